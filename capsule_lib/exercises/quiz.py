"""Concept questions that answer on the page: self-contained HTML, CSS and JavaScript, no kernel and no network.

A :class:`Quiz` is shown by Jupyter through ``_repr_html_`` (JupyterLab, Colab, and the book's static pages, where
myst-nb copies the HTML into the page) and as plain text elsewhere (``__repr__``: the questions, then the answers).
Its script uses no library, loads nothing and finds its own container (``document.currentScript``), so a page may
hold several quizzes and a re-run cell replaces its quiz cleanly. Clicking a choice (or entering a number) marks it
right or wrong and shows the question's explanation; for a question that asks the reader to predict a measurement
of the chapter, the explanation holds the measured value, passed in by the chapter's code.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

__all__ = ["Choice", "Question", "Quiz"]


@dataclass(frozen=True)
class Choice:
    """One answer of a multiple-choice question; ``feedback`` (optional) is shown when it is picked."""

    text: str
    correct: bool = False
    feedback: str = ""


@dataclass(frozen=True)
class Question:
    """A multiple-choice question (``choices``) or a numeric one (``answer`` within ``tolerance``, in ``unit``);
    ``explanation`` is shown once the reader has answered."""

    text: str
    choices: tuple[Choice, ...] = ()
    explanation: str = ""
    answer: float | None = None
    tolerance: float = 0.0
    unit: str = ""

    def __post_init__(self) -> None:
        if bool(self.choices) == (self.answer is not None):
            raise ValueError(f"a question has either choices or a numeric answer, not both or neither: {self.text!r}")
        if self.choices and sum(c.correct for c in self.choices) != 1:
            raise ValueError(f"a multiple-choice question needs exactly one correct choice: {self.text!r}")


def _markup(text: str) -> str:
    """Escaped text with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


_CSS = """
.capsule-quiz { border: 1px solid #c9c9d6; border-radius: 6px; padding: 8px 12px; margin: 8px 0;
  font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 15px; max-width: 680px; }
.capsule-quiz .cq-title { font-weight: 600; margin-bottom: 4px; }
.capsule-quiz .cq-question { border-top: 1px solid #e4e4ec; padding: 8px 0 4px 0; }
.capsule-quiz .cq-text { margin: 0 0 6px 0; }
.capsule-quiz .cq-choice { display: block; width: 100%; text-align: left; margin: 4px 0; padding: 5px 10px;
  border: 1px solid #b8b8c8; border-radius: 4px; background: #f7f7fb; color: inherit; font: inherit; cursor: pointer; }
.capsule-quiz .cq-choice:hover { background: #ececf6; }
.capsule-quiz .cq-choice.cq-picked-right { border-color: #1b7f3b; background: #e3f4e8; }
.capsule-quiz .cq-choice.cq-picked-wrong { border-color: #b3261e; background: #fbe7e6; }
.capsule-quiz .cq-input { width: 8em; padding: 3px 6px; font: inherit; }
.capsule-quiz .cq-submit { margin-left: 6px; padding: 3px 10px; font: inherit; cursor: pointer; }
.capsule-quiz .cq-feedback { margin-top: 6px; padding: 6px 10px; background: #f3f3f8; border-radius: 4px; }
.capsule-quiz .cq-right { color: #1b7f3b; font-weight: 600; }
.capsule-quiz .cq-wrong { color: #b3261e; font-weight: 600; }
"""

_JS = """
(function () {
  function init(root) {
    if (!root || root.getAttribute('data-ready')) return;
    root.setAttribute('data-ready', '1');
    root.querySelectorAll('.cq-question').forEach(function (q) {
      var box = q.querySelector('.cq-feedback'), verdict = q.querySelector('.cq-verdict');
      var extra = q.querySelector('.cq-choice-feedback');
      function show(ok, text) {
        box.hidden = false;
        verdict.textContent = ok ? 'Right.' : 'Not quite.';
        verdict.className = 'cq-verdict ' + (ok ? 'cq-right' : 'cq-wrong');
        extra.textContent = text || '';
      }
      q.querySelectorAll('.cq-choice').forEach(function (b) {
        b.addEventListener('click', function () {
          q.querySelectorAll('.cq-choice').forEach(function (o) {
            o.classList.remove('cq-picked-right', 'cq-picked-wrong');
          });
          var ok = b.getAttribute('data-correct') === '1';
          b.classList.add(ok ? 'cq-picked-right' : 'cq-picked-wrong');
          show(ok, b.getAttribute('data-feedback'));
        });
      });
      var input = q.querySelector('.cq-input'), submit = q.querySelector('.cq-submit');
      if (input && submit) {
        var answer = function () {
          var v = parseFloat(String(input.value).replace(',', '.').replace('%', ''));
          if (isNaN(v)) { show(false, 'Type a number first.'); return; }
          var want = parseFloat(q.getAttribute('data-answer')), tol = parseFloat(q.getAttribute('data-tolerance'));
          show(Math.abs(v - want) <= tol, '');
        };
        submit.addEventListener('click', answer);
        input.addEventListener('keydown', function (e) { if (e.key === 'Enter') answer(); });
      }
    });
  }
  var s = document.currentScript;
  init(s && s.parentNode && s.parentNode.closest ? s.parentNode.closest('.capsule-quiz') : null);
  document.querySelectorAll('.capsule-quiz').forEach(init);
})();
"""


class Quiz:
    """Questions shown together: ``_repr_html_`` (answers on the page, no kernel) and a plain-text form.

    Parameters
    ----------
    title : str
        The box's title.
    questions : sequence of Question
        In order.
    """

    def __init__(self, title: str, questions: list[Question] | tuple[Question, ...]) -> None:
        if not questions:
            raise ValueError("questions: a quiz needs at least one question")
        self.title, self.questions = title, tuple(questions)

    def _question_html(self, k: int, q: Question) -> str:
        head = f'<p class="cq-text"><b>{k}.</b> {_markup(q.text)}</p>'
        feedback = (
            '<div class="cq-feedback" hidden><span class="cq-verdict"></span> <span class="cq-choice-feedback">'
            f'</span><div class="cq-explanation">{_markup(q.explanation)}</div></div>'
        )
        if q.choices:
            buttons = "".join(
                f'<button type="button" class="cq-choice" data-correct="{int(c.correct)}" '
                f'data-feedback="{html.escape(c.feedback, quote=True)}">{chr(97 + i)}) {_markup(c.text)}</button>'
                for i, c in enumerate(q.choices)
            )
            choices = f'<div class="cq-choices">{buttons}</div>'
            return f'<div class="cq-question" data-kind="choice">{head}{choices}{feedback}</div>'
        unit = f" {html.escape(q.unit)}" if q.unit else ""
        return (
            f'<div class="cq-question" data-kind="number" data-answer="{json.dumps(float(q.answer))}" '
            f'data-tolerance="{json.dumps(float(q.tolerance))}">{head}<input class="cq-input" type="text" '
            f'inputmode="decimal" aria-label="your answer">{unit}<button type="button" class="cq-submit">check'
            f"</button>{feedback}</div>"
        )

    def _repr_html_(self) -> str:
        body = "".join(self._question_html(k, q) for k, q in enumerate(self.questions, 1))
        return (
            f'<div class="capsule-quiz"><style>{_CSS}</style><div class="cq-title">{html.escape(self.title)}</div>'
            f"{body}<script>{_JS}</script></div>"
        )

    def __repr__(self) -> str:
        lines = [f"{self.title} (answers at the end)"]
        answers = []
        for k, q in enumerate(self.questions, 1):
            lines.append(f"{k}. {q.text}")
            if q.choices:
                lines += [f"   {chr(97 + i)}) {c.text}" for i, c in enumerate(q.choices)]
                right = next(chr(97 + i) for i, c in enumerate(q.choices) if c.correct)
            else:
                right = f"{q.answer:g}{' ' + q.unit if q.unit else ''} (within {q.tolerance:g})"
            answers.append(f"{k}. {right}: {q.explanation}")
        return "\n".join([*lines, "", "Answers:", *answers])


# ------------------------------------------------------------------------------- building questions
def choices(correct: str, *wrong: str, feedback: dict[str, str] | None = None) -> tuple[Choice, ...]:
    """The correct answer first, then the wrong ones (the page keeps this order: the correct one is not always a)."""
    fb = feedback or {}
    return (Choice(correct, True, fb.get(correct, "")), *(Choice(w, False, fb.get(w, "")) for w in wrong))


def rotate(choices: tuple[Choice, ...], k: int) -> tuple[Choice, ...]:
    k %= len(choices)
    return choices[k:] + choices[:k]


def ranked(correct_label: str, labels: list[str]) -> tuple[Choice, ...]:
    """One choice per label, in the given order, the measured one correct."""
    return tuple(Choice(label, label == correct_label) for label in labels)


def best_of(values: dict[str, float], lowest: bool = False) -> tuple[Choice, ...]:
    """One choice per label (labels with equal values joined, "A / B"), the one with the highest value (the lowest
    with ``lowest``) correct: a prediction of "which is best" whose answer is the chapter's measurement."""
    groups: dict[float, list[str]] = {}
    for label, v in values.items():
        groups.setdefault(float(v), []).append(label)
    best = (min if lowest else max)(groups)
    return tuple(Choice(" / ".join(labels), v == best) for v, labels in groups.items())
