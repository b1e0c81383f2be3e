"""capsule_lib.attacks: FGSM equals its closed form on a linear model, BIM with one step equals FGSM, every
perturbation stays within its budget and the pixel range, and attacking a capsule network gives finite gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capsule_lib.attacks import attack_loss, bim, fgsm
from capsule_lib.models import CapsNet, CapsNetConfig

pytestmark = pytest.mark.usefixtures("one_thread")


class Linear(torch.nn.Module):
    """scores = W vec(x) + b: the model whose FGSM step has a closed form."""

    def __init__(self, d: int = 16, k: int = 3):
        super().__init__()
        self.fc = torch.nn.Linear(d, k)

    def forward(self, x):
        return self.fc(x.flatten(1))


def _data(n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_fgsm_on_a_linear_model_is_the_closed_form():
    model, (x, y) = Linear().eval(), _data()
    eps = 0.1
    with torch.no_grad():
        p = F.softmax(model(x), dim=1)
        grad = (p - F.one_hot(y, 3).float()) @ model.fc.weight  # d CE / d vec(x) = W^T (softmax - onehot)
    want = (x + eps * grad.sign().view_as(x)).clamp(0, 1)
    assert torch.allclose(fgsm(model, x, y, eps), want)
    target = (y + 1) % 3  # targeted: down the target's loss
    with torch.no_grad():
        g_t = (p - F.one_hot(target, 3).float()) @ model.fc.weight
    assert torch.allclose(fgsm(model, x, target, eps, targeted=True), (x - eps * g_t.sign().view_as(x)).clamp(0, 1))


def test_bim_with_one_step_of_the_whole_budget_is_fgsm():
    model, (x, y) = Linear().eval(), _data()
    assert torch.equal(bim(model, x, y, 0.05, steps=1, alpha=0.05), fgsm(model, x, y, 0.05))


@pytest.mark.parametrize("kwargs", [{}, {"random_start": True, "restarts": 3}, {"targeted": True, "steps": 4}])
def test_perturbations_stay_within_the_budget_and_the_pixel_range(kwargs):
    model, (x, y) = Linear().eval(), _data(32)
    for eps in (0.0, 0.03, 0.3):
        for x_adv in (
            fgsm(model, x, y, eps),
            bim(model, x, y, eps, generator=torch.Generator().manual_seed(1), **kwargs),
        ):
            assert (x_adv - x).abs().max() <= eps + 1e-6
            assert x_adv.min() >= 0 and x_adv.max() <= 1


def test_the_attacks_raise_the_loss_and_bim_beats_fgsm_on_a_linear_model():
    torch.manual_seed(0)
    model, (x, y) = Linear().eval(), _data(64)
    with torch.no_grad():
        clean = attack_loss(model(x), y).mean()
        one = attack_loss(model(fgsm(model, x, y, 0.1)), y).mean()
        many = attack_loss(model(bim(model, x, y, 0.1, steps=10)), y).mean()
    assert clean < one <= many + 1e-6


def test_attacking_a_capsule_network_gives_finite_gradients_through_the_routing():
    cfg = CapsNetConfig(conv_channels=16, primary_types=4, class_dim=8, decoder_hidden=(16, 32))
    model = CapsNet(cfg).eval()
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    x_req = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(attack_loss(model(x_req).scores, y).sum(), x_req)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    x_adv = bim(model, x, y, 0.1, steps=2)
    assert torch.isfinite(x_adv).all() and not torch.equal(x_adv, x)


def test_bad_input_is_refused_in_one_line():
    model, (x, y) = Linear(), _data()
    with pytest.raises(ValueError, match="eval mode"):
        fgsm(model, x, y, 0.1)
    model.eval()
    with pytest.raises(ValueError, match="budget"):
        fgsm(model, x, y, 2.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fgsm(model, x * 255, y, 0.1)
    with pytest.raises(ValueError, match="steps and restarts"):
        bim(model, x, y, 0.1, steps=0)


def test_restarts_stop_once_every_image_is_fooled():
    """A later restart has nothing left to attack when an earlier one fooled every image (no empty forward pass)."""

    class Strict(Linear):  # refuses an empty batch, as the library's models do
        def forward(self, x):
            assert len(x) > 0, "empty batch"
            return super().forward(x)

    model, (x, y) = Strict().eval(), _data(16)
    x_adv = bim(model, x, y, 1.0, steps=3, restarts=3, random_start=True, early_stop=True)
    with torch.no_grad():
        assert (model(x_adv).argmax(1) != y).all()
