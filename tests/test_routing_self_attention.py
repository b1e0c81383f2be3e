"""Self-attention routing (Efficient-CapsNet FCCaps), as described by Mazzia et al. (2021) and their code."""

import math

import pytest
import torch

from capsule_lib.routing.self_attention import (
    FCCapsules,
    SelfAttentionRouting,
    keras_fans,
    self_attention_routing,
    self_attention_votes,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (tests/conftest.py)


def _layer(n_inp=16, n_out=10, d_inp=8, d_out=16, seed=0, prior_std=0.0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = FCCapsules(n_inp, n_out, d_inp, d_out).to(dtype)
    if prior_std:
        with torch.no_grad():
            m.log_prior.normal_(0, prior_std)
    return m


# ------------------------------------------------------------------------------------------ structure
@pytest.mark.parametrize("B", [1, 3])
def test_shapes_and_trace(B):
    m = _layer(prior_std=0.1)
    u = torch.randn(B, 16, 8)
    v, tr = m(u, return_routing=True)
    assert v.shape == (B, 10, 16)
    assert m(u).shape == (B, 10, 16)
    assert tr.algorithm == "self_attention" and tr.iterations == 1
    assert tr.coefficients[0].shape == (B, 16, 10)
    assert tr.agreements[0].shape == (B, 16, 10)
    assert tr.outputs[0].shape == (B, 10, 16)
    assert tr.extra["attention"].shape == (B, 10, 16, 16)
    assert tr.extra["coefficients_with_prior"].shape == (B, 16, 10)
    assert m.weight.shape == (10, 16, 8, 16) and m.log_prior.shape == (10, 16, 1)
    assert isinstance(m, SelfAttentionRouting)


def test_coefficients_sum_to_one_over_outputs_before_the_bias():
    m = _layer(prior_std=0.3)
    _, tr = m(torch.randn(4, 16, 8), return_routing=True)
    c = tr.coefficients[0]
    torch.testing.assert_close(c.sum(-1), torch.ones(4, 16))
    assert (c > 0).all()
    cb = tr.extra["coefficients_with_prior"]
    torch.testing.assert_close(cb, c + m.prior().detach())
    assert not torch.allclose(cb.sum(-1), torch.ones(4, 16))  # the bias breaks the normalisation (documented)


def test_bias_is_added_after_the_softmax():
    """Changing b must not change the softmax coefficients, only what is added to them."""
    u = torch.randn(2, 16, 8)
    m = _layer()
    _, tr0 = m(u, return_routing=True)
    with torch.no_grad():
        m.log_prior.normal_(0, 1.0)
    v1, tr1 = m(u, return_routing=True)
    torch.testing.assert_close(tr0.coefficients[0], tr1.coefficients[0])
    assert not torch.allclose(tr0.outputs[0], v1)


def test_shortcut_equals_explicit_attention_row_sums():
    m = _layer(prior_std=0.2)
    u = torch.randn(5, 16, 8)
    votes = m.votes(u)  # [B, I, J, D]
    v_fast = self_attention_routing(votes, m.prior())
    v_full, tr = self_attention_routing(votes, m.prior(), return_routing=True)
    torch.testing.assert_close(v_fast, v_full, rtol=1e-5, atol=1e-6)
    A = torch.einsum("bije,bkje->bjik", votes, votes)  # explicit U_j U_j^T
    torch.testing.assert_close(tr.extra["attention"], A, rtol=1e-5, atol=1e-5)
    fast_logits = torch.einsum("bije,bje->bij", votes, votes.sum(1)) / 4.0  # sqrt(16)
    torch.testing.assert_close(tr.agreements[0], A.sum(-1).transpose(1, 2) / 4.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tr.agreements[0], fast_logits, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------- exact values
def _reference_loop(u, W, b, eps=1e-20):
    """Independent float64 re-derivation with Python loops, following the paper and the official code literally.
    u [I, d], W [J, I, d, D], b [J, I, 1]; returns v [J, D] and the softmax coefficients c[i][j]."""
    J, I, d, D = len(W), len(W[0]), len(W[0][0]), len(W[0][0][0])
    uhat = [[[sum(u[i][a] * W[j][i][a][e] for a in range(d)) for e in range(D)] for i in range(I)] for j in range(J)]
    logit = [[0.0] * J for _ in range(I)]
    for j in range(J):
        A = [[sum(uhat[j][i][e] * uhat[j][k][e] for e in range(D)) for k in range(I)] for i in range(I)]
        for i in range(I):
            logit[i][j] = sum(A[i]) / math.sqrt(D)
    c = []
    for i in range(I):
        mx = max(logit[i])
        ex = [math.exp(z - mx) for z in logit[i]]
        c.append([e / sum(ex) for e in ex])  # softmax over the outputs j
    v = []
    for j in range(J):
        s = [sum((c[i][j] + b[j][i][0]) * uhat[j][i][e] for i in range(I)) for e in range(D)]
        n = math.sqrt(sum(x * x for x in s))
        v.append([(1 - 1 / (math.exp(n) + eps)) * x / (n + eps) for x in s])  # squash_E, official form
    return v, c


@pytest.mark.parametrize("n_inp", [2, 3])
def test_tiny_case_matches_loop_reference(n_inp):
    torch.manual_seed(n_inp)
    m = FCCapsules(n_inp, 2, 3, 4).double()
    with torch.no_grad():
        m.weight.normal_(0, 0.7)
        m.log_prior.normal_(0, 0.3)
    u = torch.randn(2, n_inp, 3, dtype=torch.float64)
    v, tr = m(u, return_routing=True)
    for b in range(2):
        v_ref, c_ref = _reference_loop(u[b].tolist(), m.weight.tolist(), m.log_prior.tolist())
        torch.testing.assert_close(v[b], torch.tensor(v_ref, dtype=torch.float64), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            tr.coefficients[0][b], torch.tensor(c_ref, dtype=torch.float64), rtol=1e-10, atol=1e-12
        )
    torch.testing.assert_close(m(u), v)


def test_permuting_input_capsules_with_their_weights_leaves_outputs_unchanged():
    m = _layer(prior_std=0.2)
    u = torch.randn(3, 16, 8)
    perm = torch.randperm(16)
    m2 = _layer()
    with torch.no_grad():
        m2.weight.copy_(m.weight[:, perm])
        m2.log_prior.copy_(m.log_prior[:, perm])
    v1, tr1 = m(u, return_routing=True)
    v2, tr2 = m2(u[:, perm], return_routing=True)
    torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tr1.coefficients[0][:, perm], tr2.coefficients[0], rtol=1e-5, atol=1e-6)


def test_permuting_output_capsules_permutes_outputs():
    m = _layer(prior_std=0.2)
    u = torch.randn(2, 16, 8)
    perm = torch.randperm(10)
    m2 = _layer()
    with torch.no_grad():
        m2.weight.copy_(m.weight[perm])
        m2.log_prior.copy_(m.log_prior[perm])
    torch.testing.assert_close(m(u)[:, perm], m2(u), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_no_nan_forward_backward(scale):
    m = _layer(prior_std=0.1)
    u = (torch.randn(3, 16, 8) * scale).requires_grad_()
    v, tr = m(u, return_routing=True)
    (v.sum() + v.pow(2).sum()).backward()
    assert torch.isfinite(v).all() and torch.isfinite(tr.coefficients[0]).all()
    assert torch.isfinite(u.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    assert (v.norm(dim=-1) < 1.0 + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_no_nan(dtype):
    m = _layer(prior_std=0.1)
    for scale in (0.0, 1.0, 1e3):
        u = (torch.randn(3, 16, 8) * scale).requires_grad_()
        with torch.autocast("cpu", dtype=dtype):
            v, tr = m(u, return_routing=True)
            v_fast = m(u)
        v.float().sum().backward()
        assert torch.isfinite(v.float()).all() and torch.isfinite(v_fast.float()).all()
        assert tr.coefficients[0].dtype == torch.float32
        assert torch.isfinite(tr.coefficients[0]).all()
        torch.testing.assert_close(tr.coefficients[0].sum(-1), torch.ones(3, 16))
        assert torch.isfinite(u.grad).all()


def test_zero_capsules_give_zero_output_and_finite_grad():
    m = _layer()
    u = torch.zeros(2, 16, 8, requires_grad=True)
    v = m(u)
    assert torch.equal(v, torch.zeros_like(v))
    v.sum().backward()
    assert torch.isfinite(u.grad).all() and torch.isfinite(m.weight.grad).all()


def test_every_parameter_gets_a_gradient():
    m = _layer(prior_std=0.1)
    v = m(torch.randn(3, 16, 8))
    (v * torch.randn_like(v)).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# -------------------------------------------------------------------------------------- init, checks
def test_keras_he_normal_init_uses_the_4d_fan_in():
    assert keras_fans((10, 16, 8, 16)) == (1280, 2560)  # receptive field J*I = 160, fan_in = 8 * 160
    assert keras_fans((5, 5, 1, 32)) == (25, 800)  # a Keras conv kernel
    assert keras_fans((160, 512)) == (160, 512)
    torch.manual_seed(0)
    m = FCCapsules(16, 10, 8, 16)
    target = math.sqrt(2.0 / 1280)  # std of the truncated draw
    bound = 2 * target / 0.87962566103423978
    assert m.weight.abs().max() <= bound + 1e-7
    assert abs(m.weight.std().item() / target - 1) < 0.05
    assert torch.equal(m.log_prior, torch.zeros(10, 16, 1))
    m_t = FCCapsules(16, 10, 8, 16, init="torch")  # fan_in = d_in = 8
    assert abs(m_t.weight.std().item() / math.sqrt(2.0 / 8) - 1) < 0.05


def test_deterministic_under_a_seed():
    a, b = _layer(seed=3), _layer(seed=3)
    u = torch.randn(2, 16, 8)
    assert torch.equal(a.weight, b.weight)
    assert torch.equal(a(u), b(u))


def test_bad_shapes_raise_value_error():
    m = _layer()
    with pytest.raises(ValueError, match=r"\[B, n_inp=16, d_inp=8\]"):
        m(torch.randn(2, 16, 7))
    with pytest.raises(ValueError):
        m(torch.randn(2, 15, 8))
    with pytest.raises(ValueError):
        m(torch.randn(16, 8))
    with pytest.raises(ValueError):
        m(torch.ones(2, 16, 8, dtype=torch.long))
    votes = torch.randn(2, 16, 10, 16)
    with pytest.raises(ValueError, match="n_out, d_out"):
        self_attention_routing(votes[0])
    with pytest.raises(ValueError, match="log_prior"):
        self_attention_routing(votes, torch.zeros(10, 16))
    with pytest.raises(ValueError):
        FCCapsules(16, 10, 8, 16, init="glorot")


def test_votes_layout():
    u, W = torch.randn(2, 3, 4), torch.randn(5, 3, 4, 6)
    votes = self_attention_votes(u, W)
    assert votes.shape == (2, 3, 5, 6)
    torch.testing.assert_close(votes[1, 2, 4], u[1, 2] @ W[4, 2])


@pytest.mark.slow
def test_torch_compile_smoke():
    m = _layer(prior_std=0.1)
    u = torch.randn(3, 16, 8)
    compiled = torch.compile(m)
    torch.testing.assert_close(compiled(u), m(u), rtol=1e-5, atol=1e-6)
    v, tr = compiled(u, return_routing=True)
    torch.testing.assert_close(tr.coefficients[0].sum(-1), torch.ones(3, 16))


# ------------------------------------------------------------------------------------------ fused layer path
def _grads(m, u, g, fused: bool):
    for p in (u, *m.parameters()):
        p.grad = None
    v = m(u) if fused else self_attention_routing(m.votes(u), m.prior(), eps=m.eps)
    (v * g).sum().backward()
    return [v.detach(), u.grad, *(p.grad for p in m.parameters())]


@pytest.mark.parametrize(("B", "sizes"), [(1, (16, 10, 8, 16)), (5, (16, 10, 8, 16)), (4, (7, 3, 5, 4))])
def test_fused_layer_equals_the_plain_path_in_float64(B, sizes):
    """The layer's fused function (votes, routing, squash, hand-written backward) gives the plain path's
    outputs and gradients for the input, the weight and the bias, including an all-zero sample."""
    n_inp, n_out, d_inp, d_out = sizes
    m = _layer(n_inp, n_out, d_inp, d_out, seed=B, prior_std=0.1, dtype=torch.float64)
    u = torch.randn(B, n_inp, d_inp, dtype=torch.float64) * 0.5
    u[0, : n_inp // 2] = 0.0
    u[-1] *= 4.0
    u.requires_grad_()
    g = torch.randn(B, n_out, d_out, dtype=torch.float64)
    fused, plain = _grads(m, u, g, True), _grads(m, u, g, False)
    for name, a, b in zip(["output", "u", "weight", "log_prior"], fused, plain):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=name)


def test_fused_layer_gradcheck():
    from capsule_lib.routing._kernels.self_attention import _FusedSelfAttention

    m = _layer(5, 3, 4, 6, seed=3, prior_std=0.3, dtype=torch.float64)
    u = (torch.randn(2, 5, 4, dtype=torch.float64) * 0.7).requires_grad_()
    w, b = m.weight.detach().clone().requires_grad_(), m.log_prior.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: _FusedSelfAttention.apply(*a, 1e-20), (u, w, b))


def test_fused_layer_is_used_only_where_it_computes_the_same(monkeypatch):
    """Taken for float32/float64 without a trace, autocast or torch.compile; otherwise the plain path runs."""
    from capsule_lib.routing._kernels import self_attention as sa_kernel

    calls = []
    fused_apply = sa_kernel._FusedSelfAttention.apply
    monkeypatch.setattr(sa_kernel._FusedSelfAttention, "apply", lambda *a: calls.append(1) or fused_apply(*a))
    m, u = _layer(), torch.randn(2, 16, 8)
    m(u)
    assert len(calls) == 1
    m(u, return_routing=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(u)
    assert len(calls) == 1
    m.double()(u.double())
    assert len(calls) == 2


def test_fused_layer_float32_close_to_a_float64_reference():
    m = _layer(prior_std=0.1)
    m64 = _layer(prior_std=0.1, dtype=torch.float64)
    m64.load_state_dict(m.state_dict())
    u = torch.randn(8, 16, 8) * 0.3
    g = torch.randn(8, 10, 16)
    ours = _grads(m, u.clone().requires_grad_(), g, True)
    ref = _grads(m64, u.double().requires_grad_(), g.double(), False)
    for name, a, b in zip(["output", "u", "weight", "log_prior"], ours, ref):
        err = float((a.double() - b).abs().max() / b.abs().max())
        assert err < 1e-5, (name, err)
