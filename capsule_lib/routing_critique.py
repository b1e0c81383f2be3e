"""The chapter "Do capsules need routing?" on the comparison network: its training runs and their records.

* **the runs** (:class:`CritiqueRun`, :func:`critique_runs`, :func:`train_run`): every routing kind of the comparison
  network routed, with Paik et al.'s uniform and random couplings, and dynamic routing at other iteration counts,
  plus the routing-free heads (:data:`CRITIQUE_HEADS`) and a depth series of dynamic routing (one to four routing
  layers, the hidden layers started as the paper's and at ``N(0, 1)``), each for the same epochs
  (:data:`CRITIQUE_BUDGET`; on the viewpoint protocol after the comparison's learning-rate warm-up) and two seeds;
  the records are shipped with the checkpoints (:func:`recorded_runs`, :func:`merge_records`, :func:`records_line`);
* **reading them** (:func:`summarise`, :class:`Measured`, :func:`versus`, :func:`judged`, :func:`coupling_rows`,
  :func:`depth_series`, :func:`depth_rows`): means over the seeds with standard errors, the two-standard-error rule,
  and the book's rule that a network must have learned (:mod:`capsule_lib.learning`: a configuration that did not
  is shown as "did not train" and never judged); the chapter's other tables and its figure's data
  (:func:`untrained_rows`, :func:`coupling_panels`, :func:`iteration_rows`, :func:`routing_free_rows`).

What they say about the critics' claims: :mod:`capsule_lib.critique_verdicts`; the measurements of trained networks
come from :mod:`capsule_lib.critique`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._checks import module_device
from ._contracts import checked
from .comparison import SHORT_LABELS, contestant_recipe
from .cost import machine_info
from .critique import gradient_by_layer, routing_by_layer
from .data import get_dataset
from .evaluation import accuracy_standard_error, predict
from .learning import CHANCE, DID_NOT_TRAIN, DID_NOT_TRAIN_LABEL, NOT_TESTED, learned, learning_threshold
from .routing.kinds import ROUTING_KINDS
from .train import train
from .train.shipped import CHECKPOINT_DIR
from .types import COUPLINGS

__all__ = [
    "CRITIQUE_BUDGET",
    "CRITIQUE_SEEDS",
    "CRITIQUE_DYNAMIC_ITERATIONS",
    "CRITIQUE_DEPTHS",
    "DEPTH_CAPSULES",
    "CRITIQUE_HEADS",
    "LONGER_EPOCHS",
    "CritiqueRun",
    "critique_runs",
    "N_AFFINE",
    "N_LAYER_IMAGES",
    "train_run",
    "CRITIQUE_RECORDS",
    "recorded_runs",
    "merge_records",
    "records_line",
    "retrain_cost",
    "METRICS",
    "METRIC_SIZES",
    "config_key",
    "Measured",
    "measured",
    "best_val",
    "summarise",
    "versus",
    "judged",
    "UNTRAINED_HEADERS",
    "untrained_rows",
    "COUPLING_HEADERS",
    "coupling_rows",
    "PANELS",
    "coupling_panels",
    "iteration_rows",
    "ROUTING_FREE_ROWS",
    "routing_free_rows",
    "DepthPoint",
    "depth_series",
    "DEPTH_HEADERS",
    "depth_rows",
]

# ---------------------------------------------------------------------------------------------------------------------
# The chapter's training protocol: Paik et al.'s baselines and the routing-free heads on the comparison network
# ---------------------------------------------------------------------------------------------------------------------

#: what each critique run trains on, per dataset, the epochs (every run the same number, as the critics compare at
#: equal training, not at equal time), the training images (``None`` for the recipe's whole training split) and, for
#: the viewpoint protocol, the generated smallNORB-like set (the comparison's, as real smallNORB is not in the data)
CRITIQUE_BUDGET: dict[str, dict[str, Any]] = {
    "mnist": {"epochs": 1, "train_subset": 30_000},
    "norb": {"epochs": 3, "train_subset": None, "dataset": "rendered_norb"},
}

#: the seeds every configuration is trained with (two, for a standard error per configuration)
CRITIQUE_SEEDS: tuple[int, ...] = (0, 1)

#: dynamic routing's extra iteration counts (its default is 3)
CRITIQUE_DYNAMIC_ITERATIONS: tuple[int, ...] = (2, 5)

#: the depths (routing layers) of the MNIST depth series, dynamic routing with ``depth - 1`` hidden layers of
#: :data:`DEPTH_CAPSULES` capsules (Mitterreiter et al.'s deeper stacks)
CRITIQUE_DEPTHS: tuple[int, ...] = (1, 2, 3, 4)

#: capsules per hidden routing layer in the depth series
DEPTH_CAPSULES = 16

#: the routing-free heads trained on MNIST (:data:`~capsule_lib.models.routing_classifier.HEADS` but ``"routing"``)
CRITIQUE_HEADS: tuple[str, ...] = ("hvc", "shared_transform", "aff_capsnet")

#: the lengthened MNIST budget of Aff-CapsNets' layer, which does not learn in one epoch (it stays on the margin loss's
#: plateau), and of the routed dynamic-routing network it is judged against
LONGER_EPOCHS = 3


@dataclass(frozen=True)
class CritiqueRun:
    """One training run of the chapter: ``kind`` (a routing kind) routed with ``couplings`` (``"routed"``: its own
    algorithm; ``"uniform"``, ``"random"``: Paik et al.'s baselines) for ``iterations`` (``None``: its default), or
    a routing-free ``head`` (:data:`CRITIQUE_HEADS`), on ``dataset`` with ``seed``; ``depth`` (a run of the depth
    series): that many routing layers, ``depth - 1`` of them hidden (:data:`DEPTH_CAPSULES` capsules each), started
    as ``hidden_init`` says (``RoutingClassifierConfig.hidden_init``: ``"paper"`` or ``"unit"``); ``budget_epochs``:
    a budget lengthened beyond :data:`CRITIQUE_BUDGET`'s (:data:`LONGER_EPOCHS`)."""

    dataset: str
    kind: str
    couplings: str = "routed"
    seed: int = 0
    iterations: int | None = None
    head: str = "routing"
    depth: int | None = None
    hidden_init: str = "paper"
    budget_epochs: int | None = None

    @property
    def name(self) -> str:
        return f"critique_{self.dataset}_{config_key(vars(self))}_seed{self.seed}"

    def recipe(self, **overrides: Any) -> Any:
        """The comparison's recipe of ``kind`` on ``dataset`` (:func:`~capsule_lib.comparison.contestant_recipe`)
        with this run's couplings, iterations, head, seed and :data:`CRITIQUE_BUDGET`, then ``overrides``."""
        model = {"model__couplings": self.couplings, "model__head": self.head}
        if self.iterations is not None:
            model["model__iterations"] = self.iterations
        if self.depth is not None:
            model["model__hidden"] = (DEPTH_CAPSULES,) * (self.depth - 1)
        if self.hidden_init != "paper":
            model["model__hidden_init"] = self.hidden_init
        longer = {"epochs": self.budget_epochs} if self.budget_epochs is not None else {}
        fields = {**CRITIQUE_BUDGET[self.dataset], **longer, "seed": self.seed, **model, **overrides}
        return contestant_recipe(self.kind, self.dataset, **fields)


@checked
def critique_runs(datasets: Sequence[str] = ("mnist", "norb"), heads: bool = True) -> list[CritiqueRun]:
    """Every run of the chapter, in training order: per dataset and seed, each routing kind routed, with uniform and
    with random couplings; dynamic routing at :data:`CRITIQUE_DYNAMIC_ITERATIONS`; with ``heads``, the routing-free
    heads (:data:`CRITIQUE_HEADS`) and the depth series (:data:`CRITIQUE_DEPTHS`) with the paper's initialisation of
    the hidden layers and with ``"unit"`` (from two routing layers on: one has no hidden layer) (MNIST only: the
    affine test)."""
    runs = []
    for ds in datasets:
        for seed in CRITIQUE_SEEDS:
            runs += [CritiqueRun(ds, k, c, seed) for k in ROUTING_KINDS for c in ("routed", "uniform", "random")]
            runs += [CritiqueRun(ds, "dynamic", "routed", seed, T) for T in CRITIQUE_DYNAMIC_ITERATIONS]
            if heads and ds == "mnist":
                runs += [CritiqueRun(ds, "dynamic", seed=seed, head=h) for h in CRITIQUE_HEADS]
                runs += [
                    CritiqueRun(ds, "dynamic", seed=seed, head=h, budget_epochs=LONGER_EPOCHS) for h in ("aff_capsnet",)
                ]
                runs += [CritiqueRun(ds, "dynamic", seed=seed, budget_epochs=LONGER_EPOCHS)]
    for init in ("paper", "unit") if heads and "mnist" in datasets else ():
        depths = [k for k in CRITIQUE_DEPTHS if init == "paper" or k > 1]
        for seed in CRITIQUE_SEEDS:
            runs += [CritiqueRun("mnist", "dynamic", seed=seed, depth=k, hidden_init=init) for k in depths]
    return runs


#: the affine test images each MNIST run is also evaluated on (the comparison chapter's first 5,000)
N_AFFINE = 5000

#: the validation images a depth-series run's routing is measured on, layer by layer
N_LAYER_IMAGES = 500


@checked
def train_run(
    run: CritiqueRun, data_root: Any = None, out_dir: Any = None, progress: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Train one run of the chapter (:func:`~capsule_lib.train.train`, model selection on the validation split) and
    return its record: the configuration, parameters, epochs, training images and seconds, the hardware, and the
    accuracies of the selected weights: validation, test (MNIST; the familiar and novel test views on the viewpoint
    protocol) and, on MNIST, the first :data:`N_AFFINE` affine-transformed test images; for a run of the depth
    series, ``layers``: per routing layer (image side first) its coupling statistics and alive parents on
    :data:`N_LAYER_IMAGES` validation images (:func:`~capsule_lib.critique.routing_by_layer`) and the RMS gradient
    of its weights on the first 64 (:func:`~capsule_lib.critique.gradient_by_layer`). ``overrides``: recipe fields
    (e.g. a smoke run's ``train_subset``)."""
    t0 = time.time()
    recipe = run.recipe(**overrides)
    model, trainer = train(recipe, out_dir=out_dir, data_root=data_root, progress=progress)
    hist = trainer.history
    rec: dict[str, Any] = {
        "name": run.name,
        "dataset": run.dataset,
        "kind": run.kind,
        "couplings": run.couplings,
        "seed": run.seed,
        "iterations": run.iterations,
        "head": run.head,
        "depth": run.depth,
        "hidden_init": run.hidden_init,
        "budget_epochs": run.budget_epochs,
        "parameters": sum(p.numel() for p in model.parameters()),
        "epochs": hist.records[-1]["epoch"],
        "train_images": hist.meta["train_images"],
        "train_seconds": hist.records[-1]["wall_time"],
        "hardware": hist.meta["hardware"],
        "device_name": machine_info(module_device(model)).get("device_name"),
        "torch": hist.meta["torch"],
        "val_acc": hist.best("val_acc")["val_acc"],
    }
    rec.update({k: v for k, v in hist.meta["test"].items() if k.endswith("_acc")})  # test, or familiar and novel
    if run.dataset == "mnist":
        n = overrides.get("eval_subset") or N_AFFINE
        aff = get_dataset("affine_mnist", data_root, "test", size=28).subset(n)
        scores = predict(model, aff.images, device=module_device(model))["scores"]
        rec["affine_acc"] = (scores.argmax(1).cpu() == aff.labels).double().mean().item()
        rec["affine_size"] = len(aff)
    if run.depth is not None:
        val = recipe.evaluation_sets(data_root)["val"].subset(overrides.get("eval_subset") or N_LAYER_IMAGES)
        names = [f"hidden_layers.{i}" for i in range(run.depth - 1)] + ["routing"]
        grads = gradient_by_layer(model, recipe.build_objective(), val.images[:64], val.labels[:64], names)
        T = model.config.routing_iterations
        rec["layers"] = [
            {"layer": name, **vars(lr.stats), "grad_rms": grads[name]}
            for name, lr in zip(names, routing_by_layer(model, val.images, (T,)))
        ]
    rec["total_seconds"] = time.time() - t0
    return rec


# where the recorded runs are shipped, capsule_lib/checkpoints/critique_runs.json (benchmarks/critique_runs.py
# --collect writes it: the machine and one train_run record per run); a plain comment: a documented value would print
# this machine's absolute path on the API page
CRITIQUE_RECORDS = CHECKPOINT_DIR / "critique_runs.json"


@checked
def recorded_runs(path: Any = None) -> dict[str, Any]:
    """The shipped records of the chapter's runs: ``{"machines": {device name: runs}, "rows": [record, ...],
    "missing": [name, ...]}`` (``path``: another file of that form)."""
    return json.loads(Path(path or CRITIQUE_RECORDS).read_text())


@checked
def merge_records(old: dict[str, Any], new: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The records ``old`` with the run records ``new`` added, a new record replacing an old one of the same name;
    only planned runs (:func:`critique_runs`) are kept, in planned order. A record without ``device_name`` (the first
    records, which kept one machine for all) takes ``old["machine"]``'s."""
    planned = [r.name for r in critique_runs()]
    by_name = {r["name"]: r for r in old.get("rows", [])}
    default = old.get("machine", {}).get("device_name")
    for r in by_name.values():
        r.setdefault("device_name", default)
    by_name.update({r["name"]: r for r in new})
    rows = [by_name[n] for n in planned if n in by_name]
    machines: dict[str, int] = {}
    for r in rows:
        machines[r["device_name"]] = machines.get(r["device_name"], 0) + 1
    return {"machines": machines, "rows": rows, "missing": [n for n in planned if n not in by_name]}


@checked
def records_line(records: dict[str, Any]) -> str:
    """One line on what the records hold: runs, machines, torch, CPU hours."""
    rows = records["rows"]
    machines = records.get("machines") or {records["machine"]["device_name"]: len(rows)}
    on = ", ".join(f"{n} on {m}" for m, n in machines.items())
    torches = ", ".join(sorted({r["torch"] for r in rows}))
    hours = sum(r["total_seconds"] for r in rows) / 3600
    return f"{len(rows)} runs ({on}), one thread each, torch {torches}; {hours:.1f} CPU hours"


def retrain_cost(records: dict[str, Any] | None = None) -> str:
    """What retraining every planned run (:func:`critique_runs`) costs, from the records' measured seconds (training
    and evaluation): each planned run counts the recorded seconds of its configuration (another seed's where it has
    no record of its own), for a chapter's parameters cell, e.g. ``"≈ 2.9 h on a CPU (84 runs, one thread each,
    from the 64 recorded)"``."""
    rec = records or recorded_runs()
    by_key: dict[str, list[float]] = {}
    for r in rec["rows"]:
        by_key.setdefault(f"{r['dataset']}:{config_key(r)}", []).append(r["total_seconds"])
    planned = critique_runs()
    seconds = sum(
        sum(by_key.get(f"{run.dataset}:{config_key(vars(run))}", [0.0]))
        / max(1, len(by_key.get(f"{run.dataset}:{config_key(vars(run))}", [])))
        for run in planned
    )
    return (
        f"≈ {seconds / 3600:.1f} h on a CPU ({len(planned)} runs, one thread each, from the {len(rec['rows'])} "
        "recorded)"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Reading the runs: means over seeds, standard errors, the two-standard-error rule
# ---------------------------------------------------------------------------------------------------------------------

#: what each run's record measured, by dataset (metric key -> its label)
METRICS: dict[str, dict[str, str]] = {
    "mnist": {"test_acc": "MNIST test", "affine_acc": "affine MNIST"},
    "norb": {"test_familiar_acc": "familiar views", "test_novel_acc": "novel views"},
}

#: the size of the set behind each metric (the binomial part of a standard error)
METRIC_SIZES: dict[str, int] = {
    "test_acc": 10_000,
    "affine_acc": 5_000,
    "test_familiar_acc": 4_000,
    "test_novel_acc": 4_000,
}


@checked
def config_key(row: dict[str, Any]) -> str:
    """A run's configuration without its seed: ``"<kind>_<couplings>"`` (then ``"_T<iterations>"``, ``"_depth<k>"``
    and ``"_<hidden_init>"`` where set and not the paper's), or the routing-free head's name; ``"_e<epochs>"`` after
    either for a lengthened budget (``budget_epochs``)."""
    suffix = f"_e{row['budget_epochs']}" if row.get("budget_epochs") is not None else ""
    if row.get("head", "routing") != "routing":
        return row["head"] + suffix
    its = f"_T{row['iterations']}" if row.get("iterations") is not None else ""
    depth = f"_depth{row['depth']}" if row.get("depth") is not None else ""
    init = f"_{row['hidden_init']}" if row.get("hidden_init", "paper") != "paper" else ""
    return f"{row['kind']}_{row['couplings']}{its}{depth}{init}{suffix}"


@dataclass(frozen=True)
class Measured:
    """One configuration's metric over its seeds: the mean, its standard error (the spread over the seeds and the
    binomial error of each accuracy on ``n_images``, added in quadrature), the seeds' values and whether every one of
    its runs learned (:mod:`capsule_lib.learning`'s rule; shown as "did not train" when not)."""

    mean: float
    se: float
    values: tuple[float, ...]
    learned: bool = True

    def __str__(self) -> str:
        return f"{100 * self.mean:.2f} ± {100 * self.se:.2f}" + ("" if self.learned else f" ({DID_NOT_TRAIN_LABEL})")


def measured(values: Sequence[float], n_images: int, learned: bool = True) -> Measured:
    """:class:`Measured` of one configuration's accuracies over seeds (``values``), each on ``n_images`` images."""
    v = torch.tensor([float(x) for x in values], dtype=torch.float64)
    if v.numel() == 0:
        raise ValueError("no runs to summarise")
    m = v.mean().item()
    seed_var = (v.var(unbiased=True).item() / v.numel()) if v.numel() > 1 else 0.0
    binom_var = accuracy_standard_error(m, n_images) ** 2 / v.numel()
    return Measured(m, math.sqrt(seed_var + binom_var), tuple(v.tolist()), learned)


def best_val(rows: Sequence[dict[str, Any]], dataset: str) -> float:
    """The best validation accuracy among the runs of ``dataset`` at the chapter's budget (:data:`CRITIQUE_BUDGET`;
    a lengthened one can only help): what the book's rule measures every run of ``dataset`` against."""
    return max((r["val_acc"] for r in rows if r["dataset"] == dataset and r.get("budget_epochs") is None), default=0.0)


@checked
def summarise(rows: Sequence[dict[str, Any]], dataset: str) -> dict[str, dict[str, Measured]]:
    """The runs of ``dataset`` by configuration (:func:`config_key`) -> metric (:data:`METRICS`) -> :class:`Measured`
    over their seeds; a configuration learned when each of its runs' validation accuracy passes the book's rule
    (:func:`~capsule_lib.learning.learned`) against :func:`best_val`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["dataset"] == dataset:
            groups.setdefault(config_key(r), []).append(r)
    best = best_val(rows, dataset)
    out = {}
    for key, rs in groups.items():
        ok = all(learned(r["val_acc"], best, CHANCE[dataset]) for r in rs)
        out[key] = {m: measured([r[m] for r in rs], METRIC_SIZES[m], ok) for m in METRICS[dataset] if m in rs[0]}
    return out


def versus(a: Measured, b: Measured) -> str:
    """``"higher"``, ``"lower"`` or ``"within noise"``: ``a`` against ``b`` by the two-standard-error rule (the
    difference of the means beyond twice their standard errors in quadrature; the robustness chapter's rule)."""
    se = math.hypot(a.se, b.se)
    if a.mean - b.mean > 2 * se:
        return "higher"
    if b.mean - a.mean > 2 * se:
        return "lower"
    return "within noise"


def judged(a: Measured, b: Measured) -> str | None:
    """:func:`versus`, where both measurements have at least two seeds and both learned;
    :data:`~capsule_lib.learning.NOT_TESTED` where one did not learn; ``None`` where one has a single seed (its
    standard error would hold the test set's binomial error only, not how much training from another seed moves the
    accuracy, and at a short budget that is the larger part)."""
    if not (a.learned and b.learned):
        return NOT_TESTED
    return versus(a, b) if min(len(a.values), len(b.values)) >= 2 else None


#: the columns of :func:`untrained_rows`
UNTRAINED_HEADERS = ("data", "best val. (%)", "the rule's line (%)", "runs below it", "measured cause")


@checked
def untrained_rows(records: dict[str, Any]) -> list[list[str]]:
    """The book's rule on the records, one row per dataset: the best validation accuracy, the line a run must reach
    (:func:`~capsule_lib.learning.learning_threshold`), the runs below it (``none``) and their labelled causes
    (:data:`~capsule_lib.learning.DID_NOT_TRAIN`; ``"not labelled"`` if one has none)."""
    rows = []
    for ds in METRICS:
        runs = {r["name"]: r["val_acc"] for r in records["rows"] if r["dataset"] == ds}
        if not runs:
            continue
        best = best_val(records["rows"], ds)
        line = learning_threshold(best, CHANCE[ds])
        below = sorted(n for n, acc in runs.items() if acc < line)
        causes = sorted({DID_NOT_TRAIN.get(n, "not labelled") for n in below})
        names = ", ".join(f"{n.removeprefix('critique_')} ({100 * runs[n]:.1f})" for n in below) or "none"
        rows.append([ds, f"{100 * best:.2f}", f"{100 * line:.2f}", names, "; ".join(causes) or "-"])
    return rows


#: the columns of :func:`coupling_rows`
COUPLING_HEADERS = ("routing", "routed", "uniform", "random", "routed vs uniform", "routed vs random")


@checked
def coupling_rows(summary: dict[str, dict[str, Measured]], metric: str) -> list[list[str]]:
    """One row per routing kind: its ``metric`` (%, mean ± standard error over the seeds) routed, with uniform and
    with random couplings, and how the routed network compares with each (:func:`judged`)."""
    rows = []
    for kind in ROUTING_KINDS:
        got = [summary.get(f"{kind}_{c}", {}).get(metric) for c in ("routed", "uniform", "random")]
        if got[0] is None:
            continue
        cells = [str(g) if g is not None else "not run" for g in got]
        vs = [(judged(got[0], g) or "one seed: not judged") if g is not None else "" for g in got[1:]]
        rows.append([SHORT_LABELS[kind], *cells, *vs])
    return rows


#: the panels of the chapter's coupling figure, title -> (dataset, metric)
PANELS: dict[str, tuple[str, str]] = {
    "MNIST test": ("mnist", "test_acc"),
    "affine MNIST": ("mnist", "affine_acc"),
    "novel views (smallNORB-like)": ("norb", "test_novel_acc"),
}


@checked
def coupling_panels(summaries: dict[str, dict[str, dict[str, Measured]]]) -> dict[str, dict[str, dict[str, Measured]]]:
    """The coupling figure's data (:data:`PANELS`): panel title -> routing kind -> couplings -> :class:`Measured`,
    from ``summaries`` (dataset -> :func:`summarise`)."""
    panels = {}
    for title, (ds, metric) in PANELS.items():
        summary = summaries.get(ds, {})
        panels[title] = {
            kind: {c: summary[f"{kind}_{c}"][metric] for c in COUPLINGS if f"{kind}_{c}" in summary}
            for kind in ROUTING_KINDS
        }
    return panels


@checked
def iteration_rows(summaries: dict[str, dict[str, dict[str, Measured]]]) -> tuple[list[str], list[list[Any]]]:
    """Dynamic routing's runs by iterations (1: uniform couplings, its first pass; 3: its default; and
    :data:`CRITIQUE_DYNAMIC_ITERATIONS`): headers and rows of MNIST test, affine and novel-view accuracy."""
    keys = {
        1: "dynamic_uniform",
        3: "dynamic_routed",
        **{T: f"dynamic_routed_T{T}" for T in CRITIQUE_DYNAMIC_ITERATIONS},
    }
    cols = [("mnist", "test_acc"), ("mnist", "affine_acc"), ("norb", "test_novel_acc")]
    headers = ["iterations", *(f"{METRICS[ds][m]} (%)" for ds, m in cols)]
    rows = [
        [T, *(str(summaries[ds][keys[T]][m]) if keys[T] in summaries.get(ds, {}) else "not run" for ds, m in cols)]
        for T in sorted(keys)
    ]
    return headers, rows


#: section 3's networks, configuration key -> label
ROUTING_FREE_ROWS = {
    "dynamic_routed": "dynamic routing (3 iterations)",
    "dynamic_uniform": "dynamic, uniform couplings",
    "shared_transform": "one transform per capsule type, no routing",
    "aff_capsnet": "Aff-CapsNets' layer: one transform per class, no routing",
    "hvc": "homogeneous vector capsules",
    f"dynamic_routed_e{LONGER_EPOCHS}": f"dynamic routing, {LONGER_EPOCHS} epochs",
    f"aff_capsnet_e{LONGER_EPOCHS}": f"Aff-CapsNets' layer, {LONGER_EPOCHS} epochs",
}


@checked
def routing_free_rows(records: dict[str, Any], mnist: dict[str, dict[str, Measured]]) -> list[list[str]]:
    """Section 3's table: each network of :data:`ROUTING_FREE_ROWS` that was run, its parameters, MNIST test and
    affine accuracy (:func:`summarise` of the MNIST runs, ``mnist``)."""
    params = {config_key(r): r["parameters"] for r in records["rows"] if r["dataset"] == "mnist"}
    return [
        [label, f"{params[key] / 1e6:.2f}M", str(mnist[key]["test_acc"]), str(mnist[key]["affine_acc"])]
        for key, label in ROUTING_FREE_ROWS.items()
        if key in mnist
    ]


@dataclass(frozen=True)
class DepthPoint:
    """One depth of the recorded depth series: ``params``, the accuracies by metric (:data:`METRICS`, over the
    seeds) and, per routing layer (image side first), the means over the seeds of its measurements (``alive``,
    ``grad_rms``, ``entropy``, ``variation``, ``max_share``)."""

    params: int
    accuracy: dict[str, Measured]
    layers: list[dict[str, float]]

    @property
    def never_active(self) -> list[float]:
        """The share of parents never active in each hidden layer (the class layer's parents are the classes)."""
        return [1 - layer["alive"] for layer in self.layers[:-1]]

    @property
    def gradients(self) -> list[float]:
        """The RMS gradient of each routing layer's weights, image side first."""
        return [layer["grad_rms"] for layer in self.layers]


@checked
def depth_series(rows: Sequence[dict[str, Any]], hidden_init: str = "paper") -> dict[int, DepthPoint]:
    """The depth series among the recorded ``rows`` (those with a ``depth``) whose hidden layers started as
    ``hidden_init`` says (a one-layer network has none: it belongs to every series), by depth (empty if there are
    none). Whether each depth learned is judged against every MNIST run of ``rows`` (the same budget)."""
    series = [
        r
        for r in rows
        if r.get("depth") is not None and (r["depth"] == 1 or r.get("hidden_init", "paper") == hidden_init)
    ]
    acc = summarise([r for r in rows if r["dataset"] == "mnist"], "mnist")
    out = {}
    for depth in sorted({r["depth"] for r in series}):
        rs = [r for r in series if r["depth"] == depth]
        layers = [
            {k: sum(r["layers"][i][k] for r in rs) / len(rs) for k in rs[0]["layers"][i] if k != "layer"}
            for i in range(depth)
        ]
        out[depth] = DepthPoint(rs[0]["parameters"], acc[config_key(rs[0])], layers)
    return out


#: the columns of :func:`depth_rows`
DEPTH_HEADERS = (
    "routing layers",
    "parameters",
    "MNIST test (%)",
    "affine MNIST (%)",
    "parents never active, by hidden layer",
    "RMS gradient by layer, image side first",
)


@checked
def depth_rows(series: dict[int, DepthPoint]) -> list[list[str]]:
    """One table row per depth of :func:`depth_series`: parameters, MNIST test and affine accuracy (mean ± standard
    error over the seeds), the share of parents never active per hidden layer and the RMS gradient per layer."""
    return [
        [
            depth,
            f"{p.params / 1e6:.2f}M",
            str(p.accuracy["test_acc"]),
            str(p.accuracy["affine_acc"]),
            ", ".join(f"{v:.0%}" for v in p.never_active) or "-",
            ", ".join(f"{g:.1e}" for g in p.gradients),
        ]
        for depth, p in series.items()
    ]
