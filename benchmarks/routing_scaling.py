"""Every routing algorithm alone, on the same shapes: time, memory kept for backward and peak memory of one
forward + backward against the number of input capsules, output capsules and iterations, in fp32 and bf16.

    .venv/bin/python benchmarks/routing_scaling.py --threads 2   # full sweep -> results/routing_scaling_cpu.json
    .venv/bin/python benchmarks/routing_scaling.py --quick       # tiny sweep (seconds), for the tests

The layers are :func:`capsule_lib.cost.routing_layer`'s (fully connected, capsules of size ``d``, votes included);
the rows are :func:`capsule_lib.cost.routing_scaling`'s. The JSON holds the machine and versions
(:func:`capsule_lib.cost.machine_info`), the sweep and one row per measurement; the comparison chapter plots it
with :func:`capsule_lib.viz.heinsen.plot_routing_scaling`.
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

from capsule_lib.cost import machine_info, routing_scaling  # noqa: E402
from capsule_lib.routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS  # noqa: E402

FULL = {
    "d": 16,
    "batch": 8,
    "n_inp": [64, 256, 1024, 4096],  # at n_out = 16
    "n_out": [4, 16, 64],  # at n_inp = 1024
    "iterations": [1, 2, 3, 4, 5],  # at (1024, 16)
    "amp": [None, "bf16"],
    "repeats": 3,
}
QUICK = {"d": 16, "batch": 2, "n_inp": [16, 64], "n_out": [4, 8], "iterations": [1, 2], "amp": [None], "repeats": 1}


def sweep(spec: dict, kinds: list[str], peak: bool = True) -> list[dict]:
    """The rows of one sweep: sizes at each kind's default iterations, then iterations at the middle size."""
    n_fix, j_fix = spec["n_inp"][len(spec["n_inp"]) // 2], spec["n_out"][len(spec["n_out"]) // 2]
    sizes = [(n, j_fix) for n in spec["n_inp"]] + [(n_fix, j) for j in spec["n_out"] if j != j_fix]
    common = dict(d=spec["d"], batch=spec["batch"], repeats=spec["repeats"], peak=peak)
    rows = []
    for amp in spec["amp"]:
        rows += [dict(r, sweep="size") for r in routing_scaling(sizes, kinds, amp=amp, **common)]
        iterating = [k for k in kinds if DEFAULT_ITERATIONS[k] is not None]
        for t in spec["iterations"]:
            rows += [
                dict(r, sweep="iterations")
                for r in routing_scaling([(n_fix, j_fix)], iterating, iterations=t, amp=amp, **common)
            ]
    return rows


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sweep (seconds)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--kinds", default=",".join(ROUTING_KINDS), help="comma-separated routing kinds")
    p.add_argument("--no-peak", action="store_true", help="skip the (profiler-based) peak memory")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    kinds = [k for k in a.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(ROUTING_KINDS))
    if unknown:
        p.error(f"unknown routing kind(s) {unknown}; kinds: {', '.join(ROUTING_KINDS)}")
    spec = QUICK if a.quick else FULL
    t0 = time.perf_counter()
    rows = sweep(spec, kinds, peak=not a.no_peak)
    out = Path(a.out) if a.out else HERE / "results" / f"routing_scaling_cpu{'_quick' if a.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "what": "one fully connected routing layer, forward + backward (votes included), median of repeats",
        "machine": machine_info("cpu"),
        "spec": spec,
        "kinds": {k: ROUTING_KINDS[k].description for k in kinds},
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"{len(rows)} rows in {result['seconds']} s -> {out}")
    return out


if __name__ == "__main__":
    main()
