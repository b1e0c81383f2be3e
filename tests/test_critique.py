"""The critics' measurements (capsule_lib.critique): golden values for tiny couplings, and the iteration sweep's
invariants on a small comparison network."""

from __future__ import annotations

import math

import pytest
import torch

from capsule_lib.critique import coupling_stats, routing_changes
from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig


def test_uniform_couplings_have_entropy_one_the_smallest_share_and_no_variation():
    s = coupling_stats(torch.full((4, 6, 5), 0.2))
    assert s.entropy == pytest.approx(1.0) and s.max_share == pytest.approx(0.2) and s.variation == 0.0
    assert s.alive is None


def test_one_parent_per_child_has_entropy_zero_and_the_largest_share():
    c = torch.zeros(3, 4, 5)
    c[:, torch.arange(4), torch.tensor([0, 1, 2, 0])] = 1.0  # the same tree for every image
    s = coupling_stats(c)
    assert s.entropy == pytest.approx(0.0, abs=1e-12) and s.max_share == 1.0 and s.variation == 0.0


def test_variation_measures_how_much_the_tree_changes_between_images():
    """Two images, each child sends everything to parent 0 on the first and parent 1 on the second: per pair the
    standard deviation over images is 1/sqrt(2) for two of J = 4 parents, 0 for the others; times J / J."""
    c = torch.zeros(2, 3, 4)
    c[0, :, 0] = 1.0
    c[1, :, 1] = 1.0
    assert coupling_stats(c).variation == pytest.approx(2 * math.sqrt(0.5))


def test_alive_counts_parents_active_on_enough_images():
    c = torch.full((100, 2, 4), 0.25)
    act = torch.zeros(100, 4)
    act[:, 0] = 0.9  # always active
    act[:1, 1] = 0.9  # on 1 % of the images
    act[:, 2] = 0.4  # never above 0.5
    assert coupling_stats(c, act).alive == pytest.approx(0.5)
    assert coupling_stats(c, act, min_share=0.02).alive == pytest.approx(0.25)
    assert coupling_stats(c, act, threshold=0.3).alive == pytest.approx(0.75)


def test_bad_couplings_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"couplings must be \[N >= 2, n_inp, n_out >= 2\], got \(5, 4\)"):
        coupling_stats(torch.ones(5, 4))
    with pytest.raises(ValueError, match="sum to 1 over the parents"):
        coupling_stats(torch.full((2, 3, 4), 0.5))
    with pytest.raises(ValueError, match=r"activity must be \[N=2, n_out=4\]"):
        coupling_stats(torch.full((2, 3, 4), 0.25), torch.ones(2, 3))


def _net(routing: str = "dynamic", **kw) -> RoutingClassifier:
    torch.manual_seed(0)
    return RoutingClassifier(RoutingClassifierConfig(routing=routing, stem_channels=(8, 16), primary_types=4, **kw))


@pytest.mark.parametrize("routing", ["dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted"])
def test_the_sweep_starts_from_the_uniform_pass_and_counts_changes(routing):
    model = _net(routing).train()
    x, y = torch.rand(6, 1, 28, 28), torch.arange(6)
    s = routing_changes(model, x, y, iterations=(1, 2, 4), batch_size=4)
    assert model.training  # given back in its mode
    assert s.iterations == (1, 2, 4) and s.predictions.shape == (3, 6) and len(s.stats) == 3
    assert s.changed_from_first[0] == 0.0 and all(0.0 <= v <= 1.0 for v in s.changed_from_default)
    assert s.stats[0].entropy == pytest.approx(1.0) and s.stats[0].variation == pytest.approx(0.0, abs=1e-9)
    assert s.accuracy == tuple((s.predictions[k] == y).double().mean().item() for k in range(3))
    model.eval()
    own = model(x, iterations=s.default).scores.argmax(-1)
    assert s.changed_from_default == tuple((s.predictions[k] != own).double().mean().item() for k in range(3))


def test_the_sweep_refuses_what_has_nothing_to_sweep():
    x = torch.rand(4, 1, 28, 28)
    with pytest.raises(ValueError, match="no routing iterations to sweep"):
        routing_changes(_net("self_attention"), x)
    with pytest.raises(ValueError, match=r"fixed couplings \(uniform\): nothing to sweep"):
        routing_changes(_net("dynamic", couplings="uniform"), x)
    with pytest.raises(ValueError, match="must include 1"):
        routing_changes(_net(), x, iterations=(2, 3))
    with pytest.raises(ValueError, match="at least 2 images"):
        routing_changes(_net(), x[:1])
