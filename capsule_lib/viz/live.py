"""The live widgets: a trained capsule network running in the reader's browser, on the reader's own drawing.

:func:`live_widget` emits the HTML a chapter shows (a ``Start the live model`` button and a few test images). Nothing
heavy is in the page: when the reader presses the button, the page loads the widget's script
(``_static/live/capsule_live.js``), the vendored ONNX Runtime Web (``_static/onnxruntime-web/``, wasm backend, one
thread) and the model's two ONNX graphs (``_static/live_models/<name>.{encoder,decoder}.onnx``, exported from the
shipped checkpoint by :mod:`capsule_lib.export` when the book is built). The arithmetic stays in the graphs; the
script only draws. Opened from ``file://`` (where a browser refuses to fetch the runtime and the models) the widget
says in one line how to serve the book and points at its static twin, the chapter's one-dimension figure.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence

import torch

from .._checks import check_choice
from .._contracts import checked

__all__ = ["LIVE_GRIDS", "SERVE_HINT", "LiveWidget", "live_widget"]

#: the primary-capsule grid (types, height, width) of each live model whose couplings the widget draws as the
#: chapter's routing view (a mosaic per iteration); a model not listed has its couplings drawn as a matrix
LIVE_GRIDS: dict[str, tuple[int, int, int] | None] = {"capsnet_mnist": (32, 6, 6), "efficient_capsnet_mnist": None}

#: the one line a page shows instead of the live widget when it is opened from a file, not served
SERVE_HINT = "The live model needs the book served over HTTP: run python -m http.server -d _build/html and open"

_BOOT = """<script>(function () {
  var el = document.getElementById(%(id)s), btn = el.querySelector(".cl-start");
  if (location.protocol === "file:") {
    el.querySelector(".cl-note").textContent =
      %(hint)s + " http://127.0.0.1:8000/ (" + %(twin)s + " is its static twin).";
    btn.disabled = true; return;
  }
  var root = (document.documentElement.dataset.content_root || "./") + "_static/";
  btn.addEventListener("click", function () {
    btn.disabled = true; btn.textContent = "loading the model...";
    var load = function (src, next) {
      if (window.CapsuleLive && src.indexOf("capsule_live") >= 0) return next();
      var s = document.createElement("script"); s.src = root + src; s.onload = next;
      s.onerror = function () { btn.textContent = "could not load " + src; }; document.head.appendChild(s);
    };
    load("live/capsule_live.js", function () { window.CapsuleLive.start(el, root); });
  });
})();</script>"""


class LiveWidget:
    """The HTML of one live widget; shown by Jupyter (``_repr_html_``) and written into the built page.

    Attributes
    ----------
    html : str
        The widget's HTML: its container, the start button, the test images (as data) and the boot script.
    """

    def __init__(self, html_text: str) -> None:
        self.html = html_text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:  # the text a page without HTML shows
        return "LiveWidget: a live capsule network, shown in a browser (its HTML: .html)"


@checked
def live_widget(
    model: str,
    images: torch.Tensor,
    labels: Sequence[int],
    twin: str = "the one-dimension figure below",
    widget_id: str | None = None,
) -> LiveWidget:
    """The live widget of a shipped model: draw a digit, watch the capsules, routing and reconstruction follow.

    Parameters
    ----------
    model : str
        A model of :data:`LIVE_GRIDS` (``"capsnet_mnist"``, ``"efficient_capsnet_mnist"``), exported into the
        built book by its build step (``book/_ext/live_models.py``).
    images : torch.Tensor
        ``[N, 1, 28, 28]`` or ``[N, 28, 28]`` test images the reader can pick (uint8, or float in [0, 1]); 1 to 8.
    labels : sequence of int
        Their ``N`` labels.
    twin : str, optional
        What a page without the live model shows instead (default ``"the one-dimension figure below"``).
    widget_id : str or None, optional
        The HTML id of the container; ``None`` (default): ``live-<model>``.

    Returns
    -------
    LiveWidget
        Its HTML (``_repr_html_``).
    """
    check_choice(model, tuple(LIVE_GRIDS), "model")
    x = images.reshape(images.shape[0], -1) if images.dim() in (3, 4) else images
    if images.dim() not in (3, 4) or x.shape[1] != 784 or not 1 <= x.shape[0] <= 8:
        raise ValueError(f"images: expected 1 to 8 images [N, 1, 28, 28] or [N, 28, 28], got {tuple(images.shape)}")
    if len(labels) != x.shape[0]:
        raise ValueError(f"labels: expected one label per image ({x.shape[0]}), got {len(labels)}")
    if x.dtype != torch.uint8:
        x = (x.float().clamp(0, 1) * 255).round().to(torch.uint8)
    picks = [{"label": int(y), "pixels": base64.b64encode(bytes(row.tolist())).decode()} for row, y in zip(x, labels)]
    grid = LIVE_GRIDS[model]
    wid = widget_id or f"live-{model}"
    attrs = {
        "id": wid,
        "class": "capsule-live",
        "data-model": model,
        "data-grid": ",".join(map(str, grid)) if grid else "",
        "data-images": json.dumps(picks),
    }
    opening = " ".join(f'{k}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
    boot = _BOOT % {"id": json.dumps(wid), "hint": json.dumps(SERVE_HINT), "twin": json.dumps(twin)}
    body = (
        f"<div {opening}>"
        '<button class="cl-start" type="button">Start the live model</button> '
        '<span class="cl-note">Draw a digit and watch the class capsules, the routing and the reconstruction '
        "follow; about 15 to 30 MB are loaded when you start.</span>"
        f"<noscript>This widget needs JavaScript; {html.escape(twin)} is its static twin.</noscript>"
        f"</div>{boot}"
    )
    return LiveWidget(body)
