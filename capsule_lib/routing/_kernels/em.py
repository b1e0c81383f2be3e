"""EM routing's CPU kernel (chosen by :func:`~capsule_lib.routing._common.use_kernel`; tested equal to the plain
autograd path in float64, values and gradients, in ``tests/test_fused_kernels.py`` and ``tests/test_routing_em.py``).

``_EMRoutingFunction`` runs the same M- and E-steps as the readable
``routing.em._em_routing_autograd`` (``routing.em`` passes them in, ``m_step`` and ``e_step``: this module does not
import the routing module that imports it), over cache-sized blocks of the independent routings, with a hand-derived
backward.
"""

from __future__ import annotations

import torch

__all__: list[str] = []


#: votes entries routed per block by ``_EMRoutingFunction`` (2**18 fp32 = 1 MiB: the block's temporaries
#: stay in L2/L3; much smaller blocks pay more per-op overhead than they save, measured on a 2-core EPYC). Blocks
#: are whole positions/samples, so a block is at least one ``J * I * D``.
_BLOCK_ELEMENTS = 2**18


def _block_rows(n_rows: int, row_size: int) -> int:
    """Rows (routings) per block: about ``_BLOCK_ELEMENTS`` votes, and a single block when two would do (each
    block costs a fixed ~200 small tensor ops)."""
    n = max(1, _BLOCK_ELEMENTS // row_size)
    return n_rows if n_rows <= 2 * n else n


class _EMRoutingFunction(torch.autograd.Function):
    """Procedure 1 on ``V [N, J, I, D]`` (contiguous), ``a [N, I]``, ``bu, ba [J]`` -> ``(mu [N, J, D],
    a_out [N, J])``, with a hand-derived backward. ``m_step`` and ``e_step`` are ``routing.em``'s ``_m_step`` and
    ``_e_step``, the steps the plain path runs (so both give the same bits in the forward).

    Both passes walk over blocks of the ``N`` independent routings (conv positions x batch) so that the
    votes-sized temporaries (``V - mu`` and its square) are cache-sized and reused, and the forward keeps only
    ``[n, J, I]``- and ``[n, J, D]``-sized tensors per block and iteration (``R``, the M-step weights, ``mu``,
    ``sigma2``, the activation logits); the backward recomputes ``V - mu`` block by block.

    Backward, per iteration ``t`` from the last (``c`` = M-step weights, ``e = V - mu``, ``w = 1/sigma2``,
    ``g_x`` = dL/dx; ``g_R`` comes from iteration ``t + 1``, 0 for the last)::

        g_lp     = R_{t+1} (g_R - sum_j R_{t+1} g_R)                 softmax over j       [N, J, I]
        g_logit  = sum_i g_lp sigmoid(-logit)  (+ g_a_out a (1 - a) for the last)          [N, J]
        g_maha   = -g_lp / 2 ;  g_logsig2 = sum_i g_maha + g_cost mass scale / 2           [N, J]
        g_sigma2 = g_logsig2 w - w^2 sum_i g_maha e^2                                    [N, J, D]
        g_mu     = g_mu_out - 2 g_sigma2 sum_i c e - 2 w sum_i g_maha e                   [N, J, D]
                   (sum_i c e summed from the recomputed e, not taken as its exact value mu eps / (mass + eps))
        g_V     += c (g_mu + 2 g_sigma2 e) + g_maha 2 w e                                 [N, J, I, D]
        g_c      = sum_d (g_sigma2 e^2 + g_mu e)   (+ g_mu mu, constant over i: see below)  [N, J, I]
        then through c = R'/(mass + eps), mass = sum_i R', (R' normalised over j), R' = R a; a term K
        constant over i reaches R' only as K eps / (mass + eps)^2
    """

    @staticmethod
    def forward(ctx, V, a, bu, ba, lams, normalize_over_outputs, scale, eps, m_step, e_step):
        N, J, I, D = V.shape
        T = len(lams)
        n_blk = _block_rows(N, J * I * D)
        e = V.new_empty(n_blk, J, I, D)  # (V - mu)^2 of one block
        bu_ = bu.unsqueeze(-1)  # [J, 1]
        blocks, mus, logits = [], [], []
        for s in range(0, N, n_blk):
            Vb, ab = V[s : s + n_blk], a[s : s + n_blk].unsqueeze(-2)  # [n, J, I, D], [n, 1, I]
            n = Vb.shape[0]
            R = Vb.new_full((n, J, I), 1.0 / J)  # [n, J, I]
            saved = []  # per iteration: (R, c, mass, mu, sigma2, logit)
            for t, lam in enumerate(lams):
                c, mass, mu, sq, sigma2, log_sigma2, _, logit = m_step(
                    R, ab, Vb, bu_, ba, lam, normalize_over_outputs, scale, eps, sq_out=e[:n]
                )
                saved.append((R, c, mass, mu, sigma2, logit))
                if t < T - 1:
                    _, R = e_step(sq, sigma2, log_sigma2, logit)  # [n, J, I]
            blocks.append(saved)
            mus.append(mu)
            logits.append(logit)
        # every tensor the backward needs goes through save_for_backward (so saved-tensor hooks, e.g. the memory
        # count of capsule_lib.cost, see them): V, a, bu, then per block and iteration (R, c, mass, mu, sigma2, logit)
        ctx.save_for_backward(V, a, bu, *(x for saved in blocks for step in saved for x in step))
        ctx.n_blocks, ctx.n_blk = len(blocks), n_blk
        ctx.opts, ctx.device_type = (lams, normalize_over_outputs, scale, eps), V.device.type
        logit = logits[0] if len(logits) == 1 else torch.cat(logits)  # [N, J]
        return mus[0] if len(mus) == 1 else torch.cat(mus), torch.sigmoid(logit)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mu_out, g_a_out):
        # the backward runs under the caller's autocast state: keep it in the compute dtype, like the forward
        with torch.autocast(device_type=ctx.device_type, enabled=False):
            return _EMRoutingFunction._backward(ctx, g_mu_out, g_a_out)

    @staticmethod
    def _backward(ctx, g_mu_out, g_a_out):
        V, a, bu, *flat = ctx.saved_tensors
        T6 = 6 * len(ctx.opts[0])  # tensors per block: 6 per iteration
        blocks = [
            [tuple(flat[k * T6 + 6 * t : k * T6 + 6 * t + 6]) for t in range(len(ctx.opts[0]))]
            for k in range(ctx.n_blocks)
        ]
        lams, normalize_over_outputs, scale, eps = ctx.opts
        N, J, I, D = V.shape
        T, n_blk = len(lams), ctx.n_blk
        g_mu_out = V.new_zeros(N, J, D) if g_mu_out is None else g_mu_out  # [N, J, D]
        g_a_out = V.new_zeros(N, J) if g_a_out is None else g_a_out  # [N, J]
        g_V, g_a = torch.empty_like(V), torch.empty_like(a)  # [N, J, I, D], [N, I]
        g_cost_sum, g_cost_mass_sum = V.new_zeros(J), V.new_zeros(J)  # [J]: sum_n,t g_cost (x mass)
        e = V.new_empty(n_blk, J, I, D)  # V - mu of one block
        e2 = torch.empty_like(e)  # (V - mu)^2, then a term of the block's g_V
        bu_ = bu.unsqueeze(-1)  # [J, 1]
        for b, saved in enumerate(blocks):
            blk = slice(b * n_blk, (b + 1) * n_blk)
            Vb, ab, gVb = V[blk], a[blk].unsqueeze(-2), g_V[blk]  # [n, J, I, D], [n, 1, I], [n, J, I, D]
            n = Vb.shape[0]
            eb, e2b = e[:n], e2[:n]  # [n, J, I, D]
            ef, e2f = eb.view(n * J, I, D), e2b.view(n * J, I, D)
            g_aR = torch.zeros_like(saved[0][0])  # [n, J, I]  sum_t g_R' R  (-> g_a)
            g_R = None  # dL/dR_{t+1}
            for t in reversed(range(T)):
                R, c, mass, mu, sigma2, logit = saved[t]  # [n,J,I] x 2, [n,J], [n,J,D] x 2, [n,J]
                torch.sub(Vb, mu.unsqueeze(-2), out=eb)  # [n, J, I, D]  e = V - mu
                torch.mul(eb, eb, out=e2b)  # [n, J, I, D]  e^2
                w = sigma2.reciprocal()  # [n, J, D]
                inv_m = (mass + eps).reciprocal()  # [n, J]
                # ---- E-step (t < T-1): R_{t+1} = softmax_j(log p + logsigmoid(logit)) ----
                if g_R is None:
                    a_out = torch.sigmoid(logit)  # [n, J]
                    g_logit = g_a_out[blk] * (1.0 - a_out) * a_out  # [n, J]
                else:
                    R_next = saved[t + 1][0]  # [n, J, I]
                    g_lp = R_next * g_R  # [n, J, I]
                    g_lp = torch.addcmul(g_lp, R_next, g_lp.sum(dim=-2, keepdim=True), value=-1.0)  # [n, J, I]
                    g_logit = g_lp.sum(dim=-1) * torch.sigmoid(-logit)  # [n, J]
                    g_maha = -0.5 * g_lp  # [n, J, I]  (log p = -(maha + sum_d log sigma2 + D ln 2pi) / 2)
                # ---- M-step: a_out = sigmoid(lam (ba - sum_d (bu + log sigma2 / 2) mass scale)) ----
                g_cost = -lams[t] * g_logit  # [n, J]
                g_cost_mass = g_cost * mass  # [n, J]
                g_cost_sum += g_cost.sum(dim=0)
                g_cost_mass_sum += g_cost_mass.sum(dim=0)
                g_mass = (scale * g_cost) * (bu_ + 0.5 * torch.log(sigma2)).sum(dim=-1)  # [n, J]
                g_log_sigma2 = (0.5 * scale) * g_cost_mass  # [n, J]  (the same for every d)
                if g_R is not None:
                    g_log_sigma2 = g_log_sigma2 + g_maha.sum(dim=-1)  # [n, J]
                g_sigma2 = g_log_sigma2.unsqueeze(-1) * w  # [n, J, D]
                if g_R is not None:  # maha_ij = sum_d e^2 w
                    g_m = g_maha.view(n * J, 1, I)  # [nJ, 1, I]
                    sum_ge2 = torch.bmm(g_m, e2f).view(n, J, D)  # [n, J, D]  sum_i g_maha e^2
                    g_sigma2 = torch.addcmul(g_sigma2, sum_ge2, w.square(), value=-1.0)  # [n, J, D]
                    sum_ge = torch.bmm(g_m, ef).view(n, J, D)  # [n, J, D]  sum_i g_maha e
                # g_mu = g_mu_out - 2 g_sigma2 sum_i c e - 2 w sum_i g_maha e. sum_i c e is mu eps / (mass + eps) in
                # exact arithmetic, but it must be summed from the same rounded e as the g_V term c 2 g_sigma2 e below:
                # the rounding of mu (|V| ulp, large next to e when the votes span many scales) then cancels.
                sum_ce = torch.bmm(c.view(n * J, 1, I), ef).view(n, J, D)  # [n, J, D]  sum_i c e
                g_mu = (-2.0 * g_sigma2) * sum_ce  # [n, J, D]
                if g_R is None:
                    g_mu += g_mu_out[blk]
                else:
                    g_mu.addcmul_(w, sum_ge, value=-2.0)
                # g_c = sum_d (g_sigma2 e^2 + g_mu V), taken centred: g_mu V = g_mu e + g_mu mu, whose constant part
                # (over i) reaches R' only as g_mu mu eps / (mass + eps)^2 (the sum over i of g_c c cancels the rest;
                # summing g_mu V would lose everything but |V| ulp when the votes are large next to their spread)
                g_c = torch.bmm(g_sigma2.view(n * J, 1, D), e2f.transpose(1, 2))  # [nJ, 1, I]
                g_c = g_c.baddbmm_(g_mu.view(n * J, 1, D), ef.transpose(1, 2)).view(n, J, I)  # [n, J, I]
                g_c_const = (g_mu * mu).sum(dim=-1)  # [n, J]
                # g_V (+)= c (g_mu + 2 g_sigma2 e) + g_maha (2 w e)
                torch.addcmul(g_mu.unsqueeze(-2), eb, (2.0 * g_sigma2).unsqueeze(-2), out=e2b)  # [n, J, I, D]
                if t == T - 1:
                    torch.mul(e2b, c.unsqueeze(-1), out=gVb)  # [n, J, I, D]
                else:
                    gVb.addcmul_(e2b, c.unsqueeze(-1))  # [n, J, I, D]
                if g_R is not None:
                    gVb.addcmul_(eb.mul_((2.0 * w).unsqueeze(-2)), g_maha.unsqueeze(-1))  # [n, J, I, D]
                # ---- c = R' / (mass + eps), mass = sum_i R', R' = R a (normalised over j) ----
                g_mass = torch.addcmul(g_mass, (g_c * c).sum(dim=-1), inv_m, value=-1.0)  # [n, J]
                g_mass.addcmul_(g_c_const, inv_m.square(), value=eps)  # [n, J]
                g_Rp = torch.addcmul(g_mass.unsqueeze(-1), g_c, inv_m.unsqueeze(-1))  # [n, J, I]
                if normalize_over_outputs:
                    Rq = R * ab  # [n, J, I]
                    inv_z = (Rq.sum(dim=-2, keepdim=True) + eps).reciprocal()  # [n, 1, I]
                    g_Rp = (g_Rp - (g_Rp * Rq).sum(dim=-2, keepdim=True) * inv_z) * inv_z  # [n, J, I]
                g_aR.addcmul_(g_Rp, R)  # [n, J, I]
                if t > 0:
                    g_R = g_Rp * ab  # [n, J, I]
            torch.sum(g_aR, dim=-2, out=g_a[blk])  # [n, I]  g_a = sum_t,j g_R' R
        g_ba = -g_cost_sum  # [J]  logit = lam (ba - cost)
        g_bu = g_cost_mass_sum * (D * scale)  # [J]  cost = sum_d (bu + ...) mass scale
        return g_V, g_a, g_bu, g_ba, None, None, None, None, None, None
