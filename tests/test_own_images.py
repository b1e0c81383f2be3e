"""The own-images page's tables (capsule_lib.own_images) and the matrix benchmark's goals
(benchmarks/own_images_matrix.py): what each network becomes at other sides, the runs and the misses."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from capsule_lib.own_images import (
    CELL_HEADERS,
    COST_HEADERS,
    FITTED_HEADERS,
    MATRIX_HEADERS,
    fitted_network_rows,
    matrix_cells,
    matrix_cost_rows,
    matrix_misses,
    matrix_rows,
)
from capsule_lib.train import make_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]


def _benchmark():
    spec = importlib.util.spec_from_file_location("own_images_matrix", REPO / "benchmarks" / "own_images_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_fitted_rows_say_the_stem_and_keep_the_papers_primary_capsules():
    rows = fitted_network_rows({"CapsNet": "capsnet", "CNN": "baseline_cnn"}, (28, 224), channels=3, classes=4)
    assert len(rows) == 4 and all(len(r) == len(FITTED_HEADERS) for r in rows)
    capsnet28, capsnet224, cnn28, _ = rows
    assert capsnet28[3] == capsnet224[3] == "1,152" and cnn28[3] == "—"
    assert capsnet28[4].startswith("none") and capsnet224[4] == "224 px -> 3 stride-2 convs (32 channels) -> 28 px"
    recipe = make_recipe("capsnet")
    fitted_network_rows({"given": recipe}, (96,))
    assert recipe.model.image_size == 28 and recipe.model.stem_side is None  # a recipe passed in is not changed


def _run(cell, family, val, learned, chance=0.25, **more):
    return {
        "cell": cell,
        "family": family,
        "val_acc": val,
        "test_acc": val,
        "chance": chance,
        "learned": learned,
        "symptoms": [] if learned else ["at chance"],
        "epochs": 2.5,
        "seconds_per_epoch": 40.0,
        "parameters": 1_000_000,
        "primary_capsules": 1152,
        "peak_rss_mb": 900,
        **more,
    }


def test_the_goal_is_halfway_from_chance_to_a_cnn_that_learned_and_the_misses_say_why():
    runs = [
        _run("a", "CNN", 0.85, True),
        _run("a", "CapsNet", 0.60, True),  # halfway: 0.55
        _run("a", "EM", 0.50, True),
        _run("b", "CNN", 0.26, False),  # the CNN did not learn: no goal in b
        _run("b", "CapsNet", 0.25, False),
    ]
    rows = _benchmark().goals(runs)
    assert [r.get("goal") for r in rows] == [None, True, False, None, None]
    assert rows[1]["within_5_points"] is False
    cells = [{"name": c, "source": "cifar10", "side": 64, "channels": 3, "classes": 4, "per_class": 200} for c in "ab"]
    result = {"cells": cells, "runs": rows, "budget_minutes": 2.0}
    table = matrix_rows(result)
    assert all(len(r) == len(MATRIX_HEADERS) for r in table)
    assert [r[-1] for r in table] == ["—", "yes", "**no**", "—", "—"]
    assert table[4][-2] == "did not learn: at chance" and table[0][:2] == ["a", "CNN"]
    assert matrix_cells(result)[0] == ["a", "64 px", "RGB", "4", "200", "CIFAR-10 photographs"]
    costs = matrix_cost_rows({**result, "runs": [{**rows[0], "peak_rss_mb": None, "step_memory_gib": 0.4}]})
    assert costs == [["a", "CNN", "1.00M", "1,152", "40", "≈ 0.4 GiB (estimated)"]]
    assert len(CELL_HEADERS) == len(COST_HEADERS) == 6
    misses = matrix_misses(result)
    assert len(misses) == 2 and misses[0].startswith("b: the CNN did not learn either")
    assert misses[1].startswith("a, EM: validation 50.0") and "CNN's 85.0" in misses[1] and "2 min" in misses[1]
