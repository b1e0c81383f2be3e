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
import dataclasses
import functools
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

import capsule_lib.critique as critique
import capsule_lib.evaluation as ev
import capsule_lib.models as M
import capsule_lib.pretrained as pretrained
from capsule_lib import RoutingTrace, _contracts
from capsule_lib.routing import kinds
from capsule_lib.routing_critique import CritiqueRun

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
    for path in re.findall(r"`(capsule_lib\.[\w.]+)\(", (REPO / "README.md").read_text()):  # calls in the prose
        obj = _resolve(path)
        if callable(obj):
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
    "RoutingTrace": lambda: RoutingTrace("dynamic"),
    "Settings": _settings,
    "ToyVotes": _toy,
    "AttackCurve": _attack_curve,
    "ImageRouting": _image_routing,
    "CritiqueRun": lambda: CritiqueRun("mnist", "dynamic"),
}


#: wrong values, tried in this order: the first few that do not match an argument's annotation become its rows
WRONG = ("not-a-value", 1.5, True, 7, object(), [object()], torch.zeros(3, dtype=torch.int64))


def _wrong_values(hint: Any, nonfinite_ok: bool = False) -> list[Any]:
    """Up to three values of the wrong type for ``hint``, and NaN and inf for a number (unless the function takes
    them: ``@checked(allow_nonfinite=...)``)."""
    wrong = [v for v in WRONG if not _contracts._matches(v, hint)][:3]
    if _contracts._is_float_hint(hint) and not nonfinite_ok:
        wrong += [float("nan"), float("inf")]
    return wrong


def _nonfinite_ok(obj: Any, argument: str) -> bool:
    return argument in getattr(obj, "__allow_nonfinite__", ())


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
    "capsule_lib.routing.inverse_temperature_schedule": {"iterations": lambda: 3},
    "capsule_lib.squash_hinton": {"s": lambda: torch.randn(2, 10, 16)},
    "capsule_lib.functional.squash_hinton": {"s": lambda: torch.randn(2, 10, 16)},
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
    named = {p.name for p in inspect.signature(_target(obj)).parameters.values()}
    kwargs.update({k: v for k, v in replace.items() if k not in named})  # to **overrides
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
            for k, _ in enumerate(_wrong_values(hint, _nonfinite_ok(obj, p.name))):
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
    obj = DOCUMENTED[path]
    bad = _wrong_values(_hints(obj)[argument], _nonfinite_ok(obj, argument))[k]
    _assert_refused(lambda: _call(path, {argument: bad}), argument)


# ------------------------------------------------------------------------------------------------ the commands
#: a tiny, fast run (two batches of the generated stand-in) for the rows that must start training
TINY_RUN = ["--set", "train_subset=32", "eval_subset=16", "epochs=1", "batch_size=16"]


def _commands() -> dict[str, Any]:
    from capsule_lib.commands import predict, speedrun, train

    return {"train": train, "speedrun": speedrun, "predict": predict}


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
    ("train", ["capsnet", "--out", "OUT", "--images", "MISSING"], 2, "missing"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY"], 2, "empty"),
    ("train", ["capsnet", "--out", "OUT", "--images", "FILE"], 2, "a_file"),
    ("train", ["em_norb", "--out", "OUT", "--images", "EMPTY"], 2, "em_norb"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--set", "dataset=mnist"], 2, "--images"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--image-size", "0"], 2, "image_size"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--channels", "2"], 2, "--channels"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--val-fraction", "1.5"], 2, "val_fraction"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--test-fraction", "-0.1"], 2, "test_fraction"),
    ("train", ["capsnet", "--out", "OUT", "--images", "EMPTY", "--split-seed", "x"], 2, "--split-seed"),
    ("train", ["capsnet", "--out", "OUT", "--skip-bad-files"], 2, "--skip-bad-files"),
    ("train", ["capsnet", "--out", "OUT", "--keep-small-classes"], 2, "--keep-small-classes"),
    ("train", ["capsnet", "--out", "OUT", "--images", "SMALL"], 2, "the class 'tiny' has 1 image"),
    # python -m capsule_lib.train.speedrun
    ("speedrun", ["--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "1"], 2, "--out"),
    ("speedrun", ["--minutes", "abc", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "0", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "inf", "--out", "OUT"], 2, "--minutes"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "nope"], 2, "RECIPE"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--device", "cuda"], 2, "--device"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--device", "gpu"], 2, "--device"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--threads", "-1"], 2, "--threads"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--tag", "a/b"], 2, "--tag"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "bogus_key=1", "capsnet_speedrun"], 2, "bogus_key"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "epochs=-1"], 2, "epochs"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--set", "ema=2"], 2, "ema"),
    ("speedrun", ["--minutes", "1", "--out", "FILE"], 2, "--out"),
    ("speedrun", ["--minutes", "1", "--out", "/proc/capsule_x"], 2, "--out /proc/capsule_x"),
    ("speedrun", ["--minutes", "0.01", "--out", "OUT"], 2, "--minutes 0.01 is less than 1 s: no run would train"),
    ("train", ["capsnet", "--out", "/proc/capsule_x"], 2, "--out /proc/capsule_x"),
    ("speedrun", ["--minutes", "1", "--out", "FULL", "--quick"], 2, "--out"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--data-root", "FILE", "--offline"], 2, "--data-root"),
    ("speedrun", ["--minutes", "1", "--out", "OUT", "--overwrite", "--quick", "--bogus"], 2, "--bogus"),
    # python -m capsule_lib.predict
    ("predict", [], 2, "RUN_OR_CHECKPOINT"),
    ("predict", ["capsnet_mnist"], 2, "IMAGE"),
    ("predict", ["nope", "IMG"], 2, "nope"),
    ("predict", ["FILE", "IMG"], 2, "a_file"),
    ("predict", ["capsnet_mnist", "MISSING"], 2, "missing"),
    ("predict", ["capsnet_mnist", "FILE"], 2, "a_file"),
    ("predict", ["capsnet_mnist", "EMPTY"], 2, "empty"),
    ("predict", ["capsnet_mnist", "IMG", "--batch-size", "0"], 2, "--batch-size"),
    ("predict", ["capsnet_mnist", "IMG", "--batch-size", "x"], 2, "--batch-size"),
    ("predict", ["capsnet_mnist", "IMG", "--device", "gpu"], 2, "--device"),
    ("predict", ["capsnet_mnist", "IMG", "--device", "cuda"], 2, "--device"),
    ("predict", ["capsnet_mnist", "IMG", "--csv", "EMPTY"], 2, "--csv"),
    ("predict", ["capsnet_mnist", "IMG", "--csv", "NOWHERE"], 2, "--csv"),
]


def _folders(tmp_path: Path) -> dict[str, str]:
    """The placeholders of :data:`COMMAND_ROWS`: a new folder, a file, a folder holding an earlier run's file, and a
    folder whose writes fail as on a read-only file system."""
    from PIL import Image

    (tmp_path / "a_file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "history.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    Image.new("L", (28, 28), 128).save(tmp_path / "digit.png")
    for name, n in (("big", 12), ("tiny", 1)):  # a class too small for a validation and a test image
        for k in range(n):
            (tmp_path / "small" / name).mkdir(parents=True, exist_ok=True)
            Image.new("L", (28, 28), 10 * k).save(tmp_path / "small" / name / f"{k}.png")
    return {
        "OUT": str(tmp_path / "out" / "run"),
        "FILE": str(tmp_path / "a_file"),
        "FULL": str(tmp_path / "full"),
        "READONLY": str(tmp_path / "readonly" / "run"),
        "EMPTY": str(tmp_path / "empty"),
        "SMALL": str(tmp_path / "small"),
        "MISSING": str(tmp_path / "missing.png"),
        "IMG": str(tmp_path / "digit.png"),
        "NOWHERE": str(tmp_path / "no" / "such" / "folder" / "p.csv"),
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
    main = _commands()[command].main
    data_args = {"data_root": str(data), "offline": True} if "data_root" in inspect.signature(main).parameters else {}
    with pytest.raises(SystemExit) as info:
        main(argv, **data_args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "[GENERATED stand-in data]" not in line]
    assert info.value.code == status, err[-2000:]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err[-3000:]}"
    assert names in lines[-1], f"the error does not name {names!r}: {lines[-1]}"
    after = [p for p in _tree(tmp_path) if not p.startswith("no_data")]
    assert after == before, f"left behind: {sorted(set(after) - set(before))}"


# ------------------------------------------------------------------------------------------------ value rows
class Row(typing.NamedTuple):
    """A bad value of the right type: ``call()`` must be refused in one line naming ``argument``; ``path``: the
    documented function (or method, by its dotted name) the row belongs to."""

    path: str
    argument: str
    call: Any


@functools.cache
def _classifier() -> nn.Module:
    from capsule_lib.models import RoutingClassifier, RoutingClassifierConfig

    torch.manual_seed(0)
    return RoutingClassifier(RoutingClassifierConfig(stem_channels=(4, 8), primary_types=2, caps_dim=4)).eval()


def _images(n: int = 4, side: int = 28) -> torch.Tensor:
    return torch.rand(n, 1, side, side)


def _layer(kind: str = "dynamic") -> nn.Module:
    from capsule_lib.routing.kinds import build_routing

    torch.manual_seed(0)
    return build_routing(kind, 12, 3, 4)


def _route(kind: str, **kw: Any) -> Any:
    poses, acts = torch.randn(2, 12, 4), torch.rand(2, 12) if kind in ("em", "heinsen_2019") else None
    args = {"poses": poses, "activations": acts, **kw}
    return lambda: _layer(kind).route(args.pop("poses"), args.pop("activations"), **args)


def _p(name: str) -> str:
    return f"capsule_lib.{name}"


def _call_row(path: str, argument: str, **replace: Any) -> Row:
    return Row(path, argument, lambda: _call(path, replace))


VALUE_ROWS: list[Row] = [
    # evaluation
    Row(
        _p("evaluation.predict"),
        "images",
        lambda: ev.predict(_classifier(), torch.rand(0, 1, 28, 28)),
    ),
    Row(
        _p("evaluation.predict"),
        "images",
        lambda: ev.predict(_classifier(), torch.rand(2, 3, 28, 28)),
    ),
    Row(
        _p("evaluation.predict"),
        "images",
        lambda: ev.predict(_classifier(), torch.full((2, 1, 28, 28), float("nan"))),
    ),
    Row(
        _p("evaluation.predict"),
        "images",
        lambda: ev.predict(_classifier(), torch.rand(2, 1, 28, 28) * 255),
    ),
    Row(
        _p("evaluation.predict"),
        "batch_size",
        lambda: ev.predict(_classifier(), _images(), batch_size=0),
    ),
    Row(
        _p("evaluation.predict"),
        "device",
        lambda: ev.predict(_classifier(), _images(), device="cuda:7"),
    ),
    _call_row(_p("evaluation.accuracy"), "labels", scores=torch.randn(4, 10), labels=torch.tensor([1.0, 2, 3, 4])),
    _call_row(_p("evaluation.accuracy"), "labels", scores=torch.randn(4, 10), labels=torch.tensor([1, 2, 3])),
    _call_row(_p("evaluation.accuracy"), "labels", scores=torch.randn(4, 10), labels=torch.tensor([1, 2, 3, 12])),
    _call_row(_p("evaluation.accuracy"), "scores", scores=torch.randn(4), labels=torch.tensor([1, 2, 3, 4])),
    _call_row(_p("evaluation.accuracy_standard_error"), "p", p=1.5, n=10),
    _call_row(_p("evaluation.accuracy_standard_error"), "n", p=0.5, n=0),
    _call_row(
        _p("evaluation.multimnist_accuracy"), "labels", scores=torch.randn(4, 10), labels=torch.tensor([1, 2, 3, 4])
    ),
    _call_row(
        _p("evaluation.multimnist_accuracy"),
        "labels",
        scores=torch.randn(4, 10),
        labels=torch.tensor([[1, 2], [3, 4], [5, 6], [7, 12]]),
    ),
    Row(
        _p("evaluation.iteration_sweep"),
        "iterations",
        lambda: ev.iteration_sweep(_classifier(), _images(), torch.tensor([1, 2, 3, 4]), iterations=(0, 1)),
    ),
    Row(
        _p("evaluation.iteration_sweep"),
        "iterations",
        lambda: ev.iteration_sweep(_classifier(), _images(), torch.tensor([1, 2, 3, 4]), iterations=()),
    ),
    Row(
        _p("evaluation.iteration_sweep"),
        "labels",
        lambda: ev.iteration_sweep(_classifier(), _images(), torch.tensor([1, 2, 3])),
    ),
    # routing: the protocol every layer is called through, and the functional forms
    *[
        Row("capsule_lib.routing.RoutingProtocol.route", "poses", _route(k, poses=torch.randn(0, 12, 4)))
        for k in ("dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention")
    ],
    *[
        Row(
            "capsule_lib.routing.RoutingProtocol.route",
            "poses",
            _route(k, poses=torch.randn(0, 12, 4), couplings="uniform"),
        )
        for k in ("dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention")
    ],
    *[
        Row("capsule_lib.routing.RoutingProtocol.route", "poses", _route(k, poses=torch.randn(2, 12, 5)))
        for k in ("dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention")
    ],
    *[
        Row("capsule_lib.routing.RoutingProtocol.route", "couplings", _route(k, couplings=torch.ones(3, 3)))
        for k in ("dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention")
    ],
    *[
        Row("capsule_lib.routing.RoutingProtocol.route", "iterations", _route(k, iterations=0))
        for k in ("dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted")
    ],
    Row(
        "capsule_lib.routing.RoutingProtocol.route",
        "activations",
        _route("heinsen_2019", activations=torch.full((2, 12), float("nan"))),
    ),
    Row("capsule_lib.routing.RoutingProtocol.route", "activations", _route("em", activations=torch.rand(2, 11))),
    Row("capsule_lib.routing.RoutingProtocol.route", "activations", _route("em", activations=torch.rand(2, 12) + 1)),
    Row(
        "capsule_lib.routing.kinds.build_routing",
        "kind",
        lambda: kinds.build_routing("nope", 12, 3, 4),
    ),
    _call_row(_p("dynamic_routing"), "votes", votes=torch.randn(0, 6, 3, 4)),
    _call_row(_p("dynamic_routing"), "iterations", votes=torch.randn(2, 6, 3, 4), iterations=0),
    _call_row(_p("dynamic_routing"), "bias", votes=torch.randn(2, 6, 3, 4), bias=torch.zeros(3, 5)),
    _call_row(_p("dynamic_routing"), "squash_kind", votes=torch.randn(2, 6, 3, 4), squash_kind="nope"),
    _call_row(_p("routing.dynamic.dynamic_routing_reference"), "votes", votes=torch.randn(2, 6, 4)),
    _call_row(_p("capsule_lengths"), "v", v=torch.zeros(3, 4, dtype=torch.int64)),
    _call_row(_p("routing.inverse_temperature_schedule"), "iterations", iterations=0),
    _call_row(_p("routing.inverse_temperature_schedule"), "kind", iterations=3, kind="nope"),
    # models and their configs
    *[
        _call_row(_p("models.CapsNetConfig"), f, **{f: v})
        for f, v in (("iterations", 0), ("conv_channels", 0), ("primary_dim", -1), ("n_classes", 0), ("init_std", 0.0))
    ],
    *[
        _call_row(_p("models.EMCapsNetConfig"), f, **{f: v})
        for f, v in (("iterations", 0), ("pose_size", 0), ("eps", 0.0), ("conv_padding", -1))
    ],
    *[_call_row(_p("models.SmallNORBConfig"), f, **{f: v}) for f, v in (("iterations", 0), ("n_objs", 0))],
    Row(_p("models.CapsNet"), "x", lambda: _tiny_capsnet()(torch.rand(0, 1, 28, 28))),
    Row(_p("models.CapsNet"), "x", lambda: _tiny_capsnet()(torch.rand(2, 3, 28, 28))),
    Row(_p("models.CapsNet"), "x", lambda: _tiny_capsnet()(torch.rand(2, 1, 32, 32))),
    Row(_p("models.CapsNet"), "x", lambda: _tiny_capsnet()(torch.zeros(2, 1, 28, 28, dtype=torch.uint8))),
    Row(
        _p("models.CapsNet"),
        "config",
        lambda: M.CapsNet(M.EMCapsNetConfig()),
    ),
    Row(
        "capsule_lib.models.RoutingClassifierConfig",
        "hidden",
        lambda: M.RoutingClassifierConfig(hidden=32),
    ),
    Row(
        "capsule_lib.models.RoutingClassifierConfig",
        "hidden",
        lambda: M.RoutingClassifierConfig(hidden={8: 1}),
    ),
    Row(
        "capsule_lib.models.RoutingClassifierConfig",
        "iterations",
        lambda: M.RoutingClassifierConfig(iterations=True),
    ),
    Row(
        "capsule_lib.models.RoutingClassifierConfig",
        "routing",
        lambda: M.RoutingClassifierConfig(routing="nope"),
    ),
    Row(
        "capsule_lib.models.RoutingClassifierConfig",
        "caps_dim",
        lambda: M.RoutingClassifierConfig(caps_dim=15),
    ),
]


@functools.cache
def _folder_fixture() -> dict[str, str]:
    """A file and an empty folder for the path rows (made once per test process, in a temporary folder)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="bad_inputs_"))
    (root / "a_file").write_text("x")
    (root / "empty").mkdir()
    return {"FILE": str(root / "a_file"), "EMPTY": str(root / "empty"), "MISSING": str(root / "missing")}


def _path(key: str) -> str:
    return _folder_fixture()[key]


def _with(path: str, argument: str, make: Any) -> Row:
    """A row whose bad arguments are made when it runs (``make()`` -> the replacements)."""
    return Row(path, argument, lambda: _call(path, make()))


VALUE_ROWS += [
    # data
    _call_row(_p("data.get_dataset"), "name", name="nope"),
    _call_row(_p("data.get_dataset"), "split", name="mnist", split="nope", offline=True),
    _with(_p("data.get_dataset"), "data_root", lambda: {"name": "mnist", "data_root": _path("FILE")}),
    _with(
        _p("data.get_dataset"),
        "mnist",
        lambda: {"name": "mnist", "data_root": _path("EMPTY"), "offline": True, "standin": False},
    ),
    _call_row(_p("data.sequences.marker_sequences"), "n", n=0),
    _call_row(_p("data.sequences.marker_sequences"), "n_markers", n=4, n_markers=0),
    _call_row(_p("data.sequences.marker_sequences"), "min_len", n=4, min_len=50, max_len=10),
    _call_row(_p("data.transforms.random_crop_flip"), "x", x=torch.rand(2, 3, 32)),
    _call_row(_p("data.transforms.random_crop_flip"), "padding", x=torch.rand(2, 3, 32, 32), padding=-1),
    _call_row(_p("data.viewpoints.viewpoint_sets"), "dataset", dataset="nope"),
    _call_row(_p("data.viewpoints.viewpoint_sets"), "axis", dataset="smallnorb_rendered", axis="nope"),
    _call_row(_p("data.overlap_stats"), "ds", ds={}),
    # the chapters' settings and models
    _call_row(_p("notebook.settings"), "EPOCHS", SMOKE=True, EPOCHS=0, style=False, quiet=True),
    _call_row(_p("notebook.settings"), "DEVICE", SMOKE=True, DEVICE="gpu", style=False, quiet=True),
    _with(
        _p("notebook.settings"),
        "DATA_ROOT",
        lambda: {"SMOKE": True, "DATA_ROOT": _path("FILE"), "style": False, "quiet": True},
    ),
    _call_row(_p("notebook.settings"), "data", SMOKE=True, data=("nope",), style=False, quiet=True),
    _with(_p("notebook.chapter_dataset"), "name", lambda: {"name": "nope", "split": "train", "cfg": _settings()}),
    _with(_p("notebook.chapter_dataset"), "split", lambda: {"name": "mnist", "split": "nope", "cfg": _settings()}),
    _with(
        _p("notebook.chapter_dataset"),
        "n_smoke",
        lambda: {"name": "mnist", "split": "train", "cfg": _settings(), "n_smoke": 0},
    ),
    _with(_p("notebook.train_or_load"), "nope", lambda: {"checkpoints": "nope", "cfg": _settings()}),
    _with(
        _p("notebook.train_or_load"),
        "retrain",
        lambda: {"checkpoints": ["capsnet_mnist"], "cfg": _settings(), "retrain": ["nope"]},
    ),
    _with(_p("notebook.train_or_load"), "checkpoints", lambda: {"checkpoints": [], "cfg": _settings()}),
    # the shipped checkpoints and training
    _with(_p("pretrained.registry"), "directory", lambda: {"directory": _path("FILE")}),
    _with(_p("pretrained.load_heinsen_2019"), "source", lambda: {"source": _path("MISSING")}),
    _call_row(_p("train.train"), "recipe", recipe="nope"),
    _call_row(_p("train.train"), "lr", recipe="capsnet", lr=float("nan"), offline=True),
    _call_row(_p("train.train"), "bogus", recipe="capsnet", bogus=1, offline=True),
    _call_row(_p("train.train"), "start_from", recipe="capsnet", start_from="nope", offline=True),
    _call_row(_p("train.train"), "budget_minutes", recipe="capsnet", budget_minutes=0.0, offline=True),
    _call_row(_p("train.train"), "compile", recipe="capsnet", compile="fast", offline=True),
    _with(_p("train.train"), "out_dir", lambda: {"recipe": "capsnet", "out_dir": _path("FILE"), "train_subset": 16}),
    _call_row(_p("train.shipped_recipe"), "nope", checkpoint="nope"),
    Row(
        _p("pretrained.load_pretrained"),
        "map_location",
        lambda: pretrained.load_pretrained("capsnet_mnist", map_location={}),
    ),
    Row(
        _p("pretrained.load_pretrained"),
        "map_location",
        lambda: pretrained.load_pretrained("capsnet_mnist", map_location="gpu"),
    ),
    Row(
        _p("pretrained.load_pretrained"),
        "nope",
        lambda: pretrained.load_pretrained("nope"),
    ),
    _call_row(_p("train.shipped_recipe"), "phase", checkpoint="capsnet_mnist", phase=5),
    # what routing does, measured
    Row(_p("critique.routing_changes"), "labels", lambda: _critique("routing_changes", labels=12)),
    Row(_p("critique.routing_changes"), "labels", lambda: _critique("routing_changes", labels=torch.rand(4))),
    Row(_p("critique.routing_changes"), "labels", lambda: _critique("routing_changes", labels=torch.tensor([1, 2]))),
    Row(
        _p("critique.routing_changes"),
        "labels",
        lambda: _critique("routing_changes", labels=torch.tensor([1, 2, 3, 12])),
    ),
    Row(_p("critique.routing_changes"), "iterations", lambda: _critique("routing_changes", iterations=(2, 3))),
    Row(
        _p("critique.routing_changes"), "images", lambda: _critique("routing_changes", images=torch.rand(1, 1, 28, 28))
    ),
    Row(_p("critique.routing_by_layer"), "threshold", lambda: _critique("routing_by_layer", threshold=float("nan"))),
    Row(_p("critique.routing_by_layer"), "iterations", lambda: _critique("routing_by_layer", iterations=(0,))),
    Row(
        _p("critique.reroute_image"),
        "image",
        lambda: _critique("reroute_image", image=torch.rand(3, 28, 28), images=None),
    ),
    Row(_p("critique.gradient_by_layer"), "layers", lambda: _critique("gradient_by_layer", layers=["nope"])),
    Row(
        "capsule_lib.critique.coupling_stats",
        "couplings",
        lambda: critique.coupling_stats(torch.full((4, 5, 3), -0.5) + torch.eye(3)[:1]),
    ),
    Row(
        "capsule_lib.critique.coupling_stats",
        "activity",
        lambda: critique.coupling_stats(torch.full((4, 5, 2), 0.5), torch.full((4, 2), float("nan"))),
    ),
    Row(
        "capsule_lib.critique.alive_share",
        "min_share",
        lambda: critique.alive_share(torch.rand(4, 3), min_share=2.0),
    ),
    # attacks and their tables
    Row(_p("robustness.attack_curves"), "eps", lambda: _robust("attack_curves", plan={"fgsm": {"eps": [-0.1, 0.1]}})),
    Row(
        _p("robustness.attack_curves"),
        "attack",
        lambda: _robust("attack_curves", plan={"x": {"attack": "nope", "eps": [0.1]}}),
    ),
    Row(_p("robustness.targeted_success"), "eps", lambda: _robust("targeted_success", eps=[-0.1])),
    Row(_p("robustness.targeted_success"), "n_classes", lambda: _robust("targeted_success", eps=[0.1], n_classes=1)),
    Row(_p("robustness.adversarial_examples"), "label", lambda: _robust("adversarial_examples", label=12)),
    Row(_p("robustness.adversarial_examples"), "attack", lambda: _robust("adversarial_examples", attack="nope")),
    # formatting
    _call_row(_p("report.pct"), "digits", x=0.5, digits=-1),
    _call_row(_p("report.duration"), "seconds", seconds=-5.0),
    _call_row(_p("report.show_table"), "rows", headers=["a", "b"], rows=[3]),
    _call_row(_p("report.show_budgets"), "nope", names=["nope"]),
    _call_row(_p("results.show_results"), "family", family="nope"),
    _call_row(_p("results.speedrun_references"), "nope", names=["nope"]),
    _call_row(_p("comparison.contestant_recipe"), "name", name="nope"),
    _call_row(_p("comparison.contestant_recipe"), "dataset", name="dynamic", dataset="nope"),
    _call_row(_p("comparison.shipped_name"), "name", name="nope"),
    # costs
    _call_row(_p("cost.routing_scaling"), "sizes", sizes=[]),
    _call_row(_p("cost.routing_scaling"), "kinds", sizes=[(8, 2)], kinds=["nope"]),
    _call_row(_p("cost.routing_scaling"), "d", sizes=[(8, 2)], d=0),
    _call_row(_p("cost.loglog_slope"), "x", x=[1.0], y=[2.0]),
    _call_row(_p("cost.loglog_slope"), "y", x=[1.0, 2.0], y=[1.0]),
    _call_row(_p("cost.loglog_slope"), "x", x=[0.0, 2.0], y=[1.0, 2.0]),
    _call_row(_p("cost.machine_info"), "device", device="gpu"),
    _call_row(
        _p("cost.time_forward_backward"), "repeats", fn=lambda: torch.zeros(1, requires_grad=True).sum(), repeats=0
    ),
    # the primer's toy problems
    _call_row(_p("analysis.toy_votes"), "groups", groups=()),
    _call_row(_p("analysis.toy_votes"), "n_outliers", n_outliers=-1),
    _call_row(_p("analysis.toy_votes"), "spread", spread=-0.1),
    _call_row(_p("analysis.toy_votes"), "batch", batch=0),
    _call_row(_p("analysis.outlier_sweep"), "group", group=0, problems=2, progress=False),
    _call_row(_p("analysis.outlier_sweep"), "problems", problems=0, progress=False),
    _call_row(_p("analysis.credit_maps"), "credits", credits=torch.rand(3)),
    _call_row(_p("analysis.pose_projection"), "poses", poses=torch.rand(3)),
    # exercises
    _call_row(_p("exercises.check"), "name", name="nope", fn=lambda x: x),
]


def _critique(function: str, **replace: Any) -> Any:
    """A call of a :mod:`capsule_lib.critique` function on the tiny classifier, with ``replace``'s arguments."""
    import capsule_lib.critique as cq

    images, labels = _images(), torch.tensor([1, 2, 3, 4])
    base = {
        "routing_changes": {"model": _classifier(), "images": images, "labels": labels, "iterations": (1, 2)},
        "routing_by_layer": {"model": _classifier(), "images": images, "iterations": (1, 2)},
        "reroute_image": {"model": _classifier(), "image": images[0], "iterations": (1, 2)},
        "gradient_by_layer": {
            "model": _classifier(),
            "objective": _objective(),
            "images": images,
            "labels": labels,
            "layers": ["routing"],
        },
    }[function]
    kwargs = {k: v for k, v in {**base, **replace}.items() if v is not None or k not in ("images",)}
    return getattr(cq, function)(**kwargs)


def _objective() -> Any:
    from capsule_lib.losses import ScoreObjective

    return ScoreObjective()


def _robust(function: str, **replace: Any) -> Any:
    """A call of a :mod:`capsule_lib.robustness` function on the tiny classifier, with ``replace``'s arguments."""
    import capsule_lib.robustness as rb

    images, labels = _images(), torch.tensor([1, 2, 3, 4])
    base = {
        "attack_curves": {
            "models": {"m": _classifier()},
            "images": images,
            "labels": labels,
            "plan": {"fgsm": {"eps": [0.0, 0.1]}},
        },
        "targeted_success": {"model": _classifier(), "images": images, "labels": labels, "eps": [0.1], "n_classes": 10},
        "adversarial_examples": {"models": {"m": _classifier()}, "image": images[0], "label": 1, "eps": [0.1]},
    }[function]
    return getattr(rb, function)(**{**base, **replace})


@pytest.mark.parametrize(
    "row", VALUE_ROWS, ids=[f"{r.path.removeprefix('capsule_lib.')}:{r.argument}" for r in VALUE_ROWS]
)
def test_a_bad_value_is_refused_in_one_line_naming_the_argument(row):
    _assert_refused(row.call, row.argument)


# ------------------------------------------------------------------------------------------------ coverage
def _options(parser: Any) -> set[str]:
    """Every option string and positional argument of a command's parser (``--help`` aside)."""
    found = set()
    for action in parser._actions:
        if action.dest == "help":
            continue
        found |= set(action.option_strings) or {action.metavar or action.dest}
    return found


def test_every_entry_point_has_rows():
    """A new documented function, a new argument or a new command option without catalogue rows fails here: every
    function a chapter or the README calls refuses wrong types through ``@checked`` (or, on a forward pass, in its
    body: :data:`HOT`, each with a good call in :data:`GOOD`) and has type rows for its annotated arguments; every
    option of every command appears in :data:`COMMAND_ROWS`."""
    unchecked = []
    for path, obj in DOCUMENTED.items():
        target = obj.__init__ if isinstance(obj, type) and not hasattr(obj, "__dataclass_fields__") else obj
        is_config = isinstance(obj, type) and hasattr(obj, "__dataclass_fields__")
        checked = getattr(inspect.unwrap(getattr(target, "__func__", target)), "__checked__", False) or getattr(
            target, "__checked__", False
        )
        if not (checked or is_config or path in HOT):
            unchecked.append(path)
    assert not unchecked, f"documented but neither @checked nor HOT: {unchecked}"
    assert all(path in GOOD for path in HOT if path in DOCUMENTED), "a HOT function needs its good call in GOOD"
    if any(p.startswith("capsule_lib.models.") and p.endswith("Config") for p in DOCUMENTED):
        cfg = DOCUMENTED.get("capsule_lib.models.CapsNetConfig")
        assert cfg is None or "check_fields" in inspect.getsource(cfg.__post_init__)
    for name, module in _commands().items():
        used = {a for c, argv, _, _ in COMMAND_ROWS if c == name for a in argv}
        used |= {names for c, _, _, names in COMMAND_ROWS if c == name}
        missing = sorted(o for o in _options(module._parser()) if o not in used)
        assert not missing, f"python -m ... {name}: options without a catalogue row: {missing}"


def test_the_catalogue_finds_a_function_that_forgets_its_checks():
    """The type rows are not vacuous: an unchecked function fails them, and ``@checked`` makes it pass."""

    def mean_of(values: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return values.float().mean(dim)

    with pytest.raises(AttributeError):  # what a reader got before: 'str' object has no attribute 'float'
        mean_of("x")
    guarded = _contracts.checked(mean_of)
    message = _assert_refused(lambda: guarded("x"), "values")
    assert "a tensor" in message
    _assert_refused(lambda: guarded(torch.zeros(2), dim=1.5), "dim")
    _assert_refused(lambda: guarded(torch.zeros(2), dim=True), "dim")
    assert float(guarded(torch.ones(3))) == 1.0


# ------------------------------------------------------------------------------------------------ the findings
# Each finding of the fourth pass (#56) with the test that failed before its fix.
class _Objective:
    """A margin-loss objective whose loss (``mode="loss"``), gradient (``"gradient"``) or validation loss
    (``"validation"``) turns non-finite from training step ``at`` on."""

    def __init__(self, mode: str, at: int) -> None:
        from capsule_lib.losses import ScoreObjective

        self.inner, self.mode, self.at, self.steps = ScoreObjective(), mode, at, 0

    def __call__(self, model, batch, train):
        out = self.inner(model, batch, train)
        if train:
            self.steps += 1
        late = self.steps >= self.at
        if self.mode == "loss" and train and late:
            return dataclasses.replace(out, loss=out.loss * float("nan"))
        if self.mode == "gradient" and train and late:  # d/dw sqrt(w - w) at 0 is inf; the loss stays finite
            w = next(model.parameters())
            return dataclasses.replace(out, loss=out.loss + torch.sqrt((w - w.detach()).abs().sum()))
        if self.mode == "validation" and not train and late:
            return dataclasses.replace(out, loss=out.loss * float("nan"))
        return out


def _glyph_loaders():
    from capsule_lib.data import TensorLoader, get_dataset

    tr = get_dataset("glyph_digits", split="train", n=64)
    va = get_dataset("glyph_digits", split="val", n=32)
    return TensorLoader.from_dataset(tr, 16, shuffle=True, seed=0), TensorLoader.from_dataset(va, 32)


@pytest.mark.parametrize(
    "mode, what", [("loss", "training loss"), ("gradient", "gradient"), ("validation", "validation metric val_loss")]
)
def test_training_never_keeps_a_non_finite_model(mode, what, tmp_path):
    """Finding 1: a NaN validation loss was never checked and that epoch was selected, saved and tested. Now a
    non-finite loss, gradient or validation metric stops the run in one line (the step, the likely cause, where the
    last finite state is), that epoch is never selected, and last.pt still holds the last finite epoch."""
    from capsule_lib.train import Trainer

    torch.manual_seed(0)
    model = _classifier().__class__(_classifier().config)
    trainer = Trainer(
        model,
        _Objective(mode, at=5),
        torch.optim.Adam(model.parameters(), 1e-3),
        device="cpu",
        out_dir=tmp_path,
        progress=False,
        meta={"recipe": "r", "config": {"model": {}}},
    )
    train, val = _glyph_loaders()  # 4 steps an epoch: epoch 1 is finite, epoch 2 is not
    with pytest.raises(FloatingPointError) as info:
        trainer.fit(train, val, epochs=3)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and what in message and "epoch 2" in message, message
    assert "last.pt holds the last finite state" in message
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert last["epoch"] == 1 and best["epoch"] == 1
    for state in (last["model"], best["model"]):
        assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())
    assert [r["epoch"] for r in json.loads((tmp_path / "history.json").read_text())["records"]] == [1]


def test_an_infinite_learning_rate_is_refused_before_anything_runs():
    """Finding 1: ``--set lr=1e999`` (an infinity) passed the recipe check; every number field must be finite and
    in its range."""
    from capsule_lib.train.recipes import make_recipe

    for key, value in (("lr", "1e999"), ("lr", "nan"), ("lr_decay", "0"), ("model.init_std", "-inf")):
        with pytest.raises(ValueError, match=key.split(".")[-1]):
            make_recipe("capsnet", **{key: value})


def test_a_speedrun_with_a_failed_run_exits_non_zero_and_names_it(tmp_path, capsys, monkeypatch):
    """Finding 2: a speedrun whose every run failed printed a traceback and exited 0."""
    from capsule_lib.commands import speedrun
    from capsule_lib.train import timed

    def fails(name, *a, **k):
        raise ValueError(f"{name}: the data is not on this machine")

    monkeypatch.setattr(timed, "_one_run", fails)
    out = tmp_path / "s"
    with pytest.raises(SystemExit) as info:
        speedrun.main(["--minutes", "1", "--out", str(out), "--device", "cpu", "capsnet_speedrun"], offline=True)
    err = capsys.readouterr().err
    assert info.value.code == 1
    assert "1 of 1 runs not done: capsnet_speedrun (failed: ValueError" in err.splitlines()[-1]
    assert "Traceback" not in err
    assert json.loads((out / "speedrun.json").read_text())["runs"][0]["error"].startswith("ValueError")


def test_a_second_speedrun_into_the_same_folder_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    """Finding 3: a second speedrun into the same --out replaced speedrun.json, runs/ and the checkpoints silently;
    with --overwrite the earlier run's files go first."""
    from capsule_lib.commands import speedrun
    from capsule_lib.train import timed

    done = {"recipe": "capsnet_speedrun", "metrics": {}, "epochs_trained": 1, "train_wall_s": 1.0}
    monkeypatch.setattr(timed, "_one_run", lambda name, out, *a, **k: (out / "runs").mkdir(exist_ok=True) or done)
    out = tmp_path / "s"
    argv = ["--minutes", "1", "--out", str(out), "--device", "cpu", "capsnet_speedrun"]
    speedrun.main(argv, offline=True)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "old.pt").write_text("x")
    before = _tree(out)
    with pytest.raises(SystemExit) as info:
        speedrun.main(argv, offline=True)
    assert info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert _tree(out) == before
    speedrun.main([*argv, "--overwrite"], offline=True)
    assert not (out / "checkpoints" / "old.pt").exists()


def _registry_copy(tmp_path: Path, names=("capsnet_mnist", "baseline_cnn_mnist")) -> Path:
    import shutil

    from capsule_lib.pretrained import CHECKPOINT_DIR, registry

    reg = {n: registry()[n] for n in names}
    for entry in reg.values():
        for key in ("file", "history"):
            shutil.copy(CHECKPOINT_DIR / entry[key], tmp_path / entry[key])
    (tmp_path / "registry.json").write_text(json.dumps(reg))
    return tmp_path


def _edit(entry: dict, field: str) -> None:
    if field.startswith("metrics."):
        key = field.split(".")[1]
        entry["metrics"][key] = {"test_acc": 0.9999, "test_errors": 1, "val_acc": 0.9999}[key]
    elif field == "training":
        entry["training"]["epochs"] = 100
    elif field == "dtype":
        entry["dtype"] = "float32"
    elif field == "notes":
        entry["notes"] = "trained for a week"
    elif field == "history":
        entry["history"] = "baseline_cnn_mnist.history.json"
    elif field == "config":  # #64: edited, and its config_sha256 recomputed to match
        from capsule_lib.pretrained import config_sha256

        entry["config"]["iterations"] = 1
        entry["config_sha256"] = config_sha256(entry["model"], entry["config"])


@pytest.mark.parametrize(
    "field",
    ["metrics.test_acc", "metrics.test_errors", "metrics.val_acc", "training", "dtype", "notes", "history", "config"],
)
def test_an_edited_registry_entry_is_refused_naming_the_field(field, tmp_path):
    """Finding 4: an entry whose metrics (test_acc 0.9934 -> 0.9999, test_errors 66 -> 1), training, dtype, notes or
    history were edited loaded and reported the edited values; only the weights and the config were bound."""
    from capsule_lib.pretrained import load_pretrained, registry

    d = _registry_copy(tmp_path)
    assert set(registry(d)) == {"capsnet_mnist", "baseline_cnn_mnist"}  # the copy is sound
    reg = json.loads((d / "registry.json").read_text())
    _edit(reg["capsnet_mnist"], field)
    (d / "registry.json").write_text(json.dumps(reg))
    name = field.split(".")[0]
    for call in (lambda: registry(d), lambda: load_pretrained("capsnet_mnist", directory=d)):
        message = _assert_refused(call, name)
        assert "capsnet_mnist" in message


def test_an_entry_whose_config_is_not_bound_to_its_weights_is_refused(tmp_path):
    """#64: the config's hash is computed from the config by the loader; an entry exported before it was bound (or
    whose binding was deleted) is refused, not trusted."""
    from capsule_lib.pretrained import registry

    d = _registry_copy(tmp_path)
    reg = json.loads((d / "registry.json").read_text())
    del reg["capsnet_mnist"]["bound_sha256"]["config"]
    (d / "registry.json").write_text(json.dumps(reg))
    assert "configuration is not bound to its weights" in _assert_refused(lambda: registry(d), "capsnet_mnist")


def test_an_entry_pointing_at_another_models_weights_is_refused(tmp_path):
    """Finding 4 and the tracebacks: an entry given another model's file and sha256 failed with a 6-line
    load_state_dict error (or loaded when the shapes matched)."""
    from capsule_lib.pretrained import registry

    d = _registry_copy(tmp_path)
    reg = json.loads((d / "registry.json").read_text())
    for key in ("file", "sha256"):
        reg["capsnet_mnist"][key] = reg["baseline_cnn_mnist"][key]
    (d / "registry.json").write_text(json.dumps(reg))
    assert "not those its other fields were exported with" in _assert_refused(lambda: registry(d), "capsnet_mnist")


def test_a_missing_history_file_is_one_line(tmp_path):
    """The tracebacks: a missing history file was a bare ``[Errno 2]``."""
    from capsule_lib.pretrained import load_pretrained_history

    d = _registry_copy(tmp_path)
    (d / "capsnet_mnist.history.json").unlink()
    _assert_refused(lambda: load_pretrained_history("capsnet_mnist", directory=d), "history")


class _Exploit:
    """A pickle that runs code when loaded (``__reduce__``): it would write a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_run_folder_holding_a_malicious_pickle_is_refused_without_running_it(tmp_path):
    """Unsafe loading: run checkpoints were read with weights_only=False, so a shared run folder (for a resume, an
    export or --start-from) could run code when loaded."""
    from capsule_lib.train import Trainer
    from capsule_lib.train.checkpoint import UnsafeCheckpointError
    from capsule_lib.train.shipped import export_run

    marker = tmp_path / "owned"
    torch.save({"epoch": 1, "model": {}, "exploit": _Exploit(marker)}, tmp_path / "last.pt")
    torch.save({"epoch": 1, "model": {}, "record": _Exploit(marker)}, tmp_path / "best.pt")
    model = _classifier()
    trainer = Trainer(
        model, _objective(), torch.optim.Adam(model.parameters()), device="cpu", out_dir=tmp_path, progress=False
    )
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        trainer.resume()
    (tmp_path / "history.json").write_text(
        json.dumps({"meta": {"recipe": "routing_compare_mnist", "config": {"model": {}}}, "records": []})
    )
    with pytest.raises((UnsafeCheckpointError, ValueError, KeyError)):
        export_run(tmp_path, "x", directory=tmp_path / "out")
    assert not marker.exists()


# ------------------------------------------------------------------- a run folder is one thing (issue #64)
@functools.cache
def _two_runs(root: str) -> dict[str, Path]:
    """Two finished tiny runs on a folder of images (same shapes: ``one`` and ``two``), and one of other shapes
    (``wide``), written once under ``root``; each test copies what it spoils."""
    from PIL import Image

    from capsule_lib.train import train

    base = Path(root)
    pics = base / "pics"
    for k, name in enumerate(["cat", "dog"]):
        (pics / name).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            Image.new("RGB", (12, 12), (40 * k + 5 * i, 0, 0)).save(pics / name / f"{i}.png")
    kw = dict(dataset=f"images:{pics}", epochs=1, device="cpu", progress=False, **{"model.hidden": [8, 8]})
    runs = {}
    for name, channels, seed in (("one", [4, 4, 4], 0), ("two", [4, 4, 4], 1), ("wide", [8, 8, 8], 0)):
        train("baseline_cnn", out_dir=base / "runs" / name, seed=seed, **{"model.channels": channels}, **kw)
        runs[name] = base / "runs" / name
    return runs


@pytest.fixture
def two_runs(tmp_path_factory, tmp_path) -> dict[str, Path]:
    import shutil

    runs = _two_runs(str(tmp_path_factory.getbasetemp() / "two_runs"))
    for name, folder in runs.items():
        shutil.copytree(folder, tmp_path / name)
    return {name: tmp_path / name for name in runs}


def _history_edit(folder: Path, edit) -> None:
    data = json.loads((folder / "history.json").read_text())
    edit(data["meta"])
    (folder / "history.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "spoil, part",
    [
        (lambda r: _history_edit(r["one"], lambda m: m.update(classes=m["classes"][::-1])), "history.json"),
        (lambda r: _history_edit(r["one"], lambda m: m.update(classes=["a", "b", "c", "d"])), "history.json"),
        (lambda r: _history_edit(r["one"], lambda m: m["config"]["model"].update(hidden=[8, 9])), "history.json"),
        (lambda r: (r["one"] / "best.pt").write_bytes((r["two"] / "best.pt").read_bytes()), "best.pt"),
        (lambda r: (r["one"] / "best.pt").write_bytes((r["wide"] / "best.pt").read_bytes()), "best.pt"),
        (lambda r: (r["one"] / "run.json").unlink(), "run.json"),
    ],
    ids=[
        "classes-reversed",
        "classes-of-another-length",
        "config-edited",
        "another-runs-best",
        "other-shapes",
        "no-run",
    ],
)
def test_a_run_folder_whose_parts_differ_is_refused_naming_the_part(two_runs, spoil, part, capsys):
    """predict trusted history.json: reversed class names printed reversed, another run's best.pt loaded under this
    run's names, a best.pt of other shapes a 19-line traceback. Now: one line naming the part, everywhere."""
    from capsule_lib.commands.predict import main as predict_main
    from capsule_lib.pretrained import load_trained
    from capsule_lib.train.checkpoint import RunMismatchError

    model, info = load_trained(two_runs["one"])  # unspoilt: loads
    assert info["classes"] == ["cat", "dog"]
    spoil(two_runs)
    with pytest.raises(RunMismatchError) as e:
        load_trained(two_runs["one"])
    assert part in str(e.value) and "\n" not in str(e.value)
    image = _png_for(two_runs["one"])
    with pytest.raises(SystemExit) as info:
        predict_main([str(two_runs["one"]), str(image)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and part in err[0], err


def _png_for(folder: Path) -> Path:
    from PIL import Image

    path = folder.parent / "probe.png"
    Image.new("RGB", (12, 12), (9, 9, 9)).save(path)
    return path


def test_a_resume_onto_a_spoilt_run_folder_is_refused(two_runs):
    from capsule_lib.train import train
    from capsule_lib.train.checkpoint import RunMismatchError

    meta = json.loads((two_runs["one"] / "history.json").read_text())["meta"]
    (two_runs["one"] / "last.pt").write_bytes((two_runs["two"] / "last.pt").read_bytes())
    kw = {"model.channels": [4, 4, 4], "model.hidden": [8, 8]}
    with pytest.raises(RunMismatchError, match="last.pt is not the one this run wrote"):
        train(
            "baseline_cnn",
            dataset=meta["dataset"],
            epochs=2,
            device="cpu",
            progress=False,
            resume=True,
            out_dir=two_runs["one"],
            **kw,
        )


def test_a_run_folders_parts_are_bound_as_they_are_written(two_runs):
    from capsule_lib.train.checkpoint import check_run, run_identity

    bound = json.loads((two_runs["one"] / "run.json").read_text())["parts"]
    assert sorted(bound) == ["best.pt", "history.json", "last.pt"]
    meta = json.loads((two_runs["one"] / "history.json").read_text())["meta"]
    assert bound["history.json"] == run_identity(meta) != run_identity({**meta, "classes": ["dog", "cat"]})
    check_run(two_runs["one"], ("best.pt", "last.pt", "history.json"))


# --------------------------------------------------------------------- Ctrl-C and warnings (issue #64, item 4)
@pytest.mark.parametrize(
    "where", ["capsule_lib.data.images._list_folder", "capsule_lib.data.image_folder.decode_files"]
)
def test_ctrl_c_while_a_folder_is_listed_or_decoded_is_one_line_and_130(where, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the folder was listed or decoded: exit 1 and a 59-104-line traceback."""
    from PIL import Image

    from capsule_lib.commands.train import main
    from capsule_lib.data import images as images_module

    for name in ("a", "b"):
        (tmp_path / "pics" / name).mkdir(parents=True)
        for k in range(5):
            Image.new("L", (12, 12), 10 * k).save(tmp_path / "pics" / name / f"{k}.png")

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupt)
    images_module._LOADED.clear()
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["capsnet", "--images", str(tmp_path / "pics"), "--out", str(tmp_path / "runs" / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 130 and len(err) == 1 and "interrupted (Ctrl-C)" in err[0], err
    assert _tree(tmp_path) == before


def test_ctrl_c_while_predict_reads_images_is_one_line_and_130(tmp_path, capsys, monkeypatch):
    from capsule_lib.commands import predict as command

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "predict", interrupt)
    with pytest.raises(SystemExit) as info:
        command.main(["capsnet_mnist", str(_folders(tmp_path)["IMG"])])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 130 and len(err) == 1 and "interrupted (Ctrl-C)" in err[0], err


def test_an_unsafe_checkpoint_is_refused_without_torchs_warning_lines(tmp_path, monkeypatch, recwarn):
    """torch's three warning lines preceded the one-line refusal."""
    import pickle
    import warnings

    from capsule_lib.train.checkpoint import UnsafeCheckpointError, _load_checkpoint

    def load(*a, **k):
        for _ in range(3):
            warnings.warn("torch says something about weights_only", UserWarning, stacklevel=2)
        raise pickle.UnpicklingError("Weights only load failed")

    def unsafe(*a, **k):
        warnings.warn("torch says something else", UserWarning, stacklevel=2)
        return ["posix.system"]

    monkeypatch.setattr(torch, "load", load)
    monkeypatch.setattr(torch.serialization, "get_unsafe_globals_in_checkpoint", unsafe)
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        _load_checkpoint(tmp_path / "last.pt", "cpu")
    assert not [str(w.message) for w in recwarn.list], [str(w.message) for w in recwarn.list]


def test_a_full_disk_leaves_no_tmp_and_says_which_file(tmp_path, monkeypatch):
    """The tracebacks: export_checkpoint on a full disk ('unexpected pos', x.pt.tmp left behind), and a run whose
    folder turns read-only (a traceback that named no path)."""
    from capsule_lib.train import Trainer
    from capsule_lib.train.checkpoint import CheckpointWriteError
    from capsule_lib.train.shipped import export_checkpoint

    real = torch.save

    def full(obj, f, *a, **k):
        real(obj, f, *a, **k)
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4288 vs 4176")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointWriteError) as info:
        export_checkpoint(nn.Linear(2, 2), "x", "baseline_cnn", {}, metrics={}, training={}, directory=tmp_path)
    assert str(tmp_path) in str(info.value) and len(str(info.value).splitlines()) == 1
    assert _tree(tmp_path) == []
    monkeypatch.setattr(torch, "save", real)

    def read_only(src, dst):
        raise OSError(30, "Read-only file system", str(dst))

    model = _classifier().__class__(_classifier().config)
    trainer = Trainer(
        model, _objective(), torch.optim.Adam(model.parameters()), device="cpu", out_dir=tmp_path / "r", progress=False
    )
    monkeypatch.setattr("os.replace", read_only)
    with pytest.raises(CheckpointWriteError) as info:
        trainer.fit(*_glyph_loaders(), epochs=1)
    assert str(tmp_path / "r") in str(info.value) and "Read-only" in str(info.value)
    assert not [p for p in _tree(tmp_path) if p.endswith(".tmp")]


# ------------------------------------------------------------------------------------------------ properties
from hypothesis import given, settings  # noqa: E402  (the property tests close the file)
from hypothesis import strategies as st  # noqa: E402

from capsule_lib.routing.kinds import ROUTING_KINDS  # noqa: E402

_SCALES = st.sampled_from([0.0, 1e-3, 1.0, 30.0, 1e3])


def _activations(kind: str, batch: int) -> torch.Tensor | None:
    scale = ROUTING_KINDS[kind].activations
    if scale is None:
        return None
    return torch.rand(batch, 12) if scale == "probabilities" else torch.randn(batch, 12) * 3


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(sorted(ROUTING_KINDS)),
    batch=st.integers(1, 3),
    scale=_SCALES,
    seed=st.integers(0, 999),
    couplings=st.sampled_from(["routed", "uniform", "random"]),
)
def test_finite_inputs_give_finite_outputs_and_gradients_and_couplings_sum_to_one(kind, batch, scale, seed, couplings):
    torch.manual_seed(seed)
    layer = _layer(kind)
    poses = (torch.randn(batch, 12, 4) * scale).requires_grad_()
    r = layer.route(poses, _activations(kind, batch), return_routing=True, couplings=couplings)
    outputs = [r.poses] + ([r.activations] if r.activations is not None else [])
    assert all(bool(torch.isfinite(o).all()) for o in outputs)
    sum(o.float().sum() for o in outputs).backward()
    grads = [poses.grad] + [p.grad for p in layer.parameters() if p.grad is not None]
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    for c in r.trace.coefficients:  # [B, n_inp, n_out] each, shares of each child's one unit of vote
        assert bool((c >= 0).all()) and torch.allclose(c.sum(-1).double(), torch.ones(()).double(), atol=1e-4)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    n=st.integers(2, 6),
    n_inp=st.integers(1, 8),
    n_out=st.integers(2, 6),
    sharpness=st.floats(0.0, 50.0),
    seed=st.integers(0, 999),
    threshold=st.floats(0.0, 1.0),
)
def test_coupling_statistics_stay_in_zero_one(n, n_inp, n_out, sharpness, seed, threshold):
    from capsule_lib.critique import coupling_stats

    g = torch.Generator().manual_seed(seed)
    couplings = torch.softmax(torch.randn(n, n_inp, n_out, generator=g) * sharpness, -1)
    stats = coupling_stats(couplings, torch.rand(n, n_out, generator=g), threshold=threshold)
    for value in (stats.entropy, stats.max_share, stats.alive):
        assert -1e-9 <= value <= 1 + 1e-9
    assert stats.variation >= 0


@settings(max_examples=40, deadline=None, derandomize=True)
@given(scale=st.sampled_from([0.0, 1e-6, 1.0, 1e3, 1e30]), d=st.integers(1, 16), seed=st.integers(0, 999))
def test_squashed_lengths_lie_in_zero_one_with_a_finite_gradient(scale, d, seed):
    from capsule_lib import capsule_lengths, squash_efficient, squash_hinton

    torch.manual_seed(seed)
    for squash in (squash_hinton, squash_efficient):
        s = (torch.randn(3, d) * scale).requires_grad_()
        lengths = capsule_lengths(squash(s))
        assert bool(((lengths >= 0) & (lengths < 1 + 1e-6)).all())
        lengths.sum().backward()
        assert bool(torch.isfinite(s.grad).all())
