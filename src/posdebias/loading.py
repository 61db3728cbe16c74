"""Model id, path or bundled name -> adapter: :func:`load_adapter`, :func:`get_adapter`.

The loading layer sits above the registry: it resolves where a model is (a bundled model folder
registered by a plugin, a local directory, the Hugging Face cache or hub), loads it (safetensors
only), and wraps it in the adapter its family needs. The adapter is chosen by ``config.model_type``
among every registered adapter (built-ins and plugins, :meth:`Registry.adapter_for_model_type`);
when none claims it, the generic adapter is tried, which fails with a clear message if it cannot
find the images' tokens. A local directory may hold ``posdebias_prompt.json``: the prompt template
the model was trained or tuned with, used unless a prompt is passed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from posdebias._gguf import GGUF_MAGIC, GGUFDamaged, read_gguf_header
from posdebias._inputs import excerpt, usable_path
from posdebias._weights import check_safetensors_only, model_config
from posdebias.adapters.base import Adapter
from posdebias.adapters.families.generic import GenericAdapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.prompt import PROMPT_FILE, load_prompt_file
from posdebias.adapters.server import ServerAdapter
from posdebias.core.tasks import TASK_LABEL_SETS, TaskTemplate, task_label_set
from posdebias.errors import AdapterError, Advice, InputError
from posdebias.registry import get_registry
from posdebias.registry.manager import PLUGIN_GUIDE


def _adapter_class(model_type: str, adapter: str | None) -> type[HFAdapter]:
    registry = get_registry()
    if adapter is not None:
        cls = registry.adapter_class(adapter)
        if issubclass(cls, ServerAdapter):
            raise InputError(
                f"adapter {adapter!r} talks to a model server: pass the served model's name "
                "and the server's base_url (posdebias.loading.open_adapter, or `posdebias "
                "evaluate --adapter openai --base-url URL --model NAME`)"
            )
        if not issubclass(cls, HFAdapter):
            names = ", ".join(_hf_adapter_names())
            either = f"name one that does or none (the model's family picks it): {names}"
            raise InputError(
                f"adapter {adapter!r} does not wrap Hugging Face models; {either}",
                advice=Advice(either, f"drop --model or choose one of: {names}", either),
            )
        return cls
    found = registry.adapter_for_model_type(model_type)
    if found is not None and not issubclass(found, HFAdapter):
        raise AdapterError(
            f"adapter {found.name!r} claims model_type {model_type!r} but does not wrap Hugging "
            "Face models (it is not an HFAdapter)"
        )
    return found or GenericAdapter


def _hf_adapter_names() -> list[str]:
    registry = get_registry()
    return sorted(
        name
        for name in registry.adapter_names()
        if issubclass(registry.adapter_class(name), HFAdapter)
    )


def known_families() -> str:
    """'name (model types)' of every registered Hugging Face adapter, for error messages."""
    registry = get_registry()
    parts = []
    for name in _hf_adapter_names():
        types = getattr(registry.adapter_class(name), "model_types", ())
        parts.append(f"{name} ({', '.join(types)})" if types else name)
    return "; ".join(parts)


#: What a GGUF file's quantised tensors become: transformers dequantises them on load, so the
#: model runs in float32 unless ``dtype`` asks for another (``auto`` means float32 here).
GGUF_DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class GGUFSource:
    """A single-file GGUF model: transformers reads ``file`` inside ``folder``."""

    folder: Path
    file: str


def gguf_source(model_id_or_path: str | os.PathLike[str]) -> GGUFSource | None:
    """The GGUF file ``model_id_or_path`` names, or None when it names no file.

    A file that is not a GGUF file (by its magic bytes) is refused: the only single-file models
    posdebias loads are GGUF files; everything else is a model folder or a hub id."""
    path = Path(os.path.expanduser(os.fspath(model_id_or_path)))
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise InputError(f"cannot read model file {str(path)!r}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise InputError(
            f"model path {str(path)!r} is a file but not a GGUF file (it does not start "
            "with 'GGUF'); pass a GGUF file, a Hugging Face model directory or a hub id"
        )
    return GGUFSource(path.parent, path.name)


def gguf_architecture(source: GGUFSource) -> str:
    """The ``general.architecture`` of a GGUF file whose header is whole (:mod:`posdebias._gguf`),
    refused unless transformers can load it."""
    try:
        from gguf import GGML_QUANT_SIZES
    except ImportError:
        raise InputError("loading a GGUF file needs the gguf package: pip install gguf") from None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = source.folder / source.file
    try:
        sizes = {int(kind): size for kind, size in GGML_QUANT_SIZES.items()}
        architecture = read_gguf_header(path, sizes).architecture
    except GGUFDamaged as exc:
        raise InputError(
            f"GGUF file {str(path)!r} is damaged or incomplete: {exc}; download or "
            "assemble it again"
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read model file {str(path)!r}: {exc.strerror or exc}") from None
    supported = [name for name in GGUF_SUPPORTED_ARCHITECTURES if name not in ("general",)]
    if architecture not in supported:
        raise InputError(
            f"GGUF file {source.file!r} holds a {excerpt(architecture)} model, which the "
            "installed transformers cannot load from GGUF (it loads: "
            f"{', '.join(sorted(supported))}); "
            "convert the checkpoint to a Hugging Face folder or use another build of it"
        )
    return architecture


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes", "on"}


def _resolve_source(model_id_or_path: str | os.PathLike[str], revision: str | None) -> str:
    """The path or hub id to load; fails fast for a missing path or an uncached hub id.

    Names of bundled models (registered by plugins through ``posdebias_register_models``)
    resolve to their package folder first, so they load offline through the same
    ``from_pretrained`` path.
    """
    text = os.fspath(model_id_or_path)
    bundled = get_registry().bundled_model(text)
    if bundled is not None:  # shipped inside a package: no hub lookup
        return str(bundled.path)
    path = Path(os.path.expanduser(text))
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(
                f"model directory {str(path)!r} has no config.json; it is not a Hugging "
                "Face model directory (save one with model.save_pretrained and "
                "processor.save_pretrained)"
            )
        return str(path)
    looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep in text[:1]
    if looks_local:
        raise InputError(f"model path {excerpt(text)} does not exist")
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(text, "config.json", revision=revision)
    except HFValidationError:
        raise InputError(
            f"model {excerpt(text)} is neither a local path (none exists) nor a Hugging Face "
            "model id (ORG/NAME of letters, digits, '-', '_' and '.'); check the name"
        ) from None
    if isinstance(cached, str):
        return text
    if _offline():
        why = "HF_HUB_OFFLINE is set"
    elif not _hub_reachable():
        why = f"this machine is offline ({_hub_endpoint()} cannot be reached)"
    else:
        return text
    raise InputError(
        f"model {text!r} is not a local directory (no such path) and not in the Hugging Face "
        f"cache, and {why}; download it first or pass a local model directory"
    )


def _local_folder(source: str, revision: str | None) -> Path:
    """The folder transformers will read ``source`` from: the directory itself, or the cached
    snapshot of a hub id (a hub id not cached yet is checked by transformers' own
    ``use_safetensors=True``)."""
    path = Path(source)
    if path.is_dir():
        return path
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json", revision=revision)
    return Path(cached).parent if isinstance(cached, str) else path


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint accepts a TCP connection (instead of minutes of retries)."""
    parts = urlsplit(_hub_endpoint())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def remote_code_error(source: str, detail: str) -> InputError:
    """Why a model with its own Python code is refused, and how to allow it (each door's way)."""
    check = f"`posdebias check --model {shlex.quote(source)} --trust-remote-code`"
    advice = Advice(
        "pass trust_remote_code=True (load_adapter), then see whether the generic adapter "
        "scores it right with posdebias.testing.check_adapter",
        f"opt in with --trust-remote-code, then run {check} to see whether the generic "
        "adapter scores it right",
        'opt in with "trust_remote_code": true in the adapter_options file of the model '
        f"arguments, then run {check} to see whether the generic adapter scores it right",
    )
    return InputError(
        f"model {source!r} ships its own Python code ({detail}); posdebias never runs a "
        "model's code unless you allow it, because that code can do anything your user account "
        f"can. If you trust its source, {advice.library}",
        advice=advice,
    )


def _refuse_remote_code(source: str) -> None:
    """A local model whose config needs its own code (``auto_map`` + a model_type transformers
    does not know) is refused before transformers sees it."""
    from transformers import CONFIG_MAPPING

    data = model_config(source)
    if data is None:
        return
    auto_map = data.get("auto_map")
    if auto_map and data.get("model_type") not in CONFIG_MAPPING:
        classes = ", ".join(f"{key} -> {value}" for key, value in dict(auto_map).items())
        detail = f"model_type {data.get('model_type')!r}, auto_map {classes}"
        raise remote_code_error(source, detail)


#: held while :func:`one_gguf_parse` lends the ``gguf`` package its shared reader
_GGUF_READER_SWAP = threading.RLock()


@functools.cache
def _array_reader() -> type:
    """``gguf.GGUFReader`` on a plain array view of its memory map (the view keeps it open):
    it slices the file millions of times for a large vocabulary, and each slice of an
    ``np.memmap`` is a new memmap object (Gemma 3's parse: 10.5 s; through the view, 3.1 s)."""
    import gguf.gguf_reader

    class ArrayReader(gguf.gguf_reader.GGUFReader):
        @property
        def data(self) -> Any:
            return self._array

        @data.setter
        def data(self, memmap: Any) -> None:
            self._array = memmap.view(np.ndarray)

    return ArrayReader


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Within this scope transformers gets one ``gguf.GGUFReader`` per file.

    transformers parses a GGUF file's metadata anew for the config, the tokenizer and the
    weights, and a parse is slow for a large vocabulary (Gemma 3's 262k tokens: about 10 s each on
    one CPU core, 3 s with :func:`_array_reader`); the reader is a read-only memory map, so one
    serves all three. Likewise it builds gguf's tensor-name map (about 25 ms) once per module
    of the model, the same map each time: one per architecture and depth serves the scope. The
    package attributes are swapped for the scope, so a load in another thread waits for it.
    """
    import gguf

    with _GGUF_READER_SWAP:
        original, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
        name_map = functools.cache(original_map)
        readers: dict[tuple[str, int, int], Any] = {}

        def shared_reader(path: str | os.PathLike[str], mode: Literal["r", "r+", "c"] = "r") -> Any:
            if mode != "r":  # a writable map is never shared
                return original(path, mode)
            stat = os.stat(path)
            key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
            if key not in readers:
                readers[key] = _array_reader()(path, mode)
            return readers[key]

        gguf.GGUFReader = shared_reader  # type: ignore[misc,assignment]
        gguf.get_tensor_name_map = name_map
        try:
            yield
        finally:
            gguf.GGUFReader = original  # type: ignore[misc]
            gguf.get_tensor_name_map = original_map


def _load_config(source: str, revision: str | None, trust_remote_code: bool, **file: Any) -> Any:
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    if not trust_remote_code and not file:
        _refuse_remote_code(source)
    try:
        return AutoConfig.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code, **file
        )
    except StrictDataclassError as exc:  # a config that breaks its own family's rules
        raise InputError(
            f"cannot load the config of {source!r}: it does not validate ({exc}); fix "
            "config.json or use the checkpoint's original one"
        ) from None
    except OSError as exc:
        raise InputError(
            f"cannot load the config of {source!r}: {exc}. If this machine is offline, pass a "
            "local model directory (or a model already in the Hugging Face cache)"
        ) from None
    except ValueError as exc:
        if not trust_remote_code and "trust_remote_code" in str(exc):
            raise remote_code_error(source, "its config needs custom code") from None
        raise AdapterError(
            f"cannot load {source!r}: {exc}. Known adapter families: {known_families()}; other "
            f"families need an adapter plugin (see {PLUGIN_GUIDE})"
        ) from None


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype == "auto":
        return "auto"
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype):
        raise InputError(f"dtype {dtype!r} is not a torch dtype; use auto, float32, bfloat16")
    return value


def load_adapter(
    model_id_or_path: str | os.PathLike[str],
    *,
    adapter: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    label_set: str | None = None,
    prompt: TaskTemplate | dict | str | Path | None = None,
    task: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    **options: Any,
) -> HFAdapter:
    """Load model + processor with ``from_pretrained`` and wrap them in the right adapter.

    Args:
        model_id_or_path: a local model directory, a GGUF file (a language model; its
            quantised tensors are dequantised, so ``dtype="auto"`` means float32) or a Hugging
            Face hub id (hub ids need the network or the local cache).
        adapter: force an adapter by registry name (default: by ``config.model_type``).
        dtype: ``auto`` (the checkpoint's), ``float32``, ``bfloat16``, ``float16``.
        device: where to put the model (default: ``cuda`` when available, else ``cpu``);
            ignored when ``device_map`` is given (accelerate placement).
        max_memory: with ``device_map``, the devices accelerate may use and how much of each
            (``{0: "70GiB", 1: "70GiB"}``); data-parallel ranks get their own GPU group.
        label_set: the label set the prompt names (``digits``, ``upper``, ...); default: the
            task's own (:func:`default_label_set`), as ``posdebias evaluate`` uses.
        task: the task the adapter will pose (default: a bundled model's own task, else each
            instance's); it decides the default label set only.
        prompt: a prompt template (default: the model folder's ``posdebias_prompt.json``, else
            the method's prompt).
        defaults: options proposed rather than asked for (a run protocol's image size): each
            is used where the model's family takes it and ``options`` do not set it.
        **options: further adapter options (``end_token``, ``answer_prefix``, ...).
    """
    usable_path(model_id_or_path, "the model")  # refused before anything is looked up
    named = options.pop("model", None)
    if named is not None and os.fspath(named) != os.fspath(model_id_or_path):
        raise InputError(
            f"two models given: {os.fspath(model_id_or_path)!r} and the option model={named!r}"
        )
    label_set = label_set or default_label_set(task, model_id_or_path)
    gguf = gguf_source(model_id_or_path)
    #: keywords naming the file inside ``source`` that transformers reads (a GGUF file)
    file: dict[str, Any] = {}
    if gguf is not None:  # one file, not pickled: no folder of weights to check
        gguf_architecture(gguf)
        source, file = str(gguf.folder), {"gguf_file": gguf.file}
        dtype = GGUF_DEFAULT_DTYPE if dtype == "auto" else dtype
    else:
        source = _resolve_source(model_id_or_path, revision)  # fails fast, before heavy imports
        check_safetensors_only(_local_folder(source, revision))  # before anything is opened
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
    )

    # one parse of a GGUF file's metadata for the config, the tokenizer and the weights
    with one_gguf_parse() if gguf is not None else contextlib.nullcontext():
        config = _load_config(source, revision, trust_remote_code, **file)
        cls = _adapter_class(config.model_type, adapter)
        taken = cls.option_names()  # a text model takes no image option
        options = {k: v for k, v in (defaults or {}).items() if k in taken} | options
        cls.parse_options({"label_set": label_set, **options})  # reject unknown options early
        if gguf is not None and not cls.text_only:
            raise InputError(
                f"GGUF file {gguf.file!r} holds a {config.model_type!r} model, which "
                f"adapter {cls.name!r} reads as an image-text model; posdebias loads GGUF "
                "files of language models only (a vision model needs its Hugging Face folder)"
            )
        # a prompt file that is there but not a regular file is refused, never silently skipped
        # (a retrieval prompt: a text-only model, which poses none, does not read it)
        prompt_file = Path(source, PROMPT_FILE)
        if prompt is None and gguf is None and not cls.text_only and os.path.lexists(prompt_file):
            prompt = load_prompt_file(prompt_file)
        if device_map is None and device is not None:
            check_device(device)
        kwargs: dict[str, Any] = {
            "revision": revision,
            "trust_remote_code": trust_remote_code,
            "dtype": _torch_dtype(dtype),
            **file,
        }
        if not file:  # never unpickle weights from user data: .bin checkpoints can run code on load
            kwargs["use_safetensors"] = True
        else:  # the config read above: transformers would parse the GGUF file's metadata again
            kwargs["config"] = config
        if device_map is not None:
            kwargs["device_map"] = device_map
        if max_memory is not None:
            if device_map is None:
                raise InputError("max_memory applies to device_map placement; set device_map too")
            # a config file's keys are text: "0" is GPU 0 for accelerate
            kwargs["max_memory"] = {
                int(k) if isinstance(k, str) and k.isdigit() else k: v
                for k, v in max_memory.items()
            }
        try:
            # a text-only family's processor is its tokenizer, its model a causal LM
            processor_class = AutoTokenizer if cls.text_only else AutoProcessor
            causal = cls.text_only or cls.loads_as_causal_lm
            model_class = AutoModelForCausalLM if causal else AutoModelForImageTextToText
            processor = processor_class.from_pretrained(
                source, revision=revision, trust_remote_code=trust_remote_code, **file
            )
            model = model_class.from_pretrained(source, **kwargs)
        except OSError as exc:
            hint = ""
            if "safetensors" in str(exc):
                hint = (
                    " posdebias loads safetensors weights only (pickled .bin checkpoints can run "
                    "code); convert the checkpoint with save_pretrained(safe_serialization=True)"
                )
            raise InputError(f"cannot load model {source!r}: {exc}.{hint}") from None
        except ImportError as exc:  # e.g. SmolVLM's processor needs num2words
            raise InputError(f"cannot load model {source!r}: {exc}") from None
        except ValueError as exc:
            if not trust_remote_code and "trust_remote_code" in str(exc):
                raise remote_code_error(source, "its processor needs custom code") from None
            raise AdapterError(
                f"{source!r} (model_type {config.model_type!r}) cannot be loaded as an image-text "
                f"model: {exc}. Known adapter families: {known_families()}; see {PLUGIN_GUIDE}"
            ) from None
        except Exception as exc:  # a damaged file: truncated safetensors, a broken tokenizer, ...
            raise InputError(
                f"cannot load model {source!r}: {type(exc).__name__}: {str(exc)[:300]}. A file of "
                "the model folder is damaged or truncated; download or save the model again"
            ) from None
    model = cls.prepare_loaded(model, _local_folder(source, revision))
    if device_map is None:
        model = model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.eval()
    return cls(
        model,
        processor,
        model_id=os.fspath(model_id_or_path),
        label_set=label_set,
        prompt=prompt,
        **options,
    )


def bundled_task(model: str | os.PathLike[str] | None) -> str | None:
    """The task a bundled model poses (its own questions'), or None for any other model: what
    a run or a check of it poses unless a task or a benchmark is named, at every door."""
    bundled = None if model is None else get_registry().bundled_model(os.fspath(model))
    return None if bundled is None else bundled.task


def default_label_set(
    task: str | None = None, model: str | os.PathLike[str] | None = None
) -> str | None:
    """The label set a task prompts with unless one is named, the same at every door (the
    command line, :func:`load_adapter`, :func:`get_adapter`): the task's own by the one rule,
    :func:`~posdebias.core.tasks.task_label_set`. A bundled model's own task decides whatever
    the task (it knows its own words only); without a task, None: the adapter labels each
    instance by its task's own set. A task that does not exist is an InputError."""
    if task not in (None, *TASK_LABEL_SETS):
        raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASK_LABEL_SETS)}")
    task = bundled_task(model) or task
    return None if task is None else task_label_set(task)


def get_adapter(
    model: Any,
    processor: Any,
    *,
    adapter: str | None = None,
    task: str | None = None,
    **options: Any,
) -> HFAdapter:
    """Wrap an already loaded model + processor (options: label_set, prompt, end_token, ...;
    the label set defaults to ``task``'s, else each instance's task's own, see
    :func:`default_label_set`)."""
    if "label_set" not in options and task is not None:
        options["label_set"] = default_label_set(task)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise InputError(f"{type(model).__name__} is not a Hugging Face model (no config)")
    cls = _adapter_class(model_type, adapter)
    model.eval()
    return cls(model, processor, **options)  # the options model checks every option


def served(name: str | None) -> bool:
    """Whether adapter ``name`` talks to a model server (its ``model`` is a served name, not a
    checkpoint to load)."""
    if name is None:
        return False
    return issubclass(get_registry().adapter_class(name), ServerAdapter)


def open_adapter(model: str, *, adapter: str | None = None, **options: Any) -> Adapter:
    """The adapter for ``model``: a served model by name (``adapter: openai``), otherwise a
    checkpoint loaded with :func:`load_adapter`."""
    if served(adapter):
        assert adapter is not None
        unused = sorted(set(options) & {"dtype", "device", "device_map", "trust_remote_code"})
        if unused:
            raise InputError(
                f"adapter {adapter!r} talks to a server that loads the model itself; the "
                f"loading options {unused} do not apply (set them on the server)"
            )
        return get_registry().create_adapter(adapter, model=model, **options)
    return load_adapter(model, adapter=adapter, **options)


def check_device(device: str) -> None:
    """Refuse a ``--device`` torch cannot parse or this machine does not have, before the
    model is loaded (``cuda:99`` on a machine with one GPU, ``npu:0``, ``cpu:abc``)."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InputError(
            f"device {device!r} is not a device name torch knows; use cpu, cuda, cuda:N or mps"
        ) from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (parsed.index is not None and parsed.index >= count) or count == 0:
            have = (
                f"{count} CUDA device(s) (cuda:0 .. cuda:{count - 1})"
                if count
                else "no CUDA device"
            )
            raise InputError(f"device {device!r} is not available: this machine has {have}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {device!r} is not available on this machine")
    elif parsed.type not in ("cpu", "cuda", "mps", "meta"):
        raise InputError(
            f"device {device!r} is not supported by posdebias; use cpu, cuda, cuda:N or mps"
        )
