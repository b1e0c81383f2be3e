"""The comparison chapter's contestants, named once: every routing of :data:`~capsule_lib.routing.kinds.ROUTING_KINDS`
in the same :class:`~capsule_lib.models.RoutingClassifier` and a plain CNN of matched size, on the same data,
pipeline and training budget (wall-clock time on MNIST, epochs on the viewpoint protocol).

==============================  ==================================================================================
name                            what
==============================  ==================================================================================
:data:`CONTESTANTS`             the six routing kinds and ``"cnn"``, in the chapter's order
:data:`BUDGET_MINUTES`          the training budget per dataset (``"mnist"``, ``"norb"``): wall-clock minutes of
                                training, validation included, on one machine (MNIST), or ``None``: the recipe's
                                epochs (the viewpoint protocol, equal epochs)
:data:`PROTOCOL`                what every contestant's recipe shares on a dataset beyond its recipe's defaults
                                (the viewpoint protocol's learning-rate warm-up)
:func:`contestant_recipe`       the recipe of a contestant on a dataset (routing: ``routing_compare_<dataset>``
                                with ``model.routing``; CNN: the dataset's ``baseline_cnn`` recipe at matched size)
:func:`shipped_name`            the name of its shipped checkpoint (``compare_<dataset>_<contestant>``)
:func:`measure_costs`           parameters, training throughput, latency and peak memory of each model, measured
                                the same way (:func:`capsule_lib.cost.model_costs`)
:func:`untrained_contestants`   the shipped contestants that break the book's rule (:mod:`capsule_lib.learning`):
                                validation accuracy below halfway from chance to the best contestant's
:func:`result_rows`             the chapter's accuracy table, "did not train" next to such a contestant's numbers
==============================  ==================================================================================

Train one contestant as the shipped runs were trained::

    train(contestant_recipe("em", "mnist"), out_dir="runs/compare_mnist_em",
          budget_minutes=BUDGET_MINUTES["mnist"])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._contracts import checked
from .cost import model_costs
from .learning import CHANCE, DID_NOT_TRAIN_LABEL, untrained
from .routing.kinds import ROUTING_KINDS
from .train.recipes import Recipe, make_recipe

__all__ = [
    "RUN_BUDGET_HEADERS",
    "run_budget_rows",
    "CONTESTANTS",
    "LABELS",
    "SHORT_LABELS",
    "BUDGET_MINUTES",
    "PROTOCOL",
    "CNN_OVERRIDES",
    "contestant_recipe",
    "shipped_name",
    "measure_costs",
    "contestant_accuracies",
    "untrained_contestants",
    "result_headers",
    "result_rows",
]

#: the routing kinds, then the CNN (the chapter's order)
CONTESTANTS: tuple[str, ...] = (*ROUTING_KINDS, "cnn")

#: how the chapter labels each contestant (the paper that introduced the routing)
LABELS: dict[str, str] = {
    "dynamic": "dynamic (Sabour 2017)",
    "em": "EM (Hinton 2018)",
    "heinsen_2019": "Heinsen 2019",
    "heinsen_2022": "Heinsen 2022",
    "inverted": "inverted attention (Tsai 2020)",
    "self_attention": "self-attention (Mazzia 2021)",
    "cnn": "plain CNN",
}

#: the same, short, for table rows
SHORT_LABELS: dict[str, str] = {
    "dynamic": "dynamic",
    "em": "EM",
    "heinsen_2019": "Heinsen 2019",
    "heinsen_2022": "Heinsen 2022",
    "inverted": "inverted attention",
    "self_attention": "self-attention",
    "cnn": "CNN",
}

#: wall-clock training minutes (validation included) of every contestant, per dataset; ``None``: no time budget, every
#: contestant trains its recipe's epochs (the viewpoint protocol: 15, equal epochs, so that the result does not depend
#: on how busy the machine was; the 4-minute budget of the first runs let most of them finish their 15 epochs anyway)
BUDGET_MINUTES: dict[str, float | None] = {"mnist": 8.0, "norb": None}

#: what every contestant's recipe shares on each dataset beyond the recipes' defaults (on the viewpoint protocol a
#: linear learning-rate warm-up over the first epoch (Adam at the recipe's full 3e-3 from the first step drove
#: Heinsen 2019's input activations to zero for good and stalled dynamic routing on a plateau,
#: see ``benchmarks/learning_diagnostics.py``; Heinsen's own recipe warms up too))
PROTOCOL: dict[str, dict[str, Any]] = {"mnist": {}, "norb": {"warmup_epochs": 1.0}}

#: the CNN's size, matched to the routing networks (about 1.2M parameters on either dataset, between the smallest and
#: the largest of them), and its epoch cap (the routing recipes')
CNN_OVERRIDES: dict[str, dict[str, Any]] = {
    "mnist": {"epochs": 30, "model__channels": (32, 64, 64)},
    "norb": {"model__channels": (32, 64, 64), "model__hidden": (256, 192)},
}

_ROUTING_RECIPE = {"mnist": "routing_compare_mnist", "norb": "routing_compare_norb"}
_CNN_RECIPE = {"mnist": "baseline_cnn", "norb": "baseline_cnn_norb"}


def _check(name: str, dataset: str) -> None:
    if name not in CONTESTANTS:
        raise ValueError(f"unknown contestant name {name!r}; contestants: {', '.join(CONTESTANTS)}")
    if dataset not in BUDGET_MINUTES:
        raise ValueError(f"unknown comparison dataset {dataset!r}; datasets: {', '.join(BUDGET_MINUTES)}")


@checked
def contestant_recipe(name: str, dataset: str = "mnist", /, **overrides: Any) -> Recipe:
    """The recipe contestant ``name`` (a routing kind or ``"cnn"``) is trained with on ``dataset`` (``"mnist"``
    or ``"norb"``): its recipe with :data:`PROTOCOL`'s fields, then ``overrides`` (recipe fields,
    ``model__<field>``; ``dataset=`` too, e.g. the rendered set of the viewpoint protocol) applied on top."""
    _check(name, dataset)
    if name == "cnn":
        return make_recipe(_CNN_RECIPE[dataset], **{**CNN_OVERRIDES[dataset], **PROTOCOL[dataset], **overrides})
    return make_recipe(_ROUTING_RECIPE[dataset], model__routing=name, **{**PROTOCOL[dataset], **overrides})


@checked
def shipped_name(name: str, dataset: str = "mnist") -> str:
    """The shipped checkpoint of contestant ``name`` on ``dataset``: ``compare_<dataset>_<name>``."""
    _check(name, dataset)
    return f"compare_{dataset}_{name}"


@checked
def measure_costs(
    models: dict[str, nn.Module],
    images: torch.Tensor,
    labels: torch.Tensor,
    dataset: str = "mnist",
    quick: bool = False,
    repeats: int = 3,
    peak: bool = True,
) -> dict[str, dict[str, Any]]:
    """:func:`~capsule_lib.cost.model_costs` of every model of ``models`` (contestant name -> model), each with
    its own recipe's objective: training step at batch 128, latency at batch 1 and 256, peak memory of one
    training step. ``quick``: batch 16, latency at 1 and 16, one repeat, no peak memory (seconds, for smoke
    runs and tests). ``peak=False`` skips the peak memory (it runs the profiler). Needs 256 (``quick``: 16)
    ``images``."""
    kw = (
        dict(train_batch=16, latency_batches=(1, 16), repeats=1, peak=False)
        if quick
        else dict(repeats=repeats, peak=peak)
    )
    out = {}
    for name, model in models.items():
        objective = contestant_recipe(name, dataset).build_objective()
        out[name] = model_costs(model, objective, images, labels, **kw)
    return out


#: the columns of :func:`run_budget_rows`
RUN_BUDGET_HEADERS = (  # short: eight columns fit the page
    "data",
    "model",
    "budget",
    "epochs (stopped by)",
    "images seen",
    "images/s",
    "best epoch",
    "val. (%)",
)


@checked
def run_budget_rows(histories: dict[tuple[str, str], Any]) -> list[list[str]]:
    """What each contestant's run did with its budget, one row per ``(dataset, contestant) -> History``: the
    budget, the epochs reached (fractional when stopped inside an epoch) and whether the budget or the epoch cap
    stopped the run, the training images seen and their rate, and the epoch selected on validation with its accuracy
    (columns :data:`RUN_BUDGET_HEADERS`)."""
    rows = []
    for (dataset, name), history in histories.items():
        meta, recs = history.meta, history.records
        best = max((r for r in recs if "val_acc" in r), key=lambda r: r["val_acc"])
        seen = recs[-1]["epoch"] * meta["train_images"] if "train_images" in meta else None
        rate = seen / recs[-1]["wall_time"] if seen is not None else None
        cap = meta["config"]["epochs"]
        rows.append(
            [
                dataset,
                SHORT_LABELS[name],
                f"{meta['budget_minutes']:g}\u00a0min" if "budget_minutes" in meta else "-",
                f"{recs[-1]['epoch']:.2f} ({'epoch cap' if recs[-1]['epoch'] >= cap else 'budget'})",
                f"{seen:,.0f}" if seen is not None else "-",
                f"{rate:.0f}" if rate else "-",
                f"{best['epoch']:g}",
                f"{100 * best['val_acc']:.2f}",
            ]
        )
    return rows


@checked
def contestant_accuracies(registry: dict[str, Any], dataset: str) -> dict[str, float]:
    """The validation accuracy of each shipped contestant on ``dataset`` (contestant -> its registry entry's
    ``val_acc``; ``registry``: :func:`~capsule_lib.pretrained.registry`), those shipped only."""
    return {
        name: registry[shipped_name(name, dataset)]["metrics"]["val_acc"]
        for name in CONTESTANTS
        if shipped_name(name, dataset) in registry
    }


@checked
def untrained_contestants(registry: dict[str, Any], dataset: str) -> list[str]:
    """The shipped contestants on ``dataset`` that did not learn by the book's rule
    (:func:`~capsule_lib.learning.untrained`): validation accuracy below halfway from chance to the best
    contestant's, all on the same data and budget."""
    return [n for n in CONTESTANTS if n in untrained(contestant_accuracies(registry, dataset), CHANCE[dataset])]


@checked
def result_headers(data: str) -> list[str]:
    """The columns of :func:`result_rows` for a test set named ``data``."""
    return [
        "model",
        "params",
        f"{data} test (%)",
        "affine (%)",
        "drop",
        "NORB-like familiar (%)",
        "NORB-like novel (%)",
    ]


@checked
def result_rows(results: dict[str, dict[str, Any]], untrained: dict[str, list[str]]) -> list[list[str]]:
    """The chapter's accuracy table, one row per contestant of ``results`` (contestant -> ``params``, ``accuracy``,
    ``affine``, ``familiar``, ``novel``: fractions or ``None``), with "did not train" next to the accuracies of a
    contestant in ``untrained`` (dataset -> :func:`untrained_contestants`)."""

    def cell(value: float | None, dataset: str, name: str) -> str:
        if value is None:
            return "not shipped"
        return f"{100 * value:.2f}" + (f" ({DID_NOT_TRAIN_LABEL})" if name in untrained.get(dataset, []) else "")

    return [
        [
            SHORT_LABELS[n],
            f"{r['params'] / 1e6:.2f}M",
            cell(r["accuracy"], "mnist", n),
            cell(r["affine"], "mnist", n),
            f"{100 * (r['accuracy'] - r['affine']):.1f}",
            cell(r["familiar"], "norb", n),
            cell(r["novel"], "norb", n),
        ]
        for n, r in results.items()
    ]
