"""Heinsen (2019) routing's CPU kernel: the moments path of
:func:`~capsule_lib.routing.heinsen_2019.generative_matrix_routing` (``method="moments"``, chosen by ``method="auto"``
in ``heinsen_2019`` when the weights are shared by every input and :func:`~capsule_lib.routing._common.use_kernel`
allows it: the CPU, no trace). Tested equal to
:func:`~capsule_lib.routing.heinsen_2019.generative_matrix_routing_reference` in float64,
values and gradients (``tests/test_routing_heinsen.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__: list[str] = []


def moments_routing(
    f_a_inp: torch.Tensor,
    mu: torch.Tensor,
    W: torch.Tensor,
    B: torch.Tensor,
    b_use: torch.Tensor,
    b_ign: torch.Tensor,
    iterations: int,
    p_model: str,
    eps: float,
):
    """The 2019 loop when ``W``, ``B`` and the betas are shared by every input, without forming the votes.

    ``f_a_inp [..., I, 1]``, ``mu [..., I, C, D]``, ``W [J, D, E]``, ``B [J, C, E]``, ``b_use``, ``b_ign [J]``
    -> ``(a_out [..., J], mu_out [..., J, C, E], sigma2_out [..., J, C, E])``, all in ``mu``'s dtype.

    The votes ``V_ij = mu_i W_j + B_j`` (``[..., I, J, C, E]``: 425 MB for the smallNORB model's 5184 x 64 at
    batch 20) are linear in ``mu_i``. With inputs centred, ``x_i = mu_i - m`` (``m``: their mean weighted by
    ``f(a_i)``; any shift gives the same result, centring keeps the expanded squares below from cancelling),
    ``V_ij = x_i W_j + B'_j`` with ``B'_j = m W_j + B_j``, and ``V_ij - mu_out_j = x_i W_j - K_j`` with
    ``K_j = mu_out_j - B'_j``. So every sum over the inputs needs only the ``D_use``-weighted moments
    ``sum_i D_ij x_i`` and ``sum_i D_ij x_i[c] (x) x_i[c]``, and ``log p_ij`` is a quadratic form in
    ``(x_i, x_i (x) x_i)``: all are ``[..., I, 16 or 64] x [..., 16 or 64, J]`` matrix products. Same function
    as the votes path (float64 agrees to ~1e-12).

    The expanded squares (``sigma2`` from the moments, the quadratic forms of ``log p``) cancel when a Gaussian is
    far tighter than the spread of the inputs around their mean (inputs spanning many scales, a spike): in float32
    that lost every digit of ``sigma2`` and ``log p`` (relative errors up to 1e4 on a 1e5 spike where the votes path
    in float32 stays within 1e-2), and the ratio of the expanded terms to what they leave reached 1e5-1e6 on the
    shipped smallNORB network's own inputs. :func:`.heinsen_2019.generative_matrix_routing`
    therefore runs this function in
    float64 (``mu`` and the parameters upcast; keeping the ``[..., I, J]`` shares in float32 saved 6 % and lost the
    accuracy again). That costs the CPU training step of
    the smallNORB network 1.6x at the book's 48 x 48 (156 -> 247 ms, batch 32, 2 cores) and about 3x at the paper's
    96 x 96 (``benchmarks/bench.py`` case ``model_heinsen_smallnorb``: about 0.55 -> 1.6-2.0 s at batch 20), still
    7.5x faster than the author's code there (``benchmarks/README.md``). The expanded variance is still clamped at 0
    before ``+ eps``.
    """
    I, C, D = mu.shape[-3:]
    J = W.shape[0]
    f_sum = f_a_inp.sum(dim=-2)  # [..., 1]
    weights = (f_a_inp / (f_sum.unsqueeze(-1) + eps)).detach()  # [..., I, 1]  inputs with f = 0 do not count
    centre = torch.einsum("...i,...icd->...cd", weights.squeeze(-1), mu.detach()).unsqueeze(-3)  # [..., 1, C, D]
    x = mu - centre  # [..., I, C, D]  (centred on the f-weighted mean; the result does not depend on it)
    B_c = torch.matmul(centre, W) + B  # [..., J, C, E]  V_ij = x_i W_j + B_c_j
    X = x.flatten(-2)  # [..., I, C*D]
    XX = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-3)  # [..., I, C*D*D]  x_i[c, d] x_i[c, f]
    a_out = mu_out = sigma2 = log_p = None
    for t in range(iterations):
        # E-step: each input's shares R_ij over the outputs (sum to 1 over j).
        if t == 0:
            R = mu.new_full((*mu.shape[:-3], I, J), 1.0 / J)  # [..., I, J]
        else:
            R = torch.softmax(F.logsigmoid(a_out).unsqueeze(-2) + log_p, dim=-1)  # [..., I, J]

        # D-step.
        D_use = f_a_inp * R  # [..., I, J]
        D_sum = D_use.sum(dim=-2)  # [..., J]  sum_i D_use_ij

        # M-step from the weighted moments of the inputs.
        a_out = b_use * D_sum - b_ign * (f_sum - D_sum)  # [..., J]  (sum_i D_ign_ij = sum_i f_i - D_sum_j)
        D_t = D_use.transpose(-1, -2)  # [..., J, I]
        S = D_sum[..., None, None]  # [..., J, 1, 1]
        over = 1.0 / (S + eps)  # [..., J, 1, 1]
        MW = torch.einsum("...jcd,jde->...jce", (D_t @ X).unflatten(-1, (C, D)), W)  # [..., J, C, E]  sum_i D x_i W
        mu_out = (MW + B_c * S) * over  # [..., J, C, E]
        K = mu_out - B_c  # [..., J, C, E]  V_ij - mu_out_j = x_i W_j - K_j
        Q = (D_t @ XX).unflatten(-1, (C, D, D))  # [..., J, C, D, D]  sum_i D x_i[c] (x) x_i[c]
        sum_sq = torch.einsum("...jcdf,jde,jfe->...jce", Q, W, W)  # [..., J, C, E]  sum_i D (x_i W_j)^2
        sigma2 = (sum_sq - 2.0 * K * MW + K.square() * S).clamp_min(0.0) * over + eps  # [..., J, C, E]

        # Agreements for the next E-step: -sum_{c,e} lam_jce (x_i W_j - K_j)^2_ce as a quadratic form in x_i.
        if t < iterations - 1:
            lam = 0.5 / sigma2 if p_model == "gaussian" else torch.ones_like(sigma2)  # [..., J, C, E]
            A = torch.einsum("jde,jfe,...jce->...jcdf", W, W, lam).flatten(-3)  # [..., J, C*D*D]
            G = torch.einsum("jde,...jce->...jcd", W, K * lam).flatten(-2)  # [..., J, C*D]
            const = (K.square() * lam).sum(dim=(-2, -1))  # [..., J]
            quad = XX @ A.transpose(-1, -2) - 2.0 * (X @ G.transpose(-1, -2)) + const.unsqueeze(-2)  # [..., I, J]
            if p_model == "gaussian":
                log_p = -quad - 0.5 * torch.log(sigma2).sum(dim=(-2, -1)).unsqueeze(-2)  # [..., I, J]
            else:
                log_p = torch.log_softmax(-quad, dim=-1)  # [..., I, J]  soft k-means
    return a_out, mu_out, sigma2
