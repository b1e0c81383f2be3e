"""The comparison chapter (#14): its contestants named once, their recipes (same pipeline and budget, CNN of
matched size), the shipped runs being exactly those recipes stopped by the same budget and selected on
validation, the cost measurement and benchmark, and the chapter's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from capsule_lib.comparison import (  # noqa: E402
    BUDGET_MINUTES,
    CONTESTANTS,
    LABELS,
    SHORT_LABELS,
    contestant_recipe,
    measure_costs,
    shipped_name,
)
from capsule_lib.pretrained import load_pretrained_history, registry  # noqa: E402
from capsule_lib.routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS  # noqa: E402
from capsule_lib.train import History  # noqa: E402
from capsule_lib.train.recipes import recipe_config  # noqa: E402
from capsule_lib.viz.compare import plot_budget_curves, plot_iteration_sweeps, plot_routing_costs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_every_routing_and_the_cnn_is_a_contestant():
    assert CONTESTANTS == (*ROUTING_KINDS, "cnn")
    assert set(LABELS) == set(SHORT_LABELS) == set(CONTESTANTS)


@pytest.mark.parametrize("dataset", sorted(BUDGET_MINUTES))
def test_contestants_share_the_pipeline_and_the_cnn_is_of_matched_size(dataset):
    recipes = {n: contestant_recipe(n, dataset) for n in CONTESTANTS}
    shared = ("batch_size", "dataset", "seed", "lr", "lr_decay", "train_subset", "eval_subset", "amp")
    for n, r in recipes.items():
        assert all(getattr(r, k) == getattr(recipes["dynamic"], k) for k in shared), (n, dataset)
        assert r.has_augmentation(), n
    for n in ROUTING_KINDS:
        assert recipes[n].model.routing == n and recipes[n].model.iterations is None
        assert recipes[n].epochs == recipes["cnn"].epochs  # the same cap (and schedule length)
    sizes = {n: n_params(r.build_model()) for n, r in recipes.items()}
    caps = [sizes[n] for n in ROUTING_KINDS]
    assert min(caps) < sizes["cnn"] < max(caps), sizes
    # the CNN sees the same images as the capsule networks
    cnn, caps_cfg = recipes["cnn"].model, recipes["dynamic"].model
    assert (cnn.in_channels, cnn.image_size, cnn.n_classes) == (
        caps_cfg.in_channels,
        caps_cfg.image_size,
        caps_cfg.n_classes,
    )


def test_contestant_recipe_applies_overrides_and_names_bad_input():
    r = contestant_recipe("em", "norb", epochs=3, model__iterations=2)
    assert (r.epochs, r.model.routing, r.model.iterations, r.model.in_channels) == (3, "em", 2, 2)
    assert shipped_name("em", "norb") == "compare_norb_em"
    with pytest.raises(ValueError, match="unknown contestant name 'capsnet'; contestants: dynamic, em"):
        contestant_recipe("capsnet")
    with pytest.raises(ValueError, match="unknown comparison dataset 'cifar'; datasets: mnist, norb"):
        shipped_name("em", "cifar")


def test_measure_costs_quick_reports_every_figure_for_every_model():
    torch.manual_seed(0)
    models = {n: contestant_recipe(n, "mnist").build_model() for n in ("heinsen_2022", "cnn")}
    before = {k: v.clone() for k, v in models["cnn"].state_dict().items()}
    images = torch.randint(0, 256, (16, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (16,))
    costs = measure_costs(models, images, labels, "mnist", quick=True)
    for n, c in costs.items():
        assert c["params"] == n_params(models[n])
        assert c["train_img_per_s"] > 0 and c["latency_ms_b1"] > 0 and c["latency_ms_b16"] > 0
    assert all(torch.equal(before[k], v) for k, v in models["cnn"].state_dict().items())  # weights untouched
    with pytest.raises(ValueError, match="a batch of 16 needs 16 images, got 8"):
        measure_costs(models, images[:8], labels[:8], "mnist", quick=True)


# ------------------------------------------------------------------------------------ the shipped runs
SHIPPED = [(n, ds) for ds in sorted(BUDGET_MINUTES) for n in CONTESTANTS]


@pytest.mark.parametrize("name,dataset", SHIPPED, ids=[f"{ds}-{n}" for n, ds in SHIPPED])
def test_shipped_run_is_its_recipe_stopped_by_the_common_budget(name, dataset):
    key = shipped_name(name, dataset)
    entry = registry()[key]
    hist = load_pretrained_history(key)
    meta = hist.meta
    # the recipe recorded is the contestant's recipe, unchanged (only the device may say where it ran)
    want = contestant_recipe(name, dataset)
    got = recipe_config(meta["recipe"], meta["config"])
    assert type(got) is type(want) and got.config() == want.config()
    assert not meta.get("changes") and not meta.get("start_from")
    # the same budget for everyone, on the real data for MNIST (the viewpoint runs: the rendered set); a wall-clock
    # budget on MNIST, the recipe's epochs on the viewpoint protocol
    budget = BUDGET_MINUTES[dataset]
    assert meta.get("budget_minutes") == budget
    assert meta["seed"] == 0 and meta["amp"] is None
    assert meta["generated_data"] is (dataset == "norb")
    last = hist.records[-1]
    if budget is None:
        assert last["epoch"] == want.epochs
    else:
        assert last["wall_time"] >= 60 * budget - 1 or last["epoch"] == want.epochs
        assert last["wall_time"] < 60 * budget + 120  # stopped by the budget, not much after
    # selected on validation, never on the test set
    best = max((r for r in hist.records if "val_acc" in r), key=lambda r: r["val_acc"])
    assert entry["metrics"]["selected_by"] == "val_acc" and entry["metrics"]["selected_epoch"] == best["epoch"]
    assert entry["training"]["epochs"] == pytest.approx(last["epoch"])


def test_shipped_mnist_records_are_what_the_rounded_weights_score():
    """Each checkpoint's recorded test accuracy was computed on the fp16-rounded weights that ship; the chapter
    recomputes it, and the record must not be the training run's own (fp32) number by accident."""
    for name in CONTESTANTS:
        m = registry()[shipped_name(name, "mnist")]["metrics"]
        assert m["test_size"] == 10_000 and m["val_size"] == 5_000
        assert 0.5 < m["test_acc"] <= 1.0


# ----------------------------------------------------------------------------------------- benchmark
def test_compare_models_benchmark_quick_run(tmp_path):
    out = tmp_path / "compare_quick.json"
    script = REPO / "benchmarks" / "compare_models.py"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--quick",
            "--threads",
            "1",
            "--contestants",
            "heinsen_2022,cnn",
            "--out",
            str(out),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    res = json.loads(out.read_text())
    assert res["machine"]["torch"] == torch.__version__ and res["machine"]["torch_threads"] == 1
    assert [r["contestant"] for r in res["rows"]] == ["heinsen_2022", "cnn"]
    for r in res["rows"]:
        assert r["source"] == shipped_name(r["contestant"], "mnist")
        assert r["params"] > 0 and r["train_img_per_s"] > 0 and r["latency_ms_b1"] > 0


def test_committed_cost_benchmark_covers_every_contestant():
    res = json.loads((REPO / "benchmarks" / "results" / "compare_models_mnist_cpu.json").read_text())
    assert [r["contestant"] for r in res["rows"]] == list(CONTESTANTS)
    assert not res["quick"] and res["machine"]["cpu_count"] >= 1
    for r in res["rows"]:
        assert r["source"] == shipped_name(r["contestant"], "mnist")
        assert r["peak_train_mib"] > 0 and r["latency_ms_b256"] > r["latency_ms_b1"] > 0


# -------------------------------------------------------------------------------------------- figures
@pytest.mark.usefixtures("readable_figures")  # readable at the book's size (conftest.py)
def test_budget_curves_mark_a_partial_epoch():
    h = History(
        [
            {"epoch": 1, "val_acc": 0.9, "wall_time": 60.0},
            {"epoch": 1.5, "val_acc": 0.95, "wall_time": 90.0, "partial": True},
        ],
        {},
    )
    fig = plot_budget_curves({"a": h, "b": History([], {})})
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2  # the curve and the open marker; the empty history draws nothing
    assert list(ax.get_lines()[0].get_xdata()) == [1.0, 1.5]


@pytest.mark.usefixtures("readable_figures")  # readable at the book's size (conftest.py)
def test_iteration_sweeps_and_routing_costs_draw_every_series():
    rows = [{"iterations": t, "accuracy": 0.9 + 0.01 * t, "ms_per_image": 0.1 * t} for t in (1, 2, 3)]
    fig = plot_iteration_sweeps({"x": rows, "y": rows}, trained={"x": 2})
    assert len(fig.axes[0].get_lines()) == 3 and len(fig.axes[1].get_lines()) == 2
    res = json.loads((REPO / "benchmarks" / "results" / "routing_scaling_cpu.json").read_text())
    fig = plot_routing_costs(res["rows"])
    n_kinds = len({r["kind"] for r in res["rows"]})
    assert len(fig.axes) == 6  # time and peak memory against inputs, outputs and iterations
    assert len(fig.axes[0].get_lines()) == 2 * n_kinds  # fp32 and bf16 for every routing
    iterating = sum(t is not None for t in DEFAULT_ITERATIONS.values())
    assert len(fig.axes[2].get_lines()) == 2 * iterating


def test_contestant_recipe_takes_the_recipe_dataset_as_an_override():
    r = contestant_recipe("em", "norb", dataset="rendered_norb", train_subset=8)
    assert (r.dataset, r.train_subset, r.model.routing, r.model.in_channels) == ("rendered_norb", 8, "em", 2)


def test_run_budget_rows_say_what_each_budget_bought():
    from capsule_lib.comparison import RUN_BUDGET_HEADERS, run_budget_rows

    h = History(meta={"budget_minutes": 8.0, "train_images": 1000, "config": {"epochs": 30}})
    h.append({"epoch": 1, "val_acc": 0.9, "wall_time": 100.0})
    h.append({"epoch": 1.5, "val_acc": 0.95, "wall_time": 480.0, "partial": True})
    (row,) = run_budget_rows({("mnist", "cnn"): h})
    assert len(row) == len(RUN_BUDGET_HEADERS)
    assert row == ["mnist", SHORT_LABELS["cnn"], "8\u00a0min", "1.50 (budget)", "1,500", "3", "1.5", "95.00"]
