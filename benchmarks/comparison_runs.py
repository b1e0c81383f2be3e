"""Train the comparison chapter's contestants on one dataset (:func:`capsule_lib.comparison.contestant_recipe`) and
export each as its shipped checkpoint ``compare_<dataset>_<contestant>`` (fp16, registry entry:
:func:`capsule_lib.train.shipped.export_run`).

Every run: one torch thread, the dataset's protocol (:data:`capsule_lib.comparison.BUDGET_MINUTES`: a wall-clock
budget on MNIST, so those runs must run one at a time on an otherwise idle machine; on the viewpoint protocol equal
epochs, the recipe's 15, so two workers may share the queue). Each worker claims a run by creating
``runs/compare/<name>.claim``; a run whose ``best.pt`` and history exist is not trained again.

    python benchmarks/comparison_runs.py norb --data-root $CAPSULE_DATA            # one worker (two on two cores)
    python benchmarks/comparison_runs.py norb --data-root $CAPSULE_DATA --export   # then export every finished run
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from capsule_lib.comparison import BUDGET_MINUTES, CONTESTANTS, contestant_recipe, shipped_name
from capsule_lib.cost import machine_info
from capsule_lib.data import DataSource
from capsule_lib.train import train
from capsule_lib.train.shipped import export_run

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "runs" / "compare"


def _source(dataset: str, data_root: str | None) -> DataSource:
    """MNIST from the data root; the viewpoint protocol's smallNORB, missing from the book's data, as its generated
    stand-in without a download attempt."""
    return DataSource.of(data_root, offline=True, standin=True) if dataset == "norb" else DataSource.of(data_root)


def worker(dataset: str, data_root: str | None) -> None:
    torch.set_num_threads(1)
    BASE.mkdir(parents=True, exist_ok=True)
    for name in CONTESTANTS:
        out = BASE / shipped_name(name, dataset)
        if (out / "best.pt").exists() and (out / "history.json").exists():
            continue
        try:
            os.mkdir(BASE / f"{out.name}.claim")
        except FileExistsError:
            continue
        recipe = contestant_recipe(name, dataset)  # on "norb": smallNORB, or its generated stand-in where it is missing
        budget = BUDGET_MINUTES[dataset]
        train(recipe, out_dir=out, data_root=_source(dataset, data_root), budget_minutes=budget, progress=False)
        print(f"{out.name}: trained", flush=True)


def export(dataset: str, data_root: str | None) -> None:
    torch.set_num_threads(1)
    cpu = machine_info("cpu")["device_name"]
    budget = BUDGET_MINUTES[dataset]
    for name in CONTESTANTS:
        out = BASE / shipped_name(name, dataset)
        what = (
            f"the common wall-clock budget of {budget:g} minutes (training and validation)"
            if budget
            else "its recipe's 15 epochs (the viewpoint protocol compares at equal epochs)"
        )
        notes = (
            f"The comparison chapter's controlled run on {dataset}: {contestant_recipe(name, dataset).name}"
            f"{'' if name == 'cnn' else f' with model.routing={name}'}, seed 0, fp32, {what}, with the protocol's "
            f"learning-rate warm-up over the first epoch where it has one (capsule_lib.comparison.PROTOCOL); one "
            f"thread on a 2-core {cpu}, two runs at a time, the machine shared with other work. Selected on validation."
        )
        entry = export_run(out, shipped_name(name, dataset), data_root=_source(dataset, data_root), notes=notes)
        print(f"{shipped_name(name, dataset)}: {entry['metrics']}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", choices=sorted(BUDGET_MINUTES))
    ap.add_argument("--data-root", default=os.environ.get("CAPSULE_DATA"))
    ap.add_argument("--export", action="store_true", help="export every finished run (fp16, registry entry)")
    a = ap.parse_args()
    export(a.dataset, a.data_root) if a.export else worker(a.dataset, a.data_root)
