"""An exponential moving average of a model's weights (:class:`WeightAverage`): what the speedrun recipes
evaluate, select and ship instead of the last step's weights.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """``avg <- d * avg + (1 - d) * w`` after every optimiser step, for every floating-point entry of the model's
    ``state_dict`` (parameters and BatchNorm statistics); integer buffers are copied.

    The decay warms up as ``d = min(decay, (1 + t) / (10 + t))`` after ``t`` updates, so that the first steps'
    (random) weights fade out quickly. ``module`` is a copy of the model holding the average (eval mode, no
    gradients); the :class:`~capsule_lib.train.trainer.Trainer` evaluates it.

    Parameters
    ----------
    model
        The model being trained (its tensors are read in place after every step).
    decay
        The decay ``d`` in ``(0, 1)``; the average spans about ``1 / (1 - d)`` steps.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not isinstance(decay, float) or not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be a float in (0, 1), got {decay!r}")
        self.decay, self.steps = decay, 0
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        pairs = list(zip(self.module.state_dict().values(), model.state_dict().values()))
        self._float = [(a, w) for a, w in pairs if a.is_floating_point()]
        self._other = [(a, w) for a, w in pairs if not a.is_floating_point()]

    @torch.no_grad()
    def update(self) -> None:
        """Average in the model's current weights."""
        self.steps += 1
        d = min(self.decay, (1 + self.steps) / (10 + self.steps))
        if self._float:
            torch._foreach_lerp_([a for a, _ in self._float], [w for _, w in self._float], 1.0 - d)
        for a, w in self._other:
            a.copy_(w)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "weights": self.module.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["weights"])
        self.steps = int(state["steps"])
