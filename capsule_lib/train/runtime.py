"""What a training process needs around the loop of :class:`~capsule_lib.train.trainer.Trainer`: seeds, the device,
Ctrl-C, :class:`EpochSums` (an epoch's losses and counts summed on the device) and the finiteness checks
(:func:`nonfinite_gradient`, :func:`nonfinite_record`).
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
from typing import Any

import numpy as np
import torch

__all__ = [
    "rng_state",
    "set_rng_state",
    "seed_everything",
    "select_device",
    "TrainingInterrupted",
    "EpochSums",
    "nonfinite_gradient",
    "nonfinite_record",
]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every random state a run checkpoint keeps (torch, NumPy, Python, CUDA), as tensors and plain values only, so
    that ``torch.load(weights_only=True)`` reads it back."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (str(kind), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(rng: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (NumPy's state also in NumPy's own form, from older checkpoints)."""
    if rng.get("torch") is not None:
        torch.set_rng_state(rng["torch"])
    if rng.get("numpy") is not None:
        kind, keys, *rest = rng["numpy"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        np.random.set_state((kind, keys.astype(np.uint32), *rest))
    if rng.get("python") is not None:
        state = rng["python"]  # a tuple, read back as a list of lists from some formats
        random.setstate((state[0], tuple(state[1]), state[2]))
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def select_device(preference: str | torch.device | None = "auto") -> torch.device:
    """``"auto"``/``None`` -> cuda if available, else mps, else cpu; anything else is passed to ``torch.device``."""
    if preference in (None, "auto", ""):
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(preference)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C (SIGINT) after the batch in progress; ``str()`` says where the run can be resumed."""


@contextlib.contextmanager
def _stop_on_sigint(flag: dict[str, bool]):
    """While training: the first Ctrl-C sets ``flag["stop"]`` (the loop stops after its batch, with a checkpoint);
    a second one interrupts at once. Only in the main thread (signal handlers cannot be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("stop"):
            raise KeyboardInterrupt
        flag["stop"] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class EpochSums:
    """An epoch's summed loss, correct predictions, samples and loss parts (per-sample values times the batch size),
    added up where the objective computed them: on a GPU a step never waits to report its loss. :meth:`floats` reads
    them (once per epoch for the record, and when a checkpoint stores them); ``done`` starts from such a reading."""

    def __init__(self, done: dict[str, Any] | None = None) -> None:
        done = done or {}
        self.loss, self.correct, self.n = done.get("loss_sum", 0.0), done.get("correct", 0.0), done.get("n", 0)
        self.parts: dict[str, Any] = dict(done.get("sums", {}))

    def add(self, out: Any) -> None:
        """Add one batch's :class:`~capsule_lib.losses.StepOutput`."""
        b = out.n
        self.loss = self.loss + out.loss.detach().float() * b
        self.correct = self.correct + out.correct
        self.n += b
        for k, v in out.parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + v * b

    def floats(self) -> dict[str, Any]:
        """The sums as numbers (reads the device): ``loss_sum``, ``correct``, ``n`` and ``sums`` (the parts)."""
        return {
            "loss_sum": float(self.loss),
            "correct": float(self.correct),
            "n": self.n,
            "sums": {k: float(v) for k, v in self.parts.items()},
        }


def nonfinite_gradient(
    model: torch.nn.Module, norm: torch.Tensor | None, device: torch.device, *, scaled: bool = False
) -> torch.Tensor:
    """Whether a step's gradients hold a NaN or an infinity, as a boolean tensor on ``device`` (read later with the
    loss's flag, so a GPU step never waits). ``norm``: the total norm, when clipping computed it. ``scaled``: fp16 with
    a gradient scaler, whose business an infinite gradient is (it skips that step and lowers its scale): no flag."""
    if norm is None and not scaled:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.stack(torch._foreach_norm(grads)).sum() if grads else None  # finite iff every gradient is
    if norm is None or scaled:
        return torch.zeros((), dtype=torch.bool, device=device)
    return ~torch.isfinite(norm.detach()).to(device)


def nonfinite_record(record: dict[str, Any], models: dict[str, torch.nn.Module | None]) -> str | None:
    """What is not finite after an epoch, in words (``None``: nothing): the first weight holding NaN or inf among
    ``models`` (``{prefix: module}``), else the first validation metric (``val_*``) of ``record`` that is NaN or inf."""
    for prefix, module in models.items():
        for name, p in module.named_parameters() if module is not None else ():
            if not bool(torch.isfinite(p).all()):
                return f"the weight {prefix + name!r} holds nan or inf"
    for key, value in record.items():
        if key.startswith("val_") and isinstance(value, float) and not math.isfinite(value):
            return f"the validation metric {key} is {value}"
    return None
