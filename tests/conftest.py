import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("CAPSULE_DATA") or REPO / "data")


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``pytest -n 2``) each worker gets one core: one intra-op thread per
    worker, so two workers never fight over the two cores (tests that time or train with several threads run
    them in subprocesses of their own)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-tensor tests (faster, and no oversubscription on small shared CPUs);
    the previous count is restored after the module. Use as ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def real_data() -> Path:
    """The data root ($CAPSULE_DATA, else data/) when it holds real MNIST; skip otherwise."""
    if not (REAL_DATA / "mnist" / "MNIST" / "raw").exists():
        pytest.skip(f"real MNIST not present under CAPSULE_DATA={REAL_DATA}")
    return REAL_DATA
