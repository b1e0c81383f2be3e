"""End to end: the chapters' widgets work in a real JupyterLab, driven by a headless browser.

A module-scoped fixture starts JupyterLab from this venv on 127.0.0.1 (random free port, random token) in a
temporary copy of ``book/``, with ``CAPSULE_SMOKE=1`` (smoke mode, training off). Each case in
:data:`EXPLORERS` opens a chapter with Playwright for Python in Debian's Chromium (``/usr/bin/chromium``;
Playwright's own browser download is not used), runs all cells, moves a slider and checks that the figure
in the explorer's output area changed (sha256 of the PNG bytes) and that its readout changed; before/after
screenshots go to ``_build/e2e/``. JupyterLab and every kernel it started are always shut down (the fixture
fails if a process of this server survives). The browser tests skip, saying why, when Chromium, Playwright or
JupyterLab is missing.

Adding an explorer is one :class:`ExplorerCase` in :data:`EXPLORERS`. The helpers are generic:

* :func:`open_notebook`, :func:`run_all_cells` - open a notebook and run it to the end (fails on errors);
* :func:`explorer_box` - the widget box holding the control with a given description label;
* :func:`move_slider` - move the slider with that label by N steps with the keyboard (negative = left);
* :func:`output_image_hash`, :func:`wait_for_image_change` - hash of the box's output image, and waiting until
  it differs from (or equals) a given hash, with a bounded wait and a clear message;
* :func:`readout_text`, :func:`wait_for_readout_change` - the box's text readout (``HTML``/``Label`` widgets);
* :func:`click_button` - click a widget button by its label.

Each case moves its slider by ``steps``, waits for the readout (and ``readout_pattern``) and a new, settled
image, then moves back and requires exactly the first image and readout again: a lost or out-of-order redraw
fails the test.

For example, the perturbation explorer (16 sliders, a sample picker, a reset button) adds::

    ExplorerCase("dynamic_routing.ipynb", slider="dim 3", steps=5, reset_button="reset",
                 readout_pattern=r"^capsule lengths: ")

and the test then also clicks "reset" and checks that the image and the readout return to their first state.

The module also checks the Colab path offline (no browser needed): each chapter's first cell does nothing
outside Colab and, inside Colab, pip-installs from this book's repository.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
OUT = REPO / "_build" / "e2e"
CHROMIUM = Path("/usr/bin/chromium")
CHAPTERS = sorted(p for p in BOOK.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium not installed (apt-get install -y chromium)"
)


@dataclass(frozen=True)
class ExplorerCase:
    """One widget explorer to drive: the notebook (relative to ``book/``), the description label of the
    slider to move and by how many steps, an optional regex the new readout must match (``{value}`` is
    replaced by the slider's new value) and an optional reset button that must restore the first state."""

    notebook: str
    slider: str
    steps: int = 3
    readout_pattern: str | None = None
    reset_button: str | None = None

    def __str__(self) -> str:
        return f"{self.notebook}:{self.slider}"


EXPLORERS = [
    ExplorerCase("primer.ipynb", slider="iterations", steps=3, readout_pattern=r"^iteration {value}: \|v_A\|="),
    # the capsule-dimension perturbation explorer of the dynamic-routing chapter (16 sliders, sample, reset)
    ExplorerCase(
        "dynamic_routing.ipynb", slider="dim 3", steps=5, readout_pattern=r"^capsule lengths: ", reset_button="reset"
    ),
    # the same explorer in the Efficient-CapsNet chapter (the original repository's ±0.30 range)
    ExplorerCase(
        "efficient_capsnet.ipynb", slider="dim 4", steps=4, readout_pattern=r"^capsule lengths: ", reset_button="reset"
    ),
    # the EM chapter's routing explorer: the class capsules re-routed live with more iterations
    ExplorerCase("em_routing.ipynb", slider="iterations", steps=2, readout_pattern=r"^predicts \w+; activations "),
    # the Heinsen chapter's pose explorer: the camera moved around the object, the view re-rendered live
    ExplorerCase(
        "heinsen_routing.ipynb",
        slider="azimuth",
        steps=3,
        readout_pattern=r"^azimuth \d+ deg, elevation 50 deg, lighting 0: predicts \w+",
    ),
    # the Tsai chapter's attention explorer: the class layer re-routed with more updates than it was trained with
    ExplorerCase(
        "tsai_inverted.ipynb",
        slider="iteration",
        steps=2,
        readout_pattern=r"^update {value}: -> [\w-]+: p=\d\.\d\d; routing to it: max ",
    ),
    # the perturbation explorer on a CapsNet trained on a folder of images: class names instead of digits
    ExplorerCase(
        "own_images.ipynb",
        slider="dim 3",
        steps=4,
        readout_pattern=r"^capsule lengths: [a-z-]+:\d",
        reset_button="reset",
    ),
    # the critique chapter's explorer: a trained network routed again at test time with more iterations
    ExplorerCase(
        "routing_critique.ipynb", slider="iterations", steps=3, readout_pattern=r"^prediction at T = {value}: \d+;"
    ),
]

RUN_TIMEOUT_S = 600  # running a whole chapter in smoke mode on a busy 2-core machine
CHANGE_TIMEOUT_S = 30  # a slider move -> the kernel redraws one figure


# ---------------------------------------------------------------------------------------- JupyterLab
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, token: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            pids.append(int(proc.name))
    return pids


@dataclass
class Lab:
    base: str
    token: str
    root: Path

    def url(self, notebook: str) -> str:
        return f"{self.base}/lab/tree/{notebook}?reset&token={self.token}"  # reset: no restored tabs


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on 127.0.0.1:<free port> with a token, serving a temporary copy of book/ (and of the benchmark
    results beside it); always shut down."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -r requirements.txt)")
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "book"
    shutil.copytree(BOOK, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "_build"))
    # the committed benchmark results the chapters read beside book/ (../benchmarks/results), as in the repository
    shutil.copytree(REPO / "benchmarks" / "results", tmp / "benchmarks" / "results")
    port, token = _free_port(), secrets.token_hex(24)
    runtime = tmp / "runtime"
    env = dict(
        os.environ,
        CAPSULE_SMOKE="1",
        JUPYTER_RUNTIME_DIR=str(runtime),
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        PYTHONPATH=str(REPO),
    )
    env.setdefault("CAPSULE_DATA", str(REPO / "data"))
    # no "get notified about Jupyter news?" toast over the screenshots
    notification = tmp / "user-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))
    log_path = tmp / "jupyterlab.log"
    log = open(log_path, "w")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    lab = Lab(base, token, root)

    def tail() -> str:
        log.flush()
        return log_path.read_text()[-3000:]

    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode} before it was ready:\n{tail()}")
            try:
                if _api(base, token, "/api/status")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab not ready on {base} after 120 s:\n{tail()}")
            time.sleep(0.5)
        yield lab
    finally:
        try:  # graceful: shuts down every kernel, then the server
            _api(base, token, "/api/shutdown", method="POST")
            proc.wait(timeout=30)
        except Exception:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()
        survivors = _processes_mentioning(str(runtime))
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not survivors, f"processes of the JupyterLab server outlived it (killed now): {survivors}"


# ------------------------------------------------------------------------------------ browser helpers
def open_notebook(page, lab: Lab, notebook: str, timeout_s: float = 120) -> None:
    """Open ``notebook`` (relative to the served root) and wait until its kernel is idle."""
    page.goto(lab.url(notebook), wait_until="domcontentloaded", timeout=timeout_s * 1000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=timeout_s * 1000)
    # JupyterLab restores the previous case's tabs; wait until *this* notebook is the current widget and its
    # own kernel is idle, or "run all" would go to the previous notebook (or to one without a kernel yet).
    page.wait_for_function(
        """(name) => { const w = window.jupyterapp.shell.currentWidget;
                       return w && w.context && w.context.path.endsWith(name)
                              && w.sessionContext && w.sessionContext.session
                              && w.sessionContext.session.kernel
                              && w.sessionContext.session.kernel.status === 'idle'; }""",
        arg=notebook,
        timeout=timeout_s * 1000,
    )


def run_all_cells(page, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Run every cell of the current notebook and wait until all code cells have executed; fail with the
    error output if a cell raised."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # Errors are read from the cell models, not the DOM: JupyterLab 4 does not render cells scrolled out of
    # view, and after an error the remaining cells never run, so waiting for "all done" alone would time out.
    errors_js = """() => window.jupyterapp.shell.currentWidget.content.widgets
                      .filter(c => c.model.type === 'code')
                      .flatMap(c => c.model.outputs.toJSON())
                      .filter(o => o.output_type === 'error')
                      .map(o => o.ename + ': ' + o.evalue)"""
    try:
        page.wait_for_function(
            """() => { const nb = window.jupyterapp.shell.currentWidget.content;
                       const code = nb.widgets.filter(c => c.model.type === 'code');
                       if (code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))) return true;
                       const done = code.every(c => c.model.executionCount !== null
                                                    && !c.promptNode?.textContent.includes('*'));
                       const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
                       return done && k.status === 'idle'; }""",
            timeout=timeout_s * 1000,
            polling=500,
        )
    except Exception as e:  # playwright TimeoutError
        pytest.fail(f"notebook did not finish running within {timeout_s} s ({type(e).__name__})")
    errors = page.evaluate(errors_js)
    if errors:
        pytest.fail("a cell raised an error:\n" + "\n".join(errors)[:3000])


def _exactly(label: str) -> re.Pattern:
    return re.compile(rf"^\s*{re.escape(label)}\s*$")


def explorer_box(page, label: str):
    """The innermost widget box (``VBox``) containing a control whose description label is ``label``."""
    control = page.locator(".widget-inline-hbox", has=page.locator(".widget-label", has_text=_exactly(label)))
    if control.count() == 0:
        pytest.fail(f"no widget control labelled {label!r} in the page")
    return page.locator(".widget-vbox", has=control.first).last


def _slider(page, label: str):
    box = explorer_box(page, label)
    slider = box.locator(".widget-slider", has=page.locator(".widget-label", has_text=_exactly(label)))
    if slider.count() == 0:
        pytest.fail(f"the control labelled {label!r} is not a slider")
    return slider.first


def slider_value(page, label: str) -> float:
    """The current value shown in the readout of the slider labelled ``label`` (waiting, within the usual bound,
    for the readout to be rendered: right after "run all" it can still be empty)."""
    readout = _slider(page, label).locator(".widget-readout")
    readout.scroll_into_view_if_needed()  # figures drawn above it can push it out of view, where JupyterLab
    # skips rendering cells (content-visibility) and innerText reads "": textContent is read instead
    text = _wait_until_settled(
        page, lambda: (readout.text_content() or "").strip(), f"readout of {label!r}", 0.0, CHANGE_TIMEOUT_S
    )
    return float(text)


def move_slider(page, label: str, steps: int) -> None:
    """Move the slider labelled ``label`` by ``steps`` steps with the keyboard (negative: to the left)."""
    slider = _slider(page, label)
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    key = "ArrowRight" if steps > 0 else "ArrowLeft"
    for _ in range(abs(steps)):
        handle.press(key)
    handle.blur()  # sends the value for sliders with continuous_update=False


def output_image_hash(box) -> str | None:
    """sha256 of the (last) PNG image in the box's output area, or None if there is none."""
    imgs = box.locator(".widget-output img")
    if imgs.count() == 0:
        return None
    src = imgs.last.get_attribute("src") or ""
    if src.startswith("data:"):
        data = base64.b64decode(src.split(",", 1)[1])
    else:  # blob: or file URLs: hash the source string
        data = src.encode()
    return hashlib.sha256(data).hexdigest()


def wait_for_image_change(
    page, box, reference: str | None, what: str, timeout_s: float = CHANGE_TIMEOUT_S, want_equal: bool = False
) -> str:
    """Poll until the box's image hash differs from ``reference`` (or equals it, ``want_equal``)."""
    deadline = time.monotonic() + timeout_s
    current = output_image_hash(box)
    while (current == reference) != want_equal or current is None:
        if time.monotonic() > deadline:
            state = "still different from" if want_equal else "unchanged, same as"
            pytest.fail(f"{what}: image {state} the reference after {timeout_s:.0f} s")
        page.wait_for_timeout(250)
        current = output_image_hash(box)
    return current


def readout_text(box) -> str:
    """Text of the box's readout widgets (HTML/Label), joined by newlines."""
    parts = box.locator(".widget-html-content, .widget-label-basic")
    return "\n".join(parts.nth(i).inner_text().strip() for i in range(parts.count()))


def _wait_until_settled(page, read, what: str, settle_s: float, timeout_s: float, poll_ms: int = 250):
    """Poll ``read()`` until its (non-empty) value has not changed for ``settle_s`` seconds; return it."""
    deadline = time.monotonic() + timeout_s
    current, since = read(), time.monotonic()
    while not current or time.monotonic() - since < settle_s:
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: did not settle within {timeout_s:.0f} s (last: {current!r})")
        page.wait_for_timeout(poll_ms)
        new = read()
        if new != current:
            current, since = new, time.monotonic()
    return current


def wait_for_stable_readout(page, box, what: str, settle_s: float = 1.0, timeout_s: float = CHANGE_TIMEOUT_S) -> str:
    """The box's (non-empty) readout, once it has not changed for ``settle_s`` seconds."""
    return _wait_until_settled(page, lambda: readout_text(box), f"{what}: readout", settle_s, timeout_s)


def wait_for_readout_change(
    page, box, reference: str, what: str, pattern: str | None = None, timeout_s: float = CHANGE_TIMEOUT_S
) -> str:
    """Poll until the box's readout differs from ``reference`` (and matches ``pattern``, if given)."""
    deadline = time.monotonic() + timeout_s
    current = readout_text(box)
    while current == reference or (pattern is not None and not re.search(pattern, current, re.M)):
        if time.monotonic() > deadline:
            expect = f" matching {pattern!r}" if pattern else ""
            pytest.fail(f"{what}: readout not updated{expect} after {timeout_s:.0f} s: {current!r}")
        page.wait_for_timeout(250)
        current = readout_text(box)
    return current


def wait_for_stable_image(page, box, what: str, settle_s: float = 1.5, timeout_s: float = CHANGE_TIMEOUT_S) -> str:
    """The box's image hash, once it has not changed for ``settle_s`` (keyboard moves redraw per step)."""
    return _wait_until_settled(page, lambda: output_image_hash(box), f"{what}: image", settle_s, timeout_s, 200)


def click_button(page, label: str) -> None:
    """Click the widget button whose label is ``label``."""
    button = page.locator("button.jupyter-button", has_text=_exactly(label))
    if button.count() == 0:
        pytest.fail(f"no widget button labelled {label!r}")
    button.first.click()


# ------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    pytest.importorskip(
        "playwright.sync_api", reason="playwright (Python) is not installed (pip install -r requirements.txt)"
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield b
        finally:
            b.close()


@needs_chromium
@pytest.mark.slow
@pytest.mark.parametrize("case", EXPLORERS, ids=str)
def test_explorer_slider_redraws_figure(case: ExplorerCase, jupyterlab, browser):
    OUT.mkdir(parents=True, exist_ok=True)
    stem = f"{Path(case.notebook).stem}-{re.sub(r'[^A-Za-z0-9]+', '_', case.slider)}"
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        open_notebook(page, jupyterlab, case.notebook)
        run_all_cells(page)
        box = explorer_box(page, case.slider)
        box.scroll_into_view_if_needed()
        first_hash = wait_for_image_change(page, box, None, f"{case}: initial figure")
        first_value = slider_value(page, case.slider)
        # the readout widget may render after the first image: wait for it, then for it to settle
        wait_for_readout_change(
            page,
            box,
            "",
            f"{case}: initial readout",
            pattern=case.readout_pattern.replace("{value}", f"{first_value:g}") if case.readout_pattern else None,
        )
        first_readout = wait_for_stable_readout(page, box, f"{case}: initial readout")
        box.screenshot(path=str(OUT / f"{stem}-before.png"))

        move_slider(page, case.slider, case.steps)
        new_value = slider_value(page, case.slider)
        assert new_value != first_value, f"{case}: slider did not move ({first_value} after {case.steps} steps)"
        moved = f"{case}: slider moved {first_value:g} -> {new_value:g}"
        pattern = case.readout_pattern.replace("{value}", f"{new_value:g}") if case.readout_pattern else None
        wait_for_readout_change(page, box, first_readout, moved, pattern=pattern)
        wait_for_image_change(page, box, first_hash, moved)
        final_hash = wait_for_stable_image(page, box, moved)
        assert final_hash != first_hash, f"{moved}: image back to the first one"
        moved_readout = wait_for_stable_readout(page, box, moved)
        box.screenshot(path=str(OUT / f"{stem}-after.png"))

        # and back: the figure must return to exactly the first one (catches lost or out-of-order redraws)
        move_slider(page, case.slider, -case.steps)
        back = f"{case}: slider moved back to {first_value:g}"
        wait_for_readout_change(page, box, "", back, pattern=f"^{re.escape(first_readout)}$")
        wait_for_image_change(page, box, first_hash, back, want_equal=True)

        if case.reset_button:  # move away again, then the button alone must restore the first state
            move_slider(page, case.slider, case.steps)
            again = f"{case}: moved again before reset"
            # settle first (every queued redraw done), so the reset is the last change the kernel sees
            wait_for_readout_change(page, box, "", again, pattern=f"^{re.escape(moved_readout)}$")
            wait_for_image_change(page, box, final_hash, again, want_equal=True)
            click_button(page, case.reset_button)
            wait_for_image_change(page, box, first_hash, f"{case}: after reset", want_equal=True)
            wait_for_readout_change(page, box, "", f"{case}: after reset", pattern=f"^{re.escape(first_readout)}$")
            assert slider_value(page, case.slider) == first_value, f"{case}: reset did not restore the slider"
            box.screenshot(path=str(OUT / f"{stem}-reset.png"))
    finally:
        try:
            page.screenshot(path=str(OUT / f"{stem}-page.png"), full_page=False)
        finally:
            ctx.close()


# ------------------------------------------------------------------------ the chapters' exercises, live
#: a reader's notebook: the questions of a chapter's end and an exercise filled in (the chapters' own cells)
QUIZ_NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": [
            "import torch\n", "from capsule_lib.exercises import Choice, Question, Quiz, check\n",
            "Quiz('Check your understanding', [Question('Over which axis?', (Choice('children'), "
            "Choice('parents', True)), 'Each child shares its vote.')])"]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": [
            "def squash_hinton(s):\n", "    n2 = (s**2).sum(-1, keepdim=True)\n",
            "    return n2 / (1 + n2) * s / torch.sqrt(n2)   # no epsilon\n", "\n",
            "check('squash_hinton', squash_hinton)"]},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}  # fmt: skip


@needs_chromium
@pytest.mark.slow
def test_questions_answer_and_exercises_check_in_jupyterlab(jupyterlab, browser):
    """In a live notebook: a quiz's answer shows its verdict and explanation, and ``check`` names a mistake."""
    (jupyterlab.root / "_quiz_e2e.ipynb").write_text(json.dumps(QUIZ_NOTEBOOK))
    OUT.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        open_notebook(page, jupyterlab, "_quiz_e2e.ipynb")
        run_all_cells(page, timeout_s=180)
        quiz = page.locator(".capsule-quiz").first
        quiz.wait_for(timeout=30_000)
        quiz.locator(".cq-choice", has_text="parents").click()
        feedback = quiz.locator(".cq-feedback")
        feedback.wait_for(state="visible", timeout=10_000)
        assert feedback.inner_text().startswith("Right.") and "Each child shares its vote." in feedback.inner_text()
        verdict = page.locator(".capsule-check").first
        verdict.wait_for(timeout=30_000)
        assert "NaN for a zero vector" in verdict.inner_text(), verdict.inner_text()
        page.screenshot(path=str(OUT / "exercises-jupyterlab.png"))
        assert not errors, errors
    finally:
        ctx.close()


# ----------------------------------------------------------------------------------- Colab, offline
def _first_cell(nb_path: Path) -> str:
    cell = json.loads(nb_path.read_text())["cells"][0]
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_colab_setup_cell(nb_path, monkeypatch):
    code = _first_cell(nb_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, *a, **k: calls.append(list(cmd)))
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(code, str(nb_path), "exec"), {})
    assert calls == [], f"{nb_path.name}: the Colab cell ran {calls} outside Colab"

    import types

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(compile(code, str(nb_path), "exec"), {})
    assert len(calls) == 1, f"{nb_path.name}: expected one pip call in Colab, got {calls}"
    cmd = calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"], cmd
    repo_url = yaml.safe_load((REPO / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    spec = cmd[-1]
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert spec.startswith("capsule_lib") and spec.endswith(f"@ git+{repo_url}@v{version}"), (
        f"{nb_path.name}: installs {spec!r}, not capsule_lib from {repo_url}"
    )
