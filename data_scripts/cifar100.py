#!/usr/bin/env python
"""Download CIFAR-100 (Krizhevsky 2009) into ROOT/cifar100 and extract ``cifar-100-python``.

    python data_scripts/cifar100.py --root DIR [--list]

The archive's md5 is torchvision's (``torchvision.datasets.CIFAR100.tgz_md5``); ``get_dataset("cifar100",
DIR)`` reads the extracted folder through ``torchvision.datasets.CIFAR100``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

DATASET = Dataset(
    name="CIFAR-100",
    folder="cifar100",
    resources=[
        Resource(
            ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
            "cifar-100-python.tar.gz",
            md5="eb9058c3a382ffc7106e4002c42a8d85",
            checksum_source="torchvision CIFAR100.tgz_md5",
        )
    ],
    extractions={"cifar-100-python.tar.gz": ("cifar-100-python", "cifar-100-python")},
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
