"""An instance: a stem and N candidates at positions, and the candidate-order arithmetic.

An instance is a stem (a caption, a question, a query; optionally images of its own) plus N
candidates, each an image, a text (an option, an answer to judge, a passage) or an image with a
text. Its ``task`` names the prompt it is posed with (:mod:`posdebias.core.tasks`). The classic
multi-image retrieval instance (a caption and N candidate images) is the ``retrieval`` task.

Convention used everywhere (instances, observations, calibrators): rotating by ``shift`` puts old
position ``(i + shift) % N`` at new position ``i``. An ``order`` is a permutation array: new
position ``i`` shows the candidate that sat at position ``order[i]`` of the base instance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._inputs import text_problem
from posdebias.errors import InputError

ImageRef = Any  # a path (str / Path) or a PIL.Image.Image


def image_key(image: ImageRef) -> str:
    """A stable identity string for an image reference (path text, or the object's id)."""
    if isinstance(image, (str, Path)):
        return str(image)
    return f"<{type(image).__name__}@{id(image):x}>"


#: The task kinds: which prompt an instance is posed with (templates in core/tasks.py).
TASK_KINDS = ("retrieval", "multiple_choice", "pairwise_judge", "rerank")
#: What a task's candidates are called in the prompt variants' sentences and in text meant
#: for people (messages, reports); code and record keys say "candidate".
CANDIDATE_NOUNS: dict[str, str] = {
    "retrieval": "images",
    "multiple_choice": "options",
    "pairwise_judge": "answers",
    "rerank": "passages",
}


def candidate_noun(task: str | None, *, plural: bool = True) -> str:
    """What ``task`` calls its candidates ("options" for multiple choice); "candidates" when
    the task is not known."""
    noun = CANDIDATE_NOUNS.get(task or "", "candidates")
    return noun if plural else noun[:-1]


#: Longest text of a stem or a candidate, in characters (a passage of a few pages).
MAX_TEXT_CHARS = 100_000


def text_key(text: str) -> str:
    """The identity of a text candidate: its text (whitespace as given)."""
    return f"text:{text}"


@dataclass(frozen=True)
class Candidate:
    """One candidate: an image, a text, or both (an image with its caption or option text)."""

    image: ImageRef | None = None
    text: str | None = None

    @property
    def kind(self) -> str:
        """``image``, ``text`` or ``image_text``."""
        if self.image is not None and self.text is not None:
            return "image_text"
        return "image" if self.image is not None else "text"


def _check_encodable(label: str, where: str, text: str) -> None:
    """Refuse a text that is no valid Unicode (:func:`posdebias._inputs.text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise InputError(f"{label}: {where} {problem}")


@dataclass(frozen=True, eq=False)
class Instance:
    """A stem and N candidates, at most one of which (``target``) is the right one.

    Attributes:
        stem: the stem text (the caption of retrieval, the question, the query).
        images: per candidate, its image reference (a path or a PIL image), or None for a
            text-only candidate; may be left empty when every candidate is a text.
        target: 0-based position of the right candidate (None at inference).
        id: a stable identifier (used for caching, resuming and reports).
        metadata: free-form extras (anchor id, setting, similarities, source, ...).
        candidate_ids: stable identities of the candidates (default: an image's path, a
            text's ``text:`` + text; both joined for an image with a text); kept through
            permutations so predictions map back to candidates.
        texts: per candidate, its text or None; may be left empty for image-only candidates.
        stem_images: images shown with the stem (a multi-image question), never candidates.
        task: the task kind (:data:`TASK_KINDS`), which selects the prompt template.
        content_free: a content-free view made by contextual calibration; only such a view may
            have an empty stem (Zhao et al.'s content-free inputs include the empty string).
    """

    stem: str
    images: tuple[ImageRef | None, ...] = ()
    target: int | None = None
    id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    candidate_ids: tuple[str, ...] = ()
    texts: tuple[str | None, ...] = ()
    stem_images: tuple[ImageRef, ...] = ()
    task: str = "retrieval"
    content_free: bool = False

    def __post_init__(self) -> None:
        label = f"instance {self.id!r}"
        if not isinstance(self.stem, str) or not (self.stem.strip() or self.content_free):
            raise InputError(f"{label}: the stem (caption, question or query) is empty")
        _check_encodable(label, "the stem", self.stem)
        if self.task not in TASK_KINDS:
            raise InputError(f"{label}: unknown task {self.task!r}; choose one of {TASK_KINDS}")
        images = tuple(self.images)
        texts = tuple(self.texts)
        if images and texts and len(images) != len(texts):
            raise InputError(f"{label}: {len(images)} candidate images but {len(texts)} texts")
        n = max(len(images), len(texts))
        images = images or (None,) * n
        texts = texts or (None,) * n
        what = candidate_noun(self.task)
        if n < 2:
            raise InputError(f"{label}: needs at least 2 {what}, got {n}")
        for position, (image, text) in enumerate(zip(images, texts, strict=True), start=1):
            if text is not None and (not isinstance(text, str) or not text.strip()):
                raise InputError(f"{label}: candidate {position}'s text is empty")
            if text is not None:
                _check_encodable(label, f"candidate {position}'s text", text)
            if image is None and text is None:
                raise InputError(f"{label}: candidate {position} has neither an image nor a text")
        self._check_task(label, images, texts)
        object.__setattr__(self, "images", images)
        object.__setattr__(self, "texts", texts)
        object.__setattr__(self, "stem_images", tuple(self.stem_images))
        ids = (
            tuple(self.candidate_ids)
            if self.candidate_ids
            else tuple(_candidate_key(im, tx) for im, tx in zip(images, texts, strict=True))
        )
        if len(ids) != n:
            raise InputError(f"{label}: {len(ids)} candidate_ids for {n} {what}")
        if len(set(ids)) != n:
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise InputError(f"{label}: duplicate {what} {dupes}; each must differ")
        object.__setattr__(self, "candidate_ids", ids)
        if self.target is None:
            return
        if isinstance(self.target, bool) or not isinstance(self.target, (int, np.integer)):
            raise InputError(f"{label}: target must be an int, got {self.target!r}")
        if not 0 <= int(self.target) < n:
            raise InputError(
                f"{label}: target index {self.target} is out of range for {n} {what} "
                f"(valid: 0..{n - 1})"
            )
        object.__setattr__(self, "target", int(self.target))

    def _check_task(
        self, label: str, images: tuple[ImageRef | None, ...], texts: tuple[str | None, ...]
    ) -> None:
        if self.task == "retrieval":
            if any(image is None for image in images) or any(t is not None for t in texts):
                raise InputError(
                    f"{label}: a retrieval instance has image candidates only; pose text "
                    "candidates as multiple_choice, pairwise_judge or rerank"
                )
            if self.stem_images:
                raise InputError(f"{label}: a retrieval instance has no stem images")
        if self.task == "pairwise_judge" and len(images) != 2:
            raise InputError(f"{label}: a pairwise judgement has 2 answers, got {len(images)}")

    @property
    def n(self) -> int:
        return len(self.images)

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """The N candidates in the order shown."""
        return tuple(
            Candidate(image=image, text=text)
            for image, text in zip(self.images, self.texts, strict=True)
        )

    @property
    def candidate_images(self) -> tuple[ImageRef, ...]:
        """The images of the candidates that have one, in order."""
        return tuple(image for image in self.images if image is not None)

    @property
    def all_images(self) -> tuple[ImageRef, ...]:
        """Every image of the prompt: the stem's first, then the candidates' in order."""
        return (*self.stem_images, *self.candidate_images)

    @property
    def has_texts(self) -> bool:
        return any(text is not None for text in self.texts)

    def permuted(self, order: Sequence[int] | np.ndarray) -> Instance:
        """The same instance with candidates shown in ``order`` (new i shows old order[i])."""
        checked = check_permutation(order, self.n)
        target = self.target
        return replace(
            self,
            images=tuple(self.images[k] for k in checked),
            target=None if target is None else int(np.flatnonzero(checked == target)[0]),
            candidate_ids=tuple(self.candidate_ids[k] for k in checked),
            texts=tuple(self.texts[k] for k in checked),
        )

    def rotated(self, shift: int) -> Instance:
        """Cyclic rotation: new position i shows old position (i + shift) % N."""
        return self.permuted(rotation_order(self.n, shift))

    def candidate_id_at(self, position: int) -> str:
        """Which candidate (by identity) sits at ``position`` of this order."""
        return self.candidate_ids[position]


def _candidate_key(image: ImageRef | None, text: str | None) -> str:
    if text is None:
        return image_key(image)
    if image is None:
        return text_key(text)
    return f"{image_key(image)}\x1f{text_key(text)}"


def check_permutation(order: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    array = np.asarray(order, dtype=np.int64)
    if array.shape != (n,) or sorted(array.tolist()) != list(range(n)):
        raise InputError(f"{list(order)} is not a permutation of 0..{n - 1}")
    return array


def rotation_order(n: int, shift: int) -> np.ndarray:
    """The permutation of a cyclic rotation by ``shift`` (new i shows old (i + shift) % N)."""
    return (np.arange(n) + shift) % n


def check_order_count(n: int, count: int) -> None:
    """Refuse more distinct candidate orders than N candidates have (N!)."""
    if count > math.factorial(n):
        raise InputError(
            f"{count} distinct candidate orders requested, but {n} candidates have only "
            f"{math.factorial(n)}; use --orders {math.factorial(n)} or fewer"
        )


def random_orders(
    n: int, count: int, seed: int | Sequence[int], *, identity_first: bool = False
) -> list[np.ndarray]:
    """``count`` DISTINCT candidate orders drawn with ``seed`` (no global RNG state).

    Drawn without replacement: permutations are drawn in turn and a repeat is skipped, so the
    first orders are those a with-replacement draw would give. ``identity_first`` puts the file
    order first (the authors' protocol). More orders than N! is an error
    (:func:`check_order_count`), never a silent repeat.
    """
    check_order_count(n, count)
    rng = np.random.default_rng(seed)
    orders: list[np.ndarray] = [np.arange(n)] if identity_first and count else []
    seen = {tuple(order.tolist()) for order in orders}
    while len(orders) < count:
        order = rng.permutation(n)
        key = tuple(order.tolist())
        if key not in seen:
            seen.add(key)
            orders.append(order)
    return orders
