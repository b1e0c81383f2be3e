import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("CAPSULE_DATA") or REPO / "data")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def real_data() -> Path:
    """The data root ($CAPSULE_DATA, else data/) when it holds real MNIST; skip otherwise."""
    if not (REAL_DATA / "mnist" / "MNIST" / "raw").exists():
        pytest.skip(f"real MNIST not present under CAPSULE_DATA={REAL_DATA}")
    return REAL_DATA
