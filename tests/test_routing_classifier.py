"""RoutingClassifier: one stem and one set of primary capsules, six routings (the comparison chapter)."""

import dataclasses
import json

import pytest
import torch

from capsule_lib.losses import ScoreObjective
from capsule_lib.models import RoutingClassifier, RoutingClassifierConfig
from capsule_lib.pretrained import build_model
from capsule_lib.routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS

TINY = RoutingClassifierConfig(stem_channels=(8, 16), primary_types=4)
SCORE_KIND = {
    "dynamic": "lengths",
    "self_attention": "lengths",
    "em": "activations",
    "heinsen_2019": "logits",
    "heinsen_2022": "logits",
    "inverted": "logits",
}


def test_every_routing_kind_has_a_score_kind():
    assert set(SCORE_KIND) == set(ROUTING_KINDS)


@pytest.mark.parametrize("kind", sorted(ROUTING_KINDS))
def test_shapes_scores_and_a_gradient_for_every_parameter(kind):
    torch.manual_seed(0)
    m = RoutingClassifier(TINY.with_routing(kind))
    x, y = torch.rand(3, 1, 28, 28), torch.tensor([0, 4, 9])
    assert TINY.grid == 6 and TINY.n_primary == 4 * 36
    poses, logits = m.primary_capsules(x)
    assert poses.shape == (3, 144, 16) and logits.shape == (3, 144)
    out = m(x)
    assert out.kind == SCORE_KIND[kind] and out.scores.shape == (3, 10) and out.poses.shape == (3, 10, 16)
    assert torch.isfinite(out.scores).all()
    if out.kind != "logits":
        assert ((out.scores >= 0) & (out.scores < 1)).all()
    if kind == "heinsen_2019":  # zero-initialised betas: the first step trains only them, then gradients flow
        ScoreObjective()(m, (x, y), True).loss.backward()
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                p.grad = None
    step = ScoreObjective()(m, (x, y), True)
    assert torch.isfinite(step.loss)
    step.loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{kind}: {name}"
        if name.startswith(("stem", "primary")):
            assert p.grad.abs().sum() > 0, f"{kind}: {name} gets no gradient"
    _, trace = m(x, return_routing=True).scores, m(x, return_routing=True).trace
    assert trace is not None and len(trace.coefficients) >= 1


@pytest.mark.parametrize("kind", [k for k, t in DEFAULT_ITERATIONS.items() if t is not None])
def test_test_time_iterations_change_the_output_and_leave_the_model_as_it_was(kind):
    torch.manual_seed(1)
    m = RoutingClassifier(TINY.with_routing(kind)).eval()
    with torch.no_grad():  # larger weights, so that routing moves away from its uniform start
        for p in m.routing.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        base, one, again = m(x).scores, m(x, iterations=1).scores, m(x).scores
    assert not torch.allclose(base, one), kind
    torch.testing.assert_close(base, again)  # the override did not stick
    assert m.config.routing_iterations == DEFAULT_ITERATIONS[kind]


@pytest.mark.parametrize("kind", [k for k, t in DEFAULT_ITERATIONS.items() if t is not None])
def test_test_time_iterations_are_a_call_argument_and_nothing_is_written(kind, monkeypatch):
    """``iterations=T`` reaches the routing as an argument: no attribute of any module is set during the call, and
    the result is that of the same weights built with ``T`` iterations (EM: with the schedule for ``T``)."""
    torch.manual_seed(2)
    m = RoutingClassifier(TINY.with_routing(kind)).eval()
    built = RoutingClassifier(TINY.with_routing(kind, iterations=5)).eval()
    built.load_state_dict(m.state_dict())
    x = torch.rand(2, 1, 28, 28)

    def refuse(self, name, value):
        raise AssertionError(f"{type(self).__name__}.{name} set during a forward with iterations=5")

    with torch.no_grad():
        expected = built(x).scores
        for module in m.modules():
            monkeypatch.setattr(type(module), "__setattr__", refuse)
        got = m(x, iterations=5).scores
        monkeypatch.undo()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("kind", sorted(ROUTING_KINDS))
def test_a_routing_kind_and_its_trace_have_one_name(kind):
    m = RoutingClassifier(TINY.with_routing(kind)).eval()
    with torch.no_grad():
        assert m(torch.rand(1, 1, 28, 28), return_routing=True).trace.algorithm == kind


def test_config_checks_and_json_roundtrip():
    with pytest.raises(ValueError, match=r"^routing must be one of \["):
        RoutingClassifierConfig(routing="capsnet")
    with pytest.raises(ValueError, match=r"^self_attention routing has no iterations"):
        RoutingClassifierConfig(routing="self_attention", iterations=2)
    with pytest.raises(ValueError, match=r"iterations must be >= 1, got 0"):
        RoutingClassifierConfig(routing="inverted", iterations=0)
    with pytest.raises(ValueError, match=r"^iterations must be >= 1, got 0"):
        RoutingClassifier(TINY.with_routing("inverted"))(torch.rand(1, 1, 28, 28), iterations=0)
    with pytest.raises(ValueError, match=r"^caps_dim must be a square"):
        RoutingClassifierConfig(caps_dim=8)
    with pytest.raises(ValueError, match=r"^self_attention routing has no iterations to override"):
        RoutingClassifier(TINY.with_routing("self_attention"))(torch.rand(1, 1, 28, 28), iterations=2)
    cfg = TINY.with_routing("em", iterations=2)
    back = build_model("routing_classifier", json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert back.config == cfg and back.config.stem_channels == (8, 16)


def test_recipe_trains_each_routing_through_the_one_entry_point(tmp_path):
    from capsule_lib.train import train

    smoke = dict(epochs=1, dataset="glyph_digits", train_subset=64, eval_subset=32, device="cpu", batch_size=32)
    for kind in ("em", "inverted"):
        _, tr = train(
            "routing_compare_mnist",
            out_dir=tmp_path / kind,
            progress=False,
            test=False,
            model=dataclasses.replace(TINY, routing=kind),
            **smoke,
        )
        rec = tr.history.records[-1]
        assert tr.history.meta["recipe"] == "routing_compare_mnist" and 0 <= rec["val_acc"] <= 1
        assert ("train_spread" in rec) == (kind == "em") and ("train_ce" in rec) == (kind == "inverted")


# ------------------------------------------------------------------------------------------- torch.compile
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ROUTING_KINDS))
def test_torch_compile_forward_and_backward_match_eager(kind):
    """Every routing compiles (inductor, CPU) inside the comparison network: the compiled forward gives the eager
    scores and the compiled backward the eager gradients of every parameter."""
    torch.manual_seed(0)
    cfg = RoutingClassifierConfig(routing=kind, stem_channels=(4, 8), primary_types=2, caps_dim=4, image_size=12)
    model = RoutingClassifier(cfg)
    x = torch.rand(3, 1, 12, 12)
    ref = model(x).scores
    ref.sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    out = torch.compile(model)(x).scores
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, want[n], rtol=1e-3, atol=1e-5, msg=f"{kind}, {n}: gradients differ")
