"""The chapter "Do capsules need routing?" on the library side: the routing-free heads of the comparison network,
the runs' protocol, the parse-tree measurements of multi-layer networks and the two-standard-error reading of the
runs."""

from __future__ import annotations

import math

import pytest
import torch

from capsule_lib.critique import (
    CouplingStats,
    LayerRouting,
    RoutingChanges,
    alive_share,
    routing_by_layer,
)
from capsule_lib.layers.routing_free import SharedTransformCapsules
from capsule_lib.learning import NOT_TESTED
from capsule_lib.models import EMCapsNet, EMCapsNetConfig, SmallNORBClassifier, SmallNORBConfig
from capsule_lib.models.routing_classifier import RoutingClassifier, RoutingClassifierConfig
from capsule_lib.routing.kinds import ROUTING_KINDS
from capsule_lib.routing_critique import (
    CRITIQUE_BUDGET,
    CRITIQUE_DEPTHS,
    DEPTH_CAPSULES,
    LONGER_EPOCHS,
    PANELS,
    ROUTING_FREE_ROWS,
    CritiqueRun,
    Measured,
    config_key,
    coupling_panels,
    coupling_rows,
    critique_runs,
    depth_rows,
    depth_series,
    iteration_rows,
    measured,
    merge_records,
    records_line,
    routing_free_rows,
    summarise,
    train_run,
    versus,
)
from capsule_lib.types import COUPLINGS

pytestmark = pytest.mark.usefixtures("one_thread")


def _net(**kw) -> RoutingClassifier:
    torch.manual_seed(0)
    return RoutingClassifier(RoutingClassifierConfig(stem_channels=(8, 16), primary_types=4, **kw))


@pytest.mark.parametrize("head, kind", [("hvc", "logits"), ("shared_transform", "lengths"), ("aff_capsnet", "lengths")])
def test_routing_free_heads_give_class_capsules_and_a_gradient_for_every_parameter(head, kind, adam_steps):
    model = _net(head=head)
    assert model.routing is None and model.config.routing_iterations is None
    x, y = torch.rand(5, 1, 28, 28), torch.arange(5)
    out = model(x)
    assert out.kind == kind and out.scores.shape == (5, 10) and out.poses.shape == (5, 10, 16)
    assert torch.isfinite(out.scores).all()
    model.zero_grad()
    from capsule_lib.losses import ScoreObjective

    ScoreObjective()(model, (x, y), True).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    losses = adam_steps(model, x, y)
    assert losses[-1] < losses[0]


def test_the_shared_transform_head_is_the_layer_on_the_squashed_primaries():
    model = _net(head="shared_transform").eval()
    x = torch.rand(3, 1, 28, 28)
    poses, _ = model.primary_capsules(x)
    assert isinstance(model.head, SharedTransformCapsules)
    torch.testing.assert_close(model(x).poses, model.head(model.kind.squash(poses)))


def test_routing_free_heads_refuse_routing_settings_in_one_line():
    with pytest.raises(ValueError, match="head 'hvc' routes nothing"):
        RoutingClassifierConfig(head="hvc", couplings="uniform")
    with pytest.raises(ValueError, match="head 'hvc' routes nothing"):
        RoutingClassifierConfig(head="hvc", iterations=2)
    with pytest.raises(ValueError, match="head"):
        RoutingClassifierConfig(head="capsules")
    with pytest.raises(ValueError, match="has no routing"):
        _net(head="hvc")(torch.rand(2, 1, 28, 28), iterations=3)


def test_the_runs_cover_every_routing_with_both_baselines_and_the_heads_once():
    runs = critique_runs()
    names = [r.name for r in runs]
    assert len(names) == len(set(names))
    per_seed_and_set = len(ROUTING_KINDS) * 3 + 2  # routed, uniform, random; dynamic at 2 and 5 iterations
    depths = len(CRITIQUE_DEPTHS)  # the depth series on MNIST, hidden layers started as the paper's and at N(0, 1)
    # two datasets, two seeds; heads on MNIST; the "unit" series has no one-layer network (it has no hidden layer);
    # Aff-CapsNets' layer and the routed dynamic network with the lengthened budget
    assert len(runs) == 2 * 2 * per_seed_and_set + 2 * 3 + 2 * depths + 2 * (depths - 1) + 2 * 2
    longer = [r for r in runs if r.budget_epochs is not None]
    assert {config_key(vars(r)) for r in longer} == {
        f"aff_capsnet_e{LONGER_EPOCHS}",
        f"dynamic_routed_e{LONGER_EPOCHS}",
    }
    assert (
        longer[0].recipe().epochs == LONGER_EPOCHS
        and longer[0].name == f"critique_mnist_aff_capsnet_e{LONGER_EPOCHS}_seed0"
    )
    heads = {config_key(vars(r)) for r in runs if r.head != "routing" and r.budget_epochs is None}
    assert heads == {"hvc", "shared_transform", "aff_capsnet"}
    assert sorted(r.depth for r in runs if r.depth is not None and r.hidden_init == "paper") == sorted(
        CRITIQUE_DEPTHS * 2
    )
    assert sorted(r.depth for r in runs if r.hidden_init == "unit") == sorted([k for k in CRITIQUE_DEPTHS if k > 1] * 2)
    assert len(critique_runs(("norb",))) == 2 * per_seed_and_set  # no heads, no depth series without MNIST


def test_a_runs_recipe_carries_its_couplings_iterations_head_seed_and_the_budget():
    r = CritiqueRun("mnist", "em", "random", seed=1).recipe()
    assert (r.model.routing, r.model.couplings, r.seed) == ("em", "random", 1)
    assert (r.epochs, r.train_subset) == (CRITIQUE_BUDGET["mnist"]["epochs"], CRITIQUE_BUDGET["mnist"]["train_subset"])
    r = CritiqueRun("norb", "dynamic", iterations=5).recipe()
    assert r.model.iterations == 5 and r.model.n_classes == 5 and r.epochs == CRITIQUE_BUDGET["norb"]["epochs"]
    assert r.dataset == "rendered_norb"  # the generated viewpoint set, as the comparison's runs
    r = CritiqueRun("mnist", "dynamic", head="hvc").recipe()
    assert r.model.head == "hvc" and r.build_model().routing is None
    assert CritiqueRun("mnist", "dynamic", iterations=2, seed=1).name == "critique_mnist_dynamic_routed_T2_seed1"
    r = CritiqueRun("mnist", "dynamic", depth=3).recipe()
    assert r.model.hidden == (DEPTH_CAPSULES,) * 2 and len(r.build_model().hidden_layers) == 2
    assert CritiqueRun("mnist", "dynamic", depth=1).recipe().model.hidden == ()
    assert CritiqueRun("mnist", "dynamic", depth=3).name == "critique_mnist_dynamic_routed_depth3_seed0"
    unit = CritiqueRun("mnist", "dynamic", depth=2, hidden_init="unit")
    assert unit.name == "critique_mnist_dynamic_routed_depth2_unit_seed0" and unit.recipe().model.hidden_init == "unit"
    assert CritiqueRun("norb", "heinsen_2019").recipe().warmup_epochs == 1.0  # the viewpoint protocol warms up


def test_measured_adds_the_seed_spread_and_the_binomial_error():
    m = measured([0.90, 0.92], 10_000)
    want = math.sqrt(0.0002 / 2 + 0.91 * 0.09 / 10_000 / 2)
    assert m.mean == pytest.approx(0.91) and m.se == pytest.approx(want) and m.values == (0.90, 0.92)
    assert measured([0.5], 100).se == pytest.approx(0.05)  # one seed: the binomial error alone
    assert str(measured([0.9, 0.9], 10**12)).startswith("90.00 ± 0.00")


def test_versus_is_the_two_standard_error_rule():
    a, b = measured([0.95, 0.95], 10**9), measured([0.90, 0.90], 10**9)
    assert versus(a, b) == "higher" and versus(b, a) == "lower"
    assert versus(measured([0.90, 0.92], 10_000), measured([0.91, 0.91], 10_000)) == "within noise"


def _row(kind, couplings, seed, **metrics):
    metrics.setdefault("val_acc", metrics.get("test_acc", 0.9))
    return dict(dataset="mnist", kind=kind, couplings=couplings, seed=seed, iterations=None, head="routing", **metrics)


def test_summarise_groups_the_seeds_and_coupling_rows_read_them():
    rows = [
        _row(k, c, s, test_acc=acc + 0.001 * s, affine_acc=0.5)
        for k in ROUTING_KINDS
        for c, acc in (("routed", 0.99), ("uniform", 0.90), ("random", 0.99))
        for s in (0, 1)
    ]
    summary = summarise(rows, "mnist")
    assert summary["em_routed"]["test_acc"].values == (0.99, 0.991)
    table = coupling_rows(summary, "test_acc")
    assert len(table) == len(ROUTING_KINDS) and all(r[4:] == ["higher", "within noise"] for r in table)
    assert summarise(rows, "norb") == {}


def test_alive_share_counts_parents_active_on_enough_images():
    act = torch.zeros(100, 4)
    act[:, 0], act[:2, 1] = 0.9, 0.9
    assert alive_share(act) == 0.5 and alive_share(act, min_share=0.05) == 0.25
    with pytest.raises(ValueError, match=r"activity must be \[N >= 1, n_parents\]"):
        alive_share(torch.ones(3))


@pytest.mark.parametrize(
    "make, x",
    [
        (
            lambda: EMCapsNet(
                EMCapsNetConfig(
                    in_channels=2,
                    image_size=20,
                    conv_channels=8,
                    primary_types=4,
                    caps1_types=4,
                    caps2_types=4,
                    n_classes=5,
                )
            ),
            torch.rand(4, 2, 20, 20),
        ),
        (
            lambda: SmallNORBClassifier(SmallNORBConfig(n_parts=4, d_chns=8, image_size=48, iterations=2)),
            torch.rand(4, 2, 48, 48),
        ),
    ],
)
def test_the_parse_tree_of_every_layer_starts_uniform_and_is_measured_per_depth(make, x):
    torch.manual_seed(0)
    model = make().train()
    layers = routing_by_layer(model, x, iterations=(1, 3), batch_size=3)
    assert model.training  # given back in its mode
    depths = sorted({r.depth for r in layers})
    assert depths == list(range(1, len(depths) + 1)) and len(depths) >= 2
    assert [r.iterations for r in layers] == [1] * len(depths) + [3] * len(depths)
    for r in layers:
        assert 0.0 <= r.stats.alive <= 1.0 and 1.0 / r.n_out <= r.stats.max_share + 1e-9
        if r.iterations == 1:  # the couplings used in the first pass are uniform, the same for every image
            assert r.stats.entropy == pytest.approx(1.0) and r.stats.variation == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("kind", sorted(ROUTING_KINDS))
def test_hidden_routing_layers_stack_the_same_routing_and_trace_every_layer(kind):
    model = _net(routing=kind, hidden=(6, 5)).train()
    assert [type(m) for m in model.hidden_layers] == [ROUTING_KINDS[kind].layer] * 2
    x, y = torch.rand(3, 1, 28, 28), torch.arange(3)
    out = model(x, return_routing=True)
    assert out.scores.shape == (3, 10) and out.poses.shape == (3, 10, 16) and torch.isfinite(out.scores).all()
    traces = out.extra["traces"]
    assert [t.coefficients[-1].shape[-2:] for t in traces] == [(model.config.n_primary, 6), (6, 5), (5, 10)]
    assert traces[-1] is out.trace
    for t in traces:
        torch.testing.assert_close(t.coefficients[-1].sum(-1), torch.ones(t.coefficients[-1].shape[:-1]))
    from capsule_lib.losses import ScoreObjective

    ScoreObjective()(model, (x, y), True).loss.backward()
    for name, p in model.named_parameters():  # Heinsen 2019's output coefficients start at zero: no zero check
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert "traces" not in model(x).extra
    assert _net(routing=kind)(x, return_routing=True).extra["traces"][0].coefficients[-1].shape[-1] == 10


def test_hidden_layers_refuse_bad_sizes_and_routing_free_heads_in_one_line():
    with pytest.raises(ValueError, match=r"hidden must hold capsule counts >= 2, got \(1,\)"):
        RoutingClassifierConfig(hidden=(1,))
    with pytest.raises(ValueError, match="hidden routing layers need head='routing'"):
        RoutingClassifierConfig(head="hvc", hidden=(8,))


@pytest.mark.parametrize("kind, alive", [("dynamic", True), ("heinsen_2022", False)])
def test_the_parse_tree_of_a_deeper_routing_classifier_is_measured_per_layer(kind, alive):
    torch.manual_seed(0)
    layers = routing_by_layer(_net(routing=kind, hidden=(6,)), torch.rand(4, 1, 28, 28), iterations=(1,))
    assert [(r.layer, r.depth, r.n_out) for r in layers] == [("layer 1", 1, 6), ("layer 2", 2, 10)]
    for r in layers:  # lengths are dynamic routing's activity; Heinsen 2022's outputs have none
        assert (r.stats.alive is not None) == alive and r.stats.entropy == pytest.approx(1.0)


def test_the_parse_tree_needs_per_layer_traces():
    from capsule_lib.models import CapsNet

    with pytest.raises(ValueError, match=r"CapsNet gives no per-layer traces in extra\['traces'\]"):
        routing_by_layer(CapsNet(), torch.rand(2, 1, 28, 28))


@pytest.mark.parametrize("run", [CritiqueRun("mnist", "dynamic", "random"), CritiqueRun("norb", "em", seed=1)])
def test_a_run_trains_and_records_what_the_chapter_reads(run, tmp_path):
    from capsule_lib.data import DataSource
    from capsule_lib.routing_critique import METRICS

    source = DataSource.of(str(tmp_path), offline=True, standin=True)
    rec = train_run(run, source, train_subset=32, eval_subset=16, epochs=1, device="cpu")
    assert (rec["name"], rec["couplings"], rec["seed"]) == (run.name, run.couplings, run.seed)
    assert set(METRICS[run.dataset]) <= set(rec) and all(0.0 <= rec[m] <= 1.0 for m in METRICS[run.dataset])
    assert rec["train_images"] == 32 and rec["epochs"] == 1 and rec["parameters"] > 0
    assert summarise([rec], run.dataset)[config_key(rec)][next(iter(METRICS[run.dataset]))].values == (
        rec[next(iter(METRICS[run.dataset]))],
    )


def test_a_depth_run_records_its_layers(tmp_path):
    from capsule_lib.data import DataSource

    source = DataSource.of(str(tmp_path), offline=True, standin=True)
    rec = train_run(CritiqueRun("mnist", "dynamic", depth=2), source, train_subset=32, eval_subset=16, device="cpu")
    assert rec["depth"] == 2 and [r["layer"] for r in rec["layers"]] == ["hidden_layers.0", "routing"]
    for layer in rec["layers"]:
        assert 0.0 <= layer["alive"] <= 1.0 and 0.0 <= layer["entropy"] <= 1.0 + 1e-6 and layer["grad_rms"] > 0
    point = depth_series([rec])[2]
    assert point.gradients == [r["grad_rms"] for r in rec["layers"]] and len(point.never_active) == 1


def _depth_row(depth, seed, acc, alive, grads):
    layers = [
        dict(layer=f"l{i}", entropy=1.0, max_share=0.5, variation=0.0, alive=a, grad_rms=g)
        for i, (a, g) in enumerate(zip(alive, grads))
    ]
    return {
        **_row("dynamic", "routed", seed, test_acc=acc, affine_acc=acc / 2),
        "depth": depth,
        "parameters": 10**6,
        "layers": layers,
    }


def test_the_depth_series_averages_the_seeds_and_its_verdicts_read_the_deepest_network():
    from capsule_lib.critique_verdicts import depth_verdicts

    rows = [_depth_row(1, s, 0.98, [1.0], [1e-2]) for s in (0, 1)] + [
        _depth_row(3, 0, 0.60, [1.0, 0.2, 1.0], [1e-6, 1e-4, 1e-2]),
        _depth_row(3, 1, 0.62, [1.0, 0.4, 1.0], [3e-6, 1e-4, 1e-2]),
    ]
    series = depth_series(rows)
    assert sorted(series) == [1, 3] and series[3].never_active == pytest.approx([0.0, 0.7])
    assert series[3].gradients == pytest.approx([2e-6, 1e-4, 1e-2]) and series[3].accuracy["test_acc"].mean == 0.61
    table = depth_rows(series)
    assert table[0][4] == "-" and table[1][4] == "0%, 70%" and table[1][5] == "2.0e-06, 1.0e-04, 1.0e-02"
    deeper, starve, vanish = depth_verdicts(series)
    assert (deeper[3], starve[3], vanish[3]) == ("holds", "holds", "holds")
    assert "{cite}`mitterreiter2023why`" in deeper[1] and "3 routing layers" in starve[0]
    assert depth_verdicts({}) == []
    # a depth whose runs did not learn (below halfway from chance to the best MNIST run): its verdicts are not tested
    rows[2:] = [_depth_row(3, s, 0.11, [1.0, 0.0, 1.0], [1e-10, 1e-6, 1e-3]) for s in (0, 1)]
    series = depth_series(rows)
    assert not series[3].accuracy["test_acc"].learned and str(series[3].accuracy["test_acc"]).endswith(
        "(did not train)"
    )
    assert [r[3] for r in depth_verdicts(series, "dynamic, defaults")] == [NOT_TESTED] * 3
    # the "unit" series is read apart from the paper's, and shares its one-layer network (no hidden layer)
    unit = [{**r, "hidden_init": "unit", "test_acc": 0.97, "val_acc": 0.97} for r in rows[2:]]
    both = depth_series(rows + unit, hidden_init="unit")
    assert both[3].accuracy["test_acc"].mean == 0.97 and both[1].accuracy["test_acc"].mean == 0.98


def _m(acc: float) -> Measured:
    return measured([acc, acc], 10**9)  # a standard error of ~0: only the means decide


def test_fixed_coupling_verdicts_follow_the_two_standard_error_rule():
    from capsule_lib.critique_verdicts import fixed_coupling_verdicts

    summary = {
        "mnist": {
            "dynamic_routed": {"test_acc": _m(0.95), "affine_acc": _m(0.6)},
            "dynamic_uniform": {"test_acc": _m(0.90), "affine_acc": _m(0.5)},
            "dynamic_random": {"test_acc": _m(0.95), "affine_acc": _m(0.7)},
            "em_routed": {"test_acc": _m(0.80)},
            "em_uniform": {"test_acc": _m(0.90)},
            "em_random": {"test_acc": _m(0.80)},
        }
    }
    rows = {r[0]: r for r in fixed_coupling_verdicts(summary)}
    dyn, em = (
        rows["routing is no better than fixed couplings (dynamic)"],
        rows["routing is no better than fixed couplings (EM)"],
    )
    assert dyn[3] == "uniform: does not hold; random: holds" and em[3] == "uniform: holds; random: within noise"
    assert "routed - uniform: +5.0 (MNIST test), +10.0 (affine MNIST) points" in dyn[2]
    assert "{cite}`paik2019capsule`" in dyn[1] and len(rows) == 2
    summary["mnist"]["dynamic_random"]["affine_acc"] = _m(0.5)
    (dyn, _) = fixed_coupling_verdicts(summary)
    assert dyn[3].endswith("random: does not hold")
    summary["mnist"]["dynamic_random"]["test_acc"] = _m(0.99)
    assert fixed_coupling_verdicts(summary)[0][3].endswith("random: mixed")
    summary["norb"] = {
        "dynamic_routed": {"test_novel_acc": measured([0.2], 10**9)},  # one seed: shown, not judged
        "dynamic_uniform": {"test_novel_acc": measured([0.6], 10**9)},
    }
    assert "novel" not in fixed_coupling_verdicts(summary)[0][2]
    assert coupling_rows(summary["norb"], "test_novel_acc")[0][4] == "one seed: not judged"
    # a baseline that did not learn: not tested, in the verdict and in the table
    summary["mnist"]["em_uniform"] = {"test_acc": measured([0.1, 0.1], 10**9, learned=False)}
    em = {r[0]: r for r in fixed_coupling_verdicts(summary)}["routing is no better than fixed couplings (EM)"]
    assert em[3] == f"uniform: {NOT_TESTED}; random: within noise"
    assert coupling_rows(summary["mnist"], "test_acc")[1][4] == NOT_TESTED


def test_summarise_marks_a_configuration_that_did_not_learn():
    rows = [_row("dynamic", "routed", s, test_acc=0.98) for s in (0, 1)]
    rows += [_row("em", "uniform", 0, test_acc=0.60), _row("em", "uniform", 1, test_acc=0.50)]  # the bar: 0.54
    summary = summarise(rows, "mnist")
    assert summary["dynamic_routed"]["test_acc"].learned and not summary["em_uniform"]["test_acc"].learned
    assert str(summary["em_uniform"]["test_acc"]) == "55.00 ± 5.01 (did not train)"  # seeds and 10,000 images


def test_the_chapters_tables_come_from_the_records():
    rows = [
        _row(k, c, s, test_acc=0.9 + 0.01 * s, affine_acc=0.5) for k in ROUTING_KINDS for c in COUPLINGS for s in (0, 1)
    ]
    rows += [{**_row("dynamic", "routed", s, test_acc=0.95, affine_acc=0.6), "iterations": 5} for s in (0, 1)]
    norb = [
        {**_row("dynamic", c, s, test_novel_acc=0.7, test_familiar_acc=0.8), "dataset": "norb"}
        for c in COUPLINGS
        for s in (0, 1)
    ]
    summaries = {"mnist": summarise(rows, "mnist"), "norb": summarise(norb, "norb")}
    panels = coupling_panels(summaries)
    assert list(panels) == list(PANELS) and set(panels["MNIST test"]["em"]) == set(COUPLINGS)
    assert (
        panels["novel views (smallNORB-like)"]["em"] == {} and panels["affine MNIST"]["dynamic"]["routed"].mean == 0.5
    )
    headers, table = iteration_rows(summaries)
    assert headers[0] == "iterations" and [r[0] for r in table] == [1, 2, 3, 5]
    assert table[1][1] == "not run" and table[3][1].startswith("95.00") and table[0][3].startswith("70.00")
    records = {"rows": [{**r, "parameters": 10**6} for r in rows]}
    free = routing_free_rows(records, summaries["mnist"])
    assert [r[0] for r in free] == [ROUTING_FREE_ROWS["dynamic_routed"], ROUTING_FREE_ROWS["dynamic_uniform"]]
    assert free[0][1] == "1.00M"


def test_the_rule_on_the_records_lists_the_runs_below_the_line_with_their_cause():
    from capsule_lib.routing_critique import untrained_rows

    rows = [
        {"name": "critique_mnist_a_seed0", "dataset": "mnist", "val_acc": 0.98},
        {"name": "critique_mnist_b_seed0", "dataset": "mnist", "val_acc": 0.11},
        {"name": "critique_norb_a_seed0", "dataset": "norb", "val_acc": 0.90},
    ]
    (mnist, norb) = untrained_rows({"rows": rows})
    assert mnist == ["mnist", "98.00", "54.00", "mnist_b_seed0 (11.0)", "not labelled"]
    assert norb[3:] == ["none", "-"]


def test_the_first_pass_check_is_exact_for_every_iterative_routing():
    from capsule_lib.critique import first_pass_rows

    rows = dict(first_pass_rows())
    assert rows["self-attention"] == "no iterations" and len(rows) == len(ROUTING_KINDS)
    assert all(float(v) < 1e-12 for k, v in rows.items() if k != "self-attention")


def test_records_merge_by_name_and_say_where_they_ran():
    old_rows = [
        {"name": r.name, "dataset": r.dataset, "torch": "2.0", "total_seconds": 3600.0} for r in critique_runs()[:3]
    ]
    old = {"machine": {"device_name": "AMD EPYC"}, "rows": old_rows}
    new = [{**old_rows[1], "device_name": "Intel Xeon", "torch": "2.1"}, {"name": "not planned", "device_name": "x"}]
    merged = merge_records(old, new)
    assert [r["name"] for r in merged["rows"]] == [r["name"] for r in old_rows] and merged["rows"][1]["torch"] == "2.1"
    assert merged["machines"] == {"AMD EPYC": 2, "Intel Xeon": 1} and len(merged["missing"]) == len(critique_runs()) - 3
    assert (
        records_line(merged)
        == "3 runs (2 on AMD EPYC, 1 on Intel Xeon), one thread each, torch 2.0, 2.1; 3.0 CPU hours"
    )


def _changes(acc, entropies, default=3):
    its = tuple(range(1, len(entropies) + 1))
    stats = tuple(CouplingStats(e, 0.5, 0.1) for e in entropies)
    return RoutingChanges(
        its, default, torch.zeros(len(its), 4), tuple(0.0 for _ in its), tuple(0.0 for _ in its), tuple(acc), stats
    )


def test_the_routing_changes_table_and_the_tally():
    from capsule_lib.critique import change_headers, change_rows
    from capsule_lib.critique_verdicts import tally

    ch = _changes([0.2, 0.5, 0.9, 0.95], [1.0, 0.8, 0.5, 0.4])
    (row,) = change_rows({"em": ch})
    assert len(row) == len(change_headers("MNIST")) and row[:5] == ["EM", 3, "20.00 %", "90.00 %", "95.00 %"]
    assert row[-1] == "1.00 → 0.50 → 0.40"
    rows = [["a", "", "", "uniform: holds; random: not tested (did not train)"], ["b", "", "", "holds"]]
    assert (
        tally(rows)
        == "2 rows, 3 verdicts (a row against both baselines counts twice): holds 2, not tested (did not train) 1"
    )


def test_iteration_verdicts_compare_the_own_t_with_one_pass_and_call_polarised_below_the_threshold():
    from capsule_lib.critique_verdicts import POLARISED_ENTROPY, iteration_verdicts

    same = _changes([0.9, 0.9, 0.9, 0.9], [1.0, 0.8, POLARISED_ENTROPY, 0.4])
    better = _changes([0.2, 0.5, 0.9, 0.9], [1.0, 0.99, 0.98, 0.97])
    rows = iteration_verdicts({"dynamic": same, "em": better}, 10_000)
    assert [r[3] for r in rows] == ["holds", "holds", "does not hold", "does not hold"]
    assert [r[3] for r in iteration_verdicts({"em": better}, 10_000, untrained=["em"])] == [NOT_TESTED] * 2
    assert rows[2][2].endswith("accuracy 20.00 -> 90.00% (higher)")
    with pytest.raises(ValueError, match="needs labels"):
        iteration_verdicts({"em": RoutingChanges(*[*vars(better).values()][:5], None, better.stats)}, 10)


def test_routing_free_and_tree_verdicts():
    from capsule_lib.critique_verdicts import STARVED_SHARE, routing_free_verdicts, tree_verdicts

    mnist = {
        "dynamic_routed": {"test_acc": _m(0.97), "affine_acc": _m(0.60)},
        "dynamic_uniform": {"test_acc": _m(0.97), "affine_acc": _m(0.65)},
        "em_routed": {"test_acc": _m(0.98), "affine_acc": _m(0.5)},
        "shared_transform": {"test_acc": _m(0.7), "affine_acc": _m(0.4)},  # not Gu & Tresp's: shown, not judged
        "aff_capsnet": {"test_acc": _m(0.9), "affine_acc": _m(0.4)},
        "hvc": {"test_acc": _m(0.98), "affine_acc": _m(0.6)},
    }
    rows = routing_free_verdicts(mnist)
    assert [r[3] for r in rows] == ["holds", "does not hold", "holds"]
    assert "best routed (EM)" in rows[2][2] and "Aff-CapsNets' layer 40.00" in rows[1][2]
    # a network that did not learn is never judged: not the Aff-CapsNets row, not the best routed network
    mnist["aff_capsnet"] = {m: measured([0.12, 0.12], 10**9, learned=False) for m in ("test_acc", "affine_acc")}
    mnist["em_routed"] = {m: measured([0.12, 0.12], 10**9, learned=False) for m in ("test_acc", "affine_acc")}
    mnist["aff_capsnet_e3"] = {"test_acc": _m(0.95), "affine_acc": _m(0.7)}  # a lengthened budget for both
    mnist["dynamic_routed_e3"] = {"test_acc": _m(0.98), "affine_acc": _m(0.65)}
    rows = routing_free_verdicts(mnist)
    assert rows[1][3] == NOT_TESTED and rows[2][3] == "holds" and "best routed (dynamic)" in rows[3][2]
    assert rows[2][0].endswith("(3 epochs, both)") and "Aff-CapsNets' layer 70.00" in rows[2][2]

    def layer(depth, variation, alive):
        return LayerRouting(f"l{depth}", depth, 3, 8, CouplingStats(0.3, 0.7, variation, alive))

    layers = {
        "deep": [layer(1, 0.05, 1.0), layer(2, 0.05, 1 - STARVED_SHARE), layer(3, 0.05, 1.0)],
        "lively": [layer(1, 0.5, 1.0), layer(2, 0.05, 0.9)],
    }
    grads = {"deep": {"a": 1e-4, "b": 1e-3, "c": 1e-2}, "lively": {"a": 1e-2, "b": 1e-3}}
    rows = tree_verdicts(layers, grads)
    assert [r[3] for r in rows] == ["holds", "holds", "holds", "does not hold", "does not hold", "does not hold"]
    assert rows[1][2] == "parents never active, by intermediate layer: 0%, 25%"
