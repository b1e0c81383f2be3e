"""The figures, the explorer and its page-mode twin of the chapter "Do capsules need routing?", drawn with the
chapter's shapes (six routings, ten classes, a 16 x 6 x 6 primary grid, ten test-time iterations) and checked for
readability at the book's size (``readable_figures``, conftest.py)."""

from __future__ import annotations

import html

import pytest
import torch

from capsule_lib.critique import (
    CouplingStats,
    LayerRouting,
    RoutingChanges,
    reroute_image,
    routing_changes,
)
from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig
from capsule_lib.routing.kinds import ROUTING_KINDS
from capsule_lib.routing_critique import DepthPoint, measured
from capsule_lib.viz import critique as vcr
from capsule_lib.viz.explorers import iteration_explorer
from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, iteration_page_explorer
from capsule_lib.viz.widgets import figure_output

pytestmark = pytest.mark.usefixtures("readable_figures", "one_thread")

GRID = (4, 6, 6)  # the tiny networks' primary grid: 4 types on 6 x 6


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    cfg = dict(stem_channels=(8, 16), primary_types=GRID[0])
    return {k: RoutingClassifier(RoutingClassifierConfig(routing=k, **cfg)).eval() for k in ("dynamic", "em")}


def test_routed_against_fixed_couplings_three_panels():
    panels = {
        name: {
            k: {c: measured([0.97 + 0.001 * i, 0.975], 10_000) for i, c in enumerate(vcr.COUPLING_STYLES)}
            for k in ROUTING_KINDS
        }
        for name in ("MNIST test", "affine MNIST", "novel views")
    }
    fig = vcr.plot_couplings_compared(panels, {k: k for k in ROUTING_KINDS}, title="2 seeds each")
    assert len(fig.axes) == 3
    with pytest.raises(ValueError, match="one to three panels"):
        vcr.plot_couplings_compared({}, {})


def test_the_depth_series_figure_has_accuracy_and_a_gradient_line_per_depth():
    acc = {"test_acc": measured([0.97, 0.96], 10_000), "affine_acc": measured([0.6, 0.62], 5_000)}
    layer = {"alive": 0.5, "grad_rms": 1e-3}
    series = {
        d: DepthPoint(10**6, acc, [dict(layer, grad_rms=10.0 ** (i - d)) for i in range(d)]) for d in (1, 2, 3, 4)
    }
    fig = vcr.plot_depth_series(series, title="dynamic routing, 1 to 4 routing layers, 2 seeds")
    left, right = fig.axes
    assert len(left.containers) == 2 and len(right.lines) == 4 and right.get_yscale() == "log"


def test_the_first_steps_figure_draws_loss_accuracy_and_the_first_layers_gradient_per_run():
    def run(scale):
        probes = [{"step": 0, "val_acc": 0.1}] + [
            {"step": t, "val_acc": min(1.0, 0.1 + scale * t), "grad_rms": {"stem": 10.0 ** (-t / 10), "routing": 1e-3}}
            for t in (1, 2, 5, 10, 20, 40)
        ]
        return {"loss": [1.0 - scale * t for t in range(40)], "probes": probes}

    runs = {f"variant {i}: a label as long as the chapter's": run(0.01 * i) for i in range(1, 8)}
    fig = vcr.plot_first_steps(runs, title="the first 40 steps of seven runs")
    loss, acc, grad = fig.axes
    assert len(loss.lines) == len(acc.lines) == len(grad.lines) == 7 and grad.get_yscale() == "log"
    assert len(loss.lines[0].get_xdata()) == 31  # a running mean of 10 over 40 steps
    with pytest.raises(ValueError, match="no runs to draw"):
        vcr.plot_first_steps({})


def test_routing_changes_and_layers_figures(nets):
    x = torch.rand(6, 1, 28, 28)
    changes = {k: routing_changes(m, x, iterations=range(1, 11)) for k, m in nets.items()}
    fig = vcr.plot_routing_changes(changes, title="1,000 MNIST test images")
    assert len(fig.axes) == 2
    st = CouplingStats(0.5, 0.5, 0.1, 0.8)
    layers = {
        name: [LayerRouting(f"l{d}", d, T, 8, st) for T in (1, 3) for d in (1, 2, 3)]
        for name in ("EM, smallNORB-like", "Heinsen 2019, smallNORB-like")
    }
    assert len(vcr.plot_layers(layers, title="couplings and parents, layer by layer").axes) == 3
    assert isinstance(next(iter(changes.values())), RoutingChanges)


def test_one_image_routed_per_iteration(nets):
    x = torch.rand(1, 28, 28)
    r = reroute_image(nets["dynamic"], x, range(1, 11))
    assert (
        r.couplings.shape == (10, GRID[0] * 36, 10) and r.scores.shape == (10, 10) and r.entropy[0] == pytest.approx(1)
    )
    torch.testing.assert_close(r.couplings.sum(-1), torch.ones(10, GRID[0] * 36, dtype=torch.float64))
    with torch.no_grad():
        want = nets["dynamic"](x[None], iterations=4).scores[0]
    torch.testing.assert_close(r.scores[3], want)
    vcr.plot_rerouted_image(x, r, 3, grid=GRID)
    vcr.plot_image_iterations(r, title="one test digit")


def test_the_page_explorer_has_a_frame_per_network_and_iteration(nets):
    x = torch.rand(1, 28, 28)
    routings = {k: reroute_image(m, x, (1, 2, 3, 5, 10)) for k, m in nets.items()}
    box = iteration_page_explorer(x, routings, grid=GRID)
    assert PAGE_EXPLORER_CLASS in box._dom_classes
    outer = box.children[2].children[-1].children[1]
    assert len(outer.children) == 2 and all(len(s.children) == 5 for s in outer.children)
    routings["em"] = reroute_image(nets["em"], x, (1, 2))
    with pytest.raises(ValueError, match="same iterations"):
        iteration_page_explorer(x, routings, grid=GRID)


def test_the_live_explorer_reroutes_and_draws_its_twin(nets):
    images = torch.rand(3, 1, 28, 28)
    ex = iteration_explorer(nets, images, max_iterations=4, grid=GRID)
    assert set(ex.controls) == {"network", "image", "iterations"}
    ex.set_values(network="em", image=2, iterations=3)
    r = reroute_image(nets["em"], images[2], (1, 2, 3, 4))
    (out,) = ex.output.outputs
    assert (
        out["data"]["image/png"]
        == figure_output(vcr.plot_rerouted_image(images[2], r, 2, grid=GRID))["data"]["image/png"]
    )
    assert html.escape(f"prediction at T = 3: {r.predictions[2]}") in ex.readout.value
