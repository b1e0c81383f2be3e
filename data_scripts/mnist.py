#!/usr/bin/env python
"""Download MNIST (LeCun, Cortes & Burges) into ROOT/mnist/MNIST/raw (torchvision's layout).

    python data_scripts/mnist.py --root DIR      # fetch (resumable, md5-verified, idempotent)
    python data_scripts/mnist.py --root DIR --list

Checksums: the md5s published by torchvision (``torchvision.datasets.MNIST.resources``); mirrors as in
torchvision. ``get_dataset("mnist", DIR)`` reads the ``.gz`` files directly.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
DATASET = Dataset(
    name="MNIST",
    folder="mnist",
    subdir="MNIST/raw",
    resources=[
        Resource(tuple(m + f for m in MIRRORS), f, md5=h, checksum_source="torchvision MNIST.resources")
        for f, h in MD5.items()
    ],
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
