"""Reading a folder of the reader's own images (issues #58, #64): 50,000 small PNGs decoded into the library's tensor
cache and read back from it, with the time and the peak memory of each, and what keying the cache by the files'
contents costs.

    .venv/bin/python benchmarks/image_folder.py --out benchmarks/results/image_folder_cpu.json
    .venv/bin/python benchmarks/image_folder.py --quick --out /tmp/q.json       # seconds: the tests run it

The PNGs are written to a temporary folder (deleted afterwards, never committed) in the ``ImageFolder`` layout: the
50,000 training images of CIFAR-10 (``train_full``) when the data root has them, else as many generated colour shapes
(the CIFAR-10 stand-in), 32 x 32 RGB, one folder per class (:func:`capsule_lib.data.image_files.write_image_folder`).
Each measurement runs in a fresh Python process (imports not timed); recorded: its memory once the libraries are
loaded (PSS), its peak resident memory (``getrusage``), and the peak of the process and its live worker processes
together (PSS, sampled every 20 ms):

* ``cold``: no cache yet: the folder listed, sizes sampled, every file decoded in worker processes
  (:func:`capsule_lib.data.image_facts`), then the training split taken and the cache written
  (:func:`capsule_lib.data.get_dataset`), as ``train()`` does on a run's first start;
* ``cached``: the same calls in a new process with the cache written by ``cold``: the files listed and stat-ed,
  their digests taken from the index ``cold`` kept (a file whose stat changed is read and hashed again: the cache's
  key, :func:`capsule_lib.data.image_folder.file_digest`), the cache read and checked (sha256 of its pixels);
* ``key`` (#64): the cache's key alone, in a new process: ``stat_s`` the key of before #64 (every file's size and
  modification time), ``content_s`` today's without remembered digests (every file's whole content hashed,
  BLAKE2b), ``content_again_s`` the same key computed again in that process (the digests remembered while the
  files' stat is unchanged: what each further ``get_dataset`` call of a run costs), ``indexed_s`` the key in a new
  process with the digests the ``cold`` run kept beside the cache (``file_digests.npz``: the files stat-ed, none
  read), ``sample_s`` the alternative not taken (size, modification time and the first and last 4 KiB of each file:
  a PNG of CIFAR-10 is smaller than that, so it reads whole files too);
* ``decode`` (one per ``--workers``): :func:`capsule_lib.data.image_files.decode_files` alone, with that many worker
  processes (0: in the process itself).

The files were just written, so the operating system's page cache holds them (a first read from a cold disk is
slower by the disk's reading time); ``--drop-page-cache`` empties it first (root only; the JSON says whether it was).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class _Sampler(threading.Thread):
    """The largest memory of this process and its live child processes (the decoding workers) together, sampled every
    20 ms while a measurement runs: the sum of their proportional set sizes (PSS: a page shared by the forked workers
    with their parent is counted once; psutil)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = 0, threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self.done.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_full_info().pss
                except psutil.Error:  # a worker that just ended
                    pass
            self.peak = max(self.peak, total)
            self.done.wait(0.02)


def _measure(phase: str, folder: str, cache: str, workers: int) -> dict:
    """One measurement, in this (fresh) process."""
    import PIL.Image  # noqa: F401  (imports are not timed: the library imports these on first use)
    import psutil
    import torch
    import torchvision.datasets.folder  # noqa: F401
    import torchvision.transforms.functional  # noqa: F401

    from capsule_lib.data import DataSource, get_dataset, image_facts
    from capsule_lib.data.image_files import decode_files, list_image_files

    torch.set_num_threads(1)
    before = psutil.Process().memory_full_info().pss / 2**20  # the libraries loaded, nothing read yet
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    if phase == "key":
        out = _key_costs(folder, cache)
        sampler.done.set()
        sampler.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
        out.update(memory_before_mb=round(before, 1), peak_rss_mb=round(own, 1))
        out["peak_with_workers_mb"] = round(sampler.peak / 2**20, 1)
        return out
    if phase == "decode":
        done = decode_files(list_image_files(folder), 32, workers=workers)
        n, stored = done.images.shape[0], f"decode_files(workers={workers})"
    else:
        source = DataSource(cache=cache)
        stored = image_facts(f"images:{folder}", source).record["stored"]  # decoded now, or read from the cache
        n = len(get_dataset(f"images:{folder}", source, "train"))
    seconds = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    return {
        "phase": phase,
        "workers": workers if phase == "decode" else "default",
        "seconds": round(seconds, 2),
        "images": n,
        "how": stored,
        "memory_before_mb": round(before, 1),
        "peak_rss_mb": round(own, 1),
        "peak_with_workers_mb": round(sampler.peak / 2**20, 1),
    }


def _key_costs(folder: str, cache: str) -> dict:
    """The cache key's cost (the ``key`` phase): by stat only (before #64), by whole contents (first and again in the
    process), with the digests the cold run kept beside the cache, by a sample of each file's content."""
    import hashlib

    import capsule_lib.data.image_folder as image_folder
    from capsule_lib.data.image_folder import ImageSource, _key, _list_folder, load_digests

    src = ImageSource(folder)
    listing = _list_folder(src)
    files = listing["files"]
    t0 = time.perf_counter()
    h = hashlib.sha256()
    for path in files:
        st = os.stat(path)
        h.update(f"{path}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    stat_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for path in files:
        st = os.stat(path)
        with open(path, "rb") as f:
            head = f.read(4096)
            if st.st_size > 8192:
                f.seek(-4096, os.SEEK_END)
            tail = f.read(4096)
        h.update(hashlib.blake2b(head + tail, digest_size=16).digest())
    sample_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _key(src, listing, 32)
    content_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _key(src, listing, 32)
    again_s = time.perf_counter() - t0
    image_folder._DIGESTS.clear()  # as a new process: the index read, the files stat-ed
    t0 = time.perf_counter()
    load_digests(Path(cache))
    _key(src, listing, 32)
    indexed_s = time.perf_counter() - t0
    return {
        "phase": "key",
        "workers": "default",
        "seconds": round(content_s, 3),
        "images": len(files),
        "how": "the cache key: whole contents hashed (file_digest), first and again; stat only; a 4 KiB sample",
        "stat_s": round(stat_s, 3),
        "sample_s": round(sample_s, 3),
        "content_s": round(content_s, 3),
        "content_again_s": round(again_s, 3),
        "indexed_s": round(indexed_s, 3),
    }


def _drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _write_folder(n: int, folder: Path, data_root: str | None) -> dict:
    import torch

    from capsule_lib.data import DataSource, get_dataset
    from capsule_lib.data.image_files import write_image_folder

    try:
        ds = get_dataset("cifar10", DataSource(data_root, offline=True, standin=False), "train_full")
    except FileNotFoundError:
        ds = get_dataset("colour_shapes", DataSource(data_root, offline=True), "train", n=n)
    ds = ds.subset(torch.arange(min(n, len(ds))))
    t0 = time.perf_counter()
    write_image_folder(ds.images, ds.labels, ds.classes, folder)
    size = sum(f.stat().st_size for f in folder.rglob("*.png"))
    return {
        "source": ds.name,
        "generated": ds.generated,
        "files": len(ds),
        "write_s": round(time.perf_counter() - t0, 1),
        "folder_mb": round(size / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50_000, help="PNG files (default 50,000)")
    p.add_argument("--workers", default="0,2", help="worker counts of the decode-only runs (comma-separated)")
    p.add_argument(
        "--data-root", default=os.environ.get("CAPSULE_DATA"), help="where CIFAR-10 is (default $CAPSULE_DATA)"
    )
    p.add_argument("--out", required=True, help="the JSON file")
    p.add_argument("--quick", action="store_true", help="300 files: a check that the script works, not a measurement")
    p.add_argument(
        "--drop-page-cache",
        action="store_true",
        help="empty the OS page cache before the cold run (root; slows others)",
    )
    p.add_argument("--phase", help=argparse.SUPPRESS)  # internal: one measurement in a fresh process
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.phase:
        print(json.dumps(_measure(a.phase, a.folder, a.cache, int(a.workers))))
        return
    from capsule_lib.cost import machine_info

    n = 300 if a.quick else a.n
    work = Path(tempfile.mkdtemp(prefix="image_folder_bench_"))
    try:
        folder, cache = work / "images", work / "cache"
        result = {
            "machine": machine_info("cpu"),
            "quick": a.quick,
            "command": " ".join(sys.argv),
            **_write_folder(n, folder, a.data_root),
        }
        result["page_cache_dropped"] = _drop_page_cache() if a.drop_page_cache else False
        runs = []
        phases = [("cold", 0), ("cached", 0), ("key", 0)] + [("decode", int(w)) for w in a.workers.split(",")]
        for phase, workers in phases:
            cmd = [
                sys.executable,
                __file__,
                "--out",
                "-",
                "--phase",
                phase,
                "--folder",
                str(folder),
                "--cache",
                str(cache),
                "--workers",
                str(workers),
            ]
            done = subprocess.run(
                cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
        result["runs"] = runs
        result["cache_mb"] = round(sum(f.stat().st_size for f in cache.glob("*.pt")) / 2**20, 1)
        result["digest_index_mb"] = round(sum(f.stat().st_size for f in cache.glob("*.npz")) / 2**20, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
