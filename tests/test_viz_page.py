"""Page-mode explorers: precomputed frames, switched in the browser by jslinks (no kernel)."""

from __future__ import annotations

import io

import ipywidgets as W
import pytest
import torch
from ipywidgets.widgets.widget_link import Link
from PIL import Image

from capsule_lib.analysis import decode_poses
from capsule_lib.models import CapsNet, CapsNetConfig
from capsule_lib.viz.capsules import perturb_poses
from capsule_lib.viz.page import PAGE_EXPLORER_CLASS, page_explorer, perturbation_page_explorer, png_bytes

pytestmark = pytest.mark.usefixtures("readable_figures")  # figures readable at the book's size (conftest.py)

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


def _decode_png(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png))


def _links(box):
    return [w for w in box._links if isinstance(w, Link)]


def test_png_bytes_enlarges_with_nearest_pixels():
    img = torch.zeros(1, 2, 3)
    img[0, 1, 2] = 1.0
    pic = _decode_png(png_bytes(img, scale=4))
    assert pic.size == (12, 8) and pic.getpixel((11, 7)) == 255 and pic.getpixel((0, 0)) == 0


def _parts(box):
    (row_box, col_box, images, *_) = box.children
    return row_box.children[1], row_box.children[2], col_box.children[1], col_box.children[2], images.children[-1]


def test_page_explorer_links_each_slider_to_the_frame_shown():
    frames = [[png_bytes(torch.full((1, 2, 2), (r * 3 + c) / 8)) for c in range(3)] for r in range(2)]
    box = page_explorer(frames, ("row", ["a", "b"]), ("col", ["x", "y", "z"]), initial=(1, 2))
    assert PAGE_EXPLORER_CLASS in box._dom_classes
    rows, row_readout, cols, col_readout, shown = _parts(box)
    outer = shown.children[1]
    assert (rows.value, cols.value, outer.selected_index, rows.max, cols.max) == (1, 2, 1, 1, 2)
    assert [s.selected_index for s in outer.children] == [2, 2]
    assert [h.value for h in col_readout.children] == ["<code>x</code>", "<code>y</code>", "<code>z</code>"]
    pairs = {(id(link.source[0]), id(link.target[0])) for link in _links(box)}
    assert all(link.source[1] == "value" and link.target[1] == "selected_index" for link in _links(box))
    assert pairs == {(id(rows), id(row_readout)), (id(cols), id(col_readout)), (id(rows), id(outer))} | {
        (id(cols), id(s)) for s in outer.children
    }
    assert outer.children[0].children[1].value == frames[0][1]
    # no widget here asks MathJax 2 to typeset: no descriptions, no Label, no selection-slider readouts
    assert not rows.description and not rows.readout and not isinstance(rows, W.SelectionSlider)
    with pytest.raises(ValueError, match=r"frames must be \[2 rows\]\[3 columns\]"):
        page_explorer(frames[:1], ("row", ["a", "b"]), ("col", ["x", "y", "z"]))


def test_perturbation_page_explorer_frames_are_the_decoded_perturbations():
    torch.manual_seed(0)
    model = CapsNet(TINY).eval()
    x = torch.rand(1, 1, 28, 28)
    with torch.no_grad():
        poses = model(x).poses[0]  # [10, 8]
    box = perturbation_page_explorer(model, x[0], poses, label=3, value_range=0.2, steps=5)
    rows, _, cols, col_readout, shown = _parts(box)
    labels = [h.value for h in col_readout.children]
    assert labels == [f"<code>{v}</code>" for v in ("-0.20", "-0.10", "+0.00", "+0.10", "+0.20")] and cols.value == 2
    assert rows.max == 7 and rows.value == 0
    outer = shown.children[1]
    frame = outer.children[6].children[4].value  # dimension 6 at +0.20
    want = decode_poses(model, perturb_poses(poses, torch.eye(8)[6] * 0.2)[None], 3)[0]
    assert frame == png_bytes(want)
    assert outer.children[0].children[2].value == outer.children[7].children[2].value  # offset 0: same image


def test_routing_page_explorers_draw_one_frame_per_image_and_iteration():
    from capsule_lib.analysis import toy_votes
    from capsule_lib.viz.page import routing_page_explorer, toy_routing_page_explorer

    torch.manual_seed(0)
    model = CapsNet(TINY).eval()
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        trace = model(x, return_routing=True).trace
    box = routing_page_explorer(x, trace, n_images=2, grid=(4, 6, 6))
    rows, _, cols, _, shown = _parts(box)
    assert (rows.max, cols.max, rows.value, cols.value) == (1, 2, 0, 0)  # 2 images x 3 iterations, first shown
    outer = shown.children[1]
    pngs = [[bytes(im.value) for im in stack.children] for stack in outer.children]
    assert all(p.startswith(b"\x89PNG") for row in pngs for p in row) and len({p for row in pngs for p in row}) == 6

    from capsule_lib import dynamic_routing

    t = toy_votes(groups=(5, 3), n_outliers=2, seed=0)
    _, toy_trace = dynamic_routing(t.votes, iterations=4, return_routing=True)
    one = toy_routing_page_explorer(t, toy_trace)
    (col_box, images, _) = one.children
    slider = col_box.children[1]
    stack = images.children[-1].children[1].children[0]
    assert (slider.max, slider.value, len(stack.children)) == (3, 0, 4)
    assert len(_links(one)) == 2  # the slider to its readout and to the one row of frames
