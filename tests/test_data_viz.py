"""capsule_lib.viz.data: the figures of the data page build, and generated sets are labelled as such."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from capsule_lib.data import get_dataset  # noqa: E402
from capsule_lib.viz import data as vd  # noqa: E402

pytestmark = pytest.mark.usefixtures("readable_figures")  # figures readable at the book's size (conftest.py)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_to_display_layouts():
    assert vd.to_display(torch.zeros(1, 5, 6, dtype=torch.uint8)).shape == (5, 6)
    assert vd.to_display(torch.zeros(2, 5, 6)).shape == (5, 14)  # stereo side by side with a 2 px gap
    assert vd.to_display(torch.zeros(3, 5, 6)).shape == (5, 6, 3)
    assert vd.to_display(torch.full((1, 2, 2), 255, dtype=torch.uint8)).max() == 1.0


def test_figures_of_generated_sets_say_generated(tmp_path):
    g = get_dataset("glyph_digits", tmp_path, "test", n=40)
    fig = vd.show_samples(g, n=8, ncols=4)
    assert len(fig.axes) == 8 and "GENERATED" in fig._suptitle.get_text()
    mm = get_dataset("multimnist", tmp_path, "test", source="glyph_digits", n=40)
    fig = vd.show_multimnist(mm, n=5)
    assert len(fig.axes) == 15 and "GENERATED" in fig._suptitle.get_text()
    labels = [ax.get_title() for ax in fig.axes[:5]]
    assert all("+" in t for t in labels)
    fig = vd.plot_overlap({"a": mm, "b": mm})
    assert len(fig.axes) == 2
    am = get_dataset("affine_mnist", tmp_path, "test", source="glyph_digits", n=20)
    assert len(vd.show_affine(am, n=6).axes) == 6
    rn = get_dataset("rendered_norb", tmp_path, "train_full", instances=[4], elevations=[0, 8], azimuths=[0, 9])
    fig = vd.show_viewpoints(rn, category=1, lighting=2)
    ax = fig.axes[0]
    assert "GENERATED" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0°", "180°"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["30°", "70°"]
    assert ax.images[0].get_array().shape == (2 * 96 + 3, 2 * 96 + 3)  # 2 x 2 views with 3 px gaps
    assert len(vd.show_lightings(rn, category=3, elevation=8, azimuth=9).axes) == 6
    assert len(vd.show_stereo_pairs(rn, n=4).axes) == 4
