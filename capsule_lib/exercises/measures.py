"""The exercises of the comparison chapters: votes, the scaling slope, FGSM, DARCCC's distance, coupling entropy
and the two-standard-error rule (see :mod:`.catalogue`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attacks import fgsm as _fgsm
from ..attacks import reconstruction_distance as _reconstruction_distance
from ..cost import loglog_slope as _loglog_slope
from ..critique import coupling_stats
from ..routing.dynamic import capsule_votes as _capsule_votes
from ..routing_critique import Measured
from ..routing_critique import versus as _versus
from ._inputs import F64, _cases, _labels, _rand, _randn
from .checker import Case, Exercise, Mistake

# ------------------------------------------------------------------------------------------ the comparison
CAPSULE_VOTES = Exercise(
    "capsule_votes",
    "routing_compared",
    "capsule_votes(u, W) -> votes     u [B, I, d_in], W [I, J, d_in, d_out] -> votes [B, I, J, d_out]",
    "Every child's vote for every parent through its own matrix, u_hat_j|i = W_ij^T u_i.",
    lambda: _cases(
        _capsule_votes,
        [
            ("random [2, 6, 4] through [6, 3, 4, 4]", (_randn(2, 6, 4, seed=6), _randn(6, 3, 4, 4, seed=7))),
            ("random [2, 6, 4] through [6, 3, 4, 5]", (_randn(2, 6, 4), _randn(6, 3, 4, 5, seed=1))),
            ("a batch of one [1, 3, 4] through [3, 2, 4, 4]", (_randn(1, 3, 4, seed=2), _randn(3, 2, 4, 4, seed=3))),
            (
                "float64 [2, 5, 3] through [5, 4, 3, 3]",
                (_randn(2, 5, 3, seed=4, dtype=F64), _randn(5, 4, 3, 3, seed=5, dtype=F64)),
            ),
        ],
        wrt=(0, 1),
    ),
    (
        Mistake(
            "transposed_matrices",
            "you multiplied by W_ij instead of W_ij^T: the vote is sum_d u_i[d] W_ij[d, e]",
            lambda u, W: torch.einsum("bie,ijde->bijd", u, W),
        ),
        Mistake(
            "summed_over_children",
            "you summed over the children: there is one vote per (child, parent) pair, [B, I, J, d_out]",
            lambda u, W: torch.einsum("bid,ijde->bje", u, W),
        ),
        Mistake(
            "one_matrix_per_parent",
            "you used one matrix per parent for every child (W[0]); each (child, parent) pair has its own W_ij",
            lambda u, W: torch.einsum("bid,jde->bije", u, W[0]),
        ),
    ),
)


def _slope_variant(x, y, how):
    if how == "linear":
        mx, my = sum(x) / len(x), sum(y) / len(y)
        return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    if how == "endpoints":
        return (math.log(y[-1]) - math.log(y[0])) / (math.log(x[-1]) - math.log(x[0]))
    return 1 / _loglog_slope(x, y)


LOGLOG_SLOPE = Exercise(
    "loglog_slope",
    "routing_compared",
    "loglog_slope(x, y) -> slope     two lists of positive numbers -> a float",
    "The least-squares slope of log y against log x (1: cost grows linearly with x, 2: quadratically).",
    lambda: _cases(
        _loglog_slope,
        [
            ("y = 3 x^1.5 at x = 1, 2, 4, 8", ([1.0, 2.0, 4.0, 8.0], [3.0 * v**1.5 for v in (1.0, 2.0, 4.0, 8.0)])),
            ("noisy timings at 64 ... 4096 inputs", ([64.0, 256.0, 1024.0, 4096.0], [1.1, 3.9, 17.0, 63.0])),
            ("a middle point off the line", ([1.0, 10.0, 100.0], [1.0, 30.0, 100.0])),
        ],
        grad="none",
    ),
    (
        Mistake(
            "no_logs",
            "that is the slope of y against x: take logs of both first",
            lambda x, y: _slope_variant(x, y, "linear"),
        ),  # fmt: skip
        Mistake(
            "endpoints_only",
            "you drew the line through the first and last points; fit all points by least squares",
            lambda x, y: _slope_variant(x, y, "endpoints"),
        ),
        Mistake(
            "axes_swapped",
            "you fitted log x against log y (the inverse slope)",
            lambda x, y: _slope_variant(x, y, "swapped"),
        ),  # fmt: skip
    ),
)


# ------------------------------------------------------------------------------------------- robustness
def _tiny_classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3)).eval()


def _fgsm_cases() -> list[Case]:
    model = _tiny_classifier()
    out = []
    for name, seed, n, eps in (("4 images [4, 1, 4, 4], eps 0.3", 0, 4, 0.3), ("a batch of one, eps 0.1", 1, 1, 0.1)):
        x, y = _rand(n, 1, 4, 4, seed=seed), _labels(n, 3, seed)
        out.append(Case(f"a small classifier, {name}", (model, x, y, eps), _fgsm(model, x, y, eps)))
    return out


def _fgsm_variant(model, x, y, eps, how):
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), x)
    step = -eps * g.sign() if how == "descend" else eps * g if how == "raw" else eps * g.sign()
    return (x + step).detach() if how == "noclamp" else (x + step).clamp(0, 1).detach()


FGSM = Exercise(
    "fgsm",
    "robustness",
    "fgsm(model, x, y, eps) -> x_adv     model(x) -> logits [B, K], x [B, C, H, W] in [0, 1], y [B] -> x_adv",
    "One step of size eps along the sign of the gradient of the cross-entropy of the true class, kept in [0, 1] "
    "(use torch.autograd.grad).",
    _fgsm_cases,
    (
        Mistake(
            "descends",
            "you stepped down the loss: an untargeted attack goes up the true class's loss, x + eps * sign(grad)",
            lambda m, x, y, e: _fgsm_variant(m, x, y, e, "descend"),
        ),  # fmt: skip
        Mistake(
            "no_sign",
            "FGSM steps by eps times the *sign* of the gradient (every pixel moves by eps)",
            lambda m, x, y, e: _fgsm_variant(m, x, y, e, "raw"),
        ),  # fmt: skip
        Mistake(
            "not_clamped",
            "pixels must stay in [0, 1]: clamp the adversarial image",
            lambda m, x, y, e: _fgsm_variant(m, x, y, e, "noclamp"),
        ),  # fmt: skip
    ),
)

RECONSTRUCTION_DISTANCE = Exercise(
    "reconstruction_distance",
    "robustness",
    "reconstruction_distance(x, recon) -> d     x, recon [B, C, H, W] -> d [B]",
    "DARCCC's detection statistic: the L2 distance between each image and its reconstruction.",
    lambda: _cases(
        _reconstruction_distance,
        [
            ("random images [4, 1, 6, 6]", (_rand(4, 1, 6, 6), _rand(4, 1, 6, 6, seed=1))),
            ("a batch of one [1, 2, 3, 3]", (_rand(1, 2, 3, 3, seed=2), _rand(1, 2, 3, 3, seed=3))),
            ("float64 [2, 1, 4, 4]", (_rand(2, 1, 4, 4, seed=4, dtype=F64), _rand(2, 1, 4, 4, seed=5, dtype=F64))),
        ],
    ),
    (
        Mistake(
            "squared",
            "you returned the squared distance; DARCCC thresholds the L2 distance itself",
            lambda x, r: ((x - r) ** 2).flatten(1).sum(1),
        ),  # fmt: skip
        Mistake(
            "mean_squared",
            "you returned the mean squared error per pixel; the statistic is the L2 distance ||x - recon||",
            lambda x, r: ((x - r) ** 2).flatten(1).mean(1),
        ),  # fmt: skip
        Mistake(
            "one_number",
            "you returned one number for the whole batch: one distance per image, [B]",
            lambda x, r: (x - r).norm(),
        ),  # fmt: skip
        Mistake("l1", "that is the L1 distance; use the L2 distance", lambda x, r: (x - r).abs().flatten(1).sum(1)),
    ),
)


# ---------------------------------------------------------------------------------------------- critique
def _entropy_reference(c: torch.Tensor) -> float:
    return coupling_stats(c).entropy


def _couplings(seed: int, shape=(4, 6, 5), dtype=torch.float32, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(_randn(*shape, seed=seed, scale=sharp, dtype=dtype), -1)


def _entropy_variant(c: torch.Tensor, how: str) -> float:
    J = c.shape[-1]
    if how == "nats":
        return float(-(c * c.clamp_min(1e-30).log()).sum(-1).mean())
    if how == "nan":
        return float((-(c * c.log()).sum(-1) / math.log(J)).mean())
    if how == "children":
        ct = c.transpose(1, 2)
        return float((-(ct * ct.clamp_min(1e-30).log()).sum(-1) / math.log(ct.shape[-1])).mean())
    return float((-(c * c.clamp_min(1e-30).log2()).sum(-1)).mean())


COUPLING_ENTROPY = Exercise(
    "coupling_entropy",
    "routing_critique",
    "coupling_entropy(c) -> float     c [N, I, J] (each child's couplings sum to 1 over the parents) -> a number",
    "The mean over images and children of the entropy of a child's couplings, divided by log J: 1 = uniform, 0 = all "
    "to one parent.",
    lambda: _cases(
        _entropy_reference,
        [
            ("random couplings [4, 6, 5]", (_couplings(0),)),
            ("one-hot couplings [3, 4, 3] (a parse tree)", (F.one_hot(_labels(12, 3, 1), 3).view(3, 4, 3).float(),)),
            ("uniform couplings [2, 3, 4]", (torch.full((2, 3, 4), 0.25),)),
            ("float64, 10 parents [2, 8, 10]", (_couplings(2, (2, 8, 10), F64),)),
        ],
        grad="none",
    ),
    (
        Mistake(
            "not_normalised",
            "divide each entropy by log J (the uniform couplings' entropy), so 1 = uniform",
            lambda c: _entropy_variant(c, "nats"),
        ),  # fmt: skip
        Mistake(
            "zero_log_zero",
            "0 * log 0 gives NaN: a coupling of exactly 0 contributes 0 (clamp before the log, or torch.xlogy)",
            lambda c: _entropy_variant(c, "nan"),
        ),
        Mistake(
            "over_children",
            "you took the entropy over the children (axis 1); a child's couplings are a distribution over the parents",
            lambda c: _entropy_variant(c, "children"),
        ),
        Mistake(
            "bits_not_normalised",
            "log2 gives bits, still not normalised: divide by log J (or log2 J)",
            lambda c: _entropy_variant(c, "bits"),
        ),  # fmt: skip
    ),
)


def _versus_reference(a_mean: float, a_se: float, b_mean: float, b_se: float) -> str:
    return _versus(Measured(a_mean, a_se, ()), Measured(b_mean, b_se, ()))


def _versus_variant(a_mean, a_se, b_mean, b_se, how):
    se = {"sum": a_se + b_se, "one": math.hypot(a_se, b_se) / 2, "a_only": a_se}[how]
    d = a_mean - b_mean
    return "higher" if d > 2 * se else "lower" if -d > 2 * se else "within noise"


VERSUS = Exercise(
    "versus",
    "routing_critique",
    "versus(a_mean, a_se, b_mean, b_se) -> str     'higher', 'lower' or 'within noise'",
    "The two-standard-error rule: a differs from b when the means differ by more than twice their standard errors "
    "added in quadrature.",
    lambda: _cases(
        _versus_reference,
        [
            ("a clear gain", (0.95, 0.005, 0.90, 0.005)),
            ("a clear loss", (0.80, 0.01, 0.90, 0.01)),
            ("0.035 apart, errors 0.01 and 0.01", (0.935, 0.01, 0.90, 0.01)),
            ("0.019 apart, errors 0.01 and 0.01", (0.919, 0.01, 0.90, 0.01)),
            ("0.015 apart, errors 0.001 and 0.02", (0.915, 0.001, 0.90, 0.02)),
            ("0.016 apart, errors 0.001 and 0.01", (0.916, 0.001, 0.90, 0.01)),
        ],
        grad="none",
    ),
    (
        Mistake(
            "errors_added",
            "you added the two standard errors; independent errors add in quadrature, sqrt(se_a^2 + se_b^2)",
            lambda *a: _versus_variant(*a, "sum"),
        ),  # fmt: skip
        Mistake(
            "one_standard_error",
            "the rule needs the difference beyond twice the combined standard error",
            lambda *a: _versus_variant(*a, "one"),
        ),  # fmt: skip
        Mistake(
            "one_error_only",
            "both measurements are uncertain: combine both standard errors",
            lambda *a: _versus_variant(*a, "a_only"),
        ),  # fmt: skip
    ),
)
