"""What one forward pass yields (:class:`Observation`) and what a calibrator returns
(:class:`Prediction`).

Both hold numpy arrays and validate on construction, so a bad adapter fails where it is wrong,
not three stages later inside a calibrator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from posdebias.core.instance import rotation_order
from posdebias.core.layers import LayerSet
from posdebias.errors import ObservationError

LOGSUMEXP_TOLERANCE = 1e-4


def _as_float_array(name: str, value: Any, ndim: int) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ObservationError(f"{name} must be numeric, got {type(value).__name__}") from exc
    if array.ndim != ndim:
        raise ObservationError(f"{name} must have {ndim} dimension(s), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ObservationError(f"{name} contains NaN or infinite values: {array.tolist()}")
    array.setflags(write=False)
    return array


def logsumexp(values: np.ndarray, axis: int = -1, *, keepdims: bool = False) -> np.ndarray:
    """log(sum(exp(values))) along ``axis``, computed around the maximum so that values far
    below zero (a label 800 nats below the best) neither underflow to log(0) nor give NaN.

    The one stable log-sum-exp of the package: log-softmax and log-mean-exp are built on it.
    """
    values = np.asarray(values, dtype=np.float64)
    peak = np.max(values, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)  # all -inf: the sum is 0, its log -inf
    with np.errstate(divide="ignore"):
        total = peak + np.log(np.sum(np.exp(values - peak), axis=axis, keepdims=True))
    return total if keepdims else np.squeeze(total, axis=axis)


def log_mean_exp(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """log(mean(exp(values))) along ``axis``: averaging probabilities given as logs."""
    values = np.asarray(values, dtype=np.float64)
    return logsumexp(values, axis=axis) - np.log(values.shape[axis])


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis."""
    return scores - logsumexp(scores, axis=-1, keepdims=True)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis."""
    return np.exp(log_softmax(scores))


@dataclass(frozen=True, eq=False)
class Observation:
    """One candidate order of one instance, as seen by the model in one forward pass.

    Attributes:
        label_logprobs: [N] restricted log-probabilities s_j = log P(c_j | x) of the N labels
            (logsumexp = 0; docs/method.md, "Observations").
        attention: [L, N] attention mass a^(l)_k of the last prompt token on image k's tokens,
            one row per softmax-attention layer read (head mean), or None when the adapter
            cannot give it.
        target: 0-based position of the true image in THIS order, or None at inference.
        layers: the model layers (indices and kinds) of the attention rows; None with attention
            means a dense model, rows = layers 0..L-1, all global.
        span_lengths: [N] number of prompt tokens of each candidate's span (what each
            attention mass is summed over), or None where the adapter does not say; lets layer
            selection compare candidates of different lengths per token.
        tie_logprob: log P(tie | x) of a pairwise judge's tie label in the distribution
            restricted to the N answer labels and the tie label (``label_logprobs`` are then
            the answers' share, renormalised over the N); None without a tie label
            (docs/evaluation.md, "Tie label").
        instance_id: the instance this order shows, where the caller knows it: the orders of
            one instance share it, so the layer choice counts instances, not orders, as
            independent evidence (docs/method.md, "Layer choice from calibration evidence").
    """

    label_logprobs: np.ndarray
    attention: np.ndarray | None = None
    target: int | None = None
    layers: LayerSet | None = None
    span_lengths: np.ndarray | None = None
    tie_logprob: float | None = None
    instance_id: str | None = None
    _n: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        scores = _as_float_array("label_logprobs", self.label_logprobs, 1)
        n = scores.shape[0]
        if n < 2:
            raise ObservationError(f"label_logprobs needs at least 2 labels, got {n}")
        total = float(np.logaddexp.reduce(scores))
        if abs(total) > LOGSUMEXP_TOLERANCE:
            raise ObservationError(
                f"label_logprobs must be normalised log-probabilities (logsumexp 0), got "
                f"logsumexp {total:.6g}; apply a log-softmax over the N labels"
            )
        object.__setattr__(self, "label_logprobs", scores)
        object.__setattr__(self, "_n", n)
        if self.attention is not None:
            attention = _as_float_array("attention", self.attention, 2)
            if attention.shape[1] != n or attention.shape[0] < 1:
                raise ObservationError(
                    f"attention must have shape [layers, {n}] to match {n} labels, "
                    f"got {attention.shape}"
                )
            if np.any(attention < 0):
                raise ObservationError("attention masses must be non-negative")
            object.__setattr__(self, "attention", attention)
            layers = self.layers if self.layers is not None else LayerSet.dense(attention.shape[0])
            if not isinstance(layers, LayerSet):
                raise ObservationError(f"layers must be a LayerSet, got {type(layers).__name__}")
            if len(layers) != attention.shape[0]:
                raise ObservationError(
                    f"attention has {attention.shape[0]} rows but its layers are "
                    f"{layers.describe()}: one row per layer read"
                )
            object.__setattr__(self, "layers", layers)
        elif self.layers is not None:
            raise ObservationError("layers were given without attention rows")
        if self.instance_id is not None and not isinstance(self.instance_id, str):
            raise ObservationError(
                f"instance_id must be a string, got {type(self.instance_id).__name__} "
                f"{repr(self.instance_id)[:60]}"
            )
        if self.span_lengths is not None:
            lengths = _as_float_array("span_lengths", self.span_lengths, 1)
            if lengths.shape != (n,) or np.any(lengths < 1) or np.any(lengths != np.round(lengths)):
                raise ObservationError(
                    f"span_lengths must be {n} whole token counts of at least 1, got "
                    f"{lengths.tolist()[:12]}"
                )
            object.__setattr__(self, "span_lengths", lengths.astype(np.int64))
        if self.target is not None:
            if isinstance(self.target, bool) or not isinstance(self.target, (int, np.integer)):
                raise ObservationError(f"target must be an int position, got {self.target!r}")
            if not 0 <= int(self.target) < n:
                raise ObservationError(f"target {self.target} is out of range for N={n}")
            object.__setattr__(self, "target", int(self.target))
        if self.tie_logprob is not None:
            tie = float(_as_float_array("tie_logprob", [self.tie_logprob], 1)[0])
            if tie > LOGSUMEXP_TOLERANCE:
                raise ObservationError(f"tie_logprob must be a log-probability (<= 0), got {tie}")
            object.__setattr__(self, "tie_logprob", min(tie, 0.0))

    @property
    def n(self) -> int:
        """Number of candidates N."""
        return self._n

    @property
    def scored_logprobs(self) -> np.ndarray:
        """The label scores as the adapter read them: ``label_logprobs`` and, with a tie label,
        the tie's last, restricted over all N + 1 labels (what the two were split from)."""
        if self.tie_logprob is None:
            return self.label_logprobs
        with np.errstate(divide="ignore"):
            answers = self.label_logprobs + np.log1p(-np.exp(self.tie_logprob))
        return np.append(answers, self.tie_logprob)

    @property
    def num_layers(self) -> int | None:
        """Number of attention rows (layers read) in ``attention`` (None without attention)."""
        return None if self.attention is None else int(self.attention.shape[0])

    @property
    def attention_matrix(self) -> np.ndarray:
        """``attention`` for code that needs it: an ObservationError when the adapter gave none."""
        if self.attention is None:
            raise ObservationError(
                "the observation has no attention (the adapter cannot capture it); use a "
                "calibrator that needs only label scores (vanilla, pride, permutation_average)"
            )
        return self.attention

    def rotated(self, shift: int) -> Observation:
        """The observation relabelled so that new position i is old position (i + shift) % N.

        Matches :meth:`Instance.rotated`: useful for symmetry tests and for the
        synthetic model; a real model must be run again on the rotated instance.
        """
        index = rotation_order(self.n, shift)
        return replace(
            self,
            label_logprobs=self.label_logprobs[index],
            attention=None if self.attention is None else self.attention[:, index],
            target=None if self.target is None else (self.target - shift) % self.n,
            span_lengths=None if self.span_lengths is None else self.span_lengths[index],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (floats at full precision) for run logs and caches; the layer set is
        written unless it is the dense default (so dense records read the same as before)."""
        record: dict[str, Any] = {
            "label_logprobs": self.label_logprobs.tolist(),
            "attention": None if self.attention is None else self.attention.tolist(),
            "target": self.target,
        }
        if self.layers is not None and not self.layers.is_dense:
            record.update(self.layers.to_dict())
        if self.span_lengths is not None:
            record["span_lengths"] = self.span_lengths.tolist()
        if self.tie_logprob is not None:
            record["tie_logprob"] = self.tie_logprob
        if self.instance_id is not None:
            record["instance_id"] = self.instance_id
        return record

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Observation:
        try:
            attention = payload.get("attention")
            layers = None
            if payload.get("layers") is not None or payload.get("layer_kinds") is not None:
                rows = len(attention) if isinstance(attention, list) else 0
                layers = LayerSet.from_lists(
                    payload.get("layers"), payload.get("layer_kinds"), rows
                )
            return cls(
                label_logprobs=payload["label_logprobs"],
                attention=attention,
                target=payload.get("target"),
                layers=layers,
                span_lengths=payload.get("span_lengths"),
                tie_logprob=payload.get("tie_logprob"),
                instance_id=payload.get("instance_id"),
            )
        except KeyError as exc:
            raise ObservationError(f"observation record misses field {exc.args[0]!r}") from exc


def record_fields(kind: str, payload: Any, known: set[str], required: set[str]) -> dict[str, Any]:
    """The fields of a record read back from JSON: a mapping with every ``required`` key and
    none outside ``known`` (an ObservationError naming what is wrong)."""
    if not isinstance(payload, dict):
        raise ObservationError(
            f"a {kind} record must be a JSON object, got {type(payload).__name__}"
        )
    missing = sorted(required - set(payload))
    if missing:
        raise ObservationError(f"{kind} record misses field(s) {missing}")
    unknown = sorted(str(key) for key in set(payload) - known)
    if unknown:
        raise ObservationError(
            f"{kind} record has unknown field(s) {unknown}; known: {sorted(known)}"
        )
    return dict(payload)


@dataclass(frozen=True, eq=False)
class Evidence:
    """Why a calibrator chose what it chose, per position of the observation's order.

    Every field is an [N] array, or None where the calibrator does not use that quantity.

    Attributes:
        label_probabilities: the model's own (uncalibrated) label probabilities P(c_j | x).
        attention_readout: attention of the selected layers, normalised to sum 1 (raw: no prior).
        layers: the language-model layers the attention was read from (L*, ascending).
        posterior: the visual posterior pi (purified attention; docs/method.md, Inference step 3).
        expected_bias: b_j(x), the bias expected given pi, which was subtracted from the label
            log-probabilities (docs/method.md, Inference step 4).
    """

    label_probabilities: np.ndarray | None = None
    attention_readout: np.ndarray | None = None
    layers: tuple[int, ...] | None = None
    posterior: np.ndarray | None = None
    expected_bias: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("label_probabilities", "attention_readout", "posterior", "expected_bias"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _as_float_array(name, value, 1))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))

    def merged(self, other: Evidence) -> Evidence:
        """This evidence with the fields it lacks taken from ``other``."""
        return Evidence(
            **{
                name: getattr(self, name)
                if getattr(self, name) is not None
                else getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (arrays as lists of floats, layers as a list, absent fields as
        None); :meth:`from_dict` reads it back."""
        return {
            name: (
                value.tolist()
                if isinstance(value, np.ndarray)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
            for name, value in ((name, getattr(self, name)) for name in self.__dataclass_fields__)
        }

    @classmethod
    def from_dict(cls, payload: Any) -> Evidence:
        """The evidence :meth:`to_dict` wrote (absent fields are None)."""
        fields = record_fields("evidence", payload, set(cls.__dataclass_fields__), set())
        return cls(**fields)


@dataclass(frozen=True, eq=False)
class Prediction:
    """A calibrator's answer for one observation: calibrated log-scores and the chosen position.

    ``choice`` is the argmax of ``scores`` unless a calibrator sets it; an exact tie for the
    best score is left to :func:`tie_broken` (``tied`` says so), which the runner and the API
    apply with the candidates' identities; alone, the first tied position stands.
    ``probabilities`` is the softmax of ``scores``; ``ranking`` lists the positions best first.
    ``evidence`` is filled when asked for (``Calibrator.predict(..., explain=True)``).
    """

    scores: np.ndarray
    choice: int = -1
    evidence: Evidence | None = None
    #: whether the choice is the argmax of the scores (the calibrator set none)
    by_scores: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        scores = _as_float_array("scores", self.scores, 1)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "by_scores", self.choice == -1)
        choice = int(np.argmax(scores)) if self.choice == -1 else int(self.choice)
        if not 0 <= choice < scores.shape[0]:
            raise ObservationError(f"choice {choice} is out of range for N={scores.shape[0]}")
        object.__setattr__(self, "choice", choice)

    @property
    def probabilities(self) -> np.ndarray:
        return softmax(self.scores)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of plain Python types: ``scores``, ``choice``, ``evidence`` (None
        unless asked for) and, for readers, ``probabilities`` and ``ranking`` (derived:
        :meth:`from_dict` recomputes them)."""
        return {
            "scores": self.scores.tolist(),
            "choice": self.choice,
            "probabilities": self.probabilities.tolist(),
            "ranking": self.ranking,
            "evidence": None if self.evidence is None else self.evidence.to_dict(),
        }

    @classmethod
    def from_dict(cls, payload: Any) -> Prediction:
        """The prediction :meth:`to_dict` wrote."""
        fields = record_fields(
            "prediction",
            payload,
            {"scores", "choice", "evidence", "probabilities", "ranking"},
            {"scores", "choice"},
        )
        evidence = fields.get("evidence")
        if not isinstance(fields["choice"], int) or isinstance(fields["choice"], bool):
            raise ObservationError(f"prediction choice must be an int, got {fields['choice']!r}")
        return cls(
            scores=fields["scores"],
            choice=fields["choice"],
            evidence=None if evidence is None else Evidence.from_dict(evidence),
        )

    @property
    def ranking(self) -> list[int]:
        """Positions from best to worst: ``choice`` first, then by score (ties: lower position)."""
        rest = [int(k) for k in np.argsort(-self.scores, kind="stable") if k != self.choice]
        return [self.choice, *rest]

    @property
    def tied(self) -> bool:
        """Whether the choice is the argmax of scores that several positions share exactly."""
        return self.by_scores and int(np.sum(self.scores == self.scores[self.choice])) > 1


def tie_label_wins(tie_probability: float, probabilities: np.ndarray) -> bool:
    """Whether a pairwise judge's verdict in one order is its tie label (docs/evaluation.md,
    "Tie label"): the three-way distribution keeps the model's tie mass p_tie and splits the
    rest as the calibrator's answer probabilities q say, (p_tie, (1 - p_tie) q_1,
    (1 - p_tie) q_2); the tie wins when its share exceeds each answer's,
    p_tie > (1 - p_tie) max_j q_j. For the uncalibrated label probabilities that is the
    model's own three-way argmax; a calibrator moves mass between the two answers (their
    positions carry the bias), never onto or off the tie label, which no position holds."""
    return tie_probability > (1.0 - tie_probability) * float(np.max(probabilities))


def tie_key(candidate_id: str) -> bytes:
    """The rank of a candidate among exactly tied ones (smallest first): a digest of its
    identity, fixed whatever position it is shown at."""
    return hashlib.sha256(candidate_id.encode()).digest()


def tie_broken(prediction: Prediction, candidate_ids: Sequence[str]) -> Prediction:
    """``prediction`` with an exact tie for the best score broken by the candidates'
    identities (:func:`tie_key`), not their positions: the same candidate wins the tie in
    every order, so a tie never favours position 1 (as ``argmax`` would). Choices a calibrator
    made itself, and untied ones, are kept."""
    if not prediction.tied:
        return prediction
    best = prediction.scores[prediction.choice]
    tied = [int(k) for k in np.flatnonzero(prediction.scores == best)]
    choice = min(tied, key=lambda k: tie_key(candidate_ids[k]))
    return Prediction(scores=prediction.scores, choice=choice, evidence=prediction.evidence)
