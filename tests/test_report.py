"""capsule_lib.report: numbers and tables for the rendered pages, as golden strings."""

import math

import pytest

from capsule_lib.report import markdown_table, pct, show_table


@pytest.mark.parametrize(
    "x, digits, expected",
    [
        (0.99612, 2, "99.61 %"),
        (0.5, 2, "50.00 %"),
        (1.0, 2, "100.00 %"),
        (0.0, 2, "0.00 %"),
        (0.123456, 0, "12 %"),
        (0.123456, 3, "12.346 %"),
        (-0.0123, 1, "-1.2 %"),
        (1.5, 1, "150.0 %"),
        (0.99995, 2, "100.00 %"),  # rounds, does not truncate
    ],
)
def test_pct_golden(x, digits, expected):
    assert pct(x, digits) == expected


def test_pct_missing_and_nan():
    assert pct(None) == "—" and pct(None, 5) == "—"
    assert pct(math.nan) == "nan %"  # a NaN is a value, not a missing one
    assert pct(0) == "0.00 %"  # zero is not missing


def test_markdown_table_golden():
    table = markdown_table(["model", "acc", "params"], [["CapsNet", pct(0.9961), 6_800_000], ["CNN", 0.9925, None]])
    assert table == (
        "| model | acc | params |\n|---|---|---|\n| CapsNet | 99.61 % | 6800000 |\n| CNN | 0.9925 | None |"
    )


def test_markdown_table_escapes_pipes_and_newlines():
    table = markdown_table(["a|b", "c"], [("x | y", "line 1\nline 2")])
    assert table.splitlines() == ["| a\\|b | c |", "|---|---|", "| x \\| y | line 1 line 2 |"]
    assert len(table.splitlines()) == 3  # a newline in a cell never splits the row


def test_markdown_table_edge_cases():
    assert markdown_table(["only"], []) == "| only |\n|---|"  # header and separator, no rows
    # rows are not padded or cut: GFM renders short rows with empty cells and ignores extra ones
    assert markdown_table(["a", "b"], [[""], [1, 2, 3]]) == "| a | b |\n|---|---|\n|  |\n| 1 | 2 | 3 |"
    rows = (r for r in [[1.5, True]])  # any iterable of rows
    assert markdown_table(("x", "y"), list(rows)).endswith("| 1.5 | True |")


def test_show_table_returns_markdown():
    from IPython.display import Markdown

    md = show_table(["k", "v"], [["acc", pct(0.5)]])
    assert isinstance(md, Markdown)
    assert md.data == "| k | v |\n|---|---|\n| acc | 50.00 % |"
    assert md._repr_markdown_() == md.data


def test_budget_rows_are_the_registry_records():
    """The chapters' "what each budget bought" tables (#36): every number is the registry's."""
    from capsule_lib.pretrained import registry
    from capsule_lib.report import BUDGET_HEADERS, budget_rows, duration, pct

    names = ["capsnet_mnist_gpu", "capsnet_mnist", "efficient_capsnet_mnist_gpu", "efficient_capsnet_mnist"]
    rows = budget_rows(names)
    assert len(BUDGET_HEADERS) == len(rows[0]) and [r[0] for r in rows] == [f"`{n}`" for n in names]
    for name, row in zip(names, rows):
        e = registry()[name]
        t, m = e["training"], e["metrics"]
        assert row[1] == t["hardware"] and row[3] == duration(t["wall_time_s"])
        assert row[2].endswith(f"({m['selected_epoch']})") and float(row[2].split()[0]) == round(t["epochs"], 2)
        nb = "\u00a0"  # no line break inside a number and its unit
        assert row[4] == pct(m["val_acc"]).replace(" ", nb) and row[5] == pct(m["test_acc"]).replace(" ", nb)
    assert rows[0][1] == "NVIDIA H200" and rows[0][5] == "99.62\u00a0%" and rows[2][5] == "99.54\u00a0%"
    assert duration(324.2) == "5.4\u00a0min" and duration(15840) == "4.4\u00a0h"


def test_metrics_summary_golden():
    from capsule_lib.report import metrics_summary

    assert metrics_summary({"test_acc": 0.9934}) == "99.34\u00a0%"
    assert metrics_summary({"test_familiar_acc": 0.906, "test_novel_acc": 0.7822}) == (
        "familiar 90.60\u00a0%, novel 78.22\u00a0%"
    )
    assert metrics_summary({"test_exact_acc": 0.858, "test_acc": 0.8575}) == (
        "85.80\u00a0% (bit-exact test images), 85.75\u00a0% (all)"
    )


def test_train_cost_is_the_shipped_runs_time_per_epoch_times_epochs():
    from capsule_lib.pretrained import load_pretrained_history
    from capsule_lib.report import duration, train_cost

    def per_epoch(name):
        r = load_pretrained_history(name).records[-1]
        return r["wall_time"] / r["epoch"]

    cpu = 15 * (per_epoch("em_norb_seed0") + per_epoch("baseline_cnn_norb_seed0"))
    assert train_cost(15, cpu=["em_norb_seed0", "baseline_cnn_norb_seed0"]) == (
        f"≈ {duration(cpu)} on a CPU, GPU not measured (15 epochs, from the shipped runs)".replace("\u00a0", " ")
    )
    gpu = train_cost(15, cpu=["capsnet_mnist"], gpu=["capsnet_mnist_gpu"])
    assert gpu.endswith(
        f"≈ {duration(15 * per_epoch('capsnet_mnist_gpu'))} on an NVIDIA H200 (15 epochs, from the "
        "shipped runs)".replace("\u00a0", " ")
    )
    # the comparison's runs: a wall-clock budget on MNIST, the recipe's epochs on the viewpoint protocol
    minutes = load_pretrained_history("compare_mnist_cnn").meta["budget_minutes"]
    own = load_pretrained_history("compare_norb_cnn").records[-1]["wall_time"]
    assert train_cost(30, budget=["compare_mnist_cnn", "compare_norb_cnn"]) == (
        f"≈ {duration(60 * minutes)} on any hardware (1 runs, each stops at its time budget) + "
        f"≈ {duration(own)} on a CPU (1 runs of their recipes' epochs)"
    ).replace("\u00a0", " ")


def test_history_rows_golden():
    from capsule_lib.report import HISTORY_HEADERS, history_rows
    from capsule_lib.train import History

    h = History(meta={"hardware": "x86_64 CPU, 2 threads"})
    h.append({"epoch": 1, "val_acc": 0.8, "wall_time": 600.0})
    h.append({"epoch": 2, "val_acc": 0.9, "wall_time": 1200.0})
    h.append({"epoch": 3, "val_acc": 0.85, "wall_time": 1800.0})
    (row,) = history_rows({"run_a": h})
    assert len(row) == len(HISTORY_HEADERS)
    assert row == ["`run_a`", "3 (2)", "90.00\u00a0%", "30.0\u00a0min (10.0\u00a0min/epoch)", "x86_64 CPU, 2 threads"]
    import torch

    (with_params,) = history_rows({"run_a": h}, {"run_a": torch.nn.Linear(3, 2)})
    assert with_params[1] == "8" and with_params[2:] == row[1:]


def test_pct_cell_and_epochs_text_golden():
    from capsule_lib.report import epochs_text, pct_cell

    assert pct_cell(0.99612) == "99.61\u00a0%" and pct_cell(None) == "—"
    assert [epochs_text(x) for x in (6, 6.0, 32.9906, 1.5)] == ["6", "6", "32.99", "1.5"]
