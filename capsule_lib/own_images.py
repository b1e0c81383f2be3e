"""The page *Capsules on your own images*: what each network becomes at other image sizes, and the measured matrix
of folders (``benchmarks/own_images_matrix.py``) as tables.

:func:`fitted_network_rows` fits each recipe to images of each side exactly as ``--images`` does
(:meth:`~capsule_lib.train.recipes.base.Recipe.fit_to_images`) and says what the network became
(:func:`~capsule_lib.models.registry.network_facts`); :func:`matrix_rows` and :func:`matrix_misses` read the
benchmark's JSON: every run, and the capsule networks that missed the goal (at least halfway from chance to the CNN
of the same folder and budget) with what was measured of them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from ._contracts import checked
from .data.images import ImageFacts
from .models.registry import build_model, network_facts
from .report import epochs_text, pct_cell
from .train.recipes import Recipe, make_recipe

__all__ = [
    "FITTED_HEADERS",
    "fitted_network_rows",
    "CELL_HEADERS",
    "matrix_cells",
    "MATRIX_HEADERS",
    "matrix_rows",
    "COST_HEADERS",
    "matrix_cost_rows",
    "matrix_misses",
]

#: the columns of :func:`fitted_network_rows`
FITTED_HEADERS = ["network", "image side", "parameters", "primary capsules", "stem"]


@checked
def fitted_network_rows(
    recipes: Mapping[str, str | Recipe], sides: Sequence[int], channels: int = 3, classes: int = 4
) -> list[list[str]]:
    """One row per recipe and image side: the network ``--images`` trains on a folder of that side (``channels``,
    ``classes``), its parameters, primary capsules and stem.

    Parameters
    ----------
    recipes : Mapping
        The network's name on the page -> a recipe name, or a :class:`~capsule_lib.train.recipes.base.Recipe`
        (e.g. a shipped checkpoint's, :func:`~capsule_lib.train.shipped_recipe`; it is not changed).
    sides : sequence of int
        Image sides (pixels).
    channels, classes : int
        The folder's channels and number of classes.

    Returns
    -------
    list of list of str
        Rows under :data:`FITTED_HEADERS`.
    """
    rows = []
    for label, recipe in recipes.items():
        for side in sides:
            r = make_recipe(recipe) if isinstance(recipe, str) else copy.deepcopy(recipe)
            r.fit_to_images(
                ImageFacts("", [str(k) for k in range(classes)], channels, side, [0.5] * channels, [0.25] * channels)
            )
            facts = network_facts(build_model(r.model_kind, r.model))
            primary = facts["primary_capsules"]
            rows.append(
                [
                    label,
                    f"{side} px",
                    f"{facts['parameters']:,}",
                    f"{primary:,}" if primary else "—",
                    facts["stem"] or "none: read as they are",
                ]
            )
    return rows


#: the columns of :func:`matrix_cells`
CELL_HEADERS = ["folder", "side", "colour", "classes", "images per class", "written from"]
#: the columns of :func:`matrix_rows`: what each run learned
MATRIX_HEADERS = ["folder", "network", "epochs in the budget", "validation", "test", "the run's verdict", "goal"]
#: the columns of :func:`matrix_cost_rows`: what each network became and cost
COST_HEADERS = ["folder", "network", "parameters", "primary capsules", "s per epoch", "memory"]

#: what each of the benchmark's sources is, in words
_SOURCES = {
    "mnist": "MNIST digits",
    "cifar10": "CIFAR-10 photographs",
    "norb": "rendered smallNORB-like views (left camera)",
    "cifar10_rotations": "CIFAR-10 photographs, each class at 4 rotations",
}


@checked
def matrix_cells(result: dict[str, Any]) -> list[list[str]]:
    """One row per folder of the matrix benchmark's ``result``, under :data:`CELL_HEADERS`."""
    return [
        [
            c["name"],
            f"{c['side']} px",
            "RGB" if c["channels"] == 3 else "grey",
            f"{c['classes']}",
            f"{c['per_class']:,}",
            _SOURCES.get(c["source"], c["source"])
            + (" (GENERATED stand-in)" if c.get("generated") and c["source"] != "norb" else ""),
        ]
        for c in result["cells"]
    ]


def _verdict(run: dict[str, Any]) -> str:
    if run.get("learned") is True:
        return "learned"
    if run.get("learned") is None:
        return "cannot tell" if "val_acc" in run else f"failed: {run.get('error', 'no record')}"
    return "did not learn: " + ", ".join(run.get("symptoms") or [])


def _memory(run: dict[str, Any]) -> str:
    """The run's measured peak resident memory, else the estimate of one training step its line said."""
    if run.get("peak_rss_mb") is not None:
        return f"{run['peak_rss_mb']:,} MiB"
    if run.get("step_memory_gib") is not None:  # said to 0.1 GiB by the run's line
        gib = run["step_memory_gib"]
        return f"≈ {gib:.1f} GiB (estimated)" if gib > 0 else "< 0.05 GiB (estimated)"
    return "—"


@checked
def matrix_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per run of the matrix benchmark's ``result`` (its JSON), under :data:`MATRIX_HEADERS`: the goal is
    "yes" or "no" for a capsule network (at least halfway from chance to the CNN of its folder), "—" for the CNN
    and where the folder's CNN did not learn."""
    return [
        [
            run["cell"],
            run["family"],
            epochs_text(run["epochs"]) if run.get("epochs") is not None else "—",
            pct_cell(run.get("val_acc"), 1),
            pct_cell(run.get("test_acc"), 1),
            _verdict(run),
            {True: "yes", False: "**no**"}.get(run.get("goal"), "—"),
        ]
        for run in result["runs"]
    ]


@checked
def matrix_cost_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per run of ``result`` under :data:`COST_HEADERS`: parameters, primary capsules, seconds per epoch
    and memory (the measured peak, else the run's own estimate of a training step)."""
    return [
        [
            run["cell"],
            run["family"],
            f"{run['parameters'] / 1e6:.2f}M" if run.get("parameters") else "—",
            f"{run['primary_capsules']:,}" if run.get("primary_capsules") else "—",
            f"{run['seconds_per_epoch']:,.0f}" if run.get("seconds_per_epoch") else "—",
            _memory(run),
        ]
        for run in result["runs"]
    ]


@checked
def matrix_misses(result: dict[str, Any]) -> list[str]:
    """The folders whose CNN did not learn (no goal there), then the capsule networks of the matrix that missed the
    goal, one sentence each: the folder, the network, its validation accuracy against chance and the CNN's, how far
    it trained in the budget and what its run measured."""
    cnn = {r["cell"]: r for r in result["runs"] if r["family"] == "CNN"}
    out = [
        f"{cell}: the CNN did not learn either ({pct_cell(base.get('val_acc'), 1)} against chance "
        f"{pct_cell(base.get('chance'), 1)}): no goal is set there"
        for cell, base in cnn.items()
        if not base.get("learned")
    ]
    for run in result["runs"]:
        if run.get("goal") is not False:
            continue
        base = cnn[run["cell"]]
        out.append(
            f"{run['cell']}, {run['family']}: validation {pct_cell(run['val_acc'], 1)} against chance "
            f"{pct_cell(run['chance'], 1)} and the CNN's {pct_cell(base['val_acc'], 1)}, after "
            f"{epochs_text(run['epochs'])} epochs ({run['seconds_per_epoch']:,.0f} s per epoch against the CNN's "
            f"{base['seconds_per_epoch']:,.0f}) in {result['budget_minutes']:g} min; its run measured: "
            f"{', '.join(run.get('symptoms') or ['nothing wrong but the budget'])}"
        )
    return out
