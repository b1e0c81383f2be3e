"""The bad-input catalogue (#56): every command and every function a chapter or the README tells readers to call, each
argument tried with bad values. Each case asserts a refusal the library documents (exit status 2 for a command's
usage, 1 for a run that failed; ``ValueError``, ``KeyError``, ``OSError`` or ``FloatingPointError`` for a function),
at most two lines that name the argument, and nothing left behind (no ``.tmp``, no empty run folder, no cache
written). A documented function or a command's option without rows fails :func:`test_every_entry_point_has_rows`.

The rows are of three kinds:

* **type rows**, built here for every annotated argument of every documented function from its annotation
  (:mod:`capsule_lib._contracts`: a string where a tensor goes, ``1.5`` or ``True`` for a count, NaN and inf for a
  number, a number for a name...);
* **value rows**, written by hand where a value of the right type can still be wrong (shapes, empty batches,
  negative counts, unknown names, labels outside the classes, paths that do not exist or cannot be written), in
  :data:`VALUE_ROWS`;
* **command rows**: every option of ``python -m capsule_lib.train`` and ``python -m capsule_lib.train.speedrun``
  (:data:`COMMAND_ROWS`), run in this process with a temporary output folder.

Property tests (hypothesis) close the file: finite inputs give finite outputs and gradients, couplings sum to 1 over
the parents, entropies and shares stay in [0, 1].
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from capsule_lib import _contracts

REPO = Path(__file__).resolve().parents[1]

#: what a function may raise for a bad argument (the library's documented refusals)
REFUSALS = (ValueError, KeyError, OSError, FloatingPointError)


# ------------------------------------------------------------------------------------------------ the entry points
def documented_functions() -> dict[str, Any]:
    """Every ``capsule_lib`` callable a chapter's code or the README's Python calls, by its dotted path as called
    (``capsule_lib.evaluation.accuracy``), resolved to the object."""
    sources = [[cell for cell in _code_cells(p)] for p in sorted(glob.glob(str(REPO / "book" / "*.ipynb")))]
    sources.append(re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S))
    found: dict[str, Any] = {}
    for cells in sources:
        imported: dict[str, str] = {}
        trees = []
        for src in cells:
            try:
                trees.append(ast.parse(src))
            except SyntaxError:  # a cell with IPython magic
                continue
        for tree in trees:
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("capsule_lib"):
                    imported.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names})
                elif isinstance(n, ast.Import):
                    imported.update({a.asname or a.name: a.name for a in n.names if a.name.startswith("capsule_lib")})
        for tree in trees:
            for n in ast.walk(tree):
                if isinstance(n, ast.Call):
                    f, parts = n.func, []
                    while isinstance(f, ast.Attribute):
                        parts.append(f.attr)
                        f = f.value
                    if isinstance(f, ast.Name) and f.id in imported:
                        path = ".".join([imported[f.id], *reversed(parts)])
                        obj = _resolve(path)
                        if callable(obj) and (getattr(obj, "__module__", None) or "").startswith("capsule_lib"):
                            found[path] = obj
    return found


def _code_cells(path: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _target(obj: Any) -> Any:
    """What is called: a function, or a class's ``__init__``."""
    return obj.__init__ if isinstance(obj, type) else obj


def _parameters(obj: Any) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]


def _hints(obj: Any) -> dict[str, Any]:
    if isinstance(obj, type) and hasattr(obj, "__dataclass_fields__"):
        return _contracts.resolve_hints(obj)
    return _contracts.resolve_hints(_target(obj))


DOCUMENTED = documented_functions()

#: documented functions a model's forward pass calls: they check their tensors in their body (``check_tensor``), not
#: through ``@checked`` (a check per call would cost time and break torch.compile's graphs)
HOT = {
    "capsule_lib.capsule_lengths",
    "capsule_lib.dynamic_routing",
    "capsule_lib.routing.dynamic.dynamic_routing",
    "capsule_lib.routing.dynamic.dynamic_routing_reference",
    "capsule_lib.routing.inverse_temperature_schedule",
    "capsule_lib.squash_hinton",
    "capsule_lib.functional.squash_hinton",
}


# ------------------------------------------------------------------------------------------------ values
def _dummy(hint: Any) -> Any:
    """A value of the right type for ``hint`` (what the other arguments get in a type row: the checks of
    ``@checked`` run before the function's body, so the row reaches the argument it is about)."""
    if hint in (None, type(None)):
        return None
    if _contracts._is_union(hint):
        members = [h for h in typing.get_args(hint) if h not in (None, type(None))]
        return _dummy(members[0]) if members else None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return args[0]
    simple = {bool: False, int: 1, float: 0.5, str: "x", torch.Tensor: torch.zeros(2, 2), nn.Module: nn.Linear(1, 1)}
    if hint in simple:
        return simple[hint]
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return tuple(_dummy(a) for a in args)
    if origin in (tuple, list) or str(origin).startswith("<class 'collections.abc."):
        if origin is not None and origin.__name__ in ("Mapping",):
            return {}
        if origin is not None and origin.__name__ == "Callable":
            return lambda *a, **k: None
        return [_dummy(args[0])] if args else []
    if origin is dict:
        return {}
    if isinstance(hint, type) and hint.__name__ in BY_TYPE:
        return BY_TYPE[hint.__name__]()
    if isinstance(hint, type):
        try:
            return hint()
        except Exception:  # noqa: BLE001 - a class that needs arguments: BY_TYPE or GOOD names a value for it
            return None
    return None


def _settings() -> Any:
    from capsule_lib.notebook import settings

    return settings(True, style=False, quiet=True)


def _toy() -> Any:
    from capsule_lib.analysis import toy_votes

    return toy_votes()


def _attack_curve() -> Any:
    from capsule_lib.robustness import AttackCurve

    return AttackCurve("FGSM", (0.0, 0.1), torch.ones(2, 4, dtype=torch.bool))


def _image_routing() -> Any:
    from capsule_lib.critique import ImageRouting

    return ImageRouting((1, 2), torch.rand(2, 10), "lengths", torch.full((2, 36, 10), 0.1), (0.9, 0.8))


#: made-up values of the library's own classes, by class name (for the arguments a type row does not change)
BY_TYPE: dict[str, Any] = {
    "RoutingTrace": lambda: __import__("capsule_lib").RoutingTrace("dynamic"),
    "Settings": _settings,
    "ToyVotes": _toy,
    "AttackCurve": _attack_curve,
    "ImageRouting": _image_routing,
    "CritiqueRun": lambda: __import__("capsule_lib.routing_critique", fromlist=["x"]).CritiqueRun("mnist", "dynamic"),
}


#: wrong values, tried in this order: the first few that do not match an argument's annotation become its rows
WRONG = ("not-a-value", 1.5, True, 7, object(), [object()], torch.zeros(3, dtype=torch.int64))


def _wrong_values(hint: Any) -> list[Any]:
    """Up to three values of the wrong type for ``hint``, and NaN and inf for a number."""
    wrong = [v for v in WRONG if not _contracts._matches(v, hint)][:3]
    if _contracts._is_float_hint(hint):
        wrong += [float("nan"), float("inf")]
    return wrong


# ------------------------------------------------------------------------------------------------ good calls
def _tiny_capsnet() -> nn.Module:
    from capsule_lib.models import CapsNet, CapsNetConfig

    torch.manual_seed(0)
    return CapsNet(CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))).eval()


#: good values for arguments whose type alone cannot be made up (``_dummy``): by function, then by argument
GOOD: dict[str, dict[str, Any]] = {
    "capsule_lib.capsule_lengths": {"v": lambda: torch.randn(2, 10, 16)},
    "capsule_lib.dynamic_routing": {"votes": lambda: torch.randn(2, 6, 3, 4)},
    "capsule_lib.routing.dynamic.dynamic_routing": {"votes": lambda: torch.randn(2, 6, 3, 4)},
    "capsule_lib.routing.dynamic.dynamic_routing_reference": {"votes": lambda: torch.randn(2, 6, 3, 4)},
}


def _call(path: str, replace: dict[str, Any]) -> Any:
    """Call the documented ``path`` with good or made-up values for its required arguments and ``replace``'s."""
    obj = DOCUMENTED[path]
    hints, good = _hints(obj), GOOD.get(path, {})
    args, kwargs = [], {}
    for p in _parameters(obj if isinstance(obj, type) and hasattr(obj, "__dataclass_fields__") else _target(obj)):
        if p.name in replace:
            value = replace[p.name]
        elif p.name in good:
            value = good[p.name]()
        elif p.default is inspect.Parameter.empty:
            value = _dummy(hints.get(p.name, typing.Any))
        else:
            continue
        if p.kind == p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    return obj(*args, **kwargs)


def _type_rows() -> list[Any]:
    rows = []
    for path, obj in sorted(DOCUMENTED.items()):
        hints = _hints(obj)
        target = obj if isinstance(obj, type) and hasattr(obj, "__dataclass_fields__") else _target(obj)
        for p in _parameters(target):
            hint = hints.get(p.name)
            if hint is None or hint is typing.Any or hint is _contracts._Unknown:
                continue
            for k, _ in enumerate(_wrong_values(hint)):
                rows.append(pytest.param(path, p.name, k, id=f"{path.removeprefix('capsule_lib.')}:{p.name}:{k}"))
    return rows


def _assert_refused(call: Any, argument: str) -> str:
    """``call()`` raises a documented refusal, in at most two lines that name ``argument``; returns the message."""
    with pytest.raises(REFUSALS) as info:
        call()
    e = info.value
    message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    lines = [line for line in message.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines: {message[:400]}"
    assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(argument)}(?![A-Za-z0-9_])", message), (
        f"the message does not name {argument!r}: {message[:300]}"
    )
    return message


@pytest.mark.parametrize("path, argument, k", _type_rows())
def test_a_wrong_type_is_refused_in_one_line_naming_the_argument(path, argument, k):
    bad = _wrong_values(_hints(DOCUMENTED[path])[argument])[k]
    _assert_refused(lambda: _call(path, {argument: bad}), argument)


# ------------------------------------------------------------------------------------------------ the commands
#: a tiny, fast run (two batches of the generated stand-in) for the rows that must start training
TINY_RUN = ["--set", "train_subset=32", "eval_subset=16", "epochs=1", "batch_size=16"]


def _commands() -> dict[str, Any]:
    from capsule_lib.commands import speedrun, train

    return {"train": train, "speedrun": speedrun}


#: (command, argv with OUT for the output folder, exit status, what the one line must name); every option of every
#: command appears in at least one row (test_every_entry_point_has_rows)
COMMAND_ROWS: list[tuple[str, list[str], int, str]] = [
    # python -m capsule_lib.train
    ("train", ["--out", "OUT"], 2, "recipe"),
    ("train", ["nope", "--out", "OUT"], 2, "recipe"),
    ("train", ["capsnet"], 2, "--out"),
    ("train", ["capsnet", "--shipped", "capsnet_mnist", "--out", "OUT"], 2, "--shipped"),
    ("train", ["--shipped", "nope", "--out", "OUT"], 2, "nope"),
    ("train", ["capsnet", "--out", "OUT", "--set", "lr=1e999"], 2, "lr"),
    ("train", ["capsnet", "--out", "OUT", "--set", "lr=nan"], 2, "lr"),
    ("train", ["capsnet", "--out", "OUT", "--set", "lr=-1"], 2, "lr"),
    ("train", ["capsnet", "--out", "OUT", "--set", "epochs=-1"], 2, "epochs"),
    ("train", ["capsnet", "--out", "OUT", "--set", "epochs=1.5"], 2, "epochs"),
    ("train", ["capsnet", "--out", "OUT", "--set", "bogus_key=1"], 2, "bogus_key"),
    ("train", ["capsnet", "--out", "OUT", "--set", "lr"], 2, "--set"),
    ("train", ["capsnet", "--out", "OUT", "--set", "=1"], 2, "--set"),
    ("train", ["capsnet", "--out", "OUT", "--set", "epochs=1", "--set", "epochs=2"], 2, "epochs"),
    ("train", ["capsnet", "--out", "OUT", "--set", "model.iterations=0"], 2, "iterations"),
    ("train", ["capsnet", "--out", "OUT", "--set", "model.iterations=true"], 2, "iterations"),
    ("train", ["capsnet", "--out", "OUT", "--set", "device=cuda"], 2, "device"),
    ("train", ["capsnet", "--out", "OUT", "--set", "device=gpu"], 2, "device"),
    ("train", ["capsnet", "--out", "OUT", "--set", "lr_decay=2"], 2, "lr_decay"),
    ("train", ["capsnet", "--out", "OUT", "--threads", "-1"], 2, "--threads"),
    ("train", ["capsnet", "--out", "OUT", "--threads", "two"], 2, "--threads"),
    ("train", ["capsnet", "--out", "OUT", "--budget-minutes", "0"], 2, "--budget-minutes"),
    ("train", ["capsnet", "--out", "OUT", "--budget-minutes", "nan"], 2, "--budget-minutes"),
    ("train", ["capsnet", "--out", "OUT", "--start-from", "nope"], 2, "start_from"),
    ("train", ["capsnet", "--out", "OUT", "--start-from", "baseline_cnn_mnist"], 2, "start_from"),
    ("train", ["capsnet", "--out", "OUT", "--export", "../x"], 2, "--export"),
    ("train", ["capsnet", "--out", "OUT", "--export", "capsnet_mnist"], 2, "--export"),
    ("train", ["capsnet", "--out", "OUT", "--compile", "fast"], 2, "--compile"),
    ("train", ["capsnet", "--out", "OUT", "--resume", "--overwrite"], 2, "--resume"),
    ("train", ["capsnet", "--out", "OUT", "--resume", "--fresh"], 2, "--resume"),
    ("train", ["capsnet", "--out", "FILE"], 2, "--out"),
    ("train", ["capsnet", "--out", "FULL", *TINY_RUN], 2, "--out"),
    ("train", ["capsnet", "--out", "OUT", "--data-root", "FILE"], 2, "--data-root"),
    ("train", ["capsnet", "--out", "OUT", "--offline", "--bogus"], 2, "--bogus"),
    ("train", ["capsnet", "--out", "OUT", *TINY_RUN, "lr=1e30"], 1, "lr"),
    ("train", ["capsnet", "--out", "READONLY", *TINY_RUN], 1, "READONLY"),
    # python -m capsule_lib.train.speedrun
    ("speedrun", ["--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "1"], 2, "--out"),
    ("speedrun", ["--minutes", "abc", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "0", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "inf", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "nope"], 2, "nope"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--device", "cuda"], 2, "--device"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--device", "gpu"], 2, "--device"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--threads", "-1"], 2, "--threads"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--tag", "a/b"], 2, "--tag"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "bogus_key=1", "capsnet_speedrun"], 2, "bogus_key"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "epochs=-1"], 2, "epochs"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "ema=2"], 2, "ema"),
    ("speedrun", ["--minutes", "1", "--out", "FILE"], 2, "--out"),
    ("speedrun", ["--minutes", "1", "--out", "FULL", "--quick"], 2, "--out"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--data-root", "FILE", "--offline"], 2, "--data-root"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--overwrite", "--quick", "--bogus"], 2, "--bogus"),
]


def _folders(tmp_path: Path) -> dict[str, str]:
    """The placeholders of :data:`COMMAND_ROWS`: a new folder, a file, a folder holding an earlier run's file, and a
    folder whose writes fail as on a read-only file system."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "history.json").write_text("{}")
    return {
        "OUT": str(tmp_path / "out" / "run"),
        "FILE": str(tmp_path / "a_file"),
        "FULL": str(tmp_path / "full"),
        "READONLY": str(tmp_path / "readonly" / "run"),
    }


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize(
    "command, argv, status, names", COMMAND_ROWS, ids=[f"{c}:{' '.join(a)}"[:80] for c, a, _, _ in COMMAND_ROWS]
)
def test_a_command_refuses_a_bad_argument_in_one_line_and_leaves_nothing(
    command, argv, status, names, tmp_path, capsys, monkeypatch
):
    folders = _folders(tmp_path)
    argv = [folders.get(a, a) for a in argv]
    if "READONLY" in names:  # the run's folder becomes unwritable: every write fails as on a read-only mount
        names = folders["READONLY"]
        real = torch.save

        def read_only(obj, f, *a, **k):
            if str(f).startswith(str(tmp_path / "readonly")):
                raise OSError(30, "Read-only file system", str(f))
            return real(obj, f, *a, **k)

        monkeypatch.setattr(torch, "save", read_only)
    before = _tree(tmp_path)
    data = tmp_path / "no_data"
    with pytest.raises(SystemExit) as info:
        _commands()[command].main(argv, data_root=str(data), offline=True)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "[GENERATED stand-in data]" not in line]
    assert info.value.code == status, err[-2000:]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err[-3000:]}"
    assert names in lines[-1], f"the error does not name {names!r}: {lines[-1]}"
    after = [p for p in _tree(tmp_path) if not p.startswith("no_data")]
    assert after == before, f"left behind: {sorted(set(after) - set(before))}"
