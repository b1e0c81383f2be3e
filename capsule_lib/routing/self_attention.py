"""Self-attention routing (Mazzia, Salvetti & Chiaberge 2021, Efficient-CapsNet): the ``FCCaps`` layer.

Index names used in every einsum below::

    b  batch            i, k  input (child) capsules     j  output (parent) capsule
    d  input capsule dimension                            e  output capsule dimension (D)

A single pass, no iterations (Mazzia et al. 2021 and the official code)::

    u_hat_{j,i} = u_i W_{j,i}                                       votes, [B, I, J, D]
    A_j         = U_j U_j^T,  (A_j)_{ik} = <u_hat_{j,i}, u_hat_{j,k}>   self-attention matrix, [B, J, I, I]
    a_{i,j}     = sum_k (A_j)_{ik} / sqrt(D)                        row sums, scaled
    c_{i,j}     = softmax_j(a_{i,j})                                sums to 1 over the OUTPUTS j
    c_{i,j}    <- c_{i,j} + b_{j,i}                                 learned log-prior, added AFTER the softmax
    s_j         = sum_i c_{i,j} u_hat_{j,i}
    v_j         = squash_E(s_j)

The row sum is computed as ``<u_hat_{j,i}, sum_k u_hat_{j,k}>`` (``O(I D)`` per output instead of the
``O(I^2 D)`` matrix); the explicit matrix is only formed when a trace is requested
(``return_routing=True``), and then the logits are taken from its row sums, so the trace is
self-consistent and the two paths can be compared.

The layer (:class:`SelfAttentionRouting`) runs votes, routing and squash as one autograd function with a
hand-written backward (``routing/_kernels/self_attention.py``) when it can (on the CPU, float32/float64, no
autocast, no trace, not under ``torch.compile``): the votes are laid out ``[I, D, J, B]`` so that every sum over
``D`` and over ``I`` is a sum over an outer axis (contiguous rows, vectorised) instead of over the 16-wide innermost
axis, and the whole step is some 40 small kernels instead of autograd's graph of about 70. The values and gradients
are those of the plain path (tested in float64); :func:`self_attention_routing` on given votes is the plain,
readable path.

Nothing is detached. Because the bias is added after the softmax, the coefficients actually used,
``c + b``, do **not** sum to 1 over the outputs once ``b != 0`` (``b`` is initialised to 0); the trace's
``coefficients`` are therefore the softmax outputs (before the bias, they sum to 1 over ``j``) and the
post-bias ones are in ``trace.extra["coefficients_with_prior"]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_module_input, check_nonempty, check_tensor
from ..functional import capsule_lengths, squash_efficient
from ..types import TRUNC_NORMAL_STD, Routed, RoutingTrace
from ._common import RoutingProtocol, fields_repr, refuse_activations, split_trace, use_kernel
from ._kernels.self_attention import _FusedSelfAttention

__all__ = [
    "self_attention_routing_reference",
    "self_attention_routing",
    "SelfAttentionRouting",
    "FCCapsules",
    "self_attention_votes",
    "keras_fans",
    "keras_he_normal_",
]

#: the squash epsilon of the official code (``config.json``: ``"eps": 10e-21``)
SQUASH_EPS = 1e-20


def self_attention_routing_reference(
    votes: torch.Tensor, log_prior: torch.Tensor, eps: float = SQUASH_EPS
) -> torch.Tensor:
    """Self-attention routing as the paper writes it, one pass.

    ``votes [B, n_inp, n_out, d_out]`` (``u_hat_{j,i}``), ``log_prior
    [n_inp, n_out]`` -> output capsules ``[B, n_out, d_out]``. This is the
    definition: :func:`self_attention_routing` and the layer's CPU kernel
    compute the same values and gradients (tested in float64).
    """
    A = torch.einsum("bije,bkje->bjik", votes, votes)  # [B, j, i, k] U U^T
    a = A.sum(3).transpose(1, 2) / votes.shape[-1] ** 0.5  # [B, i, j]
    c = torch.softmax(a, dim=2) + log_prior  # [B, i, j] prior after softmax
    s = torch.einsum("bij,bije->bje", c, votes)  # [B, j, e]
    return squash_efficient(s, eps=eps)  # [B, j, e]


def keras_fans(shape: tuple[int, ...] | torch.Size) -> tuple[int, int]:
    """``(fan_in, fan_out)`` exactly as Keras (``initializers._compute_fans``) computes them.

    2-D ``(n_in, n_out)``: ``(n_in, n_out)``. 3-D to 5-D kernels are treated as convolution kernels
    ``(*receptive_field, input_depth, depth)``: ``fan_in = shape[-2] * prod(shape[:-2])`` and
    ``fan_out = shape[-1] * prod(shape[:-2])``. For the ``FCCaps`` weight ``(J, I, d_in, D) =
    (10, 16, 8, 16)`` this gives ``fan_in = 8 * 10 * 16 = 1280`` (the "receptive field" is ``J * I``).

    Parameters
    ----------
    shape : tuple[int, ...] or torch.Size
        The weight's shape (a 0-D shape gives ``(1, 1)``, a 1-D one ``(n, n)``).

    Returns
    -------
    tuple[int, int]
        ``(fan_in, fan_out)``.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    rf = math.prod(shape[:-2])
    return shape[-2] * rf, shape[-1] * rf


def keras_he_normal_(tensor: torch.Tensor, fan_in: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """In-place Keras ``he_normal``: normal with std ``sqrt(2 / fan_in) / 0.8796``, truncated at +-2 std
    (so that the truncated distribution has standard deviation ``sqrt(2 / fan_in)``).

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor to fill (under ``torch.no_grad``).
    fan_in : int
        The fan-in, e.g. ``keras_fans(tensor.shape)[0]``.
    generator : torch.Generator or None, optional
        Random generator for the draw (default ``None``: the global one).

    Returns
    -------
    torch.Tensor
        ``tensor``, filled.
    """
    std = math.sqrt(2.0 / fan_in) / TRUNC_NORMAL_STD
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, 0.0, std, -2.0 * std, 2.0 * std, generator=generator)


def self_attention_votes(u: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Votes ``u_hat_{j,i} = u_i W_{j,i}``.

    Parameters
    ----------
    u : torch.Tensor
        ``[B, n_inp, d_inp]``, the input capsules.
    weight : torch.Tensor
        ``W [n_out, n_inp, d_inp, d_out]`` (the original ``(J, I, d_in, D)`` layout).

    Returns
    -------
    torch.Tensor
        ``[B, n_inp, n_out, d_out]``, the votes.
    """
    return torch.einsum("bid,jide->bije", u, weight)  # [B, I, J, E]


def self_attention_routing(
    votes: torch.Tensor,
    log_prior: torch.Tensor | None = None,
    *,
    eps: float = SQUASH_EPS,
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """Route ``votes [B, n_inp, n_out, d_out]`` to output capsules ``[B, n_out, d_out]`` in one pass.

    Logits, softmax and the bias are computed in float32 (float64 for float64 votes; autocast disabled for
    them); the weighted sum runs in the votes' dtype.

    Parameters
    ----------
    votes : torch.Tensor
        ``[B, n_inp, n_out, d_out]``, the prediction vectors ``u_hat_{j,i}`` (see :func:`self_attention_votes`).
    log_prior : torch.Tensor or None, optional
        The learned bias ``b`` as ``[n_inp, n_out]`` (the module stores it as ``(J, I, 1)``, like
        the original), added to the coefficients **after** the softmax; ``None`` (default) = 0.
    eps : float, optional
        squash_E epsilon, default ``1e-20`` as in the official code. :func:`~capsule_lib.functional.squash_efficient`
        puts it inside the root of the norm instead of adding it to ``|s|`` and ``e^{|s|}``; the values
        agree to float precision for any ``|s| >> 1e-10`` and, unlike the original, the gradient at
        ``s = 0`` is finite.
    return_routing : bool, optional
        Also return a :class:`RoutingTrace` (default False; one iteration) with

        * ``coefficients[0]`` ``[B, I, J]``: ``softmax_j`` of the scaled row sums, **before** the bias
          (sums to 1 over the outputs, the last axis);
        * ``agreements[0]`` ``[B, I, J]``: the logits ``sum_k <u_hat_{j,i}, u_hat_{j,k}> / sqrt(D)``;
        * ``outputs[0]`` ``[B, J, D]``: ``v``;
        * ``extra["attention"]`` ``[B, J, I, I]``: ``A_j = U_j U_j^T`` (unscaled);
          ``extra["coefficients_with_prior"]`` ``[B, I, J]``: ``c + b``, the weights actually used;
          ``extra["log_prior"]`` ``[I, J]`` (zeros when ``None``).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        The output capsules ``v [B, n_out, d_out]`` in the votes' dtype, or ``(v, trace)`` with
        ``return_routing=True``.
    """
    check_tensor(votes, "votes", "[B, n_inp, n_out, d_out]", [None, None, None, None])
    check_nonempty(votes, "votes", "[B, n_inp, n_out, d_out]")
    B, I, J, E = votes.shape
    if log_prior is not None:
        check_tensor(log_prior, "log_prior", f"[n_inp={I}, n_out={J}]", [I, J])
    scale = 1.0 / math.sqrt(E)
    with torch.autocast(device_type=votes.device.type, enabled=False):
        vf = votes.float() if votes.dtype in (torch.float16, torch.bfloat16) else votes  # fp32 (or fp64)
        if return_routing:
            attn = torch.einsum("bije,bkje->bjik", vf, vf)  # [B, J, I, I]
            logits = attn.sum(dim=-1).transpose(1, 2) * scale  # [B, I, J]
        else:
            attn = None
            # broadcast + sum rather than einsum: at these sizes (I = 16, J = 10) einsum's backward forms the
            # votes' gradient as B*J matrix products of inner size 1, while this backward is elementwise
            total = vf.sum(dim=1, keepdim=True)  # [B, 1, J, E]   sum_k u_hat_{j,k}
            logits = (vf * total).sum(dim=-1) * scale  # [B, I, J]
        c = torch.softmax(logits, dim=-1)  # [B, I, J], sums to 1 over the outputs j
        cb = c + log_prior.to(c.dtype) if log_prior is not None else c  # [B, I, J], bias after the softmax
    s = (cb.to(votes.dtype).unsqueeze(-1) * votes).sum(dim=1)  # [B, J, E]  sum_i c_ij u_hat_{j,i}
    v = squash_efficient(s, eps=eps)  # [B, J, E]
    if not return_routing:
        return v
    trace = RoutingTrace("self_attention")
    trace.coefficients.append(c)
    trace.agreements.append(logits)
    trace.outputs.append(v)
    trace.extra["attention"] = attn
    trace.extra["coefficients_with_prior"] = cb
    trace.extra["log_prior"] = log_prior.to(c.dtype) if log_prior is not None else logits.new_zeros(I, J)
    return v, trace


class SelfAttentionRouting(RoutingProtocol, nn.Module):
    """Fully-connected capsule layer with self-attention routing (the original ``FCCaps``):
    ``[B, n_inp, d_inp] -> [B, n_out, d_out]``.

    Parameters, in the original layout (so TF weights load with a plain copy):

    * ``weight`` ``W (n_out, n_inp, d_inp, d_out)`` = ``(J, I, d_in, D)``. ``init="keras"`` (default)
      reproduces Keras ``he_normal`` on that 4-D shape: a normal truncated at +-2 std with
      ``std = sqrt(2 / fan_in) / 0.8796``, where Keras treats the leading ``(J, I)`` axes as a
      "receptive field", so ``fan_in = d_in * J * I`` (1280 for MNIST: std of the truncated draw
      ``sqrt(2/1280) = 0.0395``) -- not ``d_in``. ``init="torch"`` uses the same rule with
      ``fan_in = d_in`` (what the fan-in of one ``d_in -> D`` map would be), for comparison.
    * ``log_prior`` ``b (n_out, n_inp, 1)`` = ``(J, I, 1)``, zeros; added to the coefficients after the
      softmax (see :func:`self_attention_routing`).

    ``forward(u, return_routing=True)`` also returns the :class:`RoutingTrace`.

    Parameters
    ----------
    n_inp, n_out, d_inp, d_out : int
        Numbers and sizes of the input and output capsules (``I``, ``J``, ``d_in``, ``D`` above).
    eps : float, optional
        The squash_E epsilon (default ``SQUASH_EPS = 1e-20``), see :func:`self_attention_routing`.
    init : str, optional
        Initialisation of ``weight``: ``"keras"`` (default) or ``"torch"`` (see above).
    """

    def __init__(
        self, n_inp: int, n_out: int, d_inp: int, d_out: int, *, eps: float = SQUASH_EPS, init: str = "keras"
    ) -> None:
        super().__init__()
        if init not in ("keras", "torch"):
            raise ValueError(f"init must be 'keras' or 'torch', got {init!r}")
        self.n_inp, self.n_out, self.d_inp, self.d_out, self.eps, self.init = n_inp, n_out, d_inp, d_out, eps, init
        self.weight = nn.Parameter(torch.empty(n_out, n_inp, d_inp, d_out))
        self.log_prior = nn.Parameter(torch.zeros(n_out, n_inp, 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        fan_in = keras_fans(self.weight.shape)[0] if self.init == "keras" else self.d_inp
        keras_he_normal_(self.weight, fan_in)
        with torch.no_grad():
            self.log_prior.zero_()

    def prior(self) -> torch.Tensor:
        """The bias ``b`` in the coefficient layout.

        Returns
        -------
        torch.Tensor
            ``[n_inp, n_out]``, a view of ``log_prior``.
        """
        return self.log_prior.squeeze(-1).transpose(0, 1)  # [I, J]

    def _check_input(self, u: torch.Tensor) -> None:
        spec = f"[B, n_inp={self.n_inp}, d_inp={self.d_inp}]"
        check_tensor(u, "u", spec, [None, self.n_inp, self.d_inp])
        check_nonempty(u, "u", spec)

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """The votes of the layer (:func:`self_attention_votes` with its ``weight``).

        Parameters
        ----------
        u : torch.Tensor
            ``[B, n_inp, d_inp]``, the input capsules.

        Returns
        -------
        torch.Tensor
            ``[B, n_inp, n_out, d_out]``, the votes ``u_hat_{j,i}``.
        """
        self._check_input(u)
        return self_attention_votes(u, self.weight)

    def forward(self, u: torch.Tensor, return_routing: bool = False):
        """Route the input capsules to the output capsules, in one pass.

        On the CPU (float32/float64, no autocast, no trace, not under ``torch.compile``) votes, routing and squash
        run as one fused autograd function; elsewhere :func:`self_attention_routing` on :meth:`votes`.

        Parameters
        ----------
        u : torch.Tensor
            ``[B, n_inp, d_inp]``, the input capsules.
        return_routing : bool, optional
            Also return the :class:`RoutingTrace` of :func:`self_attention_routing` (default False).

        Returns
        -------
        torch.Tensor or tuple[torch.Tensor, RoutingTrace]
            ``[B, n_out, d_out]``, or ``(outputs, trace)`` with ``return_routing=True``.
        """
        check_module_input(u, self, type(self).__name__)
        if use_kernel(u, self.weight, self.log_prior, trace=return_routing):
            self._check_input(u)
            return _FusedSelfAttention.apply(u, self.weight, self.log_prior, self.eps)
        return self_attention_routing(self.votes(u), self.prior(), eps=self.eps, return_routing=return_routing)

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> SelfAttentionRouting:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (``d x d`` matrices; no iterations)."""
        if iterations is not None:
            raise ValueError("self_attention routing has no iterations (pass iterations=None)")
        return cls(n_inp, n_out, d, d)

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: :meth:`forward`, with the output capsules' lengths as their activations; no
        input activations or iterations."""
        refuse_activations(activations, self)
        if iterations is not None:
            raise ValueError("self_attention routing has no iterations to override")
        v, trace = split_trace(self(poses, return_routing=return_routing), return_routing)
        return Routed(v, capsule_lengths(v), trace)  # [B, n_out, d_out], [B, n_out]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]`` in place of the softmax; the log prior is kept."""
        refuse_activations(activations, self)
        u = self.votes(poses)  # [B, i, j, e]
        s = torch.einsum("bij,bije->bje", R.to(u.dtype) + self.prior().to(u.dtype), u)  # [B, j, e]
        v = squash_efficient(s, eps=self.eps)  # [B, j, e]
        return Routed(v, capsule_lengths(v), None)

    def extra_repr(self) -> str:
        return fields_repr(self, "n_inp", "n_out", "d_inp", "d_out", "eps", "init")


class FCCapsules(SelfAttentionRouting):
    """The paper's name for :class:`SelfAttentionRouting` (``FCCaps(N, D)`` in the official code, with
    the input capsule count and size given explicitly here): ``FCCapsules(n_inp, n_out, d_inp, d_out)``.

    Parameters
    ----------
    n_inp, n_out, d_inp, d_out : int
        Numbers and sizes of the input and output capsules.
    eps : float, optional
        The squash_E epsilon (default ``1e-20``).
    init : str, optional
        ``"keras"`` (default) or ``"torch"``, as in :class:`SelfAttentionRouting`.
    """
