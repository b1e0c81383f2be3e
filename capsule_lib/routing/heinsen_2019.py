"""Heinsen (2019) generative *matrix* routing: "An Algorithm for Routing Capsules in All Domains", arXiv 1911.00792.

:func:`generative_matrix_routing_reference` is the algorithm as the paper writes it, a step per line;
:func:`generative_matrix_routing` / :class:`GenerativeMatrixRouting` (the 2019 ``Routing`` class) compute the same
values and gradients (tested in float64) with shared or per-input weights, both probability models, a trace, and on
the CPU, when the weights are shared by every input, the moments kernel (``routing/_kernels/heinsen.py``), which
never forms the votes.

Every output capsule ``j`` competes for a share ``R_ij`` of every input ``i`` (the shares sum to 1 over the outputs),
an input's activation ``f(a_i) = sigmoid(a_i)`` is split into data that output ``j`` *uses*, ``D_use_ij = f(a_i)
R_ij``, and data it *ignores*, ``D_ign_ij = f(a_i) - D_use_ij``, and each output maximises "bang per bit"
``beta_use D_use - beta_ign D_ign``. Nothing is detached: gradients flow through every iteration.

Index names used in every einsum below::

    b  batch                  i  input capsule          j  output capsule
    c  pose rows (d_cov)      d  input pose columns (d_inp)      e  output pose columns (d_out)
    ...  any number of leading (batch-like) dimensions

Numerics: the routing body runs with autocast disabled, in float32 (float64 stays float64), and the
results are cast back to the input dtype, so the routing is safe under fp16/bf16 autocast, on zero inputs
and on inputs scaled by 1e3. Input logits of ``+-inf`` (the 2019 SST model's ``logit(mask)``) are fine.

Differences from the public code (glassroom/heinsen_routing), none of which changes the math:

* internals in float32 with autocast off (the public code runs in whatever dtype it is given);
* ``return_routing=True`` returns a :class:`RoutingTrace` with every iteration (the public ``return_R`` gives the
  final state only); the trace also holds the agreements computed after the last iteration;
* the symmetry breaker ``linspace(-1, 1, n_out)`` is built in the parameters' dtype (float32 in the
  public code, a ~1e-8 difference in float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import (
    check_choice,
    check_iterations,
    check_module_input,
    check_no_nan,
    check_nonempty,
    check_tensor,
)
from .._contracts import checked
from ..types import Routed, RoutingTrace
from ._common import (
    RoutingProtocol,
    autocast_outputs,
    check_one_or,
    compute_dtype,
    fields_repr,
    no_autocast,
    require_activations,
    split_trace,
    use_kernel,
)

__all__ = [
    "generative_matrix_routing_reference",
    "generative_matrix_routing",
    "GenerativeMatrixRouting",
    "heinsen_votes",
]

_P_MODELS = ("gaussian", "skm")
_METHODS = ("auto", "votes", "moments")


def generative_matrix_routing_reference(
    a_inp: torch.Tensor,
    mu_inp: torch.Tensor,
    W: torch.Tensor,
    B: torch.Tensor,
    beta_use: torch.Tensor,
    beta_ign: torch.Tensor,
    iterations: int = 3,
    eps: float = 1e-5,
):
    """Heinsen (2019) routing as the paper writes it (Gaussian model).

    ``a_inp [B, n_inp]`` (logits), ``mu_inp [B, n_inp, d_cov, d_inp]``,
    ``W [n_inp, n_out, d_inp, d_out]``, ``B [n_inp, n_out, d_cov, d_out]``,
    ``beta_use``, ``beta_ign [n_inp, n_out]`` -> ``(a_out [B, n_out],
    mu_out [B, n_out, d_cov, d_out], sigma2 [B, n_out, d_cov, d_out])``.
    This is the definition: :func:`generative_matrix_routing` computes the
    same values and gradients (tested in float64).
    """
    f = torch.sigmoid(a_inp)[..., None]  # [B, i, 1] f(a_i)
    V = torch.einsum("bicd,ijde->bijce", mu_inp, W) + B  # [B, i, j, c, e]
    R = torch.full_like(V[..., 0, 0], 1.0 / V.shape[2])  # [B, i, j] 1/J
    for _ in range(iterations):
        D_use = f * R  # [B, i, j] D-step: data used
        D_ign = f - D_use  # [B, i, j] data ignored
        # M-step: "bang per bit" and each output's Gaussian
        used = torch.einsum("ij,bij->bj", beta_use, D_use)  # [B, j]
        a_out = used - torch.einsum("ij,bij->bj", beta_ign, D_ign)  # [B, j]
        over = 1 / (D_use.sum(1) + eps)[..., None, None]  # [B, j, 1, 1]
        mu_out = torch.einsum("bij,bijce->bjce", D_use, V) * over
        sq = (V - mu_out[:, None]) ** 2  # [B, i, j, c, e]
        sigma2 = torch.einsum("bij,bijce->bjce", D_use, sq) * over + eps
        # E-step (for the next iteration): shares by activation and
        # the log-likelihood of each vote, log p_ij (constant dropped)
        log_p = -torch.einsum("bijce,bjce->bij", sq, 0.5 / sigma2)
        log_p = log_p - 0.5 * sigma2.log().sum((2, 3))[:, None]  # [B, i, j]
        R = torch.softmax(F.logsigmoid(a_out)[:, None] + log_p, 2)
    return a_out, mu_out, sigma2


def heinsen_votes(mu_inp: torch.Tensor, W: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Votes ``V_ij = mu_i W_ij + B_ij``.

    A first size of 1 in ``W`` means one matrix shared by every input (variable ``n_inp``): then the votes are a
    single matmul.

    Parameters
    ----------
    mu_inp : torch.Tensor
        ``[..., n_inp, d_cov, d_inp]``, the input capsules ``mu_i``.
    W : torch.Tensor
        ``[n_inp or 1, n_out, d_inp, d_out]``, the transformation matrices.
    B : torch.Tensor
        ``[n_inp or 1, n_out, d_cov, d_out]``, the vote biases.

    Returns
    -------
    torch.Tensor
        ``V [..., n_inp, n_out, d_cov, d_out]``, a transposed view of a ``[..., n_out, n_inp, d_cov, d_out]``
        tensor: the routing's contractions over the inputs (means, variances) then run as plain batched matmuls
        over the outputs without copying ``V`` (this matters for the smallNORB model's 5184 x 64 votes).
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
    a_inp : torch.Tensor
        ``[..., I]``, input scores as **logits** (``f(a) = sigmoid(a)``; ``+-inf`` allowed, e.g. ``logit(mask)``).
    mu_inp : torch.Tensor
        ``[..., I, C, D]``, input capsules, ``d_cov x d_inp`` matrices.
    W : torch.Tensor
        ``[I or 1, J, d_inp, d_out]`` transformation matrices (first size 1 = shared by all inputs).
    B : torch.Tensor
        ``[I or 1, J, d_cov, d_out]`` vote biases.
    beta_use, beta_ign : torch.Tensor
        ``[I or 1, J]`` net benefit of using / net cost of ignoring a unit of data.
    iterations : int, optional
        Routing iterations ``T``, >= 1 (default 3, the paper's).
    p_model : str, optional
        ``"gaussian"`` (default, Gaussian mixture) or ``"skm"`` (soft k-means) for ``log p_ij``.
    eps : float, optional
        Added to ``sum_i D_use_ij`` and to the variances (default 1e-5).
    method : str, optional
        ``"votes"`` forms the votes ``V [..., I, J, C, E]`` and runs the loop on them; ``"moments"`` (only when
        ``W``, ``B`` and the betas are shared by all inputs, first size 1, and without a trace) runs the same
        loop on weighted moments of the inputs, in float64, without forming the votes (much faster and smaller
        for many inputs on the CPU; ``routing/_kernels/heinsen.py``); ``"auto"`` (default) picks ``"moments"`` when
        it applies and ``routing._common.use_kernel`` allows it (the CPU), ``"votes"`` elsewhere.
    return_routing : bool, optional
        Also return a :class:`RoutingTrace` (default False).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor, torch.Tensor] or tuple[tuple, RoutingTrace]
        ``(a_out [..., J], mu_out [..., J, C, E], sigma2_out [..., J, C, E])`` in ``mu_inp``'s dtype; with
        ``return_routing=True``, ``(that tuple, trace)``, the trace (``algorithm="heinsen_2019"``) holding, per
        iteration, ``coefficients`` R ``[..., I, J]`` (t = 0 is the uniform 1/J), ``agreements`` log p_ij
        ``[..., I, J]`` computed from that iteration's outputs, ``outputs`` mu_out, ``activations`` a_out, and in
        ``extra`` the lists ``D_use``, ``D_ign``, ``sigma2`` plus the ``votes`` V ``[..., I, J, C, E]`` and
        ``f_a_inp = sigmoid(a_inp)`` ``[..., I]``.
    """
    _check_inputs(a_inp, mu_inp, W, B, beta_use, beta_ign, iterations, p_model, method)
    I, J = mu_inp.shape[-3], W.shape[1]
    out_dtype = mu_inp.dtype
    ct = compute_dtype(out_dtype)
    trace = RoutingTrace("heinsen_2019") if return_routing else None
    method = _choose_method(method, mu_inp, (W, B, beta_use, beta_ign), trace is not None)
    with no_autocast(mu_inp):
        mu = mu_inp.to(ct)
        f_a_inp = torch.sigmoid(a_inp.to(ct)).unsqueeze(-1)  # [..., I, 1]
        if method == "moments":
            from ._kernels.heinsen import moments_routing

            # the expanded squares in float64: they cancel when inputs span many scales (routing/_kernels/heinsen.py)
            acc = ct if mu.device.type == "mps" else torch.float64  # (MPS has no float64)
            W0, B0, bu0, bi0 = (p[0].to(acc) for p in (W, B, beta_use, beta_ign))  # [J, D, E], [J, C, E], [J] x2
            out = moments_routing(f_a_inp.to(acc), mu.to(acc), W0, B0, bu0, bi0, iterations, p_model, eps)
            return tuple(o.to(out_dtype) for o in out)
        V = heinsen_votes(mu, W.to(ct), B.to(ct))  # [..., I, J, C, E]
        b_use = beta_use.to(ct).expand(I, J)  # [I, J]
        b_ign = beta_ign.to(ct).expand(I, J)  # [I, J]
        outputs = _route_votes(V, f_a_inp, b_use, b_ign, iterations, p_model, eps, trace, out_dtype)
    outputs = tuple(o.to(out_dtype) for o in outputs)
    if trace is not None:
        trace.extra["votes"] = V
        trace.extra["f_a_inp"] = f_a_inp.squeeze(-1)
        return outputs, trace
    return outputs


def _choose_method(method: str, mu_inp: torch.Tensor, params: tuple[torch.Tensor, ...], trace: bool) -> str:
    """``method`` resolved: ``"auto"`` takes the moments kernel where it exists, every parameter shared by all inputs
    (first size 1), and ``routing._common.use_kernel`` allows it (the CPU, no trace); any dtype
    (the kernel upcasts to float64 itself), under autocast (the routing runs with autocast off) and while
    ``torch.compile`` traces (plain tensor code). ``"votes"`` and ``"moments"`` are the caller's override;
    ``"moments"`` where it does not apply is refused in one line."""
    shared = all(p.shape[0] == 1 for p in params)
    if method == "auto":
        kernel = use_kernel(mu_inp, trace=trace, dtypes=None, autocast=True, compiling=True)
        return "moments" if shared and kernel else "votes"
    if method == "moments" and not (shared and not trace):
        raise ValueError(
            "method='moments' needs W, B, beta_use and beta_ign shared by all inputs (first size 1) "
            "and return_routing=False (the trace holds the votes); use method='votes' or 'auto'"
        )
    return method


def _check_inputs(a_inp, mu_inp, W, B, beta_use, beta_ign, iterations, p_model, method) -> None:
    """One-line errors for :func:`generative_matrix_routing`'s arguments."""
    check_choice(p_model, _P_MODELS, "p_model")
    check_choice(method, _METHODS, "method")
    check_iterations(iterations)
    check_tensor(mu_inp, "mu_inp", "[..., n_inp, d_cov, d_inp]", [None, None, None], min_leading=0)
    check_nonempty(mu_inp, "mu_inp", "[..., n_inp, d_cov, d_inp]", leading=mu_inp.dim() - 3)
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
    check_one_or(W, "W", f"[n_inp={I} or 1, n_out, d_inp={D}, d_out]", I, [J, D, E])
    check_one_or(B, "B", f"[n_inp={I} or 1, n_out={J}, d_cov={C}, d_out={E}]", I, [J, C, E])
    check_one_or(beta_use, "beta_use", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    check_one_or(beta_ign, "beta_ign", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    check_no_nan(a_inp, "a_inp")  # one NaN logit made every output NaN (EM refuses NaN activations too)


def _route_votes(
    V: torch.Tensor,
    f_a_inp: torch.Tensor,
    b_use: torch.Tensor,
    b_ign: torch.Tensor,
    iterations: int,
    p_model: str,
    eps: float,
    trace: RoutingTrace | None,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loop of :func:`generative_matrix_routing` on the votes ``V [..., I, J, C, E]`` (its plain path), as in
    :func:`generative_matrix_routing_reference`, with per-input or shared weights, both probability models and a
    trace (whose outputs are stored in ``out_dtype``). ``f_a_inp [..., I, 1]``, ``b_use``, ``b_ign [I, J]`` ->
    ``(a_out [..., J], mu_out [..., J, C, E], sigma2_out [..., J, C, E])`` in ``V``'s dtype."""
    a_out = mu_out = sigma2_out = log_p = None
    for t in range(iterations):
        # E-step: each input's shares R_ij over the outputs (sum to 1 over j).
        if t == 0:
            R = V.new_full(V.shape[:-2], 1.0 / V.shape[-3])  # [..., I, J]
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
    return a_out, mu_out, sigma2_out


class GenerativeMatrixRouting(RoutingProtocol, nn.Module):
    """Heinsen (2019) routing (the paper's ``Routing`` class): matrix capsules with scores, Gaussian mixture.

    ``forward(a_inp [..., n_inp], mu_inp [..., n_inp, d_cov, d_inp], n_out=None, return_routing=False)``
    -> ``(a_out [..., n_out], mu_out [..., n_out, d_cov, d_out], sigma2_out [..., n_out, d_cov, d_out])``,
    or ``(that tuple, RoutingTrace)`` with ``return_routing=True``. ``a_inp`` and ``a_out`` are **logits**.

    Weights, as in the paper's code: ``W [I', J', d_inp, d_out] ~ N(0, 1) / d_inp``,
    ``B [I', J', d_cov, d_out] = 0``, ``beta_use``, ``beta_ign [I', J'] = 0`` (``I' = 1`` if ``n_inp=-1``,
    ``J' = 1`` if ``n_out=-1``). The state-dict keys (``W``, ``B``, ``B_brk``, ``beta_use``, ``beta_ign`` and the
    buffer ``CONST_one``) are the original ones, so the published state_dicts load.

    Parameters
    ----------
    d_cov, d_inp, d_out : int
        Capsule matrices: inputs ``d_cov x d_inp``, outputs ``d_cov x d_out``. The 2019 order is
        ``d_cov, d_inp, d_out, n_inp=-1, n_out=-1, ...``; the 2022 package's
        ``heinsen_routing.GenerativeMatrixRouting`` puts ``n_inp, n_out`` first, so prefer keywords.
    n_inp : int, optional
        Number of inputs (> 0), or ``-1`` (default): any number; ``W``, ``B`` and the betas then have first size
        ``I' = 1`` and are shared by every input (the smallNORB model's first routing: ``W [1, 64, 4, 4]`` for
        5184 inputs).
    n_out : int, optional
        Number of outputs (> 0), or ``-1`` (default): passed to ``forward(..., n_out=J)`` (default: ``n_inp``);
        ``W``, ``B`` and the betas are shared across outputs and ``B`` gets ``B_brk * linspace(-1, 1, J)`` to
        break the symmetry (``B_brk [1, d_cov, d_out]``, init 0). The 2022 package dropped this variant.
    iterations : int, optional
        Routing iterations, >= 1 (default 3).
    single_beta : bool, optional
        If True, ``beta_ign`` is the same parameter as ``beta_use`` (default False).
    p_model : str, optional
        ``"gaussian"`` (default) or ``"skm"``, see :func:`generative_matrix_routing`.
    eps : float, optional
        As in :func:`generative_matrix_routing` (default 1e-5).
    method : str, optional
        How the loop is computed: ``"auto"`` (default), ``"votes"`` or ``"moments"``, see
        :func:`generative_matrix_routing`; the result is the same.
    """

    @checked
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
        check_choice(method, _METHODS, "method")
        check_choice(p_model, _P_MODELS, "p_model")
        if not (n_inp > 0 or n_inp == -1) or not (n_out > 0 or n_out == -1):
            raise ValueError(f"n_inp and n_out must be > 0 or -1 (variable), got {n_inp}, {n_out}")
        check_iterations(iterations)
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
        """``(W, B, beta_use, beta_ign)`` expanded to ``n_out`` outputs (symmetry breaker added to ``B``).

        Parameters
        ----------
        n_out : int or None, optional
            Number of outputs, >= 1. A layer built with a fixed ``n_out`` accepts only that (or ``None``); with
            ``n_out=-1`` ``None`` (default) means ``n_inp``.
        n_inp : int or None, optional
            Number of inputs, the default ``n_out`` of a layer with a variable ``n_out`` (default ``None``).

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
            ``W [I', J, d_inp, d_out]``, ``B [I', J, d_cov, d_out]``, ``beta_use``, ``beta_ign [I', J]``; the
            parameters themselves when ``n_out`` is fixed.
        """
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
        self,
        a_inp: torch.Tensor,
        mu_inp: torch.Tensor,
        n_out: int | None = None,
        return_routing: bool = False,
        iterations: int | None = None,
    ):
        """Route the input capsules to the output capsules.

        Parameters
        ----------
        a_inp : torch.Tensor
            ``[..., n_inp]``, input scores as logits.
        mu_inp : torch.Tensor
            ``[..., n_inp, d_cov, d_inp]``, the input capsules.
        n_out : int or None, optional
            Number of outputs, for a layer built with ``n_out=-1`` (see :meth:`expanded_parameters`).
        return_routing, iterations : optional
            Also return the :class:`RoutingTrace` (default False); routing iterations for this call (``None``, the
            default: the module's).

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor, torch.Tensor] or tuple[tuple, RoutingTrace]
            ``(a_out [..., n_out], mu_out [..., n_out, d_cov, d_out], sigma2_out [..., n_out, d_cov, d_out])``
            (the autocast dtype under autocast), or ``(that tuple, trace)`` with ``return_routing=True``.
        """
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
                self.iterations if iterations is None else iterations,
                self.p_model,
                self.eps,
                method=self.method,
                return_routing=return_routing,
            ),
            mu_inp.device.type,
        )

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> GenerativeMatrixRouting:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (``d_cov = 1``: ``1 x d`` matrices)."""
        return cls(d_cov=1, d_inp=d, d_out=d, n_inp=n_inp, n_out=n_out, iterations=iterations)

    def _input_width(self) -> int:
        return self.d_cov * self.d_inp  # a d_cov x d_inp matrix, flattened

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: :meth:`forward` on the poses as ``d_cov x d_inp`` matrices (flattened back
        after), activation logits in and out (the variances ``sigma2_out`` are in :meth:`forward`'s result)."""
        a_inp = require_activations(activations, self, "logits")
        mu_inp = poses.unflatten(-1, (self.d_cov, self.d_inp))  # [..., n_inp, d_cov, d_inp]
        out = self(a_inp, mu_inp, return_routing=return_routing, iterations=iterations)
        (a_out, mu_out, _), trace = split_trace(out, return_routing)  # [..., n_out], [..., n_out, d_cov, d_out]
        return Routed(mu_out.flatten(-2), a_out, trace)  # [..., n_out, d_cov * d_out], [..., n_out]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]``: one D-step and M-step."""
        a_inp = require_activations(activations, self, "logits")
        mu_inp = poses.unflatten(-1, (self.d_cov, self.d_inp))  # [B, i, c, d]
        W, B, b_use, b_ign = self.expanded_parameters(None, mu_inp.shape[-3])
        V = heinsen_votes(mu_inp, W, B)  # [B, i, j, c, e]
        D_use = torch.sigmoid(a_inp).unsqueeze(-1) * R.to(V.dtype)  # [B, i, j] data used
        D_ign = torch.sigmoid(a_inp).unsqueeze(-1) - D_use  # [B, i, j] data ignored
        a_out = (b_use * D_use).sum(-2) - (b_ign * D_ign).sum(-2)  # [B, j]
        mu_out = torch.einsum("bij,bijce->bjce", D_use, V) / (D_use.sum(-2) + self.eps)[..., None, None]
        return Routed(mu_out.flatten(-2), a_out, None)  # [B, j, c * e], [B, j]

    def extra_repr(self) -> str:
        return fields_repr(
            self, "d_cov", "d_inp", "d_out", "n_inp", "n_out", "iterations", "single_beta", "p_model", "eps", "method"
        )
