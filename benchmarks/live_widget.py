"""Speed and weight of the live widgets (capsule_lib.viz.live) in headless Chromium on this machine.

    .venv/bin/python benchmarks/live_widget.py --out benchmarks/results/live_widget_chromium.json

For each live model, on the minimal site of ``book/_tools/live_page.py`` served from 127.0.0.1 (the widget's HTML
in a bare page, files as the built book serves them):

* **bytes**: what the page loads before "Start" and what starting adds (runtime + widget script + models), from
  the files behind every request the page made (goal: none before, <= 25 MB after);
* **start**: from the click to the first reconstruction (loading the runtime, compiling the wasm, parsing models);
* **stroke -> capsules**: from the end of a drawn stroke (pointer up) to the ten lengths, the couplings and the
  prediction on the page (the widget's own ``performance.now()`` stamps), over ``--strokes`` drawings of a 7
  (goal: Efficient-CapsNet <= 30 ms, CapsNet <= 300 ms); the encoder call alone as well;
* **decoder frame**: one decoder call and the reconstruction painted, while a slider is dragged with the keyboard
  (goal <= 5 ms).

Medians and 90th percentiles, after one warm-up stroke; Chromium runs ONNX Runtime Web's wasm backend with one
thread. The JSON records the browser version and the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
GOALS = {"stroke_ms": {"capsnet_mnist": 300, "efficient_capsnet_mnist": 30}, "decoder_ms": 5, "page_mb": 25}
SEVEN = [[(50, 45), (150, 45)], [(150, 45), (85, 165)]]
STATE = "() => document.querySelector('.capsule-live').capsuleLive"


def _live_page():
    spec = importlib.util.spec_from_file_location("live_page", REPO / "book" / "_tools" / "live_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "median": round(statistics.median(values), 2),
        "p90": round(values[min(len(values) - 1, int(0.9 * len(values)))], 2),
        "n": len(values),
    }


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _bytes(urls: list[str], root: Path) -> int:
    return sum((root / urlparse(u).path.lstrip("/")).stat().st_size for u in set(urls))


def bench_model(browser, base: str, root: Path, model: str, strokes: int, frames: int) -> dict:
    page = browser.new_page(viewport={"width": 900, "height": 1000})
    urls, errors = [], []
    page.on("request", lambda r: urls.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base + f"{model}.html")
    before = list(urls)
    t0 = time.perf_counter()
    page.click(".cl-start")
    page.wait_for_function(f"() => {{ const s = ({STATE})(); return s && (s.error || (s.ready && s.recon)); }}")
    start_s = time.perf_counter() - t0
    box = page.locator(".cl-pen").bounding_box()
    for _ in range(strokes + 1):
        page.click(".cl-clear")
        for stroke in SEVEN:
            page.mouse.move(box["x"] + stroke[0][0], box["y"] + stroke[0][1])
            page.mouse.down()
            page.mouse.move(box["x"] + stroke[1][0], box["y"] + stroke[1][1], steps=8)
            page.mouse.up()
            page.wait_for_function(f"() => ({STATE})().encodedInput === ({STATE})().input")
    page.wait_for_timeout(300)
    page.locator(".cl-dim").nth(2).focus()
    decoded = page.evaluate(f"() => ({STATE})().timings.decoder.length")
    for _ in range(frames):
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(20)
    page.wait_for_timeout(300)
    timings = page.evaluate(f"() => ({STATE})().timings")
    state = page.evaluate(f"() => ({{ cls: ({STATE})().cls, error: ({STATE})().error || null }})")
    page.close()
    stroke_ms = timings["stroke"][2:]  # the first drawing's two strokes are the warm-up
    added = urls[len(before) :]
    result = {
        "prediction_of_the_drawn_7": state["cls"],
        "errors": errors + ([state["error"]] if state["error"] else []),
        "bytes_before_start": _bytes(before, root),
        "bytes_added_by_start": _bytes(added, root),
        "files_added_by_start": sorted({urlparse(u).path for u in added}),
        "start_s": round(start_s, 2),
        "stroke_to_capsules_ms": _stats(stroke_ms),
        "encoder_call_ms": _stats(timings["encoder"][2:]),
        "decoder_frame_ms": _stats(timings["decoder"][decoded:]),
        "goals": {
            "stroke_ms": GOALS["stroke_ms"][model],
            "decoder_ms": GOALS["decoder_ms"],
            "page_mb": GOALS["page_mb"],
        },
    }
    result["meets"] = {
        "stroke_ms": result["stroke_to_capsules_ms"]["median"] <= GOALS["stroke_ms"][model],
        "decoder_ms": result["decoder_frame_ms"]["median"] <= GOALS["decoder_ms"],
        "page_mb": result["bytes_added_by_start"] <= GOALS["page_mb"] * 1e6,
        "nothing_before_start": not [u for u in before if u.endswith((".wasm", ".onnx", ".mjs", ".js"))],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/live_widget_chromium.json")
    parser.add_argument("--strokes", type=int, default=10, help="drawings of a 7 per model (after one warm-up)")
    parser.add_argument("--frames", type=int, default=30, help="slider steps timed per model")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    live_page = _live_page()
    with TemporaryDirectory() as tmp:
        root = live_page.write_site(Path(tmp))
        server, base = live_page.serve(root)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            results = {m: bench_model(browser, base, root, m, args.strokes, args.frames) for m in live_page.MODELS}
            version = browser.version
            browser.close()
        server.shutdown()
    out = {
        "what": "live widgets in headless Chromium: bytes, start, stroke -> capsules, decoder frame",
        "browser": f"Chromium {version} (headless), ONNX Runtime Web 1.30.0, wasm backend, 1 thread",
        "cpu": _cpu(),
        "cpu_count": __import__("os").cpu_count(),
        "note": "the machine's 2 cores were shared with other jobs while this ran",
        "models": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
