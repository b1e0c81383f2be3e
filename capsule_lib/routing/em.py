"""EM routing between matrix capsules (Hinton, Sabour & Frosst, ICLR 2018, "Matrix capsules with EM routing").

Index names used in every einsum below::

    b  batch            i  input (child) capsule      j  output (parent) capsule
    d  pose entry (d = P*P = 16 for 4x4 poses)        p, q, r  rows/columns of a P x P pose matrix
    h, w  output position (conv layers)               u, v  kernel offset      t  input capsule type

Each parent ``j`` is a diagonal Gaussian over the ``d`` pose entries; each child ``i`` votes ``V_ij`` for it.
Procedure 1 of the paper, per iteration ``t = 1..T`` (``R_ij = 1/J`` before the first)::

    M-step  R'_ij   = R_ij * a_i                                     (paper: NOT renormalised over j)
            mu_j    = sum_i R'_ij V_ij / sum_i R'_ij                 [B, J, d]
            sigma2_j  = sum_i R'_ij (V_ij - mu_j)^2 / sum_i R'_ij      [B, J, d]
            cost_jh = (beta_u + log sig_jh) * sum_i R'_ij            [B, J, d]
            a_j     = sigmoid(lambda_t * (beta_a - sum_h cost_jh))   [B, J]
    E-step  log p_ij = -1/2 sum_h [ (V_ijh - mu_jh)^2 / sigma2_jh + log sigma2_jh + log 2 pi ]
            R_ij     = softmax_j(log p_ij + log a_j)                 (sums to 1 over the PARENTS j)

The returned capsules are ``mu`` (poses) and ``a`` (activations) of the last M-step; the last E-step only feeds the
trace.

Numerics
--------
Everything runs in float32 (float64 for float64 votes) with autocast disabled: votes in fp16/bf16 are upcast and the
results are cast back to the votes' dtype. The E-step is done in log space: ``log a_j = logsigmoid(...)`` (never ``log``
of an underflowed sigmoid), the posterior is normalised with ``logsumexp``, and ``log sigma`` is ``1/2 log sigma2`` with
``sigma2 >= eps`` (no square root, whose gradient is infinite at 0). Sums of ``R'`` are guarded with ``+ eps``, so
parents that receive nothing (all ``a_i = 0``) get ``mu = 0``, ``sigma2 = eps``, cost 0. Under fp16 autocast, gradients
of very large inputs (x1e3) can exceed the fp16 range on their way back into fp16 tensors; that is fp16's range (use a
GradScaler), not a NaN of the routing.

Choices where the paper is silent or where we deviate (see also :func:`inverse_temperature_schedule`)
------------------------------------------------------------------------------------------------------
* **Inverse temperature schedule.** The paper gives no values for ``lambda``. The one published formula is Hinton's
  OpenReview answer, as quoted in Gritzman's IBM implementation (``em_routing.py``):
  ``lambda_t = final_lambda * (1 - 0.95**(t+1))`` with ``final_lambda = 0.01`` (not re-checked against OpenReview). We
  use that shape (``kind="hinton"``, increasing over iterations); see the next point for the value.
* **Cost normalisation** (``normalize_costs=True``, default). Raw costs grow with the number of children per parent
  (``~ n_inp / n_out``: 4.5 in a k3 conv layer with 8 input types and 16 output types, > 100 in the class layer), so one
  ``lambda`` cannot suit every layer. We multiply ``sum_i R'_ij`` by ``n_out / n_inp`` (the cost becomes one of an
  average-sized parent). IBM's code does the same up to a constant (``100 * n_out / n_inp``), so their
  ``final_lambda = 0.01`` equals our default ``final_lambda = 1.0``. This is a constant per layer (equivalent to
  rescaling ``lambda`` and ``beta_a``), not a data-dependent normalisation. ``normalize_costs=False`` gives the paper's
  raw costs (then use a ``lambda`` around ``1e-3 .. 1e-2``, as yl-1993 and the OpenReview answer do).
* **yl-1993 quirk** (``normalize_over_outputs=True``): yl-1993/Matrix-Capsules-EM-PyTorch renormalises
  ``R'_ij`` over the outputs ``j`` right after multiplying by ``a_i``, which cancels ``a_i`` exactly: input
  activations then have no effect on ``mu``, ``sigma`` or ``a_out``. Off by default; offered to compare.
  yl-1993 as a whole is ``normalize_over_outputs=True, normalize_costs=False, inverse_temperature=1e-3``.
* ``beta_u``, ``beta_a``: one per output capsule type (shared over positions), initialised to 0 (yl-1993;
  IBM draws ``beta_a`` from N(-1000, 500) at their cost scale, about -10 at ours).
* ``eps = 1e-8`` (yl-1993; IBM uses 1e-9) is both the variance floor and the denominator guard. When a parent's Gaussian
  collapses onto one child, ``log sig`` reaches ``1/2 log eps`` and its activation saturates; in small experiments 3
  iterations did this more often than 2 (yl-1993 and IBM both default to 2 iterations; the paper uses 3, our default). A
  larger ``eps`` (variance floor) or a smaller ``final_lambda`` are the knobs if it happens.
* Nothing is detached: gradients flow through every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_activations, check_choice, check_iterations, check_module_input, check_poses, check_tensor
from .._contracts import check_value
from ..types import Routed, RoutingTrace
from ._common import RoutingProtocol, require_activations, split_trace, use_kernel
from ._kernels.em import _EMRoutingFunction

__all__ = [
    "em_routing_reference",
    "em_routing",
    "EMRouting",
    "EMRoutingBase",
    "inverse_temperature_schedule",
    "matrix_votes",
]

LN_2PI = math.log(2.0 * math.pi)
_SCHEDULES = ("hinton", "fixed", "linear")


def em_routing_reference(
    votes: torch.Tensor,
    a_in: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    lambdas: Sequence[float],
    cost_scale: float = 1.0,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EM routing as Procedure 1 of the paper writes it, in log space.

    ``votes [B, n_inp, n_out, d]``, ``a_in [B, n_inp]``, ``beta_u``,
    ``beta_a [n_out]``, one inverse temperature per iteration (``lambdas``)
    -> ``(mu [B, n_out, d], a_out [B, n_out])``. ``cost_scale`` multiplies
    ``sum_i R'_ij`` in the costs (``n_out / n_inp`` for :func:`em_routing`'s
    ``normalize_costs``). This is the definition: :func:`em_routing` computes
    the same values and gradients (tested in float64).
    """
    R = torch.full_like(votes[..., 0], 1 / votes.shape[2])  # [B, i, j] 1/J
    for t, lam in enumerate(lambdas):
        # M-step: each parent j fits a Gaussian to the votes it explains
        Rp = R * a_in[..., None]  # [B, i, j] R'_ij = R_ij a_i
        mass = Rp.sum(1)  # [B, j] sum_i R'_ij
        c = Rp / (mass[:, None] + eps)  # [B, i, j]
        mu = torch.einsum("bij,bijd->bjd", c, votes)  # [B, j, d]
        sq = (votes - mu[:, None]) ** 2  # [B, i, j, d]
        sigma2 = torch.einsum("bij,bijd->bjd", c, sq) + eps  # [B, j, d]
        log_sigma = 0.5 * sigma2.log()  # [B, j, d]
        cost = (beta_u[:, None] + log_sigma) * (cost_scale * mass)[..., None]
        logit = lam * (beta_a - cost.sum(2))  # [B, j]
        a_out = torch.sigmoid(logit)  # [B, j]
        if t == len(lambdas) - 1:
            break
        # E-step: R_ij proportional to a_j p_ij, normalised over parents j
        maha = torch.einsum("bijd,bjd->bij", sq, 1 / sigma2)  # [B, i, j]
        log_p = -0.5 * maha - log_sigma.sum(2)[:, None]  # (const. dropped)
        R = torch.softmax(log_p + F.logsigmoid(logit)[:, None], dim=2)
    return mu, a_out


# ----------------------------------------------------------------------------------------------------
# The routing itself
# ----------------------------------------------------------------------------------------------------
def inverse_temperature_schedule(iterations: int, final_lambda: float = 1.0, kind: str = "hinton") -> list[float]:
    """Per-iteration inverse temperatures ``lambda_t``, ``t = 0..iterations-1``.

    Parameters
    ----------
    iterations : int
        Number of iterations, >= 1.
    final_lambda : float, optional
        Default 1.0, meant for :func:`em_routing`'s ``normalize_costs=True``; IBM's 0.01 with their factor 100.
    kind : str, optional
        ``"hinton"`` (default): ``final_lambda * (1 - 0.95**(t+1))`` (the OpenReview formula; increasing, it approaches
        ``final_lambda`` only as ``t -> inf``: 0.05, 0.0975, 0.143 x ``final_lambda`` for 3 iterations). ``"fixed"``:
        ``final_lambda`` every iteration (yl-1993: 1e-3 with raw costs). ``"linear"``:
        ``final_lambda * (t+1) / iterations`` (reaches ``final_lambda`` at the last iteration).

    Returns
    -------
    list[float]
        One ``lambda_t`` per iteration."""
    check_iterations(iterations)
    check_value(final_lambda, float, "inverse_temperature_schedule: final_lambda")
    if kind == "hinton":
        return [final_lambda * (1.0 - 0.95 ** (t + 1)) for t in range(iterations)]
    if kind == "fixed":
        return [float(final_lambda)] * iterations
    if kind == "linear":
        return [final_lambda * (t + 1) / iterations for t in range(iterations)]
    raise ValueError(f"unknown schedule kind {kind!r}; expected one of {_SCHEDULES}")


def _lambdas(
    inverse_temperature: float | Sequence[float] | Callable[[int], Sequence[float]] | None, iterations: int
) -> list[float]:
    """One inverse temperature per iteration from ``None`` (the default schedule), a float (fixed), a schedule
    ``iterations -> values`` (e.g. a ``functools.partial`` of :func:`inverse_temperature_schedule`), or a list."""
    if inverse_temperature is None:
        return inverse_temperature_schedule(iterations)
    if isinstance(inverse_temperature, (int, float)):
        return [float(inverse_temperature)] * iterations
    if callable(inverse_temperature):
        inverse_temperature = inverse_temperature(iterations)
    lams = [float(x) for x in inverse_temperature]
    if len(lams) != iterations:
        raise ValueError(f"inverse_temperature has {len(lams)} values for {iterations} iterations")
    return lams


def _check_em_inputs(votes: torch.Tensor, a_in: torch.Tensor, beta_u: torch.Tensor, beta_a: torch.Tensor) -> None:
    check_tensor(votes, "votes", "[B, n_inp, n_out, d]", [None, None, None], min_leading=1)
    if votes.shape[0] == 0:
        raise ValueError(f"votes: empty batch {tuple(votes.shape)}; EM routing needs at least one sample")
    *lead, I, J, D = votes.shape
    spec = "[" + ", ".join(["B"] + [str(s) for s in lead[1:]] + [f"n_inp={I}"]) + "]"
    check_tensor(a_in, "a_in", spec, [None] * (len(lead) + 1))
    if tuple(a_in.shape) != (*lead, I):
        raise ValueError(f"a_in: expected shape {spec} = {(*lead, I)} (votes.shape[:-2]), got {tuple(a_in.shape)}")
    for name, beta in (("beta_u", beta_u), ("beta_a", beta_a)):
        check_tensor(beta, name, f"[n_out={J}]", [J])
    check_activations(a_in, "a_in")


def em_routing(
    votes: torch.Tensor,
    a_in: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    *,
    inverse_temperature: float | Sequence[float] | None = None,
    normalize_over_outputs: bool = False,
    normalize_costs: bool = True,
    eps: float = 1e-8,
    return_routing: bool = False,
):
    """EM routing: ``votes [B, n_inp, n_out, d]``, ``a_in [B, n_inp]`` -> ``(mu [B, n_out, d], a_out [B, n_out])``.

    Extra leading batch dimensions are allowed (``votes [B, h, w, n_inp, n_out, d]`` with ``a_in [B, h, w, n_inp]``
    routes every conv position independently).

    Parameters
    ----------
    votes : torch.Tensor
        ``V_ij``, flattened pose votes (``d = 16`` for 4x4 poses; any ``d`` works). Routing works parent-major
        internally: votes that are the ``transpose(-3, -2)`` view of a contiguous ``[..., n_out, n_inp, d]`` tensor
        (what :class:`~capsule_lib.layers.ConvCapsules` and :class:`~capsule_lib.layers.ClassCapsules` make) are used
        without a copy.
    a_in : torch.Tensor
        Input activations in ``[0, 1]`` (checked, except while ``torch.compile`` traces).
    beta_u, beta_a : torch.Tensor
        Per output type ``[n_out]``: the cost per pose entry of a parent's spread, and the activation threshold.
    iterations : int, optional
        EM iterations ``T >= 1`` (default 3, the paper's; yl-1993 finds 2 best).
    inverse_temperature : float, Sequence[float] or None, optional
        ``lambda``; a float (fixed), one float per iteration, or ``None`` for
        ``inverse_temperature_schedule(iterations)`` (default; Hinton's shape, ``final_lambda = 1``).
    normalize_over_outputs : bool, optional
        yl-1993 quirk, renormalise ``R'`` over outputs (cancels ``a_in``). Off (default) = paper.
    normalize_costs : bool, optional
        Multiply ``sum_i R'_ij`` by ``n_out / n_inp`` in the costs (default True; module docstring).
    eps : float, optional
        Variance floor and guard of the ``sum_i R'_ij`` denominators (default 1e-8).
    return_routing : bool, optional
        Also return a :class:`RoutingTrace` (default False).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor] or tuple[tuple, RoutingTrace]
        ``(mu [B, n_out, d], a_out [B, n_out])`` in the dtype of ``votes``, or ``((mu, a_out), trace)`` with
        ``return_routing=True``, the trace (``algorithm="em"``) holding, per iteration, ``coefficients`` R used in that
        M-step ``[B, n_inp, n_out]`` (sum to 1 over ``n_out``), ``agreements`` log p_ij ``[B, n_inp, n_out]`` under that
        iteration's Gaussians, ``outputs`` mu ``[B, n_out, d]``, ``activations`` a_out ``[B, n_out]``; ``extra``:
        ``"sigma2"`` and ``"costs"`` (``sum_h cost_h``, ``[B, n_out]``) per iteration, ``"inverse_temperatures"``,
        ``"mass"`` (``sum_i R'_ij`` per iteration), ``"posterior"`` (R after the last E-step) and ``"a_in"`` (the
        children's activations, as given).

    Notes
    -----
    Two implementations of the same arithmetic: without the trace, in eager mode on the CPU
    (``routing/_common.use_kernel``), a custom autograd function (``_EMRoutingFunction``) routes blocks of a few conv
    positions / samples at a time, so that the votes-sized temporaries ``(V - mu)^2`` stay in the CPU cache, and
    computes the gradients of all iterations with a hand-derived backward (it keeps only ``[.., n_out, n_inp]``- and
    ``[.., n_out, d]``-sized tensors per iteration, and recomputes ``V - mu``). With ``return_routing=True`` or under
    ``torch.compile`` the routing is written as plain differentiable tensor code (the trace tensors carry gradients;
    inductor fuses it); on CUDA, where the blocked function would launch thousands of small kernels, the plain code runs
    too. Both give the same forward results and agree to rounding in the gradients (``tests/test_routing_em.py``,
    ``tests/test_fused_kernels.py``). The custom function is once differentiable: a double backward
    (``create_graph=True``) through it raises; route with ``return_routing=True`` for that."""
    _check_em_inputs(votes, a_in, beta_u, beta_a)
    check_iterations(iterations)
    lams = _lambdas(inverse_temperature, iterations)
    *_, I, J, D = votes.shape
    scale = J / I if normalize_costs else 1.0
    cdt = torch.promote_types(votes.dtype, torch.float32)  # fp16/bf16 -> fp32; fp64 stays fp64
    with torch.autocast(device_type=votes.device.type, enabled=False):
        # Parent-major ([B, J, I, ...]): every sum over children is then a batched mat-vec on contiguous
        # memory. A no-op for votes made parent-major (ConvCapsules, ClassCapsules); else one copy.
        V = votes.to(cdt).transpose(-3, -2).contiguous()  # [B, J, I, D]
        a = a_in.to(cdt)  # [B, I]
        bu, ba = beta_u.to(cdt), beta_a.to(cdt)  # [J], [J]
        lead = V.shape[:-3]  # [B] or [B, h, w]: independent routings, flattened to N
        V, a = V.view(-1, J, I, D), a.reshape(-1, I)  # [N, J, I, D], [N, I]
        opts = (tuple(lams), normalize_over_outputs, scale, eps)
        if use_kernel(V, trace=return_routing, dtypes=None, autocast=True):  # the blocked kernel (the CPU)
            (mu, a_out), trace = _EMRoutingFunction.apply(V, a, bu, ba, *opts, _m_step, _e_step), None  # our steps
        else:
            (mu, a_out), trace = _em_routing_autograd(V, a, bu, ba, *opts, return_routing)
    mu, a_out = mu.view(*lead, J, D).to(votes.dtype), a_out.view(*lead, J).to(votes.dtype)
    if trace is None:
        return mu, a_out
    return (mu, a_out), _unflatten_trace(trace, lead, votes.dtype, a_in)


def _unflatten_trace(trace: RoutingTrace, lead: torch.Size, dtype: torch.dtype, a_in: torch.Tensor) -> RoutingTrace:
    """The trace of ``N`` flattened routings back in the votes' leading shape ``lead`` (``[B]`` or ``[B, h, w]``),
    outputs and activations in the votes' ``dtype``; ``a_in`` (the children's activations) added to ``extra``."""

    def unflat(x: torch.Tensor) -> torch.Tensor:  # [N, ...] -> [*lead, ...]
        return x.reshape(*lead, *x.shape[1:])

    trace.coefficients[:] = [unflat(x) for x in trace.coefficients]  # [B, I, J] each
    trace.agreements[:] = [unflat(x) for x in trace.agreements]  # [B, I, J] each
    trace.outputs[:] = [unflat(x).to(dtype) for x in trace.outputs]  # [B, J, D] each
    trace.activations[:] = [unflat(x).to(dtype) for x in trace.activations]  # [B, J] each
    for k in ("sigma2", "costs", "mass"):
        trace.extra[k] = [unflat(x) for x in trace.extra.get(k, [])]
    trace.extra["posterior"] = unflat(trace.extra["posterior"])  # [B, I, J]
    trace.extra["a_in"] = a_in  # [B, I]
    return trace


def _m_step(
    R: torch.Tensor,
    a: torch.Tensor,
    V: torch.Tensor,
    bu: torch.Tensor,
    ba: torch.Tensor,
    lam: float,
    normalize_over_outputs: bool,
    scale: float,
    eps: float,
    sq_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """One M-step on ``n`` routings, shared by both implementations (so that they give the same bits):
    ``R [n, J, I]``, ``a [n, 1, I]``, ``V [n, J, I, D]`` (contiguous), ``bu [J, 1]``, ``ba [J]`` ->
    ``(c, mass, mu, sq, sigma2, log_sigma2, cost, logit)``; ``sq = (V - mu)^2`` is written into ``sq_out``
    when given (a reused buffer of the blocked function; the autograd path allocates it)."""
    n, J, I, D = V.shape
    Rp = R * a  # [n, J, I]  R'_ij = R_ij a_i
    if normalize_over_outputs:  # yl-1993 quirk: cancels a_i
        Rp = Rp / (Rp.sum(dim=-2, keepdim=True) + eps)  # [n, J, I]
    mass = Rp.sum(dim=-1)  # [n, J]     sum_i R'_ij
    c = Rp / (mass.unsqueeze(-1) + eps)  # [n, J, I]  weights over i
    mu = torch.bmm(c.view(n * J, 1, I), V.view(n * J, I, D)).view(n, J, D)  # [n, J, D]  sum_i c V
    if sq_out is None:
        sq = (V - mu.unsqueeze(-2)).square()  # [n, J, I, D]
    else:
        sq = torch.sub(V, mu.unsqueeze(-2), out=sq_out).square_()  # [n, J, I, D]
    sigma2 = torch.bmm(c.view(n * J, 1, I), sq.view(n * J, I, D)).view(n, J, D) + eps  # [n, J, D]
    log_sigma2 = torch.log(sigma2)  # [n, J, D]
    cost = ((bu + 0.5 * log_sigma2) * (mass * scale).unsqueeze(-1)).sum(dim=-1)  # [n, J]  sum_h cost_h
    logit = lam * (ba - cost)  # [n, J]
    return c, mass, mu, sq, sigma2, log_sigma2, cost, logit


def _e_step(sq: torch.Tensor, sigma2: torch.Tensor, log_sigma2: torch.Tensor, logit: torch.Tensor):
    """One E-step in log space, shared by both implementations: ``sq = (V - mu)^2 [n, J, I, D]``, ``sigma2``,
    ``log_sigma2 [n, J, D]``, ``logit [n, J]`` -> ``(log_p [n, J, I], R [n, J, I])``, ``R`` normalised over j."""
    n, J, I, D = sq.shape
    # sum over d as [1, D] @ [D, I] on the transposed view: much faster on CPU than [I, D] @ [D, 1]
    w = sigma2.reciprocal().view(n * J, 1, D)  # [nJ, 1, D]
    maha = torch.bmm(w, sq.view(n * J, I, D).transpose(1, 2)).view(n, J, I)  # [n, J, I]
    log_p = -0.5 * (maha + log_sigma2.sum(dim=-1, keepdim=True) + D * LN_2PI)  # [n, J, I]
    R = torch.softmax(log_p + F.logsigmoid(logit).unsqueeze(-1), dim=-2)  # [n, J, I]  prop. to a_j p_ij
    return log_p, R


def _em_routing_autograd(
    V: torch.Tensor,
    a: torch.Tensor,
    bu: torch.Tensor,
    ba: torch.Tensor,
    lams: tuple[float, ...],
    normalize_over_outputs: bool,
    scale: float,
    eps: float,
    return_routing: bool,
) -> tuple[tuple[torch.Tensor, torch.Tensor], RoutingTrace | None]:
    """Procedure 1 as plain differentiable tensor code on parent-major votes ``V [N, J, I, D]`` (contiguous,
    compute dtype), ``a [N, I]``, ``bu, ba [J]``: ``((mu [N, J, D], a_out [N, J]), trace or None)`` (trace
    tensors with ``N`` flat). Used for the trace and under ``torch.compile``; ``_EMRoutingFunction`` runs
    the same steps."""
    N, J, I, D = V.shape
    trace = RoutingTrace("em") if return_routing else None
    a, bu = a.unsqueeze(-2), bu.unsqueeze(-1)  # [N, 1, I], [J, 1]
    R = V.new_full((N, J, I), 1.0 / J)  # [N, J, I]
    for t, lam in enumerate(lams):
        c, mass, mu, sq, sigma2, log_sigma2, cost, logit = _m_step(
            R, a, V, bu, ba, lam, normalize_over_outputs, scale, eps
        )
        a_out = torch.sigmoid(logit)  # [N, J]
        if t == len(lams) - 1 and trace is None:
            break  # the last E-step only feeds the trace
        log_p, R_next = _e_step(sq, sigma2, log_sigma2, logit)  # [N, J, I] x 2
        if trace is not None:
            trace.coefficients.append(R.transpose(-2, -1))  # [N, I, J]
            trace.agreements.append(log_p.transpose(-2, -1))  # [N, I, J]
            trace.outputs.append(mu)
            trace.activations.append(a_out)
            trace.extra.setdefault("sigma2", []).append(sigma2)
            trace.extra.setdefault("costs", []).append(cost)
            trace.extra.setdefault("mass", []).append(mass)
        R = R_next
    if trace is not None:
        trace.extra["inverse_temperatures"] = list(lams)
        trace.extra["posterior"] = R.transpose(-2, -1)  # [N, I, J]
    return (mu, a_out), trace


# ----------------------------------------------------------------------------------------------------
# Votes and the fully-connected module
# ----------------------------------------------------------------------------------------------------
def matrix_votes(poses: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Matrix votes ``V_ij = M_i W_ij``: each child's pose matrix times one transformation per parent.

    Parameters
    ----------
    poses : torch.Tensor
        ``[B, n_inp, P*P]``, each pose a row-major ``P x P`` matrix ``M_i``.
    weight : torch.Tensor
        ``[n_inp, n_out, P, P]``, the transformations ``W_ij``.

    Returns
    -------
    torch.Tensor
        ``[B, n_inp, n_out, P*P]``, the votes flattened row-major.
    """
    n_inp, n_out, P, _ = weight.shape
    M = poses.reshape(*poses.shape[:-1], P, P)  # [B, I, P, P]
    V = torch.einsum("bipq,ijqr->bijpr", M, weight)  # [B, I, J, P, P]
    return V.reshape(*V.shape[:-2], P * P)  # [B, I, J, P*P]


class EMRoutingBase(nn.Module):
    """What every layer with EM routing shares: the routing hyper-parameters, the per-output-type ``beta_u``, ``beta_a``
    (init 0, as yl-1993) and :meth:`route_votes`. Subclasses add their transformation weights (:meth:`pose_weight`)
    and how votes are formed.

    Every EM layer passes its ``**routing`` keywords on to here: the routing options are declared, defaulted and
    documented once.

    Parameters
    ----------
    n_out : int
        Number of output capsule types (the size of ``beta_u`` and ``beta_a``).
    iterations : int, optional
        EM iterations, >= 1 (default 3, the paper's); a call may override it.
    inverse_temperature : float, Sequence[float], callable or None, optional
        ``lambda`` per iteration: ``None`` (default) for :func:`inverse_temperature_schedule` (Hinton's shape,
        ``final_lambda = 1``), a float (fixed), a schedule ``iterations -> values`` (e.g. a ``functools.partial``
        of it), or one value per iteration (only for the layer's own ``iterations``).
    normalize_over_outputs : bool, optional
        yl-1993 quirk: renormalise ``R'`` over outputs (cancels ``a_in``); ``False`` (default) = paper.
    normalize_costs : bool, optional
        Multiply ``sum_i R'_ij`` by ``n_out / n_inp`` in the costs (default ``True``; see :func:`em_routing`).
    eps : float, optional
        Variance floor and guard of the ``sum_i R'_ij`` denominators (default 1e-8)."""

    @staticmethod
    def pose_weight(shape: tuple[int, ...], init_std: float | None) -> nn.Parameter:
        """A transformation-matrix parameter of ``shape`` (last two axes ``P x P``) drawn from ``N(0, std^2)``;
        ``init_std=None`` uses ``1/sqrt(P)``, which keeps the vote variance equal to the pose variance."""
        std = init_std if init_std is not None else shape[-1] ** -0.5
        return nn.Parameter(torch.randn(shape) * std)

    def __init__(
        self,
        n_out: int,
        iterations: int = 3,
        *,
        inverse_temperature: float | Sequence[float] | Callable[[int], Sequence[float]] | None = None,
        normalize_over_outputs: bool = False,
        normalize_costs: bool = True,
        eps: float = 1e-8,
    ) -> None:
        super().__init__()
        self.iterations = check_iterations(iterations)
        self._inverse_temperature = inverse_temperature  # None (the default schedule), a float, or one per iteration
        _lambdas(inverse_temperature, iterations)  # refuse a schedule of the wrong length now
        self.normalize_over_outputs, self.normalize_costs, self.eps = normalize_over_outputs, normalize_costs, eps
        self.beta_u = nn.Parameter(torch.zeros(n_out))
        self.beta_a = nn.Parameter(torch.zeros(n_out))

    @property
    def inverse_temperature(self) -> list[float]:
        """The inverse temperatures of the layer's ``iterations`` (see :meth:`inverse_temperatures`)."""
        return self.inverse_temperatures(self.iterations)

    def inverse_temperatures(self, iterations: int) -> list[float]:
        """One inverse temperature per iteration for a call with ``iterations``, derived at call time from what the
        layer was built with: the default schedule (:func:`inverse_temperature_schedule`) or a fixed value for any
        number of iterations; a per-iteration list only for its own number."""
        return _lambdas(self._inverse_temperature, iterations)

    def route_votes(
        self, votes: torch.Tensor, a_in: torch.Tensor, return_routing: bool = False, iterations: int | None = None
    ):
        """EM routing of ``votes`` (see :func:`em_routing`) with the layer's parameters, ``iterations`` times
        (default: the layer's), each with its inverse temperature."""
        T = self.iterations if iterations is None else check_iterations(iterations)
        return em_routing(
            votes,
            a_in,
            self.beta_u,
            self.beta_a,
            T,
            inverse_temperature=self.inverse_temperatures(T),
            normalize_over_outputs=self.normalize_over_outputs,
            normalize_costs=self.normalize_costs,
            eps=self.eps,
            return_routing=return_routing,
        )

    def _repr(self) -> str:
        lam = ", ".join(f"{x:.3g}" for x in self.inverse_temperature)
        return (
            f"iterations={self.iterations}, inverse_temperature=[{lam}], "
            f"normalize_over_outputs={self.normalize_over_outputs}, normalize_costs={self.normalize_costs}"
        )


class EMRouting(RoutingProtocol, EMRoutingBase):
    """Fully-connected matrix-capsule layer with EM routing:
    ``poses [B, n_inp, P*P], a_in [B, n_inp] -> (poses [B, n_out, P*P], a_out [B, n_out])``.

    Parameters
    ----------
    n_inp, n_out : int
        Numbers of input and output capsules: one ``P x P`` transformation per pair, ``weight [n_inp, n_out, P, P]``;
        ``beta_u``, ``beta_a`` ``[n_out]``.
    pose_size : int, optional
        Side ``P`` of the pose matrices (default 4).
    iterations : int, optional
        EM iterations, >= 1 (default 3); a call may override it.
    init_std : float or None, optional
        Std of the ``N(0, init_std^2)`` weights; ``None`` (default): ``1/sqrt(P)`` (vote variance = pose variance).
    coupled_temperature : str, optional
        The inverse temperature of the one pass with fixed couplings (Paik et al.'s baselines): ``"last"`` (default:
        the last iteration's, the routed output's) or ``"first"`` (2.9 times smaller for 3 iterations, learns slower,
        ``benchmarks/learning_diagnostics.py em_fixed``; with it ``"uniform"`` equals ``route(iterations=1)``).
    \\*\\*routing
        The routing options of :class:`EMRoutingBase` (``inverse_temperature``, ``normalize_over_outputs``,
        ``normalize_costs``, ``eps``)."""

    def __init__(
        self,
        n_inp: int,
        n_out: int,
        pose_size: int = 4,
        iterations: int = 3,
        *,
        init_std: float | None = None,
        coupled_temperature: str = "last",
        **routing: Any,
    ) -> None:
        super().__init__(n_out, iterations, **routing)
        self.coupled_temperature = check_choice(coupled_temperature, ("last", "first"), "coupled_temperature")
        self.n_inp, self.n_out, self.pose_size = n_inp, n_out, pose_size
        self.weight = self.pose_weight((n_inp, n_out, pose_size, pose_size), init_std)

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """``[B, n_inp, P*P] -> [B, n_inp, n_out, P*P]``."""
        d = self.pose_size**2
        spec = f"[B, n_inp={self.n_inp}, d={d}]"
        check_poses(poses, self.pose_size, spec, 3)
        check_tensor(poses, "poses", spec, [None, self.n_inp, d])
        return matrix_votes(poses, self.weight)

    def forward(
        self, poses: torch.Tensor, a_in: torch.Tensor, return_routing: bool = False, iterations: int | None = None
    ):
        """Route the input capsules: :meth:`~capsule_lib.routing.em.EMRoutingBase.route_votes` of :meth:`votes`.

        Parameters
        ----------
        poses, a_in : torch.Tensor
            ``poses [B, n_inp, P*P]`` and activations ``a_in [B, n_inp]`` in ``[0, 1]``.
        return_routing, iterations : optional
            As in :meth:`~capsule_lib.routing.em.EMRoutingBase.route_votes` (defaults False and ``None``: the layer's).

        Returns
        -------
        tuple
            ``(mu [B, n_out, P*P], a_out [B, n_out])``, or ``((mu, a_out), trace)`` with ``return_routing=True``."""
        check_module_input(poses, self, type(self).__name__)
        return self.route_votes(self.votes(poses), a_in, return_routing, iterations)

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> EMRouting:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (``sqrt(d) x sqrt(d)`` poses)."""
        return cls(n_inp, n_out, math.isqrt(d), iterations)

    def _input_width(self) -> int:
        return self.pose_size**2  # a P x P pose, flattened

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: :meth:`forward`: activations are probabilities in ``[0, 1]``, in and out."""
        a_in = require_activations(activations, self, "probabilities in [0, 1]")
        (mu, a_out), trace = split_trace(self(poses, a_in, return_routing, iterations), return_routing)
        return Routed(mu, a_out, trace)  # [B, n_out, P*P], [B, n_out]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]``: one M-step at the inverse temperature
        ``coupled_temperature`` names (default: the layer's last iteration's), in float32 or float64."""
        a_in = require_activations(activations, self, "probabilities in [0, 1]")
        cdt = torch.promote_types(poses.dtype, torch.float32)
        V = self.votes(poses).to(cdt).transpose(1, 2).contiguous()  # [B, j, i, d]
        I, J = V.shape[2], V.shape[1]
        scale = J / I if self.normalize_costs else 1.0
        lam = self.inverse_temperatures(self.iterations if self.coupled_temperature == "last" else 1)[-1]
        bu, ba = self.beta_u.to(cdt).unsqueeze(-1), self.beta_a.to(cdt)  # [J, 1], [J]
        R = R.to(cdt).transpose(1, 2).contiguous()  # [B, j, i]
        *_, mu, _, _, _, _, logit = _m_step(
            R, a_in.to(cdt).unsqueeze(1), V, bu, ba, lam, self.normalize_over_outputs, scale, self.eps
        )
        return Routed(mu.to(poses.dtype), torch.sigmoid(logit).to(poses.dtype), None)  # [B, j, d], [B, j]

    def extra_repr(self) -> str:
        shape = f"n_inp={self.n_inp}, n_out={self.n_out}, pose_size={self.pose_size}"
        return f"{shape}, coupled_temperature={self.coupled_temperature!r}, {self._repr()}"
