"""capsule_lib.viz: static figures, toy routing problems, widgets wired to their static twins."""

import base64
import html
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from capsule_lib import capsule_lengths, dynamic_routing  # noqa: E402
from capsule_lib.analysis import group_shares, outlier_sweep, toy_votes  # noqa: E402
from capsule_lib.train import History  # noqa: E402
from capsule_lib.viz import plots, toy  # noqa: E402

pytestmark = pytest.mark.usefixtures("readable_figures")  # figures readable at the book's size (conftest.py)


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


@pytest.fixture
def problem():
    t = toy_votes(groups=(5, 3), n_outliers=2, seed=0)
    _, trace = dynamic_routing(t.votes, iterations=6, return_routing=True)
    return t, trace


# ------------------------------------------------------------------------------------------ toy votes
def test_toy_votes_shapes_groups_and_determinism():
    t = toy_votes(groups=(4, 2, 3), n_outliers=1, batch=5, seed=3)
    assert t.votes.shape == (5, 10, 3, 2) and t.group.tolist() == [0] * 4 + [1] * 2 + [2] * 3 + [-1]
    assert t.centers.shape == (3, 2) and t.n_children == 10 and t.n_parents == 3
    assert t.child_labels() == ["A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "o1"]
    assert torch.equal(t.votes, toy_votes(groups=(4, 2, 3), n_outliers=1, batch=5, seed=3).votes)
    assert not torch.equal(t.votes, toy_votes(groups=(4, 2, 3), n_outliers=1, batch=5, seed=4).votes)


def test_group_votes_cluster_at_their_parent_and_others_scatter():
    t = toy_votes(groups=(6, 0), n_outliers=6, spread=0.05, batch=200, seed=0)
    members = t.votes[:, :6, 0]  # [B, 6, 2] votes of group A for A
    assert (members - t.centers[0]).norm(dim=-1).mean() < 0.1
    scattered = t.votes[:, 6:, 0]  # outliers' votes for A
    assert scattered.mean(dim=(0, 1)).norm() < 0.1  # random directions average out
    lengths = t.votes[:, 6:].norm(dim=-1)
    assert lengths.min() >= 0.3 - 1e-6 and lengths.max() <= 1.1 + 1e-6


def test_toy_votes_rejects_bad_sizes():
    with pytest.raises(ValueError):
        toy_votes(groups=(), n_outliers=1)
    with pytest.raises(ValueError):
        toy_votes(groups=(0,), n_outliers=0)


def test_routing_separates_the_toy_groups(problem):
    t, trace = problem
    first, last = group_shares(t, trace, 1), group_shares(t, trace, trace.iterations)
    np.testing.assert_allclose(first, 0.5, atol=1e-6)  # iteration 1: uniform coefficients
    assert last[0, 0] > 0.8 and last[1, 1] > 0.8  # each group routes to its own parent
    np.testing.assert_allclose(last.sum(axis=1), 1.0, atol=1e-5)


def test_routing_readout_matches_the_trace(problem):
    t, trace = problem
    line = toy.routing_readout(t, trace, 2)
    v = capsule_lengths(trace.outputs[1][0])
    shares = group_shares(t, trace, 2)
    assert line.startswith("iteration 2: ")
    assert f"|v_A|={v[0]:.2f}" in line and f"|v_B|={v[1]:.2f}" in line
    assert f"A→A {100 * shares[0, 0]:.0f}%" in line and "outliers→A/B" in line
    assert toy.routing_readout(t, trace, 1) != toy.routing_readout(t, trace, trace.iterations)
    with pytest.raises(ValueError, match="out of range"):
        toy.routing_readout(t, trace, trace.iterations + 1)


# ---------------------------------------------------------------------------------------- figures
def test_routing_figures(problem):
    t, trace = problem
    fig = toy.plot_routing_state(t, trace, 3)
    assert len(fig.axes) == t.n_parents + 1
    assert "iteration 3" in fig.axes[0].get_title()
    grid = toy.plot_toy_iterations(t, trace, iterations=[1, 3, 6])
    assert len(grid.axes) == 3 * t.n_parents
    # the static twin draws different figures for different iterations
    assert png_bytes(toy.plot_routing_state(t, trace, 1)) != png_bytes(toy.plot_routing_state(t, trace, 6))
    with pytest.raises(ValueError):
        toy.plot_toy_iterations(t, trace, iterations=[0])
    plt.close("all")


def test_outlier_sweep_shows_the_outlier_effect():
    sweep = outlier_sweep(n_outliers=(0, 12), iterations=(1, 3), problems=200, progress=False)
    L = sweep["lengths"]  # [M, plain/leaky, T, A/B]
    assert L.shape == (2, 2, 2, 2)
    assert (L[..., 0] > L[..., 1]).all()  # the agreed-on parent is longer everywhere
    assert L[1, 0, 1, 1] > L[0, 0, 1, 1] + 0.3  # outliers lengthen the parent nobody agreed on
    assert (L[:, 1] < L[:, 0]).all()  # leaky routing lowers every length
    fig = toy.plot_outlier_sweep(sweep)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_plot_squash_uses_the_library_functions():
    fig = plots.plot_squash(max_norm=4.0, n=50)
    lines = fig.axes[0].get_lines()
    x, y_h = lines[0].get_data()
    s = torch.stack([torch.tensor(x), torch.zeros(len(x))], -1).float()
    from capsule_lib import squash_hinton

    np.testing.assert_allclose(y_h, capsule_lengths(squash_hinton(s)).numpy(), atol=1e-6)
    assert (y_h < 1).all()
    plt.close(fig)


def test_plot_capsules_and_validation():
    fig = plots.plot_capsules(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), labels=["a", "b"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("a\n|v| = 0.71" == t for t in texts) and any("|v| = 0.00" in t for t in texts)
    plt.close(fig)
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        plots.plot_capsules(torch.zeros(3, 3))


def test_plot_coefficients(problem):
    _, trace = problem
    fig = plots.plot_coefficients(trace, iterations=[1, 2])
    images = [a for a in fig.axes if a.images]
    assert len(images) == 2
    np.testing.assert_allclose(images[1].images[0].get_array(), trace.coefficients[1][0].numpy())
    plt.close(fig)
    from capsule_lib import RoutingTrace

    with pytest.raises(ValueError):
        plots.plot_coefficients(RoutingTrace("dynamic"))


def _history(n=3):
    h = History()
    for e in range(1, n + 1):
        h.append(
            {
                "epoch": e,
                "train_loss": 1.0 / e,
                "train_acc": 0.5 + 0.1 * e,
                "val_loss": 1.2 / e,
                "val_acc": 0.45 + 0.1 * e,
                "lr": 1e-3,
                "epoch_time": 1.0,
            }
        )
    return h


def test_plot_history_accepts_history_dict_and_list():
    h = _history()
    for src in (h, h.to_dict(), h.records):
        fig = plots.plot_history(src, title="t")
        loss_ax, acc_ax = fig.axes
        assert [l.get_label() for l in loss_ax.get_lines()] == ["train", "val"]
        np.testing.assert_allclose(acc_ax.get_lines()[1].get_ydata(), [0.55, 0.65, 0.75])
        plt.close(fig)
    empty = plots.plot_history([])
    assert any("no records" in t.get_text() for t in empty.axes[0].texts)
    plt.close(empty)


def test_liveplot_updates_one_display(monkeypatch):
    import IPython.display as ipd

    calls = []

    class Handle:
        def update(self, obj):
            calls.append(("update", obj))

    def fake_display(obj, display_id=None):
        calls.append(("display", obj))
        return Handle()

    monkeypatch.setattr(ipd, "display", fake_display)

    class T:
        history = History()

    trainer, live = T(), plots.LivePlot("run", every=1)
    for e in range(3):
        trainer.history.append({"epoch": e + 1, "train_loss": 1.0, "train_acc": 0.5})
        live(trainer, trainer.history.records[-1])
    assert [c[0] for c in calls] == ["display", "update", "update"] and live.draws == 3
    with pytest.raises(ValueError):
        plots.LivePlot(every=0)


def test_liveplot_as_trainer_callback(monkeypatch):
    import IPython.display as ipd
    from torch import nn

    from capsule_lib.data import TensorLoader
    from capsule_lib.losses import ClassifierObjective
    from capsule_lib.train import Trainer

    shown = []
    monkeypatch.setattr(
        ipd,
        "display",
        lambda obj, display_id=None: shown.append(obj) or type("H", (), {"update": lambda self, o: shown.append(o)})(),
    )
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    model = nn.Linear(4, 3)
    live = plots.LivePlot()
    trainer = Trainer(
        model,
        ClassifierObjective(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        callbacks=[live],
        progress=False,
    )
    trainer.fit(TensorLoader([x, y], 8), TensorLoader([x, y], 16), epochs=2)
    assert live.draws == 2 and len(shown) == 2


# ---------------------------------------------------------------------------------------- widgets
def test_routing_explorer_wires_slider_to_twin(problem):
    from capsule_lib.viz.widgets import routing_explorer

    t, trace = problem
    ex = routing_explorer(t, trace, initial=1)
    slider = ex.controls["t"]
    assert slider.description == "iterations" and (slider.min, slider.max, slider.value) == (1, trace.iterations, 1)
    assert ex.draws == 1 and ex.last_values == {"t": 1}
    assert html.escape(toy.routing_readout(t, trace, 1)) in ex.readout.value
    first_png = ex.output.outputs[0]["data"]["image/png"]
    slider.value = 4
    assert ex.draws == 2 and ex.last_values == {"t": 4}
    assert html.escape(toy.routing_readout(t, trace, 4)) in ex.readout.value
    (out,) = ex.output.outputs  # the figure is replaced, not appended
    png = base64.b64decode(out["data"]["image/png"])
    assert png.startswith(b"\x89PNG") and out["data"]["image/png"] != first_png
    # the widget shows exactly what its static twin draws for the same value
    from capsule_lib.viz.widgets import figure_output

    twin = figure_output(toy.plot_routing_state(t, trace, 4))
    assert twin["data"]["image/png"] == out["data"]["image/png"]
    plt.close("all")


def test_generic_explorer_buttons_and_set_values():
    import ipywidgets as W

    from capsule_lib.viz.widgets import explorer

    drawn = []

    def draw(a, b):
        drawn.append((a, b))
        fig, ax = plt.subplots()
        ax.plot([0, a], [0, b])
        return fig

    defaults = {"a": 1.0, "b": 2.0}
    ex = explorer(
        {"a": W.FloatSlider(value=1.0, description="a"), "b": W.FloatSlider(value=2.0, description="b")},
        draw,
        readout=lambda a, b: f"a+b={a + b:.1f}",
        buttons={"reset": lambda e: e.set_values(**defaults)},
    )
    assert drawn == [(1.0, 2.0)] and "a+b=3.0" in ex.readout.value
    ex.controls["a"].value = 5.0
    assert drawn[-1] == (5.0, 2.0) and "a+b=7.0" in ex.readout.value
    ex.buttons["reset"].click()
    assert drawn[-1] == (1.0, 2.0) and len(drawn) == 3  # one redraw for the whole reset
    assert ex.values() == defaults
    plt.close("all")
