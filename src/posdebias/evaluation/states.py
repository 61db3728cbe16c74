"""Calibration states of a run: the one gate deciding whether a saved state fits a use, the
metadata a fitted state records, and saving a set of states (safe names, all files or none).

Every door (``posdebias evaluate``/``calibrate``, :class:`~posdebias.Debiaser`, the lmms-eval
and lm-eval harnesses) records and checks states through :func:`state_metadata` and
:func:`check_state`, so a state made by one is accepted by every other for the same use.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from posdebias._inputs import excerpt
from posdebias._io import remove_stale, write_files_together
from posdebias._rundir import RunFolder
from posdebias._text import one_line
from posdebias.adapters.base import Adapter, describe_adapter
from posdebias.calibrators.base import Calibrator
from posdebias.core.state import RECALIBRATE, CalibrationState, StateUse, calibration_error
from posdebias.core.tasks import TaskTemplate, former_digest
from posdebias.errors import (
    Advice,
    CalibrationError,
    CalibrationErrors,
    ConfigError,
    Door,
    InputError,
    OutputError,
)
from posdebias.evaluation.config import label_problem


def _template(adapter: Adapter, task: str) -> TaskTemplate | None:
    """The adapter's template for ``task``, or None for an adapter without task templates."""
    templates = getattr(adapter, "task_templates", None)
    template = templates.get(task) if isinstance(templates, dict) else None
    return template if isinstance(template, TaskTemplate) else None


def task_prompt_hash(adapter: Adapter, task: str, n: int | None = None) -> str | None:
    """The prompt hash a calibration state records for ``task``: the digest of the adapter's
    template for that task (an adapter without task templates: the ``prompt_hash`` it
    describes), so that a state fitted on one task's prompt is refused for another's, joined
    with the prompt options given (:data:`PROMPT_OPTIONS`, a chat template)."""
    template = _template(adapter, task)
    hashed = template.digest() if template else describe_adapter(adapter, n).get("prompt_hash")
    return None if hashed is None else _with_prompt_options(adapter, str(hashed))


#: Adapter options that change what the model reads or how its answer is scored beside the
#: task template: a state fitted under other values measured another prompt.
PROMPT_OPTIONS = ("answer_prefix", "answer_space", "logits_processors", "image_size", "max_patches")


def _with_prompt_options(adapter: Adapter, digest: str) -> str:
    """``digest`` joined with the prompt options set away from their defaults and the digest of
    a chat template given as an option (none of them: as is)."""
    options = getattr(adapter, "options", None)  # a plugin adapter may keep none
    fields = getattr(type(options), "model_fields", {})
    given = {k: getattr(options, k) for k in PROMPT_OPTIONS if k in fields}
    given = {k: v for k, v in given.items() if v != fields[k].default}
    chat = describe_adapter(adapter).get("chat_template_sha256")
    if chat is not None:
        given["chat_template"] = chat
    if not given:
        return digest
    joined = f"{digest}\x1f{json.dumps(given, sort_keys=True, default=str)}"
    return hashlib.sha256(joined.encode()).hexdigest()


def prompt_hashes(adapter: Adapter, task: str, n: int | None = None) -> tuple[str | None, ...]:
    """Every hash a state fitted with ``adapter``'s prompt for ``task`` may record: today's
    (:func:`task_prompt_hash`), then a retrieval template's older form's (recorded by states
    made before retrieval became a task template)."""
    template = _template(adapter, task) if task == "retrieval" else None
    older = None if template is None else former_digest(template)
    own = task_prompt_hash(adapter, task, n)
    return (own,) if older is None else (own, _with_prompt_options(adapter, older))


def state_metadata(adapter: Adapter, task: str, n: int | None = None) -> dict[str, Any]:
    """What a state fitted through ``adapter`` for ``task`` records beside its numbers."""
    described = describe_adapter(adapter, n)
    return {
        "model_id": described.get("model_id"),
        "prompt_hash": task_prompt_hash(adapter, task, n),
    }


def check_state(
    state: CalibrationState,
    adapter: Adapter,
    calibrator: Calibrator,
    n: int,
    task: str,
    *,
    transfer: bool = False,
    source: str | None = None,
) -> CalibrationState:
    """``state`` if it fits its use by ``calibrator`` through ``adapter`` on ``task`` with N
    candidates, else a CalibrationError naming every mismatch (and ``source``, the state's file
    or label): the calibrator, N, layers, labels, adapter, options, prompt and (unless
    ``transfer``) the model must be those it was made for, and it must hold what the
    calibrator reads from it. The one gate of every door."""
    current, *former = prompt_hashes(adapter, task, n)
    use = StateUse(
        calibrator=calibrator.name,
        n=n,
        layers=adapter.attention_layers if calibrator.needs_attention else None,
        label_set=adapter.labels_for(n, task),
        adapter=adapter.name,
        options=calibrator.options.model_dump(mode="json"),
        prompt_hash=current,
        former_prompt_hashes=tuple(h for h in former if h),
        model_id=None if transfer else describe_adapter(adapter, n).get("model_id"),
        reads=calibrator.state_reads(state),
        own_parameters=calibrator.Fitted,
    )
    state.check_compatible(use, source=source)
    return state


#: At most this many problems are listed (a folder of hundreds of broken files): the rest counted.
LISTED_PROBLEMS = 20


class StateRefusals:
    """The refusals of the states one use loads and checks, raised together: a folder with two
    unusable files, or a file unreadable beside a state that does not fit, says so at once.

    Each refusal keeps its reason; the advice refusals give is said once, after the list (the
    command line's own on the command line), and a path in a reason stays on its line."""

    def __init__(self) -> None:
        self.errors: list[InputError] = []

    def add(self, error: InputError) -> None:
        if all(str(error) != str(seen) for seen in self.errors):  # one state, two equal uses
            self.errors.append(error)

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        """Keep an InputError raised inside the block for :meth:`raise_any`."""
        try:
            yield
        except InputError as exc:
            self.add(exc)

    def raise_any(self) -> None:
        """Raise the one refusal as it was, several as one CalibrationError listing them."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            library = self._listed("library")
            advice = Advice(library, self._listed("cli"), self._listed("harness"))
            raise CalibrationErrors(library, advice=advice, errors=self.errors)

    def _listed(self, door: Door) -> str:
        reasons: list[str] = []
        advice: list[str] = []
        for error in self.errors:
            text = error.message_for(door)
            said = error.advice.at(door) if error.advice is not None else ""
            if said and text.endswith(said):
                text = text.removesuffix(said)
                advice = _merged(advice, said)
            reasons.append(f"  - {one_line(text.rstrip(' ;.'))}")
        if len(reasons) > LISTED_PROBLEMS:
            reasons[LISTED_PROBLEMS:] = [f"  ... and {len(reasons) - LISTED_PROBLEMS} more"]
        lines = [f"{len(self.errors)} problems with the calibration states:", *reasons]
        return "\n".join([*lines, *(said[:1].upper() + said[1:] for said in advice)])


def _merged(advice: list[str], said: str) -> list[str]:
    """``advice`` with ``said`` added unless it is said already: one advice that another
    extends (calibrate again; calibrate again, or allow the transfer) is said once, whole."""
    if any(known.startswith(said) for known in advice):
        return advice  # said already, or within a longer advice
    return [*(known for known in advice if not said.startswith(known)), said]


def row_states(
    saved: Mapping[str, CalibrationState], label: str, calibrator: Calibrator
) -> dict[str, CalibrationState]:
    """The saved states a calibrator row uses, by key: those saved under its label
    (``<label>.json``, or ``<label>.n<N>.json`` per N as :meth:`Debiaser.save` writes several
    N), else those its kind fitted under other labels (fitted with the row's options where
    some are), for each N the first such row's (``calibrate -N 4 --out n4.json`` and ``-N 5
    --out n5.json`` serve N = 4 and 5 as one save would). Two states of the row's kind for one
    N are refused (a CalibrationError naming the files: each door would pick its own)."""
    rows: dict[str, dict[str, CalibrationState]] = {}
    for key, state in saved.items():
        rows.setdefault(row_label(key, state), {})[key] = state
    found = rows.get(label)
    if found is None:
        options = calibrator.options.model_dump(mode="json")
        kind = [
            row
            for row in rows.values()
            if all(s.calibrator == calibrator.name for s in row.values())
        ]
        alike = [row for row in kind if all(s.options == options for s in row.values())]
        found = {}
        for row in alike or kind:
            served = {state.n for state in found.values()}
            found.update({key: s for key, s in row.items() if s.n not in served})
    by_n: dict[int, list[str]] = {}
    for key, state in found.items():
        if state.calibrator == calibrator.name:
            by_n.setdefault(state.n, []).append(key)
    for n_twice, keys in sorted(by_n.items()):
        if len(keys) > 1:
            raise two_states_error(label, n_twice, keys)
    return found


def two_states_error(label: str, n: int, keys: Sequence[str]) -> CalibrationError:
    """A row with two states of its kind for one N: each door would pick its own."""
    return CalibrationError(
        f"{len(keys)} states of {label!r} for N={n} ({', '.join(f'{k}.json' for k in keys)}): "
        "keep one (a state per N is <label>.n<N>.json, one N alone <label>.json)"
    )


def file_name_problem(file: Path, state: CalibrationState) -> str | None:
    """Why a folder's state file cannot name the row it serves (``pride.n5.json`` holding
    N = 4; a name no calibrator label may have), or None."""
    key = file.stem
    match = _PER_N.fullmatch(key)
    if match is not None and int(match["n"]) != state.n:
        return (
            f"{file} holds a state for N={state.n}, but its name says N={int(match['n'])}: "
            f"name it {match['label']}.n{state.n}.json"
        )
    label = row_label(key, state)
    unfit = label_problem(label)
    if unfit is not None:
        return (
            f"calibration state {file}: its name {excerpt(label)} cannot be a calibrator "
            f"label ({unfit}): rename the file"
        )
    return None


def fitted_for_other_n(
    label: str, fitted_n: Iterable[int], n: int, asker: str, files: Sequence[str] = ()
) -> CalibrationError:
    """A calibrator whose states serve other N than the ``n`` that ``asker`` ("this run",
    "this query") has: every N it was fitted for (and their ``files``) named, with each
    door's way to fit N."""
    shown = ", ".join(f"N={k}" for k in sorted(set(fitted_n)))
    where = f" ({', '.join(files)})" if files else ""
    return calibration_error(
        f"calibrator {label!r} was fitted for {shown} candidates{where}, but {asker} has N={n}: a "
        "fitted calibration serves the N it was fitted for. ",
        Advice(
            f"Calibrate with instances of N={n} as well: Debiaser.calibrate(instances) takes "
            "instances of several N at once.",
            RECALIBRATE.cli,
            RECALIBRATE.harness,
        ),
    )


def pick_state(
    saved: Mapping[str, CalibrationState], label: str, calibrator: Calibrator, n: int
) -> str | None:
    """Which saved state a calibrator row uses for N = ``n`` (its key): of its states
    (:func:`row_states`), the one fitted for ``n``. A calibrator that needs a fit and has
    states of other N only is refused: with one, that state goes to the gate (which names all
    it does not fit); with several, every N they serve is named (one that needs no fit serves
    any N without one)."""
    found = row_states(saved, label, calibrator)
    for_n = sorted(
        (key for key, state in found.items() if state.n == n),
        key=lambda key: found[key].calibrator != calibrator.name,  # its kind first
    )
    options = calibrator.options.model_dump(mode="json")
    kin = {  # fitted as the row asks, for other N (else the gate names each mismatch of one)
        key: state
        for key, state in found.items()
        if state.calibrator == calibrator.name and state.options == options
    }
    if for_n or not calibrator.needs_fit or len(kin) < 2:
        return next(iter(for_n or (found if calibrator.needs_fit else ())), None)
    files = [f"{key}.json" for key in kin]
    raise fitted_for_other_n(label, (s.n for s in kin.values()), n, "this run", files)


def state_file(path: Path, key: str) -> str:
    """The file a state of :func:`load_states` (key ``key``) was read from, as refusals name it."""
    return str(path / f"{key}.json" if path.is_dir() else path)


def row_source(path: Path, key: str, state: CalibrationState, row: str) -> str:
    """The file of the state a calibrator ``row`` uses, as refusals name it: with
    ``(for 'ROW')`` when it is a state of the row's kind saved under another name."""
    other = row_label(key, state) != row
    return state_file(path, key) + (f" (for {row!r})" if other else "")


def load_states(path: Path, refusals: StateRefusals | None = None) -> dict[str, CalibrationState]:
    """Calibration states from a file or a directory of ``<label>.json`` files. With
    ``refusals`` a folder's files that cannot be read, or whose names cannot name their row
    (:func:`file_name_problem`), are kept there (raised with the checks' refusals that follow)
    and the others returned; else they are raised here."""
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise CalibrationError(f"{path} holds no calibration state (*.json)")
        own = refusals if refusals is not None else StateRefusals()
        states = {}
        for file in files:
            with own.checking():
                state = CalibrationState.load(file)
                misnamed = file_name_problem(file, state)
                if misnamed is not None:  # each door would read another row from it
                    raise CalibrationError(misnamed)
                states[file.stem] = state
        if refusals is None:
            own.raise_any()
        return states
    state = CalibrationState.load(path)  # one file: nothing else to name beside it
    return {state.calibrator: state}


def check_label(label: str) -> str:
    """``label`` if it is safe as a file name, else a ConfigError saying what is allowed."""
    problem = label_problem(label)
    if problem is not None:
        raise ConfigError(f"calibrator label {repr(label)[:70]} cannot name a file: {problem}")
    return label


#: A state file of a folder of states: ``<label>.json`` or ``<label>.n<N>.json`` (a label:
#: :func:`~posdebias.evaluation.config.label_problem`).
_STATE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}(\.n[0-9]{1,3})?\.json\Z")
#: The key of the state of one of several N: ``<label>.n<N>`` (:meth:`Debiaser.save`).
_PER_N = re.compile(r"(?P<label>.+)\.n(?P<n>[0-9]+)\Z")


def state_key(label: str, n: int, several: bool) -> str:
    """The key (file stem) of a row's state: ``<label>``, or ``<label>.n<N>`` when the row has
    states for several N (:func:`row_label` reads it back)."""
    return f"{label}.n{n}" if several else label


def row_label(key: str, state: CalibrationState) -> str:
    """The calibrator row a saved state's key names: the key, less ``.n<N>`` for its N."""
    match = _PER_N.fullmatch(key)
    return match["label"] if match and int(match["n"]) == state.n else key


def states_folder(folder: str | Path, *, flag: str = "--out") -> RunFolder:
    """A folder of calibration states (``posdebias calibrate --out DIR``) through the one
    run-directory layer: a folder is ours when it holds only state files, which are never
    links; it is locked while states are fitted and written."""
    return RunFolder(
        folder, marker=None, own=_STATE_FILE, kind="folder of calibration states", flag=flag
    )


def save_states(states: Mapping[str, CalibrationState], folder: str | Path) -> list[Path]:
    """Write ``<key>.json`` for every state into ``folder`` (a key: its label, or
    ``<label>.n<N>`` for the state of one of several N), together or not at all.

    A state of the same name is replaced; other labels' states stay. A save that would leave
    another state of a label it writes (another N's, or one named the other way) is refused,
    naming it: the folder would hold two states of a row for one N, or N the saved calibration
    no longer has, and nothing is deleted for the user. A file that is not a calibration state
    is never replaced.
    """
    root = Path(folder)
    rows = {check_label(row_label(key, state)) for key, state in states.items()}
    files = {f"{key}.json": state.to_json().encode() for key, state in states.items()}
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root} is a file; give a folder for the calibration states")
    if root.is_dir():
        remove_stale(root)
        for name in files:
            check_replaceable(root / name)
        others: dict[str, str] = {}  # file name -> its row
        for file in sorted(root.glob("*.json")):
            if file.name not in files:
                with contextlib.suppress(InputError, OSError):  # not a state: not a row's
                    label = row_label(file.stem, CalibrationState.load(file))
                    if label in rows:
                        others[file.name] = label
        if others:
            labels = ", ".join(map(repr, sorted(set(others.values()))))
            raise OutputError(
                f"{root} holds other states of {labels} that this save would not replace "
                f"({', '.join(others)}): the folder would hold two states of a calibrator for "
                "one N, or N this calibration does not have; remove them, or save into another "
                "folder"
            )
    return write_files_together(root, files)


def check_replaceable(path: Path) -> None:
    """Refuse to write a state where something posdebias did not make is (a file of another
    kind, a folder, a link)."""
    if path.is_symlink() or (path.exists() and (path.is_dir() or not is_state_file(path))):
        raise OutputError(
            f"{path} exists and is not a calibration state; posdebias does not replace files "
            "it did not make: move it or choose another location"
        )


def is_state_file(path: Path) -> bool:
    """Whether ``path`` holds a calibration state (what posdebias may replace)."""
    try:
        CalibrationState.load(path)
    except Exception:  # any reason it is not ours: do not replace it
        return False
    return True
