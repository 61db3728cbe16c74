"""Nothing from a user or a file reaches the terminal raw: one sanitiser for all output."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import build_shapes_benchmark
from posdebias._text import SafeConsole, one_line, printable
from posdebias.cli import main

HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J", "a\rb", "x\u2028y", "\x9b31m"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_sanitiser_shows_control_characters_as_escapes(hostile):
    for shown in (printable(hostile), one_line(hostile + "\n")):
        assert all(ch.isprintable() for ch in shown), repr(shown)
        assert "\x1b" not in shown and "\x07" not in shown


def test_a_safe_console_escapes_table_cells_titles_and_prints(capsys):
    from rich.table import Table

    table = Table(title="\x1b[2Jtitle")
    table.add_column("\x1b]0;col\x07")
    table.add_row("[red]cell\x1b[5m")
    console = SafeConsole(width=120)
    console.print(table)
    console.print("path \x1b]0;x\x07")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "[red]cell" in out and "\\x1b[5m" in out and "\\x1b]0;x\\x07" in out


def _assert_clean(out: str, err: str) -> None:
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream, repr(stream)


@pytest.mark.parametrize("hostile", HOSTILE[:3])
def test_evaluate_out_with_escape_sequences_is_printed_escaped(tmp_path, capsys, hostile):
    out = tmp_path / f"run{hostile}"
    code = main(["evaluate", "--adapter", "synthetic", "--count", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)
    assert "results:" in captured.out


def test_a_config_out_with_escape_sequences_is_printed_escaped(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text('out: "' + str(tmp_path) + '/r\\e]0;pwned\\a\\e[2J"\ncount: 2\n')
    code = main(["evaluate", "--adapter", "synthetic", "--config", str(config)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)


def test_sweep_progress_and_paths_are_printed_escaped(tmp_path, capsys):
    out = tmp_path / "s\x1b]0;pwned\x07"
    args = ["sweep", "tau", "--adapter", "synthetic", "--values", "1", "--count", "3"]
    code = main([*args, "--orders", "2", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)
    assert "\\x1b]0;pwned\\x07" in captured.out


def test_a_benchmark_folder_name_with_escape_sequences_is_printed_escaped(tmp_path, capsys):
    bench = build_shapes_benchmark(tmp_path / "b\x1b[2J", count=4, n=3)
    capsys.readouterr()
    out = tmp_path / "run"
    code = main(["evaluate", "--adapter", "synthetic", "--benchmark", str(bench), "--count",
                 "2", "--calibration-count", "1", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)


def test_build_prints_its_paths_escaped(tmp_path, capsys):
    out = tmp_path / "bench\x1b]0;x\x07"
    code = main(["build", "--source", "shapes", "--root", str(tmp_path / "R\x1b[2J"),
                 "--setting", "random", "-N", "3", "--count", "4", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)
    assert Path(out, "benchmark.jsonl").is_file()


def _files_clean(folder: Path) -> list[Path]:
    """Every file people read in ``folder`` (reports, tables, figure texts), checked clean."""
    checked = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".md", ".csv", ".svg") and path.is_file():
            text = path.read_text(encoding="utf-8")
            assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, path
            checked.append(path)
    return checked


@pytest.mark.figures("svg")  # the figures' texts are checked too
@pytest.mark.parametrize("hostile", ["b\x1b[2J", "m\x1b]0;pwned\x07", "c\x9b31m"])
def test_files_for_people_hold_no_escape_sequences_of_a_benchmark_name(tmp_path, capsys, hostile):
    # a benchmark folder named with ESC sequences put raw ones into report.md and one raw
    # ESC on stderr (matplotlib's "Glyph 27 missing" warning)
    bench = build_shapes_benchmark(tmp_path / hostile, count=4, n=3)
    capsys.readouterr()
    out = tmp_path / f"run{hostile}"
    code = main(["evaluate", "--adapter", "synthetic", "--benchmark", str(bench), "--count",
                 "2", "--calibration-count", "1", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)
    checked = _files_clean(out)
    assert out / "report.md" in checked and any(p.suffix == ".svg" for p in checked)


def test_sweep_files_hold_no_escape_sequences(tmp_path, capsys):
    # the transfer study names its points and rows by the benchmarks' folders
    one = build_shapes_benchmark(tmp_path / "b\x1b[2J", count=6, n=3)
    two = build_shapes_benchmark(tmp_path / "c\x1b]0;x\x07", count=6, n=3, seed=1)
    capsys.readouterr()
    out = tmp_path / "s\x1b]0;pwned\x07"
    args = ["sweep", "transfer", "--adapter", "synthetic", "--benchmarks", str(one), str(two)]
    code = main(
        [*args, "--count", "3", "--calibration-count", "2", "--orders", "2", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out, captured.err)
    checked = _files_clean(out)
    assert any(p.name == "results.csv" for p in checked)
    shown = "".join(p.read_text(encoding="utf-8") for p in checked)
    assert "\\x1b[2J" in shown  # the name is there, escaped


def test_file_text_escapes_like_the_terminal_and_keeps_lines():
    from posdebias._text import file_text

    assert file_text("a\x1b[2Jb\nc\x07") == "a\\x1b[2Jb\nc\\x07"
    assert file_text("x\u2028y\tz") == "x\\u2028y\tz"
    assert file_text("caf\u00e9 \u2192 ok") == "caf\u00e9 \u2192 ok"
    long = "x" * 5000
    assert file_text(long) == long  # a file is read in full: nothing cut


def test_every_warning_reaches_the_terminal_escaped(monkeypatch):
    import posdebias.cli as cli

    seen = []
    monkeypatch.setattr(cli, "_python_show_warning", lambda *args: seen.append(args))
    cli._show_warning(UserWarning("Glyph 27 (\x1b) missing"), UserWarning, "f\x1b.py", 3)
    ((message, category, filename, lineno, _file, _line),) = seen
    assert message == "Glyph 27 (\\x1b) missing" and filename == "f\\x1b.py"
    assert (category, lineno) == (UserWarning, 3)
