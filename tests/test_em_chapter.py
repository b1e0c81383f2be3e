"""What the EM-routing chapter stands on: the naive reference EM, bad-input errors of the EM layers,
re-routing the class capsules, coordinate-addition conventions, the viewpoint protocol, the spread-loss
recipe (stable in fp32 and bf16), the shipped-checkpoint export of a viewpoint run, and the EM figures and
explorers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from capsule_lib.data import DataSource, TensorLoader, get_dataset
from capsule_lib.data.viewpoints import center_crop_images, downscale_images, familiar_values, viewpoint_sets
from capsule_lib.evaluation import compare_with_naive, em_routing_naive
from capsule_lib.layers import ClassCapsules, ConvCapsules, grid_centers
from capsule_lib.losses import SpreadObjective, StepOutput
from capsule_lib.models.em_capsnet import EMCapsNet, EMCapsNetConfig, class_centers, receptive_field_centers
from capsule_lib.routing.em import EMRouting, em_routing
from capsule_lib.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "readable_figures")  # tiny tensors; readable figures (conftest.py)


def _tiny(**kw):
    base = dict(in_channels=2, image_size=20, conv_channels=8, primary_types=4, caps1_types=4, caps2_types=4)
    return EMCapsNetConfig(**{**base, "n_classes": 5, **kw})


def _inputs(B=2, I=12, J=3, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    votes = torch.randn(B, I, J, D, generator=g, dtype=dtype)
    a_in = torch.rand(B, I, generator=g, dtype=dtype) * 0.8 + 0.1
    beta_u = torch.randn(J, generator=g, dtype=dtype) * 0.1
    beta_a = torch.randn(J, generator=g, dtype=dtype) * 0.1
    return votes, a_in, beta_u, beta_a


# ------------------------------------------------------------------------------------- naive vs log space
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_naive_em_equals_log_space_em_where_both_are_finite(iterations):
    args = _inputs()
    mu, a = em_routing(*args, iterations, inverse_temperature=0.1)
    mu_n, a_n = em_routing_naive(*args, iterations, inverse_temperature=0.1)
    torch.testing.assert_close(mu_n, mu, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a_n, a, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "case",
    ["large poses", "tight clusters", "fp16 votes", "bf16 votes, large poses"],
)
def test_naive_em_breaks_where_log_space_em_does_not(case):
    votes, a_in, bu, ba = _inputs(dtype=torch.float32, I=32)
    if case == "large poses":
        votes = votes * 100
    elif case == "tight clusters":  # every child votes (almost) the same pose: densities overflow
        votes = votes[:, :1].expand_as(votes) + 1e-5 * votes
    elif case == "fp16 votes":
        votes, a_in = votes.half() * 10, a_in.half()
    else:  # bf16 has fp32's range: the naive routing breaks where it breaks in fp32, not sooner
        votes, a_in = votes.bfloat16() * 100, a_in.bfloat16()
    mu_n, a_n = em_routing_naive(votes, a_in, bu, ba, 3)
    mu, a = em_routing(votes, a_in, bu, ba, 3)
    assert not (torch.isfinite(mu_n).all() and torch.isfinite(a_n).all()), case
    assert torch.isfinite(mu.float()).all() and torch.isfinite(a.float()).all(), case
    assert mu.dtype == votes.dtype


def test_compare_with_naive_counts_the_broken_samples():
    votes, a_in, bu, ba = _inputs(dtype=torch.float32, B=4, I=32)
    same = compare_with_naive(votes, a_in, bu, ba, 3)
    assert same["naive_nonfinite"] == 0 and same["log_space_nonfinite"] == 0 and same["max_activation_diff"] < 1e-5
    votes[:2] *= 1e4  # two of the four samples get large poses: 16 densities of 1e-4 their size underflow
    mixed = compare_with_naive(votes, a_in, bu, ba, 3)
    assert mixed["naive_nonfinite"] == 0.5 and mixed["log_space_nonfinite"] == 0
    assert mixed["max_activation_diff"] < 1e-5  # measured on the two samples where both are finite


# --------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("layer", ["EMRouting", "ConvCapsules", "ClassCapsules"])
@pytest.mark.parametrize(
    "bad,match",
    [
        ("pose 3x3", r"last dimension 9 \(3x3 poses\); this layer has 4x4 poses"),
        ("15 entries", r"last dimension 15 \(not the entries of a square matrix\)"),
        ("non-square", r"non-square 4x3 pose matrices"),
        ("unflattened", r"flatten them to 16 entries"),
        ("negative activations", r"activations must be probabilities in \[0, 1\], got values in \[-0\.5"),
        ("empty batch", r"empty batch"),
    ],
)
def test_em_layers_name_bad_inputs_in_one_line(layer, bad, match):
    lead = (2, 6) if layer == "EMRouting" else (2, 4, 3, 3)
    module = {
        "EMRouting": EMRouting(6, 3),
        "ConvCapsules": ConvCapsules(4, 2, 3),
        "ClassCapsules": ClassCapsules(4, 5),
    }[layer]
    poses, acts = torch.randn(*lead, 16), torch.rand(*lead)
    if bad == "pose 3x3":
        poses = torch.randn(*lead, 9)
    elif bad == "15 entries":
        poses = torch.randn(*lead, 15)
    elif bad == "non-square":
        poses = torch.randn(*lead, 4, 3)
    elif bad == "unflattened":
        poses = torch.randn(*lead, 4, 4)
    elif bad == "negative activations":
        acts = acts - 0.5
        acts.view(-1)[0] = -0.5
    else:
        poses, acts = poses[:0], acts[:0]
    with pytest.raises(ValueError, match=match) as err:
        module(poses, acts)
    assert "\n" not in str(err.value)


def test_em_routing_refuses_out_of_range_activations_but_not_while_compiling():
    votes, a_in, bu, ba = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"a_in: capsule activations must be probabilities"):
        em_routing(votes, a_in + 1.0, bu, ba)
    compiled = torch.compile(lambda v, a: em_routing(v, a, bu, ba, 2), backend="eager", fullgraph=True)
    mu, _ = compiled(votes, a_in)
    assert torch.isfinite(mu).all()


# ---------------------------------------------------------------------------------- re-routing, centres
def test_route_classes_reproduces_the_forward_pass_and_changes_with_its_settings():
    torch.manual_seed(0)
    model = EMCapsNet(_tiny()).eval()
    x = torch.rand(3, 2, 20, 20)
    with torch.no_grad():
        out = model(x)
        poses, acts = model.class_inputs(x)
        (p, a), trace = model.route_classes(poses, acts)
        (_, a5), trace5 = model.route_classes(poses, acts, iterations=5, final_lambda=10.0)
    torch.testing.assert_close(a, out.scores)
    torch.testing.assert_close(p, out.poses)
    assert trace.iterations == model.config.iterations and trace5.iterations == 5
    assert trace5.extra["inverse_temperatures"][-1] == pytest.approx(10.0 * (1 - 0.95**5))
    assert not torch.allclose(a5, a)
    post = trace5.extra["posterior"]  # [B, I, K]: every child's assignments sum to 1 over the classes
    torch.testing.assert_close(post.sum(-1), torch.ones(post.shape[:-1]))


def test_coordinate_addition_conventions():
    cfg = EMCapsNetConfig()  # 32 -> 14 -> 6 -> 4
    torch.testing.assert_close(class_centers(cfg), receptive_field_centers(cfg))
    grid = class_centers(EMCapsNetConfig(coord_centers="grid"))
    corner = class_centers(EMCapsNetConfig(coord_centers="grid_corner"))
    assert grid[:, 0, 0].tolist() == pytest.approx([0.125, 0.375, 0.625, 0.875])
    assert corner[:, 0, 0].tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75])
    torch.testing.assert_close(grid_centers(4, 4, convention="corner"), corner)
    a = EMCapsNet(EMCapsNetConfig(coord_centers="grid_corner"))
    b = EMCapsNet(EMCapsNetConfig(coord_centers="grid"))
    b.load_state_dict(a.state_dict())  # the convention is not a parameter: same weights, other centres
    x = torch.rand(1, 1, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(a(x).poses, b(x).poses)
    with pytest.raises(ValueError, match="coord_centers must be"):
        EMCapsNet(EMCapsNetConfig(coord_centers="middle"))


# ------------------------------------------------------------------------------------ viewpoint protocol
def test_viewpoint_sets_follow_the_protocol(tmp_path):
    sets = viewpoint_sets("rendered_norb", str(tmp_path), n_train=40, n_test=30, size=24, eval_crop=16)
    fam, novel = familiar_values("azimuth")
    assert set(fam) == {0, 1, 2, 15, 16, 17} and len(novel) == 12
    assert sets.train.images.shape[1:] == (2, 24, 24) and sets.novel.images.shape[1:] == (2, 16, 16)
    assert len(sets.train) == 40 and len(sets.familiar) == 30 and len(sets.novel) == 30
    assert torch.isin(sets.train.extra["azimuth"], torch.tensor(fam)).all()
    assert torch.isin(sets.val.extra["azimuth"], torch.tensor(fam)).all()
    assert torch.isin(sets.familiar.extra["azimuth"], torch.tensor(fam)).all()
    assert not torch.isin(sets.novel.extra["azimuth"], torch.tensor(fam)).any()
    train_inst = set(sets.train.extra["instance"].tolist()) | set(sets.val.extra["instance"].tolist())
    test_inst = set(sets.familiar.extra["instance"].tolist()) | set(sets.novel.extra["instance"].tolist())
    assert train_inst.isdisjoint(test_inst)  # unseen objects at test time
    assert sets.generated and "GENERATED" in sets.describe()
    elev = viewpoint_sets("rendered_norb", str(tmp_path), axis="elevation", n_train=20, n_test=10, size=24)
    assert elev.train.extra["elevation"].max() <= 2 and elev.novel.extra["elevation"].min() >= 3
    with pytest.raises(ValueError, match="familiar azimuth indices must be"):
        familiar_values("azimuth", [18])
    with pytest.raises(ValueError, match="axis must be"):
        familiar_values("lighting")


def test_smallnorb_falls_back_to_the_rendered_set_only_when_allowed(tmp_path, monkeypatch, capsys):
    ds = get_dataset("smallnorb", str(tmp_path), "test", n=4, offline=True)
    assert ds.name == "rendered_norb" and ds.standin_for == "smallnorb" and ds.generated
    assert "[GENERATED stand-in data]" in capsys.readouterr().out
    from capsule_lib.data import DatasetUnavailableError

    with pytest.raises(DatasetUnavailableError, match="smallnorb.py"):
        get_dataset("smallnorb", str(tmp_path), "test", standin=False, download=False)


def test_viewpoint_accuracies_of_a_model(tmp_path):
    from capsule_lib.evaluation import viewpoint_accuracies

    sets = viewpoint_sets("rendered_norb", str(tmp_path), n_train=8, n_test=20, size=24, eval_crop=20)
    model = EMCapsNet(_tiny()).eval()
    r = viewpoint_accuracies(model, sets)
    with torch.no_grad():
        pred = model(sets.novel.float_images()).scores.argmax(1)
    assert r["novel"] == pytest.approx(float((pred == sets.novel.labels).float().mean()))
    assert r["drop"] == pytest.approx(r["familiar"] - r["novel"])


def test_downscale_and_crop():
    x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).repeat(2, 2, 1, 1)
    y = downscale_images(x, 2)
    assert y.shape == (2, 2, 2, 2) and y.dtype == torch.uint8 and int(y[0, 0, 0, 0]) == round((0 + 1 + 4 + 5) / 4)
    assert center_crop_images(x, 2)[0, 0].tolist() == [[5, 6], [9, 10]]
    with pytest.raises(ValueError, match="larger than the images"):
        center_crop_images(x, 5)


# ------------------------------------------------------------------------------- objective and training
def test_spread_objective_margin_grows_per_epoch_and_refuses_lengths():
    obj = SpreadObjective(0.2, 0.9)
    margins = []
    for e in range(4):
        obj.set_epoch(e, 4)
        margins.append(obj.margin)
    assert margins == pytest.approx([0.2, 0.2 + 0.7 / 3, 0.2 + 1.4 / 3, 0.9])
    from capsule_lib.models import CapsNet, CapsNetConfig

    caps = CapsNet(CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder=False))
    with pytest.raises(ValueError, match="needs class activations"):
        obj(caps, (torch.rand(2, 1, 28, 28), torch.tensor([0, 1])), True)


def test_a_non_finite_loss_stops_training_with_one_line(tmp_path):
    class NaNObjective:
        def __call__(self, model, batch, train):
            out = model(batch[0]).sum() * float("nan")
            return StepOutput(out, {}, 0, batch[0].shape[0])

    model = torch.nn.Linear(3, 2)
    loader = TensorLoader([torch.rand(8, 3), torch.zeros(8, dtype=torch.long)], 4)
    trainer = Trainer(model, NaNObjective(), torch.optim.SGD(model.parameters(), 0.1), device="cpu", progress=False)
    with pytest.raises(FloatingPointError, match=r"epoch 1, batch 1: the training loss is nan") as err:
        trainer.fit(loader, epochs=1)
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("amp", [None, "bf16"])
def test_em_recipe_trains_stably_and_records_both_test_groups(amp, tmp_path, monkeypatch):
    """The em_norb recipe end to end on a tiny rendered set, fp32 and bf16: every loss finite, the test
    record has the familiar and novel groups, and the export evaluates the fp16 weights on the same sets."""
    from capsule_lib.pretrained import export_run, load_pretrained, registry
    from capsule_lib.train import train

    small = {"model.conv_channels": 8, "model.primary_types": 4, "model.caps1_types": 4, "model.caps2_types": 4}
    _, trainer = train(
        "em_norb",
        out_dir=tmp_path / "run",
        data_root=str(tmp_path),
        offline=True,
        progress=False,
        epochs=2,
        train_subset=48,
        eval_subset=16,
        batch_size=16,
        device="cpu",
        amp=amp,
        **small,
    )
    recs = trainer.history.records
    assert all(math.isfinite(r[k]) for r in recs for k in ("train_loss", "val_loss"))
    assert [r["train_margin"] for r in recs] == pytest.approx([0.2, 0.9])
    test = trainer.history.meta["test"]
    assert {"test_familiar_acc", "test_novel_acc"} <= set(test)
    assert trainer.history.meta["dataset"].startswith("rendered_norb")
    if amp is None:
        offline = DataSource(str(tmp_path), offline=True)
        entry = export_run(tmp_path / "run", "em_tiny", data_root=offline, directory=tmp_path / "ck")
        assert {"val_acc", "test_familiar_acc", "test_novel_acc"} <= set(entry["metrics"])
        assert entry["metrics"]["test_novel_size"] == 16
        model, _ = load_pretrained("em_tiny", directory=tmp_path / "ck")
        assert isinstance(model, EMCapsNet) and "em_tiny" in registry(tmp_path / "ck")
        assert json.loads((tmp_path / "ck" / "em_tiny.history.json").read_text())["meta"]["recipe"] == "em_norb"


# ------------------------------------------------------------------------------------- figures, explorers
@pytest.fixture(scope="module")
def routed():
    torch.manual_seed(0)
    model = EMCapsNet(_tiny()).eval()
    x = torch.rand(2, 2, 20, 20)
    with torch.no_grad():
        poses, acts = model.class_inputs(x)
        (_, a), trace = model.route_classes(poses, acts)
        child = model.class_caps.votes(poses, acts, model.centers)[1]
    return model, x, trace.detach(), child


def test_em_figures_show_the_trace(routed):
    from capsule_lib.viz.em import assignments_after, em_readout, parent_spread, plot_em_iterations, plot_em_state

    model, x, trace, child = routed
    T = trace.iterations
    R = assignments_after(trace, 1)
    assert R.shape == (T, child.shape[1], 5)
    torch.testing.assert_close(R[-1], trace.extra["posterior"][1].float())
    torch.testing.assert_close(R[0], trace.coefficients[1][1].float())
    assert parent_spread(trace, 0).shape == (T, 5)
    fig = plot_em_iterations(x[0], trace, 0, child[0], n_show=3)
    heat = [ax for ax in fig.axes if ax.get_title().startswith("after iteration")]
    assert len(heat) == T and heat[0].images[0].get_array().shape == (5, 3)
    fig = plot_em_state(x[1], trace, 1, child[1], list("abcde"), label=2)
    assert fig.axes[0].get_title() == "input (c)"
    bars = [p.get_height() for p in fig.axes[2].patches]
    assert bars == pytest.approx(trace.activations[-1][1].tolist())
    pred = "abcde"[int(trace.activations[-1][1].argmax())]
    assert fig.axes[2].get_title() == f"activations: predicts {pred}"
    assert em_readout(trace, 1, list("abcde")).startswith(f"predicts {pred};")
    with pytest.raises(ValueError, match="no posterior"):
        assignments_after(type(trace)("em"), 0)


def test_em_explorers_redraw_their_twin(routed):
    from capsule_lib.viz.explorers import em_routing_explorer
    from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, em_routing_page_explorer

    model, x, _, _ = routed
    ex = em_routing_explorer(model, x, torch.tensor([0, 3]), list("abcde"), max_iterations=4)
    first = ex.readout.value
    ex.controls["scale"].value = 100.0
    ex.controls["iterations"].value = 4
    assert ex.draws == 3 and ex.last_values == {"image": 0, "iterations": 4, "scale": 100.0}
    assert ex.readout.value != first
    page = em_routing_page_explorer(model, x[0], 0, list("abcde"), iterations=(1, 2), scales=(0.1, 1.0, 10.0))
    assert PAGE_EXPLORER_CLASS in page._dom_classes
    outer = page.children[2].children[-1].children[1]  # the Stack of rows of frames
    assert len(outer.children) == 2 and all(len(row.children) == 3 for row in outer.children)
    assert outer.selected_index == 0 and outer.children[0].selected_index == 1  # T = 3 is not in the grid: T = 1
    pngs = {img.value for row in outer.children for img in row.children}
    assert len(pngs) == 6  # every setting draws a different state


def test_em_figures_order_children_by_the_traces_own_activations(routed):
    """Without ``child_acts`` the figures read the children's activations from the trace (``extra["a_in"]``)."""
    from capsule_lib.viz.em import plot_em_state

    model, x, trace, child = routed
    torch.testing.assert_close(trace.extra["a_in"], child)
    given = plot_em_state(x[1], trace, 1, child[1], n_show=3).axes[1].images[0].get_array()
    default = plot_em_state(x[1], trace, 1, n_show=3).axes[1].images[0].get_array()
    assert (given == default).all()
