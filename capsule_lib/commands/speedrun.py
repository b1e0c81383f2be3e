"""``python -m capsule_lib.train.speedrun --minutes M --out DIR [RECIPE ...]``: the speedrun recipes one after another
inside ``M`` minutes, each exported, with ``DIR/speedrun.json`` (what :func:`~capsule_lib.train.timed.run_speedrun`
does, and writes, is described there)::

    python -m capsule_lib.train.speedrun --minutes 9 --out runs/speedrun capsnet_speedrun efficient_speedrun
    python -m capsule_lib.train.speedrun --minutes 1 --out runs/speedrun_quick --device cpu --quick   # the tests

The defaults of ``--data-root`` and ``--offline`` are ``CAPSULE_DATA`` / ``CAPSULE_OFFLINE``, read by
:func:`capsule_lib.notebook.environment`.

Layering: a command (``capsule_lib.commands``, the top layer; nothing imports it);
``capsule_lib/train/speedrun.py`` holds nothing but the call of :func:`main`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .._checks import check_device
from ..train.recipes.speedrun import SPEEDRUNS
from ..train.timed import GONE_S, run_speedrun, speedrun_recipe
from ._arguments import (
    add_data_arguments,
    check_name,
    check_out,
    check_threads,
    cleaned_out,
    data_defaults,
    fail,
    first_line,
    interrupted,
    overrides,
    parser,
    remove_outputs,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = parser("python -m capsule_lib.train.speedrun", __doc__)
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
    p.add_argument("--overwrite", action="store_true", help="replace what an earlier speedrun left in --out")
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


#: what a speedrun writes in ``--out`` (``--overwrite`` deletes these first)
SPEEDRUN_FILES = ["runs", "checkpoints", "speedrun.json", "speedrun.json.tmp"]


def main(argv: list[str] | None = None, *, data_root: str | Path | None = None, offline: bool | None = None) -> None:
    """The command line (see the module docstring); ``argv``, ``data_root`` and ``offline`` as in
    :func:`capsule_lib.commands.train.main`.

    Exit status: 0 when every run finished; 1 when a run failed or had no time left (each named, and recorded in
    ``speedrun.json``; with ``--quick`` a run with no time left still runs, briefly: a check runs every recipe); 2 for
    arguments no run can use (one line, before anything is loaded or written: the device, every run's recipe with the
    ``--set`` values, ``--out``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    a = p.parse_args(argv)
    if not (a.minutes > 0 and math.isfinite(a.minutes)):
        fail(p, f"--minutes must be a number of minutes > 0, got {a.minutes}")
    known = [c.name for c in SPEEDRUNS]
    unknown = [n for n in a.names if n not in known]
    if unknown:
        fail(p, f"RECIPE: not a speedrun recipe: {', '.join(unknown)} (choose from {', '.join(known)})")
    check_threads(p, a.threads)
    check_name(p, a.tag, "--tag")
    names = a.names or known
    sets = overrides(p, a.set)
    a.data_root, a.offline = data_defaults(p, a, data_root, offline)
    try:  # the device, and every run's recipe with the --set values, before the first run starts
        device = "auto" if a.device == "auto" else str(check_device(a.device, "--device"))
        for name in names:
            speedrun_recipe(name, device, a.quick, sets)
    except (KeyError, ValueError) as e:
        fail(p, first_line(e))
    existed = check_out(p, a.out, keep=None, replace="--overwrite", allowed=a.overwrite)
    if 60 * a.minutes < GONE_S:  # no run would get any training time (budget_share: nothing below GONE_S)
        fail(
            p, f"--minutes {a.minutes:g} is less than {GONE_S:g} s: no run would train; give the speedrun more minutes"
        )
    if a.overwrite:
        remove_outputs(a.out, SPEEDRUN_FILES)
    with cleaned_out(a.out, existed), interrupted(p, f"the speedrun ran (what finished is in {a.out}/speedrun.json)"):
        result = run_speedrun(
            names,
            a.minutes,
            a.out,
            device=device,
            data_root=a.data_root,
            offline=a.offline,
            quick=a.quick,
            tag=a.tag,
            argv=argv,
            overrides=sets,
        )
    done = [r["recipe"] for r in result["runs"] if "metrics" in r]
    missed = [
        f"{r['recipe']} ({'failed: ' + r['error'] if 'error' in r else 'skipped: ' + r['skipped']})"
        for r in result["runs"]
        if "metrics" not in r
    ]
    over = result["wall_s"] - 60.0 * a.minutes
    late = f" ({over:.0f} s over its {a.minutes:g} min)" if over >= 1.0 else ""
    print(
        f"speedrun: {len(done)} of {len(names)} runs done in {result['wall_s']:.0f} s{late}; "
        f"{Path(a.out) / 'speedrun.json'}"
    )
    if missed:
        fail(p, f"{len(missed)} of {len(names)} runs not done: {'; '.join(m.splitlines()[0] for m in missed)}", code=1)
