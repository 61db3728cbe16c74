"""``posdebias check``: prove an adapter right on a model before trusting its numbers.

Each check runs the adapter's own path and an independent reference, and reports PASS / FAIL with
the measured figure (and, on failure, the likely cause):

* ``image spans``: one span per image, in prompt order, disjoint, inside the prompt, together
  covering every image token exactly once (:func:`posdebias.adapters.hf.spans.check_spans`);
  for the candidate tasks ``candidate spans``: besides the images' spans, one disjoint span per
  candidate, and each text candidate's span decodes to exactly its text (no label, separator
  or neighbouring token: a span one token too long or too short fails);
* ``label tokens``: the labels' token paths are distinct and form a consistent trie;
* ``scores = own forward``: the adapter's restricted label scores (explicit positions, cached
  decoding steps) equal those of the model's own forward (no position ids, no cache), multi-token
  labels included (verify.py);
* ``probe = eager``: the probe's per-image attention masses equal eager ``output_attentions``
  reduced over the same spans (cross-attention layers: over each image's encoder tokens; SKIP
  when the language model has no eager attention);
* ``batch 1 vs 2``: a left-padded batch of two gives each row's numbers alone;
* ``rotation``: rotating the images cyclically moves the spans with them: span k of the rotated
  prompt holds exactly the input embeddings of image k + 1 of the original (for a model that
  reads its images through cross-attention: the vision encoder's tokens of image k + 1);
* ``preprocessing``: whether posdebias changed the image files before the processor saw them
  (the early shrink of large files, the ``image_size`` option) and, when it did, how far the
  label scores on the ORIGINAL files are from the scores on what posdebias fed the model.

An adapter that knows it cannot read the model (:meth:`HFAdapter.support_problem`) is refused
before any row runs. Where the adapter says a padded batch would change the numbers
(:class:`~posdebias.adapters.hf.BatchingUnsafe`), the probe and batch rows run the instances one
at a time, as the adapter itself does, and say so in their figure.

The figures are float32 comparisons: load the model in float32 to check it.
"""

from __future__ import annotations

import dataclasses
import itertools
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

import posdebias.defaults as defaults
from posdebias._images import min_image_side, open_image
from posdebias._inputs import excerpt
from posdebias.adapters.attention import install_probe, language_model_attention
from posdebias.adapters.hf import BatchingUnsafe, HFAdapter, PreparedBatch
from posdebias.adapters.hf.adapter import load_image
from posdebias.adapters.hf.spans import (
    ImageSpan,
    check_candidate_spans,
    check_spans,
    span_matrix,
)
from posdebias.adapters.hf.verify import max_difference, reference_scores, refuse_unsupported
from posdebias.core.instance import Instance, candidate_noun
from posdebias.errors import AdapterError, InputError, PosdebiasError

if TYPE_CHECKING:
    import torch

SCORE_TOLERANCE = 1e-4
PROBE_TOLERANCE = 1e-5
EMBEDDING_TOLERANCE = 1e-4

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

# (width, height) of generated images: different sizes and aspect ratios, so families whose
# token count follows the image size give every image its own span length.
_SIZES = ((56, 56), (84, 56), (56, 112), (112, 84), (70, 70), (112, 56), (56, 84), (98, 98))


@dataclass(frozen=True)
class CheckResult:
    """One row of the report: the check's name, PASS / FAIL / SKIP, the figure, the cause."""

    name: str
    status: str
    figure: str
    cause: str = ""

    @property
    def passed(self) -> bool:
        return self.status != FAIL


@dataclass(frozen=True)
class CheckReport:
    """Every check of one adapter on one model."""

    adapter: str
    model: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [result for result in self.results if not result.passed]

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def summary(self) -> str:
        """The report as plain text lines (for assertion messages and logs)."""
        lines = [f"posdebias check: adapter {self.adapter!r} on {self.model}"]
        for result in self.results:
            line = f"  {result.status} {result.name}: {result.figure}"
            lines.append(line + (f" -- {result.cause}" if result.cause else ""))
        return "\n".join(lines)


def check_images(count: int, *, seed: int = 0) -> list[Any]:
    """``count`` distinct seeded noise images (PIL) of different sizes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
        for width, height in itertools.islice(itertools.cycle(_SIZES), count)
    ]


#: Option texts of the candidate-task check instances (different lengths and word shapes).
_OPTIONS = (
    "a red square",
    "two blue circles, side by side",
    "none",
    "a green triangle on a white background",
    "it depends.",
    "the largest one",
    "a yellow star (small)",
    "three",
    "all of the above",
    "an orange hexagon",
    "not enough information",
    "the first and the last",
)


def check_instances(
    n: int = defaults.CANDIDATES,
    *,
    images: Sequence[Any] | None = None,
    multi_token_n: int | None = 10,
    task: str = "retrieval",
    with_images: bool = True,
) -> list[Instance]:
    """The default instances: two with N candidates (stems of different lengths, so a batch of
    them is left padded) and one with ``multi_token_n`` candidates (multi-token digit labels).

    ``images`` (paths or PIL images, at least ``n``) replaces the generated images. ``task``:
    the kind posed; a candidate task has text candidates (options, answers, passages), and
    with ``with_images`` (a vision-language model) a multiple-choice question also shows two
    images of its own and its first option is an image with a text.
    """
    if task != "retrieval":
        return _candidate_instances(n, task, multi_token_n, images, with_images)
    count = max(n, multi_token_n or 0)
    pool = list(images) if images is not None else check_images(count)
    if len(pool) < n:
        raise InputError(f"the check needs at least {n} images, got {len(pool)}")
    ids = [f"image-{index}" for index in range(len(pool))]
    instances = [
        Instance(
            stem="a photo of a red square" + " on a blue background" * index,
            images=tuple(pool[:n]) if index == 0 else tuple(pool[:n][::-1]),
            candidate_ids=tuple(ids[:n]) if index == 0 else tuple(ids[:n][::-1]),
            target=index % n,
            id=f"check-{index}",
        )
        for index in range(2)
    ]
    if multi_token_n and multi_token_n != n and len(pool) >= multi_token_n:
        instances.append(
            Instance(
                stem="a small green circle",
                images=tuple(pool[:multi_token_n]),
                candidate_ids=tuple(ids[:multi_token_n]),
                target=multi_token_n - 1,
                id="check-multi-token",
            )
        )
    return instances


def _candidate_instances(
    n: int,
    task: str,
    multi_token_n: int | None,
    images: Sequence[Any] | None,
    with_images: bool,
) -> list[Instance]:
    if task == "pairwise_judge":
        n, multi_token_n = 2, None
    show_images = with_images and task == "multiple_choice"
    pool = list(images) if images is not None else check_images(3) if show_images else []
    if show_images and len(pool) < 3:
        raise InputError(f"the check needs at least 3 images, got {len(pool)}")
    counts = [n, n] + ([multi_token_n] if multi_token_n and multi_token_n != n else [])
    stems = ("Which shape is shown", "Which shape is shown in the pictures above, and where")
    instances = []
    for index, count in enumerate(counts):
        if count > len(_OPTIONS):
            raise InputError(f"the check has {len(_OPTIONS)} option texts, N={count} is more")
        texts = _OPTIONS[:count] if index != 1 else _OPTIONS[:count][::-1]
        option_images: tuple[Any, ...] = ()
        if show_images:
            option_images = (pool[2], *([None] * (count - 1)))
        instances.append(
            Instance(
                stem=stems[min(index, 1)] + "?",
                texts=tuple(texts),
                images=option_images,
                stem_images=tuple(pool[:2]) if show_images else (),
                target=index % count,
                id=f"check-{task}-{index}",
                task=task,
            )
        )
    return instances


def check_adapter(
    adapter: Any,
    instances: Sequence[Instance] | None = None,
    *,
    n: int = defaults.CANDIDATES,
    task: str = "retrieval",
    score_tolerance: float = SCORE_TOLERANCE,
    probe_tolerance: float = PROBE_TOLERANCE,
) -> CheckReport:
    """Run every check on ``adapter`` (a Hugging Face adapter with its model loaded).

    Args:
        adapter: e.g. ``posdebias.get_adapter(model, processor)`` or ``load_adapter(path)``.
        instances: at least two instances with the same N (the batch check pairs the first
            two); default :func:`check_instances` with ``n`` images (and N = 10 for multi-token
            digit labels).
        n: images per instance of the default instances.
        task: the task kind of the default instances (:func:`check_instances`).
        score_tolerance: largest accepted difference of a label score (float32 default).
        probe_tolerance: largest accepted difference of an attention mass (float32 default).

    Returns:
        a :class:`CheckReport`; ``report.passed`` is True when no check failed. In a plugin's
        test suite: ``assert report.passed, report.summary()``.
    """
    if not isinstance(adapter, HFAdapter):
        raise InputError(
            f"posdebias check verifies Hugging Face adapters against their model; "
            f"{getattr(adapter, 'name', type(adapter).__name__)!r} wraps no model"
        )
    if instances is None:
        instances = check_instances(n, task=task, with_images=not adapter.text_only)
    instances = list(instances)
    if len(instances) < 2 or instances[0].n != instances[1].n:
        raise InputError("check_adapter needs at least two instances with the same N")
    refuse_unsupported(adapter)  # what the adapter knows it cannot read: no forward at all
    adapter.check_instances(instances)  # data the model would misread: an input error, no row
    for kind in sorted({instance.task for instance in instances}):
        problem = adapter.task_problem(kind)
        if problem is not None:
            raise AdapterError(problem)
    runner = _Checks(adapter, instances, score_tolerance, probe_tolerance)
    results = tuple(
        runner.run(name, check)
        for name, check in (
            (
                "image spans" if instances[0].task == "retrieval" else "candidate spans",
                runner.spans,
            ),
            ("label tokens", runner.labels),
            ("scores = own forward", runner.scores),
            ("probe = eager", runner.probe),
            ("batch 1 vs 2", runner.batch),
            ("rotation", runner.rotation),
            ("preprocessing", runner.preprocessing),
        )
    )
    model = adapter.model_id or type(adapter.model).__name__
    model_type = getattr(adapter.model.config, "model_type", None)
    return CheckReport(adapter.name, f"{model} ({model_type})", results)


class _Checks:
    """The checks of one adapter; each returns (status, figure, cause)."""

    def __init__(
        self,
        adapter: HFAdapter,
        instances: list[Instance],
        score_tolerance: float,
        probe_tolerance: float,
    ) -> None:
        self.adapter = adapter
        self.instances = instances
        self.score_tolerance = score_tolerance
        self.probe_tolerance = probe_tolerance
        self._singles: dict[int, tuple[Any, Any, Any]] = {}

    def run(self, name: str, check: Callable[[], tuple[str, str, str]]) -> CheckResult:
        try:
            status, figure, cause = check()
        except PosdebiasError as exc:
            return CheckResult(name, FAIL, "error", str(exc))
        except Exception as exc:  # a check reports what broke instead of stopping the others
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return CheckResult(
                name,
                FAIL,
                "error",
                f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
            )
        return CheckResult(name, status, figure, cause)

    # -- shared work ---------------------------------------------------------------------------

    def single(self, index: int) -> tuple[PreparedBatch, Any, Any]:
        """The prepared batch of instance ``index`` alone, its scores and masses (cached)."""
        if index not in self._singles:
            batch = self.adapter.prepare_batch([self.instances[index]])
            scores, masses = self.adapter.run_batch(batch)
            self._singles[index] = (batch, scores, masses)
        return self._singles[index]

    def pair(self) -> PreparedBatch:
        """The first two instances as one batch; it must be left padded (if the two prompts
        tokenize to the same length, the second caption is lengthened, and used from then on)."""
        batch = self.adapter.prepare_batch(self.instances[:2])
        if int((batch.inputs["attention_mask"] == 0).sum()) == 0:
            second = self.instances[1]
            longer = dataclasses.replace(second, stem=second.stem + " (seen again)")
            self.instances[1] = longer
            self._singles.pop(1, None)
            batch = self.adapter.prepare_batch(self.instances[:2])
            if int((batch.inputs["attention_mask"] == 0).sum()) == 0:
                raise InputError("the first two instances tokenize to the same length")
        return batch

    # -- the checks ----------------------------------------------------------------------------

    def spans(self) -> tuple[str, str, str]:
        summaries = []
        for index, instance in enumerate(self.instances):
            batch = self.single(index)[0] if index < 2 else self.adapter.prepare_batch([instance])
            summaries.append(self._row_spans(batch, 0, instance))
        pair = self.pair()
        for row in range(2):
            self._row_spans(pair, row, self.instances[row])
        return PASS, summaries[0], ""

    def _row_spans(self, batch: PreparedBatch, row: int, instance: Instance) -> str:
        """Check one row's spans; a text candidate's span must decode to its text."""
        covered = self.adapter.image_token_ids()
        ids = batch.inputs["input_ids"][row]
        if not instance.has_texts and not instance.stem_images:  # image candidates only
            return check_spans(batch.spans[row], ids, covered, instance.n)
        images = len(instance.all_images)
        if images:
            check_spans(batch.image_spans[row], ids, covered, images)
        summary = check_candidate_spans(batch.spans[row], ids, instance.n)
        tokens = ids.tolist()
        image_positions = {t for span in batch.image_spans[row] for t in span.positions()}
        for k, text in enumerate(instance.texts):
            if text is None:
                continue
            positions = [t for t in batch.spans[row][k].positions() if t not in image_positions]
            tokenizer = self.adapter.tokenizer
            decoded = tokenizer.decode([tokens[t] for t in positions])
            # the text as the tokenizer writes it (a word outside its vocabulary: unknown)
            written = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
            if "".join(decoded.split()) != "".join(written.split()):
                raise AdapterError(
                    f"candidate {k + 1}'s span decodes to {excerpt(decoded)}, not its text "
                    f"{excerpt(text)}: the span is off (label or separator tokens included, or "
                    "tokens of the text left out)"
                )
        texts = sum(1 for text in instance.texts if text is not None)
        return f"{summary}; {texts} text spans decode to their texts exactly"

    def labels(self) -> tuple[str, str, str]:
        figures = []
        for n in sorted({instance.n for instance in self.instances}):
            instance = next(i for i in self.instances if i.n == n)
            plan = self.adapter.prepare_batch([instance]).plan
            problem = _trie_problem(plan)
            if problem:
                return FAIL, f"N={n}", problem
            multi = sum(1 for path in plan.paths if len(path) > 1)
            figures.append(
                f"N={n}: {len(plan.paths)} distinct, {multi} multi-token, "
                f"{len(plan.steps)} decoding step(s)"
            )
        return PASS, "; ".join(figures), ""

    def scores(self) -> tuple[str, str, str]:
        worst = 0.0
        multi = False
        for index, instance in enumerate(self.instances):
            if index < 2:
                batch, scores, _ = self.single(index)
            else:
                batch = self.adapter.prepare_batch([instance])
                scores, _ = self.adapter.run_batch(batch, attention=False)
            multi = multi or bool(batch.plan.steps)
            reference = reference_scores(self.adapter, instance)
            worst = max(worst, max_difference(scores[0], reference))
        figure = (
            f"max |diff| {worst:.2g} over {len(self.instances)} prompts"
            + (" (multi-token labels included)" if multi else "")
            + f", tolerance {self.score_tolerance:g}"
        )
        if worst <= self.score_tolerance:
            return PASS, figure, ""
        cause = self.adapter.position_problem() or (
            "the adapter's position ids (prompt_position_ids / decode_position_ids) or its "
            "processor inputs are not what the model computes for itself"
        )
        return FAIL, figure, cause

    def probe(self) -> tuple[str, str, str]:
        import torch

        adapter = self.adapter
        batch = self.pair()
        how = "batch of 2 with left padding"
        try:
            _, masses = adapter.run_batch(batch)
        except BatchingUnsafe as exc:  # the adapter's own fallback: one instance at a time
            batch, _, masses = self.single(0)
            how = f"one instance at a time (the adapter says: {exc})"
        key = adapter.language_key
        try:
            adapter.model.set_attn_implementation(
                language_model_attention(adapter.model, key, "eager")
            )
        except (ValueError, AttributeError, KeyError) as exc:
            return SKIP, "no eager attention", f"the language model has no eager attention: {exc}"
        try:
            with torch.inference_mode():
                output = adapter.model_forward(
                    **batch.inputs, position_ids=batch.position_ids, output_attentions=True
                )
        finally:
            install_probe(adapter.model, key)
        length = batch.inputs["input_ids"].shape[1]
        maps = [layer for layer in output.attentions if layer is not None]
        spans = span_matrix(batch.spans, length).double()
        cross = adapter.cross_attention_spans(batch)
        if cross is not None:  # one map per layer; the cross-attention layers' keys are the
            maps = [maps[layer] for layer in sorted(cross.layers)]  # encoder's tokens
            spans = cross.matrix.double()
        rows = [layer[:, :, -1, :].double().mean(dim=1).cpu() for layer in maps]
        eager = torch.stack([torch.bmm(row[:, None, :], spans)[:, 0] for row in rows], dim=1)
        if eager.shape != masses.shape:
            return (
                FAIL,
                f"probe {tuple(masses.shape)} vs eager {tuple(eager.shape)}",
                "the probe and eager attention see different layers",
            )
        worst = max_difference(masses, eager)
        figure = (
            f"max |diff| {worst:.2g} over {masses.shape[1]} layers, {how}, "
            f"tolerance {self.probe_tolerance:g}"
        )
        cause = "the probe's attention row or mask differs from eager attention"
        return _verdict(worst <= self.probe_tolerance, figure, cause)

    def batch(self) -> tuple[str, str, str]:
        import torch

        batch = self.pair()
        fallback = ""
        try:
            scores, masses = self.adapter.run_batch(batch)
        except BatchingUnsafe as exc:
            # The adapter refuses this padded batch; what a run gets is observe_many's own
            # fallback (one at a time), which must still equal each instance alone.
            observed = self.adapter.observe_many(self.instances[:2], batch_size=2)
            scores = torch.tensor(np.stack([o.scored_logprobs for o in observed]))
            masses = torch.tensor(np.stack([np.asarray(o.attention) for o in observed]))
            fallback = f"; batching unsafe here, ran one at a time ({exc})"
        worst_scores = worst_masses = 0.0
        for row in range(2):
            _, alone_scores, alone_masses = self.single(row)
            worst_scores = max(worst_scores, max_difference(scores[row], alone_scores[0]))
            worst_masses = max(worst_masses, max_difference(masses[row], alone_masses[0]))
        figure = f"scores {worst_scores:.2g}, attention {worst_masses:.2g} (max |diff|){fallback}"
        passed = worst_scores <= self.score_tolerance and worst_masses <= self.probe_tolerance
        cause = (
            "a left-padded row differs from the same prompt alone: the position ids must count "
            "from each row's first real token (prompt_position_ids)"
        )
        return _verdict(passed, figure, cause)

    def rotation(self) -> tuple[str, str, str]:
        import torch

        instance = self.instances[0]
        n = instance.n
        nouns, noun = candidate_noun(instance.task), candidate_noun(instance.task, plural=False)
        original = self.single(0)[0]
        rotated = self.adapter.prepare_batch([instance.rotated(1)])
        before, before_spans = self._embeddings(original)
        after, after_spans = self._embeddings(rotated)
        worst = 0.0
        for k in range(n):
            moved = before_spans[(k + 1) % n]
            span = after_spans[k]
            if len(span) != len(moved):
                return (
                    FAIL,
                    f"{noun} {k + 1}: {len(span)} tokens after rotation, {len(moved)} before",
                    f"the spans do not follow the {nouns} when their order changes",
                )
            difference = torch.abs(after[span.positions()] - before[moved.positions()])
            worst = max(worst, float(difference.max()))
        figure = f"{nouns} rotated by 1: span k holds {noun} k + 1's tokens (max |embedding "
        figure += f"diff| {worst:.2g} over {n} spans)"
        cause = (
            f"the spans do not follow the {nouns}: span k of the rotated prompt does not "
            f"hold {noun} k + 1's tokens"
        )
        return _verdict(worst <= EMBEDDING_TOLERANCE, figure, cause)

    def preprocessing(self) -> tuple[str, str, str]:
        """What posdebias did to the image files before the processor, and what it changed."""
        from PIL import Image

        adapter = self.adapter
        instance = self.instances[0]
        if not instance.all_images:
            return PASS, "nothing to preprocess: the prompt is text only", ""
        side = min_image_side(adapter.processor)
        changes = []
        for position, reference in enumerate(instance.all_images):
            original = (
                reference
                if isinstance(reference, Image.Image)
                else open_image(reference, what=f"instance {instance.id}: image")
            )
            fed = load_image(reference, instance.id, side)
            if fed.size != original.size:
                factor = max(original.size[0] / fed.size[0], original.size[1] / fed.size[1])
                changes.append(
                    f"image {position + 1} {_size(original.size)} -> {_size(fed.size)} "
                    f"(shrunk {factor:.3g}x before the processor)"
                )
        resized = adapter.options.image_size
        note = (
            f"; every image then resized to {resized}x{resized} (the image_size option)"
            if resized is not None
            else ""
        )
        if not changes:
            return PASS, "no image file was shrunk before the processor" + note, ""
        _, fed_scores, _ = self.single(0)
        original_batch = adapter.prepare_batch([instance], original_images=True)
        original_scores, _ = adapter.run_batch(original_batch, attention=False)
        worst = max_difference(fed_scores[0], original_scores[0])
        figure = (
            f"{'; '.join(changes)}{note}; scores on the original files differ by max |diff| "
            f"{worst:.2g}, tolerance {self.score_tolerance:g}"
        )
        cause = (
            "posdebias shrank large image files before the processor and the model answers "
            "differently on the originals: resize the files yourself to the processor's size "
            "so that both agree"
        )
        return _verdict(worst <= self.score_tolerance, figure, cause)

    def _embeddings(self, batch: PreparedBatch) -> tuple[torch.Tensor, list[ImageSpan]]:
        """[T, D] float64 input embeddings of a one-row batch (image features merged in) and
        the spans over them; for a model that reads its images through cross-attention, the
        vision encoder's tokens in the order of the cross-attention keys, and their spans."""
        import torch

        with torch.inference_mode():
            output = self.adapter.model_forward(
                **batch.inputs, position_ids=batch.position_ids, output_hidden_states=True
            )
        cross = self.adapter.cross_attention_spans(batch)
        if cross is None:
            return output.hidden_states[0][0].double().cpu(), list(batch.spans[0])
        encoder = output.image_outputs.last_hidden_state  # [B, images, tiles, patches, D]
        tokens = encoder.reshape(encoder.shape[0], -1, encoder.shape[-1])[0].double().cpu()
        owned = cross.matrix[0].bool()
        spans = [ImageSpan.from_positions(torch.nonzero(owned[:, k])[:, 0].tolist())
                 for k in range(owned.shape[1])]  # fmt: skip
        return tokens, spans


def _verdict(passed: bool, figure: str, cause: str) -> tuple[str, str, str]:
    """A measured row's result: PASS with no cause, or FAIL with ``cause``."""
    return (PASS, figure, "") if passed else (FAIL, figure, cause)


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _trie_problem(plan: Any) -> str | None:
    """Why the label plan is inconsistent, or None."""
    paths = list(plan.paths)
    if len(set(paths)) != len(paths):
        return "two labels have the same token path"
    for path in paths:
        for other in paths:
            if other != path and other[: len(path)] == path:
                return f"label path {list(path)} is a prefix of {list(other)} (no end token)"
        for depth in range(len(path)):
            if path[depth] not in plan.options.get(path[:depth], ()):
                return f"the trie has no edge for token {path[depth]} after {list(path[:depth])}"
    needed = {prefix for prefix, options in plan.options.items() if prefix and len(options) > 1}
    if set(plan.steps) != needed:
        return "the decoding steps are not the prefixes with two or more continuations"
    return None
