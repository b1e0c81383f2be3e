"""Performance benchmark of capsule_lib: routing layers and model training steps vs the original implementations.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench.py --device cpu --threads 1            # full run, paper shapes
    .venv/bin/python benchmarks/bench.py --quick                             # tiny smoke configuration (< 1 min)
    .venv/bin/python benchmarks/bench.py --only 'routing_dynamic,model_*'    # a subset (comma-separated globs)
    .venv/bin/python benchmarks/bench.py --table benchmarks/results/cpu.json # print a result file as Markdown

Every case times one **step** of each variant on the same shapes and inputs:

* routing cases: forward + backward of the routing layer (votes included), with the loss
  ``sum_k <output_k, g_k>`` for fixed random ``g_k`` so every output entry gets a gradient; gradients flow to the
  layer's parameters and to its input;
* model cases: forward + loss + backward + optimizer step of the whole model.

Variants are warmed up, then run interleaved (A B, B A, A B, ...) so that a changing machine load affects them
alike; the reported time is the median over ``--repeat`` runs (CUDA: timed with events after a synchronize).
Heavy cases use half the repeats (at least 3); cases with short steps get more (up to 200), so that each variant
is timed for about ``--min-time`` seconds. The repeats used are in the JSON (``cases.<name>.repeat``).
Peak memory is measured on one step per variant (routing layers: the first warm-up step; models, whose first step
allocates the optimizer state: one extra step after the timed ones): on CUDA ``torch.cuda.max_memory_allocated``
above the
level at the step's start; on CPU the peak of the bytes allocated during the step and not yet freed, from the
profiler's memory events (``profile_memory=True``): the step's working memory (activations saved for the backward,
temporaries, the fresh gradient buffers); tensors that existed before the step are not counted. Both count tensor
memory only (no Python objects, no allocator caches or fragmentation, no oneDNN scratch buffers).

Numerical agreement: each original is run next to capsule_lib in the library's compatible mode (e.g.
``coupling="children"`` for gram-ai's softmax axis, ``expansion="official_bug"`` for apple's expansion) on the
same inputs and parameters; the JSON records the largest absolute difference of the outputs and of the input
gradients, relative to the largest absolute reference value. Agreement runs in float32 at the papers' per-sample
shapes with a batch of at most 4 (in float64 at the tiny shapes of ``--quick``, where the tests hold it to 1e-6).

The originals are re-created in :mod:`originals` (see its header for the repositories, files and fixes).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import fnmatch
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import originals as orig  # noqa: E402  (benchmarks/originals.py)

from capsule_lib.cost import peak_memory  # noqa: E402
from capsule_lib.layers import ConvCapsules  # noqa: E402
from capsule_lib.losses import margin_loss, reconstruction_loss, soft_target_cross_entropy, spread_loss  # noqa: E402
from capsule_lib.models import (  # noqa: E402
    CapsLayerSpec,
    CapsModel,
    CapsModelConfig,
    CapsNet,
    EfficientCapsNet,
    EMCapsNet,
    EMCapsNetConfig,
    SmallNORBClassifier,
    SmallNORBConfig,
)
from capsule_lib.routing import (  # noqa: E402
    DynamicRouting,
    GenerativeMatrixRouting,
    InvertedConvCapsules,
    InvertedFCCapsules,
    SelfAttentionRouting,
)

SCHEMA_VERSION = 1
#: relative tolerance of the agreement flag, per dtype of the agreement run
AGREE_RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}

#: issue #17's goals: how much faster than the fastest original capsule_lib must be on each workload
#: (median time of the fastest original / median time of capsule_lib, same run)
GOALS = {
    "routing_dynamic": 5.0,
    "routing_em_convcaps1": 3.0,
    "routing_em_convcaps2": 3.0,
    "routing_em_classcaps": 3.0,
    "routing_heinsen_smallnorb": 5.0,
    "routing_self_attention_b16": 1.5,
    "routing_self_attention_b128": 1.5,
    "model_capsnet_mnist": 2.0,
    "model_inverted_cifar10": 3.0,
    "model_heinsen_smallnorb": 3.0,
}
#: how capsule_lib's step is run besides eager fp32: variant name suffix -> (compiled, bf16 autocast)
MODES = {"eager": (False, False), "bf16": (False, True), "compiled": (True, False), "compiled_bf16": (True, True)}


# ====================================================================================================
# Case description
# ====================================================================================================
@dataclass
class Variant:
    label: str
    step: Callable[[], None]
    note: str = ""


@dataclass
class Case:
    name: str
    kind: str  # "routing" | "model"
    batch: int  # samples per step (images/s = batch / time)
    description: str
    shapes: dict
    variants: dict  # name -> Variant; the first one is capsule_lib ("ours")
    agreement: Callable[[torch.dtype], dict] | None = None
    heavy: bool = False  # fewer repeats in the full run
    notes: list = field(default_factory=list)


CASES: dict[str, Callable] = {}


def register(name: str):
    def deco(fn):
        CASES[name] = fn
        return fn

    return deco


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
def _cb(B: int, quick: bool) -> int:
    """Batch of the agreement runs: the full batch with --quick, else at most 4 (the per-sample shapes are the
    papers'; a smaller batch keeps the extra float32 runs of the originals cheap)."""
    return B if quick else min(B, 4)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int, device, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(seed), dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def _copy_(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def _randomize_(module: nn.Module, seed: int, scale: float = 0.1, only: tuple[str, ...] = ()) -> None:
    """Give parameters that start at 0/1 (betas, biases, LayerNorm affines, log-priors) random values, so the
    agreement checks exercise them (``only``: parameter-name suffixes to touch)."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if only and not name.endswith(only):
                continue
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p) * scale)


def routing_step(
    forward: Callable[..., list], inputs: list[torch.Tensor], params: list[torch.Tensor], gs: list[torch.Tensor]
) -> Callable[[], None]:
    """One forward + backward of a routing layer: ``loss = sum_k <out_k, g_k>``."""

    def step() -> None:
        for t in (*inputs, *params):
            t.grad = None
        outs = forward(*inputs)
        loss = sum((o * g).sum() for o, g in zip(outs, gs))
        loss.backward()

    return step


def model_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer):
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()

    model.train()
    return step


def _max_abs(t: torch.Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def compare(
    f_ours: Callable,
    f_orig: Callable,
    inputs: list[torch.Tensor],
    dtype: torch.dtype,
    *,
    grads: bool = True,
    mode: str,
    note: str = "",
    seed: int = 123,
) -> dict:
    """Run both on copies of ``inputs`` (leaves); compare outputs (lists of tensors in the same layout) and,
    with ``grads``, the gradients of ``sum_k <out_k, g_k>`` w.r.t. every floating input."""
    results = []
    gs = None
    for f in (f_ours, f_orig):
        xs = [_leaf(x) if (grads and x.is_floating_point()) else x.detach().clone() for x in inputs]
        outs = f(*xs)
        if gs is None:
            gs = [_randn(*o.shape, seed=seed + k, device=o.device, dtype=o.dtype) for k, o in enumerate(outs)]
        gr = []
        if grads:
            sum((o * g).sum() for o, g in zip(outs, gs)).backward()
            gr = [x.grad for x in xs if x.is_floating_point()]
        results.append(([o.detach() for o in outs], gr))
    (o1, g1), (o2, g2) = results
    out_diff = max(_max_abs(a - b) for a, b in zip(o1, o2))
    out_ref = max(_max_abs(b) for b in o2)
    res = {
        "comparable": True,
        "mode": mode,
        "dtype": str(dtype).replace("torch.", ""),
        "outputs_max_abs_diff": out_diff,
        "outputs_ref_max_abs": out_ref,
        "outputs_rel_diff": out_diff / max(out_ref, 1e-30),
    }
    rel = res["outputs_rel_diff"]
    if grads:
        g_diff = max(_max_abs(a - b) for a, b in zip(g1, g2))
        g_ref = max(_max_abs(b) for b in g2)
        res.update(grads_max_abs_diff=g_diff, grads_ref_max_abs=g_ref, grads_rel_diff=g_diff / max(g_ref, 1e-30))
        rel = max(rel, res["grads_rel_diff"])
    else:
        res.update(grads_max_abs_diff=None, grads_ref_max_abs=None, grads_rel_diff=None)
    res["tolerance_rel"] = AGREE_RTOL.get(dtype, 1e-3)
    res["agree"] = bool(math.isfinite(rel) and rel <= res["tolerance_rel"])
    res["note"] = note
    return res


def not_comparable(note: str) -> dict:
    return {"comparable": False, "note": note, "agree": None}


# ====================================================================================================
# Routing cases
# ====================================================================================================
@register("routing_dynamic")
def case_dynamic(dev, quick: bool) -> Case:
    B, I, J, d, E, T = (4, 72, 10, 8, 16, 3) if quick else (128, 1152, 10, 8, 16, 3)
    torch.manual_seed(0)
    u = _leaf(_randn(B, I, d, seed=1, device=dev, scale=0.3))
    gs = [_randn(B, J, E, seed=2, device=dev)]
    ours = DynamicRouting(I, J, d, E, T).to(dev)  # library default: coupling over parents, bias (official)
    gram = orig.GramAIDigitCaps(J, I, d, E, T).to(dev)
    xif = orig.XifengGuoDenseCapsule(I, d, J, E, T).to(dev)
    _copy_(gram.route_weights, ours.weight.permute(1, 0, 2, 3))
    _copy_(xif.weight, ours.weight.permute(1, 0, 3, 2))
    variants = {
        "ours": Variant(
            "capsule_lib DynamicRouting", routing_step(lambda x: [ours(x)], [u], list(ours.parameters()), gs)
        ),
        "gram_ai": Variant(
            "gram-ai CapsuleLayer pattern",
            routing_step(lambda x: [orig.GramAIDigitCaps.to_bje(gram(x))], [u], [gram.route_weights], gs),
        ),
        "xifengguo": Variant(
            "XifengGuo DenseCapsule pattern",
            routing_step(lambda x: [xif(x)], [u], [xif.weight], gs),
            note="detaches the votes in non-final iterations: less backward work",
        ),
    }

    def agreement(dtype):
        # large enough votes that |s| = O(1): the squash epsilons (none in gram-ai, 1e-8 outside the root in
        # XifengGuo, 1e-8 inside in capsule_lib) then change the outputs by < 1e-7 relative
        W = _randn(I, J, d, E, seed=3, device=dev, dtype=dtype, scale=0.3)
        x = _randn(_cb(B, quick), I, d, seed=4, device=dev, dtype=dtype)
        o_child = DynamicRouting(I, J, d, E, T, bias=False, coupling="children").to(dev, dtype)
        o_par = DynamicRouting(I, J, d, E, T, bias=False).to(dev, dtype)
        g = orig.GramAIDigitCaps(J, I, d, E, T).to(dev, dtype)
        xf = orig.XifengGuoDenseCapsule(I, d, J, E, T).to(dev, dtype)
        for m in (o_child, o_par):
            _copy_(m.weight, W)
        _copy_(g.route_weights, W.permute(1, 0, 2, 3))
        _copy_(xf.weight, W.permute(1, 0, 3, 2))
        return {
            "gram_ai": compare(
                lambda v: [o_child(v)],
                lambda v: [orig.GramAIDigitCaps.to_bje(g(v))],
                [x],
                dtype,
                mode="ours with coupling='children', bias=False",
                note="gram-ai takes the softmax over the input capsules (issue #10)",
            ),
            "xifengguo": compare(
                lambda v: [o_par(v)],
                lambda v: [xf(v)],
                [x],
                dtype,
                grads=False,
                mode="ours with bias=False (forward only)",
                note="gradients not comparable: XifengGuo detaches the votes in non-final "
                "iterations (capsule_lib, like the official code, does not)",
            ),
        }

    return Case(
        "routing_dynamic",
        "routing",
        B,
        "Dynamic routing (Sabour et al. 2017): CapsNet DigitCaps, votes + 3 routing iterations",
        dict(B=B, n_inp=I, n_out=J, d_inp=d, d_out=E, iterations=T),
        variants,
        agreement,
        heavy=not quick,
    )


def _em_inputs(B, T, H, dev, seed):
    poses = _leaf(_randn(B, T, H, H, 16, seed=seed, device=dev))
    acts = _leaf(torch.sigmoid(_randn(B, T, H, H, seed=seed + 1, device=dev)))
    return poses, acts


def _yl_layout(poses: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    """capsule_lib grid ``poses [B, T, H, W, 16], acts [B, T, H, W]`` -> yl-1993 ``[B, H, W, T*16 + T]``."""
    B, T, H, W, D = poses.shape
    return torch.cat([poses.permute(0, 2, 3, 1, 4).reshape(B, H, W, T * D), acts.permute(0, 2, 3, 1)], dim=-1)


def _from_yl_layout(out: torch.Tensor, C: int) -> list[torch.Tensor]:
    """yl-1993 ``[B, h, w, C*16 + C]`` -> ``[mu [B, C, h, w, 16], a [B, C, h, w]]``."""
    B, h, w, _ = out.shape
    mu = out[..., : C * 16].reshape(B, h, w, C, 16).permute(0, 3, 1, 2, 4)
    a = out[..., C * 16 :].permute(0, 3, 1, 2)
    return [mu, a]


def _em_case(
    name: str, dev, quick: bool, T_in: int, T_out: int, stride: int, H: int, B: int, qT_in: int, qT_out: int, qH: int
) -> Case:
    if quick:
        B, T_in, T_out, H = 2, qT_in, qT_out, qH
    K, iters = 3, 3
    torch.manual_seed(0)
    poses, acts = _em_inputs(B, T_in, H, dev, seed=10)
    x_yl = _leaf(_yl_layout(poses, acts))
    ours = ConvCapsules(T_in, T_out, K, stride, 0, 4, iters).to(dev)  # library defaults (paper)
    yl = orig.YL1993ConvCaps(T_in, T_out, K, 4, stride, iters).to(dev)
    _copy_(yl.weights, ours.weight.reshape(1, K * K * T_in, T_out, 4, 4))
    h = ours.output_size(H)
    gs = [_randn(B, T_out, h, h, 16, seed=12, device=dev), _randn(B, T_out, h, h, seed=13, device=dev)]
    gs_yl = [_yl_layout(*gs)]
    variants = {
        "ours": Variant(
            "capsule_lib ConvCapsules (EM)",
            routing_step(lambda p, a: list(ours(p, a)), [poses, acts], list(ours.parameters()), gs),
        ),
        "yl1993": Variant(
            "yl-1993 ConvCaps pattern", routing_step(lambda x: [yl(x)], [x_yl], list(yl.parameters()), gs_yl)
        ),
    }

    def agreement(dtype):
        o = ConvCapsules(
            T_in,
            T_out,
            K,
            stride,
            0,
            4,
            iters,
            normalize_over_outputs=True,
            normalize_costs=False,
            inverse_temperature=1e-3,
        ).to(dev, dtype)
        y = orig.YL1993ConvCaps(T_in, T_out, K, 4, stride, iters).to(dev, dtype)
        _randomize_(o, seed=14, scale=1.0, only=("beta_u", "beta_a"))
        _copy_(y.weights, o.weight.reshape(1, K * K * T_in, T_out, 4, 4))
        _copy_(y.beta_u, o.beta_u)
        _copy_(y.beta_a, o.beta_a)
        p = _randn(_cb(B, quick), T_in, H, H, 16, seed=15, device=dev, dtype=dtype)
        a = torch.sigmoid(_randn(_cb(B, quick), T_in, H, H, seed=16, device=dev, dtype=dtype))
        return {
            "yl1993": compare(
                lambda pp, aa: list(o(pp, aa)),
                lambda pp, aa: _from_yl_layout(y(_yl_layout(pp, aa)), T_out),
                [p, a],
                dtype,
                mode="ours with normalize_over_outputs=True, normalize_costs=False, inverse_temperature=1e-3",
                note="yl-1993 renormalises R*a over the outputs (cancels a_in) and uses raw costs, lambda = 1e-3",
            )
        }

    return Case(
        name,
        "routing",
        B,
        f"EM routing (Hinton et al. 2018): smallNORB ConvCaps {T_in}->{T_out} types, k3 s{stride}, "
        f"{H}x{H} input grid, 4x4 poses, {iters} iterations",
        dict(
            B=B,
            in_types=T_in,
            out_types=T_out,
            kernel=K,
            stride=stride,
            grid=H,
            out_grid=h,
            pose="4x4",
            iterations=iters,
        ),
        variants,
        agreement,
    )


@register("routing_em_convcaps1")
def case_em1(dev, quick: bool) -> Case:
    return _em_case("routing_em_convcaps1", dev, quick, 8, 16, 2, 14, 16, 4, 4, 7)


@register("routing_em_convcaps2")
def case_em2(dev, quick: bool) -> Case:
    return _em_case("routing_em_convcaps2", dev, quick, 16, 16, 1, 6, 16, 4, 4, 5)


@register("routing_em_classcaps")
def case_em_class(dev, quick: bool) -> Case:
    """smallNORB model A=64, B=8, C=D=16: class capsules from the D=16 types of the 4x4 ConvCaps2 grid to 5
    classes (weights shared over positions, coordinate addition), B=16, 3 iterations. yl-1993's class layer
    (``YL1993ConvCaps(..., coor_add=True, w_shared=True)``) returns the class activations only."""
    from capsule_lib.layers import ClassCapsules, grid_centers

    B, T, H, E, iters = (2, 3, 3, 4, 3) if quick else (16, 16, 4, 5, 3)
    torch.manual_seed(0)
    poses, acts = _em_inputs(B, T, H, dev, seed=30)
    x_yl = _leaf(_yl_layout(poses, acts))
    ours = ClassCapsules(T, E, 4, iters).to(dev)  # library defaults (paper: cell centres at entries 3, 7)
    yl = orig.YL1993ConvCaps(T, E, 1, 4, 1, iters, coor_add=True, w_shared=True).to(dev)
    _copy_(yl.weights, ours.weight.reshape(1, T, E, 4, 4))
    gs = [_randn(B, E, 16, seed=32, device=dev), _randn(B, E, seed=33, device=dev)]
    gs_yl = [gs[1]]
    variants = {
        "ours": Variant(
            "capsule_lib ClassCapsules (EM)",
            routing_step(lambda p, a: list(ours(p, a)), [poses, acts], list(ours.parameters()), gs),
        ),
        "yl1993": Variant(
            "yl-1993 class ConvCaps pattern (w_shared, coor_add)",
            routing_step(lambda x: [yl(x)], [x_yl], list(yl.parameters()), gs_yl),
            note="returns the class activations only (no poses, less backward work)",
        ),
    }

    def agreement(dtype):
        o = ClassCapsules(
            T,
            E,
            4,
            iters,
            coord_entries=(0, 1),
            normalize_over_outputs=True,
            normalize_costs=False,
            inverse_temperature=1e-3,
        ).to(dev, dtype)
        y = orig.YL1993ConvCaps(T, E, 1, 4, 1, iters, coor_add=True, w_shared=True).to(dev, dtype)
        _randomize_(o, seed=34, scale=1.0, only=("beta_u", "beta_a"))
        _copy_(y.weights, o.weight.reshape(1, T, E, 4, 4))
        _copy_(y.beta_u, o.beta_u)
        _copy_(y.beta_a, o.beta_a)
        centers = grid_centers(H, H, device=dev, dtype=dtype, convention="corner")  # yl-1993: arange(H) / H
        p = _randn(_cb(B, quick), T, H, H, 16, seed=35, device=dev, dtype=dtype)
        a = torch.sigmoid(_randn(_cb(B, quick), T, H, H, seed=36, device=dev, dtype=dtype))
        return {
            "yl1993": compare(
                lambda pp, aa: [o(pp, aa, centers)[1]],
                lambda pp, aa: [y(_yl_layout(pp, aa))],
                [p, a],
                dtype,
                mode="ours with coord_entries=(0, 1), corner centres, normalize_over_outputs=True, "
                "normalize_costs=False, inverse_temperature=1e-3 (activations only)",
                note="yl-1993 adds arange(H)/H to pose entries (0, 1), renormalises R*a over the outputs and "
                "uses raw costs, lambda = 1e-3; its class layer returns no poses",
            )
        }

    return Case(
        "routing_em_classcaps",
        "routing",
        B,
        f"EM routing (Hinton et al. 2018): smallNORB class capsules, {T} types on a {H}x{H} grid -> {E} classes, "
        f"4x4 poses, coordinate addition, {iters} iterations",
        dict(B=B, in_types=T, grid=H, n_classes=E, pose="4x4", iterations=iters),
        variants,
        agreement,
    )


@register("routing_heinsen_smallnorb")
def case_heinsen(dev, quick: bool) -> Case:
    B, n_parts, grid, n_objs = (2, 16, 3, 5) if quick else (20, 64, 9, 5)
    I = n_parts * grid * grid
    torch.manual_seed(0)
    a = _leaf(_randn(B, I, seed=20, device=dev))
    mu = _leaf(_randn(B, I, 4, 4, seed=21, device=dev))

    def ours_pair(dtype=torch.float32):
        r1 = GenerativeMatrixRouting(d_cov=4, d_inp=4, d_out=4, n_out=n_parts, iterations=3).to(dev, dtype)
        r2 = GenerativeMatrixRouting(d_cov=4, d_inp=4, d_out=4, n_inp=n_parts, n_out=n_objs, iterations=3).to(
            dev, dtype
        )
        for k, r in enumerate((r1, r2)):
            _randomize_(r, seed=22 + k, scale=0.5, only=("B", "beta_use", "beta_ign"))
        return r1, r2

    def orig_pair(r1, r2):
        o1 = orig.Heinsen2019Routing(4, 4, 4, n_out=n_parts, n_iters=3).to(r1.W.device, r1.W.dtype)
        o2 = orig.Heinsen2019Routing(4, 4, 4, n_inp=n_parts, n_out=n_objs, n_iters=3).to(r1.W.device, r1.W.dtype)
        for src, dst in ((r1, o1), (r2, o2)):
            for nm in ("W", "B", "beta_use", "beta_ign"):
                _copy_(getattr(dst, nm), getattr(src, nm))
        return o1, o2

    def run(pair):
        def f(a_, mu_):
            a1, m1, _ = pair[0](a_, mu_)
            return list(pair[1](a1, m1))

        return f

    r1, r2 = ours_pair()
    o1, o2 = orig_pair(r1, r2)
    gs = [
        _randn(B, n_objs, seed=25, device=dev),
        _randn(B, n_objs, 4, 4, seed=26, device=dev),
        _randn(B, n_objs, 4, 4, seed=27, device=dev),
    ]
    variants = {
        "ours": Variant(
            "capsule_lib GenerativeMatrixRouting x2",
            routing_step(run((r1, r2)), [a, mu], [*r1.parameters(), *r2.parameters()], gs),
        ),
        "heinsen2019": Variant(
            "heinsen_routing 2019 Routing pattern x2",
            routing_step(run((o1, o2)), [a, mu], [*o1.parameters(), *o2.parameters()], gs),
        ),
    }

    def agreement(dtype):
        p1, p2 = ours_pair(dtype)
        q1, q2 = orig_pair(p1, p2)
        aa = _randn(_cb(B, quick), I, seed=28, device=dev, dtype=dtype)
        mm = _randn(_cb(B, quick), I, 4, 4, seed=29, device=dev, dtype=dtype)
        return {
            "heinsen2019": compare(
                run((p1, p2)),
                run((q1, q2)),
                [aa, mm],
                dtype,
                mode="ours (default)",
                note="same algorithm; outputs a_out, mu_out, sigma2_out of the class routing",
            )
        }

    return Case(
        "routing_heinsen_smallnorb",
        "routing",
        B,
        f"Heinsen (2019) routing, smallNORB model's two routings: {I} -> {n_parts} (W shared by all "
        f"inputs) -> {n_objs}, 4x4 capsules, 3 iterations",
        dict(B=B, n_inp=I, n_parts=n_parts, n_out=n_objs, capsule="4x4", iterations=3),
        variants,
        agreement,
        heavy=True,
    )


@register("routing_inverted_conv")
def case_inverted_conv(dev, quick: bool) -> Case:
    B, N, M, H, K, S, d = (2, 8, 8, 7, 3, 2, 16) if quick else (32, 32, 32, 16, 3, 2, 16)
    torch.manual_seed(0)
    P = _leaf(F.layer_norm(_randn(B, N, H, H, d, seed=30, device=dev), (d,)))
    ours = InvertedConvCapsules(N, M, d, K, S).to(dev)  # expansion="unfold" (default)
    h = ours.output_size(H)
    gs = [_randn(B, M, h, h, d, seed=31, device=dev)]

    def apple(expansion, src, dtype=torch.float32):
        m = orig.AppleCapsuleCONV(N, d, M, d, K, S, expansion=expansion).to(dev, dtype)
        _copy_(m.w, src.weight)
        m.nonlinear_act.load_state_dict(src.norm.state_dict())
        return m

    def t2_ours(layer):
        return lambda p: [layer(p, layer(p))]  # T = 2: uniform pass, then one attention update

    def t2_apple(layer):
        return lambda p: [layer(p, 1, layer(p, 0))]

    a_stack, a_unfold = apple("stack", ours), apple("unfold", ours)
    variants = {
        "ours": Variant(
            "capsule_lib InvertedConvCapsules (unfold)", routing_step(t2_ours(ours), [P], list(ours.parameters()), gs)
        ),
        "apple_stack": Variant(
            "apple CapsuleCONV, first published (stack expansion)",
            routing_step(t2_apple(a_stack), [P], list(a_stack.parameters()), gs),
        ),
        "apple_unfold": Variant(
            "apple CapsuleCONV, later unfold expansion (fork)",
            routing_step(t2_apple(a_unfold), [P], list(a_unfold.parameters()), gs),
        ),
    }

    def agreement(dtype):
        res = {}
        pp = F.layer_norm(_randn(_cb(B, quick), N, H, H, d, seed=32, device=dev, dtype=dtype), (d,))
        for key, expansion, ours_exp in (
            ("apple_stack", "stack", "official_bug"),
            ("apple_unfold", "unfold", "unfold"),
        ):
            o = InvertedConvCapsules(N, M, d, K, S, expansion=ours_exp).to(dev, dtype)
            _randomize_(o, seed=33, scale=0.3, only=("norm.weight", "norm.bias"))
            a = apple(expansion, o, dtype)
            res[key] = compare(
                t2_ours(o),
                t2_apple(a),
                [pp],
                dtype,
                mode=f"ours with expansion='{ours_exp}'",
                note="T = 2 (uniform pass + one attention update)"
                + (
                    "; the stack expansion mixes pose entries and positions (apple PR #1)"
                    if expansion == "stack"
                    else ""
                ),
            )
        return res

    return Case(
        "routing_inverted_conv",
        "routing",
        B,
        f"Inverted dot-product attention (Tsai et al. 2020): CIFAR-10 CONV capsules {N}->{M}, k{K} s{S}, "
        f"{H}x{H} grid, 4x4 poses, T = 2",
        dict(B=B, in_types=N, out_types=M, kernel=K, stride=S, grid=H, out_grid=h, d=d, T=2),
        variants,
        agreement,
        heavy=not quick,
    )


@register("routing_inverted_fc")
def case_inverted_fc(dev, quick: bool) -> Case:
    B, N, G, J, d = (2, 8, 3, 10, 16) if quick else (32, 32, 5, 10, 16)
    I = N * G * G
    torch.manual_seed(0)
    P = _leaf(F.layer_norm(_randn(B, N, G, G, d, seed=40, device=dev), (d,)))
    ours = InvertedFCCapsules(I, J, d).to(dev)
    gs = [_randn(B, J, d, seed=41, device=dev)]

    def apple(src, dtype=torch.float32):
        m = orig.AppleCapsuleFC(I, d, J, d).to(dev, dtype)
        _copy_(m.w, src.weight)
        m.nonlinear_act.load_state_dict(src.norm.state_dict())
        return m

    a = apple(ours)
    variants = {
        "ours": Variant(
            "capsule_lib InvertedFCCapsules",
            routing_step(lambda p: [ours(p, ours(p))], [P], list(ours.parameters()), gs),
        ),
        "apple": Variant(
            "apple CapsuleFC pattern", routing_step(lambda p: [a(p, 1, a(p, 0))], [P], list(a.parameters()), gs)
        ),
    }

    def agreement(dtype):
        o = InvertedFCCapsules(I, J, d).to(dev, dtype)
        _randomize_(o, seed=42, scale=0.3, only=("norm.weight", "norm.bias"))
        m = apple(o, dtype)
        pp = F.layer_norm(_randn(_cb(B, quick), N, G, G, d, seed=43, device=dev, dtype=dtype), (d,))
        return {
            "apple": compare(
                lambda p: [o(p, o(p))],
                lambda p: [m(p, 1, m(p, 0))],
                [pp],
                dtype,
                mode="ours (default)",
                note="T = 2; input is the CONV grid, flattened type-major",
            )
        }

    return Case(
        "routing_inverted_fc",
        "routing",
        B,
        f"Inverted dot-product attention: CIFAR-10 class capsules, FC {I} -> {J}, 4x4 poses, T = 2",
        dict(B=B, n_inp=I, n_out=J, d=d, T=2),
        variants,
        agreement,
    )


def _self_attention_case(name: str, dev, quick: bool, B: int) -> Case:
    I, J, d, D = 16, 10, 8, 16
    if quick:
        B = 2
    torch.manual_seed(0)
    u = _leaf(_randn(B, I, d, seed=50, device=dev, scale=0.3))
    ours = SelfAttentionRouting(I, J, d, D).to(dev)
    _randomize_(ours, seed=51, scale=0.05, only=("log_prior",))
    gs = [_randn(B, J, D, seed=52, device=dev)]

    def keras(src, attention, dtype=torch.float32):
        m = orig.KerasFCCaps(J, D, I, d, attention=attention).to(dev, dtype)
        _copy_(m.W, src.weight)
        _copy_(m.b, src.log_prior)
        return m

    k_e, k_x = keras(ours, "einsum"), keras(ours, "explicit")
    variants = {
        "ours": Variant(
            "capsule_lib SelfAttentionRouting", routing_step(lambda x: [ours(x)], [u], list(ours.parameters()), gs)
        ),
        "keras": Variant(
            "Efficient-CapsNet FCCaps ops (Keras einsum)",
            routing_step(lambda x: [k_e(x)], [u], list(k_e.parameters()), gs),
        ),
        "keras_explicit": Variant(
            "FCCaps with the I x I attention matrix formed",
            routing_step(lambda x: [k_x(x)], [u], list(k_x.parameters()), gs),
        ),
    }

    def agreement(dtype):
        o = SelfAttentionRouting(I, J, d, D).to(dev, dtype)
        _randomize_(o, seed=53, scale=0.05, only=("log_prior",))
        x = _randn(_cb(B, quick), I, d, seed=54, device=dev, dtype=dtype, scale=0.3)
        note = "squash_E epsilon 1e-20 inside the norm's root (ours) vs outside (Keras)"
        return {
            key: compare(
                lambda v: [o(v)],
                lambda v, m=keras(o, att, dtype): [m(v)],  # noqa: B008 (built once per variant, on purpose)
                [x],
                dtype,
                mode="ours (default)",
                note=note,
            )
            for key, att in (("keras", "einsum"), ("keras_explicit", "explicit"))
        }

    return Case(
        name,
        "routing",
        B,
        f"Self-attention routing (Mazzia et al. 2021): Efficient-CapsNet FCCaps {I} -> {J}, {d} -> {D} dims",
        dict(B=B, n_inp=I, n_out=J, d_inp=d, d_out=D),
        variants,
        agreement,
    )


@register("routing_self_attention_b16")
def case_sa16(dev, quick: bool) -> Case:
    return _self_attention_case("routing_self_attention_b16", dev, quick, 16)


@register("routing_self_attention_b128")
def case_sa128(dev, quick: bool) -> Case:
    return _self_attention_case("routing_self_attention_b128", dev, quick, 128)


# ====================================================================================================
# Model training steps
# ====================================================================================================
def _images(B, C, H, dev, seed):
    return torch.rand(B, C, H, H, generator=_gen(seed)).to(dev)


def _labels(B, K, dev, seed):
    return torch.randint(0, K, (B,), generator=_gen(seed)).to(dev)


@register("model_capsnet_mnist")
def case_model_capsnet(dev, quick: bool) -> Case:
    B = 2 if quick else 128
    torch.manual_seed(0)
    x, y = _images(B, 1, 28, dev, 60), _labels(B, 10, dev, 61)
    y1h = F.one_hot(y, 10).float()
    ours = CapsNet().to(dev)
    opt = torch.optim.Adam(ours.parameters(), lr=1e-3)

    def loss_ours():
        out = ours(x, y)
        return margin_loss(out.scores, y) + 0.0005 * reconstruction_loss(out.reconstruction, x)

    gram = orig.GramAICapsuleNet().to(dev)
    with torch.no_grad():
        gram.digit_capsules.route_weights.mul_(0.01)  # keep the routing numerically tame; irrelevant for timing
    opt_g = torch.optim.Adam(gram.parameters(), lr=1e-3)

    def loss_gram():
        classes, recon = gram(x, y1h)
        return orig.gram_ai_capsule_loss(x, y1h, classes, recon)

    variants = {
        "ours": Variant("capsule_lib CapsNet (margin + 0.0005 recon, Adam)", model_step(ours, loss_ours, opt)),
        "gram_ai": Variant("gram-ai CapsuleNet pattern (its loss, Adam)", model_step(gram, loss_gram, opt_g)),
    }
    agree = {
        "gram_ai": not_comparable(
            "different models: gram-ai has 8 separate primary convolutions (another "
            "capsule layout), the softmax over input capsules and over the class lengths; "
            "the routing itself is compared in routing_dynamic"
        )
    }
    return Case(
        "model_capsnet_mnist",
        "model",
        B,
        "CapsNet MNIST training step (Sabour et al. 2017)",
        dict(B=B, image="1x28x28"),
        variants,
        lambda dtype: agree,
        heavy=not quick,
    )


def _efficient_case(name: str, dev, quick: bool, B: int) -> Case:
    if quick:
        B = 2
    torch.manual_seed(0)
    x, y = _images(B, 1, 28, dev, 70), _labels(B, 10, dev, 71)
    ours = EfficientCapsNet().to(dev)
    keras_model = copy.deepcopy(ours)
    fc = orig.KerasFCCaps(10, 16, 16, 8).to(dev)
    _copy_(fc.W, ours.digits.weight)
    _copy_(fc.b, ours.digits.log_prior)
    keras_model.digits = fc

    def loss_fn(model):
        def f():
            out = model(x, y)
            return margin_loss(out.scores, y) + 0.392 * reconstruction_loss(out.reconstruction, x, "mean")

        return f

    variants = {
        "ours": Variant(
            "capsule_lib EfficientCapsNet (margin + 0.392 MSE, Adam)",
            model_step(ours, loss_fn(ours), torch.optim.Adam(ours.parameters(), lr=5e-4)),
        ),
        "keras_fccaps": Variant(
            "same model with the Keras FCCaps ops",
            model_step(keras_model, loss_fn(keras_model), torch.optim.Adam(keras_model.parameters(), lr=5e-4)),
            note="the original is TensorFlow; only its routing layer is re-created",
        ),
    }

    def agreement(dtype):
        m1 = EfficientCapsNet().to(dev, dtype)
        _randomize_(m1, seed=72, scale=0.05, only=("log_prior",))
        m2 = copy.deepcopy(m1)
        k = orig.KerasFCCaps(10, 16, 16, 8).to(dev, dtype)
        _copy_(k.W, m1.digits.weight)
        _copy_(k.b, m1.digits.log_prior)
        m2.digits = k
        xx, yy = x[: _cb(B, quick)].to(dtype), y[: _cb(B, quick)]

        def run(m):
            return lambda v: [m(v, yy).scores]

        return {
            "keras_fccaps": compare(
                run(m1),
                run(m2),
                [xx],
                dtype,
                mode="ours (default), train mode",
                note="class-capsule lengths and input gradients of the whole model",
            )
        }

    return Case(
        name,
        "model",
        B,
        f"Efficient-CapsNet MNIST training step (Mazzia et al. 2021), B={B}",
        dict(B=B, image="1x28x28"),
        variants,
        agreement,
    )


@register("model_efficient_mnist_b16")
def case_model_eff16(dev, quick: bool) -> Case:
    return _efficient_case("model_efficient_mnist_b16", dev, quick, 16)


@register("model_efficient_mnist_b64")
def case_model_eff64(dev, quick: bool) -> Case:
    return _efficient_case("model_efficient_mnist_b64", dev, quick, 64)


def _apple_from_ours(model: CapsModel, expansion: str = "stack") -> orig.AppleCapsModel:
    """The official CapsModel around deep copies of capsule_lib's backbone/primary and the official layers,
    with capsule_lib's parameters."""
    cfg = model.config
    layers = []
    for lay in model.capsule_layers:
        if isinstance(lay, InvertedConvCapsules):
            a = orig.AppleCapsuleCONV(
                lay.n_inp,
                lay.pose_dim,
                lay.n_out,
                lay.pose_dim,
                lay.kernel_size,
                lay.stride,
                lay.dropout,
                expansion=expansion,
            )
        else:
            a = orig.AppleCapsuleFC(lay.n_inp, lay.pose_dim, lay.n_out, lay.pose_dim, lay.dropout)
        a = a.to(lay.weight.device, lay.weight.dtype)
        _copy_(a.w, lay.weight)
        a.nonlinear_act.load_state_dict(lay.norm.state_dict())
        layers.append(a)
    return orig.AppleCapsModel(
        copy.deepcopy(model.backbone),
        copy.deepcopy(model.primary.conv),
        copy.deepcopy(model.primary.norm),
        layers,
        copy.deepcopy(model.final_fc),
        cfg.primary_types,
        cfg.pose_dim,
        cfg.iterations,
    )


@register("model_inverted_cifar10")
def case_model_inverted(dev, quick: bool) -> Case:
    B = 2 if quick else 32
    torch.manual_seed(0)
    x, y = _randn(B, 3, 32, 32, seed=80, device=dev), _labels(B, 10, dev, 81)
    backbone = "simple" if quick else "resnet"  # --quick: the one-conv backbone and 8 capsule types
    small = (
        dict(primary_types=8, capsules=(CapsLayerSpec("conv", 8, 3, 2), CapsLayerSpec("conv", 8, 3, 1)))
        if quick
        else {}
    )
    ours = CapsModel(CapsModelConfig.cifar10(backbone, iterations=2, **small)).to(dev)
    apple = _apple_from_ours(ours, "stack").to(dev)

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    variants = {
        "ours": Variant(
            f"capsule_lib CapsModel ({backbone}, unfold, CE, SGD)",
            model_step(ours, lambda: F.cross_entropy(ours(x).scores, y), sgd(ours)),
        ),
        "apple_stack": Variant(
            "official CapsModel pattern (stack expansion)",
            model_step(apple, lambda: F.cross_entropy(apple(x), y), sgd(apple)),
        ),
    }

    def agreement(dtype):
        m1 = CapsModel(CapsModelConfig.cifar10(backbone, iterations=2, expansion="official_bug", **small)).to(
            dev, dtype
        )
        for lay in m1.capsule_layers:
            _randomize_(lay, seed=82, scale=0.3, only=("norm.weight", "norm.bias"))
        m2 = _apple_from_ours(m1, "stack").to(dev, dtype)
        m1.train(), m2.train()
        xx = _randn(_cb(B, quick), 3, 32, 32, seed=83, device=dev, dtype=dtype)
        return {
            "apple_stack": compare(
                lambda v: [m1(v).scores],
                lambda v: [m2(v)],
                [xx],
                dtype,
                mode="ours with expansion='official_bug', same parameters, train mode",
                note="logits and input gradients of the whole model",
            )
        }

    return Case(
        "model_inverted_cifar10",
        "model",
        B,
        f"Inverted-attention CapsModel, CIFAR-10 {backbone} backbone, T = 2, training step (Tsai et al. 2020)",
        dict(B=B, image="3x32x32", backbone=backbone, T=2),
        variants,
        agreement,
        heavy=not quick,
    )


@register("model_heinsen_smallnorb")
def case_model_heinsen(dev, quick: bool) -> Case:
    B, S = (2, 32) if quick else (20, 96)
    torch.manual_seed(0)
    x, y = torch.rand(B, 2, S, S, generator=_gen(90)).to(dev), _labels(B, 5, dev, 91)

    def build(dtype=torch.float32):
        m = SmallNORBClassifier(SmallNORBConfig(image_size=S)).to(dev, dtype)
        for r in m.routings:
            _randomize_(r, seed=92, scale=0.5, only=("B", "beta_use", "beta_ign"))
        o = copy.deepcopy(m)
        new = []
        for r in m.routings:
            q = orig.Heinsen2019Routing(r.d_cov, r.d_inp, r.d_out, r.n_inp, r.n_out, r.iterations).to(dev, dtype)
            for nm in ("W", "B", "beta_use", "beta_ign"):
                _copy_(getattr(q, nm), getattr(r, nm))
            new.append(q)
        o.routings = nn.ModuleList(new)
        return m, o

    ours, ho = build()

    def step(m):
        return model_step(
            m, lambda: soft_target_cross_entropy(m(x).scores, y), torch.optim.RAdam(m.parameters(), lr=5e-4)
        )

    variants = {
        "ours": Variant("capsule_lib SmallNORBClassifier (soft CE, RAdam)", step(ours)),
        "heinsen2019": Variant(
            "same conv stack + 2019 Routing pattern",
            step(ho),
            note="the original model's conv stack is the same network as capsule_lib's",
        ),
    }

    def agreement(dtype):
        m1, m2 = build(dtype)
        m1.train(), m2.train()
        xx = x[: _cb(B, quick)].to(dtype)
        return {
            "heinsen2019": compare(
                lambda v: [m1(v).scores],
                lambda v: [m2(v).scores],
                [xx],
                dtype,
                mode="ours (default), same parameters, train mode",
                note="class logits and input gradients of the whole model",
            )
        }

    return Case(
        "model_heinsen_smallnorb",
        "model",
        B,
        f"Heinsen (2019) smallNORB classifier training step, 2x{S}x{S} stereo input",
        dict(B=B, image=f"2x{S}x{S}"),
        variants,
        agreement,
        heavy=not quick,
    )


@register("model_em_smallnorb")
def case_model_em(dev, quick: bool) -> Case:
    B = 2 if quick else 16
    cfg = EMCapsNetConfig.small() if quick else EMCapsNetConfig()
    torch.manual_seed(0)
    x, y = (
        torch.rand(B, 1, cfg.image_size, cfg.image_size, generator=_gen(100)).to(dev),
        _labels(B, cfg.n_classes, dev, 101),
    )
    ours = EMCapsNet(cfg).to(dev)
    yl = orig.YL1993CapsNet(
        A=cfg.conv_channels,
        B=cfg.primary_types,
        C=cfg.caps1_types,
        D=cfg.caps2_types,
        E=cfg.n_classes,
        iters=cfg.iterations,
        conv1_padding=0,
    ).to(dev)
    variants = {
        "ours": Variant(
            "capsule_lib EMCapsNet (spread loss, Adam)",
            model_step(ours, lambda: spread_loss(ours(x).scores, y, 0.2), torch.optim.Adam(ours.parameters(), lr=3e-3)),
        ),
        "yl1993": Variant(
            "yl-1993 CapsNet pattern (A=64, B=8, C=D=16, valid conv1)",
            model_step(yl, lambda: spread_loss(yl(x), y, 0.2), torch.optim.Adam(yl.parameters(), lr=3e-3)),
            note="conv1 padding 0 so the grids are the paper's 14 -> 6 -> 4",
        ),
    }
    agree = {
        "yl1993": not_comparable(
            "different models: yl-1993 adds BatchNorm, renormalises R*a over the outputs, "
            "uses raw costs with lambda 1e-3 and another coordinate addition; the routing "
            "layer is compared in routing_em_convcaps1/2"
        )
    }
    return Case(
        "model_em_smallnorb",
        "model",
        B,
        "Matrix capsules with EM routing, smallNORB model (A=64, B=8, C=D=16), training step"
        if not quick
        else "EM capsules, small MNIST-sized model (quick)",
        dict(B=B, image=f"1x{cfg.image_size}x{cfg.image_size}"),
        variants,
        lambda dtype: agree,
        heavy=not quick,
    )


# ====================================================================================================
# Timing and memory
# ====================================================================================================
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_once(step: Callable[[], None], dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def add_modes(case: Case, dev: torch.device, modes: list[str]) -> list[str]:
    """Add capsule_lib's step in the other ``modes`` (``MODES``) as variants ``ours_<mode>`` right after ``ours``.

    bf16: the whole step under ``torch.autocast(dtype=torch.bfloat16)`` (what a user turns on; each layer
    decides what runs in bf16, the routings keep their statistics in fp32). compiled: ``torch.compile`` of the
    whole step (default inductor backend; the forward graph and its AOT backward are compiled, ``backward()``
    and the optimizer step are separate graphs). The step's first call (compilation) is recorded as
    ``first_step_s``. Returns the names of the added variants."""
    names = list(case.variants)
    ours = case.variants[names[0]]
    added = {}
    for mode in modes:
        compiled, bf16 = MODES[mode]
        if mode == "eager":
            continue
        inner = ours.step

        def step(inner=inner, bf16=bf16) -> None:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                inner()

        if compiled:
            step = torch.compile(step)
        tags = [t for t, on in (("torch.compile", compiled), ("bf16 autocast", bf16)) if on]
        added[f"{names[0]}_{mode}"] = Variant(f"{ours.label} [{', '.join(tags)}]", step, note=mode)
    case.variants = {names[0]: ours, **added, **{nm: case.variants[nm] for nm in names[1:]}}
    return list(added)


def run_case(
    case: Case,
    dev: torch.device,
    repeat: int,
    warmup: int,
    check_dtype: torch.dtype | None,
    memory: bool = True,
    min_time: float = 0.0,
    profile_ops: bool = False,
) -> dict:
    names = list(case.variants)
    ours_modes = [nm for nm in names[1:] if case.variants[nm].note in MODES]  # capsule_lib in other modes
    # Routing layers hold no optimizer state, so their first warm-up step is already a steady-state step: its
    # peak memory is measured there (saves one heavy step). Model steps allocate the optimizer state in their
    # first step, so they get an extra profiled step after the timed ones.
    mem_in_warmup = memory and case.kind == "routing" and warmup >= 1
    mem: dict = {nm: None for nm in names}
    first_step: dict = {}
    for nm in names:  # warm up (lazy init, optimizer state, allocator; compilation, which may take two calls)
        compiled = nm in ours_modes and MODES[case.variants[nm].note][0]
        for w in range(warmup + (1 if compiled else 0)):
            if compiled and w == 0:  # the compilation: timed, not profiled
                first_step[nm] = time_once(case.variants[nm].step, dev)
            elif mem_in_warmup and mem[nm] is None:
                mem[nm] = peak_memory(case.variants[nm].step, dev)
            else:
                case.variants[nm].step()
    _sync(dev)
    times = {nm: [] for nm in names}
    r = 0
    while r < repeat:  # interleaved: A B C, C B A, A B C, ...
        for nm in names if r % 2 == 0 else names[::-1]:
            times[nm].append(time_once(case.variants[nm].step, dev))
        if r == 0 and min_time:  # short steps: more repeats, so each variant is timed for about min_time seconds
            fastest = min(ts[0] for ts in times.values())
            repeat = max(repeat, min(200, math.ceil(min_time / max(fastest, 1e-6))))
        r += 1
    if memory and not mem_in_warmup:
        mem = {nm: peak_memory(case.variants[nm].step, dev) for nm in names}
    profiles = {nm: op_profile(case.variants[nm].step) for nm in names if profile_ops and nm not in ours_modes}
    out_variants = {}
    ours_med = statistics.median(times[names[0]])
    originals = [nm for nm in names[1:] if nm not in ours_modes]
    for nm in names:
        ts = times[nm]
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [med, med, med]
        out_variants[nm] = {
            "label": case.variants[nm].label,
            "note": case.variants[nm].note,
            "times_s": ts,
            "median_s": med,
            "min_s": min(ts),
            "iqr_s": q[2] - q[0],
            "first_step_s": first_step.get(nm),
            "samples_per_s": case.batch / med,
            "peak_mem_bytes": mem[nm],
            "speedup_of_ours": None if nm == names[0] or nm in ours_modes else med / ours_med,
        }
    result = {
        "kind": case.kind,
        "description": case.description,
        "batch": case.batch,
        "shapes": case.shapes,
        "repeat": repeat,
        "variants": out_variants,
        "ours": names[0],
        "ours_modes": ours_modes,
        "notes": case.notes,
        "speedups": {nm: out_variants[nm]["speedup_of_ours"] for nm in originals},
        "goal": goal_summary(case.name, out_variants, [names[0], *ours_modes], originals),
    }
    if profiles:  # capsule_lib eager fp32 and each original
        result["profile"] = profiles
    # free the timing closures before the agreement run (which builds its own modules)
    case.variants.clear()
    gc.collect()
    if check_dtype is not None and case.agreement is not None:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(1234)
            result["agreement"] = case.agreement(check_dtype)
    else:
        result["agreement"] = {}
    return result


def op_profile(step: Callable[[], None], top: int = 8) -> dict:
    """Where one step's time goes: the ``top`` operators by self CPU time (``torch.profiler``, one step; on CUDA
    the CPU side only), each with its milliseconds, share of the step and call count, plus the step's total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)  # microseconds
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return {
        "total_ms": total / 1e3,
        "top": [
            {"op": e.key, "ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total, "calls": e.count}
            for e in events[:top]
        ],
    }


def goal_summary(name: str, variants: dict, ours: list[str], originals: list[str]) -> dict | None:
    """Each capsule_lib mode against the fastest original of the same run, and issue #17's goal for the case."""
    if not originals:
        return None
    fastest = min(originals, key=lambda nm: variants[nm]["median_s"])
    t_orig = variants[fastest]["median_s"]
    ratios = {nm: t_orig / variants[nm]["median_s"] for nm in ours}
    goal = GOALS.get(name)
    return {
        "fastest_original": fastest,
        "goal": goal,
        "ratio": ratios,  # fastest original's median / this mode's median, per capsule_lib mode
        "meets_goal": None if goal is None else {nm: r >= goal for nm, r in ratios.items()},
    }


# ====================================================================================================
# Reporting
# ====================================================================================================
def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def _fmt_mem(b) -> str:
    if b is None:
        return "n/a"
    return f"{b / 2**20:.0f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def _fmt_agree(a: dict | None) -> str:
    if not a:
        return "-"
    if not a.get("comparable"):
        return "not comparable numerically"
    parts = [f"out {a['outputs_max_abs_diff']:.1e}"]
    if a.get("grads_max_abs_diff") is not None:
        parts.append(f"grad {a['grads_max_abs_diff']:.1e}")
    flag = "ok" if a.get("agree") else "DIFFERS"
    return f"{flag} ({', '.join(parts)}; {a['dtype']}, {a['mode']})"


def case_rows(name: str, res: dict) -> list[list[str]]:
    rows = []
    if "error" in res:
        return [[name, "ERROR", res["error"], "", "", "", "", ""]]
    for nm, v in res["variants"].items():
        sp = v["speedup_of_ours"]
        if nm in res.get("ours_modes", []):
            sp = res["variants"][res["ours"]]["median_s"] / v["median_s"]  # vs capsule_lib eager fp32
        rows.append(
            [
                name,
                f"{nm}: {v['label']}",
                _fmt_time(v["median_s"]),
                f"{v['samples_per_s']:.1f}",
                _fmt_mem(v["peak_mem_bytes"]),
                "-" if sp is None else (f"({sp:.2f}x eager)" if nm in res.get("ours_modes", []) else f"{sp:.2f}x"),
                ""
                if nm == res["ours"] or nm in res.get("ours_modes", [])
                else _fmt_agree(res.get("agreement", {}).get(nm)),
            ]
        )
    return rows


HEADER = ["case", "variant", "time/step (median)", "samples/s", "peak mem", "speed-up of ours", "agreement with ours"]


def print_case(name: str, res: dict) -> None:
    for row in case_rows(name, res):
        print("  " + " | ".join(row))
    sys.stdout.flush()


def markdown_table(data: dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for name, res in data["cases"].items():
        for row in case_rows(name, res):
            lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    return "\n".join(lines)


GOAL_HEADER = [
    "case",
    "fastest original",
    "its time",
    "goal",
    "eager fp32",
    "eager bf16",
    "compiled fp32",
    "compiled bf16",
]


def goal_table(data: dict) -> str:
    """One row per case: capsule_lib's speed-up over the fastest original in each mode (ratio of medians,
    same run), marked with a check where it reaches issue #17's goal; memory is in the full table."""
    lines = ["| " + " | ".join(GOAL_HEADER) + " |", "|" + "---|" * len(GOAL_HEADER)]
    for name, res in data["cases"].items():
        g = res.get("goal") if "error" not in res else None
        if not g:
            continue
        cells = []
        for mode in MODES:
            nm = res["ours"] if mode == "eager" else f"{res['ours']}_{mode}"
            r = g["ratio"].get(nm)
            ok = g["meets_goal"] and g["meets_goal"].get(nm)
            cells.append("-" if r is None else f"{r:.2f}x{' ✓' if ok else ''}")
        orig = g["fastest_original"]
        goal = "-" if g["goal"] is None else f">= {g['goal']:g}x"
        lines.append(
            f"| {name} | {orig} | {_fmt_time(res['variants'][orig]['median_s'])} | {goal} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def profile_table(data: dict, top: int = 4) -> str:
    """capsule_lib's eager fp32 step per case (from ``--profile``): its ``top`` operators by self CPU time."""
    lines = ["| case | profiled step | top operators (share of the step's CPU time) |", "|---|---|---|"]
    for name, res in data["cases"].items():
        prof = res.get("profile", {}).get(res.get("ours"))
        if prof:
            ops = ", ".join(f"{op['op']} {100 * op['share']:.0f}% (x{op['calls']})" for op in prof["top"][:top])
            lines.append(f"| {name} | {_fmt_time(prof['total_ms'] / 1e3)} | {ops} |")
    return "\n".join(lines)


def memory_bandwidth(mib: int = 512, repeats: int = 5) -> dict:
    """Main-memory bandwidth as torch sees it (the yardstick for memory-bound layers): the best of ``repeats``
    copies of a ``mib`` MiB float32 tensor into an already-touched one (bytes read + written per second), and
    the same for a sum (bytes read per second). Far larger than the caches, on the current torch threads."""
    n = mib * 2**20 // 4
    src, dst = torch.ones(n), torch.zeros(n)
    copy_s, sum_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        copy_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        src.sum()
        sum_s.append(time.perf_counter() - t0)
    return {"copy_gb_s": 2 * 4 * n / min(copy_s) / 1e9, "read_gb_s": 4 * n / min(sum_s) / 1e9, "mib": mib}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_state() -> dict:
    """The commit the benchmark ran at and whether capsule_lib/ had uncommitted changes (None outside git)."""
    import subprocess

    try:
        head = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=HERE.parent, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "capsule_lib"],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return {"git_commit": head, "capsule_lib_dirty": bool(dirty) if head else None}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "capsule_lib_dirty": None}


def _select(patterns: str | None) -> list[str]:
    if not patterns:
        return list(CASES)
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [n for n in CASES if any(fnmatch.fnmatch(n, p) or p == n for p in pats)]
    if not chosen:
        raise SystemExit(f"--only {patterns!r} matches no case; cases: {', '.join(CASES)}")
    return chosen


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats: a smoke test (< 1 min on CPU)")
    ap.add_argument("--only", default=None, help="comma-separated case names or globs (e.g. 'routing_*')")
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed repeats per variant (default 5; 2 with --quick; heavy cases use half, at least 3)",
    )
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per variant (default 1)")
    ap.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="cases with short steps get more repeats (up to 200), so that each variant is timed for "
        "about this many seconds (default 2; 0 with --quick)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--out", default=None, help="JSON output (default benchmarks/results/<device>[_quick].json)")
    ap.add_argument(
        "--check-dtype",
        default=None,
        choices=["float32", "float64", "none"],
        help="dtype of the numerical agreement runs (default float32; float64 with --quick)",
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    ap.add_argument("--ours-only", action="store_true", help="time capsule_lib's variant only (e.g. for allocator.py)")
    ap.add_argument(
        "--modes",
        default=None,
        help="capsule_lib's step in these modes, comma-separated from "
        + ", ".join(MODES)
        + " (default: all four; eager only with --quick or --ours-only)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also profile one step of capsule_lib (eager fp32) and of each original: top operators in the JSON",
    )
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--table", default=None, metavar="JSON", help="print a result file as a Markdown table and exit")
    args = ap.parse_args(argv)

    if args.list:
        print("\n".join(CASES))
        return {}
    if args.table:
        data = json.loads(Path(args.table).read_text())
        print(markdown_table(data))
        print()
        print(goal_table(data))
        if data["meta"].get("profile"):
            print()
            print(profile_table(data))
        return data
    if args.device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(args.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    repeat = args.repeat or (2 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else 1
    cd = args.check_dtype or ("float64" if args.quick else "float32")
    if args.min_time is None:
        args.min_time = 0.0 if args.quick else 2.0
    check_dtype = None if cd == "none" else getattr(torch, cd)
    if args.modes is None:
        args.modes = "eager" if (args.quick or args.ours_only) else ",".join(MODES)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes {args.modes!r}: expected names from {', '.join(MODES)}")
    out = Path(args.out) if args.out else HERE / "results" / f"{dev.type}{'_quick' if args.quick else ''}.json"

    meta = {
        "schema": SCHEMA_VERSION,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": args.quick,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "repeat": repeat,
        "warmup": warmup,
        "min_time_s": args.min_time,
        "check_dtype": cd,
        "modes": modes,
        "profile": args.profile,
        "opt_einsum": bool(torch.backends.opt_einsum.is_available()),
        **_git_state(),
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_bandwidth": memory_bandwidth(64 if args.quick else 512) if dev.type == "cpu" else None,
        "memory_method": (
            "torch.cuda.max_memory_allocated above the step's starting level"
            if dev.type == "cuda"
            else "peak of the CPU tensor bytes allocated during one step and not yet freed (tensors that "
            "existed before the step are not counted), from torch.profiler memory events"
        ),
        "timing_method": "median of interleaved repeats after warm-up; CUDA events after synchronize on CUDA",
    }
    print(
        f"capsule_lib benchmark on {meta['device_name']} ({dev}), torch {torch.__version__}, "
        f"{meta['torch_threads']} thread(s), repeat {repeat}, quick={args.quick}"
    )
    print("  " + " | ".join(HEADER))
    cases = {}
    t_all = time.perf_counter()
    for name in _select(args.only):
        t0 = time.perf_counter()
        try:
            case = CASES[name](dev, args.quick)
            if args.ours_only:  # the first variant is capsule_lib's
                first = next(iter(case.variants))
                case.variants = {first: case.variants[first]}
            add_modes(case, dev, modes)
            rep = max(3, math.ceil(repeat / 2)) if case.heavy else repeat
            res = run_case(
                case,
                dev,
                min(rep, repeat),
                warmup,
                check_dtype,
                memory=not args.no_memory,
                min_time=args.min_time,
                profile_ops=args.profile,
            )
        except Exception as exc:  # keep going; the error is recorded in the JSON
            res = {"error": f"{type(exc).__name__}: {exc}"}
        res["wall_s"] = time.perf_counter() - t0
        cases[name] = res
        print_case(name, res)
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    meta["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    meta["wall_s"] = time.perf_counter() - t_all
    data = {"meta": meta, "cases": cases}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print()
    print(goal_table(data))
    print(f"wrote {out} ({meta['wall_s']:.0f} s)")
    return data


if __name__ == "__main__":
    main()
