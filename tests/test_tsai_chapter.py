"""What the Tsai chapter stands on: the CPU-sized configuration and the backbone baseline, input normalisation,
configs read back from JSON, the CIFAR recipes (augmentation and schedules), the colour-shapes stand-in, test-time
iterations / schedules / expansion switches, the parent-major routing path against the votes path (float64,
outputs and gradients), and the chapter's figures and explorers."""

from __future__ import annotations

import dataclasses
import json

import matplotlib
import pytest
import torch

from capsule_lib.data import DataSource, get_dataset
from capsule_lib.data.generated import COLOUR_SHAPE_CLASSES, colour_shapes
from capsule_lib.data.transforms import random_crop_flip
from capsule_lib.evaluation import iteration_sweep
from capsule_lib.models import BackboneClassifier, CapsModel, CapsModelConfig
from capsule_lib.models.inverted import CIFAR10_MEAN, CIFAR10_STD
from capsule_lib.pretrained import build_model
from capsule_lib.routing.inverted import (
    conv_matrix_votes,
    conv_windows,
    fc_matrix_votes,
    inverted_attention_update,
    inverted_conv_update,
    inverted_fc_update,
)
from capsule_lib.train.recipes import make_recipe, recipe_config

matplotlib.use("Agg")


pytestmark = pytest.mark.usefixtures("one_thread", "readable_figures")  # tiny tensors; readable figures (conftest.py)


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------------------------------------------------------ the models
def test_cpu_sized_config_counts_and_shapes():
    m = CapsModel(CapsModelConfig.cifar10_cpu())
    # stem 864 + BN 64, block(32) 18,560, block(32->64, s2) 57,728
    assert n_params(m.backbone) == 77_216
    assert n_params(m.primary) == 64 * 128 + 32
    assert [n_params(layer) for layer in m.capsule_layers] == [3 * 3 * 8 * 16 * 8 + 32] * 2 + [200 * 16 * 10 + 32]
    assert n_params(m) == 135_985
    out = m(torch.rand(3, 3, 32, 32), return_routing=True)
    assert [tuple(p.shape) for p in out.trace.extra["poses"]] == [
        (3, 8, 16, 16, 16),
        (3, 8, 7, 7, 16),
        (3, 8, 5, 5, 16),
        (3, 10, 16),
    ]
    assert out.scores.shape == (3, 10)


def test_input_normalisation_is_inside_the_model():
    cfg = CapsModelConfig.cifar10_cpu()
    plain = dataclasses.replace(cfg, input_mean=None, input_std=None)
    torch.manual_seed(0)
    a = CapsModel(cfg).eval()
    b = CapsModel(plain).eval()
    b.load_state_dict(a.state_dict())  # the statistics are not in the state dict (non-persistent buffers)
    x = torch.rand(2, 3, 32, 32)
    xn = (x - torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)) / torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    assert torch.allclose(a(x).scores, b(xn).scores, atol=1e-5)
    assert a.input_contract.value_range == (0.0, 1.0)
    with pytest.raises(ValueError, match="one value per input channel"):
        CapsModelConfig.cifar10_cpu(input_mean=(0.5, 0.5), input_std=(0.2, 0.2))
    with pytest.raises(ValueError, match="go together"):
        CapsModelConfig.cifar10_cpu(input_std=None)


def test_config_survives_json_and_rebuilds_the_same_model():
    cfg = CapsModelConfig.cifar10_cpu()
    back = json.loads(json.dumps(dataclasses.asdict(cfg)))  # what histories and the registry hold
    assert isinstance(back["capsules"][0], dict)
    for kind, cls in (("caps_model", CapsModel), ("backbone_classifier", BackboneClassifier)):
        torch.manual_seed(0)
        ref = cls(cfg)
        rebuilt = build_model(kind, back)
        assert rebuilt.config == ref.config
        rebuilt.load_state_dict(ref.state_dict())


def test_backbone_classifier_shapes_gradients_and_size():
    cfg = CapsModelConfig.cifar10_cpu()
    m = BackboneClassifier(cfg)
    assert n_params(m) == 77_216 + 64 * 10 + 10
    out = m(torch.rand(4, 3, 32, 32))
    assert out.scores.shape == (4, 10) and out.kind == "logits"
    out.scores.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    with pytest.raises(ValueError, match=r"\[B, 3, 32, 32\]"):
        m(torch.rand(4, 3, 28, 28))


def test_test_time_iterations_schedule_and_expansion_switches():
    torch.manual_seed(0)
    m = CapsModel(CapsModelConfig.cifar10_cpu()).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        for T in (1, 3):
            for seq in (False, True):
                other = CapsModel(dataclasses.replace(m.config, iterations=T, sequential_routing=seq)).eval()
                other.load_state_dict(m.state_dict())
                assert torch.allclose(m(x, iterations=T, sequential=seq).scores, other(x).scores, atol=1e-6)
        assert torch.allclose(m(x, iterations=1).scores, m(x, iterations=1, sequential=True).scores)
        tr = m(x, return_routing=True, iterations=4).trace
        assert len(tr.coefficients) == 4 and tr.extra["schedule"] == "concurrent"
        ok = m(x).scores
        bug = m.set_expansion("official_bug")
        assert bug is m and all(layer.expansion == "official_bug" for layer in m.capsule_layers[:2])
        assert not torch.allclose(m(x).scores, ok)
        assert torch.allclose(m.set_expansion("unfold")(x).scores, ok)
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        m(x, iterations=0)
    with pytest.raises(ValueError, match="expansion must be one of"):
        m.set_expansion("bug")


# --------------------------------------------------------------------- parent-major path vs votes path
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_update_matches_votes_path_in_float64_with_gradients(stride):
    g = torch.Generator().manual_seed(stride)
    poses = torch.randn(2, 3, 7, 7, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 3, 3, 4, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    h = (7 - 3) // stride + 1
    prev = torch.randn(2, 5, h, h, 16, generator=g, dtype=torch.float64, requires_grad=True)
    out = inverted_conv_update(poses, weight, prev, stride=stride)
    votes = conv_matrix_votes(conv_windows(poses, 3, stride), weight)  # [B, h, w, I, M, d]
    ref = inverted_attention_update(votes, prev.permute(0, 2, 3, 1, 4)).permute(0, 3, 1, 2, 4)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    co = torch.randn_like(out)
    grads = torch.autograd.grad((out * co).sum(), (poses, weight, prev))
    refs = torch.autograd.grad((ref * co).sum(), (poses, weight, prev))
    for a, b in zip(grads, refs):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


def test_fc_update_matches_votes_path_in_float64_with_gradients():
    g = torch.Generator().manual_seed(0)
    poses = torch.randn(3, 11, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    prev = torch.randn(3, 6, 16, generator=g, dtype=torch.float64, requires_grad=True)
    out, tr = inverted_fc_update(poses, weight, prev, return_routing=True)
    ref, rtr = inverted_attention_update(fc_matrix_votes(poses, weight), prev, return_routing=True)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert torch.allclose(tr.coefficients[0], rtr.coefficients[0], rtol=1e-10)
    assert torch.allclose(tr.coefficients[0].sum(-1), torch.ones(3, 11, dtype=torch.float64))
    co = torch.randn_like(out)
    grads = torch.autograd.grad((out * co).sum(), (poses, weight, prev))
    refs = torch.autograd.grad((ref * co).sum(), (poses, weight, prev))
    for a, b in zip(grads, refs):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------------------------- data and recipes
def test_random_crop_flip_is_a_shift_and_maybe_a_flip():
    x = torch.rand(64, 3, 8, 8)
    same = random_crop_flip(x, 0, torch.Generator().manual_seed(0))
    flipped = torch.tensor([torch.equal(a, b.flip(-1)) and not torch.equal(a, b) for a, b in zip(same, x)])
    kept = torch.tensor([torch.equal(a, b) for a, b in zip(same, x)])
    assert bool((flipped | kept).all()) and 10 < int(flipped.sum()) < 54
    a = random_crop_flip(x, 4, torch.Generator().manual_seed(1))
    b = random_crop_flip(x, 4, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape
    # a shift keeps the image's values (some pushed out, zeros in): every kept value is an input value
    ones = random_crop_flip(torch.ones(16, 1, 8, 8), 4, torch.Generator().manual_seed(2))
    assert set(ones.unique().tolist()) <= {0.0, 1.0} and (ones == 0).any()


def test_recipes_follow_the_paper_and_the_cpu_budget():
    paper = make_recipe("tsai_cifar10")
    assert (paper.epochs, paper.batch_size, paper.lr, paper.momentum, paper.weight_decay) == (350, 128, 0.1, 0.9, 5e-4)
    assert [paper.lr_factor(e) for e in (0, 149, 150, 249, 250, 349)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    assert paper.model.input_mean == CIFAR10_MEAN and n_params(paper.build_model()) == 1_828_817
    opt = paper.build_optimizer(torch.nn.Linear(2, 2))
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["weight_decay"] == 5e-4

    cpu = make_recipe("tsai_cifar10_cpu")
    cpu._steps_per_epoch = 10
    f = [cpu.lr_factor(s) for s in range(cpu.epochs * 10 + 1)]
    warm = int(cpu.warmup * cpu.epochs * 10)
    assert f[0] == pytest.approx(0.1) and f[warm] == pytest.approx(1.0) and f[-1] == pytest.approx(0.0)
    assert all(a <= b for a, b in zip(f[:warm], f[1 : warm + 1])) and all(
        a >= b for a, b in zip(f[warm:], f[warm + 1 :])
    )
    assert isinstance(cpu.build_model(), CapsModel) and n_params(cpu.build_model()) == 135_985
    base = make_recipe("baseline_backbone_cifar10_cpu")
    assert isinstance(base.build_model(), BackboneClassifier)
    assert (base.epochs, base.lr, base.warmup) == (cpu.epochs, cpu.lr, cpu.warmup)
    back = recipe_config("tsai_cifar10_cpu", json.loads(json.dumps(cpu.config())))
    assert back.build_model().config == cpu.model  # field-by-field overrides are normalised by the model
    x = torch.rand(8, 3, 32, 32)
    (xa, y) = cpu.augment_batch((x, torch.zeros(8)), torch.Generator().manual_seed(0))
    assert xa.shape == x.shape and cpu.has_augmentation()


def test_colour_shapes_stand_in():
    x, y = colour_shapes(200, seed=3)
    assert x.dtype == torch.uint8 and x.shape == (200, 3, 32, 32)
    assert torch.equal(y.bincount(minlength=10), torch.full((10,), 20))
    x2, y2 = colour_shapes(200, seed=3)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    ds = get_dataset("cifar10", "/nonexistent-capsule-data", "test", standin=True, download=False, n=50)
    assert ds.generated and ds.standin_for == "cifar10" and ds.classes == COLOUR_SHAPE_CLASSES and len(ds) == 50


# -------------------------------------------------------------------------------- figures and explorers
def test_iteration_sweep_rows():
    torch.manual_seed(0)
    m = CapsModel(CapsModelConfig.cifar10_cpu()).eval()
    x, y = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8), torch.randint(0, 10, (6,))
    rows = iteration_sweep(
        m, x, y, (1, 2), {"concurrent": {"sequential": False}, "sequential": {"sequential": True}}, batch_size=4
    )
    assert [(r["setting"], r["iterations"]) for r in rows] == [
        ("concurrent", 1),
        ("concurrent", 2),
        ("sequential", 1),
        ("sequential", 2),
    ]
    assert rows[0]["accuracy"] == rows[2]["accuracy"]  # T = 1: the schedules coincide
    assert all(0 <= r["accuracy"] <= 1 and r["ms_per_image"] > 0 and r["n"] == 6 for r in rows)


def test_attention_maps_and_geometry():
    from capsule_lib.analysis import class_attention_maps, grid_geometry
    from capsule_lib.viz.inverted import plot_attention_maps

    assert grid_geometry(CapsModel(CapsModelConfig.cifar10("resnet"))) == [(0.5, 2.0, 16), (2.5, 4.0, 7), (6.5, 4.0, 5)]
    torch.manual_seed(0)
    m = CapsModel(CapsModelConfig.cifar10_cpu()).eval()
    x = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    maps, probs = class_attention_maps(m, x, iterations=3)
    assert maps.shape == (2, 3, 10, 5, 5) and probs.shape == (2, 3, 10)
    last = m(x.float() / 255, iterations=3).scores.softmax(-1)
    assert torch.allclose(probs[:, -1], last, atol=1e-6)  # the last is the output
    two = class_attention_maps(m, x, iterations=2)  # concurrent: the first updates do not depend on later ones
    assert torch.allclose(two[0], maps[:, :2], atol=1e-6) and torch.allclose(two[1], probs[:, :2], atol=1e-6)
    assert torch.allclose(maps[:, 0], torch.full_like(maps[:, 0], 0.1))  # the uniform first pass
    assert torch.allclose(maps.sum(2), torch.ones(2, 3, 5, 5), atol=1e-5)  # shares of each position's votes
    fig = plot_attention_maps(x, maps, [str(k) for k in range(10)], grid_geometry(m)[-1], [0, 1], [0, 1], probs)
    assert len(fig.axes) == 2 * 4 + 1


def test_expansion_sources_and_bug_figure():
    from capsule_lib.analysis import expansion_sources
    from capsule_lib.viz.inverted import plot_expansion_bug, plot_schedules

    rows, cols, ents = expansion_sources(7, 3, 2, 4, "unfold")
    k, l, h, w, e = torch.meshgrid(*(torch.arange(n) for n in (3, 3, 3, 3, 4)), indexing="ij")
    assert torch.equal(rows, 2 * h + k) and torch.equal(cols, 2 * w + l) and torch.equal(ents, e)
    b_rows, b_cols, b_ents = expansion_sources(7, 3, 2, 4, "official_bug")
    right = (b_rows == rows) & (b_cols == cols) & (b_ents == ents)
    assert 0 < float(right.float().mean()) < 0.5  # mostly other cells or other pose entries
    assert len(plot_expansion_bug(7, 3, 2, 4).axes) == 4
    fig = plot_schedules(3, 3)
    titles = [ax.get_title() for ax in fig.axes]
    assert "5 dependent steps" in titles[0] and "9 dependent steps" in titles[1]  # L + T - 1 vs L * T


def test_attention_explorers():
    from capsule_lib.viz.explorers import attention_explorer
    from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, attention_page_explorer

    torch.manual_seed(0)
    m = CapsModel(CapsModelConfig.cifar10_cpu()).eval()
    x, y = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 2])
    classes = [f"c{k}" for k in range(10)]
    ex = attention_explorer(m, x, y, classes)
    assert ex.readout.value.startswith("<code>update 2: -&gt; c")
    ex.controls["class"].value = 3
    ex.controls["iteration"].value = 4
    assert "update 4: -&gt; c3: p=" in ex.readout.value and ex.draws == 3
    page = attention_page_explorer(m, x[:2], y[:2], classes, iterations=(1, 2))
    assert PAGE_EXPLORER_CLASS in page._dom_classes


def test_cifar_recipes_also_evaluate_the_exact_test_images(tmp_path):
    """A copy of CIFAR-10 whose test split carries an ``exact`` mask (some images recovered from a lossy
    source): the recipes' evaluation sets add ``test_exact``, the marked images only."""
    import numpy as np

    folder = tmp_path / "cifar10"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(5):
        np.savez(folder / f"train_{k}.npz", x=rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8), y=np.arange(4))
    exact = np.array([True, True, False, True, False, False])
    np.savez(folder / "test.npz", x=rng.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8), y=np.arange(6), exact=exact)
    sets = make_recipe("tsai_cifar10_cpu").evaluation_sets(DataSource(str(tmp_path), standin=False))
    assert set(sets) == {"val", "test", "test_exact"}
    assert len(sets["test"]) == 6 and sets["test_exact"].labels.tolist() == [0, 1, 3]
    np.savez(folder / "test.npz", x=rng.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8), y=np.arange(6))
    assert set(make_recipe("tsai_cifar10").evaluation_sets(DataSource(str(tmp_path), standin=False))) == {"val", "test"}


def test_the_papers_configuration_ships_with_its_honest_budget():
    """The shipped paper-configuration run: the paper's recipe and model unchanged, stopped by a recorded
    wall-clock budget after a fraction of its 350 epochs, selected on validation, the count in the registry
    equal to the history's last (possibly partial) record."""
    from capsule_lib.pretrained import load_pretrained_history, registry

    entry = registry()["tsai_cifar10_seed0"]
    hist = load_pretrained_history("tsai_cifar10_seed0")
    run = entry["training"]
    assert hist.meta["recipe"] == "tsai_cifar10" and hist.meta["parameters"] == 1_828_817
    now = make_recipe("tsai_cifar10").config()
    assert now["model"].pop("stem_side") is None  # #63's field, added since: the default, no stem
    assert hist.meta["config"] == now  # nothing changed from the paper's recipe
    assert hist.meta["config"]["epochs"] == 350 and entry["model"] == "caps_model"
    last = hist.records[-1]
    assert run["epochs"] == last["epoch"] and 0 < run["epochs"] < 350
    assert last.get("partial", False) == (run["epochs"] != int(run["epochs"]))
    assert run["budget_minutes"] > 0 and run["wall_time_s"] <= 60 * run["budget_minutes"] + 15 * 60
    metrics = entry["metrics"]
    assert metrics["selected_by"] == "val_acc" and metrics["selected_epoch"] == hist.best("val_acc")["epoch"]
    assert 0.1 < metrics["val_acc"] < 1 and metrics["test_size"] == 10_000


def test_parameter_breakdown_adds_up():
    from capsule_lib.cost import count_parameters

    m = CapsModel(CapsModelConfig.cifar10_cpu())
    parts = m.parameter_breakdown()
    assert parts["total"] == count_parameters(m) == sum(v for k, v in parts.items() if k != "total")
    assert set(parts) == {"backbone", "primary capsules", "capsule layers", "final_fc", "total"}
