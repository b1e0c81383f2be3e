"""No silent wrong results, third pass (#47): a failed download leaves no debris and the real data is recognised
from its files; resumes that would skip or repeat images, or mix data and thread counts; labels outside the classes
at test time; ``predict``'s side effects; one-line errors that say what to do."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import capsule_lib.data as D
import capsule_lib.routing as R
from capsule_lib.data import DatasetUnavailableError, TensorLoader, get_dataset, read_idx
from capsule_lib.losses import CapsuleObjective
from capsule_lib.models import CapsNet, CapsNetConfig
from capsule_lib.train import RunMismatchError, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


# ------------------------------------------------------------------------------ data: no debris, no false presence
def _idx(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape) + arr.tobytes()


def _tiny_mnist_files(raw: Path, n_train: int = 20, n_test: int = 10) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for stem, arr in [
        ("train-images-idx3-ubyte", np.zeros((n_train, 28, 28), np.uint8)),
        ("train-labels-idx1-ubyte", np.arange(n_train, dtype=np.uint8) % 10),
        ("t10k-images-idx3-ubyte", np.zeros((n_test, 28, 28), np.uint8)),
        ("t10k-labels-idx1-ubyte", np.arange(n_test, dtype=np.uint8) % 10),
    ]:
        (raw / f"{stem}.gz").write_bytes(gzip.compress(_idx(arr)))


#: what torchvision's MNIST raises when every mirror fails (four lines, two URLs)
TORCHVISION_FAILURE = (
    "Error downloading train-images-idx3-ubyte.gz:\nTried https://ossci-datasets.s3.amazonaws.com/mnist/, got:\n"
    "<urlopen error [Errno -2] Name or service not known>\nTried http://yann.lecun.com/exdb/mnist/, got:\n"
    "<urlopen error [Errno -2] Name or service not known>\n"
)


class _TorchvisionMNIST:
    """``torchvision.datasets.MNIST(root, train, download=True)`` as the network makes it: it creates
    ``root/MNIST/raw`` first, then (``fail``) leaves a partial file and raises its four-line error, or writes the
    four files."""

    fail = True

    def __init__(self, root, train=True, download=False):
        raw = Path(root) / "MNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        if self.fail:
            (raw / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08 partial")
            raise RuntimeError(TORCHVISION_FAILURE)
        _tiny_mnist_files(raw)


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else ["<absent>"]


@pytest.mark.parametrize("existed", [False, True])
def test_a_failed_download_leaves_the_data_root_as_it_found_it_and_says_why_in_one_line(tmp_path, monkeypatch, existed):
    """make book on a machine without network left an empty ``mnist/MNIST/raw/`` (and a partial file when the
    connection broke), which the tests then took for real MNIST."""
    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets, "MNIST", _TorchvisionMNIST)
    root = tmp_path / "data"
    if existed:
        (root / "cifar10").mkdir(parents=True)
        (root / "notes.txt").write_text("mine")
    before = _tree(root)
    with pytest.raises(DatasetUnavailableError) as e:
        get_dataset("mnist", root, "test", standin=False)
    assert _tree(root) == before
    msg = str(e.value)
    assert "\n" not in msg and "Name or service not known" in msg and "python data_scripts/mnist.py" in msg
    assert "http" not in msg and "Tried" not in msg  # no URL, cut short or whole
    assert len(msg.replace(str(root), "<root>")) < 300, msg
    assert not D.find_real_data("mnist", root)


def test_a_download_that_succeeds_lands_in_the_data_root(tmp_path, monkeypatch):
    import torchvision.datasets

    monkeypatch.setattr(torchvision.datasets, "MNIST", type("Ok", (_TorchvisionMNIST,), {"fail": False}))
    te = get_dataset("mnist", tmp_path, "test", standin=False)
    assert len(te) == 10 and not te.generated
    assert _tree(tmp_path / "mnist") == [
        "MNIST",
        "MNIST/raw",
        "MNIST/raw/t10k-images-idx3-ubyte.gz",
        "MNIST/raw/t10k-labels-idx1-ubyte.gz",
        "MNIST/raw/train-images-idx3-ubyte.gz",
        "MNIST/raw/train-labels-idx1-ubyte.gz",
    ]


#: the published MNIST files' sizes, uncompressed (header + pixels or labels)
PUBLISHED = {
    "train-images-idx3-ubyte": (60000, 28, 28),
    "train-labels-idx1-ubyte": (60000,),
    "t10k-images-idx3-ubyte": (10000, 28, 28),
    "t10k-labels-idx1-ubyte": (10000,),
}


def _published_size_files(raw: Path, gz_labels: bool = True) -> None:
    """Files of MNIST's published names and sizes (zero pixels; images sparse and uncompressed, labels gzipped)."""
    raw.mkdir(parents=True, exist_ok=True)
    for stem, dims in PUBLISHED.items():
        header = bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
        size = len(header) + int(np.prod(dims))
        if "labels" in stem and gz_labels:
            (raw / f"{stem}.gz").write_bytes(gzip.compress(header + bytes(size - len(header))))
        else:
            with open(raw / stem, "wb") as f:
                f.write(header)
                f.truncate(size)


def test_the_real_dataset_is_recognised_from_its_files_not_its_folder(tmp_path):
    """One answer to "is real MNIST here" (the library, the chapters through it, the tests' real_data fixture and
    make test): the four files with their published names and sizes."""
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    assert not D.find_real_data("mnist", tmp_path) and "no MNIST files" in D.find_real_data("mnist", tmp_path).problem
    raw.mkdir(parents=True)  # the debris of a failed torchvision download
    found = D.find_real_data("mnist", tmp_path)
    assert not found and "no MNIST files" in found.problem and found.folder == raw
    _tiny_mnist_files(raw)  # a small set of the right names (a test's, or a subset): loadable, but not real MNIST
    found = D.find_real_data("mnist", tmp_path)
    assert not found and "t10k-images-idx3-ubyte.gz: 10 images, the published file has 10000" in found.problem
    assert len(get_dataset("mnist", tmp_path, "test", offline=True)) == 10
    for f in raw.iterdir():
        f.unlink()
    _published_size_files(raw)
    found = D.find_real_data("mnist", tmp_path)
    assert found and found.problem == "" and sorted(found.files) == sorted(PUBLISHED)
    (raw / "t10k-images-idx3-ubyte").write_bytes((raw / "t10k-images-idx3-ubyte").read_bytes()[:5000])  # cut short
    found = D.find_real_data("mnist", tmp_path)
    assert not found and "t10k-images-idx3-ubyte: truncated" in found.problem


@pytest.mark.slow
def test_the_real_data_fixture_skips_with_a_reason_on_a_failed_downloads_debris(tmp_path):
    """The five real-data tests that failed on a fresh machine after make book skip there, saying why."""
    import os
    import subprocess
    import sys

    (tmp_path / "data" / "mnist" / "MNIST" / "raw").mkdir(parents=True)
    tests = Path(__file__).parent
    path = os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")])  # this checkout's capsule_lib
    env = {**os.environ, "CAPSULE_DATA": str(tmp_path / "data"), "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "realdata"]
    files = ("test_core_data.py", "test_data_multimnist.py", "test_notebook.py", "test_pretrained.py")
    files = [str(tests / f) for f in files]
    res = subprocess.run([*cmd, *files], env=env, capture_output=True, text=True, timeout=300, cwd=tests.parent)
    assert res.returncode == 0, res.stdout[-2000:]
    assert re.search(r"^5 skipped, \d+ deselected", res.stdout.splitlines()[-1]), res.stdout[-2000:]
    reason = r"SKIPPED \[(\d+)\] .*: real MNIST not present under CAPSULE_DATA=\S+: no MNIST files in "
    reasons = re.findall(reason, res.stdout)
    assert sum(map(int, reasons)) == 5, res.stdout[-2000:]


def _deny(monkeypatch, under: Path, *, folder: bool):
    """Permission denied for ``under`` (a folder: listing and looking inside it; a file: opening it), as for a user
    without the rights (the tests may run as root, whom chmod does not stop)."""
    import builtins
    import os

    def denied(path):
        return PermissionError(13, "Permission denied", str(path))

    def inside(path) -> bool:
        p = Path(os.fsdecode(path)) if not isinstance(path, int) else None
        return p is not None and (p == under or under in p.parents if folder else p == under)

    stat, open_ = os.stat, builtins.open

    def guarded_stat(path, *a, **k):
        if folder and inside(path) and Path(os.fsdecode(path)) != under:
            raise denied(path)
        return stat(path, *a, **k)

    def guarded_open(path, *a, **k):
        if not isinstance(path, int) and inside(path):
            raise denied(path)
        return open_(path, *a, **k)

    monkeypatch.setattr(os, "stat", guarded_stat)
    monkeypatch.setattr(builtins, "open", guarded_open)


def test_an_unreadable_data_folder_or_file_is_named_with_the_fix_not_called_corrupt(tmp_path, monkeypatch):
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    _tiny_mnist_files(raw)
    with monkeypatch.context() as m:
        _deny(m, raw / "t10k-images-idx3-ubyte.gz", folder=False)
        with pytest.raises(PermissionError) as e:
            read_idx(raw / "t10k-images-idx3-ubyte.gz")
        msg = str(e.value)
        assert msg.startswith(f"{raw / 't10k-images-idx3-ubyte.gz'}: permission denied") and "\n" not in msg
        assert "corrupt" not in msg and "delete" not in msg and "chmod" in msg
        with pytest.raises(PermissionError, match=r"t10k-images-idx3-ubyte\.gz: permission denied"):
            get_dataset("mnist", tmp_path, "test", offline=True)
    with monkeypatch.context() as m:
        _deny(m, raw, folder=True)
        with pytest.raises(PermissionError) as e:
            get_dataset("mnist", tmp_path, "test", offline=True)
        msg = str(e.value)
        assert "permission denied" in msg and "chmod" in msg and "\n" not in msg and "[Errno" not in msg


# ------------------------------------------------------------------------------------------------ resumes
def test_a_loader_resumed_with_another_batch_size_sees_every_image_once():
    """A mid-epoch checkpoint stored a batch index; the resumed loader applied it to its own batch size: after 5
    batches of 64, batches of 32 repeated 160 images and batches of 128 skipped 320."""
    data = torch.arange(1000)

    def seen_after_resume(batch_size):
        first = TensorLoader([data], 64, shuffle=True, seed=3)
        first.set_epoch(1)
        it = iter(first)
        seen = [next(it)[0] for _ in range(5)]
        state = first.state()
        again = TensorLoader([data], batch_size, shuffle=True, seed=3)
        again.set_epoch(1)
        again.resume_at(state)
        return torch.cat(seen + [b[0] for b in again])

    assert sorted(seen_after_resume(32).tolist()) == list(range(1000))
    assert sorted(seen_after_resume(64).tolist()) == list(range(1000))
    with pytest.raises(ValueError, match=r"^the checkpoint stopped inside epoch 2 after 320 images \(5 batches of 64"):
        seen_after_resume(128)


@pytest.fixture(scope="module")
def glyphs():
    return get_dataset("glyph_digits", split="train", n=256), get_dataset("glyph_digits", split="val", n=64)


def _trainer(out_dir, objective=None, **kw):
    torch.manual_seed(0)
    model = CapsNet(TINY)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    objective = objective or CapsuleObjective()
    return Trainer(model, objective, opt, device="cpu", out_dir=out_dir, progress=False, **kw)


class _Counting:
    """The capsule objective, counting the training images it sees and raising KeyboardInterrupt at batch ``stop``."""

    def __init__(self, stop=None):
        self.inner, self.stop, self.batches, self.images = CapsuleObjective(), stop, 0, 0

    def __call__(self, model, batch, train):
        if train:
            self.batches += 1
            if self.batches == self.stop:
                raise KeyboardInterrupt
            self.images += batch[0].shape[0]
        return self.inner(model, batch, train)


def test_a_trainer_resumed_inside_an_epoch_with_another_batch_size_finishes_it_without_skipping(tmp_path, glyphs):
    tr, va = glyphs
    val = TensorLoader.from_dataset(va, 64)

    def loader(batch_size):
        return TensorLoader.from_dataset(tr, batch_size, shuffle=True, seed=0)

    t = _trainer(tmp_path, _Counting(stop=8), checkpoint_minutes=0.0)  # 4 batches of 64 an epoch
    with pytest.raises(KeyboardInterrupt):
        t.fit(loader(64), val, epochs=2)  # epoch 2 stops after 3 batches (192 images)
    with pytest.raises(ValueError, match=r"last\.pt: the checkpoint stopped inside epoch 2 after 192 images"):
        _trainer(tmp_path).fit(loader(128), val, epochs=2)
    count = _Counting()
    resumed = _trainer(tmp_path, count)
    resumed.fit(loader(32), val, epochs=2)
    assert count.images == 64 and count.batches == 2 and resumed.epoch == 2


def test_a_trainer_used_directly_records_its_data_and_never_resumes_onto_other_images(tmp_path, glyphs):
    """Only train() recorded the data fingerprint: a Trainer used directly resumed onto other images of the same
    count."""
    tr, va = glyphs
    other = get_dataset("glyph_digits", split="train", n=256, seed=1)
    val = TensorLoader.from_dataset(va, 64)
    t = _trainer(tmp_path)
    t.fit(TensorLoader.from_dataset(tr, 64), val, epochs=1)
    assert t.history.meta["data_fingerprint"] == tr.fingerprint()
    with pytest.raises(RunMismatchError, match=r"belongs to a different run \(data_fingerprint: "):
        _trainer(tmp_path).fit(TensorLoader.from_dataset(other, 64), val, epochs=2)
    same = _trainer(tmp_path)
    same.fit(TensorLoader.from_dataset(tr, 64), val, epochs=2)
    assert same.epoch == 2


def test_a_resume_with_another_thread_count_is_recorded_and_said(tmp_path, glyphs, capsys):
    """CPU results depend on the thread count: a run resumed with another one is not the uninterrupted run. The
    history said nothing ("1 threads"); now it records from which epoch on the count changed, and says so."""
    tr, va = glyphs
    tl, vl = TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 64)
    _trainer(tmp_path).fit(tl, vl, epochs=1)
    torch.set_num_threads(2)
    try:
        t = _trainer(tmp_path)
        t.fit(tl, vl, epochs=2)
    finally:
        torch.set_num_threads(1)
    assert t.history.meta["threads"] == 1
    assert t.history.meta["thread_changes"] == [{"from_epoch": 2, "threads": 2}]
    assert "with 2 threads (the run had 1)" in capsys.readouterr().out
    assert json.loads((tmp_path / "history.json").read_text())["meta"]["thread_changes"] == [
        {"from_epoch": 2, "threads": 2}
    ]


# ------------------------------------------------------------------------------------------------ labels, predict
@pytest.mark.parametrize(
    "recipe,split,message",
    [
        ("capsnet", "test", r"^test set 'glyph_digits': labels must be class indices 0\.\.9"),
        ("capsnet", "val", r"^val set 'glyph_digits': labels must be class indices 0\.\.9"),
        ("em_norb", "test_novel", r"^test_novel set 'rendered_norb \(azimuth protocol\)': labels must be .* 0\.\.4"),
    ],
)
def test_labels_outside_the_classes_are_refused_in_every_split_before_training(
    tmp_path, monkeypatch, recipe, split, message
):
    """Training labels were checked, test labels were not: a test set with labels 12 loaded and its accuracy
    dropped silently (through the command line: a traceback after training). A viewpoint protocol's test sets
    (``{prefix: loader}``) are checked each."""
    from capsule_lib.train import make_recipe, recipes, train

    real = recipes.Recipe.loaders

    def bad_labels(self, *a, **k):
        out = real(self, *a, **k)
        loader = out.test[split] if split.startswith("test_") else getattr(out, split)
        loader.tensors[1] = loader.tensors[1].clone()
        loader.tensors[1][:10] = 12
        return out

    monkeypatch.setattr(recipes.Recipe, "loaders", bad_labels)
    monkeypatch.setattr(Trainer, "fit", lambda *a, **k: pytest.fail("trained"))
    small = {"model": TINY} if recipe == "capsnet" else {}
    r = make_recipe(recipe, epochs=1, train_subset=64, eval_subset=32, device="cpu", **small)
    with pytest.raises(ValueError, match=message):
        train(r, data_root=str(tmp_path), offline=True, progress=False)


def test_the_command_line_refuses_test_labels_outside_the_classes_in_one_line(tmp_path, monkeypatch, capsys):
    from capsule_lib.commands.train import main
    from capsule_lib.train import recipes

    real = recipes.Recipe.loaders

    def bad_labels(self, *a, **k):
        out = real(self, *a, **k)
        out.test.tensors[1] = out.test.tensors[1].clone()
        out.test.tensors[1][:10] = 12
        return out

    monkeypatch.setattr(recipes.Recipe, "loaders", bad_labels)
    small = ["model.conv_channels=8", "model.primary_types=4", "model.class_dim=8", "model.decoder_hidden=[32, 64]"]
    argv = ["capsnet", "--out", str(tmp_path / "run"), "--offline", "--data-root", str(tmp_path), "--set", "epochs=1"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "train_subset=32", "eval_subset=16", "device=cpu", *small])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err  # found in the data: a run that cannot go on (usage is 2)
    assert err[0].startswith("python -m capsule_lib.train: error: test set 'glyph_digits': labels must be class")


def test_accuracy_refuses_labels_outside_the_scores_classes():
    from capsule_lib.evaluation import accuracy

    scores = torch.eye(10)
    assert accuracy(scores, torch.arange(10)) == 1.0
    with pytest.raises(ValueError, match=r"^accuracy: labels must be class indices 0\.\.9 .* got values in \[0, 12\]"):
        accuracy(scores, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 12]))


def test_predict_gives_the_model_back_in_the_mode_it_was_in():
    """predict left a training model in eval mode (a training loop calling it went on without dropout)."""
    from capsule_lib.evaluation import predict

    m = CapsNet(TINY).train()
    m.decoder.eval()  # a mixed state (e.g. a frozen part) comes back as it was
    modes = {name: mod.training for name, mod in m.named_modules()}
    predict(m, torch.rand(3, 1, 28, 28))
    assert {name: mod.training for name, mod in m.named_modules()} == modes
    with pytest.raises(ValueError, match="NaN or infinite"):
        predict(m, torch.full((3, 1, 28, 28), float("nan")))
    assert {name: mod.training for name, mod in m.named_modules()} == modes


# ------------------------------------------------------------------------------------------------ command line
def _cli(capsys, *argv):
    from capsule_lib.commands.train import main

    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_cli_refuses_a_key_given_twice_in_two_spellings(tmp_path, capsys, monkeypatch):
    """``--set model.iterations=1 --set model__iterations=3`` trained with 3 (the spellings differed)."""
    import capsule_lib.commands.train as cli

    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("trained"))
    out = str(tmp_path / "run")
    for first, second in [("model.iterations=1", "model__iterations=3"), ("model__iterations=3", "model.iterations=1")]:
        code, err = _cli(capsys, "capsnet", "--out", out, "--set", first, "--set", second)
        assert code == 2 and len(err) == 1 and "gives model.iterations twice" in err[0], err


@pytest.mark.parametrize("threads", ["-1", "0"])
def test_cli_refuses_a_thread_count_below_one_in_one_line(tmp_path, capsys, monkeypatch, threads):
    import capsule_lib.commands.train as cli

    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("trained"))
    code, err = _cli(capsys, "capsnet", "--out", str(tmp_path / "run"), "--threads", threads)
    assert code == 2 and err == [f"python -m capsule_lib.train: error: --threads must be >= 1, got {threads}"]


# ------------------------------------------------------------------------------------------------ one-line errors
def _empty_batch_cases():
    gm = R.GenerativeMatrixRouting(4, 4, 4, n_inp=8, n_out=4)
    ev = R.EfficientVectorRouting(8, 4, 8, 16)
    fc, conv = R.InvertedFCCapsules(8, 4, 16), R.InvertedConvCapsules(2, 3, 16, 3)
    sa = R.SelfAttentionRouting(8, 4, 8, 16)
    from capsule_lib.models.heinsen import (
        SequenceClassifierConfig,
        SequenceClassifierHead,
        TokenSequenceClassifier,
        TokenSequenceConfig,
    )

    head = SequenceClassifierHead(SequenceClassifierConfig(d_depth=3, d_emb=16, d_inp=8, d_out=2, n_parts=6))
    tokens = TokenSequenceClassifier(TokenSequenceConfig())
    return {
        "InvertedFCCapsules (second update)": lambda: fc(torch.rand(0, 8, 16), torch.rand(0, 4, 16)),
        "InvertedConvCapsules (second update)": lambda: conv(torch.rand(0, 2, 5, 5, 16), torch.rand(0, 3, 3, 3, 16)),
        "InvertedFCCapsules": lambda: fc(torch.rand(0, 8, 16)),
        "GenerativeMatrixRouting": lambda: gm(torch.randn(0, 8), torch.randn(0, 8, 4, 4)),
        "EfficientVectorRouting": lambda: ev(torch.randn(0, 8, 8)),
        "SequenceClassifierHead": lambda: head(torch.randn(0, 5, 3, 16)),
        "TokenSequenceClassifier": lambda: tokens(torch.zeros(0, 5, dtype=torch.long)),
        "SelfAttentionRouting": lambda: sa(torch.rand(0, 8, 8)),
    }


EMPTY_BATCH_CASES = _empty_batch_cases()


@pytest.mark.parametrize("name", sorted(EMPTY_BATCH_CASES))
def test_every_routing_layer_refuses_an_empty_batch_in_one_line(name):
    """Inverted attention's second update divided by zero; Heinsen's layers and self-attention returned empty
    outputs. Every routing layer now refuses an empty batch as dynamic and EM routing do."""
    with pytest.raises(ValueError, match=r"^\w+: empty batch \(0, [\d, ]+\); pass at least one sample, shape \["):
        EMPTY_BATCH_CASES[name]()


def test_predict_names_an_unknown_or_missing_device_and_the_fix():
    from capsule_lib.evaluation import predict

    m = CapsNet(TINY).eval()
    x = torch.rand(2, 1, 28, 28)
    with pytest.raises(ValueError, match=r"^predict\(CapsNet\): device 'gpu' is not a device name; use 'cpu', 'cuda'"):
        predict(m, x, device="gpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(
        ValueError, match=r"^predict\(CapsNet\): device 'cuda' is not available on this machine \(torch sees no CUDA"
    ):
        predict(m, x, device="cuda")


def test_load_pretrained_on_a_machine_without_the_device_says_so():
    from capsule_lib.pretrained import load_pretrained

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(
        ValueError,
        match=r"^load_pretrained\('capsnet_mnist'\): map_location 'cuda' is not available on this machine .*use 'cpu'",
    ):
        load_pretrained("capsnet_mnist", map_location="cuda")


def test_a_truncated_history_file_is_named(tmp_path, glyphs):
    from capsule_lib.train import load_history

    (tmp_path / "history.json").write_text('{"meta": {"recipe": "capsnet"}, "records": [{"epoch": 1, ')
    with pytest.raises(ValueError, match=r"history\.json: not valid JSON \(truncated or edited\?"):
        load_history(tmp_path / "history.json")
    tr, va = glyphs
    tl, vl = TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 64)
    _trainer(tmp_path / "run").fit(tl, vl, epochs=1)
    (tmp_path / "run" / "history.json").write_text('{"meta": {')
    with pytest.raises(ValueError, match=r"run/history\.json: not valid JSON .*last\.pt"):
        _trainer(tmp_path / "run").fit(tl, vl, epochs=2)
