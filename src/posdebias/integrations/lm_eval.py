"""The lm-eval model ``posdebias``: calibrated answers inside lm-evaluation-harness (0.4.13).

    pip install 'posdebias[lm-eval]'
    posdebias lm-eval --model posdebias \\
        --model_args pretrained=MODEL,calibrators=vanilla+attention_guided,calibration=STATE \\
        --tasks TASK --include_path TASKS_FOLDER

lm-eval 0.4.13 knows the models of its own list (``lm_eval.models.MODEL_MAPPING``) and those
registered with its ``register_model`` decorator in the running process; it reads no entry
point, so no installed package can add a name to a plain ``lm-eval --model``. Importing this
module registers ``posdebias``; ``posdebias lm-eval`` is lm-eval's own command line (the same
arguments, the same printed table) with it registered (:func:`main`), and from Python
``lm_eval.simple_evaluate(model=PosdebiasLM(...), ...)`` takes the model object.

Requests are answered from their document, as in lmms-eval (:mod:`posdebias.integrations.
lmms_eval`): the stem and the candidates come from
:func:`~posdebias.integrations.harness.doc_instance` (``choices``, MMLU's list, included), the
prompt is the adapter's template for the task (``adapter_options``: a JSON file, e.g. the
``task_prompt`` and ``chat_template: raw`` that write lm-eval's own MMLU prompt,
:func:`lm_eval_prompt`), and every answer is the calibrated one:

* ``loglikelihood`` (multiple-choice tasks, one request per label): the calibrated
  log-probability of that label (lm-eval picks the largest);
* ``generate_until``: the calibrated label.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from lm_eval.api.instance import Instance as Request
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from posdebias._inputs import CONFIG_LIMIT, jsonl_lines, parse_json, read_input_text
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf.prompt import RAW_CHAT_TEMPLATE
from posdebias.core.instance import Instance
from posdebias.core.observation import Prediction
from posdebias.errors import ConfigError, InputError
from posdebias.integrations import LM_EVAL_MODEL
from posdebias.integrations.harness import (
    CALIBRATION_FILE,
    LaunchedHarness,
    TaskMappingError,
    doc_instance,
    label_loglikelihood,
)
from posdebias.integrations.lm_eval_tasks import doc_choices
from posdebias.integrations.lmms_eval_tasks import check_calibration_items

__all__ = ["LM_EVAL_MMLU_TEMPLATE", "PosdebiasLM", "harness_settings", "lm_eval_prompt", "main"]

#: lm-eval's MMLU prompt (``lm_eval/tasks/mmlu/default``), zero-shot, as a posdebias task
#: template: the subject's description, the question, ``A. choice`` lines, ``Answer:``; the
#: label follows after a space (the adapter option ``answer_prefix``), and the prompt is its
#: text as is (the adapter option ``chat_template: raw``).
LM_EVAL_MMLU_TEMPLATE: dict[str, Any] = {
    "instruction": "",
    "stem": "{question}\n",
    "candidate": "{label}. {text}",
    "candidate_separator": "\n",
    "query": "\nAnswer:",
    "separator": "",
}


def lm_eval_prompt(description: str = "") -> dict[str, Any]:
    """Adapter options that pose a multiple-choice instance exactly as lm-eval's MMLU task
    does with a model without a chat template (``description``: the task's, e.g. "The
    following are multiple choice questions (with answers) about anatomy.\\n\\n"): write them
    to the JSON file of ``adapter_options``, or pass them to ``posdebias.load_adapter``."""
    return {
        "label_set": "upper",
        "answer_prefix": " ",
        "chat_template": RAW_CHAT_TEMPLATE,
        "task_prompt": {**LM_EVAL_MMLU_TEMPLATE, "instruction": description},
    }


@register_model(LM_EVAL_MODEL)
class PosdebiasLM(LaunchedHarness, LM):
    """lm-eval's ``--model posdebias`` (see the module docstring). ``adapter``: an adapter
    already made (``posdebias.get_adapter`` on a loaded model), instead of ``pretrained``; or,
    a name (as ``--model_args`` give it), the adapter ``pretrained`` is loaded with."""

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, Any] | None = None
    ) -> PosdebiasLM:
        """``--model_args`` plus what lm-eval passes every model (:func:`harness_settings`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> PosdebiasLM:
        return cls(**harness_settings(dict(arg_dict), additional_config or {}))

    def __init__(self, *, adapter: Adapter | str | None = None, **arguments: Any) -> None:
        super().__init__()
        if isinstance(adapter, str):  # the model argument adapter=NAME, as for load_adapter
            arguments["adapter"], adapter = adapter, None
        if adapter is not None:
            if arguments.get("adapter_options") is not None:
                raise ConfigError(
                    "adapter_options apply when posdebias loads the model (pretrained=); "
                    "an adapter given is used as it was made"
                )
            arguments.setdefault("pretrained", adapter.describe().get("model_id") or adapter.name)
        self._launch(arguments, "lm-eval --model_args of posdebias", adapter)

    # -- lm-eval's distributed primitives (its evaluator calls them with several ranks) ----

    def all_gather(self, tensor: Any) -> Any:
        return tensor if self._world_size <= 1 else self.accelerator.gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> Any:
        if self._world_size <= 1:
            return [obj]
        import torch.distributed

        result = [None] * self._world_size if self._rank == dst else None
        torch.distributed.gather_object(obj=obj, object_gather_list=result, dst=dst)
        return result

    def barrier(self) -> None:
        if self._world_size > 1:
            self.accelerator.wait_for_everyone()

    # -- requests ------------------------------------------------------------------------

    def _task_items(self, docs: Sequence[dict[str, Any]], tasks: Sequence[str]) -> list[Instance]:
        """The calibration split a rotated task written by ``posdebias lm-eval-task``
        records (the file, checked against the digest written beside it)."""
        for doc, task in sorted(zip(docs, tasks, strict=True), key=lambda pair: pair[1]):
            path = doc.get(CALIBRATION_FILE)
            if path:
                text = read_input_text(path, "calibration split", limit=64 * CONFIG_LIMIT)
                calibration = [
                    parse_json(line, f"{path}:{number}")
                    for number, line in enumerate(jsonl_lines(text), start=1)
                    if line.strip()
                ]
                check_calibration_items(task, calibration, [doc])
                return [doc_instance(item, task) for item in calibration]
        raise InputError(
            f"calibration=task, but none of the tasks {sorted(set(tasks))} has a calibration "
            "split; write one with `posdebias lm-eval-task --calibration-count M`, or pass "
            "calibration=<saved state or benchmark folder>"
        )

    def _answer(self, requests: Sequence[Request]) -> list[tuple[Prediction, list[str]]]:
        """(prediction, the document's labels) per request."""
        # an lm-eval `answer` is the task's truth in the task's own terms (MMLU: an index
        # from 0); the model needs none, and a rotated document carries its `target`
        docs = [{k: v for k, v in request.doc.items() if k != "answer"} for request in requests]
        tasks = [str(request.task_name) for request in requests]
        return self._predictions(
            docs, tasks, lambda: self._task_items(docs, tasks), lambda doc, _: doc_choices(doc)
        )

    def loglikelihood(self, requests: list[Request]) -> list[tuple[float, bool]]:
        """Per (document, label) request: (calibrated log-probability, is the argmax)."""
        return [
            label_loglikelihood(prediction, labels, request.args[1], request.task_name)
            for request, (prediction, labels) in zip(requests, self._answer(requests), strict=True)
        ]

    def generate_until(self, requests: list[Request]) -> list[str]:
        """The calibrated label of each request's document."""
        return [labels[prediction.choice] for prediction, labels in self._answer(requests)]

    def loglikelihood_rolling(self, requests: list[Request]) -> list[float]:
        raise TaskMappingError(
            "posdebias answers questions with candidates; perplexity tasks "
            "(loglikelihood_rolling) are not supported"
        )


def harness_settings(arguments: dict[str, Any], harness: dict[str, Any]) -> dict[str, Any]:
    """The model's arguments with lm-eval's own settings where they apply and the model
    arguments name none: ``--batch_size`` as a number (not ``auto``), ``--device`` where
    there is one (lm-eval asks for ``cuda:0`` by default, on any machine; posdebias then
    picks the best device itself, as without it)."""
    batch_size = harness.get("batch_size")
    if "batch_size" not in arguments and str(batch_size or "").isdigit():
        arguments["batch_size"] = int(str(batch_size))
    device = harness.get("device")
    if "device" not in arguments and device and _usable(str(device)):
        arguments["device"] = str(device)
    return arguments


def _usable(device: str) -> bool:
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available())
    if device.startswith("mps"):
        return bool(torch.backends.mps.is_available())
    return True


def main(argv: Sequence[str]) -> None:
    """lm-eval's own command line (``argv``: its arguments) with ``--model posdebias``
    registered; ``posdebias lm-eval`` runs it."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *argv]
    cli_evaluate()
