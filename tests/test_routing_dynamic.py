import pytest
import torch

from capsule_lib.functional import squash_hinton
from capsule_lib.routing.dynamic import DynamicRouting, capsule_votes, dynamic_routing, dynamic_routing_reference


def loop_dynamic_routing(votes, iterations, bias=None):
    """Independent re-derivation with explicit loops (float64), straight from Sabour et al. Procedure 1."""
    B, I, J, E = votes.shape
    out = torch.zeros(B, J, E, dtype=torch.float64)
    all_c = []
    for b in range(B):
        logits = [[0.0] * J for _ in range(I)]
        cs = []
        for _ in range(iterations):
            c = [[0.0] * J for _ in range(I)]
            for i in range(I):
                z = sum(torch.exp(torch.tensor(logits[i][j], dtype=torch.float64)) for j in range(J))
                for j in range(J):
                    c[i][j] = float(torch.exp(torch.tensor(logits[i][j], dtype=torch.float64)) / z)
            cs.append(torch.tensor(c, dtype=torch.float64))
            v = []
            for j in range(J):
                s = torch.zeros(E, dtype=torch.float64)
                for i in range(I):
                    s = s + c[i][j] * votes[b, i, j].double()
                if bias is not None:
                    s = s + bias[j].double()
                n2 = float((s * s).sum())
                v.append(n2 / (1 + n2) * s / (n2**0.5))
            for i in range(I):
                for j in range(J):
                    logits[i][j] += float((votes[b, i, j].double() * v[j]).sum())
            out[b] = torch.stack(v)
        all_c.append(torch.stack(cs))
    return out, torch.stack(all_c, 1)  # [B, J, E], [T, B, I, J]


@pytest.mark.parametrize("bias", [False, True])
def test_tiny_case_matches_loop_derivation(bias):
    votes = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    b = torch.randn(2, 4, dtype=torch.float64) * 0.1 if bias else None
    v, trace = dynamic_routing(votes, 3, b, return_routing=True)
    ref_v, ref_c = loop_dynamic_routing(votes, 3, b)
    assert torch.allclose(v, ref_v, atol=1e-6)
    assert torch.allclose(trace.stacked("coefficients").double(), ref_c, atol=1e-6)


def test_golden_values_fixed_case():
    """A tiny fixed case whose numbers were worked out by hand: 2 children, 2 parents, 1-D capsules."""
    votes = torch.tensor([[[[1.0], [0.0]], [[1.0], [0.0]]]])  # both children vote 1 for parent 0, 0 for parent 1
    v = dynamic_routing(votes, iterations=1)
    # c = 1/2 everywhere -> s_0 = 1, s_1 = 0 -> v_0 = 1^2/(1+1^2) = 0.5
    assert v[0, 0, 0].item() == pytest.approx(0.5, abs=1e-4)
    assert v[0, 1, 0].item() == pytest.approx(0.0, abs=1e-6)
    v2, tr = dynamic_routing(votes, iterations=2, return_routing=True)
    # logits after it. 1: b_i0 = 1*0.5, b_i1 = 0 -> c_i0 = sigmoid(0.5) = 0.6225 -> s_0 = 1.2449
    c0 = torch.sigmoid(torch.tensor(0.5)).item()
    assert tr.coefficients[1][0, 0, 0].item() == pytest.approx(c0, abs=1e-5)
    s0 = 2 * c0
    assert v2[0, 0, 0].item() == pytest.approx(s0 * s0 / (1 + s0 * s0) / s0 * s0, abs=1e-4)


@pytest.mark.parametrize("coupling,axis", [("parents", -1), ("children", 1)])
def test_coefficients_sum_to_one(coupling, axis):
    votes = torch.randn(3, 20, 5, 8)
    _, trace = dynamic_routing(votes, 4, coupling=coupling, return_routing=True)
    assert trace.iterations == 4
    for c in trace.coefficients:
        assert torch.allclose(c.sum(dim=axis), torch.ones(()), atol=1e-5)
        assert torch.all(c >= 0)


def test_leaky_routing_leaves_mass_for_orphan():
    votes = torch.randn(2, 10, 3, 4)
    _, trace = dynamic_routing(votes, 3, leaky=True, return_routing=True)
    for c in trace.coefficients:
        sums = c.sum(-1)
        assert torch.all(sums < 1) and torch.all(sums > 0)


def test_agreement_sharpens_couplings_toward_consensus():
    """Children whose votes agree end up coupled more strongly to that parent."""
    torch.manual_seed(1)
    target = torch.tensor([2.0, 0.0])
    votes = torch.randn(1, 12, 2, 2) * 0.3
    votes[0, :8, 0] = target + torch.randn(8, 2) * 0.05  # 8 agreeing votes for parent 0
    _, tr = dynamic_routing(votes, 3, return_routing=True)
    assert tr.coefficients[-1][0, :8, 0].mean() > tr.coefficients[0][0, :8, 0].mean() + 0.05


@pytest.mark.parametrize("B", [1, 3])
def test_module_shapes(B):
    layer = DynamicRouting(n_inp=12, n_out=4, d_inp=8, d_out=16, iterations=3)
    u = squash_hinton(torch.randn(B, 12, 8))
    v = layer(u)
    assert v.shape == (B, 4, 16)
    v2, trace = layer(u, return_routing=True)
    assert torch.allclose(v, v2)
    assert [c.shape for c in trace.coefficients] == [(B, 12, 4)] * 3
    assert [a.shape for a in trace.agreements] == [(B, 12, 4)] * 3
    assert [o.shape for o in trace.outputs] == [(B, 4, 16)] * 3
    assert trace.algorithm == "dynamic"


def test_every_parameter_gets_gradient():
    layer = DynamicRouting(6, 3, 4, 5)
    layer(torch.randn(2, 6, 4)).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.any(p.grad != 0), name


@pytest.mark.parametrize("scale", [0.0, 1.0, 1e3])
def test_no_nan_edge_inputs(scale):
    layer = DynamicRouting(10, 3, 8, 16)
    u = torch.randn(2, 10, 8) * scale
    u.requires_grad_(True)
    v = layer(u)
    v.sum().backward()
    assert torch.all(torch.isfinite(v)) and torch.all(torch.isfinite(u.grad))
    for p in layer.parameters():
        assert torch.all(torch.isfinite(p.grad))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_half(dtype):
    layer = DynamicRouting(10, 3, 8, 16)
    u = torch.randn(2, 10, 8) * 1e3
    with torch.autocast("cpu", dtype=dtype):
        v, trace = layer(u, return_routing=True)
    assert torch.all(torch.isfinite(v.float()))
    assert all(torch.isfinite(c).all() for c in trace.coefficients)


def test_permutation_of_inputs_with_weights_is_invariant():
    layer = DynamicRouting(7, 3, 4, 5).double()
    u = torch.randn(2, 7, 4, dtype=torch.float64)
    perm = torch.randperm(7)
    v = layer(u)
    with torch.no_grad():
        layer.weight.copy_(layer.weight[perm])
    v_perm = layer(u[:, perm])
    assert torch.allclose(v, v_perm, atol=1e-10)


def test_votes_are_w_transpose_u():
    u = torch.randn(2, 3, 4)
    W = torch.randn(3, 5, 4, 6)
    votes = capsule_votes(u, W)
    assert torch.allclose(votes[1, 2, 3], W[2, 3].T @ u[1, 2], atol=1e-5)


def test_bad_shapes_and_dtypes_raise():
    layer = DynamicRouting(6, 3, 4, 5)
    with pytest.raises(ValueError, match=r"\[B, n_inp=6, d_inp=4\]"):
        layer(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="floating"):
        layer(torch.ones(2, 6, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[B, n_inp, n_out, d_out\]"):
        dynamic_routing(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="iterations"):
        dynamic_routing(torch.randn(1, 2, 2, 2), iterations=0)
    with pytest.raises(ValueError, match="coupling"):
        DynamicRouting(6, 3, 4, 5, coupling="sideways")


def test_deterministic_under_seed():
    def run():
        torch.manual_seed(123)
        layer = DynamicRouting(6, 3, 4, 5)
        return layer(torch.randn(2, 6, 4))

    assert torch.equal(run(), run())


@pytest.mark.slow
def test_torch_compile_fullgraph_matches_eager():
    """Dynamo traces the whole routing (no graph breaks) and autograd works through it; the aot_eager
    backend keeps this fast (inductor's C++ code generation takes minutes on a small CPU)."""
    layer = DynamicRouting(12, 4, 8, 16)
    u = torch.randn(3, 12, 8)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(u)
    assert torch.allclose(out, layer(u), atol=1e-5)
    out.sum().backward()
    assert layer.weight.grad is not None


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("coupling", ["parents", "children"])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_fused_backward_equals_autograd_in_float64(leaky, coupling, iterations):
    """The fused backward (votes' gradient in one product, loop replayed on small tensors) gives the gradients
    that autograd gives on the plain loop (the trace path), for the votes and the bias."""
    torch.manual_seed(1)
    votes = (torch.randn(3, 7, 4, 5, dtype=torch.float64) * 0.8).requires_grad_(True)
    bias = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, 5, dtype=torch.float64)
    kw = dict(leaky=leaky, coupling=coupling)
    v_ref, _ = dynamic_routing(votes, iterations, bias, return_routing=True, **kw)  # plain autograd
    ref = torch.autograd.grad((v_ref * g).sum(), [votes, bias])
    v = dynamic_routing(votes, iterations, bias, **kw)
    assert "_FusedRouting" in type(v.grad_fn).__name__
    got = torch.autograd.grad((v * g).sum(), [votes, bias])
    torch.testing.assert_close(v, v_ref, rtol=1e-12, atol=1e-14)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_fused_backward_under_bf16_autocast_and_with_frozen_votes():
    torch.manual_seed(2)
    layer = DynamicRouting(12, 4, 8, 16)
    u = torch.randn(2, 12, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v = layer(u)
    v.float().sum().backward()
    assert torch.isfinite(u.grad).all() and torch.isfinite(layer.weight.grad).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v_plain, _ = layer(u, return_routing=True)
    torch.testing.assert_close(v.float(), v_plain.float())
    # votes that need no gradient (frozen W, input without grad): only the bias is trained
    votes = torch.randn(2, 12, 4, 16)
    bias = torch.zeros(4, 16, requires_grad=True)
    dynamic_routing(votes, 3, bias).sum().backward()
    assert bias.grad is not None and torch.isfinite(bias.grad).all()


@pytest.mark.parametrize("block_bytes", [None, 3 * 4 * 2 * 5 * 8])  # library default; 3 children per block
@pytest.mark.parametrize("needs", ["both", "u", "weight"])
def test_parent_major_votes_equal_the_einsum_in_float64(monkeypatch, block_bytes, needs):
    """capsule_votes' blocked function (parent-major memory) = the plain einsum: values and both gradients, for an
    upstream gradient in any layout, with blocks that do not divide the children evenly."""
    from capsule_lib.routing._kernels import dynamic as dyn_kernels

    if block_bytes is not None:
        monkeypatch.setattr(dyn_kernels, "_VOTES_BLOCK_BYTES", block_bytes)
    B, I, J, d, E = 4, 7, 2, 3, 5
    u = torch.randn(B, I, d, dtype=torch.float64, requires_grad=needs in ("both", "u"))
    W = torch.randn(I, J, d, E, dtype=torch.float64, requires_grad=needs in ("both", "weight"))
    votes = capsule_votes(u, W)
    assert votes.shape == (B, I, J, E) and votes.transpose(1, 2).is_contiguous()  # [B, J, I, E] memory
    ref = torch.einsum("bid,ijde->bije", u, W)
    torch.testing.assert_close(votes, ref, rtol=1e-12, atol=1e-12)
    for g in (
        torch.randn(B, I, J, E, dtype=torch.float64),
        torch.randn(E, J, B, I, dtype=torch.float64).permute(2, 3, 1, 0),
    ):
        leaves = [t for t in (u, W) if t.requires_grad]
        ours = torch.autograd.grad(capsule_votes(u, W), leaves, g)
        theirs = torch.autograd.grad(torch.einsum("bid,ijde->bije", u, W), leaves, g)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_parent_major_votes_are_routed_without_a_copy_and_fall_back_under_autocast():
    u, W = torch.randn(2, 6, 4), torch.randn(6, 3, 4, 5)
    votes = capsule_votes(u, W)
    vj = votes.transpose(1, 2).contiguous()
    assert vj.data_ptr() == votes.data_ptr()  # contiguous() was a no-op: the routing reads the votes in place
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = capsule_votes(u, W)
    assert half.dtype == torch.bfloat16  # the einsum under autocast, as before
    torch.testing.assert_close(half.float(), votes, rtol=2e-2, atol=2e-2)


def test_votes_with_mismatched_shapes_raise_the_einsum_error():
    with pytest.raises(RuntimeError, match="einsum"):
        capsule_votes(torch.randn(2, 3, 4), torch.randn(5, 2, 4, 6))  # 3 input capsules, weights for 5


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_the_reference_form_is_what_the_library_computes_in_float64(iterations, bias):
    """dynamic_routing_reference (the chapter's definition) = dynamic_routing on the fused path (gradients, CPU) and
    on the plain path (a trace asked for): values and the gradients of the votes and the bias; and = the loop
    re-derivation."""
    g = torch.Generator().manual_seed(0)
    votes = torch.randn(3, 11, 4, 6, dtype=torch.float64, generator=g) * 0.7
    b = torch.randn(4, 6, dtype=torch.float64, generator=g) if bias else None
    upstream = torch.randn(3, 4, 6, dtype=torch.float64, generator=g)

    def run(fn):
        x = votes.clone().requires_grad_(True)
        bb = b.clone().requires_grad_(True) if b is not None else None
        v = fn(x, bb)
        v = v[0] if isinstance(v, tuple) else v
        grads = torch.autograd.grad(v, [x] + ([bb] if bb is not None else []), upstream)
        return v.detach(), grads

    ref = run(lambda x, bb: dynamic_routing_reference(x, iterations, bb))
    for fn in (
        lambda x, bb: dynamic_routing(x, iterations, bb),
        lambda x, bb: dynamic_routing(x, iterations, bb, return_routing=True),
    ):
        got = run(fn)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=1e-12)
        for a, r in zip(got[1], ref[1]):
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
    loop, _ = loop_dynamic_routing(votes, iterations, b)
    torch.testing.assert_close(ref[0], loop, rtol=1e-6, atol=1e-8)  # the loop's squash has no epsilon
