"""Sphinx extension: keep the built book offline.

1. Drops sphinx-thebe's scripts from every page. Jupyter Book 1 always loads sphinx-thebe, which embeds the
   URL of thebe on unpkg.com; this book has no thebe button (``launch_buttons.thebe: false``), so the scripts
   do nothing but would name a CDN.
2. After the build, scans every HTML page for resources that a browser would fetch from the network
   (``<script src>``, stylesheets, images, iframes, inline scripts naming a CDN) and emits a warning per
   finding, so that ``jupyter-book build -W`` fails if a page needs the network.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from sphinx.util import logging

logger = logging.getLogger(__name__)

CDN_PATTERN = re.compile(r"(cdn\.|unpkg\.com|jsdelivr|cdnjs|googleapis|gstatic|mathjax\.org|polyfill\.io)", re.I)
_FETCHING = {
    "script": "src",
    "img": "src",
    "iframe": "src",
    "source": "src",
    "audio": "src",
    "video": "src",
    "embed": "src",
    "object": "data",
}
_LINK_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut icon", "manifest"}


def _is_thebe(js: Any) -> bool:
    filename = str(getattr(js, "filename", js) or "")
    body = str((getattr(js, "attributes", None) or {}).get("body", ""))
    return filename.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body


def drop_thebe(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if scripts:
        context["script_files"] = [js for js in scripts if not _is_thebe(js)]
    css = context.get("css_files")
    if css:
        context["css_files"] = [c for c in css if "sphinx-thebe" not in str(getattr(c, "filename", c))]


class _Scanner(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        url = ""
        if tag in _FETCHING:
            url = a.get(_FETCHING[tag], "")
        elif tag == "link" and a.get("rel", "").lower() in _LINK_RELS:
            url = a.get("href", "")
        if re.match(r"^(https?:)?//", url):
            self.found.append(f"<{tag}> loads {url}")
        for k in ("data-jupyter-widgets-cdn",):
            if re.match(r"^(https?:)?//", a.get(k, "")):
                self.found.append(f"<{tag} {k}> points at {a[k]}")
        self._in_script = tag == "script" and not a.get("type", "").startswith("application/")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            for m in re.finditer(r"https?://[^\s\"'<>]+", data):
                if CDN_PATTERN.search(m.group(0)):
                    self.found.append(f"inline script names {m.group(0)}")


def network_findings(html_dir: str | Path) -> dict[str, list[str]]:
    """``{page: [finding, ...]}`` for every HTML page under ``html_dir`` that would fetch from the network."""
    out: dict[str, list[str]] = {}
    root = Path(html_dir)
    for page in sorted(root.rglob("*.html")):
        scanner = _Scanner()
        scanner.feed(page.read_text(encoding="utf-8", errors="replace"))
        if scanner.found:
            out[page.relative_to(root).as_posix()] = scanner.found
    return out


def check_offline(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page, findings in network_findings(app.outdir).items():
        for f in findings:
            logger.warning(f"[offline_book] {page}: {f} (pages must not need the network)")


def setup(app):
    app.connect("html-page-context", drop_thebe, priority=900)
    app.connect("build-finished", check_offline)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
