"""The speedrun on a CPU: does bf16 autocast pay on this CPU, and what does a speedrun recipe reach in a fixed CPU
budget next to the shipped CPU run of the paper recipe (the same network, the same machine type)?

    python benchmarks/speedrun_cpu.py --minutes 30 --threads 2          # writes benchmarks/results/speedrun_cpu.json
    python benchmarks/speedrun_cpu.py --quick                           # seconds: a check of the script

1. **steps**: the median time of one training step (forward, loss, backward, Adam) of each MNIST speedrun recipe at
   its batch size, in float32 and under bf16 autocast (``capsule_lib.cost.time_training_step``), with the CPU's
   flags that decide it (``avx512_bf16``, ``amx_bf16``).
2. **run**: ``capsnet_speedrun`` through the speedrun command on the CPU for ``--minutes`` (eager; autocast only where
   step 1 measured it faster), then the shipped CPU run of the paper recipe (``capsnet_mnist``: its history) read at
   the same training wall time: its validation accuracy then, and when it first reached each threshold.

A benchmark, not a test: the numbers depend on the machine (time it alone: another busy process slows a step
tenfold on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from capsule_lib.cost import machine_info, time_training_step  # noqa: E402
from capsule_lib.pretrained import load_pretrained_history, registry  # noqa: E402
from capsule_lib.train import make_recipe  # noqa: E402
from capsule_lib.train.timed import run_speedrun  # noqa: E402

RECIPES = ("capsnet_speedrun", "efficient_speedrun")
#: the shipped CPU run of the paper recipe each speedrun is read against
SHIPPED_CPU = {"capsnet_speedrun": "capsnet_mnist"}


def cpu_flags() -> dict[str, bool]:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return {f: f in flags.split() for f in ("avx512_bf16", "amx_bf16", "avx512f")}


def step_times(batch_size: int | None, repeats: int) -> dict[str, dict[str, float]]:
    """name -> {"fp32": s, "bf16": s}: one training step at the recipe's batch (random images of its shape)."""
    out = {}
    for name in RECIPES:
        r = make_recipe(name)
        torch.manual_seed(0)
        model = r.build_model()
        b = batch_size or r.batch_size
        c = model.input_contract
        batch = (torch.rand(b, c.channels, c.size, c.size), torch.randint(10, (b,)))
        objective = r.build_objective()
        fp32 = time_training_step(model, objective, batch, repeats=repeats)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = time_training_step(model, objective, batch, repeats=repeats)
        out[name] = {
            "batch": b,
            "fp32_s": round(fp32, 4),
            "bf16_s": round(bf16, 4),
            "bf16_speedup": round(fp32 / bf16, 3),
        }
        print(f"{name}: batch {b}: fp32 {fp32 * 1000:.0f} ms, bf16 autocast {bf16 * 1000:.0f} ms per step", flush=True)
    return out


def against_shipped(run: dict, shipped: str, thresholds: tuple[float, ...]) -> dict:
    """The shipped CPU run read at the speedrun's training wall time: its last record by then, and when it first
    reached each threshold."""
    hist = load_pretrained_history(shipped)
    by_then = [r for r in hist.records if r["wall_time"] <= run["train_wall_s"]]
    best = max(by_then, key=lambda r: r["val_acc"]) if by_then else None
    return {
        "checkpoint": shipped,
        "hardware": hist.meta.get("hardware"),
        "recipe": hist.meta.get("recipe"),
        "best_val_acc_by_then": best["val_acc"] if best else None,
        "epochs_by_then": by_then[-1]["epoch"] if by_then else 0,
        "time_to_val": hist.time_to(thresholds),
        "whole_run": {
            "wall_time_s": hist.records[-1]["wall_time"],
            "best_val_acc": hist.best("val_acc")["val_acc"],
            "test_acc": registry()[shipped]["metrics"]["test_acc"],  # of the shipped (fp16) weights
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="the CPU speedrun's whole time (capsnet_speedrun)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="batch 8, one repeat, the speedrun command's --quick")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "speedrun_cpu.json"))
    p.add_argument("--work", default="runs/speedrun_cpu", help="the speedrun's output folder")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    result = {"machine": machine_info("cpu"), "cpu_flags": cpu_flags(), "threads": a.threads}
    result["steps"] = step_times(8 if a.quick else None, 1 if a.quick else a.repeats)
    bf16 = result["steps"]["capsnet_speedrun"]["bf16_speedup"] > 1.0
    overrides = {"compile": None, "amp": "bf16" if bf16 else None}
    sr = run_speedrun(
        ["capsnet_speedrun"],
        a.minutes,
        a.work,
        device="cpu",
        quick=a.quick,
        overrides=overrides,
        offline=a.quick,
        tag="cpu",
    )
    result["speedrun"] = sr
    run = sr["runs"][0]
    if "metrics" in run and not a.quick:
        result["against_shipped_cpu_run"] = against_shipped(
            run, SHIPPED_CPU["capsnet_speedrun"], make_recipe("capsnet_speedrun").thresholds
        )
    result["wall_s"] = round(time.time() - t0, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {a.out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
