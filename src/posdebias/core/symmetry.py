"""Cyclic symmetrisation of calibration data (docs/method.md, "Calibration").

Rotating each of M calibration instances through all N shifts puts the truth at every position
exactly M times, so the conditional profile Lobs[i, :] is estimated from the same content for
every truth position i and differs only by position.
"""

from __future__ import annotations

from collections.abc import Iterable

from posdebias.core.instance import Instance
from posdebias.errors import InputError


def cyclic_rotations(instance: Instance) -> list[Instance]:
    """The N cyclic rotations of ``instance``; element r is ``instance.rotated(r)``."""
    return [instance.rotated(shift) for shift in range(instance.n)]


def symmetrized_calibration_set(
    instances: Iterable[Instance],
) -> list[Instance]:
    """All cyclic rotations of all calibration instances (M*N instances, instance-major)."""
    instances = list(instances)
    sizes = {instance.n for instance in instances}
    if len(sizes) > 1:
        raise InputError(f"calibration instances must all have the same N, got {sorted(sizes)}")
    return [rotated for instance in instances for rotated in cyclic_rotations(instance)]
