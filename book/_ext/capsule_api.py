"""Sphinx extension for the library reference (book/appendix/api.md): cross-references to re-exported names.

capsule_lib's docstrings are NumPy style and rendered by ``sphinx.ext.napoleon`` as they are. capsule_lib
re-exports names (``capsule_lib.RoutingTrace`` is defined in ``capsule_lib.types``), and docstrings refer to
them by the short public path, by a bare name (``RoutingTrace``, ``set_epoch``) or through string annotations
(``'Trainer'``). autodoc documents each object once, under its defining module. On a missing Python reference
this extension (1) imports the target and retries with ``<obj.__module__>.<obj.__qualname__>``, then (2)
retries with the unique documented object whose name ends with ``.<target>``. References it cannot resolve
are left alone, so nitpicky builds still report them.
"""

from __future__ import annotations

import importlib


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
    matches = [
        name
        for name in domain.objects
        if name.startswith("capsule_lib.") and (name.endswith("." + target) or name == target)
    ]
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
    app.connect("missing-reference", resolve)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
