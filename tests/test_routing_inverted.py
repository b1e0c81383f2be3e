"""Tests for inverted dot-product attention routing (Tsai et al. 2020): capsule_lib.routing.inverted and
capsule_lib.models.inverted. Reference: Tsai et al. (2020) and its public code."""

from __future__ import annotations

import math

import pytest
import torch

from capsule_lib import CapsuleOutput, RoutingTrace
from capsule_lib.models.inverted import CapsLayerSpec, CapsModel, CapsModelConfig
from capsule_lib.routing.inverted import (
    InvertedConvCapsules,
    InvertedFCCapsules,
    PoseNorm,
    conv_matrix_votes,
    conv_windows,
    fc_matrix_votes,
    inverted_attention_update,
    inverted_conv_update,
    inverted_fc_update,
)


# --------------------------------------------------------------------------------------------- helpers
def tiny_config(**overrides) -> CapsModelConfig:
    """16x16 input -> simple backbone 8x8 -> CONV(4 types, k3 s2) 3x3 -> CONV(3 types, k2 s1) 2x2
    -> FC class capsules (12 -> 3), 2x2 poses."""
    kw = dict(
        n_classes=3,
        image_size=16,
        backbone="simple",
        backbone_channels=8,
        primary_types=4,
        pose_dim=4,
        capsules=(CapsLayerSpec("conv", 4, 3, 2), CapsLayerSpec("conv", 3, 2, 1)),
        iterations=2,
    )
    kw.update(overrides)
    return CapsModelConfig(**kw)


def randomise_norms(module: torch.nn.Module) -> None:
    """Non-trivial LayerNorm affine parameters, so tests also exercise gamma/beta."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


def ref_fc_update(P, W, prev, gamma, beta, eps):
    """Independent loop-based float64 re-derivation of one update (spec 1.2).
    P [B, I, d], W [I, s, s, J], prev [B, J, d] or None -> (out [B, J, d], r [B, I, J])."""
    P, W = P.double(), W.double()
    prev = None if prev is None else prev.detach().double()
    B, I, d = P.shape
    J = W.shape[-1]
    s = math.isqrt(d)
    out = torch.zeros(B, J, d, dtype=torch.float64)
    R = torch.zeros(B, I, J, dtype=torch.float64)
    for b in range(B):
        V = [[None] * J for _ in range(I)]
        for i in range(I):
            for j in range(J):
                v = torch.zeros(s, s, dtype=torch.float64)
                for a in range(s):
                    for e in range(s):
                        v[a, e] = sum(P[b, i, a * s + x] * W[i, x, e, j] for x in range(s))
                V[i][j] = v.reshape(d)
        for i in range(I):
            if prev is None:
                r = [1.0 / J] * J
            else:
                logits = [float((V[i][j] * prev[b, j].double()).sum()) / math.sqrt(d) for j in range(J)]
                mx = max(logits)
                ex = [math.exp(z - mx) for z in logits]
                r = [z / sum(ex) for z in ex]
                r = [z / (sum(r) + 1e-10) for z in r]
            for j in range(J):
                R[b, i, j] = r[j]
        for j in range(J):
            sj = sum(R[b, i, j] * V[i][j] for i in range(I))
            mean = sj.mean()
            var = ((sj - mean) ** 2).mean()
            out[b, j] = (sj - mean) / math.sqrt(var + eps) * gamma.double() + beta.double()
    return out, R


def loop_windows(x, k, stride):
    """Explicit window gather: [B, N, H, W, d] -> [B, N, k, k, h_out, w_out, d]."""
    B, N, H, W, d = x.shape
    ho, wo = (H - k) // stride + 1, (W - k) // stride + 1
    out = torch.zeros(B, N, k, k, ho, wo, d, dtype=x.dtype)
    for i in range(ho):
        for j in range(wo):
            for ki in range(k):
                for kj in range(k):
                    out[:, :, ki, kj, i, j] = x[:, :, i * stride + ki, j * stride + kj]
    return out


def official_buggy_windows(x, k, stride):
    """The official CapsuleCONV.input_expansion, written as in the public code (stack, then view)."""
    b, n, h, w, d = x.shape
    h_out, w_out = int((h - k) / stride + 1), int((w - k) / stride + 1)
    inputs = torch.stack(
        [
            x[:, :, stride * i : stride * i + k, stride * j : stride * j + k, :]
            for i in range(h_out)
            for j in range(w_out)
        ],
        dim=-1,
    )
    return inputs.view(b, n, k, k, h_out, w_out, d)


def assert_routing_trace(trace: RoutingTrace, iterations: int):
    assert trace.algorithm == "inverted"
    assert trace.iterations == iterations == len(trace.agreements) == len(trace.outputs)
    for c, a in zip(trace.coefficients, trace.agreements):
        assert c.shape == a.shape
        assert torch.isfinite(c).all() and (c >= 0).all()
        torch.testing.assert_close(c.sum(-1), torch.ones_like(c.sum(-1)), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------- layer: maths
@pytest.mark.parametrize("with_prev", [False, True])
def test_tiny_fc_matches_loop_rederivation(with_prev):
    torch.manual_seed(0)
    layer = InvertedFCCapsules(3, 2, pose_dim=4).double()
    randomise_norms(layer)
    P = torch.randn(2, 3, 4, dtype=torch.float64)
    prev = layer(torch.randn(2, 3, 4, dtype=torch.float64)) if with_prev else None
    out, trace = layer(P, prev, return_routing=True)
    ref, R = ref_fc_update(
        P, layer.weight.detach(), prev, layer.norm.weight.detach(), layer.norm.bias.detach(), layer.norm.eps
    )
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(trace.coefficients[0].double(), R, atol=1e-6, rtol=0)
    if with_prev:
        assert not torch.allclose(R, torch.full_like(R, 0.5))  # the agreement step actually did something


@pytest.mark.parametrize("k,stride,with_prev", [(2, 2, True), (3, 1, True), (3, 2, False)])
def test_tiny_conv_matches_per_window_rederivation(k, stride, with_prev):
    """CONV = an FC update per output position on that position's k x k window (children (n, k, l))."""
    torch.manual_seed(1)
    N, M, H = 2, 2, 5
    layer = InvertedConvCapsules(N, M, pose_dim=4, kernel_size=k, stride=stride).double()
    randomise_norms(layer)
    x = torch.randn(2, N, H, H, 4, dtype=torch.float64)
    ho = (H - k) // stride + 1
    prev = torch.randn(2, M, ho, ho, 4, dtype=torch.float64) if with_prev else None
    out, trace = layer(x, prev, return_routing=True)
    assert out.shape == (2, M, ho, ho, 4)
    W = layer.weight.detach()
    for i in range(ho):
        for j in range(ho):
            children = [x[:, n, i * stride + a, j * stride + c] for n in range(N) for a in range(k) for c in range(k)]
            weights = [W[a, c, n] for n in range(N) for a in range(k) for c in range(k)]
            ref, R = ref_fc_update(
                torch.stack(children, 1),
                torch.stack(weights, 0),
                None if prev is None else prev[:, :, i, j],
                layer.norm.weight.detach(),
                layer.norm.bias.detach(),
                layer.norm.eps,
            )
            torch.testing.assert_close(out[:, :, i, j], ref, atol=1e-10, rtol=1e-10)
            torch.testing.assert_close(trace.coefficients[0][:, i, j].double(), R, atol=1e-6, rtol=0)


def test_unfold_windows_equal_loop_gather_and_bug_differs():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 9, 9, 4)
    for k, stride in [(3, 2), (3, 1), (2, 2)]:
        good = conv_windows(x, k, stride)
        torch.testing.assert_close(good, loop_windows(x, k, stride), atol=0, rtol=0)
        bug = conv_windows(x, k, stride, expansion="official_bug")
        torch.testing.assert_close(bug, official_buggy_windows(x, k, stride), atol=0, rtol=0)
        assert bug.shape == good.shape
        assert (bug - good).abs().max() > 1.0  # the bug mixes pose entries with positions
    # with a single output position the two coincide (nothing to mix)
    x1 = torch.randn(1, 2, 3, 3, 4)
    torch.testing.assert_close(conv_windows(x1, 3, 1, "official_bug"), conv_windows(x1, 3, 1), atol=0, rtol=0)


def test_official_bug_changes_layer_and_model_outputs():
    torch.manual_seed(3)
    good = InvertedConvCapsules(3, 2, 4, 3, 2)
    bug = InvertedConvCapsules(3, 2, 4, 3, 2, expansion="official_bug")
    bug.load_state_dict(good.state_dict())
    x = torch.randn(2, 3, 7, 7, 4)
    assert (good(x) - bug(x)).abs().max() > 1e-2
    torch.manual_seed(4)
    m = CapsModel(tiny_config()).eval()
    mb = CapsModel(tiny_config(expansion="official_bug")).eval()
    mb.load_state_dict(m.state_dict())
    img = torch.randn(2, 3, 16, 16)
    assert (m(img).scores - mb(img).scores).abs().max() > 1e-3


def test_fused_uniform_pass_and_votes_path_agree():
    torch.manual_seed(5)
    fc = InvertedFCCapsules(6, 3, 9)
    randomise_norms(fc)
    P = torch.randn(2, 6, 9)
    kw = dict(norm=PoseNorm(fc.norm.weight, fc.norm.bias))
    v = fc_matrix_votes(P, fc.weight)
    assert v.shape == (2, 6, 3, 9)
    p1 = fc(P)
    torch.testing.assert_close(p1, inverted_attention_update(v, None, **kw), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fc(P, p1), inverted_attention_update(v, p1, **kw), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fc(P, p1), inverted_fc_update(P, fc.weight, p1, **kw), atol=0, rtol=0)

    cv = InvertedConvCapsules(3, 2, 4, 3, 2)
    randomise_norms(cv)
    x = torch.randn(2, 3, 7, 7, 4)
    kw = dict(norm=PoseNorm(cv.norm.weight, cv.norm.bias))
    v = conv_matrix_votes(conv_windows(x, 3, 2), cv.weight)  # [B, h, w, N*k*k, M, d]
    assert v.shape == (2, 3, 3, 27, 2, 4)
    q1 = cv(x)
    torch.testing.assert_close(
        q1, inverted_attention_update(v, None, **kw).permute(0, 3, 1, 2, 4), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        cv(x, q1),
        inverted_attention_update(v, q1.permute(0, 2, 3, 1, 4), **kw).permute(0, 3, 1, 2, 4),
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(cv(x, q1), inverted_conv_update(x, cv.weight, q1, stride=2, **kw), atol=0, rtol=0)


def test_trace_coefficients_are_softmax_of_scaled_agreements():
    torch.manual_seed(6)
    fc = InvertedFCCapsules(5, 4, 16)
    P = torch.randn(3, 5, 16)
    p1, t1 = fc(P, return_routing=True)
    assert (t1.agreements[0] == 0).all()
    torch.testing.assert_close(t1.coefficients[0], torch.full((3, 5, 4), 0.25))
    p2, t2 = fc(P, p1, return_routing=True)
    a = torch.einsum("bije,bje->bij", fc_matrix_votes(P, fc.weight), p1) / 4.0  # sqrt(d) = 4
    torch.testing.assert_close(t2.agreements[0], a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t2.coefficients[0], torch.softmax(a, -1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(t2.outputs[0], p2, atol=0, rtol=0)
    assert_routing_trace(t2, 1)


def test_fc_flattens_conv_grid_type_major():
    torch.manual_seed(7)
    N, h, w, d = 3, 2, 4, 4
    fc = InvertedFCCapsules(N * h * w, 2, d)
    grid = torch.randn(2, N, h, w, d)
    flat = torch.zeros(2, N * h * w, d)
    for n in range(N):
        for y in range(h):
            for x in range(w):
                flat[:, n * h * w + y * w + x] = grid[:, n, y, x]
    p1 = fc(flat)
    torch.testing.assert_close(fc(grid), p1, atol=0, rtol=0)
    torch.testing.assert_close(fc(grid, p1), fc(flat, p1), atol=0, rtol=0)


def test_fc_permutation_equivariance():
    torch.manual_seed(8)
    fc = InvertedFCCapsules(7, 4, 9)
    randomise_norms(fc)
    P = torch.randn(2, 7, 9)
    prev = fc(torch.randn(2, 7, 9))
    perm_in, perm_out = torch.randperm(7), torch.tensor([2, 0, 3, 1])
    fcp = InvertedFCCapsules(7, 4, 9)
    fcp.load_state_dict(fc.state_dict())
    with torch.no_grad():
        fcp.weight.copy_(fc.weight[perm_in][..., perm_out])
    for pv in (None, prev):
        out, tr = fc(P, pv, return_routing=True)
        outp, trp = fcp(P[:, perm_in], None if pv is None else pv[:, perm_out], return_routing=True)
        # children permuted with their weights: nothing changes; parents permuted: outputs permuted
        torch.testing.assert_close(outp, out[:, perm_out], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            trp.coefficients[0], tr.coefficients[0][:, perm_in][..., perm_out], atol=1e-6, rtol=1e-5
        )


# ------------------------------------------------------------------------------------ layer: shapes
@pytest.mark.parametrize("B", [1, 3])
def test_layer_shapes_and_trace(B):
    torch.manual_seed(9)
    cv = InvertedConvCapsules(4, 5, 16, kernel_size=3, stride=2)
    x = torch.randn(B, 4, 9, 8, 16)
    q1, t1 = cv(x, return_routing=True)
    assert q1.shape == (B, 5, 4, 3, 16)
    q2, t2 = cv(x, q1, return_routing=True)
    assert q2.shape == (B, 5, 4, 3, 16) and t2.coefficients[0].shape == (B, 4, 3, 4 * 9, 5)
    assert_routing_trace(t1, 1)
    assert_routing_trace(t2, 1)
    fc = InvertedFCCapsules(5 * 4 * 3, 6, 16)
    p1 = fc(q2)
    p2, t = fc(q2, p1, return_routing=True)
    assert p1.shape == p2.shape == (B, 6, 16) and t.coefficients[0].shape == (B, 60, 6)
    assert_routing_trace(t, 1)


def test_dropout_only_in_training():
    torch.manual_seed(10)
    fc = InvertedFCCapsules(6, 3, 4, dropout=0.5)
    P = torch.randn(2, 6, 4)
    fc.eval()
    torch.testing.assert_close(fc(P), fc(P), atol=0, rtol=0)
    ref = fc(P)
    fc.train()
    assert not torch.allclose(fc(P), ref)


# ----------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("scale", [0.0, 1e3])
def test_no_nan_on_zeros_and_large_inputs(scale):
    torch.manual_seed(11)
    fc = InvertedFCCapsules(12, 3, 16)
    cv = InvertedConvCapsules(4, 3, 16, 3, 1)
    x = torch.randn(2, 4, 5, 5, 16) * scale
    q1 = cv(x)
    q2, tq = cv(x, q1, return_routing=True)
    p1 = fc(q2[:, :, :2, :2])
    p2, tp = fc(q2[:, :, :2, :2], p1, return_routing=True)
    for t in (q1, q2, p1, p2, *tq.coefficients, *tp.coefficients, *tp.agreements):
        assert torch.isfinite(t).all()
    # huge agreements must give a sharp but valid softmax
    assert_routing_trace(tp, 1)
    m = CapsModel(tiny_config(iterations=3)).eval()
    assert torch.isfinite(m(torch.full((2, 3, 16, 16), scale)).scores).all()


def test_bf16_autocast_layers_and_model():
    torch.manual_seed(12)
    fc = InvertedFCCapsules(12, 3, 16)
    cv = InvertedConvCapsules(4, 3, 16, 3, 1)
    m = CapsModel(tiny_config(iterations=2))
    x = torch.randn(2, 4, 4, 4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q1 = cv(x)
        q2, tq = cv(x, q1, return_routing=True)
        p2, tp = fc(q2, fc(q2), return_routing=True)
        out = m(torch.randn(2, 3, 16, 16), return_routing=True)
    for t in (q1, q2, p2, out.scores, out.poses):
        assert torch.isfinite(t.float()).all()
    assert tq.coefficients[0].dtype == torch.float32  # softmax kept in fp32
    assert_routing_trace(tp, 1)
    assert_routing_trace(out.trace, 2)
    out.scores.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


# ------------------------------------------------------------------------------------ validation
def test_wrong_shapes_raise_value_error_naming_the_shape():
    fc = InvertedFCCapsules(3, 2, 4)
    with pytest.raises(ValueError, match=r"\[B, n_inp=3, d=4\]"):
        fc(torch.randn(2, 4, 4))
    with pytest.raises(ValueError, match=r"\[B, n_inp=3, d=4\]"):
        fc(torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match=r"\[B=2, n_out=2, d=4\]"):
        fc(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"floating-point"):
        fc(torch.ones(2, 3, 4, dtype=torch.long))
    cv = InvertedConvCapsules(3, 2, 4, 3, 2)
    with pytest.raises(ValueError, match=r"\[B, N=3, H, W, d=4\]"):
        cv(torch.randn(2, 5, 7, 7, 4))
    with pytest.raises(ValueError, match=r"\[B=2, M=2, h_out=3, w_out=3, d=4\]"):
        cv(torch.randn(2, 3, 7, 7, 4), torch.randn(2, 2, 4, 4, 4))
    with pytest.raises(ValueError, match=r"H, W >= 3"):
        cv(torch.randn(2, 3, 2, 7, 4))
    with pytest.raises(ValueError, match=r"square"):
        InvertedFCCapsules(3, 2, 8)
    with pytest.raises(ValueError, match=r"expansion"):
        InvertedConvCapsules(3, 2, 4, expansion="stack")
    with pytest.raises(ValueError, match=r"\[B, 3, 16, 16\]"):
        CapsModel(tiny_config())(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"iterations"):
        CapsModel(tiny_config(iterations=0))
    with pytest.raises(ValueError, match=r"backbone"):
        CapsModel(tiny_config(backbone="vgg"))


# ------------------------------------------------------------------------------------------ model
def test_parameter_counts_match_spec():
    def n(m):
        return sum(p.numel() for p in m.parameters())

    expected = {
        ("cifar10", "resnet"): 1_828_817,
        ("cifar10", "simple"): 492_177,
        ("cifar100", "resnet"): 2_799_629,
        ("cifar100", "simple"): 1_462_989,
    }
    for (ds, bb), count in expected.items():
        assert n(CapsModel(getattr(CapsModelConfig, ds)(backbone=bb))) == count, (ds, bb)
    m = CapsModel(CapsModelConfig.cifar10(backbone="resnet"))
    assert n(m) == n(CapsModel()) == 1_828_817  # the defaults are the CIFAR-10 resnet model
    assert n(m.backbone) == 1_340_224
    assert n(m.primary.conv) == 65_536 and n(m.primary.norm) == 32
    assert [n(layer) for layer in m.capsule_layers] == [147_488, 147_488, 128_032]
    assert n(m.final_fc) == 17
    assert isinstance(m.capsule_layers[0], InvertedConvCapsules) and m.capsule_layers[0].stride == 2
    assert isinstance(m.capsule_layers[1], InvertedConvCapsules) and m.capsule_layers[1].stride == 1
    assert m.class_capsules.n_inp == 800 and m.class_capsules.weight.shape == (800, 4, 4, 10)
    m100 = CapsModel(CapsModelConfig.cifar100(backbone="simple"))
    assert [tuple(layer.weight.shape) for layer in m100.capsule_layers] == [
        (3, 3, 32, 6, 6, 32),
        (3, 3, 32, 6, 6, 32),
        (800, 6, 6, 20),
        (20, 6, 6, 100),
    ]


def test_initialisation_follows_spec():
    torch.manual_seed(13)
    m = CapsModel(CapsModelConfig.cifar10())
    conv, cls = m.capsule_layers[0], m.class_capsules
    for layer, want in ((conv, math.sqrt(32 / (4 * 32 * 9))), (cls, math.sqrt(10 / (4 * 800)))):
        assert layer.init_std == pytest.approx(want)
        assert layer.weight.std().item() == pytest.approx(want, rel=0.02)
        assert abs(layer.weight.mean().item()) < 0.02 * want
    for mod in m.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            assert (mod.weight == 1).all() and (mod.bias == 0).all()
    bound = 1 / math.sqrt(16)  # PyTorch default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert m.final_fc.weight.abs().max() <= bound and m.final_fc.bias.abs().max() <= bound


@pytest.mark.parametrize("B", [1, 2])
def test_model_output_shapes_including_batch_one(B):
    torch.manual_seed(14)
    m = CapsModel(CapsModelConfig.cifar10(backbone="resnet", iterations=2)).eval()
    with torch.no_grad():
        out = m(torch.randn(B, 3, 32, 32), return_routing=True)
    assert isinstance(out, CapsuleOutput)
    assert out.scores.shape == (B, 10) and out.poses.shape == (B, 10, 16) and out.reconstruction is None
    torch.testing.assert_close(out.scores, m.final_fc(out.poses)[..., 0])  # logits of the shared final_fc
    t = out.trace
    assert_routing_trace(t, 2)
    assert t.coefficients[0].shape == (B, 800, 10)
    assert [tr.coefficients[0].shape for tr in t.extra["layers"]] == [(B, 7, 7, 288, 32), (B, 5, 5, 288, 32)]
    for tr in t.extra["layers"]:
        assert_routing_trace(tr, 2)
    assert [p.shape for p in t.extra["poses"]] == [
        (B, 32, 16, 16, 16),
        (B, 32, 7, 7, 16),
        (B, 32, 5, 5, 16),
        (B, 10, 16),
    ]
    torch.testing.assert_close(t.outputs[-1], out.poses, atol=0, rtol=0)


def test_concurrent_matches_explicit_jacobi_recurrence():
    torch.manual_seed(15)
    m = CapsModel(tiny_config(iterations=3)).eval()
    randomise_norms(m)
    x = torch.randn(2, 3, 16, 16)
    L1, L2, L3 = m.capsule_layers
    with torch.no_grad():
        P0 = m.primary_capsules(x)
        # t = 1: uniform feed-forward pass
        P1_1 = L1(P0)
        P2_1 = L2(P1_1)
        P3_1 = L3(P2_1)
        # t = 2: every layer from the t = 1 values
        P1_2 = L1(P0, P1_1)
        P2_2 = L2(P1_1, P2_1)
        P3_2 = L3(P2_1, P3_1)
        # t = 3: every layer from the t = 2 values
        P1_3 = L1(P0, P1_2)
        P2_3 = L2(P1_2, P2_2)
        P3_3 = L3(P2_2, P3_2)
        out = m(x, return_routing=True)
    torch.testing.assert_close(out.poses, P3_3, atol=0, rtol=0)
    torch.testing.assert_close(out.scores, m.final_fc(P3_3).squeeze(-1), atol=0, rtol=0)
    torch.testing.assert_close(out.trace.extra["poses"][2], P2_3, atol=0, rtol=0)
    torch.testing.assert_close(out.trace.extra["poses"][1], P1_3, atol=0, rtol=0)
    # the Gauss-Seidel variant (using the value just computed) is a different recurrence
    with torch.no_grad():
        gs = L3(P2_3, P3_2)
    assert not torch.allclose(gs, P3_3, atol=1e-4)
    assert out.trace.extra["schedule"] == "concurrent"
    assert_routing_trace(out.trace, 3)
    for tr in out.trace.extra["layers"]:
        assert_routing_trace(tr, 3)


def test_sequential_matches_explicit_recurrence():
    torch.manual_seed(16)
    m = CapsModel(tiny_config(iterations=3, sequential_routing=True)).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        v = m.primary_capsules(x)
        for layer in m.capsule_layers:
            p = layer(v)
            p = layer(v, p)
            p = layer(v, p)
            v = p
        out = m(x)
    torch.testing.assert_close(out.poses, v, atol=0, rtol=0)


def test_schedules_equal_for_one_iteration_and_differ_for_two():
    torch.manual_seed(17)
    x = torch.randn(2, 3, 16, 16)
    base = CapsModel(tiny_config(iterations=1)).eval()
    state = base.state_dict()

    def logits(T, seq):
        m = CapsModel(tiny_config(iterations=T, sequential_routing=seq)).eval()
        m.load_state_dict(state)
        with torch.no_grad():
            return m(x).scores

    torch.testing.assert_close(logits(1, False), logits(1, True), atol=0, rtol=0)
    assert (logits(2, False) - logits(2, True)).abs().max() > 1e-4
    assert (logits(2, False) - logits(1, False)).abs().max() > 1e-4


@pytest.mark.parametrize("preset,T", [("cifar10", 2), ("cifar100", 2)])
def test_every_parameter_gets_a_gradient(preset, T):
    torch.manual_seed(18)
    backbone = "resnet" if preset == "cifar10" else "simple"
    m = CapsModel(getattr(CapsModelConfig, preset)(backbone=backbone, iterations=T))
    out = m(torch.randn(2, 3, 32, 32))
    y = torch.arange(2) % out.scores.shape[1]
    torch.nn.functional.cross_entropy(out.scores, y).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        if name == "final_fc.bias":
            # The official classifier shares one Linear(d -> 1) across classes, so its bias shifts every logit
            # by the same amount: softmax cross-entropy is invariant to that, and the gradient is exactly
            # sum_k (p_k - y_k) = 0 (up to float rounding). A property of the original model, kept faithfully.
            assert p.grad.abs().max() < 1e-6, name
            continue
        assert p.grad.abs().sum() > 0, name


def test_determinism_under_seed():
    def run():
        torch.manual_seed(19)
        m = CapsModel(tiny_config(iterations=2))
        x = torch.randn(2, 3, 16, 16)
        return m, m(x).scores

    m1, a = run()
    m2, b = run()
    for (k1, v1), (k2, v2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.manual_seed(20)
    fc = InvertedFCCapsules(5, 3, 4)
    P = torch.randn(2, 5, 4)
    torch.testing.assert_close(fc(P, fc(P)), fc(P, fc(P)), atol=0, rtol=0)


@pytest.mark.slow
def test_torch_compile_fc_update():
    torch.manual_seed(21)
    fc = InvertedFCCapsules(12, 3, 16)
    P = torch.randn(2, 12, 16)
    prev = fc(P)
    compiled = torch.compile(fc, fullgraph=True)  # no graph breaks in one update
    torch.testing.assert_close(compiled(P, prev), fc(P, prev), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ fused attention update (no votes kept)
def _grads(out_fn, tensors, seed):
    """Outputs of ``out_fn()`` and the gradients of a random linear function of them w.r.t. ``tensors``."""
    outs = out_fn()
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return outs, torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("block_bytes", [None, 4000, 700])  # one block, 2 x 20 and 1 x 7 blocks
@pytest.mark.parametrize("expansion", ["unfold", "official_bug"])
def test_fused_conv_update_matches_votes_path_float64(monkeypatch, block_bytes, expansion):
    """Outputs, r, a and every gradient (poses, weight, prev_pose, LayerNorm) of the fused update equal the
    explicit-votes einsum path; the small blocks do not divide p = 3*3*3 = 27 positions or I = 27 children."""
    import capsule_lib.routing._kernels.inverted as inv

    if block_bytes is not None:
        monkeypatch.setattr(inv, "_BLOCK_BYTES", block_bytes)
    torch.manual_seed(30)
    N, M, K, S, d = 3, 3, 3, 2, 4
    layer = InvertedConvCapsules(N, M, d, K, S, expansion=expansion).double()
    randomise_norms(layer)
    x = torch.randn(3, N, 7, 7, d, dtype=torch.float64, requires_grad=True)
    prev = torch.randn(3, M, 3, 3, d, dtype=torch.float64, requires_grad=True)
    params = [x, prev, layer.weight, layer.norm.weight, layer.norm.bias]
    kw = dict(norm=PoseNorm(layer.norm.weight, layer.norm.bias))

    def fused():
        out, tr = layer(x, prev, return_routing=True)
        return out, tr.coefficients[0], tr.agreements[0]

    def reference():
        v = conv_matrix_votes(conv_windows(x, K, S, expansion), layer.weight)  # [B, h, w, I, M, d]
        out, tr = inverted_attention_update(v, prev.permute(0, 2, 3, 1, 4), return_routing=True, **kw)
        return out.permute(0, 3, 1, 2, 4), tr.coefficients[0], tr.agreements[0]

    got, g_got = _grads(fused, params, 31)
    want, g_want = _grads(reference, params, 31)
    assert inv._attend_blocks(27, 27, M, d, 8) == {None: (27, 27), 4000: (2, 20), 700: (1, 7)}[block_bytes]
    for a, b in zip(got + g_got, want + g_want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("block_bytes", [None, 1600])
def test_fused_fc_update_matches_votes_path_float64(monkeypatch, block_bytes):
    import capsule_lib.routing._kernels.inverted as inv

    if block_bytes is not None:
        monkeypatch.setattr(inv, "_BLOCK_BYTES", block_bytes)  # 1 sample, 3 of the 10 children
    torch.manual_seed(32)
    layer = InvertedFCCapsules(10, 4, 16).double()
    randomise_norms(layer)
    P = torch.randn(3, 10, 16, dtype=torch.float64, requires_grad=True)
    prev = torch.randn(3, 4, 16, dtype=torch.float64, requires_grad=True)
    params = [P, prev, layer.weight, layer.norm.weight, layer.norm.bias]
    kw = dict(norm=PoseNorm(layer.norm.weight, layer.norm.bias))

    def fused():
        out, tr = layer(P, prev, return_routing=True)
        return out, tr.coefficients[0], tr.agreements[0]

    def reference():
        out, tr = inverted_attention_update(fc_matrix_votes(P, layer.weight), prev, return_routing=True, **kw)
        return out, tr.coefficients[0], tr.agreements[0]

    got, g_got = _grads(fused, params, 33)
    want, g_want = _grads(reference, params, 33)
    assert inv._attend_blocks(10, 3, 4, 16, 8) == {None: (3, 10), 1600: (1, 3)}[block_bytes]
    for a, b in zip(got + g_got, want + g_want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_fused_attention_gradcheck_and_partial_gradients():
    """gradcheck of the fused Function with uneven blocks, and gradients that reach it only through r or a."""
    from capsule_lib.routing.inverted import _attend_matrix, _attend_matrix_unfused

    torch.manual_seed(34)
    I, p, s, M = 5, 4, 2, 3
    P = torch.randn(I, p, s, s, dtype=torch.float64, requires_grad=True)
    W = torch.randn(I, s, s, M, dtype=torch.float64, requires_grad=True)
    Q = torch.randn(p, M, s * s, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: _attend_matrix(*t, blocks=(3, 2)), (P, W, Q))
    for pick in (0, 1, 2, (1, 2)):  # only s, only r, only a, r and a
        idx = pick if isinstance(pick, tuple) else (pick,)
        got = _attend_matrix(P, W, Q, blocks=(3, 2))
        want = _attend_matrix_unfused(P, W, Q)
        for o1, o2 in zip(got, want):
            torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-14)
        g1 = torch.autograd.grad(sum((got[k] ** 2).sum() for k in idx), (P, W, Q))
        g2 = torch.autograd.grad(sum((want[k] ** 2).sum() for k in idx), (P, W, Q))
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_fused_attention_bf16_autocast_matches_unfused_dtypes():
    from capsule_lib.routing.inverted import _attend_matrix, _attend_matrix_unfused

    torch.manual_seed(35)
    P = torch.randn(6, 5, 4, 4, requires_grad=True)
    W = torch.randn(6, 4, 4, 3, requires_grad=True)
    Q = torch.randn(5, 3, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _attend_matrix(P, W, Q, blocks=(2, 4))
        want = _attend_matrix_unfused(*(t.to(torch.bfloat16) for t in (P, W, Q)))
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16, torch.float32, torch.float32]
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.1)
    g1 = torch.autograd.grad(got[0].float().sum(), (P, W, Q))
    g2 = torch.autograd.grad(want[0].float().sum(), (P, W, Q))
    for a, b in zip(g1, g2):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.2)
