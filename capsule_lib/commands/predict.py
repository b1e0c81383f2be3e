"""``python -m capsule_lib.predict RUN_OR_CHECKPOINT IMAGE [IMAGE or FOLDER ...] [--csv OUT]``: a trained model's
prediction for each image file, with the class names it was trained on and every class's score (a capsule network's
class capsule lengths or activations, a CNN's logits)::

    python -m capsule_lib.predict runs/mine photos/new/ cat.png --csv predictions.csv
    python -m capsule_lib.predict capsnet_mnist digit.png        # a shipped checkpoint

``RUN_OR_CHECKPOINT`` is a run folder of ``python -m capsule_lib.train`` (the weights chosen on validation), an
exported checkpoint file ``<name>.pt`` or a shipped checkpoint's name (:func:`capsule_lib.pretrained.load_trained`).
Images are read as the run read its training images (:func:`~capsule_lib.evaluation.predict` on files: the
network's channels, the shorter side resized to its input size, the middle square kept); a folder stands for every
image file in it. Printed: one line per file, the predicted class and the scores (all classes up to 10, else the 5
highest); ``--csv`` writes every score.

Layering: a command (``capsule_lib.commands``, the top layer; nothing imports it); ``capsule_lib/predict.py``
holds nothing but the call of :func:`main`.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import torch

from .._checks import check_device
from ..evaluation import predict
from ..pretrained import load_trained
from ..report import SCORE_WORDS, markdown_table, prediction_rows
from ._arguments import fail, interrupted, parser

__all__ = ["main"]

#: the most classes whose scores are printed in full (with more, the 5 highest; the CSV has them all)
_PRINTED = 10


def _parser() -> argparse.ArgumentParser:
    p = parser("python -m capsule_lib.predict", __doc__)
    p.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="a run folder, a .pt checkpoint or a shipped name")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files and folders of them")
    p.add_argument("--csv", metavar="OUT", help="write file, predicted class and every score as CSV")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default 64)")
    return p


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); ``argv`` default: ``sys.argv[1:]``."""
    p = _parser()
    a = p.parse_args(argv)
    if a.batch_size < 1:
        fail(p, f"--batch-size must be >= 1, got {a.batch_size}")
    if a.csv and Path(a.csv).is_dir():
        fail(p, f"--csv {a.csv}: is a folder; give a file name (e.g. {Path(a.csv) / 'predictions.csv'})")
    if a.csv and not os.access(Path(a.csv).resolve().parent, os.W_OK | os.X_OK):
        fail(p, f"--csv {a.csv}: cannot write in {Path(a.csv).resolve().parent} (missing or read-only)")
    try:  # every refusal in one line: the model, the files, the device
        with interrupted(p, "loading the model and reading the images"):
            device = check_device(a.device, p.prog, "--device")
            model, info = load_trained(a.model, device)
            result = predict(model, a.images, batch_size=a.batch_size, device=device)
    except (ValueError, FileNotFoundError, PermissionError, KeyError) as e:
        fail(p, str(e.args[0]) if e.args else type(e).__name__)
    classes, scores = info["classes"], result["scores"]
    if len(classes) != scores.shape[1]:
        classes = [str(k) for k in range(scores.shape[1])]
    word = SCORE_WORDS.get(result["kind"], "score")
    root = os.path.commonpath([os.path.abspath(f) for f in result["files"]]) if len(result["files"]) > 1 else None
    top = None if len(classes) <= _PRINTED else 5
    headers, rows = prediction_rows(result["files"], scores, classes, top=top, root=root)
    print(f"{p.prog}: {info['source']}: {len(classes)} classes, scores are {word}s; {len(rows)} images")
    print(markdown_table(headers, rows))
    if a.csv:
        try:
            _write_csv(Path(a.csv), result["files"], scores, classes, word)
        except OSError as e:
            fail(p, f"--csv {a.csv}: cannot write it ({e.strerror or type(e).__name__})", code=1)
        print(f"{p.prog}: wrote {a.csv}")


def _write_csv(path: Path, files: list[str], scores: torch.Tensor, classes: list[str], word: str) -> None:
    headers, rows = prediction_rows(files, scores, classes)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(headers[:2] + [f"{word}: {c}" for c in headers[2:]])
            w.writerows(rows)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
