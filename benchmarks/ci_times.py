"""Keep the step times of clean-clone ``make test`` runs, so the trend of CI's duration is visible.

``make test`` writes ``_build/test-logs/ci_times.json`` (each step's seconds, the total, every notebook
execution's seconds, the unit tests' summary line). After a clean-clone run (``bash .ci/run`` in a fresh clone),
add it to the committed record with the machine, the commit and the date::

    python benchmarks/ci_times.py <clone>/_build/test-logs/ci_times.json --note "after #32"

``benchmarks/results/ci_times.json`` holds ``{"runs": [...]}``, oldest first; ``book/_tools/execute.py`` orders the
notebook executions longest first by the latest run's notebook times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORD = HERE / "results" / "ci_times.json"
sys.path.insert(0, str(HERE.parent))


def machine() -> dict[str, object]:
    """The CPU (``capsule_lib.cost.machine_info``), its cores and whether it has AVX-512 and native bf16."""
    from capsule_lib.cost import machine_info

    flags = ""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": machine_info("cpu")["device_name"],
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
    }


def commit(repo: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def add_run(times_file: Path, note: str = "", record: Path = RECORD) -> dict:
    """Append the run in ``times_file`` (a clone's ``_build/test-logs/ci_times.json``) to ``record``."""
    run = json.loads(times_file.read_text())
    clone = times_file.resolve().parents[2]
    entry = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit(clone),
        "machine": machine(),
        "note": note,
        **run,
    }
    data = json.loads(record.read_text()) if record.exists() else {"runs": []}
    data["runs"].append(entry)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(data, indent=1) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("times", type=Path, help="a clone's _build/test-logs/ci_times.json")
    ap.add_argument("--note", default="")
    ap.add_argument("--record", type=Path, default=RECORD)
    a = ap.parse_args(argv)
    entry = add_run(a.times, a.note, a.record)
    print(json.dumps({k: entry[k] for k in ("date", "commit", "total_s", "steps_s")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
