"""Small helpers to put measured numbers into the rendered page (markdown tables)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._contracts import checked
from .cost import count_parameters

__all__ = [
    "pct_cell",
    "epochs_text",
    "HISTORY_HEADERS",
    "history_rows",
    "show_histories",
    "train_cost",
    "metrics_summary",
    "markdown_table",
    "show_table",
    "pct",
    "duration",
    "budget_rows",
    "show_budgets",
    "BUDGET_HEADERS",
    "SCORE_WORDS",
    "prediction_rows",
]


@checked(allow_nonfinite=("x",))
def pct(x: float | None, digits: int = 2) -> str:
    """``0.99612 -> "99.61 %"``; ``None -> "—"``."""
    if digits < 0:
        raise ValueError(f"pct: digits must be >= 0, got {digits}")
    return "—" if x is None else f"{100 * x:.{digits}f} %"


def pct_cell(x: float | None, digits: int = 2) -> str:
    """:func:`pct` for a table cell: a non-breaking space before ``%`` (the cell wraps between numbers, not inside
    one)."""
    return pct(x, digits).replace(" ", "\u00a0")


def epochs_text(x: float) -> str:
    """Epochs as a run records them: ``6``, or ``32.99`` when a time budget stopped it inside an epoch."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (cells converted with ``str``; ``|`` escaped)."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


@checked
def show_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]):
    """Display a markdown table in a notebook (returns the ``IPython.display.Markdown`` object)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(headers, rows))


@checked
def duration(seconds: float) -> str:
    """``324 -> "5.4 min"``, ``15840 -> "4.4 h"`` (a non-breaking space before the unit: table cells do not wrap
    inside it)."""
    if seconds < 0:
        raise ValueError(f"duration: seconds must be >= 0, got {seconds}")
    return f"{seconds / 60:.1f}\u00a0min" if seconds < 7200 else f"{seconds / 3600:.1f}\u00a0h"


#: the columns of :func:`budget_rows`
BUDGET_HEADERS = ("checkpoint", "hardware", "epochs (best)", "time", "val.", "test")  # short: six fit the page


def budget_rows(names: Sequence[str]) -> list[list[str]]:
    """What each shipped checkpoint's training budget bought, one row per name, read from the registry: the
    hardware, the epochs run (fractional when a time budget stopped the run inside an epoch) and, in brackets, the
    one selected on validation, the training wall time, and the validation and test accuracy of the shipped weights
    (columns ``BUDGET_HEADERS``)."""
    from .pretrained import registry

    reg, rows = registry(), []
    for name in names:
        e = reg[name]
        t, m = e["training"], e["metrics"]
        rows.append(
            [
                f"`{name}`",
                t["hardware"],
                f"{epochs_text(t['epochs'])} ({m['selected_epoch']})",
                duration(t["wall_time_s"]),
                pct_cell(m.get("val_acc")),
                pct_cell(m.get("test_acc")),
            ]
        )
    return rows


@checked
def show_budgets(names: Sequence[str]):
    """:func:`budget_rows` as a table in a notebook."""
    return show_table(BUDGET_HEADERS, budget_rows(names))


@checked
def metrics_summary(metrics: dict[str, Any]) -> str:
    """A registry entry's test result in one cell: ``familiar .., novel ..`` for the viewpoint protocol, the
    bit-exact and whole test split where a copy marks bit-exact images, else the test accuracy (a non-breaking
    space before each ``%``: a table cell wraps between the numbers, not inside one)."""

    if "test_familiar_acc" in metrics:
        return f"familiar {pct_cell(metrics['test_familiar_acc'])}, novel {pct_cell(metrics['test_novel_acc'])}"
    if "test_exact_acc" in metrics:
        return f"{pct_cell(metrics['test_exact_acc'])} (bit-exact test images), {pct_cell(metrics['test_acc'])} (all)"
    return pct_cell(metrics["test_acc"])


def train_cost(
    epochs: int, cpu: Sequence[str] = (), gpu: Sequence[str] = (), budget: Sequence[str] = (), speedrun: str = ""
) -> str:
    """What ``TRAIN = True`` costs in a chapter, measured from the shipped runs' histories, for its parameters cell.

    Parameters
    ----------
    epochs
        The chapter's ``EPOCHS``.
    cpu, gpu
        Shipped runs the chapter retrains, trained on a CPU / on a GPU: each contributes its mean wall time per
        epoch (validation included) times ``epochs``; the runs of one kind are summed.
    budget
        Shipped runs that train for their budget instead: a wall-clock one (their ``budget_minutes``, summed), or,
        for a run without one, its own epochs (its recorded wall time, on a CPU).
    speedrun
        A shipped speedrun run that the chapter retrains on a GPU instead of ``gpu`` (its ``budget_minutes`` on its
        hardware).

    Returns
    -------
    str
        E.g. ``"≈ 8.4 h on a CPU, ≈ 2.5 min on an NVIDIA H200 (15 epochs, from the shipped runs)"``, or with
        ``speedrun``: ``"≈ 8.4 h on a CPU (15 epochs), ≈ 3.2 min on an NVIDIA H200 (speedrun recipe)"``.
    """
    from .pretrained import load_pretrained_history

    def per_epoch(name: str) -> float:
        recs = load_pretrained_history(name).records
        return recs[-1]["wall_time"] / recs[-1]["epoch"]

    if budget:
        histories = [load_pretrained_history(n) for n in budget]
        timed = [h.meta["budget_minutes"] for h in histories if h.meta.get("budget_minutes")]
        own = [h.records[-1]["wall_time"] for h in histories if not h.meta.get("budget_minutes")]
        parts = [f"≈ {duration(60 * sum(timed))} on any hardware ({len(timed)} runs, each stops at its time budget)"]
        if own:
            parts.append(f"≈ {duration(sum(own))} on a CPU ({len(own)} runs of their recipes' epochs)")
        text = " + ".join(parts[bool(not timed) :])
    elif speedrun:
        meta = load_pretrained_history(speedrun).meta
        cpu_part = f"≈ {duration(epochs * sum(per_epoch(n) for n in cpu))} on a CPU ({epochs} epochs), " if cpu else ""
        text = f"{cpu_part}≈ {duration(60 * meta['budget_minutes'])} on an {meta['hardware']} (speedrun recipe)"
    else:
        parts = []
        if cpu:
            parts.append(f"≈ {duration(epochs * sum(per_epoch(n) for n in cpu))} on a CPU")
        if gpu:
            names = sorted({load_pretrained_history(n).meta["hardware"] for n in gpu})
            parts.append(f"≈ {duration(epochs * sum(per_epoch(n) for n in gpu))} on an {' / '.join(names)}")
        else:
            parts.append("GPU not measured")
        text = f"{', '.join(parts)} ({epochs} epochs, from the shipped runs)"
    return text.replace("\u00a0", " ")  # a code comment, not a table cell


#: the columns of :func:`history_rows` (``"params"`` is added after ``"run"`` when models are given)
HISTORY_HEADERS = ("run", "epochs (best)", "val.", "time (per epoch)", "hardware")


def history_rows(histories: dict[str, Any], models: dict[str, Any] | None = None) -> list[list[str]]:
    """One row per training run, from its :class:`~capsule_lib.train.checkpoint.History` (a shipped one, or one
    trained on the page): the epochs run and, in brackets, the one selected on validation, its validation accuracy, the
    training wall time (validation included) and per epoch, and the hardware (columns :data:`HISTORY_HEADERS`).
    With ``models`` (same keys), a ``params`` column after the run's name."""
    rows = []
    for name, h in histories.items():
        best, last = h.best("val_acc"), h.records[-1]
        row = [
            f"`{name}`",
            f"{last['epoch']:g} ({best['epoch']:g})",
            pct_cell(best["val_acc"]),
            f"{duration(last['wall_time'])} ({duration(last['wall_time'] / last['epoch'])}/epoch)",
            str(h.meta.get("hardware", "—")),
        ]
        if models is not None:
            row.insert(1, f"{count_parameters(models[name]):,}")
        rows.append(row)
    return rows


@checked
def show_histories(histories: dict[str, Any], models: dict[str, Any] | None = None):
    """:func:`history_rows` as a table in a notebook."""
    headers = list(HISTORY_HEADERS)
    if models is not None:
        headers.insert(1, "params")
    return show_table(headers, history_rows(histories, models))


#: what a model's scores are, by :attr:`~capsule_lib.types.CapsuleOutput.kind` (the prediction table's words)
SCORE_WORDS = {"lengths": "capsule length", "activations": "activation", "logits": "logit"}


@checked
def prediction_rows(
    files: Sequence[str], scores: Any, classes: Sequence[str], top: int | None = None, root: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a prediction table: per file, the predicted class and the scores ``[N, K]`` of every
    class (``top``: only the ``top`` highest, as ``class score``); ``root`` is cut off the front of the file names.

    Parameters
    ----------
    files : sequence of str
        The files predicted on (``predict(...)["files"]``).
    scores : torch.Tensor
        ``[N, K]`` scores (``predict(...)["scores"]``).
    classes : sequence of str
        The class names, in score order.
    top : int, optional
        Show the ``top`` highest scores per file instead of a column per class.
    root : str, optional
        A folder prefix to leave out of the file names.

    Returns
    -------
    tuple
        ``(headers, rows)`` of strings.
    """
    import os

    names = [os.path.relpath(f, root) if root else f for f in files]
    best = scores.argmax(1).tolist()
    if top is None:
        rows = [[n, classes[b], *(f"{float(v):.3f}" for v in s)] for n, b, s in zip(names, best, scores)]
        return ["file", "predicted", *classes], rows
    order = scores.argsort(1, descending=True)[:, :top].tolist()
    rows = [
        [n, classes[b], ", ".join(f"{classes[k]} {float(s[k]):.3f}" for k in o)]
        for n, b, o, s in zip(names, best, order, scores)
    ]
    return ["file", "predicted", f"highest {top} scores"], rows
