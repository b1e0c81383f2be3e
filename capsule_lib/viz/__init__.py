"""Figures and widgets for the book: viz draws, :mod:`capsule_lib.analysis` computes.

The functions here take arrays, tensors and routing traces (the toy problems, sweeps, traces and model runs they
draw come from :mod:`capsule_lib.analysis`) and never call a model or a routing function; an explorer that
recomputes for a slider's value passes its model on to an analysis function.

Static figures: ``plots`` (generic: squash curves, capsules, routing coefficients, training histories,
:class:`LivePlot`), ``toy`` (the primer's toy 2-D routing problems), ``capsules`` (capsule classifiers: routing
maps, reconstructions, perturbations), ``em``, ``heinsen``, ``inverted`` (each chapter's figures), ``compare`` (the
comparison chapter's), ``critique`` (the chapter "Do capsules need routing?"), ``robustness`` (attack curves,
detection by reconstruction, adversarial copies), ``data`` (dataset samples), ``readability`` (the check that a
figure is readable at the book's size). Widgets: ``widgets`` (the generic :func:`~capsule_lib.viz.widgets.explorer`
and the primer's routing explorer), ``explorers`` (explorers of trained classifiers) and ``page`` (page-mode
explorers: precomputed frames that work on the rendered page without a kernel); they need ``ipywidgets`` and are
imported on demand. Every widget has a static twin in the static modules, which the chapters draw as ordinary
figures for the rendered page.
"""

from . import capsules, compare, critique, data, em, heinsen, inverted, plots, robustness, toy
from .plots import LivePlot, plot_capsules, plot_coefficients, plot_history, plot_squash, set_style
from .toy import plot_routing_state, plot_toy_iterations, routing_readout

__all__ = [
    "capsules",
    "compare",
    "critique",
    "data",
    "em",
    "heinsen",
    "inverted",
    "plots",
    "robustness",
    "toy",
    "LivePlot",
    "plot_capsules",
    "plot_coefficients",
    "plot_history",
    "plot_squash",
    "set_style",
    "plot_toy_iterations",
    "plot_routing_state",
    "routing_readout",
]
