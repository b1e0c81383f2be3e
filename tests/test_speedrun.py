"""The speedrun: data kept on the training device (the same batches as the plain loader), the speedrun recipes (the
papers' networks, only the training changed), the weights' moving average, the budget fit, the losses read once per
epoch, and the command itself in quick mode on the CPU."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from capsule_lib.commands.speedrun import main as speedrun_main
from capsule_lib.cost import count_parameters
from capsule_lib.data import TensorLoader, get_dataset
from capsule_lib.data.transforms import efficient_mnist_augment, random_shift, shift_images
from capsule_lib.losses import CapsuleObjective, StepOutput
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.pretrained import load_pretrained, sha256_file
from capsule_lib.train import History, Trainer, make_recipe
from capsule_lib.train.ema import WeightAverage
from capsule_lib.train.recipes.speedrun import SPEEDRUNS, SpeedrunRecipe

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))

#: what a speedrun recipe may change against its paper recipe: how it trains, never what it trains
TRAINING_FIELDS = {
    "epochs",
    "batch_size",
    "lr",
    "device_data",
    "ema",
    "compile",
    "matmul_precision",
    "warmup_epochs",
    "hold_epochs",
    "final_lr",
    "pairs_per_epoch",
}


@pytest.fixture(scope="module")
def glyphs():
    return get_dataset("glyph_digits", split="train", n=256), get_dataset("glyph_digits", split="val", n=128)


# ------------------------------------------------------------------------------------------------ recipes
@pytest.mark.parametrize("cls", SPEEDRUNS, ids=lambda c: c.name)
def test_a_speedrun_recipe_changes_how_its_paper_network_trains_not_what_it_trains(cls):
    fast, paper = make_recipe(cls.name), make_recipe(cls.paper_recipe)
    assert isinstance(fast, SpeedrunRecipe) and isinstance(fast, type(paper))
    changed = {f.name for f in dataclasses.fields(fast) if getattr(paper, f.name, object()) != getattr(fast, f.name)}
    allowed = TRAINING_FIELDS | ({"dataset"} if cls.name == "em_norb_speedrun" else set())  # the rendered set, named
    assert changed <= allowed, changed - allowed
    assert fast.model == paper.model
    assert count_parameters(fast.build_model()) == count_parameters(paper.build_model())
    assert type(fast.build_objective()) is type(paper.build_objective())
    assert fast.scheduler_step == "batch" and fast.thresholds and fast.minutes > 0


def test_the_speedrun_schedule_warms_up_holds_and_decays_to_its_floor():
    r = make_recipe("capsnet_speedrun", epochs=10, final_lr=0.05)
    r._steps_per_epoch = 100
    f = [r.lr_factor(s) for s in range(0, 1001)]
    assert f[0] == pytest.approx(0.1) and f[50] == pytest.approx(0.55) and f[100] == 1.0 and f[199] == 1.0
    assert all(a >= b for a, b in zip(f[200:], f[201:]))  # decays from epoch 2 on
    assert f[1000] == pytest.approx(0.05) and f[600] == pytest.approx(0.05 + 0.95 * 0.5)
    with pytest.raises(ValueError, match=r"capsnet_speedrun: need 0 <= warmup_epochs <= hold_epochs"):
        make_recipe("capsnet_speedrun", warmup_epochs=3.0)
    with pytest.raises(ValueError, match=r"capsnet_speedrun: ema must be null or a float in \(0, 1\)"):
        make_recipe("capsnet_speedrun", ema=1.5)


def test_the_budget_fit_sets_the_epochs_that_fit_once_the_peak_is_held():
    r = make_recipe("capsnet_speedrun", epochs=80)
    (fit,) = r.training_callbacks(budget_minutes=2.0)  # 120 s
    trainer = type("T", (), {"history": type("H", (), {"meta": {}})(), "epochs": 80})()
    fit(trainer, {"epoch": 1, "wall_time": 30.0, "epoch_time": 30.0})  # compile epoch: not yet
    assert trainer.epochs == 80 and r.epochs == 80
    fit(trainer, {"epoch": 2, "wall_time": 40.0, "epoch_time": 10.0})  # 80 s left at 10 s each: 7 more (90 %)
    assert trainer.epochs == r.epochs == 9
    assert trainer.history.meta["epochs_fitted"] == {
        "epochs": 9,
        "planned": 80,
        "at_epoch": 2,
        "epoch_time_s": 10.0,
        "budget_minutes": 2.0,
    }
    fit(trainer, {"epoch": 2, "wall_time": 40.0, "epoch_time": 1.0})  # once only
    assert trainer.epochs == 9
    (nofit,) = r.training_callbacks(None)  # no budget: no fit (the callback restores a fitted run on resume)
    other = type("T", (), {"history": type("H", (), {"meta": {}})(), "epochs": 80})()
    nofit(other, {"epoch": 2, "wall_time": 40.0, "epoch_time": 10.0})
    assert other.epochs == 80 and "epochs_fitted" not in other.history.meta
    assert make_recipe("capsnet").training_callbacks(2.0) == ()


# ------------------------------------------------------------------------------------------------ data on the device
def test_a_resident_loader_gives_the_same_batches_and_resumes_at_the_same_place(glyphs):
    tr, _ = glyphs
    aug = lambda b, g: (random_shift(b[0], 2, g), *b[1:])  # noqa: E731
    plain = TensorLoader.from_dataset(tr, 48, shuffle=True, seed=3, transform=aug)
    resident = TensorLoader.from_dataset(tr, 48, shuffle=True, seed=3, transform=aug, resident=True, drop_last=True)
    assert len(resident) == len(plain) - 1 == 256 // 48  # the smaller last batch is dropped
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        resident.set_epoch(epoch)
        for (xa, ya), (xb, yb) in zip(plain, resident):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    resident.set_epoch(1)
    it = iter(resident)
    next(it), next(it)
    state = resident.state()
    rest = [b[0] for b in it]
    resident.resume_at(state)
    assert all(torch.equal(a, b[0]) for a, b in zip(rest, resident, strict=True))


def test_augmentations_read_nothing_back_from_the_device_and_change_no_value(glyphs):
    x = glyphs[0].images[:64].float() / 255
    d = torch.randint(-3, 4, (2, 64), generator=torch.Generator().manual_seed(0))
    assert torch.equal(shift_images(x, d[0], d[1], bound=3), shift_images(x, d[0], d[1]))
    assert torch.equal(shift_images(x, d[0], d[1], bound=28), shift_images(x, d[0], d[1]))
    a = efficient_mnist_augment(x, torch.Generator().manual_seed(1))
    b = efficient_mnist_augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)


# ------------------------------------------------------------------------------------------------ moving average
def test_the_weight_average_follows_its_formula_copies_integer_buffers_and_round_trips():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ema = WeightAverage(model, 0.9)
    w0 = model[0].weight.detach().clone()
    expected = w0.clone()
    for t in (1, 2, 3):
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model[1].num_batches_tracked += 1
        ema.update()
        d = min(0.9, (1 + t) / (10 + t))
        expected = d * expected + (1 - d) * model[0].weight.detach()
    torch.testing.assert_close(ema.module[0].weight, expected)
    assert int(ema.module[1].num_batches_tracked) == 3 and not ema.module.training
    assert not any(p.requires_grad for p in ema.module.parameters())
    other = WeightAverage(model, 0.9)
    other.load_state_dict(ema.state_dict())
    assert other.steps == 3 and torch.equal(other.module[0].weight, ema.module[0].weight)
    with pytest.raises(ValueError, match=r"ema decay must be a float in \(0, 1\), got 1"):
        WeightAverage(model, 1)


def _trainer(out_dir, ema=0.9):
    torch.manual_seed(0)
    model = CapsNet(TINY)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    return Trainer(model, CapsuleObjective(), opt, device="cpu", out_dir=out_dir, seed=0, progress=False, ema=ema)


def _loaders(glyphs):
    tr, va = glyphs
    aug = lambda b, g: (random_shift(b[0], 2, g), *b[1:])  # noqa: E731
    train = TensorLoader.from_dataset(tr, 64, shuffle=True, seed=0, transform=aug, resident=True, drop_last=True)
    return train, TensorLoader.from_dataset(va, 128, resident=True)


def test_a_run_with_a_moving_average_selects_it_and_resumes_mid_epoch_exactly(tmp_path, glyphs, monkeypatch):
    straight = _trainer(tmp_path / "a")
    straight.fit(*_loaders(glyphs), epochs=2)
    best = torch.load(tmp_path / "a" / "best.pt", weights_only=False)
    for k, v in straight.ema.module.state_dict().items():  # best.pt holds the average that was validated
        if best["epoch"] == 2:
            assert torch.equal(best["model"][k], v), k

    import capsule_lib.train.trainer as training

    clock = {"t": 1_000_000.0}
    monkeypatch.setattr(training.time, "time", lambda: clock["t"])
    stopped = _trainer(tmp_path / "b")
    base = stopped.objective

    def ten_seconds_a_batch(model, batch, train):
        clock["t"] += 10.0 if train else 0.0
        return base(model, batch, train)

    stopped.objective = ten_seconds_a_batch
    stopped.fit(*_loaders(glyphs), epochs=2, budget_minutes=1.0)  # 6 batches: epoch 1 and 2 of the 4 of epoch 2
    assert [r["epoch"] for r in stopped.history.records] == [1, 1.5]
    monkeypatch.undo()
    resumed = _trainer(tmp_path / "b")
    resumed.fit(*_loaders(glyphs), epochs=2)
    for a, b in ((straight.model, resumed.model), (straight.ema.module, resumed.ema.module)):
        for (k, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=k)
    assert resumed.ema.steps == straight.ema.steps == 2 * 4
    assert resumed.history.records[-1]["val_acc"] == pytest.approx(straight.history.records[-1]["val_acc"])


def test_a_resumed_fitted_run_trains_to_its_fitted_epochs_on_the_same_schedule(tmp_path, glyphs):
    first, fitted = _trainer(tmp_path), {"epochs": 2, "planned": 80, "at_epoch": 1, "epoch_time_s": 1.0}
    first.history.meta["epochs_fitted"] = fitted  # what the budget fit records (another session's run, say)
    first.fit(*_loaders(glyphs), epochs=1)
    r = make_recipe("capsnet_speedrun", epochs=80)
    again = _trainer(tmp_path)
    again.callbacks = list(r.training_callbacks(None))  # resumed without a budget: no new fit
    again.fit(*_loaders(glyphs), epochs=3)
    assert again.epoch == again.epochs == r.epochs == 2  # not the 3 asked for, nor the recipe's 80
    assert [rec["epoch"] for rec in again.history.records] == [1, 2]


def test_losses_are_read_once_per_every_batches_and_a_non_finite_one_still_stops_the_run(glyphs):
    reads = []

    calls = []

    class NaNAtBatch6:
        def __call__(self, model, batch, train):
            calls.append(1)
            loss = model(batch[0].float()).sum() * 0.0 + (float("nan") if len(calls) == 6 else 0.0)
            return StepOutput(loss, {}, torch.tensor(0), batch[0].shape[0])

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    loader = TensorLoader([glyphs[0].images[:64], glyphs[0].labels[:64]], 8)  # 8 batches
    t = Trainer(model, NaNAtBatch6(), torch.optim.SGD(model.parameters(), 0.1), device="cpu", progress=False)
    t.read_every = 4
    original = t._check_finite

    def counted(*args):
        reads.append(args)
        return original(*args)

    t._check_finite = counted
    with pytest.raises(FloatingPointError, match=r"^epoch 1, one of batches 5-8: the training loss is nan"):
        t.fit(loader, epochs=1)
    assert [(since, pos) for _, since, pos in reads] == [(1, 4), (5, 8)]


# ------------------------------------------------------------------------------------------------ the command
def test_time_to_reads_the_first_crossing_of_each_threshold():
    recs = [{"wall_time": 10.0, "val_acc": 0.98}, {"wall_time": 20.0, "val_acc": 0.995}, {"wall_time": 30.0}]
    assert History(recs).time_to((0.99, 0.995, 0.997)) == {"0.99": 20.0, "0.995": 20.0, "0.997": None}


def test_the_speedrun_command_runs_exports_and_reports_in_quick_mode(tmp_path, capsys):
    out = tmp_path / "sr"
    speedrun_main(
        [
            "--minutes",
            "3",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--quick",
            "--offline",
            "--data-root",
            str(tmp_path / "no_data"),
            "--set",
            "seed=1",
            "capsnet_speedrun",
            "em_norb_speedrun",
        ]
    )
    said = capsys.readouterr().out
    assert "speedrun: 2 of 2 runs done" in said
    report = json.loads((out / "speedrun.json").read_text())
    assert report["machine"]["device"] == "cpu" and report["quick"] is True
    names = [r["recipe"] for r in report["runs"]]
    assert names == ["capsnet_speedrun", "em_norb_speedrun"]
    for run in report["runs"]:
        assert run["checkpoint"] == f"{run['recipe']}_quick" and run["epochs_trained"] == 2
        assert set(run["time_to_val"]) == {f"{t:g}" for t in make_recipe(run["recipe"]).thresholds}
        assert run["budget_minutes"] > 0 and run["train_wall_s"] <= run["total_s"]
        assert sha256_file(out / "checkpoints" / run["file"]) == run["sha256"]
        model, entry = load_pretrained(run["checkpoint"], directory=out / "checkpoints")
        assert entry["metrics"]["val_size"] == 32 and entry["training"]["ema"] == 0.999
        assert entry["training"]["seed"] == 1 and report["overrides"] == {"seed": "1"}
        assert run["generated_data"] is True  # offline: the stand-ins, and the record says so
    with pytest.raises(SystemExit):
        speedrun_main(["--minutes", "1", "--out", str(out), "capsnet"])  # a paper recipe is not a speedrun
    assert "not a speedrun recipe: capsnet" in capsys.readouterr().err


def test_the_cpu_speedrun_benchmark_runs_in_quick_mode(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "speedrun_cpu.py"
    out = tmp_path / "cpu.json"
    cmd = [sys.executable, str(script), "--quick", "--threads", "1", "--out", str(out), "--work", str(tmp_path / "w")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["steps"]) == {"capsnet_speedrun", "efficient_speedrun"}
    assert all(s["fp32_s"] > 0 and s["bf16_s"] > 0 for s in report["steps"].values())
    assert report["speedrun"]["runs"][0]["recipe"] == "capsnet_speedrun" and "cpu_flags" in report


def test_the_results_page_lists_every_speedrun_recipe_and_each_shipped_runs_time_to_accuracy():
    from capsule_lib.pretrained import load_pretrained_history, registry
    from capsule_lib.results import SPEEDRUN_HEADERS, speedrun_histories, speedrun_rows

    rows = speedrun_rows()
    assert all(len(r) == len(SPEEDRUN_HEADERS) for r in rows)
    shipped = speedrun_histories()
    assert shipped and all(load_pretrained_history(n).meta["recipe"].endswith("speedrun") for n in shipped)
    text = "\n".join(" | ".join(r) for r in rows).replace("<wbr>", "")
    for cls in SPEEDRUNS:
        assert cls.name in text
    for name, hist in shipped.items():
        row = next(r for r in rows if r[0].replace("<wbr>", "") == f"<code>{name}</code>")
        first = hist.time_to(make_recipe(hist.meta["recipe"]).thresholds)
        assert row[3].count("<br>") == len(first) - 1
        assert f"{100 * registry()[name]['metrics']['test_acc']:.2f}" in row[4]


def test_a_run_without_time_left_is_skipped_and_never_shown_a_negative_budget(tmp_path, capsys):
    """#64: ``--minutes 0.01`` printed a negative training budget for every run."""
    from capsule_lib.train.timed import run_speedrun

    result = run_speedrun(["em_norb_speedrun"], 0.5, tmp_path / "sr", device="cpu", quick=True, offline=True)
    said = capsys.readouterr().out
    assert "training budget -" not in said and "em_norb_speedrun: skipped: no time left" in said, said
    assert result["runs"][0]["skipped"].startswith("no time left (cap 0.")
