"""EM routing between matrix capsules (Hinton, Sabour & Frosst, ICLR 2018, "Matrix capsules with EM routing").

Index names used in every einsum below::

    b  batch            i  input (child) capsule      j  output (parent) capsule
    d  pose entry (d = P*P = 16 for 4x4 poses)        p, q, r  rows/columns of a P x P pose matrix
    h, w  output position (conv layers)               u, v  kernel offset      t  input capsule type

Each parent ``j`` is a diagonal Gaussian over the ``d`` pose entries; each child ``i`` votes ``V_ij`` for it.
Procedure 1 of the paper, per iteration ``t = 1..T`` (``R_ij = 1/J`` before the first)::

    M-step  R'_ij   = R_ij * a_i                                     (paper: NOT renormalised over j)
            mu_j    = sum_i R'_ij V_ij / sum_i R'_ij                 [B, J, d]
            sig2_j  = sum_i R'_ij (V_ij - mu_j)^2 / sum_i R'_ij      [B, J, d]
            cost_jh = (beta_u + log sig_jh) * sum_i R'_ij            [B, J, d]
            a_j     = sigmoid(lambda_t * (beta_a - sum_h cost_jh))   [B, J]
    E-step  log p_ij = -1/2 sum_h [ (V_ijh - mu_jh)^2 / sig2_jh + log sig2_jh + log 2 pi ]
            R_ij     = softmax_j(log p_ij + log a_j)                 (sums to 1 over the PARENTS j)

The returned capsules are ``mu`` (poses) and ``a`` (activations) of the last M-step; the last E-step only
feeds the trace.

Numerics
--------
Everything runs in float32 (float64 for float64 votes) with autocast disabled: votes in fp16/bf16 are
upcast and the results are cast back to the votes' dtype. The E-step is done in log space:
``log a_j = logsigmoid(...)`` (never ``log`` of an underflowed sigmoid), the posterior is normalised with
``logsumexp``, and ``log sigma`` is ``1/2 log sig2`` with ``sig2 >= eps`` (no square root, whose gradient is
infinite at 0). Sums of ``R'`` are guarded with ``+ eps``, so parents that receive nothing (all ``a_i = 0``)
get ``mu = 0``, ``sig2 = eps``, cost 0. Under fp16 autocast, gradients of very large inputs (x1e3) can
exceed the fp16 range on their way back into fp16 tensors; that is fp16's range (use a GradScaler), not a
NaN of the routing.

Choices where the paper is silent or where we deviate (see also :func:`inverse_temperature_schedule`)
------------------------------------------------------------------------------------------------------
* **Inverse temperature schedule.** The paper gives no values for ``lambda``. The one published formula is
  Hinton's OpenReview answer, as quoted in Gritzman's IBM implementation (``em_routing.py``):
  ``lambda_t = final_lambda * (1 - 0.95**(t+1))`` with ``final_lambda = 0.01`` (not re-checked against
  OpenReview). We use that shape (``kind="hinton"``, increasing over iterations); see the next point for
  the value.
* **Cost normalisation** (``normalize_costs=True``, default). Raw costs grow with the number of children
  per parent (``~ n_inp / n_out``: 4.5 in a k3 conv layer with 8 input types and 16 output types, > 100 in
  the class layer), so one ``lambda`` cannot suit every layer. We multiply ``sum_i R'_ij`` by
  ``n_out / n_inp`` (the cost becomes one of an average-sized parent). IBM's code does the same up to a
  constant (``100 * n_out / n_inp``), so their ``final_lambda = 0.01`` equals our default
  ``final_lambda = 1.0``. This is a constant per layer (equivalent to rescaling ``lambda`` and ``beta_a``),
  not a data-dependent normalisation. ``normalize_costs=False`` gives the paper's raw costs (then use a
  ``lambda`` around ``1e-3 .. 1e-2``, as yl-1993 and the OpenReview answer do).
* **yl-1993 quirk** (``normalize_over_outputs=True``): yl-1993/Matrix-Capsules-EM-PyTorch renormalises
  ``R'_ij`` over the outputs ``j`` right after multiplying by ``a_i``, which cancels ``a_i`` exactly: input
  activations then have no effect on ``mu``, ``sigma`` or ``a_out``. Off by default; offered to compare.
  yl-1993 as a whole is ``normalize_over_outputs=True, normalize_costs=False, inverse_temperature=1e-3``.
* ``beta_u``, ``beta_a``: one per output capsule type (shared over positions), initialised to 0 (yl-1993;
  IBM draws ``beta_a`` from N(-1000, 500) at their cost scale, about -10 at ours).
* ``eps = 1e-8`` (yl-1993; IBM uses 1e-9) is both the variance floor and the denominator guard. When a
  parent's Gaussian collapses onto one child, ``log sig`` reaches ``1/2 log eps`` and its activation
  saturates; in small experiments 3 iterations did this more often than 2 (yl-1993 and IBM both default to
  2 iterations; the paper uses 3, our default). A larger ``eps`` (variance floor) or a smaller
  ``final_lambda`` are the knobs if it happens.
* Nothing is detached: gradients flow through every iteration.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_module_input, check_tensor
from .trace import RoutingTrace

__all__ = [
    "em_routing", "EMRouting", "inverse_temperature_schedule", "matrix_votes", "grid_centers",
    "MatrixPrimaryCapsules", "ConvCapsules", "ClassCapsules",
]

LN_2PI = math.log(2.0 * math.pi)
_SCHEDULES = ("hinton", "fixed", "linear")


# ----------------------------------------------------------------------------------------------------
# The routing itself
# ----------------------------------------------------------------------------------------------------
def inverse_temperature_schedule(iterations: int, final_lambda: float = 1.0, kind: str = "hinton") -> list[float]:
    """Per-iteration inverse temperatures ``lambda_t``, ``t = 0..iterations-1``.

    ``"hinton"``: ``final_lambda * (1 - 0.95**(t+1))`` (the OpenReview formula; increasing, it approaches
    ``final_lambda`` only as ``t -> inf``: 0.05, 0.0975, 0.143 x ``final_lambda`` for 3 iterations).
    ``"fixed"``: ``final_lambda`` every iteration (yl-1993: 1e-3 with raw costs).
    ``"linear"``: ``final_lambda * (t+1) / iterations`` (reaches ``final_lambda`` at the last iteration).

    The default ``final_lambda = 1.0`` is meant for the per-child cost normalisation of :func:`em_routing`
    (``normalize_costs=True``); it equals IBM's 0.01 with their factor 100 in the costs.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if kind == "hinton":
        return [final_lambda * (1.0 - 0.95 ** (t + 1)) for t in range(iterations)]
    if kind == "fixed":
        return [float(final_lambda)] * iterations
    if kind == "linear":
        return [final_lambda * (t + 1) / iterations for t in range(iterations)]
    raise ValueError(f"unknown schedule kind {kind!r}; expected one of {_SCHEDULES}")


def _lambdas(inverse_temperature: float | Sequence[float] | None, iterations: int) -> list[float]:
    if inverse_temperature is None:
        return inverse_temperature_schedule(iterations)
    if isinstance(inverse_temperature, (int, float)):
        return [float(inverse_temperature)] * iterations
    lams = [float(x) for x in inverse_temperature]
    if len(lams) != iterations:
        raise ValueError(f"inverse_temperature has {len(lams)} values for {iterations} iterations")
    return lams


def _check_em_inputs(votes: torch.Tensor, a_in: torch.Tensor, beta_u: torch.Tensor, beta_a: torch.Tensor) -> None:
    check_tensor(votes, "votes", "[B, n_inp, n_out, d]", [None, None, None], min_leading=1)
    *lead, I, J, D = votes.shape
    spec = "[" + ", ".join(["B"] + [str(s) for s in lead[1:]] + [f"n_inp={I}"]) + "]"
    check_tensor(a_in, "a_in", spec, [None] * (len(lead) + 1))
    if tuple(a_in.shape) != (*lead, I):
        raise ValueError(f"a_in: expected shape {spec} = {(*lead, I)} (votes.shape[:-2]), got {tuple(a_in.shape)}")
    for name, beta in (("beta_u", beta_u), ("beta_a", beta_a)):
        check_tensor(beta, name, f"[n_out={J}]", [J])


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

    Extra leading batch dimensions are allowed (``votes [B, h, w, n_inp, n_out, d]`` with
    ``a_in [B, h, w, n_inp]`` routes every conv position independently).

    Parameters
    ----------
    votes: ``V_ij``, flattened pose votes (``d = 16`` for 4x4 poses; any ``d`` works).
    a_in: input activations in ``[0, 1]`` (not checked: data-dependent checks break ``torch.compile``).
    beta_u, beta_a
        per output type ``[n_out]``: the cost per pose entry of a parent's spread, and the
        activation threshold.
    iterations: EM iterations ``T >= 1`` (the paper uses 3; yl-1993 finds 2 best).
    inverse_temperature: ``lambda``; a float (fixed), one float per iteration, or ``None`` for
        ``inverse_temperature_schedule(iterations)`` (Hinton's shape, ``final_lambda = 1``).
    normalize_over_outputs: yl-1993 quirk, renormalise ``R'`` over outputs (cancels ``a_in``). Off = paper.
    normalize_costs: multiply ``sum_i R'_ij`` by ``n_out / n_inp`` in the costs (module docstring).
    eps: variance floor and guard of the ``sum_i R'_ij`` denominators.
    return_routing: also return a :class:`RoutingTrace` (``algorithm="em"``) with, per iteration,
        ``coefficients`` R used in that M-step ``[B, n_inp, n_out]`` (sum to 1 over ``n_out``),
        ``agreements`` log p_ij ``[B, n_inp, n_out]`` under that iteration's Gaussians, ``outputs`` mu
        ``[B, n_out, d]``, ``activations`` a_out ``[B, n_out]``; ``extra``: ``"sigma2"`` and ``"costs"``
        (``sum_h cost_h``, ``[B, n_out]``) per iteration, ``"inverse_temperatures"``, ``"mass"``
        (``sum_i R'_ij`` per iteration) and ``"posterior"`` (R after the last E-step).

    Returns ``(mu, a_out)``, or ``((mu, a_out), trace)`` with ``return_routing=True``; both in the dtype of
    ``votes``.
    """
    _check_em_inputs(votes, a_in, beta_u, beta_a)
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    lams = _lambdas(inverse_temperature, iterations)
    *_, I, J, D = votes.shape
    trace = RoutingTrace("em") if return_routing else None
    scale = J / I if normalize_costs else 1.0
    cdt = torch.promote_types(votes.dtype, torch.float32)          # fp16/bf16 -> fp32; fp64 stays fp64
    with torch.autocast(device_type=votes.device.type, enabled=False):
        # Internally parent-major ([B, J, I, ...]): every sum over children is then a batched mat-vec on
        # contiguous memory (no permuting copies). Trace tensors are handed out as [B, I, J] views.
        V = votes.to(cdt).transpose(-3, -2).contiguous()            # [B, J, I, D]
        a = a_in.to(cdt).unsqueeze(-2)                              # [B, 1, I]
        bu, ba = beta_u.to(cdt).unsqueeze(-1), beta_a.to(cdt)       # [J, 1], [J]
        R = torch.full_like(V[..., 0], 1.0 / J)                     # [B, J, I]
        mu = V.new_zeros(V.shape[:-3] + (J, D))
        a_out = V.new_zeros(V.shape[:-3] + (J,))
        for t in range(iterations):
            # ---- M-step ----
            Rp = R * a                                              # [B, J, I]  R'_ij = R_ij a_i
            if normalize_over_outputs:  # yl-1993 quirk: cancels a_i
                Rp = Rp / (Rp.sum(dim=-2, keepdim=True) + eps)      # [B, J, I]
            mass = Rp.sum(dim=-1)                                   # [B, J]     sum_i R'_ij
            coeff = Rp / (mass.unsqueeze(-1) + eps)                 # [B, J, I]  weights over i
            mu = torch.einsum("...ji,...jid->...jd", coeff, V)      # [B, J, D]
            sq = (V - mu.unsqueeze(-2)).square()                    # [B, J, I, D]
            sigma2 = torch.einsum("...ji,...jid->...jd", coeff, sq) + eps  # [B, J, D]
            log_sigma2 = torch.log(sigma2)                          # [B, J, D]
            cost_h = (bu + 0.5 * log_sigma2) * (mass * scale).unsqueeze(-1)  # [B, J, D]
            cost = cost_h.sum(dim=-1)                               # [B, J]
            logit = lams[t] * (ba - cost)                           # [B, J]
            a_out = torch.sigmoid(logit)                            # [B, J]
            last = t == iterations - 1
            if last and trace is None:
                break  # the last E-step only feeds the trace
            # ---- E-step (log space) ----
            maha = torch.einsum("...jid,...jd->...ji", sq, sigma2.reciprocal())  # [B, J, I]
            log_p = -0.5 * (maha + log_sigma2.sum(dim=-1, keepdim=True) + D * LN_2PI)  # [B, J, I]
            log_post = log_p + F.logsigmoid(logit).unsqueeze(-1)    # [B, J, I]  log(a_j p_ij)
            R_next = torch.exp(log_post - torch.logsumexp(log_post, dim=-2, keepdim=True))  # [B, J, I]
            if trace is not None:
                trace.coefficients.append(R.transpose(-2, -1))      # [B, I, J]
                trace.agreements.append(log_p.transpose(-2, -1))    # [B, I, J]
                trace.outputs.append(mu.to(votes.dtype))
                trace.activations.append(a_out.to(votes.dtype))
                trace.extra.setdefault("sigma2", []).append(sigma2)
                trace.extra.setdefault("costs", []).append(cost)
                trace.extra.setdefault("mass", []).append(mass)
            R = R_next
    mu, a_out = mu.to(votes.dtype), a_out.to(votes.dtype)
    if trace is not None:
        trace.extra["inverse_temperatures"] = lams
        trace.extra["posterior"] = R.transpose(-2, -1)            # [B, I, J]
        return (mu, a_out), trace
    return mu, a_out


# ----------------------------------------------------------------------------------------------------
# Votes and the fully-connected module
# ----------------------------------------------------------------------------------------------------
def matrix_votes(poses: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Matrix votes ``V_ij = M_i W_ij``: ``poses [B, n_inp, P*P]`` (row-major P x P),
    ``weight [n_inp, n_out, P, P]`` -> ``[B, n_inp, n_out, P*P]``."""
    n_inp, n_out, P, _ = weight.shape
    M = poses.reshape(*poses.shape[:-1], P, P)                      # [B, I, P, P]
    V = torch.einsum("bipq,ijqr->bijpr", M, weight)                 # [B, I, J, P, P]
    return V.reshape(*V.shape[:-2], P * P)                          # [B, I, J, P*P]


def _init_weight(shape: tuple[int, ...], std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(shape) * std)


class _EMOptions(nn.Module):
    """Routing hyper-parameters and the per-output-type ``beta_u``, ``beta_a`` (init 0, as yl-1993)."""

    def __init__(self, n_out: int, iterations: int, inverse_temperature, normalize_over_outputs: bool,
                 normalize_costs: bool, eps: float) -> None:
        super().__init__()
        self.iterations = iterations
        self.inverse_temperature = _lambdas(inverse_temperature, iterations)
        self.normalize_over_outputs, self.normalize_costs, self.eps = normalize_over_outputs, normalize_costs, eps
        self.beta_u = nn.Parameter(torch.zeros(n_out))
        self.beta_a = nn.Parameter(torch.zeros(n_out))

    def route(self, votes: torch.Tensor, a_in: torch.Tensor, return_routing: bool = False):
        return em_routing(
            votes, a_in, self.beta_u, self.beta_a, self.iterations,
            inverse_temperature=self.inverse_temperature, normalize_over_outputs=self.normalize_over_outputs,
            normalize_costs=self.normalize_costs, eps=self.eps, return_routing=return_routing,
        )

    def _repr(self) -> str:
        lam = ", ".join(f"{x:.3g}" for x in self.inverse_temperature)
        return (f"iterations={self.iterations}, inverse_temperature=[{lam}], "
                f"normalize_over_outputs={self.normalize_over_outputs}, normalize_costs={self.normalize_costs}")


class EMRouting(_EMOptions):
    """Fully-connected matrix-capsule layer with EM routing:
    ``poses [B, n_inp, P*P], a_in [B, n_inp] -> (poses [B, n_out, P*P], a_out [B, n_out])``.

    Owns one ``P x P`` transformation per (input, output) pair, ``weight [n_inp, n_out, P, P]``
    (``N(0, init_std^2)``; ``init_std = 1/sqrt(P)`` keeps the vote variance equal to the pose variance),
    and ``beta_u``, ``beta_a`` ``[n_out]``. ``route(votes, a_in)`` runs :func:`em_routing` on given votes.
    ``forward(..., return_routing=True)`` returns ``((mu, a_out), trace)``.
    """

    def __init__(self, n_inp: int, n_out: int, pose_size: int = 4, iterations: int = 3, *,
                 inverse_temperature: float | Sequence[float] | None = None, normalize_over_outputs: bool = False,
                 normalize_costs: bool = True, eps: float = 1e-8, init_std: float | None = None) -> None:
        super().__init__(n_out, iterations, inverse_temperature, normalize_over_outputs, normalize_costs, eps)
        self.n_inp, self.n_out, self.pose_size = n_inp, n_out, pose_size
        std = init_std if init_std is not None else pose_size ** -0.5
        self.weight = _init_weight((n_inp, n_out, pose_size, pose_size), std)

    def votes(self, poses: torch.Tensor) -> torch.Tensor:
        """``[B, n_inp, P*P] -> [B, n_inp, n_out, P*P]``."""
        d = self.pose_size ** 2
        check_tensor(poses, "poses", f"[B, n_inp={self.n_inp}, d={d}]", [None, self.n_inp, d])
        return matrix_votes(poses, self.weight)

    def forward(self, poses: torch.Tensor, a_in: torch.Tensor, return_routing: bool = False):
        check_module_input(poses, self, type(self).__name__, dtype=False)
        return self.route(self.votes(poses), a_in, return_routing)

    def extra_repr(self) -> str:
        return f"n_inp={self.n_inp}, n_out={self.n_out}, pose_size={self.pose_size}, " + self._repr()


# ----------------------------------------------------------------------------------------------------
# Convolutional matrix-capsule layers
# ----------------------------------------------------------------------------------------------------
def _check_grid(poses: torch.Tensor, acts: torch.Tensor, n_types: int, d: int) -> None:
    check_tensor(poses, "poses", f"[B, n_types={n_types}, H, W, d={d}]", [None, n_types, None, None, d])
    B, T, H, W, _ = poses.shape
    check_tensor(acts, "activations", f"[B, n_types={n_types}, H, W]", [None, n_types, None, None])
    if tuple(acts.shape) != (B, T, H, W):
        raise ValueError(f"activations: expected shape [B, n_types, H, W] = {(B, T, H, W)} "
                         f"(matching poses), got {tuple(acts.shape)}")


class MatrixPrimaryCapsules(nn.Module):
    """Primary matrix capsules: ``[B, A, H, W] -> (poses [B, n_types, h, w, P*P], activations [B, n_types, h, w])``.

    Two convolutions on the same input (1x1 by default, as in the paper): one with ``n_types * P*P``
    channels for the poses (output channel ``t*P*P + d`` is pose entry ``d`` of type ``t``, row-major), one
    with ``n_types`` channels and a sigmoid for the activations. Parameters:
    ``A*n_types*(P*P+1)*k*k + n_types*(P*P+1)``.
    """

    def __init__(self, in_channels: int, n_types: int, pose_size: int = 4, kernel_size: int = 1,
                 stride: int = 1, padding: int = 0) -> None:
        super().__init__()
        self.in_channels, self.n_types, self.pose_size = in_channels, n_types, pose_size
        self.pose = nn.Conv2d(in_channels, n_types * pose_size ** 2, kernel_size, stride, padding)
        self.activation = nn.Conv2d(in_channels, n_types, kernel_size, stride, padding)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_tensor(x, "x", f"[B, A={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        p = self.pose(x)                                            # [B, T*D, h, w]
        B, _, h, w = p.shape
        poses = p.view(B, self.n_types, self.pose_size ** 2, h, w).permute(0, 1, 3, 4, 2)  # [B, T, h, w, D]
        acts = torch.sigmoid(self.activation(x))                    # [B, T, h, w]
        return poses, acts


class ConvCapsules(_EMOptions):
    """Convolutional matrix capsules with EM routing:
    ``poses [B, T_in, H, W, P*P], activations [B, T_in, H, W] -> ([B, T_out, h, w, P*P], [B, T_out, h, w])``.

    One ``P x P`` transformation per (kernel offset, input type, output type), shared over positions:
    ``weight [K, K, T_in, T_out, P, P]`` plus ``beta_u``, ``beta_a [T_out]`` (``K*K*T_in*T_out*P*P + 2*T_out``
    parameters). The ``K*K*T_in`` children of each output position's window vote ``V = M W`` (4x4 matrix
    product) for the ``T_out`` parents at that position, and EM routing runs over that window.

    Windows are gathered with ``F.unfold`` and routed **independently per output position**: a child that
    lies in several overlapping windows (K > stride) is assigned separately in each, so its R does not
    sum to 1 over *all* parents at all positions that see it (Gritzman's "pitfall 3"; the IBM code shares
    one R across windows). ``h = (H + 2*padding - K) // stride + 1``; zero padding adds children with
    activation 0, which carry no weight.
    """

    def __init__(self, in_types: int, out_types: int, kernel_size: int = 3, stride: int = 1, padding: int = 0,
                 pose_size: int = 4, iterations: int = 3, *,
                 inverse_temperature: float | Sequence[float] | None = None, normalize_over_outputs: bool = False,
                 normalize_costs: bool = True, eps: float = 1e-8, init_std: float | None = None) -> None:
        super().__init__(out_types, iterations, inverse_temperature, normalize_over_outputs, normalize_costs, eps)
        self.in_types, self.out_types, self.kernel_size = in_types, out_types, kernel_size
        self.stride, self.padding, self.pose_size = stride, padding, pose_size
        std = init_std if init_std is not None else pose_size ** -0.5
        self.weight = _init_weight((kernel_size, kernel_size, in_types, out_types, pose_size, pose_size), std)

    def output_size(self, size: int) -> int:
        return (size + 2 * self.padding - self.kernel_size) // self.stride + 1

    def votes(self, poses: torch.Tensor, acts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Window votes ``[B, h, w, K*K*T_in, T_out, P*P]`` and children activations ``[B, h, w, K*K*T_in]``
        (child index ``i = (u*K + v)*T_in + t``)."""
        P, K, T, D = self.pose_size, self.kernel_size, self.in_types, self.pose_size ** 2
        _check_grid(poses, acts, T, D)
        B, _, H, W, _ = poses.shape
        h, w = self.output_size(H), self.output_size(W)
        if h < 1 or w < 1:
            raise ValueError(f"poses: grid {H}x{W} is smaller than the kernel {K} (padding {self.padding})")
        x = poses.permute(0, 1, 4, 2, 3).reshape(B, T * D, H, W)    # [B, T*D, H, W]
        cols = F.unfold(x, K, padding=self.padding, stride=self.stride)  # [B, T*D*K*K, h*w]
        M = cols.view(B, T, P, P, K, K, h, w)                       # [B, t, p, q, u, v, h, w]
        V = torch.einsum("btpquvhw,uvtjqr->bhwuvtjpr", M, self.weight)  # [B, h, w, K, K, T, J, P, P]
        V = V.reshape(B, h, w, K * K * T, self.out_types, D)        # [B, h, w, I, J, D]
        ac = F.unfold(acts, K, padding=self.padding, stride=self.stride)  # [B, T*K*K, h*w]
        ac = ac.view(B, T, K, K, h, w).permute(0, 4, 5, 2, 3, 1).reshape(B, h, w, K * K * T)  # [B, h, w, I]
        return V, ac

    def forward(self, poses: torch.Tensor, acts: torch.Tensor, return_routing: bool = False):
        check_module_input(poses, self, type(self).__name__, dtype=False)
        V, a = self.votes(poses, acts)                              # [B, h, w, I, J, D], [B, h, w, I]
        out = self.route(V, a, return_routing)
        (mu, a_out), trace = out if return_routing else (out, None)
        mu = mu.permute(0, 3, 1, 2, 4)                              # [B, J, h, w, D]
        a_out = a_out.permute(0, 3, 1, 2)                           # [B, J, h, w]
        return ((mu, a_out), trace) if return_routing else (mu, a_out)

    def extra_repr(self) -> str:
        return (f"in_types={self.in_types}, out_types={self.out_types}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, " + self._repr())


def grid_centers(height: int, width: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Scaled centres ``((y + 0.5) / height, (x + 0.5) / width)`` of a ``height x width`` grid: ``[H, W, 2]``."""
    ys = (torch.arange(height, device=device, dtype=dtype) + 0.5) / height  # [H]
    xs = (torch.arange(width, device=device, dtype=dtype) + 0.5) / width    # [W]
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)        # [H, W, 2]


class ClassCapsules(_EMOptions):
    """Class capsules with EM routing from every position and type:
    ``poses [B, T, H, W, P*P], activations [B, T, H, W] -> (poses [B, K, P*P], activations [B, K])``.

    One ``P x P`` transformation per (input type, class), shared over positions: ``weight [T, K, P, P]`` plus
    ``beta_u``, ``beta_a [K]`` (``T*K*P*P + 2*K`` parameters). Children are all ``H*W*T`` capsules (order
    ``i = (y*W + x)*T + t``).

    **Coordinate addition** (paper, Sec. 3): the scaled (row, column) coordinates of the centre of each
    child's receptive field are added to the first two elements of the right-hand column of its vote
    matrix, i.e. flat entries ``(P-1, 2P-1)`` = ``(3, 7)`` for 4x4 row-major poses. ``centers [H, W, 2]`` (row,
    column) are passed by the model (receptive-field centres in the image, scaled to ``[0, 1]``); without them
    the child grid's own cell centres :func:`grid_centers` are used. yl-1993 adds ``arange(H)/H`` to flat
    entries ``(0, 1)`` instead: ``coord_entries=(0, 1)``.
    """

    def __init__(self, in_types: int, n_classes: int, pose_size: int = 4, iterations: int = 3, *,
                 coord_add: bool = True, coord_entries: tuple[int, int] | None = None,
                 inverse_temperature: float | Sequence[float] | None = None, normalize_over_outputs: bool = False,
                 normalize_costs: bool = True, eps: float = 1e-8, init_std: float | None = None) -> None:
        super().__init__(n_classes, iterations, inverse_temperature, normalize_over_outputs, normalize_costs, eps)
        self.in_types, self.n_classes, self.pose_size, self.coord_add = in_types, n_classes, pose_size, coord_add
        D = pose_size ** 2
        entries = coord_entries if coord_entries is not None else (pose_size - 1, 2 * pose_size - 1)
        if not all(0 <= e < D for e in entries) or entries[0] == entries[1]:
            raise ValueError(f"coord_entries must be two distinct indices in [0, {D}), got {entries}")
        self.coord_entries = tuple(entries)
        basis = torch.zeros(2, D)
        basis[0, entries[0]] = 1.0  # row coordinate
        basis[1, entries[1]] = 1.0  # column coordinate
        self.register_buffer("coord_basis", basis, persistent=False)  # [2, D]
        std = init_std if init_std is not None else pose_size ** -0.5
        self.weight = _init_weight((in_types, n_classes, pose_size, pose_size), std)

    def votes(self, poses: torch.Tensor, acts: torch.Tensor,
              centers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Votes ``[B, H*W*T, K, P*P]`` (with coordinate addition) and activations ``[B, H*W*T]``."""
        P, T, D = self.pose_size, self.in_types, self.pose_size ** 2
        _check_grid(poses, acts, T, D)
        B, _, H, W, _ = poses.shape
        M = poses.reshape(B, T, H, W, P, P)                         # [B, T, H, W, P, P]
        V = torch.einsum("bthwpq,tjqr->bhwtjpr", M, self.weight)    # [B, H, W, T, K, P, P]
        V = V.reshape(B, H, W, T, self.n_classes, D)                # [B, H, W, T, K, D]
        if self.coord_add:
            if centers is None:
                centers = grid_centers(H, W, device=V.device)
            check_tensor(centers, "centers", f"[H={H}, W={W}, 2]", [H, W, 2])
            offset = torch.einsum("hwc,cd->hwd", centers.to(self.coord_basis.dtype), self.coord_basis)  # [H, W, D]
            V = V + offset[:, :, None, None, :].to(V.dtype)         # [B, H, W, T, K, D]
        V = V.reshape(B, H * W * T, self.n_classes, D)              # [B, I, K, D]
        a = acts.permute(0, 2, 3, 1).reshape(B, H * W * T)          # [B, I]
        return V, a

    def forward(self, poses: torch.Tensor, acts: torch.Tensor, centers: torch.Tensor | None = None,
                return_routing: bool = False):
        V, a = self.votes(poses, acts, centers)
        return self.route(V, a, return_routing)

    def extra_repr(self) -> str:
        return (f"in_types={self.in_types}, n_classes={self.n_classes}, coord_add={self.coord_add}, "
                f"coord_entries={self.coord_entries}, " + self._repr())
