import pytest
import torch

from capsule_lib.layers import FCDecoder, PrimaryCapsules, mask_capsules
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_parameter_counts_match_spec():
    # Paper's "6.8M": conv1 + primary caps (with conv biases) + W_ij, no routing bias, no decoder
    assert n_params(CapsNet(routing_bias=False, decoder=False)) == 6_804_224
    # with the 160-512-1024-784 decoder: 8,215,568 (the count of gram-ai's implementation)
    assert n_params(CapsNet(routing_bias=False)) == 8_215_568
    # the official code also has the 10x16 routing bias
    assert n_params(CapsNet()) == 8_215_568 + 160


def test_config_geometry():
    cfg = CapsNetConfig()
    assert cfg.primary_grid == 6 and cfg.n_primary == 1152
    assert CapsNetConfig(image_size=36).primary_grid == 10  # MultiMNIST size


@pytest.mark.parametrize("B", [1, 2])
def test_forward_shapes_and_trace(B):
    m = CapsNet()
    x = torch.rand(B, 1, 28, 28)
    out = m(x, return_routing=True)
    assert out.scores.shape == (B, 10) and out.poses.shape == (B, 10, 16)
    assert out.reconstruction.shape == (B, 1, 28, 28)
    assert torch.all((out.scores >= 0) & (out.scores < 1))
    assert [c.shape for c in out.trace.coefficients] == [(B, 1152, 10)] * 3


def test_every_parameter_gets_gradient():
    m = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4))
    x = torch.rand(2, 1, 28, 28)
    y = torch.tensor([3, 7])
    out = m(x, y)
    (out.scores.sum() + out.reconstruction.sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.any(p.grad != 0), name


def test_decoder_uses_label_in_training_and_longest_at_test():
    m = CapsNet(CapsNetConfig(conv_channels=16, primary_types=4))
    x = torch.rand(2, 1, 28, 28)
    out = m(x)
    pred = out.scores.argmax(1)
    assert torch.allclose(out.reconstruction, m.reconstruct(out.poses, pred))
    other = (pred + 1) % 10
    assert not torch.allclose(m(x, other).reconstruction, out.reconstruction)


def test_mask_capsules_variants():
    v = torch.randn(2, 4, 3)
    lengths = v.norm(dim=-1)
    top = mask_capsules(v)
    kept = top.abs().sum(-1) > 0
    assert torch.equal(kept.float().argmax(1), lengths.argmax(1)) and kept.sum().item() == 2
    assert (mask_capsules(v, k=2).abs().sum(-1) > 0).sum().item() == 4
    lab = mask_capsules(v, torch.tensor([1, 2]))
    assert torch.equal(lab[0, 1], v[0, 1]) and lab[0, [0, 2, 3]].abs().sum() == 0
    two = mask_capsules(v, torch.tensor([[0, 3], [1, 2]]))
    assert (two.abs().sum(-1) > 0).sum().item() == 4
    with pytest.raises(ValueError):
        mask_capsules(v, torch.zeros(2, 3, 1))


def test_primary_capsule_ordering_is_type_major():
    pc = PrimaryCapsules(in_channels=3, n_types=4, caps_dim=2, kernel_size=3, stride=1)
    x = torch.randn(1, 3, 6, 6)
    caps = pc(x)  # [1, 4*4*4, 2]
    raw = pc.conv(x)  # [1, 8, 4, 4]
    c, y, xx = 2, 1, 3
    i = c * 16 + y * 4 + xx
    s = raw[0, c * 2 : (c + 1) * 2, y, xx]
    n2 = (s * s).sum()
    assert torch.allclose(caps[0, i], n2 / (1 + n2) * s / n2.sqrt(), atol=1e-5)


def test_bad_input_shape():
    with pytest.raises(ValueError, match=r"\[B, 1, 28, 28\]"):
        CapsNet()(torch.rand(2, 1, 32, 32))


def test_decoder_shape_check():
    d = FCDecoder()
    with pytest.raises(ValueError):
        d(torch.rand(2, 10, 8))


@pytest.mark.slow
def test_capsnet_multimnist_recipe_trains_on_pairs_and_decodes_each_digit(tmp_path, monkeypatch):
    """``capsnet_multimnist`` (#36): the 36 x 36 CapsNet keeps its two longest capsules and decodes each alone
    (``extra["reconstructions"]``), trained on generated pairs with the two-digit objective."""
    from capsule_lib.models import CapsNet, CapsNetConfig
    from capsule_lib.train import train
    from capsule_lib.train.recipes import make_recipe

    r = make_recipe("capsnet_multimnist")
    assert (r.model.image_size, r.model.mask_k, r.variant, r.lr_decay, r.lr_decay_steps) == (
        36,
        2,
        "sabour",
        0.96,
        2000,
    )
    tiny = CapsNetConfig(
        image_size=36, mask_k=2, conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(16, 32)
    )
    out = CapsNet(tiny)(torch.rand(3, 1, 36, 36), torch.tensor([[1, 2], [3, 4], [5, 6]]))
    assert out.extra["reconstructions"].shape == (3, 2, 1, 36, 36) and out.reconstruction.shape == (3, 1, 36, 36)
    with pytest.raises(ValueError, match=r"labels \[B\] or \[B, k\] \(k < 10\), not a mask \[B, 10\]"):
        CapsNet(tiny).reconstruct_each(out.poses, torch.zeros(3, 10))  # a multi-hot mask is not labels
    run = dict(epochs=1, pairs_per_epoch=64, val_pairs=32, batch_size=32, train_subset=200, device="cpu")
    _, trainer = train(
        "capsnet_multimnist", model=tiny, data_root=str(tmp_path), offline=True, progress=False, test=False, **run
    )
    rec = trainer.history.records[-1]
    assert rec["train_loss"] > 0 and 0 <= rec["val_acc"] <= 1 and "train_recon" in rec
