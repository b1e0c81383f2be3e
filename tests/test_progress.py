"""Progress bars leave nothing behind: a finished notebook bar must not keep a hidden widget that takes space
on the built page (a blank gap under the cell)."""

import tqdm.auto
import tqdm.notebook

from capsule_lib._progress import progress


def test_a_finished_notebook_bar_collapses(monkeypatch):
    monkeypatch.setattr(tqdm.auto, "tqdm", tqdm.notebook.tqdm)  # what a Jupyter kernel gets from tqdm.auto
    bar = progress(range(3), desc="x")
    assert bar.container.layout.display != "none"  # visible while it runs
    assert list(bar) == [0, 1, 2]
    assert bar.container.layout.display == "none"


def test_plain_terminal_bar_still_iterates(capsys):
    assert list(progress(range(4), total=4, desc="y")) == [0, 1, 2, 3]
