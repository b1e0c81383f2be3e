"""Issue #60's runs on a lent GPU, each one command from the repository root (the calls, with what each carries:
benchmarks/README.md, "Runs on a lent GPU"; ``python benchmarks/gpu_stage.py stage ITEM`` prints them)::

    python3 -u benchmarks/gpu_items.py tsai --budget 8                    # 1: Tsai et al.'s network on CIFAR-10
    python3 -u benchmarks/gpu_items.py tsai --budget 15 --minutes 8.5     #    a run over two slots: the first,
    python3 -u benchmarks/gpu_items.py tsai --budget 15 --minutes 8.5 --resume   # the second (piece r: its state)
    python3 -u benchmarks/gpu_items.py critique --minutes 8.5 --workers 4 # 2: the critique's MNIST runs, longer
    python3 -u benchmarks/gpu_items.py speedrun 4.8 capsnet_speedrun --set seed=1 --tag gpu_seed1   # 3 and 4
    python3 -u benchmarks/gpu_items.py speedrun 1.5 capsnet_speedrun --flops                        # 5
    python3 benchmarks/gpu_items.py --quick tsai                          # any of them on the CPU, tiny (the tests)

Every subcommand first checks the staged data it reads (:func:`gpu_stage.data_root`: every file's sha256; a missing
piece stops it before anything trains, exit 3), then trains in a subprocess in a scratch folder (``--work``; default
/dev/shm/gpu_items, else /tmp/gpu_items, emptied first). Every 10 s and at the end, what comes back is copied to
``$OUT`` (``--out``): ``meta.tar.gz`` (``record.json``: the item, the command, the machine and what each run reached;
the logs; ``speedrun.json``; the exported runs' registry and histories; the critique's ``result.json`` files), the
exported fp16 checkpoints, and for ``tsai`` the run's state (``last.pt``, ``best.pt``, ``history.json``,
``parts.json``) as ``state.tar.partNN`` pieces of 15 MiB, which go out again in the next slot (piece ``r``). At most 8
files of at most 16 MiB each, 64 MiB together (what the device returns); what does not fit is named in the record. A
call stopped by its time limit still returns what was synced.

* ``tsai``: ``python -m capsule_lib.train tsai_cifar10_speedrun`` with ``--budget-minutes BUDGET``: the run's
  length is fitted to BUDGET minutes of training over all its parts; at ``--minutes`` (default BUDGET + 0.5) this
  call stops it (Ctrl-C: a mid-epoch checkpoint) so the next slot resumes it exactly (``stage/r`` holds the state,
  :class:`~capsule_lib.train.trainer.Trainer`). ``parts.json`` in the run folder records each part's hardware,
  torch, date and epochs. A finished run is exported (float16; val, test and the exact-image test subset, TF32 off
  for the evaluation) and summarised as the speedrun does (:func:`~capsule_lib.train.timed.run_summary`).
* ``critique``: ``benchmarks/critique_runs.py`` (issue #57's, with ``--runs-dir`` and ``--set``) in ``--workers``
  processes on the critique's MNIST runs at a longer budget (default ``epochs=10 train_subset=null``); results
  returned by an earlier call (piece ``r``) are not run again; at ``--minutes`` the runs still training are stopped.
* ``speedrun``: ``python -m capsule_lib.train.speedrun MINUTES RECIPE...`` (any of its options after the recipes);
  ``--flops`` adds, per run, the FLOPs of one training step (``torch.utils.flop_counter``), the achieved FLOP/s of its
  epochs (the speedrun's own epoch times) and the card's peak (:data:`PEAK_TFLOPS`).

``--quick``: tiny subsets on the CPU (the speedrun's ``QUICK`` settings; for ``tsai`` also a smaller network of the
same layers, :data:`TSAI_QUICK`), the same code otherwise: a check that the command works, not a measurement.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_stage  # noqa: E402  (benchmarks/, beside this file)

from capsule_lib.train.learning_check import DID_NOT_LEARN_EXIT  # noqa: E402
from capsule_lib.train.recipes import RECIPES, make_recipe  # noqa: E402
from capsule_lib.train.timed import QUICK, _machine, run_summary, speedrun_recipe  # noqa: E402

MIB = 2**20
#: what a call returns: at most this many files, each at most FILE_LIMIT, TOTAL_LIMIT together
FILES, FILE_LIMIT, TOTAL_LIMIT = 8, 16 * MIB, 64 * MIB
#: the size of the pieces of a run's state (under FILE_LIMIT)
PIECE = 15 * MIB
#: the small files of a call, packed into meta.tar.gz (globs under the scratch folder)
META = (
    "record.json",
    "parts.json",
    "*.log",
    "nvidia-smi.txt",
    "speedrun.json",
    "checkpoints/registry.json",
    "checkpoints/*.history.json",
    "runs/*/history.json",
    "critique/*/result.json",
)
#: a run's state that goes out again in the next slot (under the scratch folder)
STATE = ("run/last.pt", "run/best.pt", "run/history.json", "run/run.json", "parts.json")  # run.json: their binding
TSAI = "tsai_cifar10_speedrun"
#: what ``--quick`` also shrinks in Tsai et al.'s network (an 8-channel stem, one block per stage, 4 capsule types in
#: each layer; the same layers): the paper's takes 2 s a step of 16 images on one CPU thread, this one 0.1 s
TSAI_QUICK = {
    "model.resnet_stem": 8,
    "model.resnet_blocks": [1, 1],
    "model.backbone_channels": 16,
    "model.primary_types": 4,
    "model.capsules": [{"kind": "conv", "n_caps": 4, "kernel_size": 3, "stride": s} for s in (2, 1)],
}
#: the datasets a recipe's dataset is made from (the staged pieces it needs; none: generated on the machine)
NEEDS = {"mnist": "mnist", "multimnist": "mnist", "cifar10": "cifar10"}

#: dense peak throughput in TFLOP/s (no sparsity) from NVIDIA's data sheets, keyed by a part of the device's name
#: (the more specific first): FP32 on the CUDA cores, TF32 and BF16 on the tensor cores
PEAK_TFLOPS = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


def peak_tflops(device_name: str) -> dict[str, float] | None:
    """The card's dense peaks (:data:`PEAK_TFLOPS`) by its name, ``None`` for a card not in the table (or a CPU)."""
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


class Call:
    """One device call: its scratch folder ``work`` (emptied), its ``record`` (``record.json``) and :meth:`sync`, which
    copies what goes back into ``out``."""

    def __init__(self, item: str, out: Path, work: Path, quick: bool, argv: list[str]) -> None:
        self.out, self.work, self.t0 = out, work, time.time()
        self.device = "cpu" if quick else "cuda"
        machine = _machine(self._dev())  # no GPU: one line, before anything is written
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        out.mkdir(parents=True, exist_ok=True)
        self.record: dict[str, Any] = {"item": item, "argv": argv, "quick": quick, "machine": machine}
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv"]
            (work / "nvidia-smi.txt").write_text(subprocess.run(query, capture_output=True, text=True).stdout)
        self._state_mtime: float | None = None

    def _dev(self) -> torch.device:
        if self.device == "cuda" and not torch.cuda.is_available():
            gpu_stage.fail("no CUDA device here; run it on the GPU, or with --quick on a CPU", prog="gpu_items.py")
        return torch.device(self.device)

    def sync(self) -> None:
        """Copy what comes back to ``out``: the run's state (when it changed), the exported checkpoints as far as the
        limits allow (the others named in ``record["left_out"]``), then ``record.json`` and the small files as
        ``meta.tar.gz``."""
        state = [self.work / n for n in STATE if (self.work / n).is_file()]
        if state and max(f.stat().st_mtime for f in state) != self._state_mtime:
            self._state_mtime = max(f.stat().st_mtime for f in state)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for f in state:
                    tar.add(f, arcname=f.relative_to(self.work).as_posix())
            data = buf.getvalue()
            for old in self.out.glob("state.tar.part*"):
                old.unlink()
            for k in range(0, len(data), PIECE):
                _put(self.out / f"state.tar.part{k // PIECE:02d}", data[k : k + PIECE])
        sent = [*self.out.glob("state.tar.part*")]
        used, left = sum(f.stat().st_size for f in sent) + MIB, []  # a mebibyte kept for meta.tar.gz
        for ck in sorted(self.work.glob("checkpoints/*.pt")):
            size = ck.stat().st_size
            if len(sent) + 1 < FILES and size <= FILE_LIMIT and used + size <= TOTAL_LIMIT:
                dest = self.out / ck.name
                if not dest.exists() or dest.stat().st_mtime < ck.stat().st_mtime:
                    _put(dest, ck.read_bytes())
                sent.append(dest)
                used += size
            else:
                left.append(f"{ck.name} ({size / MIB:.1f} MiB)")
        self.record.update(left_out=left, wall_s=round(time.time() - self.t0, 1))
        (self.work / "record.json").write_text(json.dumps(self.record, indent=1, default=str))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for f in sorted({f for g in META for f in self.work.glob(g)}):
                tar.add(f, arcname=f.relative_to(self.work).as_posix())
        _put(self.out / "meta.tar.gz", buf.getvalue())

    def run(self, commands: list[list[str]], minutes: float, log: str) -> list[int]:
        """Run ``commands`` side by side (each one's output in ``<log>_<k>.log``), syncing every 10 s; at ``minutes``
        each still running gets a Ctrl-C (a trainer stops after its batch with a checkpoint), then, after 90 s, a kill.
        Returns their exit codes."""
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # this checkout's capsule_lib
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)
        procs = []
        for k, cmd in enumerate(commands):
            with open(self.work / f"{log}_{k}.log", "w") as fh:
                procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env))
        deadline, stopped = time.time() + 60 * minutes, False
        self.record.setdefault("commands", []).extend(shlex.join(map(str, c)) for c in commands)
        while any(p.poll() is None for p in procs):
            wait = 10.0 if stopped else min(10.0, max(0.1, deadline - time.time()))
            try:
                next(p for p in procs if p.poll() is None).wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
            if not stopped and time.time() >= deadline:
                stopped = True
                self.record["stopped_at_minutes"] = minutes
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGINT)
            if stopped and time.time() >= deadline + 90:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            self.sync()
        codes = [p.wait() for p in procs]
        for k in range(len(commands)):
            print(f"--- {log}_{k}.log (last lines)\n" + "".join((self.work / f"{log}_{k}.log").open().readlines()[-8:]))
        return codes


def _put(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name: a file in ``$OUT`` is never seen half-written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _sets(pairs: list[str]) -> list[str]:
    for kv in pairs:
        if "=" not in kv:
            gpu_stage.fail(f"--set wants KEY=VALUE, got {kv!r}", prog="gpu_items.py")
    return pairs


def _check_arguments(a: argparse.Namespace) -> None:
    """What no call can use, in one line (exit 2) before anything is written: minutes and budgets that are not > 0, no
    worker, a recipe that is not a speedrun recipe."""
    from capsule_lib.train.recipes.speedrun import SPEEDRUNS

    for name in ("minutes", "budget"):
        value = getattr(a, name, None)
        if isinstance(value, float) and not 0 < value < float("inf"):
            gpu_stage.fail(f"--{name} must be a number of minutes > 0, got {value}", prog="gpu_items.py")
    if getattr(a, "workers", 1) < 1:
        gpu_stage.fail(f"--workers must be >= 1, got {a.workers}", prog="gpu_items.py")
    known = [c.name for c in SPEEDRUNS]
    unknown = [n for n in getattr(a, "names", []) if n not in known]
    if unknown:
        gpu_stage.fail(
            f"RECIPE: not a speedrun recipe: {', '.join(unknown)} (one of {', '.join(known)})", prog="gpu_items.py"
        )


def _recipe_sets(recipe: str, quick: bool, given: list[str], extra: dict[str, Any] | None = None) -> list[str]:
    """The ``--set`` values of a run of ``recipe``: on the GPU, ``device=cuda``; with ``quick``, the speedrun's
    ``QUICK`` settings of its fields, ``extra`` and ``device=cpu``; then the ``given`` ``KEY=VALUE`` (which win)."""
    fields = RECIPES[recipe].__dataclass_fields__
    sets = {k: json.dumps(v) for k, v in QUICK.items() if k in fields} if quick else {}
    sets.update({k: json.dumps(v) for k, v in (extra or {}).items()} if quick else {})
    sets["device"] = "cpu" if quick else "cuda"
    sets.update(kv.split("=", 1) for kv in given)
    return [f"{k}={v}" for k, v in sets.items()]


def _real_data(datasets: list[str], stage: Path) -> Path:
    """The data root of the staged pieces of ``datasets`` (checked: :func:`gpu_stage.data_root`), and each dataset's
    test split read from it by the library's reader with no stand-in allowed: a run that would silently fall back to
    generated images (``--offline``) stops here instead (exit 3)."""
    from capsule_lib.data import DataSource, get_dataset

    root = gpu_stage.data_root(datasets, stage)
    for name in datasets:
        try:
            get_dataset(name, DataSource(root, offline=True, standin=False), "test")
        except (OSError, ValueError) as e:
            gpu_stage.fail(f"{name}: the staged files do not read as the dataset ({e})", 3, prog="gpu_items.py")
    return root


def _resumed(resume: bool, stage: Path, work: Path, member: str | None = None) -> bool:
    """With ``resume``, unpack the staged piece ``r`` (checked first; exit 3 when it is missing) into ``work``: a run's
    state (its ``state.tar.part*``), or the files under ``member/`` of the ``meta.tar.gz`` a call returned. Without,
    nothing (a piece ``r`` an earlier call left on the machine is not read); returns ``resume``."""
    piece = stage / gpu_stage.RESUME
    if not resume:
        return False
    gpu_stage.verify([gpu_stage.RESUME], stage)
    parts = sorted(piece.glob("state.tar.part*"))
    if member is None and not parts:
        gpu_stage.fail(f"{piece} holds no state.tar.part* (stage it with --resume from a tsai call's files)", 3)
    if member is None:
        tar = tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts)))
    else:
        tar = tarfile.open(piece / "meta.tar.gz")
    with tar:
        keep = [m for m in tar.getmembers() if member is None or m.name.startswith(f"{member}/")]
        tar.extractall(work, members=keep, filter="data")
    return True


def tsai(a: argparse.Namespace, call: Call) -> int:
    """Item 1 (see the module docstring)."""
    from capsule_lib.data import DataSource
    from capsule_lib.train.checkpoint import load_history
    from capsule_lib.train.run import hardware_string
    from capsule_lib.train.shipped import export_run

    root = _real_data(["cifar10"], a.stage)
    run, parts_file = call.work / "run", call.work / "parts.json"
    resumed = _resumed(a.resume, a.stage, call.work)
    parts = json.loads(parts_file.read_text()) if resumed else []
    before = load_history(run / "history.json").records if resumed else []
    part = {
        "part": len(parts) + 1,
        "hardware": hardware_string(call._dev()),
        "torch": torch.__version__,
        "date": call.record["machine"]["date"],
        "from_epoch": before[-1]["epoch"] if before else 0,
        "from_wall_s": before[-1]["wall_time"] if before else 0.0,
    }
    parts.append(part)
    parts_file.write_text(json.dumps(parts, indent=1))
    call.record["parts"] = parts
    sets = _recipe_sets(TSAI, a.quick, a.set, TSAI_QUICK)
    cmd = [sys.executable, "-m", "capsule_lib.train", TSAI, "--out", str(run), "--data-root", str(root), "--offline"]
    cmd += ["--budget-minutes", str(a.budget), *(["--resume"] if resumed else []), "--set", *sets]
    (code,) = call.run([cmd], a.minutes if a.minutes is not None else a.budget + 0.5, "train")
    after = load_history(run / "history.json").records if (run / "history.json").is_file() else []
    ended = code in (0, DID_NOT_LEARN_EXIT)  # 3: the run ended and said it did not learn (its own learning check)
    part.update(exit_code=code, run_ended=ended, learned=code == 0, to_epoch=after[-1]["epoch"] if after else 0)
    part["to_wall_s"] = after[-1]["wall_time"] if after else 0.0
    parts_file.write_text(json.dumps(parts, indent=1))
    # the run ended (all its epochs, or its budget): export it, TF32 off for the evaluation; a run that did not learn
    # is exported only by --quick (a check of the command: a few images and seconds cannot learn), never shipped
    if code == 0 or (code == DID_NOT_LEARN_EXIT and a.quick):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        hist = load_history(run / "history.json")
        each = "; ".join(
            f"part {p['part']} on {p['hardware']} (torch {p['torch']}, {p['date'][:10]}): epochs {p['from_epoch']} to "
            f"{p['to_epoch']}"
            for p in parts
        )
        ended = sum(bool(p.get("run_ended")) for p in parts)
        read = "once" if ended == 1 else f"at the end of each of the {ended} parts that ended the run"
        notes = (
            f"Speedrun recipe {TSAI}: {hist.records[-1]['wall_time']:.0f} s of training in {len(parts)} part(s), "
            f"each resumed exactly from the checkpoint of the one before ({each}); budget {a.budget} min, seed "
            f"{hist.meta.get('seed')}; the weights shipped are the moving average (ema {hist.meta.get('ema')}) of the "
            f"epoch chosen on the validation split; the test split was read {read}; test_exact: the test images the "
            f"data's copy marks as bit-exact originals."
        )
        tag = a.tag or ("quick" if a.quick else "gpu")
        entry = export_run(
            run,
            f"{TSAI}_{tag}",
            data_root=DataSource(root, offline=True),
            directory=call.work / "checkpoints",
            device=call.device,
            notes=notes,
            eval_subset=hist.meta["config"].get("eval_subset"),  # the run's (--quick: a few images)
        )
        call.record["runs"] = [run_summary(TSAI, run, entry)]
        print(f"gpu_items.py: exported {entry['file']}: {json.dumps(entry['metrics'])}")
    call.record["exit_code"] = code
    return 0 if code == DID_NOT_LEARN_EXIT and a.quick else code


def critique(a: argparse.Namespace, call: Call) -> int:
    """Item 2 (see the module docstring)."""
    from capsule_lib.routing_critique import critique_runs

    script = REPO / "benchmarks" / "critique_runs.py"
    if "--runs-dir" not in script.read_text():
        gpu_stage.fail(
            "benchmarks/critique_runs.py has no --runs-dir (issue #57's version is needed)", prog="gpu_items.py"
        )
    root = _real_data(["mnist"], a.stage)
    runs_dir = call.work / "critique"
    _resumed(a.resume, a.stage, call.work, "critique")
    done = sorted(p.parent.name for p in runs_dir.glob("*/result.json"))
    only = [critique_runs(("mnist",))[0].name] if a.quick else a.only
    sets = (["epochs=1", "train_subset=64", "eval_subset=32", "device=cpu"] if a.quick else a.budget) + a.set
    cmd = [sys.executable, str(script), "--data-root", str(root), "--runs-dir", str(runs_dir), "--only", *only]
    codes = call.run([[*cmd, "--set", *sets]] * a.workers, a.minutes, "critique")
    now = sorted(p.parent.name for p in runs_dir.glob("*/result.json"))
    call.record["critique"] = {"before": done, "done_now": sorted(set(now) - set(done)), "exit_codes": codes}
    planned = [r.name for r in critique_runs(("mnist",)) if any(o in r.name for o in only)]
    call.record["critique"]["left"] = sorted(set(planned) - set(now))
    print(f"gpu_items.py: critique runs done {len(now)} of {len(planned)} ({len(now) - len(done)} in this call)")
    return 0 if now else 1


def step_flops(recipe: Any, device: torch.device) -> int:
    """FLOPs of one training step of ``recipe`` (a classifier of one label per image) at its batch size: forward,
    loss and backward, counted by ``torch.utils.flop_counter.FlopCounterMode`` in eager mode (compiling changes the
    kernels, not the arithmetic; the optimiser's elementwise update is not counted)."""
    from gpu import _batch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = recipe.build_model().to(device)
    batch = _batch(model, recipe.batch_size, device)
    with FlopCounterMode(display=False) as counter:
        recipe.build_objective()(model, batch, True).loss.backward()
    return int(counter.get_total_flops())


def flops_report(speedrun: dict[str, Any], out: Path, device: torch.device) -> list[dict[str, Any]]:
    """Per finished run of a ``speedrun.json`` (in ``out``): one step's FLOPs, the achieved TFLOP/s of its epochs (the
    median epoch time; the first epoch, which compiles, left out when there are others) and the card's peaks."""
    from capsule_lib.train.checkpoint import load_history

    rows = []
    for run in speedrun["runs"]:
        if "metrics" not in run:
            continue
        recipe = speedrun_recipe(run["recipe"], str(device), speedrun["quick"], speedrun["overrides"])
        hist = load_history(out / "runs" / run["recipe"] / "history.json")
        times = [r["epoch_time"] for r in hist.records if not r.get("partial")]
        times = times[1:] or times
        flops, steps = step_flops(recipe, device), hist.meta["train_images"] // recipe.batch_size
        achieved = flops * steps / statistics.median(times) / 1e12
        precision = recipe.amp or ("tf32" if hist.meta.get("matmul_precision") == "high" else "fp32")
        peak = peak_tflops(speedrun["machine"]["device_name"])
        rows.append(
            {
                "recipe": run["recipe"],
                "batch_size": recipe.batch_size,
                "step_flops": flops,
                "steps_per_epoch": steps,
                "epoch_s_median": round(statistics.median(times), 3),
                "epoch_s_best": round(min(times), 3),
                "epochs_timed": len(times),
                "achieved_tflops": round(achieved, 3),
                "precision": precision,
                "peak_tflops": peak,
                "share_of_peak": round(achieved / peak[precision], 4) if peak and precision in peak else None,
            }
        )
        print(f"gpu_items.py: {run['recipe']}: {json.dumps(rows[-1])}")
    return rows


def speedrun(a: argparse.Namespace, rest: list[str], call: Call) -> int:
    """Items 3, 4 and 5 (see the module docstring)."""
    needs = sorted({NEEDS[make_recipe(n).dataset] for n in a.names if make_recipe(n).dataset in NEEDS})
    root = gpu_stage.data_root(needs, a.stage) if needs else a.stage / "data"
    cmd = [sys.executable, "-m", "capsule_lib.train.speedrun", "--minutes", str(a.minutes), "--out", str(call.work)]
    cmd += ["--overwrite", "--offline", "--data-root", str(root), *a.names, *rest]
    cmd += [*(f"--set={kv}" for kv in a.set), *(["--quick", "--device", "cpu"] if a.quick else [])]
    (code,) = call.run([cmd], a.minutes + 1.0, "speedrun")
    result_file = call.work / "speedrun.json"
    if result_file.is_file():
        result = json.loads(result_file.read_text())
        call.record["runs"] = [r for r in result["runs"] if "metrics" in r]
        if a.flops:
            call.record["flops"] = flops_report(result, call.work, call._dev())
    call.record["exit_code"] = code
    return 0 if code == DID_NOT_LEARN_EXIT and a.quick else code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="what comes back (default: $OUT)")
    shm = Path("/dev/shm")
    default_work = (shm if shm.is_dir() and os.access(shm, os.W_OK) else Path("/tmp")) / "gpu_items"
    ap.add_argument("--work", type=Path, default=default_work, help="the scratch folder (emptied first)")
    ap.add_argument("--stage", type=Path, default=REPO / "stage", help="the staged pieces (gpu_stage.py)")
    ap.add_argument("--quick", action="store_true", help="tiny, on the CPU: a check of the command")
    sub = ap.add_subparsers(dest="item", required=True)
    t = sub.add_parser("tsai", help="item 1: Tsai et al.'s network on CIFAR-10, resumable over slots")
    t.add_argument("--budget", type=float, default=8.0, help="the run's training minutes over all its parts")
    t.add_argument("--minutes", type=float, default=None, help="this call's training minutes (default budget + 0.5)")
    t.add_argument("--tag", default=None, help="checkpoint name suffix (default gpu, or quick)")
    c = sub.add_parser("critique", help="item 2: the critique's MNIST runs near convergence")
    c.add_argument("--minutes", type=float, default=8.5, help="this call's training minutes")
    c.add_argument("--workers", type=int, default=4, help="runs trained side by side on the one GPU")
    c.add_argument("--only", nargs="+", default=["critique_mnist_"], help="runs whose name contains one of these")
    c.add_argument("--budget", nargs="+", default=["epochs=10", "train_subset=null", "device=cuda"])
    s = sub.add_parser("speedrun", help="items 3, 4 and 5: the speedrun command, optionally with FLOP/s")
    s.add_argument("minutes", type=float, help="the speedrun's minutes")
    s.add_argument("names", nargs="+", metavar="RECIPE", help="speedrun recipes")
    s.add_argument("--flops", action="store_true", help="one step's FLOPs and the achieved FLOP/s per run")
    for p in (t, c):
        p.add_argument("--resume", action="store_true", help="go on from the staged piece r (an earlier call's files)")
    for p in (t, c, s):
        p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="recipe fields")
    a, rest = ap.parse_known_args(argv)
    if rest and a.item != "speedrun":
        gpu_stage.fail(f"unrecognised arguments: {' '.join(rest)} (see --help)", prog="gpu_items.py")
    if a.out is None:
        gpu_stage.fail("give --out DIR or set OUT (the folder whose files come back)", prog="gpu_items.py")
    _sets(a.set)
    _check_arguments(a)
    call = Call(a.item, a.out, a.work, a.quick, argv)
    items = {"tsai": tsai, "critique": critique, "speedrun": lambda a, call: speedrun(a, rest, call)}
    try:
        code = items[a.item](a, call)
    finally:
        call.sync()
    print(f"gpu_items.py: {a.item} done in {call.record['wall_s']:.0f} s, exit {code}; {sorted(os.listdir(a.out))}")
    return code


if __name__ == "__main__":
    sys.exit(main())
