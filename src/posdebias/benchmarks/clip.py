"""CLIP image and caption embeddings for hard-negative mining (open_clip), cached on disk.

docs/benchmarks.md: the adversarial setting ranks pool images by CLIP image similarity and
filters them by caption similarity, with L2-normalised embeddings (the paper used ViT-L/14,
OpenAI weights: our default). Encoding a pool is the slow part of a build, so embeddings are
cached as safetensors files (never pickle) keyed by the model, its weights and the list of
files or captions encoded: rebuilding with another N, seed or count reuses them.

The model is an open_clip model name (``ViT-L-14``), ``local-dir:``/``hf-hub:`` schemas, or a
path to an open_clip model-config JSON (``{"embed_dim", "vision_cfg", "text_cfg"}``); weights are
a pretrained tag (``openai``), a local checkpoint file, or ``none`` for random weights (tests
only: the embeddings are meaningless).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._images import open_image
from posdebias._inputs import CONFIG_LIMIT, parse_json, read_input_text
from posdebias._io import cache_root
from posdebias._rundir import CacheFolder
from posdebias.benchmarks.files import sha256_file
from posdebias.errors import BenchmarkError

DEFAULT_CLIP_MODEL = "ViT-L-14"
DEFAULT_CLIP_PRETRAINED = "openai"
RANDOM_WEIGHTS = "none"
RANDOM_WEIGHTS_WARNING = (
    "CLIP weights 'none': the model has RANDOM weights, so the 'hard negatives' are arbitrary. "
    "Use this only for tests; pass a pretrained tag (e.g. openai) or a checkpoint for real runs."
)

Progress = Callable[[int], None]


def default_cache_dir() -> Path:
    """The ``clip`` folder of :func:`posdebias._io.cache_root`."""
    return cache_root() / "clip"


def _sha256_json(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: The copies of CLIP model configs open_clip registers, named by their content.
_CONFIG_COPY = re.compile(r"posdebias-config-[0-9a-f]{16}\.json\Z")
#: The embedding files of the cache: ``<kind>-<first 40 hex digits of the key>.safetensors``.
_EMBEDDINGS = re.compile(r"[a-z]+-[0-9a-f]{40}\.safetensors\Z")


def _register_config_file(path: Path) -> tuple[str, str]:
    """Register an open_clip model-config JSON under a content-derived name; (name, sha256)."""
    import open_clip

    text = read_input_text(path, "CLIP model config", limit=CONFIG_LIMIT, error=BenchmarkError)
    config = parse_json(text, f"CLIP model config {path}", error=BenchmarkError)
    missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in config]
    if not isinstance(config, dict) or missing:
        raise BenchmarkError(
            f"{path} is not an open_clip model config: it needs the keys embed_dim, vision_cfg and "
            f"text_cfg (missing {missing})"
        )
    digest = _sha256_json(config)
    name = f"posdebias-config-{digest[:16]}"
    if name not in open_clip.list_models():
        # open_clip looks configs up by name; a content-named copy cannot shadow a built-in one
        folder = CacheFolder(
            cache_root() / "clip-configs",
            own=_CONFIG_COPY,
            kind="posdebias cache of CLIP model configs",
            flag="cache folder (POSDEBIAS_CACHE_DIR)",
        )
        copy = folder.store(f"{name}.json", json.dumps(config, sort_keys=True).encode("utf-8"))
        open_clip.add_model_config(copy)
    return name, digest


@dataclass
class ClipEncoder:
    """A loaded open_clip model, its preprocessing and tokenizer, and its identity.

    ``identity`` is what the cache key and the manifest record: the model as given, the config
    hash for a config file, the weights tag or the checkpoint's sha256.
    """

    model: Any
    preprocess: Any
    tokenizer: Any
    device: str
    identity: dict[str, Any]
    batch_size: int = 64

    def encode_images(self, paths: Sequence[Path], progress: Progress | None = None) -> np.ndarray:
        """[len(paths), D] float32 L2-normalised image embeddings."""
        import torch

        chunks = []
        for start in range(0, len(paths), self.batch_size):
            # one image at a time at full size: the batch holds preprocessed tensors only
            batch = [self.preprocess(open_image(p)) for p in paths[start : start + self.batch_size]]
            with torch.inference_mode():
                features = self.model.encode_image(torch.stack(batch).to(self.device))
            chunks.append(_normalised(features))
            if progress is not None:
                progress(len(batch))
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)

    def encode_texts(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """[len(texts), D] float32 L2-normalised caption embeddings."""
        import torch

        chunks = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            with torch.inference_mode():
                features = self.model.encode_text(self.tokenizer(batch).to(self.device))
            chunks.append(_normalised(features))
            if progress is not None:
                progress(len(batch))
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)


def _normalised(features: Any) -> np.ndarray:
    array = features.float().cpu().numpy().astype(np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.maximum(norms, 1e-12)


def load_clip(
    model: str = DEFAULT_CLIP_MODEL,
    pretrained: str = DEFAULT_CLIP_PRETRAINED,
    *,
    device: str | None = None,
    batch_size: int = 64,
) -> ClipEncoder:
    """Load an open_clip model (see the module docstring for what ``model``/``pretrained`` take).

    ``pretrained='none'`` builds random weights from ``torch.manual_seed(0)`` (reproducible) and
    warns loudly. Unknown names, tags or unreadable files raise :class:`BenchmarkError`.
    """
    import open_clip
    import torch

    identity: dict[str, Any] = {"model": model, "pretrained": pretrained}
    model_path = Path(model)
    if model.endswith(".json") or (model_path.is_file() and ":" not in model):
        if not model_path.is_file():
            raise BenchmarkError(f"CLIP model config {model} does not exist; check --clip-model")
        name, digest = _register_config_file(model_path)
        identity["config_sha256"] = digest
    elif model.startswith(("local-dir:", "hf-hub:")):
        name = model
    else:
        name = model.replace("/", "-")
        known = open_clip.list_models()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=5)
            raise BenchmarkError(
                f"unknown CLIP model {model!r}; close names: {close or known[:10]}. Pass an "
                "open_clip model name or the path of an open_clip model-config JSON."
            )

    weights: str | None
    if pretrained.lower() == RANDOM_WEIGHTS:
        weights = None
        identity["random_weights"] = True
        warnings.warn(RANDOM_WEIGHTS_WARNING, UserWarning, stacklevel=2)
    elif Path(pretrained).is_file():
        weights = str(Path(pretrained).resolve())
        identity["checkpoint_sha256"] = sha256_file(Path(pretrained))
    else:
        weights = pretrained
        if not name.startswith(("local-dir:", "hf-hub:")):
            tags = open_clip.list_pretrained_tags_by_model(name)
            if pretrained not in tags:
                raise BenchmarkError(
                    f"{pretrained!r} is neither a pretrained tag of {model} (tags: {tags}) nor an "
                    f"existing checkpoint file; pass one with --clip-pretrained, or 'none' for "
                    "random weights (tests only)"
                )

    resolved = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # random weights ('none') are the same every run
            clip_model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=weights, device=resolved
            )
        tokenizer = open_clip.get_tokenizer(name)
    except BenchmarkError:
        raise
    except Exception as exc:  # open_clip raises RuntimeError/ValueError/OSError/HF errors
        raise BenchmarkError(
            f"cannot load CLIP model {model!r} with weights {pretrained!r}: {exc}. Without network "
            "access the weights must already be in the open_clip cache or given as a file."
        ) from exc
    clip_model.eval()
    return ClipEncoder(clip_model, preprocess, tokenizer, resolved, identity, batch_size)


# ------------------------------------------------------------------------------------- caching


@dataclass
class EmbeddingCache:
    """Embeddings on disk, one safetensors file per (encoder identity, kind, item list)."""

    folder: Path | None
    hits: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @staticmethod
    def key(kind: str, identity: dict[str, Any], items: Sequence[str]) -> str:
        return _sha256_json({"kind": kind, "encoder": identity, "items": list(items)})

    def _cache(self) -> CacheFolder:
        assert self.folder is not None
        return CacheFolder(
            self.folder,
            own=_EMBEDDINGS,
            kind="posdebias cache of CLIP embeddings",
            flag="CLIP cache folder",
        )

    def get_or_compute(
        self,
        kind: str,
        identity: dict[str, Any],
        items: Sequence[str],
        compute: Callable[[], np.ndarray],
    ) -> np.ndarray:
        """The cached array for these items, or ``compute()`` (then stored atomically)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file, save

        if self.folder is None:
            self.misses.append(kind)
            return compute()
        key = self.key(kind, identity, items)
        cache = self._cache()
        name = f"{kind}-{key[:40]}.safetensors"
        path = cache.cached(name)
        if path is not None:
            try:
                array = load_file(str(path))["embeddings"]
            except (OSError, KeyError, SafetensorError):
                array = None  # a damaged cache file is recomputed and overwritten
            if array is not None and array.shape[0] == len(items):
                self.hits.append(kind)
                return array
        array = np.ascontiguousarray(compute(), dtype=np.float32)
        metadata = {"kind": kind, "key": key, "encoder": json.dumps(identity, sort_keys=True)}
        cache.store(name, save({"embeddings": array}, metadata=metadata))
        self.misses.append(kind)
        return array


def image_cache_items(root: Path, paths: Sequence[str]) -> list[str]:
    """What identifies an image list for the cache: absolute path, size and mtime of each file."""
    items = []
    for relative in paths:
        full = root / relative
        stat = full.stat()
        items.append(f"{full}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return items
