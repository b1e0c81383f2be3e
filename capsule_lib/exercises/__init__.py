"""Exercises that check themselves: every chapter's concept questions and code exercises.

* :func:`quiz` (``questions.py``): a chapter's concept questions, answered on the page without a kernel
  (:class:`Quiz`: self-contained HTML and JavaScript, ``quiz.py``), some of them predictions of the chapter's own
  measurements.
* :func:`check` (``catalogue.py``): a reader's function against the library's reference on random and edge inputs,
  naming the seeds' known mistakes (:data:`EXERCISES`, each an :class:`Exercise` of ``checker.py``).
"""

from .catalogue import EXERCISES, check, exercises_of
from .checker import Case, CheckResult, Exercise, ExerciseFailed, Mistake
from .questions import QUESTIONS, questions_of, quiz
from .quiz import Choice, Question, Quiz

__all__ = [
    "EXERCISES",
    "QUESTIONS",
    "check",
    "exercises_of",
    "quiz",
    "questions_of",
    "Case",
    "CheckResult",
    "Exercise",
    "ExerciseFailed",
    "Mistake",
    "Choice",
    "Question",
    "Quiz",
]
