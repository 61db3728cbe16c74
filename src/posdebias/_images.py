"""Opening image files: raster formats only, a decoded-pixel cap, and early downscaling.

Every image posdebias reads from disk goes through :func:`open_image`:

* only the formats in :data:`ALLOWED_FORMATS` are tried. Pillow would otherwise recognise EPS
  (which runs Ghostscript when it is installed) and a dozen exotic formats.
* an image whose header announces more than :func:`max_image_pixels` pixels is refused before
  it is decoded (the limit is ``POSDEBIAS_MAX_IMAGE_PIXELS``, default 100 million).
* with ``min_side``, a large image is shrunk while it is decoded (JPEG's DCT scaling) or right
  after (an integer box reduction), never below ``min_side`` pixels on its short side, so a batch
  holds small images however large the files are. Only one image is ever held at full size.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from posdebias._inputs import IMAGE_FILE_LIMIT, check_regular_file
from posdebias.errors import InputError

#: Pillow format names we open; anything else is refused.
ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
#: Decoded pixels (width x height) an image may have unless ``POSDEBIAS_MAX_IMAGE_PIXELS`` says
#: otherwise: a 10000 x 10000 photo is allowed, a decompression bomb is not.
DEFAULT_MAX_IMAGE_PIXELS = 100_000_000
MAX_PIXELS_ENV = "POSDEBIAS_MAX_IMAGE_PIXELS"


def max_image_pixels() -> int:
    """The decoded-pixel cap: ``$POSDEBIAS_MAX_IMAGE_PIXELS`` or the default."""
    text = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_IMAGE_PIXELS
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise InputError(f"{MAX_PIXELS_ENV}={text[:40]!r} is not a positive whole number of pixels")
    return int(text)


def open_image(
    path: str | os.PathLike[str], *, what: str = "image", min_side: int | None = None
) -> Any:
    """An RGB PIL image from ``path`` (see the module docstring for what is refused).

    ``what`` prefixes error messages (e.g. ``instance 'x': image``).
    """
    from PIL import Image, ImageFile, UnidentifiedImageError

    path = os.path.expanduser(path)  # ~ is the home folder, as at every door
    check_regular_file(path, f"{what} file", limit=IMAGE_FILE_LIMIT, error=InputError)
    source, shown = Path(path), repr(path)  # whole, quoted, escaped
    cap = max_image_pixels()
    try:
        with warnings.catch_warnings():
            # our own cap decides; Pillow's warning would only repeat it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source, formats=ALLOWED_FORMATS) as image:
                width, height = image.size
                if width * height > cap:
                    raise _too_large(what, shown, width, height, cap)
                if image.format not in ALLOWED_FORMATS:  # defensive: formats= already limits
                    raise _not_allowed(what, shown, image.format)
                if min_side is not None:
                    image.draft("RGB", _draft_size(width, height, min_side))
                # A truncated file is an error even where another library (lmms-eval does, on
                # import) switched Pillow's process-wide LOAD_TRUNCATED_IMAGES on.
                tolerant = ImageFile.LOAD_TRUNCATED_IMAGES
                ImageFile.LOAD_TRUNCATED_IMAGES = False
                try:
                    image.load()
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = tolerant
                factor = _reduce_factor(image.size, min_side)
                if factor >= 2 and image.mode in ("RGB", "RGBA", "L", "LA"):
                    return image.reduce(factor).convert("RGB")  # shrink before any copy
                rgb = image.convert("RGB")
                return rgb.reduce(factor) if factor >= 2 else rgb
    except InputError:
        raise  # ours, already clear (InputError is a ValueError: keep it out of the next clause)
    except Image.DecompressionBombError:
        raise _too_large(what, shown, None, None, cap) from None
    except UnidentifiedImageError:
        raise InputError(
            f"{what} file {shown} cannot be read as an image: it is not one of the allowed "
            f"formats ({', '.join(ALLOWED_FORMATS)})"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        # truncated or corrupt data; Pillow raises all of these depending on the format
        raise InputError(
            f"{what} file {shown} cannot be read as an image ({str(exc)[:120]})"
        ) from None


def _draft_size(width: int, height: int, min_side: int) -> tuple[int, int]:
    """The smallest size JPEG draft may scale to without the short side going below
    ``min_side`` (draft keeps the aspect ratio and only scales by 1/2, 1/4, 1/8)."""
    short = min(width, height)
    if short <= min_side:
        return (width, height)
    scale = min_side / short
    return (max(1, int(width * scale)), max(1, int(height * scale)))


def _reduce_factor(size: tuple[int, int], min_side: int | None) -> int:
    """The integer box-reduction factor that keeps the short side at least ``min_side``."""
    return 1 if min_side is None else max(1, min(size) // max(1, min_side))


def _too_large(
    what: str, source: str, width: int | None, height: int | None, cap: int
) -> InputError:
    size = (
        f"{width} x {height} = {width * height:,} pixels" if width and height else "too many pixels"
    )
    return InputError(
        f"{what} file {source} is too large to decode ({size}; the limit is {cap:,} pixels). "
        f"Shrink the image, or raise the limit with {MAX_PIXELS_ENV}"
    )


def _not_allowed(what: str, source: str, fmt: str | None) -> InputError:
    return InputError(
        f"{what} file {source} is a {fmt} image; posdebias opens only "
        f"{', '.join(ALLOWED_FORMATS)}: convert it to PNG or JPEG"
    )


#: A processor size above this is a pixel count (Qwen2-VL's ``max_pixels``), not a side.
_AREA_THRESHOLD = 16_384


def min_image_side(processor: Any) -> int | None:
    """How far an image may be shrunk before ``processor`` sees it: twice the largest size it
    resizes to (``size``, ``crop_size``, ``image_grid_pinpoints``, ``max_pixels``), so the
    processor still does the final resize itself. None (never shrink) when it names no size."""
    image_processor = getattr(processor, "image_processor", processor)
    numbers: list[float] = []

    def collect(value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)) and value > 0:
            numbers.append(value**0.5 if value > _AREA_THRESHOLD else value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif hasattr(value, "__dataclass_fields__"):  # transformers' SizeDict
            for name in value.__dataclass_fields__:
                collect(getattr(value, name, None))
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    for name in ("size", "crop_size", "image_grid_pinpoints", "max_pixels", "min_pixels"):
        collect(getattr(image_processor, name, None))
    return 2 * int(max(numbers)) if numbers else None
