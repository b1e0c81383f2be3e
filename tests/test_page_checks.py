"""The browser checks of the built pages (book/_tools/screenshots.py) catch what a reader would see as broken:
a code cell cut off at the right edge, the build machine's absolute paths in the text, a blank output area.
A deliberately broken page must fail each check; a clean page must pass them all."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")

PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
  main {{ width: 600px; }} pre {{ overflow: hidden; white-space: pre; }}
</style></head><body><main>
<div class="cell"><div class="cell_input"><div class="highlight"><pre>{code}</pre></div></div>
<div class="cell_output"><div class="output stream">{output}</div>{gap}</div></div>
<p>{text}</p>
</main></body></html>"""

BROKEN = PAGE.format(
    code="result = some_function(" + ", ".join(f"argument_{k}" for k in range(20)) + ")",
    output="",
    gap="",
    text="capsule_lib: full run | data /root/work/data | seed 0",
)
# a progress bar closed during the build: its widget is hidden but still takes space, between two outputs
GAP = PAGE.format(
    code="x = 1",
    output="some output",
    gap='<div class="widget-subarea"><div style="visibility: hidden; height: 32px">50%</div></div>',
    text="nothing else wrong",
)
CLEAN = PAGE.format(
    code="x = 1",
    output="[real data] mnist/test: 10000 images",
    gap="",
    text="capsule_lib: full run | data $CAPSULE_DATA | seed 0",
)


def _screenshots():
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")
    spec = importlib.util.spec_from_file_location("screenshots", REPO / "book" / "_tools" / "screenshots.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["screenshots"] = mod
    spec.loader.exec_module(mod)
    return mod


def _site(tmp_path: Path, page: str) -> Path:
    html = tmp_path / "html"
    (html / "book").mkdir(parents=True)
    (html / "index.html").write_text("<html><body><main>index</main></body></html>")
    (html / "book" / "chapter.html").write_text(page)
    return html


@pytest.mark.slow
def test_page_checks_fail_on_a_broken_page(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, BROKEN)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 1
    err = capsys.readouterr().err
    assert "book/chapter.html: 1 code block(s) wider than the page" in err
    assert "absolute filesystem path(s) in the page text: ['/root/work/data']" in err
    assert "book/chapter.html: 1 empty output area(s), after the cell(s) starting ['result = some_function(" in err


@pytest.mark.slow
def test_page_checks_pass_on_a_clean_page(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, CLEAN)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_page_checks_fail_on_a_hidden_widget_gap(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, GAP)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 1
    assert "book/chapter.html: 1 empty output area(s), after the cell(s) starting ['x = 1']" in capsys.readouterr().err


# tables and figures must fit the content column (the article; here a 600 px main): a table whose wrapper scrolls
# sideways hides its last columns, an image wider than the column is cut off; one scaled down by CSS fits
COLUMN = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
  main {{ width: 600px; }} .pst-scrollable-table-container {{ overflow-x: auto; }} td, th {{ padding: 0 8px; }}
</style></head><body><main>
<div class="cell"><div class="cell_output"><div class="pst-scrollable-table-container"><table>{table}</table></div>
{image}</div></div>
</main></body></html>"""
PNG_1x1 = (  # a 1x1 PNG, stretched by CSS
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
WIDE_TABLE = COLUMN.format(
    table="<tr>" + "".join(f"<th>a long column header {k}</th>" for k in range(11)) + "</tr><tr>"
    + "".join(f"<td>{k}</td>" for k in range(11)) + "</tr>",
    image=f'<img src="{PNG_1x1}" alt="figure" style="width: 800px; height: 10px">',
)  # fmt: skip
FITTING_TABLE = COLUMN.format(
    table="<tr><th>model</th><th>accuracy</th></tr><tr><td>a</td><td>99.1</td></tr>",
    image=f'<img src="{PNG_1x1}" alt="figure" style="width: 800px; max-width: 100%; height: 10px">',
)


@pytest.mark.slow
def test_page_checks_fail_on_a_table_or_figure_wider_than_the_column(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, WIDE_TABLE)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 1
    err = capsys.readouterr().err
    lines = [line.strip() for line in err.splitlines() if "wider than the content column" in line]
    assert len(lines) == 2, err  # one line per offender
    table, image = lines
    assert table.startswith("book/chapter.html: table wider than the content column: ")
    assert "in 600 px (scrolls sideways): 'a long column header 0 | a long column header 1 |" in table
    assert int(table.split(": ")[2].split(" px")[0]) > 700  # the table's full width (headers wrapped)
    assert image.startswith("book/chapter.html: image wider than the content column: 800 px in 600 px: 'data:")


@pytest.mark.slow
def test_page_checks_pass_on_a_table_and_figure_that_fit(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, FITTING_TABLE)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 0, capsys.readouterr().err


# concept questions (capsule_lib.exercises): on the page, without a kernel, an answer must show its verdict
def _quiz_page() -> str:
    from capsule_lib.exercises import Choice, Question, Quiz

    q = Quiz(
        "Check your understanding",
        [
            Question("Over which axis?", (Choice("children"), Choice("parents", True)), "Each child shares its vote."),
            Question("How many capsules?", answer=1152, tolerance=0.5, explanation="32 x 36."),
        ],
    )
    return PAGE.format(code="quiz()", output=q._repr_html_(), gap="", text="questions")


@pytest.mark.slow
def test_page_checks_answer_the_questions_of_a_quiz(tmp_path, capsys):
    mod = _screenshots()
    html = _site(tmp_path, _quiz_page())
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 0, capsys.readouterr().err
    assert "1 quiz(zes) answered" in capsys.readouterr().out
    assert (tmp_path / "shots" / "book__chapter__quiz.png").exists()


@pytest.mark.slow
def test_page_checks_fail_on_a_quiz_that_does_not_answer(tmp_path, capsys):
    mod = _screenshots()
    broken = re.sub(r"<script>.*?</script>", "", _quiz_page(), flags=re.S)  # the questions without their script
    html = _site(tmp_path, broken)
    assert mod.main(["--html", str(html), "--out", str(tmp_path / "shots")]) == 1
    err = capsys.readouterr().err
    assert "book/chapter.html: quiz question 1: answering showed None, expected 'Not quite.'" in err
    assert "quiz question 2: answering showed None, expected 'Right.'" in err
