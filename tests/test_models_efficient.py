"""Efficient-CapsNet model (Mazzia et al. 2021), its MNIST augmentation and the training recipe."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from capsule_lib import CapsuleOutput
from capsule_lib.data.transforms import (
    content_margins,
    efficient_mnist_augment,
    erase_patches,
    random_erase,
    random_margin_shift,
    random_rotation,
    random_squish,
    rotate_images,
    shift_images,
    squish_images,
)
from capsule_lib.layers import UpsampleConvDecoder
from capsule_lib.models.efficient import EfficientCapsNet, EfficientCapsNetConfig
from capsule_lib.routing.self_attention import SelfAttentionRouting

PRESETS = ["mnist", "multimnist", "smallnorb"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (tests/conftest.py)


def _model(name="mnist", seed=0, **kw):
    torch.manual_seed(seed)
    return EfficientCapsNet(EfficientCapsNetConfig.preset(name, **kw))


def _input(cfg, B=3, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g) * scale


# ------------------------------------------------------------------------------------ architecture
@pytest.mark.parametrize("name,count", [("mnist", 161_824), ("multimnist", 154_656), ("smallnorb", 151_664)])
def test_parameter_counts_match_the_paper(name, count):
    m = _model(name)
    assert m.num_parameters() == count  # trainable, decoder excluded (the official graph's summary)
    assert m.num_parameters(include_decoder=True) > count
    no_dec = EfficientCapsNet(EfficientCapsNetConfig.preset(name, decoder=None))
    assert sum(p.numel() for p in no_dec.parameters()) == count


def test_mnist_total_with_batchnorm_statistics():
    m = _model("mnist")
    stats = sum(b.numel() for n, b in m.named_buffers() if n.endswith(("running_mean", "running_var")))
    assert m.num_parameters() + stats == 162_400


def test_decoder_parameter_counts():
    fc = _model("mnist").decoder
    assert sum(p.numel() for p in fc.parameters()) == 160 * 512 + 512 + 512 * 1024 + 1024 + 1024 * 784 + 784
    conv = _model("smallnorb").decoder
    assert isinstance(conv, UpsampleConvDecoder)
    assert sum(p.numel() for p in conv.parameters()) == (80 * 64 + 64) + (9 * 64 + 64) + (9 * 64 * 128 + 128) + (
        9 * 128 * 128 + 128
    ) + (9 * 128 * 2 + 2)


@pytest.mark.parametrize(
    "name,sizes", [("mnist", [24, 22, 20, 9]), ("multimnist", [32, 30, 14, 6]), ("smallnorb", [21, 19, 17, 8])]
)
def test_backbone_sizes_and_layer_order(name, sizes):
    m = _model(name)
    cfg = m.config
    assert cfg.feature_sizes() == sizes and cfg.primary_grid == 1 and cfg.n_primary == 16
    kinds = [type(l).__name__ for l in m.backbone]
    if name == "smallnorb":
        assert kinds == ["Conv2d", "LeakyReLU", "InstanceNorm2d"] * 4
        assert m.backbone[1].negative_slope == 0.3 and m.backbone[2].affine
    else:
        assert kinds == ["Conv2d", "ReLU", "BatchNorm2d"] * 4
    feats = m.features(_input(cfg, 2))
    assert feats.shape == (2, 128, sizes[-1], sizes[-1])
    assert m.primary_capsules(_input(cfg, 2)).shape == (2, 16, 8)
    assert isinstance(m.digits, SelfAttentionRouting)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("B", [1, 3])
def test_forward_shapes(name, B):
    m = _model(name)
    cfg = m.config
    K = cfg.n_classes
    for mode in (m.train, m.eval):
        mode()
        out = m(_input(cfg, B), return_routing=True)
        assert isinstance(out, CapsuleOutput)
        assert out.scores.shape == (B, K) and out.poses.shape == (B, K, 16)
        assert out.reconstruction.shape == (B, cfg.in_channels, cfg.image_size, cfg.image_size)
        assert ((out.scores > 0) & (out.scores < 1)).all()
        assert out.trace.coefficients[0].shape == (B, 16, K)
        assert out.trace.extra["attention"].shape == (B, K, 16, 16)
        torch.testing.assert_close(out.trace.coefficients[0].sum(-1), torch.ones(B, 16))
        torch.testing.assert_close(out.scores, out.poses.pow(2).sum(-1).add(1e-7).sqrt())
        assert ((out.reconstruction >= 0) & (out.reconstruction <= 1)).all()
        if name == "multimnist":
            assert out.extra["reconstructions"].shape == (B, 2, 1, 36, 36)
        else:
            assert "reconstructions" not in out.extra
    m.eval()
    assert m(_input(cfg, B)).trace is None


def test_masking_by_label_and_by_length():
    m = _model("mnist").eval()
    x = _input(m.config, 4)
    y = torch.tensor([3, 1, 4, 1])
    out = m(x, y)
    torch.testing.assert_close(out.reconstruction, m.decoder(out.poses * F.one_hot(y, 10)[..., None].float()))
    out0 = m(x)
    top = out0.scores.argmax(1)
    torch.testing.assert_close(out0.reconstruction, m.decoder(out0.poses * F.one_hot(top, 10)[..., None].float()))


def test_multimnist_decodes_each_of_the_top_two_capsules():
    m = _model("multimnist").eval()
    x = _input(m.config, 3)
    out = m(x)
    order = out.scores.argsort(dim=1, descending=True)[:, :2]
    for r in range(2):
        single = m.decoder(out.poses * F.one_hot(order[:, r], 10)[..., None].float())
        torch.testing.assert_close(out.extra["reconstructions"][:, r], single)
    both = m.decoder(out.poses * F.one_hot(order, 10).sum(1)[..., None].float())
    torch.testing.assert_close(out.reconstruction, both)  # the joint (k = 2) mask
    multi_hot = torch.zeros(3, 10)
    multi_hot[torch.arange(3), torch.tensor([0, 5, 9])] = 1
    multi_hot[torch.arange(3), torch.tensor([2, 6, 1])] = 1
    each = m.reconstruct_each(out.poses, multi_hot)
    for b, pair in enumerate([(0, 2), (5, 6), (1, 9)]):
        got = {int(k) for k in multi_hot[b].nonzero().flatten()}
        assert got == set(pair)
        decoded = {
            k: m.decoder(out.poses[b : b + 1] * F.one_hot(torch.tensor([k]), 10)[..., None].float()) for k in pair
        }
        for r in range(2):
            assert any(torch.allclose(each[b, r], decoded[k][0]) for k in pair)
        assert not torch.allclose(each[b, 0], each[b, 1])


# ------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("scale", [0.0, 1e3])
def test_no_nan_on_zeros_and_large_inputs(name, scale):
    m = _model(name)
    x = _input(m.config, 2, scale).requires_grad_()
    out = m(x, torch.tensor([0, 1]))
    loss = out.scores.sum() + out.reconstruction.sum()
    loss.backward()
    assert torch.isfinite(out.scores).all() and torch.isfinite(out.reconstruction).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["mnist", "smallnorb"])
def test_bf16_autocast(name):
    m = _model(name)
    x = _input(m.config, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x, torch.tensor([1, 0]), return_routing=True)
    (out.scores.float().sum() + out.reconstruction.float().mean()).backward()
    assert torch.isfinite(out.scores.float()).all() and torch.isfinite(out.reconstruction.float()).all()
    torch.testing.assert_close(out.trace.coefficients[0].sum(-1), torch.ones(2, 16))
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("name", PRESETS)
def test_every_parameter_gets_a_gradient(name):
    m = _model(name)
    y = (
        torch.tensor([0, 1, 2])
        if name != "multimnist"
        else F.one_hot(torch.tensor([[0, 1], [2, 3], [4, 5]]), 10).sum(1)
    )
    out = m(_input(m.config, 3), y)
    loss = (out.scores * torch.randn_like(out.scores)).sum() + out.reconstruction.mean()
    loss.backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_keras_initialisation():
    m = _model("mnist")
    conv = m.backbone[0]
    assert torch.equal(conv.bias, torch.zeros(32)) and torch.equal(m.primary.conv.bias, torch.zeros(128))
    std = math.sqrt(2 / 25)  # he_normal, fan_in 5*5*1
    assert conv.weight.abs().max() <= 2 * std / 0.87962566103423978 + 1e-6
    assert m.backbone[2].eps == 1e-3 and abs(m.backbone[2].momentum - 0.01) < 1e-12
    limit = math.sqrt(6 / (81 + 81 * 128))  # glorot_uniform of the (9, 9, 1, 128) depthwise kernel
    assert m.primary.conv.weight.abs().max() <= limit
    n = _model("smallnorb")
    inorm = n.backbone[2]
    assert inorm.weight.abs().max() <= 0.05 and inorm.bias.abs().max() <= 0.05 and inorm.eps == 1e-3
    t = _model("mnist", init="torch")
    assert not torch.equal(t.backbone[0].bias, torch.zeros(32))


def test_deterministic_under_a_seed_and_eval_is_deterministic():
    a, b = _model("mnist", seed=5).eval(), _model("mnist", seed=5).eval()
    x = _input(a.config, 2)
    assert torch.equal(a(x).scores, b(x).scores)
    assert torch.equal(a(x).scores, a(x).scores)


def test_bad_inputs_raise_value_error():
    m = _model("mnist")
    with pytest.raises(ValueError, match=r"\[B, 1, 28, 28\]"):
        m(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError):
        m(torch.rand(2, 3, 28, 28))
    with pytest.raises(ValueError):
        m(torch.rand(1, 28, 28))
    with pytest.raises(ValueError):
        EfficientCapsNet(EfficientCapsNetConfig(image_size=12))
    with pytest.raises(ValueError):
        EfficientCapsNetConfig.preset("cifar")
    with pytest.raises(ValueError):
        EfficientCapsNet(EfficientCapsNetConfig(norm="layer"))
    with pytest.raises(ValueError):
        EfficientCapsNet(EfficientCapsNetConfig.smallnorb(image_size=64, primary_kernel=8, decoder="conv"))


# ------------------------------------------------------------------------------------- augmentation
def _digits(B=64, seed=0):
    """Blocky 'digits' in [0, 1] with free margins of different sizes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(B, 1, 28, 28)
    for b in range(B):
        t, l = torch.randint(2, 10, (2,), generator=g).tolist()
        h, w = torch.randint(8, 16, (2,), generator=g).tolist()
        x[b, 0, t : t + h, l : l + w] = torch.rand(h, w, generator=g) * 0.8 + 0.2
    return x


AUGS = {
    "rotation": random_rotation,
    "shift": random_margin_shift,
    "squish": random_squish,
    "squish_bilinear": lambda x, g: random_squish(x, g, kernel="bilinear"),
    "erase": random_erase,
    "all": efficient_mnist_augment,
}


@pytest.mark.parametrize("name", list(AUGS))
def test_augmentations_keep_shape_range_and_are_deterministic(name):
    fn = AUGS[name]
    x = _digits()
    y1 = fn(x, torch.Generator().manual_seed(1))
    y2 = fn(x, torch.Generator().manual_seed(1))
    y3 = fn(x, torch.Generator().manual_seed(2))
    assert y1.shape == x.shape and y1.dtype == x.dtype
    assert y1.min() >= 0 and y1.max() <= 1
    assert torch.equal(y1, y2)
    assert not torch.equal(y1, y3)
    assert not torch.equal(y1, x)
    assert torch.isfinite(y1).all()


@pytest.mark.parametrize("name", list(AUGS))
def test_augmentations_reject_bad_shapes(name):
    with pytest.raises(ValueError):
        AUGS[name](torch.rand(4, 28, 28), torch.Generator().manual_seed(0))


def test_erase_zeroes_exactly_one_4x4_patch_with_corner_in_4_22():
    x = torch.ones(2000, 1, 28, 28)
    y = random_erase(x, torch.Generator().manual_seed(0))
    zeros = y[:, 0] == 0  # [B, H, W]
    assert (zeros.sum((1, 2)) == 16).all()
    rows = zeros.any(2).float()
    cols = zeros.any(1).float()
    top, left = rows.argmax(1), cols.argmax(1)
    assert (rows.sum(1) == 4).all() and (cols.sum(1) == 4).all()  # a contiguous 4x4 block
    assert top.min() == 4 and top.max() == 22 and left.min() == 4 and left.max() == 22
    expect = erase_patches(x, top, left)
    assert torch.equal(y, expect)
    assert torch.equal(y[y != 0], x[y != 0])


def test_content_margins():
    x = torch.zeros(2, 1, 28, 28)
    x[0, 0, 3:10, 5:20] = 1
    assert content_margins(x).tolist() == [[5, 8, 3, 18], [0, 0, 0, 0]]


def test_margin_shift_preserves_content_and_stays_inside_the_margins():
    x = _digits(200)
    y = random_margin_shift(x, torch.Generator().manual_seed(0))
    mx, my = content_margins(x), content_margins(y)
    dx, dy = my[:, 0] - mx[:, 0], my[:, 2] - mx[:, 2]
    assert torch.equal(y, shift_images(x, dx, dy))  # a pure shift: content preserved pixel for pixel
    torch.testing.assert_close(y.sum((1, 2, 3)), x.sum((1, 2, 3)))
    assert ((dx >= -mx[:, 0]) & (dx <= mx[:, 1]) & (dy >= -mx[:, 2]) & (dy <= mx[:, 3])).all()
    assert (dx != 0).float().mean() > 0.5 and (dx < 0).any() and (dx > 0).any() and (dy < 0).any() and (dy > 0).any()
    blank = torch.zeros(3, 1, 28, 28)
    assert torch.equal(random_margin_shift(blank, torch.Generator().manual_seed(0)), blank)


def test_rotation_by_90_degrees_is_the_opencv_permutation():
    x = torch.rand(2, 1, 28, 28)
    y = rotate_images(x, torch.tensor([90.0, 0.0]))
    # OpenCV centre (14, 14), counter-clockwise: out[r, c] = x[c, 28 - r] (row 0 falls outside -> 0)
    expect = torch.zeros(28, 28)
    for r in range(1, 28):
        for c in range(28):
            expect[r, c] = x[0, 0, c, 28 - r]
    torch.testing.assert_close(y[0, 0], expect, rtol=0, atol=1e-5)
    torch.testing.assert_close(y[1], x[1], rtol=0, atol=1e-5)


def test_random_rotation_applies_to_about_half_the_images():
    x = _digits(400)
    y = random_rotation(x, torch.Generator().manual_seed(0))
    changed = (y != x).flatten(1).any(1).float().mean().item()
    # p = 0.5, minus the ~8 % whose angle truncates to 0 degrees
    assert 0.35 < changed < 0.6
    z = random_rotation(x, torch.Generator().manual_seed(0), integer_degrees=False, p=1.0)
    assert (z != x).flatten(1).any(1).all()


@pytest.mark.parametrize("kernel", ["lanczos3", "bilinear"])
def test_squish_matches_antialiased_pil_resize(kernel):
    Image = pytest.importorskip("PIL.Image")
    import numpy as np

    x = torch.rand(3, 1, 28, 28)
    wm, off = torch.tensor([1, 4, 7]), torch.tensor([0, 3, 4])
    y = squish_images(x, wm, off, kernel, clamp=False)
    resample = Image.LANCZOS if kernel == "lanczos3" else Image.BILINEAR
    for b in range(3):
        w = 28 - int(wm[b])
        ref = np.array(Image.fromarray(x[b, 0].numpy(), mode="F").resize((w, 28), resample))
        o = int(off[b])
        torch.testing.assert_close(y[b, 0, :, o : o + w], torch.from_numpy(ref), rtol=0, atol=1e-5)
        assert (y[b, 0, :, :o] == 0).all() and (y[b, 0, :, o + w :] == 0).all()


def test_random_squish_narrows_by_1_to_7_columns():
    x = torch.ones(500, 1, 28, 28)
    y = random_squish(x, torch.Generator().manual_seed(0))
    cols = (y[:, 0] > 0.5).any(1)  # [B, W]
    width = cols.sum(1)
    offset = cols.float().argmax(1)
    assert width.min() >= 21 and width.max() <= 27 and width.max() == 27
    assert offset.min() >= 0 and offset.max() <= 4
    torch.testing.assert_close(y[:, 0, :, 10], torch.ones(500, 28))  # interior of a constant image stays 1


# --------------------------------------------------------------------------------------------- recipe
def test_recipe_smoke(tmp_path, monkeypatch):
    import capsule_lib.train.recipes.base as recipes
    from capsule_lib.data import get_dataset
    from capsule_lib.train import train
    from capsule_lib.train.recipes import RECIPES, EfficientCapsNetRecipe

    # small generated splits (rendering the default 10k glyphs dominates the run time otherwise)
    monkeypatch.setattr(
        recipes, "get_dataset", lambda name, root, split, **kw: get_dataset(name, root, split, n=48, **kw)
    )

    assert RECIPES["efficient"] is EfficientCapsNetRecipe
    r = EfficientCapsNetRecipe(epochs=1, dataset="glyph_digits", train_subset=32, eval_subset=16, device="cpu")
    assert (r.batch_size, r.lr, r.recon_weight, r.lr_decay, r.lr_min) == (16, 5e-4, 0.392, 0.97, 5e-5)
    model, trainer = train(r, out_dir=tmp_path, progress=False, test=False)
    hist = json.loads((tmp_path / "history.json").read_text())
    rec = hist["records"][0]
    assert rec["lr"] == 5e-4 and "train_recon" in rec and math.isfinite(rec["val_loss"])
    assert hist["meta"]["parameters"] == 161_824
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4 * 0.97)
    lam = trainer.scheduler.lr_lambdas[0]
    assert lam(100) == pytest.approx(0.1)  # floor 5e-5
    assert lam(10) == pytest.approx(0.97**10)


@pytest.mark.slow
def test_torch_compile_smoke():
    m = _model("mnist").eval()
    x = _input(m.config, 2)
    compiled = torch.compile(m)
    ref = m(x, torch.tensor([1, 2]))
    out = compiled(x, torch.tensor([1, 2]))
    torch.testing.assert_close(out.scores, ref.scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.reconstruction, ref.reconstruction, rtol=1e-4, atol=1e-5)
