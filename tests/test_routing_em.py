"""EM routing (Hinton, Sabour & Frosst 2018): capsule_lib.routing.em and capsule_lib.models.em_capsnet."""

from __future__ import annotations

import math
import time

import pytest
import torch

from capsule_lib import CapsuleOutput, RoutingTrace
from capsule_lib.layers import ClassCapsules, ConvCapsules, MatrixPrimaryCapsules, grid_centers
from capsule_lib.losses import spread_loss
from capsule_lib.models.em_capsnet import EMCapsNet, EMCapsNetConfig, receptive_field_centers
from capsule_lib.routing.em import EMRouting, em_routing, inverse_temperature_schedule, matrix_votes

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (tests/conftest.py)


def _tiny_cfg(**kw):
    """A model small enough for gradient tests: 20x20 input -> grids 8, 3, 1."""
    base = dict(image_size=20, conv_channels=8, primary_types=4, caps1_types=4, caps2_types=4, n_classes=3)
    return EMCapsNetConfig.small(**{**base, **kw})


def _inputs(B=2, I=6, J=3, D=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    votes = torch.randn(B, I, J, D, generator=g, dtype=dtype)
    a_in = torch.rand(B, I, generator=g, dtype=dtype) * 0.8 + 0.1
    beta_u = torch.randn(J, generator=g, dtype=dtype) * 0.1
    beta_a = torch.randn(J, generator=g, dtype=dtype) * 0.1
    return votes, a_in, beta_u, beta_a


def _grid(B=2, T=3, H=7, W=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, H, W, 16, generator=g), torch.rand(B, T, H, W, generator=g)


def _finite(*xs):
    return all(bool(torch.isfinite(x.float()).all()) for x in xs)


# ---------------------------------------------------------------------------------------------------
# The routing function
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quirk", [False, True])
def test_coefficients_sum_to_one_over_outputs_every_iteration(quirk):
    votes, a_in, bu, ba = _inputs()
    (mu, a_out), trace = em_routing(
        votes, a_in, bu, ba, iterations=4, normalize_over_outputs=quirk, return_routing=True
    )
    assert isinstance(trace, RoutingTrace) and trace.algorithm == "em" and trace.iterations == 4
    assert torch.allclose(trace.coefficients[0], torch.full_like(trace.coefficients[0], 1 / 3))
    for R in trace.coefficients + [trace.extra["posterior"]]:
        assert R.shape == (2, 6, 3)
        assert torch.allclose(R.sum(-1), torch.ones(2, 6), atol=1e-6)
        assert (R >= 0).all()
    # later iterations really re-assign (not stuck at the uniform start)
    assert not torch.allclose(trace.coefficients[1], trace.coefficients[0], atol=1e-3)


def test_trace_contents_match_outputs():
    votes, a_in, bu, ba = _inputs()
    (mu, a_out), tr = em_routing(votes, a_in, bu, ba, iterations=3, return_routing=True)
    assert len(tr.agreements) == len(tr.outputs) == len(tr.activations) == 3
    assert len(tr.extra["sigma2"]) == len(tr.extra["costs"]) == 3
    assert tr.agreements[0].shape == (2, 6, 3) and tr.outputs[0].shape == (2, 3, 16)
    assert tr.extra["sigma2"][0].shape == (2, 3, 16) and tr.extra["costs"][0].shape == (2, 3)
    assert torch.equal(tr.outputs[-1], mu) and torch.equal(tr.activations[-1], a_out)
    assert (tr.extra["sigma2"][-1] > 0).all() and (tr.agreements[-1] <= 100).all()
    # posterior = softmax_j(log p + log a) of the last iteration
    post = torch.softmax(tr.agreements[-1] + a_out.log().unsqueeze(1), dim=-1)
    assert torch.allclose(post, tr.extra["posterior"], atol=1e-5)
    assert tr.extra["inverse_temperatures"] == inverse_temperature_schedule(3)
    # without the trace: the same outputs, as a tuple
    mu2, a2 = em_routing(votes, a_in, bu, ba, iterations=3)
    assert torch.equal(mu, mu2) and torch.equal(a_out, a2)
    d = tr.detach()
    assert not d.coefficients[0].requires_grad and d.stacked("activations").shape == (3, 2, 3)


@pytest.mark.parametrize("B", [1, 3])
def test_shapes_functional_and_modules(B):
    votes, a_in, bu, ba = _inputs(B=B, I=5, J=4)
    mu, a = em_routing(votes, a_in, bu, ba)
    assert mu.shape == (B, 4, 16) and a.shape == (B, 4)
    assert ((a > 0) & (a < 1)).all()
    fc = EMRouting(5, 4)
    mu, a = fc(torch.randn(B, 5, 16), torch.rand(B, 5))
    assert mu.shape == (B, 4, 16) and a.shape == (B, 4)
    poses, acts = MatrixPrimaryCapsules(6, 3)(torch.randn(B, 6, 9, 9))
    assert poses.shape == (B, 3, 9, 9, 16) and acts.shape == (B, 3, 9, 9)
    assert ((acts > 0) & (acts < 1)).all()
    p, a = ConvCapsules(3, 5, 3, 2)(poses, acts)
    assert p.shape == (B, 5, 4, 4, 16) and a.shape == (B, 5, 4, 4)
    (p, a), tr = ClassCapsules(5, 7)(p, a, return_routing=True)
    assert p.shape == (B, 7, 16) and a.shape == (B, 7)
    assert tr.coefficients[0].shape == (B, 4 * 4 * 5, 7)


def test_extra_leading_dims_route_independently():
    votes, a_in, bu, ba = _inputs(B=6, I=5, J=3)
    mu, a = em_routing(votes, a_in, bu, ba)
    mu2, a2 = em_routing(votes.view(2, 3, 5, 3, 16), a_in.view(2, 3, 5), bu, ba)
    assert torch.allclose(mu2.reshape(6, 3, 16), mu, atol=1e-6)
    assert torch.allclose(a2.reshape(6, 3), a, atol=1e-6)


def _reference_em(V, a, bu, ba, iters, lams, quirk=False, norm_costs=True, eps=1e-8):
    """Procedure 1 of the paper, one scalar at a time, with the plain (not log-space) Gaussian density."""
    I, J, D = len(V), len(V[0]), len(V[0][0])
    R = [[1.0 / J] * J for _ in range(I)]
    Rs, logps, mus, acts = [], [], [], []
    for t in range(iters):
        Rs.append([row[:] for row in R])
        Rp = [[R[i][j] * a[i] for j in range(J)] for i in range(I)]
        if quirk:
            Rp = [[Rp[i][j] / (sum(Rp[i]) + eps) for j in range(J)] for i in range(I)]
        mu = [[0.0] * D for _ in range(J)]
        s2 = [[0.0] * D for _ in range(J)]
        act = [0.0] * J
        for j in range(J):
            m = sum(Rp[i][j] for i in range(I))
            cost = 0.0
            for h in range(D):
                mu[j][h] = sum(Rp[i][j] * V[i][j][h] for i in range(I)) / (m + eps)
                s2[j][h] = sum(Rp[i][j] * (V[i][j][h] - mu[j][h]) ** 2 for i in range(I)) / (m + eps) + eps
                cost += (bu[j] + math.log(math.sqrt(s2[j][h]))) * m * (J / I if norm_costs else 1.0)
            act[j] = 1.0 / (1.0 + math.exp(-lams[t] * (ba[j] - cost)))
        p = [[0.0] * J for _ in range(I)]
        for i in range(I):
            for j in range(J):
                dens = 1.0
                for h in range(D):
                    dens *= math.exp(-((V[i][j][h] - mu[j][h]) ** 2) / (2 * s2[j][h])) / math.sqrt(
                        2 * math.pi * s2[j][h]
                    )
                p[i][j] = dens
        logps.append([[math.log(p[i][j]) for j in range(J)] for i in range(I)])
        for i in range(I):
            z = sum(act[k] * p[i][k] for k in range(J))
            R[i] = [act[j] * p[i][j] / z for j in range(J)]
        mus.append(mu)
        acts.append(act)
    return Rs, logps, mus, acts, R


@pytest.mark.parametrize(
    "quirk,norm_costs,lam", [(False, True, None), (False, False, 0.05), (True, True, [0.3, 1.0, 2.0])]
)
def test_tiny_case_matches_loop_reference(quirk, norm_costs, lam):
    torch.manual_seed(3)
    I, J, D, T = 3, 2, 4, 3
    # each parent's votes cluster (spread 0.3) so no parent collapses onto one child: the plain densities
    # of the reference stay far from float64 underflow
    V = torch.randn(1, J, D, dtype=torch.float64) + 0.3 * torch.randn(I, J, D, dtype=torch.float64)
    a = torch.tensor([0.9, 0.3, 0.6], dtype=torch.float64)
    bu = torch.tensor([0.2, -0.1], dtype=torch.float64)
    ba = torch.tensor([0.5, -0.3], dtype=torch.float64)
    lams = inverse_temperature_schedule(T) if lam is None else ([lam] * T if isinstance(lam, float) else lam)
    (mu, a_out), tr = em_routing(
        V[None],
        a[None],
        bu,
        ba,
        T,
        inverse_temperature=lam,
        normalize_over_outputs=quirk,
        normalize_costs=norm_costs,
        return_routing=True,
    )
    assert mu.dtype == torch.float64
    Rs, logps, mus, acts, post = _reference_em(
        V.tolist(), a.tolist(), bu.tolist(), ba.tolist(), T, lams, quirk, norm_costs
    )
    t64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    for t in range(T):
        assert torch.allclose(tr.coefficients[t][0], t64(Rs[t]), atol=1e-10, rtol=1e-8)
        assert torch.allclose(tr.agreements[t][0], t64(logps[t]), atol=1e-8, rtol=1e-8)
        assert torch.allclose(tr.outputs[t][0], t64(mus[t]), atol=1e-10, rtol=1e-8)
        assert torch.allclose(tr.activations[t][0], t64(acts[t]), atol=1e-10, rtol=1e-8)
    assert torch.allclose(tr.extra["posterior"][0], t64(post), atol=1e-10, rtol=1e-8)
    assert torch.allclose(mu[0], t64(mus[-1]), atol=1e-10) and torch.allclose(a_out[0], t64(acts[-1]), atol=1e-10)
    # the reference really routes: the assignments moved away from uniform
    assert abs(Rs[1][0][0] - 0.5) > 1e-3


def test_quirk_flag_cancels_input_activations():
    votes, a_in, bu, ba = _inputs(I=8)
    a_other = torch.rand(a_in.shape, generator=torch.Generator().manual_seed(7)) * 0.8 + 0.1
    mu1, act1 = em_routing(votes, a_in, bu, ba, normalize_over_outputs=True)
    mu2, act2 = em_routing(votes, a_other, bu, ba, normalize_over_outputs=True)
    assert torch.allclose(mu1, mu2, atol=1e-5) and torch.allclose(act1, act2, atol=1e-5)
    mu1, act1 = em_routing(votes, a_in, bu, ba)
    mu2, act2 = em_routing(votes, a_other, bu, ba)
    assert (mu1 - mu2).abs().max() > 1e-2 and (act1 - act2).abs().max() > 1e-4


def test_input_activation_zero_removes_child():
    """Paper M-step: a child with a_i = 0 has no influence at all (it is NOT renormalised back in)."""
    votes, a_in, bu, ba = _inputs(I=6)
    a0 = a_in.clone()
    a0[:, 2] = 0.0
    mu_ref, act_ref = em_routing(votes, a0, bu, ba)
    v2 = votes.clone()
    v2[:, 2] = 1e3 * torch.randn_like(v2[:, 2])
    mu, act = em_routing(v2, a0, bu, ba)
    assert torch.allclose(mu, mu_ref, atol=1e-5) and torch.allclose(act, act_ref, atol=1e-5)


def test_permutation_of_inputs_leaves_outputs_unchanged():
    votes, a_in, bu, ba = _inputs(B=3, I=9)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    mu, a = em_routing(votes, a_in, bu, ba)
    mu_p, a_p = em_routing(votes[:, perm], a_in[:, perm], bu, ba)
    assert torch.allclose(mu, mu_p, atol=1e-5) and torch.allclose(a, a_p, atol=1e-6)


def test_permutation_of_outputs_is_equivariant():
    votes, a_in, bu, ba = _inputs(B=2, I=7, J=4)
    perm = torch.tensor([2, 0, 3, 1])
    mu, a = em_routing(votes, a_in, bu, ba)
    mu_p, a_p = em_routing(votes[:, :, perm], a_in, bu[perm], ba[perm])
    assert torch.allclose(mu[:, perm], mu_p, atol=1e-5) and torch.allclose(a[:, perm], a_p, atol=1e-6)


@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_no_nan_inf_fp32_forward_and_backward(scale):
    votes, a_in, bu, ba = _inputs()
    votes = (votes * scale).requires_grad_()
    a_in = (a_in if scale else torch.zeros_like(a_in)).requires_grad_()
    bu, ba = bu.clone().requires_grad_(), ba.clone().requires_grad_()
    (mu, a), tr = em_routing(votes, a_in, bu, ba, iterations=3, return_routing=True)
    assert _finite(mu, a, *tr.coefficients, *tr.agreements, *tr.extra["costs"])
    (mu.sum() + a.sum()).backward()
    assert _finite(votes.grad, a_in.grad, bu.grad, ba.grad)


def test_saturated_input_activations_no_nan():
    votes, a_in, bu, ba = _inputs(I=6)
    a_in = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0.0] * 6])  # second sample: nothing active
    mu, a = em_routing(votes, a_in, bu, ba, iterations=3)
    assert _finite(mu, a)
    assert torch.allclose(mu[1], torch.zeros_like(mu[1]))  # no mass -> mu = 0, activation from beta_a alone


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_autocast_model_no_nan(dtype, scale):
    torch.manual_seed(0)
    model = EMCapsNet(_tiny_cfg(image_size=24))  # grids 10, 4, 2
    x = torch.rand(2, 1, 24, 24) * scale
    with torch.autocast("cpu", dtype=dtype):
        out = model(x, return_routing=True)
        loss = spread_loss(out.scores.float(), torch.tensor([1, 2]), 0.2)
    assert out.scores.dtype == dtype  # results come back in the votes' (autocast) dtype
    assert _finite(out.scores, out.poses, *out.trace.coefficients, *out.trace.agreements)
    for R in out.trace.coefficients:
        assert torch.allclose(R.sum(-1), torch.ones_like(R.sum(-1)), atol=1e-5)
    assert out.trace.coefficients[0].dtype == torch.float32  # routing internals in fp32
    loss.backward()
    # fp16 overflows (> 65504) legitimately at x1e3 in the gradients; GradScaler handles that regime.
    if dtype == torch.bfloat16 or scale <= 1:
        assert all(_finite(p.grad) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_functional_keeps_fp32_internals(dtype):
    votes, a_in, bu, ba = _inputs()
    ref_mu, ref_a = em_routing(votes.to(dtype).float(), a_in.to(dtype).float(), bu, ba)
    with torch.autocast("cpu", dtype=dtype):
        mu, a = em_routing(votes.to(dtype), a_in.to(dtype), bu, ba)
    assert mu.dtype == dtype
    # same numbers as fp32 routing of the same (rounded) inputs, up to the final rounding
    assert torch.allclose(mu.float(), ref_mu, atol=2e-2, rtol=1e-2)
    assert torch.allclose(a.float(), ref_a, atol=1e-2)


def test_every_parameter_gets_a_gradient_in_layers():
    torch.manual_seed(0)
    prim, cc, cls = MatrixPrimaryCapsules(4, 3), ConvCapsules(3, 4, 3, 2), ClassCapsules(4, 3)
    fc = EMRouting(6, 2)
    p, a = prim(torch.randn(2, 4, 9, 9))
    p, a = cc(p, a)
    p, a = cls(p, a)
    mu, a2 = fc(torch.randn(2, 6, 16), torch.rand(2, 6))
    (p.square().sum() + a.sum() + mu.square().sum() + a2.sum()).backward()
    for mod in (prim, cc, cls, fc):
        for name, q in mod.named_parameters():
            assert q.grad is not None and q.grad.abs().sum() > 0, f"{type(mod).__name__}.{name}"


@pytest.mark.parametrize("bn", [False, True])
def test_every_model_parameter_gets_a_gradient(bn):
    torch.manual_seed(0)
    model = EMCapsNet(_tiny_cfg(batch_norm=bn, image_size=24))
    out = model(torch.rand(3, 1, 24, 24))
    loss = spread_loss(out.scores, torch.tensor([0, 2, 1]), 0.2) + 1e-3 * out.poses.square().mean()
    loss.backward()
    for name, q in model.named_parameters():
        assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_error_naming_the_shape():
    votes, a_in, bu, ba = _inputs(B=2, I=6, J=3)
    with pytest.raises(ValueError, match=r"\[B, n_inp, n_out, d\]"):
        em_routing(votes[..., 0], a_in, bu, ba)
    with pytest.raises(ValueError, match=r"a_in.*n_inp=6"):
        em_routing(votes, a_in[:, :5], bu, ba)
    with pytest.raises(ValueError, match=r"a_in"):
        em_routing(votes, a_in[:1], bu, ba)
    with pytest.raises(ValueError, match=r"beta_u.*\[n_out=3\]"):
        em_routing(votes, a_in, bu[:2], ba)
    with pytest.raises(ValueError, match=r"beta_a.*\[n_out=3\]"):
        em_routing(votes, a_in, bu, ba[None])
    with pytest.raises(ValueError, match=r"floating-point.*\[B, n_inp, n_out, d\]"):
        em_routing(votes.long(), a_in, bu, ba)
    with pytest.raises(ValueError, match=r"floating-point"):
        em_routing(votes, (a_in > 0.5).int(), bu, ba)
    with pytest.raises(ValueError, match="iterations"):
        em_routing(votes, a_in, bu, ba, iterations=0)
    with pytest.raises(ValueError, match="inverse_temperature"):
        em_routing(votes, a_in, bu, ba, iterations=3, inverse_temperature=[1.0, 2.0])
    with pytest.raises(ValueError, match="schedule"):
        inverse_temperature_schedule(3, kind="cosine")
    poses, acts = _grid(T=3)
    with pytest.raises(ValueError, match=r"\[B, n_types=4, H, W, d=16\]"):
        ConvCapsules(4, 2)(poses, acts)
    with pytest.raises(ValueError, match=r"activations.*\[B, n_types, H, W\]"):
        ConvCapsules(3, 2)(poses, acts[:, :, :5])
    with pytest.raises(ValueError, match="smaller than the kernel"):
        ConvCapsules(3, 2, 3)(poses[:, :, :2, :2], acts[:, :, :2, :2])
    with pytest.raises(ValueError, match=r"centers.*\[H=7, W=7, 2\]"):
        ClassCapsules(3, 2)(poses, acts, torch.zeros(6, 7, 2))
    with pytest.raises(ValueError, match=r"\[B, n_inp=5, d=16\]"):
        EMRouting(5, 2)(torch.randn(2, 4, 16), torch.rand(2, 4))
    with pytest.raises(ValueError, match=r"\[B, 1, 28, 28\]"):
        EMCapsNet(EMCapsNetConfig.small())(torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match="too small"):
        EMCapsNet(EMCapsNetConfig.small(image_size=12))


# ---------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "H,K,s,p,expected",
    [(14, 3, 2, 0, 6), (6, 3, 1, 0, 4), (12, 3, 2, 0, 5), (7, 3, 1, 1, 7), (9, 5, 2, 0, 3), (4, 1, 1, 0, 4)],
)
def test_conv_caps_output_spatial_sizes(H, K, s, p, expected):
    poses, acts = _grid(B=1, T=2, H=H, W=H)
    layer = ConvCapsules(2, 3, K, s, p, iterations=2)
    (mu, a), tr = layer(poses, acts, return_routing=True)
    assert layer.output_size(H) == expected
    assert mu.shape == (1, 3, expected, expected, 16) and a.shape == (1, 3, expected, expected)
    assert tr.coefficients[0].shape == (1, expected, expected, K * K * 2, 3)
    assert torch.allclose(tr.coefficients[-1].sum(-1), torch.ones(1, expected, expected, K * K * 2), atol=1e-6)


def test_conv_caps_equals_explicit_per_window_routing():
    """unfold layout check: gather one window by hand, vote with 4x4 matmuls, route, compare."""
    torch.manual_seed(0)
    T, J, K, s = 2, 3, 3, 2
    layer = ConvCapsules(T, J, K, s, iterations=3)
    with torch.no_grad():
        layer.beta_u.normal_(0, 0.1)
        layer.beta_a.normal_(0, 0.1)
    poses, acts = _grid(B=2, T=T, H=7, W=7)
    mu, a = layer(poses, acts)
    for oy, ox in [(0, 0), (1, 2), (2, 1)]:
        votes, a_win = [], []
        for u in range(K):
            for v in range(K):
                for t in range(T):
                    M = poses[:, t, oy * s + u, ox * s + v].reshape(2, 4, 4)
                    votes.append(torch.stack([(M @ layer.weight[u, v, t, j]).reshape(2, 16) for j in range(J)], 1))
                    a_win.append(acts[:, t, oy * s + u, ox * s + v])
        ref_mu, ref_a = em_routing(
            torch.stack(votes, 1),
            torch.stack(a_win, 1),
            layer.beta_u,
            layer.beta_a,
            3,
            inverse_temperature=layer.inverse_temperature,
        )
        assert torch.allclose(mu[:, :, oy, ox], ref_mu, atol=1e-5)
        assert torch.allclose(a[:, :, oy, ox], ref_a, atol=1e-6)


def test_conv_caps_weights_shared_over_positions():
    layer = ConvCapsules(2, 3, 3, 1)
    assert tuple(layer.weight.shape) == (3, 3, 2, 3, 4, 4)
    assert sum(q.numel() for q in layer.parameters()) == 3 * 3 * 2 * 3 * 16 + 2 * 3
    # the same window content at two positions gives the same output capsules
    poses, acts = _grid(B=1, T=2, H=3, W=6)
    poses[..., 3:, :] = poses[..., :3, :]
    acts[..., 3:] = acts[..., :3]
    mu, a = layer(poses, acts)
    assert torch.allclose(mu[:, :, :, 0], mu[:, :, :, 3], atol=1e-6) and torch.allclose(a[..., 0], a[..., 3])


def test_primary_caps_layout():
    prim = MatrixPrimaryCapsules(5, 3)
    x = torch.randn(2, 5, 4, 4)
    poses, acts = prim(x)
    raw = prim.pose(x)  # [B, 3*16, 4, 4]: channel t*16 + d
    assert torch.equal(poses[1, 2, 3, 1, 7], raw[1, 2 * 16 + 7, 3, 1])
    assert torch.allclose(acts, torch.sigmoid(prim.activation(x)))
    assert sum(q.numel() for q in prim.parameters()) == 5 * 3 * 17 + 3 * 17


def test_class_caps_coordinate_addition():
    torch.manual_seed(0)
    layer = ClassCapsules(2, 3)
    poses, acts = _grid(B=2, T=2, H=3, W=4)
    centers = torch.rand(3, 4, 2)
    v_on, a_on = layer.votes(poses, acts, centers)
    layer.coord_add = False
    v_off, a_off = layer.votes(poses, acts)
    assert torch.equal(a_on, a_off) and v_on.shape == (2, 3 * 4 * 2, 3, 16)
    diff = (v_on - v_off).view(2, 3, 4, 2, 3, 16)
    # entries 3 and 7 (right-hand column, rows 0 and 1) get (row, column); nothing else changes
    assert torch.allclose(diff[..., 3], centers[:, :, 0][None, :, :, None, None].expand(2, 3, 4, 2, 3), atol=1e-6)
    assert torch.allclose(diff[..., 7], centers[:, :, 1][None, :, :, None, None].expand(2, 3, 4, 2, 3), atol=1e-6)
    others = [k for k in range(16) if k not in (3, 7)]
    assert diff[..., others].abs().max() < 1e-6
    # votes without coordinates: child (y, x, t) votes M W with the type's shared weight
    M = poses[1, 1, 2, 3].reshape(4, 4)
    assert torch.allclose(v_off[1, (2 * 4 + 3) * 2 + 1, 2], (M @ layer.weight[1, 2]).reshape(16), atol=1e-6)
    # default centres are the child grid's cell centres; yl-1993 entries are (0, 1)
    assert torch.allclose(grid_centers(2, 4)[1, 3], torch.tensor([0.75, 0.875]))
    assert ClassCapsules(2, 3, coord_entries=(0, 1)).coord_entries == (0, 1)
    with pytest.raises(ValueError, match="coord_entries"):
        ClassCapsules(2, 3, coord_entries=(3, 3))


def test_matrix_votes_is_a_matrix_product():
    poses = torch.randn(2, 3, 16)
    W = torch.randn(3, 4, 4, 4)
    V = matrix_votes(poses, W)
    assert V.shape == (2, 3, 4, 16)
    assert torch.allclose(V[1, 2, 3], (poses[1, 2].view(4, 4) @ W[2, 3]).reshape(16), atol=1e-6)


def test_inverse_temperature_schedules():
    lam = inverse_temperature_schedule(3)
    assert lam == pytest.approx([0.05, 0.0975, 0.142625])
    assert inverse_temperature_schedule(3, 0.01, "fixed") == [0.01] * 3
    assert inverse_temperature_schedule(4, 2.0, "linear") == pytest.approx([0.5, 1.0, 1.5, 2.0])
    # lambda really enters: a larger lambda pushes activations further from 1/2
    votes, a_in, bu, ba = _inputs()
    _, a_small = em_routing(votes, a_in, bu, ba, inverse_temperature=0.01)
    _, a_big = em_routing(votes, a_in, bu, ba, inverse_temperature=1.0)
    assert (a_big - 0.5).abs().mean() > (a_small - 0.5).abs().mean()


def test_normalize_costs_is_a_per_layer_constant():
    """Normalised costs = raw costs * n_out / n_inp (so it equals rescaling lambda and beta_a)."""
    votes, a_in, bu, ba = _inputs(I=8, J=2)
    (_, a1), t1 = em_routing(votes, a_in, bu, ba, 1, inverse_temperature=1.0, return_routing=True)
    (_, a2), t2 = em_routing(
        votes, a_in, bu, ba, 1, inverse_temperature=1.0, normalize_costs=False, return_routing=True
    )
    assert torch.allclose(t1.extra["costs"][0] * 8 / 2, t2.extra["costs"][0], atol=1e-5)
    (_, a3) = em_routing(votes, a_in, bu, ba * 4, 1, inverse_temperature=0.25, normalize_costs=False)
    assert torch.allclose(a1, a3, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------
def test_model_output_shapes_default_and_small():
    torch.manual_seed(0)
    model = EMCapsNet()
    cfg = model.config
    assert (cfg.conv_grid, cfg.caps1_grid, cfg.caps2_grid) == (14, 6, 4)
    with torch.no_grad():
        out = model(torch.rand(2, 1, 32, 32), return_routing=True)
    assert isinstance(out, CapsuleOutput)
    assert out.scores.shape == (2, 5) and out.poses.shape == (2, 5, 16) and out.reconstruction is None
    assert ((out.scores > 0) & (out.scores < 1)).all()
    assert out.trace.algorithm == "em" and out.trace.coefficients[0].shape == (2, 4 * 4 * 16, 5)
    tr1 = out.extra["traces"]["conv_caps1"]
    assert tr1.coefficients[0].shape == (2, 6, 6, 3 * 3 * 8, 16)
    assert out.extra["activations"]["conv_caps2"].shape == (2, 16, 4, 4)
    small = EMCapsNet(EMCapsNetConfig.small())
    assert (small.config.conv_grid, small.config.caps1_grid, small.config.caps2_grid) == (12, 5, 3)
    for B in (1, 3):
        o = small(torch.rand(B, 1, 28, 28))
        assert o.scores.shape == (B, 10) and o.poses.shape == (B, 10, 16) and o.trace is None
    o2 = EMCapsNet(EMCapsNetConfig(in_channels=2))(torch.rand(1, 2, 32, 32))
    assert o2.scores.shape == (1, 5)


def test_model_parameter_counts():
    assert EMCapsNet().parameter_breakdown() == {
        "conv1": 1 * 64 * 25 + 64,
        "primary_caps": 64 * 8 * 17 + 8 * 17,
        "conv_caps1": 9 * 8 * 16 * 16 + 32,
        "conv_caps2": 9 * 16 * 16 * 16 + 32,
        "class_caps": 16 * 5 * 16 + 10,
        "total": 67_154,
    }
    assert EMCapsNet(in_channels=2).parameter_breakdown()["total"] == 68_754
    assert EMCapsNet(EMCapsNetConfig.large()).parameter_breakdown()["total"] == 316_394  # paper: 310K
    assert EMCapsNet(EMCapsNetConfig.small()).parameter_breakdown()["total"] == 25_084
    bn = EMCapsNet(batch_norm=True)
    assert bn.parameter_breakdown()["total"] == 67_154 + 2 * 64
    assert sum(q.numel() for q in EMCapsNet().parameters()) == 67_154


def test_receptive_field_centers():
    c = receptive_field_centers(EMCapsNetConfig())
    assert c.shape == (4, 4, 2)
    # ConvCaps2 position o sees pixel 4*o + 8 in the 32x32 input (valid convs 5/2, 1/1, 3/2, 3/1)
    expected = (torch.tensor([8.0, 12.0, 16.0, 20.0]) + 0.5) / 32
    assert torch.allclose(c[:, 0, 0], expected) and torch.allclose(c[0, :, 1], expected)


def test_model_deterministic_under_seed():
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        model = EMCapsNet(EMCapsNetConfig.small())
        outs.append(model(x, return_routing=True))
    assert torch.equal(outs[0].scores, outs[1].scores) and torch.equal(outs[0].poses, outs[1].poses)
    for r0, r1 in zip(outs[0].trace.coefficients, outs[1].trace.coefficients):
        assert torch.equal(r0, r1)


def test_model_quirk_flag_reaches_every_layer():
    model = EMCapsNet(
        EMCapsNetConfig.small(normalize_over_outputs=True, iterations=2, final_lambda=0.5, lambda_schedule="fixed")
    )
    for layer in (model.conv_caps1, model.conv_caps2, model.class_caps):
        assert layer.normalize_over_outputs and layer.inverse_temperature == [0.5, 0.5]


def test_model_can_fit_a_tiny_batch():
    """A few Adam steps with spread loss reduce the loss on a fixed batch (learning signal flows)."""
    torch.manual_seed(0)
    model = EMCapsNet(_tiny_cfg(iterations=2))
    x = torch.rand(6, 1, 20, 20)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    x[y == 1, :, :10] += 1.0
    x[y == 2, :, :, :10] += 1.0
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = spread_loss(model(x).scores, y, 0.5)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert min(losses[-5:]) < 0.7 * losses[0]


# ---------------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_torch_compile_smoke():
    torch._dynamo.reset()
    votes, a_in, bu, ba = _inputs(B=2, I=6, J=3)
    eager = em_routing(votes, a_in, bu, ba, iterations=2)
    fn = torch.compile(lambda v, a, u, b: em_routing(v, a, u, b, iterations=2), fullgraph=True)
    t0 = time.time()
    got = fn(votes, a_in, bu, ba)
    assert time.time() - t0 < 120
    assert torch.allclose(got[0], eager[0], atol=1e-5) and torch.allclose(got[1], eager[1], atol=1e-6)
    # a conv capsule layer (unfold + votes + routing) compiles to the same numbers too
    torch.manual_seed(0)
    layer = ConvCapsules(2, 3, 3, 2, iterations=2)
    poses, acts = _grid(B=1, T=2, H=5, W=5)
    ref = layer(poses, acts)
    out = torch.compile(layer, fullgraph=True)(poses, acts)
    assert torch.allclose(out[0], ref[0], atol=1e-5) and torch.allclose(out[1], ref[1], atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# The fast path (blocked custom autograd function) against the previous implementation
# ---------------------------------------------------------------------------------------------------
def _em_routing_previous(votes, a_in, beta_u, beta_a, iterations, lams, quirk, norm_costs, eps=1e-8):
    """``em_routing`` before the blocked custom autograd function (#17), kept verbatim as the reference
    (plain autograd on parent-major votes; returns ``((mu, a_out), trace lists)``)."""
    *_, I, J, D = votes.shape
    scale = J / I if norm_costs else 1.0
    LN_2PI = math.log(2.0 * math.pi)
    V = votes.transpose(-3, -2).contiguous()  # [B, J, I, D]
    a = a_in.unsqueeze(-2)  # [B, 1, I]
    bu, ba = beta_u.unsqueeze(-1), beta_a  # [J, 1], [J]
    R = torch.full_like(V[..., 0], 1.0 / J)  # [B, J, I]
    tr = {k: [] for k in ("coefficients", "agreements", "outputs", "activations", "sigma2", "costs", "mass")}
    for t in range(iterations):
        Rp = R * a  # [B, J, I]
        if quirk:
            Rp = Rp / (Rp.sum(dim=-2, keepdim=True) + eps)  # [B, J, I]
        mass = Rp.sum(dim=-1)  # [B, J]
        coeff = Rp / (mass.unsqueeze(-1) + eps)  # [B, J, I]
        mu = torch.einsum("...ji,...jid->...jd", coeff, V)  # [B, J, D]
        sq = (V - mu.unsqueeze(-2)).square()  # [B, J, I, D]
        sigma2 = torch.einsum("...ji,...jid->...jd", coeff, sq) + eps  # [B, J, D]
        log_sigma2 = torch.log(sigma2)  # [B, J, D]
        cost = ((bu + 0.5 * log_sigma2) * (mass * scale).unsqueeze(-1)).sum(dim=-1)  # [B, J]
        logit = lams[t] * (ba - cost)  # [B, J]
        a_out = torch.sigmoid(logit)  # [B, J]
        maha = torch.einsum("...jid,...jd->...ji", sq, sigma2.reciprocal())  # [B, J, I]
        log_p = -0.5 * (maha + log_sigma2.sum(dim=-1, keepdim=True) + D * LN_2PI)  # [B, J, I]
        log_post = log_p + torch.nn.functional.logsigmoid(logit).unsqueeze(-1)  # [B, J, I]
        R_next = torch.exp(log_post - torch.logsumexp(log_post, dim=-2, keepdim=True))  # [B, J, I]
        for k, x in zip(tr, (R.transpose(-2, -1), log_p.transpose(-2, -1), mu, a_out, sigma2, cost, mass)):
            tr[k].append(x)
        R = R_next
    tr["posterior"] = R.transpose(-2, -1)
    return (mu, a_out), tr


_FAST_CASES = [  # (votes shape, quirk, normalize_costs, inverse_temperature, iterations)
    ((3, 7, 4, 16), False, True, None, 3),
    ((3, 7, 4, 16), False, False, 0.05, 2),
    ((2, 3, 5, 6, 3, 4), True, True, [0.3, 1.0, 2.0], 3),
    ((2, 3, 5, 6, 3, 4), True, False, 1e-3, 1),
    ((5, 9, 5, 16), False, True, [0.5, 0.2, 0.9, 1.5], 4),
]


def _rel(x, ref, scale=None):
    x, ref = x.detach(), ref.detach()
    return float((x - ref).abs().max()) / max(float(ref.abs().max()) if scale is None else scale, 1e-300)


def _leaves64(shape, seed):
    g = torch.Generator().manual_seed(seed)
    *lead, I, J, D = shape
    V = torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()
    a = (torch.rand(*lead, I, generator=g, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
    bu = (torch.randn(J, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    ba = (torch.randn(J, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    return V, a, bu, ba


def _grads(outs, leaves, seed):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("block", [None, 1, 3 * 16])
@pytest.mark.parametrize("shape,quirk,norm_costs,lam,iters", _FAST_CASES)
def test_fast_path_matches_previous_implementation_float64(monkeypatch, block, shape, quirk, norm_costs, lam, iters):
    """Outputs and the gradients w.r.t. votes, a_in, beta_u, beta_a equal the previous implementation, with one
    block, one routing per block and blocks that do not divide the batch."""
    import capsule_lib.routing._kernels.em as em_kernel

    if block is not None:
        monkeypatch.setattr(em_kernel, "_BLOCK_ELEMENTS", block)
    leaves = _leaves64(shape, seed=len(shape) + iters)
    lams = inverse_temperature_schedule(iters) if lam is None else ([lam] * iters if isinstance(lam, float) else lam)
    opts = dict(inverse_temperature=lam, normalize_over_outputs=quirk, normalize_costs=norm_costs)
    mu, a_out = em_routing(*leaves, iters, **opts)
    (mu_ref, a_ref), _ = _em_routing_previous(*leaves, iters, lams, quirk, norm_costs)
    assert mu.dtype == torch.float64
    assert _rel(mu, mu_ref) < 1e-12 and _rel(a_out, a_ref) < 1e-12
    grads = _grads((mu, a_out), leaves, seed=5)
    grads_ref = _grads((mu_ref, a_ref), leaves, seed=5)
    g_scale = max(float(g.abs().max()) for g in grads_ref)
    for name, g, g_ref in zip(("votes", "a_in", "beta_u", "beta_a"), grads, grads_ref):
        # with the yl-1993 quirk dL/da_in is 0 up to rounding: compare it on the scale of all gradients
        scale = g_scale if (quirk and name == "a_in") else None
        assert _rel(g, g_ref, scale) < 1e-9, name


@pytest.mark.parametrize("shape,quirk,norm_costs,lam,iters", _FAST_CASES[:3])
def test_trace_path_matches_previous_implementation_float64(shape, quirk, norm_costs, lam, iters):
    """With ``return_routing=True``: every iteration's trace tensors, the outputs and the gradients (also through
    the trace) equal the previous implementation."""
    leaves = _leaves64(shape, seed=11)
    lams = inverse_temperature_schedule(iters) if lam is None else ([lam] * iters if isinstance(lam, float) else lam)
    opts = dict(inverse_temperature=lam, normalize_over_outputs=quirk, normalize_costs=norm_costs)
    (mu, a_out), tr = em_routing(*leaves, iters, **opts, return_routing=True)
    (mu_ref, a_ref), ref = _em_routing_previous(*leaves, iters, lams, quirk, norm_costs)
    assert _rel(mu, mu_ref) < 1e-12 and _rel(a_out, a_ref) < 1e-12
    for k in ("coefficients", "agreements", "outputs", "activations"):
        assert len(getattr(tr, k)) == iters
        for t in range(iters):
            assert _rel(getattr(tr, k)[t], ref[k][t]) < 1e-12, (k, t)
    for k in ("sigma2", "costs", "mass"):
        for t in range(iters):
            assert _rel(tr.extra[k][t], ref[k][t]) < 1e-12, (k, t)
    assert _rel(tr.extra["posterior"], ref["posterior"]) < 1e-12
    outs = (mu, a_out, tr.agreements[0], tr.extra["posterior"])
    outs_ref = (mu_ref, a_ref, ref["agreements"][0], ref["posterior"])
    grads, grads_ref = _grads(outs, leaves, seed=6), _grads(outs_ref, leaves, seed=6)
    g_scale = max(float(g.abs().max()) for g in grads_ref)
    for name, g, g_ref in zip(("votes", "a_in", "beta_u", "beta_a"), grads, grads_ref):
        assert _rel(g, g_ref, g_scale if (quirk and name == "a_in") else None) < 1e-9, name


def test_fast_function_passes_gradcheck():
    from capsule_lib.routing._kernels.em import _EMRoutingFunction
    from capsule_lib.routing.em import _e_step, _m_step

    V, a, bu, ba = _leaves64((3, 5, 2, 4), seed=3)  # child-major [N, I=5, J=2, D=4]
    V = V.detach().transpose(1, 2).contiguous().requires_grad_()  # parent-major [N, J, I, D], as the function takes
    for quirk, scale in ((False, 0.4), (True, 1.0)):

        def fn(V_, a_, u_, b_, quirk=quirk, scale=scale):
            return _EMRoutingFunction.apply(V_, a_, u_, b_, (0.7, 1.3, 2.0), quirk, scale, 1e-8, _m_step, _e_step)

        assert torch.autograd.gradcheck(fn, (V, a, bu, ba), eps=1e-6, atol=1e-7, rtol=1e-5)


def _conv_caps_previous(layer, poses, acts):
    """``ConvCapsules`` before #17: child-major votes through the previous routing."""
    P, K, T, D = layer.pose_size, layer.kernel_size, layer.in_types, layer.pose_size**2
    B, _, H, W, _ = poses.shape
    h, w = layer.output_size(H), layer.output_size(W)
    x = poses.permute(0, 1, 4, 2, 3).reshape(B, T * D, H, W)
    cols = torch.nn.functional.unfold(x, K, padding=layer.padding, stride=layer.stride)
    M = cols.view(B, T, P, P, K, K, h, w)
    V = torch.einsum("btpquvhw,uvtjqr->bhwuvtjpr", M, layer.weight).reshape(B, h, w, K * K * T, layer.out_types, D)
    ac = torch.nn.functional.unfold(acts, K, padding=layer.padding, stride=layer.stride)
    ac = ac.view(B, T, K, K, h, w).permute(0, 4, 5, 2, 3, 1).reshape(B, h, w, K * K * T)
    (mu, a_out), _ = _em_routing_previous(
        V, ac, layer.beta_u, layer.beta_a, layer.iterations, layer.inverse_temperature,
        layer.normalize_over_outputs, layer.normalize_costs, layer.eps,
    )  # fmt: skip
    return mu.permute(0, 3, 1, 2, 4), a_out.permute(0, 3, 1, 2)


def _class_caps_previous(layer, poses, acts, centers):
    P, T, D = layer.pose_size, layer.in_types, layer.pose_size**2
    B, _, H, W, _ = poses.shape
    M = poses.reshape(B, T, H, W, P, P)
    V = torch.einsum("bthwpq,tjqr->bhwtjpr", M, layer.weight).reshape(B, H, W, T, layer.n_classes, D)
    offset = torch.einsum("hwc,cd->hwd", centers.to(layer.coord_basis.dtype), layer.coord_basis)
    V = (V + offset[:, :, None, None, :].to(V.dtype)).reshape(B, H * W * T, layer.n_classes, D)
    a = acts.permute(0, 2, 3, 1).reshape(B, H * W * T)
    (mu, a_out), _ = _em_routing_previous(
        V, a, layer.beta_u, layer.beta_a, layer.iterations, layer.inverse_temperature,
        layer.normalize_over_outputs, layer.normalize_costs, layer.eps,
    )  # fmt: skip
    return mu, a_out


@pytest.mark.parametrize("quirk", [False, True])
def test_matrix_layers_match_previous_implementation_float64(quirk):
    """ConvCapsules and ClassCapsules (parent-major votes, fast routing): outputs and the gradients w.r.t. poses,
    activations, weights, beta_u and beta_a equal the previous layers, float64."""
    torch.manual_seed(1)
    kw = dict(normalize_over_outputs=quirk, normalize_costs=not quirk, inverse_temperature=None if not quirk else 1e-2)
    conv = ConvCapsules(3, 4, 3, 2, iterations=3, **kw).double()
    cls = ClassCapsules(4, 3, iterations=3, **kw).double()
    for m in (conv, cls):
        with torch.no_grad():
            m.beta_u.normal_(0, 0.3)
            m.beta_a.normal_(0, 0.3)
    g = torch.Generator().manual_seed(2)
    poses = torch.randn(2, 3, 7, 7, 16, generator=g, dtype=torch.float64).requires_grad_()
    acts = (torch.rand(2, 3, 7, 7, generator=g, dtype=torch.float64) * 0.9 + 0.05).requires_grad_()
    p_cls = torch.randn(2, 4, 3, 3, 16, generator=g, dtype=torch.float64).requires_grad_()
    a_cls = torch.rand(2, 4, 3, 3, generator=g, dtype=torch.float64).requires_grad_()
    centers = torch.rand(3, 3, 2, generator=g, dtype=torch.float64)
    cases = (
        (conv, lambda: conv(poses, acts), lambda: _conv_caps_previous(conv, poses, acts), (poses, acts)),
        (
            cls,
            lambda: cls(p_cls, a_cls, centers),
            lambda: _class_caps_previous(cls, p_cls, a_cls, centers),
            (p_cls, a_cls),
        ),
    )
    for layer, run_new, run_old, inputs in cases:
        leaves = (*inputs, layer.weight, layer.beta_u, layer.beta_a)
        new, old = run_new(), run_old()
        for x, ref in zip(new, old):
            assert x.shape == ref.shape and _rel(x, ref) < 1e-12
        grads, grads_ref = _grads(new, leaves, seed=7), _grads(old, leaves, seed=7)
        g_scale = max(float(g.abs().max()) for g in grads_ref)
        for name, gr, gr_ref in zip(("poses", "activations", "weight", "beta_u", "beta_a"), grads, grads_ref):
            scale = g_scale if (quirk and name == "activations") else None
            assert _rel(gr, gr_ref, scale) < 1e-9, (type(layer).__name__, name)


def test_layer_votes_are_parent_major_views():
    """The layers store their votes parent-major, so em_routing's transpose to [.., n_out, n_inp, d] is free."""
    poses, acts = _grid(B=2, T=2, H=5, W=5)
    V, _ = ConvCapsules(2, 3, 3, 1).votes(poses, acts)
    assert V.shape == (2, 3, 3, 18, 3, 16) and V.transpose(-3, -2).is_contiguous()
    V, _ = ClassCapsules(2, 4).votes(poses, acts)
    assert V.shape == (2, 50, 4, 16) and V.transpose(-3, -2).is_contiguous()


@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_fast_path_no_nan_inf_and_collapsed_gaussians(scale):
    """The fast path (no trace) on zero, unit and large votes, and with every parent collapsed onto identical
    votes (sigma2 = eps): finite outputs and gradients in float32, and equal to the autograd path in float64
    (in float32 the gradients of a collapsed Gaussian are rounding noise amplified by 1/eps in both paths)."""
    votes, a_in, bu, ba = _inputs(B=3, I=6, J=3)
    votes = votes * scale
    votes[2] = votes[2, :1]  # sample 2: all children vote the same: collapsed Gaussians
    for dtype in (torch.float32, torch.float64):
        results = []
        for trace in (False, True):
            leaves = [x.detach().to(dtype).requires_grad_() for x in (votes, a_in, bu, ba)]
            out = em_routing(*leaves, iterations=3, return_routing=trace)
            mu, a = out[0] if trace else out
            (mu.square().sum() + a.sum()).backward()
            assert _finite(mu, a, *(x.grad for x in leaves))
            results.append([mu, a, *(x.grad for x in leaves)])
        if dtype == torch.float64:
            for x, y in zip(*results):
                assert _rel(x, y, max(1.0, float(y.detach().abs().max()))) < 1e-7  # 1/eps amplifies rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_path_backward_under_autocast(dtype):
    """The custom function's backward runs under the caller's autocast state: it must stay in fp32."""
    votes, a_in, bu, ba = _inputs()
    leaves = [votes.clone().requires_grad_(), a_in.clone().requires_grad_(), bu.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=dtype):
        mu, a = em_routing(leaves[0].to(dtype), leaves[1], leaves[2], ba)
        (mu.float().sum() + a.float().sum()).backward()
    assert mu.dtype == dtype and all(x.grad.dtype == torch.float32 and _finite(x.grad) for x in leaves)
