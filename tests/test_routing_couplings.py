"""Paik et al.'s (2019) baselines for every registered routing: fixed couplings, ``"uniform"`` or ``"random"``, in
one pass (``layer.route(..., couplings=...)``, ``build_routing(..., couplings=...)``, the comparison network's
``couplings``). For an iterative algorithm ``"uniform"`` is its first iteration, computed here by another path (the
layer's plain one-pass code against the algorithm's own loop, kernels included): checked in float64. (EM's pass runs,
by default, at its last iteration's inverse temperature: its first iteration with ``coupled_temperature="first"``.)"""

from __future__ import annotations

import pytest
import torch

from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig
from capsule_lib.routing import fixed_couplings
from capsule_lib.routing.kinds import ROUTING_KINDS, build_routing
from capsule_lib.types import COUPLINGS

KINDS = sorted(ROUTING_KINDS)
ITERATIVE = [k for k in KINDS if ROUTING_KINDS[k].iterations is not None]
B, I, J, D = 3, 12, 5, 16
#: the weights that only the E-step (the agreement) reads: a fixed-coupling pass gives them no gradient
AGREEMENT_ONLY = {"heinsen_2022": {"W_G1", "W_G2", "B_G2", "W_S", "B_S"}}


def _case(kind: str, dtype=torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    entry = ROUTING_KINDS[kind]
    layer = build_routing(kind, I, J, D).to(dtype)
    poses = torch.randn(B, I, D, dtype=dtype)
    poses = poses if entry.squash is None else entry.squash(poses)
    return layer, poses, entry.input_activations(torch.randn(B, I, dtype=dtype))


@pytest.mark.parametrize("kind", ITERATIVE)
def test_uniform_couplings_are_the_first_iteration(kind):
    layer, poses, acts = _case(kind)
    if hasattr(layer, "coupled_temperature"):
        layer.coupled_temperature = "first"  # EM: the first iteration's inverse temperature
    fixed, first = layer.route(poses, acts, couplings="uniform"), layer.route(poses, acts, iterations=1)
    torch.testing.assert_close(fixed.poses, first.poses, rtol=1e-12, atol=1e-12)
    if first.activations is not None:
        torch.testing.assert_close(fixed.activations, first.activations, rtol=1e-12, atol=1e-12)
    # and not the routed result: the later iterations change the outputs
    assert not torch.allclose(fixed.poses, layer.route(poses, acts).poses, atol=1e-6)


def test_em_fixed_couplings_run_at_the_last_iterations_inverse_temperature_by_default():
    """The routed EM layer computes its output at its last iteration's inverse temperature; its fixed-coupling pass
    does too (the same layer with its couplings held), which is one iteration of a layer whose temperature is fixed
    at that value, and not its first iteration (a colder start: 2.9 times smaller for 3 iterations)."""
    from capsule_lib.routing.em import EMRouting

    layer, poses, acts = _case("em")
    assert layer.coupled_temperature == "last"
    lam = layer.inverse_temperatures(layer.iterations)[-1]
    fixed_lam = EMRouting(I, J, 4, layer.iterations, inverse_temperature=lam).double()
    fixed_lam.load_state_dict(layer.state_dict())
    expected = fixed_lam.route(poses, acts, iterations=1)
    got = layer.route(poses, acts, couplings="uniform")
    torch.testing.assert_close(got.poses, expected.poses, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.activations, expected.activations, rtol=1e-12, atol=1e-12)
    assert lam / layer.inverse_temperatures(1)[0] == pytest.approx(0.143 / 0.05, rel=0.01)
    assert not torch.allclose(got.activations, layer.route(poses, acts, iterations=1).activations, atol=1e-6)
    with pytest.raises(ValueError, match=r"coupled_temperature must be one of \('last', 'first'\), got 'middle'"):
        EMRouting(I, J, 4, 3, coupled_temperature="middle")


def test_uniform_self_attention_routing_replaces_the_softmax_and_keeps_the_prior():
    """Self-attention routing has no iterations: ``"uniform"`` sets its couplings to 1/n_out in place of the softmax
    of the votes' agreement; the learned log prior is still added."""
    layer, poses, _ = _case("self_attention")
    with torch.no_grad():
        layer.log_prior.normal_()
    u = layer.votes(poses)  # [B, i, j, e]
    s = torch.einsum("ij,bije->bje", 1.0 / J + layer.prior(), u)
    n = s.norm(dim=-1, keepdim=True)
    expected = (1 - 1 / torch.exp(n)) * s / (n + layer.eps)  # squash_E (Mazzia et al., eq. 2)
    torch.testing.assert_close(layer.route(poses, couplings="uniform").poses, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(layer.route(poses, couplings="uniform").poses, layer.route(poses).poses, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["uniform", "random"])
def test_fixed_couplings_sum_to_one_over_the_parents_and_are_traced(kind, mode):
    layer, poses, acts = _case(kind)
    routed = layer.route(poses, acts, couplings=mode, return_routing=True)
    (R,) = routed.trace.coefficients
    assert R.shape == (B, I, J) and routed.trace.algorithm == kind and routed.trace.extra["couplings"] == mode
    torch.testing.assert_close(R.sum(-1), torch.ones(B, I, dtype=R.dtype), rtol=0, atol=1e-12)
    assert (R > 0).all() and (R < 1).all()
    assert routed.poses.shape == (B, J, D) and torch.isfinite(routed.poses).all()
    assert routed.trace.outputs[0] is routed.poses
    if mode == "uniform":
        assert torch.all(R == 1.0 / J)


@pytest.mark.parametrize("kind", KINDS)
def test_random_couplings_are_drawn_afresh_from_torchs_generator(kind):
    layer, poses, acts = _case(kind)
    torch.manual_seed(1)
    a = layer.route(poses, acts, couplings="random").poses
    b = layer.route(poses, acts, couplings="random").poses
    torch.manual_seed(1)
    torch.testing.assert_close(layer.route(poses, acts, couplings="random").poses, a, rtol=0, atol=0)
    assert not torch.allclose(a, b) and not torch.allclose(a, layer.route(poses, acts, couplings="uniform").poses)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["uniform", "random"])
def test_fixed_couplings_give_every_weight_the_pass_reads_a_finite_gradient(kind, mode):
    layer, poses, acts = _case(kind)
    poses.requires_grad_(True)
    routed = layer.route(poses, acts, couplings=mode)
    out = routed.poses.square().sum() + (0 if routed.activations is None else routed.activations.sum())
    out.backward()
    assert poses.grad is not None and torch.isfinite(poses.grad).all() and poses.grad.abs().sum() > 0
    unused = AGREEMENT_ONLY.get(kind, set())
    for name, p in layer.named_parameters():
        if name in unused:
            assert p.grad is None, f"{kind}.{name} is read only by the agreement step"
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{kind}.{name}"


@pytest.mark.parametrize("kind", KINDS)
def test_uniform_couplings_pass_gradcheck_in_float64(kind):
    torch.manual_seed(0)
    entry = ROUTING_KINDS[kind]
    layer = build_routing(kind, 4, 3, 4).double()
    poses = torch.randn(2, 4, 4, dtype=torch.float64)
    poses = (poses if entry.squash is None else entry.squash(poses)).detach().requires_grad_(True)
    acts = entry.input_activations(torch.randn(2, 4, dtype=torch.float64))

    def f(x):
        r = layer.route(x, acts, couplings="uniform")
        return r.poses if r.activations is None else (r.poses, r.activations)

    assert torch.autograd.gradcheck(f, (poses,), eps=1e-6, atol=1e-6)


def test_a_layer_built_with_fixed_couplings_uses_them_unless_a_call_names_others():
    torch.manual_seed(0)
    layer = build_routing("dynamic", I, J, D, couplings="uniform").double()
    poses = torch.randn(B, I, D, dtype=torch.float64)
    assert layer.couplings == "uniform"
    torch.testing.assert_close(layer.route(poses).poses, layer.route(poses, iterations=None, couplings="uniform").poses)
    torch.testing.assert_close(layer.route(poses, couplings="routed", iterations=1).poses, layer.route(poses).poses)
    assert build_routing("dynamic", I, J, D).couplings == "routed"


def test_bad_couplings_are_refused_in_one_line():
    layer, poses, _ = _case("dynamic")
    with pytest.raises(ValueError, match=r"couplings must be one of \('routed', 'uniform', 'random'\), got 'sorted'"):
        layer.route(poses, couplings="sorted")
    with pytest.raises(ValueError, match=r"couplings='uniform' route in one pass: pass iterations=None"):
        layer.route(poses, couplings="uniform", iterations=2)
    with pytest.raises(ValueError, match="couplings must be one of"):
        build_routing("em", I, J, D, couplings="learned")
    with pytest.raises(ValueError, match="couplings must be one of"):
        RoutingClassifierConfig(couplings="none")
    with pytest.raises(ValueError, match="fixed couplings must be one of"):
        fixed_couplings("routed", B, I, J, poses)
    assert COUPLINGS == ("routed", "uniform", "random")


@pytest.mark.parametrize("mode", ["uniform", "random"])
def test_the_comparison_network_trains_with_fixed_couplings(mode, adam_steps):
    """Paik et al.'s protocol: the same network with its routing's couplings fixed (a few Adam steps on a tiny
    batch: the loss falls and the routing layer's weights move)."""
    torch.manual_seed(0)
    cfg = RoutingClassifierConfig(routing="dynamic", couplings=mode, stem_channels=(8, 16), primary_types=4)
    model = RoutingClassifier(cfg)
    assert model.routing.couplings == mode
    x, y = torch.rand(8, 1, 28, 28), torch.arange(8) % 10
    before = model.routing.weight.detach().clone()
    losses = adam_steps(model, x, y)
    assert losses[-1] < 0.7 * losses[0], losses
    assert not torch.equal(before, model.routing.weight)
    with pytest.raises(ValueError, match="route in one pass"):
        model(x, iterations=2)
    assert model(x[:2], couplings="routed", iterations=2).scores.shape == (2, 10)
