"""An in-memory batch loader: :class:`TensorLoader` (reproducible shuffling by ``(seed, epoch)``, per-batch
augmentation, ``torch.distributed`` shards, a position that a checkpoint can save and restore), and
:class:`StreamLoader`, the same over image files read in worker processes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .datasets import data_fingerprint

__all__ = ["TensorLoader", "StreamLoader"]


class TensorLoader:
    """Batches from in-memory tensors, shuffled by ``(seed, epoch)`` so that an epoch is reproducible.

    ``tensors``: tensors with the same first dimension (``uint8`` images are scaled to ``[0, 1]`` floats on
    the device). ``transform(batch, generator) -> batch`` augments a batch tuple (training only).
    Call :meth:`set_epoch` before iterating (the :class:`Trainer` does).

    Under ``torch.distributed`` pass ``rank`` and ``world_size``: ``batch_size`` is then this rank's share
    of each global batch. Every rank draws the same permutation, pads it to a multiple of ``world_size``
    (repeating its first samples) and takes every ``world_size``-th index from ``rank`` on, as
    ``DistributedSampler`` does, so that step ``k`` of the job covers exactly the samples of batch ``k`` of a
    single process with batch ``batch_size * world_size``. Augmentation draws from a per-rank generator.
    ``pad_shards=False`` (evaluation loaders) skips the padding: each sample is counted once, and ranks may
    differ by one sample (and one batch).

    ``resident=True`` keeps the tensors on ``device`` (moved there once, ``uint8`` images stay ``uint8``) and
    indexes them there, so that a batch costs no host-to-device copy of images: the data-on-the-device path of
    the speedrun recipes. The order and the augmentation draws come from the same seeded CPU generator as
    without it, so the batches are the same, value for value.
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        batch_size: int = 128,
        *,
        shuffle: bool = False,
        seed: int = 0,
        transform: Callable[..., tuple] | None = None,
        drop_last: bool = False,
        device: torch.device | str = "cpu",
        rank: int = 0,
        world_size: int = 1,
        pad_shards: bool = True,
        resident: bool = False,
    ) -> None:
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ValueError(f"all tensors need the same first dimension, got {[tuple(t.shape) for t in tensors]}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.rank, self.world_size, self.pad_shards = rank, world_size, pad_shards
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.transform, self.drop_last, self.device = transform, drop_last, torch.device(device)
        self.resident = resident
        self.tensors = [t.to(self.device) for t in tensors] if resident else list(tensors)
        self.epoch = 0
        self.position = 0  # batches yielded so far in the current epoch
        self._generator: torch.Generator | None = None
        self._start: dict[str, Any] | None = None

    @classmethod
    def from_dataset(cls, ds: Any, batch_size: int = 128, **kw: Any) -> TensorLoader:
        """From an :class:`~capsule_lib.data.ImageDataset` (images, labels); a :class:`StreamLoader` when its images
        are files read while training (:class:`~capsule_lib.data.image_files.FileImages`)."""
        if not isinstance(ds.images, torch.Tensor):
            return StreamLoader([ds.images, ds.labels], batch_size, **kw)
        return cls([ds.images, ds.labels], batch_size, **kw)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _n_local(self) -> int:
        """Samples this rank sees per epoch (all of them for one process)."""
        n = self.tensors[0].shape[0]
        return math.ceil(n / self.world_size) if self.pad_shards else len(range(self.rank, n, self.world_size))

    def __len__(self) -> int:
        n = self._n_local()
        full = self.drop_last and n >= self.batch_size  # drop the last, smaller batch only when a full one exists
        return n // self.batch_size if full else math.ceil(n / self.batch_size)

    def fingerprint(self) -> str:
        """The content fingerprint of the data this loader serves (:func:`~capsule_lib.data.datasets.data_fingerprint`
        of its first two tensors, images and labels): what a run records so that it never resumes onto other data."""
        labels = self.tensors[1] if len(self.tensors) > 1 else self.tensors[0][:0]
        return data_fingerprint(self.tensors[0], labels)

    def state(self) -> dict[str, Any]:
        """Where the current epoch's iteration is: epoch, batches done and their size, and the
        shuffling/augmentation generator's state (saved in mid-epoch checkpoints)."""
        gen = self._generator.get_state() if self._generator is not None else None
        return {"epoch": self.epoch, "batch": self.position, "batch_size": self.batch_size, "generator": gen}

    def resume_at(self, state: dict[str, Any]) -> int:
        """Make the next iteration of epoch ``state["epoch"]`` start where ``state`` stopped, with the generator as it
        was there: the remaining batches are exactly those of an uninterrupted epoch. Stopped after ``b`` batches of
        another size ``s`` (a recipe resumed with another ``batch_size``), it starts after the same ``b * s`` images
        (batch ``b * s / batch_size``), so none is skipped or seen twice; where ``batch_size`` does not divide
        ``b * s`` no batch starts there, and a one-line ``ValueError`` says what to do. Returns the batch it starts
        at."""
        done, size = int(state["batch"]), int(state.get("batch_size", self.batch_size))  # older states: this size
        images = done * size
        if images % self.batch_size:
            raise ValueError(
                f"the checkpoint stopped inside epoch {int(state['epoch']) + 1} after {images} images ({done} batches "
                f"of {size}); batches of {self.batch_size} cannot go on from there without skipping or repeating "
                f"images: finish this epoch with batch_size={size} (or one that divides {images}) and change it "
                f"afterwards, or start afresh"
            )
        self._start = {**state, "batch": images // self.batch_size}
        return images // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order, first, g = self._epoch_order()
        for k, batch in zip(range(first, len(self)), self._batches(order, first)):
            batch = tuple(_to_device(t, self.device) for t in batch)
            if self.transform is not None:
                batch = self.transform(batch, g)
            self.position = k + 1
            yield batch

    def _batches(self, order: torch.Tensor, first: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The raw batches from batch ``first`` on, in ``order``."""
        for k in range(first, len(self)):
            idx = order[k * self.batch_size : (k + 1) * self.batch_size]
            yield tuple(t[idx] for t in self.tensors)

    def _epoch_order(self) -> tuple[torch.Tensor, int, torch.Generator]:
        """This epoch's order (this rank's shard), the batch it starts at and the augmentation generator."""
        n = self.tensors[0].shape[0]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        if self.world_size > 1:  # this rank's interleaved shard; augmentation gets a generator of its own
            if self.pad_shards:
                order = torch.cat([order, order[: self._n_local() * self.world_size - n]])
            order = order[self.rank :: self.world_size]
            g.manual_seed((self.seed * 1_000_003 + self.epoch) * 1_009 + self.rank)
        start, self._start = self._start, None
        first = 0
        if start is not None and start["epoch"] == self.epoch:
            first = int(start["batch"])
            if start.get("generator") is not None:
                g.set_state(start["generator"])
        self._generator, self.position = g, first
        if self.resident:  # one copy of the epoch's order instead of one per batch
            order = order.to(self.device)
        return order, first, g


class StreamLoader(TensorLoader):
    """A :class:`TensorLoader` whose images are files (:class:`~capsule_lib.data.image_files.FileImages`, the
    reader's images too large to hold in memory), read batch by batch in ``workers`` processes (default: the CPU
    count, at most 8) that work ahead of the training step. Order, shards, augmentation and resume are the
    :class:`TensorLoader`'s; the images are never resident on the device."""

    def __init__(self, tensors: Sequence[Any], batch_size: int = 128, *, workers: int | None = None, **kw: Any):
        kw["resident"] = False
        super().__init__(tensors, batch_size, **kw)
        self.workers = min(8, os.cpu_count() or 1) if workers is None else workers

    def _batches(self, order: torch.Tensor, first: int) -> Iterator[tuple[torch.Tensor, ...]]:
        index = [order[k * self.batch_size : (k + 1) * self.batch_size] for k in range(first, len(self))]
        batches = _FileBatches(self.tensors, index)
        yield from torch.utils.data.DataLoader(batches, batch_size=None, num_workers=self.workers)


class _FileBatches(torch.utils.data.Dataset):
    """Batch ``k`` of a :class:`StreamLoader`'s epoch: its files read, its other tensors indexed (in a worker)."""

    def __init__(self, tensors: Sequence[Any], index: list[torch.Tensor]):
        self.tensors, self.index = tensors, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, ...]:
        idx = self.index[k]
        return tuple(t.load(idx) if hasattr(t, "load") else t[idx] for t in self.tensors)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    t = t.to(device, non_blocking=True)
    return t.float().div_(255.0) if t.dtype == torch.uint8 else t
