"""The concept questions of the algorithm chapters (the primer to Efficient-CapsNet), one builder each: fixed
questions and predictions whose answers come from the measurements passed in (see :mod:`.questions`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..functional import capsule_lengths, squash_efficient, squash_hinton
from ..report import pct
from .quiz import Choice, Question, best_of, choices, ranked, rotate


# ------------------------------------------------------------------------------------------------- primer
def primer_questions(*, v: torch.Tensor, sweep: dict[str, Any]) -> list[Question]:
    """``v``: the toy's parents after 8 iterations ``[1, 2, D]``; ``sweep``: "
    ":func:`~capsule_lib.analysis.outlier_sweep`."""
    short = torch.tensor([[0.1, 0.0]])
    h, e = float(capsule_lengths(squash_hinton(short))), float(capsule_lengths(squash_efficient(short)))
    a, b = (float(x) for x in capsule_lengths(v)[0])
    lengths = sweep["lengths"]  # [M, plain/leaky, T, A/B]
    m_last, t1, t3 = int(sweep["n_outliers"][-1]), float(lengths[-1, 0, 0, 1]), float(lengths[-1, 0, -1, 1])
    longer = "A" if a > b else "B"
    return [
        Question(
            "A capsule outputs a vector of length 0.8. What does the length say?",
            rotate(
                choices(
                    "The entity it stands for is present with probability about 0.8",
                    "The entity is rotated by 0.8 radians",
                    "80 % of the children vote for it",
                    "Its pose has 0.8 times the size of the input's",
                ),
                1,
            ),  # fmt: skip
            "The length is the probability that the entity is present; the direction encodes its pose.",
        ),
        Question(
            "Why can a squashed capsule approach length 1 but never reach it?",
            choices(
                "Because |s|² / (1 + |s|²) < 1 for every finite s",
                "Because the squash divides by the number of capsules",
                "Because of the epsilon in the norm",
                "It can: a long enough s reaches 1 exactly",
            ),  # fmt: skip
            "squash_H keeps the direction of s and maps its length |s| to |s|² / (1 + |s|²), which tends to 1 "
            "as |s| grows without ever equalling it.",
        ),
        Question(
            "A short vector, |s| = 0.1, is squashed by squash_H and by squash_E. Which keeps it longer?",
            rotate(choices("squash_E", "squash_H", "Both give the same length"), 2),
            f"squash_H gives |v| = {h:.4f} (quadratic near 0), squash_E {e:.4f} (nearly the identity near 0): "
            "computed here with the library's two squash functions.",
        ),
        Question(
            "In dynamic routing, the coupling coefficients of one child sum to 1 over ...",
            rotate(
                choices(
                    "the parents: each child shares one unit of vote among them",
                    "the children: each parent receives one unit of vote",
                    "both the children and the parents",
                    "nothing: they are free weights",
                ),
                3,
            ),  # fmt: skip
            "c_ij = softmax over j of b_ij: every child distributes its vote among the parents, and the parents "
            "compete for it.",
        ),
        Question(
            "Predict: the toy's five children agree on parent A, three others on parent B, and two outliers vote at "
            "random. After 8 iterations of dynamic routing, which parent is longer?",
            ranked(longer, ["A", "B"]),
            f"Measured on this page: |v_A| = {a:.3f}, |v_B| = {b:.3f} after 8 iterations.",
        ),
        Question(
            f"Predict: with {m_last} outliers and nobody agreeing on parent B, does running 3 iterations instead of 1 "
            "make B shorter?",
            ranked("no" if t3 >= t1 else "yes", ["yes", "no"]),
            f"Measured on this page (mean over the random problems): |v_B| = {t1:.3f} with 1 iteration and {t3:.3f} "
            "with 3. The outliers' votes must go somewhere, since their couplings sum to 1 over the parents.",
        ),
    ]


# -------------------------------------------------------------------------------------- dynamic routing
def dynamic_routing_questions(*, entropy: Any, axis_runs: dict[str, Any]) -> list[Question]:
    """``entropy``: mean coupling entropy per iteration (nats); ``axis_runs``: softmax axis -> (history, output)."""
    ent = [float(x) for x in entropy]
    uniform = math.log(10.0)
    moved = uniform - ent[-1]
    acc = {axis: float(run[0].records[-1]["val_acc"]) for axis, run in axis_runs.items()}
    bins = [("less than 0.01 nats", 0.0, 0.01), ("0.01 to 0.1 nats", 0.01, 0.1), ("0.1 to 1 nat", 0.1, 1.0),
            ("more than 1 nat", 1.0, math.inf)]  # fmt: skip
    right = next(label for label, lo, hi in bins if lo <= moved < hi)
    return [
        Question(
            "CapsNet's primary capsules are 32 types on a 6×6 grid, each of 8 values. How many children does each "
            "digit capsule route from?",
            rotate(choices("1,152", "32", "288", "10"), 2),
            "32 types × 36 positions = 1,152 primary capsules, each voting for each of the 10 digit capsules.",
        ),
        Question(
            "What happens to routing when the softmax runs over the children instead of the parents (gram-ai's bug)?",
            choices(
                "Every coupling is close to 1/1,152 and each parent gets an almost uniform average of votes",
                "The network cannot train at all",
                "The couplings become one-hot after one iteration",
                "Nothing changes: the two axes give the same couplings",
            ),  # fmt: skip
            "Over 1,152 children each coupling starts at 1/1,152 and barely moves: routing turns into plain averaging.",
        ),
        Question(
            "At test time, which capsule does the decoder of CapsNet reconstruct from?",
            rotate(
                choices(
                    "The longest digit capsule (the others masked to zero)",
                    "The label's capsule",
                    "All ten capsules, unmasked",
                    "The primary capsules",
                ),
                1,
            ),  # fmt: skip
            "During training the mask keeps the label's capsule; at test time the longest one, so the reconstruction "
            "shows what the network believes it saw.",
        ),
        Question(
            "The margin loss with m+ = 0.9, m− = 0.1 and λ = 0.5: what does λ do?",
            rotate(
                choices(
                    "It down-weights the loss of the absent classes",
                    "It down-weights the loss of the present class",
                    "It scales the reconstruction loss",
                    "It sets the learning rate",
                ),
                3,
            ),  # fmt: skip
            "L_k = T_k max(0, m+ − |v_k|)² + λ (1 − T_k) max(0, |v_k| − m−)²: λ stops the absent classes' terms from "
            "shrinking every capsule early in training.",
        ),
        Question(
            "Predict: in the trained network, how far does the mean coupling entropy fall from uniform (log 10 nats) "
            "after 3 iterations?",
            tuple(Choice(label, label == right) for label, _, _ in bins),
            f"Measured on this page: {ent[0]:.4f} → {ent[-1]:.4f} nats (uniform {uniform:.4f}), a fall of "
            f"{moved:.4f}: the trained couplings barely move.",
        ),
        Question(
            "Predict: after the same 2 short epochs, which softmax axis gives the higher validation accuracy?",
            best_of(acc),
            "Measured on this page: " + ", ".join(f"over the {k}: {pct(v)}" for k, v in acc.items()) + ".",
        ),
    ]


# ------------------------------------------------------------------------------------------------ EM routing
def em_routing_questions(*, naive: dict[str, dict[str, float]], results: dict[str, dict[str, float]],
               runs: dict[str, list[str]]) -> list[Question]:  # fmt: skip
    """``naive``: condition -> :func:`~capsule_lib.evaluation.compare_with_naive`; ``results``: network ->
    viewpoint accuracies; ``runs``: kind -> its networks."""
    fp16 = float(naive["fp16 votes"]["naive_nonfinite"])
    bins = [("none of them", 0.0, 1e-9), ("a few (under 10 %)", 1e-9, 0.1), ("a good part (10 % to 90 %)", 0.1, 0.9),
            ("nearly all or all (90 % or more)", 0.9, 1.01)]  # fmt: skip
    right = next(label for label, lo, hi in bins if lo <= fp16 < hi)
    drop = {kind: sum(results[n]["drop"] for n in names) / len(names) for kind, names in runs.items()}
    return [
        Question(
            "A matrix capsule is ...",
            rotate(
                choices(
                    "a 4×4 pose matrix and a separate activation",
                    "a vector whose length is its probability",
                    "a 4×4 matrix whose norm is its probability",
                    "a scalar activation",
                ),
                1,
            ),  # fmt: skip
            "EM routing's capsules carry the pose (16 numbers) and the activation apart: no squash is needed.",
        ),
        Question(
            "In EM routing, what is a parent capsule during the M-step?",
            choices(
                "A diagonal Gaussian fitted to the votes it explains",
                "The mean of all votes, unweighted",
                "A softmax over the children",
                "A linear layer",
            ),  # fmt: skip
            "Each parent fits a Gaussian to its votes, weighted by R_ij a_i; its activation rises when the Gaussian "
            "is tight (low cost) and the mass it explains is large.",
        ),
        Question(
            "Why does the library run the E-step in log space?",
            rotate(
                choices(
                    "Products of 16 densities overflow or underflow to 0, and 0/0 gives NaN",
                    "Log space is faster",
                    "The paper writes it in log space",
                    "To make the couplings sum to 1",
                ),
                2,
            ),  # fmt: skip
            "With log-densities and a softmax over the parents, nothing over- or underflows; the literal version fails "
            "whenever every parent's density of a child underflows.",
        ),
        Question(
            "Predict: with fp16 votes, on what share of the images does the literal (probability-space) EM routing "
            "return NaN or inf?",
            tuple(Choice(label, label == right) for label, _, _ in bins),
            f"Measured on this page: {pct(fp16, 0)} of the images (the log-space routing: "
            f"{pct(float(naive['fp16 votes']['log_space_nonfinite']), 0)}).",
        ),
        Question(
            "Predict: averaged over the two seeds, which network loses fewer points from familiar to novel viewpoints?",
            best_of(drop, lowest=True),
            "Measured on this page (mean of 2 seeds): "
            + ", ".join(f"{k} {100 * v:.1f} points" for k, v in drop.items())
            + ".",
        ),
    ]


# ------------------------------------------------------------------------------------------ Heinsen routing
def heinsen_routing_questions(*, results: dict[str, dict[str, float]], runs: dict[str, list[str]],
                    sequence_accuracy: float) -> list[Question]:  # fmt: skip
    """``results``: network -> viewpoint accuracies; ``runs``: kind -> its networks; ``sequence_accuracy``: the
    token task's test accuracy."""
    novel = {kind: sum(results[n]["novel"] for n in names) / len(names) for kind, names in runs.items()}
    bins = [("below 50 %", 0.0, 0.5), ("50 % to 90 %", 0.5, 0.9), ("90 % to 99 %", 0.9, 0.99),
            ("99 % or more", 0.99, 1.01)]  # fmt: skip
    right = next(label for label, lo, hi in bins if lo <= sequence_accuracy < hi)
    return [
        Question(
            "In Heinsen's routing, input capsules carry scores a_i. What are they?",
            rotate(
                choices(
                    "Logits: f(a_i) = sigmoid(a_i) is the data the input carries",
                    "Probabilities in [0, 1]",
                    "Capsule lengths",
                    "Routing coefficients",
                ),
                1,
            ),  # fmt: skip
            "Scores are logits, so padding gets −∞ (f = 0, it carries no data), and an output's score is a logit "
            "too (cross-entropy reads it directly).",
        ),
        Question(
            "What are D_use and D_ign?",
            choices(
                "The data of input i that output j uses (f(a_i) R_ij) and ignores (f(a_i) − D_use)",
                "The votes and their variances",
                "Two learned weight matrices",
                "The E-step and the M-step",
            ),
            "The D-step splits every input's data between use and ignore; an output's logit is the benefit of what it "
            "uses minus the cost of what it ignores.",
        ),
        Question(
            "Why can the same routing take sequences of any length?",
            rotate(
                choices(
                    "W and B can be shared by all inputs, so nothing depends on their number",
                    "Because it uses a recurrent network",
                    "Because sequences are padded to one length",
                    "It cannot: the length is fixed by W",
                ),
                3,
            ),  # fmt: skip
            "With n_inp = −1 the weights have a first axis of size 1, shared by every input position.",
        ),
        Question(
            "Predict: averaged over the two seeds, which network is more accurate on the novel viewpoints?",
            best_of(novel),
            "Measured on this page: " + ", ".join(f"{k} {pct(v, 1)}" for k, v in novel.items()) + ".",
        ),
        Question(
            "Predict: the 2,672-parameter sequence model trained on this page; what is its test accuracy?",
            tuple(Choice(label, label == right) for label, _, _ in bins),
            f"Measured on this page: {pct(sequence_accuracy, 1)}.",
        ),
    ]


# ------------------------------------------------------------------------------------------ inverted attention
def tsai_inverted_questions(*, sweep: list[dict[str, Any]], trained_iterations: int, accuracy_unfold: float,
                  accuracy_official: float) -> list[Question]:  # fmt: skip
    """``sweep``: :func:`~capsule_lib.evaluation.iteration_sweep` rows (concurrent and sequential); the trained
    ``T``; the accuracies with the correct windows and with the official expansion (same weights)."""
    conc = {r["iterations"]: r["accuracy"] for r in sweep if r["setting"] == "concurrent"}
    top = max(conc)
    own = conc[trained_iterations]
    verdict = "higher" if conc[top] > own else "lower" if conc[top] < own else "the same"
    return [
        Question(
            "In inverted dot-product attention, the first update of a layer routes with ...",
            rotate(
                choices(
                    "uniform couplings 1/J (no parent pose exists yet)",
                    "one-hot couplings",
                    "the previous image's couplings",
                    "couplings learned as parameters",
                ),
                2,
            ),  # fmt: skip
            "Without parents' poses to agree with, r_ij = 1/J; later updates use the agreement ⟨V_ij, P_j⟩/√d.",
        ),
        Question(
            "What ends every update instead of a squash?",
            choices("A LayerNorm over the pose's d values", "A softmax over the parents", "A ReLU", "Nothing"),
            "P_j = LayerNorm(Σ_i r_ij V_ij): a plain sum over the children, normalised.",
        ),
        Question(
            "With several capsule layers, the concurrent schedule ...",
            rotate(
                choices(
                    "updates all layers at the same time from the previous iteration's poses",
                    "updates one layer at a time, bottom to top",
                    "skips the uniform first pass",
                    "costs twice the arithmetic of the sequential schedule",
                ),
                1,
            ),  # fmt: skip
            "Both schedules do the same L·T updates; the concurrent one needs fewer dependent steps.",
        ),
        Question(
            f"Predict: the network was trained with T = {trained_iterations}. Is its accuracy with T = {top} "
            "(concurrent) at test time higher or lower?",
            ranked(verdict, ["higher", "lower", "the same"]),
            f"Measured on this page: T = {trained_iterations}: {pct(own)}, T = {top}: {pct(conc[top])}.",
        ),
        Question(
            "Predict: switch the trained network's windows to the official (buggy) input expansion, weights "
            "unchanged. Does its accuracy drop by more than 10 points?",
            ranked("yes" if accuracy_unfold - accuracy_official > 0.1 else "no", ["yes", "no"]),
            f"Measured on this page: {pct(accuracy_unfold)} with the correct windows, {pct(accuracy_official)} with "
            "the official expansion.",
        ),
    ]


# ---------------------------------------------------------------------------------------- Efficient-CapsNet
def efficient_capsnet_questions(*, step_seconds: dict[str, float], both_correct: float) -> list[Question]:
    """``step_seconds``: model -> one CPU training step; ``both_correct``: zero-shot MultiMNIST, both digits right."""
    ratio = step_seconds["CapsNet"] / step_seconds["Efficient-CapsNet"]
    bins = [
        ("about the same (under 2×)", 0, 2),
        ("2× to 5×", 2, 5),
        ("5× to 20×", 5, 20),
        ("more than 20×", 20, math.inf),
    ]
    right = next(label for label, lo, hi in bins if lo <= ratio < hi)
    mm = [("under 20 %", 0, 0.2), ("20 % to 50 %", 0.2, 0.5), ("50 % to 90 %", 0.5, 0.9), ("90 % or more", 0.9, 1.01)]
    right_mm = next(label for label, lo, hi in mm if lo <= both_correct < hi)
    return [
        Question(
            "How does self-attention routing decide the couplings of a primary capsule's votes?",
            rotate(
                choices(
                    "From how much each vote agrees with the other votes for the same class, in one pass",
                    "By iterating agreement with the output capsules",
                    "By a learned softmax only",
                    "They are uniform",
                ),
                1,
            ),  # fmt: skip
            "Row sums of Â_j = Û_j Û_jᵀ, divided by √D, softmax over the classes, plus a learned log prior; no "
            "iterations.",
        ),
        Question(
            "What replaces CapsNet's large primary-capsule convolution?",
            choices(
                "A depthwise convolution (one filter per channel)",
                "A fully connected layer",
                "Nothing: the backbone's output is used as is",
                "A 1×1 convolution",
            ),  # fmt: skip
            "A depthwise 9×9 convolution collapses the 9×9 map to 1×1 per channel: 16 capsules of 8 values.",
        ),
        Question(
            "Where is squash_E's length factor 1 − e^−|s| quite different from squash_H's?",
            rotate(
                choices(
                    "For short vectors: squash_E keeps them nearly as they are",
                    "For long vectors: squash_E exceeds 1",
                    "Nowhere: they are equal",
                    "squash_E changes the direction",
                ),
                2,
            ),  # fmt: skip
            "Near 0, 1 − e^−|s| ≈ |s| while |s|²/(1 + |s|²) ≈ |s|²; both tend to 1 for long vectors.",
        ),
        Question(
            "Predict: how many times longer is one CPU training step of CapsNet than of Efficient-CapsNet (batch 64)?",
            tuple(Choice(label, label == right) for label, _, _ in bins),
            "Measured on this page: "
            + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in step_seconds.items())
            + f" ({ratio:.1f}×).",
        ),
        Question(
            "Predict: zero-shot on overlapping pairs (trained on single digits), how often does the network find both "
            "digits?",
            tuple(Choice(label, label == right_mm) for label, _, _ in mm),
            f"Measured on this page: both digits right on {pct(both_correct)} of the pairs.",
        ),
    ]
