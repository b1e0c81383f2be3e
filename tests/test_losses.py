import pytest
import torch

from capsule_lib.losses import (
    MarginLoss,
    ReconstructionLoss,
    SoftTargetCrossEntropy,
    SpreadLoss,
    margin_loss,
    one_hot,
    reconstruction_loss,
    soft_target_cross_entropy,
    spread_loss,
    spread_margin,
)


def test_margin_loss_hand_computed():
    lengths = torch.tensor([[0.95, 0.5, 0.05], [0.2, 0.3, 0.8]])
    y = torch.tensor([0, 1])
    # sample 0: pos 0 (0.95 > 0.9); neg: 0.5*(0.4^2) + 0 = 0.08
    # sample 1: pos (0.9-0.3)^2 = 0.36; neg: 0.5*(0.1^2 + 0.7^2) = 0.25
    expected = torch.tensor([0.08, 0.61])
    assert torch.allclose(margin_loss(lengths, y, reduction="none"), expected, atol=1e-6)
    assert torch.allclose(margin_loss(lengths, y), expected.mean(), atol=1e-6)
    assert torch.allclose(MarginLoss()(lengths, y), expected.mean(), atol=1e-6)


def test_margin_loss_official_reduction_is_paper_over_2k():
    lengths = torch.rand(7, 10)
    y = torch.randint(0, 10, (7,))
    assert torch.allclose(margin_loss(lengths, y, reduction="official"), margin_loss(lengths, y) / 20, atol=1e-7)


def test_margin_loss_multi_hot_targets():
    lengths = torch.tensor([[0.9, 0.9, 0.0]])
    t = torch.tensor([[1.0, 1.0, 0.0]])
    assert margin_loss(lengths, t).item() == pytest.approx(0.0, abs=1e-7)


def test_margin_loss_bad_inputs():
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        margin_loss(torch.rand(3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        margin_loss(torch.rand(2, 3), torch.tensor([0, 1]), reduction="avg")
    with pytest.raises(ValueError):
        one_hot(torch.zeros(2, 4), 3)


def test_reconstruction_loss_sum_and_mean():
    r = torch.zeros(2, 1, 2, 2)
    t = torch.ones(2, 1, 2, 2)
    t[1] = 0.5
    assert reconstruction_loss(r, t, "sum").item() == pytest.approx((4 + 1) / 2)
    assert reconstruction_loss(r, t, "mean").item() == pytest.approx((4 + 1) / 8)
    assert ReconstructionLoss("mean")(r, t).item() == pytest.approx(5 / 8)
    with pytest.raises(ValueError):
        reconstruction_loss(torch.zeros(2, 3), torch.zeros(2, 4))


def test_spread_loss_hand_computed():
    a = torch.tensor([[0.9, 0.8, 0.1]])
    y = torch.tensor([0])
    # m=0.2: (0.2-(0.1))^2 + relu(0.2-0.8)^2 = 0.01
    assert spread_loss(a, y, 0.2).item() == pytest.approx(0.01, abs=1e-7)
    assert SpreadLoss(0.2)(a, y).item() == pytest.approx(0.01, abs=1e-7)


def test_spread_margin_schedule():
    assert spread_margin(0, 100) == pytest.approx(0.2)
    assert spread_margin(50, 100) == pytest.approx(0.55)
    assert spread_margin(1000, 100) == pytest.approx(0.9)
    sl = SpreadLoss()
    assert sl.set_margin(100, 100) == pytest.approx(0.9) and sl.margin == pytest.approx(0.9)


def test_soft_target_cross_entropy_matches_ce_on_hard_targets():
    logits = torch.randn(5, 4)
    y = torch.randint(0, 4, (5,))
    ce = torch.nn.functional.cross_entropy(logits, y)
    assert torch.allclose(soft_target_cross_entropy(logits, y), ce, atol=1e-6)
    soft = torch.nn.functional.one_hot(y, 4).float() * 0.5 + 0.125
    assert torch.allclose(
        SoftTargetCrossEntropy()(logits, soft), -(soft * logits.log_softmax(-1)).sum(-1).mean(), atol=1e-6
    )
