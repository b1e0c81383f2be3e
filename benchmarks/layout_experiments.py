"""Local experiments behind the performance notes in benchmarks/README.md (not part of the benchmark).

Each experiment times forward + backward of a capsule_lib routing layer against a prototype that computes the
same function differently, checks that both give the same outputs and gradients, and prints the times:

* dynamic routing (capsule_lib since 77d7fe5 vs its previous child-major code) and the inverted-attention CONV
  layer (capsule_lib vs a prototype): the routing tensors in **parent-major** layout
  (``[B, J, I, ...]``: every sum over the children ``i`` is then a batched matrix product on contiguous memory,
  and the softmax over the parents runs on a non-last axis);
* self-attention routing: the two sums over the children as broadcast products + sums instead of einsums;
* Heinsen's 2019 routing with W shared by all inputs (smallNORB routing 1): sums over the inputs from weighted
  moments of the inputs, without forming the votes.

    .venv/bin/python benchmarks/layout_experiments.py --threads 1 [--quick]

The prototypes are sketches of suggested changes to capsule_lib (they skip input validation, traces and
options such as leaky routing); capsule_lib itself is not modified by this file.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from capsule_lib.functional import squash  # noqa: E402
from capsule_lib.routing import DynamicRouting, GenerativeMatrixRouting, InvertedConvCapsules, SelfAttentionRouting  # noqa: E402
from capsule_lib.routing.inverted import conv_windows  # noqa: E402


# ---------------------------------------------------------------------------------------- dynamic routing
# capsule_lib adopted the parent-major layout for dynamic routing in commit 77d7fe5 (after this experiment's
# first version); the experiment now times that against the child-major code it replaced.
def dynamic_child_major(u, weight, bias, iterations=3):
    """capsule_lib's dynamic routing before 77d7fe5: votes [B, I, J, E] (a permuted view of the votes einsum's
    [I, B, J*E] result), logits [B, I, J] with the softmax over the last axis (J = 10), contractions over i on
    the child-major votes."""
    votes = torch.einsum("bid,ijde->bije", u, weight)  # [B, I, J, E]
    B, I, J, E = votes.shape
    logits = votes.new_zeros(B, I, J)  # [B, I, J]
    for t in range(iterations):
        c = torch.softmax(logits, dim=-1)  # [B, I, J]
        s = torch.einsum("bij,bije->bje", c, votes)  # [B, J, E]
        if bias is not None:
            s = s + bias
        v = squash(s)
        if t < iterations - 1:
            logits = logits + torch.einsum("bije,bje->bij", votes, v)  # [B, I, J]
    return v


# -------------------------------------------------------------------------------------- inverted (conv)
def inverted_conv_parent_major(P, layer: InvertedConvCapsules, prev=None):
    """Same math as InvertedConvCapsules.forward for matrix poses, votes kept as [B, h, w, M, I, s, s]."""
    K, _, N, s, _, M = layer.weight.shape
    win = conv_windows(P, K, layer.stride, layer.expansion)  # [B, N, k, l, h, w, d]
    B, h, w = win.shape[0], win.shape[4], win.shape[5]
    Pw = win.reshape(B, N, K, K, h, w, s, s)
    if prev is None:
        s_sum = torch.einsum("bnklhwax,klnxem->bhwmae", Pw, layer.weight).reshape(B, h, w, M, s * s) / M
    else:
        V = torch.einsum("bnklhwax,klnxem->bhwmnklae", Pw, layer.weight).reshape(B, h, w, M, N * K * K, s * s)
        Q = prev.permute(0, 2, 3, 1, 4)  # [B, h, w, M, d]
        a = torch.einsum("bhwmid,bhwmd->bhwmi", V, Q) / math.sqrt(s * s)  # [B, h, w, M, I]
        r = torch.softmax(a, dim=3)  # over the parents m (a non-last axis)
        r = r / (r.sum(dim=3, keepdim=True) + 1e-10)
        s_sum = torch.einsum("bhwmi,bhwmid->bhwmd", r, V)  # [B, h, w, M, d]
    out = F.layer_norm(s_sum, (s * s,), layer.norm.weight, layer.norm.bias, layer.norm.eps)
    return out.permute(0, 3, 1, 2, 4).contiguous()  # [B, M, h, w, d]


# ---------------------------------------------------------------------------------- self-attention routing
def self_attention_broadcast(u, layer: SelfAttentionRouting):
    """Same math as SelfAttentionRouting.forward (no trace): the two contractions over the children written as
    broadcast products + sums, whose backward is elementwise (einsum's backward builds the votes' gradient with
    B*J batched GEMMs of inner size 1, which dominate at these sizes)."""
    votes = torch.einsum("bid,jide->bije", u, layer.weight)  # [B, I, J, E]
    total = votes.sum(dim=1, keepdim=True)  # [B, 1, J, E]
    logits = (votes * total).sum(dim=-1) / math.sqrt(votes.shape[-1])  # [B, I, J]
    c = torch.softmax(logits, dim=-1) + layer.prior()  # [B, I, J]
    s = (c.unsqueeze(-1) * votes).sum(dim=1)  # [B, J, E]
    return squash(s, "efficient", eps=layer.eps)


# --------------------------------------------------------------- Heinsen 2019 routing with a shared W
def heinsen_shared_w_moments(a_inp, mu_inp, layer: GenerativeMatrixRouting):
    """Same math as GenerativeMatrixRouting when W, B and the betas are shared by all inputs (first size 1, the
    smallNORB model's first routing), without ever forming the votes V_ij = mu_i W_j + B_j [B, I, J, C, E].

    With K_j = mu_out_j - B_j, V_ij - mu_out_j = mu_i W_j - K_j, so every sum over the inputs needs only the
    D_use-weighted first and second moments of the inputs, M_j = sum_i D_ij mu_i [C, D] and
    Q_j = sum_i D_ij mu_i[c] (x) mu_i[c] [C, D, D], and log p_ij is a quadratic form in (mu_i, mu_i (x) mu_i):
    all are [B, I, 16/64] x [B, 16/64, J] matrix products. Expanding the squares trades memory for cancellation:
    sigma2 = (sum D (mu W)^2 - 2 K (M W) + K^2 sum D) / sum D loses precision when sigma2 << |V|^2.
    """
    W, Bb, b_use, b_ign = layer.W[0], layer.B[0], layer.beta_use[0], layer.beta_ign[0]  # [J,D,E], [J,C,E], [J]
    eps, iterations = layer.eps, layer.iterations
    Bsz, I, C, D = mu_inp.shape
    J = W.shape[0]
    X = mu_inp.reshape(Bsz, I, C * D)  # [B, I, C*D]
    P = torch.einsum("bicd,bicf->bicdf", mu_inp, mu_inp).reshape(Bsz, I, C * D * D)  # [B, I, C*D*D]
    f = torch.sigmoid(a_inp).unsqueeze(-1)  # [B, I, 1]
    for t in range(iterations):
        if t == 0:
            R = mu_inp.new_full((Bsz, I, J), 1.0 / J)
        else:
            R = torch.softmax(F.logsigmoid(a_out).unsqueeze(-2) + log_p, dim=-1)  # [B, I, J]
        D_use = f * R
        D_sum = D_use.sum(dim=-2)  # [B, J]
        a_out = b_use * D_sum - b_ign * (f.sum(dim=-2) - D_sum)  # [B, J] (betas shared by all inputs)
        over = (1.0 / (D_sum + eps))[..., None, None]  # [B, J, 1, 1]
        M = torch.bmm(D_use.transpose(1, 2), X).view(Bsz, J, C, D)  # [B, J, C, D]
        MW = torch.einsum("bjcd,jde->bjce", M, W)  # [B, J, C, E]
        mu_out = (MW + Bb * D_sum[..., None, None]) * over  # [B, J, C, E]
        K = mu_out - Bb
        Q = torch.bmm(D_use.transpose(1, 2), P).view(Bsz, J, C, D, D)  # [B, J, C, D, D]
        sum_sq = torch.einsum("bjcdf,jde,jfe->bjce", Q, W, W)  # sum_i D (mu_i W)^2
        sigma2 = (sum_sq - 2.0 * K * MW + K.square() * D_sum[..., None, None]) * over + eps  # [B, J, C, E]
        if t < iterations - 1:
            lam = 0.5 / sigma2  # [B, J, C, E]
            A = torch.einsum("jde,jfe,bjce->bjcdf", W, W, lam).reshape(Bsz, J, C * D * D)
            G = torch.einsum("jde,bjce->bjcd", W, K * lam).reshape(Bsz, J, C * D)
            const = (K.square() * lam).sum(dim=(-2, -1))  # [B, J]
            quad = torch.bmm(P, A.transpose(1, 2)) - 2.0 * torch.bmm(X, G.transpose(1, 2)) + const.unsqueeze(-2)
            log_p = -quad - 0.5 * torch.log(sigma2).sum(dim=(-2, -1)).unsqueeze(-2)  # [B, I, J]
    return a_out, mu_out, sigma2


# ------------------------------------------------------------------------------------------------ timing
def bench(fns: dict, inputs, params, gs, repeat: int) -> dict:
    def step(f):
        for t in (*inputs, *params):
            t.grad = None
        outs = f(*inputs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        sum((o * g).sum() for o, g in zip(outs, gs)).backward()

    for f in fns.values():
        step(f)
    times = {k: [] for k in fns}
    for r in range(repeat):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t0 = time.perf_counter()
            step(fns[k])
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def check(f1, f2, inputs, params, gs) -> tuple[float, float]:
    res = []
    for f in (f1, f2):
        for t in (*inputs, *params):
            t.grad = None
        outs = f(*inputs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        sum((o * g).sum() for o, g in zip(outs, gs)).backward()
        res.append(([o.detach().clone() for o in outs], [t.grad.clone() for t in (*inputs, *params)]))
    od = max(float((a - b).abs().max()) for a, b in zip(res[0][0], res[1][0]))
    gd = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(res[0][1], res[1][1]))
    return od, gd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    # dynamic routing, CapsNet DigitCaps
    B, I = (8, 72) if args.quick else (128, 1152)
    m = DynamicRouting(I, 10, 8, 16, 3)
    u = torch.randn(B, I, 8, requires_grad=True)
    gs = [torch.randn(B, 10, 16)]
    params = [m.weight, m.bias]
    fns = {"child-major": lambda x: dynamic_child_major(x, m.weight, m.bias), "capsule_lib": lambda x: m(x)}
    od, gd = check(fns["capsule_lib"], fns["child-major"], [u], params, gs)
    t = bench(fns, [u], params, gs, args.repeat)
    print(
        f"dynamic routing B={B}, {I}->10: child-major (before 77d7fe5) {t['child-major'] * 1e3:.0f} ms, capsule_lib "
        f"(parent-major) {t['capsule_lib'] * 1e3:.0f} ms ({t['child-major'] / t['capsule_lib']:.2f}x); "
        f"max|dout| {od:.1e}, max rel dgrad {gd:.1e}"
    )

    # self-attention routing, Efficient-CapsNet FCCaps
    for B in (16, 128):
        lay = SelfAttentionRouting(16, 10, 8, 16)
        with torch.no_grad():
            lay.log_prior.normal_(std=0.05)
        u = torch.randn(B, 16, 8, requires_grad=True)
        gs = [torch.randn(B, 10, 16)]
        params = list(lay.parameters())
        fns = {"capsule_lib": lambda x: lay(x), "broadcast": lambda x: self_attention_broadcast(x, lay)}
        od, gd = check(fns["capsule_lib"], fns["broadcast"], [u], params, gs)
        t = bench(fns, [u], params, gs, max(args.repeat, 200))
        print(
            f"self-attention B={B}, 16->10: capsule_lib {t['capsule_lib'] * 1e3:.2f} ms, broadcast "
            f"{t['broadcast'] * 1e3:.2f} ms ({t['capsule_lib'] / t['broadcast']:.2f}x); max|dout| {od:.1e}, "
            f"max rel dgrad {gd:.1e}"
        )

    # Heinsen 2019 routing, smallNORB routing 1 (5184 -> 64, W shared by all inputs)
    B, I = (2, 576) if args.quick else (20, 5184)
    r1 = GenerativeMatrixRouting(d_cov=4, d_inp=4, d_out=4, n_out=64, iterations=3)
    with torch.no_grad():
        for p_ in (r1.B, r1.beta_use, r1.beta_ign):
            p_.normal_(std=0.5)
    a = torch.randn(B, I, requires_grad=True)
    mu = torch.randn(B, I, 4, 4, requires_grad=True)
    gs = [torch.randn(B, 64), torch.randn(B, 64, 4, 4), torch.randn(B, 64, 4, 4)]
    params = [r1.W, r1.B, r1.beta_use, r1.beta_ign]
    fns = {"capsule_lib": lambda x, y: list(r1(x, y)), "moments": lambda x, y: list(heinsen_shared_w_moments(x, y, r1))}
    od, gd = check(fns["capsule_lib"], fns["moments"], [a, mu], params, gs)
    r64 = GenerativeMatrixRouting(d_cov=4, d_inp=4, d_out=4, n_out=64, iterations=3).double()
    r64.load_state_dict(r1.state_dict())
    od64, gd64 = check(
        lambda x, y: list(r64(x, y)),
        lambda x, y: list(heinsen_shared_w_moments(x, y, r64)),
        [a.detach().double().requires_grad_(), mu.detach().double().requires_grad_()],
        list(r64.parameters()),
        [g.double() for g in gs],
    )
    t = bench(fns, [a, mu], params, gs, max(3, args.repeat // 2))
    print(
        f"Heinsen routing 1, B={B}, {I}->64: capsule_lib {t['capsule_lib'] * 1e3:.0f} ms, moments "
        f"{t['moments'] * 1e3:.0f} ms ({t['capsule_lib'] / t['moments']:.2f}x); float32 max|dout| {od:.1e}, max rel "
        f"dgrad {gd:.1e}; float64 max|dout| {od64:.1e}, max rel dgrad {gd64:.1e}"
    )

    # inverted attention CONV layer, T = 2
    B, N, H = (4, 8, 7) if args.quick else (32, 32, 16)
    lay = InvertedConvCapsules(N, N, 16, 3, 2)
    P = F.layer_norm(torch.randn(B, N, H, H, 16), (16,)).requires_grad_(True)
    h = lay.output_size(H)
    gs = [torch.randn(B, N, h, h, 16)]
    params = list(lay.parameters())
    fns = {
        "capsule_lib": lambda p: lay(p, lay(p)),
        "parent-major": lambda p: inverted_conv_parent_major(p, lay, inverted_conv_parent_major(p, lay)),
    }
    od, gd = check(fns["capsule_lib"], fns["parent-major"], [P], params, gs)
    t = bench(fns, [P], params, gs, args.repeat)
    print(
        f"inverted CONV B={B}, {N}->{N}, {H}x{H}: capsule_lib {t['capsule_lib'] * 1e3:.0f} ms, parent-major "
        f"{t['parent-major'] * 1e3:.0f} ms ({t['capsule_lib'] / t['parent-major']:.2f}x); max|dout| {od:.1e}, "
        f"max rel dgrad {gd:.1e}"
    )


if __name__ == "__main__":
    main()
