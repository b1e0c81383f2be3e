#!/usr/bin/env python
"""Download CIFAR-10 (Krizhevsky 2009) into ROOT/cifar10 and extract ``cifar-10-batches-py``.

    python data_scripts/cifar10.py --root DIR [--list]

The archive's md5 is torchvision's (``torchvision.datasets.CIFAR10.tgz_md5``); the extracted folder is the
layout ``torchvision.datasets.CIFAR10(ROOT/cifar10)`` reads (and checks with its per-batch md5s), which is
what ``get_dataset("cifar10", DIR)`` uses when no ``train_*.npz`` copies are there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

DATASET = Dataset(
    name="CIFAR-10",
    folder="cifar10",
    resources=[
        Resource(
            ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
            "cifar-10-python.tar.gz",
            md5="c58f30108f718f92721af3b95e74349a",
            checksum_source="torchvision CIFAR10.tgz_md5",
        )
    ],
    extractions={"cifar-10-python.tar.gz": ("cifar-10-batches-py", "cifar-10-batches-py")},
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
