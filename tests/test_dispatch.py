"""Where the hand-written kernels run (#36): one rule, ``routing/_common.use_kernel``, picks them on the CPU only;
on CUDA every routing takes its plain, vectorised path. Tested without a GPU by taking the CPU off
``KERNEL_DEVICES``, which makes the CPU run exactly the code a CUDA tensor runs."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import capsule_lib.routing._common as common
from capsule_lib.layers import ConvCapsules
from capsule_lib.routing import dynamic, em, heinsen_2019, inverted, self_attention
from capsule_lib.routing._kernels import em as em_kernel
from capsule_lib.routing._kernels import heinsen as heinsen_kernel
from capsule_lib.routing._kernels import inverted as inverted_kernel
from capsule_lib.routing._kernels import self_attention as self_attention_kernel
from capsule_lib.routing.heinsen_2019 import generative_matrix_routing

#: the plain EM ConvCapsules forward + backward below issues 367 top-level operators (torch 2.14, CPU) whatever the
#: batch and grid; the bound leaves room for other torch versions. The blocked CPU kernel issues ~3,700 at batch 8
#: on a 14 x 14 grid and ~14,000 at batch 32 (one set per cache-sized block): on a GPU each is a kernel launch.
EM_OPS_BOUND = 450


@pytest.fixture
def cuda_rule(monkeypatch):
    """Run the routings as they run on CUDA: no device takes the kernels."""
    monkeypatch.setattr(common, "KERNEL_DEVICES", ())


def test_kernels_are_chosen_for_the_cpu_only():
    assert common.KERNEL_DEVICES == ("cpu",)
    x = torch.zeros(2, 3)
    assert common.use_kernel(x) and common.kernel_device(x)
    assert not common.use_kernel(torch.zeros(2, 3, device="meta"))  # any other device: the plain path
    assert not common.use_kernel(x, trace=True)
    assert not common.use_kernel(x.half()) and common.use_kernel(x.half(), dtypes=None)
    assert not common.use_kernel(x, x.double())  # mixed dtypes
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not common.use_kernel(x) and common.use_kernel(x, autocast=True)


#: every hand-written kernel's autograd function
KERNEL_CLASSES = (
    dynamic._CapsuleVotes,
    dynamic._FusedRouting,
    em_kernel._EMRoutingFunction,
    inverted_kernel._AttendMatrix,
    self_attention_kernel._FusedSelfAttention,
)


def _forbid(monkeypatch, cls):
    def refuse(*a, **k):
        raise AssertionError(f"{cls.__name__} ran on the CUDA path")

    monkeypatch.setattr(cls, "apply", refuse)


def test_no_fused_kernel_runs_on_the_cuda_path(cuda_rule, monkeypatch):
    """Every kernel class refuses to run; every routing still computes forward and backward (its plain path)."""
    for cls in KERNEL_CLASSES:
        _forbid(monkeypatch, cls)
    u = torch.rand(2, 12, 8, requires_grad=True)
    dynamic.DynamicRouting(12, 4, 8, 16)(u).sum().backward()
    self_attention.SelfAttentionRouting(12, 4, 8, 16)(u).sum().backward()
    mu, a = em.EMRouting(12, 4)(torch.rand(2, 12, 16, requires_grad=True), torch.rand(2, 12))
    (mu.sum() + a.sum()).backward()
    layer = inverted.InvertedConvCapsules(4, 4, 16, kernel_size=3)
    layer(torch.rand(2, 4, 5, 5, 16, requires_grad=True)).sum().backward()
    shared = [torch.rand(1, 3, 4, 4), torch.rand(1, 3, 4, 4), torch.rand(1, 3), torch.rand(1, 3)]
    calls = []
    real = heinsen_kernel.moments_routing
    monkeypatch.setattr(heinsen_kernel, "moments_routing", lambda *a: calls.append(1) or real(*a))
    generative_matrix_routing(torch.rand(2, 9), torch.rand(2, 9, 4, 4), *shared)
    assert calls == []  # Heinsen's moments path is CPU-only too: the votes path ran


def test_the_kernels_run_on_the_cpu(monkeypatch):
    """The converse: on the CPU the same calls take the kernels (the rule is not vacuous)."""
    seen = _record_kernels(monkeypatch)
    u = torch.rand(2, 12, 8, requires_grad=True)
    dynamic.DynamicRouting(12, 4, 8, 16)(u).sum().backward()
    self_attention.SelfAttentionRouting(12, 4, 8, 16)(u).sum().backward()
    em.EMRouting(12, 4)(torch.rand(2, 12, 16), torch.rand(2, 12))
    assert sorted(set(seen)) == ["_CapsuleVotes", "_EMRoutingFunction", "_FusedRouting", "_FusedSelfAttention"]


def _top_level_ops(batch: int, grid: int) -> int:
    """Top-level ``aten::`` operators (not called by another one) of one EM ConvCapsules forward + backward."""
    torch.manual_seed(0)
    layer = ConvCapsules(8, 8, 3, 2)
    poses, acts = torch.randn(batch, 8, grid, grid, 16, requires_grad=True), torch.rand(batch, 8, grid, grid)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        mu, a = layer(poses, acts)
        (mu.sum() + a.sum()).backward()
    ops = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


@pytest.mark.slow
def test_em_operator_count_on_the_cuda_path_is_bounded_and_does_not_grow(monkeypatch):
    """On the CUDA path one EM ConvCapsules step issues a fixed number of operators (each a kernel launch on a GPU),
    whatever the batch and grid, below EM_OPS_BOUND; the CPU kernel's count grows with its blocks."""
    monkeypatch.setattr(common, "KERNEL_DEVICES", ())
    small, large = _top_level_ops(2, 7), _top_level_ops(32, 14)
    assert small == large <= EM_OPS_BOUND, (small, large)
    monkeypatch.setattr(common, "KERNEL_DEVICES", ("cpu",))
    assert _top_level_ops(32, 14) > 10 * EM_OPS_BOUND  # what the bound guards against


@pytest.mark.slow
def test_a_recipe_can_compile_its_training_step(tmp_path, monkeypatch):
    """``train(compile=...)`` / ``--compile reduce-overhead`` (CUDA graphs on a GPU) for launch-bound models: the
    training step runs compiled, evaluation and the checkpoint use the plain model, and an unknown mode is refused
    before any data is read."""
    from capsule_lib.models import EfficientCapsNetConfig
    from capsule_lib.train import train

    tiny = EfficientCapsNetConfig.mnist()
    run = dict(epochs=1, train_subset=64, eval_subset=32, batch_size=16, device="cpu", augment=False, model=tiny)
    model, trainer = train(
        "efficient", compile="default", data_root=str(tmp_path), progress=False, test=False, offline=True, **run
    )
    assert type(trainer.net).__name__ == "OptimizedModule" and trainer.net._orig_mod is model
    assert trainer.history.records[-1]["train_loss"] == trainer.history.records[-1]["train_loss"]  # finite, not NaN
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())
    assert trainer.history.meta["compile"] == "default"
    with pytest.raises(ValueError, match=r"compile must be one of \(None, 'default', 'reduce-overhead'"):
        train("efficient", compile="fast", data_root=str(tmp_path), offline=True, **run)


# ------------------------------------------------------------- the algorithm module chooses, through use_kernel
def _record_kernels(monkeypatch) -> list[str]:
    """Every kernel that runs from now on, by name (each still runs)."""
    seen: list[str] = []
    for cls in KERNEL_CLASSES:
        real = cls.apply
        monkeypatch.setattr(cls, "apply", lambda *a, _c=cls, _r=real: seen.append(_c.__name__) or _r(*a))
    real_moments = heinsen_kernel.moments_routing
    monkeypatch.setattr(
        heinsen_kernel, "moments_routing", lambda *a: seen.append("moments_routing") or real_moments(*a)
    )
    return seen


def _shared_heinsen():
    """Heinsen 2019 weights shared by every input (first size 1): where its moments kernel applies."""
    return [torch.rand(1, 3, 4, 4), torch.rand(1, 3, 4, 4), torch.rand(1, 3), torch.rand(1, 3)]


#: per algorithm module: one call on the CPU, in float32, without a trace, and the kernels it runs there
KERNEL_CALLS = {
    "dynamic": (
        dynamic,
        lambda: dynamic.DynamicRouting(12, 4, 8, 16)(torch.rand(2, 12, 8, requires_grad=True)).sum().backward(),
        ["_CapsuleVotes", "_FusedRouting"],
    ),
    "em": (em, lambda: em.EMRouting(12, 4)(torch.rand(2, 12, 16), torch.rand(2, 12)), ["_EMRoutingFunction"]),
    "heinsen_2019": (
        heinsen_2019,
        lambda: generative_matrix_routing(torch.rand(2, 9), torch.rand(2, 9, 4, 4), *_shared_heinsen()),
        ["moments_routing"],
    ),
    "inverted": (
        inverted,
        lambda: inverted.InvertedFCCapsules(10, 4, 16)(torch.rand(2, 10, 16), torch.rand(2, 4, 16)),
        ["_AttendMatrix"],
    ),
    "self_attention": (
        self_attention,
        lambda: self_attention.SelfAttentionRouting(12, 4, 8, 16)(torch.rand(2, 12, 8)),
        ["_FusedSelfAttention"],
    ),
}


@pytest.mark.parametrize("kind", KERNEL_CALLS)
def test_each_kernel_is_chosen_by_use_kernel_in_its_algorithm_module(kind, monkeypatch):
    """The algorithm module's ``use_kernel`` alone decides: refused, no kernel runs on the CPU; allowed, its kernels
    run even where the real rule would refuse them (the CUDA rule). No kernel decides for itself (#48)."""
    module, call, kernels = KERNEL_CALLS[kind]
    seen = _record_kernels(monkeypatch)
    call()
    assert sorted(set(seen)) == kernels  # the real rule on the CPU: the kernels run
    seen.clear()
    monkeypatch.setattr(module, "use_kernel", lambda *a, **k: False)
    call()
    assert seen == []
    monkeypatch.setattr(common, "KERNEL_DEVICES", ())
    monkeypatch.setattr(module, "use_kernel", lambda *a, **k: True)
    call()
    assert sorted(set(seen)) == kernels


def _heinsen_path(monkeypatch, *, dtype=torch.float32, shared=True, trace=False, autocast=False, compiling=False):
    """Which path ``method="auto"`` takes for one Heinsen 2019 call: ``"moments"`` or ``"votes"``."""
    seen = _record_kernels(monkeypatch)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    params = _shared_heinsen() if shared else [torch.rand(9, *p.shape[1:]) for p in _shared_heinsen()]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        generative_matrix_routing(torch.rand(2, 9), torch.rand(2, 9, 4, 4, dtype=dtype), *params, return_routing=trace)
    return "moments" if seen else "votes"


def test_heinsen_auto_takes_the_moments_kernel_exactly_where_it_did(monkeypatch):
    """``method="auto"`` goes through use_kernel with the outcome it had before (#48): the moments kernel on the CPU
    for any dtype, under autocast (the routing runs with autocast off) and while ``torch.compile`` traces (plain tensor
    code: ``use_kernel(compiling=True)``); the votes path with a trace, with per-input weights and off the CPU."""
    assert _heinsen_path(monkeypatch) == "moments"
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        assert _heinsen_path(monkeypatch, dtype=dtype) == "moments", dtype
    assert _heinsen_path(monkeypatch, autocast=True) == "moments"
    assert _heinsen_path(monkeypatch, compiling=True) == "moments"
    assert _heinsen_path(monkeypatch, trace=True) == "votes"
    assert _heinsen_path(monkeypatch, shared=False) == "votes"
    monkeypatch.setattr(common, "KERNEL_DEVICES", ())
    assert _heinsen_path(monkeypatch) == "votes"
    assert _heinsen_path(monkeypatch, compiling=True) == "votes"


def test_inverted_attention_takes_its_kernel_under_autocast_and_not_while_compiling(monkeypatch):
    """Inverted attention's choice, now in routing/inverted.py: the kernel on the CPU for any dtype and under autocast
    (it casts its inputs itself) and with a trace (it returns ``r`` and ``a``); the plain update while
    ``torch.compile`` traces."""
    seen = _record_kernels(monkeypatch)
    P, W, Q = torch.rand(5, 4, 2, 2), torch.rand(5, 2, 2, 3), torch.rand(4, 3, 4)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        inverted._attend_matrix(P.to(dtype), W.to(dtype), Q.to(dtype))
        assert seen == ["_AttendMatrix"], dtype
        seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inverted._attend_matrix(P, W, Q)
    assert seen == ["_AttendMatrix"]
    seen.clear()
    inverted.InvertedFCCapsules(10, 4, 16)(torch.rand(2, 10, 16), torch.rand(2, 4, 16), return_routing=True)
    assert seen == ["_AttendMatrix"]
    seen.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    inverted._attend_matrix(P, W, Q)
    assert seen == []
