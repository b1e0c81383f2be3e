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
    from capsule_lib.data.datasets import announce_standins

    announce_standins(True)  # a page that said "stand-ins" once (notebook.settings) ends with its test


@pytest.fixture(autouse=True)
def _local_network_only(monkeypatch):
    """Tests never touch the network: a connection to anything but this machine fails at once (a test that
    forgets ``offline=True`` fails instead of downloading). Subprocesses (kernels, torchrun) are not covered."""
    import socket

    connect = socket.socket.connect

    def local_only(sock, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and host not in ("127.0.0.1", "::1", "localhost", "0.0.0.0"):
            raise OSError(f"tests never touch the network: connection to {address!r} refused (tests/conftest.py)")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-tensor tests (faster, and no oversubscription on small shared CPUs);
    the previous count is restored after the module. Use as ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def adam_steps():
    """``steps(model, x, y, n=15) -> losses``: ``n`` Adam steps (lr 3e-3) of the model's paper loss
    (:class:`~capsule_lib.losses.ScoreObjective`) on one batch, for the tests that a model trains at all."""
    from capsule_lib.losses import ScoreObjective

    def steps(model, x, y, n=15):
        objective, opt = ScoreObjective(), torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(n):
            step = objective(model, (x, y), True)
            opt.zero_grad()
            step.loss.backward()
            opt.step()
            losses.append(step.loss.item())
        return losses

    return steps


@pytest.fixture(scope="module")
def tiny_capsnet():
    """The viz tests' CapsNet (eval mode, seed 0): 2 primary capsule types on a 6x6 grid (28 -> 20 -> 6),
    3 classes of 4-D capsules, routing without bias, weights wide enough (``init_std=2``) that couplings differ."""
    from capsule_lib.models import CapsNet, CapsNetConfig

    torch.manual_seed(0)
    config = CapsNetConfig(
        conv_channels=8,
        primary_types=2,
        primary_dim=4,
        n_classes=3,
        class_dim=4,
        decoder_hidden=(16, 32),
        init_std=2.0,
        routing_bias=False,
    )
    return CapsNet(config).eval()


def pytest_collection_modifyitems(config, items):
    """Every test that takes the ``real_data`` fixture is marked ``realdata`` (``make test`` runs them once more on
    an empty data root, where they must skip: ``pytest -m realdata``)."""
    for item in items:
        if "real_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realdata)


@pytest.fixture
def real_data() -> Path:
    """The data root ($CAPSULE_DATA, else data/) when it holds the real MNIST, as its files say
    (:func:`capsule_lib.data.find_real_data`: names and sizes, not a folder that a failed download left); skip
    otherwise, saying why."""
    from capsule_lib.data import find_real_data

    found = find_real_data("mnist", REAL_DATA)
    if not found:
        pytest.skip(f"real MNIST not present under CAPSULE_DATA={REAL_DATA}: {found.problem}")
    return REAL_DATA


@pytest.fixture
def readable_figures(monkeypatch, request):
    """Every figure a test makes must be readable at the size the book shows it
    (:func:`capsule_lib.viz.readability.check_figure_readable`: text >= 8 px, <= 3 chart panels per row).

    For the modules whose tests draw the book's figures (``pytestmark = pytest.mark.usefixtures(
    "readable_figures")``): the test runs under the book's style (:data:`~capsule_lib.viz.plots.BOOK_STYLE`);
    each figure is checked when it is closed (an explorer's redraw, :class:`~capsule_lib.viz.plots.LivePlot`),
    when it becomes a page-mode explorer frame (:func:`capsule_lib.viz.page.figure_png`, at the frame's dpi) and
    at the end of the test (the figures still open, then closed). Problems fail the test at teardown.
    ``CAPSULE_FIGURES_OUT=dir`` saves every checked figure there as the book would show it (PNG), to look at."""
    import matplotlib
    import matplotlib.pyplot as plt

    from capsule_lib.viz.plots import BOOK_STYLE
    from capsule_lib.viz.readability import check_figure_readable

    problems: list[str] = []
    checked: set[int] = set()

    def check(fig, dpi=None, where=""):
        if id(fig) in checked or not fig.axes:
            return
        checked.add(id(fig))
        found = check_figure_readable(fig, dpi=dpi)
        if os.environ.get("CAPSULE_FIGURES_OUT"):
            out = Path(os.environ["CAPSULE_FIGURES_OUT"])
            out.mkdir(parents=True, exist_ok=True)
            name = f"{request.node.name[:80]}-{len(checked)}{'-page' if dpi else ''}.png".replace("/", "_")
            fig.savefig(out / name, dpi=dpi or fig.dpi, bbox_inches="tight")
        if found:
            title = fig._suptitle.get_text() if fig._suptitle is not None else ""
            name = title or next((ax.get_title() for ax in fig.axes if ax.get_title()), "") or "untitled"
            more = [f"... and {len(found) - 6} more"] if len(found) > 6 else []
            problems.append(f"{where}figure {name[:60]!r}:\n    " + "\n    ".join(found[:6] + more))

    close = plt.close

    def checked_close(fig=None):
        figs = [fig] if isinstance(fig, matplotlib.figure.Figure) else []
        if fig is None:
            figs = [plt.gcf()] if plt.get_fignums() else []
        elif fig == "all":
            figs = [plt.figure(n) for n in plt.get_fignums()]
        elif not figs and plt.fignum_exists(fig):
            figs = [plt.figure(fig)]
        for f in figs:
            check(f)
        close(fig)

    monkeypatch.setattr(plt, "close", checked_close)
    try:
        from capsule_lib.viz import page
    except ImportError:  # no ipywidgets: no page-mode explorers
        page = None
    if page is not None:
        figure_png = page.figure_png

        def checked_png(fig, dpi=60):
            check(fig, dpi, f"page-mode frame at {dpi} dpi: ")
            return figure_png(fig, dpi)

        monkeypatch.setattr(page, "figure_png", checked_png)
    with matplotlib.rc_context(BOOK_STYLE):
        yield
        for n in plt.get_fignums():
            check(plt.figure(n))
    close("all")
    if problems:
        more = [f"... and {len(problems) - 8} more figures"] if len(problems) > 8 else []
        pytest.fail(
            f"{len(problems)} figure(s) a reader cannot read at the book's size:\n  "
            + "\n  ".join(problems[:8] + more),
            pytrace=False,
        )
