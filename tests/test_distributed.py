"""Training under ``torchrun`` with 2 CPU processes (gloo): the same results as one process with the same global
batch, the same parameters on every rank, resume after a failure, and a failing rank that ends the job."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from capsule_lib.models import CapsNetConfig
from capsule_lib.train import train

pytestmark = pytest.mark.slow

TINY = dict(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))
#: 128 training images in global batches of 32 (16 per process), no augmentation: 4 steps per epoch
RUN = dict(batch_size=32, train_subset=128, eval_subset=64, max_shift=0, lr_decay_steps=2, device="cpu")

SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import torch

    from capsule_lib.models import CapsNetConfig
    from capsule_lib.train import train
    from capsule_lib.train import Trainer

    out, root, epochs, fail = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "fail"
    RUN.update(json.loads(sys.argv[5]))
    if fail:  # rank 1 dies at the start of epoch 2, after epoch 1 was checkpointed
        real = Trainer.train_epoch

        def train_epoch(self, loader):
            if self.dist.rank == 1 and self.epoch == 1:
                raise RuntimeError("rank 1 failed on purpose")
            return real(self, loader)

        Trainer.train_epoch = train_epoch
    model, trainer = train("capsnet", epochs=epochs, model=CapsNetConfig(**TINY), **RUN, out_dir=out, data_root=root,
                           offline=True, progress=False, test=False)
    torch.save(model.state_dict(), f"{out}/rank{trainer.dist.rank}.pt")
    """
)


def _torchrun(tmp_path, out, epochs, fail=False, timeout=240, **overrides):
    script = tmp_path / "job.py"
    script.write_text(f"TINY = {TINY!r}\nRUN = {RUN!r}\n" + SCRIPT)
    env = {**os.environ, "CAPSULE_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(out),
        str(tmp_path / "data"),
        str(epochs),
        "fail" if fail else "ok",
        json.dumps(overrides),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted 2-epoch job on 2 processes, shared by the tests below (each torchrun launch costs
    seconds of process start-up)."""
    tmp = tmp_path_factory.mktemp("ddp")
    res = _torchrun(tmp, tmp / "straight", epochs=2)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return tmp / "straight"


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path, monkeypatch, straight):
    r0, r1 = _weights(straight / "rank0.pt"), _weights(straight / "rank1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # every rank holds the same parameters
    torch.set_num_threads(1)
    single, trainer = train(
        "capsnet",
        epochs=2,
        model=CapsNetConfig(**TINY),
        **RUN,
        out_dir=tmp_path / "one",
        data_root=str(tmp_path / "data"),
        offline=True,
        progress=False,
        test=False,
    )
    worst = max((single.state_dict()[k] - r0[k]).abs().max().item() for k in r0)
    assert worst < 1e-5, f"largest parameter difference 1 vs 2 processes: {worst:.2e}"
    h1 = json.loads((tmp_path / "one" / "history.json").read_text())
    h2 = json.loads((straight / "history.json").read_text())
    assert h2["meta"]["world_size"] == 2 and h2["meta"]["batch_size_per_process"] == 16
    for epoch in range(2):
        for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
            assert h1["records"][epoch][key] == pytest.approx(h2["records"][epoch][key], rel=1e-5, abs=1e-6), key
    # the checkpoint is in the single-process format: it loads into a plain model
    best = torch.load(straight / "best.pt", map_location="cpu", weights_only=False)["model"]
    assert set(best) == set(single.state_dict()) and not any(k.startswith("module.") for k in best)


def test_a_failing_rank_ends_the_job_and_the_same_command_resumes_it(tmp_path, straight):
    failed = _torchrun(tmp_path, tmp_path / "run", epochs=2, fail=True)
    assert failed.returncode != 0
    assert "rank 1 failed on purpose" in failed.stdout + failed.stderr
    last = torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=False)
    assert last["epoch"] == 1  # the last complete epoch was checkpointed before the failure
    resumed = _torchrun(tmp_path, tmp_path / "run", epochs=2)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    a, b = _weights(tmp_path / "run" / "rank0.pt"), _weights(straight / "rank0.pt")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run differs from the uninterrupted one"
    h = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [r["epoch"] for r in h["records"]] == [1, 2]


def test_bf16_autocast_trains_under_two_processes(tmp_path):
    res = _torchrun(tmp_path, tmp_path / "bf16", epochs=1, amp="bf16")
    assert res.returncode == 0, res.stderr[-4000:]
    r0, r1 = _weights(tmp_path / "bf16" / "rank0.pt"), _weights(tmp_path / "bf16" / "rank1.pt")
    assert all(torch.equal(r0[k], r1[k]) for k in r0) and all(torch.isfinite(v).all() for v in r0.values())
    rec = json.loads((tmp_path / "bf16" / "history.json").read_text())
    assert rec["meta"]["amp"] == "bf16" and math.isfinite(rec["records"][0]["train_loss"])
