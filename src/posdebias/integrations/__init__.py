"""posdebias inside the evaluation harnesses researchers already run (optional extras).

* :mod:`posdebias.integrations.lmms_eval`: an lmms-eval model (``--model posdebias``), found
  through the ``lmms_eval.models`` entry point that :func:`lmms_eval_manifest` answers;
* :mod:`posdebias.integrations.lmms_eval_tasks`: rotated multiple-choice tasks and the
  position-bias metrics (Acc, RStd, Cons., CircularEval) as lmms-eval metrics;
* :mod:`posdebias.integrations.lm_eval`: an lm-evaluation-harness model (``posdebias lm-eval
  --model posdebias``, or ``simple_evaluate`` with :class:`~posdebias.integrations.lm_eval.
  PosdebiasLM`) and :mod:`posdebias.integrations.lm_eval_tasks`, the same rotated tasks there;
* :mod:`posdebias.integrations.vlmevalkit`: a VLMEvalKit model class for its Python API;
* :mod:`posdebias.integrations.harness`: what both share (harness documents to instances,
  calibration once per run, shared across processes, with its provenance).

Nothing here is imported by the rest of posdebias; each harness is imported only when used.
"""

from __future__ import annotations

from typing import Any

#: The model name under which lmms-eval finds posdebias (``lmms-eval --model posdebias``).
LMMS_EVAL_MODEL = "posdebias"
LMMS_EVAL_CLASS = "posdebias.integrations.lmms_eval.PosdebiasLMM"
#: The model name under which lm-eval runs posdebias (``posdebias lm-eval --model posdebias``).
LM_EVAL_MODEL = "posdebias"


def lmms_eval_manifest() -> Any:
    """The ``lmms_eval.models`` entry point: lmms-eval 0.7 calls it while building its model
    registry and registers the returned ``ModelManifest`` (lmms-eval is imported only here,
    so the entry point costs posdebias users without lmms-eval nothing)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=LMMS_EVAL_MODEL, simple_class_path=LMMS_EVAL_CLASS)
