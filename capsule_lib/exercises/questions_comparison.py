"""The concept questions of the comparison chapters (routing compared, robustness, the critique), one builder each
(see :mod:`.questions`)."""

from __future__ import annotations

from typing import Any

from ..report import pct
from ..routing_critique import versus
from .quiz import Question, best_of, choices, ranked, rotate


# ------------------------------------------------------------------------------------------ the comparison
def routing_compared_questions(*, results: dict[str, dict[str, Any]], sweeps: dict[str, list[dict[str, Any]]],
                     trained: dict[str, int]) -> list[Question]:  # fmt: skip
    """``results``: contestant -> its row (``model``, ``accuracy``, ...); ``sweeps``: label -> iteration sweep;
    ``trained``: label -> the iterations it was trained with."""
    own = {lab: next(r["accuracy"] for r in rows if r["iterations"] == trained[lab]) for lab, rows in sweeps.items()}
    gains = {lab: max(r["accuracy"] for r in rows) - own[lab] for lab, rows in sweeps.items()}
    helped = sum(g > 0.005 for g in gains.values())
    return [
        Question(
            "What changes between the contestants of this chapter's comparison?",
            rotate(
                choices(
                    "Only the routing layer: same stem, data, budget and seed",
                    "Everything: each paper's own network",
                    "Only the dataset",
                    "Only the number of epochs",
                ),
                1,
            ),  # fmt: skip
            "One network with six routings (and a CNN), trained on the same data for the same wall-clock budget.",
        ),
        Question(
            "A log-log slope of 1 between cost and the number of input capsules means ...",
            choices(
                "cost grows linearly with the inputs",
                "cost is constant",
                "cost grows quadratically",
                "cost falls with more inputs",
            ),  # fmt: skip
            "Slope 1 is linear growth, the best any routing that reads every input can do; 2 would be quadratic.",
        ),
        Question(
            "Predict: at equal budget, which model is the most accurate on the test digits?",
            best_of({r["model"]: r["accuracy"] for r in results.values()}),
            "Measured on this page: " + ", ".join(f"{r['model']} {pct(r['accuracy'])}" for r in results.values()) + ".",
        ),
        Question(
            f"Predict: of the {len(gains)} iterative routings, how many gain more than half a point of accuracy when "
            "run with a better number of iterations at test time than they were trained with?",
            ranked(str(helped), [str(k) for k in range(len(gains) + 1)]),
            "Measured on this page (best T minus trained T): "
            + ", ".join(f"{k} {100 * g:+.1f} points" for k, g in gains.items())
            + ".",
        ),
    ]


# --------------------------------------------------------------------------------------------- robustness
def robustness_questions(*, curves: dict[str, dict[str, Any]], eps: float = 0.1) -> list[Question]:
    """``curves``: model -> attack -> :class:`~capsule_lib.robustness.AttackCurve` (MNIST)."""
    kept = {name: c["BIM"].at(eps) for name, c in curves.items()}
    return [
        Question(
            "What does an L∞ budget ε = 0.1 allow an attack to do?",
            rotate(
                choices(
                    "Move every pixel by at most 0.1 (pixels in [0, 1])",
                    "Change at most 10 % of the pixels",
                    "Move the image's L2 norm by 0.1",
                    "Change the label with probability 0.1",
                ),
                1,
            ),  # fmt: skip
            "No pixel moves by more than ε; the image stays in [0, 1].",
        ),
        Question(
            "Why check for gradient masking?",
            choices(
                "A model can look robust because the attack's gradient is useless, not because it is robust",
                "To make the attack faster",
                "Because capsules have no gradient",
                "To choose ε",
            ),  # fmt: skip
            "Squashes and softmaxes can saturate; checks such as 'the iterative attack is at least as strong' and "
            "'a large budget reaches 0 %' catch an attack that fails for the wrong reason.",
        ),
        Question(
            "What does DARCCC use to flag an adversarial image?",
            rotate(
                choices(
                    "A large distance between the image and its reconstruction from the winning capsule",
                    "A low capsule length",
                    "The attack's gradient",
                    "A second classifier",
                ),
                3,
            ),  # fmt: skip
            "An adversarial image classified as another digit is reconstructed as that digit, far from the input; a "
            "reconstruction-aware attack keeps the distance small as well.",
        ),
        Question(
            f"Predict: under BIM at ε = {eps:g}, which MNIST model keeps the most test digits?",
            best_of(kept),
            "Measured on this page: " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in kept.items()) + ".",
        ),
    ]


# ---------------------------------------------------------------------------------------------- critique
def routing_critique_questions(*, summary: dict[str, dict[str, Any]], changes: dict[str, Any]) -> list[Question]:
    """``summary``: dataset -> configuration -> metric -> Measured; ``changes``: routing -> RoutingChanges."""
    routed, uniform = summary["mnist"]["dynamic_routed"]["test_acc"], summary["mnist"]["dynamic_uniform"]["test_acc"]
    verdict = versus(routed, uniform)
    changed = {k: float(c.changed_from_first[-1]) for k, c in changes.items()}
    return [
        Question(
            "For an iterative routing, what are 'uniform couplings'?",
            rotate(
                choices(
                    "c_ij = 1/n_out for every pair: the same as the routing's first iteration",
                    "Random couplings",
                    "Couplings learned as parameters",
                    "Couplings that sum to 1 over the children",
                ),
                1,
            ),  # fmt: skip
            "Every iterative routing starts from uniform couplings, so fixing them is routing with one iteration; the "
            "chapter checks this equality in float64 for every algorithm.",
        ),
        Question(
            "When does the chapter call two measurements different?",
            choices(
                "When their means differ by more than twice their standard errors combined in quadrature",
                "Whenever the means differ",
                "When one seed disagrees",
                "When the difference exceeds 1 point",
            ),
            "The two-standard-error rule, over two seeds (a single seed's error would hold only the test set's "
            "binomial error).",
        ),
        Question(
            "What would a parse tree look like in the couplings?",
            rotate(
                choices(
                    "Low entropy (each child commits to one parent), varying between images",
                    "Uniform couplings",
                    "The same couplings for every image",
                    "High entropy in every layer",
                ),
                2,
            ),  # fmt: skip
            "Each child commits to one parent, which parent depends on the image, and unused parents stay idle.",
        ),
        Question(
            "Predict: on MNIST, is dynamic routing with its 3 iterations more accurate than the same network with "
            "uniform couplings, by the two-standard-error rule?",
            ranked(verdict, ["higher", "lower", "within noise"]),
            f"Measured (recorded runs, mean ± standard error over the seeds): routed {routed} %, uniform {uniform} % "
            f"→ {verdict}.",
        ),
        Question(
            "Predict: routed again with 10 iterations at test time, which network changes the most predictions "
            "relative to T = 1?",
            best_of(changed),
            "Measured on this page: " + ", ".join(f"{k} {pct(v, 1)}" for k, v in changed.items()) + ".",
        ),
    ]
