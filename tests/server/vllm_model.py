"""A tiny random-weight Qwen2 text model that vLLM (CPU) and transformers both load.

vLLM's CPU attention needs head_dim >= 32, so the model has 4 heads of 32 (2 KV heads); the
tokenizer is the toy BPE of posdebias' test models with a ChatML template in which an image
item renders as the literal text ``<image>`` (a text model sees a placeholder, not pixels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML_TEXT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_text_model(seed: int = 0) -> tuple[Any, Any]:
    """(Qwen2ForCausalLM in float32, its tokenizer), identical for one seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from posdebias.testing.tiny.common import build_tokenizer

    tokenizer = build_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<image>"],
        chat_template=CHATML_TEXT,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=False,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval(), tokenizer


def save_text_model(directory: Path, seed: int = 0) -> Path:
    model, tokenizer = build_text_model(seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class TransformersTextAdapter:
    """The reference: the same prompt and labels as the ``openai`` adapter (with the same
    options), scored by the transformers forward of the same weights with posdebias' restricted
    label scoring (adapters/scoring.py), one full forward per decoding step (no cache)."""

    def __new__(cls, **options: Any) -> Any:  # a real Adapter subclass, built lazily
        return reference_class()(**options)


def reference_class() -> type:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posdebias.adapters.hf.scoring import plan_labels, score_labels
    from posdebias.adapters.server import ServerAdapter
    from posdebias.core.observation import Observation

    class Reference(ServerAdapter):
        """Prompts and labels of the ``openai`` adapter (it sends no request), scores from
        transformers."""

        name = "transformers_text"

        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self.prompting = self
            folder = options["tokenizer"]
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

        def describe(self, n: int | None = None) -> dict[str, Any]:
            return {**super().describe(n), "adapter": self.name}

        def scores(self, instance: Any) -> np.ndarray:
            messages = self.prompting.messages(instance)
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            prompt = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
            labels = self.prompting.labels_for(instance.n)
            tokens = []
            for label in labels:
                full = self.tokenizer(rendered + label, add_special_tokens=False)["input_ids"]
                assert full[: len(prompt)] == prompt
                tokens.append(full[len(prompt) :])
            plan = plan_labels(tokens, self.tokenizer.eos_token_id, labels)

            def logits(prefix: tuple[int, ...]) -> torch.Tensor:
                ids = torch.tensor([prompt + list(prefix)])
                with torch.inference_mode():
                    return self.model(input_ids=ids).logits[:, -1, :]

            return score_labels(plan, logits(()), logits)[0].double().numpy()

        def observe_many(self, instances: Any, *, batch_size: int = 1) -> list[Observation]:
            return [Observation(label_logprobs=self.scores(i), target=i.target) for i in instances]

    return Reference
