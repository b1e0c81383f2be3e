"""capsule_lib.viz.explorers and viz.widgets: the explorers build headless and every control change redraws
the figure (and the readout) exactly as the static twin draws it for the same values."""

import base64
import html

import matplotlib

matplotlib.use("Agg")
import ipywidgets as W  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from capsule_lib import RoutingTrace, capsule_lengths  # noqa: E402
from capsule_lib.analysis import toy_votes  # noqa: E402
from capsule_lib.data.generated import glyph_digits  # noqa: E402
from capsule_lib.routing import dynamic_routing  # noqa: E402
from capsule_lib.viz import capsules as vc  # noqa: E402
from capsule_lib.viz import toy  # noqa: E402
from capsule_lib.viz.explorers import capsule_routing_explorer, lengths_readout, perturbation_explorer  # noqa: E402
from capsule_lib.viz.widgets import Explorer, explorer, figure_output, routing_explorer  # noqa: E402

#: figures readable at the book's size (conftest.py: readable_figures also closes them), one thread
pytestmark = pytest.mark.usefixtures("readable_figures", "one_thread")

GRID = (2, 6, 6)
CLASSES = ["zero", "one", "two"]


@pytest.fixture(scope="module")
def run(tiny_capsnet):
    """The tiny CapsNet (conftest.py) on 3 generated digits."""
    x, _ = glyph_digits(n=3, seed=1)
    images = x.float() / 255.0
    with torch.no_grad():
        out = tiny_capsnet(images, return_routing=True)
    return tiny_capsnet, images, out.poses, out.trace.detach()


def png(ex: Explorer) -> str:
    (out,) = ex.output.outputs  # one figure, replaced on every redraw
    return out["data"]["image/png"]


def readout_of(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


# ------------------------------------------------------------------------------------------- readout
def test_lengths_readout_golden():
    assert lengths_readout([0.031, 0.914, 0.5]) == "capsule lengths: 0:0.03 1:0.91 2:0.50"
    assert lengths_readout(torch.tensor([0.2, 0.126]), label=1) == "capsule lengths: 0:0.20 1:0.13*"
    assert lengths_readout([0.4], label=3) == "capsule lengths: 0:0.40"  # a label outside the list marks nothing
    assert lengths_readout([]) == "capsule lengths: "
    assert lengths_readout([0.2, 0.7], label=1, classes=["cat", "dog"]) == "capsule lengths: cat:0.20 dog:0.70*"


# ---------------------------------------------------------------------------------- routing explorer
def test_capsule_routing_explorer_controls_and_initial_state(run):
    _, images, _, trace = run
    T = len(trace.coefficients)
    ex = capsule_routing_explorer(images, trace, grid=GRID, classes=CLASSES)
    assert isinstance(ex, W.VBox) and set(ex.controls) == {"image", "iteration"}
    img, it = ex.controls["image"], ex.controls["iteration"]
    assert (img.description, img.min, img.max, img.value) == ("image", 0, 2, 0)
    assert (it.description, it.min, it.max, it.value) == ("iteration", 1, T, T)  # starts at the last iteration
    assert not img.continuous_update and not it.continuous_update
    assert list(ex.children) == [img, it, ex.readout, ex.output]
    assert ex.draws == 1 and ex.last_values == {"image": 0, "iteration": T}
    expected = lengths_readout(capsule_lengths(trace.outputs[T - 1][0]).tolist(), None, CLASSES)
    assert ex.readout.value == readout_of(expected) and "zero:" in expected  # the class names, not indices
    twin = figure_output(vc.plot_routing_step(images[0], trace, 0, T - 1, grid=GRID, classes=CLASSES))
    assert png(ex) == twin["data"]["image/png"]


def test_capsule_routing_explorer_sliders_redraw_the_twin(run):
    _, images, _, trace = run
    T = len(trace.coefficients)
    ex = capsule_routing_explorer(images, trace, grid=GRID, classes=CLASSES)
    first_png, first_readout = png(ex), ex.readout.value
    ex.controls["iteration"].value = 1
    assert ex.draws == 2 and ex.last_values == {"image": 0, "iteration": 1}
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(trace.outputs[0][0]).tolist(), None, CLASSES))
    assert ex.readout.value != first_readout and png(ex) != first_png
    twin = figure_output(vc.plot_routing_step(images[0], trace, 0, 0, grid=GRID, classes=CLASSES))
    assert png(ex) == twin["data"]["image/png"]
    ex.controls["image"].value = 2
    assert ex.draws == 3 and ex.last_values == {"image": 2, "iteration": 1}
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(trace.outputs[0][2]).tolist(), None, CLASSES))
    ex.set_values(image=1, iteration=T)  # several controls, one redraw
    assert ex.draws == 4 and ex.values() == {"image": 1, "iteration": T}
    twin = figure_output(vc.plot_routing_step(images[1], trace, 1, T - 1, grid=GRID, classes=CLASSES))
    assert png(ex) == twin["data"]["image/png"]


# ----------------------------------------------------------------------------- perturbation explorer
def test_perturbation_explorer_controls(run):
    model, images, poses, _ = run
    labels = torch.tensor([2, 0, 1])
    ex = perturbation_explorer(
        model, images, poses, labels, value_range=0.2, step=0.1, perturb="label", classes=CLASSES
    )
    D = poses.shape[-1]
    assert list(ex.controls) == ["sample"] + [f"d{k}" for k in range(D)]
    s = ex.controls["sample"]
    assert (s.description, s.min, s.max, s.value) == ("sample", 0, 2, 0)
    for k in range(D):
        d = ex.controls[f"d{k}"]
        assert isinstance(d, W.FloatSlider)
        assert (d.description, d.min, d.max, d.step, d.value, d.readout_format) == (
            f"dim {k}",
            -0.2,
            0.2,
            0.1,
            0.0,
            "+.2f",
        )
    assert list(ex.buttons) == ["reset"] and ex.buttons["reset"].description == "reset"
    assert isinstance(ex.children[D + 1], W.HBox) and list(ex.children[D + 1].children) == [ex.buttons["reset"]]
    assert ex.draws == 1
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(poses[0]).tolist(), 2, CLASSES))
    assert "two:" in ex.readout.value and ex.readout.value.endswith("*</code>")  # the label (last capsule) is marked


def test_perturbation_explorer_slider_redraws_and_reset(run):
    model, images, poses, _ = run
    labels = torch.tensor([2, 0, 1])
    ex = perturbation_explorer(
        model, images, poses, labels, value_range=0.2, step=0.1, perturb="label", classes=CLASSES
    )
    initial_png, initial_readout = png(ex), ex.readout.value
    twin = figure_output(vc.plot_perturbation(model, images[0], poses[0], 2, [0.0] * 4, "label", CLASSES))
    assert initial_png == twin["data"]["image/png"]

    ex.controls["d1"].value = 0.2
    assert ex.draws == 2 and ex.last_values == {"sample": 0, "d0": 0.0, "d1": 0.2, "d2": 0.0, "d3": 0.0}
    offsets = [0.0, 0.2, 0.0, 0.0]
    p = vc.perturb_poses(poses[0], offsets, label=2)
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(p).tolist(), 2, CLASSES))
    assert ex.readout.value != initial_readout and png(ex) != initial_png
    twin = figure_output(vc.plot_perturbation(model, images[0], poses[0], 2, offsets, "label", CLASSES))
    assert png(ex) == twin["data"]["image/png"]
    # only the label's capsule was perturbed: the other lengths are those of the unperturbed poses
    unperturbed = lengths_readout(capsule_lengths(poses[0]).tolist(), 2, CLASSES)
    assert ex.readout.value.split(" two:")[0] == readout_of(unperturbed).split(" two:")[0]

    ex.controls["sample"].value = 1  # the offsets stay; the label follows the sample
    p = vc.perturb_poses(poses[1], offsets, label=0)
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(p).tolist(), 0, CLASSES))
    assert "zero:" in ex.readout.value and "*" in ex.readout.value.split(" one:")[0]

    draws = ex.draws
    ex.buttons["reset"].click()
    assert ex.draws == draws + 1  # one redraw for the whole reset
    assert ex.values() == {"sample": 1, "d0": 0.0, "d1": 0.0, "d2": 0.0, "d3": 0.0}  # the sample is kept
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(poses[1]).tolist(), 0, CLASSES))


def test_perturbation_explorer_perturbs_every_capsule_by_default(run):
    model, images, poses, _ = run
    labels = torch.tensor([2, 0, 1])
    ex = perturbation_explorer(model, images, poses, labels)
    assert (ex.controls["d0"].min, ex.controls["d0"].max, ex.controls["d0"].step) == (-0.25, 0.25, 0.05)
    ex.controls["d0"].value = -0.25
    p = vc.perturb_poses(poses[0], [-0.25, 0.0, 0.0, 0.0])  # every capsule
    assert ex.readout.value == readout_of(lengths_readout(capsule_lengths(p).tolist(), label=2))
    twin = figure_output(vc.plot_perturbation(model, images[0], poses[0], 2, [-0.25, 0.0, 0.0, 0.0], "all"))
    assert png(ex) == twin["data"]["image/png"]


# ------------------------------------------------------------------------------------ generic widgets
def test_figure_output_is_a_display_data_png():
    fig, ax = plt.subplots(1, 2, figsize=(2, 1), dpi=50)
    for a in ax:
        a.set_axis_off()  # no tick labels: 10 pt text at 50 dpi would be too small to read (readable_figures)
    out = figure_output(fig)
    assert out["output_type"] == "display_data" and out["metadata"] == {}
    assert out["data"]["text/plain"] == "<Figure size 100x50 with 2 Axes>"
    assert base64.b64decode(out["data"]["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")


def test_explorer_without_readout_or_buttons():
    calls = []

    def draw(n):
        calls.append(n)
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot(range(n + 1))
        return fig

    ex = explorer({"n": W.IntSlider(value=2, min=0, max=5, description="n")}, draw)
    assert ex.readout.value == "" and ex.buttons == {} and calls == [2]
    assert list(ex.children) == [ex.controls["n"], ex.readout, ex.output]
    assert plt.get_fignums() == []  # the explorer closes every figure it draws
    ex.controls["n"].value = 4
    assert calls == [2, 4] and ex.last_values == {"n": 4} and ex.readout.value == ""
    ex.controls["n"].value = 4  # no change, no redraw
    assert calls == [2, 4]


def test_explorer_set_values_releases_hold_after_an_error():
    drawn = []

    def draw(a):
        drawn.append(a)
        return plt.figure(figsize=(1, 1))

    ex = explorer({"a": W.IntSlider(value=0, min=0, max=9)}, draw)
    with pytest.raises(KeyError):
        ex.set_values(a=3, missing=1)
    assert ex.controls["a"].value == 3 and drawn == [0]  # set before the error, not drawn
    ex.controls["a"].value = 5  # controls redraw again afterwards
    assert drawn == [0, 5]


def test_routing_explorer_clamps_initial_and_rejects_empty_traces():
    t = toy_votes(groups=(2, 2), n_outliers=1, seed=0)
    _, trace = dynamic_routing(t.votes, iterations=3, return_routing=True)
    T = len(trace.coefficients)
    assert routing_explorer(t, trace, initial=0).controls["t"].value == 1
    ex = routing_explorer(t, trace, initial=99)
    assert ex.controls["t"].value == T and ex.last_values == {"t": T}
    assert ex.readout.value == readout_of(toy.routing_readout(t, trace, T))
    ex.controls["t"].value = 2
    assert ex.readout.value == readout_of(toy.routing_readout(t, trace, 2))
    assert png(ex) == figure_output(toy.plot_routing_state(t, trace, 2))["data"]["image/png"]
    with pytest.raises(ValueError, match="no iterations"):
        routing_explorer(t, RoutingTrace("dynamic"))
