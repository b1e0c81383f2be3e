"""Every code exercise of the book, as data: :data:`EXERCISES` by name, and :func:`check`.

Each exercise's cases are inputs and what the library's tested reference returns for them (a function of
``functional``, ``losses``, ``routing``, ``layers``, ``data``, ``attacks``, ``cost``, ``critique``,
``routing_critique``, ``report``; for the EM and Heinsen steps, the per-iteration trace of the library's routing). Each
:class:`~capsule_lib.exercises.checker.Mistake` is a wrong implementation that the seeds' code made (or that a reader
makes while following the formula), written in the form the mistake takes, with the sentence that names it. The
exercises themselves live in :mod:`capsule_lib.exercises.vectors`, :mod:`capsule_lib.exercises.matrices`,
:mod:`capsule_lib.exercises.measures` and :mod:`capsule_lib.exercises.images`.
"""

from __future__ import annotations

from typing import Any

from .._checks import check_choice
from .._contracts import checked
from .checker import CheckResult, Exercise, ExerciseFailed, run_exercise
from .images import CHANNEL_STATS, PREDICTED_CLASSES
from .matrices import CONV_WINDOWS, EM_E_STEP, EM_M_STEP, HEINSEN_E_STEP, HEINSEN_M_STEP, INVERTED_UPDATE
from .measures import CAPSULE_VOTES, COUPLING_ENTROPY, FGSM, LOGLOG_SLOPE, RECONSTRUCTION_DISTANCE, VERSUS
from .vectors import (
    CAPSULE_LENGTHS,
    DYNAMIC_ROUTING,
    MARGIN_LOSS,
    MASK_CAPSULES,
    MULTIMNIST_OVERLAY,
    PRIMARY_CAPSULES,
    SELF_ATTENTION_COUPLINGS,
    SQUASH_EFFICIENT,
    SQUASH_HINTON,
)

__all__ = ["EXERCISES", "exercises_of", "check"]

#: every exercise of the book by name, in the order of the chapters
EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        SQUASH_HINTON,
        CAPSULE_LENGTHS,
        MARGIN_LOSS,
        DYNAMIC_ROUTING,
        PRIMARY_CAPSULES,
        MASK_CAPSULES,
        EM_M_STEP,
        EM_E_STEP,
        HEINSEN_M_STEP,
        HEINSEN_E_STEP,
        INVERTED_UPDATE,
        CONV_WINDOWS,
        SQUASH_EFFICIENT,
        SELF_ATTENTION_COUPLINGS,
        MULTIMNIST_OVERLAY,
        CAPSULE_VOTES,
        LOGLOG_SLOPE,
        FGSM,
        RECONSTRUCTION_DISTANCE,
        COUPLING_ENTROPY,
        VERSUS,
        CHANNEL_STATS,
        PREDICTED_CLASSES,
    )
}


def exercises_of(chapter: str) -> list[Exercise]:
    """The exercises at the end of ``chapter`` (a notebook's name without ``.ipynb``), in order."""
    return [e for e in EXERCISES.values() if e.chapter == chapter]


@checked
def check(name: str, fn: Any, *, must_pass: bool = False) -> CheckResult:
    """Check a reader's function ``fn`` against the library's reference for the exercise ``name``.

    Parameters
    ----------
    name : str
        An exercise of :data:`EXERCISES` (its function's name: ``"squash_hinton"``, ``"dynamic_routing"``, ...).
    fn : callable
        The reader's function, called with the exercise's inputs (see its ``signature``).
    must_pass : bool, optional
        Raise :class:`~capsule_lib.exercises.checker.ExerciseFailed` with the verdict when ``fn`` does not pass (a
        chapter's hidden solution cell: a solution that stops passing fails the build). Default False.

    Returns
    -------
    CheckResult
        ``passed``, a one-line ``message`` (what differs, on which input, and the named mistake when it is a known
        one), ``mistake`` (its key) and ``status`` (``"passed"``, ``"failed"``, ``"todo"``); shown as one line in a
        notebook. Whatever ``fn`` does (raises, returns the wrong type, shape, dtype or NaN), the checker answers in
        this one line and does not raise, unless ``must_pass``.
    """
    check_choice(name, sorted(EXERCISES), "name")
    result = run_exercise(EXERCISES[name], fn)
    if must_pass and not result.passed:
        raise ExerciseFailed(str(result))
    return result
