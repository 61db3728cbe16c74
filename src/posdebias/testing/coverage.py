"""Which image-text families of the installed transformers posdebias reads, and how.

Every ``model_type`` of transformers' image-text-to-text mapping gets one verdict:

* ``built in``: a registered adapter claims it (checked by ``posdebias check`` in our tests);
* ``refused``: the generic adapter would take it, but its config or model class shows something
  the generic adapter cannot read right (:func:`~posdebias.adapters.families.generic.
  structural_problem`); a run stops with that reason before any forward;
* ``generic``: nothing in the config refuses it; at load the generic adapter still dry-runs the
  processor (offsets, placeholder tokens, tiles, bidirectional prefixes) and verifies its first
  batch against the model's own forward, and refuses on either.

``posdebias plugins --families`` prints the table; the Adapters page of the documentation holds
it, and a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from posdebias.adapters.families.generic import structural_problem
from posdebias.registry import get_registry

BUILT_IN, GENERIC, REFUSED = "built in", "generic", "refused"


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
            rows.append(
                FamilyVerdict(
                    model_type, GENERIC, "processor dry run and first-batch verification at load"
                )
            )
        else:
            rows.append(FamilyVerdict(model_type, REFUSED, problem))
    return rows


def coverage_markdown(rows: list[FamilyVerdict]) -> str:
    """The table as Markdown (the Adapters page embeds exactly this)."""
    import transformers

    counts = {
        kind: sum(1 for row in rows if row.verdict == kind) for kind in (BUILT_IN, GENERIC, REFUSED)
    }
    lines = [
        f"transformers {transformers.__version__}: {len(rows)} image-text families, "
        f"{counts[BUILT_IN]} built in, {counts[GENERIC]} generic, {counts[REFUSED]} refused.",
        "",
        "| model_type | verdict | adapter, or why |",
        "|---|---|---|",
    ]
    for row in rows:
        detail = row.detail.replace("|", "\\|")
        lines.append(f"| `{row.model_type}` | {row.verdict} | {detail} |")
    return "\n".join(lines) + "\n"
