"""The tools of ``make test`` (#32) and the GPU check (#36): the notebook executor whose executions the book build
reuses, the record of CI step times, and ``benchmarks/gpu.py`` run on the CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


execute = _load(REPO / "book" / "_tools" / "execute.py", "execute_under_test")
ci_times = _load(REPO / "benchmarks" / "ci_times.py", "ci_times_under_test")


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_the_executor_executes_every_chapter_of_the_toc():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    listed = {REPO / f"{f}.ipynb" for f in files if (REPO / f"{f}.ipynb").exists()}
    assert set(execute.chapters()) == listed and len(listed) >= 8


def test_a_page_with_two_stand_in_notices_fails_the_offline_step(tmp_path, monkeypatch):
    """One notice per page: the offline execution of a page fails when its outputs say twice that data is missing
    (dataset banners do not count)."""
    notice = "[GENERATED stand-in data] mnist is not here (offline mode): this page runs on generated stand-ins."
    banner = "[GENERATED stand-in data] glyph_digits/test: 64 images (1, 28, 28). synthetic digits"
    layer = "[GENERATED stand-in data] mnist is not available here (offline mode): using 'glyph_digits' instead."
    (tmp_path / "book").mkdir()
    one = _notebook(tmp_path / "book" / "one.ipynb", f"print({notice!r})", f"print({banner!r})")
    two = _notebook(tmp_path / "book" / "two.ipynb", f"print({notice!r})", f"print({layer!r})")
    monkeypatch.setattr(execute, "PAPERMILL_OUT", tmp_path / "out")
    monkeypatch.setattr(execute, "REPO", tmp_path)
    jobs = {nb.stem: execute.Job("offline", nb) for nb in (one, two)}
    for job in jobs.values():
        execute._run_offline(job, 1, tmp_path / f"{job.notebook.stem}.log", tmp_path)
    assert jobs["one"].ok, jobs["one"].error
    assert not jobs["two"].ok and jobs["two"].error.startswith("2 stand-in notices on one page")


@pytest.mark.slow
def test_a_book_execution_is_what_the_book_build_reads_from_its_cache(tmp_path, monkeypatch):
    """The executed notebook lands in the jupyter-cache under the key myst-nb looks it up by (a cache hit, so the
    strict build does not execute it again); a notebook that raises is reported with its cell and not cached."""
    from jupyter_cache import get_cache
    from myst_nb.core.read import standard_nb_read

    monkeypatch.setattr(execute, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(execute, "REPO", tmp_path)
    (tmp_path / "book").mkdir()
    good = _notebook(tmp_path / "book" / "good.ipynb", "x = 6 * 7", "print(x)")
    bad = _notebook(tmp_path / "book" / "bad.ipynb", "y = 1", "raise ValueError('on purpose')")
    jobs = [execute.Job("book", good), execute.Job("book", bad)]
    for job in jobs:
        execute._run_book(job, 1, tmp_path / f"{job.notebook.stem}.log")
    assert jobs[0].ok and not jobs[0].error
    assert not jobs[1].ok and "raise ValueError('on purpose')" in jobs[1].error and "ValueError" in jobs[1].error
    cache = get_cache(str(tmp_path / "cache"))
    record = cache.match_cache_notebook(standard_nb_read(good.read_text()))  # the lookup myst-nb does
    outputs = cache.get_cache_bundle(record.pk).nb.cells[1].outputs
    assert outputs[0]["text"] == "42\n"
    with pytest.raises(KeyError):
        cache.match_cache_notebook(standard_nb_read(bad.read_text()))


def test_a_job_whose_kernel_failed_to_start_runs_again_and_a_failing_notebook_does_not(tmp_path, monkeypatch):
    """Two kernels started at once can race for one TCP port; such a job is started once more (CI saw it: ZMQError
    'Address already in use' then "Kernel didn't respond"), while a notebook's own error is reported at once."""
    calls = []

    def fake_run_book(job, threads, log):
        calls.append(job.notebook.stem)
        if job.notebook.stem == "raced" and calls.count("raced") == 1:
            log.write_text("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:40021')\n")
            job.error = f"the executor exited with 1 (log: {log})"
        elif job.notebook.stem == "broken":
            log.write_text("ValueError: on purpose\n")
            job.error = "cell 2: ValueError: on purpose"
        else:
            log.write_text("")
            job.ok = True

    monkeypatch.setattr(execute, "_run_book", fake_run_book)
    monkeypatch.setattr(execute, "REPO", tmp_path)
    jobs = {n: execute.Job("book", tmp_path / "book" / f"{n}.ipynb") for n in ("raced", "broken")}
    for name, job in jobs.items():
        execute.run_job(job, 1, tmp_path / f"{name}.log", tmp_path)
    assert jobs["raced"].ok and not jobs["raced"].error and calls.count("raced") == 2
    assert not jobs["broken"].ok and jobs["broken"].error == "cell 2: ValueError: on purpose"
    assert calls.count("broken") == 1


def test_jobs_run_longest_first_by_the_last_recorded_run(tmp_path):
    record = tmp_path / "ci_times.json"
    record.write_text(
        json.dumps({"runs": [{"notebooks_s": {"book:a.ipynb": 5}}, {"notebooks_s": {"book:a.ipynb": 9}}]})
    )
    assert execute.previous_times(record) == {"book:a.ipynb": 9.0}
    assert execute.previous_times(tmp_path / "missing.json") == {}
    committed = execute.previous_times()  # the committed record names jobs the executor makes
    names = {execute.Job(p, nb).name for p in execute.PATHS for nb in execute.chapters()}
    assert committed and set(committed) <= names


def test_ci_times_appends_a_run_with_its_machine_and_commit(tmp_path):
    clone = tmp_path / "clone"
    logs = clone / "_build" / "test-logs"
    logs.mkdir(parents=True)
    run = {"steps_s": {"0 lint": 1, "1 unit tests": 300}, "total_s": 301, "passed": True, "notebooks_s": {}}
    (logs / "ci_times.json").write_text(json.dumps(run))
    record = tmp_path / "record.json"
    for note in ("first", "second"):
        ci_times.add_run(logs / "ci_times.json", note, record)
    runs = json.loads(record.read_text())["runs"]
    assert [r["note"] for r in runs] == ["first", "second"]
    assert runs[-1]["total_s"] == 301 and runs[-1]["machine"]["cores"] >= 1 and "commit" in runs[-1]


def test_the_committed_ci_times_show_each_run_and_its_steps():
    runs = json.loads((REPO / "benchmarks" / "results" / "ci_times.json").read_text())["runs"]
    for r in runs:
        assert r["total_s"] == pytest.approx(sum(r["steps_s"].values()), abs=len(r["steps_s"]) + 5)
        assert {"date", "commit", "machine", "unit_tests", "notebooks_s"} <= set(r)


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu_quick(tmp_path):
    """``benchmarks/gpu.py --device cpu --quick``: every recipe's step timed in fp32 and bf16 (and compiled for the
    first), every routing's float32 outputs and gradients checked against float64, the JSON written."""
    gpu = _load(REPO / "benchmarks" / "gpu.py", "gpu_under_test")
    out = tmp_path / "gpu_cpu_quick.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick", "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=900, cwd=tmp_path)
    data = json.loads(out.read_text())
    assert data["quick"] and data["machine"]["device"] == "cpu" and data["epoch"] == {"skipped": "--quick"}
    assert list(data["steps"]) == list(gpu.RECIPES)
    for name, row in data["steps"].items():
        for mode in ("fp32", "bf16"):
            assert row[mode]["ms"] > 0 and row[mode]["peak_mb"] > 0, (name, mode, row[mode])
    first = data["steps"][gpu.RECIPES[0]]["compiled"]
    assert first["ms"] > 0 and first["compile_and_warmup_s"] > 0
    from capsule_lib.routing.kinds import ROUTING_KINDS

    assert set(data["agreement"]) == set(ROUTING_KINDS)
    for kind, row in data["agreement"].items():  # float32 against float64 on the CPU
        assert row["tolerance_met"] is not None and row["tolerance_met"] <= 1e-3, (kind, row)


def test_the_appendix_gpu_epoch_times_come_from_the_shipped_histories():
    """The running appendix quotes the H200 epoch times of the GPU-trained checkpoints: they must be the medians of
    the epoch times their shipped histories record."""
    import re
    import statistics

    from capsule_lib.pretrained import load_pretrained_history

    text = (REPO / "book" / "appendix" / "running.md").read_text()
    quoted = re.search(
        r"([\d.]+) s for CapsNet at batch (\d+) and ([\d.]+) s for\s+Efficient-CapsNet at batch (\d+)", text
    )
    assert quoted, "the appendix no longer quotes the GPU epoch times"
    for name, seconds, batch in (
        ("capsnet_mnist_gpu", quoted[1], quoted[2]),
        ("efficient_capsnet_mnist_gpu", quoted[3], quoted[4]),
    ):
        h = load_pretrained_history(name)
        times = [r["epoch_time"] for r in h.records if not r.get("partial")]
        assert f"{statistics.median(times):.1f}" == seconds and h.meta["config"]["batch_size"] == int(batch), name
        assert h.meta["hardware"] == "NVIDIA H200"
