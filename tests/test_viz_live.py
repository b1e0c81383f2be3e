"""The live widget's HTML (capsule_lib.viz.live): what a page holds before the reader starts it (the browser test
is tests/test_e2e_live_widget.py)."""

import base64
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from capsule_lib.viz.live import LIVE_GRIDS, SERVE_HINT, live_widget

REPO = Path(__file__).resolve().parents[1]


def _data(widget):
    m = re.search(r'data-images="([^"]*)"', widget.html)
    return json.loads(m.group(1).replace("&quot;", '"'))


def test_the_page_holds_the_test_images_and_loads_nothing_before_start():
    images = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    widget = live_widget("capsnet_mnist", images, [4, 1, 9])
    picks = _data(widget)
    assert [p["label"] for p in picks] == [4, 1, 9]
    assert base64.b64decode(picks[1]["pixels"]) == bytes(images[1].flatten().tolist())
    assert 'data-grid="32,6,6"' in widget.html and 'id="live-capsnet_mnist"' in widget.html
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", widget.html), "nothing is fetched by the page itself"
    assert widget._repr_html_() == widget.html and "LiveWidget" in repr(widget)
    assert json.dumps(SERVE_HINT)[1:-1] in widget.html and "python -m http.server -d _build/html" in SERVE_HINT
    floats = live_widget("efficient_capsnet_mnist", images.float() / 255, [4, 1, 9], widget_id="w2")
    assert _data(floats) == picks and 'data-grid=""' in floats.html and 'id="w2"' in floats.html


def test_the_offline_check_of_the_book_finds_no_network_resource_in_it():
    spec = importlib.util.spec_from_file_location("offline_book", REPO / "book" / "_ext" / "offline_book.py")
    offline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(offline)
    scanner = offline._Scanner()
    scanner.feed(live_widget("capsnet_mnist", torch.zeros(1, 28, 28), [0]).html)
    assert scanner.found == []


def test_bad_arguments_are_refused_in_one_line():
    x = torch.zeros(2, 1, 28, 28)
    with pytest.raises(ValueError, match="must be one of"):
        live_widget("em_norb", x, [0, 1])
    with pytest.raises(ValueError, match="labels: expected one label per image"):
        live_widget("capsnet_mnist", x, [0])
    with pytest.raises(ValueError, match="images: expected 1 to 8 images"):
        live_widget("capsnet_mnist", torch.zeros(9, 1, 28, 28), list(range(9)))
    with pytest.raises(ValueError, match="images: expected 1 to 8 images"):
        live_widget("capsnet_mnist", torch.zeros(2, 1, 32, 32), [0, 1])


def test_every_live_model_is_exported_by_the_book():
    from capsule_lib.export import LIVE_MODELS

    assert set(LIVE_GRIDS) == set(LIVE_MODELS)
