"""Self-attention routing's CPU kernel (chosen by :func:`~capsule_lib.routing._common.use_kernel` in
:class:`~capsule_lib.routing.self_attention.SelfAttentionRouting`; tested equal to
:func:`~capsule_lib.routing.self_attention.self_attention_routing_reference` and to the plain path in float64, values
and gradients, in ``tests/test_fused_kernels.py`` and ``tests/test_routing_self_attention.py``).
"""

from __future__ import annotations

import math

import torch

__all__: list[str] = []


class _FusedSelfAttention(torch.autograd.Function):
    """Votes, self-attention routing and squash_E in one function with a hand-written backward.

    ``u [B, I, d]``, ``W [J, I, d, D]``, ``log_prior [J, I, 1]`` (the module's layout) -> ``v [B, J, D]``.
    Internally the votes are ``V [I, D, J, B]`` (``V_i = W_i u_i^T``, one batched product over ``i``), so the
    sums over ``D`` (logits, the coefficients' gradient) and over ``I`` (``T``, ``s``) run over outer axes::

        T = sum_i V_i / sqrt(D)              [D, J, B]
        a = <V_i, T>_D                       [I, J, B]     logits
        c = softmax_J(a),  cb = c + prior    [I, J, B]
        s = sum_i cb_i V_i                   [D, J, B]
        n = sqrt(|s|^2 + eps),  v = f(n) s   f(n) = (1 - e^-n) / n

    Backward, with ``g = dL/dv``::

        gs  = f g + s <g, s> f'(n) / n                   squash_E
        gcb = <V_i, gs>_D;   gprior = sum_B gcb
        ga  = c (gcb - <c, gcb>_J)                       softmax
        gV  = cb gs + ga T + sum_i ga_i V_i / sqrt(D)    (s; the logits' left factor; their T)
        gu_i = gV_i^T W_i,   gW_i = gV_i u_i             two batched products over i
    """

    @staticmethod
    def forward(ctx, u, weight, log_prior, eps):
        B, I, d = u.shape
        J, D = weight.shape[0], weight.shape[3]
        scale = 1.0 / math.sqrt(D)
        Wr = weight.permute(1, 3, 0, 2).reshape(I, D * J, d)  # [I, D*J, d]   (a copy of the small weight)
        ut = u.transpose(0, 1)  # [I, B, d]
        # one allocation for the votes and a votes-sized scratch (the elementwise products below, and the votes'
        # gradient in backward): fresh votes-sized buffers cost page faults that outweigh the arithmetic here
        buf = u.new_empty(2, I, D * J, B)
        torch.bmm(Wr, ut.transpose(1, 2), out=buf[0])  # [I, D*J, d] @ [I, d, B] -> [I, D*J, B]
        V, S = buf[0].view(I, D, J, B), buf[1].view(I, D, J, B)  # votes, scratch   [I, D, J, B]
        Ts = V.sum(0).mul_(scale)  # [D, J, B]      sum_k u_hat_{j,k} / sqrt(D)
        logits = torch.mul(V, Ts, out=S).sum(1)  # [I, J, B]
        c = torch.softmax(logits, dim=1)  # [I, J, B], sums to 1 over the outputs j
        cb = c + log_prior.view(J, I, 1).transpose(0, 1)  # [I, J, B]   bias after the softmax
        s = torch.mul(cb.unsqueeze(1), V, out=S).sum(0)  # [D, J, B]
        n = torch.linalg.vecdot(s, s, dim=0).add_(eps).sqrt_()  # [J, B]   safe norm (eps inside the root)
        h = torch.expm1(n.neg()).neg_()  # [J, B]   1 - e^{-n}
        f = h / n  # [J, B]
        ctx.save_for_backward(ut, Wr, buf, Ts, c, cb, s, n, h, f)
        ctx.scale = scale
        return (s * f).permute(2, 1, 0)  # [B, J, D] (a view of [D, J, B])

    @staticmethod
    def backward(ctx, g_v):
        ut, Wr, buf, Ts, c, cb, s, n, h, f = ctx.saved_tensors
        I, DJ, B = buf.shape[1:]
        D, J, d = DJ // c.shape[1], c.shape[1], ut.shape[-1]
        # votes, and the scratch that becomes the votes' gradient (written through .data so that the saved buffer's
        # version does not change: a second backward, e.g. gradcheck or retain_graph, can unpack it again)
        V, G = buf[0].view(I, D, J, B), buf.data[1].view(I, D, J, B)
        g = g_v.permute(2, 1, 0)  # [D, J, B]
        # f'(n)/n = (n e^-n - h) / n^3 with n e^-n = n - n h                                                 [J, B]
        fp = torch.addcmul(n - h, n, h, value=-1).div_(n).div_(n * n)
        g_s = torch.addcmul(g * f, s, torch.linalg.vecdot(g, s, dim=0).mul_(fp))  # [D, J, B]
        g_cb = torch.mul(V, g_s, out=G).sum(1)  # [I, J, B]
        g_prior = g_cb.sum(-1).t().unsqueeze(-1)  # [J, I, 1]
        g_a = (g_cb - torch.linalg.vecdot(c, g_cb, dim=1).unsqueeze(1)).mul_(c).unsqueeze(1)  # [I, 1, J, B]
        g_T = torch.mul(g_a, V, out=G).sum(0)  # [D, J, B]
        # g_V = g_T / sqrt(D) + cb g_s + g_a Ts, in two passes over the votes-sized buffer      [I, D, J, B]
        torch.addcmul(g_T.mul_(ctx.scale), cb.unsqueeze(1), g_s, out=G).addcmul_(g_a, Ts)
        g_V = G.view(I, DJ, B)
        g_u = torch.bmm(Wr.transpose(1, 2), g_V).permute(2, 0, 1)  # [I, d, B] -> [B, I, d]
        g_W = torch.bmm(g_V, ut).view(I, D, J, d).permute(2, 0, 3, 1)  # [I, D*J, d] -> [J, I, d, D]
        return g_u, g_W, g_prior, None
