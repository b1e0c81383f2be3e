"""Full-page screenshots of the built book with headless Chromium, plus an offline check.

    .venv/bin/python book/_tools/screenshots.py [--html _build/html] [--out _build/screenshots] [page.html ...]

For every page (default: every page under ``book/`` plus ``genindex.html``) it opens the ``file://`` URL in
Debian's Chromium through Playwright, waits for MathJax and the widget renderer, saves
``<out>/<page path with / -> __>.png`` and reports:

* every request that left the machine (anything but ``file:``, ``data:``, ``blob:``, ``about:``),
* math that MathJax did not typeset (raw ``\\(`` or ``$$`` left in ``.math`` elements),
* Markdown tables shown as raw ``|---|`` text,
* widget views in the saved state that did not render, and JavaScript errors,
* code blocks wider than their box (cut off at the right edge), absolute filesystem paths of the build
  machine in the page text, and output areas that show nothing (a blank gap),
* concept questions (``capsule_lib.exercises`` quizzes) that do not answer: in every quiz, clicking each question's
  right and a wrong choice (typing the answer of a numeric one) must show the verdict and the explanation, with no
  JavaScript error on the page (a screenshot of the first answered quiz goes next to the page's),
* tables and images wider than the content column (the ``article``'s content box, 688 px at the default
  1280 px wide viewport): a table whose scrolling wrapper scrolls sideways (hidden columns) or that reaches past
  the column's right edge, an image cut off or past that edge (one scaled down by ``max-width: 100%`` fits);
  one line per offender with the table's first-row header or the image's file name.

Exits 1 if any page has one of these problems (JavaScript errors are printed, not counted).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")

_PROBE = """() => {
  const math = Array.from(document.querySelectorAll('.math, span.math, div.math'));
  const raw = math.filter(e => !e.querySelector('mjx-container') && /\\\\\\(|\\\\\\[|\\$\\$/.test(e.textContent)).length;
  const typeset = document.querySelectorAll('mjx-container').length;
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  const rendered = document.querySelectorAll('.widget-subarea .jupyter-widgets, .widget-subarea .lm-Widget').length;
  const imgs = Array.from(document.querySelectorAll('img')).filter(i => i.complete && i.naturalWidth > 0).length;
  const brokenImgs = Array.from(document.querySelectorAll('img')).filter(i => i.complete && i.naturalWidth === 0).map(i => i.getAttribute('src'));
  // a Markdown table that was not rendered (e.g. an output rendered as CommonMark) shows up as '|---|' text
  const rawTables = Array.from(document.querySelectorAll('article p, .output p, .cell_output p'))
                         .filter(p => /\\|\\s*-{3,}\\s*\\|/.test(p.textContent)).length;
  // code that does not fit its box: the reader sees it cut off (or has to scroll sideways)
  const overflow = Array.from(document.querySelectorAll('div.highlight pre, .cell_input pre'))
      .filter(p => p.scrollWidth > p.clientWidth + 2)
      .map(p => p.textContent.split(String.fromCharCode(10)).reduce((a, b) => b.length > a.length ? b : a, '').trim().slice(0, 70));
  // the build machine's absolute paths printed on the page
  const main = document.querySelector('main') || document.body;
  const absPaths = (main.innerText.match(/(?:^|[\\s'"(=:])\\/(?:home|root|work|tmp|Users|mnt|srv|opt|var|private)\\/[^\\s'")]*/gm) || [])
      .map(s => s.trim()).slice(0, 5);
  // an output area that shows nothing (e.g. a progress bar or widget that left no state): a blank gap
  const blank = e => !e.innerText.trim() && !(e.matches('img, svg, canvas, table, video, iframe') ||
                                                e.querySelector('img, svg, canvas, table, mjx-container, video, iframe'));
  const emptyOutputs = Array.from(document.querySelectorAll('.cell_output'))
      .filter(o => blank(o) || Array.from(o.children).some(c => c.getBoundingClientRect().height > 4 && blank(c)))
      .map(o => { const c = o.closest('.cell'); const code = c && c.querySelector('.cell_input pre');
                  return code ? code.textContent.trim().split(String.fromCharCode(10))[0].slice(0, 70) : '(output without code)'; });
  // tables and figures wider than the content column: the reader sees hidden columns behind a sideways scroll
  // (or a picture cut off at the column's edge). An image scaled down by CSS (max-width: 100%) fits.
  const col = document.querySelector('article') || main;
  const cs = getComputedStyle(col), cr = col.getBoundingClientRect();
  const colRight = cr.right - parseFloat(cs.paddingRight) - parseFloat(cs.borderRightWidth);
  const colWidth = Math.round(colRight - cr.left - parseFloat(cs.paddingLeft) - parseFloat(cs.borderLeftWidth));
  const scroller = e => {  // the nearest box between e and the column that scrolls or clips sideways
    for (let a = e.parentElement; a && a !== col && a !== document.body; a = a.parentElement)
      if (/auto|scroll|hidden|clip/.test(getComputedStyle(a).overflowX)) return a;
    return null;
  };
  const tooWide = [];
  const check = (e, kind, label) => {
    const r = e.getBoundingClientRect(), box = scroller(e);
    if (box && box.scrollWidth > box.clientWidth + 2 && r.right > box.getBoundingClientRect().right + 2)
      tooWide.push({kind, label, width: Math.round(Math.max(box.scrollWidth, r.width)), column: Math.min(box.clientWidth, colWidth), scrolls: true});
    else if (r.right > colRight + 2)
      tooWide.push({kind, label, width: Math.round(r.width), column: colWidth, scrolls: false});
  };
  for (const t of col.querySelectorAll('table')) {
    if (!t.getClientRects().length) continue;  // not shown (e.g. a collapsed cell)
    const row = t.querySelector('tr');
    const head = row ? Array.from(row.cells).map(c => c.innerText.trim().replace(/\\s+/g, ' ')).join(' | ') : '';
    check(t, 'table', head.slice(0, 90));
  }
  for (const i of col.querySelectorAll('img')) {
    if (i.offsetParent === null || !i.getClientRects().length) continue;  // a hidden frame of an explorer
    const src = i.getAttribute('src') || '';
    check(i, 'image', src.startsWith('data:') ? src.slice(0, 30) + '...' : src.split('/').pop());
  }
  return {too_wide: tooWide, column_px: colWidth, code_overflow: overflow, abs_paths: absPaths, empty_outputs: emptyOutputs, raw_tables: rawTables, math: math.length, raw_math: raw, typeset, widget_views: views, widgets_rendered: rendered, images: imgs, broken_images: brokenImgs};
}"""


#: largest page (HTML file, widget state included) allowed to carry page-mode explorers
PAGE_EXPLORER_MAX_KB = 3000

_SHOWN_FRAME = """(box) => {
  const imgs = [...box.querySelectorAll('img')].filter(i => i.offsetParent !== null && i.naturalWidth > 0);
  const img = imgs[imgs.length - 1];  // the first image is the fixed input, the last visible one the frame
  if (!img) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.getContext('2d').drawImage(img, 0, 0);
  return c.toDataURL();
}"""


def check_page_explorer(page, box) -> list[str]:
    """Move the last slider of one page-mode explorer two steps right and back (keyboard on the slider
    handle, as a reader would): the shown frame must change, then come back to the first one."""
    handles = box.locator(".noUi-handle")
    if handles.count() < 1:
        return ["page-mode explorer without a slider"]
    start = box.evaluate(_SHOWN_FRAME)
    if start is None:
        return ["page-mode explorer shows no image on first load"]
    offset = handles.nth(handles.count() - 1)  # the last slider picks the frame within a row
    offset.focus()
    for key in ("ArrowRight", "ArrowRight"):
        offset.press(key)
    page.wait_for_timeout(300)
    moved = box.evaluate(_SHOWN_FRAME)
    for key in ("ArrowLeft", "ArrowLeft"):
        offset.press(key)
    page.wait_for_timeout(300)
    back = box.evaluate(_SHOWN_FRAME)
    problems = []
    if moved == start:
        problems.append("page-mode explorer: moving the offset slider did not change the image")
    if back != start:
        problems.append("page-mode explorer: moving the slider back did not bring the first image back")
    return problems


_ANSWER = """(q) => {
  const box = q.querySelector('.cq-feedback'), verdict = q.querySelector('.cq-verdict');
  const shown = box && !box.hidden && box.offsetParent !== null;
  return shown ? verdict.textContent.trim() + ' | ' + q.querySelector('.cq-explanation').textContent.trim() : null;
}"""


def check_quiz(page, box) -> list[str]:
    """Answer every question of one quiz as a reader would (click the right choice and a wrong one; type a numeric
    answer): each must show its verdict and explanation."""
    problems = []
    questions = box.locator(".cq-question")
    for k in range(questions.count()):
        q = questions.nth(k)
        if q.get_attribute("data-kind") == "number":
            q.locator(".cq-input").fill(q.get_attribute("data-answer"))
            q.locator(".cq-submit").click()
            tries = [("Right.", q.evaluate(_ANSWER))]
        else:
            tries = []
            for wanted, sel in (
                ("Not quite.", '.cq-choice[data-correct="0"]'),
                ("Right.", '.cq-choice[data-correct="1"]'),
            ):
                choice = q.locator(sel).first
                if choice.count():
                    choice.click()
                    tries.append((wanted, q.evaluate(_ANSWER)))
        for wanted, got in tries:
            if got is None or not got.startswith(wanted) or got.endswith("|"):
                problems.append(
                    f"quiz question {k + 1}: answering showed {got!r}, expected {wanted!r} and an explanation"
                )
    return problems


def default_pages(html: Path) -> list[Path]:
    pages = sorted((html / "book").rglob("*.html"))
    return pages + [p for p in (html / "genindex.html",) if p.exists()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", default="_build/html")
    ap.add_argument("--out", default="_build/screenshots")
    ap.add_argument("--width", type=int, default=1280, help="viewport width in px (the column checks assume 1280)")
    ap.add_argument("--max-height", type=int, default=20000, help="crop taller pages (the API reference) here")
    ap.add_argument("pages", nargs="*", help="pages relative to --html (default: all chapter pages)")
    args = ap.parse_args(argv)

    html, out = Path(args.html).resolve(), Path(args.out)
    if not (html / "index.html").exists():
        print(f"no built book at {html} (run `make book` first)", file=sys.stderr)
        return 2
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    pages = [html / p for p in args.pages] if args.pages else default_pages(html)
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    report: dict[str, dict] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        try:
            for page_path in pages:
                rel = page_path.relative_to(html).as_posix()
                ctx = browser.new_context(viewport={"width": args.width, "height": 900})
                page = ctx.new_page()
                remote: list[str] = []
                errors: list[str] = []
                page.on(
                    "request",
                    lambda r, remote=remote: None if r.url.startswith(LOCAL_SCHEMES) else remote.append(r.url),
                )
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(page_path.as_uri(), wait_until="load", timeout=60_000)
                page.wait_for_function(
                    "() => !window.MathJax || !window.MathJax.startup || window.MathJax.startup.promise !== undefined",
                    timeout=30_000,
                )
                page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
                page.wait_for_timeout(1500)  # let the widget manager render saved widget state
                info = page.evaluate(_PROBE)
                info.update(remote_requests=remote, js_errors=errors)
                shot = out / (rel.replace("/", "__").removesuffix(".html") + ".png")
                height = page.evaluate("() => document.documentElement.scrollHeight")
                clip = (
                    {"x": 0, "y": 0, "width": args.width, "height": args.max_height}
                    if height > args.max_height
                    else None
                )
                page.screenshot(path=str(shot), full_page=True, clip=clip)
                info["height"], info["cropped"] = height, clip is not None
                info["screenshot"] = str(shot)
                report[rel] = info
                problems = []
                explorers = page.locator(".capsule-page-explorer")
                info["page_explorers"] = explorers.count()
                info["page_kb"] = round(page_path.stat().st_size / 1024)
                for k in range(info["page_explorers"]):
                    problems += check_page_explorer(page, explorers.nth(k))
                if info["page_explorers"] and errors:  # the explorers run in the page's JavaScript
                    problems.append(f"{len(errors)} JavaScript error(s) on a page with page-mode explorers")
                quizzes = page.locator(".capsule-quiz")
                info["quizzes"] = quizzes.count()
                for k in range(info["quizzes"]):
                    problems += check_quiz(page, quizzes.nth(k))
                    if k == 0:
                        quizzes.nth(k).screenshot(path=str(shot.with_name(shot.stem + "__quiz.png")))
                if info["quizzes"] and errors:
                    problems.append(f"{len(errors)} JavaScript error(s) on a page with questions")
                if info["page_explorers"] and info["page_kb"] > PAGE_EXPLORER_MAX_KB:
                    problems.append(f"page weight {info['page_kb']} KB > {PAGE_EXPLORER_MAX_KB} KB")
                if remote:
                    problems.append(f"network requests: {remote}")
                if info["raw_math"]:
                    problems.append(f"{info['raw_math']} math element(s) not typeset")
                if info["widget_views"] and not info["widgets_rendered"]:
                    problems.append(f"{info['widget_views']} widget view(s) in the page, none rendered")
                if info["raw_tables"]:
                    problems.append(f"{info['raw_tables']} Markdown table(s) shown as raw text")
                if info["broken_images"]:
                    problems.append(f"broken images: {info['broken_images']}")
                if info["code_overflow"]:
                    problems.append(
                        f"{len(info['code_overflow'])} code block(s) wider than the page, e.g. "
                        f"{info['code_overflow'][:2]}"
                    )
                for w in info["too_wide"]:  # one problem per table or image that does not fit
                    problems.append(
                        f"{w['kind']} wider than the content column: {w['width']} px in {w['column']} px"
                        f"{' (scrolls sideways)' if w['scrolls'] else ''}: {w['label']!r}"
                    )
                if info["abs_paths"]:
                    problems.append(f"absolute filesystem path(s) in the page text: {info['abs_paths']}")
                if info["empty_outputs"]:
                    problems.append(
                        f"{len(info['empty_outputs'])} empty output area(s), after the cell(s) "
                        f"starting {info['empty_outputs'][:3]}"
                    )
                status = "PROBLEM: " + "; ".join(problems) if problems else "ok"
                print(
                    f"{rel}: math {info['typeset']}/{info['math']} typeset, images {info['images']}, widgets "
                    f"{info['widgets_rendered']} rendered of {info['widget_views']} views, "
                    f"{info['page_explorers']} page-mode explorer(s) moved ({info['page_kb']} KB), "
                    f"{info['quizzes']} quiz(zes) answered, "
                    f"{len(errors)} JS error(s) -> {shot} [{status}]"
                )
                for e in errors:
                    print(f"    JS error: {e[:300]}")
                failures += [f"{rel}: {p}" for p in problems]
                ctx.close()
        finally:
            browser.close()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    if failures:
        print("screenshots: problems found:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"screenshots: {len(pages)} page(s) in {out}, no network requests, all math typeset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
