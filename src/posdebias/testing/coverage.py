"""Which image-text families of the installed transformers posdebias reads, and how.

Every ``model_type`` of transformers' image-text-to-text mapping gets one verdict:

* ``built in``: a registered adapter claims it (checked by ``posdebias check`` in our tests);
* ``refused``: the generic adapter would take it, but its config or model class shows something
  the generic adapter cannot read right (:func:`~posdebias.adapters.families.generic.
  structural_problem`), or the recorded sweep found it refused at load (the processor dry run);
  a run stops with that reason before any forward;
* ``generic``: nothing refuses it. Where the recorded sweep built a tiny model of the family from
  transformers' own classes, every ``posdebias check`` row passed on it (``checked``); where no
  tiny model could be built offline it is not checked. At load the generic adapter still dry-runs
  the processor (offsets, placeholder tokens, tiles, bidirectional prefixes) and verifies its
  first batch against the model's own forward, and refuses on either.

The sweep is recorded in ``data/family_sweep.json`` (per family: its verdict and why, and the
transformers version it ran on); it applies only to that version of transformers.
``posdebias plugins --families`` prints the table; the Adapters page of the documentation holds
it, and a test keeps the two equal.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Any

from posdebias.adapters.families.generic import structural_problem
from posdebias.registry import get_registry

BUILT_IN, GENERIC, REFUSED = "built in", "generic", "refused"

#: the sweep's verdicts (its ``could not build`` is a family left unchecked)
SWEPT_PASS, SWEPT_REFUSED, SWEPT_FAIL = "PASS", "refused", "FAIL"
_UNCHECKED = "not checked (no tiny model of it could be built offline"
_AT_LOAD = "processor dry run and first-batch verification at load"


@dataclass(frozen=True)
class FamilyVerdict:
    """One row of the coverage table."""

    model_type: str
    verdict: str
    detail: str


def image_text_model_types() -> list[str]:
    """Every ``model_type`` of the installed transformers' image-text-to-text mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def family_coverage() -> list[FamilyVerdict]:
    """The verdict of every image-text family (config defaults, no weights, no processor)."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    registry = get_registry()
    swept = recorded_sweep()
    rows = []
    for model_type in image_text_model_types():
        adapter = registry.adapter_for_model_type(model_type)
        if adapter is not None and adapter.name != "generic":
            rows.append(FamilyVerdict(model_type, BUILT_IN, f"adapter {adapter.name!r}"))
            continue
        model_class = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])
        try:
            config = AutoConfig.for_model(model_type)
        except Exception as exc:  # a config that needs arguments: say so, do not guess
            rows.append(
                FamilyVerdict(model_type, REFUSED, f"its config cannot be built: {exc}"[:160])
            )
            continue
        problem = structural_problem(config, model_class)
        if problem is None:
            rows.append(_swept_verdict(model_type, swept.get(model_type)))
        else:
            rows.append(FamilyVerdict(model_type, REFUSED, problem))
    return rows


def recorded_sweep() -> dict[str, dict[str, str]]:
    """The recorded sweep's verdict of each family it ran (``verdict``, ``detail``), or ``{}``
    when it ran on another version of transformers than the installed one."""
    import transformers

    text = resources.files("posdebias").joinpath("data/family_sweep.json").read_text("utf-8")
    record: dict[str, Any] = json.loads(text)
    if record["transformers"] != transformers.__version__:
        return {}
    families: dict[str, dict[str, str]] = record["families"]
    return families


def _swept_verdict(model_type: str, swept: dict[str, str] | None) -> FamilyVerdict:
    """A family the config does not refuse, as the recorded sweep found it."""
    if swept is None:
        return FamilyVerdict(model_type, GENERIC, _AT_LOAD)
    if swept["verdict"] == SWEPT_PASS:
        detail = "checked: a tiny model of its own classes passes every `posdebias check` row"
        return FamilyVerdict(model_type, GENERIC, detail)
    if swept["verdict"] == SWEPT_REFUSED:
        return FamilyVerdict(model_type, REFUSED, f"at load: {swept['detail']}")
    if swept["verdict"] == SWEPT_FAIL:
        return FamilyVerdict(model_type, GENERIC, f"a check row FAILS: {swept['detail']}")
    return FamilyVerdict(model_type, GENERIC, f"{_UNCHECKED}: {swept['detail']}); {_AT_LOAD}")


def coverage_markdown(rows: list[FamilyVerdict]) -> str:
    """The table as Markdown (the Adapters page embeds exactly this)."""
    import transformers

    counts = Counter(row.verdict for row in rows)
    checked = sum(1 for row in rows if row.verdict == GENERIC and row.detail.startswith("checked"))
    unchecked = sum(1 for row in rows if row.detail.startswith(_UNCHECKED))
    lines = [
        f"transformers {transformers.__version__}: {len(rows)} image-text families, "
        f"{counts[BUILT_IN]} built in, {counts[GENERIC]} generic ({checked} of them checked, "
        f"{unchecked} with no tiny model to check), {counts[REFUSED]} refused.",
        "",
        "| model_type | verdict | adapter, or why |",
        "|---|---|---|",
    ]
    for row in rows:
        detail = row.detail.replace("|", "\\|")
        lines.append(f"| `{row.model_type}` | {row.verdict} | {detail} |")
    return "\n".join(lines) + "\n"
