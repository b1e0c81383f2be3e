"""Results at a glance: every shipped checkpoint next to the published numbers for its task.

:func:`results_rows` reads the checkpoint registry (:func:`~capsule_lib.train.shipped.registry`) when it is called,
so the book's results page shows the records of the checkpoints it ships; :func:`show_results` puts one family
of them (:data:`FAMILIES`: the data they were trained and tested on) in a table. The published numbers come from
:mod:`capsule_lib.published`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ._checks import check_choice
from ._contracts import checked
from .cost import count_parameters
from .published import PublishedResult, published
from .report import duration, epochs_text, markdown_table, pct_cell

__all__ = [
    "Family",
    "FAMILIES",
    "ResultRow",
    "family_of",
    "paper_result",
    "reimplementation_result",
    "parameter_count",
    "training_cell",
    "PROXY_MARK",
    "TASK_NAMES",
    "PUBLISHED_HEADERS",
    "results_rows",
    "results_table",
    "show_results",
    "published_rows",
    "show_published",
    "glue_figure",
    "SPEEDRUN_HEADERS",
    "speedrun_histories",
    "speedrun_rows",
    "speedrun_references",
    "show_speedruns",
]


@dataclass(frozen=True)
class Family:
    """Checkpoints trained and tested on the same data, shown in one table.

    Attributes
    ----------
    name
        The key in :data:`FAMILIES`.
    title
        What the data is, for the page.
    task
        The :class:`~capsule_lib.published.PublishedResult` task the papers' numbers are for.
    metrics
        ``(column header, registry metrics)`` pairs: the accuracies shown, from each entry's ``metrics`` (several
        in one column are joined by ``" / "``).
    paper_header
        The header of the published numbers' column.
    """

    name: str
    title: str
    task: str
    metrics: tuple[tuple[str, tuple[str, ...]], ...]
    paper_header: str = "paper"


#: the tables of the results page, by the data their checkpoints were trained and tested on (:func:`family_of`)
FAMILIES = {
    "mnist": Family("mnist", "MNIST", "mnist", (("test", ("test_acc",)),)),
    "viewpoints": Family(
        "viewpoints",
        "rendered smallNORB-like toys, novel-viewpoint protocol",
        "smallnorb",
        (("familiar / novel views", ("test_familiar_acc", "test_novel_acc")),),
        paper_header="paper (smallNORB)",
    ),
    "cifar10": Family(
        "cifar10",
        "CIFAR-10",
        "cifar10",
        (("test, bit-exact images", ("test_exact_acc",)), ("test, all", ("test_acc",))),
    ),
    "other": Family("other", "other data", "", (("test", ("test_acc",)),)),
}

#: the published network whose numbers a (model kind, family) is shown next to, and whether that network is a
#: related one rather than the very network (a proxy, marked :data:`PROXY_MARK`); the comparison's networks have none
_PAPER_MODEL = {
    ("capsnet", "mnist"): ("CapsNet", False),
    ("baseline_cnn", "mnist"): ("baseline CNN", False),
    # Efficient-CapsNet's own MNIST figure is not quoted (see capsule_lib.published): its paper's reference capsnet
    ("efficient_capsnet", "mnist"): ("Base-CapsNet", True),
    ("em_capsnet", "viewpoints"): ("EM capsules", False),
    ("heinsen_smallnorb", "viewpoints"): ("Heinsen's smallNORB network", False),
    ("caps_model", "cifar10"): ("inverted attention routing, resnet backbone", False),
}
#: marks a paper number that is for a related network, not for the row's own
PROXY_MARK = "\u2020"
#: the data sets' names on the page
TASK_NAMES = {
    "mnist": "MNIST",
    "multimnist": "MultiMNIST",
    "affnist": "affNIST",
    "smallnorb": "smallNORB",
    "cifar10": "CIFAR-10",
}


def family_of(entry: dict[str, Any]) -> str:
    """The :data:`FAMILIES` key of a registry entry, from its training data set."""
    dataset = str(entry.get("training", {}).get("dataset", ""))
    if dataset == "mnist":
        return "mnist"
    if "norb" in dataset:
        return "viewpoints"
    if dataset == "cifar10":
        return "cifar10"
    return "other"


def _paper_model(name: str, entry: dict[str, Any]) -> tuple[str, bool] | None:
    if name.startswith("compare_"):  # the comparison chapter's shared network: no paper trained it
        return None
    return _PAPER_MODEL.get((entry["model"], family_of(entry)))


def paper_result(name: str, entry: dict[str, Any]) -> PublishedResult | None:
    """The paper's (or its authors' code's) number for the network a checkpoint trains, on the family's task."""
    model = _paper_model(name, entry)
    if model is None:
        return None
    found = [r for r in published(FAMILIES[family_of(entry)].task, model[0]) if r.source != "re-implementation"]
    return found[0] if found else None


def reimplementation_result(name: str, entry: dict[str, Any]) -> PublishedResult | None:
    """The best public re-implementation's number for that network and task (the first of equals)."""
    model = _paper_model(name, entry)
    found = published(FAMILIES[family_of(entry)].task, model[0], "re-implementation") if model else []
    return max(found, key=lambda r: r.accuracy) if found else None


@cache
def _count(kind: str, config_json: str) -> int:
    import json

    from .pretrained import build_model

    return count_parameters(build_model(kind, json.loads(config_json)))


def parameter_count(entry: dict[str, Any]) -> int:
    """Every parameter of a registry entry's network, decoders included (built from its configuration; no
    weights are read)."""
    import json

    return _count(entry["model"], json.dumps(entry["config"], sort_keys=True))


def training_cell(entry: dict[str, Any]) -> str:
    """``"6 epochs (6 kept), 3.4 h, x86_64 CPU, 1 threads"``: the epochs run (fractional when a time budget
    stopped the run inside an epoch), the one selected on validation, the training wall time and the hardware, as
    the registry records them."""
    t, m = entry["training"], entry["metrics"]
    epochs = epochs_text(t["epochs"])
    return (
        f"{epochs} epoch{'' if epochs == '1' else 's'} ({epochs_text(m['selected_epoch'])} kept), "
        f"{duration(t['wall_time_s'])}, {t['hardware']}"
    )


def _unbreakable_units(text: str) -> str:
    """A non-breaking space between a number and its unit (``%``, ``K``, ``M``): a table cell never wraps there."""
    return re.sub(r"(\d) (%|K\b|M\b)", "\\1\u00a0\\2", text)


def _name_cell(name: str) -> str:
    """The checkpoint's name in code font, with a line-break opportunity after each ``_`` (long names would
    otherwise widen the table past the page's column)."""
    return "<code>" + name.replace("_", "_<wbr>") + "</code>"


@dataclass(frozen=True)
class ResultRow:
    """One shipped checkpoint's line: ``cells`` maps each column header of its family's table to its text.

    Attributes
    ----------
    name
        The checkpoint (a :func:`~capsule_lib.train.shipped.registry` key).
    family
        Its :data:`FAMILIES` key.
    cells
        Column header -> cell text, in the table's column order.
    paper
        The published number in the paper column (``None``: none).
    reimplementation
        The re-implementation's number (``None``: none).
    """

    name: str
    family: str
    cells: dict[str, str]
    paper: PublishedResult | None
    reimplementation: PublishedResult | None


def _headers(family: Family) -> list[str]:
    return ["checkpoint", *(h for h, _ in family.metrics), family.paper_header, "re-impl.", "params", "training"]


@checked
def results_rows(registry: dict[str, dict[str, Any]] | None = None) -> list[ResultRow]:
    """One :class:`ResultRow` per registry entry (default: the shipped registry, read now), grouped by family in
    :data:`FAMILIES` order, the papers' networks before the comparison's runs, then by name."""
    from .pretrained import registry as shipped

    reg = shipped() if registry is None else registry
    rows = []
    order = list(FAMILIES)
    for name in sorted(reg, key=lambda n: (order.index(family_of(reg[n])), n.startswith("compare_"), n)):
        entry = reg[name]
        family = FAMILIES[family_of(entry)]
        paper, reimpl = paper_result(name, entry), reimplementation_result(name, entry)
        values = [_name_cell(name)]
        values += [" / ".join(pct_cell(entry["metrics"].get(k)) for k in keys) for _, keys in family.metrics]
        mark = PROXY_MARK if paper is not None and _paper_model(name, entry)[1] else ""
        values += [paper.text + mark if paper else "—", reimpl.text if reimpl else "—"]
        values += [f"{parameter_count(entry):,}", training_cell(entry)]
        rows.append(ResultRow(name, family.name, dict(zip(_headers(family), values)), paper, reimpl))
    return rows


def results_table(family: str, rows: Sequence[ResultRow] | None = None) -> str:
    """The markdown table of one family's rows (columns without any published number are left out)."""
    check_choice(family, sorted(FAMILIES), "family")
    rows = [r for r in (results_rows() if rows is None else rows) if r.family == family]
    headers = _headers(FAMILIES[family])
    if all(r.reimplementation is None for r in rows):
        headers.remove("re-impl.")
    if all(r.paper is None for r in rows):
        headers.remove(FAMILIES[family].paper_header)
    return markdown_table(headers, [[r.cells[h] for h in headers] for r in rows])


@checked
def show_results(family: str, rows: Sequence[ResultRow] | None = None):
    """:func:`results_table` displayed in a notebook (an ``IPython.display.Markdown`` object)."""
    from IPython.display import Markdown

    return Markdown(results_table(family, rows))


#: the columns of :func:`published_rows`
PUBLISHED_HEADERS = ("data", "model", "accuracy", "as stated; notes", "source")


def published_rows() -> list[list[str]]:
    """Every published number (:data:`~capsule_lib.published.PUBLISHED`) as a row: data, model, accuracy, what the
    source states with the notes, and the source (a citation role for a paper, a link for a repository)."""
    rows = []
    for r in published():
        if r.cite.startswith("https://"):
            source = f"[{r.by}]({r.cite}), {r.where}"
        else:
            source = f"{{cite:t}}`{r.cite}`, {r.where}"
        stated = _unbreakable_units(r.stated + (f"; {r.note}" if r.note else ""))
        rows.append([TASK_NAMES[r.task], _unbreakable_units(r.model), r.text, stated, source])
    return rows


@checked
def show_published():
    """:func:`published_rows` as a table in a notebook."""
    from IPython.display import Markdown

    return Markdown(markdown_table(PUBLISHED_HEADERS, published_rows()))


#: the columns of :func:`speedrun_rows`
SPEEDRUN_HEADERS = ("speedrun", "hardware", "trained", "first reached on validation", "test", "paper")


@checked
def speedrun_histories(registry: dict[str, dict[str, Any]] | None = None, family: str | None = None) -> dict[str, Any]:
    """The shipped checkpoints trained by a speedrun recipe (:mod:`capsule_lib.train.recipes.speedrun`), only those of
    one :data:`FAMILIES` key with ``family``: name -> its :class:`~capsule_lib.train.checkpoint.History` (read from
    the shipped history file)."""
    from .pretrained import load_pretrained_history
    from .pretrained import registry as shipped
    from .train.recipes.registry import RECIPES
    from .train.recipes.speedrun import SpeedrunRecipe

    out = {}
    for name, entry in sorted((shipped() if registry is None else registry).items()):
        if "history" not in entry or (family is not None and family_of(entry) != family):
            continue
        hist = load_pretrained_history(name)
        if issubclass(RECIPES.get(hist.meta.get("recipe"), object), SpeedrunRecipe):
            out[name] = hist
    return out


def _reached(hist: Any, thresholds: tuple[float, ...]) -> str:
    """``"99 %: 0.5 min<br>99.5 %: 0.8 min<br>99.7 %: —"``: the first validation crossing of each threshold, one per
    line (``—``: never reached)."""
    cells = []
    for t, s in zip(thresholds, hist.time_to(thresholds).values()):
        cells.append(f"{100 * t:g}\u00a0%: {duration(s) if s is not None else '—'}")
    return "<br>".join(cells)


def speedrun_rows(registry: dict[str, dict[str, Any]] | None = None) -> list[list[str]]:
    """One row per shipped checkpoint of a speedrun recipe (:data:`SPEEDRUN_HEADERS`): the hardware, what was
    trained (epochs, wall time, the budget), when validation accuracy first reached each of the recipe's
    thresholds, the test accuracy of the epoch kept and the paper's number. A recipe without a shipped checkpoint
    gets a row of its name saying so."""
    from .train.recipes.speedrun import SPEEDRUNS

    reg = _shipped_or(registry)
    hists = speedrun_histories(reg)
    rows = []
    for cls in SPEEDRUNS:
        names = [n for n, h in hists.items() if h.meta["recipe"] == cls.name]
        if not names:
            rows.append([_name_cell(cls.name), "no run shipped yet", "—", "—", "—", "—"])
        for name in names:
            entry, hist = reg[name], hists[name]
            t, m = entry["training"], entry["metrics"]
            keys = [k for k in ("test_acc", "test_familiar_acc", "test_novel_acc") if k in m]
            paper = paper_result(name, entry)
            budget = f"budget {t['budget_minutes']:.1f}\u00a0min"
            trained = f"{epochs_text(t['epochs'])} epochs, {duration(t['wall_time_s'])} ({budget})"
            rows.append(
                [
                    _name_cell(name),
                    t["hardware"],
                    trained,
                    _reached(hist, cls.thresholds),
                    " / ".join(pct_cell(m[k]) for k in keys),
                    paper.text + (PROXY_MARK if _paper_model(name, entry)[1] else "") if paper else "—",
                ]
            )
    return rows


def _shipped_or(registry: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    from .pretrained import registry as shipped

    return shipped() if registry is None else registry


@checked
def speedrun_references(names: Iterable[str], registry: dict[str, dict[str, Any]] | None = None) -> dict[str, float]:
    """The papers' test accuracies (%) for the networks of the checkpoints ``names``, labelled for a figure's
    reference lines: ``{"CapsNet, paper (test)": 99.75, ...}`` (a range's lower end; ``†`` marks a related
    network's number, as in the tables)."""
    reg = _shipped_or(registry)
    out = {}
    for name in names:
        paper = paper_result(name, reg[name])
        if paper is not None:
            mark = PROXY_MARK if _paper_model(name, reg[name])[1] else ""
            out[f"{paper.model}{mark}, paper (test)"] = paper.accuracy
    return out


@checked
def show_speedruns(registry: dict[str, dict[str, Any]] | None = None):
    """:func:`speedrun_rows` as a table in a notebook."""
    from IPython.display import Markdown

    return Markdown(markdown_table(SPEEDRUN_HEADERS, speedrun_rows(registry)))


@checked
def glue_figure(name: str, fig) -> None:
    """Show a matplotlib figure and register it under ``name`` for other pages of the book (MyST-NB's ``glue``:
    ``{glue:any}`` with ``:doc:`` pastes it). Without MyST-NB (e.g. in Colab) the figure is only shown. The figure
    is closed afterwards, so the notebook shows it once."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    try:
        from myst_nb import glue
    except ImportError:
        display(fig)
    else:
        glue(name, fig, display=True)
    plt.close(fig)
