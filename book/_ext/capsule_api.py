"""Sphinx extension for the library reference (book/appendix/api.md).

1. **Docstring fields.** capsule_lib docstrings often write NumPy-style ``Parameters`` sections as
   ``name: description`` (no space before the colon), and may end such a section with a plain paragraph.
   Napoleon would read ``description`` as a *type* and swallow the paragraph into the last field. Before
   napoleon runs, :func:`normalize_fields` rewrites ``name: description`` as ``name`` + indented description
   and moves a trailing paragraph in front of the section. NumPy's own ``name : type`` form is left alone.

2. **Cross-references.** Resolve references to capsule_lib objects by where they are documented:

capsule_lib re-exports names (``capsule_lib.routing.RoutingTrace`` is defined in
``capsule_lib.routing.trace``), and docstrings refer to them by the short public path, by a bare name
(``RoutingTrace``, ``set_epoch``) or through string annotations (``'Trainer'``). autodoc documents each object
once, under its defining module. On a missing Python reference this extension (1) imports the target and
retries with ``<obj.__module__>.<obj.__qualname__>``, then (2) retries with the unique documented object whose
name ends with ``.<target>``. References it cannot resolve are left alone, so nitpicky builds still report them.
"""
from __future__ import annotations

import importlib
import re

from sphinx.util import logging

logger = logging.getLogger(__name__)

FIELD_SECTIONS = {"Parameters", "Other Parameters", "Keyword Arguments", "Args", "Arguments"}
_FIELD = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*): (\S.*)$")
_HEADER_RULE = re.compile(r"^\s*-{3,}\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_header(lines: list[str], i: int) -> bool:
    return i + 1 < len(lines) and lines[i].strip() != "" and bool(_HEADER_RULE.match(lines[i + 1]))


def normalize_fields(lines: list[str]) -> list[str]:
    """Rewrite ``name: description`` fields of parameter sections (see the module docstring)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not (_is_header(lines, i) and lines[i].strip() in FIELD_SECTIONS):
            out.append(lines[i])
            i += 1
            continue
        base = _indent(lines[i])
        section = [lines[i], lines[i + 1]]
        trailing: list[str] = []
        j = i + 2
        while j < len(lines):
            line = lines[j]
            if _is_header(lines, j):
                break
            if line.strip() == "":
                nxt = next((k for k in range(j + 1, len(lines)) if lines[k].strip()), None)
                if nxt is None:
                    j = len(lines)
                    break
                if _indent(lines[nxt]) <= base and not _FIELD.match(lines[nxt].strip()) and not _is_header(lines, nxt):
                    # a plain paragraph after the fields: it ends the section
                    k = nxt
                    while k < len(lines) and not _is_header(lines, k):
                        trailing.append(lines[k])
                        k += 1
                    j = k
                    break
                section.append(line)
                j += 1
                continue
            m = _FIELD.match(line.strip()) if _indent(line) == base else None
            if m:
                section.append(" " * base + m.group(1))
                section.append(" " * (base + 4) + m.group(2))
            else:
                section.append(line)
            j += 1
        while trailing and trailing[-1].strip() == "":
            trailing.pop()
        if trailing:
            out.extend(trailing + [""])
        out.extend(section)
        if j < len(lines) and out and out[-1].strip() != "":
            out.append("")
        i = j
    return out


def process_docstring(app, what, name, obj, options, lines) -> None:
    if name.startswith("capsule_lib"):
        lines[:] = normalize_fields(list(lines))


def _canonical(target: str) -> str | None:
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        return f"{mod}.{qual}" if mod and qual else None
    return None


def resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").strip("'\"")
    if not target:
        return None
    domain = env.get_domain("py")
    typ = node.get("reftype")
    candidates = []
    if target.startswith("capsule_lib."):
        canon = _canonical(target)
        if canon and canon != target:
            candidates.append(canon)
    matches = [name for name in domain.objects if name.startswith("capsule_lib.")
               and (name.endswith("." + target) or name == target)]
    if len(matches) == 1:
        candidates.append(matches[0])
    for cand in candidates:
        if cand in domain.objects:
            new = node.deepcopy()
            new["reftarget"] = cand
            res = domain.resolve_xref(env, node.get("refdoc", ""), app.builder, typ, cand, new, contnode)
            if res is None:  # e.g. :meth: pointing at an attribute: resolve with any role
                hits = domain.resolve_any_xref(env, node.get("refdoc", ""), app.builder, cand, new, contnode)
                res = hits[0][1] if hits else None
            if res is not None:
                return res
    return None


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", process_docstring, priority=100)  # before napoleon (500)
    app.connect("missing-reference", resolve)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
