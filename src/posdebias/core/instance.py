"""A multi-image retrieval instance and the candidate-order arithmetic around it.

Convention used everywhere (instances, observations, calibrators): rotating by ``shift`` puts old
position ``(i + shift) % N`` at new position ``i``. An ``order`` is a permutation array: new
position ``i`` shows the image that sat at position ``order[i]`` of the base instance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posdebias.errors import InputError

ImageRef = Any  # a path (str / Path) or a PIL.Image.Image


def image_key(image: ImageRef) -> str:
    """A stable identity string for an image reference (path text, or the object's id)."""
    if isinstance(image, (str, Path)):
        return str(image)
    return f"<{type(image).__name__}@{id(image):x}>"


@dataclass(frozen=True, eq=False)
class RetrievalInstance:
    """A query and N candidate images, exactly one of which (``target``) matches.

    Attributes:
        query: the caption text.
        images: N image references (paths or PIL images), in the order shown to the model.
        target: 0-based position of the matching image in ``images`` (None at inference).
        id: a stable identifier (used for caching, resuming and reports).
        metadata: free-form extras (anchor id, setting, similarities, ...).
        image_ids: stable identities of the images (default: their paths); kept through
            permutations so predictions can be mapped back to images.
    """

    query: str
    images: tuple[ImageRef, ...]
    target: int | None
    id: str
    metadata: dict[str, Any] = field(default_factory=dict)
    image_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():
            raise InputError(f"instance {self.id!r}: the query (caption) is empty")
        images = tuple(self.images)
        object.__setattr__(self, "images", images)
        n = len(images)
        if n < 2:
            raise InputError(f"instance {self.id!r}: needs at least 2 images, got {n}")
        ids = tuple(self.image_ids) if self.image_ids else tuple(image_key(im) for im in images)
        if len(ids) != n:
            raise InputError(f"instance {self.id!r}: {len(ids)} image_ids for {n} images")
        if len(set(ids)) != n:
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise InputError(f"instance {self.id!r}: duplicate images {dupes}; each must differ")
        object.__setattr__(self, "image_ids", ids)
        if self.target is None:
            return
        if isinstance(self.target, bool) or not isinstance(self.target, (int, np.integer)):
            raise InputError(f"instance {self.id!r}: target must be an int, got {self.target!r}")
        if not 0 <= int(self.target) < n:
            raise InputError(
                f"instance {self.id!r}: target index {self.target} is out of range for {n} "
                f"images (valid: 0..{n - 1})"
            )
        object.__setattr__(self, "target", int(self.target))

    @property
    def n(self) -> int:
        return len(self.images)

    def permuted(self, order: Sequence[int] | np.ndarray) -> RetrievalInstance:
        """The same instance with candidates shown in ``order`` (new i shows old order[i])."""
        checked = check_permutation(order, self.n)
        target = self.target
        return RetrievalInstance(
            query=self.query,
            images=tuple(self.images[k] for k in checked),
            target=None if target is None else int(np.flatnonzero(checked == target)[0]),
            id=self.id,
            metadata=self.metadata,
            image_ids=tuple(self.image_ids[k] for k in checked),
        )

    def rotated(self, shift: int) -> RetrievalInstance:
        """Cyclic rotation: new position i shows old position (i + shift) % N."""
        return self.permuted(rotation_order(self.n, shift))

    def image_id_at(self, position: int) -> str:
        """Which image (by identity) sits at ``position`` of this order."""
        return self.image_ids[position]


def check_permutation(order: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    array = np.asarray(order, dtype=np.int64)
    if array.shape != (n,) or sorted(array.tolist()) != list(range(n)):
        raise InputError(f"{list(order)} is not a permutation of 0..{n - 1}")
    return array


def rotation_order(n: int, shift: int) -> np.ndarray:
    """The permutation of a cyclic rotation by ``shift`` (new i shows old (i + shift) % N)."""
    return (np.arange(n) + shift) % n


def check_order_count(n: int, count: int) -> None:
    """Refuse more distinct candidate orders than N images have (N!)."""
    if count > math.factorial(n):
        raise InputError(
            f"{count} distinct candidate orders requested, but {n} images have only "
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


def positions_to_base(order: Sequence[int] | np.ndarray, values: np.ndarray) -> np.ndarray:
    """Map a per-position vector of a permuted order back to base-instance positions.

    ``values[i]`` belongs to the image shown at position i, i.e. base image ``order[i]``.
    """
    out = np.empty_like(values)
    out[np.asarray(order)] = values
    return out
