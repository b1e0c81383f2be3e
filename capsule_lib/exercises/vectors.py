"""The exercises on vector capsules: the squashes, lengths, the margin loss, dynamic routing, primary capsules,
the reconstruction mask, self-attention routing's couplings and a MultiMNIST pair (see :mod:`.catalogue`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..data.generated import glyph_digits
from ..data.multimnist import make_multimnist
from ..data.transforms import shift_images
from ..functional import capsule_lengths as _capsule_lengths
from ..functional import squash, squash_efficient, squash_hinton
from ..layers.masking import mask_capsules
from ..layers.primary import PrimaryCapsules
from ..losses import margin_loss as _margin_loss
from ..routing.dynamic import dynamic_routing, dynamic_routing_reference
from ..routing.self_attention import self_attention_routing
from ._inputs import F64, _cases, _labels, _rand, _randn
from .checker import Case, Exercise, Mistake


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
