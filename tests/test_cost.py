"""capsule_lib.cost: every routing algorithm measured the same way (the comparison chapter's isolated routing)."""

import pytest
import torch

from capsule_lib.cost import loglog_slope, routing_layer, routing_scaling
from capsule_lib.routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS


@pytest.mark.parametrize("kind", sorted(ROUTING_KINDS))
def test_every_kind_builds_runs_and_backpropagates(kind):
    m, loss = routing_layer(kind, n_inp=12, n_out=5, d=16, batch=3)
    value = loss()
    assert value.ndim == 0 and torch.isfinite(value)
    value.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{kind}: {name}"


def test_rows_carry_iterations_and_precision_and_memory_grows_with_both():
    kinds = [k for k in ROUTING_KINDS if DEFAULT_ITERATIONS[k] is not None]
    one = routing_scaling([(64, 8)], kinds, batch=2, time_it=False, iterations=1)
    three = routing_scaling([(64, 8)], kinds, batch=2, time_it=False, iterations=3)
    for a, b in zip(one, three):
        assert (a["iterations"], b["iterations"]) == (1, 3)
        assert b["saved_mib"] > a["saved_mib"], a["kind"]  # every iteration keeps tensors for the backward
    sa = routing_scaling([(64, 8)], ("self_attention",), time_it=False, iterations=3)[0]
    assert sa["iterations"] is None  # no iterations to set: the argument does not apply
    bf = routing_scaling([(64, 8)], ("dynamic",), batch=2, time_it=True, repeats=1, amp="bf16")[0]
    fp = routing_scaling([(64, 8)], ("dynamic",), batch=2, time_it=False)[0]
    assert bf["amp"] == "bf16" and fp["amp"] is None and bf["ms"] > 0
    assert bf["saved_mib"] < fp["saved_mib"]  # the votes are kept in bfloat16


@pytest.mark.parametrize("kind", ["em", "inverted", "self_attention"])
def test_memory_is_linear_in_the_number_of_input_capsules(kind):
    rows = routing_scaling([(64, 8), (256, 8), (1024, 8)], (kind,), batch=2, time_it=False)
    assert 0.85 < loglog_slope([r["n_inp"] for r in rows], [r["saved_mib"] for r in rows]) < 1.15


def test_bad_arguments_fail_in_one_line():
    with pytest.raises(ValueError, match=r"^em routes matrix capsules: d must be a square"):
        routing_layer("em", 4, 4, d=8)
    with pytest.raises(ValueError, match=r"^self_attention routing has no iterations"):
        routing_layer("self_attention", 4, 4, d=8, iterations=2)
    with pytest.raises(ValueError, match=r"^amp must be None or 'bf16'"):
        routing_scaling([(4, 4)], ("dynamic",), amp="fp16")


def test_peak_memory_counts_what_a_step_allocates_and_machine_info():
    from capsule_lib.cost import machine_info, peak_memory

    keep = torch.zeros(1000)  # existed before the step: not counted

    def step():
        a = torch.ones(256, 1024)  # 1 MiB
        b = a * 2  # another 1 MiB while a is alive
        return float((b + keep[:1]).sum())

    peak = peak_memory(step)
    assert 2 * 2**20 <= peak < 4 * 2**20
    rows = routing_scaling([(64, 8)], ("dynamic",), batch=2, time_it=False, peak=True)
    assert rows[0]["peak_mib"] >= rows[0]["saved_mib"] > 0  # saved tensors are part of the peak
    info = machine_info()
    assert info["device"] == "cpu" and info["torch"] == torch.__version__ and info["torch_threads"] >= 1
    assert info["device_name"] and info["date"][:2] == "20"


def test_model_costs_measure_without_changing_the_model():
    from capsule_lib.cost import model_costs
    from capsule_lib.losses import ScoreObjective
    from capsule_lib.models import RoutingClassifier, RoutingClassifierConfig

    torch.manual_seed(0)
    m = RoutingClassifier(RoutingClassifierConfig(routing="inverted", stem_channels=(4, 8), primary_types=2))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    images = torch.randint(0, 256, (12, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (12,))
    c = model_costs(m, ScoreObjective(), images, labels, train_batch=8, latency_batches=(1, 4), repeats=1)
    assert c["params"] == sum(p.numel() for p in m.parameters())
    assert c["train_img_per_s"] > 0 and c["latency_ms_b1"] > 0 and c["latency_ms_b4"] > 0 and c["peak_train_mib"] > 0
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match=r"^model_costs: a batch of 64 needs 64 images, got 12"):
        model_costs(m, ScoreObjective(), images, labels, train_batch=8, latency_batches=(64,), repeats=1, peak=False)


@pytest.mark.usefixtures("readable_figures")  # readable at the book's size (conftest.py)
def test_pareto_front_and_comparison_figures():
    import matplotlib

    matplotlib.use("Agg")
    from capsule_lib.viz.compare import pareto_front, plot_pareto, plot_robustness

    rows = [
        {"model": "a", "accuracy": 0.99, "params": 1000, "train_img_per_s": 10, "shifted": 0.8},
        {"model": "b", "accuracy": 0.98, "params": 100, "train_img_per_s": 50, "shifted": 0.9},
        {"model": "c", "accuracy": 0.97, "params": 500, "train_img_per_s": 5, "shifted": 0.7},  # beaten by b
        {"model": "d", "accuracy": 0.90, "params": 50, "train_img_per_s": 60, "shifted": 0.85},
    ]
    assert pareto_front(rows, "params") == ["d", "b", "a"]
    assert pareto_front(rows, "train_img_per_s", lower_x=False) == ["a", "b", "d"]
    fig = plot_pareto(rows)
    assert len(fig.axes) == 2 and all(ax.get_xscale() == "log" for ax in fig.axes)
    fig = plot_robustness(rows, "accuracy", "shifted")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b", "c", "d"]


def test_count_parameters():
    from capsule_lib.cost import count_parameters

    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # 16 + 10
    assert count_parameters(m) == 26
    m[0].weight.requires_grad_(False)
    assert count_parameters(m) == 26 and count_parameters(m, trainable_only=True) == 14


def test_scaling_summary_reads_the_size_sweep():
    from capsule_lib.cost import scaling_summary

    rows = [
        {"sweep": "size", "kind": "k", "amp": amp, "n_inp": n, "n_out": 16, "ms": n / 64 * f, "peak_mib": n * n * f}
        for n in (64, 256, 1024)
        for amp, f in ((None, 1.0), ("bf16", 0.5))
    ] + [{"sweep": "iterations", "kind": "k", "amp": None, "n_inp": 1024, "n_out": 16, "ms": 1e9, "peak_mib": 1e9}]
    s = scaling_summary(rows, n_inp=1024, n_out=16)["k"]
    assert (s["ms"], s["bf16_ms"], s["peak_mib"], s["bf16_peak_mib"]) == (16.0, 8.0, 1024.0**2, 0.5 * 1024**2)
    assert s["ms_slope"] == pytest.approx(1.0) and s["peak_mib_slope"] == pytest.approx(2.0)
