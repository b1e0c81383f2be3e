"""Every code exercise of the book, as data: :data:`EXERCISES` by name.

Each exercise's cases are inputs and what the library's tested reference returns for them (a function of
``functional``, ``losses``, ``routing``, ``layers``, ``data``, ``attacks``, ``cost``, ``critique``,
``routing_critique``; for the EM and Heinsen steps, the per-iteration trace of the library's routing). Each
:class:`~capsule_lib.exercises.checker.Mistake` is a wrong implementation that the seeds' code made (or that a reader
makes while following the formula), written here in the form the mistake takes, with the sentence that names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice
from ..attacks import fgsm as _fgsm
from ..attacks import reconstruction_distance as _reconstruction_distance
from ..cost import loglog_slope as _loglog_slope
from ..critique import coupling_stats
from ..data.generated import glyph_digits
from ..data.multimnist import make_multimnist
from ..data.transforms import shift_images
from ..functional import capsule_lengths as _capsule_lengths
from ..functional import squash, squash_efficient, squash_hinton
from ..layers.masking import mask_capsules
from ..layers.primary import PrimaryCapsules
from ..losses import margin_loss as _margin_loss
from ..routing.dynamic import capsule_votes as _capsule_votes
from ..routing.dynamic import dynamic_routing, dynamic_routing_reference
from ..routing.em import em_routing
from ..routing.heinsen_2019 import generative_matrix_routing
from ..routing.inverted import conv_windows as _conv_windows
from ..routing.inverted import inverted_attention_update
from ..routing.self_attention import self_attention_routing
from ..routing_critique import Measured
from ..routing_critique import versus as _versus
from .checker import Case, CheckResult, Exercise, ExerciseFailed, Mistake, run_exercise

__all__ = ["EXERCISES", "exercises_of", "check"]

F64 = torch.float64


def _randn(*shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)


def _rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def _cases(ref: Callable, specs: list[tuple], grad: str = "exact", wrt: tuple[int, ...] = (0,)) -> list[Case]:
    """Cases ``(name, args[, grad[, atol]])`` whose expected outputs are ``ref(*args)``."""
    out = []
    for name, args, *rest in specs:
        g = rest[0] if rest else grad
        atol = rest[1] if len(rest) > 1 else None
        out.append(Case(name, args, ref(*args), g, wrt, ref if g == "exact" else None, atol))
    return out


# ------------------------------------------------------------------------------------------- squash, lengths
def _squash_cases(ref: Callable) -> Callable[[], list[Case]]:
    return lambda: _cases(
        ref,
        [
            ("random capsules [4, 6, 8]", (_randn(4, 6, 8, scale=0.7),)),
            ("zero vectors [2, 3, 8]", (torch.zeros(2, 3, 8),), "finite"),
            ("very long vectors [2, 3, 8] (|s| about 1e4)", (_randn(2, 3, 8, seed=1, scale=3e3),), "finite"),
            ("a batch of one [1, 1, 16]", (_randn(1, 1, 16, seed=2),)),
            ("float64 [3, 5, 4]", (_randn(3, 5, 4, seed=3, dtype=F64),)),
        ],
    )


def _norm(s: torch.Tensor) -> torch.Tensor:
    return torch.sqrt((s**2).sum(-1, keepdim=True))


_SQUASH_AXIS = (
    "you squashed over axis -2 (across the capsules): squash each capsule over its own d values, the last axis"
)
_NO_EPS = (
    "NaN for a zero vector: s / |s| divides 0 by 0. Put a small epsilon inside the square root, "
    "|s| = sqrt(sum s^2 + eps) (the squash of gram-ai, acburigo and the official TensorFlow code has none)"
)
_EPS_OUTSIDE = (
    "NaN gradient at s = 0: the epsilon is added outside the square root, and sqrt's derivative at 0 is infinite; "
    "put it inside, sqrt(sum s^2 + eps) (Efficient-CapsNet's original squash protects only the value this way)"
)

SQUASH_HINTON = Exercise(
    "squash_hinton",
    "primer",
    "squash_hinton(s) -> v     s [..., d] -> v [..., d]",
    "Sabour et al.'s squash, v = |s|^2 / (1 + |s|^2) * s / |s|, finite (value and gradient) at s = 0.",
    _squash_cases(squash_hinton),
    (
        Mistake("no_epsilon", _NO_EPS, lambda s: squash(s, "hinton_no_eps")),
        Mistake(
            "epsilon_outside_root",
            _EPS_OUTSIDE,
            lambda s: _norm(s) ** 2 / (1 + _norm(s) ** 2) * s / (_norm(s) + 1e-8),
        ),
        Mistake(
            "linear_factor",
            "the length factor is |s| / (1 + |s|); squash_H's is |s|^2 / (1 + |s|^2) (short vectors "
            "shrink quadratically)",
            lambda s: _norm(s) / (1 + _norm(s)) * s / (_norm(s) + 1e-8),
        ),
        Mistake(
            "squash_efficient",
            "this is Efficient-CapsNet's squash_E, (1 - e^-|s|) s / |s|; squash_H is |s|^2 / (1 + |s|^2) s / |s|",
            squash_efficient,
        ),
        Mistake("wrong_axis", _SQUASH_AXIS, lambda s: squash_hinton(s, dim=-2)),
        Mistake(
            "unit_vectors",
            "you returned s / |s| (unit vectors): the length must be |s|^2 / (1 + |s|^2)",
            lambda s: s / (_norm(s) + 1e-8),
        ),
    ),
)

SQUASH_EFFICIENT = Exercise(
    "squash_efficient",
    "efficient_capsnet",
    "squash_efficient(s) -> v     s [..., d] -> v [..., d]",
    "Mazzia et al.'s squash, v = (1 - 1 / e^|s|) * s / |s|, finite (value and gradient) at s = 0.",
    _squash_cases(squash_efficient),
    (
        Mistake(
            "no_epsilon",
            _NO_EPS.replace("(the squash of gram-ai, acburigo and the official TensorFlow code has none)", ""),
            lambda s: (1 - torch.exp(-_norm(s))) * s / _norm(s),
        ),
        Mistake("epsilon_outside_root", _EPS_OUTSIDE, lambda s: (1 - torch.exp(-_norm(s))) * s / (_norm(s) + 1e-20)),
        Mistake(
            "squash_hinton",
            "this is CapsNet's squash_H, |s|^2 / (1 + |s|^2) s / |s|; squash_E is (1 - e^-|s|) s / |s|",
            squash_hinton,
        ),
        Mistake("wrong_axis", _SQUASH_AXIS, lambda s: squash_efficient(s, dim=-2)),
        Mistake(
            "exp_not_inverse",
            "the length factor is 1 - 1/e^|s| = 1 - e^-|s| (you used e^-|s|, which is 1 at s = 0)",
            lambda s: torch.exp(-_norm(s)) * s / torch.sqrt(_norm(s) ** 2 + 1e-8),
        ),
    ),
)

CAPSULE_LENGTHS = Exercise(
    "capsule_lengths",
    "primer",
    "capsule_lengths(v) -> lengths     v [..., n, d] -> [..., n]",
    "The length |v| of every capsule, with a finite gradient at a zero capsule.",
    lambda: _cases(
        _capsule_lengths,
        [
            ("random capsules [4, 10, 16]", (_randn(4, 10, 16, scale=0.3),)),
            ("zero capsules [2, 3, 8]", (torch.zeros(2, 3, 8),), "finite", 1e-3),
            ("a batch of one [1, 1, 4]", (_randn(1, 1, 4, seed=1),)),
            ("float64 [3, 5, 4]", (_randn(3, 5, 4, seed=2, dtype=F64),)),
        ],
    ),
    (
        Mistake(
            "sqrt_at_zero",
            "NaN gradient at a zero capsule: sqrt's derivative at 0 is infinite. Use a safe norm, "
            "sqrt(sum v^2 + eps) (capsule_lib.safe_norm)",
            lambda v: torch.sqrt((v**2).sum(-1)),
        ),
        Mistake("squared", "you returned the squared length sum v^2; take its square root", lambda v: (v**2).sum(-1)),
        Mistake(
            "wrong_axis",
            "you took the norm over the capsules (axis -2); a capsule's length is the norm of its d "
            "values (the last axis)",
            lambda v: _capsule_lengths(v, dim=-2),
        ),
        Mistake(
            "keepdim",
            "you kept the last axis (keepdim=True): return one length per capsule, [..., n]",
            lambda v: _capsule_lengths(v)[..., None],
        ),
    ),
)


# ---------------------------------------------------------------------------------------- dynamic routing
def _labels(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(seed))


def _margin(lengths, targets, m_pos=0.9, m_neg=0.1, lam=0.5, pos_lam=1.0, power=2, reduce="mean"):
    t = F.one_hot(targets.long(), lengths.shape[1]).to(lengths.dtype)
    per = (pos_lam * t * F.relu(m_pos - lengths) ** power + lam * (1 - t) * F.relu(lengths - m_neg) ** power).sum(1)
    return per.mean() if reduce == "mean" else per.sum()


MARGIN_LOSS = Exercise(
    "margin_loss",
    "dynamic_routing",
    "margin_loss(lengths, targets) -> loss     lengths [B, K], targets [B] (labels) -> a scalar",
    "Sabour et al.'s margin loss (m+ = 0.9, m- = 0.1, lambda = 0.5), summed over the classes, mean over the batch.",
    lambda: _cases(
        _margin_loss,
        [
            ("random lengths [8, 10]", (_rand(8, 10), _labels(8, 10, 0))),
            ("a batch of one [1, 10]", (_rand(1, 10, seed=1), _labels(1, 10, 1))),
            ("5 classes [6, 5]", (_rand(6, 5, seed=2), _labels(6, 5, 2))),
        ],
    ),
    (
        Mistake(
            "official_mean",
            "you averaged over the classes as well as the batch, with weights 0.5 and 0.25: the official TensorFlow "
            "code's reduction, the paper's loss / 2K, which makes the reconstruction term 2K times "
            "heavier; sum over the "
            "classes, mean over the batch",
            lambda x, y: _margin_loss(x, y, reduction="official"),
        ),
        Mistake(
            "mean_over_classes",
            "you averaged over the classes: sum the K terms (Eq. 4), then take the mean over the batch",
            lambda x, y: _margin(x, y) / x.shape[1],
        ),
        Mistake(
            "sum_over_batch",
            "you summed over the batch: take the mean over the batch",
            lambda x, y: _margin(x, y, reduce="sum"),
        ),
        Mistake(
            "lambda_on_present",
            "lambda = 0.5 down-weights the absent classes (T_k = 0), not the present one",
            lambda x, y: _margin(x, y, lam=1.0, pos_lam=0.5),
        ),
        Mistake(
            "no_square", "the two hinge terms are squared: max(0, m+ - |v_k|)^2", lambda x, y: _margin(x, y, power=1)
        ),
        Mistake(
            "softmax_lengths",
            "you applied the loss to softmax(lengths) (gram-ai's extra softmax, issue #6): the margin loss reads the "
            "capsule lengths themselves",
            lambda x, y: _margin(torch.softmax(x, 1), y),
        ),
        Mistake(
            "swapped_margins",
            "the margins are swapped: a present class is pushed above m+ = 0.9, an absent one below m- = 0.1",
            lambda x, y: _margin(x, y, m_pos=0.1, m_neg=0.9),
        ),
    ),
)


def _routing_no_max(votes: torch.Tensor, iterations: int = 3) -> torch.Tensor:
    """acburigo's loop: softmax written as exp / sum exp, without subtracting the max."""
    b = votes.new_zeros(votes.shape[:3])
    for t in range(iterations):
        c = torch.exp(b) / torch.exp(b).sum(2, keepdim=True)
        v = squash_hinton(torch.einsum("bij,bije->bje", c, votes))
        if t < iterations - 1:
            b = b + torch.einsum("bije,bje->bij", votes, v)
    return v


def _routing_agree_s(votes: torch.Tensor, iterations: int = 3) -> torch.Tensor:
    b = votes.new_zeros(votes.shape[:3])
    for t in range(iterations):
        s = torch.einsum("bij,bije->bje", torch.softmax(b, 2), votes)
        v = squash_hinton(s)
        if t < iterations - 1:
            b = b + torch.einsum("bije,bje->bij", votes, s)
    return v


DYNAMIC_ROUTING = Exercise(
    "dynamic_routing",
    "dynamic_routing",
    "dynamic_routing(votes, iterations=3) -> v     votes [B, I, J, D] -> v [B, J, D]",
    "Procedure 1 of Sabour et al.: couplings c = softmax of the logits b over the parents, v = squash(sum_i c u_hat), "
    "b += u_hat . v; no bias.",
    lambda: _cases(
        dynamic_routing_reference,
        [
            ("random votes [2, 6, 3, 4], 3 iterations", (_randn(2, 6, 3, 4, scale=0.5), 3)),
            ("random votes [2, 5, 4, 3], 1 iteration", (_randn(2, 5, 4, 3, seed=1), 1)),
            ("zero votes [1, 4, 3, 4]", (torch.zeros(1, 4, 3, 4), 3), "finite"),
            ("very long votes [2, 6, 3, 4] (about 1e3)", (_randn(2, 6, 3, 4, seed=2, scale=1e3), 3), "finite"),
            ("a batch of one, 5 iterations [1, 8, 2, 4]", (_randn(1, 8, 2, 4, seed=3), 5)),
            ("float64 [2, 6, 3, 4]", (_randn(2, 6, 3, 4, seed=4, dtype=F64), 3)),
        ],
    ),
    (
        Mistake(
            "softmax_over_children",
            "the softmax runs over the children (axis 1), as in gram-ai/capsule-networks (issue #10): "
            "each child shares "
            "one unit of vote among the parents, so take it over the parents j (the last axis of b)",
            lambda v, t=3: dynamic_routing(v, t, coupling="children"),
        ),
        Mistake(
            "detached_votes",
            "the values are right, but the votes are detached in the non-final iterations (XifengGuo/CapsNet-Pytorch): "
            "only the last iteration passes gradient back; the paper detaches nothing",
            lambda v, t=3: dynamic_routing(v, t, detach="non_final"),
        ),
        Mistake(
            "logits_never_updated",
            "the logits b are never updated (every iteration routes with uniform couplings): add the agreement "
            "u_hat . v to b after each iteration",
            lambda v, t=3: dynamic_routing(v, 1),
        ),
        Mistake(
            "no_epsilon",
            "NaN on zero votes: your squash has no epsilon (gram-ai, acburigo, the official code); use "
            "capsule_lib.squash_hinton or put the epsilon inside the square root",
            lambda v, t=3: dynamic_routing(v, t, squash_kind="hinton_no_eps"),
        ),
        Mistake(
            "softmax_overflow",
            "exp overflows on large logits: a softmax written as exp(b) / sum exp(b) without subtracting the max "
            "(acburigo's); use torch.softmax",
            _routing_no_max,
        ),
        Mistake(
            "agreement_with_s",
            "the agreement uses s_j; it is u_hat . v_j, with the squashed v_j",
            _routing_agree_s,
        ),
        Mistake(
            "squash_efficient",
            "you squashed with squash_E; dynamic routing uses Sabour et al.'s squash_H",
            lambda v, t=3: dynamic_routing(v, t, squash_kind="efficient"),
        ),
    ),
)


def _primary_reference(h: torch.Tensor, n_types: int) -> torch.Tensor:
    """The library's :class:`PrimaryCapsules` with an identity 1x1 convolution: its reshape and squash alone."""
    C = h.shape[1]
    layer = PrimaryCapsules(C, n_types, C // n_types, kernel_size=1, stride=1).to(h.dtype)
    with torch.no_grad():
        layer.conv.weight.copy_(torch.eye(C, dtype=h.dtype).view(C, C, 1, 1))
        layer.conv.bias.zero_()
    return layer(h)


def _primary_layout(h: torch.Tensor, n: int, order: str, squashed: bool = True) -> torch.Tensor:
    B, C, H, W = h.shape
    d = C // n
    if order == "view":
        u = h.reshape(B, -1, d)
    elif order == "position":
        u = h.view(B, n, d, H, W).permute(0, 3, 4, 1, 2).reshape(B, -1, d)
    elif order == "dimension_major":
        u = h.view(B, d, n, H, W).permute(0, 2, 3, 4, 1).reshape(B, -1, d)
    else:
        u = h.view(B, n, d, H, W).permute(0, 1, 3, 4, 2).reshape(B, -1, d)
    return squash_hinton(u) if squashed else u


PRIMARY_CAPSULES = Exercise(
    "primary_capsules",
    "dynamic_routing",
    "primary_capsules(h, n_types) -> u     h [B, n_types * d, H, W] -> u [B, n_types * H * W, d]",
    "Read capsules out of a convolution's output: channel c*d + a is dimension a of type c; order the capsules "
    "type-major (i = c*H*W + y*W + x) and squash each.",
    lambda: _cases(
        _primary_reference,
        [
            ("random features [2, 32, 3, 3], 4 types", (_randn(2, 32, 3, 3), 4)),
            ("a batch of one [1, 24, 2, 5], 3 types", (_randn(1, 24, 2, 5, seed=1), 3)),
            ("float64 [2, 16, 4, 4], 2 types", (_randn(2, 16, 4, 4, seed=2, dtype=F64), 2)),
        ],
    ),
    (
        Mistake(
            "not_squashed",
            "the capsules are not squashed (acburigo/CapsNet forgets it): squash each capsule over its d values",
            lambda h, n: _primary_layout(h, n, "type", squashed=False),
        ),
        Mistake(
            "view_mixes_positions",
            "a plain view(B, -1, d) of the [B, n_types*d, H, W] tensor puts d neighbouring spatial positions into one "
            "capsule (XifengGuo/CapsNet-Pytorch, issue #2): split the channels into (n_types, d) first, then move d "
            "last",
            lambda h, n: _primary_layout(h, n, "view"),
        ),
        Mistake(
            "position_major",
            "your capsules are right but ordered by position first ((y*W + x)*n_types + c, as acburigo's); this book "
            "orders them type-major, i = c*H*W + y*W + x",
            lambda h, n: _primary_layout(h, n, "position"),
        ),
        Mistake(
            "dimension_major_channels",
            "you split the channels as (d, n_types); channel c*d + a is dimension a of type c, so split as "
            "(n_types, d)",
            lambda h, n: _primary_layout(h, n, "dimension_major"),
        ),
    ),
)


def _mask_variant(v: torch.Tensor, y: torch.Tensor | None = None, how: str = "longest") -> torch.Tensor:
    B, J, _ = v.shape
    if how == "largest_entry":
        idx = v.amax(-1).argmax(1) if y is None else y
    else:
        idx = _capsule_lengths(v).argmax(1) if (y is None or how == "longest") else y
    m = F.one_hot(idx.long(), J).to(v.dtype)
    if how == "others":
        m = 1 - m
    if how == "selected_only":
        return v[torch.arange(B), idx.long()]
    return v * m[..., None]


MASK_CAPSULES = Exercise(
    "mask_capsules",
    "dynamic_routing",
    "mask_capsules(v, y=None) -> masked     v [B, J, D], y [B] labels or None -> [B, J, D]",
    "Keep one capsule per image and zero the others: the label's (training) or, without labels, the longest one.",
    lambda: _cases(
        mask_capsules,
        [
            ("random capsules [4, 10, 16] with labels", (_randn(4, 10, 16, scale=0.3), _labels(4, 10, 0))),
            ("random capsules [4, 10, 16], no labels", (_randn(4, 10, 16, seed=1, scale=0.3), None)),
            ("a batch of one [1, 5, 4] with a label", (_randn(1, 5, 4, seed=2), _labels(1, 5, 1))),
            ("float64 [3, 6, 8], no labels", (_randn(3, 6, 8, seed=3, dtype=F64), None)),
        ],
    ),
    (
        Mistake(
            "ignores_label",
            "you kept the longest capsule although the label is given: during training the decoder reads the label's "
            "capsule (Sabour et al.)",
            lambda v, y=None: _mask_variant(v, None),
        ),
        Mistake(
            "keeps_the_others",
            "you zeroed the selected capsule and kept the others",
            lambda v, y=None: _mask_variant(v, y, "others"),
        ),
        Mistake(
            "largest_entry",
            "you picked the capsule with the largest entry, not the longest one (its length |v_j|)",
            lambda v, y=None: _mask_variant(v, y, "largest_entry"),
        ),
        Mistake(
            "selected_only",
            "you returned only the selected capsule, [B, D] (acburigo's decoder input); the mask keeps [B, J, D] with "
            "the other capsules zeroed (the decoder reads all J*D values)",
            lambda v, y=None: _mask_variant(v, y, "selected_only"),
        ),
    ),
)


# --------------------------------------------------------------------------------------------- EM routing
def _em_case_data(seed: int, dtype: torch.dtype, scale: float = 1.0, shape=(2, 6, 3, 4)):
    """Votes, activations, betas, inverse temperatures and the library's trace; ``scale != 1``: child 0's votes are
    moved ``scale`` away from the others and its activation is tiny (a distant vote that barely moves the
    Gaussians: its densities underflow under every parent)."""
    B, I, J, D = shape
    votes = _randn(B, I, J, D, seed=seed, dtype=dtype)
    a_in = _rand(B, I, seed=seed + 1, dtype=dtype) * 0.8 + 0.1
    if scale != 1.0:
        votes[:, 0] += scale
        a_in[:, 0] = 1e-4
    bu, ba = _randn(J, seed=seed + 2, scale=0.5, dtype=dtype), _randn(J, seed=seed + 3, scale=0.5, dtype=dtype)
    lams = [0.05, 0.1, 0.2]
    (_, _), tr = em_routing(votes, a_in, bu, ba, 3, inverse_temperature=lams, normalize_costs=False,
                            return_routing=True)  # fmt: skip
    return votes, a_in, bu, ba, lams, tr


_EM_DATA = [("random", 0, torch.float32, 1.0, (2, 6, 3, 4)), ("float64", 10, F64, 1.0, (2, 5, 4, 4)),
            ("a batch of one", 20, torch.float32, 1.0, (1, 8, 2, 4))]  # fmt: skip


def _em_m_cases() -> list[Case]:
    out = []
    for what, seed, dtype, scale, shape in _EM_DATA:
        votes, a_in, bu, ba, lams, tr = _em_case_data(seed, dtype, scale, shape)
        for t in range(3):
            R = tr.coefficients[t].detach()
            out.append(Case(f"{what} votes {list(shape)}, iteration {t + 1}'s R",
                            (votes, a_in, R, bu, ba, lams[t]),
                            (tr.outputs[t].detach(), tr.extra["sigma2"][t].detach(), tr.activations[t].detach()),
                            "finite"))  # fmt: skip
    return out


def _em_m(votes, a_in, R, beta_u, beta_a, lam, *, renormalise=False, use_a=True, log_sigma2=False, mass=True):
    eps = 1e-8
    Rp = R * a_in[..., None] if use_a else R
    if renormalise:
        Rp = Rp / (Rp.sum(2, keepdim=True) + eps)
    m = Rp.sum(1)  # [B, J]
    c = Rp / (m[:, None] + eps)
    mu = torch.einsum("bij,bijd->bjd", c, votes)
    sigma2 = torch.einsum("bij,bijd->bjd", c, (votes - mu[:, None]) ** 2) + eps
    log_s = sigma2.log() if log_sigma2 else 0.5 * sigma2.log()
    cost = ((beta_u[:, None] + log_s) * (m[..., None] if mass else 1.0)).sum(2)
    return mu, sigma2, torch.sigmoid(lam * (beta_a - cost))


EM_M_STEP = Exercise(
    "em_m_step",
    "em_routing",
    "em_m_step(votes, a_in, R, beta_u, beta_a, lam) -> (mu, sigma2, a_out)     votes [B, I, J, D], a_in [B, I], "
    "R [B, I, J], beta_u, beta_a [J] -> [B, J, D], [B, J, D], [B, J]",
    "One M-step of Hinton et al.'s EM routing, with the paper's raw costs and eps = 1e-8 as the variance floor.",
    _em_m_cases,
    (
        Mistake(
            "activations_cancelled",
            "the children's activations a_i have no effect on the result: you left them out, or renormalised "
            "R'_ij = R_ij a_i over the parents, which cancels them (yl-1993's code does); use R'_ij = R_ij a_i as "
            "it is",
            lambda *a: _em_m(*a, use_a=False),
        ),
        Mistake(
            "log_variance_in_cost",
            "cost_h uses log sigma_h = 1/2 log sigma2_h; you used log sigma2_h",
            lambda *a: _em_m(*a, log_sigma2=True),
        ),
        Mistake(
            "cost_without_mass",
            "a parent's cost is (beta_u + log sigma_h) times the mass it explains, sum_i R'_ij",
            lambda *a: _em_m(*a, mass=False),
        ),
    ),
)


def _em_e_cases() -> list[Case]:
    out = []
    for what, seed, dtype, scale, shape in [*_EM_DATA, ("a distant child's", 30, torch.float32, 1e3, (2, 6, 3, 4))]:
        votes, _, _, _, _, tr = _em_case_data(seed, dtype, scale, shape)
        nxt = [*tr.coefficients[1:], tr.extra["posterior"]]
        for t in range(3) if scale == 1.0 else (0,):
            args = (votes, tr.outputs[t].detach(), tr.extra["sigma2"][t].detach(), tr.activations[t].detach())
            out.append(Case(f"{what} votes {list(shape)}, after M-step {t + 1}", args, nxt[t].detach(), "finite"))
    return out


def _em_e(votes, mu, sigma2, a_out, *, dim=2, prior=True, half=True, log_sigma=True, log_space=True):
    sq = (votes - mu[:, None]) ** 2
    log_p = -(0.5 if half else 1.0) * (sq / sigma2[:, None]).sum(-1)
    if log_sigma:
        log_p = log_p - 0.5 * sigma2.log().sum(-1)[:, None]
    logit = log_p + (a_out.log()[:, None] if prior else 0.0)
    if not log_space:
        p = torch.exp(logit)
        return p / p.sum(dim, keepdim=True)
    return torch.softmax(logit, dim)


EM_E_STEP = Exercise(
    "em_e_step",
    "em_routing",
    "em_e_step(votes, mu, sigma2, a_out) -> R     votes [B, I, J, D], mu, sigma2 [B, J, D], a_out [B, J] -> "
    "R [B, I, J]",
    "One E-step: R_ij proportional to a_j p_ij (p: the parent's diagonal Gaussian), normalised over the parents, in "
    "log space.",
    _em_e_cases,
    (
        Mistake(
            "normalised_over_children",
            "R is normalised over the children (axis 1); each child's assignments sum to 1 over the parents j "
            "(the last axis)",
            lambda *a: _em_e(*a, dim=1),
        ),
        Mistake(
            "no_parent_activation",
            "R_ij is proportional to a_j p_ij: add log a_j to each log-likelihood",
            lambda *a: _em_e(*a, prior=False),
        ),
        Mistake(
            "not_log_space",
            "0/0: the densities underflow for distant votes; work in log space (log a_j + log p_ij, then a softmax "
            "over j), as the chapter's 'Why log space' shows",
            lambda *a: _em_e(*a, log_space=False),
        ),
        Mistake(
            "missing_half",
            "the log-density is -1/2 sum_h (V - mu)^2 / sigma2 - 1/2 sum_h log sigma2 (+ a constant): the 1/2 is "
            "missing",
            lambda *a: _em_e(*a, half=False),
        ),
        Mistake(
            "missing_log_sigma",
            "the log-density also has -1/2 sum_h log sigma2_jh: a wide Gaussian explains every vote a little less",
            lambda *a: _em_e(*a, log_sigma=False),
        ),
    ),
)


# ------------------------------------------------------------------------------------------ Heinsen routing
def _heinsen_trace(seed: int, dtype: torch.dtype, shape=(2, 6, 3, 2, 3)):
    B, I, J, C, E = shape
    a_inp = _randn(B, I, seed=seed, dtype=dtype)
    mu_inp = _randn(B, I, C, E, seed=seed + 1, dtype=dtype)
    W, Bias = _randn(I, J, E, E, seed=seed + 2, scale=0.5, dtype=dtype), _randn(I, J, C, E, seed=seed + 3, dtype=dtype)
    bu, bi = _randn(I, J, seed=seed + 4, dtype=dtype), _randn(I, J, seed=seed + 5, dtype=dtype)
    _, tr = generative_matrix_routing(a_inp, mu_inp, W, Bias, bu, bi, 3, return_routing=True)
    return a_inp, bu, bi, tr


_HEINSEN_DATA = [("random", 0, torch.float32, (2, 6, 3, 2, 3)), ("float64", 10, F64, (2, 5, 4, 2, 2)),
                 ("a batch of one", 20, torch.float32, (1, 7, 2, 2, 3))]  # fmt: skip


def _heinsen_m_cases() -> list[Case]:
    out = []
    for what, seed, dtype, shape in _HEINSEN_DATA:
        a_inp, bu, bi, tr = _heinsen_trace(seed, dtype, shape)
        V = tr.extra["votes"].detach()
        for t in range(3):
            args = (a_inp, tr.coefficients[t].detach(), V, bu, bi)
            want = (tr.activations[t].detach(), tr.outputs[t].detach(), tr.extra["sigma2"][t].detach())
            out.append(Case(f"{what} inputs, iteration {t + 1}'s R", args, want, "finite", (2,)))
    return out


def _heinsen_m(a_inp, R, V, beta_use, beta_ign, *, ign="f", f_of="sigmoid", use_f=True, ign_term=True, mean=False):
    eps = 1e-5
    f = (torch.sigmoid(a_inp) if f_of == "sigmoid" else a_inp)[..., None]
    D_use = f * R if use_f else R
    D_ign = (f - D_use) if ign == "f" else (1 - D_use)
    a_out = (beta_use * D_use).sum(1) - ((beta_ign * D_ign).sum(1) if ign_term else 0.0)
    over = 1 / ((D_use.sum(1) if not mean else torch.full_like(D_use.sum(1), R.shape[1])) + eps)[..., None, None]
    mu = torch.einsum("bij,bijce->bjce", D_use, V) * over
    sigma2 = torch.einsum("bij,bijce->bjce", D_use, (V - mu[:, None]) ** 2) * over + eps
    return a_out, mu, sigma2


HEINSEN_M_STEP = Exercise(
    "heinsen_m_step",
    "heinsen_routing",
    "heinsen_m_step(a_inp, R, V, beta_use, beta_ign) -> (a_out, mu_out, sigma2_out)     a_inp [B, I] (logits), "
    "R [B, I, J], V [B, I, J, C, E], beta_use, beta_ign [I, J] -> [B, J], [B, J, C, E], [B, J, C, E]",
    "Heinsen's D-step and M-step: the data each output uses and ignores, its logit ('bang per bit') and its Gaussian "
    "(eps = 1e-5).",
    _heinsen_m_cases,
    (
        Mistake(
            "ignored_is_one_minus_used",
            "D_ign = f(a_i) - D_use: what an output ignores is what the input carries minus what it uses (you used "
            "1 - D_use)",
            lambda *a: _heinsen_m(*a, ign="one"),
        ),
        Mistake(
            "scores_not_sigmoid",
            "the input scores are logits: f(a_i) = sigmoid(a_i)",
            lambda *a: _heinsen_m(*a, f_of="identity"),
        ),  # fmt: skip
        Mistake(
            "no_f", "D_use = f(a_i) R_ij: weigh the shares by sigmoid(a_i)", lambda *a: _heinsen_m(*a, use_f=False)
        ),
        Mistake(
            "no_ignore_term",
            "a_out_j also subtracts sum_i beta_ign_ij D_ign_ij (the cost of the data it ignores)",
            lambda *a: _heinsen_m(*a, ign_term=False),
        ),
        Mistake(
            "mean_over_inputs",
            "mu_j is divided by sum_i D_use_ij (+ eps), the data it uses, not by the number of inputs",
            lambda *a: _heinsen_m(*a, mean=True),
        ),
    ),
)


def _heinsen_e_cases() -> list[Case]:
    out = []
    for what, seed, dtype, shape in _HEINSEN_DATA:
        _, _, _, tr = _heinsen_trace(seed, dtype, shape)
        V = tr.extra["votes"].detach()
        for t in range(2):
            args = (tr.activations[t].detach(), V, tr.outputs[t].detach(), tr.extra["sigma2"][t].detach())
            out.append(Case(f"{what} inputs, after M-step {t + 1}", args, tr.coefficients[t + 1].detach(), "finite",
                            (1,)))  # fmt: skip
    return out


def _heinsen_e(a_out, V, mu, sigma2, *, dim=2, prior="logsigmoid", log_sigma=True):
    sq = (V - mu[:, None]) ** 2
    log_p = -(sq / (2 * sigma2[:, None])).sum((-2, -1))
    if log_sigma:
        log_p = log_p - 0.5 * sigma2.log().sum((-2, -1))[:, None]
    pri = {"logsigmoid": F.logsigmoid(a_out), "logit": a_out, "none": torch.zeros_like(a_out)}[prior]
    return torch.softmax(pri[:, None] + log_p, dim)


HEINSEN_E_STEP = Exercise(
    "heinsen_e_step",
    "heinsen_routing",
    "heinsen_e_step(a_out, V, mu_out, sigma2_out) -> R     a_out [B, J] (logits), V [B, I, J, C, E], mu_out, "
    "sigma2_out [B, J, C, E] -> R [B, I, J]",
    "The E-step: R_ij = softmax over j of log sigmoid(a_out_j) + log p_ij (Gaussian, constant dropped).",
    _heinsen_e_cases,
    (
        Mistake(
            "over_inputs",
            "the softmax runs over the inputs (axis 1); each input's shares sum to 1 over the outputs j",
            lambda *a: _heinsen_e(*a, dim=1),
        ),  # fmt: skip
        Mistake(
            "logit_as_log_probability",
            "the prior is log sigmoid(a_out_j): a_out are logits, not log-probabilities",
            lambda *a: _heinsen_e(*a, prior="logit"),
        ),
        Mistake(
            "no_prior",
            "add the prior log sigmoid(a_out_j) to each log-likelihood",
            lambda *a: _heinsen_e(*a, prior="none"),
        ),  # fmt: skip
        Mistake(
            "missing_log_sigma",
            "log p_ij also has -1/2 sum log sigma2_j (the normalisation of each Gaussian)",
            lambda *a: _heinsen_e(*a, log_sigma=False),
        ),
    ),
)


# ----------------------------------------------------------------------------------- inverted attention
def _layer_normed(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return F.layer_norm(_randn(*shape, seed=seed, dtype=dtype), shape[-1:])


def _inverted(votes, prev=None, *, dim=2, scale=True, norm="layer"):
    J, d = votes.shape[2], votes.shape[-1]
    if prev is None:
        r = torch.full_like(votes[..., 0], 1 / J)
    else:
        a = torch.einsum("bijd,bjd->bij", votes, prev) / (math.sqrt(d) if scale else 1.0)
        r = torch.softmax(a, dim)
    s = torch.einsum("bij,bijd->bjd", r, votes)
    return {"layer": F.layer_norm(s, (d,)), "none": s, "squash": squash_hinton(s)}[norm]


INVERTED_UPDATE = Exercise(
    "inverted_update",
    "tsai_inverted",
    "inverted_update(votes, prev_pose=None) -> poses     votes [B, I, J, d], prev_pose [B, J, d] or None -> [B, J, d]",
    "One inverted dot-product attention update: agreement <V_ij, P_j> / sqrt(d), softmax over the parents, plain sum "
    "over the children, LayerNorm over d (no affine); uniform routing when prev_pose is None.",
    lambda: _cases(
        inverted_attention_update,
        [
            ("random votes [2, 6, 3, 16] and parents", (_randn(2, 6, 3, 16), _layer_normed(2, 3, 16, seed=1))),
            ("random votes [2, 5, 4, 4], first pass (no parents)", (_randn(2, 5, 4, 4, seed=2), None)),
            ("a batch of one [1, 8, 2, 9]", (_randn(1, 8, 2, 9, seed=3), _layer_normed(1, 2, 9, seed=4))),
            (
                "float64 [2, 6, 3, 16]",
                (_randn(2, 6, 3, 16, seed=5, dtype=F64), _layer_normed(2, 3, 16, seed=6, dtype=F64)),
            ),
        ],
    ),
    (
        Mistake(
            "softmax_over_children",
            "the softmax runs over the children (axis 1); Tsai et al. normalise over the parents j (the last axis)",
            lambda v, p=None: _inverted(v, p, dim=1),
        ),  # fmt: skip
        Mistake(
            "no_scaling",
            "the agreement is <V_ij, P_j> / sqrt(d): the 1 / sqrt(d) is missing",
            lambda v, p=None: _inverted(v, p, scale=False),
        ),  # fmt: skip
        Mistake(
            "no_layer_norm",
            "the new pose is LayerNorm_d(sum_i r_ij V_ij): the LayerNorm over d is missing",
            lambda v, p=None: _inverted(v, p, norm="none"),
        ),  # fmt: skip
        Mistake(
            "squash_not_layer_norm",
            "Tsai et al. end the update with a LayerNorm over d, not a squash",
            lambda v, p=None: _inverted(v, p, norm="squash"),
        ),  # fmt: skip
    ),
)

CONV_WINDOWS = Exercise(
    "conv_windows",
    "tsai_inverted",
    "conv_windows(poses, k, stride) -> windows     poses [B, N, H, W, d] -> [B, N, k, k, h_out, w_out, d]",
    "The valid k x k windows of a capsule grid: out[b, n, k, l, h, w] = poses[b, n, h*stride + k, w*stride + l].",
    lambda: _cases(
        _conv_windows,
        [
            ("a 7x7 grid [2, 3, 7, 7, 4], k 3, stride 2", (_randn(2, 3, 7, 7, 4), 3, 2)),
            ("a 5x6 grid [1, 2, 5, 6, 16], k 3, stride 1", (_randn(1, 2, 5, 6, 16, seed=1), 3, 1)),
            ("float64 [2, 2, 4, 4, 4], k 2, stride 2", (_randn(2, 2, 4, 4, 4, seed=2, dtype=F64), 2, 2)),
        ],
    ),
    (
        Mistake(
            "official_expansion",
            "you stacked the window slices on the last axis and then viewed that memory as [..., h_out, w_out, d] (the "
            "official CapsuleCONV.input_expansion, apple PR #1): pose entries and positions get mixed",
            lambda p, k, s: _conv_windows(p, k, s, "official_bug"),
        ),
        Mistake(
            "offsets_swapped",
            "the two kernel offsets are swapped: axis 2 is the row offset k, axis 3 the column offset l",
            lambda p, k, s: _conv_windows(p, k, s).transpose(2, 3),
        ),
    ),
)


# ---------------------------------------------------------------------------------------- Efficient-CapsNet
def _sa_reference(votes: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    return self_attention_routing(votes, log_prior, return_routing=True)[1].extra["coefficients_with_prior"]


def _sa(votes, log_prior, *, dim=2, scale=True, prior_after=True):
    a = torch.einsum("bije,bkje->bij", votes, votes) / (math.sqrt(votes.shape[-1]) if scale else 1.0)
    return torch.softmax(a, dim) + log_prior if prior_after else torch.softmax(a + log_prior, dim)


SELF_ATTENTION_COUPLINGS = Exercise(
    "self_attention_couplings",
    "efficient_capsnet",
    "self_attention_couplings(votes, log_prior) -> c     votes [B, I, J, D], log_prior [I, J] -> c [B, I, J]",
    "Efficient-CapsNet's couplings: the row sums of each class's self-attention matrix, / sqrt(D), a softmax over the "
    "classes, then the learned log prior added.",
    lambda: _cases(
        _sa_reference,
        [
            ("random votes [2, 16, 10, 16]", (_randn(2, 16, 10, 16, scale=0.2), _randn(16, 10, seed=1, scale=0.1))),
            ("a batch of one [1, 4, 3, 8]", (_randn(1, 4, 3, 8, seed=2), _randn(4, 3, seed=3, scale=0.1))),
            ("float64 [2, 5, 4, 4]", (_randn(2, 5, 4, 4, seed=4, dtype=F64), _randn(5, 4, seed=5, dtype=F64))),
        ],
        wrt=(0, 1),
    ),
    (
        Mistake(
            "softmax_over_children",
            "the softmax runs over the primary capsules (axis 1); Efficient-CapsNet takes "
            "it over the classes j (the last axis)",
            lambda v, b: _sa(v, b, dim=1),
        ),  # fmt: skip
        Mistake(
            "no_scaling", "the row sums are divided by sqrt(D) before the softmax", lambda v, b: _sa(v, b, scale=False)
        ),  # fmt: skip
        Mistake(
            "prior_inside_softmax",
            "the learned log prior is added after the softmax in Efficient-CapsNet's code (c + b), not inside it",
            lambda v, b: _sa(v, b, prior_after=False),
        ),
    ),
)


def _overlay_cases() -> list[Case]:
    x, y = glyph_digits(48, seed=0)
    out = []
    for variant, seed in (("sabour", 0), ("efficient", 1)):
        p = make_multimnist(x, y, 12, variant=variant, seed=seed)
        args = (x[p["index_a"]], x[p["index_b"]], p["shift_a"], p["shift_b"], 4)
        out.append(Case(f"12 glyph-digit pairs, {variant}'s shifts", args, p["merged"]))
    p = make_multimnist(x, y, 1, seed=2)
    out.append(Case("a batch of one", (x[p["index_a"]], x[p["index_b"]], p["shift_a"], p["shift_b"], 4), p["merged"]))
    return out


def _overlay(a, b, shift_a, shift_b, pad=4, *, merge="clip", shift="zero", swap=False):
    def move(img, sh):
        img = F.pad(img, (pad, pad, pad, pad))
        dx, dy = (sh[:, 1], sh[:, 0]) if swap else (sh[:, 0], sh[:, 1])
        if shift == "roll":
            return torch.stack([torch.roll(i, (int(v), int(u)), (-2, -1)) for i, u, v in zip(img, dx, dy)])
        return shift_images(img, dx, dy)

    A, Bm = move(a, shift_a), move(b, shift_b)
    if merge == "wrap":
        return A + Bm
    if merge == "mean":
        return ((A.int() + Bm.int()) // 2).to(torch.uint8)
    if merge == "max":
        return torch.maximum(A, Bm)
    return (A.int() + Bm.int()).clamp_max(255).to(torch.uint8)


MULTIMNIST_OVERLAY = Exercise(
    "multimnist_overlay",
    "efficient_capsnet",
    "multimnist_overlay(a, b, shift_a, shift_b, pad=4) -> merged     a, b uint8 [N, 1, 28, 28], shifts [N, 2] as "
    "(dx, dy) -> uint8 [N, 1, 28 + 2 pad, 28 + 2 pad]",
    "A MultiMNIST pair: pad both digits, shift each by its (dx, dy) with zero fill, add them and clip at 255.",
    _overlay_cases,
    (
        Mistake(
            "uint8_wraps",
            "uint8 addition wraps around above 255: add in a wider type and clip, min(a + b, 255)",
            lambda *a: _overlay(*a, merge="wrap"),
        ),
        Mistake(
            "averaged",
            "you averaged the two digits; MultiMNIST adds them and clips at 255",
            lambda *a: _overlay(*a, merge="mean"),
        ),  # fmt: skip
        Mistake(
            "maximum",
            "you took the pixel-wise maximum; MultiMNIST adds the digits and clips at 255",
            lambda *a: _overlay(*a, merge="max"),
        ),  # fmt: skip
        Mistake(
            "rolled",
            "torch.roll wraps a digit around the border; the shift fills with zeros (what leaves the canvas is lost)",
            lambda *a: _overlay(*a, shift="roll"),
        ),
        Mistake(
            "shift_axes_swapped",
            "the shifts are (dx, dy): dx moves the columns, dy the rows",
            lambda *a: _overlay(*a, swap=True),
        ),  # fmt: skip
    ),
)


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


#: every exercise of the book by name, in the order of the chapters
EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        SQUASH_HINTON,
        CAPSULE_LENGTHS,
        MARGIN_LOSS,
        DYNAMIC_ROUTING,
        PRIMARY_CAPSULES,
        MASK_CAPSULES,
        EM_M_STEP,
        EM_E_STEP,
        HEINSEN_M_STEP,
        HEINSEN_E_STEP,
        INVERTED_UPDATE,
        CONV_WINDOWS,
        SQUASH_EFFICIENT,
        SELF_ATTENTION_COUPLINGS,
        MULTIMNIST_OVERLAY,
        CAPSULE_VOTES,
        LOGLOG_SLOPE,
        FGSM,
        RECONSTRUCTION_DISTANCE,
        COUPLING_ENTROPY,
        VERSUS,
    )
}


def exercises_of(chapter: str) -> list[Exercise]:
    """The exercises at the end of ``chapter`` (a notebook's name without ``.ipynb``), in order."""
    return [e for e in EXERCISES.values() if e.chapter == chapter]


def check(name: str, fn: Any, *, must_pass: bool = False) -> CheckResult:
    """Check a reader's function ``fn`` against the library's reference for the exercise ``name``.

    Parameters
    ----------
    name : str
        An exercise of :data:`EXERCISES` (its function's name: ``"squash_hinton"``, ``"dynamic_routing"``, ...).
    fn : callable
        The reader's function, called with the exercise's inputs (see its ``signature``).
    must_pass : bool, optional
        Raise :class:`~capsule_lib.exercises.checker.ExerciseFailed` with the verdict when ``fn`` does not pass (a
        chapter's hidden solution cell: a solution that stops passing fails the build). Default False.

    Returns
    -------
    CheckResult
        ``passed``, a one-line ``message`` (what differs, on which input, and the named mistake when it is a known
        one), ``mistake`` (its key) and ``status`` (``"passed"``, ``"failed"``, ``"todo"``); shown as one line in a
        notebook. Whatever ``fn`` does (raises, returns the wrong type, shape, dtype or NaN), the checker answers in
        this one line and does not raise, unless ``must_pass``.
    """
    check_choice(name, sorted(EXERCISES), "name")
    result = run_exercise(EXERCISES[name], fn)
    if must_pass and not result.passed:
        raise ExerciseFailed(str(result))
    return result
