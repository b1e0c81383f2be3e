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

**Presets** (:data:`DYNAMIC_PRESETS`, ``DynamicRouting.preset(name, ...)``) reproduce public implementations'
numerics (checked in float64 against loop-by-loop re-implementations written from their descriptions):

==============  ==========  ======  ===================  =============  ===========================
preset          coupling    bias    squash kind          detach         W init std
==============  ==========  ======  ===================  =============  ===========================
``ours``        parents     0.1     ``hinton`` (safe)    none           0.01
``official``    parents     0.1     ``hinton_no_eps``    none           0.1 (truncated normal)
``gram-ai``     children    none    ``hinton_no_eps``    none           1
``acburigo``    parents     none    ``hinton_no_eps``    none           sqrt(2 / (n_inp * d_inp))
``xifengguo``   parents     none    ``hinton_eps_norm``  ``non_final``  0.01
==============  ==========  ======  ===================  =============  ===========================

Every implementation starts from zero logits and adds ``u_hat . v`` after every iteration but the last (some also
after the last, where it is unused). acburigo's softmax skips the max-subtraction (the same values while the
logits are moderate); the official code's truncated-normal initialisation (std 0.1, cut at 2 std) is
approximated by a normal one.
``detach="non_final"`` (XifengGuo) routes the non-final iterations on detached votes, so only the last
iteration's weighted sum carries gradient to the votes (and through them to ``W``).

**Votes scaled to the fan-in** (:meth:`DynamicRouting.scale_votes_`, not in the paper): the votes are made with
``W * k``, ``k = n_out / n_inp``, the stored ``W`` drawn from ``N(0, 1 / k^2)`` and the bias set to 0. At the start
the effective weights ``W * k`` are ``N(0, 1)``: a vote is about as long as four times its input (``d = 16``), where
the paper's ``N(0, 0.01^2)`` makes votes so short that a layer fed by a few capsules outputs its bias, the same for
every image. In training Adam moves every stored weight by about the learning rate per step, so the effective
weights move ``k`` times less: a layer fed by 576 capsules, whose sum of votes otherwise saturates the squash within
tens of steps, learns ``n_inp / n_out`` times slower than a layer of 16 to 16. A per-layer initialisation and
learning rate, written into the layer (``benchmarks/learning_diagnostics.py depth`` measures it and the usual
remedies one by one).
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice, check_iterations, check_module_input, check_nonempty, check_tensor
from .._contracts import check_value
from ..functional import SQUASH_KINDS, capsule_lengths, squash
from ..types import Routed, RoutingTrace
from ._common import RoutingProtocol, fields_repr, refuse_activations, split_trace, use_kernel
from ._kernels.dynamic import _VOTES_BLOCK_BYTES, _CapsuleVotes, _FusedRouting, _Replay  # noqa: F401

__all__ = ["dynamic_routing_reference", "dynamic_routing", "DynamicRouting", "capsule_votes", "DYNAMIC_PRESETS"]

_COUPLING = ("parents", "children")
_DETACH = ("none", "non_final")


def dynamic_routing_reference(
    votes: torch.Tensor, iterations: int = 3, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Dynamic routing as the paper writes it (Procedure 1), a step per line.

    ``votes [B, n_inp, n_out, d_out]`` (``u_hat_{j|i}``), optional bias
    ``[n_out, d_out]`` -> output capsules ``[B, n_out, d_out]``. This is the
    definition: :func:`dynamic_routing` computes the same values and gradients
    (tested in float64), with the public implementations' variants, a trace,
    and on the CPU a fused backward.
    """
    _check_votes(votes, iterations, bias, "dynamic_routing_reference")
    b = votes.new_zeros(votes.shape[:3])  # [B, i, j] logits b_ij, all 0
    for t in range(iterations):
        c = torch.softmax(b, dim=2)  # [B, i, j] sums to 1 over parents j
        s = torch.einsum("bij,bije->bje", c, votes)  # [B, j, e] s_j
        if bias is not None:
            s = s + bias  # [B, j, e]
        v = squash(s, "hinton")  # [B, j, e] v_j = squash(s_j)
        if t < iterations - 1:  # agreement u_hat_{j|i} . v_j, [B, i, j]
            b = b + torch.einsum("bije,bje->bij", votes, v)
    return v


def _check_votes(votes: torch.Tensor, iterations: int, bias: torch.Tensor | None, name: str) -> int:
    """One line for what no dynamic routing can take: votes ``[B, n_inp, n_out, d_out]`` of a non-empty batch, a count
    of iterations, a bias ``[n_out, d_out]`` or ``None``; returns the iterations as an ``int``."""
    check_tensor(votes, f"{name}: votes", "[B, n_inp, n_out, d_out]", [None, None, None, None])
    check_nonempty(votes, f"{name}: votes", "[B, n_inp, n_out, d_out]")
    if bias is not None:
        check_tensor(bias, f"{name}: bias", f"[n_out={votes.shape[2]}, d_out={votes.shape[3]}]", list(votes.shape[2:]))
    return check_iterations(iterations, f"{name}: iterations")


#: keyword arguments of :class:`DynamicRouting` that reproduce each implementation (see the module docstring);
#: ``init_std`` is a number or ``"sqrt(2 / (n_inp * d_inp))"`` (acburigo's scaling, computed by ``preset``)
DYNAMIC_PRESETS: dict[str, dict] = {
    "ours": dict(coupling="parents", bias=True, squash_kind="hinton", detach="none", init_std=0.01),
    "official": dict(coupling="parents", bias=True, squash_kind="hinton_no_eps", detach="none", init_std=0.1),
    "gram-ai": dict(coupling="children", bias=False, squash_kind="hinton_no_eps", detach="none", init_std=1.0),
    "acburigo": dict(
        coupling="parents",
        bias=False,
        squash_kind="hinton_no_eps",
        detach="none",
        init_std="sqrt(2 / (n_inp * d_inp))",
    ),
    "xifengguo": dict(coupling="parents", bias=False, squash_kind="hinton_eps_norm", detach="non_final", init_std=0.01),
}


def capsule_votes(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Votes ``u_hat_{j|i} = W_ij^T u_i``.

    On the CPU, for float32/float64 (no autocast, not under ``torch.compile``) the result is a ``[B, I, J, E]`` view of
    parent-major ``[B, J, I, E]`` memory, the layout :func:`dynamic_routing` routes in, so the routing needs no
    copy of the votes; it is formed block by block over the children, each block's product transposed while it is
    still in cache (``_CapsuleVotes``; its backward reads the votes' gradient the same way). Otherwise (and
    equal in value) a plain einsum.

    Parameters
    ----------
    u : torch.Tensor
        ``[B, n_inp, d_inp]``, the input capsules ``u_i``.
    weight : torch.Tensor
        ``[n_inp, n_out, d_inp, d_out]``, one transformation matrix ``W_ij`` per (input, output) pair.

    Returns
    -------
    torch.Tensor
        ``[B, n_inp, n_out, d_out]``, the votes ``u_hat_{j|i}``.
    """
    shapes_match = u.dim() == 3 and weight.dim() == 4 and tuple(weight.shape[::2]) == tuple(u.shape[1:])
    if shapes_match and use_kernel(u, weight):  # (mismatched shapes: the einsum says what does not match)
        return _CapsuleVotes.apply(u, weight)
    return torch.einsum("bid,ijde->bije", u, weight)  # [B, I, J, E]


def _coupling(logits: torch.Tensor, coupling: str, leaky: bool) -> torch.Tensor:
    """Softmax of ``logits [B, J, I]`` (parent-major) over parents (or children), optionally leaky."""
    if coupling == "children":
        return torch.softmax(logits, dim=2)  # sums to 1 over i (the bug)
    if leaky:  # an extra all-zero "orphan" parent absorbs votes that agree with nobody
        padded = torch.cat([torch.zeros_like(logits[:, :1]), logits], dim=1)  # [B, J+1, I]
        return torch.softmax(padded, dim=1)[:, 1:]  # [B, J, I]
    return torch.softmax(logits, dim=1)  # [B, J, I]


def _route(
    vj: torch.Tensor,
    iterations: int,
    bias: torch.Tensor | None,
    leaky: bool,
    coupling: str,
    squash_kind: str,
    detach: str,
    keep_agreements: bool,
    given: dict | None = None,
) -> tuple[torch.Tensor, dict]:
    """The routing loop on parent-major votes ``vj [B, J, I, E]``: returns ``v [B, J, E]`` and the per-iteration
    ``c [B, J, I]``, ``s`` / ``v [B, J, E]`` and ``agree [B, J, I]`` (every agreement if ``keep_agreements``, else
    only those that feed a later iteration) plus the final ``logits``. With ``given`` (the ``s`` and ``agree``
    of an earlier run of the same loop) the two products with the votes are not recomputed (``_Replay``)."""
    B, J, I, E = vj.shape
    logit_dtype = torch.float32 if vj.dtype in (torch.float16, torch.bfloat16) else vj.dtype
    logits = vj.new_zeros(B, J, I, dtype=logit_dtype)  # b_ij (parent-major)
    st: dict = {"c": [], "s": [], "v": [], "agree": []}
    v = vj.new_zeros(B, J, E)
    for t in range(iterations):
        last = t == iterations - 1
        u = vj.detach() if detach == "non_final" and not last else vj  # [B, J, I, E]
        c = _coupling(logits, coupling, leaky)  # [B, J, I]
        if given is None:
            s = torch.matmul(c.to(u.dtype).unsqueeze(2), u).squeeze(2)  # [B, J, 1, I] @ [B, J, I, E] -> [B, J, E]
        else:
            s = _Replay.apply(c.to(u.dtype), u, given["s"][t], "s")  # [B, J, E]
        st["c"].append(c)
        st["s"].append(s)
        if bias is not None:
            s = s + bias.to(s.dtype)
        v = squash(s, squash_kind)  # [B, J, E]
        st["v"].append(v)
        if not last or keep_agreements:
            # u_hat_{j|i} . v_j as [1, E] @ [E, I] (reads u in the orientation that is 2x faster than [I, E] @ [E, 1])
            if given is None:
                agree = torch.matmul(v.unsqueeze(-2), u.transpose(-1, -2)).squeeze(-2).to(logit_dtype)  # [B, J, I]
            else:
                agree = _Replay.apply(v, u, given["agree"][t], "agree")  # [B, J, I]
            st["agree"].append(agree)
            if not last:
                logits = logits + agree
    st["logits"] = logits
    return v, st


def dynamic_routing(
    votes: torch.Tensor,
    iterations: int = 3,
    bias: torch.Tensor | None = None,
    *,
    leaky: bool = False,
    coupling: str = "parents",
    squash_kind: str = "hinton",
    detach: str = "none",
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """Route ``votes [B, n_inp, n_out, d_out]`` to output capsules ``[B, n_out, d_out]``.

    By default nothing is detached: gradients flow through every iteration, as in the official code. The routing
    logits and agreements are computed in the votes' dtype (float32 for float16/bfloat16 votes). Internally the
    votes are laid out parent-major, ``[B, J, I, E]`` (one copy), so that both per-iteration contractions
    are contiguous batched matrix products; the trace's tensors are ``[B, I, J]`` views of that layout. When
    gradients are needed on the CPU (and no trace is asked for, and not under ``torch.compile``), the backward
    forms the votes' gradient in one batched product (``_FusedRouting``); the values and gradients are the same.

    Parameters
    ----------
    votes : torch.Tensor
        ``[B, n_inp, n_out, d_out]``, the prediction vectors ``u_hat_{j|i}``.
    iterations : int, optional
        Number of routing iterations ``T``, >= 1 (default 3, the paper's).
    bias : torch.Tensor or None, optional
        Output bias ``[n_out, d_out]`` added to ``s_j`` (official code, init 0.1); ``None`` (default): none.
    leaky : bool, optional
        Add an all-zero extra logit before the softmax over the parents (official "leaky routing"; unused with
        ``coupling="children"``). Default False.
    coupling : str, optional
        ``"parents"`` (default, correct: sum to 1 over j) or ``"children"`` (gram-ai bug: over i).
    squash_kind : str, optional
        A :func:`~capsule_lib.functional.squash` kind: ``"hinton"`` (default, ours) or an original's variant
        (``"hinton_no_eps"``, ``"hinton_eps_norm"``).
    detach : str, optional
        ``"none"`` (default, official) or ``"non_final"`` (XifengGuo: non-final iterations route detached votes).
    return_routing : bool, optional
        Also return a :class:`RoutingTrace` (default False).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        The output capsules ``v [B, n_out, d_out]``; with ``return_routing=True``, ``(v, trace)``, the trace
        (``algorithm="dynamic"``) holding per-iteration coefficients ``[B, I, J]``, agreements ``[B, I, J]``
        and outputs ``[B, J, E]``; ``extra`` holds the final ``logits`` and the ``votes``.
    """
    iterations = _check_votes(votes, iterations, bias, "dynamic_routing")
    check_choice(coupling, _COUPLING, "coupling")
    check_choice(detach, _DETACH, "detach")
    check_choice(squash_kind, SQUASH_KINDS, "squash_kind")
    check_value(leaky, bool, "dynamic_routing: leaky")
    check_value(return_routing, bool, "dynamic_routing: return_routing")
    B, I, J, E = votes.shape
    needs_grad = torch.is_grad_enabled() and (votes.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad and use_kernel(votes, trace=return_routing, dtypes=None, autocast=True):
        return _FusedRouting.apply(votes, bias, iterations, leaky, coupling, squash_kind, detach, _route)
    vj = votes.transpose(1, 2).contiguous()  # [B, J, I, E]
    v, st = _route(vj, iterations, bias, leaky, coupling, squash_kind, detach, return_routing)
    if not return_routing:
        return v
    trace = RoutingTrace("dynamic")
    for c, agree, out in zip(st["c"], st["agree"], st["v"]):
        trace.coefficients.append(c.transpose(1, 2))  # [B, I, J]
        trace.agreements.append(agree.transpose(1, 2))  # [B, I, J]
        trace.outputs.append(out)
    trace.extra["logits"] = st["logits"].transpose(1, 2)  # [B, I, J] final routing logits
    trace.extra["votes"] = votes  # [B, I, J, E] (a reference, no copy), for "who votes for whom" figures
    return v, trace


class DynamicRouting(RoutingProtocol, nn.Module):
    """Fully-connected capsule layer with dynamic routing: ``[B, n_inp, d_inp] -> [B, n_out, d_out]``.

    Holds one transformation matrix per (input, output) pair, ``weight [n_inp, n_out, d_inp, d_out]``, and an
    optional output ``bias [n_out, d_out]``. ``forward(u, return_routing=True)`` also returns the
    :class:`RoutingTrace`.

    Parameters
    ----------
    n_inp, n_out : int
        Numbers of input and output capsules.
    d_inp, d_out : int
        Sizes of the input and output capsules.
    iterations : int, optional
        Routing iterations, >= 1 (default 3; checked when routing).
    bias : bool, optional
        Whether the layer has an output bias (default True).
    leaky : bool, optional
        Leaky routing, as in :func:`dynamic_routing` (default False).
    coupling, squash_kind, detach : str, optional
        The routing variant, as in :func:`dynamic_routing` (defaults ``"parents"``, ``"hinton"``, ``"none"``);
        ``coupling`` and ``detach`` are checked here.
    init_std : float, optional
        Standard deviation of the normal initialisation of ``weight`` (default 0.01).
    bias_init : float, optional
        Initial value of every bias entry (default 0.1).
    vote_scale : float, optional
        The votes are made with ``weight * vote_scale`` (default 1: the paper's votes; see
        :meth:`scale_votes_`).
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
        detach: str = "none",
        init_std: float = 0.01,
        bias_init: float = 0.1,
        vote_scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_choice(coupling, _COUPLING, "coupling")
        if isinstance(vote_scale, bool) or not isinstance(vote_scale, (int, float)) or not vote_scale > 0:
            raise ValueError(f"vote_scale must be a number > 0, got {vote_scale!r}")
        check_choice(detach, _DETACH, "detach")
        self.n_inp, self.n_out, self.d_inp, self.d_out = n_inp, n_out, d_inp, d_out
        self.iterations, self.leaky, self.coupling, self.squash_kind = iterations, leaky, coupling, squash_kind
        self.detach = detach
        self.weight = nn.Parameter(torch.randn(n_inp, n_out, d_inp, d_out) * init_std)
        self.bias = nn.Parameter(torch.full((n_out, d_out), float(bias_init))) if bias else None
        self.vote_scale = float(vote_scale)

    def unit_init_(self) -> DynamicRouting:
        """Re-initialise the layer in place for a place deep in a stack (not the paper's): weights ``N(0, 1)``, so a
        vote is about ``sqrt(d_out)`` times as long as its input, and the bias at 0. The paper's ``N(0, 0.01^2)`` and
        0.1 suit a layer fed by a thousand capsules; fed by a few, its votes are so short that its output is its bias,
        the same for every image (``benchmarks/learning_diagnostics.py depth``). Returns the layer."""
        with torch.no_grad():
            self.weight.normal_(0.0, 1.0)
            if self.bias is not None:
                self.bias.zero_()
        return self

    def scale_votes_(self) -> DynamicRouting:
        """Scale the votes to the layer's fan-in, in place (see the module docstring): ``vote_scale = n_out /
        n_inp``, the stored ``weight ~ N(0, 1 / vote_scale^2)`` (effective weights ``N(0, 1)``), bias 0. Returns
        the layer."""
        self.vote_scale = self.n_out / self.n_inp
        with torch.no_grad():
            self.weight.normal_(0.0, 1.0 / self.vote_scale)
            if self.bias is not None:
                self.bias.zero_()
        return self

    @classmethod
    def preset(
        cls, name: str, n_inp: int, n_out: int, d_inp: int, d_out: int, iterations: int = 3, **overrides
    ) -> DynamicRouting:
        """The layer configured as implementation ``name`` of :data:`DYNAMIC_PRESETS`.

        Parameters
        ----------
        name : str
            ``"ours"``, ``"official"``, ``"gram-ai"``, ``"acburigo"`` or ``"xifengguo"`` (ValueError otherwise).
        n_inp, n_out, d_inp, d_out : int
            Numbers and sizes of the input and output capsules.
        iterations : int, optional
            Routing iterations (default 3).
        \\*\\*overrides
            Keyword arguments of :class:`DynamicRouting` that replace the preset's fields.

        Returns
        -------
        DynamicRouting
            The configured layer (an ``init_std`` of ``"sqrt(2 / (n_inp * d_inp))"``, acburigo's, computed).
        """
        if name not in DYNAMIC_PRESETS:
            raise ValueError(f"unknown dynamic-routing preset {name!r}; expected one of {sorted(DYNAMIC_PRESETS)}")
        kw = {**DYNAMIC_PRESETS[name], **overrides}
        if kw["init_std"] == "sqrt(2 / (n_inp * d_inp))":
            kw["init_std"] = (2.0 / (n_inp * d_inp)) ** 0.5
        return cls(n_inp, n_out, d_inp, d_out, iterations, **kw)

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """The votes of the layer (:func:`capsule_votes` with its ``weight``).

        Parameters
        ----------
        u : torch.Tensor
            ``[B, n_inp, d_inp]``, the input capsules (non-empty).

        Returns
        -------
        torch.Tensor
            ``[B, n_inp, n_out, d_out]``, the votes ``u_hat_{j|i}``.
        """
        spec = f"[B, n_inp={self.n_inp}, d_inp={self.d_inp}]"
        check_tensor(u, "u", spec, [None, self.n_inp, self.d_inp])
        check_nonempty(u, "u", spec)
        return capsule_votes(u, self.weight if self.vote_scale == 1.0 else self.weight * self.vote_scale)

    def forward(self, u: torch.Tensor, return_routing: bool = False, iterations: int | None = None):
        """Route the input capsules to the output capsules.

        Parameters
        ----------
        u : torch.Tensor
            ``[B, n_inp, d_inp]``, the input capsules.
        return_routing : bool, optional
            Also return the :class:`RoutingTrace` (default False).
        iterations : int or None, optional
            Routing iterations for this call; ``None`` (default): the module's.

        Returns
        -------
        torch.Tensor or tuple[torch.Tensor, RoutingTrace]
            ``[B, n_out, d_out]``, or ``(outputs, trace)`` with ``return_routing=True`` (see
            :func:`dynamic_routing`).
        """
        check_module_input(u, self, type(self).__name__)
        return dynamic_routing(
            self.votes(u),
            self.iterations if iterations is None else iterations,
            self.bias,
            leaky=self.leaky,
            coupling=self.coupling,
            squash_kind=self.squash_kind,
            detach=self.detach,
            return_routing=return_routing,
        )

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> DynamicRouting:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (``d x d`` matrices)."""
        return cls(n_inp, n_out, d, d, iterations)

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: :meth:`forward`, with the output capsules' lengths as their activations; no
        input activations."""
        refuse_activations(activations, self)
        v, trace = split_trace(self(poses, return_routing=return_routing, iterations=iterations), return_routing)
        return Routed(v, capsule_lengths(v), trace)  # [B, n_out, d_out], [B, n_out]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]``: one weighted sum of the votes, squashed."""
        refuse_activations(activations, self)
        u = self.votes(poses)  # [B, i, j, e]
        s = torch.einsum("bij,bije->bje", R.to(u.dtype), u)  # [B, j, e]
        if self.bias is not None:
            s = s + self.bias.to(s.dtype)
        v = squash(s, self.squash_kind)  # [B, j, e]
        return Routed(v, capsule_lengths(v), None)

    def extra_repr(self) -> str:
        return fields_repr(
            self,
            "n_inp",
            "n_out",
            "d_inp",
            "d_out",
            "iterations",
            "coupling",
            "leaky",
            "squash_kind",
            "detach",
            *(("vote_scale",) if self.vote_scale != 1.0 else ()),
        )
