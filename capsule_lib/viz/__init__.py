"""Figures and widgets for the book.

Static figures: ``plots`` (generic: squash curves, capsules, routing coefficients, training histories,
:class:`LivePlot`), ``toy`` (toy 2-D routing problems), ``capsules`` (capsule classifiers: routing maps,
reconstructions, perturbations), ``em``, ``heinsen``, ``inverted`` (each chapter's figures), ``compare`` (the
comparison chapter's), ``robustness`` (attack curves, detection by reconstruction, adversarial copies), ``data``
(dataset samples). Widgets: ``widgets`` (the generic :func:`~capsule_lib.viz.widgets.explorer` and the primer's
routing explorer) and ``explorers`` (explorers of trained classifiers); they need ``ipywidgets`` and are imported
on demand. Every widget has a static twin in the static modules, which the chapters draw as ordinary figures for
the rendered page.
"""

from . import capsules, compare, data, em, heinsen, inverted, plots, robustness, toy
from .plots import LivePlot, plot_capsules, plot_coefficients, plot_history, plot_squash, set_style
from .toy import ToyVotes, plot_routing_state, plot_toy_iterations, routing_readout, toy_votes

__all__ = [
    "capsules",
    "compare",
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
    "ToyVotes",
    "plot_toy_iterations",
    "plot_routing_state",
    "routing_readout",
    "toy_votes",
]
