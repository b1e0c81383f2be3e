"""Sphinx extension: the live widgets' ONNX graphs, exported from the shipped checkpoints when the book is built.

The graphs are not committed (CapsNet's encoder alone is 14 MB in fp16): after an HTML build, every model of
:data:`capsule_lib.export.LIVE_MODELS` is exported by :func:`capsule_lib.export.export_pretrained` into
``_static/live_models/`` of the built book. The export (about a minute on two cores) is cached in
``_build/.live_models/<key>/``, keyed by the checkpoints' sha256 and the export code, so a rebuild copies.
Without the optional extra ``export`` (onnx, onnxscript) the build warns once and the widgets say they could not
start; the chapters' static twins are unaffected.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)


def cache_key() -> str:
    """The checkpoints' sha256 and the export module's source: what the exported files depend on."""
    import capsule_lib.export as export
    from capsule_lib.pretrained import registry

    reg = registry()
    h = hashlib.sha256(Path(export.__file__).read_bytes())
    for name in sorted(export.LIVE_MODELS):
        h.update(f"{name}:{reg[name]['sha256']}:{export.LIVE_MODELS[name]}".encode())
    return h.hexdigest()[:16]


def export_live_models(out: Path, cache_root: Path) -> Path:
    """Export (or copy from the cache) every live model into ``out``; returns ``out``."""
    from capsule_lib.export import LIVE_MODELS, export_pretrained

    cache = cache_root / cache_key()
    if not cache.is_dir():
        tmp = cache_root / (cache.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for name in LIVE_MODELS:
            export_pretrained(name, tmp)
        tmp.rename(cache)
    out.mkdir(parents=True, exist_ok=True)
    for f in cache.glob("*.onnx"):
        shutil.copyfile(f, out / f.name)
    return out


def on_build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    try:
        export_live_models(Path(app.outdir) / "_static" / "live_models", Path(app.outdir).parent / ".live_models")
    except ImportError as e:
        logger.warning(f"live widgets: models not exported ({e})")


def setup(app):
    app.connect("build-finished", on_build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
