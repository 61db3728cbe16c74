"""Real pretrained weights: SmolLM2-135M-Instruct and Gemma 3 270M from GGUF files of the
package index, on real WordNet questions (tests/real_models.py).

The tiny random-weight models prove the plumbing of every family; these prove that posdebias
reads real weights exactly (``check``), that a GGUF file and the same weights as a folder give
the same scores, and (tests/goldens/real_*.json, ``make goldens``) what the defaults do.
One xdist worker runs them all, so each model is loaded once per session.
"""

from __future__ import annotations

import numpy as np
import pytest

from real_models import save_dequantised, wordnet_questions

pytestmark = [pytest.mark.xdist_group("real_models"), pytest.mark.slow]

MODELS = ("smollm2", "gemma3")


@pytest.fixture(scope="session")
def adapters(real_models):
    """Each real model loaded once, from its GGUF file, as ``posdebias evaluate`` loads it
    (tests/conftest.py; the goldens' runs reuse these loads)."""
    return real_models.by_name


def test_a_load_parses_its_gguf_file_once(real_models):
    """transformers reads the config, the tokenizer and the weights, each of which parsed the
    file's metadata (3 x 9.5 s for Gemma 3's vocabulary): posdebias lends it one reader."""
    assert real_models.parses == {"smollm2": 1, "gemma3": 1}


@pytest.fixture(scope="session")
def capitals(tmp_path_factory):
    from posdebias.core.instance import Instance

    path = wordnet_questions("capitals", 6, 4, 11, tmp_path_factory.mktemp("q") / "q.jsonl")
    import json

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        Instance(
            stem=row["question"],
            texts=tuple(row["options"]),
            target=row["answer"] - 1,
            id=row["id"],
            task="multiple_choice",
        )
        for row in rows
    ]


@pytest.mark.parametrize("name", MODELS)
def test_check_passes_every_row_on_the_real_model(name, adapters):
    from posdebias.testing.check import FAIL, check_adapter, check_instances

    adapter = adapters[name]
    report = check_adapter(adapter, check_instances(4, task="multiple_choice", with_images=False))
    failed = [f"{r.name}: {r.figure} ({r.cause})" for r in report.results if r.status == FAIL]
    assert not failed
    assert len(report.results) >= 5


@pytest.mark.parametrize("name", MODELS)
def test_gguf_types_and_layers_are_read_as_the_model_has_them(name, adapters):
    adapter = adapters[name]
    layers = adapter.attention_layers
    assert adapter.model.dtype.__repr__() == "torch.float32"  # GGUF is dequantised
    if name == "gemma3":  # 18 layers, every sixth global, the others a 512-token window
        assert len(layers) == 18
        assert [
            i for i, kind in zip(layers.indices, layers.kinds, strict=True) if kind == "global"
        ] == [
            5,
            11,
            17,
        ]
    else:
        assert len(layers) == 30 and set(layers.kinds) == {"global"}


def test_gguf_and_the_same_weights_as_a_folder_give_the_same_scores(adapters, capitals, tmp_path):
    """The dequantised GGUF saved as a safetensors folder loads to the same observations."""
    from posdebias.loading import load_adapter

    adapter = adapters["smollm2"]
    folder = save_dequantised(adapter, tmp_path / "smollm2")
    again = load_adapter(
        str(folder), label_set="upper", device=str(adapter.device), dtype="float32"
    )
    for first, second in zip(
        adapter.observe_many(capitals[:3]), again.observe_many(capitals[:3]), strict=True
    ):
        # the same float32 weights; measured 3.3e-6 apart on log-probabilities near -10, a
        # few float32 ulps of 30 layers' sums (the attention masses agree within 1e-7)
        np.testing.assert_allclose(first.label_logprobs, second.label_logprobs, atol=1e-5)
        np.testing.assert_allclose(first.attention, second.attention, atol=1e-7)
        assert first.span_lengths.tolist() == second.span_lengths.tolist()


def _study_tool():
    """tools/real_models_study.py, the script that rebuilds docs/real-models.md."""
    import importlib.util
    import sys

    from real_models import ROOT

    spec = importlib.util.spec_from_file_location(
        "real_models_study", ROOT / "tools" / "real_models_study.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_real_models_page_is_rebuilt_from_real_observations(adapters, tmp_path):
    """The page's script on four real questions: its block holds every calibrator with an
    interval, the cloze ceiling, the per-layer figure and the time; its vanilla and cloze
    figures equal a recount from the recorded scores; only the block of the page changes."""
    import json

    study_tool = _study_tool()
    path = wordnet_questions("capitals", 4, 4, 3, tmp_path / "q.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    payload = study_tool.observations(adapters["smollm2"], rows)
    record = {"model": "smollm2", "relation": "capitals", **payload}
    study_tool.observation_file(tmp_path, "smollm2", "capitals", 4).write_text(json.dumps(record))
    assert len(payload["views"]) == len(payload["content_free"]) == 16
    assert all(len(scores) == 4 for scores in payload["cloze"].values())

    figure = tmp_path / "layers.png"
    block = study_tool.render(
        tmp_path, 2, 0, figure, sets=(("capitals", 4, 4, 3),), models={"smollm2": "S"}, sizes=(2,)
    )
    for row in study_tool.ROWS:
        assert f"| {row.label} | " in block
    assert "| cloze (options not shown; sum)" in block and "informative layer found" in block
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "| S | capitals, N = 4 |" in block

    study = study_tool.Study.read(study_tool.observation_file(tmp_path, "smollm2", "capitals", 4))
    rng, recount = np.random.default_rng(0), []
    for _ in range(2):
        test = [study.ids[i] for i in rng.permutation(4)[2:]]
        views = [view for key in test for view in study.views[key]]
        recount.append(np.mean([view.label_logprobs.argmax() == view.target for view in views]))
    vanilla = study_tool.measure(study, 2, 2, 0)["rows"]["vanilla"]
    assert vanilla[0] == pytest.approx(100 * np.mean(recount)) and vanilla[1] <= vanilla[0]
    cloze = [np.argmax(np.array(payload["cloze"][row["id"]])[:, 0]) == row["answer"] - 1
             for row in rows]  # fmt: skip
    assert study_tool.cloze_accuracy(study, "sum", 0)[0] == pytest.approx(100 * np.mean(cloze))

    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nprose\n\n{study_tool.BEGIN}\nold\n{study_tool.END}\n\nafter\n")
    study_tool.write_page(page, block)
    text = page.read_text()
    assert text.startswith("# Title\n\nprose\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in text and block in text
    page.write_text("no block here\n")
    with pytest.raises(SystemExit, match="no generated block"):
        study_tool.write_page(page, block)
