"""A minimal site serving one live widget per page, as the built book serves it (for the browser test and the
benchmark, which cannot afford a whole book build): ``_static/live/``, ``_static/onnxruntime-web/`` (the vendored
files), ``_static/live_models/`` (exported by ``book/_ext/live_models.py``, cached in ``_build/.live_models``) and
``<model>.html``, the widget's HTML from :func:`capsule_lib.viz.live.live_widget` in a bare page.

``python book/_tools/live_page.py OUT_DIR`` writes it; ``python -m http.server -d OUT_DIR`` serves it.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "book" / "_vendor"
MODELS = ("capsnet_mnist", "efficient_capsnet_mnist")  # the chapters' live widgets (capsule_lib.export.LIVE_MODELS)
PAGE = """<!doctype html>
<html lang="en" data-content_root="./"><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>{title}</title></head>
<body style="max-width:760px;margin:12px auto;font-family:sans-serif"><h1>{title}</h1>{widget}</body></html>
"""


def _extension():
    spec = importlib.util.spec_from_file_location("live_models", REPO / "book" / "_ext" / "live_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_images(n: int = 4):
    """``n`` test images of the data path at hand (real MNIST under CAPSULE_DATA, else the stand-in), one per class
    from 0 up, as uint8 ``[n, 1, 28, 28]`` and their labels."""
    import os

    import torch

    from capsule_lib.data import get_dataset

    ds = get_dataset("mnist", os.environ.get("CAPSULE_DATA") or REPO / "data", split="test", offline=True, standin=True)
    idx = [int(torch.nonzero(ds.labels == k)[0]) for k in range(n)]
    return ds.images[idx], [int(ds.labels[i]) for i in idx]


def write_site(out: Path, models: tuple[str, ...] = MODELS) -> Path:
    """Write the site into ``out``: the vendored files, the exported models and one page per model."""
    from capsule_lib.viz.live import live_widget

    static = out / "_static"
    for folder in ("live", "onnxruntime-web"):
        shutil.copytree(VENDOR / folder, static / folder, dirs_exist_ok=True)
    _extension().export_live_models(static / "live_models", REPO / "_build" / ".live_models")
    images, labels = test_images()
    for model in models:
        widget = live_widget(model, images, labels, twin="the static figure")
        (out / f"{model}.html").write_text(PAGE.format(title=model, widget=widget.html))
    return out


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log on stderr
        pass


def serve(root: Path) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``root`` on 127.0.0.1 (a free port) in a daemon thread; returns the server and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


if __name__ == "__main__":
    print(write_site(Path(sys.argv[1])))
