"""Why did a network of the comparison or the critique not learn? Each diagnosis trains the network's first few
hundred steps (:func:`capsule_lib.learning.first_steps`: the run's own seed, data, optimiser and schedule, one CPU
thread) before and after a fix, or with each usual remedy, and records the loss, the probe accuracy, the input
activations, the capsule lengths and the RMS gradient by layer as it goes, in
``benchmarks/results/learning_<diagnosis>.json`` (the chapters read them).

    python benchmarks/learning_diagnostics.py heinsen_norb --data-root $CAPSULE_DATA   # Heinsen 2019, viewpoints
    python benchmarks/learning_diagnostics.py heinsen_norb_fixed --data-root $CAPSULE_DATA   # the same, fixed couplings
    python benchmarks/learning_diagnostics.py dynamic_norb --data-root $CAPSULE_DATA   # dynamic routing, seeds 0, 1
    python benchmarks/learning_diagnostics.py depth --data-root $CAPSULE_DATA          # 3 dynamic-routing layers
    python benchmarks/learning_diagnostics.py shared --data-root $CAPSULE_DATA         # shared transforms, no routing
    python benchmarks/learning_diagnostics.py em_fixed --data-root $CAPSULE_DATA       # EM, uniform couplings

``--quick`` runs every variant for a few steps on a slice of the data (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from capsule_lib.comparison import contestant_recipe
from capsule_lib.cost import machine_info
from capsule_lib.learning import first_steps

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: the critique's MNIST budget (one epoch over 30,000 training images) and its viewpoint protocol
MNIST = {"train_subset": 30_000, "epochs": 1}
NORB = {"dataset": "rendered_norb", "epochs": 3}


def _hidden_init(std: str, bias: float):
    """An ablation: re-initialise the hidden routing layers (weights N(0, std^2): ``"fan_in"`` = sqrt(2 / (n_inp
    d_inp)), else a number) and their biases."""

    def setup(model: torch.nn.Module) -> None:
        with torch.no_grad():
            for layer in model.hidden_layers:
                s = math.sqrt(2.0 / (layer.n_inp * layer.d_inp)) if std == "fan_in" else float(std)
                layer.weight.normal_(0.0, s)
                layer.bias.fill_(bias)

    return setup


def _first_pass_temperature(model: torch.nn.Module) -> None:
    """The EM layer's fixed-coupling pass at its first iteration's inverse temperature (the first records')."""
    model.routing.coupled_temperature = "first"


#: diagnosis -> (steps, probe every, {label: (kind, dataset, recipe overrides, setup)})
DIAGNOSES: dict[str, tuple[int, int, dict[str, tuple[str, str, dict[str, Any], Any]]]] = {
    "heinsen_norb": (
        300,
        20,
        {
            "before: Adam at 3e-3 from the first step": ("heinsen_2019", "norb", {**NORB, "warmup_epochs": 0}, None),
            "lr 1e-3, no warm-up": ("heinsen_2019", "norb", {**NORB, "warmup_epochs": 0, "lr": 1e-3}, None),
            "after: warm-up over the first epoch": ("heinsen_2019", "norb", NORB, None),
        },
    ),
    "heinsen_norb_fixed": (
        300,
        20,
        {
            f"{couplings} couplings, seed 0": (
                "heinsen_2019",
                "norb",
                {**NORB, "seed": 0, "model__couplings": couplings},
                None,
            )
            for couplings in ("uniform", "random")
        },
    ),
    "dynamic_norb": (
        300,
        20,
        {
            f"{when}, seed {s}": ("dynamic", "norb", {**NORB, "seed": s, **extra}, None)
            for when, extra in (("before: no warm-up", {"warmup_epochs": 0}), ("after: warm-up", {}))
            for s in (0, 1)
        },
    ),
    "depth": (
        100,
        10,
        {
            "defaults (3 routing layers, hidden 16, 16)": (
                "dynamic",
                "mnist",
                {**MNIST, "model__hidden": (16, 16)},
                None,
            ),
            "warm-up over the epoch": (
                "dynamic",
                "mnist",
                {**MNIST, "model__hidden": (16, 16), "warmup_epochs": 1.0},
                None,
            ),
            "lr 1e-4": ("dynamic", "mnist", {**MNIST, "model__hidden": (16, 16), "lr": 1e-4}, None),
            "hidden 64, 64": ("dynamic", "mnist", {**MNIST, "model__hidden": (64, 64)}, None),
            "fan-in init, bias 0": (
                "dynamic",
                "mnist",
                {**MNIST, "model__hidden": (16, 16)},
                _hidden_init("fan_in", 0.0),
            ),
            "N(0, 1) init, bias 0": (
                "dynamic",
                "mnist",
                {**MNIST, "model__hidden": (16, 16)},
                _hidden_init("1.0", 0.0),
            ),
            "after: votes scaled to the fan-in": (
                "dynamic",
                "mnist",
                {**MNIST, "model__hidden": (16, 16), "model__scaled_votes": True},
                None,
            ),
        },
    ),
    "shared": (
        100,
        10,
        {
            "one transform per type (the first records)": (
                "dynamic",
                "mnist",
                {**MNIST, "model__head": "shared_transform"},
                None,
            ),
            "Aff-CapsNets: one transform per class for all": (
                "dynamic",
                "mnist",
                {**MNIST, "model__head": "aff_capsnet"},
                None,
            ),
            "dynamic routing (for comparison)": ("dynamic", "mnist", MNIST, None),
        },
    ),
    "em_fixed": (
        100,
        10,
        {
            "before: first iteration's inverse temperature": (
                "em",
                "mnist",
                {**MNIST, "model__couplings": "uniform"},
                _first_pass_temperature,
            ),
            "after: last iteration's": ("em", "mnist", {**MNIST, "model__couplings": "uniform"}, None),
            "routed (for comparison)": ("em", "mnist", MNIST, None),
        },
    ),
}


def diagnose(name: str, data_root: str | None, quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    steps, every, variants = DIAGNOSES[name]
    smoke = {"train_subset": 64, "eval_subset": 32} if quick else {}
    steps, every = (4, 2) if quick else (steps, every)
    runs = {}
    for label, (kind, dataset, overrides, setup) in variants.items():
        recipe = contestant_recipe(kind, dataset, **{**overrides, **smoke})
        runs[label] = first_steps(recipe, steps, data_root, every=every, n_probe=32 if quick else 256, setup=setup)
        end = runs[label]["probes"][-1]
        print(
            f"{name}: {label}: probe accuracy {end['val_acc']:.3f} after {steps} steps "
            f"({runs[label]['seconds']:.0f} s)",
            flush=True,
        )
    return {"diagnosis": name, "machine": machine_info("cpu"), "quick": quick, "runs": runs}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("diagnosis", choices=sorted(DIAGNOSES))
    ap.add_argument("--data-root", default=os.environ.get("CAPSULE_DATA"))
    ap.add_argument("--quick", action="store_true", help="a few steps on a slice of the data (not written)")
    a = ap.parse_args()
    result = diagnose(a.diagnosis, a.data_root, a.quick)
    if not a.quick:
        out = RESULTS / f"learning_{a.diagnosis}.json"
        out.write_text(json.dumps(result, indent=1))
        print(f"-> {out.relative_to(ROOT)}")
