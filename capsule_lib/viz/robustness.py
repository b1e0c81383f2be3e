"""Figures of the robustness chapter: accuracy against the attack budget, reconstruction distances of clean and
attacked images (DARCCC), and each model's adversarial copies of one digit.

They draw what :mod:`capsule_lib.robustness` computed (curves, detections, adversarial examples); they run no
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .._contracts import checked
from ..robustness import AdversarialExample, AttackCurve, Detection
from .data import to_display
from .plots import finish_figure

__all__ = ["plot_attack_curves", "plot_detection", "plot_adversarial_frame", "plot_adversarial_grid"]

#: the baseline's line: black and dashed, so the capsule networks stand against it
_BASELINE = {"color": "black", "linestyle": "--", "linewidth": 2.0}


@checked
def plot_attack_curves(
    curves: Mapping[str, Mapping[str, AttackCurve]],
    title: str = "",
    chance: float | None = None,
    baseline: str = "plain CNN",
) -> Figure:
    """Accuracy (%) against the budget epsilon, one panel per attack, one line per model.

    ``curves``: model label -> attack name -> :class:`~capsule_lib.robustness.AttackCurve` (every model with the
    same attacks). ``chance``: a dotted line at this accuracy (1 / classes). ``baseline``: the label drawn as a
    black dashed line."""
    attacks = list(next(iter(curves.values())))
    fig, axs = plt.subplots(1, len(attacks), figsize=(4.4 * len(attacks), 3.5), squeeze=False, sharey=True)
    colors = plt.get_cmap("tab10")
    for ax, attack in zip(axs[0], attacks):
        for k, (label, per_attack) in enumerate(curves.items()):
            c = per_attack[attack]
            style = _BASELINE if label == baseline else {"color": colors(k % 10), "linewidth": 1.4}
            ax.plot(c.eps, [100 * a for a in c.accuracy()], marker="o", markersize=3, label=label, **style)
        if chance is not None:
            ax.axhline(100 * chance, color="0.5", linestyle=":", linewidth=1, label="chance")
        n = next(iter(curves.values()))[attack].correct.shape[1]
        ax.set_title(f"{next(iter(curves.values()))[attack].attack} ({n} images)", fontsize=10)
        ax.set_xlabel("epsilon (L-infinity budget, pixels in [0, 1])", fontsize=9)
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axs[0][0].set_ylabel("accuracy under attack (%)", fontsize=9)
    handles, labels = axs[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    rows = (len(labels) + 3) // 4
    return finish_figure(fig, title, rect=(0, 0.07 * rows, 1, 1))


@checked
def plot_detection(detections: Mapping[str, Mapping[str, Detection]], title: str = "") -> Figure:
    """Reconstruction distances, one panel per model: the clean test images and, per attack, the adversarial
    images that fooled the model, with the detection threshold (5% false positives on clean validation images).

    ``detections``: model label -> attack name -> :class:`~capsule_lib.robustness.Detection`."""
    fig, axs = plt.subplots(1, len(detections), figsize=(4.4 * len(detections), 4.2), squeeze=False)
    for ax, (label, per_attack) in zip(axs[0], detections.items()):
        first = next(iter(per_attack.values()))
        dists = [first.clean] + [d.attacked[d.fooled] for d in per_attack.values()]
        hi = max(float(d.max()) for d in dists if len(d))
        bins = np.linspace(0, hi * 1.02, 30)
        ax.hist(first.clean.numpy(), bins=bins, color="0.6", alpha=0.8, label="clean test images", density=True)
        for k, (attack, d) in enumerate(per_attack.items()):
            fooled = d.attacked[d.fooled].numpy()
            ax.hist(
                fooled,
                bins=bins,
                histtype="step",
                linewidth=1.8,
                color=f"C{k + 1}",
                density=True,
                label=f"{attack}: {len(fooled)} fooled, {100 * d.detection_rate:.0f}% flagged",
            )
        ax.axvline(first.threshold, color="black", linestyle="--", linewidth=1.2, label="threshold (5% FPR)")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("L2 distance between input and reconstruction", fontsize=9)
        ax.set_yticks([])
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    return finish_figure(fig, title)


def _wrapped(name: str) -> str:
    """A model name over lines short enough for a column of nine pictures ("inverted attention" ->
    "inverted\nattention", "Efficient-CapsNet" -> "Efficient-\nCapsNet")."""
    return name.replace(" ", "\n").replace("-", "-\n") if len(name) > 8 else name


def _picture(ax, image, title: str = "", color: str = "black") -> None:
    ax.imshow(to_display(image), cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8, color=color)


def plot_adversarial_frame(
    examples: Mapping[str, AdversarialExample], label: int, names: Mapping[str, str] | None = None
) -> Figure:
    """Every model's adversarial copy of one digit at one budget (top row: titled with the prediction, red when
    wrong) and, under the models with a decoder, the reconstruction from the winning capsule (bottom row).

    ``examples``: model name -> :class:`~capsule_lib.robustness.AdversarialExample`; ``names``: short labels."""
    keys = list(examples)
    with_recon = any(e.reconstruction is not None for e in examples.values())
    rows = 2 if with_recon else 1
    fig, axs = plt.subplots(rows, len(keys), figsize=(0.95 * len(keys), 1.4 * rows + 0.45), squeeze=False)
    for j, k in enumerate(keys):
        e = examples[k]
        right = e.prediction == label
        head = _wrapped((names or {}).get(k, k))
        _picture(axs[0][j], e.image, f"{head}\n-> {e.prediction}", "black" if right else "red")
        if with_recon:
            if e.reconstruction is None:
                axs[1][j].axis("off")
            else:
                _picture(axs[1][j], e.reconstruction, "reconstr.")
    fig.tight_layout(pad=0.3)
    return fig


@checked
def plot_adversarial_grid(
    frames: Sequence[Mapping[str, AdversarialExample]],
    eps: Sequence[float],
    label: int,
    names: Mapping[str, str] | None = None,
    title: str = "",
) -> Figure:
    """The static twin of the epsilon explorer: one row per budget of ``eps`` (``frames[i]`` for ``eps[i]``),
    each model's adversarial copy titled with its prediction (red when wrong)."""
    keys = list(frames[0])
    fig, axs = plt.subplots(len(eps), len(keys), figsize=(0.8 * len(keys), 1.05 * len(eps) + 0.8), squeeze=False)
    for i, (frame, e) in enumerate(zip(frames, eps)):
        for j, k in enumerate(keys):
            ex = frame[k]
            head = _wrapped((names or {}).get(k, k)) + "\n" if i == 0 else ""
            _picture(axs[i][j], ex.image, f"{head}-> {ex.prediction}", "black" if ex.prediction == label else "red")
        axs[i][0].set_ylabel(f"eps {e:g}", fontsize=8)
    return finish_figure(fig, title, pad=0.3)
