"""The chapters' helpers never move a caller's model: a chapter keeps its model on ``cfg.device`` (a GPU in
Colab) from the first cell to the last, so every helper must bring its inputs to the model, not the model to
its inputs. A ``model.cpu()`` hidden in a helper (or in a chapter) breaks every later call on the GPU."""

import matplotlib
import pytest
import torch

from capsule_lib._checks import module_device
from capsule_lib.evaluation import predict
from capsule_lib.models import CapsNet, CapsNetConfig, EfficientCapsNet, EfficientCapsNetConfig
from capsule_lib.viz.capsules import plot_perturbation, plot_perturbation_grid

matplotlib.use("Agg")


def _pinned(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with ``.to()``, ``.cpu()``, ``.cuda()``, ``.half()`` ... made to fail (they all go through
    ``_apply``)."""

    def refuse(*a, **k):
        raise AssertionError("a helper moved or cast the caller's model in place")

    model._apply = refuse  # type: ignore[method-assign]
    return model


@pytest.fixture(params=["capsnet", "efficient"])
def model(request):
    torch.manual_seed(0)
    if request.param == "capsnet":
        m = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4))
    else:
        m = EfficientCapsNet(EfficientCapsNetConfig.mnist())
    return _pinned(m.eval())


def test_the_guard_itself_catches_a_move(model):
    with pytest.raises(AssertionError, match="moved"):
        model.cpu()


def test_helpers_leave_the_model_where_it_is(model):
    import matplotlib.pyplot as plt

    from capsule_lib.viz.explorers import perturbation_explorer

    x = torch.rand(3, 1, 28, 28)
    res = predict(model, (x * 255).to(torch.uint8), keep_poses=True)
    poses, y = res["poses"], res["scores"].argmax(1)  # [3, 10, 16], [3]
    plt.close(plot_perturbation(model, x[0], poses[0], int(y[0]), [0.1] * 16))
    plt.close(plot_perturbation_grid(model, poses[0], int(y[0]), values=(-0.1, 0.0, 0.1), dims=[0, 1]))
    ex = perturbation_explorer(model, x, poses, y)
    ex.set_values(d0=0.2)
    plt.close("all")
    assert module_device(model) == torch.device("cpu")


def test_predict_names_a_device_mismatch_in_one_line():
    m = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4)).to("meta")
    with pytest.raises(ValueError, match=r"the model is on meta but device='cpu'; move the model first"):
        predict(m, torch.zeros(2, 1, 28, 28), device="cpu")


def test_predict_defaults_to_the_model_device():
    m = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4)).to("meta")
    with pytest.raises((NotImplementedError, RuntimeError), match="meta"):  # the batch went to "meta", no mismatch
        predict(m, torch.zeros(2, 1, 28, 28))
