"""Tests for Heinsen's routings (2019 matrix routing, 2022 vector routing) and the Heinsen models."""

from __future__ import annotations

import math

import pytest
import torch

from capsule_lib import RoutingTrace
from capsule_lib.functional import add_coordinate_channels, coordinate_channels
from capsule_lib.losses import soft_target_cross_entropy
from capsule_lib.models.heinsen import (
    SequenceClassifierConfig,
    SequenceClassifierHead,
    SmallNORBClassifier,
    SmallNORBConfig,
)
from capsule_lib.routing.heinsen_2019 import (
    GenerativeMatrixRouting,
    generative_matrix_routing,
    generative_matrix_routing_reference,
)
from capsule_lib.routing.heinsen_2022 import (
    EfficientVectorRouting,
    VectorRoutingWeights,
    efficient_vector_routing,
    efficient_vector_routing_reference,
)

AUTOCAST_OUT = {"autocast_bf16": torch.bfloat16, "autocast_fp16": torch.float16}  # every routing layer


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


def randomize_(m: torch.nn.Module, scale: float = 1.0, seed: int = 0) -> torch.nn.Module:
    """Give every parameter (including the zero-initialised B, B_brk and betas) a random value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return m


def gmr_inputs(*lead, n=5, d_cov=3, d_inp=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*lead, n, generator=g, dtype=dtype) * 2
    mu = torch.randn(*lead, n, d_cov, d_inp, generator=g, dtype=dtype)
    return a, mu


def all_finite(*ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


# ============================================================================ 2019: generative matrix routing
@pytest.mark.parametrize("p_model", ["gaussian", "skm"])
@pytest.mark.parametrize("kw", [dict(n_inp=5, n_out=3), dict(n_out=3), dict(n_inp=5)])
def test_gmr_coefficients_sum_to_one_every_iteration(p_model, kw):
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, p_model=p_model, iterations=4, **kw), 0.5)
    a, mu = gmr_inputs(2)
    (a_out, mu_out, sigma2), tr = m(a, mu, n_out=None if "n_out" in kw else 3, return_routing=True)
    assert isinstance(tr, RoutingTrace) and tr.algorithm == "heinsen_2019" and tr.iterations == 4
    assert torch.equal(tr.coefficients[0], torch.full((2, 5, 3), 1 / 3))  # t = 0 is uniform 1/J
    for R in tr.coefficients:
        assert R.shape == (2, 5, 3)
        torch.testing.assert_close(R.sum(-1), torch.ones(2, 5))
        assert bool((R >= 0).all())
    assert not torch.allclose(tr.coefficients[1], tr.coefficients[0])  # routing actually moved
    for name, shape in (("agreements", (2, 5, 3)), ("outputs", (2, 3, 3, 2)), ("activations", (2, 3))):
        assert len(getattr(tr, name)) == 4 and getattr(tr, name)[0].shape == shape
    assert len(tr.extra["D_use"]) == len(tr.extra["D_ign"]) == len(tr.extra["sigma2"]) == 4
    # D-step: D_use + D_ign = sigmoid(a_inp) for every output; the trace's last entries are the outputs.
    torch.testing.assert_close(
        tr.extra["D_use"][-1] + tr.extra["D_ign"][-1], torch.sigmoid(a)[..., None].expand(2, 5, 3)
    )
    torch.testing.assert_close(tr.outputs[-1], mu_out)
    torch.testing.assert_close(tr.activations[-1], a_out)
    torch.testing.assert_close(tr.extra["sigma2"][-1], sigma2)


@pytest.mark.parametrize("lead", [(1,), (3,), (2, 3), ()])
def test_gmr_shapes(lead):
    m = GenerativeMatrixRouting(d_cov=3, d_inp=4, d_out=2, n_inp=5, n_out=6)
    a_out, mu_out, sigma2 = m(*gmr_inputs(*lead))
    assert a_out.shape == (*lead, 6)
    assert mu_out.shape == sigma2.shape == (*lead, 6, 3, 2)
    assert bool((sigma2 > 0).all())


def test_gmr_parameters_and_inits():
    torch.manual_seed(0)
    m = GenerativeMatrixRouting(d_cov=4, d_inp=8, d_out=4, n_inp=300, n_out=20)
    assert m.W.shape == (300, 20, 8, 4) and m.B.shape == (300, 20, 4, 4)
    assert m.beta_use.shape == m.beta_ign.shape == (300, 20) and m.beta_use is not m.beta_ign
    assert not hasattr(m, "B_brk")
    assert abs(m.W.std().item() - 1 / 8) < 0.01 and abs(m.W.mean().item()) < 0.01  # N(0, 1) / d_inp
    assert not m.B.any() and not m.beta_use.any() and not m.beta_ign.any()
    shared = GenerativeMatrixRouting(4, 4, 4, n_out=64)  # the smallNORB model's first routing
    assert shared.W.shape == (1, 64, 4, 4) and shared.B.shape == (1, 64, 4, 4) and shared.beta_use.shape == (1, 64)
    assert n_params(shared) == 2176
    var_out = GenerativeMatrixRouting(4, 4, 4, n_inp=10)
    assert var_out.W.shape == (10, 1, 4, 4) and var_out.B_brk.shape == (1, 4, 4) and not var_out.B_brk.any()
    single = GenerativeMatrixRouting(4, 4, 4, n_inp=10, n_out=3, single_beta=True)
    assert single.beta_ign is single.beta_use and n_params(single) == 10 * 3 * (16 + 16 + 1)
    assert set(single.state_dict()) == {"W", "B", "beta_use", "beta_ign", "CONST_one"}  # original keys


def test_gmr_variable_n_inp_shares_weights():
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=3), 0.3)
    for n in (1, 5, 9):
        a, mu = gmr_inputs(2, n=n, seed=n)
        a_out, mu_out, sigma2 = m(a, mu)
        assert a_out.shape == (2, 3) and mu_out.shape == (2, 3, 3, 2)
    # shared weights: with one iteration, one input repeated k times routes like that input alone
    # (same shares, same weighted mean and variance up to eps), except that a_out, a sum over inputs, is
    # k times larger.
    one = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=3, iterations=1, eps=1e-12), 0.3).double()
    a, mu = gmr_inputs(1, n=1, dtype=torch.float64)
    ref = one(a, mu)
    rep = one(a.repeat(1, 4), mu.repeat(1, 4, 1, 1))
    torch.testing.assert_close(4 * ref[0], rep[0])
    torch.testing.assert_close(ref[1], rep[1])
    torch.testing.assert_close(ref[2], rep[2])


def test_gmr_variable_n_out_and_symmetry_breaker():
    m = GenerativeMatrixRouting(3, 4, 2, n_inp=5)
    a, mu = gmr_inputs(2)
    for J in (2, 7):
        a_out, mu_out, sigma2 = m(a, mu, n_out=J)
        assert a_out.shape == (2, J) and mu_out.shape == sigma2.shape == (2, J, 3, 2)
    assert m(a, mu)[0].shape == (2, 5)  # default: n_out = n_inp, as in the original
    # With B_brk = 0 every output has the same W, B and betas: all outputs are identical (the symmetry that
    # B_brk * linspace(-1, 1, n_out) breaks).
    _, mu_sym, _ = m(a, mu, n_out=4)
    assert torch.allclose(mu_sym, mu_sym[:, :1].expand_as(mu_sym))
    with torch.no_grad():
        m.B_brk.normal_()
    _, mu_brk, _ = m(a, mu, n_out=4)
    assert not torch.allclose(mu_brk[:, 0], mu_brk[:, 1])
    W, B, _, _ = m.expanded_parameters(4)
    torch.testing.assert_close(B[:, 0] - B[:, 3], -2 * m.B_brk.expand(5, -1, -1))  # linspace(-1, 1, 4) ends
    fixed = GenerativeMatrixRouting(3, 4, 2, n_inp=5, n_out=3)
    with pytest.raises(ValueError, match="n_out is fixed"):
        fixed(a, mu, n_out=4)


def _ref_gmr(a, mu, W, B, bu, bi, T, p_model, eps):
    """Independent loop-based float re-derivation of Heinsen (2019), from the paper's equations."""
    I, C, D = mu.shape
    J, E = W.shape[1], W.shape[3]
    mu, W, B, a, bu, bi = (x.tolist() for x in (mu, W, B, a, bu, bi))
    V = [
        [
            [[sum(mu[i][c][d] * W[i][j][d][e] for d in range(D)) + B[i][j][c][e] for e in range(E)] for c in range(C)]
            for j in range(J)
        ]
        for i in range(I)
    ]
    f = [1 / (1 + math.exp(-a[i])) for i in range(I)]
    hist, a_out, logp = [], None, None
    for t in range(T):
        R = [[0.0] * J for _ in range(I)]
        for i in range(I):
            if t == 0:
                R[i] = [1 / J] * J
            else:
                z = [-math.log1p(math.exp(-a_out[j])) + logp[i][j] for j in range(J)]
                mx = max(z)
                ex = [math.exp(v - mx) for v in z]
                R[i] = [v / sum(ex) for v in ex]
        Du = [[f[i] * R[i][j] for j in range(J)] for i in range(I)]
        Di = [[f[i] - Du[i][j] for j in range(J)] for i in range(I)]
        a_out = [sum(bu[i][j] * Du[i][j] - bi[i][j] * Di[i][j] for i in range(I)) for j in range(J)]
        mu_out = [[[0.0] * E for _ in range(C)] for _ in range(J)]
        sigma2 = [[[0.0] * E for _ in range(C)] for _ in range(J)]
        for j in range(J):
            s = sum(Du[i][j] for i in range(I)) + eps
            for c in range(C):
                for e in range(E):
                    m_ = sum(Du[i][j] * V[i][j][c][e] for i in range(I)) / s
                    mu_out[j][c][e] = m_
                    sigma2[j][c][e] = sum(Du[i][j] * (V[i][j][c][e] - m_) ** 2 for i in range(I)) / s + eps
        logp = [[0.0] * J for _ in range(I)]
        for i in range(I):
            sq = [sum((V[i][j][c][e] - mu_out[j][c][e]) ** 2 for c in range(C) for e in range(E)) for j in range(J)]
            if p_model == "gaussian":
                for j in range(J):
                    logp[i][j] = -sum(
                        (V[i][j][c][e] - mu_out[j][c][e]) ** 2 / (2 * sigma2[j][c][e]) + 0.5 * math.log(sigma2[j][c][e])
                        for c in range(C)
                        for e in range(E)
                    )
            else:
                lse = math.log(sum(math.exp(-s) for s in sq))
                logp[i] = [-sq[j] - lse for j in range(J)]
        hist.append(dict(R=R, Du=Du, Di=Di, a_out=a_out, mu=mu_out, sigma2=sigma2, logp=logp))
    return hist


@pytest.mark.parametrize("p_model", ["gaussian", "skm"])
@pytest.mark.parametrize("I", [2, 3])
def test_gmr_tiny_case_matches_loop_rederivation(p_model, I):
    torch.manual_seed(1)
    C, D, E, J, T, eps = 2, 2, 3, 2, 3, 1e-5
    m = randomize_(GenerativeMatrixRouting(C, D, E, n_inp=I, n_out=J, iterations=T, p_model=p_model), 0.7).double()
    a = torch.randn(I, dtype=torch.float64)
    mu = torch.randn(I, C, D, dtype=torch.float64)
    (a_out, mu_out, sigma2), tr = m(a, mu, return_routing=True)
    ref = _ref_gmr(a, mu, m.W, m.B, m.beta_use, m.beta_ign, T, p_model, eps)
    d = torch.float64
    for t in range(T):
        torch.testing.assert_close(tr.coefficients[t], torch.tensor(ref[t]["R"], dtype=d))  # E-step
        torch.testing.assert_close(tr.extra["D_use"][t], torch.tensor(ref[t]["Du"], dtype=d))  # D-step
        torch.testing.assert_close(tr.extra["D_ign"][t], torch.tensor(ref[t]["Di"], dtype=d))
        torch.testing.assert_close(tr.activations[t], torch.tensor(ref[t]["a_out"], dtype=d))  # M-step
        torch.testing.assert_close(tr.outputs[t], torch.tensor(ref[t]["mu"], dtype=d))
        torch.testing.assert_close(tr.extra["sigma2"][t], torch.tensor(ref[t]["sigma2"], dtype=d))
        torch.testing.assert_close(tr.agreements[t], torch.tensor(ref[t]["logp"], dtype=d))
    torch.testing.assert_close(a_out, torch.tensor(ref[-1]["a_out"], dtype=d))
    torch.testing.assert_close(sigma2, torch.tensor(ref[-1]["sigma2"], dtype=d))
    # the functional form with the module's parameters is the same computation
    fa, fmu, fs = generative_matrix_routing(a, mu, m.W, m.B, m.beta_use, m.beta_ign, T, p_model, eps)
    torch.testing.assert_close(fmu, mu_out)


def test_gmr_permutation_equivariance():
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, n_inp=6, n_out=4), 0.5).double()
    a, mu = gmr_inputs(2, n=6, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    ref = m(a, mu)
    # permuting inputs together with their per-input parameters leaves the outputs unchanged
    out = generative_matrix_routing(
        a[:, perm], mu[:, perm], m.W[perm], m.B[perm], m.beta_use[perm], m.beta_ign[perm], m.iterations
    )
    for x, y in zip(ref, out):
        torch.testing.assert_close(x, y)
    # permuting inputs alone changes them (the weights are per input) ...
    assert not torch.allclose(m(a[:, perm], mu[:, perm])[1], ref[1])
    # ... and permuting the outputs' parameters permutes the outputs
    pj = torch.tensor([2, 0, 3, 1])
    out = generative_matrix_routing(a, mu, m.W[:, pj], m.B[:, pj], m.beta_use[:, pj], m.beta_ign[:, pj], m.iterations)
    for x, y, k in zip(ref, out, (1, 3, 3)):
        torch.testing.assert_close(x.index_select(x.dim() - k, pj), y)
    # with shared weights (variable n_inp), permuting the inputs alone leaves the outputs unchanged
    s = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=4), 0.5).double()
    for x, y in zip(s(a, mu), s(a[:, perm], mu[:, perm])):
        torch.testing.assert_close(x, y)


def test_gmr_inputs_with_score_minus_inf_have_no_influence():
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=3), 0.5)
    a, mu = gmr_inputs(2, n=6)
    a = a.clone()
    a[:, 4:] = float("-inf")  # padding, as logit(mask) in the SST model
    a[:, 0] = float("inf")
    ref = m(a, mu)
    mu2 = mu.clone()
    mu2[:, 4:] = torch.randn(2, 2, 3, 4) * 100
    for x, y in zip(ref, m(a, mu2)):
        torch.testing.assert_close(x, y)
        assert all_finite(x)
    # and they do not change the result compared with dropping them
    for x, y in zip(ref, m(a[:, :4], mu[:, :4])):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("n_inp", [5, -1])  # -1: W shared by all inputs, the moments path
@pytest.mark.parametrize("p_model", ["gaussian", "skm"])
@pytest.mark.parametrize("case", ["zeros", "x1e3", "fp16", "autocast_bf16", "autocast_fp16", "all_masked"])
def test_gmr_numerics(p_model, case, n_inp):
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, n_inp=n_inp, n_out=3, p_model=p_model), 0.5)
    a, mu = gmr_inputs(2)
    a, mu = a.requires_grad_(), mu.requires_grad_()
    ctx = torch.autocast(
        "cpu", dtype=torch.bfloat16 if case == "autocast_bf16" else torch.float16, enabled=case.startswith("autocast")
    )
    with ctx:
        if case == "zeros":
            out = m(a * 0, mu * 0)
        elif case == "x1e3":
            out = m(a * 1e3, mu * 1e3)
        elif case == "fp16":
            out = m(a.half(), mu.half())
            assert all(o.dtype == torch.float16 for o in out)
        elif case == "all_masked":
            out = m(torch.full_like(a, float("-inf")) + 0 * a, mu)
        else:
            out = m(a, mu)
            assert all(o.dtype == AUTOCAST_OUT.get(case, torch.float32) for o in out)  # the autocast dtype
    assert all_finite(*out)
    sum(o.float().sum() for o in out).backward()
    assert all_finite(a.grad, mu.grad, *(p.grad for p in m.parameters()))


@pytest.mark.parametrize("kw", [dict(n_inp=5, n_out=3), dict(n_out=3), dict(n_inp=5), dict(single_beta=True)])
def test_gmr_every_parameter_gets_a_gradient(kw):
    m = GenerativeMatrixRouting(3, 4, 2, **kw)  # default (paper) init: B = B_brk = betas = 0
    a, mu = gmr_inputs(2)
    g = torch.Generator().manual_seed(3)
    a_out, mu_out, sigma2 = m(a, mu, n_out=None if kw.get("n_out") else 3)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in (a_out, mu_out, sigma2))
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


@pytest.mark.parametrize("p_model", ["gaussian", "skm"])
@pytest.mark.parametrize("kw", [dict(n_out=6), dict(n_out=-1), dict(n_out=6, single_beta=True)])
@pytest.mark.parametrize("iterations", [1, 3])
def test_gmr_moments_path_equals_votes_path_in_float64(p_model, kw, iterations):
    """With W, B and the betas shared by all inputs, the routing runs on weighted moments of the inputs without
    forming the votes; in float64 it is the same function: outputs and every gradient to 1e-9. The inputs sit
    far from the origin (mean 3) so that the centring matters."""
    torch.manual_seed(0)
    m = randomize_(GenerativeMatrixRouting(3, 4, 2, iterations=iterations, p_model=p_model, **kw), 0.5).double()
    a = torch.randn(2, 3, 40, dtype=torch.float64, requires_grad=True)  # two leading dims
    mu = (torch.randn(2, 3, 40, 3, 4, dtype=torch.float64) + 3.0).requires_grad_(True)
    n_out = 6 if kw["n_out"] == -1 else None
    res = {}
    for method in ("votes", "moments"):
        m.method = method
        out = m(a, mu, n_out=n_out)
        g = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in out)
        res[method] = (out, torch.autograd.grad(loss, [a, mu, *m.parameters()]))
    for x, y in zip(res["moments"][0], res["votes"][0]):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    for x, y in zip(res["moments"][1], res["votes"][1]):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    assert res["votes"][0][1].std() > 0.1  # the outputs are not trivial


def test_gmr_method_auto_and_its_errors():
    shared = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=3), 0.5)
    per_input = randomize_(GenerativeMatrixRouting(3, 4, 2, n_inp=5, n_out=3), 0.5)
    a, mu = gmr_inputs(2)
    (_, _, _), trace = shared(a, mu, return_routing=True)  # a trace holds the votes: auto takes the votes path
    assert trace.extra["votes"].shape == (2, 5, 3, 3, 2)
    for x, y in zip(shared(a, mu), generative_matrix_routing(a, mu, *shared.expanded_parameters(), method="votes")):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)  # auto = moments here, float32
    per_input.method = "moments"
    with pytest.raises(ValueError, match="method='moments' needs W, B, beta_use and beta_ign shared"):
        per_input(a, mu)
    shared.method = "moments"
    with pytest.raises(ValueError, match="return_routing=False"):
        shared(a, mu, return_routing=True)
    with pytest.raises(ValueError, match="method must be one of"):
        GenerativeMatrixRouting(3, 4, 2, method="fast")


def test_gmr_moments_path_never_forms_the_votes():
    """The smallNORB model's first routing (W shared by all inputs): working memory of a forward + backward about the
    size of the float32 votes, though the moments path runs in float64 (#35; its ``[B, I, J]`` tensors take 8 bytes),
    and far below the votes path's, which allocates the votes several times over (about 9x more here)."""
    from capsule_lib.cost import peak_memory

    m = GenerativeMatrixRouting(4, 4, 4, n_out=64)
    a = torch.randn(2, 2000, requires_grad=True)
    mu = torch.randn(2, 2000, 4, 4, requires_grad=True)
    votes_bytes = 2 * 2000 * 64 * 16 * 4  # [B, I, J, 4, 4] float32 = 16 MiB

    def step(method):
        m.method = method
        return peak_memory(lambda: sum(o.sum() for o in m(a, mu)).backward(), torch.device("cpu"))

    moments, votes = step("moments"), step("votes")
    assert moments < 1.5 * votes_bytes < 4 * votes_bytes < votes and votes > 5 * moments, (moments, votes)


def test_gmr_moments_path_on_a_trained_network_in_float32():
    """The expanded squares of the moments path can lose digits in float32 when a Gaussian is much tighter than
    the spread of the inputs; on the shipped smallNORB network (real trained poses) its outputs stay as close to
    a float64 reference as the votes path's, and the class scores and predictions are the same."""
    from capsule_lib.data.viewpoints import viewpoint_sweep
    from capsule_lib.pretrained import load_pretrained

    model, _ = load_pretrained("heinsen_norb_seed0")
    model.eval()
    images = torch.cat(
        [viewpoint_sweep("rendered_norb", category=c, instance=0, azimuths=[0, 8], size=48).images for c in range(5)]
    )
    images = images.float() / 255
    r1 = model.routings[0]
    with torch.no_grad():
        a, mu = model.part_capsules(images)
        ref = generative_matrix_routing(
            a.double(), mu.double(), *(p.double() for p in r1.expanded_parameters()), method="votes"
        )
        errors = {}
        for method in ("votes", "moments"):
            out = generative_matrix_routing(a, mu, *r1.expanded_parameters(), method=method)
            errors[method] = max(float((o.double() - g).abs().max() / g.abs().max()) for o, g in zip(out, ref))
        scores = {}
        for method in ("votes", "moments"):
            r1.method = method
            scores[method] = model(images).scores
    assert errors["moments"] < max(10 * errors["votes"], 1e-5), errors
    torch.testing.assert_close(scores["moments"], scores["votes"], rtol=1e-4, atol=1e-4)
    assert scores["moments"].argmax(-1).equal(scores["votes"].argmax(-1))


def test_gmr_bad_shapes_raise():
    m = GenerativeMatrixRouting(3, 4, 2, n_inp=5, n_out=3)
    a, mu = gmr_inputs(2)
    with pytest.raises(ValueError, match=r"mu_inp: expected shape \[\.\.\., n_inp=5, d_cov=3, d_inp=4\]"):
        m(a, mu[..., :3])
    with pytest.raises(ValueError, match=r"mu_inp: expected shape \[\.\.\., n_inp=5"):
        m(a[:, :4], mu[:, :4])
    with pytest.raises(ValueError, match=r"a_inp: expected shape \[\.\.\., n_inp\]"):
        m(a[:1], mu)
    with pytest.raises(ValueError, match="floating-point"):
        m(a.long(), mu)
    with pytest.raises(ValueError, match=r"W: expected shape \[n_inp=5 or 1"):
        generative_matrix_routing(
            a, mu, torch.zeros(4, 3, 4, 2), torch.zeros(1, 3, 3, 2), torch.zeros(1, 3), torch.zeros(1, 3)
        )
    with pytest.raises(ValueError, match=r"B: expected shape"):
        generative_matrix_routing(
            a, mu, torch.zeros(1, 3, 4, 2), torch.zeros(1, 3, 2, 2), torch.zeros(1, 3), torch.zeros(1, 3)
        )
    with pytest.raises(ValueError, match="p_model"):
        GenerativeMatrixRouting(3, 4, 2, p_model="em")
    with pytest.raises(ValueError, match="iterations"):
        GenerativeMatrixRouting(3, 4, 2, iterations=0)


def test_gmr_determinism():
    def run():
        torch.manual_seed(123)
        m = GenerativeMatrixRouting(3, 4, 2, n_inp=5, n_out=3)
        return m(*gmr_inputs(2)), m.W.detach().clone()

    (o1, w1), (o2, w2) = run(), run()
    assert torch.equal(w1, w2)
    for x, y in zip(o1, o2):
        assert torch.equal(x, y)


# ============================================================================ 2022: efficient vector routing
def evr_input(*lead, n=6, d=8, seed=0, dtype=torch.float32):
    return torch.randn(*lead, n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_evr_parameters_and_inits():
    torch.manual_seed(0)
    d_inp, d_out, J, I = 256, 64, 40, 300
    m = EfficientVectorRouting(I, J, d_inp, d_out)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {
        "W_A": (I, d_inp),
        "B_A": (I,),
        "W_F1": (J, d_inp),
        "W_F2": (d_inp, d_out),
        "B_F2": (J, d_out),
        "W_G1": (d_out, d_inp),
        "W_G2": (J, d_inp),
        "B_G2": (J, d_inp),
        "W_S": (I, J),
        "B_S": (I, J),
        "beta_use": (I, J),
        "beta_ign": (I, J),
    }
    stds = {
        "W_A": 2 / d_inp**0.5,
        "W_F1": 1.0,
        "W_F2": 2 / d_inp**0.5,
        "W_G1": 1 / d_out**0.5,
        "W_G2": 1.0,
        "W_S": 1 / d_inp**0.5,
        "beta_use": 1.0,
        "beta_ign": 1.0,
    }
    for k, s in stds.items():
        assert abs(getattr(m, k).std().item() / s - 1) < 0.05, k
    for k in ("B_A", "B_F2", "B_G2", "B_S"):
        assert not getattr(m, k).any(), k
    v = EfficientVectorRouting(-1, J, d_inp, d_out)
    assert v.W_A.shape == (1, d_inp) and v.B_A.shape == (1,) and v.W_S.shape == (1, J)
    assert not hasattr(v, "beta_use") and isinstance(v.compute_beta_use, torch.nn.Linear)
    assert v.compute_beta_ign.weight.shape == (J, d_inp)
    with pytest.raises(ValueError, match="n_out must be >= 2"):
        EfficientVectorRouting(5, 1, 4, 4)


@pytest.mark.parametrize("n_inp", [6, -1])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_evr_coefficients_and_trace(n_inp, iterations):
    m = EfficientVectorRouting(n_inp, 3, 8, 5, iterations=iterations)
    x = evr_input(2)
    out, tr = m(x, return_routing=True)  # iterations = 1 works (the public return_dict path raises there)
    assert out.shape == (2, 3, 5) and tr.iterations == iterations and tr.algorithm == "heinsen_2022"
    torch.testing.assert_close(tr.coefficients[0], torch.full((2, 6, 3), 1 / 3))
    for t in range(iterations):
        R = tr.coefficients[t]
        torch.testing.assert_close(R.sum(-1), torch.ones(2, 6))
        assert tr.agreements[t].shape == (2, 6, 3) and bool((tr.agreements[t] <= 0).all())  # log-sigmoids
        if t > 0:
            torch.testing.assert_close(R, torch.softmax(tr.agreements[t - 1], -1))
        f = torch.sigmoid(tr.extra["a_inp"])[..., None]
        torch.testing.assert_close(tr.extra["D_use"][t], f * R)
        assert tr.extra["phi"][t].shape == (2, 6, 3)
    torch.testing.assert_close(tr.outputs[-1], out)
    assert tr.extra["a_inp"].shape == (2, 6)


@pytest.mark.parametrize("lead", [(1,), (3,), (2, 3), ()])
@pytest.mark.parametrize("d_out", [5, 1])
def test_evr_shapes(lead, d_out):
    m = EfficientVectorRouting(6, 4, 8, d_out)
    assert m(evr_input(*lead)).shape == (*lead, 4, d_out)


def test_evr_variable_n_inp():
    m = EfficientVectorRouting(-1, 4, 8, 5)
    outs = [m(evr_input(2, n=n, seed=n)) for n in (1, 3, 11)]
    assert all(o.shape == (2, 4, 5) for o in outs)
    fixed = EfficientVectorRouting(6, 4, 8, 5)
    with pytest.raises(ValueError, match=r"x_inp: expected shape \[\.\.\., n_inp=6, d_inp=8\]"):
        fixed(evr_input(2, n=5))


def test_evr_memory_efficient_equals_materialised_votes():
    m = randomize_(EfficientVectorRouting(6, 4, 8, 5, iterations=3), 0.5).double()
    x = evr_input(2, dtype=torch.float64)
    lazy = m(x)
    m.memory_efficient = False
    full, tr = m(x, return_routing=True)
    torch.testing.assert_close(lazy, full)
    assert tr.extra["V"].shape == (2, 6, 4, 5)


def _ref_evr(x, p, T, normalize, eps=1e-5):
    """Independent loop-based re-derivation of Heinsen (2022) (spec section 4.2) with python floats."""
    x = x.tolist()
    P = {k: v.tolist() for k, v in p.items()}
    I, D = len(x), len(x[0])
    J, E = len(P["B_F2"]), len(P["B_F2"][0])
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731

    def N(v):
        if len(v) == 1:
            return list(v)
        m = sum(v) / len(v)
        var = sum((u - m) ** 2 for u in v) / len(v)
        return [(u - m) / math.sqrt(var + eps) for u in v]

    xs = [[x[i][d] / math.sqrt(I) for d in range(D)] for i in range(I)]
    a = [sum(xs[i][d] * P["W_A"][i][d] for d in range(D)) + P["B_A"][i] for i in range(I)]
    V = [
        [
            [sum(xs[i][d] * P["W_F1"][j][d] * P["W_F2"][d][e] for d in range(D)) + P["B_F2"][j][e] for e in range(E)]
            for j in range(J)
        ]
        for i in range(I)
    ]
    hist, S = [], None
    for t in range(T):
        if t == 0:
            R = [[1 / J] * J for _ in range(I)]
        else:
            R = []
            for i in range(I):
                ex = [math.exp(S[i][j]) for j in range(J)]
                R.append([v / sum(ex) for v in ex])
        Du = [[sig(a[i]) * R[i][j] for j in range(J)] for i in range(I)]
        Di = [[sig(a[i]) - Du[i][j] for j in range(J)] for i in range(I)]
        phi = [[P["beta_use"][i][j] * Du[i][j] - P["beta_ign"][i][j] * Di[i][j] for j in range(J)] for i in range(I)]
        x_out = [[sum(phi[i][j] * V[i][j][e] for i in range(I)) for e in range(E)] for j in range(J)]
        pred = []
        for j in range(J):
            n = N(x_out[j])
            pred.append(
                [sum(n[e] * P["W_G1"][e][d] for e in range(E)) * P["W_G2"][j][d] + P["B_G2"][j][d] for d in range(D)]
            )
        S = [
            [
                -math.log1p(math.exp(-(sum(x[i][d] * pred[j][d] for d in range(D)) * P["W_S"][i][j] + P["B_S"][i][j])))
                for j in range(J)
            ]
            for i in range(I)
        ]
        hist.append(dict(R=R, phi=phi, S=S, x_out=[N(v) for v in x_out] if normalize else x_out))
    return hist


@pytest.mark.parametrize("I", [2, 3])
@pytest.mark.parametrize("normalize", [True, False])
def test_evr_tiny_case_matches_loop_rederivation(I, normalize):
    T = 3
    m = randomize_(EfficientVectorRouting(I, 2, 3, 4, iterations=T, normalize=normalize), 0.8, seed=I).double()
    x = evr_input(n=I, d=3, seed=5, dtype=torch.float64)
    out, tr = m(x, return_routing=True)
    ref = _ref_evr(x, dict(m.named_parameters()), T, normalize)
    d = torch.float64
    for t in range(T):
        torch.testing.assert_close(tr.coefficients[t], torch.tensor(ref[t]["R"], dtype=d))
        torch.testing.assert_close(tr.extra["phi"][t], torch.tensor(ref[t]["phi"], dtype=d))
        torch.testing.assert_close(tr.agreements[t], torch.tensor(ref[t]["S"], dtype=d))
        torch.testing.assert_close(tr.outputs[t], torch.tensor(ref[t]["x_out"], dtype=d))
    torch.testing.assert_close(out, torch.tensor(ref[-1]["x_out"], dtype=d))
    # the functional form is the same computation
    p = dict(m.named_parameters())
    f = efficient_vector_routing(x, m, p["beta_use"], p["beta_ign"], T, normalize=normalize)  # the layer's weights
    torch.testing.assert_close(f, out)
    weights = VectorRoutingWeights(*(p[name] for name in VectorRoutingWeights._fields))  # or grouped by hand
    torch.testing.assert_close(
        efficient_vector_routing(x, weights, p["beta_use"], p["beta_ign"], T, normalize=normalize), out
    )


def test_evr_permutation_equivariance():
    m = randomize_(EfficientVectorRouting(6, 4, 8, 5), 0.5).double()
    x = evr_input(2, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    p = dict(m.named_parameters())
    per_input = {"W_A", "B_A", "W_S", "B_S"}  # the weights with an input axis, permuted with the inputs
    weights = VectorRoutingWeights(*(p[n][perm] if n in per_input else p[n] for n in VectorRoutingWeights._fields))
    out = efficient_vector_routing(
        x[:, perm],
        weights,
        p["beta_use"][perm],
        p["beta_ign"][perm],
        m.iterations,
    )
    torch.testing.assert_close(out, m(x))
    assert not torch.allclose(m(x[:, perm]), m(x))
    v = randomize_(EfficientVectorRouting(-1, 4, 8, 5), 0.5).double()
    torch.testing.assert_close(v(x[:, perm]), v(x))


@pytest.mark.parametrize("n_inp", [6, -1])
@pytest.mark.parametrize("memory_efficient", [True, False])
def test_evr_padding_mask_inputs_have_no_influence(n_inp, memory_efficient):
    m = randomize_(EfficientVectorRouting(n_inp, 4, 8, 5, iterations=3, memory_efficient=memory_efficient), 0.5)
    x = evr_input(2)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    pad[1, 1] = True
    out, tr = m(x, mask=pad[..., None], return_routing=True)  # [B, I, 1] broadcasts over the outputs
    x2 = x.clone()
    x2[pad] = torch.randn(int(pad.sum()), 8) * 1e3
    out2 = m(x2, mask=pad[..., None])
    torch.testing.assert_close(out, out2)
    assert all_finite(out)
    for R, phi in zip(tr.coefficients, tr.extra["phi"]):
        assert not R[pad].any() and not phi[pad].any()  # ignored by every output: all-zero shares
        torch.testing.assert_close(R[~pad].sum(-1), torch.ones(int((~pad).sum())))
    assert not torch.allclose(m(x2), m(x))  # without the mask the same change does matter


def test_evr_pairwise_mask():
    m = randomize_(EfficientVectorRouting(5, 3, 8, 4, iterations=3), 0.5)
    x = evr_input(2, n=5)
    mask = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)  # [I, J]
    out, tr = m(x, mask=mask, return_routing=True)
    assert all_finite(out)
    for R, phi, Du, Di in zip(tr.coefficients, tr.extra["phi"], tr.extra["D_use"], tr.extra["D_ign"]):
        for T_ in (R, phi, Du, Di):
            assert not T_[:, mask].any()
        torch.testing.assert_close(R.sum(-1), torch.ones(2, 5))  # over the unmasked outputs
    torch.testing.assert_close(tr.coefficients[0][0, 3], torch.tensor([0.0, 0.0, 1.0]))
    # with one iteration, output j only sees the inputs unmasked for j
    one = randomize_(EfficientVectorRouting(5, 3, 8, 4, iterations=1), 0.5)
    x2 = x.clone()
    x2[:, 0] += 10.0  # input 0 is masked for output 0 only
    y1, y2 = one(x, mask=mask), one(x2, mask=mask)
    torch.testing.assert_close(y1[:, 0], y2[:, 0])
    assert not torch.allclose(y1[:, 1], y2[:, 1])
    # a per-example mask [B, I, J]
    bm = torch.stack([mask, mask.roll(1, dims=1)])
    yb = m(x, mask=bm)
    torch.testing.assert_close(yb[:1], m(x[:1], mask=mask))
    torch.testing.assert_close(yb[1:], m(x[1:], mask=mask.roll(1, dims=1)))


def test_evr_mask_validation():
    m = EfficientVectorRouting(5, 3, 8, 4)
    x = evr_input(2, n=5)
    with pytest.raises(ValueError, match=r"mask: expected a bool tensor"):
        m(x, mask=torch.zeros(5, 3))
    with pytest.raises(ValueError, match=r"mask: expected shape \[n_inp=5, n_out=3\]"):
        m(x, mask=torch.zeros(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask: expected shape"):
        m(x, mask=torch.zeros(4, 2, 5, 3, dtype=torch.bool))  # may not add batch dims


@pytest.mark.parametrize("n_inp", [6, -1])
@pytest.mark.parametrize("case", ["zeros", "x1e3", "fp16", "autocast_bf16", "autocast_fp16", "masked"])
def test_evr_numerics(n_inp, case):
    m = EfficientVectorRouting(n_inp, 4, 8, 5)
    x = evr_input(2).requires_grad_()
    mask = None
    ctx = torch.autocast(
        "cpu", dtype=torch.bfloat16 if case == "autocast_bf16" else torch.float16, enabled=case.startswith("autocast")
    )
    with ctx:
        if case == "zeros":
            out = m(x * 0)
        elif case == "x1e3":
            out = m(x * 1e3)
        elif case == "fp16":
            out = m(x.half())
            assert out.dtype == torch.float16
        elif case == "masked":  # every input of output 0 masked, one input masked everywhere
            mask = torch.zeros(6, 4, dtype=torch.bool)
            mask[:, 0] = True
            mask[2] = True
            out = m(x, mask=mask)
        else:
            out = m(x)
            assert out.dtype == AUTOCAST_OUT.get(case, torch.float32)  # outputs in the autocast dtype
    assert all_finite(out)
    out.float().sum().backward()
    assert all_finite(x.grad, *(p.grad for p in m.parameters() if p.grad is not None))


@pytest.mark.parametrize("n_inp", [6, -1])
def test_evr_every_parameter_gets_a_gradient(n_inp):
    m = EfficientVectorRouting(n_inp, 4, 8, 5, iterations=2)
    out = m(evr_input(2))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


def test_evr_determinism():
    def run():
        torch.manual_seed(7)
        m = EfficientVectorRouting(-1, 4, 8, 5)
        return m(evr_input(2))

    assert torch.equal(run(), run())


# ============================================================================ models
def test_coordinate_channels():
    g = coordinate_channels(3, 5)
    assert g.shape == (2, 3, 5)
    torch.testing.assert_close(g[0, :, 0], torch.tensor([-1.0, 0.0, 1.0]))  # down the rows
    torch.testing.assert_close(g[0, 1], torch.zeros(5))
    torch.testing.assert_close(g[1, 2], torch.linspace(-1, 1, 5))  # across the columns
    x = torch.rand(4, 2, 3, 5)
    y = add_coordinate_channels(x)
    assert y.shape == (4, 4, 3, 5) and torch.equal(y[:, :2], x) and torch.equal(y[1, 2:], g)


def test_smallnorb_parameter_count_and_layout():
    m = SmallNORBClassifier()
    assert n_params(m) == 271_688
    assert n_params(m.routings[0]) == 2_176 and n_params(m.routings[1]) == 10_880
    assert m.routings[0].W.shape == (1, 64, 4, 4)  # shared across all 5184 inputs
    convs = [mod for mod in m.convolve if isinstance(mod, torch.nn.Conv2d)]
    assert [c.stride[0] for c in convs] == [1, 2, 1, 2, 1, 2] and convs[0].in_channels == 4
    assert all(c.padding == (0, 0) and c.kernel_size == (3, 3) for c in convs)
    assert all(not c.bias.any() for c in convs)
    # the original module names, so that the published state_dict loads
    keys = set(m.state_dict())
    assert {
        "convolve.0.weight",
        "convolve.1.weight",
        "convolve.16.bias",
        "compute_a.1.weight",
        "compute_mu.1.weight",
        "routings.0.W",
        "routings.0.CONST_one",
        "routings.1.beta_ign",
    } <= keys


def test_smallnorb_forward_96():
    torch.manual_seed(0)
    m = SmallNORBClassifier().eval()
    x = torch.rand(1, 2, 96, 96)
    a, mu = m.part_capsules(x)
    assert a.shape == (1, 5184) and mu.shape == (1, 5184, 4, 4)
    # part-major then (y, x): part p at position (y, x) is capsule p * 81 + y * 9 + x
    with torch.no_grad():
        feat = m.convolve(add_coordinate_channels(x))
        mu_map = m.compute_mu(feat).view(1, 64, 4, 4, 9, 9)
        torch.testing.assert_close(mu[0, 3 * 81 + 2 * 9 + 7], mu_map[0, 3, :, :, 2, 7])
        out = m(x, return_routing=True)
    assert out.scores.shape == (1, 5) and out.poses.shape == (1, 5, 16)
    assert out.extra["sigma2"].shape == (1, 5, 4, 4) and all_finite(out.scores, out.poses)
    assert out.trace is out.extra["traces"][1] and out.extra["traces"][0].coefficients[0].shape == (1, 5184, 64)
    with pytest.raises(ValueError, match=r"^SmallNORBClassifier: images: expected shape \[B, 2, 96, 96\]"):
        m(torch.rand(1, 2, 64, 64))


def test_smallnorb_gradients_small_images():
    torch.manual_seed(0)
    m = SmallNORBClassifier(SmallNORBConfig(image_size=40))  # any size works: the first routing has a variable n_inp
    out = m(torch.rand(2, 2, 40, 40))
    g = torch.Generator().manual_seed(1)
    loss = (
        soft_target_cross_entropy(out.scores, torch.tensor([1, 3]))
        + (out.poses * torch.randn(out.poses.shape, generator=g)).sum()
        + out.extra["sigma2"].sum()
    )
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and all_finite(p.grad) and bool(p.grad.abs().sum() > 0), name


def test_smallnorb_coordinates_added_by_the_data_pipeline():
    torch.manual_seed(0)
    inside = SmallNORBClassifier(image_size=32).eval()
    outside = SmallNORBClassifier(SmallNORBConfig(image_size=32, in_channels=4, coord_channels=False)).eval()
    assert n_params(outside) == n_params(inside)
    outside.load_state_dict(inside.state_dict())
    x = torch.rand(2, 2, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(outside(add_coordinate_channels(x)).scores, inside(x).scores)
        torch.testing.assert_close(outside(add_coordinate_channels(x)).poses, inside(x).poses)


@pytest.mark.parametrize("n_classes,count", [(5, 140_480), (2, 138_944)])
def test_sequence_head_parameter_counts(n_classes, count):
    h = SequenceClassifierHead(SequenceClassifierConfig(n_classes=n_classes))  # d_depth=37, d_emb=1280, ...
    assert n_params(h) == count
    assert h.depth_emb.shape == (37, 1280) and not h.depth_emb.any()
    assert h.routings[0].W.shape == (1, 64, 64, 2)


def test_sequence_head_padding_gradients_and_variants():
    torch.manual_seed(0)
    cfg = SequenceClassifierConfig(d_depth=3, d_emb=16, d_inp=8, d_out=2, n_parts=6, n_classes=3)
    h = SequenceClassifierHead(cfg)
    randomize_(h.routings[1], 0.5)  # nonzero betas so that the logits depend on the tokens
    embs = torch.randn(2, 5, 3, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    out = h(embs, pad, return_routing=True)
    assert out.scores.shape == (2, 3) and out.poses.shape == (2, 3, 2) and all_finite(out.scores)
    assert out.extra["traces"][0].coefficients[0].shape == (2, 15, 6)
    embs2 = embs.clone()
    embs2[1, 3:] = torch.randn(2, 3, 16) * 100  # change the padding only
    out2 = h(embs2, pad)
    torch.testing.assert_close(out.scores, out2.scores)
    torch.testing.assert_close(out.poses, out2.poses)
    torch.testing.assert_close(h(embs, token_weights=(~pad).float()).scores, out.scores)
    # the padded example equals the same example without its padding
    torch.testing.assert_close(h(embs[1:, :3]).scores, out.scores[1:])
    loss = soft_target_cross_entropy(out.scores, torch.tensor([0, 2])) + out.poses.sum() + out.extra["sigma2"].sum()
    loss.backward()
    for name, p in h.named_parameters():
        assert p.grad is not None and all_finite(p.grad) and bool(p.grad.abs().sum() > 0), name
    flat = SequenceClassifierHead(cfg, d_depth=None)
    assert flat.depth_emb is None and flat(torch.randn(2, 4, 16)).scores.shape == (2, 3)
    with pytest.raises(ValueError, match=r"embs: expected shape \[B, n, d_depth=3, d_emb=16\]"):
        h(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"padding_mask: expected a bool tensor of shape \[B, n\]"):
        h(embs, pad.float())


# ============================================================================ torch.compile
@pytest.mark.slow
def test_compile_matches_eager():
    """fullgraph=True: no graph breaks (no data-dependent Python control flow) in either routing."""
    torch.manual_seed(0)
    gm = randomize_(GenerativeMatrixRouting(3, 4, 2, n_out=3), 0.5)
    ev = EfficientVectorRouting(-1, 3, 8, 4)
    a, mu = gmr_inputs(2)
    x = evr_input(2)
    mask = torch.zeros(2, 6, 1, dtype=torch.bool)
    mask[1, 4:] = True
    for eager, args, kw in ((gm, (a, mu), {}), (ev, (x,), {"mask": mask})):
        compiled = torch.compile(eager, fullgraph=True)
        ref = eager(*args, **kw)
        got = compiled(*args, **kw)
        for r, g in zip(ref if isinstance(ref, tuple) else (ref,), got if isinstance(got, tuple) else (got,)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ the reference forms (first in each module)
def _grads(out, inputs):
    g = torch.Generator().manual_seed(7)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("shared,method", [(False, "votes"), (True, "votes"), (True, "moments")])
def test_generative_matrix_routing_equals_its_reference_in_float64(shared, method):
    """The paper's loop, a step per line, is what the library computes: every path (per-input weights, weights
    shared by all inputs, the CPU moments kernel), values and the gradients of every input and parameter."""
    g = torch.Generator().manual_seed(0)
    Bsz, I, J, C, D, E = 3, 7, 4, 2, 3, 5
    i1 = 1 if shared else I

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()

    a, mu = r(Bsz, I, scale=2.0), r(Bsz, I, C, D)
    W, B, bu, bi = r(i1, J, D, E, scale=0.5), r(i1, J, C, E, scale=0.3), r(i1, J), r(i1, J)
    inputs = (a, mu, W, B, bu, bi)
    ours = generative_matrix_routing(a, mu, W, B, bu, bi, 3, method=method)
    ref = generative_matrix_routing_reference(
        a, mu, W.expand(I, -1, -1, -1), B.expand(I, -1, -1, -1), bu.expand(I, -1), bi.expand(I, -1), 3
    )
    for x, y in zip(ours, ref):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)
    for x, y in zip(_grads(ours, inputs), _grads(ref, inputs)):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("memory_efficient", [True, False])
def test_efficient_vector_routing_equals_its_reference_in_float64(memory_efficient):
    m = randomize_(EfficientVectorRouting(6, 4, 5, 3, iterations=3, memory_efficient=memory_efficient), 0.5).double()
    x = torch.randn(2, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    params = [m.W_A, m.B_A, m.W_F1, m.W_F2, m.B_F2, m.W_G1, m.W_G2, m.B_G2, m.W_S, m.B_S, m.beta_use, m.beta_ign]
    ours = m(x)
    ref = efficient_vector_routing_reference(x, *params, iterations=3)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-11)
    for a, b in zip(_grads(ours, [x, *params]), _grads(ref, [x, *params])):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
