"""label_free: the paper's correction, calibrated from instances WITHOUT known targets.

The labelled fit needs to know where the truth is in each of the M x N calibration observations.
Without labels, the cyclic structure of the calibration set gives a handle (docs/method.md,
"Calibration without labels"): in the N rotations of one instance the unknown true image stays
the same while its position moves, so each instance has ONE latent variable, which image is the
truth. Two pieces of evidence speak about it:

* attention: the purified-attention posterior pi of every rotation, mapped back to images and
  multiplied over the N rotations. Each image visits every position once, so a positional
  factor of the attention cancels from this product (a strong sink inside a softmax need not);
* label scores: how well the rotation's label log-probabilities fit the current conditional
  profile Lobs[i, :] of the position i the truth would occupy there (a Gaussian in log space,
  shared variance), as the paper observes that profiles within a truth position are nearly
  identical.

EM: start from the attention evidence alone, estimate Lobs from the soft targets (M-step), weigh
attention and score fit together for new soft targets (E-step), and repeat until they agree.
Label scores alone cannot place the rows (shifting every latent image by the same amount and the
rows of Lobs with it explains the scores equally well); the attention anchors them. Where the
attention does not consistently point at the same image across rotations, the fit says so
(``diagnostics``) and falls back to the static logit prior, which needs no targets, instead of
fitting a conditional profile to noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from posdebias._markers import register_hook
from posdebias.calibrators.attention_guided import AttentionGuided, AttentionGuidedOptions
from posdebias.calibrators.options import read_masses
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.stages import EPSILON, BiasProfiler
from posdebias.core.state import CalibrationState
from posdebias.errors import InputError

MIN_VARIANCE = 1e-12
"""Floor of the score-noise variance (noise-free observations make it zero)."""


class LabelFreeOptions(AttentionGuidedOptions):
    iterations: int = Field(default=100, ge=0, le=100_000, description="most EM iterations")
    tolerance: float = Field(
        default=1e-6, gt=0, le=1, description="stop when no soft target moves by more than this"
    )
    use_scores: bool = Field(
        default=True,
        description="E-step also weighs how well the label scores fit the profile "
        "(False: soft targets from attention alone, no iteration)",
    )
    min_consistency: float = Field(
        default=0.25,
        ge=-1,
        le=1,
        description="chance-corrected agreement of the attention across the rotations of an "
        "instance below which attention counts as uninformative",
    )
    check_shift: bool = Field(
        default=True,
        description="refuse a fit whose truths are consistently a fixed number of images off "
        "the images the label scores favour over all rotations (shifted attention)",
    )


def rotation_positions(n: int) -> np.ndarray:
    """P[r, t]: the position of base image t in rotation r (rotation r shows base position
    (i + r) % N at position i)."""
    return (np.arange(n)[None, :] - np.arange(n)[:, None]) % n


def attention_consistency(attention: np.ndarray) -> float:
    """Chance-corrected agreement of the attention across rotations, in [-1/(N-1), 1].

    ``attention``: [M, N, N] log-attention of instance m, rotation r, position k. The mean of
    each position over all observations is removed first (it is positional, not content: the
    truth visits every position equally often). Then, for each instance, the image each
    rotation points at (argmax); the share of rotation pairs of an instance that point at the
    same image, averaged, against 1/N: 1 when every rotation points at one image, about 0 for
    attention that points at images at random, negative for attention that points at a
    position whatever it shows.
    """
    m, n, _ = attention.shape
    centred = attention - attention.mean(axis=(0, 1))
    images = (np.argmax(centred, axis=2) + np.arange(n)[None, :]) % n  # [M, r]
    same = images[:, :, None] == images[:, None, :]
    agreement = float((same.sum(axis=(1, 2)) - n).sum() / (m * n * (n - 1)))
    return (agreement - 1.0 / n) / (1.0 - 1.0 / n)


def score_offsets(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Share of instances at each offset d between the image the fit calls the truth and the
    image the label scores favour (``[N]``, sums to 1; d = 0: they agree).

    The scores' favourite of instance m is the image with the largest sum over its N rotations
    of s_{m,r}[P(r, t)] - p_prior[P(r, t)] (cyclic permutation averaging of PriDe's scores):
    every image visits every position once, so the static prior and any conditional bias that
    treats all images alike cancel. Attention that consistently points d images off makes the
    fit's truths d images off the scores' favourites on most instances.
    """
    m, n, _ = scores.shape
    positions = rotation_positions(n)
    prior = scores.reshape(m * n, n).mean(axis=0)
    centred = scores - prior
    by_image = centred[:, np.arange(n)[:, None], positions].sum(axis=1)  # [M, t]
    favourite = by_image.argmax(axis=1)
    fitted = targets.argmax(axis=1)
    offsets = (fitted - favourite) % n
    return np.bincount(offsets, minlength=n) / m


def expectation_maximisation(
    scores: np.ndarray,
    attention_evidence: np.ndarray,
    *,
    iterations: int,
    tolerance: float,
    use_scores: bool,
    average: str = "log",
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Soft targets and the conditional profile from unlabelled, symmetrised observations.

    Args:
        scores: [M, N, N] label log-probabilities, instance m, rotation r, label j.
        attention_evidence: [M, N] log-evidence that base image t of instance m is the truth.

    Returns:
        (Lobs [N, N], soft targets q [M, N] over base images, facts about the run).
    """
    m, n, _ = scores.shape
    positions = rotation_positions(n)  # [r, t] -> position
    # image_at[r, i]: the base image at position i of rotation r
    image_at = (np.arange(n)[None, :] + np.arange(n)[:, None]) % n

    def m_step(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Lobs from the soft targets, fit[m, r, i] (the squared distance of rotation r's
        scores to its row i) and the variance of the scores around their rows."""
        weights = targets[:, image_at]  # [M, r, i]: probability that position i holds the truth
        total = weights.sum(axis=(0, 1))  # = M for every row
        if average == "log":
            profile = np.einsum("mri,mrj->ij", weights, scores) / total[:, None]
        else:
            mean = np.einsum("mri,mrj->ij", weights, np.exp(scores)) / total[:, None]
            profile = np.log(np.maximum(mean, EPSILON))
        fit = ((scores[:, :, None, :] - profile[None, None, :, :]) ** 2).sum(axis=3)
        variance = float((weights * fit).sum() / (m * n * n))
        return profile, fit, max(variance, MIN_VARIANCE)

    targets = np.exp(log_softmax(attention_evidence))
    profile, fit, variance = m_step(targets)
    done, converged = 0, not use_scores
    while use_scores and done < iterations:
        # E-step: the attention evidence, less how badly each image as truth fits the scores
        misfit = fit[:, np.arange(n)[:, None], positions].sum(axis=1) / (2 * variance)
        updated = np.exp(log_softmax(attention_evidence - misfit))
        change = float(np.max(np.abs(updated - targets)))
        targets = updated
        profile, fit, variance = m_step(targets)
        done += 1
        if change < tolerance:
            converged = True
            break
    return (
        profile,
        targets,
        {"iterations": done, "converged": converged, "score_noise": float(np.sqrt(variance))},
    )


class LabelFree(AttentionGuided):
    name = "label_free"
    Options = LabelFreeOptions
    options: LabelFreeOptions
    needs_targets = False
    summary = "attention_guided calibrated without targets (EM over the cyclic rotations)"

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        return ("attention_prior", "bias_matrix")  # no layer choice: none without targets

    def _fit(self, observations: Sequence[Observation]) -> dict[str, Any]:
        """Fit on the symmetrised calibration set in the order of
        :func:`posdebias.symmetrized_calibration_set`: instance after instance, each in its N
        rotations r = 0..N-1 (how ``Debiaser.calibrate`` and the runner observe it)."""
        n = observations[0].n
        if len(observations) % n:
            raise InputError(
                f"calibrator {self.name!r} needs the N={n} cyclic rotations of every "
                f"calibration instance, got {len(observations)} observations"
            )
        m = len(observations) // n
        # the candidates' attention as predict reads it: without targets there is no evidence
        # to choose a reading by, so the option's first (the per-token mean by default)
        masses = read_masses(observations, self.options.reading())
        prior = masses.mean(axis=0)
        corrector = self.options.corrector(self.options.mixture)
        selector = self.options.selector()
        # as predict reads it (attention_prior: false divides by 1, the raw attention)
        divisor = prior if self.options.attention_prior else np.ones_like(prior)
        purified = np.stack(
            [
                corrector.purified_log_attention(view, divisor, selector.select(view, obs.layers))
                for view, obs in zip(masses, observations, strict=True)
            ]
        ).reshape(m, n, n)
        log_posteriors = log_softmax(corrector.tau * purified)  # [M, r, position]
        consistency = attention_consistency(purified)
        scores = np.stack([obs.label_logprobs for obs in observations]).reshape(m, n, n)
        diagnostics: dict[str, Any] = {
            "attention_consistency": consistency,
            "min_consistency": self.options.min_consistency,
            "instances": m,
        }

        def fitted(profile: np.ndarray, gamma: float, **found: Any) -> dict[str, Any]:
            """The state fields of a profile, with what the fit ``found`` in its diagnostics."""
            diagnostics.update(found)
            return {
                "observed_profile": profile.tolist(),
                "gamma": gamma,
                "bias_matrix": BiasProfiler.bias_matrix(profile, gamma).tolist(),
                "attention_prior": prior.tolist(),
                "diagnostics": diagnostics,
            }

        def static_prior(warning: str, **found: Any) -> dict[str, Any]:
            """No conditional profile: every row is the static logit prior (PriDe), and why."""
            profile = np.tile(scores.reshape(m * n, n).mean(axis=0), (n, 1))
            return fitted(profile, 0.0, attention_informative=False, **found, warning=warning)

        if consistency < self.options.min_consistency:
            return static_prior(
                f"attention is uninformative on these {m} calibration instances (agreement "
                f"across rotations {consistency:.2f}, chance-corrected; needed "
                f">= {self.options.min_consistency:g}): no conditional bias profile was "
                "fitted, the correction falls back to the static logit prior (PriDe). "
                "Calibrate with labelled instances (attention_guided) instead."
            )
        positions = rotation_positions(n)
        evidence = log_posteriors[:, np.arange(n)[:, None], positions].sum(axis=1)  # [M, t]
        profile, targets, facts = expectation_maximisation(
            scores,
            evidence,
            iterations=self.options.iterations,
            tolerance=self.options.tolerance,
            use_scores=self.options.use_scores,
            average=self.options.average,
        )
        shares = score_offsets(scores, targets)
        shift = int(np.argmax(shares))
        diagnostics.update(
            score_agreement=float(shares[0]),
            score_agreement_by_offset=shares.tolist(),
        )
        shifted = shift != 0 and shares[shift] > shares[0] and shares[shift] >= 0.5
        if self.options.check_shift and shifted:
            return static_prior(
                f"attention looks shifted: on {100 * shares[shift]:.0f}% of these {m} "
                f"calibration instances the candidate the attention singles out is {shift} "
                f"position(s) after the one the label scores favour over all rotations (they "
                f"agree on {100 * shares[0]:.0f}%); a bias profile fitted to it would be "
                "confidently wrong, so the correction falls back to the static logit prior "
                "(PriDe). Calibrate with labelled instances (attention_guided) instead.",
                attention_shift=shift,
                **facts,
            )
        return fitted(
            profile,
            BiasProfiler.visual_gain(profile),
            attention_informative=True,
            attention_shift=shift if shifted else 0,
            **facts,
            soft_targets=targets.tolist(),
        )


posdebias_register_calibrators = register_hook(LabelFree)
