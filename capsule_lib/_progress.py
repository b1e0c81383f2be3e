"""Progress bars (``tqdm.auto``) that vanish completely when they finish.

In a notebook, ``tqdm.auto`` draws a widget. A bar with ``leave=False`` is only *hidden* when it closes, so the
saved page keeps an invisible widget that still takes its height: a blank gap in the rendered book. These
bars also collapse their layout (``display: none``) before closing, so a finished bar leaves nothing behind,
in a live notebook and on the built page alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress(iterable: Iterable[Any], total: int | None = None, desc: str | None = None):
    """``tqdm.auto.tqdm(iterable, total=total, desc=desc, leave=False)`` that leaves no trace when closed."""
    from tqdm.auto import tqdm

    bar = tqdm(iterable, total=total, desc=desc, leave=False)
    container = getattr(bar, "container", None)  # only the notebook (widget) bar has one
    if container is not None:
        close = bar.close

        def close_and_collapse() -> None:
            try:
                container.layout.display = "none"
            except Exception:  # pragma: no cover - a widget without a layout
                pass
            close()

        bar.close = close_and_collapse
    return bar
