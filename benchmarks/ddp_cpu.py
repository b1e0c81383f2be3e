"""One recipe for a fixed number of steps on 1 process and on 2 processes (``torchrun``, gloo), on this CPU:
throughput and the per-epoch loss curve of each, for the "Training at scale" section of the appendix.

    .venv/bin/python benchmarks/ddp_cpu.py --out benchmarks/results/ddp_cpu.json

Both runs use the same global batch and data order (:mod:`capsule_lib.distributed`), the generated stand-in
data (``CAPSULE_OFFLINE=1``) and the same total number of threads (1 process x ``--threads``, or 2 processes x
``--threads / 2``), so the comparison is of the job split, not of extra cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RECIPE = "capsnet"  # no batch norm: one and two processes compute the same function of the same global batch
SETTINGS = {"epochs": 2, "train_subset": 1024, "eval_subset": 512, "batch_size": 128, "device": "cpu", "max_shift": 0}

JOB = """
import json, sys, time, torch
from capsule_lib.train import train
torch.set_num_threads(int(sys.argv[3]))
t0 = time.time()
_, trainer = train(sys.argv[1], **json.loads(sys.argv[2]), out_dir=sys.argv[4], offline=True, progress=False,
                   test=False)
if trainer.dist.is_main:
    json.dump({"wall_s": time.time() - t0, "records": trainer.history.records}, open(sys.argv[4] + "/job.json", "w"))
"""


def run(n_proc: int, threads: int, tmp: Path) -> dict:
    out = tmp / f"p{n_proc}"
    script = tmp / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "CAPSULE_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    args = [str(script), RECIPE, json.dumps(SETTINGS), str(threads), str(out)]
    cmd = (
        [sys.executable, *args]
        if n_proc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n_proc}", *args]
    )
    subprocess.run(cmd, env=env, check=True)
    job = json.loads((out / "job.json").read_text())
    steps = SETTINGS["train_subset"] // SETTINGS["batch_size"] * SETTINGS["epochs"]
    train_s = sum(r["epoch_time"] for r in job["records"])
    return {
        "processes": n_proc,
        "threads_per_process": threads,
        "steps": steps,
        "train_s": train_s,
        "images_per_s": steps * SETTINGS["batch_size"] / train_s,
        "train_loss": [r["train_loss"] for r in job["records"]],
        "val_acc": [r["val_acc"] for r in job["records"]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="total threads (split over the processes)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ddp_cpu.json"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        one = run(1, a.threads, Path(d))
        two = run(2, max(a.threads // 2, 1), Path(d))
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    result = {
        "recipe": RECIPE,
        "settings": SETTINGS,
        "machine": {"cpu": cpu, "cores": os.cpu_count()},
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "runs": [one, two],
        "max_train_loss_difference": max(abs(x - y) for x, y in zip(one["train_loss"], two["train_loss"])),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
