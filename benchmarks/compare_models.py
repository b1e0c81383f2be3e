"""What each contestant of the comparison chapter costs on this machine: parameters, training throughput
(images/s of a full training step at batch 128), inference latency at batch 1 and 256, and the peak memory of
one training step, measured the same way for every model (:func:`capsule_lib.comparison.measure_costs`).

    .venv/bin/python benchmarks/compare_models.py --threads 2   # shipped models -> results/compare_models_cpu.json
    .venv/bin/python benchmarks/compare_models.py --quick       # small batches, one repeat (seconds), for tests

The models are the shipped ``compare_<dataset>_<contestant>`` checkpoints where they exist (else freshly
initialised networks of the same configuration: costs do not depend on the weights). The JSON holds the machine
and versions (:func:`capsule_lib.cost.machine_info`), the settings and one row per model; the comparison
chapter reads it next to its own live, shorter measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capsule_lib.comparison import CONTESTANTS, contestant_recipe, measure_costs, shipped_name  # noqa: E402
from capsule_lib.cost import machine_info  # noqa: E402
from capsule_lib.pretrained import load_pretrained, registry  # noqa: E402


def contestant_models(dataset: str, names: list[str]) -> dict[str, tuple[torch.nn.Module, str]]:
    """Each contestant's model and where it came from (the shipped checkpoint, or 'initialised')."""
    reg = registry()
    out = {}
    for name in names:
        ship = shipped_name(name, dataset)
        if ship in reg:
            out[name] = (load_pretrained(ship)[0], ship)
        else:
            out[name] = (contestant_recipe(name, dataset).build_model(), "initialised (no shipped checkpoint)")
    return out


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small batches, one repeat (seconds)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dataset", default="mnist", choices=["mnist", "norb"])
    p.add_argument("--contestants", default=",".join(CONTESTANTS), help="comma-separated contestant names")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    names = [n for n in a.contestants.split(",") if n]
    unknown = sorted(set(names) - set(CONTESTANTS))
    if unknown:
        p.error(f"unknown contestant(s) {unknown}; contestants: {', '.join(CONTESTANTS)}")
    torch.manual_seed(0)
    recipe = contestant_recipe(names[0], a.dataset)
    side, channels = recipe.model.image_size, recipe.model.in_channels
    images = torch.randint(0, 256, (256, channels, side, side), dtype=torch.uint8)
    labels = torch.randint(0, recipe.model.n_classes, (256,))
    models = contestant_models(a.dataset, names)
    t0 = time.perf_counter()
    costs = measure_costs({n: m for n, (m, _) in models.items()}, images, labels, a.dataset, a.quick, a.repeats)
    rows = [{"contestant": n, "source": models[n][1], **costs[n]} for n in names]
    out = (
        Path(a.out) if a.out else HERE / "results" / f"compare_models_{a.dataset}_cpu{'_quick' if a.quick else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "what": "capsule_lib.comparison.measure_costs: training step (forward, loss, backward, Adam) at batch "
        + ("16" if a.quick else "128")
        + ", no-grad forward latency, peak memory of one training step; fp32, eager; medians of repeats",
        "machine": machine_info("cpu"),
        "dataset": a.dataset,
        "input": [channels, side, side],
        "quick": a.quick,
        "repeats": 1 if a.quick else a.repeats,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['contestant']:>15}: {r['params']:>9,} params, {r['train_img_per_s']:8.1f} img/s training, "
            + ", ".join(f"{k} {v:.2f}" for k, v in r.items() if k.startswith("latency"))
            + (f", peak {r['peak_train_mib']:.0f} MiB" if "peak_train_mib" in r else "")
        )
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
