"""The verdicts of the chapter "Do capsules need routing?": each critic's claim in its own words (:data:`CLAIMS`), our
measurement and "holds", "does not hold" or "within noise", by the two-standard-error rule where there are seeds
(:func:`~capsule_lib.routing_critique.versus`) and by stated thresholds otherwise; a verdict that rests on a network
that did not learn (:mod:`capsule_lib.learning`'s rule) is :data:`~capsule_lib.learning.NOT_TESTED`.

* Paik et al.: :func:`fixed_coupling_verdicts` (the recorded runs), :func:`iteration_verdicts` (test-time
  iterations of trained networks, :func:`capsule_lib.critique.routing_changes`);
* Gu & Tresp, Byerly et al.: :func:`routing_free_verdicts`;
* Mitterreiter et al.: :func:`tree_verdicts` (multi-layer networks, :func:`capsule_lib.critique.routing_by_layer`,
  :func:`~capsule_lib.critique.gradient_by_layer`) and :func:`depth_verdicts` (the recorded depth series).

Every function returns rows of :data:`VERDICT_HEADERS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._contracts import checked
from .comparison import SHORT_LABELS
from .critique import LayerRouting, RoutingChanges
from .learning import NOT_TESTED
from .routing.kinds import ROUTING_KINDS
from .routing_critique import METRICS, DepthPoint, Measured, judged, measured, versus

__all__ = [
    "VERDICT_HEADERS",
    "CLAIMS",
    "STATIC_VARIATION",
    "POLARISED_ENTROPY",
    "STARVED_SHARE",
    "fixed_coupling_verdicts",
    "iteration_verdicts",
    "routing_free_verdicts",
    "tree_verdicts",
    "depth_verdicts",
    "tally",
]

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
        "Aff-CapsNets' shared transforms without routing are more robust",
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
    "deeper": ("more capsule layers do not help", "mitterreiter2023why", "why capsule neural networks do not scale"),
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


@checked
def fixed_coupling_verdicts(summaries: dict[str, dict[str, dict[str, Measured]]]) -> list[list[str]]:
    """Paik et al.'s first claim for each routing kind: the routed network against the same network with uniform and
    with random couplings on every metric of ``summaries`` (dataset -> :func:`summarise`): it holds where the routed
    network is lower on some metric and higher on none, does not where it is higher on some and lower on none. Only
    metrics measured with at least two seeds on both sides are judged (:func:`judged`); where one side did not learn
    the scheme's verdict is :data:`~capsule_lib.learning.NOT_TESTED`."""
    rows = []
    for kind in ROUTING_KINDS:
        parts, verdicts = [], []
        for scheme in ("uniform", "random"):
            res, diffs = [], []
            for ds, summary in summaries.items():
                routed, fixed = summary.get(f"{kind}_routed", {}), summary.get(f"{kind}_{scheme}", {})
                for m in (m for m in routed if m in fixed and judged(routed[m], fixed[m]) is not None):
                    res.append(judged(routed[m], fixed[m]))
                    diffs.append(f"{100 * (routed[m].mean - fixed[m].mean):+.1f} ({METRICS[ds][m]})")
            if res:
                parts.append(f"routed - {scheme}: " + ", ".join(diffs) + " points")
                verdicts.append(f"{scheme}: {NOT_TESTED if NOT_TESTED in res else _no_better(res)}")
        if parts:
            rows.append(_claim("fixed", "; ".join(parts), "; ".join(verdicts), SHORT_LABELS[kind]))
    return rows


@checked
def iteration_verdicts(
    changes: dict[str, RoutingChanges], n_images: int, untrained: Sequence[str] = ()
) -> list[list[str]]:
    """Paik et al.'s second and third claims on each trained network of ``changes`` (kind -> :func:`routing_changes`
    on ``n_images`` labelled images): the accuracy at its own ``T`` against ``T = 1`` (two standard errors: within
    noise = the routing does not change the result), and whether the couplings polarise: their entropy falls at
    every added iteration, to at most :data:`POLARISED_ENTROPY` at the last ``T``. The kinds in ``untrained`` (their
    networks did not learn: :func:`~capsule_lib.comparison.untrained_contestants`) are :data:`NOT_TESTED`."""
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
                NOT_TESTED if kind in untrained else "holds" if cmp == "within noise" else "does not hold",
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
                NOT_TESTED if kind in untrained else "holds" if falls else "does not hold",
                SHORT_LABELS[kind],
            )
        )
    return rows


def _judge(a: Measured, b: Measured, verdicts: dict[str, str]) -> tuple[str, str]:
    """``(comparison, verdict)``: :func:`versus` of ``a`` against ``b`` and its verdict from ``verdicts`` (comparison ->
    verdict, "within noise" by default), or :data:`NOT_TESTED` for both when one of them did not learn."""
    if not (a.learned and b.learned):
        return NOT_TESTED, NOT_TESTED
    cmp = versus(a, b)
    return cmp, verdicts.get(cmp, "within noise")


@checked
def routing_free_verdicts(mnist: dict[str, dict[str, Measured]]) -> list[list[str]]:
    """Gu & Tresp's and Byerly et al.'s claims on the MNIST runs (:func:`summarise`): dynamic routing against its
    uniform couplings on the affine test; Aff-CapsNets' layer (head ``"aff_capsnet"``) against routed dynamic routing
    on the affine test, at the chapter's budget and at each lengthened one both were trained with (keys ending in
    ``"_e<epochs>"``); the HVC head against the best routed network that learned on the test split."""
    rows = []
    routed, uniform = mnist["dynamic_routed"], mnist["dynamic_uniform"]
    cmp, verdict = _judge(routed["affine_acc"], uniform["affine_acc"], {"higher": "does not hold", "lower": "holds"})
    verdict = "holds" if verdict == "within noise" else verdict  # "contributes neither": within noise agrees
    rows.append(
        _claim(
            "affine",
            f"affine MNIST: routed {routed['affine_acc']}, uniform {uniform['affine_acc']} ({cmp})",
            verdict,
            "dynamic",
        )
    )
    for key in sorted(k for k in mnist if k.startswith("aff_capsnet")):  # and with a lengthened budget, "_e<epochs>"
        budget = key.removeprefix("aff_capsnet")
        ref = mnist.get(f"dynamic_routed{budget}", {}).get("affine_acc")
        if ref is None:
            continue
        shared = mnist[key]["affine_acc"]
        cmp, verdict = _judge(shared, ref, {"higher": "holds", "lower": "does not hold"})
        ours = f"affine MNIST: Aff-CapsNets' layer {shared}, dynamic routing {ref} ({cmp})"
        rows.append(_claim("shared", ours, verdict, f"{budget[2:]} epochs, both" if budget else ""))
    learned_routed = [k for k in ROUTING_KINDS if f"{k}_routed" in mnist and mnist[f"{k}_routed"]["test_acc"].learned]
    if "hvc" in mnist and learned_routed:
        best = max(learned_routed, key=lambda k: mnist[f"{k}_routed"]["test_acc"].mean)
        hvc, top = mnist["hvc"]["test_acc"], mnist[f"{best}_routed"]["test_acc"]
        cmp, verdict = _judge(hvc, top, {"lower": "does not hold", "higher": "holds", "within noise": "holds"})
        rows.append(_claim("hvc", f"MNIST test: HVC {hvc}, best routed ({SHORT_LABELS[best]}) {top} ({cmp})", verdict))
    return rows


@checked
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


@checked
def depth_verdicts(series: dict[int, DepthPoint], label: str = "dynamic") -> list[list[str]]:
    """Mitterreiter et al.'s claims on a depth series (:func:`~capsule_lib.routing_critique.depth_series`, ``label``
    naming it): each deeper network's MNIST test accuracy against the shallowest (two standard errors: holds where
    deeper is lower, does not where it is higher); starvation (at least :data:`STARVED_SHARE` of a hidden layer's
    parents never active) and the vanishing gradient (the RMS gradient shrinking at every layer towards the image) in
    the deepest network. A verdict that rests on a depth that did not learn is :data:`NOT_TESTED`."""
    if not series:
        return []
    depths = sorted(series)
    deepest = series[depths[-1]]
    acc = {k: series[k].accuracy["test_acc"] for k in depths}
    cmp = [versus(acc[k], acc[depths[0]]) for k in depths[1:]]
    ours = ", ".join(f"{k}: {acc[k]}" for k in depths)
    never, g = deepest.never_active, deepest.gradients
    deep_label = f"{label}, {depths[-1]} routing layers"
    all_learned, deepest_learned = all(a.learned for a in acc.values()), acc[depths[-1]].learned
    return [
        _claim(
            "deeper", f"MNIST test (%) by routing layers, {ours}", _no_better(cmp) if all_learned else NOT_TESTED, label
        ),
        _claim(
            "starve",
            "parents never active, by hidden layer: " + ", ".join(f"{v:.0%}" for v in never),
            NOT_TESTED
            if not deepest_learned
            else "holds"
            if never and max(never) >= STARVED_SHARE
            else "does not hold",
            deep_label,
        ),
        _claim(
            "vanish",
            "RMS gradient by layer, image side first: " + ", ".join(f"{v:.1e}" for v in g),
            NOT_TESTED if not deepest_learned else "holds" if all(a < b for a, b in zip(g, g[1:])) else "does not hold",
            deep_label,
        ),
    ]


@checked
def tally(verdicts: Sequence[Sequence[str]]) -> str:
    """One line counting the verdicts of ``verdicts`` (rows of :data:`VERDICT_HEADERS`; a row against both baselines,
    ``"uniform: ...; random: ..."``, counts twice), most frequent first."""
    counts: dict[str, int] = {}
    for *_, v in verdicts:
        for part in v.split("; "):
            key = part.split(": ", 1)[-1]
            counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return f"{len(verdicts)} rows, {sum(counts.values())} verdicts (a row against both baselines counts twice): " + (
        ", ".join(f"{k} {n}" for k, n in ordered)
    )
