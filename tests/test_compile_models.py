"""``torch.compile`` (inductor, CPU) of every model of the library on a tiny configuration: one compiled forward
and backward gives the eager scores and the eager gradient of every parameter (#17). The routing layers have
their own compile tests; ``RoutingClassifier`` is compiled with each routing in test_routing_classifier.py and
Efficient-CapsNet's forward in test_models_efficient.py."""

from __future__ import annotations

import pytest
import torch
from test_routing_em import _tiny_cfg as em_tiny_config  # the tiny configs those modules' tests use
from test_routing_inverted import tiny_config as tsai_tiny_config

from capsule_lib.models import BaselineCNN, BaselineCNNConfig, CapsModel, CapsNet, CapsNetConfig, EMCapsNet
from capsule_lib.models.heinsen import SmallNORBClassifier, SmallNORBConfig


def _capsnet():
    cfg = CapsNetConfig(conv_channels=8, primary_types=2, class_dim=8, decoder_hidden=(16, 32))
    return CapsNet(cfg), torch.rand(2, 1, 28, 28)


def _em():
    return EMCapsNet(em_tiny_config()), torch.rand(2, 1, 20, 20)


def _heinsen():
    cfg = SmallNORBConfig(n_parts=4, d_chns=8, image_size=None, iterations=2, strides=(1, 2, 1, 2, 1, 2))
    return SmallNORBClassifier(cfg), torch.rand(2, 2, 48, 48)


def _tsai():
    return CapsModel(tsai_tiny_config()), torch.rand(2, 3, 16, 16)


def _cnn():
    return BaselineCNN(BaselineCNNConfig(channels=(4, 4, 4), hidden=(8, 8), dropout=0.0)), torch.rand(2, 1, 28, 28)


MODELS = {"capsnet": _capsnet, "em_capsnet": _em, "heinsen_smallnorb": _heinsen, "caps_model": _tsai, "cnn": _cnn}


def _scores(out):
    return out if isinstance(out, torch.Tensor) else out.scores


def _loss(out):
    """Scores and, where the model decodes, its reconstruction: every parameter takes part."""
    loss = _scores(out).float().pow(2).sum()
    recon = getattr(out, "reconstruction", None)
    return loss + recon.float().sum() if recon is not None else loss


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_forward_and_backward_match_eager(name):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    model.eval()  # no dropout / batch-norm statistics updates: the two passes see the same function
    ref_out = model(x)
    ref = _scores(ref_out)
    _loss(ref_out).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    got_out = torch.compile(model)(x)
    out = _scores(got_out)
    _loss(got_out).backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want) == {n for n, _ in model.named_parameters()}, name
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-3, atol=1e-5, msg=f"{name}, {n}: gradients differ")
