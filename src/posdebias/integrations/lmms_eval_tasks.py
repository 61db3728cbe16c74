"""Position bias in lmms-eval's own tables: rotated tasks and their metrics.

:func:`write_rotated_tasks` (``posdebias lmms-eval-task``) turns a multiple-choice benchmark
into lmms-eval tasks whose documents are every item in its N cyclic rotations (rotation r
shows base candidate ``(i + r) % N`` at position i, the posdebias convention), one task per
calibrator plus a group that runs them all in ONE harness run. The rotation, the order and
the calibrator are recorded in each document, so the harness's sample logs say what was shown.

The task functions below are what the written YAML files point to. :func:`process_results`
turns a response into a record (the item, the rotation, the truth position, the chosen
position, the chosen base candidate); the aggregations compute, over all records of a task,
exactly what ``posdebias evaluate`` reports for the same items and orders:

* ``acc``: accuracy (%) per rotation, averaged over the rotations (Acc);
* ``rstd``: sample std of the per-position recalls (RStd, percentage points);
* ``cons``: % of items whose chosen candidate is the same in every rotation (Cons.);
* ``circular``: % of items answered right in every rotation (CircularEval).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

import posdebias.defaults as defaults
from posdebias._images import open_image
from posdebias._inputs import check_whole_number
from posdebias._rundir import RunFolder
from posdebias._text import printable
from posdebias.benchmarks.files import load_benchmark
from posdebias.benchmarks.tasks import bare_answer
from posdebias.core.instance import Instance, rotation_order
from posdebias.core.labels import LABEL_SETS, get_label_set
from posdebias.core.tasks import task_label_set, task_template
from posdebias.errors import InputError, PosdebiasError
from posdebias.evaluation.config import label_problem
from posdebias.evaluation.job import split_held_out
from posdebias.evaluation.metrics import compute_metrics
from posdebias.integrations.harness import (
    CALIBRATION_FILE,
    CALIBRATION_ITEMS,
    CALIBRATION_SPLIT,
    CALIBRATOR,
    ITEM,
    LABELS,
    ORDER,
    ROTATION,
    HarnessConfig,
    answer_position,
    current_provenance,
    doc_instance,
    doc_kind,
    doc_texts,
)
from posdebias.registry import get_registry

OutputType = Literal["generate_until", "multiple_choice"]
Harness = Literal["lmms-eval", "lm-eval"]
#: The module whose functions a harness's written task module imports.
HARNESS_TASK_MODULES: dict[str, str] = {
    "lmms-eval": "posdebias.integrations.lmms_eval_tasks",
    "lm-eval": "posdebias.integrations.lm_eval_tasks",
}
METRICS = ("acc", "rstd", "cons", "circular")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}\Z")

# -- refusals under lmms-eval's command line ---------------------------------------------------


def _in_lmms_eval_command() -> bool:
    """Whether this process is lmms-eval's command line (``lmms-eval``, ``python -m
    lmms_eval``, each process of ``accelerate launch -m lmms_eval``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in ("lmms_eval", "lmms_eval.__main__"):
        return True
    return bool(sys.argv) and Path(sys.argv[0]).name in ("lmms-eval", "lmms_eval")


@contextlib.contextmanager
def refusals_stop_the_command() -> Iterator[None]:
    """A refusal of posdebias (a document it cannot rotate, a task it cannot answer) stops
    lmms-eval's command line with exit status 2 and ``error: <message>`` on stderr.

    lmms-eval 0.7.3's command line logs any error raised while it loads tasks or evaluates
    (one raised while loading a task arrives wrapped in a tenacity ``RetryError``, after five
    attempts) and exits 0 with no results, so a script would go on as if the run had worked.
    A ``SystemExit`` passes both. Called from Python (``simple_evaluate``, a test), the error
    is raised as usual. Also a decorator (``@refusals_stop_the_command()``).
    """
    try:
        yield
    except PosdebiasError as error:
        if not _in_lmms_eval_command():
            raise
        print(f"error: {printable(error.message_for('harness'))}", file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from error


# -- the task transform ---------------------------------------------------------------------


#: The per-candidate fields of a document (rotated together; ``options`` is the field of
#: foreign multiple-choice layouts such as MuirBench's); ``stem_images`` stay put.
CANDIDATE_FIELDS = ("images", "texts", "options")


def candidate_count(doc: Mapping[str, Any], fields: Sequence[str] = CANDIDATE_FIELDS) -> int:
    return max(len(doc.get(field) or ()) for field in fields)


#: Fields a task's documents may name their item by, looked for in this order; a document
#: with none of them is named by its position in the task (``item-<index>``).
ID_FIELDS = ("id", "question_id", "idx", "index", "sample_id")


def item_id(doc: Mapping[str, Any], index: int | None = None) -> str:
    """The identity of ``doc``'s item, shared by its rotations (the metrics group by it): the
    first of :data:`ID_FIELDS` it has (after a rotated document's own), else its position
    ``index`` in the task."""
    for field in (ITEM, *ID_FIELDS):
        if doc.get(field) is not None:
            return str(doc[field])
    if index is None:
        raise InputError(
            f"a document has none of the fields {list(ID_FIELDS)} to name its item; give each "
            "document an 'id'"
        )
    return f"item-{index}"


def rotate_doc(
    doc: Mapping[str, Any],
    rotation: int,
    index: int | None = None,
    *,
    fields: Sequence[str] = CANDIDATE_FIELDS,
    answer_base: int = 1,
) -> dict[str, Any]:
    """One base document shown in cyclic rotation ``rotation`` (candidates, truth, order).

    The truth is ``target`` (a 0-based position); a document with only an ``answer`` (a letter,
    or an index counted from ``answer_base``: 1 in lmms-eval's layouts, 0 in lm-eval's, where
    an index names a choice) gets its ``target`` too, and its ``answer`` is moved in its own
    format, so the task's own scoring still reads it. ``index``: the document's position in
    its task, its item's name when it has no id field (:func:`item_id`). ``fields``: the
    candidate lists.
    """
    ident = item_id(doc, index)
    for field in fields:
        if doc.get(field) is not None and not isinstance(doc[field], (list, tuple)):
            raise InputError(
                f"item {ident!r}: field {field!r} is a {type(doc[field]).__name__}, not a list "
                "with one entry per candidate; give the documents a list of candidates"
            )
    n = candidate_count(doc, fields)
    if n < 2:
        raise InputError(f"item {ident!r}: no candidates to rotate (fields {tuple(fields)})")
    order = rotation_order(n, rotation).tolist()
    rotated = {**doc, ITEM: ident, ROTATION: rotation, ORDER: order}
    for field in fields:
        values = doc.get(field)
        if values:
            rotated[field] = [values[k] for k in order]
    target = doc.get("target")
    answer = doc.get("answer")
    if target is None and answer is not None:
        target = answer_position(answer, n, base=answer_base)
        if target is None:
            raise InputError(f"item {ident!r}: answer {answer!r} names no candidate")
    if target is not None:
        rotated["target"] = order.index(int(target))
        if answer is not None:
            rotated["answer"] = _answer_like(answer, rotated["target"], answer_base)
    return rotated


def _answer_like(answer: Any, position: int, base: int = 1) -> Any:
    """``position`` written as ``answer`` was: an index from ``base``, or a letter in its case,
    brackets and full stop (``"(B)"``, ``"b."``)."""
    if isinstance(answer, int):
        return position + base
    text = str(answer)
    letter = chr(ord("A") + position)
    stripped = bare_answer(text)
    if stripped.isdigit():
        return text.replace(stripped, str(position + base))
    return text.replace(stripped, letter if stripped.isupper() else letter.lower())


def items_digest(docs: Iterable[Mapping[str, Any]]) -> str:
    """What decides a task's metrics in its items: each one's id, candidates and truth."""
    digest = hashlib.sha256()
    for doc in docs:
        key = [doc.get(name) for name in ("id", "target", "images", "texts", "stem_images")]
        digest.update((json.dumps(key, sort_keys=True) + "\n").encode())
    return digest.hexdigest()


def rotation_transform(
    calibrator: str | None,
    rotations: int | None = None,
    *,
    items: str | None = None,
    calibration: str | None = None,
    calibration_file: str | None = None,
    fields: Sequence[str] = CANDIDATE_FIELDS,
    answer_base: int = 1,
) -> Callable:
    """A ``process_docs`` function: every document in its first ``rotations`` cyclic
    rotations (all N by default), item-major, each recording ``calibrator``. ``items``: the
    :func:`items_digest` of the documents as written; other documents (an items file edited
    to move a truth) are refused, so the metrics come from the benchmark's truth.
    ``calibration``: the digest of the task's calibration split as written, recorded in each
    document, so that the model refuses a calibration file edited since
    (:func:`check_calibration_items`); ``calibration_file``: where that split is, recorded too
    (lm-eval hands a model no other split). ``fields`` and ``answer_base``: the layout of the
    documents (:func:`rotate_doc`)."""

    @refusals_stop_the_command()
    def process_docs(dataset: Any) -> Any:
        import datasets

        if items is not None and items_digest(dataset) != items:
            raise InputError(
                "the task's items differ from the ones posdebias wrote from the benchmark (the "
                "items file was edited): write the tasks again (`posdebias lm-eval-task`, "
                "`posdebias lmms-eval-task`)"
            )
        rows = []
        for index, doc in enumerate(dataset):
            n = candidate_count(doc, fields)
            count = n if rotations is None else rotations
            if not 1 <= count <= n:
                raise InputError(f"rotations must be 1..{n} for {n} candidates, got {count}")
            for rotation in range(count):
                row = rotate_doc(doc, rotation, index, fields=fields, answer_base=answer_base)
                row[CALIBRATOR] = calibrator
                if calibration is not None:
                    row[CALIBRATION_ITEMS] = calibration
                if calibration_file is not None:
                    row[CALIBRATION_FILE] = calibration_file
                rows.append(row)
        return datasets.Dataset.from_list(rows)

    return process_docs


def check_calibration_items(
    task: str, calibration: Iterable[Mapping[str, Any]], docs: Iterable[Mapping[str, Any]]
) -> None:
    """Refuse ``task``'s calibration split if it differs from the one `posdebias
    lmms-eval-task` wrote: its digest is recorded in the task's rotated documents (``docs``);
    a split without one (a task written otherwise) is not checked."""
    recorded = next((doc.get(CALIBRATION_ITEMS) for doc in docs), None)
    if recorded is not None and items_digest(calibration) != recorded:
        raise InputError(
            f"task {task!r}: the calibration items differ from the ones `posdebias "
            "lmms-eval-task` wrote from the benchmark (the calibration file was edited): write "
            "the tasks again"
        )


#: ``process_docs: !function posdebias.integrations.lmms_eval_tasks.rotated_docs`` turns any
#: multiple-choice task into its N cyclic rotations, in its own YAML (no calibrator named).
rotated_docs = rotation_transform(None)


# -- what the task YAML points to -------------------------------------------------------------


def doc_labels(doc: Mapping[str, Any]) -> list[str]:
    labels = doc.get(LABELS)
    if labels:
        return list(labels)
    n = max(candidate_count(doc), len(doc_texts(doc) or ()))
    return get_label_set(task_label_set(doc_kind(doc))).labels(n)


def doc_to_visual(doc: Mapping[str, Any]) -> list[Any]:
    """The images of the prompt in the order shown, the stem's first (for models other than
    posdebias's, which reads the files itself)."""
    paths = [*(doc.get("stem_images") or ()), *(p for p in doc.get("images") or () if p)]
    item = doc.get(ITEM, doc.get("id"))
    return [open_image(path, what=f"item {item!r}: image") for path in paths]


def doc_to_text(doc: Mapping[str, Any]) -> str:
    """The text of the task's default posdebias prompt, for models that need a prompt."""
    labels = doc_labels(doc)
    n = len(labels)
    kind = doc_kind(doc)
    label_set = next(
        (ls for ls in LABEL_SETS.values() if n <= ls.capacity and ls.labels(n) == labels),
        get_label_set(task_label_set(kind)),
    )
    messages = task_template(kind).messages(doc_instance(doc, kind), label_set)
    return "".join(item.get("text", "") for message in messages for item in message["content"])


def doc_to_target(doc: Mapping[str, Any]) -> str:
    """The label of the truth in this rotation (what a generated answer must be)."""
    return doc_labels(doc)[int(doc["target"])]


def doc_to_target_index(doc: Mapping[str, Any]) -> int:
    """The truth's position in this rotation (multiple-choice tasks)."""
    return int(doc["target"])


doc_to_choice = doc_labels


def parse_choice(response: Any, labels: Sequence[str]) -> int:
    """The chosen position from a harness response: a generated label (the text itself, or
    the first word that is a label), or the per-choice (loss, greedy) pairs of a
    multiple-choice task, whose smallest loss is the answer (lmms-eval's convention). -1
    when no label is named."""
    if isinstance(response, (list, tuple)) and response and isinstance(response[0], str):
        response = response[0]
    if isinstance(response, str):
        text = response.strip()
        words = [text, *re.findall(r"[A-Za-z0-9\-]+", text)]
        return next((labels.index(word) for word in words if word in labels), -1)
    losses = [float(pair[0]) for pair in response]
    return int(np.argmin(losses))


def process_results(doc: Mapping[str, Any], results: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """One record per document, under every metric (the aggregations read them all)."""
    labels = doc_labels(doc)
    choice = parse_choice(results if not isinstance(results[0], str) else results[0], labels)
    return choice_records(doc, choice, labels)


def choice_records(
    doc: Mapping[str, Any], choice: int, labels: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The record of one answered document (the chosen position ``choice``, -1 for none)
    under every metric: what any harness's ``process_results`` returns."""
    order = list(doc.get(ORDER) or range(len(labels)))
    record = {
        "item": str(doc.get(ITEM, doc.get("id"))),
        "rotation": int(doc.get(ROTATION, 0)),
        "target": int(doc["target"]),
        "choice": choice,
        "chosen": order[choice] if choice >= 0 else -1,
        "n": len(labels),
        "calibrator": doc.get(CALIBRATOR),
    }
    provenance = current_provenance()
    if provenance is not None:
        record["calibration"] = provenance
    return {metric: record for metric in METRICS}


def records_arrays(
    records: Sequence[Mapping[str, Any]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """[items, rotations] arrays (targets, choices, chosen base candidates) of the items seen
    in every rotation (a ``--limit`` run may cut an item short: it is left out), and N."""
    by_item: dict[str, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for record in records:
        by_item[record["item"]][int(record["rotation"])] = record
    if not by_item:
        raise InputError("no records to aggregate")
    count = max(len(rows) for rows in by_item.values())
    complete = [rows for rows in by_item.values() if sorted(rows) == list(range(count))]
    if not complete:
        raise InputError("no item was answered in every rotation")
    items = [[rows[r] for r in range(count)] for rows in complete]
    targets = np.array([[row["target"] for row in rows] for rows in items])
    choices = np.array([[row["choice"] for row in rows] for rows in items])
    chosen = np.array([[row["chosen"] for row in rows] for rows in items])
    return targets, choices, chosen, int(items[0][0]["n"])


def _metrics(records: Sequence[Mapping[str, Any]]) -> Any:
    return compute_metrics(*records_arrays(records))


def accuracy(records: Sequence[Mapping[str, Any]]) -> float:
    """Acc (%): accuracy per rotation, averaged over the rotations."""
    return float(_metrics(records).accuracy_mean)


def rstd(records: Sequence[Mapping[str, Any]]) -> float:
    """RStd (percentage points): sample std of the recall per truth position."""
    return float(_metrics(records).rstd)


def consistency(records: Sequence[Mapping[str, Any]]) -> float:
    """Cons. (%): items whose chosen candidate is the same in every rotation."""
    return float(_metrics(records).consistency)


def circular(records: Sequence[Mapping[str, Any]]) -> float:
    """CircularEval (%): items answered right in every rotation; NaN, no number, when the
    task shows fewer rotations than N (``--rotations``), as ``evaluate`` leaves it absent."""
    targets, choices, _, n = records_arrays(records)
    right = np.all(targets == choices, axis=1)
    return 100.0 * float(np.mean(right)) if targets.shape[1] == n else float("nan")


# -- writing the tasks ----------------------------------------------------------------------


def _base_doc(instance: Instance, labels: list[str]) -> dict[str, Any]:
    """A benchmark line as a harness document (image paths made absolute)."""
    doc: dict[str, Any] = {
        "id": instance.id,
        "task": instance.task,
        "query": instance.stem,
        "target": instance.target,
        LABELS: labels,
    }
    if any(image is not None for image in instance.images):
        doc["images"] = [
            None if image is None else str(Path(image).resolve()) for image in instance.images
        ]
    if instance.has_texts:
        doc["texts"] = list(instance.texts)
    if instance.stem_images:
        doc["stem_images"] = [str(Path(image).resolve()) for image in instance.stem_images]
    return doc


def _jsonl(docs: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(doc, sort_keys=True) + "\n" for doc in docs).encode()


def _quote(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML string


def write_rotated_tasks(
    benchmark: str | Path,
    out: str | Path,
    *,
    name: str,
    calibrators: Sequence[str] = ("vanilla", "attention_guided"),
    output_type: OutputType = "generate_until",
    rotations: int | None = None,
    count: int | None = None,
    calibration_count: int = 0,
    seed: int = 0,
    label_set: str | None = None,
    harness: Harness = "lmms-eval",
) -> list[Path]:
    """Write the rotated lmms-eval (or lm-eval: ``harness``) tasks of ``benchmark`` into
    ``out``; returns the files.

    Files: ``<name>.yaml`` (the group: every calibrator's task, ONE run), ``<name>_<label>.yaml``
    per calibrator, ``<name>_items.jsonl`` (the base items), ``<name>_calibration.jsonl`` (with
    ``calibration_count``: items held out by ``seed`` exactly as ``posdebias evaluate`` holds
    them out, the task's ``calibration`` split for ``calibration=task``) and
    ``<name>_posdebias.py`` (the functions the YAML names). All appear together or none.
    ``label_set``: the labels the answers use (default: the task's, ``A``.. for multiple
    choice, ``1``.. for retrieval).
    """
    if not _NAME.fullmatch(name):
        raise InputError(
            f"task name {name!r}: use a letter, then letters, digits or '_' (at most 64)"
        )
    labels_out = list(calibrators)
    if not labels_out:
        raise InputError("give at least one calibrator")
    for label in labels_out:
        problem = label_problem(label)
        if problem is not None:
            raise InputError(f"calibrator {label!r}: not a name ({problem})")
        get_registry().calibrator_class(label)  # an unknown one: refused before any file
    if len(set(labels_out)) != len(labels_out):
        raise InputError(f"calibrators repeated: {labels_out}")
    check_whole_number("the calibration count", calibration_count, 0, defaults.MAX_CALIBRATION)
    check_whole_number("the seed", seed, 0, defaults.MAX_SEED)
    if count is not None:
        check_whole_number("the count", count, 1, defaults.MAX_INSTANCES)
    instances = load_benchmark(benchmark).instances
    if calibration_count:
        calibration, test = split_held_out(instances, calibration_count, seed)
    else:
        calibration, test = [], list(instances)
    if count is not None:
        test = test[:count]
    n = test[0].n
    if rotations is not None:
        check_whole_number(f"rotations of {n} candidates", rotations, 1, n)
    labels = get_label_set(task_label_set(test[0].task, label_set)).labels(n)
    out = Path(out)
    module = f"{name}_posdebias"
    test_docs = [_base_doc(instance, labels) for instance in test]
    files: dict[str, bytes] = {f"{name}_items.jsonl": _jsonl(test_docs)}
    data_files = {"test": str((out / f"{name}_items.jsonl").resolve())}
    calibration_docs = [_base_doc(instance, labels) for instance in calibration]
    if calibration_docs:
        files[f"{name}_calibration.jsonl"] = _jsonl(calibration_docs)
        data_files[CALIBRATION_SPLIT] = str((out / f"{name}_calibration.jsonl").resolve())
    source = HARNESS_TASK_MODULES[harness]
    functions = [
        f'"""Written by `posdebias {harness}-task`: the functions its task YAML files name."""',
        "",
        f"from {source} import (  # noqa: F401",
        "    accuracy, circular, consistency, doc_to_choice, doc_to_target,",
        "    doc_to_target_index, doc_to_text, doc_to_visual, process_results, rstd,",
        "    rotation_transform,",
        ")",
        "",
        "#: the items' ids, candidates and truths as written (an edited items file is refused)",
        f"ITEMS = {items_digest(test_docs)!r}",
    ]
    digests = "items=ITEMS"
    if calibration_docs:
        functions += [
            "#: the same of the calibration split (an edited calibration file is refused)",
            f"CALIBRATION = {items_digest(calibration_docs)!r}",
        ]
        digests += ", calibration=CALIBRATION"
        if harness == "lm-eval":  # lm-eval hands a model no other split: name the file
            functions.append(f"CALIBRATION_FILE = {data_files[CALIBRATION_SPLIT]!r}")
            digests += ", calibration_file=CALIBRATION_FILE"
    functions.append("")
    task_names = []
    for index, label in enumerate(labels_out):
        task = f"{name}_{re.sub(r'[^A-Za-z0-9_]', '_', label)}"
        task_names.append(task)
        functions.append(
            f"docs_{index} = rotation_transform({label!r}, {rotations!r}, {digests})  # {task}"
        )
        files[f"{task}.yaml"] = _task_yaml(
            task, name, module, index, data_files, output_type, label, n, rotations, harness
        ).encode()
    files[f"{module}.py"] = ("\n".join(functions) + "\n").encode()
    group = [f"group: {name}", "task:"] + [f"  - {task}" for task in task_names]
    group += ["metadata:", "  version: 1", ""]
    files[f"{name}.yaml"] = "\n".join(group).encode()
    # lexists: a dangling link of the user's stands there too (exists() said no, and the
    # rename replaced it); the write itself places each file only where nothing is
    existing = [file for file in files if os.path.lexists(out / file)]
    if existing:
        raise InputError(
            f"{out} already holds {existing[0]}; choose an empty folder or another --name"
        )
    folder = RunFolder(
        out, marker=None, own=re.compile(re.escape(name) + r"(_\w+)?\.(yaml|jsonl|py)")
    )
    return folder.write_files(files, new=True)


def rotated_tasks_command(
    benchmark: str | Path,
    out: str | Path,
    *,
    name: str,
    calibrators: Sequence[str],
    calibration_count: int = 0,
    label_set: str | None = None,
    harness: Harness = "lmms-eval",
) -> str:
    """The lmms-eval (or lm-eval: ``harness``, through ``posdebias lm-eval``) command that runs
    the tasks :func:`write_rotated_tasks` wrote, with every
    model argument they need: the calibrators, the calibration (``task`` when a split was held
    out, with its size unless it is the model's default), and the label set when it is not the
    task's own (the model's default). ``MODEL`` (and
    without a held-out split ``CALIBRATION``) are for the user to fill in."""
    fields = HarnessConfig.model_fields
    task = load_benchmark(benchmark).instances[0].task
    arguments = ["pretrained=MODEL", f"calibrators={'+'.join(calibrators)}"]
    if calibration_count:
        arguments.append("calibration=task")
        if calibration_count != fields["calibration_count"].default:
            arguments.append(f"calibration_count={calibration_count}")
    else:
        arguments.append("calibration=CALIBRATION")
    labels = task_label_set(task, label_set)
    if labels != task_label_set(task):  # the model answers each task in its own by default
        arguments.append(f"label_set={labels}")
    return shlex.join(
        [
            *(["lmms-eval"] if harness == "lmms-eval" else ["posdebias", "lm-eval"]),
            "--model",
            "posdebias",
            "--model_args",
            ",".join(arguments),
            "--tasks",
            name,
            "--include_path",
            str(out),
        ]
    )


def _task_yaml(
    task: str,
    group: str,
    module: str,
    index: int,
    data_files: Mapping[str, str],
    output_type: OutputType,
    calibrator: str,
    n: int,
    rotations: int | None,
    harness: Harness = "lmms-eval",
) -> str:
    lines = [
        f"task: {task}",
        f"tag: {group}_tasks",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        *(f"    {split}: {_quote(path)}" for split, path in data_files.items()),
        "test_split: test",
        f"output_type: {output_type}",
        f"process_docs: !function {module}.docs_{index}",
        f"doc_to_text: !function {module}.doc_to_text",
    ]
    if harness == "lmms-eval":  # lm-eval's prompts hold no image
        lines.insert(-1, f"doc_to_visual: !function {module}.doc_to_visual")
    if output_type == "multiple_choice":
        lines += [
            f"doc_to_target: !function {module}.doc_to_target_index",
            f"doc_to_choice: !function {module}.doc_to_choice",
        ]
    else:
        lines += [
            f"doc_to_target: !function {module}.doc_to_target",
            "generation_kwargs:",
            "  max_new_tokens: 8",
            "  do_sample: false",
            '  until: ["\\n"]',
        ]
    lines += [f"process_results: !function {module}.process_results", "metric_list:"]
    for metric, function, better in (
        ("acc", "accuracy", "true"),
        ("rstd", "rstd", "false"),
        ("cons", "consistency", "true"),
        ("circular", "circular", "true"),
    ):
        lines += [
            f"  - metric: {metric}",
            f"    aggregation: !function {module}.{function}",
            f"    higher_is_better: {better}",
        ]
    lines += [
        "metadata:",
        "  version: 1",
        f"  posdebias_calibrator: {_quote(calibrator)}",
        f"  posdebias_rotations: {rotations if rotations is not None else n}",
        "",
    ]
    return "\n".join(lines)
