"""Keep Jupyter Book's execution cache honest.

jupyter-cache keys an executed notebook on its code cells only. A change in ``capsule_lib`` (its code, and its
shipped checkpoints and registry), in the installed packages or in the ``CAPSULE_*`` environment would
otherwise leave the book showing outputs of older code or older weights.
This script hashes all of those; when the hash differs from the one stored next to the cache, it deletes the
cache (``_build/.jupyter_cache``), the executed copies (``_build/jupyter_execute``) and Sphinx's saved
environment (``_build/.doctrees``; without it Sphinx would not re-read, hence not re-execute, an unchanged
notebook), so the next build executes every chapter again. Run by ``make book`` and ``make test``.

    .venv/bin/python book/_tools/cache_guard.py [--build _build]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_KEYS = ("CAPSULE_DATA", "CAPSULE_OFFLINE", "CAPSULE_SMOKE")


def fingerprint(repo: Path | None = None) -> str:
    """sha256 over every file of capsule_lib (sources, checkpoints, registry, histories), requirements.txt,
    pyproject.toml, installed distributions and the CAPSULE_* environment variables (``repo`` defaults to
    this repository)."""
    repo = repo or REPO
    h = hashlib.sha256()
    lib = sorted(
        f
        for f in (repo / "capsule_lib").rglob("*")
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
    )
    files = lib + [repo / "requirements.txt", repo / "pyproject.toml"]
    for f in files:
        if f.is_file():
            h.update(f.relative_to(repo).as_posix().encode())
            h.update(f.read_bytes())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions() if d.metadata["Name"])
    h.update("\n".join(dists).encode())
    for k in ENV_KEYS:
        h.update(f"{k}={os.environ.get(k, '')}".encode())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "_build"))
    args = ap.parse_args(argv)
    build = Path(args.build)
    key_file = build / ".jupyter_cache.key"
    new = fingerprint()
    old = key_file.read_text().strip() if key_file.exists() else None
    if old != new:
        stale = [p for p in (build / ".jupyter_cache", build / "jupyter_execute", build / ".doctrees") if p.exists()]
        for p in stale:
            shutil.rmtree(p)
        if stale:
            print(
                "cache_guard: capsule_lib, packages or CAPSULE_* changed -> cleared the execution cache; "
                "every chapter will be executed again"
            )
        build.mkdir(parents=True, exist_ok=True)
        key_file.write_text(new + "\n")
    else:
        print("cache_guard: execution cache matches the current code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
