"""After `jupyter-book build`: fail on any notebook that raised, and say which pages ran on stand-in data.

Jupyter Book (myst-nb) reports a notebook that raises as a *warning* and still writes the page, with the
traceback in it, and prints "build succeeded". ``make book`` runs this script after the build, so that:

* a notebook whose execution failed fails the build: the notebook, the failing cell's code and the error are
  printed (from the reports myst-nb writes to ``<html>/reports/*.err.log``), and the exit status is 1;
* when chapters ran on generated stand-ins because a dataset could not be had, one summary line names the
  datasets and the pages, and how to fetch the real data.

    .venv/bin/python book/_tools/build_report.py --clean   # before the build: remove old reports
    .venv/bin/python book/_tools/build_report.py           # after the build
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: a page's stand-in notice (capsule_lib.notebook: "<names> is not here", names joined by ", ") or the data layer's
#: line (capsule_lib.data.get_dataset: "<name> is not available here")
MARK = re.compile(r"\[GENERATED stand-in data\] (\w+(?:, \w+)*) is not (?:available )?here")
SCRIPTS = {"mnist": "mnist.py", "multimnist": "mnist.py", "affine_mnist": "mnist.py"}


def failed_notebooks(html: Path) -> dict[str, str]:
    """``{page: summary}`` for every ``reports/*.err.log`` under the built HTML."""
    out = {}
    reports = html / "reports"
    for log in sorted(reports.rglob("*.err.log")) if reports.is_dir() else []:
        page = log.relative_to(reports).as_posix()[: -len(".err.log")]
        out[page] = summarize(log.read_text(errors="replace"))
    return out


def summarize(text: str, max_lines: int = 25) -> str:
    """The failing cell's code (nbclient prints it between dashed lines) and the last error line."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()  # without the ANSI colours of the traceback
    cell: list[str] = []
    for i, line in enumerate(lines):
        if "An error occurred while executing the following cell" in line:
            body = lines[i + 1 :]
            dashes = [k for k, s in enumerate(body) if set(s.strip()) == {"-"}]
            if len(dashes) >= 2:
                cell = body[dashes[0] + 1 : dashes[1]]
            break
    errors = [s for s in lines if re.match(r"^\s*\w*(Error|Exception)\b.*:", s)]
    error = errors[-1].strip() if errors else (lines[-1].strip() if lines else "(empty report)")
    code = "\n".join("    | " + s for s in cell[:max_lines]) or "    | (cell code not in the report)"
    return f"failing cell:\n{code}\n  error: {error}"


def _outputs_text(cells: list[dict]) -> str:
    text = []
    for c in cells:
        for o in c.get("outputs", []):
            t = o.get("text", "")
            text.append("".join(t) if isinstance(t, list) else t)
    return "\n".join(text)


def _executed_notebooks(executed: Path, cache: Path | None) -> dict[str, list[dict]]:
    """``{page: cells}`` of the executed notebooks: from the book's execution cache (what the build rendered; in
    cache mode the copies under ``jupyter_execute/`` may carry no outputs), else from ``jupyter_execute/``."""
    found: dict[str, list[dict]] = {}
    for nb in sorted(executed.rglob("*.ipynb")) if executed.is_dir() else []:
        try:
            found[nb.relative_to(executed).with_suffix("").as_posix()] = json.loads(nb.read_text()).get("cells", [])
        except (json.JSONDecodeError, OSError):
            continue
    if cache is not None and (cache / "global.db").exists():
        try:
            from jupyter_cache import get_cache

            jc = get_cache(str(cache))
            for rec in sorted(jc.list_cache_records(), key=lambda r: r.pk):  # the latest record of a page wins
                uri = Path(rec.uri)
                page = (uri.relative_to(REPO) if uri.is_relative_to(REPO) else Path(uri.name)).with_suffix("")
                found[page.as_posix()] = [dict(c) for c in jc.get_cache_bundle(rec.pk).nb.cells]
        except Exception as e:  # the summary is a convenience: never fail the build over it
            print(f"build_report: could not read the execution cache ({type(e).__name__}: {e})")
    return found


def standin_pages(executed: Path, cache: Path | None = None) -> dict[str, list[str]]:
    """``{dataset: [pages]}`` for every executed notebook whose outputs announce a generated stand-in."""
    found: dict[str, list[str]] = {}
    for page, cells in _executed_notebooks(executed, cache).items():
        for name in sorted({n for names in MARK.findall(_outputs_text(cells)) for n in names.split(", ")}):
            found.setdefault(name, []).append(page)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "_build"))
    ap.add_argument("--clean", action="store_true", help="remove the reports of an earlier build and exit")
    args = ap.parse_args(argv)
    build = Path(args.build)
    html = build / "html"
    if args.clean:
        shutil.rmtree(html / "reports", ignore_errors=True)
        return 0
    failed = failed_notebooks(html)
    for page, summary in failed.items():
        print(f"build_report: notebook FAILED: {page}.ipynb\n  {summary}")
    standins = standin_pages(build / "jupyter_execute", build / ".jupyter_cache")
    if standins:
        parts = [f"{name} ({', '.join(pages)})" for name, pages in standins.items()]
        fetch = sorted({f'python data_scripts/{SCRIPTS.get(n, n + ".py")} --root "$CAPSULE_DATA"' for n in standins})
        print(
            f"build_report: built on generated stand-in data for: {'; '.join(parts)}. Fetch the real data with "
            f"{' and '.join(f'`{c}`' for c in fetch)} (or build with internet access), then `make book` again."
        )
    if failed:
        print(
            f"build_report: {len(failed)} notebook(s) raised during execution; the book was NOT built correctly "
            f"(full tracebacks: {html / 'reports'})"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
