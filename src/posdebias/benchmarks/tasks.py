"""Benchmarks of the candidate tasks (multiple choice, pairwise judge, rerank) from local files.

Each source is read with the rules of every other input (regular files of bounded size, image
paths confined to the root, every problem reported with its line) and becomes a benchmark
folder exactly as retrieval's: ``benchmark.jsonl`` (one :class:`InstanceRecord` per line) and
``manifest.json`` (format version 2, with the task).

Sources (``posdebias build --task KIND --source S --data PATH``):

* ``multiple_choice``: ``mcq`` (JSONL of ``{id, question, options, answer, images?}``; an option
  is a text or ``{text?, image?}``; ``answer`` a 1-based index or a letter), ``mmlu`` (the MMLU
  CSV layout: question, the options, the answer letter; no header; a file or a folder of
  ``*.csv``), ``muirbench`` (JSONL rows with ``question``, ``options``, ``answer`` letter,
  ``image_list``) and ``blink`` (``question``, ``choices``, ``answer`` like ``(A)``,
  ``image_1``..``image_4``); images are files next to the data (or under ``--root``).
* ``pairwise_judge``: ``pairwise`` (JSONL of ``{id, question, answers: [a, b], preferred}``,
  ``preferred`` 1 / 2 or A / B) and ``mtbench`` (MT-Bench human judgements: ``question_id``,
  ``model_a``, ``model_b``, ``winner``, ``conversation_a``, ``conversation_b``, ``turn``):
  the votes on one pair become one instance (their majority, the split in its metadata); turn 2
  shows turn 1's question and answers; pairs whose majority is a tie are counted).
* ``rerank``: ``beir`` (a BEIR folder: ``corpus.jsonl``, ``queries.jsonl``,
  ``qrels/<split>.tsv``): per query its most relevant passage plus N-1 negatives, drawn at
  random (setting ``random``, seeded) or the passages BM25 ranks highest for the query among
  those the qrels do not mark relevant (setting ``adversarial``); the right passage's position
  is drawn with the seed. Each line keeps the qrels grades of its candidates
  (``meta.relevance``, for nDCG) and the folder's name as its group (``meta.group``).

Groups: MMLU's subject, BLINK's ``sub_task`` and MuirBench's ``task`` become ``meta.group``,
which a run's results break down by.

Where questions have different numbers of options, ``-N`` keeps those with N (default: the
most common N); the others are counted in the manifest (``counts.skipped_other_n``).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

import posdebias.defaults as defaults
from posdebias._inputs import (
    check_whole_number,
    excerpt,
    file_decimal_number,
    file_whole_number,
    jsonl_lines,
    parse_json,
    text_problem,
)
from posdebias._version import __version__
from posdebias.benchmarks.build import BuildReport
from posdebias.benchmarks.files import (
    MAX_N,
    MAX_STEM_IMAGES,
    MIN_N,
    TASK_FORMAT_VERSION,
    AnnotationFile,
    BenchmarkManifest,
    InstanceRecord,
    SourceInfo,
    sha256_file,
    write_benchmark,
)
from posdebias.benchmarks.problems import Problems, json_lines
from posdebias.benchmarks.sources import check_root, line_image_path, read_data_text
from posdebias.core.instance import MAX_TEXT_CHARS
from posdebias.errors import BenchmarkError, InputError, validation_problems

#: Source kinds of each task.
TASK_SOURCES: dict[str, tuple[str, ...]] = {
    "multiple_choice": ("mcq", "mmlu", "muirbench", "blink"),
    "pairwise_judge": ("pairwise", "mtbench"),
    "rerank": ("beir",),
}
#: The source kind of every task source, for ``--source``.
ALL_TASK_SOURCES = tuple(kind for kinds in TASK_SOURCES.values() for kind in kinds)


@dataclass
class _Item:
    """One instance read from a source, before selection: stem, candidates, right position."""

    id: str
    line: int
    question: str
    texts: list[str | None]
    images: list[str | None]
    target: int
    stem_images: list[str] = field(default_factory=list)
    meta: dict[str, str | int | float | bool] = field(default_factory=dict)


@dataclass
class _Read:
    items: list[_Item]
    files: list[Path]
    root: Path
    skipped: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------ helpers


def _text(value: Any, what: str, problems: Problems, line: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        problems.add(f"{what} must be a non-empty string", line=line)
        return None
    if len(value) > MAX_TEXT_CHARS:
        problems.add(
            f"{what} has {len(value)} characters, over the limit of {MAX_TEXT_CHARS}", line=line
        )
        return None
    problem = text_problem(value)
    if problem is not None:
        problems.add(f"{what} {problem}", line=line)
        return None
    return value.strip()


def _image(value: Any, root: Path, problems: Problems, line: int) -> str | None:
    if not isinstance(value, str) or not value.strip():
        problems.add(f"an image must be a file name, got {excerpt(value)}", line=line)
        return None
    relative = line_image_path(value, root, problems, line)
    if relative is None:
        return None
    if not (root / relative).is_file():
        problems.add(f"image {excerpt(value)} not found under {root}", line=line)
        return None
    return relative


def bare_answer(text: str) -> str:
    """An answer without the brackets, full stop and spaces it may be written with."""
    return text.strip().strip("().").strip()


def answer_index(value: Any, n: int, *, base: int = 1, field: str = "answer") -> int:
    """The 0-based position an answer names: a letter (``B``, ``(b)``, ``B.``) or an index
    counted from ``base`` (a JSON integer or ASCII digits: 1 in posdebias's and lmms-eval's
    files, 0 in lm-eval's); InputError saying why not. The one reading of every door."""
    text = bare_answer(value) if isinstance(value, str) else None
    if text is not None and len(text) == 1 and text.isascii() and text.isalpha():
        index, base = ord(text.upper()) - ord("A"), 0
    else:
        try:
            index = file_whole_number(value if text is None else text, field, 0, 10**9)
        except InputError as exc:
            raise InputError(f"{exc}; write a {base}-based index or a letter") from None
    if not base <= index < n + base:
        raise InputError(f"{field} {excerpt(value)} is out of range for {n} options")
    return index - base


def _answer(value: Any, n: int, problems: Problems, line: int, field: str = "answer") -> int | None:
    try:
        return answer_index(value, n, field=field)
    except InputError as exc:
        problems.add(str(exc), line=line)
        return None


def _json_rows(path: Path, what: str, problems: Problems) -> Iterable[tuple[int, Any]]:
    """(line number, object) of a JSONL file, or of a JSON array (line = element number)."""
    text = read_data_text(path, what)
    if text.lstrip().startswith("["):
        rows = parse_json(text, str(path), error=BenchmarkError)
        if not isinstance(rows, list):
            raise BenchmarkError(f"{path}: expected a JSON array of rows")
        yield from enumerate(rows, start=1)
        return
    yield from json_lines(text, problems)


def _objects(
    path: Path, what: str, keys: tuple[str, ...], problems: Problems, *, foreign: bool = False
) -> Iterable[tuple[int, dict]]:
    """(line number, row) of the rows of ``path`` (:func:`_json_rows`) that are objects of
    exactly ``keys`` (our layouts) or, ``foreign``, hold ``keys`` among columns of their own
    (MuirBench, BLINK, MT-Bench); every other row is a problem."""
    for line, row in _json_rows(path, what, problems):
        if not isinstance(row, dict):
            problems.add("expected an object", line=line)
        elif foreign and (missing := [key for key in keys if key not in row]):
            problems.add(f"missing columns {missing}", line=line)
        elif not foreign and (unknown := sorted(str(key) for key in row if key not in keys)):
            problems.add(f"unknown keys {unknown[:5]}; allowed: {list(keys)}", line=line)
        else:
            yield line, row


def _row_id(value: Any, fallback: str) -> str:
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    return fallback


# ------------------------------------------------------------------------- multiple choice

_MCQ_KEYS = ("id", "question", "options", "answer", "images")


def read_mcq(path: Path, root: Path) -> _Read:
    """``{id, question, options, answer, images?}`` per line (see the module docstring)."""
    problems = Problems(path)
    items: list[_Item] = []
    for line, row in _objects(path, "multiple-choice file", _MCQ_KEYS, problems):
        question = _text(row.get("question"), "'question'", problems, line)
        options = row.get("options")
        if not isinstance(options, list) or not MIN_N <= len(options) <= MAX_N:
            problems.add(f"'options' must be a list of {MIN_N}..{MAX_N} options", line=line)
            continue
        texts: list[str | None] = []
        images: list[str | None] = []
        for k, option in enumerate(options, start=1):
            if isinstance(option, dict):
                extra = sorted(str(key) for key in option if key not in ("text", "image"))
                if extra or not option:
                    problems.add(f"option {k} takes text and / or image only", line=line)
                    texts.append(None)
                    images.append(None)
                    continue
                text = option.get("text")
                texts.append(None if text is None else _text(text, f"option {k}", problems, line))
                image = option.get("image")
                images.append(None if image is None else _image(image, root, problems, line))
            else:
                texts.append(_text(option, f"option {k}", problems, line))
                images.append(None)
        stem_images = row.get("images") or []
        if not isinstance(stem_images, list) or len(stem_images) > MAX_STEM_IMAGES:
            problems.add("'images' must be a list of at most 16 file names", line=line)
            continue
        stems = [_image(image, root, problems, line) for image in stem_images]
        target = _answer(row.get("answer"), len(options), problems, line)
        if question is None or target is None or None in stems:
            continue
        items.append(
            _Item(
                id=_row_id(row.get("id"), f"mcq-{line:06d}"),
                line=line,
                question=question,
                texts=texts,
                images=images,
                target=target,
                stem_images=[s for s in stems if s is not None],
            )
        )
    problems.raise_any("Fix the file.")
    return _Read(items=items, files=[path], root=root)


def read_mmlu(path: Path) -> _Read:
    """The MMLU CSV layout: question, options..., answer letter; no header. A folder: every
    ``*.csv`` in it, sorted; the subject is the file name without ``_test`` / ``_dev``."""
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files:
        raise BenchmarkError(f"{path} holds no *.csv files; give an MMLU CSV file or folder")
    problems = Problems(path)
    items: list[_Item] = []
    for file in files:
        subject = re.sub(r"_(test|dev|val)\Z", "", file.stem)
        reader = csv.reader(io.StringIO(read_data_text(file, "MMLU CSV file"), newline=""))
        try:
            for row in reader:
                line = reader.line_num
                where = Problems(file)
                if not row or not any(cell.strip() for cell in row):
                    continue
                if not MIN_N + 2 <= len(row) <= MAX_N + 2:
                    problems.add(
                        f"{file.name} line {line}: expected question, options and the answer "
                        f"letter ({MIN_N + 2}..{MAX_N + 2} columns), got {len(row)}"
                    )
                    continue
                question = _text(row[0], "the question", where, line)
                texts = [
                    _text(cell, f"option {k}", where, line) for k, cell in enumerate(row[1:-1], 1)
                ]
                target = _answer(row[-1], len(row) - 2, where, line)
                problems.extend(f"{file.name} {problem}" for problem in where)
                if where or question is None or target is None:
                    continue
                items.append(
                    _Item(
                        id=f"{subject}-{line:05d}",
                        line=line,
                        question=question,
                        texts=list(texts),
                        images=[None] * len(texts),
                        target=target,
                        meta={"subject": subject, "group": subject},
                    )
                )
        except csv.Error as exc:
            problems.add(f"{file.name} line {reader.line_num}: not CSV ({exc})")
    problems.raise_any("Fix the file.")
    return _Read(items=items, files=files, root=path if path.is_dir() else path.parent)


def read_muirbench(path: Path, root: Path, *, layout: str = "muirbench") -> _Read:
    """MuirBench rows (``question``, ``options``, ``answer``, ``image_list``) or BLINK rows
    (``question``, ``choices``, ``answer``, ``image_1``..``image_4``); other columns are kept
    as metadata when they are short scalars (``task``, ``sub_task``, ``idx``, ...)."""
    problems = Problems(path)
    items: list[_Item] = []
    options_key, image_keys = (
        ("options", ("image_list",)) if layout == "muirbench" else ("choices", ())
    )
    keys = ("question", options_key, "answer")
    for line, row in _objects(path, f"{layout} file", keys, problems, foreign=True):
        question = _text(row.get("question"), "'question'", problems, line)
        options = row.get(options_key)
        if not isinstance(options, list) or not MIN_N <= len(options) <= MAX_N:
            problems.add(f"{options_key!r} must be a list of {MIN_N}..{MAX_N} options", line=line)
            continue
        texts = [_text(str(o) if isinstance(o, (int, float)) else o, f"option {k}", problems, line)
                 for k, o in enumerate(options, start=1)]  # fmt: skip
        if layout == "muirbench":
            listed = row.get("image_list") or []
        else:
            listed = [
                row[key] for key in sorted(row) if re.fullmatch(r"image_\d+", key) and row[key]
            ]
        if not isinstance(listed, list) or len(listed) > MAX_STEM_IMAGES:
            problems.add("images must be a list of at most 16 file names", line=line)
            continue
        stems = [_image(image, root, problems, line) for image in listed]
        target = _answer(row.get("answer"), len(options), problems, line)
        if question is None or target is None or None in stems or None in texts:
            continue
        meta = {
            str(key): value
            for key, value in row.items()
            if key not in ("question", options_key, "answer", *image_keys)
            and not re.fullmatch(r"image_\d+", str(key))
            and isinstance(value, (str, int, float, bool))
            and len(str(value)) <= 200
        }
        items.append(
            _Item(
                id=_row_id(row.get("idx", row.get("id")), f"{layout}-{line:06d}"),
                line=line,
                question=question,
                texts=list(texts),
                images=[None] * len(texts),
                target=target,
                stem_images=[s for s in stems if s is not None],
                meta=_grouped(dict(list(meta.items())[:16]), ("sub_task", "task")),
            )
        )
    problems.raise_any("Fix the file.")
    return _Read(items=items, files=[path], root=root)


def _grouped(
    meta: dict[str, str | int | float | bool], keys: tuple[str, ...]
) -> dict[str, str | int | float | bool]:
    """``meta`` with ``group`` set to the first of ``keys`` it has (BLINK's ``sub_task``,
    MuirBench's ``task``): the per-group rows of a run's results read it."""
    for key in keys:
        if isinstance(meta.get(key), str) and "group" not in meta:
            return {**meta, "group": meta[key]}
    return meta


# -------------------------------------------------------------------------- pairwise judge

_PAIRWISE_KEYS = ("id", "question", "answers", "preferred")


def read_pairwise(path: Path) -> _Read:
    """``{id, question, answers: [a, b], preferred}`` per line; ``preferred`` 1 / 2 or A / B."""
    problems = Problems(path)
    items: list[_Item] = []
    for line, row in _objects(path, "pairwise file", _PAIRWISE_KEYS, problems):
        question = _text(row.get("question"), "'question'", problems, line)
        answers = row.get("answers")
        if not isinstance(answers, list) or len(answers) != 2:
            problems.add("'answers' must be a list of two answers", line=line)
            continue
        texts = [_text(a, f"answer {k}", problems, line) for k, a in enumerate(answers, 1)]
        target = _answer(row.get("preferred"), 2, problems, line, "'preferred'")
        if question is None or target is None or None in texts:
            continue
        items.append(
            _Item(
                id=_row_id(row.get("id"), f"pair-{line:06d}"),
                line=line,
                question=question,
                texts=list(texts),
                images=[None, None],
                target=target,
            )
        )
    problems.raise_any("Fix the file.")
    return _Read(items=items, files=[path], root=path.parent)


def _turn_text(conversation: Any, index: int) -> Any:
    if not isinstance(conversation, list) or len(conversation) <= index:
        return None
    entry = conversation[index]
    return entry.get("content") if isinstance(entry, dict) else None


#: How a turn-2 judgement shows the conversation (MT-Bench's multi-turn judge prompt shows
#: each assistant's whole conversation and asks about the second answer).
MT_TURN2_STEM = "{q1}\n\nFollow-up question (judge the answers to this one): {q2}"
MT_TURN2_ANSWER = "Answer to the first question: {a1}\n\nAnswer to the follow-up question: {a2}"

_MT_COLUMNS = ("question_id", "model_a", "model_b", "winner", "conversation_a")
#: A human vote of the MT-Bench file -> which answer it prefers (None: a tie).
_MT_WINNERS: dict[str, int | None] = {
    "model_a": 0,
    "model_b": 1,
    "tie": None,
    "tie (bothbad)": None,
}


@dataclass
class _Pair:
    """One judged pair of MT-Bench (question, turn, two models) and its human votes."""

    line: int
    models: tuple[str, str]
    question: str
    texts: list[str]
    votes: list[int | None] = field(default_factory=list)
    judges: list[str] = field(default_factory=list)


def _mt_turn(row: dict, turn: int, problems: Problems, line: int) -> tuple[str, list[str]] | None:
    """(stem, the two answers) of ``turn``: turn 2 keeps turn 1's question and each model's
    first answer (:data:`MT_TURN2_STEM`, :data:`MT_TURN2_ANSWER`)."""
    keys = ("conversation_a", "conversation_b")
    at = 2 * (turn - 1)
    question = _text(_turn_text(row.get(keys[0]), at), "the question", problems, line)
    answers = [_text(_turn_text(row.get(k), at + 1), f"{k}'s answer", problems, line) for k in keys]
    other = _turn_text(row.get(keys[1]), at)
    if question is not None and isinstance(other, str) and other.strip() != question:
        problems.add(f"conversation_b asks another question in turn {turn}", line=line)
        return None
    if question is None or answers[0] is None or answers[1] is None:
        return None
    if turn == 1:
        return question, [answers[0], answers[1]]
    first = _text(_turn_text(row.get(keys[0]), 0), "the turn-1 question", problems, line)
    replies = [_text(_turn_text(row.get(k), 1), f"{k}'s turn-1 answer", problems, line)
               for k in keys]  # fmt: skip
    if first is None or replies[0] is None or replies[1] is None:
        return None
    stem = MT_TURN2_STEM.format(q1=first, q2=question)
    texts = [
        MT_TURN2_ANSWER.format(a1=reply, a2=answer)
        for reply, answer in zip(replies, answers, strict=True)
    ]
    if any(len(text) > MAX_TEXT_CHARS for text in (stem, *texts)):
        problems.add(f"turn 2's conversation is over {MAX_TEXT_CHARS} characters", line=line)
        return None
    return stem, texts


def majority(votes: list[int | None]) -> int | None:
    """The answer most votes prefer (0 or 1), or None (a tie): when tie votes are the most
    common, or both answers have as many votes (the split is recorded beside it)."""
    count = Counter(votes)
    first, second, ties = count[0], count[1], count[None]
    if first == second or ties >= max(first, second):
        return None
    return 0 if first > second else 1


def read_mtbench(path: Path) -> _Read:
    """MT-Bench human judgements, one row per vote: the votes on one pair (question, turn,
    models, in either order) become ONE instance whose target is their majority
    (:func:`majority`), with the split in its metadata (``votes_a``, ``votes_b``,
    ``votes_tie``); a pair whose majority is a tie has no right answer and is counted
    (``counts.tie_pairs``), not posed. Turn 2 keeps turn 1 (:func:`_mt_turn`)."""
    problems = Problems(path)
    pairs: dict[tuple[str, int, frozenset[str]], _Pair] = {}
    for line, row in _objects(path, "MT-Bench judgement file", _MT_COLUMNS, problems, foreign=True):
        winner = row.get("winner")
        if not isinstance(winner, str) or winner not in _MT_WINNERS:
            problems.add(f"winner {excerpt(winner)} is not model_a, model_b or tie", line=line)
            continue
        try:  # 2.0, true, "²": no turn
            turn = file_whole_number(row.get("turn", 1), "turn", 1, 2, text=False)
        except InputError as exc:
            problems.add(str(exc), line=line)
            continue
        models = (_row_id(row["model_a"], ""), _row_id(row["model_b"], ""))
        if not all(models) or models[0] == models[1]:
            problems.add("model_a and model_b must be two different names", line=line)
            continue
        posed = _mt_turn(row, int(turn), problems, line)
        if posed is None:
            continue
        question, texts = posed
        vote = _MT_WINNERS[winner]
        key = (_row_id(row["question_id"], ""), int(turn), frozenset(models))
        pair = pairs.get(key)
        if pair is None:
            pair = pairs[key] = _Pair(line, models, question, texts)
        flipped = models != pair.models
        if flipped:
            texts = texts[::-1]
            vote = None if vote is None else 1 - vote
        if (question, texts) != (pair.question, pair.texts):
            problems.add(
                f"another conversation for the pair of line {pair.line} (same question, turn "
                "and models, other texts)",
                line=line,
            )
            continue
        pair.votes.append(vote)
        pair.judges.append(_row_id(row.get("judge"), "?"))
    problems.raise_any("Fix the file.")
    items: list[_Item] = []
    tie_pairs = 0
    for (question_id, turn, _), pair in pairs.items():
        target = majority(pair.votes)
        if target is None:
            tie_pairs += 1
            continue
        count = Counter(pair.votes)
        meta: dict[str, str | int | float | bool] = {
            "question_id": question_id,
            "model_a": pair.models[0],
            "model_b": pair.models[1],
            "turn": turn,
            "votes_a": count[0],
            "votes_b": count[1],
            "votes_tie": count[None],
            "judges": ",".join(sorted(set(pair.judges)))[:200],
        }
        items.append(
            _Item(
                id=f"{question_id}-{pair.models[0]}-{pair.models[1]}-t{turn}",
                line=pair.line,
                question=pair.question,
                texts=list(pair.texts),
                images=[None, None],
                target=target,
                meta=meta,
            )
        )
    votes = sum(len(pair.votes) for pair in pairs.values())
    return _Read(
        items=items,
        files=[path],
        root=path.parent,
        skipped={"votes": votes, "pairs": len(pairs), "tie_pairs": tie_pairs},
    )


# ---------------------------------------------------------------------------------- rerank


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class BM25:
    """Okapi BM25 over a list of documents (k1 = 1.5, b = 0.75; idf = log(1 + (D - df + 0.5) /
    (df + 0.5))): the hard-negative ranking of the rerank source."""

    def __init__(self, documents: list[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.counts = [Counter(_tokens(doc)) for doc in documents]
        self.lengths = np.array([sum(c.values()) for c in self.counts], dtype=np.float64)
        self.mean_length = float(self.lengths.mean()) if len(self.counts) else 0.0
        frequency = Counter(term for counts in self.counts for term in counts)  # documents per term
        size = len(self.counts)
        self.idf = {t: math.log(1 + (size - df + 0.5) / (df + 0.5)) for t, df in frequency.items()}
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for index, counts in enumerate(self.counts):
            for term, count in counts.items():
                self.postings.setdefault(term, []).append((index, count))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``."""
        out = np.zeros(len(self.counts), dtype=np.float64)
        norm = self.k1 * (1 - self.b + self.b * self.lengths / max(self.mean_length, 1e-9))
        for term in set(_tokens(query)):
            for index, count in self.postings.get(term, ()):
                out[index] += self.idf[term] * count * (self.k1 + 1) / (count + norm[index])
        return out


def _beir_jsonl(path: Path, what: str, text_keys: tuple[str, ...]) -> dict[str, str]:
    problems = Problems(path)
    out: dict[str, str] = {}
    for line, row in _json_rows(path, what, problems):
        if not isinstance(row, dict) or not isinstance(row.get("_id"), (str, int)):
            problems.add("expected an object with an _id", line=line)
            continue
        parts = [row.get(key) for key in text_keys]
        if not all(part is None or isinstance(part, str) for part in parts):
            problems.add(f"{' and '.join(text_keys)} must be strings", line=line)
            continue
        text = " ".join(part.strip() for part in parts if part and part.strip())
        if not text:
            problems.add("the text is empty", line=line)
            continue
        if len(text) > MAX_TEXT_CHARS:
            problems.add(f"the text is over {MAX_TEXT_CHARS} characters", line=line)
            continue
        key = str(row["_id"])
        problem = text_problem(text) or text_problem(key)
        if problem is not None:
            problems.add(f"the text or _id {problem}", line=line)
            continue
        if key in out:
            problems.add(f"duplicate _id {excerpt(key)}", line=line)
            continue
        out[key] = text
    problems.raise_any("Fix the file.")
    return out


def _beir_qrels(
    path: Path, queries: dict[str, str], corpus: dict[str, str]
) -> dict[str, dict[str, float]]:
    """query id -> {passage id: relevance score} of a BEIR qrels file (tab separated)."""
    problems = Problems(path)
    relevant: dict[str, dict[str, float]] = {}
    for line, row in enumerate(jsonl_lines(read_data_text(path, "BEIR qrels file")), start=1):
        cells = row.strip().split("\t")
        if not row.strip() or (line == 1 and cells[0] in ("query-id", "query_id")):
            continue
        if len(cells) != 3:
            problems.add("expected query-id, corpus-id and score (tab separated)", line=line)
            continue
        try:  # nan, inf, 1e999, "²": no relevance
            score = file_decimal_number(cells[2], "score")
        except InputError as exc:
            problems.add(str(exc), line=line)
            continue
        if cells[0] not in queries or cells[1] not in corpus:
            problems.add(
                f"query {excerpt(cells[0])} or passage {excerpt(cells[1])} is not "
                "in queries.jsonl / corpus.jsonl",
                line=line,
            )
            continue
        relevant.setdefault(cells[0], {})[cells[1]] = score
    problems.raise_any("Fix the file.")
    return relevant


def read_beir(
    folder: Path, n: int, count: int | None, seed: int, setting: str, split: str = "test"
) -> _Read:
    """Rerank instances from a BEIR folder (module docstring)."""
    if not folder.is_dir():
        raise BenchmarkError(f"--data {folder} is not a folder; give a BEIR dataset folder")
    corpus_file, queries_file = folder / "corpus.jsonl", folder / "queries.jsonl"
    qrels_file = folder / "qrels" / f"{split}.tsv"
    corpus = _beir_jsonl(corpus_file, "BEIR corpus", ("title", "text"))
    queries = _beir_jsonl(queries_file, "BEIR queries", ("text",))
    relevant = _beir_qrels(qrels_file, queries, corpus)
    doc_ids = list(corpus)
    if len(doc_ids) < n:
        raise BenchmarkError(f"the corpus has {len(doc_ids)} passages, fewer than N={n}")
    bm25 = BM25([corpus[d] for d in doc_ids]) if setting == "adversarial" else None
    rng = np.random.default_rng(seed)
    items: list[_Item] = []
    position = {doc: index for index, doc in enumerate(doc_ids)}
    for query_id in queries:
        judged = relevant.get(query_id)
        if not judged or max(judged.values()) <= 0:
            continue
        if count is not None and len(items) >= count:
            break
        best = max(judged, key=lambda doc: (judged[doc], -position[doc]))
        excluded = {doc for doc, score in judged.items() if score > 0}
        pool = np.array([position[d] for d in doc_ids if d not in excluded], dtype=np.int64)
        if len(pool) < n - 1:
            raise BenchmarkError(
                f"query {excerpt(query_id)} has {len(pool)} non-relevant passages, fewer than "
                f"N-1={n - 1}"
            )
        if bm25 is not None:
            scores = bm25.scores(queries[query_id])[pool]
            negatives = pool[np.lexsort((pool, -scores))[: n - 1]]
        else:
            negatives = rng.choice(pool, size=n - 1, replace=False)
        target = int(rng.integers(n))
        chosen = [doc_ids[int(k)] for k in negatives]
        chosen.insert(target, best)
        items.append(
            _Item(
                id=str(query_id),
                line=0,
                question=queries[query_id],
                texts=[corpus[doc] for doc in chosen],
                images=[None] * n,
                target=target,
                meta={
                    "passages": ",".join(chosen)[:2000],
                    "relevance": ",".join(f"{max(judged.get(doc, 0.0), 0.0):g}" for doc in chosen),
                    "group": folder.resolve().name[:200],
                },
            )
        )
    return _Read(items=items, files=[corpus_file, queries_file, qrels_file], root=folder)


# ----------------------------------------------------------------------------------- build


def build_task_benchmark(
    task: str,
    source: str,
    data: Path,
    out: Path,
    *,
    root: Path | None = None,
    n: int | None = None,
    count: int | None = None,
    seed: int = 0,
    setting: str | None = None,
    split: str = "test",
) -> BuildReport:
    """Read ``data`` with ``source`` and write the benchmark folder ``out`` (module docstring).

    Everything is checked before anything is written; the two files appear together or not at
    all (as for retrieval builds).
    """
    setting = _check_build_options(task, source, n, count, seed, setting)
    data = Path(data)
    if not data.exists():
        raise BenchmarkError(f"--data {data} does not exist")
    base = data if data.is_dir() else data.parent
    image_root = check_root(Path(root)) if root is not None else base.resolve()
    read = _read_source(source, data, image_root, n, count, seed, setting, split)
    if not read.items:
        raise BenchmarkError(f"{data} has no usable instances")
    chosen_n, with_n = _with_n(read.items, n, data)
    skipped_n = len(read.items) - len(with_n)
    kept = _unique_ids(with_n, data)[:count]
    records = _records(task, kept, data)
    counts: dict[str, int | float] = {"instances": len(records), "read": len(read.items)}
    warnings = []
    if skipped_n:
        counts["skipped_other_n"] = skipped_n
        warnings.append(f"{skipped_n} instances with another number of candidates than N="
                        f"{chosen_n} were left out (-N chooses)")  # fmt: skip
    counts.update(read.skipped)
    images = {path for item in kept for path in (*item.stem_images, *item.images) if path}
    manifest = BenchmarkManifest(
        format_version=TASK_FORMAT_VERSION,
        task=task,
        package_version=__version__,
        root=str(read.root.resolve() if not images else image_root),
        source=SourceInfo(
            kind=source,
            annotation_files=[
                AnnotationFile(path=str(path.resolve()), sha256=sha256_file(path))
                for path in read.files
            ],
            images_in_source=len(images),
            pool_size=len(read.items),
            has_categories=False,
        ),
        setting=setting or "given",  # type: ignore[arg-type]
        n=chosen_n,
        count=len(records),
        seed=seed,
        counts=counts,
    )
    written = write_benchmark(out, records, manifest)
    return BuildReport(out_dir=Path(out), manifest=written, warnings=warnings)


def _check_build_options(
    task: str, source: str, n: int | None, count: int | None, seed: int, setting: str | None
) -> str | None:
    """Refuse a task, source, N, count, seed or setting that cannot build; the setting (rerank:
    ``random`` by default; the other tasks have none)."""
    if task not in TASK_SOURCES:
        raise BenchmarkError(f"unknown task {task!r}; choose one of {list(TASK_SOURCES)}")
    if source not in TASK_SOURCES[task]:
        raise BenchmarkError(
            f"--source {source} does not build {task}; choose one of {list(TASK_SOURCES[task])}"
        )
    if n is not None and not MIN_N <= n <= MAX_N:
        raise BenchmarkError(f"-N {n} is out of range; N must be {MIN_N}..{MAX_N}")
    if count is not None:
        check_whole_number("--count", count, 1, defaults.MAX_INSTANCES, error=BenchmarkError)
    check_whole_number("--seed", seed, 0, defaults.MAX_SEED, error=BenchmarkError)
    if task == "rerank":
        setting = setting or "random"
        if setting not in ("random", "adversarial"):
            raise BenchmarkError(f"--setting {setting} is not random or adversarial (BM25)")
        return setting
    if setting not in (None, "given"):
        raise BenchmarkError(f"--setting is for rerank only; {task} uses the source's options")
    return None


def _read_source(
    source: str,
    data: Path,
    image_root: Path,
    n: int | None,
    count: int | None,
    seed: int,
    setting: str | None,
    split: str,
) -> _Read:
    if source == "mcq":
        return read_mcq(data, image_root)
    if source == "mmlu":
        return read_mmlu(data)
    if source in ("muirbench", "blink"):
        return read_muirbench(data, image_root, layout=source)
    if source == "pairwise":
        return read_pairwise(data)
    if source == "mtbench":
        return read_mtbench(data)
    return read_beir(data, n or defaults.CANDIDATES, count, seed, setting or "random", split)


def _with_n(items: list[_Item], n: int | None, data: Path) -> tuple[int, list[_Item]]:
    """(N, the items with N candidates): ``n``, or the most common N (the smaller on a tie)."""
    sizes = Counter(len(item.texts) for item in items)
    chosen_n = n if n is not None else min(sizes, key=lambda k: (-sizes[k], k))
    kept = [item for item in items if len(item.texts) == chosen_n]
    if not kept:
        shown = ", ".join(f"{k} ({v})" for k, v in sorted(sizes.items()))
        raise BenchmarkError(f"no instance of {data} has N={chosen_n} candidates; it has {shown}")
    return chosen_n, kept


def _unique_ids(items: list[_Item], data: Path) -> list[_Item]:
    problems = Problems(data)
    first: dict[str, int] = {}
    for item in items:
        if item.id in first:
            problems.add(f"duplicate id {excerpt(item.id)} (first on line {first[item.id]})",
                         line=item.line)  # fmt: skip
        first.setdefault(item.id, item.line)
    problems.raise_any("Give every instance its own id.")
    return items


def _records(task: str, items: list[_Item], data: Path) -> list[InstanceRecord]:
    """The benchmark lines of ``items``, each checked by the benchmark file's own schema."""
    problems = Problems(data)
    records = []
    for item in items:
        try:
            records.append(_record(task, item))
        except ValidationError as exc:
            problems.extend(validation_problems(exc), line=item.line)
    problems.raise_any("Fix the file.")
    return records


def _record(task: str, item: _Item) -> InstanceRecord:
    has_images = any(image is not None for image in item.images)
    has_texts = any(text is not None for text in item.texts)
    return InstanceRecord(
        id=item.id,
        task=task,
        query=item.question,
        images=list(item.images) if has_images else None,
        texts=list(item.texts) if has_texts else None,
        stem_images=item.stem_images or None,
        target=item.target,
        meta=item.meta or None,
    )
