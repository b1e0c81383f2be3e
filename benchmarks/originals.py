"""Re-creations of the original public implementations' routing computations, **for timing only**.

Each block below re-creates, in PyTorch, the tensor operations of one public implementation the way that code
performs them (same broadcasts and materialised expansions, same einsum strings and contraction order, same
Python loops), so that :mod:`benchmarks.bench` can time ``capsule_lib`` against them on the same shapes and
inputs. They are written from the papers' descriptions and from a reading of the
original files; they are minimal re-writes (no training scripts, loggers, data code) and are **not** the
original code. Bugs that prevent running on a modern PyTorch (2.x) or on CPU are fixed and listed in each
header; bugs that change the *math* are kept (they are what the originals compute), and
:mod:`benchmarks.bench` compares them with ``capsule_lib`` run in its compatible mode where the library has one.

Contraction order: ``torch.einsum`` with three or more operands contracts left to right unless the optional
``opt_einsum`` package is installed (then it picks a path). The originals were written for PyTorch 1.x,
which always contracted left to right; this venv has no ``opt_einsum``, so the multi-operand einsums below
run exactly as they did then. (With ``opt_einsum`` installed they would get cheaper paths; see README.)

Layouts: every class keeps its parameters in the original layout; :mod:`benchmarks.bench` copies capsule_lib's
parameters into them (permuting axes where the layouts differ) so that both sides compute on the same numbers.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "gram_ai_softmax", "gram_ai_squash", "GramAIDigitCaps", "GramAICapsuleNet", "gram_ai_capsule_loss",
    "xifengguo_squash", "XifengGuoDenseCapsule",
    "YL1993ConvCaps", "YL1993PrimaryCaps", "YL1993CapsNet",
    "Heinsen2019Routing",
    "AppleCapsuleFC", "AppleCapsuleCONV", "AppleCapsModel",
    "efficient_squash", "KerasFCCaps",
]


# ====================================================================================================
# gram-ai/capsule-networks, capsule_network.py (CapsuleLayer with num_route_nodes != -1, CapsuleNet,
# CapsuleLoss), final version of the file.
#
# Fixes needed to run it (no change to the math):
#   * ``Variable`` is imported only under ``__main__`` and ``.cuda()`` is hard-coded: the zero routing
#     logits are created with ``torch.zeros(..., device=priors.device, dtype=priors.dtype)``;
#   * ``.squeeze()`` of the digit capsules breaks at batch size 1: squeeze the two singleton axes by index;
#   * ``(x * y[:, :, None]).view(B, -1)`` fails on the non-contiguous tensor in modern PyTorch: ``reshape``;
#   * ``nn.MSELoss(size_average=False)`` is deprecated: ``reduction="sum"``.
# Kept (they are the original's math): softmax over the INPUT capsules (issue #10), no bias, squash without
# epsilon, routing logits with an extra 16-wide axis (issue #23), W ~ N(0, 1), the softmax over the class
# lengths before the margin loss (issue #6), eight separate 32-channel convolutions as primary capsules.
# ====================================================================================================
def gram_ai_softmax(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The original softmax helper: move ``dim`` last, make contiguous, flatten, softmax, undo."""
    moved = x.transpose(dim, x.dim() - 1)
    flat = F.softmax(moved.contiguous().view(-1, moved.size(-1)), dim=-1)
    return flat.view(*moved.size()).transpose(dim, x.dim() - 1)


def gram_ai_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``|s|^2 / (1 + |s|^2) * s / |s|`` with no epsilon (NaN at s = 0, as in the original)."""
    sq = (s ** 2).sum(dim=dim, keepdim=True)
    return sq / (1 + sq) * s / torch.sqrt(sq)


class GramAIDigitCaps(nn.Module):
    """gram-ai's routed ``CapsuleLayer``: ``x [B, I, d] -> [J, B, 1, 1, E]`` (the original's output layout).

    ``route_weights [J, I, d, E]``. The votes are a broadcast matmul ``x[None, :, :, None, :] @ W[:, None]``,
    which materialises ``W`` expanded over the batch (``J*B*I*d*E`` floats) inside ``matmul``.
    """

    def __init__(self, num_capsules: int = 10, num_route_nodes: int = 1152, in_channels: int = 8,
                 out_channels: int = 16, num_iterations: int = 3) -> None:
        super().__init__()
        self.num_iterations = num_iterations
        self.route_weights = nn.Parameter(torch.randn(num_capsules, num_route_nodes, in_channels, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        priors = x[None, :, :, None, :] @ self.route_weights[:, None, :, :, :]  # [J, B, I, 1, E]
        logits = torch.zeros(*priors.size(), device=priors.device, dtype=priors.dtype)  # fix: was Variable().cuda()
        for it in range(self.num_iterations):
            probs = gram_ai_softmax(logits, dim=2)  # over the I input capsules (the original's axis)
            outputs = gram_ai_squash((probs * priors).sum(dim=2, keepdim=True))  # [J, B, 1, 1, E]
            if it != self.num_iterations - 1:
                logits = logits + (priors * outputs).sum(dim=-1, keepdim=True)  # broadcast back to [J,B,I,1,E]
        return outputs

    @staticmethod
    def to_bje(out: torch.Tensor) -> torch.Tensor:
        """``[J, B, 1, 1, E] -> [B, J, E]`` (the original's ``.squeeze().transpose(0, 1)``, batch-1 safe)."""
        return out.squeeze(3).squeeze(2).transpose(0, 1)


class GramAICapsuleNet(nn.Module):
    """gram-ai ``CapsuleNet`` (MNIST): conv1 -> 8 primary convs -> routed digit caps -> softmaxed lengths,
    decoder on the label-masked capsules. ``forward(x, y_onehot) -> (classes [B, 10], recon [B, 784])``."""

    def __init__(self, num_classes: int = 10, num_iterations: int = 3) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(1, 256, kernel_size=9, stride=1)
        self.primary = nn.ModuleList([nn.Conv2d(256, 32, kernel_size=9, stride=2) for _ in range(8)])
        self.digit_capsules = GramAIDigitCaps(num_classes, 32 * 6 * 6, 8, 16, num_iterations)
        self.decoder = nn.Sequential(nn.Linear(16 * num_classes, 512), nn.ReLU(inplace=True),
                                     nn.Linear(512, 1024), nn.ReLU(inplace=True),
                                     nn.Linear(1024, 784), nn.Sigmoid())

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        x = F.relu(self.conv1(x), inplace=True)
        u = torch.cat([conv(x).view(x.size(0), -1, 1) for conv in self.primary], dim=-1)  # [B, 1152, 8]
        u = gram_ai_squash(u)
        v = GramAIDigitCaps.to_bje(self.digit_capsules(u))  # [B, 10, 16]
        classes = F.softmax((v ** 2).sum(dim=-1) ** 0.5, dim=-1)
        if y is None:
            y = torch.eye(self.num_classes, device=x.device, dtype=x.dtype).index_select(0, classes.argmax(1))
        recon = self.decoder((v * y[:, :, None]).reshape(v.size(0), -1))  # fix: was .view
        return classes, recon


def gram_ai_capsule_loss(images: torch.Tensor, labels_onehot: torch.Tensor, classes: torch.Tensor,
                         recon: torch.Tensor) -> torch.Tensor:
    """gram-ai ``CapsuleLoss``: (sum margin on the softmaxed classes + 0.0005 * SSE) / B."""
    left = F.relu(0.9 - classes) ** 2
    right = F.relu(classes - 0.1) ** 2
    margin = (labels_onehot * left + 0.5 * (1.0 - labels_onehot) * right).sum()
    images = images.view(recon.size(0), -1)
    sse = F.mse_loss(recon, images, reduction="sum")  # fix: size_average=False is deprecated
    return (margin + 0.0005 * sse) / images.size(0)


# ====================================================================================================
# XifengGuo/CapsNet-Pytorch, capsulelayers.py (DenseCapsule).
#
# Fix needed: the routing logits are ``Variable(torch.zeros(...)).cuda()``; created on the input's device.
# Kept: the votes ``matmul(W [J, I, E, d], x[:, None, :, :, None])`` (a broadcast matmul that materialises W
# expanded over the batch), softmax over the outputs (correct), squash with 1e-8 outside the root, the votes
# DETACHED in every non-final iteration (so no gradient flows through the routing iterations), and the
# logit update after every non-final iteration.
# ====================================================================================================
def xifengguo_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    n = torch.norm(s, p=2, dim=dim, keepdim=True)
    return n ** 2 / (1 + n ** 2) / (n + 1e-8) * s


class XifengGuoDenseCapsule(nn.Module):
    """``x [B, I, d] -> [B, J, E]``; ``weight [J, I, E, d] = 0.01 * N(0, 1)``."""

    def __init__(self, in_num_caps: int = 1152, in_dim_caps: int = 8, out_num_caps: int = 10,
                 out_dim_caps: int = 16, routings: int = 3) -> None:
        super().__init__()
        self.out_num_caps, self.routings = out_num_caps, routings
        self.weight = nn.Parameter(0.01 * torch.randn(out_num_caps, in_num_caps, out_dim_caps, in_dim_caps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = torch.matmul(self.weight, x[:, None, :, :, None]).squeeze(-1)  # [B, J, I, E]
        x_hat_detached = x_hat.detach()
        b = torch.zeros(x.size(0), self.out_num_caps, x.size(1), device=x.device, dtype=x.dtype)  # fix: .cuda()
        for it in range(self.routings):
            c = F.softmax(b, dim=1)  # [B, J, I], over the outputs
            if it == self.routings - 1:
                outputs = xifengguo_squash(torch.sum(c[:, :, :, None] * x_hat, dim=-2, keepdim=True))
            else:
                outputs = xifengguo_squash(torch.sum(c[:, :, :, None] * x_hat_detached, dim=-2, keepdim=True))
                b = b + torch.sum(outputs * x_hat_detached, dim=-1)
        return outputs.squeeze(-2)  # [B, J, E]


# ====================================================================================================
# yl-1993/Matrix-Capsules-EM-PyTorch, model/capsules.py (ConvCaps: add_pathes, transform_view, add_coord,
# m_step, e_step, caps_em_routing; PrimaryCaps; CapsNet).
#
# Fixes needed to run on CPU / modern PyTorch (no change to the math): ``torch.cuda.FloatTensor(...)`` for
# the initial R, the ln(2 pi) constant and the coordinate-addition offsets are created on the input's device
# and dtype. Option added: ``conv1_padding`` (the original pads conv1 by 2 for 28x28 MNIST; the smallNORB
# shapes of the paper, 32 -> 14 -> 6 -> 4, need 0).
# Kept: the channel-last ``[b, h, w, B*(P*P+1)]`` layout (poses then activations), the fancy-index patch
# extraction + ``.contiguous()``, ``w.repeat(b, ...)`` and ``x.repeat(..., C, ...)`` before a batched
# matmul (the votes' transformation matrices are materialised once per window), the renormalisation of
# ``r * a_in`` over the outputs (which cancels a_in), ``lambda = 1e-3``, ``log(sqrt(sigma^2))``,
# ``log(a_out)`` of the sigmoid, and the full [b, B, C, P*P] log-likelihood tensor in the E-step.
# ====================================================================================================
class YL1993ConvCaps(nn.Module):
    """ConvCaps: ``x [b, h, w, B*(P*P+1)] -> [b, h', w', C*(P*P+1)]`` (or class activations ``[b, C]`` when
    ``w_shared``). ``weights [1, K*K*B, C, P, P]``; ``beta_u``, ``beta_a [C]``."""

    def __init__(self, B: int = 32, C: int = 32, K: int = 3, P: int = 4, stride: int = 2, iters: int = 3,
                 coor_add: bool = False, w_shared: bool = False) -> None:
        super().__init__()
        self.B, self.C, self.K, self.P, self.psize, self.stride = B, C, K, P, P * P, stride
        self.iters, self.coor_add, self.w_shared = iters, coor_add, w_shared
        self.eps = 1e-8
        self._lambda = 1e-03
        self.ln_2pi = math.log(2 * math.pi)  # fix: was a torch.cuda.FloatTensor
        self.beta_u = nn.Parameter(torch.zeros(C))
        self.beta_a = nn.Parameter(torch.zeros(C))
        self.weights = nn.Parameter(torch.randn(1, K * K * B, C, P, P))

    def m_step(self, a_in, r, v, eps, b, B, C, psize):
        r = r * a_in                                                   # [b, B, C]
        r = r / (r.sum(dim=2, keepdim=True) + eps)                     # renormalised over the outputs
        r_sum = r.sum(dim=1, keepdim=True)                             # [b, 1, C]
        coeff = (r / (r_sum + eps)).view(b, B, C, 1)
        mu = torch.sum(coeff * v, dim=1, keepdim=True)                 # [b, 1, C, psize]
        sigma_sq = torch.sum(coeff * (v - mu) ** 2, dim=1, keepdim=True) + eps
        r_sum = r_sum.view(b, C, 1)
        sigma_sq = sigma_sq.view(b, C, psize)
        cost_h = (self.beta_u.view(C, 1) + torch.log(sigma_sq.sqrt())) * r_sum
        a_out = torch.sigmoid(self._lambda * (self.beta_a - cost_h.sum(dim=2)))  # [b, C]
        return a_out, mu, sigma_sq.view(b, 1, C, psize)

    def e_step(self, mu, sigma_sq, a_out, v, eps, b, C):
        ln_p_j_h = -1.0 * (v - mu) ** 2 / (2 * sigma_sq) - torch.log(sigma_sq.sqrt()) - 0.5 * self.ln_2pi
        ln_ap = ln_p_j_h.sum(dim=3) + torch.log(a_out.view(b, 1, C))  # [b, B, C]
        return torch.softmax(ln_ap, dim=2)

    def caps_em_routing(self, v, a_in, C, eps):
        b, B, c, psize = v.shape
        r = torch.full((b, B, C), 1.0 / C, device=v.device, dtype=v.dtype)  # fix: was torch.cuda.FloatTensor
        for it in range(self.iters):
            a_out, mu, sigma_sq = self.m_step(a_in, r, v, eps, b, B, C, psize)
            if it < self.iters - 1:
                r = self.e_step(mu, sigma_sq, a_out, v, eps, b, C)
        return mu, a_out

    def add_pathes(self, x, B, K, psize, stride):
        b, h, w, c = x.shape
        oh = ow = int((h - K) / stride + 1)
        idxs = [[h_idx + k_idx for k_idx in range(K)] for h_idx in range(0, h - K + 1, stride)]
        x = x[:, idxs, :, :]
        x = x[:, :, :, idxs, :]
        x = x.permute(0, 1, 3, 2, 4, 5).contiguous()                  # [b, oh, ow, K, K, c]
        return x, oh, ow

    def transform_view(self, x, w, C, P, w_shared=False):
        b, B, psize = x.shape
        x = x.view(b, B, 1, P, P)
        if w_shared:
            hw = int(B / w.size(1))
            w = w.repeat(1, hw, 1, 1, 1)
        w = w.repeat(b, 1, 1, 1, 1)                                    # [b, B, C, P, P]  materialised
        x = x.repeat(1, 1, C, 1, 1)                                    # [b, B, C, P, P]  materialised
        return torch.matmul(x, w).view(b, B, C, P * P)

    def add_coord(self, v, b, h, w, B, C, psize):
        v = v.view(b, h, w, B, C, psize)
        coor = torch.arange(h, dtype=v.dtype, device=v.device) / h
        coor_h = torch.zeros(1, h, 1, 1, 1, self.psize, dtype=v.dtype, device=v.device)  # fix: cuda tensors
        coor_w = torch.zeros(1, 1, w, 1, 1, self.psize, dtype=v.dtype, device=v.device)
        coor_h[0, :, 0, 0, 0, 0] = coor
        coor_w[0, 0, :, 0, 0, 1] = coor
        v = v + coor_h + coor_w
        return v.view(b, h * w * B, C, psize)

    def forward(self, x):
        b, h, w, c = x.shape
        if not self.w_shared:
            x, oh, ow = self.add_pathes(x, self.B, self.K, self.psize, self.stride)
            p_in = x[..., :self.B * self.psize].contiguous().view(b * oh * ow, self.K * self.K * self.B, self.psize)
            a_in = x[..., self.B * self.psize:].contiguous().view(b * oh * ow, self.K * self.K * self.B, 1)
            v = self.transform_view(p_in, self.weights, self.C, self.P)
            p_out, a_out = self.caps_em_routing(v, a_in, self.C, self.eps)
            p_out = p_out.view(b, oh, ow, self.C * self.psize)
            a_out = a_out.view(b, oh, ow, self.C)
            return torch.cat([p_out, a_out], dim=3)
        p_in = x[..., :self.B * self.psize].contiguous().view(b, h * w * self.B, self.psize)
        a_in = x[..., self.B * self.psize:].contiguous().view(b, h * w * self.B, 1)
        v = self.transform_view(p_in, self.weights, self.C, self.P, self.w_shared)
        if self.coor_add:
            v = self.add_coord(v, b, h, w, self.B, self.C, self.psize)
        _, out = self.caps_em_routing(v, a_in, self.C, self.eps)
        return out


class YL1993PrimaryCaps(nn.Module):
    """``[b, A, h, w] -> [b, h, w, B*(P*P+1)]``: a 1x1 pose conv and a 1x1 sigmoid activation conv."""

    def __init__(self, A: int = 32, B: int = 32, K: int = 1, P: int = 4, stride: int = 1) -> None:
        super().__init__()
        self.pose = nn.Conv2d(A, B * P * P, kernel_size=K, stride=stride, bias=True)
        self.a = nn.Conv2d(A, B, kernel_size=K, stride=stride, bias=True)

    def forward(self, x):
        return torch.cat([self.pose(x), torch.sigmoid(self.a(x))], dim=1).permute(0, 2, 3, 1)


class YL1993CapsNet(nn.Module):
    """yl-1993 ``CapsNet``: conv1 (5x5 s2) + BN + ReLU -> PrimaryCaps -> ConvCaps(k3 s2) -> ConvCaps(k3 s1) ->
    class ConvCaps (weights shared over positions, coordinate addition) -> class activations ``[b, E]``."""

    def __init__(self, A: int = 32, B: int = 32, C: int = 32, D: int = 32, E: int = 10, K: int = 3, P: int = 4,
                 iters: int = 3, in_channels: int = 1, conv1_padding: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, A, kernel_size=5, stride=2, padding=conv1_padding)
        self.bn1 = nn.BatchNorm2d(A, eps=0.001, momentum=0.1, affine=True)
        self.primary_caps = YL1993PrimaryCaps(A, B, 1, P, stride=1)
        self.conv_caps1 = YL1993ConvCaps(B, C, K, P, stride=2, iters=iters)
        self.conv_caps2 = YL1993ConvCaps(C, D, K, P, stride=1, iters=iters)
        self.class_caps = YL1993ConvCaps(D, E, 1, P, stride=1, iters=iters, coor_add=True, w_shared=True)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.primary_caps(x)
        x = self.conv_caps1(x)
        x = self.conv_caps2(x)
        return self.class_caps(x)


# ====================================================================================================
# glassroom/heinsen_routing, heinsen_routing.py at the 2019 paper's code (class ``Routing``).
#
# No fixes needed. Kept: ``W.expand(n_inp, ...)`` then ``einsum('ijdh,...icd->...ijch', W, mu) + B`` (the
# votes [..., I, J, C, E] in input-major layout), the three-operand einsums for mu/sigma^2 (contracted left
# to right), ``(V - mu)^2`` materialised every iteration, ``sig2.sqrt().log()``.
# The parameters are passed in (W, B, beta_use, beta_ign, optionally B_brk) so that the benchmark can share
# them with capsule_lib's GenerativeMatrixRouting.
# ====================================================================================================
class Heinsen2019Routing(nn.Module):
    """``(a_inp [..., I], mu_inp [..., I, C, D]) -> (a_out [..., J], mu_out [..., J, C, E], sig2 [..., J, C, E])``."""

    def __init__(self, d_cov: int, d_inp: int, d_out: int, n_inp: int = -1, n_out: int = -1, n_iters: int = 3,
                 single_beta: bool = False, p_model: str = "gaussian", eps: float = 1e-5) -> None:
        super().__init__()
        self.n_iters, self.p_model, self.eps = n_iters, p_model, eps
        self.n_inp_is_fixed, self.n_out_is_fixed = n_inp > 0, n_out > 0
        i1, j1 = max(1, n_inp), max(1, n_out)
        self.register_buffer("CONST_one", torch.tensor(1.0))
        self.W = nn.Parameter(torch.randn(i1, j1, d_inp, d_out) / d_inp)
        self.B = nn.Parameter(torch.zeros(i1, j1, d_cov, d_out))
        if not self.n_out_is_fixed:
            self.B_brk = nn.Parameter(torch.zeros(1, d_cov, d_out))
        self.beta_use = nn.Parameter(torch.zeros(i1, j1))
        self.beta_ign = self.beta_use if single_beta else nn.Parameter(torch.zeros(i1, j1))

    def forward(self, a_inp, mu_inp, n_out: int | None = None):
        n_inp = a_inp.shape[-1]
        W = self.W if self.n_inp_is_fixed else self.W.expand(n_inp, -1, -1, -1)
        B = self.B
        if self.n_out_is_fixed:
            n_out = W.shape[1]
        else:
            n_out = n_out if n_out is not None else n_inp
            W = W.expand(-1, n_out, -1, -1)
            B = B + self.B_brk * torch.linspace(-1, 1, n_out, device=B.device, dtype=B.dtype)[:, None, None]
        V = torch.einsum("ijdh,...icd->...ijch", W, mu_inp) + B        # [..., I, J, C, E]
        f_a_inp = torch.sigmoid(a_inp).unsqueeze(-1)                   # [..., I, 1]
        for it in range(self.n_iters):
            if it == 0:
                R = (self.CONST_one.to(V.dtype) / n_out).expand(V.shape[:-2])  # [..., I, J]
            else:
                if self.p_model == "gaussian":
                    log_p = (-torch.einsum("...ijch,...jch->...ij", V_less_mu_out_2, 1.0 / (2.0 * sig2_out))
                             - sig2_out.sqrt().log().sum((-2, -1)).unsqueeze(-2))
                else:
                    log_p = torch.log_softmax(-V_less_mu_out_2.sum((-2, -1)), dim=-1)
                R = torch.softmax(F.logsigmoid(a_out).unsqueeze(-2) + log_p, dim=-1)
            D_use = f_a_inp * R
            D_ign = f_a_inp - D_use
            a_out = (self.beta_use * D_use).sum(dim=-2) - (self.beta_ign * D_ign).sum(dim=-2)  # [..., J]
            over_D_use_sum = 1.0 / (D_use.sum(dim=-2) + self.eps)     # [..., J]
            mu_out = torch.einsum("...ij,...ijch,...j->...jch", D_use, V, over_D_use_sum)
            V_less_mu_out_2 = (V - mu_out.unsqueeze(-4)) ** 2          # [..., I, J, C, E]
            sig2_out = torch.einsum("...ij,...ijch,...j->...jch", D_use, V_less_mu_out_2, over_D_use_sum) + self.eps
        return a_out, mu_out, sig2_out


# ====================================================================================================
# apple/ml-capsules-inverted-attention-routing, src/layers.py (CapsuleFC, CapsuleCONV; matrix_pose=True) and
# src/capsule_model.py (CapsModel, concurrent routing).
#
# ``expansion="stack"`` is the first published ``CapsuleCONV.input_expansion``: a Python loop over the
# h_out*w_out output positions whose k x k slices are ``torch.stack``ed on the LAST axis and then ``view``ed as
# [b, n, k, k, h_out, w_out, d] (mixing pose entries and positions: apple PR #1). ``expansion="unfold"`` is the
# later version of that file (also the author's fork), ``input.unfold(2, ..).unfold(3, ..).permute(...)``; as
# committed it raises NameError (``res`` is undefined), fixed here by permuting the unfolded tensor.
# Kept: the three-operand einsums (left to right: the votes, or r x inputs, are materialised as
# [b, n, k, l, h, w, a, d, m] / [b, n, k, l, m, h, w, a, x] tensors), the in-place ``mul_`` of the logits,
# the renormalisation of r, Dropout, LayerNorm; the model's ``out.squeeze()`` (it breaks at batch 1; the
# benchmark never uses batch 1 for the model).
# ====================================================================================================
class AppleCapsuleFC(nn.Module):
    """``input [b, n, d]`` (or a CONV grid ``[b, n, h, w, d]``), ``next_capsule_value [b, m, d]`` or None
    -> ``[b, m, d]``. ``w [n, s, s, m]``."""

    def __init__(self, in_n_capsules: int, in_d_capsules: int, out_n_capsules: int, out_d_capsules: int,
                 dp: float = 0.0) -> None:
        super().__init__()
        self.in_n_capsules, self.out_n_capsules, self.out_d_capsules = in_n_capsules, out_n_capsules, out_d_capsules
        self.sqrt_d = int(math.sqrt(in_d_capsules))
        self.weight_init_const = math.sqrt(out_n_capsules / (self.sqrt_d * in_n_capsules))
        self.w = nn.Parameter(self.weight_init_const * torch.randn(in_n_capsules, self.sqrt_d, self.sqrt_d,
                                                                   out_n_capsules))
        self.nonlinear_act = nn.LayerNorm(out_d_capsules)
        self.drop = nn.Dropout(dp)
        self.scale = 1.0 / (out_d_capsules ** 0.5)

    def forward(self, input, num_iter=0, next_capsule_value=None):
        if input.dim() == 5:  # a CONV layer's grid, flattened type-major
            input = input.permute(0, 4, 1, 2, 3)
            input = input.contiguous().view(input.shape[0], input.shape[1], -1).permute(0, 2, 1)
        w = self.w
        _input = input.view(input.shape[0], input.shape[1], self.sqrt_d, self.sqrt_d)  # bnax
        if next_capsule_value is None:
            query_key = torch.zeros(self.in_n_capsules, self.out_n_capsules).type_as(input)
            query_key = F.softmax(query_key, dim=1)
            out = torch.einsum("nm, bnax, nxdm->bmad", query_key, _input, w)
        else:
            nv = next_capsule_value.view(next_capsule_value.shape[0], next_capsule_value.shape[1],
                                         self.sqrt_d, self.sqrt_d)
            _query_key = torch.einsum("bnax, nxdm, bmad->bnm", _input, w, nv)
            _query_key.mul_(self.scale)
            query_key = F.softmax(_query_key, dim=2)
            query_key = query_key / (torch.sum(query_key, dim=2, keepdim=True) + 1e-10)
            out = torch.einsum("bnm, bnax, nxdm->bmad", query_key, _input, w)
        out = self.drop(out)
        out = out.view(out.shape[0], out.shape[1], self.out_d_capsules)
        return self.nonlinear_act(out)


class AppleCapsuleCONV(nn.Module):
    """``input [b, n, H, W, d]``, ``next_capsule_value [b, m, h, w, d]`` or None -> ``[b, m, h, w, d]``.
    ``w [k, k, n, s, s, m]``. ``expansion``: ``"stack"`` (first published, buggy) or ``"unfold"``."""

    def __init__(self, in_n_capsules: int, in_d_capsules: int, out_n_capsules: int, out_d_capsules: int,
                 kernel_size: int, stride: int, dp: float = 0.0, expansion: str = "stack") -> None:
        super().__init__()
        if expansion not in ("stack", "unfold"):
            raise ValueError(f"expansion must be 'stack' or 'unfold', got {expansion!r}")
        self.in_n_capsules, self.out_n_capsules, self.out_d_capsules = in_n_capsules, out_n_capsules, out_d_capsules
        self.kernel_size, self.stride, self.expansion = kernel_size, stride, expansion
        self.sqrt_d = int(math.sqrt(in_d_capsules))
        self.weight_init_const = math.sqrt(out_n_capsules / (self.sqrt_d * in_n_capsules * kernel_size ** 2))
        self.w = nn.Parameter(self.weight_init_const * torch.randn(kernel_size, kernel_size, in_n_capsules,
                                                                   self.sqrt_d, self.sqrt_d, out_n_capsules))
        self.nonlinear_act = nn.LayerNorm(out_d_capsules)
        self.drop = nn.Dropout(dp)
        self.scale = 1.0 / (out_d_capsules ** 0.5)

    def input_expansion(self, input):
        K, st = self.kernel_size, self.stride
        if self.expansion == "unfold":
            tiled = input.unfold(2, size=K, step=st).unfold(3, size=K, step=st)  # [b, n, h, w, d, k, l]
            return tiled.permute([0, 1, 5, 6, 2, 3, 4])                          # fix: was res.permute(...)
        b, n, h, w, d = input.shape
        h_out, w_out = int((h - K) / st + 1), int((w - K) / st + 1)
        stacked = torch.stack([input[:, :, st * i:st * i + K, st * j:st * j + K, :]
                               for i in range(h_out) for j in range(w_out)], dim=-1)  # [b, n, k, k, d, h*w]
        return stacked.view(b, n, K, K, h_out, w_out, d)

    def forward(self, input, num_iter=0, next_capsule_value=None):
        inputs = self.input_expansion(input)
        w = self.w
        _inputs = inputs.view(*inputs.shape[:6], self.sqrt_d, self.sqrt_d)  # bnklhwax
        if next_capsule_value is None:
            query_key = torch.zeros(self.in_n_capsules, self.kernel_size, self.kernel_size,
                                    self.out_n_capsules).type_as(inputs)
            query_key = F.softmax(query_key, dim=3)
            out = torch.einsum("nklm, bnklhwax, klnxdm->bmhwad", query_key, _inputs, w)
        else:
            nv = next_capsule_value.view(*next_capsule_value.shape[:4], self.sqrt_d, self.sqrt_d)
            _query_key = torch.einsum("bnklhwax, klnxdm, bmhwad->bnklmhw", _inputs, w, nv)
            _query_key.mul_(self.scale)
            query_key = F.softmax(_query_key, dim=4)
            query_key = query_key / (torch.sum(query_key, dim=4, keepdim=True) + 1e-10)
            out = torch.einsum("bnklmhw, bnklhwax, klnxdm->bmhwad", query_key, _inputs, w)
        out = self.drop(out)
        out = out.view(*out.shape[:4], self.out_d_capsules)
        return self.nonlinear_act(out)


class AppleCapsModel(nn.Module):
    """The official ``CapsModel`` forward (concurrent routing) around given sub-modules:
    ``backbone`` (the official resnet_backbone is the same network as capsule_lib's ResNetBackbone),
    ``pc_layer`` (conv1x1, no bias), ``nonlinear_act`` (LayerNorm(d)), ``capsule_layers``, ``final_fc``."""

    def __init__(self, backbone: nn.Module, pc_layer: nn.Conv2d, nonlinear_act: nn.LayerNorm,
                 capsule_layers: list[nn.Module], final_fc: nn.Linear, pc_num_caps: int, pc_caps_dim: int,
                 num_routing: int = 2) -> None:
        super().__init__()
        self.pre_caps, self.pc_layer, self.nonlinear_act = backbone, pc_layer, nonlinear_act
        self.capsule_layers = nn.ModuleList(capsule_layers)
        self.final_fc = final_fc
        self.pc_num_caps, self.pc_caps_dim, self.num_routing = pc_num_caps, pc_caps_dim, num_routing

    def forward(self, x):
        c = self.pre_caps(x)
        u = self.pc_layer(c).permute(0, 2, 3, 1)
        u = u.view(u.shape[0], u.shape[1], u.shape[2], self.pc_num_caps, self.pc_caps_dim).permute(0, 3, 1, 2, 4)
        init_capsule_value = self.nonlinear_act(u)
        capsule_values, val = [init_capsule_value], init_capsule_value
        for layer in self.capsule_layers:  # first iteration: uniform feed-forward pass
            val = layer(val, 0)
            capsule_values.append(val)
        for n in range(self.num_routing - 1):  # concurrent (Jacobi) updates
            new_values = [init_capsule_value]
            for i, layer in enumerate(self.capsule_layers):
                new_values.append(layer(capsule_values[i], n, capsule_values[i + 1]))
            capsule_values = new_values
        return self.final_fc(capsule_values[-1]).squeeze()


# ====================================================================================================
# EscVM/Efficient-CapsNet, utils/layers.py (FCCaps, Squash). The original is TensorFlow 2 / Keras, which
# cannot be installed here; this re-creates its operations in PyTorch one for one:
#   u = einsum('...ji,kjiz->...kjz', inputs, W)         votes in output-major layout [B, J, I, D]
#   c = einsum('...ij,...kj->...i', u, u)[..., None]     row sums of the self-attention matrix
#   c = softmax(c / sqrt(D), axis=1) + b                 over the outputs; the bias after the softmax
#   s = reduce_sum(u * c, axis=-2)                       broadcast product materialised, then summed
#   v = squash_E(s) with eps 1e-20 outside the norm
# Note on the attention matrix: in that einsum the label k appears in one operand only, and both
# tf.einsum and torch.einsum sum such labels out BEFORE the contraction, so neither forms the I x I matrix
# U_j U_j^T; it is sum_k u_k dotted with u_i. ``attention="explicit"`` forms the matrix
# (einsum 'bjid,bjkd->bjik', then a row sum), which is what the formula in the paper describes and what a
# literal reading of the Keras line suggests; it is timed as a second variant.
# ====================================================================================================
def efficient_squash(s: torch.Tensor, eps: float = 10e-21) -> torch.Tensor:
    n = torch.norm(s, dim=-1, keepdim=True)
    return (1 - 1 / (torch.exp(n) + eps)) * (s / (n + eps))


class KerasFCCaps(nn.Module):
    """``inputs [B, I, d] -> [B, J, D]``; ``W [J, I, d, D]``, ``b [J, I, 1]`` (the Keras layouts)."""

    def __init__(self, N: int, D: int, input_N: int, input_D: int, attention: str = "einsum") -> None:
        super().__init__()
        if attention not in ("einsum", "explicit"):
            raise ValueError(f"attention must be 'einsum' or 'explicit', got {attention!r}")
        self.N, self.D, self.attention = N, D, attention
        self.W = nn.Parameter(torch.randn(N, input_N, input_D, D) * math.sqrt(2.0 / (input_D * N * input_N)))
        self.b = nn.Parameter(torch.zeros(N, input_N, 1))

    def forward(self, inputs):
        u = torch.einsum("...ji,kjiz->...kjz", inputs, self.W)        # [B, J, I, D]
        if self.attention == "einsum":
            c = torch.einsum("...ij,...kj->...i", u, u)[..., None]     # [B, J, I, 1]
        else:
            c = torch.einsum("...id,...kd->...ik", u, u).sum(dim=-1)[..., None]  # [B, J, I, I] -> [B, J, I, 1]
        c = c / math.sqrt(self.D)
        c = torch.softmax(c, dim=1)                                    # over the outputs J
        c = c + self.b
        s = torch.sum(u * c, dim=-2)                                   # [B, J, D]
        return efficient_squash(s)
