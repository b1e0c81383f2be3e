"""``iterations`` is a call argument of every routing model: ``model(x, iterations=T)`` routes ``T`` times for that
call only, equal to the same weights built with ``T`` iterations, without writing into any module."""

from __future__ import annotations

import pytest
import torch

from capsule_lib._checks import check_iterations
from capsule_lib.models import CapsNet, CapsNetConfig, EMCapsNet, EMCapsNetConfig, SmallNORBClassifier, SmallNORBConfig

MODELS = {
    "capsnet": (
        lambda T: CapsNet(
            CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(16, 32)), iterations=T
        ),
        (1, 28, 28),
    ),
    "em_capsnet": (
        lambda T: EMCapsNet(
            EMCapsNetConfig(conv_channels=8, primary_types=4, caps1_types=4, caps2_types=4), iterations=T
        ),
        (1, 32, 32),
    ),
    "heinsen_smallnorb": (
        lambda T: SmallNORBClassifier(SmallNORBConfig(n_parts=4, d_chns=8, image_size=48, iterations=T)),
        (2, 48, 48),
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_routes_the_iterations_it_is_called_with(name, monkeypatch):
    build, shape = MODELS[name]
    torch.manual_seed(0)
    model, reference = build(3).eval(), build(2).eval()
    reference.load_state_dict(model.state_dict())
    x = torch.rand(2, *shape)

    def refuse(self, key, value):
        raise AssertionError(f"{type(self).__name__}.{key} set during a forward with iterations=2")

    with torch.no_grad():
        expected, default = reference(x).scores, model(x).scores
        for module in model.modules():
            monkeypatch.setattr(type(module), "__setattr__", refuse)
        got = model(x, iterations=2).scores
        monkeypatch.undo()
        again = model(x).scores
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(again, default)  # nothing stuck


@pytest.mark.parametrize("bad,message", [(0, "must be >= 1, got 0"), (2.5, "must be an integer >= 1, got 2.5")])
def test_one_check_for_every_count_of_iterations(bad, message):
    with pytest.raises(ValueError, match=message):
        check_iterations(bad)
    model = MODELS["capsnet"][0](3)
    with pytest.raises(ValueError, match=message):
        model(torch.rand(1, 1, 28, 28), iterations=bad)
