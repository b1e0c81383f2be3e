"""What a training process needs around the loop of :class:`~capsule_lib.train.trainer.Trainer`: seeds, the device,
Ctrl-C, and :class:`EpochSums`, an epoch's losses and counts summed on the device.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
from typing import Any

import numpy as np
import torch

__all__ = ["seed_everything", "select_device", "TrainingInterrupted", "EpochSums"]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


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
