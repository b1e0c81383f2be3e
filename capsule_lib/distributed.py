"""Running one training job on several processes with ``torch.distributed`` (``torchrun``).

Nothing here schedules processes: ``torchrun`` (``python -m torch.distributed.run``) starts them and sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`setup` reads them and
joins the process group (``nccl`` on CUDA, ``gloo`` on the CPU). Without those variables it returns a
single-process :class:`DistInfo` and touches nothing, so the same code runs with and without ``torchrun``::

    torchrun --nproc_per_node=2 -m capsule_lib.train capsnet --out runs/capsnet_mnist

How a job is split (see :class:`~capsule_lib.data.TensorLoader` and :class:`~capsule_lib.train.trainer.Trainer`):
a recipe's ``batch_size`` is the **global** batch; every rank takes ``batch_size / world_size`` samples of
each global batch (the same interleaved shard of one shared permutation that ``DistributedSampler`` gives),
gradients are averaged by ``DistributedDataParallel``, metrics are summed over ranks, and only rank 0 prints,
draws and writes checkpoints (in the single-process format).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "setup", "all_reduce_sums", "in_torchrun"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job: ``rank`` of ``world_size`` processes, and its ``device``."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Whether this is the process of rank 0, the one that prints, draws and writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def in_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process in the job."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: torch.device, timeout_s: float = 600.0) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (once per process) and return
    this process's :class:`DistInfo`. On CUDA each process uses ``cuda:<LOCAL_RANK>``; on the CPU the
    backend is ``gloo``. Outside ``torchrun`` (or with one process) nothing is initialised."""
    if not in_torchrun() and not dist.is_initialized():
        return DistInfo(0, 1, device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), device)


def all_reduce_sums(values: list[float], info: DistInfo) -> list[float]:
    """Sum ``values`` over all ranks (float64 on the job's device); the identity for one process."""
    if not info.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()
