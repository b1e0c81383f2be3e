"""Your own images, measured (issue #63): every family that trains on a folder, on folders the book can write, from 28
to 224 px, grey and RGB, 2 to 40 classes, 50 to 5,000 images per class, at the same CPU budget per run.

    .venv/bin/python benchmarks/own_images_matrix.py --out benchmarks/results/own_images_matrix_cpu.json
    .venv/bin/python benchmarks/own_images_matrix.py --quick --out /tmp/q.json     # seconds: the tests run it

The grid (sizes x channels x classes x images per class) is sampled by :data:`CELLS`, one folder per size, so that
every size, both channel counts, every class count (2, 4, 10, 40) and images per class from 50 to 5,000 occur at
least once:

=========  ========================================  =====  =======  =========  ===============
cell       written from                              side   colour   classes    images / class
=========  ========================================  =====  =======  =========  ===============
mnist28    MNIST digits 3 and 5                      28     grey     2          5,000
cifar32    CIFAR-10, every class                     32     RGB      10         500
cifar64    CIFAR-10 airplane, bird, frog, ship       64     RGB      4          200
norb128    rendered smallNORB-like views, left eye   128    grey     4          200
cifar224   CIFAR-10 x 4 rotations (40 classes)       224    RGB      40         50
=========  ========================================  =====  =======  =========  ===============

Pictures smaller than their cell's side (CIFAR-10's 32 px, MNIST's 28) are enlarged (bilinear) before they are
written, as a reader's upscaled photos would be; without the data under ``--data-root`` the generated stand-ins
(glyph digits, colour shapes) are written instead, and the JSON says so. Each family of :data:`FAMILIES` trains on
each folder through the command a reader runs (``python -m capsule_lib.train RECIPE --images FOLDER``), one thread,
``--budget-minutes`` of training each (validation included; the run stops inside an epoch if need be and keeps the
best validated weights), two runs at a time on separate cells. Recorded per run: parameters and primary capsules
(the run's ``history.meta``), seconds per epoch (the first full epoch's, else the partial one scaled), the process's
peak resident memory (``VmHWM``, polled every 0.5 s), the best validation accuracy, the test accuracy of the epoch
it selected, the run's own verdict (``learned``, its symptoms) and the command's exit status; per cell, whether each
capsule network reached the goal: at least halfway from chance to the CNN of the same cell
(:func:`capsule_lib.learning.learned`), and the stretch goal, within 5 points of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cell:
    """One folder of the grid: where its pictures come from, their side, colour, classes and images per class."""

    name: str
    source: str  # "mnist", "cifar10", "norb", "cifar10_rotations"
    side: int
    channels: int
    classes: tuple[int, ...]  # the source's class indices (a rotation cell: 10 classes x 4 rotations)
    per_class: int


CELLS = (
    Cell("mnist28", "mnist", 28, 1, (3, 5), 5000),
    Cell("cifar32", "cifar10", 32, 3, tuple(range(10)), 500),
    Cell("cifar64", "cifar10", 64, 3, (0, 2, 6, 8), 200),
    Cell("norb128", "norb", 128, 1, (0, 1, 2, 3), 200),
    Cell("cifar224", "cifar10_rotations", 224, 3, tuple(range(10)), 50),
)

#: the families a reader can train on a folder: label -> (recipe, --set overrides)
#: (a batch of 32 instead of the recipes' 128: four times the steps in the same CPU minutes; Efficient-CapsNet's own
#: recipe already takes 16)
FAMILIES = {
    "CapsNet": ("capsnet", ["batch_size=32"]),
    "Efficient-CapsNet": ("efficient", []),
    "comparison network (dynamic routing)": ("routing_compare_mnist", ["model.routing=dynamic", "batch_size=32"]),
    "comparison network (EM routing)": ("routing_compare_mnist", ["model.routing=em", "batch_size=32"]),
    "CNN": ("baseline_cnn", ["batch_size=32"]),
}
CNN = "CNN"


def _source_images(cell: Cell, data_root: str | None, quick: bool):
    """The cell's pictures (uint8 ``[N, C, h, w]``), labels (0..K-1), class names and whether they are generated."""
    import torch

    from capsule_lib.data import DataSource, get_dataset

    per_class = 12 if quick else cell.per_class
    if cell.source == "norb":
        from capsule_lib.data.render import render_norb_like

        r = render_norb_like("train", categories=cell.classes, n=per_class * len(cell.classes), size=cell.side, seed=0)
        images, labels = r["images"][:, :1], r["category"]  # the left camera: one grey channel
        keep = torch.cat([torch.nonzero(labels == k).squeeze(1)[:per_class] for k in cell.classes])
        names = ["animal", "human", "airplane", "truck", "car"]
        y = torch.searchsorted(torch.tensor(cell.classes), labels[keep])
        return images[keep], y, [names[k] for k in cell.classes], True
    name = "mnist" if cell.source == "mnist" else "cifar10"
    ds = get_dataset(name, DataSource(data_root, offline=True, standin=True), "train")
    rotations = 4 if cell.source == "cifar10_rotations" else 1  # each source class gives that many classes
    keep = torch.cat([torch.nonzero(ds.labels == k).squeeze(1)[: per_class * rotations] for k in cell.classes])
    images, y = ds.images[keep], torch.searchsorted(torch.tensor(cell.classes), ds.labels[keep])
    names = [ds.classes[k] for k in cell.classes]
    if cell.source == "cifar10_rotations":  # 40 classes: each class's pictures turned by 0, 90, 180 and 270 degrees
        quarter = torch.arange(len(y)) % 4  # a different quarter of each class's pictures for each rotation
        images = torch.stack([torch.rot90(im, int(q), (1, 2)) for im, q in zip(images, quarter)])
        y = y * 4 + quarter
        names = [f"{n}_rot{90 * q}" for n in names for q in range(4)]
    return images, y, names, ds.generated


def write_cell(cell: Cell, folder: Path, data_root: str | None, quick: bool) -> dict:
    """Write the cell's folder (``folder/<class>/<k>.png``) at the cell's side; what was written."""
    import torch
    import torch.nn.functional as F

    from capsule_lib.data.image_files import write_image_folder

    t0 = time.perf_counter()
    images, labels, names, generated = _source_images(cell, data_root, quick)
    if images.shape[1] != cell.channels:  # a grey source for an RGB cell, or the other way round
        images = images.float().mean(1, keepdim=True) if cell.channels == 1 else images.expand(-1, 3, -1, -1)
    if images.shape[-1] != cell.side:
        images = F.interpolate(images.float(), size=(cell.side, cell.side), mode="bilinear", align_corners=False)
    images = images.round().clamp(0, 255).to(torch.uint8)
    write_image_folder(images, labels, names, folder)
    return {"files": len(labels), "classes": len(names), "generated": generated, "write_s": time.perf_counter() - t0}


def _peak_kib(pid: int) -> int:
    """A live process's peak resident memory so far (``VmHWM`` of ``/proc/PID/status``, KiB; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def _run(cell: Cell, family: str, folder: Path, work: Path, budget: float, quick: bool) -> dict:
    """One family on one folder, through the command line in a process of its own; what its run recorded."""
    recipe, sets = FAMILIES[family]
    out = work / cell.name / "runs" / "".join(c if c.isalnum() or c == "-" else "_" for c in family)
    epochs = 1 if quick else 1000  # the budget ends the run
    cmd = [sys.executable, "-m", "capsule_lib.train", recipe, "--images", str(folder), "--out", str(out)]
    cmd += ["--image-size", str(cell.side)]  # the folder's side (a folder's default size is at most 64 px)
    cmd += ["--threads", "1", "--budget-minutes", str(budget), "--set", f"epochs={epochs}", "device=cpu", *sets]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CAPSULE_OFFLINE": "1"}
    t0, load = time.perf_counter(), os.getloadavg()[0]
    with open(work / f"{cell.name}_{out.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
        peak = 0
        while proc.poll() is None:  # the run's own peak resident memory (VmHWM: since its exec, so not this
            peak = max(peak, _peak_kib(proc.pid))  # process's memory, which a fork-and-exec child's maxrss counts)
            time.sleep(0.5)
    said = (work / f"{cell.name}_{out.name}.log").read_text()
    row = {
        "cell": cell.name,
        "family": family,
        "recipe": recipe,
        "exit_status": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(peak / 1024),
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],  # the machine's 1-min load, start and end
        "lines": [line for line in said.splitlines() if "network:" in line or "did not learn" in line][-2:],
    }
    history = out / "history.json"
    if not history.is_file():
        row["error"] = said.strip().splitlines()[-1] if said.strip() else "no output"
        return row
    h = json.loads(history.read_text())
    meta, records = h["meta"], h["records"]
    full = [r for r in records if not r.get("partial")]
    first = full[0] if full else records[-1]
    per_epoch = first["epoch_time"] / (first["epoch"] if first.get("partial") else 1)
    best = max(records, key=lambda r: r["val_acc"])
    check = meta.get("learning_check") or {}
    row.update(
        parameters=meta.get("parameters"),
        primary_capsules=meta.get("primary_capsules"),
        stem=meta.get("stem"),
        image_size=(meta.get("images") or {}).get("image_size"),
        epochs=records[-1]["epoch"],
        seconds_per_epoch=round(per_epoch, 1),
        val_acc=best["val_acc"],
        test_acc=(meta.get("test") or {}).get("test_acc"),
        chance=check.get("chance"),
        learned=meta.get("learned"),
        symptoms=check.get("symptoms"),
    )
    return row


def goals(rows: list[dict]) -> list[dict]:
    """Each capsule network's row with the goal (at least halfway from chance to the CNN of its cell, on validation)
    and the stretch goal (within 5 points of it, on test) marked, where the CNN of the cell learned; the CNN's rows
    unchanged."""
    from capsule_lib.learning import learned

    cnn = {r["cell"]: r for r in rows if r["family"] == CNN and r.get("learned")}  # a CNN that learned: a yardstick
    for r in rows:
        base = cnn.get(r["cell"])
        if r["family"] == CNN or base is None or r.get("val_acc") is None or r.get("chance") is None:
            continue  # no goal where the CNN of the cell did not learn either (the cell measures nothing)
        r["goal"] = learned(r["val_acc"], max(base["val_acc"], r["val_acc"]), r["chance"])
        if r.get("test_acc") is not None and base.get("test_acc") is not None:
            r["within_5_points"] = r["test_acc"] >= base["test_acc"] - 0.05
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file")
    p.add_argument("--budget-minutes", type=float, default=2.0, help="training minutes per run (default 2)")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--cells", default=",".join(c.name for c in CELLS), help="cells to run (comma-separated)")
    p.add_argument("--families", default=",".join(FAMILIES), help="families to run (comma-separated labels)")
    p.add_argument(
        "--data-root", default=os.environ.get("CAPSULE_DATA"), help="MNIST and CIFAR-10 (default $CAPSULE_DATA)"
    )
    p.add_argument("--work", help="keep the folders and runs here (default: a temporary folder, deleted)")
    p.add_argument("--quick", action="store_true", help="12 images per class, one epoch: a check, not a measurement")
    a = p.parse_args(argv)
    from capsule_lib.cost import machine_info

    cells = [c for c in CELLS if c.name in a.cells.split(",")]
    families = [f for f in FAMILIES if f in a.families.split(",")]
    work = Path(a.work or tempfile.mkdtemp(prefix="own_images_matrix_")).resolve()
    budget = 0.05 if a.quick else a.budget_minutes
    try:
        written = {}
        for cell in cells:
            written[cell.name] = write_cell(cell, work / cell.name / "images", a.data_root, a.quick)
            print(json.dumps({"cell": cell.name, **written[cell.name]}), flush=True)
        jobs = [(c, f) for f in families for c in cells]  # family-major: runs side by side are on different cells
        with ThreadPoolExecutor(a.parallel) as pool:
            futures = [pool.submit(_run, c, f, work / c.name / "images", work, budget, a.quick) for c, f in jobs]
            rows = []
            for fut in futures:
                rows.append(fut.result())
                print(json.dumps(rows[-1]), flush=True)
        result = {
            "machine": machine_info("cpu"),
            "command": " ".join("$CAPSULE_DATA" if v == a.data_root else v for v in sys.argv),  # no local paths
            "quick": a.quick,
            "budget_minutes": budget,
            "parallel": a.parallel,
            "threads_per_run": 1,
            "cells": [{**asdict(c), **written[c.name]} for c in cells],
            "runs": goals(rows),
        }
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
