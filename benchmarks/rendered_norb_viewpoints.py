"""Viewpoint generalisation on the rendered smallNORB-like set (GENERATED data), with a small CapsNet.

The protocol of Hinton, Sabour & Frosst (2018), novel azimuths: train on the training instances seen only
from azimuths 300, 320, 340, 0, 20, 40 degrees (all 9 elevations, all 6 lightings); test on the test
instances (unseen objects) at those *familiar* azimuths and at the 12 *novel* ones. ``--axis elevation``
trains on the 3 lowest elevations instead. A small CapsNet (:class:`capsule_lib.models.CapsNet`, dynamic
routing, no decoder) sees the stereo pair downscaled to 2x32x32. The gap between the two test accuracies
is the viewpoint-generalisation drop the later chapters study.

    python benchmarks/rendered_norb_viewpoints.py --out runs/rendered_norb_viewpoints.json

Writes a JSON with the numbers, the configuration and the timings. Model selection uses a held-out tenth
of the training images (familiar views of the training instances), never the test sets.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from capsule_lib.data import TensorLoader
from capsule_lib.data.datasets import ImageDataset
from capsule_lib.data.render import CATEGORIES, HINTON_AZIMUTHS_FAMILIAR, HINTON_ELEVATIONS_FAMILIAR, render_norb_like
from capsule_lib.data.transforms import random_shift
from capsule_lib.losses import CapsuleObjective
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.train import Trainer, seed_everything


def downscale(x: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[N, 2, 96, 96]`` -> uint8 ``[N, 2, size, size]`` (area averaging, in chunks)."""
    out = torch.empty(x.shape[0], x.shape[1], size, size, dtype=torch.uint8)
    for lo in range(0, x.shape[0], 2048):
        y = F.interpolate(x[lo : lo + 2048].float(), size=(size, size), mode="area")
        out[lo : lo + 2048] = y.round().clamp(0, 255).to(torch.uint8)
    return out


def as_dataset(d: dict, split: str, size: int) -> ImageDataset:
    extra = {k: d[k] for k in ("instance", "elevation", "azimuth", "lighting")}
    return ImageDataset(
        "rendered_norb",
        split,
        downscale(d["images"], size),
        d["category"],
        list(CATEGORIES),
        generated=True,
        extra=extra,
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/rendered_norb_viewpoints.json")
    p.add_argument("--axis", choices=["azimuth", "elevation"], default="azimuth")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--size", type=int, default=32, help="input size after downscaling from 96")
    p.add_argument("--lightings", type=int, nargs="*", default=None, help="lighting conditions to use (default all 6)")
    p.add_argument("--test-subsample", type=int, default=None, help="render only this many test pairs per group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--workers", type=int, default=1, help="rendering processes")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    seed_everything(a.seed)
    fam = HINTON_AZIMUTHS_FAMILIAR if a.axis == "azimuth" else HINTON_ELEVATIONS_FAMILIAR
    all_vals = range(18) if a.axis == "azimuth" else range(9)
    novel = [v for v in all_vals if v not in fam]
    key = "azimuths" if a.axis == "azimuth" else "elevations"

    t0 = time.time()
    tr = render_norb_like("train", **{key: fam}, lightings=a.lightings, seed=a.data_seed, workers=a.workers)
    te_f = render_norb_like(
        "test", **{key: fam}, lightings=a.lightings, seed=a.data_seed, n=a.test_subsample, workers=a.workers
    )
    te_n = render_norb_like(
        "test", **{key: novel}, lightings=a.lightings, seed=a.data_seed, n=a.test_subsample, workers=a.workers
    )
    render_s = time.time() - t0
    train_all = as_dataset(tr, "train", a.size)
    g = torch.Generator().manual_seed(a.seed)
    perm = torch.randperm(len(train_all), generator=g)
    n_val = len(train_all) // 10
    train, val = train_all.subset(perm[n_val:]), train_all.subset(perm[:n_val])
    fam_test, nov_test = as_dataset(te_f, "test", a.size), as_dataset(te_n, "test", a.size)
    print(
        f"[GENERATED data] rendered_norb: train {len(train)} / val {len(val)} (training instances, familiar {a.axis}s "
        f"{list(fam)}), test familiar {len(fam_test)}, test novel {len(nov_test)}; rendering took {render_s:.0f} s",
        flush=True,
    )

    cfg = CapsNetConfig(
        in_channels=2,
        image_size=a.size,
        conv_channels=64,
        conv_kernel=9,
        primary_types=8,
        primary_dim=8,
        primary_kernel=9,
        primary_stride=2,
        n_classes=len(CATEGORIES),
        class_dim=16,
        iterations=3,
        decoder=False,
    )
    model = CapsNet(cfg)
    n_params = sum(q.numel() for q in model.parameters())

    def augment(batch, gen):
        x, *rest = batch
        return (random_shift(x, 2, gen), *rest)

    train_loader = TensorLoader.from_dataset(train, a.batch_size, shuffle=True, seed=a.seed, transform=augment)
    val_loader = TensorLoader.from_dataset(val, 256)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    steps = a.epochs * len(train_loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 ** (s / max(steps, 1)))
    out_dir = Path(a.out).with_suffix("")
    trainer = Trainer(
        model,
        CapsuleObjective(recon_weight=0.0),
        opt,
        sched,
        scheduler_step="batch",
        device="cpu",
        out_dir=out_dir,
        seed=a.seed,
        progress=False,
        meta={"benchmark": "rendered_norb_viewpoints"},
    )
    t1 = time.time()
    hist = trainer.fit(train_loader, val_loader, a.epochs, resume=False)
    train_s = time.time() - t1
    best = trainer.load_best()
    for r in hist.records:
        print(
            f"epoch {r['epoch']}: train acc {r['train_acc']:.3f}, val acc {r['val_acc']:.3f} ({r['epoch_time']:.0f} s)",
            flush=True,
        )
    fam_acc = trainer.evaluate(TensorLoader.from_dataset(fam_test, 256), "test")["test_acc"]
    nov_acc = trainer.evaluate(TensorLoader.from_dataset(nov_test, 256), "test")["test_acc"]
    result = {
        "data": "GENERATED rendered_norb (smallNORB-like, capsule_lib.data.render), not smallNORB",
        "protocol": f"train on training instances at familiar {a.axis}s {list(fam)}; test on test instances",
        "familiar_test_acc": fam_acc,
        "novel_test_acc": nov_acc,
        "drop": fam_acc - nov_acc,
        "chance": 1 / len(CATEGORIES),
        "best_val_acc": best["val_acc"] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "n_train": len(train),
        "n_val": len(val),
        "n_test_familiar": len(fam_test),
        "n_test_novel": len(nov_test),
        "model": {"class": "capsule_lib.models.CapsNet", "config": cfg.__dict__, "parameters": n_params},
        "training": {
            "epochs": a.epochs,
            "batch_size": a.batch_size,
            "lr": a.lr,
            "schedule": "exp decay to 0.1x",
            "loss": "margin (paper reduction), no reconstruction",
            "augmentation": "random shift ±2 px",
            "input": f"stereo pair area-downscaled 96 -> {a.size}",
            "seed": a.seed,
            "data_seed": a.data_seed,
        },
        "render_seconds": render_s,
        "train_seconds": train_s,
        "hardware": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "history": hist.records,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(
        f"familiar {a.axis}s: {fam_acc:.3f}   novel {a.axis}s: {nov_acc:.3f}   (chance {1 / len(CATEGORIES):.2f}) "
        f"-> {out}",
        flush=True,
    )
    return result


if __name__ == "__main__":
    main()
