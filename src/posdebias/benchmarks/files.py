"""The benchmark file (``benchmark.jsonl``) and its ``manifest.json``: schema, writing, loading.

One JSON object per line (keys sorted, no spaces) describes one instance: ``id``, ``query``,
``images`` (paths relative to the root), ``target`` (index of the anchor), ``anchor_image_id``,
``setting``, ``caption_index`` (which of the anchor's captions is the query) and, in the
adversarial setting, ``similarities`` (CLIP image cosine of each image with the anchor image) and
``caption_similarities`` (highest caption cosine of each image with the query). The manifest
records everything needed to rebuild the file and check it is the one that was built: source and
annotation hashes, setting, N, seed, CLIP model and weights, filters, counts, the sha256 of the
JSONL and the package version. Both files are written atomically; the same build gives the same
bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import posdebias.defaults as defaults
from posdebias._inputs import (
    CONFIG_LIMIT,
    DATA_LIMIT,
    confined_path,
    excerpt,
    jsonl_lines,
    parse_json,
    path_name_problem,
    read_input_bytes,
    read_input_text,
    text_problem,
)
from posdebias._io import write_files_together
from posdebias._rundir import RunFolder
from posdebias.benchmarks.problems import Problems, problems_error
from posdebias.benchmarks.shapes import existing_dataset_info
from posdebias.core.instance import (
    MAX_TEXT_CHARS,
    TASK_KINDS,
    Instance,
    text_key,
)
from posdebias.errors import Advice, BenchmarkError, InputError, validation_problems

BENCHMARK_FILE = "benchmark.jsonl"
MANIFEST_FILE = "manifest.json"
#: Version 1: retrieval only (written unchanged for retrieval builds); version 2: a manifest
#: with a ``task`` and lines of candidates of any kind. Readers take both.
FORMAT_VERSION = 1
TASK_FORMAT_VERSION = 2
MAX_STEM_IMAGES = 16
MIN_N, MAX_N = defaults.MIN_CANDIDATES, defaults.MAX_CANDIDATES
#: Largest count or index a benchmark file or manifest may record (images of a source, the
#: caption of an image): far above any real dataset, far below what breaks arithmetic.
MAX_INDEX = 10**9

#: random / adversarial distractors; ``given``: the candidates as the source lists them.
Setting = Literal["random", "adversarial", "given"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class InstanceRecord(_Strict):
    """One line of ``benchmark.jsonl``.

    A retrieval line (no ``task`` key; the format of version 1, unchanged) has a caption and N
    image paths. A line of another task (``task`` set) has a stem (``query``), N candidates given
    by ``texts`` and / or ``images`` (one entry per candidate, null where a candidate has none)
    and optional ``stem_images``; ``target`` is the 0-based position of the right candidate.
    """

    id: str = Field(min_length=1)
    task: str | None = None
    query: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    images: list[str | None] | None = Field(default=None, min_length=MIN_N, max_length=MAX_N)
    texts: list[str | None] | None = Field(default=None, min_length=MIN_N, max_length=MAX_N)
    stem_images: list[str] | None = Field(default=None, max_length=MAX_STEM_IMAGES)
    target: int = Field(ge=0, le=MAX_N - 1)
    anchor_image_id: str | None = None
    setting: Setting | None = None
    caption_index: int | None = Field(default=None, ge=0, le=MAX_INDEX)
    similarities: list[float] | None = None
    caption_similarities: list[float] | None = None
    meta: dict[str, str | int | float | bool] | None = Field(default=None, max_length=32)

    @model_validator(mode="after")
    def _consistent(self) -> InstanceRecord:
        if not self.query.strip():
            raise ValueError("the query (caption) is empty or whitespace; give each line a caption")
        if self.task is None:
            self._check_retrieval()
        else:
            self._check_candidates()
        n = self.n
        if self.target >= n:
            what = "images" if self.task is None else "candidates"
            raise ValueError(f"target {self.target} is out of range for {n} {what}")
        for name in ("similarities", "caption_similarities"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} values for {n} images")
        return self

    @model_validator(mode="before")
    @classmethod
    def _check_texts(cls, data: Any) -> Any:
        """Every text of the line (ids, stem, candidates, paths, metadata keys and values) can
        be written and tokenized (:func:`text_problem`), named by its field."""
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            values = (
                value.items()
                if isinstance(value, dict)
                else enumerate(value)
                if isinstance(value, list)
                else [(None, value)]
            )
            for key, item in values:
                for text in (key, item):
                    problem = text_problem(text) if isinstance(text, str) else None
                    if problem is not None:
                        where = name if key is None else f"{name}[{key!a}]"
                        raise ValueError(f"{where} {problem}")
        return data

    def _check_retrieval(self) -> None:
        missing = [
            name
            for name in ("images", "anchor_image_id", "setting", "caption_index")
            if getattr(self, name) is None
        ]
        if missing:
            raise ValueError(f"a retrieval line needs {', '.join(missing)}")
        if self.texts is not None or self.stem_images is not None:
            raise ValueError("texts and stem_images need a task (multiple_choice, ...)")
        images = [image for image in self.images or [] if image is not None]
        if len(images) != len(self.images or []):
            raise ValueError("a retrieval line lists an image for every candidate")
        repeated = sorted({image for image in images if images.count(image) > 1})
        if repeated:
            raise ValueError(f"duplicate images {repeated}: each candidate must be different")

    def _check_candidates(self) -> None:
        if self.task not in TASK_KINDS or self.task == "retrieval":
            kinds = [kind for kind in TASK_KINDS if kind != "retrieval"]
            raise ValueError(f"unknown task {self.task!r}; choose one of {kinds} (or no task)")
        if self.images is None and self.texts is None:
            raise ValueError("a candidate line needs texts, images or both")
        if (
            self.images is not None
            and self.texts is not None
            and len(self.images) != len(self.texts)
        ):
            raise ValueError(f"{len(self.images)} images but {len(self.texts)} texts")
        absent = [None] * self.n
        pairs = list(zip(self.images or absent, self.texts or absent, strict=True))
        for position, (image, text) in enumerate(pairs):
            if image is None and (text is None or not text.strip()):
                raise ValueError(f"candidate {position + 1} has neither an image nor a text")
            if text is not None and len(text) > MAX_TEXT_CHARS:
                raise ValueError(
                    f"candidate {position + 1}'s text has {len(text)} characters, over the "
                    f"limit of {MAX_TEXT_CHARS}"
                )
        if len(set(pairs)) != len(pairs):
            raise ValueError("two candidates are the same; each candidate must be different")
        if self.task == "pairwise_judge" and self.n != 2:
            raise ValueError(f"a pairwise judgement has 2 answers, got {self.n}")

    @property
    def n(self) -> int:
        return len(self.images if self.images is not None else self.texts or [])

    def image_paths(self) -> list[str]:
        """Every image path of the line: the stem's, then the candidates'."""
        return [*(self.stem_images or []), *(im for im in self.images or [] if im is not None)]


class AnnotationFile(_Strict):
    path: str
    sha256: str


class SourceInfo(_Strict):
    kind: str
    annotation_files: list[AnnotationFile]
    images_in_source: int = Field(ge=0, le=MAX_INDEX)
    skipped_missing_images: int = Field(default=0, ge=0, le=MAX_INDEX)
    pool_size: int = Field(ge=0, le=MAX_INDEX)
    has_categories: bool
    shapes: dict[str, Any] | None = None  # generator settings for --source shapes


class ClipInfo(_Strict):
    model: str
    pretrained: str
    identity: dict[str, Any]
    random_weights: bool = False


class FilterInfo(_Strict):
    category: Literal["equal", "equal_or_superset", "skipped"]
    category_filter_skipped: bool
    category_skip_reason: str | None = None
    caption_threshold: float


class BenchmarkManifest(_Strict):
    """``manifest.json``: how a benchmark was built (no timestamps: rebuilds are identical)."""

    format_version: int = Field(default=FORMAT_VERSION, ge=1, le=TASK_FORMAT_VERSION)
    task: str | None = None
    package_version: str
    root: str
    source: SourceInfo
    setting: Setting
    n: int = Field(ge=MIN_N, le=MAX_N)
    count: int = Field(ge=1, le=defaults.MAX_INSTANCES)
    seed: int = Field(ge=0, le=defaults.MAX_SEED)
    clip: ClipInfo | None = None
    filters: FilterInfo | None = None
    counts: dict[str, int | float] = Field(default_factory=dict)
    benchmark_file: str = BENCHMARK_FILE
    benchmark_sha256: str = ""

    @model_validator(mode="after")
    def _task_version(self) -> BenchmarkManifest:
        if self.task is not None and self.task not in TASK_KINDS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {list(TASK_KINDS)}")
        if self.task not in (None, "retrieval") and self.format_version < TASK_FORMAT_VERSION:
            raise ValueError(f"a {self.task} benchmark has format_version {TASK_FORMAT_VERSION}")
        return self

    @property
    def task_kind(self) -> str:
        """The task of the benchmark (``retrieval`` for a version-1 manifest)."""
        return self.task or "retrieval"

    def dump(self) -> dict[str, Any]:
        """The manifest's JSON (a retrieval manifest without the ``task`` key, as in version
        1, so a retrieval build gives the same bytes as before)."""
        payload = self.model_dump(mode="json")
        if self.task is None:
            payload.pop("task")
        return payload


@dataclass(frozen=True)
class Benchmark:
    """A loaded benchmark: instances with absolute image paths, the manifest and the root."""

    instances: list[Instance]
    manifest: BenchmarkManifest | None
    root: Path
    path: Path

    def __len__(self) -> int:
        return len(self.instances)

    @property
    def task(self) -> str:
        """The task its instances pose (``retrieval`` for a file without a manifest)."""
        return self.manifest.task_kind if self.manifest is not None else self.instances[0].task

    @property
    def fingerprint(self) -> str:
        """sha256 of the benchmark file: what a run's results and resumption are tied to."""
        if self.manifest is not None and self.manifest.benchmark_sha256:
            return self.manifest.benchmark_sha256
        return sha256_file(self.path)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_line(record: InstanceRecord) -> str:
    """The canonical one-line JSON of a record (sorted keys, unset optional keys left out)."""
    payload = record.model_dump(exclude_none=True)
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_benchmark(
    out_dir: str | os.PathLike[str],
    records: list[InstanceRecord],
    manifest: BenchmarkManifest,
) -> BenchmarkManifest:
    """Write ``benchmark.jsonl`` then ``manifest.json`` (with the JSONL's sha256) atomically.

    Returns the manifest as written (``benchmark_sha256`` filled in).
    """
    folder = benchmark_folder(Path(out_dir))
    folder.check()
    data = "".join(record_line(record) + "\n" for record in records).encode("utf-8")
    final = manifest.model_copy(update={"benchmark_sha256": sha256_bytes(data)})
    manifest_text = json.dumps(final.dump(), indent=2, sort_keys=True) + "\n"
    folder.create()
    folder.lock()
    try:
        write_files_together(
            folder.root, {BENCHMARK_FILE: data, MANIFEST_FILE: manifest_text.encode("utf-8")}
        )
    finally:
        folder.unlock()
    return final


#: What a benchmark folder of ours holds (besides temporary names and the lock).
_OWN_BENCHMARK = re.compile(r"^(benchmark\.jsonl|manifest\.json)\Z")


def benchmark_folder(folder: Path) -> RunFolder:
    """A benchmark folder of ours, through the one run-directory layer: ``manifest.json`` marks
    it, and only ``benchmark.jsonl`` and ``manifest.json`` are ours there."""
    return RunFolder(folder, marker=MANIFEST_FILE, own=_OWN_BENCHMARK, kind="benchmark folder")


def same_files(images: list[str], root: Path) -> list[str]:
    """A problem for each group of image paths that name one file (``./x.png``,
    ``images//x.png``, a symbolic link to it): each candidate must be a different image."""
    groups: dict[str, list[str]] = {}
    for image in images:
        groups.setdefault(os.path.realpath(root / image), []).append(image)
    return [
        f"images {names} are the same file; each candidate must be a different image"
        for names in groups.values()
        if len(names) > 1
    ]


def _source_changed(manifest: BenchmarkManifest, root: Path) -> list[str]:
    """Problems if the images a benchmark was built from changed since: a shapes root
    regenerated with other settings, or an annotation file with other content."""
    problems = []
    pinned = manifest.source.shapes
    if pinned is not None:
        current = existing_dataset_info(root) or {}
        changed = [key for key in sorted(pinned) if current.get(key) != pinned[key]]
        if changed:
            shown = ", ".join(
                f"{key} {_short(pinned[key])} -> {_short(current.get(key))}" for key in changed
            )
            problems.append(
                f"the shapes images under {root} were regenerated with other settings since "
                f"this benchmark was built ({shown}); rebuild the benchmark, or regenerate the "
                "images with its settings"
            )
    for annotation in manifest.source.annotation_files:
        path = Path(annotation.path)
        if path.is_file() and sha256_file(path) != annotation.sha256:
            problems.append(
                f"the annotation file {path} changed since this benchmark was built (sha256 "
                "mismatch), so its images may have too; rebuild the benchmark"
            )
    return problems


def _reads_images(manifest: BenchmarkManifest | None) -> bool:
    """Whether the benchmark's instances name image files under its root: a text benchmark
    built from a questions file without images holds its texts itself (its root, the folder
    the questions came from, may be gone)."""
    if manifest is None:
        return True
    return manifest.task in (None, "retrieval") or manifest.source.images_in_source > 0


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def load_manifest(path: Path) -> BenchmarkManifest:
    text = read_input_text(path, "benchmark manifest", limit=CONFIG_LIMIT, error=BenchmarkError)
    payload = parse_json(text, str(path), error=BenchmarkError)
    try:
        return BenchmarkManifest.model_validate(payload)
    except ValidationError as exc:
        raise problems_error(
            f"{path} is not a valid benchmark manifest", validation_problems(exc, unknown="key")
        ) from exc


def benchmark_task(path: str | os.PathLike[str]) -> str | None:
    """The task a benchmark folder's manifest says it poses, without reading its instances
    (None when there is no readable manifest: loading the benchmark says what is wrong)."""
    try:
        _, manifest = _locate(Path(path))
        return None if manifest is None else load_manifest(manifest).task_kind
    except (InputError, OSError):  # a benchmark error among them
        return None


def _locate(path: Path) -> tuple[Path, Path | None]:
    """(JSONL path, manifest path or None) for a benchmark folder or a JSONL file."""
    if path.is_dir():
        manifest = path / MANIFEST_FILE
        if not manifest.exists():
            raise BenchmarkError(
                f"{path} has no {MANIFEST_FILE}; give a folder made by `posdebias build`"
            )
        name = load_manifest(manifest).benchmark_file
        return confined_path(path, name, "the manifest's benchmark_file", error=BenchmarkError), (
            manifest
        )
    if path.is_file():
        manifest = path.parent / MANIFEST_FILE
        return path, manifest if manifest.is_file() else None
    if path.exists():
        raise BenchmarkError(
            f"benchmark {path} is not a folder or a regular file; give a folder made by "
            "`posdebias build`"
        )
    raise BenchmarkError(
        f"benchmark {path} does not exist; give a folder made by `posdebias build`"
    )


def load_benchmark(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    check_images: bool = True,
) -> Benchmark:
    """Load and validate a benchmark folder (or its JSONL file) into instances (any task).

    ``root`` overrides the manifest's root (data moved to another machine). Every problem is
    collected (schema, duplicate ids, N differing from the manifest, images missing under the
    root, a JSONL changed since it was built) and reported in one :class:`BenchmarkError` with
    the line number of each.
    """
    jsonl_path, manifest_path = _locate(Path(path))
    manifest = load_manifest(manifest_path) if manifest_path is not None else None
    root_path = _image_root(jsonl_path, manifest, root)
    data = read_input_bytes(jsonl_path, "benchmark file", limit=DATA_LIMIT, error=BenchmarkError)
    problems = Problems(jsonl_path)
    problems.extend(_file_problems(data, manifest, root_path, check_images))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchmarkError(f"{jsonl_path} is not UTF-8 text ({exc.reason})") from exc
    lines = _LineChecker(manifest, root_path, check_images)
    instances = [
        instance
        for number, line in enumerate(jsonl_lines(text), start=1)
        if line.strip() and (instance := lines.instance(number, line, problems))
    ]
    if not text.strip():
        problems.add("the file is empty: it has no instances")
    elif not problems and not instances:
        problems.add("the file has no instances")
    problems.raise_any("Fix or rebuild the benchmark with `posdebias build`.")
    return Benchmark(instances=instances, manifest=manifest, root=root_path, path=jsonl_path)


def _image_root(
    jsonl_path: Path, manifest: BenchmarkManifest | None, root: str | os.PathLike[str] | None
) -> Path:
    """The folder image paths are relative to: ``root`` if given, else the manifest's."""
    if root is not None:
        return Path(root).resolve()
    if manifest is not None:
        return _manifest_root(manifest, jsonl_path.parent)
    raise BenchmarkError(
        f"{jsonl_path} has no {MANIFEST_FILE} beside it; {_ROOT_ADVICE.library}",
        advice=Advice(
            _ROOT_ADVICE.library,
            f"give the folder posdebias build wrote (with its {MANIFEST_FILE})",
        ),
    )


def _file_problems(
    data: bytes, manifest: BenchmarkManifest | None, root: Path, check_images: bool
) -> list[str]:
    """Problems of the file as a whole: changed since it was built, or built from images that
    changed since (a missing image root is an error at once)."""
    problems = []
    if manifest is not None and manifest.benchmark_sha256 != sha256_bytes(data):
        problems.append(
            f"the file differs from the one recorded in {MANIFEST_FILE} (sha256 mismatch): it "
            "was edited or truncated after `posdebias build`; rebuild it"
        )
    if check_images and _reads_images(manifest) and not root.is_dir():
        raise BenchmarkError(
            f"the image root {root} does not exist; {_ROOT_ADVICE.library}", advice=_ROOT_ADVICE
        )
    if manifest is not None and check_images:
        problems += _source_changed(manifest, root)
    return problems


class _LineChecker:
    """Checks each line of a benchmark file on its own: the schema, its id against the lines
    before it, its N and task against the manifest, its images against the root (each file is
    looked up once)."""

    def __init__(self, manifest: BenchmarkManifest | None, root: Path, check_images: bool):
        self.manifest = manifest
        self.root = root
        self.real_root = root.resolve()
        self.check_images = check_images
        self.first_line: dict[str, int] = {}
        self._exists: dict[str, bool] = {}
        self._inside_root: dict[str, bool] = {}

    def instance(self, number: int, line: str, problems: Problems) -> Instance | None:
        """The instance of line ``number``, or None with its problems noted."""
        try:
            record = InstanceRecord.model_validate_json(line)
        except ValidationError as exc:
            problems.extend(validation_problems(exc, unknown="key"), line=number)
            return None
        found = [
            *self._identity(record),
            *self._against_manifest(record),
            *self._image_problems(record),
        ]
        if self.check_images and not found:
            found += same_files(
                [image for image in record.images or [] if image is not None], self.root
            )
        self.first_line.setdefault(record.id, number)
        problems.extend(found, line=number)
        return None if found else _instance(record, self.root)

    def _identity(self, record: InstanceRecord) -> list[str]:
        if record.id not in self.first_line:
            return []
        return [f"duplicate id {excerpt(record.id)} (first on line {self.first_line[record.id]})"]

    def _against_manifest(self, record: InstanceRecord) -> list[str]:
        manifest = self.manifest
        if manifest is None:
            return []
        problems = []
        if record.n != manifest.n:
            what = "images" if record.task is None else "candidates"
            problems.append(f"{record.n} {what}, but the manifest says N={manifest.n}")
        if record.task != manifest.task:
            problems.append(
                f"task {record.task or 'retrieval'}, but the manifest says {manifest.task_kind}"
            )
        return problems

    def _image_problems(self, record: InstanceRecord) -> list[str]:
        found = (self._image_problem(image) for image in record.image_paths())
        return [problem for problem in found if problem is not None]

    def _image_problem(self, image: str) -> str | None:
        posix = PurePosixPath(image)
        if posix.is_absolute() or ".." in posix.parts or "\x00" in image:
            return f"image path {excerpt(image)} must be relative to the root"
        unusable = path_name_problem(image) or path_name_problem(self.root / image)
        if unusable is not None:
            return f"image path {excerpt(image)} {unusable}"
        if image not in self._inside_root:
            self._inside_root[image] = (self.root / image).resolve().is_relative_to(self.real_root)
        if not self._inside_root[image]:
            return (
                f"image {excerpt(image)} leads outside the root {self.root} through a "
                "symlink; images must be inside the root"
            )
        if not self.check_images:
            return None
        if image not in self._exists:
            self._exists[image] = (self.root / image).is_file()
        if not self._exists[image]:
            return f"image {excerpt(image)} not found under {self.root}"
        return None


#: The fields of a line an instance keeps in its metadata (where set).
_METADATA = ("anchor_image_id", "setting", "caption_index", "similarities", "caption_similarities")


def _instance(record: InstanceRecord, root: Path) -> Instance:
    """The instance of one validated line (image paths made absolute under ``root``)."""
    metadata: dict[str, Any] = {
        name: getattr(record, name) for name in _METADATA if getattr(record, name) is not None
    }
    if record.meta:
        metadata["meta"] = dict(record.meta)
    n = record.n
    images_in = record.images or [None] * n
    texts = tuple(record.texts or [None] * n)
    ids = tuple(
        "\x1f".join(part for part in (image, None if text is None else text_key(text)) if part)
        for image, text in zip(images_in, texts, strict=True)
    )
    return Instance(
        stem=record.query,
        images=tuple(None if image is None else str(root / image) for image in images_in),
        target=record.target,
        id=record.id,
        metadata=metadata,
        candidate_ids=ids,
        texts=texts,
        stem_images=tuple(str(root / image) for image in record.stem_images or []),
        task=record.task or "retrieval",
    )


def _manifest_root(manifest: BenchmarkManifest, folder: Path) -> Path:
    """The image root a manifest names: the absolute folder `posdebias build` was given, or a
    relative one, which must stay inside the benchmark folder (symlinks resolved)."""
    root = manifest.root
    if "\x00" in root or not root:
        raise BenchmarkError(f"the manifest's root {excerpt(root)} is not a usable path")
    if Path(root).is_absolute():
        return Path(root)
    try:
        return confined_path(
            folder, root, "the manifest's root", error=BenchmarkError, hint=_ROOT_ADVICE.library
        )
    except BenchmarkError as exc:
        raise BenchmarkError(str(exc), advice=_ROOT_ADVICE) from None


#: Where the images of a benchmark are when its manifest does not say it usably: the library
#: takes the root as an argument; on the command line the benchmark is rebuilt (no command
#: takes a root for a benchmark it reads).
_ROOT_ADVICE = Advice(
    "pass the image root yourself: load_benchmark(path, root=...)",
    "put the images back where the manifest says, or rebuild the benchmark where they are now "
    "with posdebias build",
)
