#!/usr/bin/env python
"""Download the Stanford Sentiment Treebank (Socher et al. 2013) into ROOT/sst and extract ``trees/``.

    python data_scripts/sst.py --root DIR [--list]

``trainDevTestTrees_PTB.zip`` holds ``trees/{train,dev,test}.txt`` (8,544 / 1,101 / 2,210 sentences as
labelled PTB trees). SST-5 uses the five labels; SST-2 drops the neutral label 2 and maps 0-1 -> 0 and
3-4 -> 1 (Heinsen 2019's language demo; ``capsule_lib.data.sst.load_sst``).

Checksum: the dataset authors publish none. The sha256 and size below are pinned by a third-party public
project (found by code search; repository not identified), not by Stanford: if the download does not match,
the script says so with both hashes and keeps nothing.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

DATASET = Dataset(
    name="SST (sentiment treebank)",
    folder="sst",
    resources=[
        Resource(
            ("https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip",),
            "trainDevTestTrees_PTB.zip",
            sha256="5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc",
            size=789539,
            checksum_source="a third-party pin (not published by the authors)",
        )
    ],
    extractions={"trainDevTestTrees_PTB.zip": ("trees", "trees")},
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
