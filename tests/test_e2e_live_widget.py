"""End to end: the live widgets (capsule_lib.viz.live) in headless Chromium, checked against PyTorch.

A module-scoped fixture writes a minimal site as the built book serves it (``book/_tools/live_page.py``: the
vendored ONNX Runtime Web, the widget's script, the models exported from the shipped checkpoints, one page per
model holding the widget's HTML) and serves it from 127.0.0.1. For each model the test presses "Start", draws the
strokes of a 7 with the mouse, and checks that the class and the ten lengths the page shows equal PyTorch's on the
28 x 28 input the widget fed its encoder (within 1e-4); it moves two of the 16 sliders with the keyboard and checks
that the reconstruction changed and equals the PyTorch decoder's for the pose plus those offsets; it counts 0 page
errors, 0 console errors and 0 requests leaving 127.0.0.1, and that nothing heavy loads before "Start". Opened from
``file://`` the widget shows the one line saying how to serve the book. Screenshots go to ``_build/e2e/``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "_build" / "e2e"
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium not installed (apt-get install -y chromium)"),
]
pytest.importorskip("onnx", reason="the optional extra 'export' (onnx, onnxscript)")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")

MODELS = ("capsnet_mnist", "efficient_capsnet_mnist")
#: the strokes of a 7 on the 196 x 196 pen canvas: the bar, then the stem
SEVEN = [[(50, 45), (150, 45)], [(150, 45), (85, 165)]]
STATE = "() => document.querySelector('.capsule-live').capsuleLive"
SETTLED = """() => { const s = document.querySelector('.capsule-live').capsuleLive, w = s && s.ready;
  return w && s.encodedInput === s.input && s.decodedClass !== undefined; }"""


def _live_page():
    spec = importlib.util.spec_from_file_location("live_page", REPO / "book" / "_tools" / "live_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    live_page = _live_page()
    root = live_page.write_site(tmp_path_factory.mktemp("live_site"))
    server, base = live_page.serve(root)
    yield root, base
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page with every request, page error and console error recorded."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 900, "height": 1000})
        self.requests, self.errors = [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)


def _draw(page, strokes):
    box = page.locator(".cl-pen").bounding_box()
    for stroke in strokes:
        (x0, y0), rest = stroke[0], stroke[1:]
        page.mouse.move(box["x"] + x0, box["y"] + y0)
        page.mouse.down()
        for x, y in rest:
            page.mouse.move(box["x"] + x, box["y"] + y, steps=12)
        page.mouse.up()


def _settle(page):
    page.wait_for_function(SETTLED, timeout=60_000)
    page.wait_for_timeout(300)  # a decoder frame queued by the last stroke
    page.wait_for_function(SETTLED, timeout=60_000)


@pytest.mark.parametrize("name", MODELS)
def test_the_live_widget_equals_pytorch_on_a_drawn_digit(site, browser, name):
    from capsule_lib.pretrained import load_pretrained

    root, base = site
    w = Watched(browser)
    page = w.page
    page.goto(base + f"{name}.html")
    assert [u for u in w.requests if u.endswith((".wasm", ".onnx", ".mjs", "ort.wasm.min.js"))] == []
    page.click(".cl-start")
    page.wait_for_function(f"() => {{ const s = ({STATE})(); return s && (s.error || (s.ready && s.recon)); }}")
    assert page.evaluate(f"() => ({STATE})().error || ''") == ""
    page.click(".cl-clear")
    _draw(page, SEVEN)
    _settle(page)
    got = page.evaluate(
        f"""() => {{ const s = ({STATE})(), q = (c) => document.querySelector(c);
        return {{ input: Array.from(s.encodedInput), cls: Number(q('.cl-pred').dataset.cls),
        shown: Array.from(document.querySelectorAll('.cl-len')).map(e => Number(e.dataset.length)),
        recon: Array.from(s.recon), poses: Array.from(s.poses) }}; }}"""
    )
    model, _ = load_pretrained(name)
    x = torch.tensor(got["input"], dtype=torch.float32).view(1, 1, 28, 28)
    assert x.sum() > 20, "the drawing reached the encoder"
    with torch.no_grad():
        out = model(x)
    lengths = out.scores[0].numpy()
    assert got["cls"] == int(lengths.argmax()) == 7
    assert np.abs(np.array(got["shown"]) - lengths).max() < 1e-4
    assert np.abs(np.array(got["poses"]).reshape(10, 16) - out.poses[0].numpy()).max() < 1e-4
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / f"live_{name}_drawn.png"), full_page=True)

    before = np.array(got["recon"])
    for d, presses, key in ((0, 20, "ArrowRight"), (4, 15, "ArrowLeft")):
        page.locator(".cl-dim").nth(d).focus()
        for _ in range(presses):
            page.keyboard.press(key)
    _settle(page)
    moved = page.evaluate(f"() => {{ const s = ({STATE})(); return [Array.from(s.offsets), Array.from(s.recon)]; }}")
    offsets = np.array(moved[0])
    assert np.allclose(offsets[[0, 4]], [0.2, -0.15], atol=1e-6) and np.count_nonzero(offsets) == 2
    pose = out.poses[0, 7] + torch.tensor(offsets, dtype=torch.float32)
    poses = torch.zeros(1, 10, 16)
    poses[0, 7] = pose
    with torch.no_grad():
        want = model.reconstruct(poses, torch.tensor([7]))[0, 0].flatten().numpy()
    after = np.array(moved[1])
    assert np.abs(after - before).max() > 0.05, "moving two sliders changed the reconstruction"
    assert np.abs(after - want).max() < 1e-4
    page.screenshot(path=str(OUT / f"live_{name}_sliders.png"), full_page=True)

    page.click(".cl-reset")
    _settle(page)
    reset = np.array(page.evaluate(f"() => Array.from(({STATE})().recon)"))
    assert np.abs(reset - before).max() < 1e-6
    assert w.errors == []
    outside = [u for u in w.requests if not u.startswith(base) and not u.startswith("data:")]
    assert outside == [], f"requests leaving 127.0.0.1: {outside}"
    page.close()


def test_from_file_the_widget_says_how_to_serve_the_book(site, browser):
    from capsule_lib.viz.live import SERVE_HINT

    root, _ = site
    w = Watched(browser)
    w.page.goto((root / "capsnet_mnist.html").as_uri())
    note = w.page.locator(".cl-note").inner_text()
    assert note.startswith(SERVE_HINT) and "http://127.0.0.1:8000/" in note and "static twin" in note
    assert w.page.locator(".cl-start").is_disabled()
    assert [u for u in w.requests if not u.endswith("capsnet_mnist.html")] == [] and w.errors == []
    w.page.close()


def test_the_vendored_runtime_is_what_the_readme_says():
    vendor = REPO / "book" / "_vendor" / "onnxruntime-web"
    names = sorted(p.name for p in vendor.iterdir())
    assert names == ["LICENSE", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm", "ort.wasm.min.js"]
    version = (vendor / "ort.wasm.min.js").read_text()[:200]
    assert "ONNX Runtime Web v1.30.0" in version and "1.30.0" in (REPO / "book/_vendor/README.md").read_text()
    assert (vendor / "ort-wasm-simd-threaded.wasm").read_bytes()[:4] == b"\0asm"
