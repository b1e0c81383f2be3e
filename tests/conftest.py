import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CAPSULE_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data() -> Path:
    """The offline copies of real datasets (MNIST, CIFAR-10), or skip when absent."""
    if not (SHARED_DATA / "mnist" / "MNIST" / "raw").exists():
        pytest.skip(f"real datasets not present at {SHARED_DATA}")
    return SHARED_DATA
