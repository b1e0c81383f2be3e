"""capsule_lib.report: numbers and tables for the rendered pages, as golden strings."""

import math

import pytest

from capsule_lib.report import markdown_table, pct, show_table


@pytest.mark.parametrize(
    "x, digits, expected",
    [
        (0.99612, 2, "99.61 %"),
        (0.5, 2, "50.00 %"),
        (1.0, 2, "100.00 %"),
        (0.0, 2, "0.00 %"),
        (0.123456, 0, "12 %"),
        (0.123456, 3, "12.346 %"),
        (-0.0123, 1, "-1.2 %"),
        (1.5, 1, "150.0 %"),
        (0.99995, 2, "100.00 %"),  # rounds, does not truncate
    ],
)
def test_pct_golden(x, digits, expected):
    assert pct(x, digits) == expected


def test_pct_missing_and_nan():
    assert pct(None) == "—" and pct(None, 5) == "—"
    assert pct(math.nan) == "nan %"  # a NaN is a value, not a missing one
    assert pct(0) == "0.00 %"  # zero is not missing


def test_markdown_table_golden():
    table = markdown_table(["model", "acc", "params"], [["CapsNet", pct(0.9961), 6_800_000], ["CNN", 0.9925, None]])
    assert table == (
        "| model | acc | params |\n|---|---|---|\n| CapsNet | 99.61 % | 6800000 |\n| CNN | 0.9925 | None |"
    )


def test_markdown_table_escapes_pipes_and_newlines():
    table = markdown_table(["a|b", "c"], [("x | y", "line 1\nline 2")])
    assert table.splitlines() == ["| a\\|b | c |", "|---|---|", "| x \\| y | line 1 line 2 |"]
    assert len(table.splitlines()) == 3  # a newline in a cell never splits the row


def test_markdown_table_edge_cases():
    assert markdown_table(["only"], []) == "| only |\n|---|"  # header and separator, no rows
    # rows are not padded or cut: GFM renders short rows with empty cells and ignores extra ones
    assert markdown_table(["a", "b"], [[""], [1, 2, 3]]) == "| a | b |\n|---|---|\n|  |\n| 1 | 2 | 3 |"
    rows = (r for r in [[1.5, True]])  # any iterable of rows
    assert markdown_table(("x", "y"), list(rows)).endswith("| 1.5 | True |")


def test_show_table_returns_markdown():
    from IPython.display import Markdown

    md = show_table(["k", "v"], [["acc", pct(0.5)]])
    assert isinstance(md, Markdown)
    assert md.data == "| k | v |\n|---|---|\n| acc | 50.00 % |"
    assert md._repr_markdown_() == md.data
