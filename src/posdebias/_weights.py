"""Safetensors only, by every route: checked on the model folder before transformers opens it.

``from_pretrained(use_safetensors=True)`` alone is not enough: a ``model.safetensors.index.json``
may map tensors to a pickled ``.bin`` shard, ``config.json`` may name a weights file
(``transformers_weights``), a PEFT adapter may be ``adapter_model.bin``, and a ``variant`` or a
sharded checkpoint has other names. Unpickling runs code, so a model folder holding a pickled
weights file that transformers could pick up by any of these routes is refused outright, before
anything in it is loaded. Trainer leftovers that transformers never loads (``training_args.bin``,
``optimizer.pt``, ``rng_state.pth``...) are ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from posdebias._inputs import CONFIG_LIMIT, DATA_LIMIT, excerpt, read_input_text
from posdebias.errors import InputError

#: Suffixes of formats that are not safetensors (pickle, TensorFlow, Flax).
_UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".msgpack")
#: Weight-file stems transformers (and PEFT through it) load: ``pytorch_model``,
#: ``model``, ``adapter_model``, ``tf_model``, ``flax_model``, with a variant or shard suffix.
_WEIGHT_STEM = re.compile(r"^(pytorch_model|model|adapter_model|tf_model|flax_model)([.-].*)?\Z")
_FIX = (
    "posdebias loads safetensors weights only (pickled checkpoints can run code when loaded); "
    "convert the checkpoint with save_pretrained(safe_serialization=True) and remove the "
    "pickled files"
)


def _unsafe(name: str) -> bool:
    return name.lower().endswith(_UNSAFE_SUFFIXES)


def check_safetensors_only(folder: str | Path) -> None:
    """Refuse ``folder`` if a non-safetensors weight file could be loaded from it.

    Routes checked: weight files by name (plain, variant, sharded), every ``*.index.json``'s
    ``weight_map`` (each entry must be a ``.safetensors`` file inside the folder), and the
    ``transformers_weights`` entry of ``config.json``.
    """
    root = Path(folder)
    if not root.is_dir():
        return
    problems: list[str] = []
    for path in sorted(root.iterdir()):
        name = path.name
        if _unsafe(name) and _WEIGHT_STEM.fullmatch(name.rsplit(".", 1)[0]):
            problems.append(f"{name} is a pickled or non-safetensors weights file")
        elif name.endswith(".index.json"):
            problems += _index_problems(root, path)
    payload = model_config(root)
    if payload is not None:
        explicit = payload.get("transformers_weights")
        if explicit is not None and (
            not isinstance(explicit, str) or not explicit.endswith((".safetensors", ".json"))
        ):
            problems.append(f"config.json names the weights file {excerpt(explicit)}")
    if problems:
        raise InputError(f"cannot load model {root}: " + "; ".join(problems[:10]) + f". {_FIX}")


def model_config(folder: str | Path) -> dict[str, Any] | None:
    """A model folder's ``config.json`` as a JSON object (read within the config limit), None
    where there is none or it is broken (transformers reports a broken config itself)."""
    config = Path(folder, "config.json")
    if not config.is_file():
        return None
    text = read_input_text(config, "model config", limit=CONFIG_LIMIT)  # too large: refused
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def _index_problems(root: Path, index: Path) -> list[str]:
    if index.name.endswith(_UNSAFE_SUFFIXES[0] + ".index.json"):  # pytorch_model.bin.index.json
        return [f"{index.name} indexes pickled .bin shards"]
    text = read_input_text(index, "weights index", limit=DATA_LIMIT)
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return [f"{index.name} is not valid JSON"]
    weight_map = payload.get("weight_map") if isinstance(payload, dict) else None
    if not isinstance(weight_map, dict):
        return []  # not a weights index (transformers would not use it as one)
    problems = []
    real_root = root.resolve()
    for file in sorted({str(value) for value in weight_map.values()}):
        if not file.endswith(".safetensors"):
            problems.append(
                f"{index.name} maps tensors to {excerpt(file)}, not a .safetensors file"
            )
        elif not (root / file).resolve().is_relative_to(real_root):
            problems.append(f"{index.name} maps tensors to {excerpt(file)}, outside the folder")
    return problems
