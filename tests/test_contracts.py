"""No silent wrong results, second pass (#35): input contracts of every model, non-finite images, one-line errors,
data identity, the registry's configuration checksum and the command line. (The EM kernel's gradients on
mixed-scale inputs: tests/test_fused_kernels.py.)"""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest
import torch

from capsule_lib.data import TensorLoader, get_dataset
from capsule_lib.data.datasets import check_labels, data_fingerprint
from capsule_lib.evaluation import predict
from capsule_lib.losses import CapsuleObjective
from capsule_lib.models import (
    CapsNet,
    CapsNetConfig,
    EMCapsNet,
    EMCapsNetConfig,
    RoutingClassifier,
    RoutingClassifierConfig,
)
from capsule_lib.models.heinsen import SmallNORBClassifier, SmallNORBConfig
from capsule_lib.train import RunMismatchError, Trainer, TrainingInterrupted

TINY_CAPSNET = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


def _models():
    """The models #35 found without a contract, tiny, with an image batch each ``[4, C, H, W]`` in [0, 1]."""
    em = EMCapsNet(EMCapsNetConfig.small(image_size=20, conv_channels=8, primary_types=4, caps1_types=4, caps2_types=4))
    norb = SmallNORBClassifier(SmallNORBConfig(n_parts=4, d_chns=8, image_size=48, iterations=2))
    rc = RoutingClassifier(
        RoutingClassifierConfig(routing="dynamic", stem_channels=(4, 8), primary_types=2, caps_dim=4, image_size=12)
    )
    return {
        "EMCapsNet": (em, torch.rand(4, 1, 20, 20)),
        "SmallNORBClassifier": (norb, torch.rand(4, 2, 48, 48)),
        "RoutingClassifier": (rc, torch.rand(4, 1, 12, 12)),
    }


MODELS = _models()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_refuses_0_255_and_normalised_images(name):
    """Item 2: 0-255 floats and mean/std-normalised images were predicted silently (0-97% of the right answers)."""
    model, x = MODELS[name]
    assert predict(model, x)["scores"].shape == (4, model.config.n_classes if hasattr(model.config, "n_classes") else 5)
    with pytest.raises(ValueError, match=rf"^predict\({name}\): images: float images must be in \[0, 1\]"):
        predict(model, x * 255)
    with pytest.raises(ValueError, match="normalised input"):
        predict(model, (x - 0.5) / 0.25)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_check_the_image_shape_in_one_line(name):
    """Item 2: RoutingClassifier had no shape check (torch's reshape error); every model names the shape it takes."""
    model, x = MODELS[name]
    spec = model.input_contract.spec.replace("[", r"\[").replace("]", r"\]")
    arg = "images" if name == "SmallNORBClassifier" else "x"  # the name of forward's argument
    with pytest.raises(ValueError, match=rf"^{name}: {arg}: expected shape {spec}"):
        model(torch.rand(2, x.shape[1] + 1, *x.shape[2:]))
    if model.input_contract.size is not None:
        with pytest.raises(ValueError, match=rf"^{name}: {arg}: expected shape {spec}"):
            model(torch.rand(2, x.shape[1], x.shape[2] + 2, x.shape[3] + 2))
    with pytest.raises(ValueError, match=rf"^{name}: {arg}: empty batch"):
        model(x[:0])


@pytest.mark.parametrize("name", sorted(MODELS) + ["CapsNet"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_predict_refuses_non_finite_images(name, bad):
    """Item 3: NaN images passed the range check and were predicted as class 0 (and counted by accuracy)."""
    model, x = MODELS[name] if name != "CapsNet" else (CapsNet(TINY_CAPSNET), torch.rand(4, 1, 28, 28))
    x = x.clone()
    x[1, 0, 3, 3] = bad
    with pytest.raises(ValueError, match=r"1 of \d+ pixel values are NaN or infinite"):
        predict(model, x)


def test_predict_takes_numpy_and_refuses_empty_input_and_bad_batch_sizes():
    """Item 4: a numpy array (AttributeError), an empty batch ("torch.cat(): expected a non-empty list") and
    ``batch_size=0``."""
    model, x = MODELS["RoutingClassifier"]
    assert torch.equal(predict(model, x.numpy())["scores"], predict(model, x)["scores"])
    assert predict(model, (x * 255).to(torch.uint8).numpy())["scores"].shape == (4, 10)
    with pytest.raises(ValueError, match=r"^predict\(RoutingClassifier\): no images to predict"):
        predict(model, x[:0])
    for bs in (0, -1, 2.5):
        with pytest.raises(ValueError, match="batch_size must be (a positive integer|an integer)"):
            predict(model, x, batch_size=bs)
    with pytest.raises(ValueError, match="images must be a tensor or a ndarray"):
        predict(model, x.tolist())


def test_routing_layers_refuse_an_empty_batch_and_a_dtype_mismatch_in_one_line():
    """Item 4: an empty batch ended in ZeroDivisionError in dynamic routing; fp16 capsules into fp32 routing layers
    in torch's bare "expected scalar type Float but found Half"."""
    from capsule_lib.routing.dynamic import DynamicRouting
    from capsule_lib.routing.em import EMRouting
    from capsule_lib.routing.inverted import InvertedFCCapsules
    from capsule_lib.routing.self_attention import SelfAttentionRouting

    with pytest.raises(ValueError, match=r"^u: empty batch \(0, 8, 8\)"):
        DynamicRouting(8, 4, 8, 16)(torch.zeros(0, 8, 8, requires_grad=True))
    layers = [
        (DynamicRouting(8, 4, 8, 16), (torch.rand(2, 8, 8),)),
        (EMRouting(8, 4), (torch.rand(2, 8, 16), torch.rand(2, 8))),
        (SelfAttentionRouting(8, 4, 8, 16), (torch.rand(2, 8, 8),)),
        (InvertedFCCapsules(8, 4, 16), (torch.rand(2, 8, 16),)),
    ]
    for layer, args in layers:
        name = type(layer).__name__
        with pytest.raises(
            ValueError, match=rf"^{name}: the input is torch.float16 but the parameters are torch.float32"
        ):
            layer(args[0].half(), *args[1:])
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast, mixed dtypes are the point
            layer(args[0].bfloat16(), *args[1:])


def _shipped_copy(tmp_path, name="capsnet_mnist"):
    from capsule_lib.pretrained import CHECKPOINT_DIR, registry

    entry = registry()[name]
    for key in ("file", "history"):
        shutil.copy(CHECKPOINT_DIR / entry[key], tmp_path / entry[key])
    return entry


def _write_registry(tmp_path, name, entry):
    """A registry of one entry, its fields bound to its weights as an export binds them (so that a test reaches the
    check it is about; tests/test_bad_inputs.py refuses unbound edits)."""
    from capsule_lib.train.shipped import BOUND_FIELDS, bound_sha256

    entry = {**entry, "bound_sha256": {f: bound_sha256(entry, f, tmp_path) for f in BOUND_FIELDS}}
    (tmp_path / "registry.json").write_text(json.dumps({name: entry}))


def test_registry_entries_need_their_checksums_and_a_bad_file_is_one_line(tmp_path):
    """Item 4: a registry entry without sha256 (KeyError) and an unreadable checkpoint file whose sha256 the registry
    matches (torch.load's traceback)."""
    from capsule_lib.pretrained import load_pretrained, sha256_file

    entry = _shipped_copy(tmp_path)
    _write_registry(tmp_path, "m", {k: v for k, v in entry.items() if k != "sha256"})
    with pytest.raises(ValueError, match=r"^registry entry 'm' has no sha256"):
        load_pretrained("m", directory=tmp_path)
    f = tmp_path / entry["file"]
    f.write_bytes(f.read_bytes()[:1000])  # truncated, and the registry updated to match it
    _write_registry(tmp_path, "m", {**entry, "sha256": sha256_file(f)})
    with pytest.raises(ValueError, match=r"^checkpoint 'm' \(.*\): not a readable PyTorch state_dict"):
        load_pretrained("m", directory=tmp_path)


def test_a_registry_config_edited_after_export_is_refused(tmp_path):
    """Item 5: the checksum covered only the weights; ``iterations`` 3 -> 1 in the entry loaded silently."""
    from capsule_lib.pretrained import ChecksumMismatchError, config_sha256, load_pretrained, registry

    entry = _shipped_copy(tmp_path)
    _write_registry(tmp_path, "m", entry)
    model, _ = load_pretrained("m", directory=tmp_path)
    assert model.config.iterations == 3
    edited = {**entry, "config": {**entry["config"], "iterations": 1}}
    _write_registry(tmp_path, "m", edited)
    with pytest.raises(ChecksumMismatchError, match="model configuration was changed after export"):
        load_pretrained("m", directory=tmp_path)
    for name, e in registry().items():  # every shipped entry carries a config checksum that matches it
        assert e["config_sha256"] == config_sha256(e["model"], e["config"]), name


def test_data_fingerprint_tells_other_images_apart():
    a = get_dataset("glyph_digits", split="train", n=300)
    b = get_dataset("glyph_digits", split="train", n=300, seed=1)
    assert len(a) == len(b) and a.name == b.name
    assert a.fingerprint() == get_dataset("glyph_digits", split="train", n=300).fingerprint()
    assert a.fingerprint() != b.fingerprint()
    altered = a.images.clone()
    altered[150] = 255 - altered[150]  # one image changed (index 150 is among the sampled ones)
    assert data_fingerprint(altered, a.labels) != a.fingerprint()
    labels = a.labels.clone()
    labels[7] = (labels[7] + 1) % 10  # every label counts
    assert data_fingerprint(a.images, labels) != a.fingerprint()


@pytest.fixture(scope="module")
def glyphs():
    return get_dataset("glyph_digits", split="train", n=192), get_dataset("glyph_digits", split="val", n=64)


def _trainer(out_dir, fingerprint=None, **kw):
    torch.manual_seed(0)
    model = CapsNet(TINY_CAPSNET)
    meta = {"recipe": "capsnet", "dataset": "mnist", "train_images": 192, "config": {"model": {"a": 1}}}
    if fingerprint is not None:
        meta["data_fingerprint"] = fingerprint
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    return Trainer(model, CapsuleObjective(), opt, device="cpu", out_dir=out_dir, progress=False, meta=meta, **kw)


def test_a_run_never_resumes_onto_other_images(tmp_path, glyphs):
    """Item 5: a run resumed onto a dataset of the same name and size but other images and mixed the two."""
    tr, va = glyphs
    tl, vl = TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 64)
    _trainer(tmp_path, "aaaa").fit(tl, vl, epochs=1)
    with pytest.raises(RunMismatchError, match=r"data_fingerprint: 'aaaa' -> 'bbbb'"):
        _trainer(tmp_path, "bbbb").fit(tl, vl, epochs=2)
    _trainer(tmp_path, "aaaa").fit(tl, vl, epochs=2)  # the same data resumes


def test_train_records_the_fingerprint_and_refuses_labels_outside_the_classes(tmp_path, monkeypatch):
    """Item 5: labels outside the class range loaded without error."""
    from capsule_lib.train import recipes, train

    r = recipes.CapsNetRecipe(epochs=1, train_subset=64, eval_subset=32, model=TINY_CAPSNET, device="cpu")
    _, trainer = train(r, data_root=str(tmp_path), offline=True, progress=False, test=False)
    fp = trainer.history.meta["data_fingerprint"]
    assert isinstance(fp, str) and len(fp) == 16
    with pytest.raises(
        ValueError, match=r"labels must be class indices 0\.\.9 for this model, got values in \[0, 10\]"
    ):
        check_labels(torch.tensor([0, 3, 10]), 10, "training set 'mnist'")
    real = recipes.Recipe.loaders

    def bad_labels(self, *a, **k):
        out = real(self, *a, **k)
        out.train_set.labels[0] = 12
        return out

    monkeypatch.setattr(recipes.Recipe, "loaders", bad_labels)
    with pytest.raises(ValueError, match=r"^training set 'glyph_digits': labels must be class indices 0\.\.9"):
        train(r, data_root=str(tmp_path), offline=True, progress=False, test=False)


def _cli(capsys, *argv):
    from capsule_lib.commands.train import main

    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "setting,message",
    [
        ("epochs=1.5", "epochs must be an integer, got 1.5"),
        ("epochs=-1", "epochs must be a positive integer, got -1"),
        ("train_subset=-5", "train_subset must be a positive integer, got -5"),
        ("epochs=abc", "epochs must be an integer, got 'abc'"),
        ("lr=fast", "lr must be a float, got 'fast'"),
        ("batch_size=0", "batch_size must be a positive integer, got 0"),
        ("device=gpu", "device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu'"),
        ("model.iterations=x", "iterations must be an integer, got 'x'"),
    ],
)
def test_cli_checks_every_value_before_loading_data(tmp_path, capsys, monkeypatch, setting, message):
    """Item 6: these trained 2 epochs, trained nothing and exited 0, or ended in 14-41-line tracebacks after the data
    had loaded. Now: exit status 2 and one error line, before any data is read."""
    from capsule_lib.train import recipes

    monkeypatch.setattr(recipes.Recipe, "loaders", lambda *a, **k: pytest.fail("data loaded"))
    code, err = _cli(capsys, "capsnet", "--out", str(tmp_path / "run"), "--set", setting)
    assert (
        code == 2 and len(err) == 1 and err[0].startswith("python -m capsule_lib.train: error: ") and message in err[0]
    )


def test_cli_adds_up_several_set_flags_and_refuses_a_key_given_twice(tmp_path, capsys, monkeypatch):
    import capsule_lib.commands.train as train_module

    seen = {}

    def fake_train(recipe, **kw):
        seen["recipe"] = recipe
        raise SystemExit(0)

    monkeypatch.setattr(train_module, "train", fake_train)
    out = str(tmp_path / "run")
    _cli(capsys, "capsnet", "--out", out, "--set", "epochs=2", "--set", "train_subset=64", "lr=0.002")
    r = seen["recipe"]
    assert (r.epochs, r.train_subset, r.lr) == (2, 64, 0.002)
    code, err = _cli(capsys, "capsnet", "--out", out, "--set", "epochs=2", "--set", "epochs=3")
    assert code == 2 and "gives epochs twice" in err[-1]


class _InterruptAt:
    """An objective that sends this process SIGINT (Ctrl-C) during training batch ``at`` of the first run."""

    def __init__(self, at: int):
        self.inner, self.at, self.calls = CapsuleObjective(), at, 0

    def __call__(self, model, batch, train):
        if train:
            self.calls += 1
            if self.calls == self.at:
                signal.raise_signal(signal.SIGINT)
        return self.inner(model, batch, train)


def test_ctrl_c_stops_after_the_batch_with_a_checkpoint_and_the_rerun_says_it_resumes(tmp_path, glyphs, capsys):
    """Item 6: Ctrl-C printed a 56-line traceback and the rerun resumed without saying so; a finished run's rerun
    re-read the test set with no "already finished" line."""
    tr, va = glyphs
    tl, vl = TensorLoader.from_dataset(tr, 32, shuffle=True, seed=0), TensorLoader.from_dataset(va, 64)
    t = _trainer(tmp_path)
    t.objective = _InterruptAt(8)  # the 2nd batch of epoch 2 (6 batches per epoch)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a job started in the background
    with pytest.raises(TrainingInterrupted, match=r"after batch 2 of 6 of epoch 2 \(mid-epoch checkpoint\); run the"):
        t.fit(tl, vl, epochs=3)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["epoch"] == 1 and state["in_epoch"]["loader"]["batch"] == 2
    again = _trainer(tmp_path)
    again.fit(tl, vl, epochs=3)
    assert "resuming" in capsys.readouterr().out and again.epoch == 3
    test_calls = []
    again.evaluate = lambda loader, prefix="val": test_calls.append(prefix) or {f"{prefix}_acc": 0.5}
    first = again.finish(vl)
    done = _trainer(tmp_path)
    done.fit(tl, vl, epochs=3)
    assert "already finished (3 of 3 epochs); nothing to train" in capsys.readouterr().out
    done.evaluate = lambda loader, prefix="val": pytest.fail("the test split was read again")
    assert done.finish(vl) == first and test_calls == ["test"]


def test_cli_prints_one_line_on_ctrl_c(tmp_path, capsys, monkeypatch):
    import capsule_lib.commands.train as train_module

    def interrupted(recipe, **kw):
        raise TrainingInterrupted("training interrupted (Ctrl-C) after batch 3 of 9 of epoch 1; run the same command")

    monkeypatch.setattr(train_module, "train", interrupted)
    code, err = _cli(capsys, "capsnet", "--out", str(tmp_path / "run"), "--set", "epochs=1")
    assert code == 130 and err == ["training interrupted (Ctrl-C) after batch 3 of 9 of epoch 1; run the same command"]


def test_numpy_and_tensor_images_agree_for_uint8():
    model, x = MODELS["EMCapsNet"]
    u8 = (x * 255).round().to(torch.uint8)
    assert torch.equal(predict(model, u8.numpy())["scores"], predict(model, u8)["scores"])
    assert np.isfinite(predict(model, u8)["scores"].numpy()).all()
