"""Training speed of the shipped models on this machine, fp32 against bf16 autocast: seconds per step and per
MNIST epoch (55,000 training images), for choosing a recipe's ``amp`` setting.

    .venv/bin/python benchmarks/epoch_times.py --threads 2 --out benchmarks/results/epoch_times_cpu.json

One training step = forward, loss, backward, Adam step (:func:`capsule_lib.cost.time_training_step`, median
of ``--repeat`` after a warm-up step), on a batch of real-size MNIST-shaped inputs (random pixels: the time
does not depend on the values). bf16 runs the step under ``torch.autocast(<device>, dtype=torch.bfloat16)``
with fp32 master weights, as ``Trainer(amp="bf16")`` does. The JSON records the CPU model, whether it has
native bf16 instructions (``avx512_bf16`` / ``amx_bf16`` in /proc/cpuinfo), threads and torch version.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

from capsule_lib.cost import time_training_step
from capsule_lib.losses import CapsuleObjective, ClassifierObjective
from capsule_lib.models import BaselineCNN, CapsNet, EfficientCapsNet, EfficientCapsNetConfig
from capsule_lib.train import select_device

MODELS = {  # name -> (builder, objective, batch size of the shipped run)
    "capsnet_mnist": (lambda: CapsNet(), lambda: CapsuleObjective(0.0005), 128),
    "efficient_capsnet_mnist": (
        lambda: EfficientCapsNet(EfficientCapsNetConfig.mnist()),
        lambda: CapsuleObjective(0.392, recon_reduction="mean"),
        64,
    ),
    "baseline_cnn_mnist": (lambda: BaselineCNN(), lambda: ClassifierObjective(), 128),
}
TRAIN_IMAGES = 55_000


def cpu_info() -> dict:
    info = {"machine": platform.machine(), "processor": platform.processor()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
        flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
        info.update(
            model=model,
            avx512f="avx512f" in flags,
            avx512_bf16="avx512_bf16" in flags,
            amx_bf16="amx_bf16" in flags,
            avx2="avx2" in flags,
        )
    except OSError:
        pass
    return info


class Autocast:
    """An objective run under bf16 autocast (fp32 master weights)."""

    def __init__(self, objective, device_type: str) -> None:
        self.objective, self.device_type = objective, device_type

    def __call__(self, model, batch, train):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.objective(model, batch, train)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    ap.add_argument("--out", default="benchmarks/results/epoch_times_cpu.json")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = select_device(a.device)
    rows = []
    for name, (build, objective, batch_size) in MODELS.items():
        if a.only and name not in a.only:
            continue
        torch.manual_seed(0)
        model = build().to(device)
        x = torch.rand(batch_size, 1, 28, 28, device=device)
        y = torch.randint(0, 10, (batch_size,), device=device)
        row = {"model": name, "batch_size": batch_size, "steps_per_epoch": math.ceil(TRAIN_IMAGES / batch_size)}
        for precision in ("fp32", "bf16"):
            obj = objective() if precision == "fp32" else Autocast(objective(), device.type)
            step = time_training_step(model, obj, (x, y), repeats=a.repeat, warmup=1)
            row[f"{precision}_s_per_step"] = step
            row[f"{precision}_min_per_epoch"] = step * row["steps_per_epoch"] / 60
            print(
                f"{name:25s} {precision}: {step * 1000:8.1f} ms/step, "
                f"{row[f'{precision}_min_per_epoch']:6.1f} min/epoch",
                flush=True,
            )
        row["bf16_speedup"] = row["fp32_s_per_step"] / row["bf16_s_per_step"]
        rows.append(row)
    result = {
        "benchmark": "epoch_times",
        "date": time.strftime("%Y-%m-%d"),
        "device": str(device),
        "cpu": cpu_info(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "repeats": a.repeat,
        "train_images": TRAIN_IMAGES,
        "results": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
