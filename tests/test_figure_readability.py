"""Figures a reader can read at the size the book shows them (:mod:`capsule_lib.viz.readability`).

The check itself on synthetic figures (small text, a five-panel row, a scaled-down wide figure, a page-mode frame's
dpi); then every figure function of :mod:`capsule_lib.viz` drawn with the shapes its chapter uses (the book's
numbers of classes, iterations, panels and images, on random or generated data), each checked by the
``readable_figures`` fixture (tests/conftest.py); and a test that no public figure function is left untested.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from capsule_lib.viz.plots import BOOK_STYLE, COLUMN_PX  # noqa: E402
from capsule_lib.viz.readability import check_figure_readable, displayed_width  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- the check
@pytest.fixture
def book_style():
    with matplotlib.rc_context(BOOK_STYLE):
        yield
    plt.close("all")


def test_small_text_in_a_scaled_down_figure_is_flagged(book_style):
    fig, axes = plt.subplots(1, 2, figsize=(13.76, 3))  # saved ~1140 px wide (tight): shown at ~0.6 x
    axes[0].set_title("a title", fontsize=14)  # 14 pt at 100 dpi = 19.4 px natural, ~11.8 px shown: readable
    axes[1].set_xlabel("an axis label", fontsize=8)  # ~6.8 px shown
    axes[1].tick_params(labelsize=14)
    axes[0].tick_params(labelsize=14)
    assert displayed_width(fig) == COLUMN_PX and displayed_width(fig, column_px=2000) > 1100
    problems = check_figure_readable(fig)
    assert any(p.startswith("axis label 'an axis label': 8 pt is 6.") for p in problems), problems
    assert not any("a title" in p for p in problems)
    assert all("tick label" not in p for p in problems)


def test_a_figure_within_the_column_is_shown_at_its_natural_size(book_style):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.set_title("6 pt = 8.3 px at 100 dpi", fontsize=6)
    ax.tick_params(labelsize=6)
    ax.set_xlabel("x", fontsize=6)
    ax.set_ylabel("y", fontsize=6)
    assert check_figure_readable(fig) == []
    assert displayed_width(fig) < COLUMN_PX
    assert check_figure_readable(fig, min_text_px=9)  # the threshold is a parameter
    assert check_figure_readable(fig, dpi=60)  # a page-mode frame saved at 60 dpi: 5 px


def test_rows_of_more_than_three_panels_are_flagged_grids_are_not(book_style):
    fig, axes = plt.subplots(1, 5, figsize=(6.8, 2))
    for ax in axes:
        ax.plot([0, 1], [0, 1])
        ax.tick_params(labelsize=7)
    fig.colorbar(axes[0].imshow([[0, 1]]), ax=list(axes))  # a colour bar is not a panel
    problems = check_figure_readable(fig)
    assert [p for p in problems if "panels" in p] == [
        "5 panels in one row (> 3): ['picture', 'untitled', 'untitled', 'untitled', 'untitled']"
    ]
    fig, axes = plt.subplots(2, 3, figsize=(6.8, 4))
    for ax in axes.flat:
        ax.plot([0, 1], [0, 1])
        ax.tick_params(labelsize=7)
    ax.twinx().plot([0, 1], [1, 0])  # a twin axes sits on its host: still three in that row
    assert check_figure_readable(fig) == []


def test_a_strip_of_pictures_may_hold_more_than_three(book_style):
    fig, axes = plt.subplots(2, 10, figsize=(6.8, 1.6))
    for ax in axes.flat:
        ax.imshow(torch.rand(8, 8).numpy())
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("7", fontsize=8)
    assert check_figure_readable(fig) == []
    axes[0, 0].set_yticks([0, 7])  # one chart among them: the row is a row of panels
    assert any("10 panels in one row" in p for p in check_figure_readable(fig))


def test_hidden_and_empty_texts_are_not_checked(book_style):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.tick_params(labelsize=8)
    ax.text(0.5, 0.5, "hidden", fontsize=2).set_visible(False)
    ax.text(0.5, 0.5, "", fontsize=2)
    ax.set_xticks([0.5], ["x"])
    assert check_figure_readable(fig) == []
    sub = fig.add_axes((0.6, 0.6, 0.2, 0.2))
    sub.plot([0, 1])
    sub.tick_params(labelsize=4)
    sub.axis("off")  # an axis turned off draws no tick labels
    assert check_figure_readable(fig) == []


def test_column_width_matches_the_browser_check():
    """The figures' column and the page check's column are the same measurement (688 px at 1280 px)."""
    assert COLUMN_PX == 688
    assert "688 px at the default" in (REPO / "book" / "_tools" / "screenshots.py").read_text()


# ------------------------------------------------------------------------------- every figure is tested
FIGURE_MODULES = (
    "plots",
    "toy",
    "capsules",
    "data",
    "compare",
    "robustness",
    "em",
    "heinsen",
    "inverted",
    "explorers",
    "page",
)


def _figure_functions() -> list[str]:
    """The public functions of ``capsule_lib.viz`` that draw a figure or an explorer of figures."""
    names = []
    for mod in FIGURE_MODULES:
        tree = ast.parse((REPO / "capsule_lib" / "viz" / f"{mod}.py").read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                n = node.name
                if n.startswith(("plot_", "show_")) or n.endswith("_explorer") or n == "image_grid":
                    names.append(n)
    return names


def test_every_public_figure_function_is_drawn_by_a_checked_test():
    """Each figure function of the book is called in a test module that checks its figures (``readable_figures``)."""
    checked = ""
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        if "readable_figures" in text:
            checked += text
    missing = [n for n in _figure_functions() if not re.search(rf"\b{n}\(", checked)]  # a call, not a longer name
    assert len(_figure_functions()) > 40
    assert missing == [], f"figure functions no checked test draws: {missing}"


# --------------------------------------------------------------------------- the book's figures, as drawn
@pytest.fixture(scope="module")
def digits():
    from capsule_lib.data.generated import glyph_digits

    x, y = glyph_digits(n=20, seed=0)
    return x, y


@pytest.fixture(scope="module")
def dynamic_trace():
    """Dynamic routing as in the CapsNet chapter: 32 x 6 x 6 primary capsules, 10 classes, 3 iterations."""
    from capsule_lib.routing import dynamic_routing

    torch.manual_seed(0)
    votes = torch.randn(3, 32 * 6 * 6, 10, 16) * 0.05
    with torch.no_grad():
        _, trace = dynamic_routing(votes, 3, return_routing=True)
    return trace.detach()


@pytest.fixture(scope="module")
def toy():
    from capsule_lib.analysis import toy_votes
    from capsule_lib.routing import dynamic_routing as route

    problem = toy_votes(groups=(5, 3), n_outliers=2, seed=0)  # the primer's toy problem
    _, trace = route(problem.votes, 8, return_routing=True)
    return problem, trace


@pytest.mark.usefixtures("readable_figures")
def test_book_primer_figures(toy):
    from capsule_lib.analysis import outlier_sweep
    from capsule_lib.viz import plots
    from capsule_lib.viz import toy as vt

    problem, trace = toy
    plots.plot_capsules(torch.tensor([[0.9, 0.2], [0.3, 0.4], [0.05, -0.05]]), ["confident", "unsure", "absent"])
    plots.plot_squash(max_norm=5.0)
    vt.plot_toy_iterations(problem, trace, iterations=[1, 3, 8])
    plots.plot_coefficients(
        trace, iterations=[1, 3, 8], child_labels=problem.child_labels(), parent_labels=problem.parent_names()
    )
    vt.plot_routing_state(problem, trace, 3)
    vt.plot_outlier_sweep(outlier_sweep(n_outliers=range(0, 13, 2), iterations=(1, 3), problems=20, progress=False))


@pytest.mark.usefixtures("readable_figures")
def test_book_toy_figures_with_three_parents():
    """Three parents: four panels, two rows (the parents, then the coefficients)."""
    from capsule_lib.analysis import toy_votes
    from capsule_lib.routing import dynamic_routing as route
    from capsule_lib.viz import toy as vt

    problem = toy_votes(groups=(4, 3, 3), n_outliers=2, seed=1)
    _, trace = route(problem.votes, 4, return_routing=True)
    fig = vt.plot_routing_state(problem, trace, 2)
    assert [ax.get_title()[:11] for ax in fig.axes[:3]] == ["iteration 2"] * 3
    vt.plot_toy_iterations(problem, trace)  # every iteration: four columns wrap into rows of at most three


@pytest.mark.usefixtures("readable_figures")
def test_book_capsnet_figures(digits, dynamic_trace):
    from capsule_lib.train import History
    from capsule_lib.viz import capsules as vc
    from capsule_lib.viz import plots

    x, y = digits
    classes = [str(k) for k in range(10)]
    vc.plot_image_grid(x[:20], [str(int(v)) for v in y[:20]], cols=10)
    vc.plot_image_grid(x[:20], [f"{int(v)}→{(int(v) + 1) % 10}" for v in y[:20]], cols=10)
    recs = [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 1.1 / e, "train_acc": 1 - 0.1 / e, "val_acc": 0.9}
        for e in (1, 2, 3)
    ]
    plots.plot_history(History(recs, {}))
    plots.plot_history(History(recs, {}), title="EM capsules, seed 0")
    vc.plot_routing_iterations(x[0], dynamic_trace, sample=0, classes=classes)
    vc.plot_routing_step(x[1], dynamic_trace, 1, 2, classes=classes)
    primary = torch.rand(3, 32 * 6 * 6)
    vc.plot_coupling_sharpening(dynamic_trace, primary)
    recon = torch.rand(10, 1, 28, 28)
    vc.plot_reconstructions(x[:10].float() / 255, recon, y[:10], y[:10])
    vc.plot_segmentation(
        x[:8].float() / 255,
        recon[:8],
        recon[:8].flip(0),
        torch.stack([y[:8], y[8:16]], 1),
        torch.stack([y[:8], y[8:16]], 1),
    )


@pytest.fixture(scope="module")
def capsnet10():
    from capsule_lib.models import CapsNet, CapsNetConfig

    torch.manual_seed(0)
    cfg = CapsNetConfig(conv_channels=8, primary_types=2, primary_dim=4, class_dim=16, decoder_hidden=(16, 32))
    return CapsNet(cfg).eval()


@pytest.mark.usefixtures("readable_figures")
def test_book_perturbation_figures(digits, capsnet10):
    import numpy as np

    from capsule_lib.viz import capsules as vc

    x, _ = digits
    images = x[:2].float() / 255
    with torch.no_grad():
        poses = capsnet10(images).poses  # [2, 10, 16]
    # the widest grid of the book (Efficient-CapsNet: 13 offsets x 16 dimensions; CapsNet's has 11 offsets)
    vc.plot_perturbation_grid(
        capsnet10, poses[0], 3, values=np.round(np.arange(-0.30, 0.3001, 0.05), 2), image=images[0]
    )
    vc.plot_perturbation(capsnet10, images[0], poses[0], 3, [0.25 if d in (1, 4) else 0.0 for d in range(16)])


@pytest.mark.usefixtures("readable_figures")
def test_book_self_attention_figure(digits):
    from capsule_lib.models import EfficientCapsNet, EfficientCapsNetConfig
    from capsule_lib.viz import capsules as vc

    torch.manual_seed(0)
    m = EfficientCapsNet(EfficientCapsNetConfig(decoder_hidden=(16,))).eval()  # 16 primary capsules, 10 classes
    x, _ = digits
    with torch.no_grad():
        out = m(x[:2].float() / 255, return_routing=True)
    vc.plot_self_attention(x[0], out.trace.detach(), sample=0)


@pytest.mark.usefixtures("readable_figures")
def test_book_em_figures():
    from capsule_lib.models import EMCapsNet, EMCapsNetConfig
    from capsule_lib.viz.em import plot_em_iterations, plot_em_state

    torch.manual_seed(0)
    cfg = EMCapsNetConfig(in_channels=2, image_size=32, conv_channels=8, primary_types=8, caps1_types=8, caps2_types=8)
    m = EMCapsNet(cfg).eval()  # five classes, three iterations, as the chapter's model
    x = torch.rand(1, 2, 32, 32)
    with torch.no_grad():
        poses, acts = m.class_inputs(x)
        _, trace = m.route_classes(poses, acts)
    classes = ["animal", "human", "airplane", "truck", "car"]
    fig = plot_em_iterations(x[0], trace.detach(), 0, classes=classes)
    assert sum(ax.get_title().startswith("after iteration") for ax in fig.axes) == 3
    plot_em_state(x[0], trace.detach(), 0, None, classes, 2, title="3 iteration(s), lambda × 0.01")


@pytest.mark.usefixtures("readable_figures")
def test_book_heinsen_figures():
    from capsule_lib.data.sequences import marker_sequences
    from capsule_lib.viz import heinsen as vh

    torch.manual_seed(0)
    classes = ["animal", "human", "airplane", "truck", "car"]
    poses = torch.randn(5, 2, 18, 16)  # 5 class capsules x 2 objects x 18 azimuths
    fig = vh.plot_pose_trajectories(
        poses, list(range(0, 360, 20)), classes, ["object 0", "object 1"], "azimuth (degrees)",
        title="rendered_norb: class-capsule poses around each object (Heinsen routing, seed 0)",
    )  # fmt: skip
    assert [ax.get_title() for ax in fig.axes[:5]] == [f"class capsule '{c}'" for c in classes]
    vh.plot_pose_trajectories(
        torch.randn(5, 2, 9, 16), [30 + 5 * e for e in range(9)], classes, ["object 0", "object 1"],
        "elevation (degrees)", cyclic=False, title="rendered_norb: class-capsule poses as the camera rises",
    )  # fmt: skip
    probs = torch.softmax(torch.randn(5), 0)
    track = torch.randn(18, 2)
    vh.plot_viewpoint_state(torch.rand(2, 48, 48), probs, track, 3, classes, 4, track + 0.1, title="azimuth 60 deg")
    maps = torch.rand(3, 5, 6, 6)
    vh.plot_class_credits(torch.rand(2, 48, 48), maps, classes, 4)
    vh.plot_class_credits(torch.rand(2, 48, 48), maps[-1:], classes, 4, [3])
    s = marker_sequences(4, seed=7)
    credits = torch.randn(4, s.tokens.shape[1], len(s.classes))
    vh.plot_token_credits(s.tokens, credits, s.classes, s.labels, s.labels, len(s.classes))
    vh.plot_token_credits(s.tokens, credits, s.classes, s.labels, s.labels, len(s.classes), label="logit drop")
    rows = [
        {"kind": k, "n_inp": i, "n_out": o, "saved_mib": i * o * f, "ms": i * o * f / 10}
        for k, f in (("dynamic", 1.0), ("heinsen_2019", 0.3), ("heinsen_2022", 0.1))
        for i, o in [(n, 32) for n in (64, 256, 1024, 4096)] + [(1024, n) for n in (8, 128)]
    ]
    vh.plot_routing_scaling(rows, title="one routing layer, d = 16, batch 4 (live measurement)")


@pytest.mark.usefixtures("readable_figures")
def test_book_comparison_figures():
    from capsule_lib.comparison import CONTESTANTS, LABELS
    from capsule_lib.train import History
    from capsule_lib.viz import compare

    rows = [
        {"model": LABELS[n], "accuracy": 0.99 - 0.004 * k, "params": 10 ** (5 + k / 3), "train_img_per_s": 50 * (k + 1),
         "affine": 0.7 + 0.02 * k, "familiar": 0.9, "novel": 0.8 - 0.01 * k}
        for k, n in enumerate(CONTESTANTS)
    ]  # fmt: skip
    compare.plot_pareto(rows, title="MNIST test accuracy against cost (costs: cpu, 2 threads, torch 2.6, 2025-01-01)")
    compare.plot_robustness(
        rows, "accuracy", "affine", labels=("MNIST test", "affNIST"),
        title="accuracy on the test digits and on their affine-transformed copies (drop in points)",
    )  # fmt: skip
    compare.plot_pareto(
        rows, axes=(("params", "parameters", True),), y="novel", title="smallNORB-like, novel viewpoints"
    )
    hist = {
        LABELS[n]: History([{"epoch": e, "val_acc": 0.9 + 0.01 * e, "wall_time": 60.0 * e} for e in (1, 2, 3)], {})
        for n in CONTESTANTS
    }
    compare.plot_budget_curves(hist, title="MNIST: validation accuracy against training time (open circle: stopped)")
    sweeps = {
        LABELS[n]: [{"iterations": t, "accuracy": 0.98 + 0.001 * t, "ms_per_image": 0.1 * t} for t in (1, 2, 3, 4, 5)]
        for n in CONTESTANTS[:-1]
    }
    compare.plot_iteration_sweeps(sweeps, trained={k: 3 for k in sweeps}, title="1000 MNIST test images")
    res = json.loads((REPO / "benchmarks" / "results" / "routing_scaling_cpu.json").read_text())
    compare.plot_routing_costs(res["rows"], title="routing layers alone, forward + backward (committed run)")


@pytest.mark.usefixtures("readable_figures")
def test_book_tsai_figures():
    from capsule_lib.analysis import class_attention_maps, grid_geometry
    from capsule_lib.models import CapsModel, CapsModelConfig
    from capsule_lib.viz import inverted as vi

    vi.plot_schedules(n_layers=3, iterations=3)
    vi.plot_expansion_bug(size=7, kernel_size=3, stride=2, d=16)
    rows = [
        {"setting": s, "iterations": t, "accuracy": 0.6 + 0.01 * t, "ms_per_image": 0.5 * t}
        for s in ("concurrent", "sequential")
        for t in (1, 2, 3, 4)
    ]
    vi.plot_iteration_sweep(rows, title="CPU-sized capsule network (trained with T = 2, concurrent), 1000 images")
    torch.manual_seed(0)
    m = CapsModel(CapsModelConfig.cifar10_cpu()).eval()
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with torch.no_grad():
        out = m(x[:1].float() / 255, return_routing=True)
    conv1, trace1 = m.capsule_layers[0], out.trace.extra["layers"][0]
    vi.plot_conv_window(
        x[0], trace1.coefficients[-1][0], grid_geometry(m)[0], (3, 3), conv1.kernel_size, conv1.stride, conv1.n_inp,
        title="first CONV capsule layer, update 2 (true class: automobile)",
    )  # fmt: skip
    maps, probs = class_attention_maps(m, x)
    vi.plot_attention_maps(
        x, maps, classes, grid_geometry(m)[-1], probs[:, -1].argmax(1).tolist(), list(range(6)), probs,
        title="routing into the predicted class, every update",
    )  # fmt: skip


@pytest.mark.usefixtures("readable_figures")
def test_book_data_figures(tmp_path):
    from capsule_lib.data import get_dataset
    from capsule_lib.viz import data as vd

    g = get_dataset("glyph_digits", tmp_path, "test", n=40)
    vd.show_samples(g, n=16, title="glyph_digits (the offline stand-in for MNIST)")
    mm = get_dataset("multimnist", tmp_path, "test", source="glyph_digits", n=40)
    vd.show_multimnist(mm, n=8, title="MultiMNIST, Sabour recipe (±4 px)")
    vd.plot_overlap({"Sabour ±4 px": mm, "Efficient ±6 px": mm})
    am = get_dataset("affine_mnist", tmp_path, "test", source="glyph_digits", n=20)
    vd.show_affine(am, n=16)
    sample = get_dataset("rendered_norb", tmp_path, "test", n=10)
    vd.show_stereo_pairs(sample, n=10, title="rendered_norb test: random stereo pairs (left | right)")
    sweep = get_dataset(
        "rendered_norb", tmp_path, "train_full", categories=[2], instances=[6], lightings=[0],
        elevations=list(range(9)), azimuths=list(range(18)),
    )  # fmt: skip
    vd.show_viewpoints(sweep, category=2, instance=6, lighting=0)
    vd.show_viewpoints(sweep, category=2, lighting=0, elevations=[0, 4, 8], azimuths=list(range(0, 18, 2)))
    lights = get_dataset(
        "rendered_norb", tmp_path, "train_full", categories=[0], instances=[7], elevations=[2], azimuths=[4]
    )
    vd.show_lightings(lights, category=0, instance=7, elevation=2, azimuth=4)
    per_cat = get_dataset(
        "rendered_norb", tmp_path, "train_full", elevations=[3], azimuths=[2], lightings=[1], instances=[4, 9]
    )
    vd.image_grid(
        per_cat.images[:, :1],
        [f"{per_cat.classes[int(c)]} #{int(i)}" for c, i in zip(per_cat.labels, per_cat.extra["instance"])],
        ncols=10,
        title="rendered_norb: training instances of each category (left camera)  [GENERATED]",
    )
