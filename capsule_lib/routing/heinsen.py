"""Heinsen's routing algorithms: the 2019 generative *matrix* routing and the 2022 efficient *vector* routing.

* Heinsen (2019), "An Algorithm for Routing Capsules in All Domains", arXiv 1911.00792:
  :func:`generative_matrix_routing` / :class:`GenerativeMatrixRouting` (the 2019 ``Routing`` class).
* Heinsen (2022), "An Algorithm for Routing Vectors in Sequences", arXiv 2211.11754:
  :func:`efficient_vector_routing` / :class:`EfficientVectorRouting`.

Both are the same E-step / D-step / M-step loop: every output capsule ``j`` competes for a share ``R_ij`` of
every input ``i`` (the shares sum to 1 over the outputs), an input's activation ``f(a_i) = sigmoid(a_i)`` is
split into data that output ``j`` *uses*, ``D_use_ij = f(a_i) R_ij``, and data it *ignores*,
``D_ign_ij = f(a_i) - D_use_ij``, and each output maximises "bang per bit"
``beta_use D_use - beta_ign D_ign``. Nothing is detached: gradients flow through every iteration.

Index names used in every einsum below::

    i  input capsule          j  output capsule
    c  pose rows (d_cov)      d  input pose columns / input vector size      e  output size (d_out)
    ...  any number of leading (batch-like) dimensions

Numerics: the routing body runs with autocast disabled, in float32 (float64 stays float64), and the
results are cast back to the input dtype, so the routings are safe under fp16/bf16 autocast, on zero inputs
and on inputs scaled by 1e3. Input logits of ``+-inf`` (the 2019 SST model's ``logit(mask)``) are fine.

Differences from the public code (glassroom/heinsen_routing), none of which changes the math:

* internals in float32 with autocast off (the public code runs in whatever dtype it is given);
* ``return_routing=True`` returns a :class:`RoutingTrace` with every iteration (the public ``return_R`` /
  ``return_dict`` give the final state only, and ``return_dict`` raises ``UnboundLocalError`` with
  ``iterations=1``); the trace also holds the agreements computed after the last iteration;
* the 2019 symmetry breaker ``linspace(-1, 1, n_out)`` is built in the parameters' dtype (float32 in the
  public code, a ~1e-8 difference in float64);
* :class:`EfficientVectorRouting` takes the boolean ``mask`` described in the spec (True = ignore): masked
  pairs get ``a = -inf`` and routing logit ``-inf``; the t = 0 uniform shares are spread over the unmasked
  outputs only, and an input masked for every output gets all-zero shares instead of NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_module_input, check_tensor
from ..types import RoutingTrace
from ._common import autocast_outputs, kernel_device

__all__ = [
    "generative_matrix_routing",
    "GenerativeMatrixRouting",
    "heinsen_votes",
    "efficient_vector_routing",
    "EfficientVectorRouting",
]

_P_MODELS = ("gaussian", "skm")
_METHODS = ("auto", "votes", "moments")


# ----------------------------------------------------------------------------------------------- helpers
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16/float32 -> float32; float64 -> float64."""
    return torch.promote_types(dtype, torch.float32)


def _no_autocast(t: torch.Tensor):
    """Context that turns autocast off on ``t``'s device (so einsums really run in the compute dtype)."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _check_one_or(p: torch.Tensor, name: str, spec: str, n: int, rest: list) -> None:
    """``p`` must be ``[n, *rest]`` or ``[1, *rest]`` (weights shared across inputs)."""
    check_tensor(p, name, spec, [None, *rest])
    if p.shape[0] not in (1, n):
        raise ValueError(f"{name}: expected shape {spec} with first size 1 or {n}, got {tuple(p.shape)}")


def _check_mask(mask: torch.Tensor | None, lead: torch.Size, n_inp: int, n_out: int) -> torch.Tensor | None:
    """A boolean mask (True = ignore the pair) broadcastable to ``[..., n_inp, n_out]`` without adding dims."""
    if mask is None:
        return None
    spec = f"[n_inp={n_inp}, n_out={n_out}] or [..., n_inp, n_out] (broadcastable, bool)"
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask: expected a bool tensor of shape {spec}, got {got}")
    full = (*lead, n_inp, n_out)
    try:
        ok = mask.dim() >= 2 and tuple(torch.broadcast_shapes(mask.shape, full)) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask: expected shape {spec} for inputs with leading dims {tuple(lead)}, got {tuple(mask.shape)}"
        )
    return mask


def _masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis (the outputs j) ignoring masked entries.

    A row whose entries are all masked (an input ignored by every output, e.g. padding) gets all-zero
    coefficients instead of NaN; every other row sums to 1 over its unmasked outputs.
    """
    if mask is None:
        return torch.softmax(logits, dim=-1)
    logits = logits.masked_fill(mask, float("-inf"))
    logits = logits.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)  # no all -inf rows: finite softmax
    return torch.softmax(logits, dim=-1).masked_fill(mask, 0.0)


# ------------------------------------------------------------------------------ 2019: matrix routing
def heinsen_votes(mu_inp: torch.Tensor, W: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Votes ``V_ij = mu_i W_ij + B_ij``.

    ``mu_inp [..., n_inp, d_cov, d_inp]``, ``W [n_inp or 1, n_out, d_inp, d_out]``,
    ``B [n_inp or 1, n_out, d_cov, d_out]`` -> ``V [..., n_inp, n_out, d_cov, d_out]``. A first size of 1 means
    one matrix shared by every input (variable ``n_inp``): then the votes are a single matmul.

    The result is a transposed view of a ``[..., n_out, n_inp, d_cov, d_out]`` tensor: the routing's
    contractions over the inputs (means, variances) then run as plain batched matmuls over the outputs
    without copying ``V`` (this matters for the smallNORB model's 5184 x 64 votes).
    """
    I, C = mu_inp.shape[-3:-1]
    if W.shape[0] == 1:  # one matmul: [..., 1, I*C, D] @ [J, D, E]
        V = torch.matmul(mu_inp.flatten(-3, -2).unsqueeze(-3), W[0]).unflatten(-2, (I, C))  # [..., J, I, C, E]
    else:
        V = torch.einsum("...icd,ijde->...jice", mu_inp, W).contiguous()  # [..., J, I, C, E]
    V = V + B.transpose(0, 1)  # [..., J, I, C, E]
    return V.transpose(-4, -3)  # [..., I, J, C, E]


def _log_p(V_less_mu_out_2: torch.Tensor, sigma2_out: torch.Tensor, p_model: str) -> torch.Tensor:
    """``log p_ij`` of every vote under every output's model.

    ``(V - mu)^2 [..., I, J, C, E]``, ``sigma2 [..., J, C, E]`` -> ``[..., I, J]``.
    """
    if p_model == "gaussian":  # the -1/2 log(2 pi) constant is dropped (it cancels in the softmax)
        quad = torch.einsum("...ijce,...jce->...ij", V_less_mu_out_2, 1.0 / (2.0 * sigma2_out))  # [..., I, J]
        log_sig = 0.5 * torch.log(sigma2_out).sum(dim=(-2, -1))  # [..., J]  sum_{c,e} log sigma_jce
        return -quad - log_sig.unsqueeze(-2)  # [..., I, J]
    return torch.log_softmax(-V_less_mu_out_2.sum(dim=(-2, -1)), dim=-1)  # [..., I, J]  soft k-means


def _shared_weight_routing(
    f_a_inp: torch.Tensor,
    mu: torch.Tensor,
    W: torch.Tensor,
    B: torch.Tensor,
    b_use: torch.Tensor,
    b_ign: torch.Tensor,
    iterations: int,
    p_model: str,
    eps: float,
):
    """The 2019 loop when ``W``, ``B`` and the betas are shared by every input, without forming the votes.

    ``f_a_inp [..., I, 1]``, ``mu [..., I, C, D]``, ``W [J, D, E]``, ``B [J, C, E]``, ``b_use``, ``b_ign [J]``
    -> ``(a_out [..., J], mu_out [..., J, C, E], sigma2_out [..., J, C, E])``, all in ``mu``'s dtype.

    The votes ``V_ij = mu_i W_j + B_j`` (``[..., I, J, C, E]``: 425 MB for the smallNORB model's 5184 x 64 at
    batch 20) are linear in ``mu_i``. With inputs centred, ``x_i = mu_i - m`` (``m``: their mean weighted by
    ``f(a_i)``; any shift gives the same result, centring keeps the expanded squares below from cancelling),
    ``V_ij = x_i W_j + B'_j`` with ``B'_j = m W_j + B_j``, and ``V_ij - mu_out_j = x_i W_j - K_j`` with
    ``K_j = mu_out_j - B'_j``. So every sum over the inputs needs only the ``D_use``-weighted moments
    ``sum_i D_ij x_i`` and ``sum_i D_ij x_i[c] (x) x_i[c]``, and ``log p_ij`` is a quadratic form in
    ``(x_i, x_i (x) x_i)``: all are ``[..., I, 16 or 64] x [..., 16 or 64, J]`` matrix products. Same function
    as the votes path (float64 agrees to ~1e-12).

    The expanded squares (``sigma2`` from the moments, the quadratic forms of ``log p``) cancel when a Gaussian is
    far tighter than the spread of the inputs around their mean (inputs spanning many scales, a spike): in float32
    that lost every digit of ``sigma2`` and ``log p`` (relative errors up to 1e4 on a 1e5 spike where the votes path
    in float32 stays within 1e-2), and the ratio of the expanded terms to what they leave reached 1e5-1e6 on the
    shipped smallNORB network's own inputs. :func:`generative_matrix_routing` therefore runs this function in
    float64 (``mu`` and the parameters upcast; keeping the ``[..., I, J]`` shares in float32 saved 6 % and lost the
    accuracy again). That costs the CPU training step of
    the smallNORB network 1.6x at the book's 48 x 48 (156 -> 247 ms, batch 32, 2 cores) and about 3x at the paper's
    96 x 96 (``benchmarks/bench.py`` case ``model_heinsen_smallnorb``: about 0.55 -> 1.6-2.0 s at batch 20), still
    7.5x faster than the author's code there (``benchmarks/README.md``). The expanded variance is still clamped at 0
    before ``+ eps``.
    """
    I, C, D = mu.shape[-3:]
    J = W.shape[0]
    f_sum = f_a_inp.sum(dim=-2)  # [..., 1]
    weights = (f_a_inp / (f_sum.unsqueeze(-1) + eps)).detach()  # [..., I, 1]  inputs with f = 0 do not count
    centre = torch.einsum("...i,...icd->...cd", weights.squeeze(-1), mu.detach()).unsqueeze(-3)  # [..., 1, C, D]
    x = mu - centre  # [..., I, C, D]  (centred on the f-weighted mean; the result does not depend on it)
    B_c = torch.matmul(centre, W) + B  # [..., J, C, E]  V_ij = x_i W_j + B_c_j
    X = x.flatten(-2)  # [..., I, C*D]
    XX = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-3)  # [..., I, C*D*D]  x_i[c, d] x_i[c, f]
    a_out = mu_out = sigma2 = log_p = None
    for t in range(iterations):
        # E-step: each input's shares R_ij over the outputs (sum to 1 over j).
        if t == 0:
            R = mu.new_full((*mu.shape[:-3], I, J), 1.0 / J)  # [..., I, J]
        else:
            R = torch.softmax(F.logsigmoid(a_out).unsqueeze(-2) + log_p, dim=-1)  # [..., I, J]

        # D-step.
        D_use = f_a_inp * R  # [..., I, J]
        D_sum = D_use.sum(dim=-2)  # [..., J]  sum_i D_use_ij

        # M-step from the weighted moments of the inputs.
        a_out = b_use * D_sum - b_ign * (f_sum - D_sum)  # [..., J]  (sum_i D_ign_ij = sum_i f_i - D_sum_j)
        D_t = D_use.transpose(-1, -2)  # [..., J, I]
        S = D_sum[..., None, None]  # [..., J, 1, 1]
        over = 1.0 / (S + eps)  # [..., J, 1, 1]
        MW = torch.einsum("...jcd,jde->...jce", (D_t @ X).unflatten(-1, (C, D)), W)  # [..., J, C, E]  sum_i D x_i W
        mu_out = (MW + B_c * S) * over  # [..., J, C, E]
        K = mu_out - B_c  # [..., J, C, E]  V_ij - mu_out_j = x_i W_j - K_j
        Q = (D_t @ XX).unflatten(-1, (C, D, D))  # [..., J, C, D, D]  sum_i D x_i[c] (x) x_i[c]
        sum_sq = torch.einsum("...jcdf,jde,jfe->...jce", Q, W, W)  # [..., J, C, E]  sum_i D (x_i W_j)^2
        sigma2 = (sum_sq - 2.0 * K * MW + K.square() * S).clamp_min(0.0) * over + eps  # [..., J, C, E]

        # Agreements for the next E-step: -sum_{c,e} lam_jce (x_i W_j - K_j)^2_ce as a quadratic form in x_i.
        if t < iterations - 1:
            lam = 0.5 / sigma2 if p_model == "gaussian" else torch.ones_like(sigma2)  # [..., J, C, E]
            A = torch.einsum("jde,jfe,...jce->...jcdf", W, W, lam).flatten(-3)  # [..., J, C*D*D]
            G = torch.einsum("jde,...jce->...jcd", W, K * lam).flatten(-2)  # [..., J, C*D]
            const = (K.square() * lam).sum(dim=(-2, -1))  # [..., J]
            quad = XX @ A.transpose(-1, -2) - 2.0 * (X @ G.transpose(-1, -2)) + const.unsqueeze(-2)  # [..., I, J]
            if p_model == "gaussian":
                log_p = -quad - 0.5 * torch.log(sigma2).sum(dim=(-2, -1)).unsqueeze(-2)  # [..., I, J]
            else:
                log_p = torch.log_softmax(-quad, dim=-1)  # [..., I, J]  soft k-means
    return a_out, mu_out, sigma2


def generative_matrix_routing(
    a_inp: torch.Tensor,
    mu_inp: torch.Tensor,
    W: torch.Tensor,
    B: torch.Tensor,
    beta_use: torch.Tensor,
    beta_ign: torch.Tensor,
    iterations: int = 3,
    p_model: str = "gaussian",
    eps: float = 1e-5,
    *,
    method: str = "auto",
    return_routing: bool = False,
):
    """Heinsen (2019) routing of matrix capsules: ``(a_inp [..., I], mu_inp [..., I, C, D])`` ->
    ``(a_out [..., J], mu_out [..., J, C, E], sigma2_out [..., J, C, E])``.

    The loop (spec section 4.1), with ``f = sigmoid(a_inp)``::

        E-step  t = 0: R_ij = 1/J;  t > 0: R_ij = softmax_j( log sigmoid(a_out_j) + log p_ij )
        D-step  D_use_ij = f_i R_ij;  D_ign_ij = f_i - D_use_ij
        M-step  a_out_j  = sum_i beta_use_ij D_use_ij - sum_i beta_ign_ij D_ign_ij      (logits)
                mu_j     = sum_i D_use_ij V_ij / (sum_i D_use_ij + eps)
                sigma2_j   = sum_i D_use_ij (V_ij - mu_j)^2 / (sum_i D_use_ij + eps) + eps

    ``a_out`` are logits, meant to be fed straight into a cross-entropy.

    Parameters
    ----------
    a_inp
        input scores as **logits** (``f(a) = sigmoid(a)``; ``+-inf`` allowed, e.g. ``logit(mask)``).
    mu_inp
        input capsules, ``d_cov x d_inp`` matrices.
    W
        ``[I or 1, J, d_inp, d_out]`` transformation matrices (first size 1 = shared by all inputs).
    B
        ``[I or 1, J, d_cov, d_out]`` vote biases.
    beta_use, beta_ign
        ``[I or 1, J]`` net benefit of using / net cost of ignoring a unit of data.
    iterations
        routing iterations ``T`` (>= 1; the paper uses 3).
    p_model
        ``"gaussian"`` (Gaussian mixture) or ``"skm"`` (soft k-means) for ``log p_ij``.
    eps
        added to ``sum_i D_use_ij`` and to the variances.
    method
        ``"votes"`` forms the votes ``V [..., I, J, C, E]`` and runs the loop on them; ``"moments"`` (only when
        ``W``, ``B`` and the betas are shared by all inputs, first size 1, and without a trace) runs the same
        loop on weighted moments of the inputs, in float64, without forming the votes (much faster and smaller
        for many inputs on the CPU; see ``_shared_weight_routing``); ``"auto"`` (default) picks ``"moments"`` when
        it applies on the CPU, ``"votes"`` elsewhere.
    return_routing
        also return a :class:`RoutingTrace` (``algorithm="heinsen"``) holding, per iteration,
        ``coefficients`` R ``[..., I, J]`` (t = 0 is the uniform 1/J), ``agreements`` log p_ij ``[..., I, J]``
        computed from that iteration's outputs, ``outputs`` mu_out, ``activations`` a_out, and in ``extra``
        the lists ``D_use``, ``D_ign``, ``sigma2`` plus the ``votes`` V ``[..., I, J, C, E]``.
    """
    if p_model not in _P_MODELS:
        raise ValueError(f"p_model must be one of {_P_MODELS}, got {p_model!r}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    check_tensor(mu_inp, "mu_inp", "[..., n_inp, d_cov, d_inp]", [None, None, None], min_leading=0)
    I, C, D = mu_inp.shape[-3:]
    lead = mu_inp.shape[:-3]
    check_tensor(a_inp, "a_inp", f"[..., n_inp={I}]", [I], min_leading=0)
    if a_inp.shape != (*lead, I):
        raise ValueError(
            f"a_inp: expected shape [..., n_inp] = {(*lead, I)} to match mu_inp "
            f"{tuple(mu_inp.shape)}, got {tuple(a_inp.shape)}"
        )
    check_tensor(W, "W", f"[n_inp or 1, n_out, d_inp={D}, d_out]", [None, None, D, None])
    J, E = W.shape[1], W.shape[3]
    _check_one_or(W, "W", f"[n_inp={I} or 1, n_out, d_inp={D}, d_out]", I, [J, D, E])
    _check_one_or(B, "B", f"[n_inp={I} or 1, n_out={J}, d_cov={C}, d_out={E}]", I, [J, C, E])
    _check_one_or(beta_use, "beta_use", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    _check_one_or(beta_ign, "beta_ign", f"[n_inp={I} or 1, n_out={J}]", I, [J])

    out_dtype = mu_inp.dtype
    ct = _compute_dtype(out_dtype)
    trace = RoutingTrace("heinsen") if return_routing else None
    shared = all(p.shape[0] == 1 for p in (W, B, beta_use, beta_ign))
    if method == "auto":  # the moments path was measured faster on the CPU only (routing/_common.KERNEL_DEVICES)
        method = "moments" if shared and trace is None and kernel_device(mu_inp) else "votes"
    elif method == "moments" and not (shared and trace is None):
        raise ValueError(
            "method='moments' needs W, B, beta_use and beta_ign shared by all inputs (first size 1) "
            "and return_routing=False (the trace holds the votes); use method='votes' or 'auto'"
        )
    with _no_autocast(mu_inp):
        mu = mu_inp.to(ct)
        f_a_inp = torch.sigmoid(a_inp.to(ct)).unsqueeze(-1)  # [..., I, 1]
        if method == "moments":
            # the expanded squares in float64: they cancel when inputs span many scales (_shared_weight_routing)
            acc = ct if mu.device.type == "mps" else torch.float64  # (MPS has no float64)
            W0, B0, bu0, bi0 = (p[0].to(acc) for p in (W, B, beta_use, beta_ign))  # [J, D, E], [J, C, E], [J] x2
            out = _shared_weight_routing(f_a_inp.to(acc), mu.to(acc), W0, B0, bu0, bi0, iterations, p_model, eps)
            return tuple(o.to(out_dtype) for o in out)
        V = heinsen_votes(mu, W.to(ct), B.to(ct))  # [..., I, J, C, E]
        b_use = beta_use.to(ct).expand(I, J)  # [I, J]
        b_ign = beta_ign.to(ct).expand(I, J)  # [I, J]
        a_out = mu_out = sigma2_out = log_p = None
        for t in range(iterations):
            # E-step: each input's shares R_ij over the outputs (sum to 1 over j).
            if t == 0:
                R = V.new_full((*lead, I, J), 1.0 / J)  # [..., I, J]
            else:
                R = torch.softmax(F.logsigmoid(a_out).unsqueeze(-2) + log_p, dim=-1)  # [..., I, J]

            # D-step: data used / ignored by each output.
            D_use = f_a_inp * R  # [..., I, J]
            D_ign = f_a_inp - D_use  # [..., I, J]

            # M-step: "bang per bit" activations and the weighted Gaussian of the votes.
            a_out = (b_use * D_use).sum(dim=-2) - (b_ign * D_ign).sum(dim=-2)  # [..., J]
            over_D_use_sum = (1.0 / (D_use.sum(dim=-2) + eps))[..., None, None]  # [..., J, 1, 1]
            mu_out = torch.einsum("...ij,...ijce->...jce", D_use, V) * over_D_use_sum  # [..., J, C, E]
            V_less_mu_out_2 = (V - mu_out.unsqueeze(-4)) ** 2  # [..., I, J, C, E]
            sigma2_out = (
                torch.einsum("...ij,...ijce->...jce", D_use, V_less_mu_out_2) * over_D_use_sum + eps
            )  # [..., J, C, E]

            # Agreement of every vote with the new outputs (the next E-step's log-likelihoods).
            if t < iterations - 1 or trace is not None:
                log_p = _log_p(V_less_mu_out_2, sigma2_out, p_model)  # [..., I, J]
            if trace is not None:
                trace.coefficients.append(R)
                trace.agreements.append(log_p)
                trace.outputs.append(mu_out.to(out_dtype))
                trace.activations.append(a_out.to(out_dtype))
                trace.extra.setdefault("D_use", []).append(D_use)
                trace.extra.setdefault("D_ign", []).append(D_ign)
                trace.extra.setdefault("sigma2", []).append(sigma2_out.to(out_dtype))
    outputs = (a_out.to(out_dtype), mu_out.to(out_dtype), sigma2_out.to(out_dtype))
    if trace is not None:
        trace.extra["votes"] = V
        trace.extra["f_a_inp"] = f_a_inp.squeeze(-1)
        return outputs, trace
    return outputs


class GenerativeMatrixRouting(nn.Module):
    """Heinsen (2019) routing (the paper's ``Routing`` class): matrix capsules with scores, Gaussian mixture.

    ``forward(a_inp [..., n_inp], mu_inp [..., n_inp, d_cov, d_inp], n_out=None, return_routing=False)``
    -> ``(a_out [..., n_out], mu_out [..., n_out, d_cov, d_out], sigma2_out [..., n_out, d_cov, d_out])``,
    or ``(that tuple, RoutingTrace)`` with ``return_routing=True``. ``a_inp`` and ``a_out`` are **logits**.

    Arguments (2019 order: ``d_cov, d_inp, d_out, n_inp=-1, n_out=-1, ...``; the 2022 package
    ``heinsen_routing.GenerativeMatrixRouting`` puts ``n_inp, n_out`` first, so prefer keywords):

    * ``n_inp=-1``: any number of inputs; ``W``, ``B`` and the betas have first size ``I' = 1`` and are shared by
      every input (the smallNORB model's first routing: ``W [1, 64, 4, 4]`` for 5184 inputs).
    * ``n_out=-1``: the number of outputs is passed to ``forward(..., n_out=J)`` (default: ``n_inp``);
      ``W``, ``B`` and the betas are shared across outputs and ``B`` gets ``B_brk * linspace(-1, 1, J)`` to
      break the symmetry (``B_brk [1, d_cov, d_out]``, init 0). The 2022 package dropped this variant.
    * ``single_beta``: ``beta_ign`` is the same parameter as ``beta_use``.
    * ``method``: how the loop is computed (``"auto"``, ``"votes"``, ``"moments"``), see
      :func:`generative_matrix_routing`; the result is the same.

    Parameters, as in the paper's code: ``W [I', J', d_inp, d_out] ~ N(0, 1) / d_inp``,
    ``B [I', J', d_cov, d_out] = 0``, ``beta_use``, ``beta_ign [I', J'] = 0`` (``J' = 1`` if ``n_out=-1``).
    The state-dict keys (``W``, ``B``, ``B_brk``, ``beta_use``, ``beta_ign`` and the buffer ``CONST_one``) are the
    original ones, so the published state_dicts load.
    """

    def __init__(
        self,
        d_cov: int,
        d_inp: int,
        d_out: int,
        n_inp: int = -1,
        n_out: int = -1,
        iterations: int = 3,
        single_beta: bool = False,
        p_model: str = "gaussian",
        eps: float = 1e-5,
        method: str = "auto",
    ) -> None:
        super().__init__()
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        if p_model not in _P_MODELS:
            raise ValueError(f"p_model must be one of {_P_MODELS}, got {p_model!r}")
        if not (n_inp > 0 or n_inp == -1) or not (n_out > 0 or n_out == -1):
            raise ValueError(f"n_inp and n_out must be > 0 or -1 (variable), got {n_inp}, {n_out}")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.d_cov, self.d_inp, self.d_out, self.n_inp, self.n_out = d_cov, d_inp, d_out, n_inp, n_out
        self.iterations, self.single_beta, self.p_model, self.eps = iterations, single_beta, p_model, eps
        self.method = method
        i1, j1 = max(1, n_inp), max(1, n_out)
        self.register_buffer("CONST_one", torch.tensor(1.0))  # unused; kept for state-dict compatibility
        self.W = nn.Parameter(torch.randn(i1, j1, d_inp, d_out) / d_inp)
        self.B = nn.Parameter(torch.zeros(i1, j1, d_cov, d_out))
        if n_out == -1:
            self.B_brk = nn.Parameter(torch.zeros(1, d_cov, d_out))
        self.beta_use = nn.Parameter(torch.zeros(i1, j1))
        self.beta_ign = self.beta_use if single_beta else nn.Parameter(torch.zeros(i1, j1))

    def expanded_parameters(self, n_out: int | None = None, n_inp: int | None = None):
        """``(W, B, beta_use, beta_ign)`` expanded to ``n_out`` outputs (symmetry breaker added to ``B``)."""
        if self.n_out > 0:
            if n_out is not None and n_out != self.n_out:
                raise ValueError(f"n_out is fixed at {self.n_out} for this routing; got n_out={n_out}")
            return self.W, self.B, self.beta_use, self.beta_ign
        if n_out is None:
            if n_inp is None:
                raise ValueError("this routing has a variable n_out: pass n_out=...")
            n_out = n_inp
        if n_out < 1:
            raise ValueError(f"n_out must be >= 1, got {n_out}")
        ramp = torch.linspace(-1.0, 1.0, n_out, device=self.B.device, dtype=self.B.dtype)  # [J]
        W = self.W.expand(-1, n_out, -1, -1)  # [I', J, D, E]
        B = self.B + self.B_brk * ramp[:, None, None]  # [I', J, C, E]  break the symmetry between outputs
        return W, B, self.beta_use.expand(-1, n_out), self.beta_ign.expand(-1, n_out)

    def forward(
        self, a_inp: torch.Tensor, mu_inp: torch.Tensor, n_out: int | None = None, return_routing: bool = False
    ):
        check_module_input(mu_inp, self, type(self).__name__, dtype=False)
        I = self.n_inp if self.n_inp > 0 else None
        check_tensor(
            mu_inp,
            "mu_inp",
            f"[..., n_inp={I or '*'}, d_cov={self.d_cov}, d_inp={self.d_inp}]",
            [I, self.d_cov, self.d_inp],
            min_leading=0,
        )
        W, B, b_use, b_ign = self.expanded_parameters(n_out, mu_inp.shape[-3])
        return autocast_outputs(
            generative_matrix_routing(
                a_inp,
                mu_inp,
                W,
                B,
                b_use,
                b_ign,
                self.iterations,
                self.p_model,
                self.eps,
                method=self.method,
                return_routing=return_routing,
            ),
            mu_inp.device.type,
        )

    def extra_repr(self) -> str:
        return (
            f"d_cov={self.d_cov}, d_inp={self.d_inp}, d_out={self.d_out}, n_inp={self.n_inp}, "
            f"n_out={self.n_out}, iterations={self.iterations}, single_beta={self.single_beta}, "
            f"p_model={self.p_model!r}, eps={self.eps}, method={self.method!r}"
        )


# ------------------------------------------------------------------------------ 2022: vector routing
def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``N``: LayerNorm over the last axis without affine parameters; identity for ``d_out = 1``."""
    return F.layer_norm(x, x.shape[-1:], eps=eps) if x.shape[-1] > 1 else x


def efficient_vector_routing(
    x_inp: torch.Tensor,
    W_A: torch.Tensor,
    B_A: torch.Tensor,
    W_F1: torch.Tensor,
    W_F2: torch.Tensor,
    B_F2: torch.Tensor,
    W_G1: torch.Tensor,
    W_G2: torch.Tensor,
    B_G2: torch.Tensor,
    W_S: torch.Tensor,
    B_S: torch.Tensor,
    beta_use: torch.Tensor,
    beta_ign: torch.Tensor,
    iterations: int = 2,
    *,
    normalize: bool = True,
    memory_efficient: bool = True,
    mask: torch.Tensor | None = None,
    ln_eps: float = 1e-5,
    return_routing: bool = False,
):
    """Heinsen (2022) efficient vector routing: ``x_inp [..., I, d_inp] -> x_out [..., J, d_out]``.

    In the shapes of the parameters, ``I' = I``, or 1 when shared by a variable number of inputs.

    The loop (spec section 4.2)::

        E-step  t = 0: R_ij = 1/J;  t > 0: R_ij = softmax_j(S_ij)
        D-step  D_use_ij = sigmoid(a_i) R_ij;  D_ign_ij = sigmoid(a_i) - D_use_ij
        M-step  phi_ij = beta_use_ij D_use_ij - beta_ign_ij D_ign_ij       ("bang per bit", credit assignment)
                x_out_j = sum_i phi_ij V_ij
        after the loop: x_out = N(x_out) if normalize

    Parameters
    ----------
    W_A, B_A
        W_A ``[I', d_inp]``, B_A ``[I']``: input activations ``a_i = x~_i . W_A,i + B_A,i`` with
        ``x~ = x / sqrt(I)``.
    W_F1, W_F2, B_F2
        W_F1 ``[J, d_inp]``, W_F2 ``[d_inp, d_out]``, B_F2 ``[J, d_out]``: votes
        ``V_ij = (x~_i * W_F1,j) W_F2 + B_F2,j``.
    W_G1, W_G2, B_G2
        W_G1 ``[d_out, d_inp]``, W_G2 ``[J, d_inp]``, B_G2 ``[J, d_inp]``: predictions of the inputs
        ``pred_j = (N(x_out_j) W_G1) * W_G2,j + B_G2,j``.
    W_S, B_S
        W_S ``[I', J]``, B_S ``[I', J]``: agreements ``S_ij = log sigmoid((x_i . pred_j) W_S,ij + B_S,ij)``
        (unscaled x).
    beta_use, beta_ign
        ``[I, J]`` or per example ``[..., I, J]`` (``Linear(d_inp -> J)`` of x when ``n_inp = -1``).
    iterations
        iterations (>= 1; the paper uses 2). ``iterations=1`` works here, trace included (the public
        ``return_dict=True`` path raises ``UnboundLocalError`` for ``iterations=1``).
    normalize
        apply ``N`` (LayerNorm without affine, identity when ``d_out = 1``) to the final outputs.
    memory_efficient
        never materialise ``V [..., I, J, d_out]``; contract ``phi`` with ``x~`` first
        (same result up to rounding).
    mask
        optional bool ``[I, J]`` or batch-broadcastable ``[..., I, J]``; **True = ignore the pair**. A masked
        pair gets ``a = -inf`` (so ``D_use = D_ign = phi = 0``) and routing logit ``-inf``; for a padding mask
        ``pad [B, I]`` pass ``pad[..., None]``. An input masked for every output gets all-zero ``R``. Masked
        input values must be finite (they are multiplied by 0).
    return_routing
        also return a :class:`RoutingTrace` (``algorithm="heinsen_vector"``) with per-iteration
        ``coefficients`` R ``[..., I, J]`` (t = 0 uniform), ``agreements`` S ``[..., I, J]`` (the log-sigmoid
        logits computed from that iteration's outputs), ``outputs`` x_out ``[..., J, d_out]`` (normalised if
        ``normalize``), and in ``extra`` the lists ``phi``, ``D_use``, ``D_ign``, ``pred_x_inp`` plus ``a_inp``
        ``[..., I]`` (and ``V`` when not ``memory_efficient``).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    check_tensor(x_inp, "x_inp", "[..., n_inp, d_inp]", [None, None], min_leading=0)
    I, D = x_inp.shape[-2:]
    lead = x_inp.shape[:-2]
    check_tensor(B_F2, "B_F2", "[n_out, d_out]", [None, None])
    J, E = B_F2.shape
    _check_one_or(W_A, "W_A", f"[n_inp={I} or 1, d_inp={D}]", I, [D])
    _check_one_or(B_A, "B_A", f"[n_inp={I} or 1]", I, [])
    check_tensor(W_F1, "W_F1", f"[n_out={J}, d_inp={D}]", [J, D])
    check_tensor(W_F2, "W_F2", f"[d_inp={D}, d_out={E}]", [D, E])
    check_tensor(W_G1, "W_G1", f"[d_out={E}, d_inp={D}]", [E, D])
    check_tensor(W_G2, "W_G2", f"[n_out={J}, d_inp={D}]", [J, D])
    check_tensor(B_G2, "B_G2", f"[n_out={J}, d_inp={D}]", [J, D])
    _check_one_or(W_S, "W_S", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    _check_one_or(B_S, "B_S", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    for name, b in (("beta_use", beta_use), ("beta_ign", beta_ign)):
        check_tensor(b, name, f"[..., n_inp={I}, n_out={J}]", [I, J], min_leading=0)
    mask = _check_mask(mask, lead, I, J)

    out_dtype = x_inp.dtype
    ct = _compute_dtype(out_dtype)
    trace = RoutingTrace("heinsen_vector") if return_routing else None
    with _no_autocast(x_inp):
        x = x_inp.to(ct)  # [..., I, D]
        W_A, B_A, W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S, B_S, beta_use, beta_ign = (
            p.to(ct) for p in (W_A, B_A, W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S, B_S, beta_use, beta_ign)
        )
        W_A, B_A = W_A.expand(I, D), B_A.expand(I)  # [I, D], [I]
        W_S, B_S = W_S.expand(I, J), B_S.expand(I, J)  # [I, J], [I, J]
        scaled_x_inp = x * I**-0.5  # [..., I, D]  x~ = x / sqrt(I)
        a_inp = torch.einsum("...id,id->...i", scaled_x_inp, W_A) + B_A  # [..., I]
        f_a_inp = torch.sigmoid(a_inp).unsqueeze(-1)  # [..., I, 1]
        if mask is not None:
            f_a_inp = torch.where(mask, 0.0, f_a_inp)  # [..., I, J]  a = -inf on masked pairs
        V = None
        if not memory_efficient:
            V = torch.einsum("...id,jd,de->...ije", scaled_x_inp, W_F1, W_F2) + B_F2  # [..., I, J, E]
        S = x_out = None
        for t in range(iterations):
            # E-step: shares of each input over the outputs.
            if t == 0:
                R = _masked_softmax(x.new_zeros((*lead, I, J)), mask)  # [..., I, J]  uniform 1/J
            else:
                R = _masked_softmax(S, mask)  # [..., I, J]

            # D-step.
            D_use = f_a_inp * R  # [..., I, J]
            D_ign = f_a_inp - D_use  # [..., I, J]

            # M-step.
            phi = beta_use * D_use - beta_ign * D_ign  # [..., I, J]  "bang per bit" credit assignments
            if V is None:  # sum_i phi_ij V_ij without materialising V
                phi_x = torch.einsum("...ij,...id->...jd", phi, scaled_x_inp)  # [..., J, D]
                x_out = torch.einsum("...jd,jd,de->...je", phi_x, W_F1, W_F2) + torch.einsum(
                    "...ij,je->...je", phi, B_F2
                )  # [..., J, E]
            else:
                x_out = torch.einsum("...ij,...ije->...je", phi, V)  # [..., J, E]

            # Agreements with the new outputs (the next E-step's logits).
            if t < iterations - 1 or trace is not None:
                pred_x_inp = (
                    torch.einsum("...je,ed,jd->...jd", _normalize(x_out, ln_eps), W_G1, W_G2) + B_G2
                )  # [..., J, D]
                S = F.logsigmoid(torch.einsum("...id,...jd->...ij", x, pred_x_inp) * W_S + B_S)  # [..., I, J]
            if trace is not None:
                trace.coefficients.append(R)
                trace.agreements.append(S)
                shown = _normalize(x_out, ln_eps) if normalize else x_out
                trace.outputs.append(shown.to(out_dtype))
                trace.extra.setdefault("phi", []).append(phi)
                trace.extra.setdefault("D_use", []).append(D_use)
                trace.extra.setdefault("D_ign", []).append(D_ign)
                trace.extra.setdefault("pred_x_inp", []).append(pred_x_inp)
        if normalize:
            x_out = _normalize(x_out, ln_eps)  # [..., J, E]
    x_out = x_out.to(out_dtype)
    if trace is not None:
        trace.extra["a_inp"] = a_inp
        if V is not None:
            trace.extra["V"] = V
        return x_out, trace
    return x_out


class EfficientVectorRouting(nn.Module):
    """Heinsen (2022) ``EfficientVectorRouting``: ``x_inp [..., n_inp, d_inp] -> x_out [..., n_out, d_out]``.

    ``forward(x_inp, mask=None, return_routing=False)``; see :func:`efficient_vector_routing` for the
    algorithm, the mask (bool, True = ignore, ``[n_inp, n_out]`` or batch-broadcastable) and the trace.

    Parameters and inits (spec section 4.2; names as in the ``heinsen_routing`` package, so its state_dicts
    load; ``I' = n_inp``, or 1 if ``n_inp = -1``):
    ``W_A [I', d_inp] ~ N(0, (2/sqrt(d_inp))^2)``, ``B_A [I'] = 0``; ``W_F1 [J, d_inp] ~ N(0, 1)``,
    ``W_F2 [d_inp, d_out]`` std ``2/sqrt(d_inp)``, ``B_F2 [J, d_out] = 0``; ``W_G1 [d_out, d_inp]`` std
    ``1/sqrt(d_out)``, ``W_G2 [J, d_inp] ~ N(0, 1)``, ``B_G2 [J, d_inp] = 0``; ``W_S [I', J]`` std
    ``1/sqrt(d_inp)``, ``B_S [I', J] = 0``; ``beta_use``, ``beta_ign [n_inp, J] ~ N(0, 1)``, or, with
    ``n_inp = -1`` (variable length), ``compute_beta_use``/``compute_beta_ign = Linear(d_inp, J)`` applied to x.

    ``n_out >= 2`` (as in the package). ``iterations=1`` is supported, including ``return_routing=True`` (the
    public ``return_dict=True`` raises ``UnboundLocalError`` there). ``d_out = 1`` routes a sequence to
    ``n_out`` scalars (sequence -> vector).
    """

    def __init__(
        self,
        n_inp: int,
        n_out: int,
        d_inp: int,
        d_out: int,
        iterations: int = 2,
        normalize: bool = True,
        memory_efficient: bool = True,
    ) -> None:
        super().__init__()
        if not (n_inp > 0 or n_inp == -1):
            raise ValueError(f"n_inp must be > 0 or -1 (variable), got {n_inp}")
        if n_out < 2:
            raise ValueError(f"n_out must be >= 2, got {n_out}")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.n_inp, self.n_out, self.d_inp, self.d_out, self.iterations = n_inp, n_out, d_inp, d_out, iterations
        self.normalize, self.memory_efficient = normalize, memory_efficient
        i1 = max(1, n_inp)
        self.register_buffer("CONST_ones_over_n_out", torch.ones(n_out) / n_out)  # state-dict compatibility
        self.W_A = nn.Parameter(torch.randn(i1, d_inp) * (2.0 / math.sqrt(d_inp)))
        self.B_A = nn.Parameter(torch.zeros(i1))
        self.W_F1 = nn.Parameter(torch.randn(n_out, d_inp))
        self.W_F2 = nn.Parameter(torch.randn(d_inp, d_out) * (2.0 / math.sqrt(d_inp)))
        self.B_F2 = nn.Parameter(torch.zeros(n_out, d_out))
        self.W_G1 = nn.Parameter(torch.randn(d_out, d_inp) / math.sqrt(d_out))
        self.W_G2 = nn.Parameter(torch.randn(n_out, d_inp))
        self.B_G2 = nn.Parameter(torch.zeros(n_out, d_inp))
        self.W_S = nn.Parameter(torch.randn(i1, n_out) / math.sqrt(d_inp))
        self.B_S = nn.Parameter(torch.zeros(i1, n_out))
        if n_inp > 0:
            self.beta_use = nn.Parameter(torch.randn(n_inp, n_out))
            self.beta_ign = nn.Parameter(torch.randn(n_inp, n_out))
        else:
            self.compute_beta_use = nn.Linear(d_inp, n_out)
            self.compute_beta_ign = nn.Linear(d_inp, n_out)

    def betas(self, x_inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(beta_use, beta_ign)``: the ``[n_inp, n_out]`` parameters, or ``[..., n, n_out]`` from x if variable."""
        if self.n_inp > 0:
            return self.beta_use, self.beta_ign
        ct = _compute_dtype(x_inp.dtype)
        with _no_autocast(x_inp):
            x = x_inp.to(ct)
            return tuple(
                F.linear(x, m.weight.to(ct), m.bias.to(ct))  # [..., I, J]
                for m in (self.compute_beta_use, self.compute_beta_ign)
            )

    def forward(self, x_inp: torch.Tensor, mask: torch.Tensor | None = None, return_routing: bool = False):
        check_module_input(x_inp, self, type(self).__name__, dtype=False)
        I = self.n_inp if self.n_inp > 0 else None
        check_tensor(x_inp, "x_inp", f"[..., n_inp={I or '*'}, d_inp={self.d_inp}]", [I, self.d_inp], min_leading=0)
        beta_use, beta_ign = self.betas(x_inp)
        return autocast_outputs(
            efficient_vector_routing(
                x_inp,
                self.W_A,
                self.B_A,
                self.W_F1,
                self.W_F2,
                self.B_F2,
                self.W_G1,
                self.W_G2,
                self.B_G2,
                self.W_S,
                self.B_S,
                beta_use,
                beta_ign,
                self.iterations,
                normalize=self.normalize,
                memory_efficient=self.memory_efficient,
                mask=mask,
                return_routing=return_routing,
            ),
            x_inp.device.type,
        )

    def extra_repr(self) -> str:
        return (
            f"n_inp={self.n_inp}, n_out={self.n_out}, d_inp={self.d_inp}, d_out={self.d_out}, "
            f"iterations={self.iterations}, normalize={self.normalize}, memory_efficient={self.memory_efficient}"
        )
