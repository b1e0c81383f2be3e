"""The first cell of every chapter: install ``capsule_lib`` when the notebook runs in Google Colab.

The repository URL is defined in one place, ``repository.url`` in ``_config.yml`` (the same URL the launch
buttons use), and the version pin is the library's version in ``pyproject.toml``: the cell installs the git
tag ``v<version>`` of that repository, so a chapter opened from a release installs the library it was written
for. This script writes that cell into every chapter, or checks that each chapter has it::

    .venv/bin/python book/_tools/colab_cell.py           # check (exit 1 and name the notebooks if one differs)
    .venv/bin/python book/_tools/colab_cell.py --write   # rewrite the cell in every chapter

The cell is tagged ``colab-setup`` and ``remove-cell`` (it is not shown on the rendered pages).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAGS = ["colab-setup", "remove-cell"]
EXTRAS = "data,widgets"


def repository_url(repo: Path = REPO) -> str:
    """``repository.url`` from ``_config.yml`` (read without a YAML dependency: two indented keys)."""
    text = (repo / "_config.yml").read_text()
    m = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", text, re.M)
    if not m:
        raise SystemExit(f"{repo / '_config.yml'}: no repository.url")
    return m.group(1).strip("\"'").rstrip("/")


def library_version(repo: Path = REPO) -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (repo / "pyproject.toml").read_text(), re.M)
    if not m:
        raise SystemExit(f"{repo / 'pyproject.toml'}: no version")
    return m.group(1)


def package_spec(repo: Path = REPO) -> str:
    """The pip requirement the cell installs, e.g. ``capsule_lib[data,widgets] @ git+URL@v0.1.0``."""
    return f"capsule_lib[{EXTRAS}] @ git+{repository_url(repo)}@v{library_version(repo)}"


def cell_source(repo: Path = REPO) -> str:
    return (
        "# Colab only: install capsule_lib (repository and version: _config.yml and pyproject.toml;\n"
        "# written by book/_tools/colab_cell.py). Outside Colab this cell does nothing.\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    PACKAGE = "{package_spec(repo)}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", PACKAGE], check=True)\n'
        "    import capsule_lib\n"
        '    print("capsule_lib", capsule_lib.__version__, "installed from", PACKAGE)\n'
    )


def chapters(repo: Path = REPO) -> list[Path]:
    return sorted(p for p in (repo / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def colab_cell(nb: dict) -> dict | None:
    cells = nb.get("cells", [])
    return cells[0] if cells and "colab-setup" in cells[0].get("metadata", {}).get("tags", []) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite the cell in every chapter")
    args = ap.parse_args(argv)
    want = cell_source()
    bad = []
    for path in chapters():
        nb = json.loads(path.read_text())
        cell = colab_cell(nb)
        if cell is not None and "".join(cell["source"]) == want:
            continue
        if not args.write:
            bad.append(path.relative_to(REPO).as_posix())
            continue
        new = {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {"tags": TAGS},
            "outputs": [],
            "source": want.splitlines(keepends=True),
        }
        if cell is None:
            nb["cells"].insert(0, new)
        else:
            cell.update(new)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"colab_cell: wrote {path.relative_to(REPO)}")
    if bad:
        print(
            f"colab_cell: the Colab cell differs from _config.yml/pyproject.toml in: {', '.join(bad)}; "
            "run `.venv/bin/python book/_tools/colab_cell.py --write`"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
