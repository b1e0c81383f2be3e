"""Inverted dot-product attention routing's CPU kernel (chosen in :mod:`capsule_lib.routing.inverted` by
:func:`~capsule_lib.routing._common.use_kernel`; tested equal to the unfused update in float64, values and gradients,
in ``tests/test_fused_kernels.py`` and ``tests/test_routing_inverted.py``).

``_AttendMatrix`` is one attention update for matrix poses, ``(P, W, Q) -> (s, r, a)``, that forms the votes in
cache-sized blocks of positions and children and never holds them whole, in the forward and again in the backward.
``routing.inverted._attend_matrix`` chooses between it and the plain update ``routing.inverted._attend_matrix_unfused``
(its block sizes from ``_attend_blocks``).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

__all__: list[str] = []

_RENORM_EPS = 1e-10  # the official r / (sum_j r + 1e-10)


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Dtype for logits, softmaxes and LayerNorm statistics: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


_BLOCK_BYTES = 1 << 20  # votes held at once by the fused update on CPU (1 MiB: stays in cache between passes)
_BLOCK_CHILDREN = 16  # children per block (at least): long position runs make the per-child products larger


def _attend_blocks(I: int, p: int, M: int, d: int, itemsize: int) -> tuple[int, int]:
    """Block sizes ``(positions, children)`` for ``_AttendMatrix``: votes blocks of about ``_BLOCK_BYTES``, as many
    positions as fit next to ``_BLOCK_CHILDREN`` children, then as many children as fit next to those positions."""
    budget = _BLOCK_BYTES
    per = M * d * itemsize  # the votes of one child at one position
    pc = min(p, max(1, budget // (min(I, _BLOCK_CHILDREN) * per)))
    return pc, min(I, max(1, budget // (pc * per)))


def _block(buf: torch.Tensor, *shape: int) -> torch.Tensor:
    """The first ``prod(shape)`` elements of the work buffer ``buf``, viewed as ``shape`` (contiguous)."""
    return buf[: math.prod(shape)].view(shape)


class _AttendMatrix(torch.autograd.Function):
    """Fused attention update for matrix poses that never holds the votes: ``(P, W, Q) -> (s, r, a)``.

    ``P [I, p, s, s]`` children's poses (rows ``a``, columns ``x``; ``p`` = batch x positions),
    ``W [I, s, s, M]`` one ``s x s`` matrix per (child, parent) (rows ``x``, columns ``e``, parent last),
    ``Q [p, M, d]`` the parents' previous poses; returns ``s [p, d, M]``, ``r [I, p, M]``, ``a [I, p, M]``
    (``a`` and ``r`` in fp32, fp64 for fp64 inputs; ``s`` in the inputs' dtype).

    The forward walks blocks of (positions, children) (``_attend_blocks``); per block it forms the votes
    ``V [i, p, (a, e), m]`` with one batched product over the children (``[I, p*a, x] @ [I, x, e*M]``, the
    weight's own layout) into a reused work buffer, then ``a = <V, Q> / sqrt(d)``, ``r`` (softmax over the
    parents, renormalised) and ``s += sum_i r V``, all while the block is in cache. Only ``P, W, Q`` and ``a``
    are saved; the backward recomputes each block's votes and ``r`` and forms ``dV = r (x) g_s + g_a (x) Q`` in
    the votes' layout, so that ``dP = dV . W^T`` and ``dW += P^T . dV`` are plain batched products (inner size
    ``e*M`` and ``p*a``). Every step runs with autocast off, in the dtype of the (already cast) inputs.
    """

    @staticmethod
    def forward(ctx, P, W, Q, pc: int, ic: int):
        ctx.set_materialize_grads(False)
        I, p, s, _ = P.shape
        M = W.shape[-1]
        d = s * s
        acc = _acc_dtype(P)
        with torch.autocast(P.device.type, enabled=False):
            Wf = W.reshape(I, s, s * M)  # [I, x, e*M]
            Qt = Q.transpose(1, 2)  # [p, d, M]
            S = Q.new_zeros(p, d, M, dtype=acc)  # [p, d, M]
            r_out = Q.new_empty(I, p, M, dtype=acc)  # [I, p, M]
            a_out = Q.new_empty(I, p, M, dtype=acc)  # [I, p, M]
            buf_v, buf_t = P.new_empty(2, min(pc, p) * min(ic, I) * d * M)  # work buffers, one votes block each
            for p0 in range(0, p, pc):
                p1 = min(p, p0 + pc)
                Qb = Qt[p0:p1].contiguous()  # [pc, d, M]
                for i0 in range(0, I, ic):
                    i1 = min(I, i0 + ic)
                    nb, mb = i1 - i0, p1 - p0
                    Pb = P[i0:i1, p0:p1].reshape(nb, mb * s, s)  # [ic, pc*a, x]
                    V = torch.bmm(Pb, Wf[i0:i1], out=_block(buf_v, nb, mb * s, s * M)).view(nb, mb, d, M)  # votes
                    VQ = torch.mul(V, Qb, out=_block(buf_t, nb, mb, d, M))  # [ic, pc, d, M]
                    a = VQ.sum(2, dtype=acc).mul_(1.0 / math.sqrt(d))  # [ic, pc, M]  <V, Q> / sqrt(d)
                    r = torch.softmax(a, dim=2)  # [ic, pc, M], over the parents m
                    r = r.div_(r.sum(dim=2, keepdim=True).add_(_RENORM_EPS))  # official renormalisation
                    a_out[i0:i1, p0:p1] = a
                    r_out[i0:i1, p0:p1] = r
                    S[p0:p1] += V.mul_(r.to(V.dtype).unsqueeze(2)).sum(0, dtype=acc)  # [pc, d, M]  sum_i r V
        ctx.save_for_backward(P, W, Q, a_out)
        ctx.blocks = (pc, ic)
        return S.to(P.dtype), r_out, a_out

    @staticmethod
    @once_differentiable
    def backward(ctx, g_s, g_r_out, g_a_out):
        P, W, Q, a_all = ctx.saved_tensors
        if g_s is None and g_r_out is None and g_a_out is None:
            return None, None, None, None, None
        pc, ic = ctx.blocks
        I, p, s, _ = P.shape
        M = W.shape[-1]
        d = s * s
        acc, dt = a_all.dtype, P.dtype
        scale = 1.0 / math.sqrt(d)
        with torch.autocast(P.device.type, enabled=False):
            Wf = W.reshape(I, s, s * M)  # [I, x, e*M]
            Qt = Q.transpose(1, 2)  # [p, d, M]
            gP = torch.empty_like(P, memory_format=torch.contiguous_format)  # [I, p, s, s]
            gW = torch.zeros(I, s, s * M, dtype=acc, device=W.device)  # [I, x, e*M]
            gQ = torch.zeros(p, d, M, dtype=acc, device=Q.device)  # [p, d, M]
            buf_v, buf_t = P.new_empty(2, min(pc, p) * min(ic, I) * d * M)  # work buffers, one votes block each
            for p0 in range(0, p, pc):
                p1 = min(p, p0 + pc)
                Qb = Qt[p0:p1].contiguous()  # [pc, d, M]
                gSb = None if g_s is None else g_s[p0:p1].to(dt).contiguous()  # [pc, d, M]
                for i0 in range(0, I, ic):
                    i1 = min(I, i0 + ic)
                    nb, mb = i1 - i0, p1 - p0
                    Pb = P[i0:i1, p0:p1].reshape(nb, mb * s, s)  # [ic, pc*a, x]
                    V = torch.bmm(Pb, Wf[i0:i1], out=_block(buf_v, nb, mb * s, s * M)).view(nb, mb, d, M)  # votes
                    a = a_all[i0:i1, p0:p1]  # [ic, pc, M]
                    r0 = torch.softmax(a, dim=2)  # [ic, pc, M]  before the renormalisation
                    z = r0.sum(dim=2, keepdim=True).add_(_RENORM_EPS)  # [ic, pc, 1]
                    r = r0 / z  # [ic, pc, M]
                    g_r = None if g_r_out is None else g_r_out[i0:i1, p0:p1]  # [ic, pc, M]
                    if gSb is not None:
                        VgS = torch.mul(V, gSb, out=_block(buf_t, nb, mb, d, M))  # [ic, pc, d, M]
                        g_r = VgS.sum(2, dtype=acc) if g_r is None else VgS.sum(2, dtype=acc).add_(g_r)  # <g_s, V>
                    if g_r is not None:
                        g_r0 = (g_r - (g_r * r).sum(2, keepdim=True)).div_(z)  # through r0 / (sum r0 + eps)
                        g_a = r0.mul_(g_r0 - (g_r0 * r0).sum(2, keepdim=True))  # through the softmax
                        g_a = g_a if g_a_out is None else g_a.add_(g_a_out[i0:i1, p0:p1])
                    else:
                        g_a = g_a_out[i0:i1, p0:p1]
                    g_a = (g_a * scale).to(dt).unsqueeze(2)  # [ic, pc, 1, M]  d loss / d <V, Q>
                    gQ[p0:p1] += V.mul_(g_a).sum(0, dtype=acc)  # [pc, d, M]  sum_i g_a V
                    gV = torch.mul(g_a, Qb, out=_block(buf_t, nb, mb, d, M))  # [ic, pc, d, M]  g_a (x) Q
                    if gSb is not None:
                        gV.addcmul_(r.to(dt).unsqueeze(2), gSb)  # + r (x) g_s
                    gV = gV.view(nb, mb * s, s * M)  # [ic, pc*a, e*M]
                    gP[i0:i1, p0:p1] = torch.bmm(gV, Wf[i0:i1].transpose(1, 2)).view(nb, mb, s, s)  # [ic,pc,a,x]
                    gW[i0:i1] += torch.bmm(Pb.transpose(1, 2), gV)  # [ic, x, e*M]
        return gP, gW.view(W.shape).to(W.dtype), gQ.transpose(1, 2).to(Q.dtype), None, None
