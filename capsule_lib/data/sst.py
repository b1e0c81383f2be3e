"""Stanford Sentiment Treebank (Socher et al. 2013) reader for the language demo (Heinsen 2019).

``<root>/sst/trees/{train,dev,test}.txt`` (from ``python data_scripts/sst.py --root ROOT``): one sentence per
line as a labelled PTB tree, e.g. ``(3 (2 It) (4 (2 's) (3 fine)))``; labels 0 (very negative) to 4 (very
positive). SST-5 keeps the five labels; SST-2 drops neutral (2) and maps 0-1 -> 0, 3-4 -> 1. Heinsen trains
on all phrases (``subtrees=True``, deduplicated) and evaluates on root sentences.
"""
from __future__ import annotations

import re
from pathlib import Path

from .._checks import check_choice
from .datasets import data_root, unavailable

__all__ = ["parse_tree", "load_sst", "SST_SPLITS"]

SST_SPLITS = {"train": "train.txt", "val": "dev.txt", "test": "test.txt"}
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_tree(line: str) -> list[tuple[str, int]]:
    """All phrases of one labelled tree as ``(text, label)``, the root (whole sentence) first."""
    tokens = _TOKEN.findall(line)
    stack: list[tuple[int, list[str]]] = []
    phrases: list[tuple[str, int]] = []
    expect_label = False
    for tok in tokens:
        if tok == "(":
            expect_label = True
        elif tok == ")":
            if not stack:
                raise ValueError(f"unbalanced tree: {line[:80]!r}")
            label, words = stack.pop()
            phrases.append((" ".join(words), label))
            if stack:
                stack[-1][1].extend(words)
        elif expect_label:
            if not tok.isdigit() or not 0 <= int(tok) <= 4:
                raise ValueError(f"bad label {tok!r} in {line[:80]!r}")
            stack.append((int(tok), []))
            expect_label = False
        else:
            if not stack:
                raise ValueError(f"word outside a tree: {line[:80]!r}")
            stack[-1][1].append(tok)
    if stack or not phrases:
        raise ValueError(f"unbalanced or empty tree: {line[:80]!r}")
    return [phrases[-1]] + phrases[:-1]


def load_sst(root: str | Path | None = None, split: str = "train", classes: int = 5, subtrees: bool = False,
             ) -> tuple[list[str], list[int]]:
    """Texts and labels of an SST split (``"train"``, ``"val"`` = dev, ``"test"``); ``classes`` 5 or 2;
    ``subtrees=True`` adds every phrase (deduplicated by text, first label kept)."""
    check_choice(split, tuple(SST_SPLITS), "split")
    if classes not in (2, 5):
        raise ValueError(f"classes must be 5 (SST-5) or 2 (SST-2), got {classes}")
    folder = data_root(root) / "sst"
    path = folder / "trees" / SST_SPLITS[split]
    if not path.exists():
        raise unavailable("sst", folder, "sst.py", "the loader does not download; run the script")
    texts, labels, seen = [], [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        phrases = parse_tree(line)
        for text, label in (phrases if subtrees else phrases[:1]):
            if subtrees:
                if text in seen:
                    continue
                seen.add(text)
            if classes == 2:
                if label == 2:
                    continue
                label = int(label > 2)
            texts.append(text)
            labels.append(label)
    return texts, labels
