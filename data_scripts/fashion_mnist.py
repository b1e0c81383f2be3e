#!/usr/bin/env python
"""Download Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) into ROOT/fashion_mnist/FashionMNIST/raw.

    python data_scripts/fashion_mnist.py --root DIR [--list]

Checksums: the md5s published by torchvision (``torchvision.datasets.FashionMNIST.resources``).
``get_dataset("fashion_mnist", DIR)`` reads the ``.gz`` files directly.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
DATASET = Dataset(
    name="Fashion-MNIST",
    folder="fashion_mnist",
    subdir="FashionMNIST/raw",
    resources=[
        Resource(tuple(m + f for m in MIRRORS), f, md5=h, checksum_source="torchvision FashionMNIST.resources")
        for f, h in MD5.items()
    ],
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
