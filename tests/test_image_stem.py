"""Networks that follow the image size without changing what they are (issue #63): the image stem
(capsule_lib.layers.stem), ``stem_side`` in every image model's config, recipes fitted to the reader's images,
``network_facts``, the reconstruction target, and the training memory estimated and checked before a run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from capsule_lib.cost import check_training_memory, estimate_training_memory, peak_memory
from capsule_lib.data.images import ImageFacts
from capsule_lib.layers import ImageStem, resize_images
from capsule_lib.losses import CapsuleObjective, reconstruction_target
from capsule_lib.models import CapsNet, CapsNetConfig
from capsule_lib.models.registry import build_model, network_facts, smallest_image_size
from capsule_lib.routing.kinds import ROUTING_KINDS
from capsule_lib.train import make_recipe, train
from capsule_lib.train.recipes.base import NEAR_SIDE

pytestmark = pytest.mark.usefixtures("one_thread")

SIDES = (28, 32, 40, 64, 96, 128, 224, 256)
#: every family that takes --images: (recipe, model-config overrides)
FAMILIES = {
    "capsnet": ("capsnet", {}),
    "efficient": ("efficient", {}),
    **{f"compare_{k}": ("routing_compare_mnist", {"routing": k}) for k in sorted(ROUTING_KINDS)},
    "tsai_cpu": ("tsai_cifar10_cpu", {}),
    "tsai": ("tsai_cifar10", {}),
    "baseline_cnn": ("baseline_cnn", {}),
    "baseline_backbone": ("baseline_backbone_cifar10_cpu", {}),
}


def _config(family: str, channels: int, classes: int, side: int | None = None):
    """The family's paper network with ``channels`` and ``classes`` (its own side), or, with ``side``, the network
    for images of that side: the paper's behind a stem (``stem_side`` = the paper's side)."""
    recipe, overrides = FAMILIES[family]
    r = make_recipe(recipe)
    norm = {"input_mean": None, "input_std": None} if hasattr(r.model, "input_mean") else {}
    cfg = replace(r.model, in_channels=channels, n_classes=classes, **norm, **overrides)
    own = cfg.image_size
    if side is not None and side != own:
        cfg = replace(cfg, image_size=side, stem_side=own)
    return r.model_kind, cfg


def _primary(kind: str, cfg) -> int:
    """The primary capsules a config's network has, from the config (0 for the CNNs)."""
    if kind in ("baseline_cnn", "backbone_classifier"):
        return 0
    if hasattr(cfg, "n_primary"):
        return cfg.n_primary
    if hasattr(cfg, "backbone_grid") and hasattr(cfg, "primary_types"):
        return cfg.primary_types * cfg.backbone_grid**2
    return 0


def _parameters(kind: str, cfg) -> int:
    with torch.device("meta"):  # no memory, no initialisation
        return sum(p.numel() for p in build_model(kind, cfg).parameters())


# ------------------------------------------------------------------------------------------------ the stem itself
def test_the_stem_halves_with_convolutions_then_lands_on_its_side_without_parameters():
    cases = {  # image side -> (stride-2 convolutions, output channels)
        28: (0, 3),  # the identity
        20: (0, 3),  # bilinear upsampling
        40: (0, 3),  # an area resize: 40 < 2 * 28
        56: (1, 32),
        64: (1, 32),
        224: (3, 32),
        256: (3, 32),
    }
    for side, (convs, channels) in cases.items():
        stem = ImageStem(3, side, 28)
        x = torch.rand(2, 3, side, side)
        y = stem(x)
        assert y.shape == (2, channels, 28, 28) and stem.halvings == convs, side
        assert (sum(p.numel() for p in stem.parameters()) == 0) == (convs == 0), side
    identity = ImageStem(3, 28, 28)
    x = torch.rand(2, 3, 28, 28)
    assert identity(x) is x and not identity.resizes and identity.describe() is None
    assert ImageStem(3, 64, None)(torch.rand(1, 3, 64, 64)).shape == (1, 3, 64, 64)  # no stem
    assert ImageStem(3, 224, 28).describe() == "224 px -> 3 stride-2 convs (32 channels) -> 28 px"
    assert ImageStem(1, 40, 28).describe() == "40 px -> area resize -> 28 px"


def test_resize_images_averages_down_interpolates_up_and_keeps_its_own_side():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    assert torch.equal(resize_images(x, 2), torch.tensor([[[[2.5, 4.5], [10.5, 12.5]]]]))  # area: means of 2x2
    assert resize_images(x, 4) is x
    up = resize_images(torch.ones(1, 2, 3, 3), 7)
    assert up.shape == (1, 2, 7, 7) and torch.allclose(up, torch.ones_like(up))
    with pytest.raises(ValueError, match="side must be >= 1"):
        resize_images(x, 0)
    with pytest.raises(ValueError, match="ImageStem: side must be >= 1"):
        ImageStem(3, 64, 0)


# --------------------------------------------------------------------------------------- every family, every size
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_size_keeps_the_papers_primary_capsules_and_about_its_size(family):
    """At every side from 28 to 256, grey and RGB, 2 and 40 classes: the primary capsules of the paper's network and
    its parameters within 2x (the paper's network with the same channels and classes)."""
    for channels in (1, 3):
        for classes in (2, 40):
            kind, paper = _config(family, channels, classes)
            n_paper, p_paper = _primary(kind, paper), _parameters(kind, paper)
            for side in SIDES:
                _, cfg = _config(family, channels, classes, side)
                n = _parameters(kind, cfg)
                assert _primary(kind, cfg) == n_paper, (family, side, channels, classes)
                assert p_paper / 2 <= n <= 2 * p_paper, (family, side, channels, classes, n, p_paper)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_size_trains_forward_and_backward_with_a_gradient_for_every_parameter(family):
    """One forward and backward at batch 2 per side (channels and classes taking turns): finite outputs, a finite
    gradient for every parameter, and the primary capsules counted by ``network_facts`` on a forward pass."""
    torch.manual_seed(0)
    for k, side in enumerate(SIDES):
        channels, classes = (1, 3)[k % 2], (2, 40)[(k // 2) % 2]
        kind, cfg = _config(family, channels, classes, side)
        model = build_model(kind, cfg).train()
        x = torch.rand(2, channels, side, side)
        out = model(x)
        scores = out if isinstance(out, torch.Tensor) else out.scores
        assert scores.shape == (2, classes) and torch.isfinite(scores).all(), (family, side)
        loss = scores.float().square().mean()
        if getattr(out, "reconstruction", None) is not None:
            target = reconstruction_target(out, x)
            assert target.shape == out.reconstruction.shape == (2, channels, 28, 28), (family, side)
            loss = loss + (out.reconstruction - target).square().mean()
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
        assert not missing, (family, side, missing[:5])
        facts = network_facts(model)
        assert facts["primary_capsules"] == _primary(kind, cfg) and facts["parameters"] == _parameters(kind, cfg)
        assert (facts["stem"] is None) == (side == (cfg.stem_side or cfg.image_size)), (family, side)


def test_without_a_stem_the_networks_are_the_papers_and_their_checkpoints_load():
    """``stem_side=None`` (the default) and ``stem_side == image_size`` build the network as before: the same
    state_dict keys (no ``image_stem``) and the papers' parameter counts; a shipped checkpoint loads into it."""
    from capsule_lib.pretrained import load_pretrained

    papers = {"capsnet": 8_215_728, "tsai": 1_828_817, "baseline_cnn": 4_681_618}
    for family, count in papers.items():
        kind, cfg = _config(family, 3 if family == "tsai" else 1, 10)
        with torch.device("meta"):
            plain, same = build_model(kind, cfg), build_model(kind, replace(cfg, stem_side=cfg.image_size))
        assert plain.state_dict().keys() == same.state_dict().keys()
        assert not any("image_stem" in k for k in plain.state_dict())
        assert sum(p.numel() for p in plain.parameters()) == count, family
    model, entry = load_pretrained("capsnet_mnist")
    assert model.config.stem_side is None and not model.image_stem.resizes


def test_the_reconstruction_is_of_the_image_as_the_stem_resizes_it():
    model = CapsNet(CapsNetConfig(in_channels=3, image_size=64, stem_side=28, conv_channels=16, primary_types=4))
    x, y = torch.rand(2, 3, 64, 64), torch.tensor([0, 3])
    out = model(x, y)
    assert out.reconstruction.shape == (2, 3, 28, 28)
    assert torch.equal(out.extra["reconstruction_target"], resize_images(x, 28))
    step = CapsuleObjective()(model, (x, y), True)
    want = (out.reconstruction - resize_images(x, 28)).detach().square().sum() / 2
    assert step.parts["recon"] == pytest.approx(float(want), rel=1e-4)
    plain = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4))
    out = plain(torch.rand(2, 1, 28, 28))
    assert "reconstruction_target" not in out.extra  # no stem: compared with x itself, as before


# ------------------------------------------------------------------------------------ recipes fitted to the images
def _facts(side: int, channels: int = 3, classes: int = 4) -> ImageFacts:
    return ImageFacts("pics", [str(k) for k in range(classes)], channels, side, [0.5] * channels, [0.25] * channels)


@pytest.mark.parametrize(
    "recipe,own",
    [
        ("capsnet", 28),
        ("efficient", 28),
        ("routing_compare_mnist", 28),
        ("tsai_cifar10_cpu", 32),
        ("tsai_cifar10", 32),
        ("baseline_cnn", 28),
        ("baseline_backbone_cifar10_cpu", 32),
    ],
)
def test_fit_to_images_puts_the_papers_network_behind_a_stem(recipe, own):
    for side in (12, 64, 224):
        r = make_recipe(recipe)
        r.fit_to_images(_facts(side))
        assert (r.model.image_size, r.model.stem_side, r.model.in_channels, r.model.n_classes) == (side, own, 3, 4)
        assert smallest_image_size(r.model_kind, r.model) == 1  # any side: the stem resizes it
    r = make_recipe(recipe)
    r.fit_to_images(_facts(own))
    assert r.model.stem_side is None and r.model.image_size == own  # the paper's side: the paper's network


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fitted_to_images_of_every_size_each_family_stays_within_twice_its_paper_network(family):
    """The networks ``fit_to_images`` builds (what ``--images`` trains) at every side from 28 to 256 px, grey and RGB,
    2 and 40 classes: primary capsules and parameters within 2x of the paper's network with the same channels and
    classes; beyond NEAR_SIDE of its own side a network reads the images behind its stem."""
    recipe, overrides = FAMILIES[family]
    for channels in (1, 3):
        for classes in (2, 40):
            kind, paper = _config(family, channels, classes)
            n_paper, p_paper = _primary(kind, paper), _parameters(kind, paper)
            for side in SIDES:
                r = make_recipe(recipe, **{f"model.{k}": v for k, v in overrides.items()})
                r.fit_to_images(_facts(side, channels, classes))
                n, p = _primary(kind, r.model), _parameters(kind, r.model)
                assert n_paper / 2 <= n <= 2 * n_paper and p_paper / 2 <= p <= 2 * p_paper, (family, side, n, p)
                if not paper.image_size / NEAR_SIDE <= side <= paper.image_size * NEAR_SIDE:
                    assert r.model.stem_side == paper.image_size, (family, side)  # far from its side: the stem


def test_a_stem_side_too_small_for_the_network_is_refused_in_one_line():
    r = make_recipe("capsnet", **{"model.stem_side": 12})
    with pytest.raises(ValueError) as e:
        r.fit_to_images(_facts(64))
    assert "stem_side 12 is too small for capsnet, whose convolutions need at least 17 x 17" in str(e.value)
    assert "\n" not in str(e.value)
    r = make_recipe("capsnet", **{"model.stem_side": 20})
    r.fit_to_images(_facts(64))
    assert r.model.stem_side == 20 and r.model.image_size == 64  # the reader's own stem side is kept
    with pytest.raises(ValueError, match="stem_side 12 is too small for the conv stack"):
        CapsNet(image_size=64, stem_side=12)


# ---------------------------------------------------------------------------------------------- training memory
def test_the_memory_estimate_is_near_a_measured_training_step():
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(in_channels=3, image_size=64, stem_side=28, conv_channels=32, primary_types=8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    B = 8
    est = estimate_training_memory(model, B)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # BatchNorm statistics untouched
    x, y = torch.rand(B, 3, 64, 64), torch.randint(0, 10, (B,))
    opt, objective = torch.optim.Adam(model.parameters()), CapsuleObjective()

    def step() -> None:
        out = objective(model, (x, y), True)
        opt.zero_grad()
        out.loss.backward()
        opt.step()

    step()  # Adam's state exists before the measured step: counted below with the weights
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    measured = peak_memory(step) + 3 * weights  # the step's peak above the weights and Adam's two moments
    assert 0.5 < est["bytes"] / measured < 2, (est, measured)
    assert est["bytes"] == est["fixed"] + est["base"] + B * est["per_image"] and est["per_image"] > 0


def test_a_run_that_will_not_fit_is_refused_with_the_batch_that_would(tmp_path, monkeypatch):
    model = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4, decoder_hidden=(32, 64)))
    est = estimate_training_memory(model, 1)
    room = est["fixed"] + est["base"] + 5 * est["per_image"] + 1
    with pytest.raises(ValueError) as e:
        check_training_memory(model, 128, available=room)
    text = str(e.value)
    assert "\n" not in text and "at batch 128 needs about" in text and "batch_size 5 fits" in text, text
    assert check_training_memory(model, 5, available=room)["bytes"] <= room
    with pytest.raises(ValueError, match="not even one image fits: train on images of about"):
        check_training_memory(model, 128, available=est["fixed"] + est["base"] + est["per_image"] // 2)
    monkeypatch.setattr("capsule_lib.cost.available_memory", lambda device: room)
    tiny = {"model.conv_channels": 16, "model.primary_types": 4, "model.decoder_hidden": [32, 64]}
    with pytest.raises(ValueError, match="batch_size 5 fits"):  # before any data is read or anything written
        train(
            "capsnet",
            data_root=str(tmp_path),
            offline=True,
            device="cpu",
            progress=False,
            out_dir=tmp_path / "run",
            **tiny,
        )
    assert not (tmp_path / "run").exists() and not (tmp_path / "mnist").exists()


def test_a_shipped_checkpoint_starts_a_run_of_a_config_with_the_later_stem_side_field(tmp_path):
    """``stem_side`` was added after the checkpoints were exported: their recorded configs lack it (= None)."""
    from capsule_lib.train.run import start_checkpoint

    state, record = start_checkpoint(make_recipe("baseline_cnn"), "baseline_cnn_mnist")
    assert record["checkpoint"] == "baseline_cnn_mnist" and state
    with pytest.raises(ValueError, match="that checkpoint's model configuration differs"):
        start_checkpoint(make_recipe("baseline_cnn", **{"model.stem_side": 20}), "baseline_cnn_mnist")
