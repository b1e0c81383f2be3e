"""The routing-free capsule layers of the critics (layers/routing_free.py): Byerly et al.'s homogeneous vector
capsules against their reference form, and Gu & Tresp's shared transforms against dynamic routing's uniform pass."""

from __future__ import annotations

import pytest
import torch

from capsule_lib.layers import HomogeneousVectorCapsules, SharedTransformCapsules
from capsule_lib.layers.routing_free import homogeneous_vector_capsules_reference
from capsule_lib.routing import DynamicRouting

B, I, J, D = 5, 12, 4, 8


def test_homogeneous_vector_capsules_equal_their_reference_in_float64_values_and_gradients():
    torch.manual_seed(0)
    layer = HomogeneousVectorCapsules(I, J, D).double().train()
    with torch.no_grad():
        layer.shift.normal_()
    u = torch.randn(B, I, D, dtype=torch.float64, requires_grad=True)
    v = layer(u)
    ref = homogeneous_vector_capsules_reference(u, layer.weight, layer.shift, layer.norm.eps)
    torch.testing.assert_close(v, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(v)
    grads = torch.autograd.grad(v, (u, layer.weight, layer.shift), g)
    ref_grads = torch.autograd.grad(ref, (u, layer.weight, layer.shift), g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert v.shape == (B, J, D) and (v >= 0).all()
    torch.testing.assert_close(layer.scores(v), v.norm(dim=-1))


def test_homogeneous_vector_capsules_never_mix_a_capsules_dimensions():
    """Element-wise weights: output dimension k reads only input dimension k (the batch norm is per dimension)."""
    torch.manual_seed(0)
    layer = HomogeneousVectorCapsules(I, J, D).double().train()
    u = torch.randn(B, I, D, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(layer(u)[..., 3].sum(), u)
    assert g[..., 3].abs().sum() > 0 and g[..., [k for k in range(D) if k != 3]].abs().max() == 0


def test_homogeneous_vector_capsules_use_running_statistics_in_eval_mode():
    torch.manual_seed(0)
    layer = HomogeneousVectorCapsules(I, J, D)
    u = torch.randn(B, I, D)
    train_out = layer.train()(u)
    eval_out = layer.eval()(u)
    assert torch.isfinite(eval_out).all() and not torch.allclose(train_out, eval_out)
    torch.testing.assert_close(layer(u[:1]), eval_out[:1])  # one image alone: no batch statistics


def test_shared_transforms_without_routing_are_dynamic_routings_uniform_pass_with_tied_weights():
    """The same weights at every position of a type, couplings 1/n_out: dynamic routing's first pass (no bias)."""
    torch.manual_seed(0)
    types, positions = 3, 4
    layer = SharedTransformCapsules(types, positions, J, D, 16).double()
    tied = DynamicRouting(types * positions, J, D, 16, bias=False).double()
    with torch.no_grad():
        tied.weight.copy_(layer.weight.repeat_interleave(positions, dim=0))  # capsule i is of type i // positions
    u = torch.randn(B, types * positions, D, dtype=torch.float64)
    torch.testing.assert_close(layer(u), tied.route(u, couplings="uniform").poses, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(u), tied.route(u, iterations=1).poses, rtol=1e-12, atol=1e-12)
    # the class capsules see each type's capsules summed over the positions: moving a capsule changes nothing
    moved = u.view(B, types, positions, D).roll(1, dims=2).reshape(B, types * positions, D)
    torch.testing.assert_close(layer(moved), layer(u), rtol=1e-12, atol=1e-12)


def test_aff_capsnets_share_one_transform_per_class_across_every_capsule():
    """Gu & Tresp's Aff-CapsNets (``shared="all"``): one matrix per class for every input capsule, couplings 1/n_out:
    dynamic routing's first pass with the weights tied across all inputs; the class capsules see only the sum of the
    input capsules, so any reordering of them, across types and positions, changes nothing."""
    torch.manual_seed(0)
    types, positions = 3, 4
    layer = SharedTransformCapsules(types, positions, J, D, 16, shared="all").double()
    assert layer.weight.shape == (1, J, D, 16) and "shared='all'" in repr(layer)
    tied = DynamicRouting(types * positions, J, D, 16, bias=False).double()
    with torch.no_grad():
        tied.weight.copy_(layer.weight.expand(types * positions, -1, -1, -1))
    u = torch.randn(B, types * positions, D, dtype=torch.float64)
    torch.testing.assert_close(layer(u), tied.route(u, couplings="uniform").poses, rtol=1e-12, atol=1e-12)
    shuffled = u[:, torch.randperm(types * positions)]
    torch.testing.assert_close(layer(shuffled), layer(u), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"shared must be one of \('type', 'all'\), got 'position'"):
        SharedTransformCapsules(types, positions, J, D, D, shared="position")


@pytest.mark.parametrize(
    "make",
    [
        lambda: HomogeneousVectorCapsules(I, J, D),
        lambda: SharedTransformCapsules(3, 4, J, D, D),
        lambda: SharedTransformCapsules(3, 4, J, D, D, shared="all"),
    ],
)
def test_routing_free_layers_give_every_parameter_a_finite_gradient(make):
    torch.manual_seed(0)
    layer = make().double().train()
    u = torch.randn(B, I, D, dtype=torch.float64, requires_grad=True)
    layer.scores(layer(u)).sum().backward()
    for name, p in [("u", u), *layer.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_routing_free_layers_refuse_bad_input_in_one_line():
    with pytest.raises(ValueError, match=r"\[B, n_inp=12, d=8\]"):
        HomogeneousVectorCapsules(I, J, D)(torch.randn(2, 11, D))
    with pytest.raises(ValueError, match=r"\[B, n_inp=12, d_inp=8\]"):
        SharedTransformCapsules(3, 4, J, D, D)(torch.randn(2, 12, 7))
    with pytest.raises(ValueError):
        HomogeneousVectorCapsules(I, J, D)(torch.randn(0, I, D))
