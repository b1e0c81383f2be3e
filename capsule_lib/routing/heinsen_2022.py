"""Heinsen (2022) efficient *vector* routing: "An Algorithm for Routing Vectors in Sequences", arXiv 2211.11754.

:func:`efficient_vector_routing_reference` is the algorithm as the paper writes it, a step per line;
:func:`efficient_vector_routing` / :class:`EfficientVectorRouting` compute the same values and gradients (tested in
float64) with a mask, per-example betas (variable-length inputs), a trace, and without materialising the votes
(``memory_efficient``).

The same E-step / D-step / M-step loop as the 2019 routing (:mod:`~capsule_lib.routing.heinsen_2019`), on vectors:
an output's "bang per bit" ``phi_ij = beta_use D_use_ij - beta_ign D_ign_ij`` weights the votes directly, and the
agreements compare each input with the output's prediction of it.

Index names used in every einsum below::

    b  batch                  i  input vector           j  output vector
    d  input size (d_inp)     e  output size (d_out)    ...  any number of leading (batch-like) dimensions

Numerics: the routing body runs with autocast disabled, in float32 (float64 stays float64), and the
results are cast back to the input dtype (safe under fp16/bf16 autocast, on zero inputs and on inputs x1e3).

Differences from the public code (glassroom/heinsen_routing), none of which changes the math:

* internals in float32 with autocast off (the public code runs in whatever dtype it is given);
* ``return_routing=True`` returns a :class:`RoutingTrace` with every iteration (the public ``return_dict`` gives
  the final state only and raises ``UnboundLocalError`` with ``iterations=1``);
* :class:`EfficientVectorRouting` takes the boolean ``mask`` described in the spec (True = ignore): masked
  pairs get ``a = -inf`` and routing logit ``-inf``; the t = 0 uniform shares are spread over the unmasked
  outputs only, and an input masked for every output gets all-zero shares instead of NaN.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_iterations, check_module_input, check_nonempty, check_tensor
from ..types import Routed, RoutingTrace
from ._common import (
    RoutingProtocol,
    autocast_outputs,
    check_one_or,
    compute_dtype,
    fields_repr,
    no_autocast,
    refuse_activations,
    split_trace,
)

__all__ = [
    "efficient_vector_routing_reference",
    "efficient_vector_routing",
    "VectorRoutingWeights",
    "EfficientVectorRouting",
]


def efficient_vector_routing_reference(
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
    eps: float = 1e-5,
) -> torch.Tensor:
    """Heinsen (2022) routing as the paper writes it.

    ``x_inp [B, n_inp, d_inp]`` and the parameters of
    :func:`efficient_vector_routing` (``beta_use``, ``beta_ign``
    ``[n_inp, n_out]``) -> ``x_out [B, n_out, d_out]``. This is the
    definition: :func:`efficient_vector_routing` computes the same values
    and gradients (tested in float64).
    """
    N = _normalize  # LayerNorm without affine parameters
    x = x_inp * x_inp.shape[1] ** -0.5  # [B, i, d] x~ = x / sqrt(I)
    f = torch.sigmoid(torch.einsum("bid,id->bi", x, W_A) + B_A)  # [B, i]
    f = f[..., None]  # [B, i, 1] f(a_i)
    V = torch.einsum("bid,jd,de->bije", x, W_F1, W_F2) + B_F2  # [B, i, j, e]
    R = torch.full_like(V[..., 0], 1.0 / V.shape[2])  # [B, i, j] 1/J
    for _ in range(iterations):
        D_use = f * R  # [B, i, j] D-step: data used
        D_ign = f - D_use  # [B, i, j] data ignored
        phi = beta_use * D_use - beta_ign * D_ign  # [B, i, j] M-step
        x_out = torch.einsum("bij,bije->bje", phi, V)  # [B, j, e]
        # E-step (for the next iteration): each output predicts the
        # inputs; S_ij scores input i against output j's prediction
        pred = torch.einsum("bje,ed,jd->bjd", N(x_out, eps), W_G1, W_G2)
        pred = pred + B_G2  # [B, j, d]
        S = torch.einsum("bid,bjd->bij", x_inp, pred) * W_S + B_S
        R = torch.softmax(F.logsigmoid(S), dim=2)  # [B, i, j]
    return N(x_out, eps)


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``N``: LayerNorm over the last axis without affine parameters; identity for ``d_out = 1``."""
    return F.layer_norm(x, x.shape[-1:], eps=eps) if x.shape[-1] > 1 else x


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


class VectorRoutingWeights(NamedTuple):
    """The weights of Heinsen (2022) routing besides the betas, grouped (:func:`efficient_vector_routing` takes them
    so, or any object with these attributes: an :class:`EfficientVectorRouting` itself). Names as in the
    ``heinsen_routing`` package; ``I' = I``, or 1 when shared by a variable number of inputs."""

    W_A: torch.Tensor  # [I', d_inp]      input activations a_i = x~_i . W_A,i + B_A,i
    B_A: torch.Tensor  # [I']
    W_F1: torch.Tensor  # [J, d_inp]      votes V_ij = (x~_i * W_F1,j) W_F2 + B_F2,j
    W_F2: torch.Tensor  # [d_inp, d_out]
    B_F2: torch.Tensor  # [J, d_out]
    W_G1: torch.Tensor  # [d_out, d_inp]  predictions pred_j = (N(x_out_j) W_G1) * W_G2,j + B_G2,j
    W_G2: torch.Tensor  # [J, d_inp]
    B_G2: torch.Tensor  # [J, d_inp]
    W_S: torch.Tensor  # [I', J]          agreements S_ij = log sigmoid((x_i . pred_j) W_S,ij + B_S,ij)
    B_S: torch.Tensor  # [I', J]

    @classmethod
    def of(cls, weights: Any) -> VectorRoutingWeights:
        """The weights read from ``weights`` (this tuple, or any object with the ten attributes, e.g. the layer)."""
        return cls(*(getattr(weights, name) for name in cls._fields))


def efficient_vector_routing(
    x_inp: torch.Tensor,
    weights: VectorRoutingWeights | nn.Module,
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
    x_inp : torch.Tensor
        ``[..., I, d_inp]``, the input vectors ``x``.
    weights : VectorRoutingWeights or EfficientVectorRouting
        The ten weights, grouped (:class:`VectorRoutingWeights`, or the layer): ``W_A [I', d_inp]``, ``B_A [I']``
        make the input activations ``a_i = x~_i . W_A,i + B_A,i`` with ``x~ = x / sqrt(I)``; ``W_F1 [J, d_inp]``,
        ``W_F2 [d_inp, d_out]``, ``B_F2 [J, d_out]`` the votes ``V_ij = (x~_i * W_F1,j) W_F2 + B_F2,j``;
        ``W_G1 [d_out, d_inp]``, ``W_G2 [J, d_inp]``, ``B_G2 [J, d_inp]`` the predictions of the inputs
        ``pred_j = (N(x_out_j) W_G1) * W_G2,j + B_G2,j``; ``W_S``, ``B_S [I', J]`` the agreements
        ``S_ij = log sigmoid((x_i . pred_j) W_S,ij + B_S,ij)`` (unscaled x).
    beta_use, beta_ign : torch.Tensor
        ``[I, J]`` or per example ``[..., I, J]`` (``Linear(d_inp -> J)`` of x when ``n_inp = -1``).
    iterations : int, optional
        Iterations, >= 1 (default 2, the paper's). ``iterations=1`` works here, trace included (the public
        ``return_dict=True`` path raises ``UnboundLocalError`` for ``iterations=1``).
    normalize : bool, optional
        Apply ``N`` (LayerNorm without affine, identity when ``d_out = 1``) to the final outputs (default True).
    memory_efficient : bool, optional
        Never materialise ``V [..., I, J, d_out]``; contract ``phi`` with ``x~`` first
        (same result up to rounding). Default True.
    mask : torch.Tensor or None, optional
        Bool ``[I, J]`` or batch-broadcastable ``[..., I, J]``; **True = ignore the pair**. A masked
        pair gets ``a = -inf`` (so ``D_use = D_ign = phi = 0``) and routing logit ``-inf``; for a padding mask
        ``pad [B, I]`` pass ``pad[..., None]``. An input masked for every output gets all-zero ``R``. Masked
        input values must be finite (they are multiplied by 0). ``None`` (default): no mask.
    ln_eps : float, optional
        The epsilon of ``N`` (default 1e-5).
    return_routing : bool, optional
        Also return a :class:`RoutingTrace` (default False).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        ``x_out [..., J, d_out]`` in ``x_inp``'s dtype; with ``return_routing=True``, ``(x_out, trace)``, the trace
        (``algorithm="heinsen_2022"``) holding per-iteration ``coefficients`` R ``[..., I, J]`` (t = 0 uniform),
        ``agreements`` S ``[..., I, J]`` (the log-sigmoid logits computed from that iteration's outputs),
        ``outputs`` x_out ``[..., J, d_out]`` (normalised if ``normalize``), and in ``extra`` the lists ``phi``,
        ``D_use``, ``D_ign``, ``pred_x_inp`` plus ``a_inp`` ``[..., I]`` (and ``V`` when not ``memory_efficient``).
    """
    w = VectorRoutingWeights.of(weights)
    _check_inputs(x_inp, w, beta_use, beta_ign, iterations)
    (I, D), J = x_inp.shape[-2:], w.B_F2.shape[0]
    mask = _check_mask(mask, x_inp.shape[:-2], I, J)
    out_dtype = x_inp.dtype
    ct = compute_dtype(out_dtype)
    trace = RoutingTrace("heinsen_2022") if return_routing else None
    with no_autocast(x_inp):
        x = x_inp.to(ct)  # [..., I, D]
        W_A, B_A, W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S, B_S, beta_use, beta_ign = (
            p.to(ct) for p in (*w, beta_use, beta_ign)
        )
        scaled_x_inp = x * I**-0.5  # [..., I, D]  x~ = x / sqrt(I)
        a_inp = torch.einsum("...id,id->...i", scaled_x_inp, W_A.expand(I, D)) + B_A.expand(I)  # [..., I]
        f_a_inp = torch.sigmoid(a_inp).unsqueeze(-1)  # [..., I, 1]
        if mask is not None:
            f_a_inp = torch.where(mask, 0.0, f_a_inp)  # [..., I, J]  a = -inf on masked pairs
        V = None
        if not memory_efficient:
            V = torch.einsum("...id,jd,de->...ije", scaled_x_inp, W_F1, W_F2) + B_F2  # [..., I, J, E]
        params = (W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S.expand(I, J), B_S.expand(I, J), beta_use, beta_ign)
        x_out = _route(x, scaled_x_inp, f_a_inp, V, params, iterations, mask, ln_eps, normalize, trace, out_dtype)
        if normalize:
            x_out = _normalize(x_out, ln_eps)  # [..., J, E]
    x_out = x_out.to(out_dtype)
    if trace is not None:
        trace.extra["a_inp"] = a_inp
        if V is not None:
            trace.extra["V"] = V
        return x_out, trace
    return x_out


def _check_inputs(
    x_inp: torch.Tensor, w: VectorRoutingWeights, beta_use: torch.Tensor, beta_ign: torch.Tensor, iterations: int
) -> None:
    """One-line errors for :func:`efficient_vector_routing`'s arguments."""
    W_A, B_A, W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S, B_S = w
    check_iterations(iterations)
    check_tensor(x_inp, "x_inp", "[..., n_inp, d_inp]", [None, None], min_leading=0)
    check_nonempty(x_inp, "x_inp", "[..., n_inp, d_inp]", leading=x_inp.dim() - 2)
    I, D = x_inp.shape[-2:]
    check_tensor(B_F2, "B_F2", "[n_out, d_out]", [None, None])
    J, E = B_F2.shape
    check_one_or(W_A, "W_A", f"[n_inp={I} or 1, d_inp={D}]", I, [D])
    check_one_or(B_A, "B_A", f"[n_inp={I} or 1]", I, [])
    check_tensor(W_F1, "W_F1", f"[n_out={J}, d_inp={D}]", [J, D])
    check_tensor(W_F2, "W_F2", f"[d_inp={D}, d_out={E}]", [D, E])
    check_tensor(W_G1, "W_G1", f"[d_out={E}, d_inp={D}]", [E, D])
    check_tensor(W_G2, "W_G2", f"[n_out={J}, d_inp={D}]", [J, D])
    check_tensor(B_G2, "B_G2", f"[n_out={J}, d_inp={D}]", [J, D])
    check_one_or(W_S, "W_S", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    check_one_or(B_S, "B_S", f"[n_inp={I} or 1, n_out={J}]", I, [J])
    for name, b in (("beta_use", beta_use), ("beta_ign", beta_ign)):
        check_tensor(b, name, f"[..., n_inp={I}, n_out={J}]", [I, J], min_leading=0)


def _route(
    x: torch.Tensor,
    scaled_x_inp: torch.Tensor,
    f_a_inp: torch.Tensor,
    V: torch.Tensor | None,
    params: tuple[torch.Tensor, ...],
    iterations: int,
    mask: torch.Tensor | None,
    ln_eps: float,
    normalize: bool,
    trace: RoutingTrace | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The loop of :func:`efficient_vector_routing` (parameters expanded, in the compute dtype), as in
    :func:`efficient_vector_routing_reference`, with a mask, without the votes when ``V`` is ``None``, and a trace.
    Returns the last iteration's ``x_out [..., J, E]`` before the final normalisation."""
    W_F1, W_F2, B_F2, W_G1, W_G2, B_G2, W_S, B_S, beta_use, beta_ign = params  # expanded, in x's dtype
    lead, (I, J) = x.shape[:-2], W_S.shape
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
            pred_x_inp = torch.einsum("...je,ed,jd->...jd", _normalize(x_out, ln_eps), W_G1, W_G2) + B_G2  # [..., J, D]
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
    return x_out


class EfficientVectorRouting(RoutingProtocol, nn.Module):
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

    ``iterations=1`` is supported, including ``return_routing=True`` (the public ``return_dict=True`` raises
    ``UnboundLocalError`` there).

    Parameters
    ----------
    n_inp : int
        Number of inputs (> 0), or ``-1`` for a variable number (the betas are then computed from x).
    n_out : int
        Number of outputs, >= 2 (as in the package).
    d_inp, d_out : int
        Sizes of the input and output vectors; ``d_out = 1`` routes a sequence to ``n_out`` scalars
        (sequence -> vector).
    iterations : int, optional
        Routing iterations, >= 1 (default 2).
    normalize, memory_efficient : bool, optional
        As in :func:`efficient_vector_routing` (default True each).
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
        check_iterations(iterations)
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
        """``(beta_use, beta_ign)``: the ``[n_inp, n_out]`` parameters, or ``[..., n, n_out]`` from x if variable.

        Parameters
        ----------
        x_inp : torch.Tensor
            ``[..., n, d_inp]``, the inputs (read only when ``n_inp = -1``).

        Returns
        -------
        tuple[torch.Tensor, torch.Tensor]
            ``beta_use``, ``beta_ign``; computed in float32 (float64 for float64 inputs) when variable.
        """
        if self.n_inp > 0:
            return self.beta_use, self.beta_ign
        ct = compute_dtype(x_inp.dtype)
        with no_autocast(x_inp):
            x = x_inp.to(ct)
            return tuple(
                F.linear(x, m.weight.to(ct), m.bias.to(ct))  # [..., I, J]
                for m in (self.compute_beta_use, self.compute_beta_ign)
            )

    def forward(
        self,
        x_inp: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_routing: bool = False,
        iterations: int | None = None,
    ):
        """Route the input vectors to the output vectors.

        Parameters
        ----------
        x_inp : torch.Tensor
            ``[..., n_inp, d_inp]``, the input vectors.
        mask : torch.Tensor or None, optional
            Bool ``[n_inp, n_out]`` or batch-broadcastable, True = ignore the pair (see
            :func:`efficient_vector_routing`); ``None`` (default): no mask.
        return_routing, iterations : optional
            As in :meth:`~capsule_lib.routing.dynamic.DynamicRouting.forward` (defaults False and ``None``: the
            module's).

        Returns
        -------
        torch.Tensor or tuple[torch.Tensor, RoutingTrace]
            ``x_out [..., n_out, d_out]`` (the autocast dtype under autocast), or ``(x_out, trace)`` with
            ``return_routing=True``.
        """
        check_module_input(x_inp, self, type(self).__name__, dtype=False)
        I = self.n_inp if self.n_inp > 0 else None
        check_tensor(x_inp, "x_inp", f"[..., n_inp={I or '*'}, d_inp={self.d_inp}]", [I, self.d_inp], min_leading=0)
        beta_use, beta_ign = self.betas(x_inp)
        return autocast_outputs(
            efficient_vector_routing(
                x_inp,
                self,
                beta_use,
                beta_ign,
                self.iterations if iterations is None else iterations,
                normalize=self.normalize,
                memory_efficient=self.memory_efficient,
                mask=mask,
                return_routing=return_routing,
            ),
            x_inp.device.type,
        )

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> EfficientVectorRouting:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (the layer's defaults)."""
        return cls(n_inp, n_out, d, d, iterations)

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: :meth:`forward` without a mask; no input or output activations."""
        refuse_activations(activations, self)
        x_out, trace = split_trace(self(poses, return_routing=return_routing, iterations=iterations), return_routing)
        return Routed(x_out, None, trace)  # [B, n_out, d_out]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]``: one D-step and M-step (the E-step's weights
        ``W_G1``, ``W_G2``, ``B_G2``, ``W_S``, ``B_S`` are not used)."""
        refuse_activations(activations, self)
        w, (b_use, b_ign) = VectorRoutingWeights.of(self), self.betas(poses)
        I, D = poses.shape[-2:]
        x = poses * I**-0.5  # [B, i, d] x~
        f = torch.sigmoid(torch.einsum("bid,id->bi", x, w.W_A.expand(I, D)) + w.B_A.expand(I)).unsqueeze(-1)
        V = torch.einsum("bid,jd,de->bije", x, w.W_F1, w.W_F2) + w.B_F2  # [B, i, j, e]
        D_use = f * R.to(V.dtype)  # [B, i, j]
        phi = b_use * D_use - b_ign * (f - D_use)  # [B, i, j]
        x_out = torch.einsum("bij,bije->bje", phi, V)  # [B, j, e]
        return Routed(_normalize(x_out, 1e-5) if self.normalize else x_out, None, None)

    def extra_repr(self) -> str:
        return fields_repr(self, "n_inp", "n_out", "d_inp", "d_out", "iterations", "normalize", "memory_efficient")
