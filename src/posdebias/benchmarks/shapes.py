"""The bundled synthetic source: small images of coloured shapes with exact captions.

Why it exists: tests and the bundled default run need a source that goes through exactly the code
path of the real datasets (docs/benchmarks.md), and the bundled organism model is trained on
it. So the generator writes a COCO-format folder (``images/*.png``, ``annotations/captions_*.json``
and ``annotations/instances_*.json``) that :func:`posdebias.benchmarks.sources.read_coco` reads,
and the categories (the shape kinds) make the adversarial category filter meaningful.

Captions come from a fixed word-level grammar, lowercase words separated by single spaces, no
punctuation::

    caption := object ( " and " object )* " on a " BACKGROUND " background"
    object  := "a " SIZE " " COLOUR " " SHAPE " at the " POSITION

for example ``a small red circle at the left and a large blue square at the top on a white
background``. Every word is in :meth:`ShapeSpace.vocabulary`, so a word-level tokenizer built from
it covers every caption. Everything is a pure function of a seed (numpy ``Generator``); attribute
names are used in their declaration order, never in set or hash order.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posdebias._inputs import CONFIG_LIMIT, read_input_text
from posdebias._io import StagedFolder, make_staging_dir, remove_stale
from posdebias.errors import BenchmarkError, OutputError, validation_message

GENERATOR_NAME = "posdebias.benchmarks.shapes"
SHAPES_FORMAT_VERSION = 1
SPLIT = "shapes"
CAPTIONS_FILE = f"annotations/captions_{SPLIT}.json"
INSTANCES_FILE = f"annotations/instances_{SPLIT}.json"

#: Shape kinds the renderer can draw; a ShapeSpace uses any subset of them.
SHAPE_KINDS = ("circle", "square", "triangle", "diamond", "cross", "star", "hexagon", "ring")

#: The fixed words of the caption grammar (see the module docstring).
GRAMMAR_WORDS = ("a", "and", "at", "background", "on", "the")

_NAME = re.compile(r"^[a-z]+( [a-z]+)*\Z")
# Object colours closer than this (sum of absolute RGB differences) to the background are not
# drawn on it: a red square on a red background would make the caption a lie.
_MIN_CONTRAST = 96

RGB = tuple[int, int, int]


class ShapeSpace(BaseModel):
    """The attribute space of the shapes source (all names are caption words).

    ``sizes`` are object diameters as a fraction of the image side, ``positions`` are object
    centres as (x, y) fractions; ``jitter`` moves each centre by up to that fraction and scales
    each diameter by up to ``1 +- jitter`` so that no two images are pixel-identical templates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    colours: dict[str, RGB] = Field(
        default_factory=lambda: {
            "red": (220, 40, 40),
            "green": (40, 170, 60),
            "blue": (40, 80, 220),
            "yellow": (240, 210, 40),
            "purple": (150, 60, 190),
            "orange": (245, 140, 30),
        }
    )
    shapes: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross", "star")
    sizes: dict[str, float] = Field(
        default_factory=lambda: {"small": 0.22, "medium": 0.3, "large": 0.38}
    )
    positions: dict[str, tuple[float, float]] = Field(
        default_factory=lambda: {
            "left": (0.22, 0.5),
            "right": (0.78, 0.5),
            "top": (0.5, 0.22),
            "bottom": (0.5, 0.78),
            "center": (0.5, 0.5),
        }
    )
    backgrounds: dict[str, RGB] = Field(
        default_factory=lambda: {
            "white": (245, 245, 245),
            "black": (20, 20, 20),
            "gray": (128, 128, 128),
        }
    )
    min_objects: int = Field(default=1, ge=1)
    max_objects: int = Field(default=2, ge=1)
    jitter: float = Field(default=0.03, ge=0.0, le=0.2)

    @model_validator(mode="after")
    def _check(self) -> ShapeSpace:
        for field in ("colours", "sizes", "positions", "backgrounds"):
            if not getattr(self, field):
                raise ValueError(f"{field} must name at least one value")
        if not self.shapes:
            raise ValueError("shapes must name at least one shape kind")
        bad = [name for name in self._names() if not _NAME.fullmatch(name)]
        if bad:
            raise ValueError(
                f"attribute names must be lowercase words separated by single spaces: {bad}"
            )
        unknown = [shape for shape in self.shapes if shape not in SHAPE_KINDS]
        if unknown:
            raise ValueError(f"unknown shape kinds {unknown}; supported: {list(SHAPE_KINDS)}")
        if len(set(self.shapes)) != len(self.shapes):
            raise ValueError(f"shapes has duplicates: {list(self.shapes)}")
        for name, rgb in [*self.colours.items(), *self.backgrounds.items()]:
            if not all(0 <= channel <= 255 for channel in rgb):
                raise ValueError(f"colour {name!r}: RGB values must be in 0..255, got {rgb}")
        for name, diameter in self.sizes.items():
            if not 0.02 <= diameter <= 1.0:
                raise ValueError(
                    f"size {name!r}: diameter fraction must be in 0.02..1, got {diameter}"
                )
        for name, (x, y) in self.positions.items():
            if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
                raise ValueError(f"position {name!r}: (x, y) must be fractions in 0..1")
        if self.min_objects > self.max_objects:
            raise ValueError(f"min_objects {self.min_objects} > max_objects {self.max_objects}")
        if self.max_objects > len(self.positions):
            raise ValueError(
                f"max_objects {self.max_objects} needs at least as many positions, "
                f"got {len(self.positions)} (objects never share a position)"
            )
        for background in self.backgrounds:
            if not self.colours_on(background):
                raise ValueError(f"no object colour is visible on background {background!r}")
        return self

    def colours_on(self, background: str) -> list[str]:
        """Object colours with enough contrast to be drawn on ``background`` (declaration order)."""
        base = self.backgrounds[background]
        return [
            name
            for name, rgb in self.colours.items()
            if sum(abs(a - b) for a, b in zip(rgb, base, strict=True)) >= _MIN_CONTRAST
        ]

    def _names(self) -> list[str]:
        """Every attribute name (each a caption word or words), in declaration order."""
        return [*self.colours, *self.shapes, *self.sizes, *self.positions, *self.backgrounds]

    def vocabulary(self) -> list[str]:
        """Every word a caption can contain, sorted (for building a word-level tokenizer)."""
        words = {word for name in self._names() for word in name.split(" ")}
        return sorted(words | set(GRAMMAR_WORDS))

    def category_id(self, shape: str) -> int:
        """COCO-style category id of a shape kind: its 1-based place in :attr:`shapes`."""
        return self.shapes.index(shape) + 1

    def coco_categories(self) -> list[dict[str, Any]]:
        return [
            {"id": self.category_id(shape), "name": shape, "supercategory": "shape"}
            for shape in self.shapes
        ]


def load_shape_space(path: str | os.PathLike[str]) -> ShapeSpace:
    """Read a :class:`ShapeSpace` from a JSON file, with a clear error for a bad one."""
    source = Path(path)
    text = read_input_text(source, "shape space", limit=CONFIG_LIMIT, error=BenchmarkError)
    try:
        return ShapeSpace.model_validate_json(text)
    except ValidationError as exc:
        raise BenchmarkError(
            validation_message(exc, f"{source}: invalid shape space", unknown="key")
        ) from exc


def _rgb(value: Sequence[int]) -> tuple[int, int, int]:
    red, green, blue = value
    return (red, green, blue)


@dataclass(frozen=True)
class ShapeObject:
    """One drawn shape: its caption words and the exact geometry they were rendered with."""

    shape: str
    colour: str
    size: str
    position: str
    rgb: RGB
    center: tuple[float, float]  # fractions of the image side, jitter included
    diameter: float  # fraction of the image side, jitter included


@dataclass(frozen=True)
class ShapeAttributes:
    """Everything needed to render one image and to caption it."""

    objects: tuple[ShapeObject, ...]
    background: str
    background_rgb: RGB

    @property
    def categories(self) -> tuple[str, ...]:
        """The shape kinds present, each once, in order of appearance."""
        return tuple(dict.fromkeys(obj.shape for obj in self.objects))

    def key(self) -> tuple[Any, ...]:
        """The caption-level identity (jitter ignored): two images with equal keys look alike."""
        return (self.background, *((o.position, o.shape, o.colour, o.size) for o in self.objects))

    def to_json(self) -> dict[str, Any]:
        return {"background": self.background, "objects": [asdict(o) for o in self.objects]}


def sample_shape_attributes(
    rng: np.random.Generator, space: ShapeSpace | None = None
) -> ShapeAttributes:
    """Draw one image's attributes (in memory, no disk): the organism trainer's data source.

    Objects get distinct positions and are listed in the order of :attr:`ShapeSpace.positions`,
    so :func:`caption_for` is canonical.
    """
    space = space or ShapeSpace()
    backgrounds = list(space.backgrounds)
    background = backgrounds[int(rng.integers(len(backgrounds)))]
    colours = space.colours_on(background)
    positions = list(space.positions)
    sizes = list(space.sizes)
    count = int(rng.integers(space.min_objects, space.max_objects + 1))
    chosen = sorted(int(i) for i in rng.choice(len(positions), size=count, replace=False))
    objects = []
    for index in chosen:
        shape = space.shapes[int(rng.integers(len(space.shapes)))]
        colour = colours[int(rng.integers(len(colours)))]
        size = sizes[int(rng.integers(len(sizes)))]
        dx, dy, ds = (float(v) for v in rng.uniform(-space.jitter, space.jitter, size=3))
        x, y = space.positions[positions[index]]
        objects.append(
            ShapeObject(
                shape=shape,
                colour=colour,
                size=size,
                position=positions[index],
                rgb=_rgb(space.colours[colour]),
                center=(x + dx, y + dy),
                diameter=space.sizes[size] * (1.0 + ds),
            )
        )
    return ShapeAttributes(
        objects=tuple(objects),
        background=background,
        background_rgb=_rgb(space.backgrounds[background]),
    )


def _caption(objects: tuple[ShapeObject, ...], background: str) -> str:
    phrases = (f"a {o.size} {o.colour} {o.shape} at the {o.position}" for o in objects)
    return " and ".join(phrases) + f" on a {background} background"


def caption_for(attributes: ShapeAttributes) -> str:
    """The canonical caption (objects in position order), from the fixed grammar."""
    return _caption(attributes.objects, attributes.background)


def captions_for(attributes: ShapeAttributes) -> list[str]:
    """All captions of an image: the canonical one, then each rotation of the object order.

    COCO gives several captions per image; so do we (one per rotation, k captions for k objects).
    """
    objects = attributes.objects
    return [
        _caption(objects[shift:] + objects[:shift], attributes.background)
        for shift in range(len(objects))
    ]


def _star(cx: float, cy: float, radius: float) -> list[tuple[float, float]]:
    """Ten points, alternately on the outer and the inner radius, from the top clockwise."""
    radii = (radius, radius * 0.45) * 5
    angles = (-math.pi / 2 + k * math.pi / 5 for k in range(10))
    return [
        (cx + r * math.cos(a), cy + r * math.sin(a)) for r, a in zip(radii, angles, strict=True)
    ]


def _draw(draw: ImageDraw.ImageDraw, obj: ShapeObject, side: float) -> None:
    cx, cy = obj.center[0] * side, obj.center[1] * side
    r = obj.diameter * side / 2
    fill = tuple(obj.rgb)
    if obj.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif obj.shape == "square":
        h = r * 0.82  # similar area to the circle of the same size
        draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=fill)
    elif obj.shape == "triangle":
        draw.regular_polygon((cx, cy + r * 0.12, r * 1.05), 3, fill=fill)
    elif obj.shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    elif obj.shape == "cross":
        arm = r * 0.36
        draw.rectangle((cx - r, cy - arm, cx + r, cy + arm), fill=fill)
        draw.rectangle((cx - arm, cy - r, cx + arm, cy + r), fill=fill)
    elif obj.shape == "star":
        draw.polygon(_star(cx, cy, r * 1.1), fill=fill)
    elif obj.shape == "hexagon":
        draw.regular_polygon((cx, cy, r), 6, fill=fill)
    elif obj.shape == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=fill, width=max(1, round(r * 0.4)))
    else:  # pragma: no cover - ShapeSpace validation rejects unknown kinds
        raise BenchmarkError(f"cannot draw shape {obj.shape!r}; supported: {list(SHAPE_KINDS)}")


def render_shape_image(
    attributes: ShapeAttributes, size: int = 64, *, supersample: int = 4
) -> Image.Image:
    """Render an RGB image of ``size`` x ``size`` pixels (drawn larger, then box-downsampled)."""
    if size < 8:
        raise BenchmarkError(f"image size {size} is too small to draw shapes; use 8 or more")
    side = size * supersample
    canvas = Image.new("RGB", (side, side), tuple(attributes.background_rgb))
    draw = ImageDraw.Draw(canvas)
    for obj in attributes.objects:
        _draw(draw, obj, side)
    return canvas.resize((size, size), Image.Resampling.BOX)


@dataclass(frozen=True)
class ShapeSample:
    attributes: ShapeAttributes
    caption: str
    image: Image.Image


def iter_shape_samples(
    seed: int, space: ShapeSpace | None = None, image_size: int = 64
) -> Iterator[ShapeSample]:
    """An endless, seeded stream of rendered samples with canonical captions (no disk)."""
    space = space or ShapeSpace()
    rng = np.random.default_rng(seed)
    while True:
        attributes = sample_shape_attributes(rng, space)
        yield ShapeSample(
            attributes, caption_for(attributes), render_shape_image(attributes, image_size)
        )


def _bbox(obj: ShapeObject, size: int) -> list[float]:
    r = obj.diameter * size / 2
    x0 = max(0.0, obj.center[0] * size - r)
    y0 = max(0.0, obj.center[1] * size - r)
    x1 = min(float(size), obj.center[0] * size + r)
    y1 = min(float(size), obj.center[1] * size + r)
    return [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)]


def _dataset_info(count: int, seed: int, space: ShapeSpace, image_size: int) -> dict[str, Any]:
    return {
        "generator": GENERATOR_NAME,
        "format_version": SHAPES_FORMAT_VERSION,
        "count": count,
        "seed": seed,
        "image_size": image_size,
        "space": space.model_dump(mode="json"),
    }


def _dump(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n"


def existing_dataset_info(out_dir: Path) -> dict[str, Any] | None:
    """The generator info of a shapes folder at ``out_dir``, or None if it is not one."""
    try:
        payload = json.loads((out_dir / CAPTIONS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    info = payload.get("info") if isinstance(payload, dict) else None
    if isinstance(info, dict) and info.get("generator") == GENERATOR_NAME:
        return info
    return None


def sample_unique_attributes(
    count: int, seed: int, space: ShapeSpace | None = None
) -> list[ShapeAttributes]:
    """``count`` attribute draws whose captions all differ (so every instance is unambiguous)."""
    space = space or ShapeSpace()
    rng = np.random.default_rng(seed)
    seen: set[tuple[Any, ...]] = set()  # membership only, never iterated
    samples: list[ShapeAttributes] = []
    attempts = misses = 0
    limit = 50 * count + 1000
    while len(samples) < count:
        attempts += 1
        # a space this size is exhausted: 20,000 repeats in a row would take e^-20 luck with
        # even one caption in a thousand still new (and a huge count could draw for an hour)
        if attempts > limit or misses > 20_000:
            raise BenchmarkError(
                f"the shape space gives only about {len(samples)} distinct captions, fewer than "
                f"the {count} images asked for; lower the count or enlarge the ShapeSpace "
                "(more colours, shapes, sizes, positions or objects per image)"
            )
        attributes = sample_shape_attributes(rng, space)
        key = attributes.key()
        if key in seen:
            misses += 1
            continue
        misses = 0
        seen.add(key)
        samples.append(attributes)
    return samples


def generate_shapes_dataset(
    out_dir: str | os.PathLike[str],
    count: int,
    seed: int = 0,
    space: ShapeSpace | None = None,
    image_size: int = 64,
) -> Path:
    """Write ``count`` shapes images as a COCO-format folder at ``out_dir`` and return it.

    Same arguments, same bytes. Images get ids 1..count and file names ``images/000001.png``
    (relative to ``out_dir``, which is the benchmark root). A folder already holding the same
    dataset is reused as is; one holding another shapes dataset and nothing else is replaced;
    any other non-empty folder is refused (we never delete data we did not make). See
    :func:`stage_shapes_dataset` for a build that swaps the folder only once it succeeds.
    """
    staged = stage_shapes_dataset(out_dir, count, seed, space, image_size)
    try:
        staged.commit()
    finally:
        staged.discard()
    return staged.target


def stage_shapes_dataset(
    out_dir: str | os.PathLike[str],
    count: int,
    seed: int = 0,
    space: ShapeSpace | None = None,
    image_size: int = 64,
) -> StagedFolder:
    """Check ``out_dir`` (see :func:`generate_shapes_dataset`) and write the dataset into a
    staging folder beside it, leaving the target as it was until it is committed
    (:class:`posdebias._io.StagedFolder`): a build that fails later (CLIP refused, a full
    disk) never replaces a shared root that other benchmarks are built on. Staging folders a
    killed build left are removed here."""
    space = space or ShapeSpace()
    if count < 1:
        raise BenchmarkError(f"shapes count must be at least 1, got {count}")
    target = Path(out_dir)
    info = _dataset_info(count, seed, space, image_size)
    if target.parent.is_dir():
        remove_stale(target.parent)
    existing = existing_dataset_info(target) if target.exists() else None
    if existing == info:  # the same dataset: nothing to write
        return StagedFolder(target, target, staged=False)
    _check_replaceable(target)
    attributes = sample_unique_attributes(count, seed, space)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = make_staging_dir(target)
    except OSError as exc:
        raise OutputError(f"cannot create {target}: {exc.strerror}") from exc
    # checked again as it is swapped in: a folder made there meanwhile is not replaced
    staged = StagedFolder(target, staging, staged=True, replaceable=_check_replaceable)
    try:
        _write_dataset(staging, attributes, info, space, image_size)
    except OSError as exc:
        staged.discard()
        raise OutputError(f"cannot write the shapes dataset to {target}: {exc.strerror}") from exc
    except BaseException:
        staged.discard()
        raise
    return staged


def _check_replaceable(target: Path) -> None:
    """Refuse a ``target`` a shapes dataset may not replace: a file, a link, or a folder
    holding anything but a shapes dataset (posdebias replaces only what it made)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise BenchmarkError(
            f"{target} is a file or a link; --root must be a folder for --source shapes"
        )
    if not target.exists() or not any(target.iterdir()):
        return
    if existing_dataset_info(target) is None:
        raise BenchmarkError(
            f"{target} is not empty and is not a shapes dataset; choose an empty or new "
            "folder as --root for --source shapes"
        )
    foreign = _foreign_files(target)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise BenchmarkError(
            f"{target} holds files that are not part of the shapes dataset ({shown}); "
            "posdebias replaces only what it made: move them, or choose another --root"
        )


#: The marker file of a generated shapes folder (its generator settings).
MARKER_FILE = ".posdebias-shapes.json"
_OWN_IMAGE = re.compile(r"^\d{6}\.png\Z")


def _foreign_files(folder: Path) -> list[str]:
    """Entries of a shapes folder that the generator did not make (relative names)."""
    foreign = []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if name == MARKER_FILE and entry.is_file() and not entry.is_symlink():
            continue
        if name in ("images", "annotations") and entry.is_dir() and not entry.is_symlink():
            for child in sorted(entry.iterdir()):
                ours = (
                    _OWN_IMAGE.fullmatch(child.name)
                    if name == "images"
                    else child.name in (Path(CAPTIONS_FILE).name, Path(INSTANCES_FILE).name)
                )
                if not ours or child.is_symlink() or not child.is_file():
                    foreign.append(f"{name}/{child.name}")
            continue
        foreign.append(name)
    return foreign


def _write_dataset(
    folder: Path,
    samples: list[ShapeAttributes],
    info: dict[str, Any],
    space: ShapeSpace,
    image_size: int,
) -> None:
    (folder / "images").mkdir()
    (folder / "annotations").mkdir()
    images, captions, objects = [], [], []
    caption_ids = itertools.count(1)
    object_ids = itertools.count(1)
    for image_id, attributes in enumerate(samples, start=1):
        file_name = f"images/{image_id:06d}.png"
        render_shape_image(attributes, image_size).save(folder / file_name, format="PNG")
        images.append(
            {
                "id": image_id,
                "file_name": file_name,
                "width": image_size,
                "height": image_size,
                "attributes": attributes.to_json(),
            }
        )
        for text in captions_for(attributes):
            captions.append({"id": next(caption_ids), "image_id": image_id, "caption": text})
        for obj in attributes.objects:
            bbox = _bbox(obj, image_size)
            objects.append(
                {
                    "id": next(object_ids),
                    "image_id": image_id,
                    "category_id": space.category_id(obj.shape),
                    "bbox": bbox,
                    "area": round(bbox[2] * bbox[3], 2),
                    "iscrowd": 0,
                }
            )
    plain_images = [{k: v for k, v in image.items() if k != "attributes"} for image in images]
    head = {"info": info, "licenses": []}
    for name, payload in (
        (MARKER_FILE, info),
        (CAPTIONS_FILE, {**head, "images": images, "annotations": captions}),
        (
            INSTANCES_FILE,
            {
                **head,
                "images": plain_images,
                "annotations": objects,
                "categories": space.coco_categories(),
            },
        ),
    ):
        (folder / name).write_text(_dump(payload), encoding="utf-8")
