"""The routing protocol: every registered algorithm is built and called the same way (``routing/kinds.py``), and a new
algorithm is one class and one registry line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from capsule_lib.functional import capsule_lengths, squash_hinton
from capsule_lib.models import RoutingClassifier, RoutingClassifierConfig
from capsule_lib.routing._common import RoutingProtocol
from capsule_lib.routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS, RoutingKind, build_routing, register_routing
from capsule_lib.types import Routed, RoutingTrace

pytestmark = pytest.mark.usefixtures("one_thread")

B, N_INP, N_OUT, D = 3, 12, 5, 16
KINDS = ["dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention"]


def _inputs(kind: str, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    poses = torch.randn(B, N_INP, D, generator=g, dtype=dtype).requires_grad_()
    return poses, ROUTING_KINDS[kind].input_activations(torch.randn(B, N_INP, generator=g, dtype=dtype))


def test_the_registry_holds_the_six_algorithms_and_their_defaults():
    assert list(ROUTING_KINDS) == KINDS
    assert dict(DEFAULT_ITERATIONS) == {k: ROUTING_KINDS[k].iterations for k in KINDS}
    assert [k for k in KINDS if ROUTING_KINDS[k].iterations is None] == ["self_attention"]
    for kind in ROUTING_KINDS.values():
        assert kind.layer.__module__ == f"capsule_lib.routing.{kind.name}"  # module = kind = trace name


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_routes_through_the_one_protocol(kind):
    torch.manual_seed(0)
    spec = ROUTING_KINDS[kind]
    layer = build_routing(kind, N_INP, N_OUT, D)
    assert isinstance(layer, spec.layer)
    poses, a = _inputs(kind)
    r = layer.route(poses, a)
    assert isinstance(r, Routed) and r.trace is None
    assert r.poses.shape == (B, N_OUT, D) and torch.isfinite(r.poses).all()
    if spec.scores is None:
        assert r.activations is None
    else:
        assert r.activations.shape == (B, N_OUT) and torch.isfinite(r.activations).all()
        if spec.scores != "logits":
            assert ((r.activations >= 0) & (r.activations <= 1)).all()
    loss = sum(t.square().sum() for t in (r.poses, r.activations) if t is not None)
    loss.backward()
    assert poses.grad is not None and torch.isfinite(poses.grad).all()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{kind}: {name}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_trace_and_the_iterations_of_a_call(kind):
    torch.manual_seed(0)
    layer = build_routing(kind, N_INP, N_OUT, D)
    poses, a = _inputs(kind)
    r = layer.route(poses, a, return_routing=True)
    assert isinstance(r.trace, RoutingTrace) and r.trace.algorithm == kind
    for c in r.trace.coefficients:
        assert c.shape[-2:] == (N_INP, N_OUT)
    plain = layer.route(poses, a)
    torch.testing.assert_close(r.poses, plain.poses)  # a trace changes nothing
    if DEFAULT_ITERATIONS[kind] is None:
        with pytest.raises(ValueError, match="no iterations"):
            layer.route(poses, a, iterations=2)
        return
    once = layer.route(poses, a, iterations=1, return_routing=True)
    if kind != "inverted":  # inverted attention's trace is its last update's (one iteration each)
        assert once.trace.iterations == 1 and r.trace.iterations == DEFAULT_ITERATIONS[kind]
    assert not torch.allclose(once.poses, plain.poses)


@pytest.mark.parametrize("kind", KINDS)
def test_activations_are_refused_or_required_in_one_line(kind):
    layer = build_routing(kind, N_INP, N_OUT, D)
    poses, a = _inputs(kind)
    if ROUTING_KINDS[kind].activations is None:
        with pytest.raises(ValueError, match=r"takes no input activations \(pass activations=None\)$"):
            layer.route(poses, torch.rand(B, N_INP))
    else:
        with pytest.raises(ValueError, match=r"needs input activations \(\[B, n_inp\] "):
            layer.route(poses)


@pytest.mark.parametrize("kind", KINDS)
def test_the_protocol_is_the_paper_shaped_call_in_float64(kind):
    """``route`` adds no arithmetic of its own: it equals each layer's own call, value for value."""
    torch.manual_seed(0)
    layer = build_routing(kind, N_INP, N_OUT, D).double()
    poses, a = _inputs(kind, torch.float64)
    r = layer.route(poses, a)
    if kind == "em":
        mu, a_out = layer(poses, a)
        expected = (mu, a_out)
    elif kind == "heinsen_2019":
        a_out, mu, _ = layer(a, poses.unsqueeze(-2))
        expected = (mu.squeeze(-2), a_out)
    elif kind == "inverted":
        P = None
        for _ in range(DEFAULT_ITERATIONS[kind]):
            P = layer(poses, P)
        expected = (P, None)
    else:
        v = layer(poses)
        expected = (v, None if ROUTING_KINDS[kind].scores is None else capsule_lengths(v))
    assert torch.equal(r.poses, expected[0])
    if expected[1] is not None:
        assert torch.equal(r.activations, expected[1])


def test_a_kind_is_refused_twice_or_without_the_protocol():
    with pytest.raises(ValueError, match="'dynamic' is already registered"):
        register_routing(ROUTING_KINDS["dynamic"])
    with pytest.raises(ValueError, match=r"Linear lacks the routing protocol's fully_connected, route and _coupled"):
        register_routing(RoutingKind("linear", nn.Linear, None, "not a routing"))
    assert "linear" not in ROUTING_KINDS


class UniformRouting(RoutingProtocol, nn.Module):
    """A toy routing for the registry test: every child sends its vote to every parent with the same coupling
    ``1 / n_out`` (Paik et al.'s uniform baseline), then squash. ``[B, n_inp, d] -> [B, n_out, d]``."""

    def __init__(self, n_inp: int, n_out: int, d: int) -> None:
        super().__init__()
        self.n_out = n_out
        self.weight = nn.Parameter(torch.randn(n_inp, n_out, d, d) * 0.05)

    @classmethod
    def fully_connected(cls, n_inp: int, n_out: int, d: int, iterations: int | None) -> UniformRouting:
        return cls(n_inp, n_out, d)

    def _routed(self, poses, activations, iterations, return_routing) -> Routed:  # behind route(...)
        votes = torch.einsum("bid,ijde->bije", poses, self.weight)  # [B, I, J, d]
        c = torch.full(votes.shape[:3], 1.0 / self.n_out, dtype=votes.dtype)  # [B, I, J]
        v = squash_hinton(torch.einsum("bij,bije->bje", c, votes))  # [B, J, d]
        trace = RoutingTrace("uniform", coefficients=[c], outputs=[v]) if return_routing else None
        return Routed(v, v.norm(dim=-1), trace)

    def _coupled(self, poses, activations, R) -> Routed:  # behind route(..., couplings="random")
        v = squash_hinton(torch.einsum("bij,bid,ijde->bje", R, poses, self.weight))  # [B, J, d]
        return Routed(v, v.norm(dim=-1), None)


@pytest.fixture
def uniform_kind():
    """The toy, registered with one line for one test (and removed after it)."""
    kind = register_routing(
        RoutingKind("uniform", UniformRouting, None, "uniform couplings, a toy", squash=squash_hinton, scores="lengths")
    )
    yield kind
    del ROUTING_KINDS["uniform"]


def test_a_new_routing_is_one_class_and_one_registry_line(uniform_kind, adam_steps):
    """The toy above, registered with one line (the fixture), trains through the comparison network, which no line
    of this test or of the library had to change for it."""
    assert ROUTING_KINDS["uniform"] is uniform_kind and DEFAULT_ITERATIONS["uniform"] is None
    torch.manual_seed(0)
    model = RoutingClassifier(RoutingClassifierConfig(routing="uniform", stem_channels=(8, 16), primary_types=4))
    assert isinstance(model.routing, UniformRouting) and model.readout is None
    x, y = torch.rand(8, 1, 28, 28), torch.arange(8) % 10
    out = model(x, return_routing=True)
    assert out.kind == "lengths" and out.scores.shape == (8, 10) and out.trace.algorithm == "uniform"
    torch.testing.assert_close(out.trace.coefficients[0].sum(-1), torch.ones(8, 144))
    before = [p.detach().clone() for p in model.parameters()]
    losses = adam_steps(model, x, y)
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(not torch.equal(p, q) for p, q in zip(before, model.parameters()))
