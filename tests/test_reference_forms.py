"""Readable first, fast second: every routing module opens with its algorithm as a short reference function, and
the library's paths (plain and CPU kernels) compute the same values and gradients in float64. (Dynamic routing's
and Heinsen's references are checked in their own test files, test_routing_dynamic.py and test_routing_heinsen.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from capsule_lib.routing._common import use_kernel
from capsule_lib.routing.em import em_routing, em_routing_reference, inverse_temperature_schedule
from capsule_lib.routing.inverted import InvertedFCCapsules, inverted_routing_reference
from capsule_lib.routing.self_attention import (
    SelfAttentionRouting,
    self_attention_routing,
    self_attention_routing_reference,
    self_attention_votes,
)

ROUTING = Path(__file__).resolve().parents[1] / "capsule_lib" / "routing"
ALGORITHMS = ["dynamic", "em", "heinsen_2019", "heinsen_2022", "inverted", "self_attention"]


def _randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()


def _grads(out, inputs, seed=7):
    g = torch.Generator().manual_seed(seed)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, inputs)


def _assert_same(ours, ref, inputs):
    ours_t = ours if isinstance(ours, tuple) else (ours,)
    ref_t = ref if isinstance(ref, tuple) else (ref,)
    for x, y in zip(ours_t, ref_t, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)
    for x, y in zip(_grads(ours, inputs), _grads(ref, inputs), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("module", ALGORITHMS)
def test_each_routing_module_opens_with_its_reference_form(module):
    """The first function a reader meets in routing/<algorithm>.py is the algorithm itself (short, and the one
    the chapters show), before any variant, module or kernel."""
    tree = ast.parse((ROUTING / f"{module}.py").read_text())
    first = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    assert isinstance(first, ast.FunctionDef) and first.name.endswith("_reference"), (module, first.name)
    assert first.end_lineno - first.lineno + 1 <= 45, f"{module}.{first.name}: {first.end_lineno - first.lineno + 1}"
    src = ast.get_source_segment((ROUTING / f"{module}.py").read_text(), first)
    assert max(len(line) for line in src.splitlines()) <= 78, f"{first.name}: lines wider than the chapter's column"


@pytest.mark.parametrize("trace", [False, True])  # False: the CPU kernel; True: the plain autograd path
@pytest.mark.parametrize("normalize_costs", [True, False])
def test_em_routing_equals_its_reference_in_float64(trace, normalize_costs):
    B, I, J, D = 3, 6, 4, 16
    votes, a_in = _randn(B, I, J, D), torch.rand(B, I, dtype=torch.float64).requires_grad_()
    bu, ba = _randn(J, scale=0.1), _randn(J, scale=0.1)
    lams = inverse_temperature_schedule(3)
    assert use_kernel(votes, trace=trace, dtypes=None, autocast=True) is not trace
    out = em_routing(votes, a_in, bu, ba, 3, normalize_costs=normalize_costs, return_routing=trace)
    ours = out[0] if trace else out
    ref = em_routing_reference(votes, a_in, bu, ba, lams, cost_scale=J / I if normalize_costs else 1.0)
    _assert_same(ours, ref, (votes, a_in, bu, ba))


@pytest.mark.parametrize("trace", [False, True])  # False: the blocked CPU kernel (_AttendMatrix); True: plain
def test_inverted_routing_equals_its_reference_in_float64(trace):
    layer = InvertedFCCapsules(5, 3, 16).double()
    with torch.no_grad():
        layer.norm.weight.normal_(1.0, 0.2)
        layer.norm.bias.normal_(0.0, 0.2)
    poses = _randn(2, 5, 16)
    out = None
    for _ in range(3):  # the layer's updates, each given the previous output (how the models iterate it)
        out = layer(poses, out, return_routing=trace)
        out = out[0] if trace else out
    ref = inverted_routing_reference(poses, layer.weight, 3, layer.norm.weight, layer.norm.bias, layer.norm.eps)
    _assert_same(out, ref, (poses, layer.weight, layer.norm.weight, layer.norm.bias))


def test_self_attention_routing_equals_its_reference_in_float64():
    layer = SelfAttentionRouting(6, 4, 8, 5).double()
    with torch.no_grad():
        layer.log_prior.normal_(0.0, 0.3)
    u = _randn(3, 6, 8)
    inputs = (u, layer.weight, layer.log_prior)

    def ref():
        return self_attention_routing_reference(self_attention_votes(u, layer.weight), layer.prior(), layer.eps)

    assert use_kernel(u, layer.weight, layer.log_prior)  # the layer takes its CPU kernel here
    _assert_same(layer(u), ref(), inputs)
    plain = self_attention_routing(self_attention_votes(u, layer.weight), layer.prior(), eps=layer.eps)
    _assert_same(plain, ref(), inputs)
