"""capsule_lib.notebook: the settings every chapter applies in its first cells."""

from pathlib import Path

import pytest
import torch

from capsule_lib.data import DatasetUnavailableError, DataSource, get_dataset
from capsule_lib.data.datasets import data_root
from capsule_lib.notebook import Settings, chapter_dataset, env_flag, in_colab, settings, train_or_load, try_dataset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("CAPSULE_SMOKE", "CAPSULE_OFFLINE", "CAPSULE_DATA"):
        monkeypatch.delenv(k, raising=False)


def test_env_flag(monkeypatch):
    for value, expected in [("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False), ("", False)]:
        monkeypatch.setenv("CAPSULE_X", value)
        assert env_flag("CAPSULE_X") is expected
    monkeypatch.delenv("CAPSULE_X")
    assert env_flag("CAPSULE_X") is False


def test_defaults_and_banner(capsys, tmp_path):
    cfg = settings(DATA_ROOT=str(tmp_path))
    assert isinstance(cfg, Settings)
    assert (cfg.smoke, cfg.train, cfg.epochs, cfg.offline, cfg.seed) == (False, False, 1, False, 0)
    assert cfg.device == torch.device("cpu") or cfg.device.type in ("cuda", "mps")
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [cfg.banner()]
    assert "full run" in out[0] and "TRAIN off" in out[0] and f"data .../{tmp_path.name}/" in out[0]
    assert str(tmp_path) not in out[0]  # never the machine's absolute path


def test_smoke_from_environment_caps_epochs(monkeypatch, capsys):
    monkeypatch.setenv("CAPSULE_SMOKE", "1")
    cfg = settings(SMOKE=False, TRAIN=True, EPOCHS=15, quiet=True)
    assert cfg.smoke and cfg.train and cfg.epochs == 1
    assert "SMOKE run" in cfg.banner() and "TRAIN on (1 epoch)" in cfg.banner()
    assert capsys.readouterr().out == ""  # quiet
    assert settings(SMOKE=True, EPOCHS=15, smoke_epochs=2, quiet=True).epochs == 2


def test_full_mode_keeps_epochs():
    cfg = settings(TRAIN=True, EPOCHS=15, quiet=True)
    assert not cfg.smoke and cfg.epochs == 15 and "15 epochs" in cfg.banner()


def test_bad_epochs():
    with pytest.raises(ValueError, match="EPOCHS"):
        settings(EPOCHS=0, quiet=True)


def test_data_root_precedence(monkeypatch, tmp_path):
    import os

    env_root = tmp_path / "env"
    monkeypatch.setenv("CAPSULE_DATA", str(env_root))
    assert settings(quiet=True).data_root == env_root.resolve()  # "" -> $CAPSULE_DATA
    param = tmp_path / "param"
    cfg = settings(DATA_ROOT=str(param), quiet=True)  # the parameter wins
    assert cfg.data_root == param.resolve()
    assert os.environ["CAPSULE_DATA"] == str(env_root)  # settings() reads the environment, never writes it


def test_data_root_default_is_repo_data_inside_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPSULE_DATA", raising=False)
    assert data_root(start=REPO / "book") == REPO / "data"
    assert data_root(start=tmp_path) == tmp_path.resolve() / "data"
    monkeypatch.setenv("CAPSULE_DATA", str(tmp_path / "env"))
    assert data_root(start=REPO / "book") == REPO / "data"  # the library ignores the environment ...
    assert settings(quiet=True, style=False).data_root == (tmp_path / "env").resolve()  # ... the chapters read it
    assert data_root(tmp_path / "arg", start=REPO) == tmp_path / "arg"  # an argument beats the default


def test_offline_flag_and_device(monkeypatch):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    cfg = settings(DEVICE="cpu", quiet=True)
    assert cfg.offline and cfg.device == torch.device("cpu")
    assert "offline" in cfg.banner()
    assert cfg.data == DataSource(cfg.data_root, offline=True, standin=True)  # what the chapter passes down


def test_seeding_is_applied():
    settings(quiet=True, seed=123)
    a = torch.rand(3)
    settings(quiet=True, seed=123)
    assert torch.equal(a, torch.rand(3))


def test_style_is_applied():
    import matplotlib.pyplot as plt

    plt.rcParams["axes.spines.top"] = True
    settings(quiet=True)
    assert plt.rcParams["axes.spines.top"] is False
    plt.rcParams["axes.spines.top"] = True
    settings(quiet=True, style=False)
    assert plt.rcParams["axes.spines.top"] is True


def test_in_colab(monkeypatch):
    import sys
    import types

    assert not in_colab()
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert in_colab()


def test_chapter_dataset_falls_back_to_standin_in_smoke_mode(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")  # never touch the network from a test
    cfg = settings(SMOKE=True, DATA_ROOT=str(tmp_path), quiet=True)
    ds = chapter_dataset("mnist", "train", cfg, n_smoke=64)
    out = capsys.readouterr().out
    assert ds.generated and len(ds) == 64 and ds.name == "glyph_digits"
    assert out.count("[GENERATED stand-in data] mnist is not here (offline mode)") == 1
    assert "The text" not in out and "NOT mnist results" not in out  # the page's notice, not the data layer's line


def _no_network(monkeypatch):
    """Make every torchvision download fail the way it does without internet."""
    import torchvision.datasets as tvd

    def fail(*a, **k):
        raise OSError("simulated: no route to host")

    monkeypatch.setattr(tvd, "MNIST", fail)
    monkeypatch.delenv("CAPSULE_OFFLINE", raising=False)


def test_chapter_dataset_falls_back_when_the_download_fails_outside_offline_mode(tmp_path, monkeypatch, capsys):
    """`make book` on a machine without the data and without internet: the chapter runs on the stand-in."""
    _no_network(monkeypatch)
    cfg = Settings(
        smoke=False, train=False, epochs=1, device=torch.device("cpu"), data_root=tmp_path, offline=False, seed=0
    )
    ds = chapter_dataset("mnist", "test", cfg)
    out = capsys.readouterr().out
    assert ds.generated and ds.name == "glyph_digits" and len(ds) == 2000 and ds.standin_for == "mnist"
    assert out.count("[GENERATED stand-in data]") == 2  # the notice, and the banner of the stand-in
    assert "[GENERATED stand-in data] mnist is not here (not under the data root and could not be downloaded)" in out
    assert "Its text describes the results on the real data" in out
    multi = chapter_dataset("multimnist", "test", cfg, n=16)
    assert multi.generated and "glyph_digits (NOT MNIST)" in multi.description


def test_get_dataset_without_standin_raises_the_clear_error(tmp_path, monkeypatch):
    _no_network(monkeypatch)
    with pytest.raises(DatasetUnavailableError, match="data_scripts/mnist.py"):
        get_dataset("mnist", tmp_path, "test")  # default outside offline mode: no fallback
    with pytest.raises(DatasetUnavailableError, match="CAPSULE_OFFLINE=1"):
        get_dataset("mnist", tmp_path, "test", standin=False, offline=True)
    assert get_dataset("mnist", tmp_path, "test", n=8, offline=True).generated  # offline: the default allows it


def test_chapter_dataset_without_standin(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    cfg = settings(SMOKE=True, DATA_ROOT=str(tmp_path), quiet=True)
    with pytest.raises(DatasetUnavailableError, match="no generated stand-in"):
        chapter_dataset("cifar100", "test", cfg)  # cifar10 has one (colour_shapes)


def test_chapter_device_falls_back_to_cpu_with_one_line(capsys):
    from capsule_lib.notebook import chapter_device

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert chapter_device("cuda") == torch.device("cpu")
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["DEVICE='cuda' requested but cuda is not available here: running on the CPU instead."]
    assert chapter_device("cpu") == torch.device("cpu") and capsys.readouterr().out == ""
    cfg = settings(DEVICE="cuda", quiet=True)
    assert cfg.device == torch.device("cpu")


def test_chapter_dataset_uses_real_data_when_present(real_data, capsys):
    cfg = settings(SMOKE=True, DATA_ROOT=str(real_data), quiet=True)
    ds = chapter_dataset("mnist", "test", cfg, n_smoke=32)
    assert not ds.generated and len(ds) == 32
    assert "[real data]" in capsys.readouterr().out


def test_a_page_says_once_that_it_runs_on_stand_ins(tmp_path, monkeypatch, capsys):
    """settings(..., data=...) says it at the top of the page; the page's later loads (its own, and the data
    layer's for training) say nothing more; the next page says it again."""
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    cfg = settings(SMOKE=True, DATA_ROOT=str(tmp_path), data=("mnist",))
    top = capsys.readouterr().out
    assert top.count("[GENERATED stand-in data]") == 1 and "mnist is not here (offline mode)" in top
    chapter_dataset("mnist", "test", cfg, n_smoke=32)
    chapter_dataset("affine_mnist", "test", cfg, n_smoke=32, size=28)
    get_dataset("mnist", cfg.data, "train", n=32)  # e.g. a training run on the page
    later = capsys.readouterr().out
    assert "is not here" not in later and "is not available here" not in later
    settings(SMOKE=True, DATA_ROOT=str(tmp_path), data=("mnist",))  # a new page
    assert capsys.readouterr().out.count("mnist is not here") == 1


def test_a_page_with_its_data_prints_no_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    settings(SMOKE=True, DATA_ROOT=str(tmp_path), data=())
    assert "GENERATED" not in capsys.readouterr().out


# ------------------------------------------------------------------------------ a chapter's models in one call
def _page(tmp_path, train: bool) -> Settings:
    return Settings(
        smoke=True, train=train, epochs=1, device=torch.device("cpu"), data_root=tmp_path, offline=True, seed=0
    )


def test_train_or_load_loads_the_shipped_checkpoints_when_train_is_off(tmp_path):
    from capsule_lib.pretrained import load_pretrained_history

    model, history = train_or_load("baseline_cnn_mnist", _page(tmp_path, train=False))
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert history.records == load_pretrained_history("baseline_cnn_mnist").records
    models, histories = train_or_load(["baseline_cnn_mnist", "compare_mnist_cnn"], _page(tmp_path, train=False))
    assert list(models) == list(histories) == ["baseline_cnn_mnist", "compare_mnist_cnn"]


@pytest.mark.slow
def test_train_or_load_retrains_the_shipped_recipe_when_train_is_on(tmp_path, monkeypatch):
    """TRAIN on: the named runs are retrained from their shipped recipe (here with the shipped run's time budget,
    capped in smoke mode), the others loaded; runs go to runs/<checkpoint>_smoke under the working folder."""
    from capsule_lib.pretrained import load_pretrained_history

    monkeypatch.chdir(tmp_path)
    models, histories = train_or_load(
        ["compare_mnist_cnn", "baseline_cnn_mnist"],
        _page(tmp_path, train=True),
        retrain=["compare_mnist_cnn"],
        budget=True,
        smoke=(64, 32),
    )
    new, shipped = histories["compare_mnist_cnn"], load_pretrained_history("compare_mnist_cnn")
    assert new.meta["recipe"] == shipped.meta["recipe"] and new.meta["generated_data"]
    assert new.meta["budget_minutes"] == 0.05 and new.meta["train_images"] == 64
    assert (tmp_path / "runs" / "compare_mnist_cnn_smoke").is_dir()
    assert histories["baseline_cnn_mnist"].records == load_pretrained_history("baseline_cnn_mnist").records
    assert all(not m.training for m in models.values())


def test_try_dataset_says_why_a_dataset_is_missing(tmp_path, capsys):
    assert try_dataset("mnist", _page(tmp_path, train=False)) is None
    out = capsys.readouterr().out
    assert out.startswith("mnist: not available here.") and "data_scripts/mnist.py" in out
    assert str(tmp_path) not in out  # the machine's path is not printed
