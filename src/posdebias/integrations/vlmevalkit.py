"""A VLMEvalKit model class: calibrated answers from VLMEvalKit's Python API.

VLMEvalKit has no plugin mechanism: a model is a class in its ``vlmeval/config.py`` table
``supported_VLM``. Add posdebias there (the docs page "In lmms-eval and VLMEvalKit")::

    from functools import partial
    from posdebias.integrations.vlmevalkit import PosdebiasVLM
    supported_VLM["posdebias-organism"] = partial(
        PosdebiasVLM, pretrained="posdebias/organism", calibrators="attention_guided",
        calibration="states/")

A VLMEvalKit message is a list of ``{"type": "image" | "text", "value": path or text}``. The
images are the N candidates (in the order shown) and the texts, joined, are the query; the
answer is the calibrated label (``label_set="upper"`` answers ``"A"``..., as VLMEvalKit's
multiple-choice scoring expects). With VLMEvalKit installed the class subclasses its
``vlmeval.vlm.base.BaseModel``; without it, it offers the same interface
(:class:`VLMEvalKitInterface`), so it is usable and testable either way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

from posdebias.core.instance import Instance
from posdebias.errors import ConfigError, InputError
from posdebias.integrations.harness import FROM_TASK, HarnessConfig, HarnessDebiaser

__all__ = ["PosdebiasVLM", "message_instance"]


class VLMEvalKitInterface:
    """What VLMEvalKit's inference calls on a model (``vlmeval.vlm.base.BaseModel``):
    ``generate(message, dataset)``, ``use_custom_prompt``, ``build_prompt``,
    ``set_dump_image``, ``INTERLEAVE``; used when VLMEvalKit is not installed."""

    INTERLEAVE = False
    allowed_types: ClassVar[list[str]] = ["text", "image", "video"]

    def __init__(self) -> None:
        self.dump_image_func: Any = None

    def use_custom_prompt(self, dataset: str | None) -> bool:
        return False

    def build_prompt(self, line: Any, dataset: str | None = None) -> list[dict[str, str]]:
        raise NotImplementedError

    def set_dump_image(self, dump_image_func: Any) -> None:
        self.dump_image_func = dump_image_func

    def dump_image(self, line: Any, dataset: str | None) -> Any:
        return self.dump_image_func(line)

    def generate_inner(self, message: list[dict[str, str]], dataset: str | None = None) -> str:
        raise NotImplementedError

    def generate(self, message: Any, dataset: str | None = None) -> str:
        """VLMEvalKit's entry: a message as a string, a dict, or a list of them."""
        if isinstance(message, (str, dict)):
            message = [message]
        items = [
            item if isinstance(item, dict) else {"type": "text", "value": str(item)}
            for item in message
        ]
        return self.generate_inner(items, dataset)


try:  # the real base class where VLMEvalKit is installed
    from vlmeval.vlm.base import BaseModel as _Base
except ImportError:  # VLMEvalKit absent (or not importable here): its documented interface
    _Base = VLMEvalKitInterface


class PosdebiasVLM(_Base):
    """posdebias as a VLMEvalKit model: settings as in lmms-eval's ``--model_args``
    (:class:`~posdebias.integrations.harness.HarnessConfig`); calibrated at construction from
    a saved state or a benchmark folder."""

    INTERLEAVE = False
    is_api = False

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        config = HarnessConfig.from_arguments(settings, "PosdebiasVLM settings")
        if config.calibration == FROM_TASK:
            raise ConfigError(
                "calibration=task is for lmms-eval tasks; in VLMEvalKit pass a saved state "
                "(`posdebias calibrate`) or a benchmark folder"
            )
        rank, world = _rank_and_world()
        self.harness = HarnessDebiaser(
            config, rank=rank, world_size=world, barrier=_barrier if world > 1 else None
        )
        self.harness.calibrate()

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Where the calibration came from (a saved state, a benchmark: path and hashes)."""
        return self.harness.provenance

    def generate_inner(self, message: list[dict[str, str]], dataset: str | None = None) -> str:
        """The calibrated label for a message whose images are the candidates."""
        instance = message_instance(message, dataset)
        ranking = self.harness.answers([instance])[0]
        return self.harness.labels(instance)[ranking.choice]


def message_instance(message: Sequence[dict[str, Any]], dataset: str | None) -> Instance:
    """A VLMEvalKit message as an instance: its images the candidates, its texts the query."""
    images = [item["value"] for item in message if item.get("type") == "image"]
    texts = [str(item["value"]) for item in message if item.get("type") == "text"]
    where = f"dataset {dataset!r}" if dataset else "this message"
    if len(images) < 2:
        raise InputError(
            f"{where} gives {len(images)} image(s): posdebias needs the N >= 2 candidates as "
            "the message's images (text options are not candidates this version reads)"
        )
    query = "\n".join(text for text in texts if text.strip())
    if not query:
        raise InputError(f"{where} has no text: posdebias needs the query as text")
    key = "\x1f".join([query, *(str(image) for image in images)])
    ident = "vlm-" + hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return Instance(stem=query, images=tuple(images), target=None, id=ident)


def _rank_and_world() -> tuple[int, int]:
    """VLMEvalKit runs data-parallel under torchrun with a process group: rank 0 fits and
    the others wait for it there. Without a process group each process is on its own."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
