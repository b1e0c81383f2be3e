"""The reader's own images (capsule_lib.data.images, image_folder, image_files): layouts, splits, decisions,
fingerprints, the cache, every bad input of issue #58 in one line with nothing left behind, tensors in memory,
recipes fitted to the data, the commands (--images, predict) and a tiny train-then-predict."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from capsule_lib.data import DataSource, get_dataset, image_facts, register_images
from capsule_lib.data import images as images_module
from capsule_lib.data.image_files import BadImageError, FileImages, decode_files, list_image_files, read_image
from capsule_lib.data.image_folder import ImageSource
from capsule_lib.data.loaders import StreamLoader, TensorLoader
from capsule_lib.models.registry import smallest_image_size
from capsule_lib.train import RunMismatchError, make_recipe, train

pytestmark = pytest.mark.usefixtures("one_thread")

#: tiny networks of each family that reads images (model fields; classes, channels and size come from the data)
TINY = {
    "capsnet": {
        "model.conv_channels": 8,
        "model.primary_types": 2,
        "model.class_dim": 4,
        "model.decoder_hidden": [8, 8],
    },
    "baseline_cnn": {"model.channels": [4, 4, 4], "model.hidden": [8, 8]},
    "routing_compare_mnist": {"model.stem_channels": [4, 8], "model.primary_types": 2, "model.caps_dim": 4},
}


@pytest.fixture(autouse=True)
def _fresh():
    """Each test reads its folders anew (the module remembers the last folders of the process)."""
    images_module._LOADED.clear()
    yield
    images_module._LOADED.clear()


def _png(path: Path, size: int | tuple[int, int] = 12, mode: str = "RGB", seed: int = 0) -> Path:
    w, h = (size, size) if isinstance(size, int) else size
    rng = np.random.default_rng(seed)
    shape = (h, w) if mode == "L" else (h, w, 4 if mode == "RGBA" else 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)
    return path


def _folder(root: Path, counts: dict[str, int], size: int = 12, mode: str = "RGB") -> Path:
    for k, (name, n) in enumerate(counts.items()):
        for i in range(n):
            _png(root / name / f"{i:03d}.png", size, mode, seed=100 * k + i)
    return root


def _spec(path: Path, **options) -> str:
    return ImageSource(str(path), **options).spec


# ------------------------------------------------------------------------------------------------ layouts, splits
def test_a_folder_per_class_gives_sorted_classes_and_seeded_splits_of_each_class(tmp_path):
    root = _folder(tmp_path / "pics", {"dog": 10, "cat": 10, "émeu": 10})
    tr, va, te = (get_dataset(_spec(root), None, s) for s in ("train", "val", "test"))
    assert tr.classes == ["cat", "dog", "émeu"] and tr.images.dtype == torch.uint8
    assert tuple(tr.images.shape[1:]) == (3, 12, 12) and (len(tr), len(va), len(te)) == (24, 3, 3)
    assert sorted(va.labels.tolist()) == [0, 1, 2] and sorted(te.labels.tolist()) == [0, 1, 2]  # one of each class
    assert len(get_dataset(_spec(root), None, "train_full")) == 27
    rec = tr.extra["images"]
    assert rec["split_sizes"] == {"train": 24, "val": 3, "test": 3} and rec["options"]["split_seed"] == 0
    again = get_dataset(_spec(root), None, "val")
    assert torch.equal(again.images, va.images)  # the same files every time
    images_module._LOADED.clear()
    other = get_dataset(_spec(root, split_seed=1), None, "val")
    assert not torch.equal(other.images, va.images) and other.extra["images"]["options"]["split_seed"] == 1


def test_split_folders_are_kept_and_the_missing_one_is_held_out(tmp_path):
    root = tmp_path / "pics"
    _folder(root / "train", {"a": 10, "b": 10})
    _folder(root / "test", {"a": 2, "b": 3})
    _folder(root / "valid", {"a": 1, "b": 1})
    sizes = {s: len(get_dataset(_spec(root), None, s)) for s in ("train", "val", "test")}
    assert sizes == {"train": 20, "val": 2, "test": 5}  # all three given: nothing held out
    images_module._LOADED.clear()
    import shutil

    shutil.rmtree(root / "valid")
    tr = get_dataset(_spec(root, val_fraction=0.2), None, "train")
    assert (len(tr), len(get_dataset(_spec(root, val_fraction=0.2), None, "val"))) == (16, 4)
    assert "split folders test/, train/" in tr.extra["images"]["layout"] or "train/" in tr.extra["images"]["layout"]
    assert len(get_dataset(_spec(root, val_fraction=0.2), None, "test")) == 5  # the given test split, untouched


def test_grey_files_give_one_channel_and_a_mixed_folder_is_converted_and_counted(tmp_path):
    grey = _folder(tmp_path / "grey", {"a": 3, "b": 3}, mode="L")
    assert image_facts(_spec(grey)).channels == 1
    mixed = _folder(tmp_path / "mixed", {"a": 4, "b": 4})
    _png(mixed / "a" / "grey.png", mode="L")
    _png(mixed / "b" / "alpha.png", mode="RGBA")
    facts = image_facts(_spec(mixed))
    assert facts.channels == 3 and facts.record["grey_to_rgb"] == 1
    assert image_facts(_spec(mixed, channels=1)).record["colour_to_grey"] == 9  # 8 RGB + 1 RGBA made grey
    x = read_image(mixed / "a" / "grey.png", 12, 3)
    assert x.shape == (3, 12, 12) and (x[0] == x[1]).all() and (x[1] == x[2]).all()  # PIL's L -> RGB


def test_the_size_is_the_most_common_side_resized_and_centre_cropped_and_counted(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 5, "b": 5}, size=16)
    _png(root / "a" / "wide.png", (40, 20))
    facts = image_facts(_spec(root))
    assert (
        facts.image_size == 16
        and facts.record["resized"] == 1
        and "most common shorter side" in facts.record["size_rule"]
    )
    assert image_facts(_spec(root, image_size=8)).record["resized"] == 11
    # the resize: shorter side to the size, then the middle square (a 40 x 20 image keeps its middle 20 columns)
    wide = np.asarray(Image.open(root / "a" / "wide.png"))  # [20, 40, 3]
    assert np.array_equal(read_image(root / "a" / "wide.png", 20), wide[:, 10:30].transpose(2, 0, 1))


def test_the_decisions_are_said_in_one_line_and_normalisation_is_the_training_splits(tmp_path, capsys):
    root = _folder(tmp_path / "pics", {"a": 10, "b": 10})
    tr = get_dataset(_spec(root), None, "train")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[your images]")]
    assert len(said) == 1 and "12 x 12" in said[0] and "RGB" in said[0] and "16 / 2 / 2" in said[0]
    x = tr.images.double() / 255
    assert tr.extra["images"]["mean"] == pytest.approx(x.mean((0, 2, 3)).tolist(), abs=1e-4)
    assert tr.extra["images"]["std"] == pytest.approx(x.std((0, 2, 3), unbiased=False).tolist(), abs=1e-4)


def test_unicode_class_and_file_names_work(tmp_path):
    root = tmp_path / "画像 フォルダ"
    _png(root / "猫" / "ネコ 1.png")
    for i in range(4):
        _png(root / "猫" / f"{i}.png", seed=i)
        _png(root / "chien é" / f"ü{i}.png", seed=10 + i)
    facts = image_facts(_spec(root))
    assert facts.classes == ["chien é", "猫"] and facts.record["files"] == 9


def test_the_spec_round_trips_its_options_and_a_question_mark_of_the_folder(tmp_path):
    src = ImageSource(
        "a/b", image_size=32, channels=1, val_fraction=0.2, test_fraction=0.05, split_seed=3, skip_bad=True
    )
    assert ImageSource.parse(src.spec) == src and ImageSource("x").spec == "images:x"
    assert ImageSource.parse("images:why?not").path == "why?not"
    for bad, message in [
        ({"image_size": 0}, "image_size must be a positive integer"),
        ({"channels": 2}, "channels must be 1 (grey), 3 (RGB)"),
        ({"val_fraction": 0}, "val_fraction must be > 0"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "must leave training images"),
        ({"test_fraction": 1.5}, "test_fraction must be a number in [0, 1)"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            ImageSource("x", **bad)


# ------------------------------------------------------------------------------------------ cache and fingerprint
def test_the_cache_is_written_when_the_data_is_used_reused_and_rebuilt_when_not_to_be_trusted(
    tmp_path, capsys, monkeypatch
):
    root = _folder(tmp_path / "pics", {"a": 6, "b": 6})
    source = DataSource(cache=tmp_path / "cache")
    first = image_facts(_spec(root), source)
    assert not (tmp_path / "cache").exists()  # read, not yet accepted: nothing written
    get_dataset(_spec(root), source, "train")
    files = list((tmp_path / "cache").glob("*.pt"))
    assert len(files) == 1 and "decoded now" in first.record["stored"]
    images_module._LOADED.clear()
    again = image_facts(_spec(root), source)
    assert "read from the cache" in again.record["stored"] and again.mean == first.mean
    for spoil, why in [
        (lambda: monkeypatch.setattr("capsule_lib.data.image_folder._version", lambda: "0.0.1"), "another version"),
        (lambda: files[0].write_bytes(b"not a cache"), "unreadable"),
    ]:
        spoil()
        images_module._LOADED.clear()
        capsys.readouterr()
        rebuilt = image_facts(_spec(root), source)
        assert "decoded now" in rebuilt.record["stored"] and why in capsys.readouterr().out
        get_dataset(_spec(root), source, "train")  # writes the rebuilt cache
    _png(root / "a" / "000.png", seed=999)  # other pixels: another key, another cache file
    images_module._LOADED.clear()
    assert "decoded now" in image_facts(_spec(root), source).record["stored"]


def test_a_cache_whose_images_were_altered_is_rebuilt(tmp_path, capsys):
    from capsule_lib.data.image_files import load_cache, save_cache

    path = tmp_path / "c.pt"
    save_cache(path, "k", "v", {"images": torch.zeros(2, 1, 4, 4, dtype=torch.uint8)})
    assert load_cache(path, "k", "v") is not None and load_cache(path, "other", "v") is None
    data = torch.load(path, weights_only=True)
    data["images"][0, 0, 0, 0] = 7
    torch.save(data, path)
    assert load_cache(path, "k", "v") is None and "damaged" in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_records_the_images_fingerprint_and_refuses_to_resume_onto_other_images(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 6, "b": 6})
    kw = dict(dataset=_spec(root), epochs=1, device="cpu", progress=False, out_dir=tmp_path / "runs" / "r")
    _, trainer = train("baseline_cnn", **kw, **TINY["baseline_cnn"])
    meta = trainer.history.meta
    assert meta["images"]["classes"] == ["a", "b"] and meta["classes"] == ["a", "b"] and meta["data_fingerprint"]
    assert meta["config"]["model"]["n_classes"] == 2 and meta["config"]["model"]["in_channels"] == 3
    assert len(list((tmp_path / "runs" / "image_cache").glob("*.pt"))) == 1  # next to the run
    _png(root / "b" / "000.png", seed=1234)
    images_module._LOADED.clear()
    with pytest.raises(RunMismatchError):
        train("baseline_cnn", **{**kw, "epochs": 2}, **TINY["baseline_cnn"])


# ------------------------------------------------------------------------------------------------------ bad input
def _refused(tmp_path: Path, spec: str, error: type, message: str, recipe: str = "baseline_cnn") -> None:
    """``spec`` is refused in one line naming ``message``, before a run folder or a cache is written."""
    runs = tmp_path / "runs"
    with pytest.raises(error) as e:
        train(recipe, dataset=spec, epochs=1, device="cpu", progress=False, out_dir=runs / "r", **TINY[recipe])
    text = str(e.value)
    assert message in text and "\n" not in text, text
    assert not runs.exists(), sorted(runs.rglob("*"))


def test_a_path_that_does_not_exist_or_is_a_file_is_refused(tmp_path):
    _refused(tmp_path, _spec(tmp_path / "nowhere"), FileNotFoundError, f"{tmp_path / 'nowhere'}: no such folder")
    _png(tmp_path / "one.png")
    _refused(tmp_path, _spec(tmp_path / "one.png"), NotADirectoryError, "one.png: not a folder")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs file permissions (not root)")
def test_a_folder_that_cannot_be_read_is_refused(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 3, "b": 3})
    (root / "b").chmod(0)
    try:
        _refused(tmp_path, _spec(root), PermissionError, f"{root / 'b'}: cannot be read (permission denied)")
    finally:
        (root / "b").chmod(0o755)


def test_a_folder_that_cannot_be_read_is_refused_whoever_runs_the_test(tmp_path, monkeypatch):
    import capsule_lib.data.image_folder as folder

    root = _folder(tmp_path / "pics", {"a": 3, "b": 3})
    monkeypatch.setattr(folder.os, "access", lambda path, mode: Path(path).name != "b")
    _refused(tmp_path, _spec(root), PermissionError, f"{root / 'b'}: cannot be read (permission denied); make it")
    images_module._LOADED.clear()

    def denied(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder.os, "scandir", denied)
    _refused(tmp_path, _spec(root), PermissionError, f"{root}: cannot be read (permission denied)")


def test_an_empty_folder_and_loose_files_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(tmp_path, _spec(tmp_path / "empty"), ValueError, "empty; put each class's images in a folder of its own")
    _png(tmp_path / "loose" / "x.png")
    _refused(tmp_path, _spec(tmp_path / "loose"), ValueError, "has image files but no class folders")


def test_one_class_and_a_class_without_images_are_refused(tmp_path):
    one = _folder(tmp_path / "one", {"cat": 4})
    _refused(tmp_path, _spec(one), ValueError, "one class (cat); a classifier needs at least two class folders")
    two = _folder(tmp_path / "two", {"cat": 4})
    (two / "dog").mkdir()
    (two / "dog" / "notes.txt").write_text("no images here")
    _refused(tmp_path, _spec(two), ValueError, "the class folder 'dog' has no training images")
    facts = image_facts(_spec(_folder(tmp_path / "three", {"x": 3, "y": 3})))
    assert facts.record["ignored"] == {}


def test_a_file_that_is_not_an_image_or_is_truncated_is_named_or_skipped_and_counted(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 10, "b": 10})
    (root / "a" / "text.png").write_text("I am not a PNG")
    _refused(tmp_path, _spec(root), ValueError, "text.png: not an image or damaged")
    cut = _png(root / "b" / "cut.png", 64, seed=5)
    cut.write_bytes(cut.read_bytes()[:200])
    (root / "a" / "text.png").unlink()
    images_module._LOADED.clear()
    _refused(tmp_path, _spec(root), ValueError, "cut.png: not an image or damaged")
    (root / "a" / "text.png").write_text("I am not a PNG")
    images_module._LOADED.clear()
    facts = image_facts(_spec(root, skip_bad=True))
    assert facts.record["skipped"] == 2 and sorted(facts.record["skipped_files"]) == ["a/text.png", "b/cut.png"]
    assert facts.record["files"] == 20 and "2 unreadable skipped" in images_module.describe_images(facts.record)


def test_images_smaller_than_the_network_meet_it_behind_its_stem_and_a_stem_too_small_says_the_smallest(tmp_path):
    """Since #63 a recipe puts its paper network behind an image stem (``stem_side``): 12 x 12 images are upsampled to
    CapsNet's 28; a ``stem_side`` smaller than the network reads is refused in one line naming the smallest side."""
    root = _folder(tmp_path / "pics", {"a": 5, "b": 5}, size=12)
    r = make_recipe("capsnet", **TINY["capsnet"])
    r.fit_to_images(image_facts(_spec(root)))
    assert (r.model.image_size, r.model.stem_side) == (12, 28)
    runs = tmp_path / "runs"
    with pytest.raises(ValueError) as e:
        train(
            "capsnet",
            dataset=_spec(root),
            device="cpu",
            progress=False,
            out_dir=runs / "r",
            **{**TINY["capsnet"], "model.stem_side": 16},
        )
    assert "stem_side 16 is too small for capsnet, whose convolutions need at least 17 x 17" in str(e.value)
    assert "\n" not in str(e.value) and not runs.exists()
    assert {k: smallest_image_size(make_recipe(k).model_kind, make_recipe(k).model) for k in TINY} == {
        "capsnet": 17,
        "baseline_cnn": 4,
        "routing_compare_mnist": 5,
    }
    assert smallest_image_size("efficient_capsnet", make_recipe("efficient").model) == 27
    assert smallest_image_size("caps_model", make_recipe("tsai_cifar10_cpu").model) == 13


def test_train_and_test_folders_with_other_classes_are_refused(tmp_path):
    root = tmp_path / "pics"
    _folder(root / "train", {"a": 4, "b": 4})
    _folder(root / "test", {"a": 2, "c": 2})
    _refused(tmp_path, _spec(root), ValueError, "have different classes (b, c in one only)")
    mixed = tmp_path / "mixed"
    _folder(mixed / "train", {"a": 4, "b": 4})
    _folder(mixed, {"cats": 2})
    _refused(tmp_path, _spec(mixed), ValueError, "mixes split folders (train) with class folders (cats)")


def test_too_few_images_for_a_held_out_split_are_refused(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 2, "b": 2})
    _refused(tmp_path, _spec(root), ValueError, "the class 'a' has 2 images (2 train / 0 val / 0 test)")


# ------------------------------------------------------------------------------------- small classes (issue #64)
def test_a_class_too_small_for_a_validation_and_a_test_image_is_refused_naming_it(tmp_path):
    """A folder of 1 + 12 images: the one image's class would get no validation or test image (and the large class
    alone would report the accuracy); refused in one line naming the class, its images and what it needs."""
    root = _folder(tmp_path / "pics", {"big": 12, "tiny": 1})
    _refused(tmp_path, _spec(root), ValueError, "the class 'tiny' has 1 image (1 train / 0 val / 0 test)")
    _refused(tmp_path, _spec(root), ValueError, "it needs at least 3")
    split = _folder(tmp_path / "split", {"train/a": 5, "train/b": 5, "val/a": 2})
    (split / "val" / "b").mkdir()
    _refused(tmp_path, _spec(split), ValueError, "the class 'b' has 5 images (4 train / 0 val / 1 test)")
    _refused(tmp_path, _spec(split), ValueError, "(val/ included)")


def test_keep_small_keeps_the_class_and_says_so(tmp_path, capsys):
    root = _folder(tmp_path / "pics", {"big": 12, "tiny": 1})
    facts = image_facts(_spec(root, keep_small=True))
    assert facts.record["small_classes_kept"] == ["tiny"] and facts.record["class_split_sizes"]["tiny"] == [1, 0, 0]
    line = capsys.readouterr().out
    assert "kept without a validation or test image (keep_small): tiny" in line and "tiny 1/0/0" in line
    assert ImageSource.parse(_spec(root, keep_small=True)).keep_small
    with pytest.raises(ValueError, match="the class 'b' has 2 images"):
        register_images("small64", torch.zeros(8, 1, 4, 4), torch.tensor([0] * 6 + [1] * 2), ["a", "b"])
    register_images("small64", torch.zeros(8, 1, 4, 4), torch.tensor([0] * 6 + [1] * 2), ["a", "b"], keep_small=True)
    assert "keep_small): b" in capsys.readouterr().out


def test_the_summary_line_states_each_classs_split_sizes(tmp_path, capsys):
    root = _folder(tmp_path / "pics", {"a": 10, "b": 20})
    facts = image_facts(_spec(root))
    assert facts.record["class_split_sizes"] == {"a": [8, 1, 1], "b": [16, 2, 2]}
    assert "per class a 8/1/1, b 16/2/2" in capsys.readouterr().out
    many = {"classes": [str(k) for k in range(10)], "class_split_sizes": {str(k): [8, 1, 1] for k in range(10)}}
    many["class_split_sizes"]["7"] = [3, 1, 1]
    line = images_module.describe_images({**facts.record, **many})
    assert "per class 3-8 / 1-1 / 1-1 (fewest: 7 3/1/1)" in line


def test_tiny_images_enlarged_beyond_four_times_are_counted_and_said(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 6, "b": 6}, size=12)
    for i in range(3):
        _png(root / "a" / f"{i:03d}.png", 1, seed=i)  # 1 x 1 images, enlarged to 12 x 12
    facts = image_facts(_spec(root))
    assert facts.record["upsampled"] == 3 and facts.image_size == 12
    assert "3 of them enlarged more than 4x" in images_module.describe_images(facts.record)
    large = image_facts(_spec(root, image_size=80))  # read while training: counted from the headers
    assert large.record["upsampled"] == 12
    register_images("tiny64", torch.zeros(6, 1, 2, 2), torch.tensor([0, 1] * 3), ["a", "b"], image_size=12)
    assert images_module._MEMORY["tiny64"]["record"]["upsampled"] == 6


# ----------------------------------------------------------------------------- the cache by content (issue #64)
def _bmp(path: Path, value: int) -> None:
    """An uncompressed 12 x 12 file: other pixels give the same size, so an edit keeps size and (restored) mtime."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 12, 3), value, np.uint8)).save(path, format="BMP")


def _new_process() -> None:
    """Forget what this process read (as a new process would start)."""
    import capsule_lib.data.image_folder as folder

    images_module._LOADED.clear()
    folder._DIGESTS.clear()
    folder._INDEX_READ.clear()


def _edit_in_place(path: Path, value: int) -> None:
    st = path.stat()
    _bmp(path, value)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("settled", [False, True], ids=["just-written", "digests-remembered"])
def test_pixels_edited_in_place_are_never_served_from_the_cache_or_the_process(tmp_path, monkeypatch, settled):
    """Same names, sizes and modification times, other pixels: the process's copy and the cache file are not used."""
    import capsule_lib.data.image_folder as folder

    monkeypatch.setattr(folder, "_DIGESTS", {})
    if settled:  # the files count as settled: their digests are remembered and reused while their stat is the same
        monkeypatch.setattr(folder, "_SETTLED_NS", 0)
    for k in range(4):
        _bmp(tmp_path / "pics" / "a" / f"{k}.bmp", 10)
        _bmp(tmp_path / "pics" / "b" / f"{k}.bmp", 200)
    spec, source = _spec(tmp_path / "pics", val_fraction=0.25, test_fraction=0.25), DataSource(cache=tmp_path / "c")
    before = get_dataset(spec, source, "train_full")  # decoded, and the cache written
    assert bool((before.images[:, 0] == 10).any())
    for k in range(4):
        _edit_in_place(tmp_path / "pics" / "a" / f"{k}.bmp", 200)
    _new_process()  # the cache file holds the old pixels
    again = image_facts(spec, source)
    assert "decoded now" in again.record["stored"] and again.mean != before.extra["images"]["mean"]
    assert bool((get_dataset(spec, source, "train_full").images == 200).all())
    for k in range(4):
        _edit_in_place(tmp_path / "pics" / "a" / f"{k}.bmp", 10)
    during = get_dataset(spec, source, "train_full")  # the same process: its copy is not the files' any more
    assert bool((during.images[:, 0] == 10).any()), "the in-process copy outlived the edit"
    _new_process()
    assert "read from the cache" in image_facts(spec, source).record["stored"]  # unchanged files: the cache serves


def test_a_new_process_reads_only_the_files_that_changed(tmp_path, monkeypatch):
    """The digests of settled files are kept beside the cache: a new process stats the files and reads only those
    whose stat signature (status-change time included) changed; an edit in place is read again."""
    import hashlib

    import capsule_lib.data.image_folder as folder

    monkeypatch.setattr(folder, "_DIGESTS", {})
    monkeypatch.setattr(folder, "_SETTLED_NS", 0)
    for k in range(4):
        _bmp(tmp_path / "pics" / "a" / f"{k}.bmp", 10)
        _bmp(tmp_path / "pics" / "b" / f"{k}.bmp", 200)
    spec, source = _spec(tmp_path / "pics", val_fraction=0.25, test_fraction=0.25), DataSource(cache=tmp_path / "c")
    get_dataset(spec, source, "train")
    with np.load(tmp_path / "c" / folder.DIGEST_INDEX) as index:
        assert len(index["paths"]) == 8 and index["sigs"].shape == (8, 5)
    hashed = []
    real = hashlib.blake2b

    def counting(*a, **k):
        hashed.append(1)
        return real(*a, **k)

    monkeypatch.setattr(folder.hashlib, "blake2b", counting)
    _new_process()
    assert "read from the cache" in image_facts(spec, source).record["stored"] and not hashed
    _edit_in_place(tmp_path / "pics" / "a" / "0.bmp", 99)
    _new_process()
    assert "decoded now" in image_facts(spec, source).record["stored"] and len(hashed) == 1


def test_a_files_digest_is_its_content(tmp_path):
    from capsule_lib.data.image_folder import file_digest

    _bmp(tmp_path / "x.bmp", 1)
    first = file_digest(str(tmp_path / "x.bmp"))
    _edit_in_place(tmp_path / "x.bmp", 2)
    assert file_digest(str(tmp_path / "x.bmp")) != first
    _edit_in_place(tmp_path / "x.bmp", 1)
    assert file_digest(str(tmp_path / "x.bmp")) == first


@pytest.mark.slow
def test_the_train_command_reads_the_cache_it_wrote(tmp_path, capsys):
    """The command line reads the decoded images back (before #64 it decoded the folder on every run)."""
    from capsule_lib.commands.train import main as train_main

    root = _folder(tmp_path / "pics", {"a": 6, "b": 6})
    sets = [f"{k}={json.dumps(v)}" for k, v in TINY["baseline_cnn"].items()]
    argv = ["baseline_cnn", "--images", str(root), "--set", "epochs=1", "device=cpu", *sets]
    train_main([*argv, "--out", str(tmp_path / "runs" / "one")])
    assert "decoded now" in capsys.readouterr().out
    images_module._LOADED.clear()  # a new process
    train_main([*argv, "--out", str(tmp_path / "runs" / "two")])
    said = capsys.readouterr().out
    assert "decoded images read from the cache" in said and "decoded now" not in said


def test_a_recipe_whose_data_is_not_labelled_images_refuses_them_before_reading_them(tmp_path):
    for name, says in [("em_norb", "smallNORB viewpoint protocol"), ("capsnet_multimnist", "overlapping digits")]:
        with pytest.raises(ValueError, match=f"^{name}: its data is|^{name}: it trains on") as e:
            make_recipe(name, dataset=_spec(tmp_path / "not-even-there"))
        assert says in str(e.value)


# ------------------------------------------------------------------------------------------------ in memory
def test_tensors_in_memory_are_a_dataset_of_their_own(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (30, 20, 20, 3), dtype=np.uint8)  # [N, H, W, C], as numpy holds images
    y = np.arange(30) % 3
    name = register_images("mine_in_memory", x, y, ["r", "g", "b"], image_size=16)
    tr, va, te = (get_dataset(name, None, s) for s in ("train", "val", "test"))
    assert tuple(tr.images.shape[1:]) == (3, 16, 16) and (len(tr), len(va), len(te)) == (24, 3, 3)
    assert tr.classes == ["r", "g", "b"] and image_facts(name).record["resized"] == 30
    grey = register_images(
        "mine_grey",
        torch.rand(12, 8, 8),
        torch.arange(12) % 2,
        ["a", "b"],
        test=(torch.rand(4, 8, 8), torch.tensor([0, 1, 0, 1])),
    )
    assert len(get_dataset(grey, None, "test")) == 4 and image_facts(grey).channels == 1
    for args, message in [
        (("mnist", x, y, ["a", "b", "c"]), "one of the library's datasets"),
        (("m1", x, y, ["a"]), "two or more distinct names"),
        (("m2", x, y + 5, ["a", "b", "c"]), "labels must be \\[N\\] class indices 0..2"),
        (("m3", x[:, :, :, :2], y, ["a", "b", "c"]), "need 1 \\(grey\\) or 3 \\(RGB\\) channels"),
        (("m4", torch.full((30, 3, 8, 8), 2.0), y, ["a", "b", "c"]), "uint8, or floats in \\[0, 1\\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            register_images(*args)


# --------------------------------------------------------------------------------------- decoding and streaming
def test_decode_files_matches_reading_one_by_one_in_workers_too(tmp_path):
    files = [str(_png(tmp_path / f"{i}.png", 10, seed=i)) for i in range(5)]
    one = torch.stack([torch.from_numpy(read_image(f, 10)) for f in files])
    for workers in (0, 2):
        done = decode_files(files, 10, workers=workers)
        assert torch.equal(done.images, one) and done.keep.all() and done.bad == []
    (tmp_path / "bad.png").write_text("nope")
    with pytest.raises(BadImageError, match="bad.png: not an image or damaged .*--skip-bad-files"):
        decode_files([*files, str(tmp_path / "bad.png")], 10)


def test_large_images_are_read_while_training_with_the_same_batches(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 10, "b": 10}, size=70)
    big = get_dataset(_spec(root), None, "train")
    assert isinstance(big.images, torch.Tensor) and big.images.shape[1:] == (3, 64, 64)  # capped at 64: decoded
    images_module._LOADED.clear()
    ds = get_dataset(_spec(root, image_size=70), None, "train")
    assert isinstance(ds.images, FileImages) and tuple(ds.images.shape) == (16, 3, 70, 70)
    stream = TensorLoader.from_dataset(ds, 5, shuffle=True, seed=3, workers=0)
    assert isinstance(stream, StreamLoader)
    dense = TensorLoader([ds.images.load(), ds.labels], 5, shuffle=True, seed=3)
    for loader in (stream, dense):
        loader.set_epoch(1)
    for (xs, ys), (xd, yd) in zip(stream, dense, strict=True):
        assert torch.equal(xs, xd) and torch.equal(ys, yd)
    assert stream.fingerprint() == TensorLoader([ds.images, ds.labels], 5).fingerprint()


def test_list_image_files_reads_folders_and_names_what_is_missing(tmp_path):
    a = _png(tmp_path / "in" / "b.png")
    _png(tmp_path / "in" / "sub" / "a.jpg")
    (tmp_path / "in" / "notes.txt").write_text("x")
    assert list_image_files([tmp_path / "in", a]) == [str(a), str(tmp_path / "in/sub/a.jpg"), str(a)]
    with pytest.raises(FileNotFoundError, match="gone.png: no such file or folder"):
        list_image_files(tmp_path / "gone.png")
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="none: no image files in this folder"):
        list_image_files(tmp_path / "none")


# ------------------------------------------------------------------------------------------- every family trains
@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(TINY))
def test_each_family_fits_classes_channels_and_size_to_the_images(tmp_path, recipe):
    root = _folder(tmp_path / "pics", {"a": 5, "b": 5, "c": 5}, size=12, mode="L")
    extra = {"model.routing": "em"} if recipe == "routing_compare_mnist" else {}
    model, trainer = train(recipe, dataset=_spec(root), epochs=1, device="cpu", progress=False, **TINY[recipe], **extra)
    cfg = model.config
    assert (cfg.n_classes, cfg.in_channels, cfg.image_size, cfg.stem_side) == (3, 1, 12, 28)  # behind its stem
    assert trainer.history.meta["test"]["test_acc"] is not None


def test_tsais_network_gets_the_training_splits_normalisation(tmp_path):
    root = _folder(tmp_path / "pics", {"a": 5, "b": 5}, size=16)
    r = make_recipe("tsai_cifar10_cpu")
    facts = image_facts(_spec(root))
    r.fit_to_images(facts)
    assert list(r.model.input_mean) == facts.mean and r.model.n_classes == 2 and r.model.image_size == 16


# --------------------------------------------------------------------------------------------- the commands
def _cli(capsys, main, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--image-size", "32"], "--image-size goes with --images PATH"),
        (["--images", "x", "--set", "dataset=mnist"], "give the data once: --images PATH or --set dataset="),
        (["--images", "x", "--val-fraction", "0"], "val_fraction must be > 0"),
        (["--images", "x", "--image-size", "-3"], "image_size must be a positive integer"),
    ],
)
def test_the_train_command_checks_the_image_options_in_one_line(tmp_path, capsys, argv, message):
    from capsule_lib.commands.train import main

    code, err = _cli(capsys, main, "baseline_cnn", "--out", str(tmp_path / "r"), *argv)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists()


def test_the_predict_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    from capsule_lib.commands.predict import main

    img = _png(tmp_path / "x.png")
    (tmp_path / "bad.png").write_text("nope")
    (tmp_path / "empty").mkdir()
    for argv, message in [
        ([str(tmp_path / "no_run"), str(img)], "not a run folder, a checkpoint file (.pt) or a shipped checkpoint"),
        ([str(tmp_path / "empty"), str(img)], "not a finished run folder"),
        (["capsnet_mnist", str(tmp_path / "gone.png")], "gone.png: no such file or folder"),
        (["capsnet_mnist", str(tmp_path / "empty")], "no image files in this folder"),
        (["capsnet_mnist", str(tmp_path / "bad.png")], "bad.png: not an image or damaged"),
        (["capsnet_mnist", str(img), "--batch-size", "0"], "--batch-size must be >= 1"),
        (["capsnet_mnist", str(img), "--csv", str(tmp_path)], "is a folder; give a file name"),
        (["capsnet_mnist", str(img), "--device", "gpu"], "is not a device name"),
    ]:
        code, err = _cli(capsys, main, *argv)
        assert code == 2 and len(err) == 1 and message in err[0], (argv, err)


def test_predict_on_files_is_predict_on_the_tensors_they_hold(tmp_path):
    from capsule_lib.evaluation import predict
    from capsule_lib.pretrained import load_trained

    model, info = load_trained("capsnet_mnist")
    assert info["classes"] == [str(k) for k in range(10)] and "shipped checkpoint" in info["source"]
    ds = get_dataset("glyph_digits", tmp_path, "test", offline=True, n=6)
    from capsule_lib.data.image_files import write_image_folder

    files = write_image_folder(ds.images, ds.labels, ds.classes, tmp_path / "digits")
    by_file = predict(model, tmp_path / "digits")
    assert sorted(by_file["files"]) == sorted(map(str, files)) and by_file["kind"] == "lengths"
    order = [files.index(Path(f)) for f in by_file["files"]]
    assert torch.allclose(by_file["scores"], predict(model, ds.images[order])["scores"])


@pytest.mark.slow
def test_train_then_predict_on_your_own_images_from_the_command_line(tmp_path, capsys):
    """The two commands a reader runs: train a capsule network on a folder, predict on files and a folder."""
    from capsule_lib.commands.predict import main as predict_main
    from capsule_lib.commands.train import main as train_main

    root = _folder(tmp_path / "mes images", {"chat": 6, "chien": 6, "oiseau ü": 6}, size=20)
    sets = [f"{k}={json.dumps(v)}" for k, v in TINY["capsnet"].items()]
    train_main(
        [
            "capsnet",
            "--images",
            str(root),
            "--out",
            str(tmp_path / "runs" / "mine"),
            "--set",
            "epochs=1",
            "device=cpu",
            *sets,
        ]
    )
    capsys.readouterr()
    out_csv = tmp_path / "p.csv"
    predict_main(
        [str(tmp_path / "runs" / "mine"), str(root / "chat" / "000.png"), str(root / "oiseau ü"), "--csv", str(out_csv)]
    )
    said = capsys.readouterr().out
    assert "3 classes, scores are capsule lengths; 7 images" in said
    rows = list(csv.reader(out_csv.open(encoding="utf-8")))
    assert rows[0] == ["file", "predicted", "capsule length: chat", "capsule length: chien", "capsule length: oiseau ü"]
    assert len(rows) == 8 and all(r[1] in ("chat", "chien", "oiseau ü") for r in rows[1:])
    assert all(0 <= float(v) <= 1 for r in rows[1:] for v in r[2:])


# ------------------------------------------------------------------------------------ explorers on your network
def test_the_explorers_read_the_networks_grid_and_name_the_classes(tmp_path):
    from capsule_lib.analysis import capsule_grid
    from capsule_lib.models import CapsNet, CapsNetConfig
    from capsule_lib.viz.explorers import capsule_routing_explorer, lengths_readout, perturbation_explorer
    from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, routing_page_explorer

    classes = ["chat", "chien", "oiseau"]
    cfg = CapsNetConfig(
        in_channels=3, image_size=20, n_classes=3, conv_channels=8, primary_types=2, class_dim=4, decoder_hidden=(8, 8)
    )
    model = CapsNet(cfg).eval()
    assert capsule_grid(model) == (2, 2, 2)  # 20 - 8 = 12, then a 9x9 stride-2 convolution: 2 x 2
    x = torch.rand(3, 3, 20, 20)
    with torch.no_grad():
        out = model(x, return_routing=True)
    poses = out.poses
    ex = perturbation_explorer(model, x, poses, torch.tensor([0, 1, 2]), classes=classes)
    assert ex.readout.value.startswith("<code>capsule lengths: chat:") and "oiseau:" in ex.readout.value
    assert lengths_readout([0.1, 0.9], 1) == "capsule lengths: 0:0.10 1:0.90*"  # digits when no names are given
    routing = capsule_routing_explorer(x, out.trace.detach(), grid=capsule_grid(model), classes=classes)
    assert "chien:" in routing.readout.value
    page = routing_page_explorer(x, out.trace.detach(), n_images=2, grid=capsule_grid(model), classes=classes)
    assert PAGE_EXPLORER_CLASS in page._dom_classes


@pytest.mark.slow
def test_the_decoding_benchmark_runs_in_quick_mode(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "image_folder.py"
    out = tmp_path / "q.json"
    cmd = [sys.executable, str(script), "--quick", "--data-root", str(tmp_path / "empty"), "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True, cwd=tmp_path)
    res = json.loads(out.read_text())
    assert res["files"] == 300 and res["generated"] and res["machine"]["cpu_count"] >= 1
    phases = [(r["phase"], r["workers"]) for r in res["runs"]]
    assert phases == [("cold", "default"), ("cached", "default"), ("key", "default"), ("decode", 0), ("decode", 2)]
    key = res["runs"][2]
    assert key["content_s"] > 0 and key["stat_s"] >= 0 and key["content_again_s"] >= 0 and key["indexed_s"] >= 0
    assert all(r["seconds"] > 0 and r["peak_with_workers_mb"] > 0 for r in res["runs"])
    assert "read from the cache" in res["runs"][1]["how"] and res["cache_mb"] > 0


def test_a_splits_first_images_hold_every_class(tmp_path):
    """Files come class by class; a split comes in a seeded order, so ``train_subset=n`` keeps every class."""
    root = _folder(tmp_path / "pics", {"a": 10, "b": 10, "c": 10})
    tr = get_dataset(_spec(root), None, "train")
    assert set(tr.subset(6).labels.tolist()) == {0, 1, 2}
    assert torch.equal(get_dataset(_spec(root), None, "train").labels, tr.labels)  # the same order every time
