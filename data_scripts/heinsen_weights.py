#!/usr/bin/env python
"""Download the author's published weights of Heinsen (2019), "An Algorithm for Routing Capsules in All
Domains": the smallNORB model's ``state_dict`` (99.1% test accuracy in the paper), into ROOT/heinsen_2019.

    python data_scripts/heinsen_weights.py --root DIR [--list]

The file is the one committed to the author's repository (glassroom/heinsen_routing, pinned to commit
6ea5b3a9, the last commit with the 2019 code); the checksum is the sha256 of that committed file. Load it
with ``capsule_lib.pretrained.load_heinsen_2019(DIR / "heinsen_2019" / FILE)``: the author's key names and
tensor layouts map onto :class:`capsule_lib.models.SmallNORBClassifier` (96 x 96 stereo pairs).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _download import Dataset, Resource, main  # noqa: E402

COMMIT = "6ea5b3a92ab88e758605643fd0cba01c7fee1434"
FILE = "smallNORB_pretrained_model_state_dict.pt"
DATASET = Dataset(
    name="Heinsen (2019) smallNORB weights",
    folder="heinsen_2019",
    resources=[
        Resource(
            (
                f"https://raw.githubusercontent.com/glassroom/heinsen_routing/{COMMIT}/{FILE}",
                f"https://github.com/glassroom/heinsen_routing/raw/{COMMIT}/{FILE}",
            ),
            FILE,
            sha256="e4dca94f4ee01ae8dcdf1278b409e29dfc0bbf894d897d9f98e16de6d7ae7520",
            size=1101095,
            checksum_source="sha256 of the file as committed in glassroom/heinsen_routing at 6ea5b3a9",
        )
    ],
    notes="The author's smallNORB state_dict (1.1 MB).",
)

if __name__ == "__main__":
    sys.exit(main(DATASET))
