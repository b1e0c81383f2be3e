"""What the commands share: the data arguments and their defaults from the environment, the ``--set KEY=VALUE``
overrides and the one-line error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..notebook import environment


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """``--data-root`` and ``--offline``, whose defaults are the environment's (:func:`data_defaults`)."""
    p.add_argument("--data-root", default=None, help="the data root (default: $CAPSULE_DATA, else ./data)")
    p.add_argument(
        "--offline",
        action="store_true",
        default=None,
        help="never download; where data is missing, generated stand-ins if the command allows them "
        "(default: $CAPSULE_OFFLINE)",
    )


def data_defaults(a: argparse.Namespace, data_root: str | Path | None, offline: bool | None) -> tuple[str | None, bool]:
    """The data root and offline decision of a command: its arguments, else the caller's defaults (``data_root``,
    ``offline``), else the environment's (``CAPSULE_DATA``, ``CAPSULE_OFFLINE``, read by
    :func:`capsule_lib.notebook.environment`)."""
    env = environment()
    root = a.data_root or data_root or env.data_root
    first = [x for x in (a.offline, offline) if x is not None]
    return (str(root) if root else None), first[0] if first else env.offline


def fail(p: argparse.ArgumentParser, message: str, code: int = 2) -> None:
    """Exit with one error line (``p.error`` would print the whole usage first)."""
    print(f"{p.prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def overrides(p: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items -> ``{key: value}`` (values still text: the recipe parses them); ``model__x`` is
    ``model.x``; a key given twice with different values, or an item without ``=``, is refused in one line."""
    found: dict[str, str] = {}
    for kv in items:
        if "=" not in kv:
            fail(p, f"--set wants KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        k = k.strip().replace("__", ".")  # one key, however it is spelt (model.iterations = model__iterations)
        if k in found and found[k] != v:
            fail(p, f"--set gives {k} twice ({found[k]!r} and {v!r}); give it once")
        found[k] = v
    return found
