"""The lmms-eval model ``posdebias``: calibrated answers inside lmms-eval (0.7.3).

    pip install 'posdebias[lmms-eval]'
    lmms-eval --model posdebias \\
        --model_args pretrained=MODEL,calibrators=vanilla+attention_guided,calibration=STATE \\
        --tasks TASK --include_path TASKS_FOLDER

lmms-eval finds the class through the ``lmms_eval.models`` entry point
(:func:`posdebias.integrations.lmms_eval_manifest`). Every family posdebias loads works:
``pretrained`` is what :func:`posdebias.load_adapter` takes (a hub id, a local folder, or
``posdebias/organism``). Requests are answered from the document, not the harness's prompt
string: the query and the candidates come from :func:`~posdebias.integrations.harness.doc_instance`
(a task it cannot read is refused naming the task), and the prompt is the model's own posdebias
prompt.

* ``generate_until``: the calibrated label (``"2"``, ``"B"``: the task's own label set unless
  ``label_set`` names another, which must then be the one the task expects);
* ``loglikelihood`` (multiple-choice tasks: one request per label): the calibrated
  log-probability of that label, NEGATED, because lmms-eval 0.7.3 scores multiple choice with
  ``argmin`` (it expects a loss, the negative log-likelihood, as its own models return).

The lmms-eval 0.7.3 workarounds this class carries (docs: "In lmms-eval and VLMEvalKit"):
``filelock<4`` pinned by the extra (lmms-eval imports ``filelock._api``, gone in filelock 4);
answers wrapped in lmms-eval's ``GenerationResult`` (a bare ``(score, is_greedy)`` tuple is
turned into the text ``"(-1.25, True)"`` by its output unwrapping); the negated score above;
``accelerator`` and ``device`` attributes, which its multi-process path reads from the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lmms_eval.api.instance import GenerationResult
from lmms_eval.api.instance import Instance as Request
from lmms_eval.api.model import lmms

from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.observation import Prediction
from posdebias.core.tasks import task_label_set
from posdebias.errors import InputError
from posdebias.integrations.harness import (
    CALIBRATION_SPLIT,
    LABELS,
    LaunchedHarness,
    TaskMappingError,
    doc_instance,
    label_loglikelihood,
)
from posdebias.integrations.lmms_eval_tasks import (
    check_calibration_items,
    refusals_stop_the_command,
)


class PosdebiasLMM(LaunchedHarness, lmms):
    """lmms-eval's ``--model posdebias`` (see the module docstring)."""

    is_simple = True

    def __init__(self, **arguments: Any) -> None:
        super().__init__()
        if arguments.get("device") in ("", None):
            arguments.pop("device", None)
        batch_size = arguments.get("batch_size")  # lmms-eval's own --batch_size comes as text
        if isinstance(batch_size, str) and batch_size.isascii() and batch_size.isdigit():
            arguments["batch_size"] = int(batch_size)
        # lmms-eval's multi-process path reads lm.accelerator and lm.device (workaround 4)
        config = self._launch(arguments, "lmms-eval --model_args of posdebias")
        self.batch_size_per_gpu = config.batch_size

    # -- requests ------------------------------------------------------------------------

    def _task_items(self, tasks: Sequence[str]) -> list[Instance]:
        """The held-out items of the first task, by name, with a calibration split (by name,
        so every process picks the same one whichever requests it holds)."""
        for task in sorted(set(tasks)):
            splits = self.task_dict.get(task, {})
            if CALIBRATION_SPLIT in splits:
                calibration = splits[CALIBRATION_SPLIT]
                for split, docs in splits.items():
                    if split != CALIBRATION_SPLIT:
                        check_calibration_items(task, calibration, docs)
                return [doc_instance(doc, task) for doc in calibration]
        raise InputError(
            f"calibration=task, but none of the tasks {sorted(set(tasks))} has a "
            f"'{CALIBRATION_SPLIT}' split; write one with `posdebias lmms-eval-task "
            "--calibration-count M`, or pass calibration=<saved state or benchmark folder>"
        )

    def _answer(self, requests: Sequence[Request]) -> list[tuple[Prediction, list[str]]]:
        """(prediction, labels) per request."""
        where = [request.args[-3:] for request in requests]  # (doc_id, task, split)
        docs = [self.task_dict[task][split][doc_id] for doc_id, task, split in where]
        tasks = [task for _, task, _ in where]
        return self._predictions(docs, tasks, lambda: self._task_items(tasks), _expected_labels)

    @refusals_stop_the_command()
    def generate_until(self, requests: list[Request]) -> list[GenerationResult]:
        """The calibrated label of each request's document."""
        return [
            GenerationResult(text=labels[prediction.choice])
            for prediction, labels in self._answer(requests)
        ]

    @refusals_stop_the_command()
    def loglikelihood(self, requests: list[Request]) -> list[GenerationResult]:
        """Per (document, label) request: (negated calibrated log-probability, is the argmax),
        wrapped in ``GenerationResult`` so lmms-eval keeps the pair (workarounds 2 and 3)."""
        pairs = [
            label_loglikelihood(prediction, labels, request.args[1], request.task_name)
            for request, (prediction, labels) in zip(requests, self._answer(requests), strict=True)
        ]
        # lmms-eval's unwrap_generation_output returns .text unchanged: the pair survives
        return [GenerationResult(text=(-logprob, is_choice)) for logprob, is_choice in pairs]

    @refusals_stop_the_command()
    def generate_until_multi_round(self, requests: list[Request]) -> list[str]:
        raise TaskMappingError(
            "posdebias answers one question per document; multi-round tasks are not supported"
        )


def _expected_labels(doc: Mapping[str, Any], instance: Instance) -> list[str] | None:
    """A rotated task's own labels, else a foreign multiple-choice task's letters."""
    expected = doc.get(LABELS)
    if expected is None and instance.task != "retrieval":
        expected = get_label_set(task_label_set(instance.task)).labels(instance.n)
    return expected
