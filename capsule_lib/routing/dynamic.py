"""Dynamic routing between capsules (Sabour, Frosst & Hinton, 2017).

Index names (in the einsum and the shape comments below)::

    b  batch            i  input (child) capsule      j  output (parent) capsule
    d  input capsule dimension                         e  output capsule dimension

Per iteration ``t = 1..T``::

    c_ij  = softmax_j(b_ij)                    coupling coefficients, sum to 1 over the PARENTS j
    s_j   = sum_i c_ij u_hat_{j|i} (+ bias_j)  weighted sum of votes
    v_j   = squash(s_j)
    b_ij += u_hat_{j|i} . v_j                  agreement (skipped after the last iteration: unused)

``coupling="children"`` reproduces the most-copied PyTorch port (gram-ai/capsule-networks, issue #10),
which takes the softmax over the 1152 *input* capsules instead; it is here only for comparison.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_module_input, check_tensor
from ..functional import squash
from ..types import RoutingTrace

__all__ = ["dynamic_routing", "DynamicRouting", "capsule_votes"]

_COUPLING = ("parents", "children")


def capsule_votes(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Votes ``u_hat_{j|i} = W_ij^T u_i``: ``u [B, n_inp, d_inp]``, ``W [n_inp, n_out, d_inp, d_out]``
    -> ``[B, n_inp, n_out, d_out]``."""
    return torch.einsum("bid,ijde->bije", u, weight)  # [B, I, J, E]


def _coupling(logits: torch.Tensor, coupling: str, leaky: bool) -> torch.Tensor:
    """Softmax of ``logits [B, J, I]`` (parent-major) over parents (or children), optionally leaky."""
    if coupling == "children":
        return torch.softmax(logits, dim=2)  # sums to 1 over i (the bug)
    if leaky:  # an extra all-zero "orphan" parent absorbs votes that agree with nobody
        padded = torch.cat([torch.zeros_like(logits[:, :1]), logits], dim=1)  # [B, J+1, I]
        return torch.softmax(padded, dim=1)[:, 1:]  # [B, J, I]
    return torch.softmax(logits, dim=1)  # [B, J, I]


def dynamic_routing(
    votes: torch.Tensor,
    iterations: int = 3,
    bias: torch.Tensor | None = None,
    *,
    leaky: bool = False,
    coupling: str = "parents",
    squash_kind: str = "hinton",
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """Route ``votes [B, n_inp, n_out, d_out]`` to output capsules ``[B, n_out, d_out]``.

    Nothing is detached: gradients flow through every iteration, as in the official code. Internally the
    votes are laid out parent-major, ``[B, J, I, E]`` (one copy), so that both per-iteration contractions
    are contiguous batched matrix products; the trace's tensors are ``[B, I, J]`` views of that layout.

    Parameters
    ----------
    votes
        the prediction vectors ``u_hat_{j|i}``.
    iterations
        number of routing iterations ``T`` (>= 1); the paper uses 3.
    bias
        optional output bias ``[n_out, d_out]`` added to ``s_j`` (official code, init 0.1).
    leaky
        add an all-zero extra logit before the softmax (official "leaky routing").
    coupling
        ``"parents"`` (correct: sum to 1 over j) or ``"children"`` (gram-ai bug: over i).
    return_routing
        also return a :class:`RoutingTrace` with per-iteration coefficients ``[B, I, J]``,
        agreements ``[B, I, J]`` and outputs ``[B, J, E]``; ``extra`` holds the final ``logits`` and the
        ``votes``.
    """
    check_tensor(votes, "votes", "[B, n_inp, n_out, d_out]", [None, None, None, None])
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if coupling not in _COUPLING:
        raise ValueError(f"coupling must be one of {_COUPLING}, got {coupling!r}")
    B, I, J, E = votes.shape
    if bias is not None:
        check_tensor(bias, "bias", f"[n_out={J}, d_out={E}]", [J, E])
    trace = RoutingTrace("dynamic") if return_routing else None
    vj = votes.transpose(1, 2).contiguous()  # [B, J, I, E]
    logits = votes.new_zeros(B, J, I, dtype=torch.float32)  # b_ij (parent-major), kept in fp32
    v = votes.new_zeros(B, J, E)
    for t in range(iterations):
        c = _coupling(logits, coupling, leaky)  # [B, J, I]
        s = torch.matmul(c.to(vj.dtype).unsqueeze(2), vj).squeeze(2)  # [B, J, 1, I] @ [B, J, I, E] -> [B, J, E]
        if bias is not None:
            s = s + bias.to(s.dtype)
        v = squash(s, squash_kind)  # [B, J, E]
        last = t == iterations - 1
        if not last or trace is not None:
            agree = torch.matmul(vj, v.unsqueeze(-1)).squeeze(-1).float()  # u_hat_{j|i} . v_j: [B, J, I]
            if not last:
                logits = logits + agree
        if trace is not None:
            trace.coefficients.append(c.transpose(1, 2))  # [B, I, J]
            trace.agreements.append(agree.transpose(1, 2))  # [B, I, J]
            trace.outputs.append(v)
    if trace is not None:
        trace.extra["logits"] = logits.transpose(1, 2)  # [B, I, J] final routing logits
        trace.extra["votes"] = votes  # [B, I, J, E] (a reference, no copy), for "who votes for whom" figures
        return v, trace
    return v


class DynamicRouting(nn.Module):
    """Fully-connected capsule layer with dynamic routing: ``[B, n_inp, d_inp] -> [B, n_out, d_out]``.

    Holds one transformation matrix per (input, output) pair, ``W [n_inp, n_out, d_inp, d_out]``, and an
    optional output bias ``[n_out, d_out]``. ``forward(u, return_routing=True)`` also returns the
    :class:`RoutingTrace`.
    """

    def __init__(
        self,
        n_inp: int,
        n_out: int,
        d_inp: int,
        d_out: int,
        iterations: int = 3,
        *,
        bias: bool = True,
        leaky: bool = False,
        coupling: str = "parents",
        squash_kind: str = "hinton",
        init_std: float = 0.01,
        bias_init: float = 0.1,
    ) -> None:
        super().__init__()
        if coupling not in _COUPLING:
            raise ValueError(f"coupling must be one of {_COUPLING}, got {coupling!r}")
        self.n_inp, self.n_out, self.d_inp, self.d_out = n_inp, n_out, d_inp, d_out
        self.iterations, self.leaky, self.coupling, self.squash_kind = iterations, leaky, coupling, squash_kind
        self.weight = nn.Parameter(torch.randn(n_inp, n_out, d_inp, d_out) * init_std)
        self.bias = nn.Parameter(torch.full((n_out, d_out), float(bias_init))) if bias else None

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """``[B, n_inp, d_inp] -> [B, n_inp, n_out, d_out]``."""
        check_tensor(u, "u", f"[B, n_inp={self.n_inp}, d_inp={self.d_inp}]", [None, self.n_inp, self.d_inp])
        return capsule_votes(u, self.weight)

    def forward(self, u: torch.Tensor, return_routing: bool = False):
        check_module_input(u, self, type(self).__name__, dtype=False)
        return dynamic_routing(
            self.votes(u),
            self.iterations,
            self.bias,
            leaky=self.leaky,
            coupling=self.coupling,
            squash_kind=self.squash_kind,
            return_routing=return_routing,
        )

    def extra_repr(self) -> str:
        return (
            f"n_inp={self.n_inp}, n_out={self.n_out}, d_inp={self.d_inp}, d_out={self.d_out}, "
            f"iterations={self.iterations}, coupling={self.coupling!r}, leaky={self.leaky}"
        )
