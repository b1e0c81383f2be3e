"""Execute every chapter once per data path, several at a time: the notebook step of ``make test``.

Two executions of each chapter notebook, and no more:

* **book**: the chapter as the book shows it (parameters as committed: ``TRAIN`` off, full size) on the data under
  ``CAPSULE_DATA``, executed exactly as Jupyter Book's cache mode would execute it (jupyter-cache's
  ``single_nb_execution`` in the notebook's folder) and stored in the book's execution cache
  (``_build/.jupyter_cache``). The strict book build that follows (``jupyter-book build . --all -W -n``) finds
  every chapter there and executes nothing again: its pages show these outputs. A chapter that raises is not
  cached; the book build then executes it once more and fails on it with its own report
  (``book/_tools/build_report.py``).
* **offline**: the chapter under papermill with ``-p SMOKE True``, an empty data root and ``CAPSULE_OFFLINE=1``, so
  it runs entirely on generated stand-ins (executed copies in ``_build/papermill/``).

Jobs run ``--jobs`` at a time (default: the number of CPUs), longest first by the durations of the previous run
(``benchmarks/results/ci_times.json``), each in a process of its own; a notebook's kernel uses
``cpus / jobs`` intra-op threads (``OMP_NUM_THREADS``), so concurrent kernels do not oversubscribe the cores.
Timings printed by a chapter executed here are therefore taken next to another job: ``make book`` executes the
chapters one at a time, for the reference timings. ``book/_tools/cache_guard.py`` runs first (it clears a cache
made by other code, packages or ``CAPSULE_*`` settings).

    .venv/bin/python book/_tools/execute.py [--paths book,offline] [--jobs N] [--times out.json] [NOTEBOOK ...]

Exit status 1 if any execution failed (each failure printed with its notebook, failing cell and error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "_build"
CACHE = BUILD / ".jupyter_cache"
PAPERMILL_OUT = BUILD / "papermill"
TIMES = REPO / "benchmarks" / "results" / "ci_times.json"
TIMEOUT_S = 900  # per cell, as execute.timeout in _config.yml and the papermill step
PATHS = ("book", "offline")
sys.path.insert(0, str(Path(__file__).parent))  # build_report, cache_guard: the book build's own tools


@dataclass
class Job:
    path: str  # "book" or "offline"
    notebook: Path  # absolute
    seconds: float = 0.0
    ok: bool = False
    error: str = ""

    @property
    def name(self) -> str:
        return f"{self.path}:{self.notebook.relative_to(REPO / 'book').as_posix()}"


def chapters() -> list[Path]:
    """Every notebook under ``book/`` (the same list as ``_toc.yml``: tests/test_book.py checks it)."""
    return sorted(p for p in (REPO / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def _kernel_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def _run_book(job: Job, threads: int, log: Path) -> None:
    """Execute in a child process (``--one``), then store the executed notebook in the book's cache."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "executed.ipynb"
        cmd = [sys.executable, __file__, "--one", str(job.notebook), "--to", str(out)]
        with log.open("w") as fh:
            rc = subprocess.run(cmd, env=_kernel_env(threads), stdout=fh, stderr=subprocess.STDOUT).returncode
        result = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
        if rc != 0 or result.get("error"):
            job.error = result.get("error") or f"the executor exited with {rc} (log: {log})"
            return
        import nbformat

        nb = nbformat.read(out, as_version=4)
        cache = get_cache(str(CACHE))
        cache.cache_notebook_bundle(
            CacheBundleIn(nb, str(job.notebook), data={"execution_seconds": result["seconds"]}),
            check_validity=False,
            overwrite=True,
        )
        job.ok = True


def _run_offline(job: Job, threads: int, log: Path, empty_root: Path) -> None:
    out = PAPERMILL_OUT / job.notebook.relative_to(REPO / "book")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        *(str(Path(sys.executable).with_name("papermill")), str(job.notebook), str(out)),
        *("-p", "SMOKE", "True", "--cwd", str(job.notebook.parent), "--kernel", "python3"),
        *("--no-progress-bar", "--execution-timeout", str(TIMEOUT_S), "--log-level", "WARNING"),
    ]
    env = _kernel_env(threads, {"CAPSULE_DATA": str(empty_root), "CAPSULE_OFFLINE": "1"})
    with log.open("w") as fh:
        rc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    job.ok = rc == 0
    if not job.ok:
        job.error = _summary(log.read_text(errors="replace"))
    elif len(notices := stand_in_notices(json.loads(out.read_text()))) > 1:
        job.ok = False
        job.error = f"{len(notices)} stand-in notices on one page (one, at the top, is enough): {notices}"


#: a page's notice (capsule_lib.notebook) or the data layer's line (capsule_lib.data.get_dataset) that a dataset is
#: replaced by a generated stand-in; dataset banners ("[GENERATED stand-in data] glyph_digits/test: ...") are not
NOTICE = re.compile(r"\[GENERATED stand-in data\] [^\n]*? is not (?:here|available here)")


def stand_in_notices(nb: dict) -> list[str]:
    """Every stand-in notice in an executed notebook's outputs (``make test`` allows one per page)."""
    found = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            found += [m[:70] for m in NOTICE.findall(text if isinstance(text, str) else "".join(text))]
    return found


def _summary(text: str) -> str:
    from build_report import summarize  # the book build's report format

    return summarize(text)


def execute_one(notebook: Path, to: Path) -> int:
    """Child process of a book job: execute ``notebook`` as myst-nb's cache mode does, write it to ``to`` and
    ``{seconds, error}`` next to it."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(notebook, as_version=4)
    result = single_nb_execution(nb, cwd=str(notebook.parent), timeout=TIMEOUT_S, allow_errors=False)
    error = _summary(result.exc_string) if result.err is not None else ""
    nbformat.write(result.nb, to)
    to.with_suffix(".json").write_text(json.dumps({"seconds": result.time, "error": error}))
    return 0


#: a kernel that died while it started, before the notebook ran: jupyter_client picks free TCP ports and the kernel
#: binds them a moment later, so two kernels started at once can race for one port ("Address already in use")
KERNEL_START_FAILURE = re.compile(
    r"zmq\.error\.ZMQError: Address already in use|Kernel didn't respond in \d+ seconds|Kernel died before replying"
)


def kernel_start_failed(log: Path) -> bool:
    """Whether ``log`` shows the kernel failing to start (nothing of the notebook ran)."""
    return log.exists() and KERNEL_START_FAILURE.search(log.read_text(errors="replace")) is not None


def run_job(job: Job, threads: int, log: Path, empty_root: Path, attempts: int = 2) -> None:
    """Execute one job; a job whose kernel failed to start is started again (up to ``attempts`` times in all), any
    other failure is reported as it is."""
    for attempt in range(1, attempts + 1):
        job.ok, job.error = False, ""
        try:
            if job.path == "book":
                _run_book(job, threads, log)
            else:
                _run_offline(job, threads, log, empty_root)
        except Exception as e:  # the step reports it like a failed notebook
            job.error = f"{type(e).__name__}: {e}"
        if job.ok or attempt == attempts or not kernel_start_failed(log):
            return
        print(f"execute: {job.name}: the kernel failed to start (log: {log}); starting it again", flush=True)


def previous_times(path: Path = TIMES) -> dict[str, float]:
    """``{job name: seconds}`` of the latest run recorded in ``benchmarks/results/ci_times.json`` (empty if none)."""
    try:
        runs = json.loads(path.read_text())["runs"]
        return {k: float(v) for k, v in runs[-1].get("notebooks_s", {}).items()}
    except (OSError, ValueError, KeyError, IndexError, AttributeError, TypeError):
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated: book, offline")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--times", type=Path, default=None, help="write {job: seconds} here (JSON)")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        return execute_one(a.one.resolve(), a.to)
    paths = [p for p in a.paths.split(",") if p]
    if unknown := set(paths) - set(PATHS):
        ap.error(f"unknown path(s) {sorted(unknown)}; expected {PATHS}")
    if a.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {a.jobs}")
    notebooks = [n.resolve() for n in a.notebooks] or chapters()
    if "book" in paths:
        import cache_guard

        cache_guard.main([])
    known = previous_times()
    jobs = [Job(p, nb) for p in paths for nb in notebooks]
    jobs.sort(key=lambda j: -known.get(j.name, j.notebook.stat().st_size / 1e3))  # longest first
    threads = max(1, (os.cpu_count() or 1) // a.jobs)
    logs = BUILD / "test-logs" / "notebooks"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"execute: {len(jobs)} execution(s) ({', '.join(paths)}), {a.jobs} at a time, {threads} thread(s) each")

    with tempfile.TemporaryDirectory() as empty_root:

        def run(job: Job) -> Job:
            t0 = time.perf_counter()
            log = logs / (job.name.replace("/", "_").replace(":", "__") + ".log")
            run_job(job, threads, log, Path(empty_root))
            job.seconds = time.perf_counter() - t0
            status = "ok" if job.ok else "FAILED"
            print(f"execute: {job.name:38s} {job.seconds:7.1f} s  {status}", flush=True)
            return job

        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            done = list(pool.map(run, jobs))

    failed = [j for j in done if not j.ok]
    for j in failed:
        print(f"execute: FAILED {j.name}\n  {j.error}")
    if a.times is not None:
        a.times.parent.mkdir(parents=True, exist_ok=True)
        a.times.write_text(json.dumps({j.name: round(j.seconds, 1) for j in done}, indent=1) + "\n")
    total = sum(j.seconds for j in done)
    print(f"execute: {len(done) - len(failed)} of {len(done)} executed ({total:.0f} s of executions)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
