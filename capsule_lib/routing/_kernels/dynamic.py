"""Dynamic routing's CPU kernels (chosen by :func:`~capsule_lib.routing._common.use_kernel`; each tested equal to
the plain path in float64, values and gradients, in ``tests/test_fused_kernels.py``).

* ``_CapsuleVotes``: the votes ``u_hat = W^T u`` written parent-major, block by block (no transposing copy);
* ``_FusedRouting``: the routing loop whose backward forms the votes' gradient in one batched product;
* ``_Replay``: a product with the votes whose value the forward already computed (used by that backward).

The algorithm itself is :func:`~capsule_lib.routing.dynamic.dynamic_routing_reference`.
"""

from __future__ import annotations

import torch

__all__: list[str] = []

#: bytes of one block of votes in :class:`_CapsuleVotes` (a few MiB: the block stays in the CPU's cache between
#: the batched product that writes it and the transposing copy that reads it)
_VOTES_BLOCK_BYTES = 4 << 20


class _CapsuleVotes(torch.autograd.Function):
    """:func:`~capsule_lib.routing.dynamic.capsule_votes` written parent-major: ``u [B, I, d]``,
    ``W [I, J, d, E]`` -> a ``[B, I, J, E]`` view of ``[B, J, I, E]`` memory. Per block of children ``i0:i1``:
    ``[i, B, d] @ [i, d, J*E]`` into a cache-sized buffer, then one transposing copy into ``out[:, :, i0:i1]``.
    The plain einsum writes all ``[I, B, J*E]`` products to memory and the routing then copies them to
    parent-major, reading and writing the votes twice more; the backward likewise gathers the gradient per block
    instead of transposing it whole."""

    @staticmethod
    def forward(ctx, u, weight):
        B, I, d = u.shape
        J, E = weight.shape[1], weight.shape[3]
        ut = u.transpose(0, 1)  # [I, B, d]
        Wf = weight.transpose(1, 2).reshape(I, d, J * E)  # [I, d, J*E]   (a copy of the weight: J and d swap)
        out = u.new_empty(B, J, I, E)
        n = max(1, min(I, _VOTES_BLOCK_BYTES // (B * J * E * u.element_size())))  # children per block
        buf = u.new_empty(n, B, J * E)
        for i0 in range(0, I, n):
            i1 = min(i0 + n, I)
            blk = torch.bmm(ut[i0:i1], Wf[i0:i1], out=buf[: i1 - i0])  # [i, B, d] @ [i, d, J*E] -> [i, B, J*E]
            out[:, :, i0:i1].copy_(blk.view(i1 - i0, B, J, E).permute(1, 2, 0, 3))  # -> [B, J, i, E]
        ctx.save_for_backward(u, Wf)
        ctx.block = n
        return out.transpose(1, 2)  # [B, I, J, E]

    @staticmethod
    def backward(ctx, g):
        u, Wf = ctx.saved_tensors
        B, I, J, E = g.shape
        d, n = u.shape[-1], ctx.block
        gj = g.transpose(1, 2)  # [B, J, I, E] (contiguous when it comes from dynamic_routing)
        ut = u.transpose(0, 1)  # [I, B, d]
        g_u = u.new_empty(I, B, d) if ctx.needs_input_grad[0] else None
        g_W = u.new_empty(I, d, J * E) if ctx.needs_input_grad[1] else None
        buf = g.new_empty(n, B, J * E)
        for i0 in range(0, I, n):
            i1 = min(i0 + n, I)
            blk = buf[: i1 - i0]
            blk.view(i1 - i0, B, J, E).copy_(gj[:, :, i0:i1].permute(2, 0, 1, 3))  # [i, B, J, E]
            if g_u is not None:
                torch.bmm(blk, Wf[i0:i1].transpose(1, 2), out=g_u[i0:i1])  # [i, B, J*E] @ [i, J*E, d]
            if g_W is not None:
                torch.bmm(ut[i0:i1].transpose(1, 2), blk, out=g_W[i0:i1])  # [i, d, B] @ [i, B, J*E]
        g_u = g_u.transpose(0, 1) if g_u is not None else None  # [B, I, d]
        g_W = g_W.view(I, d, J, E).transpose(1, 2) if g_W is not None else None  # [I, J, d, E]
        return g_u, g_W


class _Replay(torch.autograd.Function):
    """``s = c u`` (``kind="s"``) or ``agree = u . v`` (``kind="agree"``) with the value already known (a leaf
    that requires grad, so the output always does): the backward returns the small operand's gradient only,
    ``dL/dc = dL/ds . u`` or ``dL/dv = dL/dagree u``, reading the votes ``u [B, J, I, E]`` once."""

    @staticmethod
    def forward(ctx, small, u, value, kind):
        ctx.save_for_backward(u)
        ctx.kind, ctx.small_dtype = kind, small.dtype
        return value.detach().clone()

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        g = g.to(u.dtype).unsqueeze(2)  # [B, J, 1, E] (kind "s") or [B, J, 1, I] (kind "agree")
        if ctx.kind == "s":
            g_small = torch.matmul(g, u.transpose(-1, -2)).squeeze(2)  # [B, J, 1, E] @ [B, J, E, I] -> [B, J, I]
        else:
            g_small = torch.matmul(g, u).squeeze(2)  # [B, J, 1, I] @ [B, J, I, E] -> [B, J, E]
        return g_small.to(ctx.small_dtype), None, None, None


class _FusedRouting(torch.autograd.Function):
    """:func:`~capsule_lib.routing.dynamic.dynamic_routing` whose backward forms the votes' gradient in **one**
    batched product.

    The votes ``u [B, J, I, E]`` enter the loop only through ``s_t = c_t u`` (a sum over the children) and
    ``agree_t = u v_t`` (a dot product over ``e``), so
    ``dL/du_ji = sum_t c_t,ji dL/ds_t,j + sum_t dL/dagree_t,ji v_t,j``: a ``[I, K] @ [K, E]`` product per
    ``(b, j)`` with ``K = 2T - 1`` (1 with ``detach="non_final"``). Autograd instead writes one votes-sized
    outer product per use and adds them up (5 products + 4 additions of the largest tensor for T = 3). The
    backward replays the loop on the saved votes with autograd on the small tensors only (``c``, ``s``, ``v``,
    logits, bias: their gradients read the votes but never write a votes-sized tensor), reusing the forward's
    products with the votes (``_Replay``). ``route`` is the plain loop (``dynamic._route``), passed in so that
    this module does not import the routing module that imports it.
    """

    @staticmethod
    def forward(ctx, votes, bias, iterations, leaky, coupling, squash_kind, detach, route):
        vj = votes.transpose(1, 2).contiguous()  # [B, J, I, E]
        ctx.autocast = (torch.is_autocast_enabled(vj.device.type), torch.get_autocast_dtype(vj.device.type))
        ctx.options = (iterations, leaky, coupling, squash_kind, detach)
        ctx.route = route
        v, st = route(vj, iterations, bias, leaky, coupling, squash_kind, detach, False)
        ctx.save_for_backward(vj, bias, *st["s"], *st["agree"])
        return v

    @staticmethod
    def backward(ctx, g_v):
        vj, bias, *values = ctx.saved_tensors
        iterations, leaky, coupling, squash_kind, detach = ctx.options
        given = {"s": values[:iterations], "agree": values[iterations:]}  # the forward's products with the votes
        enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(vj.device.type, dtype=dtype, enabled=enabled):
            b = bias.detach().requires_grad_() if bias is not None else None
            given = {k: [x.detach().requires_grad_() for x in xs] for k, xs in given.items()}
            v, st = ctx.route(vj, iterations, b, leaky, coupling, squash_kind, detach, False, given)
            first = iterations - 1 if detach == "non_final" else 0  # iterations whose votes carry gradient
            s_used, a_used = st["s"][first:], st["agree"][first:]
            wrt = [*s_used, *a_used] + ([b] if b is not None else [])
            grads = torch.autograd.grad(v, wrt, g_v, allow_unused=True)
        n_s = len(s_used)
        g_s = [torch.zeros_like(x) if g is None else g for x, g in zip(s_used, grads[:n_s])]
        g_a = [torch.zeros_like(x) if g is None else g for x, g in zip(a_used, grads[n_s : n_s + len(a_used)])]
        g_bias = grads[-1] if b is not None else None
        dt = vj.dtype
        L = torch.stack([c.to(dt) for c in st["c"][first:]] + [g.to(dt) for g in g_a], dim=-1)  # [B, J, I, K]
        R = torch.stack([g.to(dt) for g in g_s] + [x.detach().to(dt) for x in st["v"][first : first + len(g_a)]], 2)
        g_votes = torch.matmul(L, R)  # [B, J, I, K] @ [B, J, K, E] -> [B, J, I, E]
        return g_votes.transpose(1, 2), g_bias, None, None, None, None, None, None
