"""Every fused or blocked kernel against its plain reference on inputs that span many scales.

A kernel must agree with its reference wherever the reference is accurate. For each kernel and each input
family (mixed scales within one input, a single spike), two checks on values and on the gradients of every input:

* float64: the kernel equals the plain path (relative error 1e-9 of each tensor's scale);
* float32: the kernel's error against the float64 plain path is at most ``FACTOR`` times the float32 plain path's
  own error (plus a floor at float32 rounding), so a kernel may round differently but never lose digits the
  plain path keeps. (Before #35 the EM kernel's gradients were off by up to 1e9 times the plain path's error,
  and the float32 Heinsen moments path by 1e6 times.)
"""

from __future__ import annotations

import pytest
import torch

from capsule_lib.routing._kernels import inverted as inverted_kernel
from capsule_lib.routing._kernels.self_attention import _FusedSelfAttention
from capsule_lib.routing.dynamic import _CapsuleVotes, dynamic_routing
from capsule_lib.routing.em import em_routing
from capsule_lib.routing.heinsen_2019 import generative_matrix_routing
from capsule_lib.routing.inverted import _attend_matrix_unfused
from capsule_lib.routing.self_attention import self_attention_routing, self_attention_votes

F64 = torch.float64
FACTOR = 10.0  # float32: kernel error <= FACTOR x plain error + FLOOR
FLOOR = 1e-5
SCALES = {
    "mixed": (0.0, 1e-8, 1e4, 1e6),  # one input's capsules at these scales
    "wide": (0.0, 1.0, 1e3),
    "spike": (1.0,) * 7 + (1e5,),  # mostly unit capsules, now and then one 1e5 times larger
}
SEEDS = range(4)


def _scaled(shape: tuple[int, ...], values: tuple[float, ...], g: torch.Generator, caps_dims: int) -> torch.Tensor:
    """Normal entries, each capsule (the last ``caps_dims`` axes) multiplied by one of ``values``."""
    v = torch.tensor(values, dtype=F64)
    pick = torch.randint(len(v), shape[: len(shape) - caps_dims] + (1,) * caps_dims, generator=g)
    return v[pick] * torch.randn(shape, generator=g, dtype=F64)


def _run(fn, leaves: list[torch.Tensor], weights: list[torch.Tensor], dtype: torch.dtype):
    """Outputs of ``fn`` on ``leaves`` cast to ``dtype`` and the gradients of a fixed random projection of them."""
    xs = [x.detach().to(dtype).requires_grad_() for x in leaves]
    outs = fn(xs)
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights))
    grads = torch.autograd.grad(loss, xs)
    return [o.detach().to(F64) for o in outs] + [g.to(F64) for g in grads]


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


def _check(kernel, plain, leaves, weights) -> None:
    ref = _run(plain, leaves, weights, F64)
    for x, r in zip(_run(kernel, leaves, weights, F64), ref):
        assert _err(x, r) < 1e-9, "float64: kernel != plain path"
    k32 = _run(kernel, leaves, weights, torch.float32)
    p32 = _run(plain, leaves, weights, torch.float32)
    for n, (k, p, r) in enumerate(zip(k32, p32, ref)):
        assert _err(k, r) <= FACTOR * _err(p, r) + FLOOR, (n, _err(k, r), _err(p, r))


def _normal(g: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=F64) * std


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_em_routing_kernel(scales, seed):
    """``_EMRoutingFunction`` (no trace) against the plain autograd path (``return_routing=True``), votes made from
    poses at mixed scales as EMRouting makes them (each child's votes share its pose's scale)."""
    g = torch.Generator().manual_seed(seed)
    I, J = 8, 4
    poses = _scaled((2, I, 4, 4), SCALES[scales], g, 2)  # [B, I, P, P]
    weight = _normal(g, I, J, 4, 4, std=0.5)
    a_in, bu, ba = torch.rand(2, I, generator=g, dtype=F64), _normal(g, J, std=0.1), _normal(g, J, std=0.1)
    votes = torch.einsum("bipq,ijqr->bijpr", poses, weight).reshape(2, I, J, 16)

    def run(trace):
        def fn(xs):
            out = em_routing(*xs, iterations=3, return_routing=trace)
            return out[0] if trace else out

        return fn

    _check(run(False), run(True), [votes, a_in, bu, ba], [_normal(g, 2, J, 16), _normal(g, 2, J)])


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_dynamic_routing_kernel(scales, seed):
    """``_FusedRouting`` (gradients, no trace) against the plain loop (``return_routing=True``)."""
    g = torch.Generator().manual_seed(seed)
    votes, bias = _scaled((2, 12, 4, 8), SCALES[scales], g, 2), _normal(g, 4, 8, std=0.1)
    _check(
        lambda xs: (dynamic_routing(xs[0], 3, xs[1]),),
        lambda xs: (dynamic_routing(xs[0], 3, xs[1], return_routing=True)[0],),
        [votes, bias],
        [_normal(g, 2, 4, 8)],
    )


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_capsule_votes_kernel(scales, seed):
    """``_CapsuleVotes`` (parent-major, blocked) against the einsum."""
    g = torch.Generator().manual_seed(seed)
    u, W = _scaled((2, 12, 8), SCALES[scales], g, 1), _normal(g, 12, 4, 8, 16)
    _check(
        lambda xs: (_CapsuleVotes.apply(*xs),),
        lambda xs: (torch.einsum("bid,ijde->bije", *xs),),
        [u, W],
        [_normal(g, 2, 12, 4, 16)],
    )


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_self_attention_kernel(scales, seed):
    """``_FusedSelfAttention`` against votes + :func:`self_attention_routing`."""
    g = torch.Generator().manual_seed(seed)
    I, J = 12, 4
    u, W, prior = _scaled((2, I, 8), SCALES[scales], g, 1), _normal(g, J, I, 8, 16, std=0.1), _normal(g, J, I, 1)

    def plain(xs):
        return (self_attention_routing(self_attention_votes(xs[0], xs[1]), xs[2].squeeze(-1).t()),)

    _check(lambda xs: (_FusedSelfAttention.apply(*xs, 1e-20),), plain, [u, W, prior], [_normal(g, 2, J, 16)])


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_inverted_attention_kernel(scales, seed):
    """``_AttendMatrix`` (blocked over positions and children; blocks that do not divide) against the unfused
    update on whole votes."""
    g = torch.Generator().manual_seed(seed)
    I, p, s, M = 20, 6, 4, 5
    P, W, Q = _scaled((I, p, s, s), SCALES[scales], g, 2), _normal(g, I, s, s, M), _normal(g, p, M, s * s)
    weights = [_normal(g, p, s * s, M), _normal(g, I, p, M), _normal(g, I, p, M)]
    _check(
        lambda xs: inverted_kernel._AttendMatrix.apply(*xs, 4, 7),
        lambda xs: _attend_matrix_unfused(*xs),
        [P, W, Q],
        weights,
    )


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_heinsen_moments_path(scales, seed):
    """Heinsen 2019 with shared weights: the moments path (no votes) against the votes path."""
    g = torch.Generator().manual_seed(seed)
    I, J, C, D, E = 30, 5, 4, 4, 4
    leaves = [
        _normal(g, 2, I),  # a_inp (logits)
        _scaled((2, I, C, D), SCALES[scales], g, 2),  # mu_inp
        _normal(g, 1, J, D, E, std=0.5),  # W, shared by the inputs
        _normal(g, 1, J, C, E, std=0.5),  # B
        _normal(g, 1, J),  # beta_use
        _normal(g, 1, J),  # beta_ign
    ]
    _check(
        lambda xs: generative_matrix_routing(*xs, method="moments"),
        lambda xs: generative_matrix_routing(*xs, method="votes"),
        leaves,
        [_normal(g, 2, J), _normal(g, 2, J, C, E), _normal(g, 2, J, C, E)],
    )
