"""One command for a GPU check: does this library train and agree with itself on this accelerator, and how fast?

    python benchmarks/gpu.py                       # any CUDA machine (about 2-3 minutes on one H100)
    python benchmarks/gpu.py --device cpu --quick  # the same code on the CPU, tiny: the unit tests run this

It writes ``benchmarks/results/gpu_<device>.json`` (``--out`` to change) with

* **machine**: versions (torch, CUDA, cuDNN, Python), the device's name and memory, the CPU;
* **steps**: for every recipe of :data:`RECIPES`, the median time of one training step (forward, loss, backward,
  Adam step) at the recipe's batch size on random images of the recipe's shape, in ``fp32``, under ``bf16``
  autocast and ``compiled`` (``torch.compile``, default mode; its compile time separately), with the peak tensor
  memory of a step (``capsule_lib.cost.peak_memory``);
* **agreement**: every routing of the library, in the comparison's network (``RoutingClassifier``), run in float64
  on the CPU and in float32 on the device (TF32 off for the check), from the same weights and images: the largest
  relative error of the scores, of the input's gradient and of every parameter's gradient, and the tightest of
  ``TOLERANCES`` it meets;
* **epoch**: one CapsNet MNIST epoch through ``capsule_lib.train.train`` (wall time, test accuracy) when MNIST is at
  hand (``--data-root`` / ``CAPSULE_DATA``; skipped, and said so, when it is not, and with ``--quick``).

``--quick``: batch 2, one timed repeat, ``compiled`` only for the first recipe, no epoch: a check that the script
works, not a measurement. The running appendix (``book/appendix/running.md``) explains how to read the file.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from capsule_lib.cost import machine_info, peak_memory, time_training_step  # noqa: E402
from capsule_lib.data import DatasetUnavailableError  # noqa: E402
from capsule_lib.models import RoutingClassifier, RoutingClassifierConfig  # noqa: E402
from capsule_lib.routing.kinds import ROUTING_KINDS  # noqa: E402
from capsule_lib.train.recipes import make_recipe  # noqa: E402

#: the recipes whose training step is timed (the book's models; MultiMNIST and the sequence head are left out:
#: their batches are not images of one class)
RECIPES = (
    "baseline_cnn",
    "capsnet",
    "efficient",
    "em_norb",
    "heinsen_norb",
    "tsai_cifar10",
    "tsai_cifar10_cpu",
    "routing_compare_mnist",
)
MODES = ("fp32", "bf16", "compiled")
TOLERANCES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


def _batch(model: torch.nn.Module, batch_size: int, device: torch.device, seed: int = 0):
    """Random images in [0, 1] of the model's input shape and random labels of its classes."""
    c = model.input_contract
    size = c.size or 48
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch_size, c.channels, size, size, generator=g)
    cfg = model.config
    n = getattr(cfg, "n_classes", None) or getattr(cfg, "n_objs", None)
    y = torch.randint(n, (batch_size,), generator=g)
    return x.to(device), y.to(device)


def _time_mode(name: str, mode: str, batch_size: int, device: torch.device, quick: bool) -> dict[str, Any]:
    """One recipe's training step in one mode: median ms, peak tensor MB (and compile + warm-up seconds)."""
    r = make_recipe(name)
    torch.manual_seed(0)
    model = r.build_model().to(device)
    objective, batch = r.build_objective(), _batch(model, batch_size, device)
    opt = torch.optim.Adam(model.parameters(), 1e-4)
    t0 = time.perf_counter()
    net = torch.compile(model) if mode == "compiled" else model
    amp = mode == "bf16"
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            seconds = time_training_step(net, objective, batch, opt, repeats=1 if quick else 5, warmup=1)
            warm = time.perf_counter() - t0  # compilation (if any), the warm-up and the timed steps
            peak = peak_memory(lambda: _one_step(net, objective, batch, opt), device)
    except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    row = {"ms": round(1000 * seconds, 3), "peak_mb": round(peak / 2**20, 1)}
    if mode == "compiled":
        row["compile_and_warmup_s"] = round(warm, 1)
    return row


def time_steps(device: torch.device, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, name in enumerate(RECIPES):
        bs = 2 if quick else make_recipe(name).batch_size
        row: dict[str, Any] = {"batch_size": bs}
        for mode in MODES:
            skip = mode == "compiled" and quick and k > 0  # --quick compiles the first recipe only
            row[mode] = None if skip else _time_mode(name, mode, bs, device, quick)
        fp32 = (row.get("fp32") or {}).get("ms")
        for mode in ("bf16", "compiled"):
            ms = (row.get(mode) or {}).get("ms")
            if fp32 and ms:
                row[mode]["speedup_vs_fp32"] = round(fp32 / ms, 2)
        out[name] = row
        print(f"gpu.py: {name:24s} " + "  ".join(f"{m} {(row.get(m) or {}).get('ms', '-')}" for m in MODES), flush=True)
    return out


def _one_step(model, objective, batch, opt):
    out = objective(model, batch, True)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double().cpu(), ref.double().cpu()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


def agreement(device: torch.device) -> dict[str, Any]:
    """Float64 on the CPU against float32 on ``device`` for every routing kind (TF32 off)."""
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows = {}
    try:
        for kind in ROUTING_KINDS:
            torch.manual_seed(0)
            cfg = RoutingClassifierConfig(routing=kind, stem_channels=(16, 32), primary_types=4, caps_dim=16)
            ref_model = RoutingClassifier(cfg).double()
            with torch.no_grad():  # away from the initialisation (e.g. Heinsen's betas start at 0: scores all 0)
                for p in ref_model.parameters():
                    p.add_(
                        0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype)
                    )
            model = RoutingClassifier(cfg).to(device)
            model.load_state_dict({k: v.float() for k, v in ref_model.state_dict().items()})
            x = torch.rand(8, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            w = torch.randn(8, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            results = []
            for m, xi in ((ref_model, x), (model, x.float().to(device))):
                xi = xi.clone().requires_grad_()
                s = m(xi).scores
                (s * w.to(s.dtype).to(s.device)).sum().backward()
                results.append((s.detach(), xi.grad, {n: p.grad for n, p in m.named_parameters()}))
            (s64, gx64, gp64), (s32, gx32, gp32) = results
            errs = {"scores": _rel(s32, s64), "input_grad": _rel(gx32, gx64)}
            errs["param_grad_max"] = max(_rel(gp32[n], gp64[n]) for n in gp64 if gp64[n] is not None)
            worst = max(errs.values())
            meets = next((t for t in TOLERANCES if worst <= t), None)
            rows[kind] = {**{k: float(f"{v:.3g}") for k, v in errs.items()}, "tolerance_met": meets}
            print(f"gpu.py: agreement {kind:16s} worst rel. error {worst:.2e} (meets {meets})", flush=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return rows


def mnist_epoch(device: torch.device, data_root: str | None) -> dict[str, Any]:
    from capsule_lib.train import train

    t0 = time.perf_counter()
    try:
        _, trainer = train("capsnet", data_root=data_root, standin=False, progress=False, epochs=1, device=str(device))
    except DatasetUnavailableError as e:
        return {"skipped": f"MNIST not at hand ({str(e).splitlines()[0][:120]})"}
    rec = trainer.history.records[-1]
    return {
        "recipe": "capsnet",
        "epochs": 1,
        "epoch_s": round(rec["epoch_time"], 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "val_acc": rec.get("val_acc"),
        "test_acc": (trainer.history.meta.get("test") or {}).get("test_acc"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu.py: no CUDA device here; run it on a GPU machine, or with --device cpu --quick", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    info = machine_info(device)
    info.update(
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if device.type == "cuda" else None,
        device_memory_gb=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        if device.type == "cuda"
        else None,
        cpu=machine_info("cpu")["device_name"],
    )
    result: dict[str, Any] = {"machine": info, "quick": a.quick, "modes": list(MODES)}
    result["steps"] = time_steps(device, a.quick)
    result["agreement"] = agreement(device)
    result["epoch"] = {"skipped": "--quick"} if a.quick else mnist_epoch(device, a.data_root)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    slug = re.sub(r"[^a-z0-9]+", "_", info["device_name"].lower()).strip("_") if device.type == "cuda" else "cpu"
    out = a.out or REPO / "benchmarks" / "results" / f"gpu_{slug}{'_quick' if a.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(result, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v))
        + "\n"
    )
    print(f"gpu.py: wrote {out} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
