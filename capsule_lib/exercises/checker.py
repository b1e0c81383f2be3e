"""The checker of the chapters' code exercises: a reader's function against the library's reference.

An :class:`Exercise` is data: the cases to run (inputs and the reference's outputs, computed by the library), and
the known mistakes (:class:`Mistake`: a wrong implementation, as the seeds' code made it, and the sentence that names
it). :func:`run_exercise` calls the reader's function on every case and stops at the first case where it differs,
saying in one line what differs: an exception, the type, the shape, the dtype, NaN or inf, the values, a missing or
non-finite gradient, the gradient's values. Where the reader's outputs (or gradients) equal a known mistake's on
that case, the verdict names that mistake instead. Nothing the reader's function does makes the checker raise or
hang: a call that runs past the time limit (:data:`TIME_LIMIT_S` a case) is stopped and said ("did not return within
N s"), a tensor on another device or of any dtype is one line, and a function that changes an input in place is
named with the argument it changed.
"""

from __future__ import annotations

import html
import inspect
import math
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "Mistake", "Exercise", "CheckResult", "ExerciseFailed", "run_exercise", "TIME_LIMIT_S"]

#: seconds one call of the reader's function may take on one case (the cases are tiny, and the reference takes ms)
TIME_LIMIT_S = 10.0


class _TimedOut(BaseException):
    """The reader's call ran past the time limit (a BaseException: an ``except Exception`` in it does not catch it)."""


def _call(fn: Callable[..., Any], args: tuple, limit: float) -> Any:
    """``fn(*args)``, stopped after ``limit`` seconds (:class:`_TimedOut`): by an alarm signal in the main thread
    (a Python loop is interrupted; a single long torch operation at its end), else in a helper thread that is left
    behind when it does not return (the verdict is given anyway)."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        def alarm(signum: int, frame: Any) -> None:
            raise _TimedOut

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, limit, 0.5)  # again every 0.5 s: a bare except in fn cannot keep it
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["out"]


@dataclass(frozen=True)
class Case:
    """One input of an exercise and what the reference returns for it.

    Attributes
    ----------
    name : str
        What the case is, for the verdict ("zero vectors [2, 3, 8]").
    args : tuple
        The reader's function is called as ``fn(*args)``; tensors are cloned for every call.
    expected : Any
        The reference's output: a tensor, a tuple of tensors, or a plain value (str, float) compared with ``==``
        (floats within the tolerance).
    grad : str
        ``"exact"``: gradients of the outputs with respect to the tensors ``wrt`` are compared with ``reference``'s;
        ``"finite"``: they must exist and be finite; ``"none"``: not checked.
    wrt : tuple of int
        Positions in ``args`` of the float tensors the gradient is taken with respect to.
    reference : Callable or None
        The reference as a function of ``args`` (for ``grad="exact"``; ``None`` otherwise).
    atol : float or None
        An absolute tolerance for this case's values where correct implementations may differ (a safe norm of a
        zero vector is ``sqrt(eps)``); ``None``: the dtype's.
    """

    name: str
    args: tuple
    expected: Any
    grad: str = "none"
    wrt: tuple[int, ...] = (0,)
    reference: Callable[..., Any] | None = None
    atol: float | None = None


@dataclass(frozen=True)
class Mistake:
    """A known wrong implementation and the sentence that names it (shown when the reader's function returns what
    ``fn`` returns on a case where the reference returns something else)."""

    key: str
    message: str
    fn: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    """A code exercise: the function the reader writes, the cases it is checked on and the mistakes it recognises.

    Attributes
    ----------
    name : str
        The name ``check(name, fn)`` takes (also the function's name in the stub).
    chapter : str
        The chapter notebook (``book/<chapter>.ipynb``) whose end holds the stub and the solution.
    signature : str
        The function's signature with shapes, as the stub shows it.
    task : str
        One sentence: what to compute.
    cases : Callable
        ``() -> list[Case]``, built when checked (deterministic: fixed seeds).
    mistakes : tuple of Mistake
        The seeds' mistakes this exercise recognises.
    """

    name: str
    chapter: str
    signature: str
    task: str
    cases: Callable[[], list[Case]]
    mistakes: tuple[Mistake, ...] = ()


class ExerciseFailed(AssertionError):
    """Raised by ``check(..., must_pass=True)`` (a chapter's solution cell) when the function does not pass."""


@dataclass
class CheckResult:
    """The verdict on one function: ``passed``, a one-line ``message``, the recognised ``mistake`` (its key, or
    ``None``) and ``status`` (``"passed"``, ``"failed"`` or ``"todo"``: the stub is not filled in yet)."""

    name: str
    passed: bool
    message: str
    mistake: str | None = None
    status: str = "failed"
    cases: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        mark = {"passed": "✓", "todo": "…"}.get(self.status, "✗")
        return f"{mark} {self.name}: {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = {"passed": "#1b7f3b", "todo": "#6b6b6b"}.get(self.status, "#b3261e")
        return (
            f'<div class="capsule-check" style="border-left: 4px solid {colour}; padding: 2px 8px; '
            f'font-family: sans-serif">{html.escape(str(self))}</div>'
        )


# ------------------------------------------------------------------------------------------------ comparison
def _tolerances(t: torch.Tensor) -> tuple[float, float]:
    return (1e-7, 1e-9) if t.dtype == torch.float64 else (2e-4, 2e-5)


def _close(got: torch.Tensor, want: torch.Tensor, atol: float | None = None) -> bool:
    """Equal shapes, dtypes and values within the dtype's tolerance (or ``atol``), scaled by the reference's size;
    NaN equals NaN."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not torch.is_floating_point(want):
        return bool(torch.equal(got.to(want.dtype), want))
    rtol, dtype_atol = _tolerances(want)
    atol = dtype_atol if atol is None else atol
    g, w = got.detach().double(), want.detach().double()
    finite = torch.isfinite(w)
    scale = float(w[finite].abs().max()) if bool(finite.any()) else 1.0
    return bool(torch.allclose(g, w, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True))


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _same(got: Any, want: Any, atol: float | None = None) -> bool:
    """Outputs equal: tensors by :func:`_close`, floats (or a 0-d tensor for a float) within a relative 1e-5,
    anything else with ``==``."""
    gs, ws = _as_tuple(got), _as_tuple(want)
    if len(gs) != len(ws):
        return False
    for g, w in zip(gs, ws):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or not _close(g, w, atol):
                return False
        elif isinstance(w, float):
            if isinstance(g, torch.Tensor) and g.numel() == 1:
                g = float(g.detach())
            if isinstance(g, (int, float)) and math.isnan(g) and math.isnan(w):
                continue
            if not isinstance(g, (int, float)) or not math.isclose(float(g), w, rel_tol=1e-5, abs_tol=1e-9):
                return False
        elif g != w:
            return False
    return True


def _fresh(args: tuple, wrt: Sequence[int], grad: bool) -> tuple:
    """Clones of the case's tensors (a reader's in-place edit cannot leak into the next call); the ``wrt`` ones
    require grad when ``grad``."""
    out = []
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            a = a.detach().clone()
            if grad and k in wrt and a.is_floating_point():
                a.requires_grad_(True)
        out.append(a)
    return tuple(out)


def _cotangents(outputs: tuple, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outputs]


def _grads(fn: Callable, args: tuple, wrt: Sequence[int]) -> tuple[Any, list[torch.Tensor | None]]:
    """``fn(*args)`` on fresh copies that require grad, and the gradients of ``sum(out * fixed random)`` with
    respect to the ``wrt`` arguments (``None`` where none flows back)."""
    xs = _fresh(args, wrt, True)
    with torch.enable_grad():
        out = fn(*xs)
        outs = [o for o in _as_tuple(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        terms = [(o * c).sum() for o, c in zip(outs, _cotangents(tuple(outs))) if o.requires_grad]
        inputs = [xs[k] for k in wrt if isinstance(xs[k], torch.Tensor)]
        if not terms:
            return out, [None] * len(inputs)
        total = sum(terms[1:], terms[0])
        gs = torch.autograd.grad(total, inputs, allow_unused=True)
    return out, list(gs)


# ---------------------------------------------------------------------------------------------- the checker
def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).replace('torch.', '')} tensor of shape {list(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"an object of type {type(x).__name__}" if x is not None else "None"


def _mistake_on(exercise: Exercise, case: Case, got: Any, got_grads: list | None) -> Mistake | None:
    """The known mistake whose output (or, when ``got_grads`` is given, gradient) the reader's equals on this case,
    where it differs from the reference's."""
    for m in exercise.mistakes:
        try:
            if got_grads is None:
                wrong = m.fn(*_fresh(case.args, case.wrt, False))
                if not _same(wrong, case.expected) and _same(got, wrong):
                    return m
            else:
                wrong, wrong_grads = _grads(m.fn, case.args, case.wrt)
                _, ref_grads = _grads(case.reference, case.args, case.wrt) if case.reference else (None, None)
                if ref_grads is not None and _grads_equal(wrong_grads, ref_grads):
                    continue  # this mistake does not show in the gradient here
                if _same(wrong, got) and _grads_equal(got_grads, wrong_grads):
                    return m
        except Exception:  # a mistake that cannot run on this case does not match it
            continue
    return None


def _grads_equal(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (x is None) != (y is None) or (x is not None and not _close(x, y)):
            return False
    return True


def _first_difference(got: Any, want: Any) -> str:
    """What differs between two outputs of the same structure, in words."""
    gs, ws = _as_tuple(got), _as_tuple(want)
    many = len(ws) > 1
    for k, (g, w) in enumerate(zip(gs, ws)):
        which = f"output {k + 1} " if many else ""
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"{which}returned {_describe(g)}, expected {_describe(w)}"
            if tuple(g.shape) != tuple(w.shape):
                return f"{which}has shape {list(g.shape)}, expected {list(w.shape)}"
            if g.dtype != w.dtype:
                got_t, want_t = (str(t.dtype).replace("torch.", "") for t in (g, w))
                return f"{which}is {got_t}, expected {want_t} (keep the input's dtype)"
            bad = ~torch.isfinite(g.detach()) & torch.isfinite(w)
            if bool(bad.any()):
                kind = "NaN" if bool(torch.isnan(g.detach()[bad]).any()) else "inf"
                return f"{which}has {kind} in {int(bad.sum())} of {g.numel()} entries where the reference is finite"
            if not _close(g, w):
                diff = float((g.detach().double() - w.detach().double()).abs().max())
                return f"{which}differs from the reference by up to {diff:.3g}"
        elif not _same(g, w):
            return f"{which}is {g!r}, expected {w!r}"
    return "differs from the reference"


def _structure_ok(got: Any, want: Any) -> str | None:
    gs, ws = _as_tuple(got), _as_tuple(want)
    if isinstance(want, tuple) and (not isinstance(got, (tuple, list)) or len(gs) != len(ws)):
        return f"returned {_describe(got)}, expected a tuple of {len(ws)}"
    if not isinstance(want, tuple) and isinstance(got, (tuple, list)):
        return f"returned {_describe(got)}, expected {_describe(want)}"
    many = len(ws) > 1
    for k, (g, w) in enumerate(zip(gs, ws)):
        if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor):
            which = f"output {k + 1} " if many else ""
            if g.device != w.device:
                return f"{which}is on the {g.device} device, expected {w.device} (keep the input's device)"
            if g.layout != w.layout:
                return f"{which}is a {str(g.layout).replace('torch.', '')} tensor, expected a dense (strided) one"
            if g.dtype != w.dtype and (g.dtype.is_complex or g.is_quantized or g.dtype.itemsize == 0):
                got_t, want_t = (str(t.dtype).replace("torch.", "") for t in (g, w))
                return f"{which}is {got_t}, expected {want_t} (keep the input's dtype)"
    return None


def _changed_inputs(fn: Any, before: tuple, after: tuple) -> str | None:
    """The name of the first tensor argument the reader's call changed in place (its values, shape or dtype), as the
    function names it where its signature says (``s``), else by position; ``None`` when none changed."""
    for k, (a, b) in enumerate(zip(before, after)):
        if not isinstance(a, torch.Tensor):
            continue
        b = b.detach()
        same = a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        if same and a.is_floating_point():
            same = bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
        elif same:
            same = bool(torch.equal(a, b))
        if not same:
            try:
                names = list(inspect.signature(fn).parameters)
            except (TypeError, ValueError):
                names = []
            return f"'{names[k]}'" if k < len(names) else f"argument {k + 1}"
    return None


def run_exercise(exercise: Exercise, fn: Any, time_limit: float = TIME_LIMIT_S) -> CheckResult:
    """Check ``fn`` on every case of ``exercise``; the verdict of the first case where it differs (see the module
    docstring). Never raises because of ``fn``, and never waits more than ``time_limit`` seconds for one call of
    it. Runs torch on one thread (the cases are tiny: more threads only wait for each other on a busy machine),
    restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(exercise, fn, time_limit)
    finally:
        torch.set_num_threads(threads)


def _run(exercise: Exercise, fn: Any, limit: float = TIME_LIMIT_S) -> CheckResult:
    name = exercise.name

    def fail(message: str, mistake: Mistake | None = None, status: str = "failed") -> CheckResult:
        if mistake is not None:
            return CheckResult(name, False, f"{mistake.message} (on {case.name})", mistake.key, status, done)
        return CheckResult(name, False, message, None, status, done)

    if not callable(fn):
        return CheckResult(name, False, f"expected a function, got {_describe(fn)} (pass the function itself)")
    cases, done = exercise.cases(), []
    for k, case in enumerate(cases):
        args = _fresh(case.args, case.wrt, False)
        try:
            got = _call(fn, args, limit)
        except _TimedOut:
            return fail(f"did not return within {limit:g} s (an endless loop?) (on {case.name})")
        except NotImplementedError:
            return fail(f"not written yet: fill in the body of {name} and run the cell again", status="todo")
        except Exception as e:  # the reader's function raised: say so, in one line
            return fail(f"raised {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''} (on {case.name})")
        changed = _changed_inputs(fn, case.args, args)
        if changed is not None:
            return fail(
                f"changes its input {changed} in place (an in-place operation such as x.mul_() or x /= ...); compute "
                f"a new tensor instead (on {case.name})"
            )
        if k == 0 and (got is None or got is Ellipsis):
            return fail(f"returns None: write the body of {name}, then run the cell again", status="todo")
        try:
            problem = _structure_ok(got, case.expected)
            if problem is None and not _same(got, case.expected, case.atol):
                problem = _first_difference(got, case.expected)
        except Exception as e:  # noqa: BLE001 - something the comparison cannot read: said, never raised
            problem = f"returned {_describe(got)} that cannot be compared ({type(e).__name__})"
        if problem is not None:
            return fail(f"{problem} (on {case.name})", _mistake_on(exercise, case, got, None))
        if case.grad != "none":
            verdict = _check_gradient(exercise, case, fn, limit)
            if verdict is not None:
                return fail(*verdict)
        done.append(case.name)
    grads = " and gradients" if any(c.grad != "none" for c in cases) else ""
    shown = ", ".join(c.name for c in cases[:3]) + (", ..." if len(cases) > 3 else "")
    return CheckResult(name, True, f"right on all {len(cases)} cases{grads} ({shown})", None, "passed", done)


def _check_gradient(
    exercise: Exercise, case: Case, fn: Callable, limit: float = TIME_LIMIT_S
) -> tuple[str, Mistake | None] | None:
    """``None`` when the gradient is right on ``case``, else ``(message, recognised mistake)``."""
    try:
        got, got_grads = _call(_grads, (fn, case.args, case.wrt), limit)
    except _TimedOut:
        return f"did not return within {limit:g} s while its gradient was computed (on {case.name})", None
    except Exception as e:
        text = str(e).splitlines()[0][:120] if str(e) else ""
        if "in-place" in text:
            return f"changes an input in place, which breaks its gradient ({text}) (on {case.name})", None
        return f"its gradient could not be computed: {type(e).__name__}: {text} (on {case.name})", None
    if all(g is None for g in got_grads):
        mistake = _mistake_on(exercise, case, got, got_grads)
        return (
            f"no gradient flows back to the inputs (a .detach(), .data, .item() or numpy on the way?) (on {case.name})",
            mistake,
        )
    for g in got_grads:
        if g is not None and not bool(torch.isfinite(g).all()):
            bad = "NaN" if bool(torch.isnan(g).any()) else "inf"
            mistake = _mistake_on(exercise, case, got, got_grads)
            return f"the gradient has {bad} (on {case.name})", mistake
    if case.grad == "exact" and case.reference is not None:
        _, want = _grads(case.reference, case.args, case.wrt)
        if not _grads_equal(got_grads, want):
            mistake = _mistake_on(exercise, case, got, got_grads)
            return f"the values are right but the gradient differs from the reference's (on {case.name})", mistake
    return None
