"""Train the runs of the chapter "Do capsules need routing?" (:func:`capsule_lib.routing_critique.critique_runs`)
and record what each reached: ``runs/critique/<name>/result.json`` per run, then (``--collect``) one
``capsule_lib/checkpoints/critique_runs.json`` (shipped with the checkpoints) that the chapter reads.

Several workers can share the queue (each claims a run by creating ``<name>.claim``); a run whose ``result.json``
exists is skipped. Every run: one torch thread, the protocol of :data:`capsule_lib.routing_critique.CRITIQUE_BUDGET`,
trained and evaluated by :func:`capsule_lib.routing_critique.train_run` (what the chapter calls with ``TRAIN`` on).
``--collect`` merges the new results into the shipped records (a new record replaces the one of the same name:
:func:`capsule_lib.routing_critique.merge_records`).

    python benchmarks/critique_runs.py --data-root $CAPSULE_DATA          # one worker (start two on two cores)
    python benchmarks/critique_runs.py --only critique_norb_ _scaled_      # only runs whose name contains one of these
    python benchmarks/critique_runs.py --collect

Another budget (e.g. near convergence on a GPU) goes to its own folder and records, never over the shipped ones:

    python benchmarks/critique_runs.py --only critique_mnist_ --set epochs=10 train_subset=null device=cuda \
        --runs-dir runs/critique_converged
    python benchmarks/critique_runs.py --collect --runs-dir runs/critique_converged \
        --records benchmarks/results/critique_runs_converged.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from capsule_lib.routing_critique import CRITIQUE_RECORDS, critique_runs, merge_records, recorded_runs, train_run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = CRITIQUE_RECORDS  # capsule_lib/checkpoints/critique_runs.json: shipped with the checkpoints


def worker(data_root: str | None, only: list[str] | None, base: Path, overrides: dict) -> None:
    torch.set_num_threads(1)
    base.mkdir(parents=True, exist_ok=True)
    runs = sorted(critique_runs(), key=lambda r: (r.seed, r.dataset != "mnist"))  # a whole seed first
    for run in runs:
        if only and not any(part in run.name for part in only):
            continue
        out = base / run.name
        if (out / "result.json").exists():
            continue
        try:
            os.mkdir(base / f"{run.name}.claim")
        except FileExistsError:
            continue
        rec = train_run(run, data_root, out_dir=out, **overrides)
        (out / "result.json").write_text(json.dumps(rec, indent=1))
        print(
            f"{run.name}: test {rec.get('test_acc', rec.get('test_novel_acc')):.4f} in {rec['total_seconds']:.0f} s",
            flush=True,
        )


def collect(base: Path, records: Path) -> None:
    new = [json.loads(p.read_text()) for p in sorted(base.glob("*/result.json"))]
    old = recorded_runs(records) if records.exists() else {}
    out = {"protocol": "capsule_lib.routing_critique.CRITIQUE_BUDGET", **merge_records(old, new)}
    records.write_text(json.dumps(out, indent=1))
    print(f"{len(out['rows'])} runs ({len(new)} new) -> {records}; missing {len(out['missing'])}")


def _overrides(pairs: list[str]) -> dict:
    """``key=value`` recipe fields, the values read as JSON where they parse (``null``, numbers), else strings."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes key=value pairs, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", default=os.environ.get("CAPSULE_DATA"))
    ap.add_argument("--only", nargs="+", help="train only the runs whose name contains one of these")
    ap.add_argument("--collect", action="store_true", help="merge the runs' results into the records")
    ap.add_argument("--set", nargs="+", default=[], help="recipe fields for every run, key=value (another budget)")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "critique"), help="where the runs and results go")
    ap.add_argument("--records", default=str(RESULTS), help="the records --collect writes (default: the shipped ones)")
    a = ap.parse_args()
    if a.collect:
        collect(Path(a.runs_dir), Path(a.records))
    else:
        worker(a.data_root, a.only, Path(a.runs_dir), _overrides(a.set))
