"""ipywidgets explorers. Every explorer only wires controls to a *static twin*: a plain function that draws
the same figure for given values (and one that writes the readout), so the book can show the twin as a
normal figure and tests can call it without a browser.

:func:`explorer` is the generic wiring: named controls (sliders, dropdowns, ...), a twin
``draw(**values) -> Figure``, an optional ``readout(**values) -> str`` and optional buttons. The returned
:class:`Explorer` is an ``ipywidgets.VBox`` (controls, readout, figure output) that keeps references to its
parts for tests. :func:`routing_explorer` is the primer chapter's explorer built on it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as W
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .._contracts import checked
from ..analysis import ToyVotes
from ..types import RoutingTrace
from .toy import plot_routing_state, routing_readout

__all__ = ["Explorer", "explorer", "routing_explorer", "figure_output"]


class Explorer(W.VBox):
    """A VBox of controls, a readout line and the twin's figure.

    Attributes: ``controls`` (name -> widget), ``buttons`` (label -> ``Button``), ``readout``
    (``HTML``), ``output`` (``Output`` holding the current figure), ``values()`` (current control values),
    ``draws`` (how many times the figure was drawn) and ``last_values`` (the values of the last draw).
    """

    def __init__(
        self,
        controls: Mapping[str, W.ValueWidget],
        draw: Callable[..., Figure],
        readout: Callable[..., str] | None = None,
        buttons: Mapping[str, Callable[[Explorer], None]] | None = None,
    ) -> None:
        self.controls = dict(controls)
        self.draw_fn, self.readout_fn = draw, readout
        self.readout = W.HTML(layout=W.Layout(min_height="1.5em"))
        self.output = W.Output(layout=W.Layout(min_height="200px"))
        self.buttons: dict[str, W.Button] = {}
        for label, action in (buttons or {}).items():
            b = W.Button(description=label, tooltip=label)
            b.on_click(lambda _b, act=action: act(self))
            self.buttons[label] = b
        self.draws = 0
        self.last_values: dict[str, Any] | None = None
        self._hold = False
        rows: list[W.Widget] = list(self.controls.values())
        if self.buttons:
            rows.append(W.HBox(list(self.buttons.values())))
        super().__init__(rows + [self.readout, self.output])
        for w in self.controls.values():
            w.observe(self._changed, names="value")
        self.refresh()

    def values(self) -> dict[str, Any]:
        """Current value of every control, by name."""
        return {name: w.value for name, w in self.controls.items()}

    def set_values(self, **values: Any) -> None:
        """Set several controls at once and redraw once (e.g. for a reset button)."""
        self._hold = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._hold = False
        self.refresh()

    def _changed(self, _change: Mapping[str, Any]) -> None:
        if not self._hold:
            self.refresh()

    def refresh(self) -> None:
        """Redraw the figure and the readout for the current values.

        The figure is rendered to PNG here and assigned to the ``Output`` widget's ``outputs`` in one state
        update (no ``with output:`` capture): with capture, quick successive slider moves can lose redraws,
        because the front end routes captured messages by message id.
        """
        vals = self.values()
        if self.readout_fn is not None:
            self.readout.value = f"<code>{html.escape(self.readout_fn(**vals))}</code>"
        fig = self.draw_fn(**vals)
        try:
            self.output.outputs = (figure_output(fig),)
        finally:
            plt.close(fig)
        self.draws += 1
        self.last_values = vals


def figure_output(fig: Figure) -> dict[str, Any]:
    """A notebook ``display_data`` output (PNG + text) for ``fig``, as the inline backend would show it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
    w, h = fig.get_size_inches() * fig.dpi
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {
            "image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
            "text/plain": f"<Figure size {w:.0f}x{h:.0f} with {len(fig.axes)} Axes>",
        },
    }


def explorer(
    controls: Mapping[str, W.ValueWidget],
    draw: Callable[..., Figure],
    readout: Callable[..., str] | None = None,
    buttons: Mapping[str, Callable[[Explorer], None]] | None = None,
) -> Explorer:
    """Wire ``controls`` to the static twin ``draw`` (called as ``draw(**{name: value})``).

    ``readout(**values) -> str`` fills a text line under the controls; ``buttons`` maps a label to an
    action ``action(explorer)`` (e.g. ``lambda ex: ex.set_values(**defaults)`` for a reset button).
    Each control's ``description`` is what a reader (and the browser test) finds it by.
    """
    return Explorer(controls, draw, readout, buttons)


@checked
def routing_explorer(toy: ToyVotes, trace: RoutingTrace, initial: int = 1, sample: int = 0) -> Explorer:
    """Slider over the routing iterations of a recorded trace.

    Static twins: :func:`~capsule_lib.viz.toy.plot_routing_state` (figure) and
    :func:`~capsule_lib.viz.toy.routing_readout` (text). The slider's description is ``"iterations"``.
    """
    if trace.iterations < 1:
        raise ValueError("the trace has no iterations")
    slider = W.IntSlider(
        value=min(max(initial, 1), trace.iterations),
        min=1,
        max=trace.iterations,
        step=1,
        description="iterations",
        continuous_update=False,
    )
    return explorer(
        {"t": slider},
        draw=lambda t: plot_routing_state(toy, trace, t, sample),
        readout=lambda t: routing_readout(toy, trace, t, sample),
    )
