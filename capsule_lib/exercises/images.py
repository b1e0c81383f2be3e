"""The exercises of the page on the reader's own images: the training split's normalisation statistics and the
predicted class names from CapsNet's class capsules (see :mod:`.catalogue`).

The references are the library's own: the statistics :mod:`capsule_lib.data.images` records for a folder (computed
from the ``uint8`` pixels and kept to 4 decimals, hence the cases' tolerance of 1e-4), and the predicted column of
:func:`~capsule_lib.report.prediction_rows` over the scores :func:`~capsule_lib.evaluation.predict` gives for CapsNet
(:func:`~capsule_lib.functional.capsule_lengths`).
"""

from __future__ import annotations

import torch

from ..data.images import _stats
from ..functional import capsule_lengths
from ..report import prediction_rows
from ._inputs import F64, _rand, _randn
from .checker import Case, Exercise, Mistake

__all__ = ["CHANNEL_STATS", "PREDICTED_CLASSES"]


# ----------------------------------------------------------------------------------------- normalisation
def _pixels(n: int, c: int, side: int, seed: int) -> torch.Tensor:
    """``uint8 [n, C, side, side]`` images of different brightness (each image scaled by its own factor)."""
    bright = 0.2 + 0.8 * _rand(n, seed=seed + 100, dtype=F64)
    return (_rand(n, c, side, side, seed=seed, dtype=F64) * bright[:, None, None, None] * 255).round().to(torch.uint8)


def _stats_case(name: str, pixels: torch.Tensor, split: list[int], dtype: torch.dtype) -> Case:
    """The reader gets the images as floats in [0, 1] (a dataset's ``float_images()``); the expected statistics are
    what the library records for the same ``uint8`` pixels' training split."""
    split_t = torch.tensor(split)
    mean, std, _ = _stats(pixels, torch.nonzero(split_t == 0).squeeze(1))
    expected = (torch.tensor(mean, dtype=dtype), torch.tensor(std, dtype=dtype))
    return Case(name, (pixels.to(dtype) / 255, split_t), expected, atol=1e-4)


def _stats_cases() -> list[Case]:
    return [
        _stats_case(
            "12 RGB images of different brightness [12, 3, 5, 5], 8 in training",
            _pixels(12, 3, 5, 0),
            [0, 1, 0, 0, 2, 0, 0, 1, 0, 2, 0, 0],
            torch.float32,
        ),
        _stats_case(
            "grey images [9, 1, 4, 4], 6 in training", _pixels(9, 1, 4, 1), [0, 0, 2, 0, 1, 0, 2, 0, 0], torch.float32
        ),
        _stats_case(
            "float64 RGB images [10, 3, 6, 6], held-out images last",
            _pixels(10, 3, 6, 2),
            [0, 0, 0, 0, 0, 0, 1, 1, 2, 2],
            F64,
        ),
        _stats_case("one training image [4, 3, 5, 5]", _pixels(4, 3, 5, 3), [1, 0, 2, 1], torch.float32),
    ]


def _stats_variant(images: torch.Tensor, split: torch.Tensor, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    keep = {"all": split >= 0, "train_val": split <= 1, "test": split == 2}.get(how, split == 0)
    x = images[keep]
    if how == "channels_last":
        return x.mean((0, 1, 2)), x.std((0, 1, 2), correction=0)
    if how == "one_number":
        return x.mean(), x.std(correction=0)
    if how == "unbiased":
        return x.mean((0, 2, 3)), x.std((0, 2, 3))
    if how == "image_stds":
        return x.mean((0, 2, 3)), x.std((2, 3), correction=0).mean(0)
    return x.mean((0, 2, 3)), x.std((0, 2, 3), correction=0)


_ONLY_TRAIN = "only the training images (split == 0) may shape what the network is trained on"

CHANNEL_STATS = Exercise(
    "channel_stats",
    "own_images",
    "channel_stats(images, split) -> (mean, std)     images [N, C, H, W] in [0, 1], split [N] (0 train, 1 val, "
    "2 test) -> mean [C], std [C]",
    "The per-channel mean and standard deviation of the training split's pixels (over images, rows and columns: "
    "N, H, W), the statistics the library records for a folder.",
    _stats_cases,
    (
        Mistake(
            "all_splits",
            f"you used every image, validation and test included: {_ONLY_TRAIN}",
            lambda x, s: _stats_variant(x, s, "all"),
        ),
        Mistake(
            "train_and_val",
            f"you included the validation images (split 1), which choose the epoch: {_ONLY_TRAIN}",
            lambda x, s: _stats_variant(x, s, "train_val"),
        ),
        Mistake(
            "test_split",
            f"you used the test images (split 2), which are used once, at the end: {_ONLY_TRAIN}",
            lambda x, s: _stats_variant(x, s, "test"),
        ),
        Mistake(
            "channels_last",
            "you averaged over axes (0, 1, 2), as for [N, H, W, C] arrays: these images are [N, C, H, W], so "
            "average over N, H and W (axes 0, 2, 3)",
            lambda x, s: _stats_variant(x, s, "channels_last"),
        ),
        Mistake(
            "one_number",
            "you returned one number for all channels: one mean and one std per channel, [C]",
            lambda x, s: _stats_variant(x, s, "one_number"),
        ),
        Mistake(
            "unbiased_std",
            "torch.std divides by n - 1 by default; the recorded std is the pixels' own spread, divided by n "
            "(correction=0)",
            lambda x, s: _stats_variant(x, s, "unbiased"),
        ),
        Mistake(
            "mean_of_image_stds",
            "you averaged each image's std: the std is over all training pixels together (the differences between "
            "images count too)",
            lambda x, s: _stats_variant(x, s, "image_stds"),
        ),
    ),
)


# --------------------------------------------------------------------------------------- class names
def _predicted_reference(poses: torch.Tensor, classes: list[str]) -> tuple[str, ...]:
    """``predict``'s scores for CapsNet (the class capsules' lengths), named as the prediction table names them."""
    _, rows = prediction_rows([str(k) for k in range(len(poses))], capsule_lengths(poses), classes)
    return tuple(row[1] for row in rows)


def _one_long_entry() -> torch.Tensor:
    """Two images whose longest capsule is not the one with the largest entry: [-2, 0, 0] is longer than [1, 1, 0]."""
    poses = torch.full((2, 3, 3), 0.1)
    poses[0, 0], poses[0, 1] = torch.tensor([-2.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    poses[1, 2], poses[1, 1] = torch.tensor([0.0, 0.0, -1.5]), torch.tensor([0.9, 0.9, 0.0])
    return poses


_PAGE = ["airplane", "bird", "frog", "ship"]
_FIVE = ["cat", "dog", "horse", "deer", "truck"]


def _predicted_cases() -> list[Case]:
    specs = [
        ("4 images, 5 classes, 8-D capsules [4, 5, 8]", _randn(4, 5, 8, seed=0, scale=0.3), _FIVE),
        ("a batch of one, the page's 4 classes [1, 4, 16]", _randn(1, 4, 16, seed=1, scale=0.2), _PAGE),
        ("float64, 6 images of 3 classes [6, 3, 4]", _randn(6, 3, 4, seed=2, dtype=F64), _FIVE[:3]),
        ("a long capsule with a negative entry [2, 3, 3]", _one_long_entry(), _PAGE[:3]),
    ]
    return [Case(name, (poses, classes), _predicted_reference(poses, classes)) for name, poses, classes in specs]


PREDICTED_CLASSES = Exercise(
    "predicted_classes",
    "own_images",
    "predicted_classes(poses, classes) -> names     poses [N, K, D] class capsules, classes: K names -> N names",
    "Each image's predicted class name: the class whose capsule is longest (CapsNet's scores are the lengths).",
    _predicted_cases,
    (
        Mistake(
            "largest_entry",
            "you picked the capsule with the largest entry; the class is the longest capsule (the norm of its D "
            "values)",
            lambda p, c: [c[k] for k in p.amax(-1).argmax(1).tolist()],
        ),
        Mistake(
            "over_the_batch",
            "you took the argmax over the images (axis 0); each image's class is its longest class capsule (axis 1)",
            lambda p, c: [c[k] for k in capsule_lengths(p).argmax(0).tolist()],
        ),
        Mistake(
            "indices_not_names",
            "you returned the class indices; look each one up in classes and return the names",
            lambda p, c: capsule_lengths(p).argmax(1),
        ),
    ),
)
