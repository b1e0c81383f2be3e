"""The training loop: a :class:`Trainer` with per-epoch JSON history, best/last checkpoints and exact resume (the
process around it, seeds, devices, Ctrl-C and the epoch's sums, is :mod:`~capsule_lib.train.runtime`).

Model selection uses the validation split only; a test loader, if given, is evaluated for the record and
never used to choose a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed import DistInfo, all_reduce_sums
from ..losses import StepOutput
from .checkpoint import History, RunMismatchError, _atomic_save, _load_checkpoint, read_json
from .ema import WeightAverage
from .runtime import (
    EpochSums,
    TrainingInterrupted,
    _stop_on_sigint,
    nonfinite_gradient,
    nonfinite_record,
    rng_state,
    seed_everything,
    select_device,
    set_rng_state,
)

__all__ = ["Trainer"]


class Trainer:
    """Fit a model with an objective, keeping everything needed to resume after an interruption.

    * ``out_dir``: where ``last.pt`` (model, optimizer, scheduler, scaler, RNG states, epoch, history),
      ``best.pt`` (weights of the best validation epoch) and ``history.json`` are written after every epoch.
    * ``scheduler_step``: ``"epoch"`` or ``"batch"`` (when to call ``scheduler.step()``).
    * ``amp``: ``None``, ``"bf16"`` or ``"fp16"`` (fp16 uses a GradScaler; CUDA only).
    * ``callbacks``: callables ``cb(trainer, record)`` run after each epoch (e.g. :class:`~capsule_lib.viz.LivePlot`);
      one with a method ``resumed(trainer)`` is also called when :meth:`fit` resumes a run (e.g. the budget fit).
    * ``keep_epochs``: also keep every epoch's weights as ``epoch_NNN.pt`` (to compare budgets afterwards).
    * ``checkpoint_minutes``: also write ``last.pt`` *inside* an epoch, at most this often (default 10; ``None``
      turns it off), when the training loader can report and restore its position (``state()`` /
      ``resume_at()``, as :class:`TensorLoader` does). Resuming from such a checkpoint finishes the epoch
      with exactly the batches, augmentations and random states of the uninterrupted run.
    * Every epoch reseeds torch from ``(seed, epoch)``, so a resumed run repeats exactly what the
      uninterrupted run would have done.
    * ``fit(..., budget_minutes=m)`` stops once the run's training wall time (resumed time included, validation
      too) reaches ``m`` minutes, inside an epoch if the training loader can report its position (``state()`` /
      ``resume_at()``, as :class:`TensorLoader`; other loaders stop at an epoch's end): the weights reached are
      evaluated on validation and recorded as a **partial epoch** (``{"epoch": 3.42, "partial": True, ...}``: 3
      epochs and 42% of the 4th), selected like any epoch (``best.pt``), and ``last.pt`` holds the position, so a
      later ``fit`` with a larger budget trains on exactly as the uninterrupted run would have (same batches,
      same weights); the history keeps the partial record before the finished epoch's. Without ``out_dir`` a
      stopped run cannot go on.
    * Resuming with a different recipe (``meta["config"]``) is allowed and recorded in
      ``history.meta["changes"]`` as ``{"from_epoch": ..., "config": ...}``. Resuming a *different run* is
      not: ``last.pt`` stores the run's identity (:meth:`identity`: recipe, dataset, number of training
      images, stand-in or real data, seed, model configuration, and the training data's content fingerprint, taken
      from the training loader's ``fingerprint()`` when the caller's ``meta`` has none) and :meth:`fit` refuses, in
      one line, to continue a run whose identity differs (use another ``out_dir`` or ``resume=False``).
    * A mid-epoch checkpoint resumed with another batch size goes on from the same image (none skipped or seen
      twice), or refuses in one line. A resume with another thread count goes on, says so and is recorded
      (``meta["thread_changes"]``): CPU results depend on it, so the run is not the uninterrupted one exactly.
    * :meth:`finish` evaluates the test split **once**, after :meth:`load_best`, and records it in
      ``history.meta["test"]``; the recipes pass no test loader to :meth:`fit`, so no per-epoch test curve
      exists to be looked at while a run is steered.
    * ``ema``: a decay in (0, 1): a moving average of the weights (:class:`~capsule_lib.train.ema.WeightAverage`) is
      updated after every step, and it is what :meth:`evaluate` validates, ``best.pt`` keeps and :meth:`load_best`
      loads (into the model too); ``last.pt`` holds it, so a resumed run continues the same average.
    * ``dist``: this process's place in a ``torch.distributed`` job (:func:`capsule_lib.distributed.setup`).
      With more than one process the model trains wrapped in ``DistributedDataParallel``; the loaders must be
      sharded (``TensorLoader(rank=, world_size=)``); losses, accuracies and counts are summed over ranks
      before they are recorded; only rank 0 shows progress, runs callbacks and writes ``out_dir`` (checkpoints
      in the single-process format, loadable without ``torch.distributed``); every rank resumes from
      ``out_dir/last.pt`` (a shared filesystem), from the last complete epoch (no mid-epoch checkpoints); after
      :meth:`load_best` every rank holds rank 0's best weights.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Callable[..., StepOutput],
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        *,
        scheduler_step: str = "epoch",
        device: str | torch.device | None = "auto",
        amp: str | None = None,
        out_dir: str | os.PathLike | None = None,
        seed: int = 0,
        grad_clip: float | None = None,
        callbacks: Iterable[Callable[[Trainer, dict], None]] = (),
        progress: bool = True,
        select_metric: str = "val_acc",
        meta: dict[str, Any] | None = None,
        keep_epochs: bool = False,
        checkpoint_minutes: float | None = 10.0,
        dist: DistInfo | None = None,
        ema: float | None = None,
    ) -> None:
        if scheduler_step not in ("epoch", "batch"):
            raise ValueError("scheduler_step must be 'epoch' or 'batch'")
        if amp not in (None, "bf16", "fp16"):
            raise ValueError("amp must be None, 'bf16' or 'fp16'")
        self.dist = dist if dist is not None else DistInfo(0, 1, select_device(device))
        self.device = self.dist.device
        self.model = model.to(self.device)
        self.net: nn.Module = self.model  # what the training step calls: the model, or its DDP wrapper
        if self.dist.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DistributedDataParallel(self.model, device_ids=ids)
            progress, callbacks = progress and self.dist.is_main, callbacks if self.dist.is_main else ()
        self.objective, self.optimizer, self.scheduler = objective, optimizer, scheduler
        self.ema = WeightAverage(self.model, ema) if ema is not None else None
        self.scheduler_step, self.amp, self.seed, self.grad_clip = scheduler_step, amp, seed, grad_clip
        self.callbacks, self.progress, self.select_metric = list(callbacks), progress, select_metric
        self.keep_epochs, self.checkpoint_minutes = keep_epochs, checkpoint_minutes
        self.read_every: int | None = None  # batches between reads of the summed losses (None: 1 on a CPU, else 50)
        self._in_epoch: dict[str, Any] | None = None  # progress inside an epoch, from a mid-epoch checkpoint
        self._budget_end: float | None = None  # time.time() at which fit(budget_minutes=) stops training
        self._stopped: dict[str, Any] | None = None  # set by train_epoch when the budget ran out inside an epoch
        self._interrupt: dict[str, bool] = {}  # {"stop": True} after a Ctrl-C (fit's SIGINT handler)
        self._trained_now = False  # whether the latest fit() trained anything (finish() reuses a recorded test)
        self._last_save = 0.0
        self._epoch_lr, self._t_epoch = 0.0, 0.0
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._writes = self.out_dir is not None and self.dist.is_main  # rank 0 writes, every rank reads
        self.scaler = torch.amp.GradScaler("cuda", enabled=(amp == "fp16" and self.device.type == "cuda"))
        self.history = History(meta=dict(meta or {}))
        self._meta = dict(meta or {})
        self.epoch = 0  # number of completed epochs
        self.epochs = 0  # the epochs fit() trains to
        self.best_metric = -math.inf
        self._best_in_memory: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None  # when out_dir is None
        self._t0 = 0.0
        self._wall_before = 0.0

    # ---------------------------------------------------------------- checkpoint state
    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run (resuming across them would silently mix them)."""
        keys = ("recipe", "dataset", "train_images", "generated_data")
        ident: dict[str, Any] = {k: self._meta.get(k) for k in keys}
        ident["seed"] = self.seed
        ident["model"] = (self._meta.get("config") or {}).get("model")
        for key in ("start_from", "data_fingerprint"):  # only when set: checkpoints written before they existed match
            if self._meta.get(key) is not None:
                ident[key] = self._meta[key]
        return json.loads(json.dumps(ident, default=str))

    def state_dict(self) -> dict[str, Any]:
        return {
            "identity": self.identity(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "epoch": self.epoch,
            "best_metric": self.best_metric,
            "history": json.loads(json.dumps(self.history.to_dict(), default=str)),  # plain values (weights_only)
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        old, new = state.get("identity"), self.identity()
        if old is not None and "data_fingerprint" not in old:  # written before runs recorded their data's content
            new.pop("data_fingerprint", None)
        differ = [k for k in {**(old or {}), **new} if old is not None and old.get(k) != new.get(k)]  # absent = None
        if differ:
            diff = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ)
            where = self.out_dir / "last.pt" if self.out_dir is not None else "the checkpoint"
            raise RunMismatchError(
                f"{where} belongs to a different run ({diff[:300]}); resuming would mix the two. "
                f"Train into another out_dir, or pass resume=False to start afresh (it overwrites "
                f"that run)"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(state.get("ema") or {"steps": 0, "weights": self.model.state_dict()})
        self.epoch = int(state["epoch"])
        self.best_metric = float(state["best_metric"])
        self._in_epoch = state.get("in_epoch")
        self.history = History.from_dict(state["history"])
        set_rng_state(state.get("rng") or {})

    def resume(self) -> bool:
        """Load ``out_dir/last.pt`` if present; returns whether it did."""
        if self.out_dir is None or not (self.out_dir / "last.pt").exists():
            return False
        self.load_state_dict(_load_checkpoint(self.out_dir / "last.pt", self.device))
        saved = self.out_dir / "history.json"  # finish() records the test split there, after the last last.pt
        if saved.exists() and "test" not in self.history.meta:
            written = read_json(saved, "delete it and run again: last.pt holds the run's records, and it is rewritten")
            if len(written.get("records", [])) == len(self.history) and "test" in written.get("meta", {}):
                self.history.meta["test"] = written["meta"]["test"]
        return True

    # ---------------------------------------------------------------- loops
    def _autocast(self):
        if self.amp is None:
            return torch.autocast(self.device.type, enabled=False)
        dtype = torch.bfloat16 if self.amp == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _bar(self, it: Iterable, total: int, desc: str):
        if not self.progress:
            return it
        from .._progress import progress

        return progress(it, total=total, desc=desc)

    def train_epoch(self, loader: Any) -> dict[str, float]:
        self.model.train()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(self.epoch)
        resumable = (
            self._writes and not self.dist.distributed and hasattr(loader, "state") and hasattr(loader, "resume_at")
        )
        done, self._in_epoch = self._in_epoch, None
        first, sums = 0, EpochSums()
        if done is not None and resumable:  # finish an epoch interrupted after a mid-epoch checkpoint
            try:
                started = loader.resume_at(done["loader"])  # the same images done, whatever the batch size now
            except ValueError as e:
                raise ValueError(f"{self.out_dir / 'last.pt'}: {e}") from None
            first = done["loader"]["batch"] if started is None else started
            sums = EpochSums(done)
        self._last_save = time.time()
        bar = self._bar(loader, len(loader) - first, f"epoch {self.epoch + 1}")
        # the sums stay on the device; they are read every `every` batches (the finiteness check, the progress bar)
        # and at the epoch's end: on a GPU each read waits for the device, so a read per step would stall it
        # (a non-finite loss or gradient is flagged on the device and read there too, before the optimiser's step: on a
        # CPU no weight ever takes a non-finite step; on a GPU no checkpoint is written before the flags are read)
        every, since, nonfinite = self.read_every or (1 if self.device.type == "cpu" else 50), None, None
        for batch in bar:
            batch = tuple(b.to(self.device) for b in batch)
            with self._autocast():
                out = self.objective(self.net, batch, True)
            position = getattr(loader, "position", None)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(out.loss).backward()
            norm = None
            if self.grad_clip is not None:
                self.scaler.unscale_(self.optimizer)
                norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            grad_bad = nonfinite_gradient(self.model, norm, self.device, scaled=self.scaler.is_enabled())
            step_bad = torch.stack([~torch.isfinite(out.loss.detach()), grad_bad])  # [2]: loss, gradient
            nonfinite, since = (step_bad, position) if nonfinite is None else (nonfinite | step_bad, since)
            if position is None or position % every == 0 or position >= len(loader):
                nonfinite = self._check_finite(nonfinite, since, position)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.ema is not None:
                self.ema.update()
            if self.scheduler is not None and self.scheduler_step == "batch":
                self.scheduler.step()
            sums.add(out)
            if self.progress and hasattr(bar, "set_postfix") and (position is None or position % every == 0):
                read = sums.floats()
                bar.set_postfix(loss=f"{read['loss_sum'] / sums.n:.4f}", acc=f"{read['correct'] / sums.n:.4f}")
            unfinished = position is not None and position < len(loader)
            budget_out = self._budget_end is not None and time.time() >= self._budget_end
            due = self.checkpoint_minutes is not None and time.time() - self._last_save >= 60 * self.checkpoint_minutes
            if nonfinite is not None and (self._interrupt.get("stop") or budget_out or due):
                nonfinite = self._check_finite(nonfinite, since, position)  # never keep weights a nan has reached
            if self._interrupt.get("stop"):
                if resumable and unfinished:
                    _atomic_save(self._in_epoch_state(loader, sums), self.out_dir / "last.pt")
                    where = f"after batch {position} of {len(loader)} of epoch {self.epoch + 1} (mid-epoch checkpoint)"
                elif self._writes:
                    where = f"at the end of epoch {self.epoch} (the last complete epoch)"
                else:
                    raise TrainingInterrupted(
                        "training interrupted (Ctrl-C); this run keeps no checkpoint (no out_dir)"
                    )
                raise TrainingInterrupted(
                    f"training interrupted (Ctrl-C) {where}; run the same command again to resume from "
                    f"{self.out_dir / 'last.pt'}"
                )
            if budget_out and unfinished:  # fit() evaluates the weights reached and saves the position
                in_epoch = {"loader": loader.state(), **sums.floats()} if resumable else sums.floats()
                in_epoch.update(lr=self._epoch_lr, elapsed=time.time() - self._t_epoch)
                self._stopped = {"fraction": position / len(loader), "in_epoch": in_epoch if resumable else None}
                break
            if resumable and due and unfinished:
                _atomic_save(self._in_epoch_state(loader, sums), self.out_dir / "last.pt")
                self._last_save = time.time()
        if nonfinite is not None:
            self._check_finite(nonfinite, since, position)
        return self._record("train", sums)

    def _check_finite(self, nonfinite: torch.Tensor, since: int | None, position: int | None) -> None:
        """Stop the run in one line if a training loss or gradient since batch ``since`` (up to ``position``) was not
        finite (``nonfinite``: the two flags); returns ``None`` (nothing left to check)."""
        loss_bad, grad_bad = (bool(f) for f in nonfinite)
        if loss_bad or grad_bad:
            where = f"batch {position}" if since == position else f"one of batches {since}-{position}"
            what = "the training loss" if loss_bad else "a gradient (the loss was finite)"
            raise FloatingPointError(
                f"epoch {self.epoch + 1}, {where}: {what} is nan or infinite; the run stops here. "
                f"{self._likely_cause()}"
            )

    def _likely_cause(self) -> str:
        """What a non-finite stop says after the step: the likely cause and where the last finite state is."""
        lr = self.optimizer.param_groups[0]["lr"]
        cause = f"Likely cause: a learning rate too high for this model (lr {lr:g} now), or NaN/inf in the data."
        if not self._writes:
            return f"{cause} This run keeps no checkpoint (no out_dir)"
        last = self.out_dir / "last.pt"
        if not last.exists():
            return f"{cause} No checkpoint was written before this ({last} does not exist)"
        return f"{cause} {last} holds the last finite state; resume from it with a lower lr (--set lr=...)"

    def _check_record_finite(self, rec: dict[str, Any]) -> None:
        """Stop in one line when an epoch's weights or validation results are not finite: that epoch is never selected,
        saved or exported, and ``last.pt`` keeps the epoch before it."""
        what = nonfinite_record(rec, {"": self.model, "ema.": self.ema.module if self.ema is not None else None})
        if what is not None:
            raise FloatingPointError(
                f"epoch {rec['epoch']}: {what}; the run stops and this epoch is neither selected nor saved. "
                f"{self._likely_cause()}"
            )

    def _in_epoch_state(self, loader: Any, sums: EpochSums) -> dict:
        """The run's state with its position inside the current epoch (a mid-epoch checkpoint)."""
        state = self.state_dict()
        state["in_epoch"] = {
            "loader": loader.state(),
            **sums.floats(),
            "lr": self._epoch_lr,
            "elapsed": time.time() - self._t_epoch,
            "wall_time": self._wall_before + time.time() - self._t0,
        }
        return state

    def _record(self, prefix: str, sums: EpochSums) -> dict:
        """Per-sample means of the summed loss, accuracy and loss parts, summed over all ranks first."""
        read = sums.floats()  # the device's sums, read once here
        keys = sorted(read["sums"])
        values = [read["loss_sum"], read["correct"], read["n"], *(read["sums"][k] for k in keys)]
        loss_sum, correct, n, *parts = all_reduce_sums(values, self.dist)
        rec = {f"{prefix}_loss": loss_sum / max(n, 1), f"{prefix}_acc": correct / max(n, 1)}
        rec.update({f"{prefix}_{k}": v / max(n, 1) for k, v in zip(keys, parts)})
        return rec

    @torch.no_grad()
    def evaluate(self, loader: Any, prefix: str = "val") -> dict[str, float]:
        """Loss, loss parts and accuracy of the current model on ``loader`` (no augmentation); with ``ema``, of the
        weights' moving average (what the run selects and ships)."""
        self.model.eval()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(0)
        sums, model = EpochSums(), self.ema.module if self.ema is not None else self.model  # what is selected, shipped
        model.eval()
        for batch in loader:
            batch = tuple(b.to(self.device) for b in batch)
            with self._autocast():
                sums.add(self.objective(model, batch, False))
        return self._record(prefix, sums)

    def fit(
        self,
        train_loader: Any,
        val_loader: Any = None,
        epochs: int = 1,
        *,
        test_loader: Any = None,
        resume: bool = True,
        budget_minutes: float | None = None,
    ) -> History:
        """Train until ``epochs`` epochs are complete (counting epochs done before a resume), or until the run's
        training wall time reaches ``budget_minutes`` (then the last record may be a partial epoch: see the class
        docstring)."""
        if budget_minutes is not None and budget_minutes <= 0:
            raise ValueError(f"budget_minutes must be > 0 (or None for no budget), got {budget_minutes}")
        if budget_minutes is not None and self.dist.distributed:  # each rank would stop at its own batch
            raise ValueError("budget_minutes applies to single-process runs; under torchrun, limit epochs instead")
        self._record_data(train_loader)
        resumed = False
        self.epochs = epochs  # the loop's target; a callback may shorten the run (the speedrun's budget fit)
        if self.out_dir is not None:
            if self._writes:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            resumed = resume and self.resume()
            for cb in self.callbacks if resumed else ():  # what the run decided goes on (the speedrun's fitted epochs)
                getattr(cb, "resumed", lambda trainer: None)(self)
            if resumed:
                self._say(self._resume_line(self.epochs))
            if resumed and self._meta.get("config") not in (None, self.history.meta.get("config")):
                # the run continues with a different recipe: record what changed and from which epoch on
                changes = self.history.meta.setdefault("changes", [])
                latest = changes[-1]["config"] if changes else self.history.meta.get("config")
                if latest != self._meta["config"]:
                    changes.append({"from_epoch": self.epoch + 1, "config": self._meta["config"]})
                if isinstance(self.scheduler, torch.optim.lr_scheduler.LambdaLR):
                    # the new schedule applies now: LambdaLR computes the lr from the step count, so one step
                    # back and one forward sets it from the new lambdas and leaves the count as it was
                    self.scheduler.last_epoch -= 1
                    self.scheduler.step()
        # training time before this call: up to the mid-epoch checkpoint or budget stop resumed from, if any
        self._wall_before = self.history.records[-1]["wall_time"] if self.history.records else 0.0
        self._wall_before = (self._in_epoch or {}).get("wall_time", self._wall_before)
        if not self._writes and self.history.records and self.history.records[-1].get("partial"):
            raise ValueError(
                "this run stopped inside an epoch (budget_minutes) and, without out_dir, kept no checkpoint of "
                "where: it cannot go on. Train budgeted runs with out_dir to continue them"
            )
        self._t0 = time.time()
        self._stopped = None
        self._budget_end = None if budget_minutes is None else self._t0 + 60 * budget_minutes - self._wall_before
        if budget_minutes is not None or "budget_minutes" in self.history.meta:
            self.history.meta["budget_minutes"] = budget_minutes  # the budget of the latest call (None: none)
        self.history.meta.setdefault("device", str(self.device))
        self.history.meta.setdefault("seed", self.seed)
        self.history.meta.setdefault("amp", self.amp)
        self._record_threads(resumed)
        self._trained_now = self.epoch < (epochs := self.epochs)  # a resumed run's fitted epochs, say
        if not self._trained_now:
            self._say(f"{self.out_dir or 'run'}: already finished ({self.epoch} of {epochs} epochs); nothing to train")
        self._interrupt = {}
        # one process: Ctrl-C stops after the batch with a checkpoint; under torchrun every rank gets the signal and
        # the launcher ends the job (resume from the last complete epoch)
        stop = contextlib.nullcontext() if self.dist.distributed else _stop_on_sigint(self._interrupt)
        with stop:
            self._fit_epochs(train_loader, val_loader, test_loader)
        return self.history

    def _record_data(self, loader: Any) -> None:
        """The training data's fingerprint in the run's identity (a resume onto other images is refused), from the
        loader's ``fingerprint()`` when ``meta`` has none; a loader without one (a stream) records none."""
        if self._meta.get("data_fingerprint") is None and callable(getattr(loader, "fingerprint", None)):
            self._meta["data_fingerprint"] = loader.fingerprint()
            self.history.meta.setdefault("data_fingerprint", self._meta["data_fingerprint"])

    def _record_threads(self, resumed: bool) -> None:
        """torch's thread count in ``meta["threads"]``; a resume with another count (CPU sums in another order) goes
        on, says so and records it in ``meta["thread_changes"]`` (``{"from_epoch": ..., "threads": ...}``)."""
        threads, meta = torch.get_num_threads(), self.history.meta
        recorded = (meta.get("thread_changes") or [{"threads": meta.get("threads")}])[-1]["threads"]
        meta.setdefault("threads", threads)
        if resumed and recorded is not None and recorded != threads:
            meta.setdefault("thread_changes", []).append({"from_epoch": self.epoch + 1, "threads": threads})
            self._say(
                f"{self.out_dir / 'last.pt'}: resuming with {threads} threads (the run had {recorded}); CPU results "
                f"depend on the thread count, so this run does not repeat the uninterrupted one exactly (recorded in "
                f"history.meta['thread_changes'])"
            )

    def _say(self, line: str) -> None:
        """A one-line status message (rank 0 only)."""
        if self.dist.is_main:
            print(line, flush=True)

    def _resume_line(self, epochs: int) -> str:
        where = f"{self.out_dir / 'last.pt'}"
        if self._in_epoch is not None:
            return f"resuming {where}: inside epoch {self.epoch + 1} of {epochs} (mid-epoch checkpoint)"
        return f"resuming {where}: {self.epoch} of {epochs} epochs done"

    def _fit_epochs(self, train_loader: Any, val_loader: Any, test_loader: Any) -> None:
        while self.epoch < self.epochs:
            if self._budget_end is not None and time.time() >= self._budget_end:
                break  # the budget ran out at an epoch boundary
            if self._in_epoch is None:  # a resumed mid-epoch checkpoint restored the random states instead
                seed_everything(self.seed * 1_000_003 + self.epoch + 7_919 * self.dist.rank)
            t_epoch = time.time() - (self._in_epoch or {}).get("elapsed", 0.0)
            lr = (self._in_epoch or {}).get("lr", self.optimizer.param_groups[0]["lr"])
            self._epoch_lr, self._t_epoch = lr, t_epoch
            rec: dict[str, Any] = {"epoch": self.epoch + 1, "lr": lr}
            if hasattr(self.objective, "set_epoch"):  # e.g. the spread loss's margin schedule
                self.objective.set_epoch(self.epoch, self.epochs)
            rec.update(self.train_epoch(train_loader))
            if self._stopped is not None:
                self._record_partial(rec, val_loader)
                break
            if self.scheduler is not None and self.scheduler_step == "epoch":
                self.scheduler.step()
            if val_loader is not None:
                rec.update(self.evaluate(val_loader, "val"))
            self._check_record_finite(rec)
            if test_loader is not None:  # for the record only; never used for selection
                rec.update(self.evaluate(test_loader, "test"))
            rec["epoch_time"] = time.time() - t_epoch
            rec["wall_time"] = self._wall_before + time.time() - self._t0
            self.epoch += 1
            self._append_and_select(rec)
            if self._writes:
                if self.keep_epochs:
                    snapshot = {"model": self.model.state_dict(), "epoch": self.epoch, "record": rec}
                    _atomic_save(snapshot, self.out_dir / f"epoch_{self.epoch:03d}.pt")
                _atomic_save(self.state_dict(), self.out_dir / "last.pt")
                self.history.save(self.out_dir / "history.json")
            for cb in self.callbacks:
                cb(self, rec)

    def _append_and_select(self, rec: dict[str, Any]) -> None:
        """Append an evaluated record to the history and, if it improves ``select_metric``, keep its weights as the
        best (``best.pt``, or in memory without ``out_dir`` or off rank 0)."""
        self.history.append(rec)
        metric = rec.get(self.select_metric)
        rec["best"] = improved = metric is not None and metric > self.best_metric
        if not improved:
            return
        self.best_metric = metric
        evaluated = (self.ema.module if self.ema is not None else self.model).state_dict()  # the weights validated
        if self._writes:
            _atomic_save({"model": evaluated, "epoch": rec["epoch"], "record": rec}, self.out_dir / "best.pt")
        else:
            self._best_in_memory = ({k: v.detach().clone() for k, v in evaluated.items()}, rec)

    def _record_partial(self, rec: dict[str, Any], val_loader: Any) -> None:
        """The budget ran out inside epoch ``self.epoch + 1``: evaluate the weights reached, record them as a
        partial epoch (selected like any epoch) and save the position in ``last.pt``, history included, so that a
        larger budget trains on from there."""
        stopped, self._stopped = self._stopped, None
        state = self.state_dict() if self._writes else None  # before evaluation: the exact training state
        rec["epoch"] = self.epoch + math.floor(stopped["fraction"] * 1e4) / 1e4  # < epoch + 1
        rec["partial"] = True
        if val_loader is not None:
            rec.update(self.evaluate(val_loader, "val"))
        self._check_record_finite(rec)
        rec["epoch_time"] = time.time() - self._t_epoch
        rec["wall_time"] = self._wall_before + time.time() - self._t0
        self._append_and_select(rec)
        if self._writes:
            if state is not None and stopped["in_epoch"] is not None:  # resumable at this position
                state["in_epoch"] = dict(stopped["in_epoch"], wall_time=rec["wall_time"])
                state["history"] = json.loads(json.dumps(self.history.to_dict()))  # with the partial record
                state["best_metric"] = self.best_metric
                _atomic_save(state, self.out_dir / "last.pt")
            self.history.save(self.out_dir / "history.json")
        for cb in self.callbacks:
            cb(self, rec)

    def finish(self, test_loader: Any = None) -> dict[str, Any] | None:
        """Load the best-validation weights (:meth:`load_best`) and, with ``test_loader``, evaluate the test split
        once, for the record: ``history.meta["test"] = {"epoch": <selected epoch>, "test_acc": ..., ...}`` (also
        saved to ``out_dir/history.json``). Returns that record (``None`` without a test loader).
        ``test_loader`` may be a dict ``{prefix: loader}`` for several test sets (e.g. ``test_familiar`` and
        ``test_novel`` of a viewpoint protocol): each is recorded under its own prefix."""
        best = self.load_best()
        if test_loader is None:
            return None
        loaders = test_loader if isinstance(test_loader, dict) else {"test": test_loader}
        rec = {"epoch": best["epoch"] if best else self.epoch, "selected_by": self.select_metric}
        recorded = self.history.meta.get("test")
        if not self._trained_now and recorded and recorded.get("epoch") == rec["epoch"]:
            return recorded  # an already finished run: its test split was read once, when it finished
        for prefix, loader in loaders.items():
            rec.update(self.evaluate(loader, prefix))
        self.history.meta["test"] = rec
        if self._writes:
            self.history.save(self.out_dir / "history.json")
        return rec

    def load_best(self) -> dict[str, Any] | None:
        """Load the best-validation weights into the model: from ``out_dir/best.pt``, or, without ``out_dir``,
        from the copy kept in memory during :meth:`fit`. Returns that epoch's record (``None`` if there is none).
        In a distributed job rank 0 loads them and sends them to every rank."""
        if not self.dist.distributed:
            return self._load_best_here()
        import torch.distributed as torch_dist

        record = [self._load_best_here() if self.dist.is_main else None]
        for t in self.model.state_dict().values():
            torch_dist.broadcast(t, 0)
        torch_dist.broadcast_object_list(record, 0)
        return record[0]

    def _load_best_here(self) -> dict[str, Any] | None:
        if not self._writes:
            if self._best_in_memory is None:
                return None
            state, record = self._best_in_memory
        elif not (self.out_dir / "best.pt").exists():
            return None
        else:
            ck = _load_checkpoint(self.out_dir / "best.pt", self.device)
            state, record = ck["model"], ck["record"]
        self.model.load_state_dict(state)
        if self.ema is not None:  # evaluate() reads the average: after load_best it holds the best weights too
            self.ema.module.load_state_dict(state)
        return record
