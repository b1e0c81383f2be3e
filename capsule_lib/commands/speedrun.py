"""``python -m capsule_lib.train.speedrun --minutes M --out DIR [RECIPE ...]``: the speedrun recipes one after another
inside ``M`` minutes, each exported, with ``DIR/speedrun.json`` (what :func:`~capsule_lib.train.timed.run_speedrun`
does, and writes, is described there)::

    python -m capsule_lib.train.speedrun --minutes 9 --out runs/speedrun capsnet_speedrun efficient_speedrun
    python -m capsule_lib.train.speedrun --minutes 1 --out runs/speedrun_quick --device cpu --quick   # the tests

The defaults of ``--data-root`` and ``--offline`` are ``CAPSULE_DATA`` / ``CAPSULE_OFFLINE``, read by
:func:`capsule_lib.notebook.environment`.

Layering: a command (:mod:`capsule_lib.commands`, the top layer; nothing imports it);
``capsule_lib/train/speedrun.py`` holds nothing but the call of :func:`main`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..train.recipes.speedrun import SPEEDRUNS
from ..train.timed import run_speedrun
from ._arguments import add_data_arguments, data_defaults, overrides

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m capsule_lib.train.speedrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = [c.name for c in SPEEDRUNS]
    p.add_argument(
        "names",
        nargs="*",
        default=[],
        metavar="RECIPE",
        help=f"speedrun recipes, in order (default: all: {', '.join(names)})",
    )
    p.add_argument("--minutes", type=float, required=True, help="the whole command's time, minutes")
    p.add_argument("--out", required=True, help="output folder (runs/, checkpoints/, speedrun.json)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    add_data_arguments(p)
    p.add_argument("--quick", action="store_true", help="tiny runs: a check of the command, not a measurement")
    p.add_argument("--tag", default=None, help="checkpoint name suffix (default: gpu, cpu or quick)")
    p.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe field set in every run, as JSON (repeat: --set amp=bf16 --set compile=null)",
    )
    return p


def main(argv: list[str] | None = None, *, data_root: str | Path | None = None, offline: bool | None = None) -> None:
    """The command line (see the module docstring); ``argv``, ``data_root`` and ``offline`` as in
    :func:`capsule_lib.commands.train.main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    a = p.parse_args(argv)
    if not a.minutes > 0:
        p.error(f"--minutes must be > 0, got {a.minutes}")
    unknown = [n for n in a.names if n not in {c.name for c in SPEEDRUNS}]
    if unknown:
        p.error(f"not a speedrun recipe: {', '.join(unknown)} (choose from {', '.join(c.name for c in SPEEDRUNS)})")
    if a.threads:
        torch.set_num_threads(a.threads)
    names = a.names or [c.name for c in SPEEDRUNS]
    sets = overrides(p, a.set)  # parsed (JSON) and checked by make_recipe, for each recipe
    a.data_root, a.offline = data_defaults(a, data_root, offline)
    result = run_speedrun(
        names,
        a.minutes,
        a.out,
        device=a.device,
        data_root=a.data_root,
        offline=a.offline,
        quick=a.quick,
        tag=a.tag,
        argv=argv,
        overrides=sets,
    )
    done = [r["recipe"] for r in result["runs"] if "metrics" in r]
    missed = [
        f"{r['recipe']} ({'failed' if 'error' in r else 'skipped'})" for r in result["runs"] if "metrics" not in r
    ]
    print(
        f"speedrun: {len(done)} of {len(names)} runs done in {result['wall_s']:.0f} s; {Path(a.out) / 'speedrun.json'}"
        + (f"; not done: {', '.join(missed)}" if missed else "")
    )
