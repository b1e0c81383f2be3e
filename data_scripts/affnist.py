#!/usr/bin/env python
"""Download the official affNIST test set (Tieleman 2013) into ROOT/affnist and extract ``affNIST_test.mat``.

    python data_scripts/affnist.py --root DIR [--list]

``32x/transformed/test.mat.zip`` (320,000 transformed MNIST test digits, 40x40). Checksum and size:
TensorFlow Datasets' ``url_checksums/affnist.txt`` (tensorflow/datasets). ``get_dataset("affnist", DIR,
"test")`` reads ``affNIST_test.mat`` (or the zip itself).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

DATASET = Dataset(
    name="affNIST (test)",
    folder="affnist",
    resources=[
        Resource(
            ("https://www.cs.toronto.edu/~tijmen/affNIST/32x/transformed/test.mat.zip",),
            "test.mat.zip",
            sha256="2cde38ec83ee2ebfd7b901f8be5a09efb17a1bda04771f9b4905751eb945c01a",
            size=121743191,
            checksum_source="TensorFlow Datasets url_checksums",
        )
    ],
    extractions={"test.mat.zip": ("test.mat", "affNIST_test.mat")},
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
