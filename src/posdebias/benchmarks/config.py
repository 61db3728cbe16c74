"""pydantic configuration of a benchmark build (``posdebias build --config FILE`` or flags).

One sub-model per source says what that source reads; the adversarial setting's CLIP options
live in their own optional sub-model, so a random build cannot carry CLIP settings by mistake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import posdebias.defaults as defaults
from posdebias._inputs import UsablePath
from posdebias.benchmarks.selection import DEFAULT_CAPTION_THRESHOLD
from posdebias.benchmarks.shapes import ShapeSpace, load_shape_space
from posdebias.errors import BenchmarkError, validation_message

DEFAULT_COUNT = 1000
SETTINGS = ("random", "adversarial")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Source(_Strict):
    root: UsablePath = Field(description="folder the image file names are relative to")
    skip_missing_images: bool = Field(
        default=False, description="drop listed images that are not on disk instead of stopping"
    )

    def captions_file(self) -> Path | None:
        """The ``captions`` file of a source that reads one (COCO, Flickr8k, JSONL)."""
        captions: Path | None = getattr(self, "captions", None)
        return captions

    def instances_file(self) -> Path | None:
        return None


class CocoSource(_Source):
    """COCO captions (and optionally instances, for the category filter)."""

    kind: Literal["coco"] = "coco"
    captions: UsablePath | None = Field(
        default=None, description="captions_*.json (default: found)"
    )
    instances: UsablePath | None = Field(default=None, description="instances_*.json (categories)")

    def instances_file(self) -> Path | None:
        return self.instances


class Flickr8kSource(_Source):
    """Flickr8k: Flickr8k.token.txt or captions.txt; no categories."""

    kind: Literal["flickr8k"] = "flickr8k"
    captions: UsablePath | None = Field(default=None, description="captions file (default: found)")


class JsonlSource(_Source):
    """One JSON object per line: an image path and its captions."""

    kind: Literal["jsonl"] = "jsonl"
    captions: UsablePath | None = Field(default=None, description="the JSONL file (default: found)")


class ShapesSource(_Source):
    """The bundled synthetic source, generated into ``root`` (a folder of its own)."""

    kind: Literal["shapes"] = "shapes"
    images: int | None = Field(
        default=None,
        ge=1,
        le=defaults.MAX_SHAPES_IMAGES,
        description="images to generate (default: pool size or 2 x count)",
    )
    seed: int = Field(default=0, ge=0, le=defaults.MAX_SEED, description="generator seed")
    image_size: int = Field(
        default=64, ge=8, le=defaults.MAX_IMAGE_SIZE, description="image side in pixels"
    )
    space: ShapeSpace | None = Field(
        default=None, description="attribute space (default: built in)"
    )


Source = Annotated[
    CocoSource | Flickr8kSource | JsonlSource | ShapesSource, Field(discriminator="kind")
]


class AdversarialOptions(_Strict):
    """CLIP hard negatives: the encoder, the caption filter and the embedding cache."""

    clip_model: str | None = Field(
        default=None, description="open_clip model name or model-config JSON (ViT-L-14)"
    )
    clip_pretrained: str | None = Field(
        default=None, description="pretrained tag, local checkpoint, or 'none' (tests only)"
    )
    caption_threshold: float = Field(
        default=DEFAULT_CAPTION_THRESHOLD,
        gt=-1.0,
        le=1.0,
        description="drop images whose caption cosine with the query is >= this",
    )
    drop_category_supersets: bool = False
    cache_dir: UsablePath | None = Field(default=None, description="CLIP embedding cache folder")
    use_cache: bool = True
    device: str | None = None
    batch_size: int = Field(
        default=64, ge=1, le=defaults.MAX_BATCH_SIZE, description="CLIP encoding batch size"
    )


class BuildConfig(_Strict):
    """Everything that defines a benchmark build."""

    source: Source
    out: UsablePath
    setting: Literal["random", "adversarial"] = "random"
    n: int = Field(
        default=defaults.CANDIDATES,
        ge=defaults.MIN_CANDIDATES,
        le=defaults.MAX_CANDIDATES,
        description="images per instance",
    )
    count: int = Field(
        default=DEFAULT_COUNT, ge=1, le=defaults.MAX_INSTANCES, description="instances"
    )
    seed: int = Field(default=0, ge=0, le=defaults.MAX_SEED, description="seed of the draws")
    pool_size: int | None = Field(
        default=None, ge=1, le=defaults.MAX_INSTANCES, description="first K images of the source"
    )
    adversarial: AdversarialOptions | None = None

    @model_validator(mode="after")
    def _adversarial_options(self) -> BuildConfig:
        if self.setting == "adversarial" and self.adversarial is None:
            self.adversarial = AdversarialOptions()
        if self.setting == "random" and self.adversarial is not None:
            raise ValueError(
                "adversarial options are given for a random build; drop them or use "
                "setting: adversarial"
            )
        return self


#: Flat CLI flags -> where they live in the config.
_SOURCE_FLAGS = {
    "root": "root",
    "captions": "captions",
    "instances": "instances",
    "skip_missing_images": "skip_missing_images",
    "shapes_images": "images",
    "shapes_seed": "seed",
    "shapes_image_size": "image_size",
}
_ADVERSARIAL_FLAGS = (
    "clip_model",
    "clip_pretrained",
    "caption_threshold",
    "drop_category_supersets",
    "cache_dir",
    "use_cache",
    "device",
    "batch_size",
)


def build_config_from(data: dict[str, Any], flags: dict[str, Any], where: str) -> BuildConfig:
    """A validated BuildConfig from a config file's mapping plus CLI flags (None: not given).

    Flags override the file; source flags go into ``source``, CLIP flags into ``adversarial``.
    """
    data = dict(data)
    source = dict(data.get("source") or {}) if isinstance(data.get("source"), dict) else {}
    adversarial = data.get("adversarial")
    adversarial = dict(adversarial) if isinstance(adversarial, dict) else adversarial
    space_file = flags.pop("shapes_space", None)
    for flag, value in flags.items():
        if value is None:
            continue
        if flag == "source":
            if source.get("kind") not in (None, value):
                source = {k: v for k, v in source.items() if k in ("root",)}
            source["kind"] = value
        elif flag in _SOURCE_FLAGS:
            source[_SOURCE_FLAGS[flag]] = value
        elif flag in _ADVERSARIAL_FLAGS:
            adversarial = {**(adversarial or {}), flag: value}
        else:
            data[flag] = value
    if space_file is not None:
        source["space"] = load_shape_space(space_file)
    if source:
        data["source"] = source
    if "source" in data and isinstance(data["source"], dict) and "kind" not in data["source"]:
        raise BenchmarkError(
            f"{where}: the source kind is missing; pass --source (one of coco, flickr8k, jsonl, "
            "shapes) or give source: {kind: ...} in the config"
        )
    if adversarial is not None:
        data["adversarial"] = adversarial
    if data.get("setting") == "random" and adversarial is not None and not data.get("adversarial"):
        data.pop("adversarial", None)
    try:
        return BuildConfig.model_validate(data)
    except ValidationError as exc:
        raise BenchmarkError(validation_message(exc, where, unknown="key")) from None
