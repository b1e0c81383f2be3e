"""The exercises on matrix and attention routing: EM's M-step and E-step, Heinsen's D/M-step and E-step, an
inverted-attention update and convolutional windows (see :mod:`.catalogue`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..functional import squash_hinton
from ..routing.em import em_routing
from ..routing.heinsen_2019 import generative_matrix_routing
from ..routing.inverted import conv_windows as _conv_windows
from ..routing.inverted import inverted_attention_update
from ._inputs import F64, _cases, _rand, _randn
from .checker import Case, Exercise, Mistake


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
