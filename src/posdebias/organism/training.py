"""What every bundled organism's training shares: its word-level tokenizer, one thread and one
seed, and the model folder it writes.

The image organism (:mod:`posdebias.organism.train`) and the text organism
(:mod:`posdebias.organism.text.train`) both train a tiny real Hugging Face model from a seed on
one CPU thread and publish a folder that ``from_pretrained`` loads: weights, config, tokenizer
(or processor), the model card and ``training.json`` with the settings and the time.
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._rundir import RunFolder
from posdebias.errors import OutputError

CARD_FILE = "README.md"
TRAINING_FILE = "training.json"


def word_pre_tokenizer() -> Any:
    """Words and runs of punctuation, a run of digits one word (``12`` is one label)."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=False)]
    )


def words_of(texts: Sequence[str]) -> list[str]:
    """Every word of ``texts`` as :func:`word_pre_tokenizer` splits them, sorted (token ids never
    depend on hash seeds)."""
    pre = word_pre_tokenizer()
    return sorted({piece for text in texts for piece, _ in pre.pre_tokenize_str(text)})


def word_tokenizer(
    vocabulary: Sequence[str],
    *,
    chat_template: str,
    named_tokens: dict[str, str] | None = None,
) -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over ``vocabulary`` (ids in its order), with
    ``<unk>``, ``<pad>``, ``<s>``, ``</s>`` (which ``vocabulary`` must hold) and the special
    ``named_tokens`` (``{"image_token": "<image>"}``: an attribute of the tokenizer, as real
    checkpoints name theirs)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(vocabulary)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = word_pre_tokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens=named_tokens or {},
        chat_template=chat_template,
    )
    if named_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(named_tokens.values())})
    return tokenizer


def curriculum_n(
    step: int, steps: int, low: int, start: int, high: int, rng: np.random.Generator
) -> int:
    """N of training step ``step`` of ``steps``: uniform over ``low`` up to a ceiling that grows
    linearly from ``start`` to ``high`` over the first half of the steps.

    Why a curriculum: with N uniform up to 12 from the first step, the image organism's
    attention converged but its answer stayed at chance (the label of the attended candidate
    has to be copied, and at large N that copy is too hard to find first); starting at N <= 4,
    where it is found within a few hundred steps, and widening from there, the answer follows
    at every N.
    """
    ramp = max(1, steps // 2)
    first = max(low, min(start, high))
    ceiling = min(high, first + (high - first) * step // ramp)
    return int(rng.integers(low, ceiling + 1))


def train_top(model: Any, language_model: Any, learning_rate: float) -> Any:
    """Freeze ``model`` except the top decoder layer and final norm of ``language_model`` and
    the LM head; an AdamW optimizer over those (the bias stage of both organisms: the answer
    changes, the lower layers' attention does not)."""
    import torch

    for parameter in model.parameters():
        parameter.requires_grad_(False)
    trained = [
        *language_model.layers[-1].parameters(),
        *language_model.norm.parameters(),
        *model.lm_head.parameters(),
    ]
    for parameter in trained:
        parameter.requires_grad_(True)
    return torch.optim.AdamW(trained, lr=learning_rate)


def optimize(optimizer: Any, loss: Any, schedule: Any = None) -> None:
    """One optimizer step on ``loss`` (gradients cleared first), then one of ``schedule``."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if schedule is not None:
        schedule.step()


def soft_target_step(optimizer: Any, logits: Any, label_ids: Any, targets: Any) -> float:
    """One optimizer step on the cross-entropy of the label distribution (the log-softmax over
    the whole vocabulary, at the labels' tokens) against soft ``targets`` [B, N]; the loss."""
    import torch

    log_probs = torch.log_softmax(logits, dim=-1)[:, label_ids]
    loss = -(targets * log_probs).sum(dim=1).mean()
    optimize(optimizer, loss)
    return float(loss.item())


def model_folder(target: Path) -> RunFolder:
    """The folder a training writes, through the one run-directory layer: new or empty (a
    trained model is never replaced), locked while training, the model staged inside it and
    renamed into place only once complete. Opened before training, so an unusable ``--out``
    (a file, a link, a full disk) fails in a second, not after the training."""
    folder = RunFolder(target, marker=TRAINING_FILE, own=re.compile(r".+"), kind="model folder")
    if folder.is_ours():
        raise OutputError(
            f"--out {target} already holds a trained model; posdebias never replaces one: "
            "choose a new folder"
        )
    folder.check()
    folder.create()
    folder.lock()
    return folder


@contextlib.contextmanager
def seeded(seed: int, threads: int) -> Iterator[None]:
    """Torch on ``threads`` CPU threads with its global generator seeded by ``seed``; both
    restored afterwards (one thread: sums in a fixed order, so a training is reproducible)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(before)


def train_model(
    out: str | Path,
    seed: int,
    threads: int,
    train: Callable[[], tuple[Any, Any, dict[str, Any]]],
    *,
    dtype: str,
    card: Path,
    log: Callable[[str], None],
    files: dict[str, str] | None = None,
) -> Path:
    """Run ``train`` under :func:`seeded` and publish what it returns into the model folder
    ``out``, all appearing together: the model (SDPA attention, ``dtype``), its processor or
    tokenizer, the model ``card``, ``files`` (name -> text) and ``training.json`` (its record,
    with the time and versions). The one frame of both organisms' trainings."""
    path = Path(out)
    folder = model_folder(path)  # before torch's import: a bad --out fails at once
    try:
        import torch
        import transformers

        started = time.perf_counter()
        with seeded(seed, threads):
            model, processor, info = train()
        seconds = time.perf_counter() - started
        info = {
            **info,
            "dtype": dtype,
            "training_seconds": round(seconds, 1),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
        }
        from safetensors import SafetensorError

        model.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        try:
            with folder.staged() as staging:
                model.set_attn_implementation("sdpa")
                model.to(getattr(torch, dtype)).save_pretrained(staging)
                processor.save_pretrained(staging)
                for name, text in (files or {}).items():
                    (staging / name).write_text(text, "utf-8")
                shutil.copyfile(card, staging / CARD_FILE)
                (staging / TRAINING_FILE).write_text(json.dumps(info, indent=2) + "\n", "utf-8")
        except (OSError, SafetensorError) as exc:  # safetensors reports a full disk its way
            why = getattr(exc, "strerror", None) or exc
            raise OutputError(f"cannot write the model to {folder.root}: {why}") from exc
    finally:
        folder.unlock(remove=folder.is_ours())
    log(f"trained in {seconds:.0f} s; wrote {path}")
    return path
