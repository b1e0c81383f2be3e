"""The chapter "Do capsules need routing?" on the comparison network: its training runs, their records, and what
they say about the critics' claims.

* **the runs** (:class:`CritiqueRun`, :func:`critique_runs`, :func:`train_run`): every routing kind of the comparison
  network routed, with Paik et al.'s uniform and random couplings, and dynamic routing at other iteration counts,
  plus the two routing-free heads, each for the same epochs (:data:`CRITIQUE_BUDGET`) and two seeds; the records are
  shipped with the checkpoints (:func:`recorded_runs`);
* **reading them** (:func:`summarise`, :class:`Measured`, :func:`versus`, :func:`coupling_rows`): means over the seeds
  with standard errors, the two-standard-error rule;
* **the verdicts** (:func:`fixed_coupling_verdicts`, :func:`iteration_verdicts`, :func:`routing_free_verdicts`,
  :func:`tree_verdicts`): each claim in the critic's words (:data:`CLAIMS`), our measurement and "holds", "does not
  hold" or "within noise"; the measurements of trained networks come from :mod:`capsule_lib.critique`.
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
from .comparison import SHORT_LABELS, contestant_recipe
from .critique import LayerRouting, RoutingChanges
from .data import get_dataset
from .evaluation import accuracy_standard_error, predict
from .routing.kinds import ROUTING_KINDS
from .train import train
from .train.shipped import CHECKPOINT_DIR

__all__ = [
    "CRITIQUE_BUDGET",
    "CRITIQUE_SEEDS",
    "CRITIQUE_DYNAMIC_ITERATIONS",
    "CritiqueRun",
    "critique_runs",
    "N_AFFINE",
    "train_run",
    "CRITIQUE_RECORDS",
    "recorded_runs",
    "retrain_cost",
    "METRICS",
    "METRIC_SIZES",
    "config_key",
    "Measured",
    "measured",
    "summarise",
    "versus",
    "judged",
    "COUPLING_HEADERS",
    "coupling_rows",
    "VERDICT_HEADERS",
    "CLAIMS",
    "STATIC_VARIATION",
    "POLARISED_ENTROPY",
    "STARVED_SHARE",
    "fixed_coupling_verdicts",
    "iteration_verdicts",
    "routing_free_verdicts",
    "tree_verdicts",
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


@dataclass(frozen=True)
class CritiqueRun:
    """One training run of the chapter: ``kind`` (a routing kind) routed with ``couplings`` (``"routed"``: its own
    algorithm; ``"uniform"``, ``"random"``: Paik et al.'s baselines) for ``iterations`` (``None``: its default), or
    a routing-free ``head`` (``"hvc"``, ``"shared_transform"``), on ``dataset`` with ``seed``."""

    dataset: str
    kind: str
    couplings: str = "routed"
    seed: int = 0
    iterations: int | None = None
    head: str = "routing"

    @property
    def name(self) -> str:
        what = self.head if self.head != "routing" else f"{self.kind}_{self.couplings}"
        its = f"_T{self.iterations}" if self.iterations is not None else ""
        return f"critique_{self.dataset}_{what}{its}_seed{self.seed}"

    def recipe(self, **overrides: Any) -> Any:
        """The comparison's recipe of ``kind`` on ``dataset`` (:func:`~capsule_lib.comparison.contestant_recipe`)
        with this run's couplings, iterations, head, seed and :data:`CRITIQUE_BUDGET`, then ``overrides``."""
        model = {"model__couplings": self.couplings, "model__head": self.head}
        if self.iterations is not None:
            model["model__iterations"] = self.iterations
        fields = {**CRITIQUE_BUDGET[self.dataset], "seed": self.seed, **model, **overrides}
        return contestant_recipe(self.kind, self.dataset, **fields)


def critique_runs(datasets: Sequence[str] = ("mnist", "norb"), heads: bool = True) -> list[CritiqueRun]:
    """Every run of the chapter, in training order: per dataset and seed, each routing kind routed, with uniform and
    with random couplings; dynamic routing at :data:`CRITIQUE_DYNAMIC_ITERATIONS`; with ``heads``, the two
    routing-free heads (MNIST only: the affine test)."""
    runs = []
    for ds in datasets:
        for seed in CRITIQUE_SEEDS:
            runs += [CritiqueRun(ds, k, c, seed) for k in ROUTING_KINDS for c in ("routed", "uniform", "random")]
            runs += [CritiqueRun(ds, "dynamic", "routed", seed, T) for T in CRITIQUE_DYNAMIC_ITERATIONS]
            if heads and ds == "mnist":
                runs += [CritiqueRun(ds, "dynamic", seed=seed, head=h) for h in ("hvc", "shared_transform")]
    return runs


#: the affine test images each MNIST run is also evaluated on (the comparison chapter's first 5,000)
N_AFFINE = 5000


def train_run(
    run: CritiqueRun, data_root: Any = None, out_dir: Any = None, progress: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Train one run of the chapter (:func:`~capsule_lib.train.train`, model selection on the validation split) and
    return its record: the configuration, parameters, epochs, training images and seconds, the hardware, and the
    accuracies of the selected weights: validation, test (MNIST; the familiar and novel test views on the viewpoint
    protocol) and, on MNIST, the first :data:`N_AFFINE` affine-transformed test images. ``overrides``: recipe fields
    (e.g. a smoke run's ``train_subset``)."""
    t0 = time.time()
    model, trainer = train(run.recipe(**overrides), out_dir=out_dir, data_root=data_root, progress=progress)
    hist = trainer.history
    rec: dict[str, Any] = {
        "name": run.name,
        "dataset": run.dataset,
        "kind": run.kind,
        "couplings": run.couplings,
        "seed": run.seed,
        "iterations": run.iterations,
        "head": run.head,
        "parameters": sum(p.numel() for p in model.parameters()),
        "epochs": hist.records[-1]["epoch"],
        "train_images": hist.meta["train_images"],
        "train_seconds": hist.records[-1]["wall_time"],
        "hardware": hist.meta["hardware"],
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
    rec["total_seconds"] = time.time() - t0
    return rec


# where the recorded runs are shipped, capsule_lib/checkpoints/critique_runs.json (benchmarks/critique_runs.py
# --collect writes it: the machine and one train_run record per run); a plain comment: a documented value would print
# this machine's absolute path on the API page
CRITIQUE_RECORDS = CHECKPOINT_DIR / "critique_runs.json"


def recorded_runs(path: Any = None) -> dict[str, Any]:
    """The shipped records of the chapter's runs: ``{"machine": ..., "rows": [record, ...], "missing": [name, ...]}``
    (``path``: another file of that form)."""
    return json.loads(Path(path or CRITIQUE_RECORDS).read_text())


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


def config_key(row: dict[str, Any]) -> str:
    """A run's configuration without its seed: ``"<kind>_<couplings>"`` (``"_T<iterations>"`` when set), or the
    routing-free head's name."""
    if row.get("head", "routing") != "routing":
        return row["head"]
    its = f"_T{row['iterations']}" if row.get("iterations") is not None else ""
    return f"{row['kind']}_{row['couplings']}{its}"


@dataclass(frozen=True)
class Measured:
    """One configuration's metric over its seeds: the mean, its standard error (the spread over the seeds and the
    binomial error of each accuracy on ``n_images``, added in quadrature) and the seeds' values."""

    mean: float
    se: float
    values: tuple[float, ...]

    def __str__(self) -> str:
        return f"{100 * self.mean:.2f} ± {100 * self.se:.2f}"


def measured(values: Sequence[float], n_images: int) -> Measured:
    """:class:`Measured` of one configuration's accuracies over seeds (``values``), each on ``n_images`` images."""
    v = torch.tensor([float(x) for x in values], dtype=torch.float64)
    if v.numel() == 0:
        raise ValueError("no runs to summarise")
    m = v.mean().item()
    seed_var = (v.var(unbiased=True).item() / v.numel()) if v.numel() > 1 else 0.0
    binom_var = accuracy_standard_error(m, n_images) ** 2 / v.numel()
    return Measured(m, math.sqrt(seed_var + binom_var), tuple(v.tolist()))


def summarise(rows: Sequence[dict[str, Any]], dataset: str) -> dict[str, dict[str, Measured]]:
    """The runs of ``dataset`` by configuration (:func:`config_key`) -> metric (:data:`METRICS`) -> :class:`Measured`
    over their seeds."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["dataset"] == dataset:
            groups.setdefault(config_key(r), []).append(r)
    return {
        key: {m: measured([r[m] for r in rs], METRIC_SIZES[m]) for m in METRICS[dataset] if m in rs[0]}
        for key, rs in groups.items()
    }


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
    """:func:`versus`, where both measurements have at least two seeds; ``None`` where one has a single seed (its
    standard error would hold the test set's binomial error only, not how much training from another seed moves the
    accuracy, and at a short budget that is the larger part)."""
    return versus(a, b) if min(len(a.values), len(b.values)) >= 2 else None


#: the columns of :func:`coupling_rows`
COUPLING_HEADERS = ("routing", "routed", "uniform", "random", "routed vs uniform", "routed vs random")


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


# ---------------------------------------------------------------------------------------------------------------------
# The verdicts: each claim, the critic's words, our measurement, and what the two-standard-error rule says
# ---------------------------------------------------------------------------------------------------------------------

#: the columns of the verdict rows
VERDICT_HEADERS = ("claim", "the critic", "ours", "verdict")

#: the critics' claims as their abstracts state them (key -> short claim, source key in references.bib, the words)
CLAIMS: dict[str, tuple[str, str, str]] = {
    "fixed": (
        "routing is no better than fixed couplings",
        "paik2019capsule",
        "often worse than baselines that assign the couplings uniformly or randomly",
    ),
    "changes": (
        "iterating does not change the prediction",
        "paik2019capsule",
        "in most cases does not change the classification result",
    ),
    "polarises": (
        "iterating polarises the couplings",
        "paik2019capsule",
        "polarizes the link strengths, extremely so when repeated without stopping",
    ),
    "affine": (
        "routing does not help affine robustness",
        "gu2020improving",
        "routing contributes neither to generalization nor to affine robustness",
    ),
    "shared": (
        "shared transforms without routing are more robust",
        "gu2020improving",
        "affNIST 79% (CapsNet) to 93.21% (Aff-CapsNets), no routing",
    ),
    "hvc": (
        "HVCs without routing match routing networks",
        "byerly2021norouting",
        "MNIST 99.83% (one model), as well as the best capsule network",
    ),
    "static": (
        "no parse tree: couplings barely depend on the image",
        "mitterreiter2023why",
        "the parse-tree concept is not present in CapsNets",
    ),
    "starve": (
        "many capsules starve",
        "mitterreiter2023why",
        "a vanishing gradient results in the starvation of many capsules during training",
    ),
    "vanish": ("the gradient vanishes towards the image", "mitterreiter2023why", "a vanishing gradient problem"),
}

#: below this ``variation`` (:class:`~capsule_lib.critique.CouplingStats`) the couplings count as static (from image
#: to image they move by less than a tenth of the uniform share)
STATIC_VARIATION = 0.1

#: the couplings count as polarised when their mean normalised entropy at the largest test-time ``T`` is at most this
POLARISED_ENTROPY = 0.5

#: many capsules starve when at least this share of an intermediate layer's parents is never active
STARVED_SHARE = 0.25


def _claim(key: str, ours: str, verdict: str, subject: str = "") -> list[str]:
    claim, cite, words = CLAIMS[key]
    return [f"{claim}{f' ({subject})' if subject else ''}", f"{words} {{cite}}`{cite}`", ours, verdict]


def _no_better(results: Sequence[str]) -> str:
    """ "Routing is no better than the baseline" from the routed network's :func:`versus` on several metrics."""
    if "higher" in results and "lower" in results:
        return "mixed"
    if "higher" in results:
        return "does not hold"
    return "holds" if "lower" in results else "within noise"


def fixed_coupling_verdicts(summaries: dict[str, dict[str, dict[str, Measured]]]) -> list[list[str]]:
    """Paik et al.'s first claim for each routing kind: the routed network against the same network with uniform and
    with random couplings on every metric of ``summaries`` (dataset -> :func:`summarise`): it holds where the routed
    network is lower on some metric and higher on none, does not where it is higher on some and lower on none. Only
    metrics measured with at least two seeds on both sides are judged (:func:`judged`)."""
    rows = []
    for kind in ROUTING_KINDS:
        parts, verdicts = [], []
        for scheme in ("uniform", "random"):
            res, diffs = [], []
            for ds, summary in summaries.items():
                routed, fixed = summary.get(f"{kind}_routed", {}), summary.get(f"{kind}_{scheme}", {})
                for m in (m for m in routed if m in fixed and judged(routed[m], fixed[m]) is not None):
                    res.append(versus(routed[m], fixed[m]))
                    diffs.append(f"{100 * (routed[m].mean - fixed[m].mean):+.1f} ({METRICS[ds][m]})")
            if res:
                parts.append(f"routed - {scheme}: " + ", ".join(diffs) + " points")
                verdicts.append(f"{scheme}: {_no_better(res)}")
        if parts:
            rows.append(_claim("fixed", "; ".join(parts), "; ".join(verdicts), SHORT_LABELS[kind]))
    return rows


def iteration_verdicts(changes: dict[str, RoutingChanges], n_images: int) -> list[list[str]]:
    """Paik et al.'s second and third claims on each trained network of ``changes`` (kind -> :func:`routing_changes`
    on ``n_images`` labelled images): the accuracy at its own ``T`` against ``T = 1`` (two standard errors: within
    noise = the routing does not change the result), and whether the couplings polarise: their entropy falls at
    every added iteration, to at most :data:`POLARISED_ENTROPY` at the last ``T``."""
    rows = []
    for kind, ch in changes.items():
        if ch.accuracy is None:
            raise ValueError(f"{kind}: routing_changes needs labels for the verdicts")
        k = ch.iterations.index(ch.default)
        first, own = measured([ch.accuracy[0]], n_images), measured([ch.accuracy[k]], n_images)
        cmp = versus(own, first)
        rows.append(
            _claim(
                "changes",
                f"T = 1 -> {ch.default}: {100 * ch.changed_from_first[k]:.1f}% of predictions change; accuracy "
                f"{100 * first.mean:.2f} -> {100 * own.mean:.2f}% ({cmp})",
                "holds" if cmp == "within noise" else "does not hold",
                SHORT_LABELS[kind],
            )
        )
        ent = [s.entropy for s in ch.stats]
        falls = all(b <= a + 1e-6 for a, b in zip(ent, ent[1:])) and ent[-1] <= POLARISED_ENTROPY
        rows.append(
            _claim(
                "polarises",
                f"entropy {ent[0]:.2f} (T = 1) -> {ent[k]:.2f} (T = {ch.default}) -> {ent[-1]:.2f} "
                f"(T = {ch.iterations[-1]})",
                "holds" if falls else "does not hold",
                SHORT_LABELS[kind],
            )
        )
    return rows


def routing_free_verdicts(mnist: dict[str, dict[str, Measured]]) -> list[list[str]]:
    """Gu & Tresp's and Byerly et al.'s claims on the MNIST runs (:func:`summarise`): dynamic routing against its
    uniform couplings on the affine test; the shared-transform head against routed dynamic routing on the affine
    test; the HVC head against the best routed network on the test split."""
    rows = []
    routed, uniform = mnist["dynamic_routed"], mnist["dynamic_uniform"]
    cmp = versus(routed["affine_acc"], uniform["affine_acc"])
    rows.append(
        _claim(
            "affine",
            f"affine MNIST: routed {routed['affine_acc']}, uniform {uniform['affine_acc']} ({cmp})",
            "does not hold" if cmp == "higher" else "holds",
            "dynamic",
        )
    )
    if "shared_transform" in mnist:
        shared = mnist["shared_transform"]["affine_acc"]
        cmp = versus(shared, routed["affine_acc"])
        verdict = {"higher": "holds", "lower": "does not hold"}.get(cmp, "within noise")
        rows.append(
            _claim(
                "shared",
                f"affine MNIST: shared transforms {shared}, dynamic routing {routed['affine_acc']} ({cmp})",
                verdict,
            )
        )
    if "hvc" in mnist:
        best = max(
            (k for k in ROUTING_KINDS if f"{k}_routed" in mnist), key=lambda k: mnist[f"{k}_routed"]["test_acc"].mean
        )
        hvc, top = mnist["hvc"]["test_acc"], mnist[f"{best}_routed"]["test_acc"]
        cmp = versus(hvc, top)
        rows.append(
            _claim(
                "hvc",
                f"MNIST test: HVC {hvc}, best routed ({SHORT_LABELS[best]}) {top} ({cmp})",
                "does not hold" if cmp == "lower" else "holds",
            )
        )
    return rows


def tree_verdicts(layers: dict[str, Sequence[LayerRouting]], gradients: dict[str, dict[str, float]]) -> list[list[str]]:
    """Mitterreiter et al.'s claims on multi-layer networks (label -> :func:`routing_by_layer` at the network's own
    ``T``, the largest in the list; label -> :func:`gradient_by_layer`, image side first): the couplings are static
    where every layer's ``variation`` is below :data:`STATIC_VARIATION`; many capsules starve where at least
    :data:`STARVED_SHARE` of an intermediate layer's parents are never active; the gradient vanishes where it
    shrinks at every layer from the class layer towards the image."""
    rows = []
    for label, rs in layers.items():
        T = max(r.iterations for r in rs)
        own = sorted((r for r in rs if r.iterations == T), key=lambda r: r.depth)
        var = ", ".join(f"{r.stats.variation:.2f}" for r in own)
        static = all(r.stats.variation < STATIC_VARIATION for r in own)
        rows.append(
            _claim(
                "static",
                f"variation by layer (T = {T}): {var}; entropy " + ", ".join(f"{r.stats.entropy:.2f}" for r in own),
                "holds" if static else "does not hold",
                label,
            )
        )
        alive = [r.stats.alive for r in own[:-1]]  # intermediate layers: the class layer's parents are the classes
        starved = bool(alive) and max(1 - a for a in alive) >= STARVED_SHARE
        never = ", ".join(f"{1 - a:.0%}" for a in alive)
        rows.append(
            _claim(
                "starve",
                f"parents never active, by intermediate layer: {never}",
                "holds" if starved else "does not hold",
                label,
            )
        )
        g = list(gradients.get(label, {}).values())
        if len(g) >= 2:
            by_layer = ", ".join(f"{v:.1e}" for v in g)
            shrinks = all(a < b for a, b in zip(g, g[1:]))
            rows.append(
                _claim(
                    "vanish",
                    f"RMS gradient by layer, image side first: {by_layer}",
                    "holds" if shrinks else "does not hold",
                    label,
                )
            )
    return rows
