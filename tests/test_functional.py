import pytest
import torch

from capsule_lib.functional import (
    Length,
    SafeNorm,
    Squash,
    capsule_lengths,
    safe_norm,
    squash,
    squash_efficient,
    squash_hinton,
)

SQUASHES = [squash_hinton, squash_efficient]


@pytest.mark.parametrize("fn,max_exp", [(squash_hinton, 2.5), (squash_efficient, 0.4)])
def test_squash_norm_in_unit_interval(fn, max_exp):
    # [0, 1) exactly where float32 can tell |v| from 1 (|s| up to ~1e3 for squash_H, ~15 for squash_E) ...
    s = torch.randn(1000, 8) * torch.logspace(-4, max_exp, 1000).unsqueeze(1)
    n = fn(s).norm(dim=-1)
    assert torch.all(n >= 0) and torch.all(n < 1)
    # ... and never above 1 (nor NaN) for any magnitude
    big = torch.randn(1000, 8) * torch.logspace(-8, 30, 1000).unsqueeze(1)
    nb = fn(big).norm(dim=-1)
    assert torch.all(torch.isfinite(nb)) and torch.all(nb <= 1 + 1e-6)


@pytest.mark.parametrize("fn", SQUASHES)
def test_squash_preserves_direction(fn):
    s = torch.randn(50, 16)
    v = fn(s)
    cos = torch.nn.functional.cosine_similarity(s, v, dim=-1)
    assert torch.allclose(cos, torch.ones(50), atol=1e-5)


def test_squash_hinton_formula():
    s = torch.tensor([[3.0, 4.0]])  # |s| = 5
    expected = 25 / 26 * s / 5
    assert torch.allclose(squash_hinton(s, eps=0.0), expected, atol=1e-7)


def test_squash_efficient_formula():
    s = torch.tensor([[3.0, 4.0]])
    expected = (1 - torch.exp(torch.tensor(-5.0))) * s / 5
    assert torch.allclose(squash_efficient(s, eps=0.0), expected, atol=1e-7)


@pytest.mark.parametrize("fn", SQUASHES + [lambda x: safe_norm(x)])
def test_finite_gradient_at_zero(fn):
    s = torch.zeros(3, 8, requires_grad=True)
    fn(s).sum().backward()
    assert torch.all(torch.isfinite(s.grad))


@pytest.mark.parametrize("fn", SQUASHES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_squash_half_precision_large_inputs(fn, dtype):
    s = (torch.randn(10, 16) * 1e3).to(dtype)  # |s|^2 overflows fp16 if computed naively
    v = fn(s)
    assert v.dtype == dtype
    assert torch.all(torch.isfinite(v.float()))
    assert torch.all(v.float().norm(dim=-1) <= 1.0 + 1e-2)


def test_squash_huge_inputs_do_not_collapse():
    s = torch.full((2, 4), 1e15)
    v = squash_hinton(s)
    assert torch.allclose(v.norm(dim=-1), torch.ones(2), atol=1e-4)


def test_squash_dispatch_and_modules():
    s = torch.randn(4, 8)
    assert torch.equal(squash(s, "hinton"), squash_hinton(s))
    assert torch.equal(squash(s, "sabour"), squash_hinton(s))
    assert torch.equal(Squash("efficient")(s), squash_efficient(s))
    assert torch.equal(SafeNorm()(s), safe_norm(s))
    assert torch.equal(Length()(s), capsule_lengths(s))
    with pytest.raises(ValueError, match="unknown squash"):
        squash(s, "nope")
    with pytest.raises(ValueError):
        Squash("nope")


def test_lengths_match_norm():
    v = torch.randn(5, 10, 16)
    assert torch.allclose(capsule_lengths(v), v.norm(dim=-1), atol=1e-6)
