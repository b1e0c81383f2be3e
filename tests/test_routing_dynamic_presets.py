"""Dynamic-routing presets reproduce the public implementations' numerics.

Each preset is checked in float64 against a loop-by-loop re-implementation written from the description of
that implementation (which axis the softmax runs over, bias, the squash as written there, what is detached):
outputs, every iteration's coupling coefficients, and the gradients with respect to the inputs, the
transformation matrices and the bias, to rtol 1e-9.
"""

import math

import pytest
import torch

from capsule_lib.functional import squash, squash_hinton, squash_hinton_eps_norm, squash_hinton_no_eps
from capsule_lib.routing.dynamic import DYNAMIC_PRESETS, DynamicRouting, dynamic_routing

F64 = torch.float64


def _squash_ref(s, kind):
    """The squash of each implementation, written as it writes it (``s``: one capsule ``[E]``)."""
    if kind == "hinton":  # ours: epsilon inside the root
        n = torch.sqrt((s * s).sum() + 1e-8)
        return n * n / (1 + n * n) * s / n
    if kind == "hinton_no_eps":  # gram-ai, acburigo, official
        n2 = (s * s).sum()
        return n2 / (1 + n2) * s / torch.sqrt(n2)
    if kind == "hinton_eps_norm":  # XifengGuo: epsilon added to the norm
        n = torch.sqrt((s * s).sum())
        return n * n / (1 + n * n) / (n + 1e-8) * s
    raise AssertionError(kind)


def loop_reference(u, W, bias, iterations, *, coupling, squash_kind, detach):
    """Votes ``u_hat[i][j] = W[i, j]^T u[i]`` and Procedure 1 with explicit loops over batch, children and
    parents; autograd flows through the Python loops. Returns outputs ``[B, J, E]`` and per-iteration
    coefficients ``[T][B, I, J]``."""
    B, I, _ = u.shape
    J = W.shape[1]
    outs, coeffs = [], [[] for _ in range(iterations)]
    for b in range(B):
        u_hat = [[W[i, j].T @ u[b, i] for j in range(J)] for i in range(I)]
        logits = [[torch.zeros((), dtype=F64) for _ in range(J)] for _ in range(I)]
        for t in range(iterations):
            last = t == iterations - 1
            uh = [[x.detach() if detach == "non_final" and not last else x for x in row] for row in u_hat]
            c = [[None] * J for _ in range(I)]
            if coupling == "parents":  # softmax over j for each child i
                for i in range(I):
                    z = sum(torch.exp(logits[i][k]) for k in range(J))
                    for j in range(J):
                        c[i][j] = torch.exp(logits[i][j]) / z
            else:  # gram-ai: over the children i for each parent j
                for j in range(J):
                    z = sum(torch.exp(logits[k][j]) for k in range(I))
                    for i in range(I):
                        c[i][j] = torch.exp(logits[i][j]) / z
            coeffs[t].append(torch.stack([torch.stack(row) for row in c]))
            v = []
            for j in range(J):
                s = sum(c[i][j] * uh[i][j] for i in range(I))
                if bias is not None:
                    s = s + bias[j]
                v.append(_squash_ref(s, squash_kind))
            if not last:
                for i in range(I):
                    for j in range(J):
                        logits[i][j] = logits[i][j] + (uh[i][j] * v[j]).sum()
        outs.append(torch.stack(v))
    return torch.stack(outs), [torch.stack(ct) for ct in coeffs]


@pytest.mark.parametrize("name", sorted(DYNAMIC_PRESETS))
@pytest.mark.parametrize("iterations", [1, 3])
def test_preset_matches_its_loop_reimplementation_in_float64(name, iterations):
    torch.manual_seed(0)
    B, I, J, D, E = 2, 6, 3, 4, 5
    layer = DynamicRouting.preset(name, I, J, D, E, iterations).double()
    with torch.no_grad():  # weights large enough that the routing moves the couplings away from uniform
        layer.weight.normal_(0.0, 0.5)
        if layer.bias is not None:
            layer.bias.normal_(0.0, 0.1)
    preset = DYNAMIC_PRESETS[name]
    u = torch.randn(B, I, D, dtype=F64, requires_grad=True)
    g = torch.randn(B, J, E, dtype=F64)  # a fixed random direction for the backward pass

    v, trace = layer(u, return_routing=True)
    grads = torch.autograd.grad((v * g).sum(), [u, *layer.parameters()])

    W = layer.weight.detach().clone().requires_grad_(True)
    bias = layer.bias.detach().clone().requires_grad_(True) if layer.bias is not None else None
    u_ref = u.detach().clone().requires_grad_(True)
    v_ref, c_ref = loop_reference(
        u_ref, W, bias, iterations, coupling=preset["coupling"], squash_kind=preset["squash_kind"],
        detach=preset["detach"],
    )  # fmt: skip
    grads_ref = torch.autograd.grad((v_ref * g).sum(), [u_ref, W, *([bias] if bias is not None else [])])

    torch.testing.assert_close(v, v_ref, rtol=1e-9, atol=1e-12)
    assert len(trace.coefficients) == iterations
    for t in range(iterations):
        torch.testing.assert_close(trace.coefficients[t], c_ref[t], rtol=1e-9, atol=1e-12, msg=f"iteration {t + 1}")
    for what, a, b in zip(["u", "W", "bias"], grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=f"gradient w.r.t. {what}")
    # without a trace, training takes the fused backward (one product for the votes' gradient): same numbers
    v_fused = layer(u)
    assert v_fused.grad_fn is not None and "_FusedRouting" in type(v_fused.grad_fn).__name__
    grads_fused = torch.autograd.grad((v_fused * g).sum(), [u, *layer.parameters()])
    torch.testing.assert_close(v_fused, v_ref, rtol=1e-9, atol=1e-12)
    for what, a, b in zip(["u", "W", "bias"], grads_fused, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=f"fused backward: gradient w.r.t. {what}")
    if iterations == 3:  # the check has teeth: routing moved the couplings away from uniform
        assert (trace.coefficients[-1] - trace.coefficients[0]).abs().max() > 1e-3


def test_presets_differ_where_their_implementations_differ():
    torch.manual_seed(1)
    votes = torch.randn(2, 6, 3, 5, dtype=F64) * 0.7
    ours = dynamic_routing(votes, 3)
    # the axis bug changes everything, detach changes nothing in the forward pass, the squashes only by ~eps
    assert not torch.allclose(dynamic_routing(votes, 3, coupling="children"), ours, atol=1e-3)
    torch.testing.assert_close(dynamic_routing(votes, 3, detach="non_final"), ours, rtol=1e-12, atol=0)
    torch.testing.assert_close(dynamic_routing(votes, 3, squash_kind="hinton_no_eps"), ours, rtol=1e-6, atol=0)

    # ...but detach does change the gradient: only the last iteration's weighted sum reaches the votes
    def grad(**kw):
        x = votes.clone().requires_grad_(True)
        (dynamic_routing(x, 3, **kw) ** 2).sum().backward()
        return x.grad

    assert not torch.allclose(grad(detach="non_final"), grad(), rtol=1e-3)


def test_squash_variants_as_written_by_the_originals():
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=F64)
    # |s| = 5: 25/26 * s/5 for every variant but the epsilon's own size
    want = 25 / 26 * s[0] / 5
    torch.testing.assert_close(squash_hinton_no_eps(s)[0], want, rtol=1e-15, atol=0)
    torch.testing.assert_close(squash_hinton_eps_norm(s)[0], 25 / 26 / (5 + 1e-8) * s[0], rtol=1e-15, atol=0)
    torch.testing.assert_close(squash_hinton(s)[0], want, rtol=1e-9, atol=0)
    # at s = 0: ours and XifengGuo's are 0 with a finite gradient; the epsilon-free one is NaN
    assert torch.equal(squash(s, "hinton")[1], torch.zeros(2, dtype=F64))
    assert torch.isnan(squash(s, "hinton_no_eps")[1]).all()
    assert torch.equal(squash(s, "hinton_eps_norm")[1], torch.zeros(2, dtype=F64))
    for kind in ("hinton", "hinton_eps_norm"):
        z = torch.zeros(1, 2, dtype=F64, requires_grad=True)
        squash(z, kind).sum().backward()
        assert torch.isfinite(z.grad).all(), kind
    # near 0, XifengGuo's epsilon outside the root gives a slope |s| / (|s| + eps): not the formula's |s|
    tiny = torch.tensor([1e-8, 0.0], dtype=F64)
    assert squash_hinton_eps_norm(tiny)[0].item() == pytest.approx(1e-16 / (1 + 1e-16) / 2e-8 * 1e-8, rel=1e-12)


def test_float64_logits_stay_float64_and_half_votes_route_in_float32():
    votes = torch.randn(2, 6, 3, 5, dtype=F64)
    _, trace = dynamic_routing(votes, 2, return_routing=True)
    assert trace.extra["logits"].dtype == F64 and trace.coefficients[0].dtype == F64
    _, trace = dynamic_routing(votes.bfloat16(), 2, return_routing=True)
    assert trace.extra["logits"].dtype == torch.float32


def test_preset_errors_and_init():
    with pytest.raises(ValueError, match=r"^unknown dynamic-routing preset 'sabour'; expected one of \["):
        DynamicRouting.preset("sabour", 6, 3, 4, 5)
    with pytest.raises(ValueError, match=r"^detach must be one of \('none', 'non_final'\), got 'all'"):
        DynamicRouting(6, 3, 4, 5, detach="all")
    torch.manual_seed(0)
    big = DynamicRouting.preset("acburigo", 1152, 10, 8, 16)
    assert big.bias is None and big.weight.std().item() == pytest.approx(math.sqrt(2 / (1152 * 8)), rel=0.02)
    assert DynamicRouting.preset("gram-ai", 6, 3, 4, 5).coupling == "children"
    assert DynamicRouting.preset("xifengguo", 6, 3, 4, 5, iterations=2).iterations == 2
