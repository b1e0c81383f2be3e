"""The book's rule for what enters a comparison or a verdict (:mod:`capsule_lib.learning`), checked on the shipped
records, and the probe of a run's first steps that finds why a network does not learn."""

from __future__ import annotations

import pytest
import torch

from capsule_lib.comparison import (
    BUDGET_MINUTES,
    CONTESTANTS,
    contestant_accuracies,
    contestant_recipe,
    result_headers,
    result_rows,
    shipped_name,
    untrained_contestants,
)
from capsule_lib.data import DataSource
from capsule_lib.learning import (
    CHANCE,
    DIAGNOSIS_HEADERS,
    DID_NOT_TRAIN,
    LEARNED_SHARE,
    diagnosis_rows,
    first_steps,
    learned,
    learning_threshold,
    unlabelled,
    untrained,
)
from capsule_lib.pretrained import registry
from capsule_lib.routing_critique import best_val, recorded_runs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_rule_is_halfway_from_chance_to_the_best():
    assert LEARNED_SHARE == 0.5
    assert learning_threshold(0.98, 0.1) == pytest.approx(0.54)
    assert learned(0.54, 0.98, 0.1) and not learned(0.5399, 0.98, 0.1)
    assert learned(0.2, 0.2, 0.2)  # when the best is at chance, nothing is asked beyond chance
    runs = {"a": 0.98, "b": 0.80, "c": 0.11, "d": 0.55}
    assert untrained(runs, 0.1) == {"c": 0.11} and untrained({}, 0.1) == {}
    assert unlabelled(runs, 0.1, labels={}) == ["c"] and unlabelled(runs, 0.1, labels={"c": "measured cause"}) == []


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: learning_threshold(98.0, 0.1),
            r"chance and best must be accuracies in \[0, 1\], got chance=0.1, best=98.0",
        ),
        (lambda: learned(1.5, 0.9, 0.1), r"val_acc must be an accuracy in \[0, 1\], got 1.5"),
    ],
)
def test_the_rule_refuses_numbers_that_are_not_accuracies_in_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_every_shipped_critique_run_learned_or_is_labelled_with_its_cause():
    """The chapter "Do capsules need routing?": every recorded run passes the rule against the best run on its data
    (every run of a data set has the same budget), or carries its measured cause in ``DID_NOT_TRAIN``."""
    rows = recorded_runs()["rows"]
    for dataset in ("mnist", "norb"):
        runs = {r["name"]: r["val_acc"] for r in rows if r["dataset"] == dataset}
        line = learning_threshold(best_val(rows, dataset), CHANCE[dataset])  # the best run at the chapter's budget
        assert runs and line > CHANCE[dataset], dataset
        assert sorted(n for n, acc in runs.items() if acc < line and n not in DID_NOT_TRAIN) == [], dataset


def test_every_shipped_comparison_run_learned_or_is_labelled_with_its_cause():
    reg = registry()
    for dataset in BUDGET_MINUTES:
        accuracies = contestant_accuracies(reg, dataset)
        assert set(accuracies) == set(CONTESTANTS), dataset
        labelled = {shipped_name(n, dataset): acc for n, acc in accuracies.items()}
        assert unlabelled(labelled, CHANCE[dataset]) == [], dataset


def test_the_labels_name_recorded_runs_that_really_break_the_rule():
    """A label is for a run that breaks the rule: a stale label (the run retrained, or learning) would hide nothing
    and say something false."""
    records = recorded_runs()["rows"]
    rows = {r["name"]: r for r in records}
    for name, cause in DID_NOT_TRAIN.items():
        assert name in rows and "benchmarks/learning_diagnostics.py" in cause, name
        ds = rows[name]["dataset"]
        assert not learned(rows[name]["val_acc"], best_val(records, ds), CHANCE[ds]), name


def test_the_comparison_table_says_which_contestant_did_not_train():
    reg = {shipped_name(n, "norb"): {"metrics": {"val_acc": 0.9 if n != "em" else 0.3}} for n in CONTESTANTS}
    assert untrained_contestants(reg, "norb") == ["em"] and untrained_contestants(reg, "mnist") == []
    results = {
        n: {"params": 1e6, "accuracy": 0.99, "affine": 0.6, "familiar": 0.3, "novel": None} for n in ("em", "cnn")
    }
    rows = result_rows(results, {"norb": ["em"]})
    assert len(result_headers("MNIST")) == len(rows[0]) and rows[0][2] == "99.00" and rows[0][4] == "39.0"
    assert rows[0][5] == "30.00 (did not train)" and rows[1][5] == "30.00" and rows[0][6] == "not shipped"


@pytest.fixture
def standins(tmp_path):
    return DataSource.of(str(tmp_path), offline=True, standin=True)


@pytest.mark.slow
def test_the_first_steps_of_a_run_are_measured_as_it_trains(standins):
    recipe = contestant_recipe("dynamic", "mnist", train_subset=64, eval_subset=32, model__hidden=(4,))
    r = first_steps(recipe, steps=6, data_root=standins, every=3, n_probe=16)
    assert r["recipe"] == "routing_compare_mnist" and r["config"]["model"]["hidden"] == [4]
    assert len(r["loss"]) == len(r["lr"]) == 6 and all(v > 0 for v in r["loss"])
    assert [p["step"] for p in r["probes"]] == [0, 1, 2, 3, 5, 6]
    start, end = r["probes"][0], r["probes"][-1]
    assert "grad_rms" not in start and list(end["grad_rms"]) == ["stem", "primary", "hidden_layers.0", "routing"]
    assert len(end["lengths"]) == 2 and all(0 <= x["mean"] < 1 and 0 <= x["saturated"] <= 1 for x in end["lengths"])
    assert 0.0 <= end["val_acc"] <= 1.0 and "activations" not in end
    # the same seed, the same start: the probe trains what train() would train
    again = first_steps(recipe, steps=6, data_root=standins, every=3, n_probe=16)
    assert again["loss"] == r["loss"]
    # a routing that takes activations: their mean and the share switched off; a setup hook runs on the built network
    seen = []
    em = first_steps(
        contestant_recipe("em", "mnist", train_subset=64, eval_subset=32), 2, standins, 1, 16, setup=seen.append
    )
    assert 0 < em["probes"][-1]["activations"]["mean"] < 1 and len(seen) == 1 and hasattr(seen[0], "routing")
    rows = diagnosis_rows({"dynamic": r, "EM": em})
    assert len(rows[0]) == len(DIAGNOSIS_HEADERS) and rows[1][4] == "-" and rows[0][3] == "-"
    assert len(rows[0][5].split(", ")) == 4


def test_the_first_steps_refuse_bad_arguments_in_one_line():
    recipe = contestant_recipe("dynamic", "mnist")
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        first_steps(recipe, steps=0)
    with pytest.raises(ValueError, match="every must be a positive integer, got 2.5"):
        first_steps(recipe, every=2.5)
    with pytest.raises(TypeError, match="recipe must be a Recipe"):
        first_steps("routing_compare_mnist")


def test_the_viewpoint_protocol_warms_the_learning_rate_up_over_its_first_epoch():
    r = contestant_recipe("heinsen_2019", "norb")
    assert r.warmup_epochs == 1.0 and r.scheduler_step == "batch"
    r._steps_per_epoch = 10
    factors = [r.lr_factor(s) for s in range(25)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(r.lr_decay) and factors[20] == pytest.approx(r.lr_decay**2)
    plain = contestant_recipe("heinsen_2019", "norb", warmup_epochs=0)
    assert plain.scheduler_step == "epoch" and plain.lr_factor(2) == pytest.approx(plain.lr_decay**2)
    assert contestant_recipe("cnn", "norb").warmup_epochs == 1.0  # every contestant of the protocol
    with pytest.raises(ValueError, match=r"warmup_epochs must be a number from 0 to epochs \(15\), got -1"):
        contestant_recipe("em", "norb", warmup_epochs=-1)
    mnist = contestant_recipe("dynamic", "mnist", warmup_epochs=1.0)
    mnist._steps_per_epoch = 4
    assert mnist.lr_factor(0) == pytest.approx(0.25) and mnist.lr_factor(3) == pytest.approx(
        mnist.lr_decay ** (3 / 2000)
    )
    with pytest.raises(ValueError, match="warmup_epochs must be a number from 0 to epochs"):
        contestant_recipe("dynamic", "mnist", warmup_epochs=31)


def test_votes_scaled_to_the_fan_in_start_at_unit_weights_and_learn_slower_by_the_fan_in():
    from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig
    from capsule_lib.routing.dynamic import DynamicRouting, capsule_votes

    torch.manual_seed(0)
    layer = DynamicRouting(400, 10, 16, 16).scale_votes_()
    assert layer.vote_scale == pytest.approx(10 / 400) and torch.count_nonzero(layer.bias) == 0
    effective = layer.weight * layer.vote_scale
    assert effective.std().item() == pytest.approx(1.0, rel=0.02) and "vote_scale=0.025" in repr(layer)
    u = torch.randn(2, 400, 16)
    torch.testing.assert_close(layer.votes(u), capsule_votes(u, effective))
    net = RoutingClassifier(
        RoutingClassifierConfig(stem_channels=(8, 16), primary_types=4, hidden=(6,), scaled_votes=True)
    )
    assert [m.vote_scale for m in (*net.hidden_layers, net.routing)] == pytest.approx([6 / 144, 10 / 6])
    with pytest.raises(ValueError, match="scaled_votes needs a routing head whose layer scales its votes"):
        RoutingClassifierConfig(routing="em", scaled_votes=True)
    with pytest.raises(ValueError, match="vote_scale must be a number > 0, got 0"):
        DynamicRouting(4, 2, 4, 4, vote_scale=0)


def test_hidden_layers_started_at_unit_weights_pass_the_image_on():
    """The paper's initialisation makes a hidden layer of 16 capsules output its bias for every image; weights
    N(0, 1) and biases 0 (``hidden_init="unit"``) make its outputs differ from image to image. The class layer keeps
    the paper's initialisation."""
    from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig

    x = torch.rand(8, 1, 28, 28)
    spread = {}
    for init in ("paper", "unit"):
        torch.manual_seed(0)
        cfg = RoutingClassifierConfig(stem_channels=(8, 16), primary_types=4, hidden=(16, 16), hidden_init=init)
        net = RoutingClassifier(cfg).eval()
        out = net(x, return_routing=True)
        hidden = out.extra["traces"][1].outputs[-1]  # [B, 16, 16]: the second hidden layer's capsules
        spread[init] = (hidden - hidden.mean(0)).norm(dim=-1).mean().item() / hidden.norm(dim=-1).mean().item()
        if init == "unit":
            assert all(torch.count_nonzero(m.bias) == 0 for m in net.hidden_layers)
            assert abs(net.hidden_layers[0].weight.std().item() - 1.0) < 0.05
            assert net.routing.weight.std().item() < 0.02  # the class layer: the paper's
    assert spread["paper"] < 1e-2 < 0.1 < spread["unit"]
    with pytest.raises(ValueError, match="hidden_init must be one of \\('paper', 'unit'\\), got 'zeros'"):
        RoutingClassifierConfig(hidden_init="zeros")
    with pytest.raises(ValueError, match="hidden_init='unit' needs a routing layer with unit_init_"):
        RoutingClassifierConfig(routing="em", hidden_init="unit")
