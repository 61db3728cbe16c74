"""Readers for the on-disk formats of the benchmark sources: each returns a :class:`SourcePool`.

A pool lists every usable image once, with all its captions and (where the source has them) its
object categories, in a deterministic order that does not depend on the file system or on hash
seeds: COCO and shapes by image id, Flickr8k by file name, JSONL in file order. Paths are kept
relative to the root, which is what benchmark files store (docs/benchmarks.md).

Every reader collects all the problems it finds and raises one :class:`BenchmarkError` naming
each (file and line, or JSON location) so a user fixes a file in one pass, not one error a run.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from posdebias._inputs import (
    DATA_LIMIT,
    excerpt,
    jsonl_lines,
    parse_json,
    path_name_problem,
    read_input_text,
)
from posdebias.benchmarks.problems import Problems, json_lines, problems_error
from posdebias.benchmarks.shapes import CAPTIONS_FILE, INSTANCES_FILE
from posdebias.errors import BenchmarkError

SOURCE_KINDS = ("coco", "flickr8k", "jsonl", "shapes")


@dataclass(frozen=True)
class PoolImage:
    """One candidate image of a source.

    ``image_id`` is the source's own identity (COCO id, Flickr8k file name, JSONL path);
    ``path`` is relative to the pool root (POSIX separators); ``categories`` is a sorted tuple of
    object category names, or None when the source has no categories (Flickr8k).
    """

    image_id: str
    path: str
    captions: tuple[str, ...]
    categories: tuple[str, ...] | None


@dataclass(frozen=True)
class SourcePool:
    """All images of a source, plus what a manifest must record about where they came from."""

    kind: str
    root: Path
    images: tuple[PoolImage, ...]
    annotation_files: tuple[Path, ...]
    skipped_missing: tuple[str, ...] = ()

    @property
    def has_categories(self) -> bool:
        return bool(self.images) and all(image.categories is not None for image in self.images)


def read_data_text(path: Path, what: str, flag: str = "--data") -> str:
    """A source file's text, bounded and refused as every input is (``flag`` names it)."""
    return read_input_text(path, what, limit=DATA_LIMIT, error=BenchmarkError, hint=f"check {flag}")


def _read_json(path: Path, what: str, flag: str) -> Any:
    return parse_json(read_data_text(path, what, flag), str(path), error=BenchmarkError)


def check_root(root: Path) -> Path:
    if not root.is_dir():
        raise BenchmarkError(f"--root {root} is not a folder; give the folder holding the images")
    return root.resolve()


def _find_one(folders: Sequence[Path], pattern: str, what: str, flag: str) -> Path:
    found = (path for folder in folders if folder.is_dir() for path in sorted(folder.glob(pattern)))
    unique = list(dict.fromkeys(path.resolve() for path in found))
    if len(unique) == 1:
        return unique[0]
    where = ", ".join(str(folder) for folder in folders)
    if not unique:
        raise BenchmarkError(f"no {what} ({pattern}) found in {where}; pass it with {flag} FILE")
    names = ", ".join(str(path) for path in unique)
    raise BenchmarkError(f"several {what} files found ({names}); choose one with {flag} FILE")


def relative_path(name: str, root: Path) -> str:
    """``name`` as a clean POSIX path relative to ``root`` (already resolved), or ValueError
    saying why not: it escapes the root (by ``..``, by being absolute elsewhere, or through a
    symlink), or no file system can hold a file of that name."""
    problem = path_name_problem(name) or path_name_problem(root / name)
    if problem is not None:
        raise ValueError(problem)
    outside = f"is outside the root {root}"
    path = Path(name)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(root)
        except ValueError:
            raise ValueError(outside) from None
    posix = PurePosixPath(path.as_posix())
    if not posix.parts or ".." in posix.parts or not (root / posix).resolve().is_relative_to(root):
        raise ValueError(outside)
    return posix.as_posix()


def line_image_path(name: str, root: Path, problems: Problems, line: int) -> str | None:
    """:func:`relative_path` of an image named on ``line`` of a source file; why not is noted
    as that line's problem (None)."""
    try:
        return relative_path(name, root)
    except ValueError as exc:
        problems.add(f"image {excerpt(name)} {exc}", line=line)
        return None


def _finish(
    kind: str,
    root: Path,
    images: list[PoolImage],
    annotation_files: Sequence[Path],
    listed_in: Path,
    skip_missing: bool,
) -> SourcePool:
    """Check every image exists under the root; drop or report the missing ones."""
    if not images:
        raise BenchmarkError(f"{listed_in} lists no images with captions; nothing to build from")
    missing = [image.path for image in images if not (root / image.path).is_file()]
    if missing and not skip_missing:
        raise problems_error(
            f"{len(missing)} of {len(images)} images listed in {listed_in} are not under {root}",
            [f"missing image: {path}" for path in missing],
            "Check --root (the folder the file names are relative to), or pass "
            "--skip-missing-images to build from the images that exist.",
        )
    kept = [image for image in images if (root / image.path).is_file()] if missing else images
    if not kept:
        raise BenchmarkError(f"none of the images listed in {listed_in} exist under {root}")
    return SourcePool(
        kind=kind,
        root=root,
        images=tuple(kept),
        annotation_files=tuple(path.resolve() for path in annotation_files),
        skipped_missing=tuple(missing),
    )


# ---------------------------------------------------------------------------------------- COCO


def read_coco(
    root: str | os.PathLike[str],
    captions_file: str | os.PathLike[str] | None = None,
    instances_file: str | os.PathLike[str] | None = None,
    *,
    skip_missing: bool = False,
    kind: str = "coco",
) -> SourcePool:
    """Read a COCO captions file (+ instances file for categories) and the image folder.

    ``root`` is the folder the ``file_name`` entries are relative to (e.g. ``coco/val2014``).
    Without ``captions_file`` we look for exactly one ``captions_*.json`` in ``root/annotations``,
    ``root/../annotations`` or ``root``; without ``instances_file`` for the matching
    ``instances_*.json`` beside it. No instances file: the pool has no categories.
    """
    root_path = check_root(Path(root))
    captions_path, instances_path = _coco_files(root_path, captions_file, instances_file)
    file_names, captions = _coco_captions(captions_path)
    categories = None
    if instances_path is not None:
        categories = _coco_categories(instances_path, set(file_names))
    problems = Problems(captions_path)
    images = []
    owner: dict[str, int] = {}
    for image_id in sorted(file_names):
        relative = _coco_file(image_id, file_names[image_id], owner, root_path, problems)
        if relative is not None:
            images.append(
                PoolImage(
                    image_id=str(image_id),
                    path=relative,
                    captions=tuple(captions[image_id]),
                    categories=None if categories is None else categories.get(image_id, ()),
                )
            )
    problems.raise_any()
    files = [captions_path] + ([instances_path] if instances_path is not None else [])
    return _finish(kind, root_path, images, files, captions_path, skip_missing)


def _coco_files(
    root: Path,
    captions_file: str | os.PathLike[str] | None,
    instances_file: str | os.PathLike[str] | None,
) -> tuple[Path, Path | None]:
    """The captions file (given or found) and the instances file (given, or the one beside it)."""
    if captions_file is None:
        folders = [root / "annotations", root.parent / "annotations", root]
        captions_path = _find_one(folders, "captions_*.json", "COCO captions file", "--captions")
    else:
        captions_path = Path(captions_file)
    if instances_file is not None:
        return captions_path, Path(instances_file)
    guess = captions_path.with_name(captions_path.name.replace("captions_", "instances_", 1))
    return captions_path, guess if guess != captions_path and guess.is_file() else None


def _coco_captions(path: Path) -> tuple[dict[int, str], dict[int, list[str]]]:
    """(image id -> file name, image id -> captions) of a COCO captions file; every image
    needs a caption."""
    payload = _read_json(path, "COCO captions file", "--captions")
    problems = Problems(path)
    file_names = _coco_images(payload, problems)
    captions: dict[int, list[str]] = {image_id: [] for image_id in file_names}
    for index, ann in enumerate(_coco_list(payload, "annotations", problems)):
        caption = _coco_caption(ann, f"annotations[{index}]", captions, problems)
        if caption is not None:
            captions[ann["image_id"]].append(caption)
    if not problems:
        uncaptioned = [image_id for image_id, texts in captions.items() if not texts]
        problems.extend(f"image id {image_id} has no caption" for image_id in sorted(uncaptioned))
    problems.raise_any("Fix the captions file or choose another.")
    return file_names, captions


def _coco_caption(
    ann: Any, where: str, captions: dict[int, list[str]], problems: Problems
) -> str | None:
    """The normalised caption of one annotation, or None with its problem noted."""
    if not isinstance(ann, dict):
        problems.add(f"{where}: not an object")
        return None
    image_id, caption = ann.get("image_id"), ann.get("caption")
    if not isinstance(image_id, int) or isinstance(image_id, bool):
        problems.add(f"{where}: image_id must be an integer, got {excerpt(image_id)}")
    elif image_id not in captions:
        problems.add(f"{where}: image_id {image_id} is not in the images list")
    elif not isinstance(caption, str) or not caption.strip():
        problems.add(f"{where} (image {image_id}): caption is missing or empty")
    else:
        return " ".join(caption.split())
    return None


def _coco_file(
    image_id: int, file_name: str, owner: dict[str, int], root: Path, problems: Problems
) -> str | None:
    """The path of one image relative to the root (each image id its own file), or None with
    its problem noted."""
    try:
        relative = relative_path(file_name, root)
    except ValueError as exc:
        problems.add(f"image {image_id}: file_name {excerpt(file_name)} {exc}")
        return None
    if relative in owner:
        problems.add(
            f"image {image_id}: file_name {excerpt(relative)} is also the file of image "
            f"{owner[relative]}; each image id needs its own file"
        )
        return None
    owner[relative] = image_id
    return relative


def _coco_list(payload: Any, key: str, problems: Problems) -> list[Any]:
    if not isinstance(payload, dict) or not isinstance(payload.get(key), list):
        problems.add(f"top level: a COCO file needs a {key!r} list")
        return []
    return payload[key]


def _coco_images(payload: Any, problems: Problems) -> dict[int, str]:
    file_names: dict[int, str] = {}
    for index, image in enumerate(_coco_list(payload, "images", problems)):
        where = f"images[{index}]"
        if not isinstance(image, dict):
            problems.add(f"{where}: not an object")
            continue
        image_id, file_name = image.get("id"), image.get("file_name")
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            problems.add(f"{where}: id must be an integer, got {excerpt(image_id)}")
        elif not isinstance(file_name, str) or not file_name:
            problems.add(f"{where} (id {image_id}): file_name is missing")
        elif image_id in file_names:
            problems.add(f"{where}: duplicate image id {image_id}")
        else:
            file_names[image_id] = file_name
    return file_names


def _coco_categories(path: Path, image_ids: set[int]) -> dict[int, tuple[str, ...]]:
    """Image id -> sorted category names, from a COCO instances file."""
    payload = _read_json(path, "COCO instances file", "--instances")
    problems = Problems(path)
    names: dict[int, str] = {}
    for index, category in enumerate(_coco_list(payload, "categories", problems)):
        if (
            not isinstance(category, dict)
            or not isinstance(category.get("id"), int)
            or not isinstance(category.get("name"), str)
        ):
            problems.add(f"categories[{index}]: needs an integer id and a name")
            continue
        names[category["id"]] = category["name"]
    found: dict[int, set[str]] = {}
    for index, ann in enumerate(_coco_list(payload, "annotations", problems)):
        if not isinstance(ann, dict):
            problems.add(f"annotations[{index}]: not an object")
            continue
        image_id, category_id = ann.get("image_id"), ann.get("category_id")
        if category_id not in names:
            problems.add(f"annotations[{index}]: unknown category_id {excerpt(category_id)}")
        elif image_id in image_ids:
            found.setdefault(image_id, set()).add(names[category_id])
    problems.raise_any("Fix the instances file or choose another.")
    return {image_id: tuple(sorted(cats)) for image_id, cats in found.items()}


# ------------------------------------------------------------------------------------ Flickr8k


def read_flickr8k(
    root: str | os.PathLike[str],
    captions_file: str | os.PathLike[str] | None = None,
    *,
    skip_missing: bool = False,
) -> SourcePool:
    """Read Flickr8k captions (``Flickr8k.token.txt`` or the CSV ``captions.txt``) + images.

    ``root`` is the image folder. The format is recognised from the content: a CSV with the
    header ``image,caption``, or ``name.jpg#k<TAB>caption`` lines. Flickr8k has no object
    categories, so the adversarial category filter is skipped (and the manifest says so).
    """
    root_path = check_root(Path(root))
    if captions_file is None:
        candidates = [
            root_path / "captions.txt",
            root_path.parent / "captions.txt",
            root_path / "Flickr8k.token.txt",
            root_path.parent / "Flickr8k.token.txt",
            root_path.parent / "Flickr8k_text" / "Flickr8k.token.txt",
        ]
        existing = [path for path in candidates if path.is_file()]
        if len(existing) != 1:
            listed = ", ".join(str(path) for path in (existing or candidates))
            raise BenchmarkError(
                f"{'several' if existing else 'no'} Flickr8k captions files found ({listed}); "
                "pass one with --captions FILE"
            )
        captions_path = existing[0]
    else:
        captions_path = Path(captions_file)
    text = read_data_text(captions_path, "Flickr8k captions file", "--captions")
    problems = Problems(captions_path)
    lines = jsonl_lines(text)
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.lower().replace(" ", "") == "image,caption":
        captions = _flickr_csv(text, problems)
    elif "\t" in first and "#" in first.split("\t", 1)[0]:
        captions = _flickr_token(lines, problems)
    else:
        raise BenchmarkError(
            f"{captions_path}:1: not a Flickr8k captions file: expected the CSV header "
            f"'image,caption' or 'name.jpg#0<TAB>caption' lines, got {excerpt(first)}"
        )
    images = []
    for name in sorted(captions):
        try:
            relative = relative_path(name, root_path)
        except ValueError as exc:
            problems.add(f"image name {excerpt(name)} {exc}")
            continue
        ordered = tuple(caption for _, caption in sorted(captions[name], key=lambda kc: kc[0]))
        images.append(PoolImage(image_id=name, path=relative, captions=ordered, categories=None))
    problems.raise_any("Fix the captions file.")
    return _finish("flickr8k", root_path, images, [captions_path], captions_path, skip_missing)


def _flickr_token(lines: list[str], problems: Problems) -> dict[str, list[tuple[int, str]]]:
    captions: dict[str, list[tuple[int, str]]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        name, hash_, k = key.strip().rpartition("#")
        if not tab or not hash_ or not name or not re.fullmatch(r"[0-9]{1,9}", k):
            problems.add(f"expected 'name.jpg#k<TAB>caption', got {excerpt(line)}", line=number)
        elif not caption.strip():
            problems.add(f"empty caption for {name}", line=number)
        else:
            captions.setdefault(name, []).append((int(k), " ".join(caption.split())))
    return captions


def _flickr_csv(text: str, problems: Problems) -> dict[str, list[tuple[int, str]]]:
    captions: dict[str, list[tuple[int, str]]] = {}
    reader = csv.reader(jsonl_lines(text))
    next(reader)  # the header, checked by the caller
    for row in reader:
        number = reader.line_num
        if not row or not any(field.strip() for field in row):
            continue
        # unquoted commas inside a caption split it into more fields: join them back
        name, caption = row[0].strip(), ",".join(row[1:])
        if not name or len(row) < 2:
            got = excerpt(",".join(row))
            problems.add(f"expected 'image,caption', got {got}", line=number)
        elif not caption.strip():
            problems.add(f"empty caption for {name}", line=number)
        else:
            index = len(captions.get(name, []))
            captions.setdefault(name, []).append((index, " ".join(caption.split())))
    return captions


# --------------------------------------------------------------------------------------- JSONL

_JSONL_KEYS = ("image", "caption", "categories")


def read_jsonl(
    root: str | os.PathLike[str],
    captions_file: str | os.PathLike[str] | None,
    *,
    skip_missing: bool = False,
) -> SourcePool:
    """Read a JSONL of ``{"image": path, "caption": text, "categories": [names]?}`` lines.

    Paths are relative to ``root``. An image may appear on several lines (several captions);
    categories, if given, must be given for every image and agree between its lines.
    """
    root_path = check_root(Path(root))
    if captions_file is None:
        raise BenchmarkError("--source jsonl needs the JSONL file: pass it with --captions FILE")
    path = Path(captions_file)
    problems = Problems(path)
    captions: dict[str, list[str]] = {}
    categories: dict[str, tuple[str, ...] | None] = {}
    first_line: dict[str, int] = {}
    text = read_data_text(path, "JSONL captions file", "--captions")
    for number, record in json_lines(text, problems):
        entry = _caption_line(record, root_path, problems, number)
        if entry is None:
            continue
        relative, caption, cats = entry
        if relative in categories and categories[relative] != cats:
            problems.add(
                f"categories of {relative} differ from line {first_line[relative]}", line=number
            )
            continue
        first_line.setdefault(relative, number)
        categories[relative] = cats
        captions.setdefault(relative, []).append(caption)
    if any(cats is not None for cats in categories.values()):
        for name, cats in categories.items():
            if cats is None:
                problems.add(f"{name} has no categories but other images do", line=first_line[name])
    problems.raise_any("Fix the JSONL file.")
    images = [
        PoolImage(image_id=name, path=name, captions=tuple(texts), categories=categories[name])
        for name, texts in captions.items()
    ]
    return _finish("jsonl", root_path, images, [path], path, skip_missing)


def _caption_line(
    record: Any, root: Path, problems: Problems, number: int
) -> tuple[str, str, tuple[str, ...] | None] | None:
    """(image path relative to the root, caption, sorted categories or None) of one line, or
    None with its problems noted."""
    if not isinstance(record, dict):
        problems.add("expected an object with image and caption", line=number)
        return None
    unknown = sorted(key for key in record if key not in _JSONL_KEYS)
    image, caption, cats = record.get("image"), record.get("caption"), record.get("categories")
    if unknown:
        problems.add(f"unknown keys {unknown}; allowed: {list(_JSONL_KEYS)}", line=number)
    if not isinstance(image, str) or not image.strip():
        problems.add("'image' must be a non-empty path", line=number)
        return None
    relative = line_image_path(image, root, problems, number)
    if relative is None:
        return None
    if not isinstance(caption, str) or not caption.strip():
        problems.add("'caption' must be a non-empty string", line=number)
        return None
    if cats is not None and (
        not isinstance(cats, list) or not all(isinstance(c, str) and c for c in cats)
    ):
        problems.add("'categories' must be a list of names", line=number)
        return None
    normalised = None if cats is None else tuple(sorted(dict.fromkeys(cats)))
    return relative, " ".join(caption.split()), normalised


def read_source(
    kind: str,
    root: str | os.PathLike[str],
    captions_file: str | os.PathLike[str] | None = None,
    instances_file: str | os.PathLike[str] | None = None,
    *,
    skip_missing: bool = False,
) -> SourcePool:
    """Dispatch to the reader of ``kind`` (one of :data:`SOURCE_KINDS`)."""
    if kind in ("coco", "shapes"):
        if kind == "shapes" and captions_file is None:
            captions_file = Path(root) / CAPTIONS_FILE
            instances_file = instances_file or Path(root) / INSTANCES_FILE
        return read_coco(root, captions_file, instances_file, skip_missing=skip_missing, kind=kind)
    if instances_file is not None:
        raise BenchmarkError(f"--instances is only used with --source coco, not {kind}")
    if kind == "flickr8k":
        return read_flickr8k(root, captions_file, skip_missing=skip_missing)
    if kind == "jsonl":
        return read_jsonl(root, captions_file, skip_missing=skip_missing)
    raise BenchmarkError(f"unknown source {kind!r}; choose one of {list(SOURCE_KINDS)}")
