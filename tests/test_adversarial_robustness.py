"""capsule_lib.robustness and its figures: attack curves agree with the attacks they run, BIM curves are nested, an
early-stopped BIM fools at least the images the full run fools, the masking checks flag a model that hides its
gradient, the detector's threshold gives its false-positive rate, the EM-paper verdicts follow the noise rule, and
the figures are readable at the book's size."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from capsule_lib import robustness as rb  # noqa: E402
from capsule_lib.attacks import bim, fgsm, fgsm_sweep, reconstruction_aware_objective  # noqa: E402
from capsule_lib.models import CapsNet, CapsNetConfig  # noqa: E402
from capsule_lib.viz import robustness as vr  # noqa: E402
from capsule_lib.viz.readability import check_figure_readable  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread", "readable_figures")  # readable at the book's size (conftest.py)


class Linear(torch.nn.Module):
    def __init__(self, d: int = 16, k: int = 3, masked: bool = False):
        super().__init__()
        self.fc, self.masked = torch.nn.Linear(d, k), masked

    def forward(self, x):
        s = self.fc(x.flatten(1))
        return s.detach() + 0 * s if self.masked else s  # masked: the same scores, a zero gradient


def _data(n: int = 64, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 4, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def _model(seed: int = 0, **kw):
    torch.manual_seed(seed)
    return Linear(**kw).eval()


def test_fgsm_sweep_is_fgsm_at_every_budget():
    model, (x, y) = _model(), _data(16)
    eps = [0.0, 0.05, 0.2]
    swept = fgsm_sweep(model, x, y, eps)
    for e, x_adv in zip(eps, swept):
        assert torch.equal(x_adv, fgsm(model, x, y, e))


def test_fgsm_curve_counts_what_the_attack_does():
    model, (x, y) = _model(), _data()
    curve = rb.attack_curve(model, x, y, [0.1, 0.3], "fgsm", batch_size=10)
    assert curve.eps == (0.0, 0.1, 0.3) and curve.correct.shape == (3, 64)
    with torch.no_grad():
        want = [(model(fgsm(model, x, y, e)).argmax(1) == y).float().mean().item() for e in (0.0, 0.1, 0.3)]
    assert curve.accuracy() == pytest.approx(want)
    with pytest.raises(ValueError, match="was not measured"):
        curve.at(0.2)


def test_attack_curve_reads_uint8_images_reports_the_clean_accuracy_at_eps_0_and_refuses_other_attacks():
    model, (x, y) = _model(), _data(20)
    u8 = (x * 255).round().to(torch.uint8)
    curve = rb.attack_curve(model, u8, y, [0.3], batch_size=7)
    with torch.no_grad():
        clean = float((model(u8.float() / 255).argmax(1) == y).float().mean())
    assert curve.at(0.0) == pytest.approx(clean) and curve.at(0.3) <= curve.at(0.0)
    with pytest.raises(ValueError, match="'fgsm' or 'bim'"):
        rb.attack_curve(model, x, y, [0.1], attack="pgd")


def test_a_bim_curve_is_nested_and_never_above_one_bim_run():
    model, (x, y) = _model(), _data()
    curve = rb.attack_curve(model, x, y, [0.05, 0.1, 0.2], "bim", steps=5)
    correct = curve.correct
    assert (correct[1:] <= correct[:-1]).all()  # robust at a budget => robust at every smaller one
    with torch.no_grad():
        single = (model(bim(model, x, y, 0.1, steps=5)).argmax(1) == y).float().mean().item()
    assert curve.at(0.1) <= single + 1e-9


def test_early_stopped_bim_fools_every_image_the_full_run_fools():
    model, (x, y) = _model(), _data(128)
    with torch.no_grad():
        full = model(bim(model, x, y, 0.15, steps=8)).argmax(1) != y
        early = model(bim(model, x, y, 0.15, steps=8, early_stop=True)).argmax(1) != y
    assert full.any() and (early >= full).all()


def test_the_masking_checks_pass_an_honest_model_and_flag_a_masked_one():
    x, y = _data(48)
    results = {}
    for masked in (False, True):
        model = _model(masked=masked)
        fg = rb.attack_curve(model, x, y, [0.1], "fgsm")
        bi = rb.attack_curve(model, x, y, [0.1], "bim")
        results[masked] = rb.masking_check(model, x, y, fg, bi, eps=0.1, n=48, steps=5, large_eps=1.0)
    honest, masked = results[False], results[True]
    assert honest["iterative_not_weaker"] == 1.0 and honest["large_to_zero"] == 1.0
    assert masked["large_to_zero"] == 0.0  # a zero gradient moves no pixel: the accuracy stays where it was
    heads, rows = rb.masking_table({"honest": honest, "masked": masked}, 0.1, 1.0)
    assert rows[0][-1] == "consistent" and rows[1][-1].startswith("suspect")
    with pytest.raises(ValueError, match="cover"):
        rb.masking_check(_model(), x, y, fg, bi, n=100)


def _tiny_capsnet():
    torch.manual_seed(0)
    cfg = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(16, 32))
    return CapsNet(cfg).eval()


def test_detection_threshold_is_the_clean_quantile_and_needs_a_decoder():
    model = _tiny_capsnet()
    g = torch.Generator().manual_seed(0)
    val, test, labels = torch.rand(40, 1, 28, 28, generator=g), torch.rand(8, 1, 28, 28, generator=g), torch.arange(8)
    both = rb.detection(model, val, test, labels, 0.1, {"BIM": 0.0, "aware": 0.5}, steps=2)
    d, aware = both["BIM"], both["aware"]
    assert d.threshold == pytest.approx(float(torch.quantile(rb.reconstruction_distances(model, val), 0.95)))
    assert d.clean.shape == d.attacked.shape == d.fooled.shape == (8,)
    assert torch.isfinite(d.attacked).all() and 0 <= d.undetected_rate <= d.success_rate <= 1
    assert torch.isfinite(aware.attacked).all()
    heads, rows = rb.detection_table({"tiny": {"BIM": d, "aware": aware}})
    assert len(rows) == 2 and len(rows[0]) == len(heads)
    with pytest.raises(ValueError, match="decoder"):
        reconstruction_aware_objective(1.0)(type("Out", (), {"reconstruction": None, "scores": None})(), test, labels)


def test_targeted_success_at_zero_budget_counts_the_pairs_already_predicted_as_the_target():
    model, (x, y) = _model(), _data(30)
    rates = rb.targeted_success(model, x, y, [0.0, 0.5], n_classes=3)
    with torch.no_grad():
        pred = model(x).argmax(1)
    hits = sum(int(((pred == t) & (y != t)).sum()) for t in range(3))
    pairs = sum(int((y != t).sum()) for t in range(3))
    assert rates[0] == pytest.approx(hits / pairs) and 0 <= rates[1] <= 1


def _curve(acc: float, eps=(0.0, 0.1, 0.2), n: int = 400) -> rb.AttackCurve:
    correct = torch.zeros(len(eps), n, dtype=torch.bool)
    correct[0] = True
    correct[1:, : int(acc * n)] = True
    return rb.AttackCurve("FGSM", tuple(eps), correct)


def test_the_em_paper_verdicts_follow_the_two_standard_error_rule():
    def verdicts(em: float, cnn: float) -> list[str]:
        curves = {"EM": {"FGSM": _curve(em), "BIM": _curve(em)}, "CNN": {"FGSM": _curve(cnn), "BIM": _curve(cnn)}}
        heads, rows = rb.compare_to_em_paper(curves, {"EM": [0, 0.1, 0.1], "CNN": [0, 0.1, 0.1]}, [0, 0.1, 0.2])
        return [r[-1] for r in rows]

    clear = verdicts(0.5, 0.05)
    assert clear[0] == "holds" and clear[1] == "holds"  # EM above chance; the CNN far below it at 0.2
    assert clear[2:6] == ["holds"] * 4 and clear[6:] == ["no clear difference"] * 2
    assert verdicts(0.05, 0.5)[2:6] == ["reversed"] * 4 and verdicts(0.05, 0.5)[0] == "does not hold"
    assert verdicts(0.2, 0.2)[2:6] == ["no clear difference"] * 4


def test_the_figures_are_readable_at_the_books_size():
    curves = {name: {"FGSM": _curve(a), "BIM": _curve(a / 2)} for name, a in (("CNN", 0.8), ("EM", 0.6))}
    assert check_figure_readable(vr.plot_attack_curves(curves, title="t", chance=0.1, baseline="CNN")) == []
    model, g = _tiny_capsnet(), torch.Generator().manual_seed(1)
    val, test = torch.rand(20, 1, 28, 28, generator=g), torch.rand(6, 1, 28, 28, generator=g)
    d = rb.detection(model, val, test, torch.arange(6), 0.2, steps=2)
    assert check_figure_readable(vr.plot_detection({"tiny": d}, title="t")) == []
    frames = rb.adversarial_examples({"caps": model, "lin": _model(d=784, k=10)}, test[0], 3, [0.0, 0.1], "bim", 2)
    assert frames[0]["caps"].reconstruction is not None and frames[0]["lin"].reconstruction is None
    assert (frames[1]["lin"].image - test[0]).abs().max() <= 0.1 + 1e-6
    assert check_figure_readable(vr.plot_adversarial_frame(frames[1], 3), dpi=80) == []
    assert check_figure_readable(vr.plot_adversarial_grid(frames, [0.0, 0.1], 3, title="t")) == []


def test_the_epsilon_explorer_works_without_a_kernel():
    pytest.importorskip("ipywidgets")
    from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, adversarial_page_explorer

    model, img = _model(d=784, k=10), torch.rand(1, 28, 28)
    frames = {
        a: rb.adversarial_examples({"lin": model}, img, 2, [0.0, 0.1, 0.2], a.lower(), 2) for a in ("FGSM", "BIM")
    }
    box = adversarial_page_explorer(frames, [0.0, 0.1, 0.2], img, 2)
    assert PAGE_EXPLORER_CLASS in box._dom_classes and len(box._links) == 2 + 1 + 2
