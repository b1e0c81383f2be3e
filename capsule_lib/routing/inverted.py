"""Inverted dot-product attention routing (Tsai, Srivastava, Goh & Salakhutdinov, 2020).

"Capsules with Inverted Dot-Product Attention Routing", ICLR 2020; official code
``apple/ml-capsules-inverted-attention-routing`` (``src/layers.py``: ``CapsuleFC``, ``CapsuleCONV``).
Only the configuration the paper trains is implemented: **matrix poses**, ``d = s*s`` with the same ``d``
for children and parents.

Index names used in every einsum below::

    b  batch                  i / n  input (child) capsule (type)    j / m  output (parent) capsule (type)
    a  pose row               x      pose column of a child, row of W   e  pose column of a vote / parent
    k, l  kernel row, column  h, w   output position (CONV)             d  flattened pose (d = s*s)

One routing **update** ``L(P_in, P_out_prev)`` (the layer's ``forward``)::

    V_{i->j}  = P_i . W_ij                           s x s matrix product, flattened row-major to d
    a_ij      = <V_{i->j}, P_j^prev> / sqrt(d)       (first pass, no P_prev: a_ij = 0, i.e. r_ij = 1/J)
    r_ij      = softmax_j(a_ij);  r_ij /= sum_j r_ij + 1e-10    sums to 1 over the PARENTS j
    P_j       = LayerNorm_d( Dropout( sum_i r_ij V_{i->j} ) )   plain sum over children, no /I

Nothing is detached; there is no bias and no squash; ``P_prev`` is the post-LayerNorm output of the previous
update of the same layer. How updates of different layers are interleaved (the concurrent/Jacobi and the
sequential schedules) is the model's business: see :class:`capsule_lib.models.inverted.CapsModel`.
On the CPU the attention update never holds the votes of a whole layer (``_attend_matrix``).

CONV layers route each output position ``(h, w)`` from its own ``k x k`` window of children (valid windows,
no padding, ``h_out = (H - k) // stride + 1``); the softmax runs over the output types at that position
only, so a child that lies in several overlapping windows is routed independently in each of them.

``expansion="unfold"`` (default) gathers the windows correctly; ``expansion="official_bug"`` reproduces the
official code's window gathering, which mixes pose entries and output positions (see :func:`conv_windows`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice, check_iterations, check_module_input, check_nonempty, check_tensor
from .._contracts import checked
from ..types import Routed, RoutingTrace
from ._common import RoutingProtocol, autocast_outputs, refuse_activations, split_trace, use_kernel
from ._kernels.inverted import _RENORM_EPS, _acc_dtype, _attend_blocks, _AttendMatrix

__all__ = [
    "PoseNorm", "inverted_routing_reference", "fc_matrix_votes", "conv_windows", "conv_matrix_votes",
    "inverted_attention_update", "inverted_fc_update", "inverted_conv_update", "InvertedFCCapsules",
    "InvertedConvCapsules", "EXPANSIONS",
]  # fmt: skip

EXPANSIONS = ("unfold", "official_bug")


def inverted_routing_reference(
    poses: torch.Tensor,
    weight: torch.Tensor,
    iterations: int = 2,
    norm_weight: torch.Tensor | None = None,
    norm_bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Inverted dot-product attention routing of one fully connected layer
    as the paper writes it (Procedure 1, the layer's ``iterations`` updates).

    ``poses [B, n_inp, d]`` (``s x s`` matrices, ``d = s*s``),
    ``weight [n_inp, s, s, n_out]``, LayerNorm's affine parameters ``[d]`` ->
    ``poses [B, n_out, d]``. This is the definition: calling
    :func:`inverted_fc_update` ``iterations`` times, each call given the
    previous one's output, computes the same values and gradients (tested in
    float64).
    """
    B, I, d = poses.shape
    s = math.isqrt(d)
    P = poses.reshape(B, I, s, s)  # [B, i, a, x] child pose matrices
    V = torch.einsum("biax,ixej->bijae", P, weight).flatten(-2)  # [B,i,j,d]
    out = None
    for _ in range(iterations):
        if out is None:  # first pass: no parent poses yet, r_ij = 1/J
            r = torch.full_like(V[..., 0], 1 / V.shape[2])  # [B, i, j]
        else:  # agreement of each vote with the parent's pose
            a = torch.einsum("bijd,bjd->bij", V, out) / d**0.5  # [B, i, j]
            r = torch.softmax(a, dim=2)  # [B, i, j] sums to 1 over j
        s_j = torch.einsum("bij,bijd->bjd", r, V)  # [B, j, d] plain sum
        out = F.layer_norm(s_j, (d,), norm_weight, norm_bias, eps)
    return out


def _side(d: int) -> int:
    """Side ``s`` of a square matrix pose with ``d = s*s`` entries (ValueError otherwise)."""
    s = math.isqrt(d)
    if s * s != d:
        raise ValueError(f"matrix poses need a square pose size d = s*s, got d={d}")
    return s


# ----------------------------------------------------------------------------------------------- votes
def fc_matrix_votes(poses: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """FC votes ``V_{i->j} = P_i . W_ij``, each pose read as an ``s x s`` matrix (row-major).

    Parameters
    ----------
    poses, weight : torch.Tensor
        ``poses [B, n_inp, d]`` and ``weight [n_inp, s, s, n_out]`` (``d = s*s``).

    Returns
    -------
    torch.Tensor
        ``[B, n_inp, n_out, d]``.
    """
    V = _fc_votes(poses, weight)  # [B, I, J, s, s]
    return V.flatten(-2)  # [B, I, J, d]


def _fc_votes(poses: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[B, I, d], [I, s, s, J] -> [B, I, J, s, s]`` (votes kept as matrices)."""
    I, s, _, J = weight.shape
    P = poses.reshape(poses.shape[0], I, s, s)  # [B, I, s, s]  (a, x)
    return torch.einsum("biax,ixej->bijae", P, weight)  # [B, I, J, s, s]


def conv_windows(poses: torch.Tensor, kernel_size: int, stride: int = 1, expansion: str = "unfold") -> torch.Tensor:
    """Valid ``k x k`` windows of a capsule grid, in the official layout.

    Parameters
    ----------
    poses : torch.Tensor
        ``[B, N, H, W, d]``, with ``H, W >= kernel_size``.
    kernel_size, stride : int
        The window side ``k`` and its step.
    expansion : str
        ``"unfold"``: ``out[b, n, k, l, h, w] = poses[b, n, h*stride + k, w*stride + l]`` (a view). ``"official_bug"``:
        the official ``CapsuleCONV.input_expansion``: window slices stacked on the **last** axis,
        ``[B, N, k, k, d, h_out*w_out]``, that memory then ``view``ed as ``[B, N, k, k, h_out, w_out, d]``, mixing
        pose entries and positions (apple PR #1, unmerged; the author's fork switched to ``unfold``); here only so
        the book can compare (which expansion produced the published numbers is unknown).

    Returns
    -------
    torch.Tensor
        ``[B, N, k, k, h_out, w_out, d]`` with ``h_out = (H - k) // stride + 1``.
    """
    check_choice(expansion, EXPANSIONS, "expansion")
    check_tensor(poses, "poses", "[B, N, H, W, d]", [None, None, None, None, None])
    B, N, H, W, D = poses.shape
    if H < kernel_size or W < kernel_size:
        raise ValueError(
            f"poses: a {kernel_size}x{kernel_size} valid window needs H, W >= {kernel_size}, "
            f"got shape {tuple(poses.shape)} ([B, N, H, W, d])"
        )
    u = poses.unfold(2, kernel_size, stride).unfold(3, kernel_size, stride)  # [B, N, h, w, d, k, l]
    h, w = u.shape[2], u.shape[3]
    if expansion == "unfold":
        return u.permute(0, 1, 5, 6, 2, 3, 4)  # [B, N, k, l, h, w, d]
    # official: torch.stack([slice(i, j) for i in range(h) for j in range(w)], -1) -> [B, N, k, l, d, h*w],
    # i.e. stacked[b, n, k, l, e, i*w + j] = poses[b, n, i*stride + k, j*stride + l, e]; then .view(...)
    stacked = u.permute(0, 1, 5, 6, 4, 2, 3).reshape(B, N, kernel_size, kernel_size, D * h * w)  # [B,N,k,l,d*h*w]
    return stacked.reshape(B, N, kernel_size, kernel_size, h, w, D)  # [B, N, k, l, h, w, d] (scrambled), = .view


def conv_matrix_votes(windows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """CONV votes ``V_{(n,k,l)->m}(h, w) = P_n(h*stride+k, w*stride+l) . W_{k,l,n,m}``.

    Parameters
    ----------
    windows, weight : torch.Tensor
        ``windows [B, N, k, k, h, w, d]`` (from :func:`conv_windows`) and ``weight [k, k, N, s, s, M]``.

    Returns
    -------
    torch.Tensor
        ``[B, h, w, N*k*k, M, d]``, the window children ordered ``i = n*k*k + k_row*k + k_col``.
    """
    return _conv_votes(windows, weight).flatten(-2)  # [B, h, w, I, M, d]


def _conv_votes(windows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[B, N, k, k, h, w, d], [k, k, N, s, s, M] -> [B, h, w, N*k*k, M, s, s]`` (votes kept as matrices,
    so that merging ``(n, k, l)`` is usually a view rather than a copy of the largest tensor of the layer)."""
    K, _, N, s, _, M = weight.shape
    B, _, _, _, h, w, _ = windows.shape
    P = windows.reshape(B, N, K, K, h, w, s, s)  # [B, N, k, l, h, w, s, s]  (a, x)
    V = torch.einsum("bnklhwax,klnxem->bhwnklmae", P, weight)  # [B, h, w, N, k, l, M, s, s]
    return V.reshape(B, h, w, N * K * K, M, s, s)  # [B, h, w, I, M, s, s]


# ------------------------------------------------------------------------------------- routing pieces
def _attend(votes: torch.Tensor, prev_pose: torch.Tensor):
    """Agreement, routing probabilities and weighted vote sum for votes ``[B, ..., I, J, A, E]`` (matrix votes,
    ``A = E = s``; or ``A = 1, E = d``) and ``prev_pose [B, ..., J, d = A*E]``;
    returns ``(s [B, ..., J, d], r [B, ..., I, J], a [B, ..., I, J])``."""
    A, E = votes.shape[-2:]
    Q = prev_pose.to(votes.dtype).reshape(*prev_pose.shape[:-1], A, E)  # [B, ..., J, A, E]
    a = torch.einsum("...ijae,...jae->...ij", votes, Q)  # [B, ..., I, J]  <V_ij, P_j^prev>
    a = a.to(_acc_dtype(votes)) * (1.0 / math.sqrt(A * E))  # / sqrt(d); fp32 (fp64 for fp64 votes)
    r = torch.softmax(a, dim=-1)  # [B, ..., I, J], over the parents j
    r = r / (r.sum(dim=-1, keepdim=True) + _RENORM_EPS)  # official renormalisation (a no-op up to rounding)
    s = torch.einsum("...ij,...ijae->...jae", r.to(votes.dtype), votes)  # [B, ..., J, s, s]
    return s.flatten(-2), r, a  # [B, ..., J, d]


def _attend_matrix_unfused(P: torch.Tensor, W: torch.Tensor, Q: torch.Tensor):
    """:func:`_attend_matrix`'s plain update (on CUDA and under ``torch.compile``, which fuses the elementwise
    steps): ordinary differentiable ops on the full votes, copied once to parent-major."""
    I, p, s, _ = P.shape
    M = W.shape[-1]
    d = s * s
    V = torch.bmm(P.reshape(I, p * s, s), W.reshape(I, s, s * M))  # [I, p*a, e*M]
    V = V.view(I, p, s, s, M).permute(1, 4, 0, 2, 3).reshape(p * M, I, d)  # [p*M, I, d]  parent-major
    a = torch.bmm(V, Q.reshape(p * M, d, 1)).view(p, M, I)  # [p, M, I]  <V_im, P_m^prev>
    a = a.to(_acc_dtype(V)) * (1.0 / math.sqrt(d))  # / sqrt(d); fp32 (fp64 for fp64 votes)
    r = torch.softmax(a, dim=1)  # [p, M, I], over the parents m
    r = r / (r.sum(dim=1, keepdim=True) + _RENORM_EPS)  # official renormalisation (a no-op up to rounding)
    s_sum = torch.bmm(r.to(V.dtype).reshape(p * M, 1, I), V).view(p, M, d)  # [p, M, d]
    return s_sum.transpose(1, 2), r.permute(2, 0, 1), a.permute(2, 0, 1)  # [p, d, M], [I, p, M] x2


def _attend_matrix(P: torch.Tensor, W: torch.Tensor, Q: torch.Tensor, blocks: tuple[int, int] | None = None):
    """One attention update for matrix poses, ``(P [I, p, s, s], W [I, s, s, M], Q [p, M, d]) -> (s [p, d, M],
    r [I, p, M], a [I, p, M])``: votes ``V[i, p, m] = P[i, p] . W[i, :, :, m]`` (``p`` = batch x positions),
    ``a = <V, Q>/sqrt(d)``, ``r = softmax_m(a)`` (renormalised, sums to 1 over ``M``), ``s = sum_i r V`` in the
    votes' dtype (``r``, ``a`` in fp32, fp64 for fp64). Where ``routing._common.use_kernel`` allows
    it (the CPU, eager) the kernel ``_AttendMatrix`` forms the votes in cache-sized ``blocks = (positions, children)``
    (default ``_attend_blocks``), never whole, in the forward and again in the backward; else the plain update runs."""
    dtype, dev = P.dtype, P.device.type
    if torch.is_autocast_enabled(dev) and dtype != torch.float64:
        dtype = torch.get_autocast_dtype(dev)  # what the votes' matmul would produce under autocast
    P, W, Q = P.to(dtype), W.to(dtype), Q.to(dtype)
    if not use_kernel(P, dtypes=None, autocast=True):  # CUDA, torch.compile: the plain, vectorised update
        return _attend_matrix_unfused(P, W, Q)
    if blocks is None:
        I, p, s, _ = P.shape
        blocks = _attend_blocks(I, p, W.shape[-1], s * s, P.element_size())
    return _AttendMatrix.apply(P, W, Q, *blocks)


class PoseNorm(NamedTuple):
    """The ``LayerNorm_d(Dropout(s))`` that ends every inverted-attention update, as the functional forms take it
    (a layer passes its own: :meth:`of`). Calling it on ``s [..., d]`` computes in fp32 (fp64 for fp64) and casts
    the result to ``dtype``.

    Parameters
    ----------
    weight, bias : torch.Tensor or None, optional
        LayerNorm's affine parameters ``[d]`` (default ``None``: none).
    eps : float, optional
        LayerNorm's epsilon (default 1e-5).
    dropout : float, optional
        Dropout probability before the LayerNorm (default 0.0), active only if ``training`` (default False)."""

    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-5
    dropout: float = 0.0
    training: bool = False

    @classmethod
    def of(cls, layer: nn.Module) -> PoseNorm:
        """The norm of an :class:`InvertedFCCapsules` or :class:`InvertedConvCapsules` layer, in its mode.

        Parameters
        ----------
        layer : torch.nn.Module
            A layer with ``norm`` (an ``nn.LayerNorm``), ``dropout`` and ``training``.

        Returns
        -------
        PoseNorm
            Its LayerNorm's parameters and epsilon, its dropout probability and its training mode."""
        return cls(layer.norm.weight, layer.norm.bias, layer.norm.eps, layer.dropout, layer.training)

    def __call__(self, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # [..., d] -> [..., d]
        s = F.dropout(s, self.dropout, self.training)
        acc = _acc_dtype(s)
        w = None if self.weight is None else self.weight.to(acc)
        b = None if self.bias is None else self.bias.to(acc)
        return F.layer_norm(s.to(acc), (s.shape[-1],), w, b, self.eps).to(dtype)


def _one_step_trace(r: torch.Tensor, a: torch.Tensor, out: torch.Tensor, **extra) -> RoutingTrace:
    return RoutingTrace("inverted", coefficients=[r], agreements=[a], outputs=[out], extra=dict(extra))


def _normed_update(
    s: torch.Tensor, r: torch.Tensor, a: torch.Tensor, norm: PoseNorm | None, dtype: torch.dtype, trace: bool
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """An update's poses ``norm(s)`` in ``dtype`` (``PoseNorm()`` when ``norm`` is None), with a one-step trace
    of the coefficients ``r`` and agreements ``a`` when ``trace``."""
    out = (norm or PoseNorm())(s, dtype)
    return (out, _one_step_trace(r, a, out)) if trace else out


def inverted_attention_update(
    votes: torch.Tensor,
    prev_pose: torch.Tensor | None = None,
    *,
    norm: PoseNorm | None = None,
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """One inverted-attention routing update from precomputed votes.

    Parameters
    ----------
    votes : torch.Tensor
        ``[B, ..., n_inp, n_out, d]`` (any number of position axes ``...``).
    prev_pose : torch.Tensor or None, optional
        ``[B, ..., n_out, d]``, the previous update's post-LayerNorm output; ``None`` (default): a uniform pass.
    norm : PoseNorm or None, optional
        The LayerNorm and dropout that end the update (default ``None``: ``PoseNorm()``, no affine, eps 1e-5, no
        dropout).
    return_routing : bool, optional
        Also return a one-iteration :class:`RoutingTrace` (default False).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        Poses ``[B, ..., n_out, d] = LayerNorm_d(Dropout(sum_i r_ij V_ij))``, or ``(poses, trace)``: ``coefficients``
        ``r [B, ..., n_inp, n_out]`` (sum to 1 over the last axis, the parents), ``agreements`` the scaled dot products
        ``a_ij`` that produced them (zeros for the uniform pass; unlike dynamic routing the logits are recomputed from
        scratch at each update, never accumulated), ``outputs`` the new poses."""
    check_tensor(votes, "votes", "[B, ..., n_inp, n_out, d]", [None, None, None], min_leading=1)
    check_nonempty(votes, "votes", "[B, ..., n_inp, n_out, d]", leading=votes.dim() - 3)
    I, J, D = votes.shape[-3:]
    if prev_pose is None:
        s = votes.sum(dim=-3) * (1.0 / J)  # [B, ..., J, d], r_ij = 1/J
        r = votes.new_full(votes.shape[:-1], 1.0 / J, dtype=_acc_dtype(votes))  # [B, ..., I, J]
        a = torch.zeros_like(r)
    else:
        want = tuple(votes.shape[:-3]) + (J, D)
        check_tensor(prev_pose, "prev_pose", f"[B, ..., n_out={J}, d={D}] = {want}", list(want))
        s, r, a = _attend(votes.unsqueeze(-2), prev_pose)  # votes as [B, ..., I, J, 1, d]
    return _normed_update(s, r, a, norm, votes.dtype, return_routing)


def inverted_fc_update(
    poses: torch.Tensor,
    weight: torch.Tensor,
    prev_pose: torch.Tensor | None = None,
    *,
    norm: PoseNorm | None = None,
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """Functional form of :class:`InvertedFCCapsules` (one update). The uniform first pass is computed as
    ``(1/J) sum_i P_i . W_ij`` without materialising the votes.

    Parameters
    ----------
    poses, weight : torch.Tensor
        ``poses [B, n_inp, d]`` (or a grid ``[B, N, h, w, d]``, flattened type-major ``i = n*h*w + y*w + x``) and
        ``weight [n_inp, s, s, n_out]``, ``d = s*s``.
    prev_pose, norm, return_routing
        As in :func:`inverted_attention_update`, with ``prev_pose [B, n_out, d]`` or ``None``.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        ``[B, n_out, d]``, or ``(poses, trace)`` with ``return_routing=True``."""
    I, s, _, J = weight.shape
    D = s * s
    if poses.dim() == 5:
        check_tensor(poses, "poses", f"[B, N, h, w, d={D}] with N*h*w = n_inp = {I}", [None, None, None, None, D])
        poses = poses.reshape(poses.shape[0], -1, D)  # [B, N*h*w, d], type-major
    check_tensor(poses, "poses", f"[B, n_inp={I}, d={D}]", [None, I, D])
    check_nonempty(poses, "poses", f"[B, n_inp={I}, d={D}]")  # an empty batch divided by zero in the kernel
    B = poses.shape[0]
    if prev_pose is None:
        P = poses.reshape(B, I, s, s)  # [B, I, s, s]
        s_sum = torch.einsum("biax,ixej->bjae", P, weight).reshape(B, J, D) * (1.0 / J)  # [B, J, d]
        r = poses.new_full((B, I, J), 1.0 / J, dtype=_acc_dtype(poses))  # [B, I, J]
        a = torch.zeros_like(r)
    else:
        check_tensor(prev_pose, "prev_pose", f"[B={B}, n_out={J}, d={D}]", [B, J, D])
        P = poses.reshape(B, I, s, s).transpose(0, 1)  # [I, B, s, s]  (a, x)
        s_sum, r, a = _attend_matrix(P, weight, prev_pose)  # [B, d, J], [I, B, J] x2
        s_sum = s_sum.transpose(1, 2)  # [B, J, d]
        r, a = r.transpose(0, 1), a.transpose(0, 1)  # [B, I, J] views
    return _normed_update(s_sum, r, a, norm, poses.dtype, return_routing)  # [B, J, d]


def inverted_conv_update(
    poses: torch.Tensor,
    weight: torch.Tensor,
    prev_pose: torch.Tensor | None = None,
    *,
    stride: int = 1,
    expansion: str = "unfold",
    norm: PoseNorm | None = None,
    return_routing: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, RoutingTrace]:
    """Functional form of :class:`InvertedConvCapsules` (one update).

    Parameters
    ----------
    poses, weight : torch.Tensor
        ``poses [B, N, H, W, d]`` and ``weight [k, k, N, s, s, M]``, ``d = s*s``.
    prev_pose, norm, return_routing
        As in :func:`inverted_attention_update`, with ``prev_pose [B, M, h_out, w_out, d]`` or ``None``.
    stride, expansion
        As in :func:`conv_windows` (defaults 1 and ``"unfold"``).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, RoutingTrace]
        ``[B, M, h_out, w_out, d]``, or ``(poses, trace)``: ``coefficients``/``agreements``
        ``[B, h_out, w_out, N*k*k, M]`` (window child ``i = n*k*k + k_row*k + k_col``; sum to 1 over ``M`` at each
        position), ``outputs`` ``[B, M, h_out, w_out, d]``."""
    K, _, N, s, _, M = weight.shape
    D = s * s
    check_tensor(poses, "poses", f"[B, N={N}, H, W, d={D}]", [None, N, None, None, D])
    check_nonempty(poses, "poses", f"[B, N={N}, H, W, d={D}]")
    B = poses.shape[0]
    windows = conv_windows(poses, K, stride, expansion)  # [B, N, k, l, h, w, d]
    h, w = windows.shape[4], windows.shape[5]
    if prev_pose is None:
        P = windows.reshape(B, N, K, K, h, w, s, s)  # [B, N, k, l, h, w, s, s]
        s_sum = torch.einsum("bnklhwax,klnxem->bhwmae", P, weight).reshape(B, h, w, M, D) * (1.0 / M)  # [B,h,w,M,d]
        r = poses.new_full((B, h, w, N * K * K, M), 1.0 / M, dtype=_acc_dtype(poses))  # [B, h, w, I, M]
        a = torch.zeros_like(r)
    else:
        check_tensor(prev_pose, "prev_pose", f"[B={B}, M={M}, h_out={h}, w_out={w}, d={D}]", [B, M, h, w, D])
        P = windows.permute(1, 2, 3, 0, 4, 5, 6).reshape(N * K * K, B * h * w, s, s)  # [I, p, s, s], i = (n, k, l)
        Wm = weight.permute(2, 0, 1, 3, 4, 5).reshape(N * K * K, s, s, M)  # [I, x, e, M]
        Q = prev_pose.permute(0, 2, 3, 1, 4).reshape(B * h * w, M, D)  # [p, M, d]
        s_sum, r, a = _attend_matrix(P, Wm, Q)  # [p, d, M], [I, p, M] x2
        s_sum = s_sum.transpose(1, 2).view(B, h, w, M, D)  # [B, h, w, M, d]
        r = r.transpose(0, 1).view(B, h, w, N * K * K, M)  # [B, h, w, I, M] (view)
        a = a.transpose(0, 1).view(B, h, w, N * K * K, M)
    out = (norm or PoseNorm())(s_sum, poses.dtype)  # [B, h, w, M, d]
    out = out.permute(0, 3, 1, 2, 4).contiguous()  # [B, M, h, w, d]
    return (out, _one_step_trace(r, a, out)) if return_routing else out


# -------------------------------------------------------------------------------------------- modules
class InvertedFCCapsules(RoutingProtocol, nn.Module):
    """Fully-connected capsule layer with one inverted-attention update per call (``CapsuleFC``,
    ``matrix_pose=True``): ``[B, n_inp, d] -> [B, n_out, d]``.

    Parameters
    ----------
    n_inp, n_out : int
        Numbers of input and output capsules: ``weight [n_inp, s, s, n_out]``, one ``s x s`` matrix per pair,
        Gaussian with std ``sqrt(n_out / (s * n_inp))`` (official init).
    pose_dim : int, optional
        Pose size ``d = s*s``, a square (default 16); ``norm`` = ``LayerNorm(d)`` (gamma 1, beta 0).
    iterations : int, optional
        Number of updates ``route`` runs, >= 1 (default 2).
    dropout, eps : float, optional
        Dropout probability before the LayerNorm, in training (``dropout``, default 0.0); LayerNorm's ``eps`` (1e-5)."""

    @checked
    def __init__(
        self,
        n_inp: int,
        n_out: int,
        pose_dim: int = 16,
        *,
        iterations: int = 2,
        dropout: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        s = _side(pose_dim)
        self.n_inp, self.n_out, self.pose_dim, self.side = n_inp, n_out, pose_dim, s
        self.iterations, self.dropout = check_iterations(iterations), dropout
        self.init_std = math.sqrt(n_out / (s * n_inp))
        self.weight = nn.Parameter(torch.randn(n_inp, s, s, n_out) * self.init_std)
        self.norm = nn.LayerNorm(pose_dim, eps=eps)

    def votes(self, P_in: torch.Tensor) -> torch.Tensor:
        """``[B, n_inp, d] -> [B, n_inp, n_out, d]``."""
        check_tensor(P_in, "P_in", f"[B, n_inp={self.n_inp}, d={self.pose_dim}]", [None, self.n_inp, self.pose_dim])
        return fc_matrix_votes(P_in, self.weight)

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> InvertedFCCapsules:
        """The registry's constructor: ``n_inp -> n_out`` capsules of size ``d`` (``sqrt(d) x sqrt(d)`` matrices)."""
        return cls(n_inp, n_out, d, iterations=iterations)

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:
        """The protocol's :meth:`route`: ``iterations`` updates, the first uniform, each from the previous output (as
        :func:`inverted_routing_reference`); no activations; the last update's trace. (Networks of layers interleave
        their updates, calling :meth:`forward`: :class:`~capsule_lib.models.inverted.CapsModel`.)"""
        refuse_activations(activations, self)
        P, trace = None, None
        for _ in range(self.iterations if iterations is None else check_iterations(iterations)):
            P, trace = split_trace(self(poses, P, return_routing=return_routing), return_routing)
        return Routed(P, None, trace)  # [B, n_out, d]

    def _coupled(self, poses, activations, R) -> Routed:
        """The protocol's fixed couplings ``R [B, n_inp, n_out]``: one update's sum of votes, LayerNorm-ed."""
        refuse_activations(activations, self)
        V = self.votes(poses)  # [B, i, j, d]
        return Routed(PoseNorm.of(self)(torch.einsum("bij,bijd->bjd", R.to(V.dtype), V), poses.dtype), None, None)

    def forward(self, P_in: torch.Tensor, P_out_prev: torch.Tensor | None = None, return_routing: bool = False):
        """One update: :func:`inverted_fc_update` with the layer's weights.

        Parameters
        ----------
        P_in, P_out_prev, return_routing
            ``poses``, ``prev_pose`` (this layer's previous output, post-LayerNorm; ``None``: uniform first pass) and
            ``return_routing`` of :func:`inverted_fc_update`.

        Returns
        -------
        torch.Tensor or tuple[torch.Tensor, RoutingTrace]
            ``[B, n_out, d]`` (in the autocast dtype under autocast), or ``(poses, trace)``."""
        check_module_input(P_in, self, type(self).__name__)
        out = inverted_fc_update(P_in, self.weight, P_out_prev, norm=PoseNorm.of(self), return_routing=return_routing)
        return autocast_outputs(out, P_in.device.type)

    def extra_repr(self) -> str:
        return (
            f"n_inp={self.n_inp}, n_out={self.n_out}, pose_dim={self.pose_dim} ({self.side}x{self.side}), "
            f"iterations={self.iterations}, dropout={self.dropout}, init_std={self.init_std:.4g}"
        )


class InvertedConvCapsules(nn.Module):
    """Convolutional capsule layer with one inverted-attention update per call (``CapsuleCONV``, ``matrix_pose=True``):
    ``[B, n_inp, H, W, d] -> [B, n_out, h_out, w_out, d]``, valid windows, ``h_out = (H - k) // stride + 1``.

    Parameters
    ----------
    n_inp, n_out : int
        Numbers of input and output capsule types: ``weight [k, k, n_inp, s, s, n_out]``, shared over positions,
        Gaussian with std ``sqrt(n_out / (s * n_inp * k^2))`` (official init).
    pose_dim, kernel_size, stride : int, optional
        Pose size ``d = s*s``, a square (default 16; ``norm`` = ``LayerNorm(d)``), window side ``k`` (default 3) and
        stride (default 1).
    dropout, eps : float, optional
        Dropout probability before the LayerNorm, in training (``dropout``, default 0.0); LayerNorm's ``eps`` (1e-5).
    expansion : str, optional
        ``"unfold"`` (default) gathers windows correctly; ``"official_bug"`` reproduces the official
        ``input_expansion`` (see :func:`conv_windows`), for comparison only."""

    def __init__(
        self,
        n_inp: int,
        n_out: int,
        pose_dim: int = 16,
        kernel_size: int = 3,
        stride: int = 1,
        *,
        dropout: float = 0.0,
        expansion: str = "unfold",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        check_choice(expansion, EXPANSIONS, "expansion")
        s = _side(pose_dim)
        self.n_inp, self.n_out, self.pose_dim, self.side = n_inp, n_out, pose_dim, s
        self.kernel_size, self.stride, self.dropout, self.expansion = kernel_size, stride, dropout, expansion
        self.init_std = math.sqrt(n_out / (s * n_inp * kernel_size * kernel_size))
        self.weight = nn.Parameter(torch.randn(kernel_size, kernel_size, n_inp, s, s, n_out) * self.init_std)
        self.norm = nn.LayerNorm(pose_dim, eps=eps)

    def output_size(self, size: int) -> int:
        """Valid-window output size for an input grid of side ``size``."""
        return (size - self.kernel_size) // self.stride + 1

    def votes(self, P_in: torch.Tensor) -> torch.Tensor:
        """``[B, n_inp, H, W, d] -> [B, h_out, w_out, n_inp*k*k, n_out, d]``."""
        check_tensor(
            P_in,
            "P_in",
            f"[B, n_inp={self.n_inp}, H, W, d={self.pose_dim}]",
            [None, self.n_inp, None, None, self.pose_dim],
        )
        return conv_matrix_votes(conv_windows(P_in, self.kernel_size, self.stride, self.expansion), self.weight)

    def forward(self, P_in: torch.Tensor, P_out_prev: torch.Tensor | None = None, return_routing: bool = False):
        """One update: :func:`inverted_conv_update` with the layer's weights.

        Parameters
        ----------
        P_in, P_out_prev, return_routing
            ``poses [B, n_inp, H, W, d]``, ``prev_pose`` (``None``: the uniform first pass) and ``return_routing`` of
            :func:`inverted_conv_update`.

        Returns
        -------
        torch.Tensor or tuple[torch.Tensor, RoutingTrace]
            ``[B, n_out, h_out, w_out, d]`` (in the autocast dtype under autocast), or ``(poses, trace)``."""
        check_module_input(P_in, self, type(self).__name__)
        norm, stride, expansion = PoseNorm.of(self), self.stride, self.expansion
        out = inverted_conv_update(
            P_in, self.weight, P_out_prev, stride=stride, expansion=expansion, norm=norm, return_routing=return_routing
        )
        return autocast_outputs(out, P_in.device.type)

    def extra_repr(self) -> str:
        return (
            f"n_inp={self.n_inp}, n_out={self.n_out}, pose_dim={self.pose_dim} ({self.side}x{self.side}), "
            f"kernel_size={self.kernel_size}, stride={self.stride}, expansion={self.expansion!r}, "
            f"dropout={self.dropout}, init_std={self.init_std:.4g}"
        )
