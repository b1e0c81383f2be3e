"""Figures of EM routing (Hinton et al. 2018) as clustering: which parent (class capsule) each child claims,
iteration by iteration, how tight each parent's Gaussian gets, and the class activations. Static twins of the
EM explorers in :mod:`capsule_lib.viz.explorers` and :mod:`capsule_lib.viz.page`.

A trace of :func:`~capsule_lib.routing.em.em_routing` holds, per iteration ``t``, the assignments ``R`` used in
that M-step (``coefficients[t]``, uniform for ``t = 0``), the parents' variances (``extra["sigma2"][t]``) and
activations (``activations[t]``); ``extra["posterior"]`` is ``R`` after the last E-step. The assignment
*after* iteration ``t`` is therefore ``coefficients[t + 1]`` (or the posterior for the last one):
:func:`assignments_after`; ``extra["a_in"]`` holds the children's activations, by which the figures order them.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .._contracts import checked
from ..types import RoutingTrace
from .data import to_display
from .plots import finish_figure

__all__ = [
    "assignments_after",
    "parent_spread",
    "plot_em_iterations",
    "plot_em_state",
    "em_readout",
    "EM_LAMBDA_SCALES",
]

#: the inverse-temperature multipliers offered by the EM explorers (x the model's ``final_lambda``)
EM_LAMBDA_SCALES = (0.01, 0.1, 1.0, 10.0, 100.0)


def assignments_after(trace: RoutingTrace, sample: int) -> torch.Tensor:
    """``R`` after each iteration's E-step for one sample: ``[T, n_inp, n_out]`` (rows sum to 1 over the parents).
    Needs a trace whose last E-step was run (``return_routing=True`` runs it)."""
    if "posterior" not in trace.extra:
        raise ValueError("the trace has no posterior: route with return_routing=True (algorithm 'em')")
    after = [c[sample] for c in trace.coefficients[1:]] + [trace.extra["posterior"][sample]]
    return torch.stack([r.float() for r in after])


def parent_spread(trace: RoutingTrace, sample: int) -> torch.Tensor:
    """The spread of each parent's Gaussian per iteration: mean over pose entries of ``sigma2``, ``[T, n_out]``."""
    return torch.stack([s[sample].float().mean(-1) for s in trace.extra["sigma2"]])


def _order(trace: RoutingTrace, sample: int, child_acts: torch.Tensor | None, n_show: int) -> torch.Tensor:
    """The ``n_show`` most active children, most active first (``child_acts [n_inp]``, default the trace's)."""
    acts = child_acts if child_acts is not None else trace.extra["a_in"][sample]
    return acts.float().argsort(descending=True)[:n_show]


def _names(classes: Sequence[str] | None, k: int) -> list[str]:
    return list(classes) if classes is not None else [str(j) for j in range(k)]


def _heatmap(ax, R: torch.Tensor, order: torch.Tensor, names: list[str], title: str, fontsize: float = 8) -> None:
    ax.imshow(R[order].T.numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.grid(False)
    ax.set_yticks(range(len(names)), names, fontsize=fontsize)
    ax.set_xticks([])
    ax.set_title(title, fontsize=fontsize + 1)


@checked
def plot_em_iterations(
    image: torch.Tensor,
    trace: RoutingTrace,
    sample: int,
    child_acts: torch.Tensor | None = None,
    classes: Sequence[str] | None = None,
    n_show: int = 64,
) -> Figure:
    """EM routing of one image, every iteration: the input (left) and, one row per iteration, the assignment
    ``R_ij`` of the ``n_show`` most active children (columns, most active first; ``child_acts [n_inp]``) to
    each class capsule (rows); bottom row, each parent's spread (mean ``sigma^2``, log scale) and activation per
    iteration. ``child_acts`` defaults to the trace's ``extra["a_in"]``."""
    R = assignments_after(trace, sample)  # [T, I, K]
    T, _, K = R.shape
    names = _names(classes, K)
    order = _order(trace, sample, child_acts, n_show)
    fig = plt.figure(figsize=(8.6, 1.25 * T + 3.4))
    gs = fig.add_gridspec(T + 1, 2, height_ratios=[1.0] * T + [2.2], width_ratios=[1.0, 3.4])
    ax = fig.add_subplot(gs[:T, 0])
    ax.imshow(to_display(image), cmap="gray")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("input", fontsize=9)
    for t in range(T):
        _heatmap(fig.add_subplot(gs[t, 1]), R[t], order, names, f"after iteration {t + 1}: R (children ->)")
    spread = parent_spread(trace, sample).numpy()  # [T, K]
    acts = torch.stack([a[sample].float() for a in trace.activations]).numpy()  # [T, K]
    bottom = gs[T, :].subgridspec(1, 2)
    ax = fig.add_subplot(bottom[0, 0])
    for j in range(K):
        ax.plot(range(1, T + 1), spread[:, j], marker="o", label=names[j])
    ax.set_yscale("log")
    ax.set_xticks(range(1, T + 1))
    ax.set_xlabel("iteration", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title("spread of each parent's Gaussian (mean $\\sigma^2$)", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    ax = fig.add_subplot(bottom[0, 1])
    width = 0.8 / T
    for t in range(T):
        ax.bar(np.arange(K) + (t - (T - 1) / 2) * width, acts[t], width, label=f"iteration {t + 1}")
    ax.set_xticks(range(K), names, fontsize=8)
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.tick_params(labelsize=8)
    ax.set_title("class activations $a_j$", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", ncol=min(T, 3))
    fig.tight_layout()
    return fig


@checked
def plot_em_state(
    image: torch.Tensor,
    trace: RoutingTrace,
    sample: int,
    child_acts: torch.Tensor | None = None,
    classes: Sequence[str] | None = None,
    label: int | None = None,
    n_show: int = 64,
    title: str = "",
) -> Figure:
    """The end state of one routing run (the twin of the EM explorers): the input, the final assignments of the
    ``n_show`` most active children, and the class activations (the prediction in orange, ``label`` named).
    Every text is at least 10 pt, so the figure stays readable as a page-mode frame saved at 60 dpi."""
    R = assignments_after(trace, sample)[-1]  # [I, K]
    K = R.shape[-1]
    names = _names(classes, K)
    acts = trace.activations[-1][sample].float().numpy()
    pred = int(acts.argmax())
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.0), gridspec_kw={"width_ratios": [0.8, 2.4, 1.3]})
    axes[0].imshow(to_display(image), cmap="gray")
    axes[0].set_xticks([])
    axes[0].set_yticks([])
    axes[0].set_title("input" + (f" ({names[label]})" if label is not None else ""), fontsize=10)
    _heatmap(
        axes[1],
        R,
        _order(trace, sample, child_acts, n_show),
        names,
        f"assignments R after {trace.iterations} iteration(s)",
        fontsize=10,
    )
    axes[1].title.set_fontsize(10)
    axes[2].bar(range(K), acts, color=["tab:orange" if k == pred else "tab:blue" for k in range(K)])
    axes[2].set_xticks(range(K), names, fontsize=10, rotation=20, ha="right")
    axes[2].set_ylim(0, 1)
    axes[2].tick_params(labelsize=10)
    axes[2].set_title(f"activations: predicts {names[pred]}", fontsize=10)
    return finish_figure(fig, title, fontsize=11)


def em_readout(trace: RoutingTrace, sample: int, classes: Sequence[str] | None = None) -> str:
    """One line: the prediction, the class activations and how decided the children are (mean over children of
    the largest assignment, 1/K = undecided, 1 = every child claimed by one parent)."""
    acts = trace.activations[-1][sample].float()
    R = assignments_after(trace, sample)[-1]
    names = _names(classes, acts.numel())
    parts = " ".join(f"{names[k]}:{float(v):.2f}" for k, v in enumerate(acts))
    return f"predicts {names[int(acts.argmax())]}; activations {parts}; mean max R {float(R.max(-1).values.mean()):.2f}"
