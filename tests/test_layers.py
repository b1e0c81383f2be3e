import pytest
import torch
import torch.nn.functional as F

from capsule_lib.layers import GemmConv2d, PrimaryCapsules, bf16_gemm_conv2d


def rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("stride,k,bias", [(2, 9, True), (1, 3, False), (2, 4, True)])
def test_bf16_gemm_conv_matches_conv2d_forward_and_backward(stride, k, bias):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 13, 13, requires_grad=True)
    w = (torch.randn(7, 5, k, k) * 0.1).requires_grad_()
    b = torch.randn(7, requires_grad=True) if bias else None
    g = torch.randn_like(F.conv2d(x, w, b, stride=stride))
    ref = F.conv2d(x, w, b, stride=stride)
    ref_grads = torch.autograd.grad(ref, [x, w] + ([b] if bias else []), g)
    out = bf16_gemm_conv2d(x, w, b, stride)
    grads = torch.autograd.grad(out, [x, w] + ([b] if bias else []), g)
    assert out.shape == ref.shape
    assert rel(out, ref) < 1e-2  # bf16 operands, fp32 accumulation
    for a, r in zip(grads, ref_grads):
        assert rel(a, r) < 1e-2


def test_gemm_conv_is_a_drop_in_conv2d():
    torch.manual_seed(0)
    std = torch.nn.Conv2d(4, 6, 3, 2)
    fast = GemmConv2d(4, 6, 3, 2)
    fast.load_state_dict(std.state_dict())
    x = torch.randn(2, 4, 9, 9)
    assert rel(fast(x), std(x)) < 1e-2
    padded = GemmConv2d(4, 6, 3, padding=1)  # falls back to the library convolution
    padded.load_state_dict(torch.nn.Conv2d(4, 6, 3, padding=1).state_dict())
    assert padded(x).shape == (2, 6, 9, 9)


def test_primary_capsules_conv_options():
    a = PrimaryCapsules(8, 4, 2, 3, 2)
    b = PrimaryCapsules(8, 4, 2, 3, 2, conv="bf16_gemm")
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 8, 9, 9)
    assert rel(b(x), a(x)) < 1e-2
    with pytest.raises(ValueError, match="conv"):
        PrimaryCapsules(conv="fft")
