"""capsule_lib.viz static figures: structure and plotted values of every figure function on tiny models.

Complements tests/test_viz.py (toy routing, squash, history, the routing explorer) and tests/test_data_viz.py
(the data page's figures on generated sets): here the capsule-classifier figures of ``viz.capsules`` on a tiny
randomly initialised CapsNet / Efficient-CapsNet, and the remaining branches of ``viz.plots``, ``viz.toy`` and
``viz.data``. Everything runs on the CPU with 4 images.
"""

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from capsule_lib import RoutingTrace, capsule_lengths, squash_efficient  # noqa: E402
from capsule_lib.analysis import toy_votes  # noqa: E402
from capsule_lib.data.datasets import ImageDataset  # noqa: E402
from capsule_lib.data.generated import glyph_digits  # noqa: E402
from capsule_lib.models import EfficientCapsNet, EfficientCapsNetConfig  # noqa: E402
from capsule_lib.routing import dynamic_routing  # noqa: E402
from capsule_lib.train import History  # noqa: E402
from capsule_lib.viz import capsules as vc  # noqa: E402
from capsule_lib.viz import data as vd  # noqa: E402
from capsule_lib.viz import plots, toy  # noqa: E402
from capsule_lib.viz.data import to_display  # noqa: E402

#: figures readable at the book's size (conftest.py: readable_figures also closes them), one thread
pytestmark = pytest.mark.usefixtures("readable_figures", "one_thread")

GRID = (2, 6, 6)  # primary capsule grid of the tiny CapsNet: 2 types x 6x6 (28 -9+1 = 20 -> (20-9)//2+1 = 6)
CLASSES = ["zero", "one", "two"]
ORANGE, BLUE = to_rgba("tab:orange"), to_rgba("tab:blue")


# ------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def images():
    x, _ = glyph_digits(n=4, seed=0)  # uint8 [4, 1, 28, 28]
    return x.float() / 255.0


@pytest.fixture(scope="module")
def capsnet(images, tiny_capsnet):
    assert tiny_capsnet.config.n_primary == GRID[0] * GRID[1] * GRID[2]
    with torch.no_grad():
        out = tiny_capsnet(images, return_routing=True)
        primary_lengths = capsule_lengths(tiny_capsnet.primary_capsules(images))  # [4, 72]
    return tiny_capsnet, out, out.trace.detach(), primary_lengths


@pytest.fixture(scope="module")
def efficient(images):
    torch.manual_seed(0)
    model = EfficientCapsNet(
        EfficientCapsNetConfig(
            conv_channels=(4, 4, 4, 16), n_primary_caps=4, primary_dim=4, n_classes=3, class_dim=4, decoder_hidden=(16,)
        )
    ).eval()
    with torch.no_grad():
        out = model(images, return_routing=True)
    return model, out, out.trace.detach()


def _bars(ax):
    return np.array([p.get_height() for p in ax.patches])


def _colors(ax):
    return [tuple(p.get_facecolor()) for p in ax.patches]


def _xticklabels(ax):
    return [t.get_text() for t in ax.get_xticklabels()]


def _img(ax, k=0):
    return np.asarray(ax.images[k].get_array())


def _decode(model, poses, label):
    with torch.no_grad():
        return model.reconstruct(poses, torch.full((poses.shape[0],), label, dtype=torch.long))


# ------------------------------------------------------------------------------------------- helpers
def test_to_display_layouts_and_range():
    g = torch.tensor([[[0, 255], [51, 102]]], dtype=torch.uint8)  # [1, 2, 2]
    np.testing.assert_allclose(to_display(g), [[0.0, 1.0], [0.2, 0.4]], atol=1e-6)
    rgb = torch.stack([torch.full((2, 3), v) for v in (0.1, 0.5, 2.0)])  # [3, 2, 3], one value out of range
    out = to_display(rgb)
    assert out.shape == (2, 3, 3)
    np.testing.assert_allclose(out[0, 0], [0.1, 0.5, 1.0], atol=1e-6)  # channels last, clamped to [0, 1]
    assert to_display(torch.full((4, 5), -1.0)).shape == (4, 5)
    assert to_display(torch.full((4, 5), -1.0)).min() == 0.0


def test_coupling_grid_is_type_major(capsnet):
    _, _, trace, _ = capsnet
    T = len(trace.coefficients)
    g = vc.coupling_grid(trace, sample=2, parent=1, grid=GRID)
    assert g.shape == (T, *GRID)
    n, h, w = GRID
    for t, c, y, x in [(0, 0, 0, 0), (T - 1, 1, 2, 5), (1, 1, 5, 0)]:
        i = c * h * w + y * w + x
        assert g[t, c, y, x] == trace.coefficients[t][2, i, 1]


def test_routing_contributions_weight_couplings_by_vote_length(capsnet):
    _, _, trace, _ = capsnet
    r = vc.routing_contributions(trace, sample=1, parent=2, grid=GRID)
    assert r.shape == (len(trace.coefficients), *GRID)
    norm = trace.extra["votes"][1, :, 2].norm(dim=-1)  # [72]
    expected = torch.stack([c[1, :, 2] * norm for c in trace.coefficients]).reshape(-1, *GRID)
    torch.testing.assert_close(r, expected)


def test_coupling_entropy_uniform_first_iteration_and_weights(capsnet):
    _, _, trace, primary_lengths = capsnet
    ent = vc.coupling_entropy(trace)
    assert ent.shape == (len(trace.coefficients),)
    assert ent[0].item() == pytest.approx(math.log(3), abs=1e-5)  # iteration 1: uniform couplings over 3 parents
    assert (ent[1:] < math.log(3)).all()
    # equal weights give the plain mean; a one-hot weight gives that child's entropy
    torch.testing.assert_close(vc.coupling_entropy(trace, torch.ones(4, 72)), ent)
    w = torch.zeros(4, 72)
    w[3, 10] = 5.0
    c = trace.coefficients[-1][3, 10]
    assert vc.coupling_entropy(trace, w)[-1].item() == pytest.approx(float(-(c * c.log()).sum()), rel=1e-5)
    weighted = vc.coupling_entropy(trace, primary_lengths)
    assert weighted.shape == ent.shape and not torch.allclose(weighted[1:], ent[1:])


# ------------------------------------------------------------------------------------- routing figures
def test_plot_routing_step_panels_and_values(capsnet, images):
    _, _, trace, _ = capsnet
    fig = vc.plot_routing_step(images[1], trace, sample=1, iteration=1, grid=GRID, classes=CLASSES)
    assert len(fig.axes) == 5  # four panels + the mosaic's colour bar
    ax_in, ax_mosaic, ax_sent, ax_len = fig.axes[:4]
    final = capsule_lengths(trace.outputs[-1][1])
    parent = int(final.argmax())
    assert ax_in.get_title() == "input"
    np.testing.assert_allclose(_img(ax_in), images[1, 0].numpy())
    assert ax_mosaic.get_title() == f"iteration 2: c(i -> '{CLASSES[parent]}') per capsule type"
    mosaic = _img(ax_mosaic)  # 2 tiles of 6x6 in a row of 8 (1-pixel gutters), the rest NaN
    assert mosaic.shape == (6, 8 * 7 - 1)
    coup = vc.coupling_grid(trace, 1, parent, GRID)[1]
    np.testing.assert_allclose(mosaic[:, :6], coup[0].numpy())
    np.testing.assert_allclose(mosaic[:, 7:13], coup[1].numpy())
    assert np.isnan(mosaic[:, 6]).all() and np.isnan(mosaic[:, 14:]).all()
    assert ax_sent.get_title() == "sent to it (sum over types)"
    np.testing.assert_allclose(
        _img(ax_sent), vc.routing_contributions(trace, 1, parent, GRID)[1].sum(0).numpy(), rtol=1e-6
    )
    assert ax_len.get_title() == "output capsule lengths"
    np.testing.assert_allclose(_bars(ax_len), capsule_lengths(trace.outputs[1][1]).numpy(), rtol=1e-6)
    assert _colors(ax_len) == [ORANGE if k == parent else BLUE for k in range(3)]
    assert _xticklabels(ax_len) == CLASSES and ax_len.get_ylim() == (0, 1)


def test_plot_routing_step_explicit_parent_and_no_votes(capsnet, images):
    _, _, trace, _ = capsnet
    no_votes = dataclasses.replace(trace, extra={k: v for k, v in trace.extra.items() if k != "votes"})
    fig = vc.plot_routing_step(images[0], no_votes, sample=0, iteration=0, parent=2, grid=GRID)
    ax_mosaic, ax_sent, ax_len = fig.axes[1:4]
    assert "'2'" in ax_mosaic.get_title() and ax_mosaic.get_title().startswith("iteration 1:")
    assert ax_sent.get_title() == "mean coupling"
    coup = vc.coupling_grid(trace, 0, 2, GRID)[0]
    np.testing.assert_allclose(_img(ax_sent), coup.mean(0).numpy(), rtol=1e-6)
    assert _colors(ax_len)[2] == ORANGE and _xticklabels(ax_len) == ["0", "1", "2"]


def test_plot_routing_iterations_one_row_per_iteration(capsnet, images):
    _, _, trace, _ = capsnet
    T = len(trace.coefficients)
    fig = vc.plot_routing_iterations(images[3], trace, sample=3, grid=GRID, classes=CLASSES)
    assert len(fig.axes) == 1 + 3 * T + T  # the input, T rows of 3 panels, one colour bar per row
    ax_in = fig.axes[0]
    assert ax_in.get_title() == "input"
    np.testing.assert_allclose(_img(ax_in), images[3, 0].numpy())
    rows = np.array(fig.axes[1:]).reshape(T, 4)[:, :3]  # mosaic, sent, lengths (then the row's colour bar)
    parent = int(capsule_lengths(trace.outputs[-1][3]).argmax())
    contrib = vc.routing_contributions(trace, 3, parent, GRID).sum(1)  # [T, h, w]
    for t in range(T):
        assert rows[t, 0].get_ylabel() == f"iteration {t + 1}"
        np.testing.assert_allclose(_img(rows[t, 1]), contrib[t].numpy(), rtol=1e-6)
        assert rows[t, 1].images[0].get_clim() == pytest.approx((0, float(contrib.max())))  # shared scale
        np.testing.assert_allclose(_bars(rows[t, 2]), capsule_lengths(trace.outputs[t][3]).numpy(), rtol=1e-6)
        assert _colors(rows[t, 2]) == [ORANGE if k == parent else BLUE for k in range(3)]
    assert rows[1, 0].get_title() == ""
    assert f"'{CLASSES[parent]}'" in rows[0, 0].get_title()
    assert rows[0, 2].get_title() == "output lengths"


def test_plot_routing_iterations_without_votes_uses_mean_coupling(capsnet, images):
    _, _, trace, _ = capsnet
    no_votes = dataclasses.replace(trace, extra={})
    fig = vc.plot_routing_iterations(images[0], no_votes, sample=0, parent=1, grid=GRID)
    T = len(trace.coefficients)
    rows = np.array(fig.axes[1:]).reshape(T, 4)
    coup = vc.coupling_grid(trace, 0, 1, GRID)
    np.testing.assert_allclose(_img(rows[-1, 1]), coup[-1].mean(0).numpy(), rtol=1e-6)
    assert _colors(rows[0, 2])[1] == ORANGE


def test_plot_routing_iterations_title_follows_the_grid(capsnet, images):
    _, _, trace, _ = capsnet
    fig = vc.plot_routing_iterations(images[0], trace, sample=0, grid=GRID)
    title = fig.axes[1].get_title()
    assert "4x8" not in title and "32" not in title


def test_plot_coupling_sharpening(capsnet):
    _, _, trace, primary_lengths = capsnet
    T = len(trace.coefficients)
    fig = vc.plot_coupling_sharpening(trace, primary_lengths)
    ax_ent, ax_hist = fig.axes
    line, uniform = ax_ent.get_lines()
    np.testing.assert_allclose(line.get_xdata(), np.arange(1, T + 1))
    np.testing.assert_allclose(line.get_ydata(), vc.coupling_entropy(trace, primary_lengths).numpy(), rtol=1e-6)
    np.testing.assert_allclose(uniform.get_ydata(), [math.log(3)] * 2)
    assert [t.get_text() for t in ax_ent.texts] == [" uniform = ln 3"]
    assert ax_ent.get_xlabel() == "iteration" and ax_hist.get_yscale() == "log"
    assert len(ax_hist.patches) == T  # one step histogram per iteration
    assert [t.get_text() for t in ax_hist.get_legend().get_texts()] == [f"iteration {t + 1}" for t in range(T)]
    # the histograms count the couplings to each image's winning capsule
    winners = capsule_lengths(trace.outputs[-1]).argmax(-1)
    bins = np.linspace(0, 1, 41)
    for t in range(T):
        vals = torch.stack([trace.coefficients[t][b, :, winners[b]] for b in range(4)]).flatten().numpy()
        counts, _ = np.histogram(vals, bins=bins)
        assert ax_hist.patches[t].get_xy()[:, 1].max() == counts.max()


def test_plot_coupling_sharpening_explicit_parents(capsnet):
    _, _, trace, _ = capsnet
    parent_of = torch.tensor([2, 2, 2, 2])
    fig = vc.plot_coupling_sharpening(trace, parent_of=parent_of)
    ax_ent, ax_hist = fig.axes
    np.testing.assert_allclose(ax_ent.get_lines()[0].get_ydata(), vc.coupling_entropy(trace).numpy(), rtol=1e-6)
    vals = trace.coefficients[-1][:, :, 2].flatten().numpy()
    counts, _ = np.histogram(vals, bins=np.linspace(0, 1, 41))
    assert ax_hist.patches[-1].get_xy()[:, 1].max() == counts.max()


# ------------------------------------------------------------------------------- reconstructions
def test_plot_reconstructions(capsnet, images):
    _, out, _, _ = capsnet
    recons = out.reconstruction
    fig = vc.plot_reconstructions(images, recons, labels=[3, 1, 4, 1], preds=torch.tensor([3, 0, 4, 2]), n=3)
    axes = np.array(fig.axes).reshape(2, 3)
    assert [a.get_title() for a in axes[0]] == ["y=3 p=3", "y=1 p=0", "y=4 p=4"]
    assert axes[0, 0].get_ylabel() == "input" and axes[1, 0].get_ylabel() == "recon."
    for k in range(3):
        np.testing.assert_allclose(_img(axes[0, k]), images[k, 0].numpy())
        np.testing.assert_allclose(_img(axes[1, k]), recons[k, 0].numpy(), rtol=1e-6)
        assert list(axes[1, k].get_xticks()) == []
    fig = vc.plot_reconstructions(images, recons, n=10)  # n is capped by the batch; no titles without labels
    assert len(fig.axes) == 2 * 4 and all(a.get_title() == "" for a in fig.axes)


def test_perturb_poses_all_or_one_capsule():
    poses = torch.arange(12, dtype=torch.float32).view(3, 4)  # [K=3, D=4]
    off = [0.5, 0.0, -1.0, 0.0]
    every = vc.perturb_poses(poses, off)
    torch.testing.assert_close(every - poses, torch.tensor(off).expand(3, 4))
    one = vc.perturb_poses(poses, torch.tensor(off), label=1)
    torch.testing.assert_close(one[1], poses[1] + torch.tensor(off))
    torch.testing.assert_close(one[[0, 2]], poses[[0, 2]])
    assert poses[1, 0] == 4.0  # the input is not modified
    batched = vc.perturb_poses(torch.zeros(2, 3, 4), off, label=2)  # [B, K, D]
    assert batched[:, 2].tolist() == [off, off] and batched[:, :2].abs().sum() == 0


def test_plot_lengths_into_given_axes():
    fig, ax = plt.subplots()
    vc.plot_lengths(ax, np.array([0.1, 0.9, 0.4]), highlight=1, classes=["a", "b", "c"])
    np.testing.assert_allclose(_bars(ax), [0.1, 0.9, 0.4])
    assert _colors(ax) == [BLUE, ORANGE, BLUE]
    assert _xticklabels(ax) == ["a", "b", "c"] and ax.get_title() == "capsule lengths" and ax.get_ylim() == (0, 1)
    fig, ax = plt.subplots()
    vc.plot_lengths(ax, np.array([0.2, 0.3]))
    assert _colors(ax) == [BLUE, BLUE] and _xticklabels(ax) == ["0", "1"]


@pytest.mark.parametrize("perturb", ["all", "label"])
def test_plot_perturbation(capsnet, images, perturb):
    model, out, _, _ = capsnet
    poses, label, offsets = out.poses[1], 2, [0.3, 0.0, -0.2, 0.1]
    fig = vc.plot_perturbation(model, images[1], poses, label, offsets, perturb=perturb, classes=CLASSES)
    ax_in, ax_rec, ax_len = fig.axes
    assert (ax_in.get_title(), ax_rec.get_title(), ax_len.get_title()) == ("input", "reconstruction", "capsule lengths")
    p = vc.perturb_poses(poses, offsets, None if perturb == "all" else label)
    np.testing.assert_allclose(_img(ax_in), images[1, 0].numpy())
    np.testing.assert_allclose(_img(ax_rec), _decode(model, p[None], label)[0, 0].numpy(), rtol=1e-5, atol=1e-6)
    bars = _bars(ax_len)
    np.testing.assert_allclose(bars, capsule_lengths(p).numpy(), rtol=1e-6)
    unperturbed = capsule_lengths(poses).numpy()
    if perturb == "label":  # only the label's capsule changes length
        np.testing.assert_allclose(bars[:2], unperturbed[:2], rtol=1e-6)
    else:
        assert not np.allclose(bars[:2], unperturbed[:2])
    assert bars[2] != pytest.approx(unperturbed[2])
    assert _colors(ax_len)[label] == ORANGE and _xticklabels(ax_len) == CLASSES


def test_plot_perturbation_grid_cells_are_the_perturbed_reconstructions(capsnet, images):
    model, out, _, _ = capsnet
    poses, label = out.poses[0], 1
    values, dims = (-0.2, 0.0, 0.3), [0, 2]
    fig = vc.plot_perturbation_grid(model, poses, label, values=values, dims=dims, image=images[0])
    axes = np.array(fig.axes).reshape(1 + len(dims), 1 + len(values))
    assert axes[0, 1].get_title() == "input" and axes[0, 2].get_title() == "recon."
    np.testing.assert_allclose(_img(axes[0, 1]), images[0, 0].numpy())
    np.testing.assert_allclose(_img(axes[0, 2]), _decode(model, poses[None], label)[0, 0].numpy(), rtol=1e-5, atol=1e-6)
    assert not axes[0, 0].axison and not axes[0, 3].axison  # unused cells of the top row stay blank
    assert [axes[1 + r, 0].texts[0].get_text() for r in range(2)] == ["dim 0", "dim 2"]
    assert [a.get_xlabel() for a in axes[-1, 1:]] == ["-0.20", "+0.00", "+0.30"]
    assert all(a.get_xlabel() == "" for a in axes[1, 1:])  # values are written under the last row only
    for r, d in enumerate(dims):
        for c, v in enumerate(values):
            p = poses.clone()
            p[label, d] += v
            np.testing.assert_allclose(
                _img(axes[1 + r, 1 + c]), _decode(model, p[None], label)[0, 0].numpy(), rtol=1e-5, atol=1e-6
            )


def test_plot_perturbation_grid_defaults(efficient):
    model, out, _ = efficient
    fig = vc.plot_perturbation_grid(model, out.poses[2], 0)
    D = out.poses.shape[-1]
    axes = np.array(fig.axes).reshape(D, 12)  # all D dimensions, 11 default values (-0.25 .. +0.25) + labels
    labels = [a.get_xlabel() for a in axes[-1, 1:]]
    assert labels[0] == "-0.25" and labels[-1] == "+0.25" and "+0.00" in labels and "-0.00" not in labels
    assert [axes[r, 0].texts[0].get_text() for r in range(D)] == [f"dim {d}" for d in range(D)]


def test_plot_segmentation_overlays_red_and_green(capsnet, images):
    _, out, _, _ = capsnet
    rec_a, rec_b = out.reconstruction, images.flip(-1)
    labels, preds = torch.tensor([[1, 7], [2, 3], [0, 9]]), torch.tensor([[1, 7], [3, 5], [0, 9]])
    fig = vc.plot_segmentation(images, rec_a, rec_b, labels, preds, n=3)
    axes = np.array(fig.axes).reshape(2, 3)
    assert [a.get_title() for a in axes[0]] == ["y=1,7\np=1,7", "y=2,3\np=3,5", "y=0,9\np=0,9"]
    assert axes[0, 0].get_ylabel() == "input" and axes[1, 0].get_ylabel() == "red/green"
    for k in range(3):
        rgb = _img(axes[1, k])
        assert rgb.shape == (28, 28, 3)
        np.testing.assert_allclose(rgb[..., 0], rec_a[k, 0].numpy(), rtol=1e-6)
        np.testing.assert_allclose(rgb[..., 1], rec_b[k, 0].numpy(), rtol=1e-6)
        assert (rgb[..., 2] == 0).all()
    fig = vc.plot_segmentation(images, rec_a, rec_b, preds=preds[:2].repeat(2, 1))
    assert len(fig.axes) == 8 and fig.axes[0].get_title() == "p=1,7"  # no empty label line


def test_plot_image_grid_blank_cells_and_titles(images):
    u8 = (images * 255).round().to(torch.uint8)
    imgs = torch.cat([u8, u8[:1]])  # 5 images
    fig = vc.plot_image_grid(imgs, titles=[f"#{k}" for k in range(5)], cols=3)
    assert len(fig.axes) == 6
    for k, ax in enumerate(fig.axes[:5]):
        assert ax.get_title() == f"#{k}" and ax.axison
        np.testing.assert_allclose(_img(ax), imgs[k, 0].float().numpy() / 255.0, rtol=1e-6)
    assert not fig.axes[5].axison and not fig.axes[5].images
    fig = vc.plot_image_grid(u8[:2])
    assert len(fig.axes) == 10 and all(a.get_title() == "" for a in fig.axes)  # one row of the default 10 columns


def test_capsule_figures_draw_stereo_images():
    x = torch.rand(2, 2, 8, 8)  # smallNORB-like stereo pairs, as Efficient-CapsNet's smallNORB preset reads them
    fig = vc.plot_reconstructions(x, x, n=2)
    assert len(fig.axes) == 4
    for ax in fig.axes:
        arr = _img(ax)
        assert arr.ndim == 2 or arr.shape[-1] in (3, 4)  # something imshow can show
    assert len(vc.plot_image_grid(x, cols=2).axes) == 2


# ---------------------------------------------------------------------------- self-attention routing
def test_plot_self_attention(efficient, images):
    _, out, trace = efficient
    assert len(trace.coefficients) == 1
    s = 2
    fig = vc.plot_self_attention(images[s], trace, sample=s, classes=CLASSES)
    assert len(fig.axes) == 5 + 3  # five panels, three colour bars
    ax_in, ax_attn, ax_c, ax_cb, ax_len = fig.axes[:5]
    lengths = capsule_lengths(trace.outputs[-1][s])
    parent = int(lengths.argmax())
    assert parent == int(out.scores[s].argmax())
    assert ax_in.get_title() == "input"
    attn = trace.extra["attention"][s, parent].numpy()
    np.testing.assert_allclose(_img(ax_attn), attn, rtol=1e-6)
    lim = np.abs(attn).max()
    assert ax_attn.images[0].get_clim() == pytest.approx((-lim, lim))  # symmetric colour scale
    assert ax_attn.get_title() == f"attention between votes for '{CLASSES[parent]}'"
    np.testing.assert_allclose(_img(ax_c), trace.coefficients[-1][s].numpy(), rtol=1e-6)
    np.testing.assert_allclose(_img(ax_cb), trace.extra["coefficients_with_prior"][s].numpy(), rtol=1e-6)
    assert _xticklabels(ax_c) == CLASSES and ax_c.get_xlabel() == "class j"
    np.testing.assert_allclose(_bars(ax_len), lengths.numpy(), rtol=1e-6)
    assert _colors(ax_len)[parent] == ORANGE


def test_plot_self_attention_zero_attention_and_explicit_parent():
    I, J = 3, 2
    c = torch.full((1, I, J), 0.5)
    trace = RoutingTrace(
        "self_attention",
        coefficients=[c],
        outputs=[torch.tensor([[[0.6, 0.0], [0.0, 0.3]]])],
        extra={"attention": torch.zeros(1, J, I, I), "coefficients_with_prior": c + 0.1},
    )
    fig = vc.plot_self_attention(torch.zeros(1, 4, 4), trace, sample=0, parent=1)
    ax_attn, ax_len = fig.axes[1], fig.axes[4]
    assert ax_attn.images[0].get_clim() == (-1.0, 1.0)  # all-zero attention: a unit scale, not a 0-width one
    assert ax_attn.get_title() == "attention between votes for '1'"
    np.testing.assert_allclose(_bars(ax_len), [0.6, 0.3], rtol=1e-6)
    assert _colors(ax_len) == [BLUE, ORANGE]


# ---------------------------------------------------------------------------------------- viz.plots
def test_set_style_applies_the_book_style():
    with matplotlib.rc_context():
        plt.rcParams["axes.grid"] = False
        plots.set_style()
        for key, value in plots.BOOK_STYLE.items():
            got = plt.rcParams[key]
            assert (tuple(got) if isinstance(got, list) else got) == value, key


def test_plot_squash_into_given_axes():
    fig, ax = plt.subplots()
    assert plots.plot_squash(max_norm=3.0, n=30, ax=ax) is fig
    hinton, eff, ref, one = ax.get_lines()
    x = torch.tensor(eff.get_xdata(), dtype=torch.float32)
    np.testing.assert_allclose(
        eff.get_ydata(), capsule_lengths(squash_efficient(torch.stack([x, torch.zeros_like(x)], -1))).numpy(), atol=1e-6
    )
    np.testing.assert_allclose(ref.get_ydata(), np.minimum(x.numpy(), 1.0))
    assert len(x) == 30 and ax.get_xlim() == (0, 3.0) and (eff.get_ydata() <= 1).all()
    assert [t.get_text() for t in ax.get_legend().get_texts()][2] == r"$\min(|s|, 1)$"


def test_plot_capsules_from_a_list_into_given_axes():
    fig, ax = plt.subplots()
    vecs = [[3.0, 0.0], [-0.6, -0.8]]
    assert plots.plot_capsules(vecs, ax=ax, title="two", colors=["red", "green"]) is fig
    assert ax.get_title() == "two" and ax.get_xlim() == pytest.approx((-3.9, 3.9))  # 1.3 x the longest
    texts = [t for t in ax.texts if not isinstance(t, matplotlib.text.Annotation)]  # arrows are annotations
    assert [t.get_text() for t in texts] == ["capsule 0\n|v| = 3.00", "capsule 1\n|v| = 1.00"]
    assert [t.get_color() for t in texts] == ["red", "green"]
    assert (texts[1].get_ha(), texts[1].get_va()) == ("right", "top")  # labels sit outside the arrow tip
    assert (texts[0].get_ha(), texts[0].get_va()) == ("left", "bottom")
    assert len([c for c in ax.get_children() if isinstance(c, matplotlib.text.Annotation)]) == 2
    fig = plots.plot_capsules(np.array([[0.1, 0.2]]))
    assert fig.axes[0].get_xlim() == (-1.25, 1.25)  # small capsules keep the unit circle in view


def test_plot_coefficients_labels_and_range_checks():
    t = toy_votes(groups=(2, 1), n_outliers=1, seed=1)
    _, trace = dynamic_routing(t.votes, iterations=3, return_routing=True)
    fig = plots.plot_coefficients(trace, child_labels=t.child_labels(), parent_labels=t.parent_names())
    panels = [a for a in fig.axes if a.images]
    assert [a.get_title() for a in panels] == ["iteration 1", "iteration 2", "iteration 3"]
    assert _xticklabels(panels[0]) == ["A", "B"]
    assert [x.get_text() for x in panels[0].get_yticklabels()] == ["A1", "A2", "B1", "o1"]
    assert panels[0].get_ylabel() == "child i" and panels[1].get_ylabel() == ""
    np.testing.assert_allclose(_img(panels[2]), trace.coefficients[2][0].numpy())
    for bad in ([0], [4]):
        with pytest.raises(ValueError, match=f"iteration {bad[0]} out of range 1..3"):
            plots.plot_coefficients(trace, iterations=bad)


def test_history_records_and_plot_history_with_gaps():
    recs = [
        {"epoch": 1, "train_loss": 1.0, "train_acc": 0.5, "test_acc": None},
        {"epoch": 2, "train_loss": 0.5, "train_acc": 0.7, "test_loss": 0.6, "test_acc": 0.65},
        {"train_loss": 0.25, "train_acc": 0.8},
    ]  # no epoch: its position (3)
    h = History()
    for r in recs:
        h.append(r)
    assert plots.history_records(h) == recs
    assert plots.history_records({"records": recs}) == recs and plots.history_records({}) == []
    assert plots.history_records(tuple(recs)) == recs
    fig = plots.plot_history(recs)
    ax_l, ax_a = fig.axes
    assert fig._suptitle is None
    train, test = ax_a.get_lines()
    assert (train.get_label(), test.get_label()) == ("train", "test")
    np.testing.assert_allclose(train.get_xdata(), [1, 2, 3])
    np.testing.assert_allclose(test.get_xdata(), [2])  # the None value is skipped
    np.testing.assert_allclose(test.get_ydata(), [0.65])
    np.testing.assert_allclose(ax_l.get_lines()[0].get_ydata(), [1.0, 0.5, 0.25])
    assert (ax_l.get_title(), ax_a.get_ylabel()) == ("loss", "accuracy")


def test_liveplot_redraws_every_n_epochs(monkeypatch):
    import IPython.display as ipd

    shown = []

    class Handle:
        def update(self, fig):
            shown.append(("update", len(fig.axes[0].get_lines()[0].get_xdata())))

    def display(fig, display_id=None):
        shown.append(("display", len(fig.axes[0].get_lines()[0].get_xdata())))
        return Handle()

    monkeypatch.setattr(ipd, "display", display)

    class Trainer:
        history = History()

    trainer, live = Trainer(), plots.LivePlot(every=2)
    for e in range(5):
        trainer.history.append({"epoch": e + 1, "train_loss": 1.0 / (e + 1), "train_acc": 0.5})
        live(trainer, trainer.history.records[-1])
    assert shown == [("display", 2), ("update", 4)] and live.draws == 2
    assert plt.get_fignums() == []  # every drawn figure is closed


# ------------------------------------------------------------------------------------------- viz.toy
def test_draw_routing_panel_sizes_votes_by_coefficient():
    t = toy_votes(groups=(3, 2), n_outliers=1, seed=0)
    _, trace = dynamic_routing(t.votes, iterations=3, return_routing=True)
    fig, ax = plt.subplots()
    toy.draw_routing_panel(ax, t, trace, 2, 1, label_parent=False)
    v = trace.outputs[1][0, 1]
    assert ax.get_title() == f"iteration 2: $|v_B|$ = {float(v.norm()):.2f}" and ax.get_ylabel() == ""
    c = trace.coefficients[1][0, :, 1].numpy()
    sizes = np.concatenate([s.get_sizes() for s in ax.collections])
    np.testing.assert_allclose(sizes, 15 + 200 * c, rtol=1e-6)
    offsets = np.concatenate([s.get_offsets() for s in ax.collections])
    np.testing.assert_allclose(offsets, t.votes[0, :, 1].numpy(), rtol=1e-6)
    (arrow,) = [a for a in ax.texts if isinstance(a, matplotlib.text.Annotation)]
    np.testing.assert_allclose(arrow.xy, v.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="out of range"):
        toy.draw_routing_panel(ax, t, trace, 4, 0)


def test_plot_toy_iterations_defaults_to_every_iteration():
    t = toy_votes(groups=(2, 2, 1), n_outliers=0, seed=2)
    _, trace = dynamic_routing(t.votes, iterations=4, return_routing=True)
    T = len(trace.coefficients)
    fig = toy.plot_toy_iterations(t, trace)
    assert len(fig.axes) == 3 * T
    axes = np.array(fig.axes).reshape(3, T)  # rows = parents, columns = iterations
    assert [a.get_ylabel() for a in axes[:, 0]] == ["parent A", "parent B", "parent C"]
    assert all(a.get_ylabel() == "" for a in axes[:, 1:3].flat)
    # at most three iterations a row: the fourth starts a block of rows below, labelled again
    assert [a.get_ylabel() for a in axes[:, 3]] == ["parent A", "parent B", "parent C"]
    assert axes[0, 3].get_position().y0 < axes[2, 0].get_position().y0
    assert [a.get_title().split(":")[0] for a in axes[0]] == [f"iteration {k}" for k in range(1, T + 1)]
    labels = [h.get_text() for h in fig.legends[0].get_texts()]
    assert labels == ["votes of group A", "votes of group B", "votes of group C", "parent capsule $v_j$"]


# ------------------------------------------------------------------------------------------ viz.data
def _norb_like(classes=("car", "plane")):
    """4 stereo views of instance 4 of category 1: elevations 0/1, azimuths 0/2, lightings 0/3."""
    fields = {
        "instance": [4, 4, 4, 4, 7],
        "elevation": [0, 0, 1, 0, 0],
        "azimuth": [0, 2, 0, 0, 0],
        "lighting": [0, 0, 0, 3, 0],
    }
    images = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 2, 8, 8) * 50
    images = images.clone()
    images[:, 1] = 255  # right camera all white
    return ImageDataset(
        "norb_like",
        "test",
        images,
        torch.tensor([1, 1, 1, 1, 0]),
        list(classes),
        generated=True,
        extra={k: torch.tensor(v) for k, v in fields.items()},
    )


def test_to_display_stereo_and_bad_channels():
    x = torch.stack([torch.zeros(3, 4), torch.full((3, 4), 0.5)])  # [2, 3, 4]
    d = vd.to_display(x)
    assert d.shape == (3, 4 + 2 + 4)
    assert (d[:, :4] == 0).all() and (d[:, 4:6] == 1).all() and (d[:, 6:] == 0.5).all()
    with pytest.raises(ValueError, match="cannot display 0 channels"):
        vd.to_display(torch.zeros(0, 3, 3))


def test_image_grid_into_given_figure():
    imgs = torch.rand(3, 1, 5, 5)
    fig = plt.figure()
    assert vd.image_grid(imgs, ncols=8, fig=fig) is fig
    assert len(fig.axes) == 3 and fig._suptitle is None  # ncols is capped by the number of images
    assert all(not a.axison and a.get_title() == "" for a in fig.axes)
    np.testing.assert_allclose(_img(fig.axes[2]), imgs[2, 0].numpy())
    assert tuple(fig.axes[0].get_subplotspec().get_gridspec().get_geometry()) == (1, 3)
    fig = vd.image_grid(torch.rand(5, 2, 4, 4), ncols=2, title="pairs")
    assert tuple(fig.axes[0].get_subplotspec().get_gridspec().get_geometry()) == (3, 2)
    assert fig._suptitle.get_text() == "pairs" and _img(fig.axes[0]).shape == (4, 10)


def test_show_samples_names_multi_label_samples():
    labels = torch.tensor([[1, 0, 1], [0, 1, 0]])
    ds = ImageDataset("multi", "val", torch.zeros(2, 1, 4, 4, dtype=torch.uint8), labels, ["a", "b", "c"])
    fig = vd.show_samples(ds, n=2)
    assert sorted(a.get_title() for a in fig.axes) == ["a+c", "b"]
    assert fig._suptitle.get_text() == "multi / val"  # real (not generated) sets carry no tag
    ds2 = ImageDataset("plain", "test", torch.zeros(2, 1, 4, 4), torch.tensor([3, 5]), [], generated=True)
    fig = vd.show_samples(ds2, n=2, title="mine [GENERATED]")
    assert sorted(a.get_title() for a in fig.axes) == ["3", "5"]  # no class names: the label value
    assert fig._suptitle.get_text() == "mine [GENERATED]"  # the tag is not repeated


def test_show_viewpoints_mosaic_leaves_missing_views_blank():
    ds = _norb_like()
    fig = vd.show_viewpoints(ds, category=1, instance=4, elevations=[0, 1], azimuths=[0, 2], camera=0)
    ax = fig.axes[0]
    m = _img(ax)
    assert m.shape == (2 * 8 + 1, 2 * 8 + 1)  # 2x2 views of 8x8 with 1-pixel gaps
    assert (m[:8, :8] == 0).all()  # (el 0, az 0): sample 0
    np.testing.assert_allclose(m[:8, 9:], 50 / 255)  # (el 0, az 2): sample 1
    np.testing.assert_allclose(m[9:, :8], 100 / 255)  # (el 1, az 0): sample 2
    assert (m[9:, 9:] == 1).all() and (m[8, :] == 1).all()  # (el 1, az 2) missing: blank; gutters white
    assert _xticklabels(ax) == ["0°", "40°"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["30°", "35°"]
    assert ax.get_title() == "plane #4 across viewpoints, lighting 0  [GENERATED]"
    right = _img(vd.show_viewpoints(ds, category=1, camera=1).axes[0])  # instance found, views from the data
    assert right.shape == (17, 17) and (right[:8, :8] == 1).all()


def test_show_lightings_and_stereo_pairs_titles():
    ds = _norb_like()
    fig = vd.show_lightings(ds, category=1, elevation=0, azimuth=0)
    assert [a.get_title() for a in fig.axes] == ["lighting 0", "lighting 3"]
    assert fig._suptitle.get_text() == ("plane #4, elevation 30°, azimuth 0°: the lighting conditions  [GENERATED]")
    np.testing.assert_allclose(_img(fig.axes[1])[:, :8], 150 / 255)  # sample 3, left camera
    ds.classes = []
    fig = vd.show_stereo_pairs(ds, n=5, ncols=5, title="pairs")
    titles = sorted(a.get_title() for a in fig.axes)
    assert "1 #4 el 35° az 0° L0" in titles and "1 #4 el 30° az 0° L3" in titles and "0 #7 el 30° az 0° L0" in titles
    assert fig._suptitle.get_text() == "pairs  [GENERATED]"
