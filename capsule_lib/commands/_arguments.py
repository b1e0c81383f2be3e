"""What the commands share: a parser whose errors are one line, the data arguments and their defaults from the
environment, the ``--set KEY=VALUE`` overrides, the checks of an output folder and of names, and the one-line
error."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from ..notebook import environment

#: a name a command writes as a file or a registry key (``--export``, ``--tag``): letters, digits, ``_ . -``
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (an unknown option, a missing argument, ``--minutes abc``) are one line
    naming the argument, instead of the usage dump and the error."""

    def error(self, message: str) -> NoReturn:
        fail(self, f"{message} (see --help)")


def parser(prog: str, doc: str | None) -> OneLineParser:
    """A command's parser: its ``prog`` (``python -m ...``) and its module docstring as the description."""
    return OneLineParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


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


def data_defaults(
    p: argparse.ArgumentParser, a: argparse.Namespace, data_root: str | Path | None, offline: bool | None
) -> tuple[str | None, bool]:
    """The data root and offline decision of a command: its arguments, else the caller's defaults (``data_root``,
    ``offline``), else the environment's (``CAPSULE_DATA``, ``CAPSULE_OFFLINE``, read by
    :func:`capsule_lib.notebook.environment`). A data root that is a file is refused (exit 2)."""
    env = environment()
    root = a.data_root or data_root or env.data_root
    first = [x for x in (a.offline, offline) if x is not None]
    if root and Path(root).exists() and not Path(root).is_dir():
        fail(p, f"--data-root {root} is a file; give the folder that holds the datasets")
    return (str(root) if root else None), first[0] if first else env.offline


def fail(p: argparse.ArgumentParser, message: str, code: int = 2) -> NoReturn:
    """Exit with one error line (``p.error`` would print the whole usage first); ``code`` 2 for usage, 1 for a run
    that failed."""
    print(f"{p.prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


@contextlib.contextmanager
def interrupted(p: argparse.ArgumentParser, doing: str) -> Iterator[None]:
    """Ctrl-C while ``doing`` (listing or decoding images, loading a model): one line and exit status 130, as for
    Ctrl-C while training, instead of a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"{p.prog}: interrupted (Ctrl-C) while {doing}", file=sys.stderr)
        raise SystemExit(130) from None


def first_line(e: BaseException) -> str:
    """An exception's message as one line (its first), or its type's name."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return text.splitlines()[0] if text.strip() else type(e).__name__


def overrides(p: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` items -> ``{key: value}`` (values still text: the recipe parses them); ``model__x`` is
    ``model.x``; a key given twice with different values, or an item without ``=``, is refused in one line."""
    found: dict[str, str] = {}
    for kv in items:
        if "=" not in kv:
            fail(p, f"--set wants KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        k = k.strip().replace("__", ".")  # one key, however it is spelt (model.iterations = model__iterations)
        if not k:
            fail(p, f"--set wants KEY=VALUE, got {kv!r} (no key)")
        if k in found and found[k] != v:
            fail(p, f"--set gives {k} twice ({found[k]!r} and {v!r}); give it once")
        found[k] = v
    return found


def check_threads(p: argparse.ArgumentParser, threads: int | None) -> None:
    """``--threads``: ``None`` (torch's default) or an integer >= 1, set here."""
    if threads is not None and threads < 1:
        fail(p, f"--threads must be >= 1, got {threads}")
    if threads:
        import torch

        torch.set_num_threads(threads)


def check_name(p: argparse.ArgumentParser, value: str | None, flag: str) -> None:
    """A name the command writes as a file or a registry key: letters, digits, ``_ . -`` (no path, no space)."""
    if value is not None and not NAME.match(value):
        fail(p, f"{flag} must be a simple name (letters, digits, _ . -; no path), got {value!r}")


def check_out(p: argparse.ArgumentParser, out: str, *, keep: str | None, replace: str, allowed: bool) -> bool:
    """Check an output folder before anything is loaded or written: not a file, in a place this process can write
    to, and, when it exists and is not empty, ``allowed`` (the user asked to go on with it or to replace it: ``keep``
    and ``replace`` are those options' spellings, for the message; ``keep`` ``None`` for a command that cannot go
    on with an earlier output). Returns whether the folder already existed."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        fail(p, f"--out {out} is a file; give a folder (it is created if missing)")
    parent = next((q for q in (path, *path.parents) if q.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(p, f"--out {out}: cannot write in {parent} (read-only or not yours); choose a folder you can write to")
    try:  # a place access() allows but that takes no folder (/proc, /sys): a folder made and removed at once
        os.rmdir(tempfile.mkdtemp(prefix=".capsule_out_", dir=parent))
    except OSError as e:
        fail(p, f"--out {out}: cannot make a folder in {parent} ({e.strerror or type(e).__name__}); choose another")
    existed = path.is_dir()
    if existed and any(path.iterdir()) and not allowed:
        go_on = f"{keep} to go on with what is there, " if keep else ""
        fail(p, f"--out {out} is not empty; pass {go_on}{replace} to replace it, or choose another folder")
    return existed


@contextlib.contextmanager
def cleaned_out(out: str, existed: bool) -> Iterator[None]:
    """Remove the output folder (and the parents it needed) if this command created it and a failure left it empty:
    a command that fails leaves nothing behind."""
    path = Path(out).resolve()
    made = [] if existed else [q for q in (path, *path.parents) if not q.exists()]
    try:
        yield
    except BaseException:
        for q in made:  # the deepest first
            with contextlib.suppress(OSError):
                if q.is_dir() and not any(q.iterdir()):
                    q.rmdir()
        raise


def remove_outputs(folder: str, names: list[str]) -> None:
    """``--overwrite``: delete what an earlier run of the command left in ``folder`` (files or folders by name,
    ``*`` patterns allowed), so that nothing of it mixes with the new run."""
    for pattern in names:
        for q in Path(folder).glob(pattern):
            shutil.rmtree(q) if q.is_dir() else q.unlink()
