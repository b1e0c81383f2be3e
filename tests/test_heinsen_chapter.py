"""What the Heinsen chapter stands on: the loader of the author's published 2019 weights (state dicts
fabricated here in the author's exact key layout and shapes; no download), the viewpoint recipes of the
chapter, bad sequence inputs, the scaling measurement and the chapter's figures."""

from __future__ import annotations

import math

import pytest
import torch

from capsule_lib.models.heinsen import SequenceClassifierHead, SmallNORBClassifier
from capsule_lib.pretrained import load_heinsen_2019

pytestmark = pytest.mark.usefixtures("one_thread", "readable_figures")  # tiny tensors; readable figures (conftest.py)


def _bn(prefix: str, c: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.weight": torch.rand(c, generator=g) + 0.5,
        f"{prefix}.bias": torch.randn(c, generator=g),
        f"{prefix}.running_mean": torch.randn(c, generator=g) * 0.1,
        f"{prefix}.running_var": torch.rand(c, generator=g) + 0.5,
        f"{prefix}.num_batches_tracked": torch.tensor(1000),
    }


def _routing(prefix: str, i: int, j: int, c: int, d: int, e: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.W": torch.randn(i, j, d, e, generator=g) / d,
        f"{prefix}.B": torch.randn(i, j, c, e, generator=g) * 0.1,
        f"{prefix}.beta_use": torch.randn(i, j, generator=g),
        f"{prefix}.beta_ign": torch.randn(i, j, generator=g),
        f"{prefix}.CONST_one": torch.tensor(1.0),
    }


def author_smallnorb_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The key layout and shapes of the author's smallNORB file, written out from his model's code:
    ``convolve`` = 6 x [BatchNorm2d, Conv2d, Swish] (indices 3k, 3k+1; Swish has no state), 4 input channels
    (L, R and two coordinate channels), 64 channels; 1x1 heads; routings W [1, 64, 4, 4] and [64, 5, 4, 4]."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for k, c_in in enumerate([4] + [64] * 5):
        sd.update(_bn(f"convolve.{3 * k}", c_in, g))
        sd[f"convolve.{3 * k + 1}.weight"] = torch.randn(64, c_in, 3, 3, generator=g) * 0.1
        sd[f"convolve.{3 * k + 1}.bias"] = torch.randn(64, generator=g) * 0.1
    sd.update(_bn("compute_a.0", 64, g))
    sd["compute_a.1.weight"] = torch.randn(64, 64, 1, 1, generator=g) * 0.1
    sd["compute_a.1.bias"] = torch.randn(64, generator=g)
    sd.update(_bn("compute_mu.0", 64, g))
    sd["compute_mu.1.weight"] = torch.randn(1024, 64, 1, 1, generator=g) * 0.1
    sd["compute_mu.1.bias"] = torch.randn(1024, generator=g)
    sd.update(_routing("routings.0", 1, 64, 4, 4, 4, g))
    sd.update(_routing("routings.1", 64, 5, 4, 4, 4, g))
    return sd


def author_sst_state_dict(n_classes: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    """The author's SSTClassifier layout: depth_emb [37, 1280], detect_parts = [Linear, Swish, LayerNorm],
    routings W [1, 64, 64, 2] and [64, n_classes, 2, 2] with d_cov = 1."""
    g = torch.Generator().manual_seed(seed)
    sd = {
        "depth_emb": torch.randn(37, 1280, generator=g) * 0.01,
        "detect_parts.0.weight": torch.randn(64, 1280, generator=g) * 0.01,
        "detect_parts.0.bias": torch.randn(64, generator=g) * 0.01,
        "detect_parts.2.weight": torch.rand(64, generator=g) + 0.5,
        "detect_parts.2.bias": torch.randn(64, generator=g) * 0.1,
    }
    sd.update(_routing("routings.0", 1, 64, 1, 64, 2, g))
    sd.update(_routing("routings.1", 64, n_classes, 1, 2, 2, g))
    return sd


# ------------------------------------------------------------------------------- author's weights
def test_author_smallnorb_weights_load_and_every_tensor_is_used():
    sd = author_smallnorb_state_dict()
    m = load_heinsen_2019(sd)
    assert isinstance(m, SmallNORBClassifier) and not m.training
    assert sum(p.numel() for p in m.parameters()) == 271_688
    ours = m.state_dict()
    assert set(ours) == set(sd)
    for k, v in sd.items():
        assert torch.equal(ours[k], v), k
    out = m(torch.rand(2, 2, 96, 96))
    assert out.scores.shape == (2, 5) and torch.isfinite(out.scores).all()


def test_author_weights_from_a_file_and_dataparallel_prefix(tmp_path):
    sd = author_smallnorb_state_dict(1)
    path = tmp_path / "smallNORB_pretrained_model_state_dict.pt"
    torch.save({f"module.{k}": v for k, v in sd.items()}, path)
    m = load_heinsen_2019(path, image_size=None)
    assert torch.equal(m.routings[1].W, sd["routings.1.W"])
    assert m(torch.rand(1, 2, 48, 48)).scores.shape == (1, 5)  # image_size=None takes any size


@pytest.mark.parametrize("n_classes", [5, 2])
def test_author_sst_weights_load(n_classes):
    sd = author_sst_state_dict(n_classes)
    m = load_heinsen_2019(sd)
    assert isinstance(m, SequenceClassifierHead) and m.config.n_classes == n_classes
    assert sum(p.numel() for p in m.parameters()) == {5: 140_480, 2: 138_944}[n_classes]
    for k, v in sd.items():
        assert torch.equal(m.state_dict()[k], v), k


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda sd: sd.pop("routings.1.beta_ign"), "missing key 'routings.1.beta_ign'"),
        (lambda sd: sd.update({"convolve.2.weight": torch.ones(64)}), "unexpected key 'convolve.2.weight'"),
        (lambda sd: sd.update({"routings.0.W": torch.zeros(1, 64, 4, 3)}), "'routings.0.W' has shape (1, 64, 4, 3)"),
    ],
)
def test_author_weights_bad_keys_give_one_line_errors(edit, message):
    sd = author_smallnorb_state_dict()
    edit(sd)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_heinsen_2019(sd)
    assert "\n" not in str(e.value)


def test_author_weights_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_scripts/heinsen_weights.py"):
        load_heinsen_2019(tmp_path / "missing.pt")
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable PyTorch state_dict"):
        load_heinsen_2019(bad)
    with pytest.raises(ValueError, match="not one of Heinsen's"):
        load_heinsen_2019({"fc.weight": torch.zeros(2, 2)})


def test_weights_script_points_at_the_pinned_file():
    import importlib.util
    from pathlib import Path

    from capsule_lib.pretrained import HEINSEN_2019_FILE

    path = Path(__file__).resolve().parents[1] / "data_scripts" / "heinsen_weights.py"
    spec = importlib.util.spec_from_file_location("heinsen_weights", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.DATASET.resources[0]
    assert f"{mod.DATASET.folder}/{res.filename}" == HEINSEN_2019_FILE
    assert mod.COMMIT in res.url and len(res.sha256) == 64 and res.size > 0


# ------------------------------------------------------------------------------- recipes and data
def test_heinsen_viewpoint_recipes():
    from capsule_lib.train.recipes import make_recipe

    r = make_recipe("heinsen_norb")
    m = r.build_model()
    assert sum(p.numel() for p in m.parameters()) == 271_688  # the paper's network, unchanged
    assert (r.image_size, r.crop, r.max_shift, r.epochs, r.batch_size) == (48, 48, 8, 10, 32)
    assert m.part_capsules(torch.rand(1, 2, 48, 48))[0].shape == (1, 64 * 3 * 3)  # 576 part capsules
    cnn = make_recipe("baseline_cnn_norb48").build_model()
    n_cnn = sum(p.numel() for p in cnn.parameters())
    assert 0.9 < n_cnn / 271_688 < 1.1  # a CNN of about the same size
    x = torch.rand(4, 2, 48, 48)
    y = r.augment_batch((x, torch.zeros(4)), torch.Generator().manual_seed(0))[0]
    assert y.shape == x.shape and not torch.equal(x, y)
    assert make_recipe("heinsen_norb", max_shift=0).augment_batch((x,), torch.Generator())[0].equal(x)


def test_shift_augmentation_fills_edges_and_moves_content():
    from capsule_lib.train.recipes import make_recipe

    r = make_recipe("heinsen_norb", max_shift=3)
    x = torch.zeros(64, 1, 12, 12)
    x[:, :, 5:7, 5:7] = 1.0
    y = r.augment_batch((x,), torch.Generator().manual_seed(1))[0]
    assert (y.sum((1, 2, 3)) == 4).all()  # the blob moves by at most 3 px, never off the image
    centres = (y[:, 0].nonzero()[:, 1:].float().view(64, 4, 2).mean(1) - 5.5).abs()
    assert centres.max() <= 3 and centres.max() > 0


def test_marker_sequences_task():
    from capsule_lib.data.sequences import PAD, marker_sequences

    s = marker_sequences(300, seed=3)
    again = marker_sequences(300, seed=3)
    assert torch.equal(s.tokens, again.tokens) and torch.equal(s.labels, again.labels)
    assert not torch.equal(s.tokens, marker_sequences(300, seed=4).tokens)
    L = s.tokens.shape[1]
    assert ((s.tokens == PAD) == (torch.arange(L)[None] >= s.n_tokens[:, None])).all()  # padding only at the end
    assert s.n_tokens.min() >= 16 and s.n_tokens.max() <= 40
    counts = torch.stack([(s.tokens == m + 1).sum(1) for m in range(4)], 1)  # [N, 4]
    top = counts.max(1)
    assert torch.equal(top.indices, s.labels)  # the label is the most frequent marker ...
    assert ((counts == top.values[:, None]).sum(1) == 1).all()  # ... and it is unique
    assert top.values.min() >= 2 and top.values.max() <= 4
    assert torch.bincount(s.labels, minlength=4).min() > 40  # every class occurs
    with pytest.raises(ValueError, match="min_len"):
        marker_sequences(2, min_len=5, max_len=10)


def test_heinsen_sequence_recipe_trains_end_to_end(tmp_path):
    from capsule_lib.train import train

    model, trainer = train(
        "heinsen_sequences", out_dir=tmp_path, progress=False, train_subset=256, eval_subset=128, epochs=1
    )
    rec = trainer.history.records[-1]
    assert math.isfinite(rec["train_loss"]) and 0 <= rec["val_acc"] <= 1
    assert "test_acc" in trainer.history.meta["test"]


# ------------------------------------------------------------------------------- sequence head: inputs
def test_sequence_head_bad_inputs():
    from capsule_lib.models.heinsen import SequenceClassifierConfig, TokenSequenceClassifier

    head = SequenceClassifierHead(SequenceClassifierConfig(d_depth=None, d_emb=8, d_inp=8, n_parts=4, n_classes=3))
    with pytest.raises(ValueError, match="sequences are empty") as e:
        head(torch.zeros(2, 0, 8))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="d_emb=8"):
        head(torch.zeros(2, 5, 7))  # wrong capsule (embedding) size
    with pytest.raises(ValueError, match="padding_mask"):
        head(torch.zeros(2, 5, 8), torch.zeros(2, 4, dtype=torch.bool))
    tok = TokenSequenceClassifier(vocab=10)
    with pytest.raises(ValueError, match="int64"):
        tok(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        tok(torch.full((2, 5), 10))


def test_all_padding_sequences_have_a_defined_finite_result():
    from capsule_lib.models.heinsen import SequenceClassifierConfig

    torch.manual_seed(0)
    head = SequenceClassifierHead(SequenceClassifierConfig(d_depth=None, d_emb=8, d_inp=8, n_parts=4, n_classes=3))
    for p in head.parameters():  # a "trained" head: betas and biases away from their zero init
        p.data.add_(torch.randn_like(p) * 0.5)
    mask = torch.ones(2, 6, dtype=torch.bool)
    embs = torch.randn(2, 6, 8, requires_grad=True)
    out = head(embs, mask)
    assert torch.isfinite(out.scores).all() and torch.isfinite(out.poses).all()
    torch.testing.assert_close(out.scores[0], out.scores[1])  # independent of what the padding contains
    out.scores.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)
    # padding does not change a real sequence's result
    x = torch.randn(1, 4, 8)
    padded = torch.cat([x, torch.randn(1, 3, 8) * 100], 1)
    m = torch.tensor([[False] * 4 + [True] * 3])
    torch.testing.assert_close(head(padded, m).scores, head(x).scores, atol=1e-5, rtol=1e-5)


def test_token_credits_chain_the_bang_per_bit_of_both_routings():
    from capsule_lib.data.sequences import marker_sequences
    from capsule_lib.models.heinsen import TokenSequenceClassifier, bang_per_bit

    torch.manual_seed(0)
    m = TokenSequenceClassifier()
    for p in m.parameters():  # betas away from their zero init
        p.data.add_(torch.randn_like(p) * 0.3)
    s = marker_sequences(3, seed=1)
    out, credits = m.token_credits(s.tokens)
    assert credits.shape == (3, s.tokens.shape[1], 4)
    assert (credits[s.padding_mask] == 0).all()  # padding carries no data, so no credit
    t1, t2 = out.extra["traces"]
    phi1, phi2 = bang_per_bit(m.head.routings[0], t1), bang_per_bit(m.head.routings[1], t2)
    torch.testing.assert_close(phi1.sum(-2), t1.activations[-1])  # a_out_j = sum_i phi_ij (the parts' logits)
    torch.testing.assert_close(phi2.sum(-2), out.scores)  # the class logits
    # summed over the tokens, the credit is sum_j a_part_j phi2_jk
    torch.testing.assert_close(credits.sum(1), torch.einsum("bj,bjk->bk", t1.activations[-1], phi2))
    torch.testing.assert_close(out.scores, m(s.tokens).scores)


def test_class_credits_of_the_smallnorb_model():
    torch.manual_seed(0)
    m = SmallNORBClassifier(image_size=48).eval()
    x = torch.rand(2, 2, 48, 48)
    with torch.no_grad():
        out, credits = m.class_credits(x)
        a, _ = m.part_capsules(x)
    assert m.part_grid(x) == (3, 3) and credits.shape == (2, 5, 64, 3, 3)
    total = credits.sum(1).reshape(2, -1)  # over the classes: each part's data, sigmoid(a)
    torch.testing.assert_close(total, torch.sigmoid(a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.scores, m(x).scores)
    first = m.class_credits(x, 0)[1]  # iteration 1 of the class routing: uniform shares
    torch.testing.assert_close(first, first[:, :1].expand_as(first))


# ------------------------------------------------------------------------------- cost of routing
def test_routing_memory_scaling():
    from capsule_lib.cost import loglog_slope, routing_scaling, saved_bytes

    rows = routing_scaling(
        [(64, 8), (256, 8), (1024, 8)], ("dynamic", "heinsen_2019", "heinsen_2022"), d=8, batch=2, time_it=False
    )
    for kind in ("dynamic", "heinsen_2019", "heinsen_2022"):
        pts = [(r["n_inp"], r["saved_mib"]) for r in rows if r["kind"] == kind]
        assert 0.85 < loglog_slope(*zip(*pts)) < 1.15, kind  # linear in n_inp
        assert all(r["ms"] is None for r in rows)
    # per pair, the 2019 routing keeps d-sized votes, the 2022 one does not
    by_d = {d: routing_scaling([(512, 16)], ("heinsen_2019", "heinsen_2022"), d=d, time_it=False) for d in (4, 32)}
    grow = {k: by_d[32][i]["saved_mib"] / by_d[4][i]["saved_mib"] for i, k in enumerate(("2019", "2022"))}
    assert grow["2019"] > 4 and grow["2022"] < 2.5
    w = torch.randn(10, 10, requires_grad=True)
    _, n = saved_bytes(lambda: (w @ torch.ones(10, 3)).sum(), exclude=[w])
    assert n == 10 * 3 * 4  # the ones are saved for backward, the parameter is excluded
    with pytest.raises(ValueError, match="unknown routing kind"):
        routing_scaling([(4, 4)], ("capsnet",))
    assert loglog_slope([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)


# ------------------------------------------------------------------------------- figures and explorers
def test_viewpoint_sweep_order_and_pose_figures():
    import matplotlib

    matplotlib.use("Agg")
    from capsule_lib.analysis import class_poses, pose_projection
    from capsule_lib.data.viewpoints import viewpoint_sweep
    from capsule_lib.viz.heinsen import plot_pose_trajectories

    d = viewpoint_sweep("rendered_norb", category=4, instance=0, elevations=[1, 3], azimuths=[2, 0, 5], size=48)
    assert d.images.shape == (6, 2, 48, 48) and (d.labels == 4).all()
    assert d.extra["elevation"].tolist() == [1, 1, 1, 3, 3, 3] and d.extra["azimuth"].tolist() == [0, 2, 5] * 2
    with pytest.raises(ValueError, match="instances"):
        viewpoint_sweep("rendered_norb", category=4, instance=4)  # a training instance
    m = SmallNORBClassifier(image_size=None).eval()
    probs, poses = class_poses(m, d.images)
    assert probs.shape == (6, 5) and poses.shape == (6, 5, 16)
    torch.testing.assert_close(probs.sum(1), torch.ones(6))
    proj = pose_projection(poses[:, 4])
    assert proj.apply(poses[:, 4]).shape == (6, 2) and float(proj.explained.sum()) <= 1 + 1e-6
    fig = plot_pose_trajectories(poses[None, None, :, 4].expand(2, 2, 6, 16), list(range(6)), ["a", "b"], ["x", "y"])
    assert [ax.get_title() for ax in fig.axes[:2]] == ["class capsule 'a'", "class capsule 'b'"]
    with pytest.raises(ValueError, match="at least 2"):
        pose_projection(poses[:1, 0])


def test_heinsen_explorers_redraw_their_twins():
    import matplotlib

    matplotlib.use("Agg")
    from capsule_lib.data.viewpoints import viewpoint_sweep
    from capsule_lib.viz.explorers import class_credit_explorer, pose_trajectory_explorer

    torch.manual_seed(0)
    m = SmallNORBClassifier(image_size=None).eval()
    calls = []

    def sweep(e, light):
        calls.append((e, light))
        return viewpoint_sweep(
            "rendered_norb", category=4, instance=0, elevations=[e], lightings=[light], size=48
        ).images

    classes = ["animal", "human", "airplane", "truck", "car"]
    ex = pose_trajectory_explorer(m, sweep, 4, classes)
    first = ex.readout.value
    assert "<code>azimuth 0 deg, elevation 50 deg, lighting 0: predicts" in first
    ex.controls["azimuth"].value = 9
    ex.controls["elevation"].value = 2
    assert "<code>azimuth 180 deg, elevation 40 deg" in ex.readout.value and ex.draws == 3
    assert calls == [(4, 0), (2, 0)]  # each sweep is fetched once
    imgs = viewpoint_sweep("rendered_norb", category=4, instance=0, azimuths=[0, 9], size=48).images
    ex2 = class_credit_explorer(m, imgs, torch.tensor([4, 4]), classes)
    before = ex2.readout.value
    assert "<code>predicts" in before and "share of credit" in before
    ex2.controls["iteration"].value = 1  # uniform shares: every class capsule gets the same credit
    assert ex2.readout.value.count("20%") == 5
    ex2.controls["image"].value = 1
    assert ex2.draws == 3


def test_token_credit_and_scaling_figures():
    import matplotlib

    matplotlib.use("Agg")
    from capsule_lib.data.sequences import marker_sequences
    from capsule_lib.viz.heinsen import plot_routing_scaling, plot_token_credits

    s = marker_sequences(2, seed=0)
    credits = torch.rand(2, s.tokens.shape[1], 4)
    fig = plot_token_credits(s.tokens, credits, s.classes, s.labels, s.labels, 4)
    ax = fig.axes[0]
    n = int(s.n_tokens[0])
    assert ax.images[0].get_array().shape == (4, n)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert sum(lbl != "·" for lbl in labels) == int(s.is_marker()[0].sum())
    rows = [
        {"kind": k, "n_inp": i, "n_out": 8, "saved_mib": i * f, "ms": None}
        for k, f in (("dynamic", 1.0), ("heinsen_2022", 0.1))
        for i in (8, 32)
    ]
    fig = plot_routing_scaling(rows)
    assert "slope 1.00" in fig.axes[0].get_legend().get_texts()[0].get_text()


def test_pose_page_explorer_precomputes_distinct_views():
    import matplotlib

    matplotlib.use("Agg")
    from capsule_lib.data.viewpoints import viewpoint_sweep
    from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, pose_page_explorer

    torch.manual_seed(0)
    m = SmallNORBClassifier(image_size=None).eval()

    def sweep(e, light):
        return viewpoint_sweep("rendered_norb", category=4, instance=0, elevations=[e], lightings=[light]).images

    page = pose_page_explorer(m, sweep, 4, ["a", "b", "c", "d", "e"], elevations=(0, 4), azimuth_step=6)
    assert PAGE_EXPLORER_CLASS in page._dom_classes
    outer = page.children[2].children[-1].children[1]  # the Stack of rows of frames
    assert len(outer.children) == 2 and all(len(row.children) == 3 for row in outer.children)
    assert outer.selected_index == 1  # elevation index 4 (the reference sweep) first
    assert len({img.value for row in outer.children for img in row.children}) == 6


def test_token_occlusion_is_the_logit_drop_of_masking_one_token():
    from capsule_lib.data.sequences import marker_sequences
    from capsule_lib.models.heinsen import TokenSequenceClassifier

    torch.manual_seed(0)
    m = TokenSequenceClassifier().eval()
    for p in m.parameters():
        p.data.add_(torch.randn_like(p) * 0.3)
    s = marker_sequences(2, seed=2)
    scores, effect = m.token_occlusion(s.tokens)
    assert effect.shape == (2, s.tokens.shape[1], 4)
    assert (effect[s.padding_mask] == 0).all()
    t = 3
    masked = s.tokens.clone()
    masked[:, t] = 0
    with torch.no_grad():
        torch.testing.assert_close(effect[:, t], m(s.tokens).scores - m(masked).scores)
    torch.testing.assert_close(scores, m(s.tokens).scores.detach())
