"""benchmarks/gpu_stage.py and benchmarks/gpu_items.py (issue #60's runs on a lent GPU), on the CPU: the staging of the
data in pieces (checksums, what each call carries against 64 MiB), the tracked checkpoints moved out of a checkout and
back, what a call returns (the limits, a stop at the deadline), and each item's command in --quick mode on tiny data
in the real files' formats, down to the re-check and registration of what came back (in a dry run)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"capsule_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


@pytest.fixture(scope="module")
def stage_mod():
    return _load("gpu_stage")


@pytest.fixture(scope="module")
def items_mod():
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))  # gpu_items imports gpu_stage and gpu beside it
    try:
        yield _load("gpu_items")
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A data root in the offline copies' formats: CIFAR-10 as six .npz shards (5 x 1,100 training images: 5,000 of
    them validation, and 200 test images, the first 50 marked exact), MNIST's four IDX .gz files of the published
    sizes, and checksums.sha256."""
    root = tmp_path_factory.mktemp("data")
    g = np.random.default_rng(0)

    def images(n):
        y = g.integers(0, 10, n).astype(np.uint8)
        x = np.broadcast_to((y * 25)[:, None, None, None], (n, 32, 32, 3)).copy()
        x[:, :4, :4] = g.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8)
        return x, y

    (root / "cifar10").mkdir()
    for k in range(5):
        x, y = images(1100)
        np.savez_compressed(root / f"cifar10/train_{k}.npz", x=x, y=y)
    x, y = images(200)
    np.savez_compressed(root / "cifar10/test.npz", x=x, y=y, exact=np.arange(200) < 50)
    raw = root / "mnist/MNIST/raw"
    raw.mkdir(parents=True)
    for stem, n in (("train", 60000), ("t10k", 10000)):
        labels = g.integers(0, 10, n).astype(np.uint8)
        im = np.zeros((n, 28, 28), np.uint8)
        im[:, 10:14, 10:14] = (labels * 25)[:, None, None]
        with gzip.open(raw / f"{stem}-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
            f.write(struct.pack(">HBBIII", 0, 8, 3, n, 28, 28) + im.tobytes())
        with gzip.open(raw / f"{stem}-labels-idx1-ubyte.gz", "wb", compresslevel=1) as f:
            f.write(struct.pack(">HBBI", 0, 8, 1, n) + labels.tobytes())
    files = sorted(p for p in root.rglob("*") if p.is_file())
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root).as_posix()}\n" for p in files]
    (root / "checksums.sha256").write_text("".join(sums))
    return root


def _meta(out: Path, into: Path) -> dict:
    with tarfile.open(out / "meta.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return json.loads((into / "record.json").read_text())


# ---------------------------------------------------------------------------------------------- staging
def test_the_data_travel_in_checked_pieces_and_each_call_fits_64_mib(stage_mod, data, tmp_path, capsys, monkeypatch):
    stage = tmp_path / "stage"
    assert stage_mod.main(["--stage-dir", str(stage), "--dry-run", "stage", "tsai", "--data", str(data)]) == 0
    assert not stage.exists()  # a dry run copies nothing
    capsys.readouterr()
    assert stage_mod.main(["--stage-dir", str(stage), "stage", "tsai", "--data", str(data)]) == 0
    said = capsys.readouterr().out
    assert said.count(" of 64 (ok); carry ") == 3 and 'carry ["' in said and "gpu_items.py tsai" in said
    for piece in "abc":  # two shards a piece, the test shard with the last training shard
        sums = stage_mod.read_checksums(stage / piece / "checksums.sha256")
        assert sorted(sums) == sorted(stage_mod.PIECES[piece])
        known = stage_mod.read_checksums(data / "checksums.sha256")
        assert all(known[n] == d and (stage / piece / n).is_file() for n, d in sums.items())
    root = stage_mod.data_root(["cifar10"], stage)
    assert sorted(p.name for p in (root / "cifar10").iterdir()) == ["test.npz", *(f"train_{k}.npz" for k in range(5))]

    monkeypatch.setattr(stage_mod, "CALL_LIMIT", 2**20)  # a call over the limit is said and fails
    assert stage_mod.main(["--stage-dir", str(stage), "stage", "tsai", "--data", str(data)]) == 1
    assert "OVER THE LIMIT" in capsys.readouterr().out


def test_a_missing_or_damaged_piece_stops_the_device_before_training(stage_mod, data, tmp_path, capsys):
    stage = tmp_path / "stage"
    stage_mod.main(["--stage-dir", str(stage), "stage", "tsai", "--data", str(data)])
    capsys.readouterr()
    (stage / "b" / "cifar10" / "train_3.npz").write_bytes(b"damaged")
    with pytest.raises(SystemExit) as e:
        stage_mod.main(["--stage-dir", str(stage), "verify", "a", "b"])
    assert e.value.code == 3
    assert "stage/b/cifar10/train_3.npz: sha256" in capsys.readouterr().err.strip().splitlines()[-1]
    (stage / "c" / "checksums.sha256").unlink()
    with pytest.raises(SystemExit) as e:
        stage_mod.data_root(["cifar10"], stage)
    assert e.value.code == 3 and "stage/a" in capsys.readouterr().out  # a checked before
    (stage / "a" / "checksums.sha256").write_text("")
    with pytest.raises(SystemExit):
        stage_mod.verify(["a"], stage)
    assert "does not list cifar10/train_0.npz" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stage_mod.verify(["c"], stage)
    assert "stage/c is missing: the call that carries it did not run on this machine" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stage", "tsai"], "give --data DATA"),
        (["stage", "tsai_resume", "--data", "{data}"], "give --resume DIR"),
        (["stage", "tsai_resume", "--data", "{data}", "--resume", "{tmp}"], "none of state.tar.part*, meta.tar.gz"),
        (["stage", "em", "--data", "{tmp}"], ""),  # EM's rendered set is made on the device: nothing to stage
        (["stage", "critique", "--data", "{tmp}"], "no checksums.sha256 there"),
        (["back"], "nothing to move back"),
        (["collect", "{tmp}"], "no meta.tar.gz"),
        (["collect", "{tmp}", "--rename", "a"], "--rename wants OLD=NEW"),
    ],
)
def test_bad_staging_arguments_are_one_line(stage_mod, data, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("CAPSULE_DATA", raising=False)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    argv = [a.format(data=data, tmp=tmp_path) for a in argv]
    base = ["--stage-dir", str(tmp_path / "stage"), "--repo", str(repo)]
    if message:
        with pytest.raises(SystemExit) as e:
            stage_mod.main([*base, *argv])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    else:
        assert stage_mod.main([*base, *argv]) == 0


def test_the_tracked_checkpoints_leave_the_checkout_and_come_back(stage_mod, tmp_path, capsys):
    repo = tmp_path / "repo"
    files = {"capsule_lib/checkpoints/a.pt": 3000, "book/_vendor/w.js": 2000, "capsule_lib/x.py": 100}
    for name, size in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(b"x" * size)
    (repo / "notes.txt").write_bytes(b"y" * 10)  # untracked, not ignored: it travels too
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", *files], check=True)
    assert stage_mod.travelling(repo) == 110  # the moved paths never count
    stage_mod.main(["--repo", str(repo), "--dry-run", "away"])
    assert (repo / "capsule_lib/checkpoints/a.pt").exists()
    stage_mod.main(["--repo", str(repo), "away"])
    assert not (repo / "capsule_lib/checkpoints/a.pt").exists() and not (repo / "book/_vendor").exists()
    assert (tmp_path / "repo.away" / "capsule_lib/checkpoints/a.pt").stat().st_size == 3000
    with pytest.raises(SystemExit):
        stage_mod.main(["--repo", str(repo), "away"])
    assert "run `back` first" in capsys.readouterr().err
    (repo / "capsule_lib/checkpoints/a.pt").write_bytes(b"x" * 3000)  # e.g. restored by git: the same content
    stage_mod.main(["--repo", str(repo), "back"])
    assert {n: (repo / n).stat().st_size for n in files} == files and not (tmp_path / "repo.away").exists()
    stage_mod.main(["--repo", str(repo), "away"])
    (repo / "capsule_lib/checkpoints/a.pt").write_bytes(b"other")
    with pytest.raises(SystemExit):
        stage_mod.main(["--repo", str(repo), "back"])
    assert "differs from the moved copy" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- what comes back
def test_a_call_returns_what_fits_and_stops_its_runs_at_the_deadline(items_mod, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    call = items_mod.Call("speedrun", out, work, True, ["x"])
    (work / "checkpoints").mkdir()
    for k in range(8):  # eight of 1 MiB and one over the 16 MiB a returned file may have
        (work / "checkpoints" / f"c{k}.pt").write_bytes(b"\0" * 2**20)
    (work / "checkpoints" / "big.pt").write_bytes(b"\0" * (17 * 2**20))
    script = "import signal, sys, time\nsignal.signal(signal.SIGINT, lambda *a: sys.exit(130))\ntime.sleep(60)"
    codes = call.run([[sys.executable, "-c", script]], 0.01, "dummy")
    assert codes == [130] and call.record["stopped_at_minutes"] == 0.01
    sent = sorted(p.name for p in out.iterdir())
    assert len(sent) == 8 and "meta.tar.gz" in sent and "big.pt" not in sent
    record = _meta(out, tmp_path / "meta")
    assert record["left_out"] == ["big.pt (17.0 MiB)", "c7.pt (1.0 MiB)"]
    assert (tmp_path / "meta" / "dummy_0.log").exists() and record["commands"][0].startswith(sys.executable)


def test_the_peak_table_knows_each_card_by_its_name(items_mod):
    peak = items_mod.peak_tflops
    assert peak("NVIDIA H200") == peak("NVIDIA H100 80GB HBM3") == items_mod.PEAK_TFLOPS["H100"]
    assert peak("NVIDIA H100 PCIe")["bf16"] == 756.0 and peak("NVIDIA H200 NVL")["tf32"] == 417.5
    assert peak("Intel(R) Xeon(R) Processor") is None


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["tsai"], 2, "give --out DIR or set OUT"),
        (["--out", "{tmp}/o", "tsai", "--set", "lr"], 2, "--set wants KEY=VALUE, got 'lr'"),
        (["--out", "{tmp}/o", "tsai", "--bogus"], 2, "unrecognised arguments: --bogus"),
        (["--out", "{tmp}/o", "tsai", "--budget", "0"], 2, "--budget must be a number of minutes > 0, got 0.0"),
        (["--out", "{tmp}/o", "critique", "--workers", "0"], 2, "--workers must be >= 1, got 0"),
        (["--out", "{tmp}/o", "speedrun", "1", "capsnet"], 2, "RECIPE: not a speedrun recipe: capsnet (one of"),
        (["--out", "{tmp}/o", "--quick", "tsai"], 3, "stage/a is missing"),
        pytest.param(
            ["--out", "{tmp}/o", "tsai"],
            2,
            "no CUDA device here; run it on the GPU, or with --quick on a CPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here"),
        ),
        (["--out", "{tmp}/o", "--quick", "speedrun", "1", "capsnet_speedrun"], 3, "stage/m is missing"),
    ],
)
def test_bad_item_arguments_are_one_line(items_mod, tmp_path, capsys, monkeypatch, argv, code, message):
    monkeypatch.delenv("OUT", raising=False)
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as e:
        items_mod.main(["--stage", str(tmp_path / "stage"), "--work", str(tmp_path / "work"), *argv])
    assert e.value.code == code and message in capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 3 or not (tmp_path / "o").exists()  # refused before anything is written


# ---------------------------------------------------------------------------------------------- the items, --quick
@pytest.fixture
def device_env(monkeypatch):
    """The environment of a device command run here: this checkout's capsule_lib, one thread per process."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("OUT", raising=False)


def _items(items_mod, *args) -> int:
    """``gpu_items.py ARGS`` in this process (its training runs in subprocesses, as on the device)."""
    return items_mod.main([str(a) for a in args])


@pytest.mark.slow
def test_tsai_runs_in_two_parts_and_its_checkpoint_is_rechecked_and_registered(
    stage_mod, items_mod, data, tmp_path, device_env, capsys
):
    stage, work = tmp_path / "stage", tmp_path / "work"
    common = ["--quick", "--stage", stage, "--work", work]
    sets = ["--set", "hold_epochs=2.0", "eval_subset=16"]  # no budget fit before the end
    registry = REPO / "capsule_lib" / "checkpoints" / "registry.json"
    shipped = hashlib.sha256(registry.read_bytes()).hexdigest()
    assert stage_mod.main(["--stage-dir", str(stage), "stage", "tsai", "--data", str(data)]) == 0
    assert (
        _items(items_mod, *common, "--out", tmp_path / "out1", "tsai", "--budget", "0.0005", *sets) == 0
    )  # stops early (0.03 s: within the first epoch)
    assert {"meta.tar.gz", "state.tar.part00"} <= {p.name for p in (tmp_path / "out1").iterdir()}
    args = ["--stage-dir", str(stage), "stage", "tsai_resume", "--data", str(data), "--resume", str(tmp_path / "out1")]
    assert stage_mod.main(args) == 0
    assert _items(items_mod, *common, "--out", tmp_path / "out2", "tsai", "--budget", "1", "--resume", *sets) == 0
    assert "resuming" in (work / "train_0.log").read_text()
    record = _meta(tmp_path / "out2", tmp_path / "meta")
    parts = record["parts"]
    assert [p["part"] for p in parts] == [1, 2] and 0 < parts[0]["to_epoch"] == parts[1]["from_epoch"] < 2
    assert parts[1]["to_epoch"] == 2 and all(p["hardware"] and p["torch"] for p in parts)
    (run,) = record["runs"]
    m = run["metrics"]
    assert {"val_errors", "test_errors", "test_exact_errors"} <= set(m) and m["test_exact_size"] == 16
    assert run["dataset"] == "cifar10" and run["generated_data"] is False  # the staged files, not a stand-in
    assert (
        "in 2 part(s)"
        in json.loads((tmp_path / "meta/checkpoints/registry.json").read_text())[run["checkpoint"]]["notes"]
    )

    scratch = tmp_path / "collect"
    args = ["--dry-run", "collect", str(tmp_path / "out2"), "--data-root", str(data), "--scratch", str(scratch)]
    assert stage_mod.main(args) == 0
    counts = f"val {m['val_errors']}/{m['val_errors']}, test {m['test_errors']}/{m['test_errors']}"
    assert counts in capsys.readouterr().out
    entry = json.loads((scratch / "checkpoints" / "registry.json").read_text())[run["checkpoint"]]
    assert "error counts equal the device's" in entry["notes"] and entry["file"] == f"{run['checkpoint']}.pt"
    (recorded,) = (scratch / "results").glob("gpu_tsai_*.json")
    call = json.loads(recorded.read_text())["calls"][0]
    assert call["registered"] == [run["checkpoint"]] and call["record"]["parts"] == parts
    assert hashlib.sha256(registry.read_bytes()).hexdigest() == shipped  # the dry run left the registry alone


@pytest.mark.slow
def test_the_speedrun_item_reports_the_flops_of_its_step(stage_mod, items_mod, data, tmp_path, device_env):
    stage = tmp_path / "stage"
    assert stage_mod.main(["--stage-dir", str(stage), "stage", "epoch", "--data", str(data)]) == 0
    args = ["--quick", "--stage", stage, "--work", tmp_path / "work", "--out", tmp_path / "out", "speedrun", "1"]
    assert _items(items_mod, *args, "baseline_cnn_speedrun", "--flops", "--tag", "check") == 0
    assert (tmp_path / "out" / "baseline_cnn_speedrun_check.pt").is_file()
    record = _meta(tmp_path / "out", tmp_path / "meta")
    (row,) = record["flops"]
    assert row["step_flops"] > 0 and row["steps_per_epoch"] == 64 // 16 and row["precision"] == "fp32"
    achieved = row["step_flops"] * row["steps_per_epoch"] / row["epoch_s_median"] / 1e12
    assert row["achieved_tflops"] == pytest.approx(achieved, rel=1e-2, abs=1e-3) and row["peak_tflops"] is None
    assert json.loads((tmp_path / "meta" / "speedrun.json").read_text())["runs"][0]["recipe"] == "baseline_cnn_speedrun"


@pytest.mark.slow
def test_the_critique_item_runs_the_critique_runs_script_and_skips_what_came_back(
    stage_mod, items_mod, data, tmp_path, device_env, capsys
):
    stage = tmp_path / "stage"
    assert stage_mod.main(["--stage-dir", str(stage), "stage", "critique", "--data", str(data)]) == 0
    args = ["--quick", "--stage", stage, "--work", tmp_path / "work", "--out", tmp_path / "out"]
    args += ["critique", "--workers", "1", "--minutes", "2"]
    if "--runs-dir" not in (BENCH / "critique_runs.py").read_text():  # before issue #57's script is merged
        with pytest.raises(SystemExit) as e:
            _items(items_mod, *args)
        assert e.value.code == 2 and "issue #57's version is needed" in capsys.readouterr().err
        return
    assert _items(items_mod, *args) == 0
    record = _meta(tmp_path / "out", tmp_path / "meta")
    (name,) = record["critique"]["done_now"]
    assert (tmp_path / "meta" / "critique" / name / "result.json").is_file()
    resume = ["stage", "critique_resume", "--data", str(data), "--resume", str(tmp_path / "out")]
    assert stage_mod.main(["--stage-dir", str(stage), *resume]) == 0
    args[args.index(tmp_path / "out")] = tmp_path / "out2"
    assert _items(items_mod, *args, "--resume") == 0
    assert _meta(tmp_path / "out2", tmp_path / "m2")["critique"]["before"] == [name]


# ---------------------------------------------------------------------------------------------- the library's part
def test_evaluation_metrics_counts_errors_per_set_and_two_digit_images_both_ways():
    from capsule_lib.data import ImageDataset
    from capsule_lib.train.shipped import evaluation_metrics

    class Fixed(torch.nn.Module):  # scores = the first 3 pixels: the predictions are known
        def forward(self, x):
            return x.flatten(1)[:, :3]

    x = torch.tensor([[0.9, 0.5, 0.1], [0.4, 0.8, 0.1], [0.1, 0.3, 0.7], [0.5, 0.9, 0.1]]).view(4, 1, 1, 3)
    one = ImageDataset("t", "test", x, torch.tensor([0, 1, 1, 0]), ["a", "b", "c"])  # predicted 0, 1, 2, 1
    two = ImageDataset("t", "test", x, torch.tensor([[0, 2], [1, 0], [2, 1], [1, 2]]), ["a", "b", "c"])
    m = evaluation_metrics(Fixed(), {"test": one, "pairs": two}, batch_size=3)
    assert (m["test_errors"], m["test_size"], m["test_acc"]) == (2, 4, 0.5)
    # the top two of each image: {0, 1}, {0, 1}, {1, 2}, {0, 1}: both digits in images 2 and 3, 6 of the 8 digits
    assert (m["pairs_errors"], m["pairs_acc"], m["pairs_per_digit"]) == (2, 0.5, 0.75)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda f, t: f.evaluation_metrics("model", {}), "evaluation_metrics: model must be a Module"),
        (lambda f, t: f.evaluation_metrics(t.nn.Identity(), [1]), "evaluation_metrics: sets must be a dict"),
        (lambda f, t: f.evaluation_metrics(t.nn.Identity(), {}, batch_size=0), "batch_size must be >= 1, got 0"),
        (lambda f, t: f.evaluation_metrics(t.nn.Identity(), {"val": 3}), "sets['val'] must be a dataset"),
    ],
)
def test_evaluation_metrics_refuses_bad_inputs_in_one_line(call, message):
    from capsule_lib.train import shipped

    with pytest.raises(ValueError, match=re.escape(message)):
        call(shipped, torch)


def test_run_summary_refuses_what_is_not_a_speedrun_export(tmp_path):
    from capsule_lib.train.timed import run_summary

    with pytest.raises(ValueError, match="name must be a speedrun recipe .* got 'capsnet'"):
        run_summary("capsnet", tmp_path, {})
    with pytest.raises(ValueError, match="entry must be an export's registry entry; it has no file, sha256, metrics"):
        run_summary("capsnet_speedrun", tmp_path, {})
    with pytest.raises(FileNotFoundError, match="history.json"):
        run_summary("capsnet_speedrun", tmp_path, {"file": "a.pt", "sha256": "0", "metrics": {}})
