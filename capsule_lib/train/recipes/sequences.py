"""Heinsen's routing head on GENERATED token sequences (the stand-in for his SST experiments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ...data import DataSource
from ...data.loaders import TensorLoader
from ...data.sequences import marker_sequences
from ...losses import (
    ClassifierObjective,
)
from ...models.heinsen import TokenSequenceConfig
from .base import (
    Loaders,
    Recipe,
)

__all__ = ["HeinsenSequenceRecipe"]


@dataclass
class HeinsenSequenceRecipe(Recipe):
    """Heinsen's (2019) sequence head (:class:`~capsule_lib.models.TokenSequenceClassifier`) on the GENERATED
    majority-marker task (:func:`~capsule_lib.data.sequences.marker_sequences`): ``n_train`` / ``n_val`` /
    ``n_test`` sequences of 16-40 tokens from seeds ``data_seed``, ``+1``, ``+2``; cross-entropy, Adam, lr
    ``3e-3`` x0.8 per epoch. ``dataset`` is fixed (``"marker_sequences"``); there is no real counterpart (SST
    needs a frozen transformer: see the chapter)."""

    name: ClassVar[str] = "heinsen_sequences"
    images_refusal: ClassVar[str] = "it classifies token sequences, not images"

    dataset: str = "marker_sequences"
    epochs: int = 4
    batch_size: int = 64
    lr: float = 3e-3
    lr_decay: float = 0.8
    n_train: int = 12000
    n_val: int = 2000
    n_test: int = 4000
    data_seed: int = 0
    model: TokenSequenceConfig = field(default_factory=TokenSequenceConfig)

    model_kind: ClassVar[str] = "token_sequences"

    def build_objective(self) -> Any:
        return ClassifierObjective()

    def lr_factor(self, step: int) -> float:
        return self.lr_decay**step

    def sequences(self, split: str):
        """The split's :class:`~capsule_lib.data.sequences.TokenSequences` (``eval_subset`` / ``train_subset``
        applied)."""
        n = {"train": self.train_subset or self.n_train, "val": self.n_val, "test": self.n_test}[split]
        if split != "train" and self.eval_subset:
            n = min(n, self.eval_subset)
        seed = self.data_seed + {"train": 0, "val": 1, "test": 2}[split]
        m = self.model
        return marker_sequences(n, seed, n_markers=m.n_classes, vocab=m.vocab)

    def make_loaders(
        self, data_root: DataSource | str | None, device: torch.device, test: bool, shard: dict
    ) -> Loaders:
        if self.dataset != "marker_sequences":
            raise ValueError(f"{self.name}: dataset must be 'marker_sequences' (generated), got {self.dataset!r}")
        ev = shard["eval"]
        tr = self.sequences("train")
        train = TensorLoader(
            [tr.tokens, tr.labels], shard["batch_size"], shuffle=True, seed=self.seed, device=device, **shard["rank"]
        )
        va = self.sequences("val")
        val = TensorLoader([va.tokens, va.labels], 512, device=device, **ev)
        tests = None
        if test:
            te = self.sequences("test")
            tests = TensorLoader([te.tokens, te.labels], 512, device=device, **ev)
        return Loaders(train, val, tests, tr, "marker_sequences (GENERATED)", True)

    def evaluation_sets(self, data_root: DataSource | str | None = None) -> dict[str, Any]:
        return {"val": self.sequences("val"), "test": self.sequences("test")}

    def check_data(self, model: nn.Module, loaders: Loaders) -> None:
        return None
