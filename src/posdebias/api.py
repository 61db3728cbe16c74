"""The library API for application code: calibrate once, then rank images for a caption."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posdebias.adapters.base import Adapter
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import ImageRef, RetrievalInstance, image_key
from posdebias.core.observation import Prediction
from posdebias.core.state import CalibrationState
from posdebias.errors import CalibrationError
from posdebias.evaluation.runner import fit_calibrators
from posdebias.registry import get_registry


class Debiaser:
    """A model adapter plus one calibrator, fitted once and reused for every query.

    >>> debiaser = Debiaser(adapter)                    # attention_guided by default
    >>> debiaser.calibrate(calibration_instances)       # 5 instances x N rotations
    >>> debiaser.save("calibration.json")
    >>> debiaser.rank("a red circle", ["a.png", "b.png", "c.png", "d.png"]).choice
    """

    def __init__(
        self,
        adapter: Adapter,
        calibrator: str | Calibrator = "attention_guided",
        *,
        batch_size: int = 1,
        **options: Any,
    ) -> None:
        self.adapter = adapter
        if isinstance(calibrator, Calibrator):
            self.calibrator = calibrator
        else:
            self.calibrator = get_registry().create_calibrator(calibrator, **options)
        self.batch_size = batch_size
        self.state: CalibrationState | None = None

    def calibrate(self, instances: Sequence[RetrievalInstance]) -> CalibrationState:
        """Fit on the N cyclic rotations of each calibration instance (targets known)."""

        described = self.adapter.describe()
        self.state = fit_calibrators(
            self.adapter,
            {self.calibrator.name: self.calibrator},
            list(instances),
            batch_size=self.batch_size,
            metadata={k: described.get(k) for k in ("model_id", "prompt_hash")},
        )[self.calibrator.name]
        return self.state

    def save(self, path: str | Path) -> Path:
        return self._fitted().save(path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        adapter: Adapter,
        *,
        batch_size: int = 1,
        transfer: bool = False,
    ) -> Debiaser:
        """A debiaser from a saved state; refused if made with another adapter or prompt, or
        on another model unless ``transfer`` says that is intended."""
        state = CalibrationState.load(path)
        described = adapter.describe()
        state.check_compatible(
            adapter=adapter.name,
            prompt_hash=described.get("prompt_hash"),
            model_id=None if transfer else described.get("model_id"),
        )
        debiaser = cls(adapter, state.calibrator, batch_size=batch_size, **state.options)
        debiaser.state = state
        return debiaser

    def _fitted(self) -> CalibrationState:
        if self.state is None:
            raise CalibrationError(
                "this Debiaser is not calibrated: call .calibrate(instances) or Debiaser.load()"
            )
        return self.state

    def rank(self, query: str, images: Sequence[ImageRef]) -> Prediction:
        """Calibrated scores of the images (in the given order) for ``query``."""
        state = self._fitted()
        keys = "\x1f".join(image_key(image) for image in images)
        ident = "query-" + hashlib.sha1(f"{query}\x1e{keys}".encode()).hexdigest()[:12]
        instance = RetrievalInstance(query=query, images=tuple(images), target=None, id=ident)
        state.check_compatible(
            n=instance.n,
            layers=self.adapter.attention_layers if self.calibrator.needs_attention else None,
            label_set=self.adapter.labels_for(instance.n),
        )
        views = (
            self.calibrator.views_of(instance) if self.calibrator.needs_rotations else [instance]
        )
        observations = self.adapter.observe_many(views, batch_size=self.batch_size)
        rotations = observations if self.calibrator.needs_rotations else None
        return self.calibrator.predict(observations[0], state, rotations=rotations)
