"""The results page (book/results.ipynb, capsule_lib.results, capsule_lib.published): one row per shipped checkpoint
whose numbers are the registry's, published numbers that are cited and agree with what their sources state, the
chapters quoting the same published numbers, and the page executing offline with the figure the introduction
pastes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from capsule_lib.pretrained import build_model, registry
from capsule_lib.published import PUBLISHED, REPOSITORIES, published
from capsule_lib.results import (
    FAMILIES,
    PROXY_MARK,
    family_of,
    glue_figure,
    paper_result,
    reimplementation_result,
    results_rows,
    results_table,
)

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
NBSP = "\u00a0"
REG = registry()


def _pct(x: float) -> str:  # written out here, not imported: the page's numbers are checked against this
    return f"{100 * x:.2f}{NBSP}%"


def _time(s: float) -> str:
    return f"{s / 60:.1f}{NBSP}min" if s < 7200 else f"{s / 3600:.1f}{NBSP}h"


def _epochs(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _plain(cell: str) -> str:
    return cell.replace("<wbr>", "").replace("<code>", "").replace("</code>", "")


def _expected_cells(name: str) -> dict[str, str]:
    """The numbers a checkpoint's row must show, computed here from its registry entry."""
    e = REG[name]
    m, t = e["metrics"], e["training"]
    fam = FAMILIES[family_of(e)]
    cells = {"checkpoint": name}
    for header, keys in fam.metrics:
        cells[header] = " / ".join(_pct(m[k]) for k in keys)
    cells["params"] = f"{sum(p.numel() for p in build_model(e['model'], e['config']).parameters()):,}"
    n = _epochs(t["epochs"])
    cells["training"] = (
        f"{n} epoch{'' if n == '1' else 's'} ({_epochs(m['selected_epoch'])} kept), "
        f"{_time(t['wall_time_s'])}, {t['hardware']}"
    )
    return cells


def test_there_is_one_row_per_registry_entry():
    rows = results_rows()
    names = [r.name for r in rows]
    assert sorted(names) == sorted(REG) and len(names) == len(set(names))
    assert all(r.family in FAMILIES for r in rows)


@pytest.mark.parametrize("name", sorted(REG))
def test_a_rows_numbers_are_its_registry_entrys(name):
    row = next(r for r in results_rows() if r.name == name)
    want = _expected_cells(name)
    got = {h: _plain(c) for h, c in row.cells.items() if h in want}
    assert got == want


def test_each_family_table_fits_the_page_and_lists_its_rows():
    rows = results_rows()
    for fam in FAMILIES:
        mine = [r for r in rows if r.family == fam]
        if not mine:
            continue
        lines = results_table(fam, rows).splitlines()
        headers = [h.strip() for h in lines[0].strip("|").split("|")]
        assert len(headers) <= 7, headers  # short enough for the page's ~700 px column
        assert len(lines) == 2 + len(mine)
        for line, row in zip(lines[2:], mine):
            assert _plain(line).startswith(f"| {row.name} |")


def test_paper_and_reimplementation_columns():
    cells = {r.name: r.cells for r in results_rows()}
    assert cells["capsnet_mnist"]["paper"] == f"99.75{NBSP}%" and cells["capsnet_mnist"]["re-impl."] == f"99.7{NBSP}%"
    assert cells["em_norb_seed0"]["paper (smallNORB)"] == f"98.2{NBSP}%"
    assert cells["em_norb_seed0"]["re-impl."] == f"90.03{NBSP}%"
    assert cells["heinsen_norb_seed1"]["paper (smallNORB)"] == f"99.1{NBSP}%"
    assert cells["tsai_cifar10_cpu_seed0"]["paper"] == f"94.85{NBSP}%"
    assert cells["efficient_capsnet_mnist"]["paper"] == f"99.46–99.61{NBSP}%{PROXY_MARK}"  # a related network's
    assert cells["baseline_cnn_mnist"]["paper"] == f"99.61{NBSP}%"
    for name, c in cells.items():
        if name.startswith("compare_"):  # the comparison's network: no paper trained it
            assert all(v == "—" for h, v in c.items() if h.startswith(("paper", "re-impl")))
    assert reimplementation_result("capsnet_mnist", REG["capsnet_mnist"]).by == "gram-ai/capsule-networks"
    assert paper_result("compare_mnist_dynamic", REG["compare_mnist_dynamic"]) is None


def test_a_checkpoint_on_other_data_gets_a_table_too():
    fake = {"svhn_net": {**REG["capsnet_mnist"], "training": {**REG["capsnet_mnist"]["training"], "dataset": "svhn"}}}
    (row,) = results_rows(fake)
    assert row.family == "other" and row.paper is None
    assert _plain(results_table("other", [row]).splitlines()[2]).startswith("| svhn_net | 99.34")


def _bib_keys() -> set[str]:
    return set(re.findall(r"@\w+\{([^,\s]+),", (REPO / "references.bib").read_text()))


@pytest.mark.parametrize("result", PUBLISHED, ids=lambda r: f"{r.by}:{r.task}:{r.model}")
def test_every_published_number_is_cited_and_agrees_with_what_its_source_states(result):
    assert result.cite in _bib_keys() or result.cite.startswith("https://"), result.cite
    if result.source == "re-implementation":
        assert REPOSITORIES[result.by] == result.cite
    assert result.task in {"mnist", "multimnist", "affnist", "smallnorb", "cifar10"}
    assert 0 < result.accuracy <= 100 and result.stated and result.where
    err = re.match(r"([\d.]+)(?:–([\d.]+))?(?: ± [\d.]+)? % (?:average )?test error", result.stated)
    if err:  # an error rate: the accuracy is 100 minus it (a range is reversed)
        low, high = float(err.group(1)), float(err.group(2) or err.group(1))
        assert round(100 - high, 2) == result.accuracy
        assert round(100 - low, 2) == (result.accuracy_max or result.accuracy)
    else:  # an accuracy: the number stated first is the one shown
        assert float(re.match(r"[\d.]+", result.stated).group()) == result.accuracy


def test_the_chapters_quote_the_same_published_numbers():
    """The page and the chapters must not contradict each other: each chapter quotes the published numbers of its
    paper as capsule_lib.published holds them."""

    def text(chapter: str) -> str:
        return "".join("".join(c["source"]) for c in json.loads((BOOK / chapter).read_text())["cells"])

    quoted = {
        "dynamic_routing.ipynb": [*published("mnist", "CapsNet"), *published("multimnist")],
        "em_routing.ipynb": [*published("smallnorb", "EM capsules")],
        "heinsen_routing.ipynb": published("smallnorb", "Heinsen's smallNORB network"),
        "tsai_inverted.ipynb": published("cifar10", "inverted attention routing, resnet backbone"),
        "efficient_capsnet.ipynb": [
            *published("mnist", "Base-CapsNet"),
            *published("mnist", "baseline CNN (Mazzia et al.)"),
        ],
    }
    for chapter, results in quoted.items():
        body = text(chapter)
        for r in results:
            number = r.text.removesuffix(f"{NBSP}%")
            assert number in body, f"{chapter} does not quote {r.by}'s {r.model} ({number})"


def test_the_introduction_pastes_the_figure_the_page_glues():
    intro = (BOOK / "intro.md").read_text()
    m = re.search(r"```\{glue:any\} (\w+)\n:doc: (\S+)\n```", intro)
    assert m, "intro.md pastes no figure"
    assert m.group(2) == "results.ipynb"
    page = "".join("".join(c["source"]) for c in json.loads((BOOK / "results.ipynb").read_text())["cells"])
    assert f'glue_figure("{m.group(1)}"' in page
    assert "{doc}`results`" in intro


def test_glue_figure_shows_the_figure_without_myst_nb(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # import fails, as in Colab
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    fig = plt.figure()
    glue_figure("key", fig)
    assert shown == [fig] and not plt.fignum_exists(fig.number)


@pytest.mark.slow
def test_the_page_executes_offline_and_shows_the_registrys_numbers(tmp_path, monkeypatch):
    """book/results.ipynb under papermill in smoke mode, offline, with an empty data root: every registry entry is a
    row of one of its tables with the registry's numbers, and the figure the introduction pastes is glued."""
    import papermill

    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    monkeypatch.setenv("CAPSULE_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "results.ipynb"
    papermill.execute_notebook(
        str(BOOK / "results.ipynb"),
        str(out),
        parameters={"SMOKE": True},
        cwd=str(BOOK),
        kernel_name="python3",
        progress_bar=False,
    )
    nb = json.loads(out.read_text())
    tables, glued = [], {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "text/markdown" in data:
                tables.append("".join(data["text/markdown"]))
            if "scrapbook" in o.get("metadata", {}):
                glued[o["metadata"]["scrapbook"]["name"]] = data
    assert "image/png" in glued["intro_routing"]
    rows: dict[str, dict[str, str]] = {}
    for table in tables:
        lines = table.splitlines()
        headers = [h.strip() for h in lines[0].strip("|").split(" | ")]
        for line in lines[2:]:
            cells = [_plain(c.strip()) for c in line.strip().strip("|").split(" | ")]
            rows.setdefault(cells[0], dict(zip(headers, cells)))
    for name in REG:
        want = _expected_cells(name)
        assert name in rows, f"{name} is not on the page"
        assert {h: rows[name][h] for h in want} == want
