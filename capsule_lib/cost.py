"""What a routing layer (or a model) costs: activation memory kept for the backward pass, peak memory and time
of a forward+backward, measured the same way for every algorithm (the Heinsen chapter's scaling plot and the
comparison chapter).

Memory is counted as the bytes of the distinct tensors autograd **saves for backward** during the forward
pass (``torch.autograd.graph.saved_tensors_hooks``; the parameters' own storages excluded, each storage counted
once; copies of the parameters that a layer or autocast makes, e.g. the bfloat16 weights under bf16 autocast,
are new storages and count). It is what grows with the number of input and output capsules, it is exact and the
same on every device, unlike a CPU process's peak memory; :func:`peak_memory` adds the temporaries. Time is the
median over ``repeats`` calls (after one warm-up) of forward + backward on the current device and thread count:
a property of this machine, not of the algorithm alone. :func:`model_costs` measures whole models the same way
for every model of the comparison; :func:`machine_info` labels result files.
"""

from __future__ import annotations

import copy
import datetime
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._contracts import checked
from .routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS, routing_kind

__all__ = [
    "scaling_summary",
    "count_parameters",
    "saved_bytes",
    "time_forward_backward",
    "peak_memory",
    "machine_info",
    "routing_layer",
    "routing_scaling",
    "time_training_step",
    "model_costs",
    "loglog_slope",
    "estimate_training_memory",
    "available_memory",
    "check_training_memory",
]


@checked
def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """The number of parameter values of ``module`` (all of them, or only those with ``requires_grad``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def saved_bytes(fn: Callable[[], Any], exclude: Sequence[torch.Tensor] = ()) -> tuple[Any, int]:
    """``(fn(), bytes)``: the bytes of the distinct storages autograd saved for backward while ``fn`` ran,
    not counting the storages of ``exclude`` (e.g. the parameters)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@checked
def time_forward_backward(fn: Callable[[], torch.Tensor], repeats: int = 3) -> float:
    """Median seconds of ``fn().backward()`` over ``repeats`` calls, after one warm-up call."""
    if repeats < 1:
        raise ValueError(f"time_forward_backward: repeats must be >= 1, got {repeats}")
    times = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        fn().backward()
        if k:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_memory(step: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """Peak tensor bytes allocated while ``step()`` runs, above the level at its start (tensors that existed
    before are not counted). CUDA: ``torch.cuda.max_memory_allocated`` above the starting level. CPU: the peak
    of the bytes allocated and not yet freed, reconstructed from ``torch.profiler``'s memory events
    (``tracemalloc`` does not see torch's allocations, and a process's max RSS cannot be attributed to one step).
    Tensor memory only: no allocator caches, fragmentation or library workspaces."""
    dev = torch.device(device)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        step()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for e in events:
        if e.device_type() == torch.autograd.DeviceType.CPU:
            live += e.nbytes()
            peak = max(peak, live)
    return int(peak)


@checked
def machine_info(device: str | torch.device = "cpu") -> dict[str, Any]:
    """What a measurement ran on, for the JSON files of ``benchmarks/`` and the chapters' labels: the device's
    name (the CPU model from ``/proc/cpuinfo`` where there is one), core and thread counts, torch, Python and
    platform versions, and the date."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"machine_info: device {device!r} is not a device name ('cpu', 'cuda', 'cuda:N')") from None
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {
        "device": str(dev),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def routing_layer(
    kind: str, n_inp: int, n_out: int, d: int, batch: int = 4, seed: int = 0, iterations: int | None = None
):
    """``(module, make_loss)`` for one routing layer of ``kind`` (:func:`~capsule_lib.routing.kinds.build_routing`:
    ``n_inp`` to ``n_out`` capsules of size ``d``, with ``iterations``): ``make_loss()`` runs the layer's ``route``,
    votes included, on fixed random inputs (``batch`` examples; activations where the kind takes them) and returns a
    scalar to backpropagate (the sum of squares of the output poses and activations)."""
    spec = routing_kind(kind)  # ValueError for an unknown kind
    m = spec.build(n_inp, n_out, d, iterations)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_inp, d, generator=g).requires_grad_()  # [B, n_inp, d]
    a = spec.input_activations(torch.randn(batch, n_inp, generator=g))  # [B, n_inp] where the kind takes them

    def loss() -> torch.Tensor:
        r = m.route(x, a)  # the routing protocol: poses [B, n_out, d], activations [B, n_out] or None
        return sum(t.float().square().sum() for t in (r.poses, r.activations) if t is not None)

    return m, loss


@checked
def routing_scaling(
    sizes: Sequence[tuple[int, int]],
    kinds: Sequence[str] = tuple(ROUTING_KINDS),
    d: int = 16,
    batch: int = 4,
    repeats: int = 3,
    time_it: bool = True,
    iterations: int | None = None,
    amp: str | None = None,
    peak: bool = False,
) -> list[dict[str, Any]]:
    """One row per (kind, (n_inp, n_out)) of ``sizes``: ``saved_mib`` (activation memory, see the module
    docstring), ``ms`` (forward + backward, median; ``None`` without ``time_it``), ``params``, ``iterations``
    (``iterations`` for every kind that iterates, else each kind's default) and ``amp`` (``"bf16"``: the forward
    pass under CPU bfloat16 autocast, as training with ``amp="bf16"`` runs it); with ``peak``, also ``peak_mib``
    (:func:`peak_memory` of one forward + backward: saved tensors plus temporaries)."""
    if amp not in (None, "bf16"):
        raise ValueError(f"amp must be None or 'bf16', got {amp!r}")
    if not sizes or any(len(s) != 2 or min(s) < 1 for s in sizes):
        raise ValueError(f"routing_scaling: sizes must be (n_inp, n_out) pairs of counts >= 1, got {list(sizes)[:4]}")
    for name, value in (("d", d), ("batch", batch), ("repeats", repeats)):
        if value < 1:
            raise ValueError(f"routing_scaling: {name} must be >= 1, got {value}")
    rows = []
    for kind in kinds:
        T = None if routing_kind(kind).iterations is None else iterations  # ValueError for an unknown kind
        for n_inp, n_out in sizes:
            m, loss = routing_layer(kind, n_inp, n_out, d, batch, iterations=T)
            if amp == "bf16":
                plain = loss

                def loss(plain=plain) -> torch.Tensor:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        return plain()

            params = list(m.parameters())
            _, nbytes = saved_bytes(loss, exclude=params)
            ms = 1e3 * time_forward_backward(loss, repeats) if time_it else None
            peak_mib = peak_memory(lambda f=loss: f().backward()) / 2**20 if peak else None
            rows.append(
                {
                    "kind": kind,
                    "n_inp": n_inp,
                    "n_out": n_out,
                    "d": d,
                    "batch": batch,
                    "iterations": DEFAULT_ITERATIONS[kind] if T is None else T,
                    "amp": amp,
                    "saved_mib": nbytes / 2**20,
                    "ms": ms,
                    "peak_mib": peak_mib,
                    "params": sum(p.numel() for p in params),
                }
            )
    return rows


@checked
def time_training_step(
    model: nn.Module,
    objective: Callable[..., Any],
    batch: tuple[torch.Tensor, ...],
    optimizer: torch.optim.Optimizer | None = None,
    repeats: int = 3,
    warmup: int = 1,
) -> float:
    """Median wall time (seconds) of one training step (forward, loss, backward, optimizer step) on ``batch``.

    Works on a copy of the model's state and restores it afterwards, so the model is unchanged."""
    state = copy.deepcopy(model.state_dict())
    opt = optimizer or torch.optim.Adam(model.parameters(), 1e-4)
    opt_state = copy.deepcopy(opt.state_dict())
    device = next(model.parameters()).device
    model.train()
    times = []
    for k in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = objective(model, batch, True)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    model.load_state_dict(state)
    opt.load_state_dict(opt_state)
    model.eval()
    return float(statistics.median(times))


def model_costs(
    model: nn.Module,
    objective: Callable[..., Any],
    images: torch.Tensor,
    labels: torch.Tensor,
    train_batch: int = 128,
    latency_batches: Sequence[int] = (1, 256),
    repeats: int = 3,
    peak: bool = True,
) -> dict[str, Any]:
    """What one model costs on this machine, the same way for every model of the comparison: ``params``;
    ``train_img_per_s`` (median training step -- forward, ``objective``'s loss, backward, Adam step -- on a batch
    of ``train_batch`` of ``images``); ``latency_ms_b{n}`` (median no-grad forward of a batch of ``n``, eval mode)
    for each of ``latency_batches``; ``peak_train_mib`` (:func:`peak_memory` of one training step, optimizer state
    excluded). ``images`` ``uint8`` (scaled to [0, 1]) or float ``[N, C, H, W]``, on the model's device; the
    model's weights are left unchanged (the training steps run on a copy)."""

    def batch(n: int) -> torch.Tensor:
        if n > len(images):
            raise ValueError(f"model_costs: a batch of {n} needs {n} images, got {len(images)}")
        x = images[:n]
        return x.float() / 255.0 if x.dtype == torch.uint8 else x

    work = copy.deepcopy(model)
    out: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    xb, yb = batch(train_batch), labels[:train_batch]
    step_s = time_training_step(work, objective, (xb, yb), repeats=repeats)
    out["train_img_per_s"] = train_batch / step_s
    if peak:
        opt = torch.optim.Adam(work.parameters(), 1e-4)
        work.train()

        def one_step() -> None:
            res = objective(work, (xb, yb), True)
            opt.zero_grad(set_to_none=True)
            res.loss.backward()
            opt.step()

        one_step()  # the optimizer state exists before the measured step
        out["peak_train_mib"] = peak_memory(one_step, xb.device) / 2**20
    work.eval()
    with torch.no_grad():
        for n in latency_batches:
            x = batch(n)
            times = []
            for k in range(repeats + 1):
                if x.device.type == "cuda":
                    torch.cuda.synchronize(x.device)
                t0 = time.perf_counter()
                work(x)
                if x.device.type == "cuda":
                    torch.cuda.synchronize(x.device)
                if k:
                    times.append(time.perf_counter() - t0)
            out[f"latency_ms_b{n}"] = 1e3 * statistics.median(times)
    return out


@checked
def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (1 = linear growth, 2 = quadratic)."""
    if len(x) != len(y):
        raise ValueError(f"loglog_slope: x and y must be as long as each other, got {len(x)} and {len(y)}")
    if len(set(x)) < 2:
        raise ValueError(f"loglog_slope: x needs at least two different values, got {list(x)[:4]}")
    for name, values in (("x", x), ("y", y)):
        if min(values) <= 0:
            raise ValueError(f"loglog_slope: {name} must be positive (a logarithm), got {min(values)}")
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


@checked
def scaling_summary(rows: Sequence[dict[str, Any]], n_inp: int = 1024, n_out: int = 16) -> dict[str, dict[str, float]]:
    """Per routing kind, from :func:`routing_scaling` rows (the ``"size"`` sweep): time (``ms``) and peak memory
    (``peak_mib``) at ``n_inp -> n_out`` in fp32 and under bf16 autocast (``bf16_ms``, ``bf16_peak_mib``), and the
    log-log slopes of the fp32 time and memory against the number of input capsules at ``n_out`` outputs
    (``ms_slope``, ``peak_mib_slope``; 1 = linear growth)."""
    size = [r for r in rows if r["sweep"] == "size"]
    out: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(r["kind"] for r in size):
        at = {r["amp"]: r for r in size if r["kind"] == kind and (r["n_inp"], r["n_out"]) == (n_inp, n_out)}
        pts = sorted(
            (r["n_inp"], r["ms"], r["peak_mib"])
            for r in size
            if r["kind"] == kind and r["amp"] is None and r["n_out"] == n_out
        )
        x = [p[0] for p in pts]
        out[kind] = {
            "ms": at[None]["ms"],
            "bf16_ms": at["bf16"]["ms"],
            "peak_mib": at[None]["peak_mib"],
            "bf16_peak_mib": at["bf16"]["peak_mib"],
            "ms_slope": loglog_slope(x, [p[1] for p in pts]),
            "peak_mib_slope": loglog_slope(x, [p[2] for p in pts]),
        }
    return out


# ------------------------------------------------------------------------------------- training memory (#63)
def _bytes(n: float) -> str:
    """``n`` bytes in words (``"1.2 GiB"``)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@checked
def estimate_training_memory(
    model: nn.Module, batch_size: int, image_shape: tuple[int, int, int] | None = None
) -> dict[str, int]:
    """The memory one training step of ``model`` with Adam needs at ``batch_size`` images, estimated before training.

    The fixed part is the parameters and buffers, the gradients and Adam's two moments (four copies of the
    trainable parameters). The part that grows with the batch is what autograd saves for backward
    (:func:`saved_bytes`), measured on a copy of the model in training mode on the CPU with blank batches of 2 and 4
    images and extrapolated linearly (the model itself, its mode and the random state are untouched). Float32, no
    autocast (a run under ``amp`` saves less); the temporaries of the backward pass are not counted: the measured
    peak of a CPU training step of CapsNet behind a stem (64 and 224 px, batch 8) was 1.2x the estimate
    (``tests/test_image_stem.py`` holds it within 2x).

    Parameters
    ----------
    model : nn.Module
        An image model (``model(x)`` on ``[B, C, H, W]``).
    batch_size : int
        Images per training step (per process), >= 1.
    image_shape : tuple of int, optional
        ``(C, H, W)`` of one image; ``None`` (default): the model's ``input_contract``.

    Returns
    -------
    dict[str, int]
        ``bytes`` (the estimate at ``batch_size``), ``fixed`` (weights, gradients, Adam state), ``per_image`` and
        ``base`` (activations saved independently of the batch).
    """
    if batch_size < 1:
        raise ValueError(f"estimate_training_memory: batch_size must be >= 1, got {batch_size}")
    if image_shape is None:
        contract = getattr(model, "input_contract", None)
        if contract is None or contract.size is None:
            raise ValueError("estimate_training_memory: give image_shape (C, H, W); the model declares no image size")
        image_shape = (contract.channels, contract.size, contract.size)
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    work = copy.deepcopy(model).to("cpu").float().train()
    saved = []
    with torch.random.fork_rng(devices=[]):
        for n in (2, 4):
            x = torch.zeros(n, *image_shape) + 0.5
            _, b = saved_bytes(lambda x=x: work(x), exclude=list(work.parameters()))
            saved.append(b)
    per_image = max((saved[1] - saved[0]) // 2, 0)
    base = max(saved[0] - 2 * per_image, 0)
    fixed = weights + 3 * trainable  # gradients, Adam's exp_avg and exp_avg_sq
    return {"bytes": fixed + base + batch_size * per_image, "fixed": fixed, "per_image": per_image, "base": base}


def available_memory(device: str | torch.device = "cpu") -> int | None:
    """Bytes free for a run on ``device``: ``torch.cuda.mem_get_info`` on a GPU; on the CPU ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else the available physical pages (``os.sysconf``); ``None`` where neither says."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    if dev.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


@checked
def check_training_memory(
    model: nn.Module, batch_size: int, device: str | torch.device = "cpu", available: int | None = None
) -> dict[str, int] | None:
    """Refuse, in one line, a run whose training step will not fit in memory, before it starts (and fails later).

    Parameters
    ----------
    model : nn.Module
        The model to train (an image model; others are not checked).
    batch_size : int
        Images per training step (per process).
    device : str or torch.device, optional
        Where it trains (default ``"cpu"``): what :func:`available_memory` reads.
    available : int, optional
        Bytes available; ``None`` (default): :func:`available_memory` of ``device`` (no check where it says nothing).

    Returns
    -------
    dict[str, int] or None
        The :func:`estimate_training_memory` (with ``available``); ``None`` for a model without an image size or a
        device whose free memory is unknown.

    Raises
    ------
    ValueError
        When the estimate exceeds what is available: the estimate, what is available, and the largest batch size
        that fits (or, when not even one image does, about the largest image side).
    """
    contract = getattr(model, "input_contract", None)
    if contract is None or contract.size is None:
        return None
    available = available_memory(device) if available is None else available
    if available is None:
        return None
    est = estimate_training_memory(model, batch_size)
    if est["bytes"] <= available:
        return {**est, "available": int(available)}
    room = available - est["fixed"] - est["base"]
    fits = int(room // est["per_image"]) if est["per_image"] and room > 0 else 0
    if fits >= 1:
        advice = f"batch_size {fits} fits (--set batch_size={fits})"
    else:
        side = contract.size
        share = max(room, 0) / max(est["per_image"], 1)
        smaller = int(side * math.sqrt(share)) if share > 0 else 0
        advice = (
            f"not even one image fits: train on images of about {smaller} px or less (--image-size {smaller})"
            if smaller >= 1
            else "its weights, gradients and Adam state alone do not fit: train a smaller network"
        )
    raise ValueError(
        f"training {type(model).__name__} at batch {batch_size} needs about {_bytes(est['bytes'])} "
        f"({_bytes(est['fixed'])} of weights, gradients and Adam state + {_bytes(est['per_image'])} per image), more "
        f"than the {_bytes(available)} available on {torch.device(device)}; {advice}"
    )
