"""Did this run learn? (capsule_lib.train.learning_check): the line above chance, the capsules' health, the early stop
of a dead network, the run's record, the command's exit status and the warning of predict and load_trained."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from capsule_lib.data import images as images_module
from capsule_lib.data.loaders import TensorLoader
from capsule_lib.train.learning_check import (
    DID_NOT_LEARN_EXIT,
    LearningCheck,
    above_chance_line,
    chance_accuracy,
    check_learning,
)
from capsule_lib.types import CapsuleOutput

pytestmark = pytest.mark.usefixtures("one_thread")


class _Scores(nn.Module):
    """A stand-in network whose class scores are given: ``fn(x) -> [B, K]``."""

    def __init__(self, fn, kind: str = "lengths") -> None:
        super().__init__()
        self.w, self.fn, self.kind = nn.Parameter(torch.zeros(1)), fn, kind

    def forward(self, x):
        return CapsuleOutput(scores=self.fn(x) + 0 * self.w, kind=self.kind, poses=None)


def _val(n: int = 200, k: int = 4) -> TensorLoader:
    g = torch.Generator().manual_seed(0)
    return TensorLoader([torch.randint(0, 256, (n, 1, 8, 8), generator=g, dtype=torch.uint8), torch.arange(n) % k], 64)


def test_chance_is_the_most_frequent_class_and_the_line_grows_as_the_split_shrinks():
    assert chance_accuracy(torch.tensor([0, 1, 2, 3])) == 0.25
    assert chance_accuracy(torch.tensor([1, 1, 1, 0])) == 0.75
    assert above_chance_line(0.25, 100) == pytest.approx(0.25 + 3 * (0.25 * 0.75 / 100) ** 0.5)  # 0.380
    assert above_chance_line(0.1, 1000) == pytest.approx(0.1285, abs=1e-4)
    assert above_chance_line(0.1, 10**7) == pytest.approx(0.12)  # never less than MIN_MARGIN above chance
    assert above_chance_line(0.25, 10) > above_chance_line(0.25, 100) > above_chance_line(0.25, 1000)
    with pytest.raises(ValueError, match="n >= 1"):
        above_chance_line(0.5, 0)


def test_a_network_above_chance_with_healthy_capsules_learned():
    healthy = _Scores(lambda x: torch.rand(len(x), 4, generator=torch.Generator().manual_seed(1)) * 0.8 + 0.1)
    v = check_learning(healthy, _val(), val_acc=0.6, epoch=3)
    assert v.learned is True and not v.dead and v.symptoms == [] and v.reason == ""
    assert v.chance == 0.25 and v.val_images == 200 and "learned" in v.message("runs/x")


@pytest.mark.parametrize(
    "scores,symptom",
    [(lambda x: torch.ones(len(x), 4) * 0.999, "saturated"), (lambda x: torch.full((len(x), 4), 1e-4), "collapsed")],
)
def test_saturated_or_collapsed_capsules_at_chance_are_a_dead_network(scores, symptom):
    v = check_learning(_Scores(scores), _val(), val_acc=0.25, epoch=1, lr=1e-3)
    assert v.learned is False and v.dead and symptom in v.symptoms and "at chance" in v.symptoms
    assert symptom in v.reason and "lr=0.0001" in v.reason and "\n" not in v.message("r")
    above = check_learning(_Scores(scores), _val(), val_acc=0.9, epoch=1)  # above chance, but every capsule gone
    assert above.learned is False and not above.dead and symptom in above.symptoms


def test_one_class_for_every_image_is_a_symptom_for_logits_too():
    one = _Scores(lambda x: torch.tensor([[5.0, 0, 0, 0]]).expand(len(x), 4), kind="logits")
    v = check_learning(one, _val(), val_acc=0.25, epoch=1)
    assert v.learned is False and v.symptoms == ["at chance", "one class"] and v.measured["saturated"] is None
    assert not v.dead  # networks name one class for every image after their first steps: judged at the end
    assert "names one class for 100% of the images after 1 epoch " in v.reason


def test_at_chance_with_healthy_capsules_is_not_dead_and_too_few_images_cannot_tell():
    healthy = _Scores(lambda x: torch.rand(len(x), 4, generator=torch.Generator().manual_seed(2)) * 0.8 + 0.1)
    v = check_learning(healthy, _val(), val_acc=0.27, epoch=1)
    assert v.learned is False and not v.dead and v.symptoms == ["at chance"] and "train longer" in v.reason
    tiny = check_learning(healthy, _val(n=2), val_acc=0.5, epoch=1)
    assert tiny.learned is None and "2 validation images cannot tell" in tiny.reason


def test_the_callback_stops_a_dead_run_after_its_first_epoch_and_records_why():
    said = []
    trainer = SimpleNamespace(
        model=_Scores(lambda x: torch.ones(len(x), 4)),
        ema=None,
        history=SimpleNamespace(meta={}),
        dist=SimpleNamespace(distributed=False),
        epochs=30,
        epoch=1,
        out_dir=None,
        _say=said.append,
    )
    check = LearningCheck(_val(), lr=1e-3)
    check(trainer, {"epoch": 1, "val_acc": 0.25})
    assert trainer.epochs == 1 and trainer.history.meta["learned"] is False
    assert trainer.history.meta["learning_check"]["stopped_at_epoch"] == 1
    assert len(said) == 1 and "did not learn" in said[0] and "stopped after epoch 1" in said[0]
    later = SimpleNamespace(**{**vars(trainer), "epochs": 30, "epoch": 2, "history": SimpleNamespace(meta={})})
    check(later, {"epoch": 2, "val_acc": 0.25})  # checked after the first epoch only
    assert later.epochs == 30 and later.history.meta == {}


# ------------------------------------------------------------------------------------------------ the commands
def _noise_folder(root, classes: int = 4, per_class: int = 40, side: int = 16):
    """Pictures of noise sorted into class folders at random: labels no network can learn from the pictures."""
    rng = np.random.default_rng(0)
    for k in range(classes):
        for i in range(per_class):
            (root / f"c{k}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8), "L").save(root / f"c{k}" / f"{i}.png")
    return root


@pytest.mark.slow
def test_a_folder_of_random_labels_is_reported_as_not_learned_with_its_exit_status(tmp_path, capsys):
    from capsule_lib.commands.predict import main as predict_main
    from capsule_lib.commands.train import main as train_main

    images_module._LOADED.clear()
    root = _noise_folder(tmp_path / "noise")
    run = tmp_path / "runs" / "noise"
    tiny = ["model.channels=[4, 4, 4]", "model.hidden=[8, 8]"]
    argv = ["baseline_cnn", "--images", str(root), "--val-fraction", "0.3", "--out", str(run)]
    with pytest.raises(SystemExit) as e:
        train_main([*argv, "--set", "epochs=2", "device=cpu", *tiny])
    out, err = capsys.readouterr()
    assert e.value.code == DID_NOT_LEARN_EXIT == 3
    said = [line for line in (out + err).splitlines() if "did not learn" in line]
    assert len(said) == 1 and "against chance 25.0%" in said[0], out + err
    meta = json.loads((run / "history.json").read_text())["meta"]
    assert meta["learned"] is False and "at chance" in meta["learning_check"]["symptoms"]
    assert (run / "best.pt").is_file() and (run / "last.pt").is_file()  # its checkpoints are kept
    assert json.loads(out.strip().splitlines()[-1])["learned"] is False
    predict_main([str(run), str(root / "c0" / "0.png")])
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "did not learn" in warnings[0] and "no better than chance" in warnings[0]
    images_module._LOADED.clear()


@pytest.mark.slow
def test_a_small_folder_at_96_px_learns_within_a_minute_of_training(tmp_path, capsys):
    """A folder off the book's own ground (96 px, 4 classes of 60 digits, grey): CapsNet behind its stem learns
    within a one-minute training budget on one thread, and says what it became."""
    import torch.nn.functional as F

    from capsule_lib.commands.train import main as train_main
    from capsule_lib.data import DataSource, get_dataset
    from capsule_lib.data.image_files import write_image_folder

    images_module._LOADED.clear()
    ds = get_dataset("glyph_digits", DataSource(tmp_path / "none", offline=True), "train", n=1000)
    keep = torch.cat([torch.nonzero(ds.labels == k).squeeze(1)[:60] for k in range(4)])
    big = F.interpolate(ds.images[keep].float(), size=(96, 96), mode="bilinear").round().clamp(0, 255)
    write_image_folder(big.to(torch.uint8), ds.labels[keep], ["zero", "one", "two", "three"], tmp_path / "digits")
    run = tmp_path / "run"
    small = ["model.conv_channels=32", "model.primary_types=8", "model.decoder_hidden=[64, 128]"]
    argv = ["capsnet", "--images", str(tmp_path / "digits"), "--image-size", "96", "--val-fraction", "0.2"]
    train_main([*argv, "--out", str(run), "--budget-minutes", "1", "--set", "epochs=100", "device=cpu", *small])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[your images]"))
    assert "96 x 96" in line and "288 primary capsules" in line and "stem 96 px -> 1 stride-2 conv" in line
    meta = json.loads((run / "history.json").read_text())["meta"]
    assert meta["learned"] is True and meta["primary_capsules"] == 288, meta.get("learning_check")
    images_module._LOADED.clear()
