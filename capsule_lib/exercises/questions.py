"""The concept questions at the end of every chapter, as data, and :func:`quiz`, which shows a chapter's.

Each chapter's questions come from one builder in :data:`QUESTIONS`. Most questions are fixed text (answerable from
the chapter). The ones that ask the reader to predict a measurement take it from the chapter's own results, passed
to :func:`quiz` by name (``quiz("primer", v=v, sweep=sweep)``): the correct choice and the value revealed after
answering are computed here from those objects, never typed in. The results page has no questions: it repeats
numbers that each chapter measures and questions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .._checks import check_choice
from .questions_algorithms import (
    dynamic_routing_questions,
    efficient_capsnet_questions,
    em_routing_questions,
    heinsen_routing_questions,
    primer_questions,
    tsai_inverted_questions,
)
from .questions_comparison import robustness_questions, routing_compared_questions, routing_critique_questions
from .questions_images import own_images_questions
from .quiz import Question, Quiz

__all__ = ["QUESTIONS", "quiz", "questions_of"]

TITLE = "Check your understanding"


#: every chapter's question builder (its keyword arguments are the measurements its predict questions reveal)
QUESTIONS: dict[str, Callable[..., list[Question]]] = {
    f.__name__.removesuffix("_questions"): f
    for f in (
        primer_questions,
        dynamic_routing_questions,
        em_routing_questions,
        heinsen_routing_questions,
        tsai_inverted_questions,
        efficient_capsnet_questions,
        routing_compared_questions,
        robustness_questions,
        routing_critique_questions,
        own_images_questions,
    )  # fmt: skip
}


def questions_of(chapter: str, **measured: Any) -> list[Question]:
    """The questions of ``chapter`` with its measurements filled in (see :func:`quiz`)."""
    check_choice(chapter, sorted(QUESTIONS), "chapter")
    builder = QUESTIONS[chapter]
    params = inspect.signature(builder).parameters
    needed = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    missing, unknown = [n for n in needed if n not in measured], [n for n in measured if n not in params]
    if missing or unknown:
        raise TypeError(
            f"quiz({chapter!r}) takes the measurements {list(params)}; "
            + (f"missing {missing}" if missing else f"unknown {unknown}")
        )
    return builder(**measured)


def quiz(chapter: str, **measured: Any) -> Quiz:
    """The concept questions at the end of ``chapter``, shown as a :class:`~capsule_lib.exercises.quiz.Quiz`.

    Parameters
    ----------
    chapter : str
        A chapter notebook's name without ``.ipynb``: one of :data:`QUESTIONS`.
    measured
        Keyword arguments: the chapter's results that its predict-a-measurement questions reveal, by the names its
        builder takes (for example ``quiz("primer", v=v, sweep=sweep)``).

    Returns
    -------
    Quiz
        Answers on the page without a kernel (``_repr_html_``); plain text elsewhere.
    """
    return Quiz(TITLE, questions_of(chapter, **measured))
