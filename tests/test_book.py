"""The book's structure and conventions: clean notebooks, chapter conventions, table of contents, citations,
offline configuration, and the helpers of the build (cache guard, offline check)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"


def _pages(pattern: str) -> list[Path]:
    """Book pages: files under book/ except checkpoints and the build assets in book/_* folders."""
    return sorted(
        p
        for p in BOOK.rglob(pattern)
        if ".ipynb_checkpoints" not in p.parts
        and not any(part.startswith("_") for part in p.relative_to(BOOK).parts[:-1])
    )


NOTEBOOKS = _pages("*.ipynb")
MARKDOWN = _pages("*.md")
CONFIG = yaml.safe_load((REPO / "_config.yml").read_text())
TOC = yaml.safe_load((REPO / "_toc.yml").read_text())
PARAMETERS = {"SMOKE": bool, "TRAIN": bool, "EPOCHS": int, "DEVICE": str, "DATA_ROOT": str}
REQUIRED_BIB = [
    "sabour2017dynamic",
    "hinton2018matrix",
    "heinsen2019algorithm",
    "heinsen2022algorithm",
    "tsai2020capsules",
    "mazzia2021efficient",
    "lecun1998gradient",
    "lecun1998mnist",
    "krizhevsky2009learning",
    "lecun2004learning",
    "tieleman2013affnist",
    "paik2019capsule",
    "gu2020improving",
    "byerly2021norouting",
    "mitterreiter2023why",
    "socher2013recursive",
    "he2016deep",
    "kingma2015adam",
    "zhang2018mixup",
    "liu2020variance",
]


def nb_json(path: Path) -> dict:
    return json.loads(path.read_text())


def src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def python_of(cell: dict) -> str:
    """The cell's source with IPython magics/shell lines blanked, so it parses as Python."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src(cell).splitlines())


def nb_id(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks under book/"


# ------------------------------------------------------------------------------------- clean notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_notebook_is_committed_without_outputs(path):
    nb = nb_json(path)
    dirty = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, (
        f"{nb_id(path)}: code cells {dirty} have outputs or execution counts; notebooks are "
        f"committed clean (the book executes them). Clear them, e.g. "
        f"`jupyter nbconvert --clear-output --inplace {nb_id(path)}`"
    )
    assert "widgets" not in nb.get("metadata", {}), f"{nb_id(path)}: saved widget state in the metadata"


# --------------------------------------------------------------------------------- chapter conventions
@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_notebook_conventions(path):
    nb = nb_json(path)
    name = nb_id(path)
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", f"{name}: kernelspec python3 missing"
    cells = code_cells(nb)
    assert cells, f"{name}: no code cells"

    first = src(cells[0])
    assert '"google.colab" in sys.modules' in first and "pip" in first, (
        f"{name}: the first code cell must install capsule_lib in Colab only"
    )

    params = [i for i, c in enumerate(cells) if "parameters" in tags(c)]
    assert len(params) == 1, f"{name}: expected exactly one cell tagged 'parameters', found {len(params)}"
    p = params[0]
    found: dict[str, object] = {}
    for stmt in ast.parse(src(cells[p])).body:
        assert isinstance(stmt, (ast.Assign, ast.AnnAssign)), (
            f"{name}: the parameters cell may only assign plain literals (papermill), found {ast.dump(stmt)[:80]}"
        )
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
        assert isinstance(target, ast.Name) and isinstance(stmt.value, ast.Constant), (
            f"{name}: parameters must be `NAME = <literal>` (papermill cannot parse expressions)"
        )
        found[target.id] = stmt.value.value
    for key, typ in PARAMETERS.items():
        assert key in found, f"{name}: parameter {key} missing from the parameters cell"
        assert type(found[key]) is typ, f"{name}: parameter {key} should be a {typ.__name__} literal"
    assert p + 1 < len(cells) and re.search(
        r"settings\(\s*SMOKE,\s*TRAIN,\s*EPOCHS,\s*DEVICE,\s*DATA_ROOT", src(cells[p + 1])
    ), f"{name}: the cell after the parameters must call settings(SMOKE, TRAIN, EPOCHS, DEVICE, DATA_ROOT)"

    for i, cell in enumerate(cells):
        code = python_of(cell)
        tree = ast.parse(code)
        for node in ast.walk(tree):
            assert not isinstance(node, ast.ClassDef), (
                f"{name}, code cell {i}: defines class {node.name}; layers/models belong in capsule_lib"
            )
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.name != "forward", f"{name}, code cell {i}: defines forward(); belongs in capsule_lib"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in ("backward", "zero_grad"), (
                    f"{name}, code cell {i}: calls .{node.func.attr}(); training loops belong in capsule_lib"
                )
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    assert m.split(".")[0] not in ("plotly", "bokeh", "altair", "seaborn"), (
                        f"{name}: figures are drawn with matplotlib (found import {m})"
                    )
                    if m.split(".")[0] == "tqdm":
                        assert m == "tqdm.auto", f"{name}: progress bars come from tqdm.auto (found {m})"


# ---------------------------------------------------------------------------------- a chapter reads like a book
#: the longest code cell a page may show: the idea and the call; formatting lives in capsule_lib
MAX_CELL_LINES = 12


def long_cells(nb: dict, limit: int = MAX_CELL_LINES) -> list[str]:
    """Code cells of more than ``limit`` lines (trailing blank lines not counted), as "cell i: n lines, <first>"."""
    out = []
    for i, cell in enumerate(code_cells(nb)):
        lines = src(cell).rstrip("\n").splitlines()
        if len(lines) > limit:
            out.append(f"code cell {i}: {len(lines)} lines, {lines[0][:60]!r}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_code_cells_are_short(path):
    """No code cell above MAX_CELL_LINES lines, hidden ones included (split the cell, or move the formatting into
    capsule_lib.report and the like)."""
    long = long_cells(nb_json(path))
    assert not long, f"{nb_id(path)}: code cells above {MAX_CELL_LINES} lines:\n" + "\n".join(long)


def test_the_cell_length_check_finds_a_long_cell():
    nb = {"cells": [{"cell_type": "code", "source": "x = 1\n" * 13}, {"cell_type": "code", "source": "y = 2\n" * 12}]}
    assert long_cells(nb) == ["code cell 0: 13 lines, 'x = 1'"]


DISPLAYS = ("show_table", "show_budgets")


def undisplayed_tables(nb: dict) -> list[str]:
    """Cells that build a table with show_table/show_budgets as a statement other than the cell's last top-level
    expression (earlier, or inside an if/for block): the returned Markdown is thrown away, the reader sees nothing."""
    out = []
    for i, cell in enumerate(code_cells(nb)):
        body = ast.parse(python_of(cell)).body
        shown = body[-1] if body and isinstance(body[-1], ast.Expr) else None
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            call = node.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
            name = getattr(call.func, "id", getattr(call.func, "attr", None)) if call is not None else None
            if name in DISPLAYS and node is not shown:
                out.append(f"code cell {i}, line {node.lineno}: {name}(...) is not the cell's last expression")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_every_table_a_cell_builds_is_shown(path):
    lost = undisplayed_tables(nb_json(path))
    assert not lost, f"{nb_id(path)}: tables that are never displayed:\n" + "\n".join(lost)


def test_the_table_check_finds_a_lost_table():
    nb = {
        "cells": [
            {"cell_type": "code", "source": "show_table(h, rows)\nprint(1)"},
            {"cell_type": "code", "source": "print(1)\nshow_table(h, rows)"},
            {"cell_type": "code", "source": "if rows:\n    show_table(h, rows)"},
        ]
    }
    assert undisplayed_tables(nb) == [
        "code cell 0, line 1: show_table(...) is not the cell's last expression",
        "code cell 2, line 2: show_table(...) is not the cell's last expression",
    ]


#: the shipped runs whose retraining each chapter's TRAIN switch repeats (capsule_lib.report.train_cost)
TRAIN_RUNS = {
    "dynamic_routing": dict(cpu=["capsnet_mnist"], speedrun="capsnet_speedrun_gpu"),
    "efficient_capsnet": dict(cpu=["efficient_capsnet_mnist"], speedrun="efficient_speedrun_gpu"),
    "em_routing": dict(cpu=["em_norb_seed0", "baseline_cnn_norb_seed0"]),
    "heinsen_routing": dict(cpu=["heinsen_norb_seed0", "baseline_cnn_norb48_seed0"]),
    "tsai_inverted": dict(cpu=["tsai_cifar10_cpu_seed0", "baseline_backbone_cifar10_cpu_seed0"]),
    "routing_compared": dict(budget="contestants"),
    "routing_critique": dict(critique=True),
    "own_images": dict(cpu=["own_images_capsnet", "own_images_cnn"]),
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_parameters_cell_says_what_training_costs(path):
    """The comment under TRAIN is what capsule_lib.report.train_cost computes from the shipped histories now."""
    from capsule_lib.comparison import CONTESTANTS, shipped_name
    from capsule_lib.report import train_cost

    cell = next(c for c in code_cells(nb_json(path)) if "parameters" in tags(c))
    said = [line for line in src(cell).splitlines() if line.startswith("# TRAIN = True costs")]
    if path.stem not in TRAIN_RUNS:
        assert not said and "trains nothing" in src(cell), f"{nb_id(path)}: add it to TRAIN_RUNS"
        return
    kw = dict(TRAIN_RUNS[path.stem])
    if kw.pop("critique", False):  # its runs are recorded, not shipped: the cost comes from their records
        from capsule_lib.routing_critique import retrain_cost as critique_cost

        assert said == [f"# TRAIN = True costs {critique_cost()}"], f"{nb_id(path)}: {said}"
        return
    if kw.get("budget") == "contestants":
        kw["budget"] = [shipped_name(n, d) for d in ("mnist", "norb") for n in CONTESTANTS]
    epochs = int(re.search(r"^EPOCHS: int = (\d+)", src(cell), re.M).group(1))
    want = f"# TRAIN = True costs {train_cost(epochs, **kw)}"
    assert said == [want], f"{nb_id(path)}: the parameters cell should say\n{want}\nfound {said}"


#: the chapters that load one shipped network by name (CHECKPOINT = "...") and that network's (model, dataset)
CHAPTER_NETWORKS = {"dynamic_routing": ("capsnet", "mnist"), "efficient_capsnet": ("efficient_capsnet", "mnist")}


@pytest.mark.parametrize("stem", sorted(CHAPTER_NETWORKS))
def test_a_chapter_loads_the_shipped_checkpoint_of_its_network_with_the_best_validation_accuracy(stem):
    """Among the shipped checkpoints of the chapter's network and data (the paper recipe's CPU and GPU runs, the
    speedrun's), the chapter shows the one chosen on the validation split: a better one registered later fails here
    until the chapter (and its prose) moves to it."""
    from capsule_lib.pretrained import registry

    cell = next(c for c in code_cells(nb_json(BOOK / f"{stem}.ipynb")) if "CHECKPOINT = " in src(c))
    loaded = re.search(r'^CHECKPOINT = "([a-z0-9_]+)"', src(cell), re.M).group(1)
    kind, data = CHAPTER_NETWORKS[stem]
    reg = registry()
    same = [n for n, e in reg.items() if e["model"] == kind and e["training"].get("dataset") == data]
    same = [n for n in same if not n.startswith("compare_")]  # the comparison's network is another one
    assert len(same) >= 2 and loaded in same
    assert loaded == max(same, key=lambda n: reg[n]["metrics"]["val_acc"]), {
        n: reg[n]["metrics"]["val_acc"] for n in same
    }


# ---------------------------------------------------------------------------------- table of contents
def toc_files() -> list[str]:
    files = [TOC["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in TOC.get("parts", []):
        assert part.get("chapters"), f"_toc.yml: part {part.get('caption')!r} is empty; omit empty parts"
        walk(part["chapters"])
    walk(TOC.get("chapters"))
    return files


def test_toc_entries_exist_and_every_page_is_listed():
    listed = toc_files()
    assert len(listed) == len(set(listed)), "_toc.yml lists a file twice"
    for f in listed:
        assert any((REPO / f).with_suffix(s).exists() for s in (".md", ".ipynb")), f"_toc.yml: {f} does not exist"
    pages = {p.relative_to(REPO).with_suffix("").as_posix() for p in NOTEBOOKS + MARKDOWN}
    missing = sorted(pages - set(listed))
    assert not missing, f"pages under book/ not in _toc.yml (add them, or delete them): {missing}"


def test_toc_parts_are_known():
    allowed = ["Introduction", "Foundations", "Routing algorithms", "Comparison", "Your own images", "Appendix"]
    captions = [p["caption"] for p in TOC.get("parts", [])]
    assert all(c in allowed for c in captions), captions
    assert captions == sorted(captions, key=allowed.index), f"parts out of order: {captions}"


# ---------------------------------------------------------------------------------------- citations
def bib_keys() -> set[str]:
    return set(re.findall(r"@\w+\{([^,\s]+),", (REPO / "references.bib").read_text()))


def cited_keys() -> set[str]:
    texts = [p.read_text() for p in MARKDOWN]
    for p in NOTEBOOKS:
        texts += [src(c) for c in nb_json(p)["cells"] if c["cell_type"] == "markdown"]
    keys: set[str] = set()
    for t in texts:
        for group in re.findall(r"\{cite(?::[a-z]+)?\}`([^`]+)`", t):
            keys.update(k.strip() for k in group.split(","))
    return keys


def test_every_citation_is_in_references_bib():
    unknown = sorted(cited_keys() - bib_keys())
    assert not unknown, f"cited but not in references.bib: {unknown}"


def test_references_bib_has_every_paper_of_the_book():
    missing = [k for k in REQUIRED_BIB if k not in bib_keys()]
    assert not missing, f"references.bib lacks {missing}"


# ------------------------------------------------------------------------------------------- config
def test_config_serves_everything_locally():
    sphinx = CONFIG["sphinx"]["config"]
    assert sphinx["html_static_path"] == ["book/_vendor", "book/_static"]
    assert all((REPO / "book" / "_static" / f).is_file() for f in sphinx["html_css_files"]), "book CSS missing"
    assert not (REPO / "_static").exists(), "a top-level _static/ is injected into every page by JB1; use book/_vendor/"
    assert (REPO / "book" / "_vendor" / sphinx["mathjax_path"]).is_file(), "vendored MathJax missing"
    for sub in ("output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "ui"):
        assert (REPO / "book" / "_vendor" / "mathjax" / sub).is_dir(), f"MathJax component {sub} missing"
    for path, attrs in sphinx["nb_ipywidgets_js"].items():
        assert not re.match(r"^(https?:)?//", path), f"nb_ipywidgets_js loads {path} from the network"
        assert (REPO / "book" / "_vendor" / path).is_file(), f"vendored {path} missing"
        for v in (attrs or {}).values():
            assert not re.match(r"^(https?:)?//", str(v)), f"nb_ipywidgets_js attribute points at {v}"
    assert "offline_book" in CONFIG["sphinx"]["local_extensions"]


def test_config_execution_and_metadata():
    ex = CONFIG["execute"]
    assert ex["execute_notebooks"] == "cache" and ex["allow_errors"] is False and ex["timeout"] >= 600
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["title"] == "Capsule Networks, an interactive book" and CONFIG["author"] and CONFIG["copyright"]
    assert CONFIG["launch_buttons"]["colab_url"] and CONFIG["launch_buttons"]["binderhub_url"]
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    assert CONFIG["html"]["use_repository_button"] is True
    assert all((REPO / f).is_file() for f in CONFIG["bibtex_bibfiles"])
    for ext in ("sphinx.ext.autodoc", "sphinx.ext.napoleon"):
        assert ext in CONFIG["sphinx"]["extra_extensions"]


def test_project_files():
    readme = (REPO / "README.md").read_text().splitlines()
    head = "\n".join(readme[:15])
    assert "make book" in head and "make test" in head, "README.md must start with the two commands"
    assert "MIT" in (REPO / "LICENSE").read_text()
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["title"] and cff["authors"]
    ci = REPO / ".ci" / "run"
    assert os.access(ci, os.X_OK) and re.search(r"^make test$", ci.read_text(), re.M)


# ------------------------------------------------------------------------------------ build helpers
def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_offline_check_finds_network_resources(tmp_path):
    mod = _load(REPO / "book" / "_ext" / "offline_book.py", "offline_book")
    (tmp_path / "ok.html").write_text(
        '<script src="_static/a.js"></script><a href="https://example.org">link</a>'
        '<script type="application/vnd.jupyter.widget-state+json">{"u": "https://cdn.jsdelivr.net/x"}</script>'
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.html").write_text(
        '<script src="https://cdn.jsdelivr.net/npm/x.js"></script>'
        '<link rel="stylesheet" href="//fonts.googleapis.com/css">'
        '<script>const THEBE_JS_URL = "https://unpkg.com/thebe@0.8.2/lib/index.js"</script>'
        '<script data-jupyter-widgets-cdn="https://cdn.jsdelivr.net/npm/" src="_static/w.js"></script>'
    )
    found = mod.network_findings(tmp_path)
    assert list(found) == ["sub/bad.html"]
    assert len(found["sub/bad.html"]) == 4


def test_cache_guard_clears_the_cache_when_code_or_environment_change(tmp_path, monkeypatch):
    mod = _load(REPO / "book" / "_tools" / "cache_guard.py", "cache_guard")
    repo = tmp_path / "repo"
    (repo / "capsule_lib").mkdir(parents=True)
    (repo / "capsule_lib" / "a.py").write_text("x = 1\n")
    (repo / "requirements.txt").write_text("torch\n")
    (repo / "pyproject.toml").write_text("[project]\n")
    monkeypatch.setattr(mod, "REPO", repo)
    monkeypatch.delenv("CAPSULE_OFFLINE", raising=False)
    build = tmp_path / "_build"
    cache = build / ".jupyter_cache"

    def run():
        for d in (cache, build / ".doctrees"):
            d.mkdir(parents=True, exist_ok=True)
            (d / "marker").write_text("cached")
        mod.main(["--build", str(build)])
        kept = [(d / "marker").exists() for d in (cache, build / ".doctrees")]
        assert kept[0] == kept[1], "the execution cache and Sphinx's environment must be cleared together"
        return kept[0]

    run()  # first run: no key yet
    assert run() is True  # nothing changed: cache kept
    (repo / "capsule_lib" / "a.py").write_text("x = 2\n")
    assert run() is False  # library changed: cache cleared
    assert run() is True
    (repo / "capsule_lib" / "checkpoints").mkdir()
    (repo / "capsule_lib" / "checkpoints" / "m.pt").write_bytes(b"weights v1")
    assert run() is False  # a new checkpoint: cache cleared
    assert run() is True
    (repo / "capsule_lib" / "checkpoints" / "registry.json").write_text("{}")
    assert run() is False  # the registry changed: cache cleared
    (repo / "capsule_lib" / "__pycache__").mkdir()
    (repo / "capsule_lib" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"bytecode")
    assert run() is True  # bytecode is not code
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    assert run() is False  # environment changed: cache cleared


def test_library_docstrings_are_numpydoc_without_a_custom_extension():
    """Parameter sections are NumPy style (``name`` or ``name : type`` on one line, the description indented
    below), so napoleon renders them without help: a ``name: description`` field would be read as a *type*."""
    import ast
    import re

    field = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*): \S")
    bad = []
    for path in sorted((REPO / "capsule_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            doc = ast.get_docstring(node) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) else None
            lines = (doc or "").splitlines()
            for i, line in enumerate(lines):
                if (
                    line.strip() in ("Parameters", "Other Parameters", "Attributes")
                    and i + 1 < len(lines)
                    and set(lines[i + 1].strip()) == {"-"}
                ):
                    for entry in lines[i + 2 :]:
                        if entry.strip() and set(entry.strip()) == {"-"}:
                            break
                        if entry == entry.lstrip() and field.match(entry):
                            bad.append(f"{path.relative_to(REPO)}: {getattr(node, 'name', 'module')}: {entry[:60]}")
    assert not bad, "name: description fields in NumPy sections:\n" + "\n".join(bad)
    assert "normalize_fields" not in (REPO / "book" / "_ext" / "capsule_api.py").read_text()


# ------------------------------------------------------------------------------- reader-facing checks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_papermill_parses_every_parameter(path):
    """`papermill --help-notebook` must list every parameter (a comment papermill cannot parse drops it)."""
    from papermill.inspection import inspect_notebook

    found = inspect_notebook(str(path))
    assert set(PARAMETERS) <= set(found), f"{nb_id(path)}: papermill infers only {sorted(found)}"
    for key, typ in PARAMETERS.items():
        assert found[key]["inferred_type_name"] == typ.__name__, f"{nb_id(path)}: {key} {found[key]}"


def test_colab_cell_is_the_one_written_from_config():
    mod = _load(REPO / "book" / "_tools" / "colab_cell.py", "colab_cell")
    assert mod.repository_url() == CONFIG["repository"]["url"].rstrip("/")
    assert mod.package_spec().endswith(f"@v{mod.library_version()}")  # pinned to the release tag
    assert mod.main([]) == 0, "a chapter's Colab cell differs: run book/_tools/colab_cell.py --write"


@pytest.mark.slow
def test_colab_cell_installs_and_imports_the_library(tmp_path):
    """Execute the Colab cell as Colab would (``google.colab`` importable), with the git URL swapped for a
    local copy of the package and pip pointed at a scratch folder: it must install and import capsule_lib
    from there."""
    import shutil
    import subprocess

    mod = _load(REPO / "book" / "_tools" / "colab_cell.py", "colab_cell")
    src_dir = tmp_path / "src"
    shutil.copytree(REPO / "capsule_lib", src_dir / "capsule_lib", ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / f, src_dir / f)
    target = tmp_path / "site"
    target.mkdir()
    cell = mod.cell_source().replace(f"git+{mod.repository_url()}@v{mod.library_version()}", src_dir.as_uri())
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import subprocess, sys, types\n"
        f"sys.path.insert(0, {str(target)!r})\n"
        "sys.modules['google'] = types.ModuleType('google')\n"
        "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
        "_run = subprocess.run\n"
        "def run(cmd, **kw):  # offline: no dependency resolution, no build isolation, into the scratch folder\n"
        f"    return _run([*cmd, '--no-deps', '--no-build-isolation', '--target', {str(target)!r}], **kw)\n"
        "subprocess.run = run\n"
        f"exec(compile({cell!r}, 'colab-cell', 'exec'))\n"
        f"assert capsule_lib.__file__.startswith({str(target)!r}), capsule_lib.__file__\n"
    )
    out = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"capsule_lib {mod.library_version()} installed from" in out.stdout


PRIVATE = "|".join([r"\.\./shared", "shared/(spec|data|hooks)", "papers" + r"\.md"])  # not a match itself


def test_no_reference_to_the_private_environment():
    """A user has none of the CI machine's private folders: only .ci/run may know where CI keeps its data."""
    hits = []
    for p in REPO.rglob("*"):
        rel = p.relative_to(REPO)
        if (
            not p.is_file()
            or rel.parts[0] in (".git", ".venv", "_build", "runs", "data", "node_modules", ".ci")
            or "egg-info" in rel.parts[0]
            or p.suffix in (".pt", ".png", ".pyc", ".woff", ".woff2")
        ):
            continue
        try:
            text = p.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1) if re.search(PRIVATE, line)]
    assert not hits, f"references to the private environment: {hits[:10]}"


def test_intro_lists_exactly_the_chapters_that_exist():
    intro = (BOOK / "intro.md").read_text()
    linked = set(re.findall(r"\{doc\}`([^`]+)`", intro))
    chapters = {p.relative_to(BOOK).with_suffix("").as_posix() for p in NOTEBOOKS + MARKDOWN} - {"intro"}
    assert chapters <= linked, f"intro.md does not mention {sorted(chapters - linked)}"
    assert linked <= chapters, f"intro.md links pages that do not exist: {sorted(linked - chapters)}"
    uses_cifar = any(
        "cifar" in src(c).lower() for p in NOTEBOOKS if p.name != "data.ipynb" for c in code_cells(nb_json(p))
    )
    assert uses_cifar or "krizhevsky2009learning" not in intro, "intro.md says chapters use CIFAR-10; none does"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_chapters_never_move_their_model_in_place(path):
    """`x = model.cpu()` moves the chapter's model too (nn.Module.cpu is in place): later GPU calls break."""
    for i, cell in enumerate(code_cells(nb_json(path))):
        for m in re.finditer(r"^\s*\w+\s*=\s*(\w+)\.(cpu|cuda)\(\)", python_of(cell), re.M):
            assert m.group(1) not in ("model", "net", "cnn", "capsnet"), (
                f"{nb_id(path)}, code cell {i}: `{m.group(0).strip()}` moves the model in place; use copy.deepcopy"
            )


# ------------------------------------------------------------------------ make book: failures, stand-ins
@pytest.mark.slow
def test_a_notebook_that_raises_fails_the_build_report(tmp_path):
    """A real (tiny) Jupyter Book build with a notebook that raises: jupyter-book itself 'succeeds'; the build
    report (run by `make book` and `make test` after it) must fail and name the notebook and the cell."""
    import subprocess

    (tmp_path / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: cache\n  allow_errors: false\nonly_build_toc_files: true\n"
    )
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n- file: broken\n")
    (tmp_path / "intro.md").write_text("# Intro\n")
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Broken"]},
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": ["x = 1\n", "raise RuntimeError('simulated failure')"],
            },
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "broken.ipynb").write_text(json.dumps(nb))
    jb = Path(sys.executable).parent / "jupyter-book"
    built = subprocess.run([str(jb), "build", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0  # the reason this report exists
    rep = subprocess.run(
        [sys.executable, str(BOOK / "_tools" / "build_report.py"), "--build", str(tmp_path / "_build")],
        capture_output=True,
        text=True,
    )
    assert rep.returncode == 1, rep.stdout
    assert "notebook FAILED: broken.ipynb" in rep.stdout
    assert "| raise RuntimeError('simulated failure')" in rep.stdout
    assert "error: RuntimeError: simulated failure" in rep.stdout


def test_build_report_summarises_the_stand_in_pages(tmp_path, capsys):
    mod = _load(BOOK / "_tools" / "build_report.py", "build_report")
    ex = tmp_path / "_build" / "jupyter_execute" / "book"
    ex.mkdir(parents=True)
    line = (
        "[GENERATED stand-in data] mnist is not available here (offline mode): using 'glyph_digits' instead. "
        "Numbers below are NOT mnist results.\n"
    )
    for name, text in [("a", line), ("b", line), ("c", "[real data] mnist/test: 10000 images\n")]:
        nb = {
            "cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}]}]
        }
        (ex / f"{name}.ipynb").write_text(json.dumps(nb))
    assert mod.main(["--build", str(tmp_path / "_build")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "built on generated stand-in data for: mnist (book/a, book/b)" in out[0]
    assert "python data_scripts/mnist.py" in out[0]


def test_build_report_reads_a_pages_one_notice(tmp_path):
    """The page's own notice (capsule_lib.notebook: several datasets in one line) counts like the data layer's."""
    mod = _load(BOOK / "_tools" / "build_report.py", "build_report")
    ex = tmp_path / "book"
    ex.mkdir()
    line = "[GENERATED stand-in data] mnist, cifar10 is not here (offline mode): this page runs on generated stand-ins."
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stdout", "text": [line]}]}]}
    (ex / "p.ipynb").write_text(json.dumps(nb))
    assert mod.standin_pages(tmp_path) == {"cifar10": ["book/p"], "mnist": ["book/p"]}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_id)
def test_metrics_are_labelled_with_the_data_they_were_computed_on(path):
    """On an offline build the chapters evaluate on a generated stand-in: a table header that hard-codes
    "MNIST" over a number computed from the chapter's own test set would mislabel it. The data's name must come
    from the dataset (the chapters' ``DATA`` label), not from a literal."""
    for i, cell in enumerate(code_cells(nb_json(path))):
        code = python_of(cell)
        if "show_table(" not in code:
            continue
        headers = re.findall(r"show_table\(\s*\[([^\]]*)\]", code)
        for h in headers:
            assert not re.search(r"[\"']MNIST test", h), (
                f"{nb_id(path)}, code cell {i}: a table header names MNIST literally ({h.strip()[:80]}); "
                "use the data label"
            )


def test_training_at_scale_numbers_come_from_the_benchmark_json():
    """The 1 vs 2 process line of the appendix quotes benchmarks/results/ddp_cpu.json (no hand-typed numbers)."""
    result = json.loads((REPO / "benchmarks" / "results" / "ddp_cpu.json").read_text())
    text = (REPO / "book" / "appendix" / "running.md").read_text()
    one, two = result["runs"]
    for run in (one, two):
        assert f"{run['images_per_s']:.1f} images/s" in text
        assert ", ".join(f"{v:.4f}" for v in run["train_loss"]) in text
    assert f"{result['max_train_loss_difference']:.1e}" in text


def test_allocator_numbers_come_from_the_benchmark_json():
    """The running appendix's allocator table quotes benchmarks/results/allocator_cpu.json (no hand-typed numbers)."""
    result = json.loads((REPO / "benchmarks" / "results" / "allocator_cpu.json").read_text())
    text = (REPO / "book" / "appendix" / "running.md").read_text()
    assert result["rows"] and not result["quick"]
    for row in result["rows"]:
        med, up = row["median_s"], row["speedup_vs_glibc"]
        cells = f"| {1e3 * med['glibc']:.0f} ms | {1e3 * med['tcmalloc']:.0f} ms (x{up['tcmalloc']:.2f}) |"
        if "glibc_thp" in med:  # the THP column, measured since the library's speed work
            cells += f" {1e3 * med['glibc_thp']:.0f} ms (x{up['glibc_thp']:.2f}) |"
        assert cells in text, row
    ups = [r["speedup_vs_glibc"]["jemalloc"] for r in result["rows"]]
    assert f"({min(ups):.2f} to {max(ups):.2f} times glibc's speed)" in text
