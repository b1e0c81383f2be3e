"""The library's shape: one home and one name per concept, modules that import only downwards, one data
root, one offline fallback and one training entry point (see CONTRIBUTING.md)."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from capsule_lib._checks import check_choice
from capsule_lib.commands.train import main
from capsule_lib.models import CapsNetConfig
from capsule_lib.pretrained import load_pretrained_history, registry
from capsule_lib.routing import DynamicRouting
from capsule_lib.train import shipped_recipe, train
from capsule_lib.train.recipes import RECIPES, CapsNetRecipe, make_recipe, recipe_config

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "capsule_lib"
TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))

#: the library's layers, bottom to top: a module may import only from its own layer or from layers before it
LAYERS = [
    "types",
    "_checks",
    "_contracts",  # argument contracts read from annotations (checked, check_fields)
    "_progress",
    "functional",
    "losses",
    "routing",
    "layers",
    "models",
    "data",
    "evaluation",
    "attacks",
    "robustness",
    "cost",
    "distributed",
    "train.runtime",
    "train.ema",
    "train.checkpoint",
    "train.trainer",
    "train.learning_check",  # did this run learn? (after its first epoch and at its end; a dead run stops)
    "train.recipes",
    "train.shipped",  # the shipped checkpoints: registry.json, sha256-checked files, export_run (a run -> a file)
    "train.run",  # train(): the one training entry point (starts from / retrains shipped checkpoints)
    "train.timed",  # run_speedrun: the speedrun recipes through train() in a number of minutes
    "train",  # train/__init__: re-exports; everything of train/ above sits below pretrained
    "pretrained",  # the readers' door to the shipped checkpoints (re-exports train.shipped), the author's weights
    "export",  # ONNX export of trained models for the book's live widgets (optional extra: onnx, onnxscript)
    "learning",  # the rule a network must pass to enter a comparison or a verdict; a probe of a run's first steps
    "comparison",
    "critique",  # the critics' questions: what routing does to a trained network, measured
    "routing_critique",  # the critics' chapter on the comparison network: its runs and their records
    "critique_verdicts",  # each critic's claim against our measurement
    "report",
    "published",
    "results",
    "own_images",  # the page on your own images: networks at other sizes, the matrix of folders as tables
    "analysis",
    "exercises",  # the chapters' questions and code exercises, checked against the library's references
    "viz",
    "notebook",  # the one reader of the CAPSULE_* environment variables
    "commands",  # train, train.speedrun, predict and their python -m entry modules (SHIMS): nothing imports them
]


def _is_shim(tree: ast.Module) -> bool:
    """A ``python -m`` entry module: a docstring and one ``if __name__ == "__main__":`` block holding exactly
    ``from capsule_lib.commands.<command> import main`` and ``main()``; nothing else."""
    docstring = bool(tree.body) and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant)
    body = tree.body[1:] if docstring else tree.body
    if len(body) != 1 or not isinstance(body[0], ast.If) or body[0].orelse:
        return False
    block = body[0]
    if ast.unparse(block.test) != "__name__ == '__main__'" or len(block.body) != 2:
        return False
    imp, call = block.body
    return (
        isinstance(imp, ast.ImportFrom)
        and imp.level == 0
        and re.fullmatch(r"capsule_lib\.commands\.[a-z_]+", imp.module or "") is not None
        and [(a.name, a.asname) for a in imp.names] == [("main", None)]
        and ast.unparse(call) == "main()"
    )


#: the ``python -m`` entry modules, by the rule of ``_is_shim``: in the commands' layer though their paths lie elsewhere
SHIMS = {
    ".".join(p.with_suffix("").relative_to(REPO).parts)
    for p in sorted(LIB.rglob("*.py"))
    if _is_shim(ast.parse(p.read_text()))
}


def _modules():
    for path in sorted(LIB.rglob("*.py")):
        parts = list(path.with_suffix("").relative_to(REPO).parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts), package


def _layer(module: str) -> str:
    """A module's layer: ``commands`` for an entry module (``SHIMS``), ``capsule_lib.<package>.<module>`` where
    LAYERS names it, else its package."""
    if module in SHIMS:
        return "commands"
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in LAYERS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "capsule_lib"


def test_every_module_belongs_to_a_layer():
    layers = {_layer(m) for _, m, _ in _modules()} - {"capsule_lib"}
    assert layers <= set(LAYERS), f"modules outside the layer list: {sorted(layers - set(LAYERS))}"


def _imports(tree: ast.AST, package: list[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of ``capsule_lib`` in ``tree``, at any depth: top-level, inside a function
    (a lazy import), a class or an ``if __name__ == "__main__"`` block alike."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            targets = [".".join(base + ([node.module] if node.module else []))]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("capsule_lib"):
            targets = [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("capsule_lib")]
        found += [(node.lineno, target) for target in targets]
    return found


def test_modules_import_only_from_lower_layers():
    """Top-level and function-level (lazy) imports alike; the package ``__init__`` re-exports and is exempt."""
    upward = []
    for path, module, package in _modules():
        src = _layer(module)
        if src == "capsule_lib":
            continue
        for line, target in _imports(ast.parse(path.read_text()), package):
            dst = _layer(target)
            if dst == "capsule_lib" or LAYERS.index(dst) > LAYERS.index(src):
                upward.append(f"{module} imports {target} (line {line})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
    sample = "from .x import a\ndef f():\n    from ..pretrained import b\n    import capsule_lib.notebook\n"
    assert _imports(ast.parse(sample), ["capsule_lib", "train"]) == [
        (1, "capsule_lib.train.x"),
        (3, "capsule_lib.pretrained"),
        (4, "capsule_lib.notebook"),
    ]  # the detector sees the imports inside functions


def _command_imports(tree: ast.AST, package: list[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of each import in ``tree`` of a command or an entry module (``from capsule_lib.train import
    speedrun`` included)."""
    found = [(line, t) for line, t in _imports(tree, package) if _layer(t) == "commands"]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("capsule_lib"):
            found += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if f"{node.module}.{a.name}" in SHIMS
            ]
    return found


def _notebook_code(path: Path) -> str:
    """A notebook's code cells as one Python source (IPython magics and shell lines left out)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = ["".join(c["source"]).splitlines() for c in cells]
    return "\n".join(line for cell in lines for line in cell if not line.lstrip().startswith(("%", "!")))


def test_the_commands_sit_on_top_and_nothing_imports_them():
    """The commands (``capsule_lib.commands`` and the entry modules of their ``python -m`` spellings, ``SHIMS``) are
    the top layer: nothing imports them (the library, the benchmarks, the data scripts and the chapters run them as
    ``python -m``; only the tests call them), and an entry module holds nothing but the call. ``train/`` sits below
    ``pretrained`` and imports nothing from ``pretrained`` or ``notebook``."""
    assert LAYERS[-1] == "commands" and LAYERS.index("notebook") < LAYERS.index("commands")
    assert SHIMS == {"capsule_lib.train.__main__", "capsule_lib.train.speedrun", "capsule_lib.predict"}
    train_layers = [x for x in LAYERS if x == "train" or x.startswith("train.")]
    assert max(LAYERS.index(x) for x in train_layers) < LAYERS.index("pretrained"), train_layers
    found = []
    for path, m, pkg in _modules():
        tree = ast.parse(path.read_text())
        if _layer(m) != "commands":
            found += [f"{m} imports the command {t} (line {line})" for line, t in _command_imports(tree, pkg)]
        if m.startswith("capsule_lib.train") and _layer(m) != "commands":
            found += [
                f"{m} imports {t} (line {line})"
                for line, t in _imports(tree, pkg)
                if _layer(t) in ("pretrained", "notebook")
            ]
    for f in [*REPO.glob("benchmarks/*.py"), *REPO.glob("data_scripts/*.py"), *REPO.glob("book/**/*.ipynb")]:
        if "_build" not in f.parts and ".ipynb_checkpoints" not in f.parts:
            code = _notebook_code(f) if f.suffix == ".ipynb" else f.read_text()
            found += [f"{f.relative_to(REPO)} imports {t}" for _, t in _command_imports(ast.parse(code), [])]
    assert not found, "\n".join(found)
    sample = "from capsule_lib.train import speedrun\nimport capsule_lib.commands.train\nfrom capsule_lib import train"
    assert _command_imports(ast.parse(sample), []) == [
        (2, "capsule_lib.commands.train"),
        (1, "capsule_lib.train.speedrun"),
    ]  # the detector sees both spellings
    # the entry modules' rule: a docstring and the call, nothing else
    call = 'if __name__ == "__main__":\n    from capsule_lib.commands.x import main\n\n    main()\n'
    assert _is_shim(ast.parse('"""doc"""\n' + call))
    for extra in ("import os\n", "x = 1\n", "def f():\n    pass\n"):
        assert not _is_shim(ast.parse(extra + call))
    assert not _is_shim(ast.parse(call.replace("main()", "main(1)")))
    assert not _is_shim(ast.parse(call.replace("commands.x", "train.run")))


def _import_graph(lib: Path = LIB) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` over every module of the package at ``lib``: module-level and
    function-level (lazy) imports, relative and absolute. ``from X import name`` is an edge to the module ``X.name``
    when there is one, else to ``X`` (its ``__init__``). Importing ``a.b.c`` also runs ``a/__init__`` and
    ``a/b/__init__``, but those implicit edges are left out: a package's ``__init__`` re-exports its modules, so they
    would make every package a cycle of its own."""
    root, top = lib.parent, lib.name
    modules: dict[str, tuple[Path, list[str]]] = {}  # module -> (its file, its package's parts)
    for path in sorted(lib.rglob("*.py")):
        parts = list(path.with_suffix("").relative_to(root).parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, parts[:-1])
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, (path, package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                if base == top or base.startswith(top + "."):
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name == top or a.name.startswith(top + ".")]
            for target in targets:
                while target not in modules:  # a name imported from a module: that module
                    target = target.rpartition(".")[0]
                if target != module:
                    graph[module].setdefault(target, node.lineno)
    return graph


def _import_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import cycle of ``graph``, one per strongly connected component (Tarjan), written out as
    ``a (line n) -> b (line m) -> a``: a shortest cycle through the component's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        start, members = component[0], set(component)
        paths, seen = [[start]], {start}  # breadth first from start back to it, inside the component
        while paths:
            path = paths.pop(0)
            nxt = [w for w in graph[path[-1]] if w in members]
            if start in nxt:
                path.append(start)
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append([*path, w])
        cycles.append(" -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {start}")
    return cycles


def test_no_import_cycles():
    """No module imports itself back through other modules, at module level or inside a function (a lazy import
    hides a cycle, it does not remove it). A kernel in ``routing/_kernels`` takes what it needs from its algorithm
    as arguments (#48: ``_kernels/em.py`` imported ``_e_step``, ``_m_step`` back from ``routing/em.py``)."""
    cycles = _import_cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_finds_a_lazy_cycle(tmp_path):
    """The check sees function-level and relative imports: EM's old circle, rebuilt in a throwaway package."""
    lib = tmp_path / "pkg"
    (lib / "routing" / "_kernels").mkdir(parents=True)
    for name in ("__init__.py", "routing/__init__.py", "routing/_kernels/__init__.py"):
        (lib / name).write_text("")
    (lib / "routing" / "em.py").write_text("def em_routing():\n    from ._kernels.em import kernel\n")
    (lib / "routing" / "_kernels" / "em.py").write_text("from ..em import _m_step\n")
    assert _import_cycles(_import_graph(lib)) == [
        "pkg.routing._kernels.em (line 1) -> pkg.routing.em (line 2) -> pkg.routing._kernels.em"
    ]


def test_kernels_import_nothing_from_the_routing_package():
    """``routing/_kernels/*.py`` never choose themselves (no ``use_kernel``: the algorithm module calls it) and take
    what they share with their algorithm as arguments, so they import nothing from ``capsule_lib.routing``."""
    graph = _import_graph()
    found = [
        f"{module} imports {target} (line {line})"
        for module, targets in graph.items()
        if module.startswith("capsule_lib.routing._kernels.")
        for target, line in targets.items()
        if target.startswith("capsule_lib.routing")
    ]
    assert not found, found


def test_each_public_name_is_defined_once():
    """One concept, one home: no two modules define a public class or function of the same name."""
    seen: dict[str, list[str]] = {}
    for path, module, _ in _modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(module)
    dupes = {k: v for k, v in seen.items() if len(v) > 1 and k != "main"}
    assert not dupes, f"defined in several modules: {dupes}"


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def test_modules_and_functions_stay_small():
    """No module above 600 lines; no function above 80 lines of code (its docstring not counted), except a
    documented kernel in ``routing/_kernels`` (a hand-derived backward is one piece of arithmetic)."""
    long_modules, long_functions = [], []
    for path, module, _ in _modules():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{module}: {len(text.splitlines())} lines")
        kernel = "._kernels." in module
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0]
                n -= first.end_lineno - first.lineno + 1
            if n > MAX_FUNCTION_LINES and not (kernel and ast.get_docstring(ast.parse(text))):
                long_functions.append(f"{module}.{node.name}: {n} lines of code")
    assert not long_modules, long_modules
    assert not long_functions, long_functions


def test_capsule_layers_live_in_layers_and_algorithms_in_routing():
    import capsule_lib.layers as layers
    import capsule_lib.routing as routing

    for name in layers.__all__:
        assert getattr(layers, name).__module__.startswith("capsule_lib.layers."), name
    for name in routing.__all__:
        assert getattr(routing, name).__module__.startswith("capsule_lib.routing."), name
    primaries = [
        (n, module)
        for path, module, _ in _modules()
        for n in re.findall(r"^class (\w*PrimaryCapsules)\b", path.read_text(), re.M)
    ]
    assert {m for _, m in primaries} == {"capsule_lib.layers.primary"}, primaries
    primaries = [n for n, _ in primaries]
    assert sorted(primaries) == sorted(
        ["PrimaryCapsules", "DepthwisePrimaryCapsules", "MatrixPrimaryCapsules", "InvertedPrimaryCapsules"]
    )
    assert {p.name for p in (LIB / "routing").glob("*.py")} == {
        "__init__.py",
        "_common.py",
        "dynamic.py",
        "em.py",
        "heinsen_2019.py",
        "heinsen_2022.py",
        "inverted.py",
        "self_attention.py",
        "kinds.py",  # the registry: one RoutingKind per algorithm (ROUTING_KINDS), the protocol
    }
    from capsule_lib.routing.kinds import ROUTING_KINDS

    algorithms = {p.stem for p in (LIB / "routing").glob("*.py") if not p.stem.startswith("_")} - {"kinds"}
    assert algorithms == set(ROUTING_KINDS)  # one name per algorithm: module = routing kind = trace name


def _kind_branches(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Comparisons against a routing kind's name (``kind == "em"``, ``routing in ("dynamic", ...)``, ``match``)."""
    hits = []
    for node in ast.walk(tree):
        sides = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            sides = [node.value]
        strings = set()
        for side in sides:
            elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            strings |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if strings & names:
            hits.append((node.lineno, ast.unparse(node)))
    return hits


def test_no_module_branches_on_a_routing_kind_outside_the_registry():
    """What differs between routing algorithms is read from their registry entry (``routing/kinds.py``), never
    from their names: a new algorithm needs no other module changed."""
    from capsule_lib.routing.kinds import ROUTING_KINDS

    names = set(ROUTING_KINDS)
    old = ast.parse('if kind == "em":\n    pass\nx = 1 if routing in ("heinsen_2022", "inverted") else 2\n')
    assert [line for line, _ in _kind_branches(old, names)] == [1, 3]  # the ladders this replaced are caught
    found = [
        f"{module}:{line}: {code}"
        for path, module, _ in _modules()
        if module != "capsule_lib.routing.kinds"
        for line, code in _kind_branches(ast.parse(path.read_text()), names)
    ]
    assert not found, "per-kind branches outside the registry:\n" + "\n".join(found)


OLD_NAMES = [
    r"\bn_iters\b",
    r"\bnum_routing\b",
    r"\bsig2",
    r"\.lengths\b",
    r"\bdefault_data_root\b",
    r"\btrain_capsnet\b",
    r"\btrain_efficient_capsnet\b",
    r"\btrain_baseline_cnn\b",
    r"\btrain_efficient_multimnist\b",
    r"routing\.trace\b",
    r"\b_TRUNC_STD\b",
    r"\b_EMOptions\b",
    r"capsule_lib\.recipes (capsnet|efficient)",
]


def test_contributing_shows_every_module_in_its_tree():
    """CONTRIBUTING.md's layout picture has a line for every module of the library."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    start = text.index("```\ncapsule_lib/")
    tree = text[start : text.index("```", start + 3)]
    missing = [
        p.relative_to(LIB).as_posix() for p in LIB.rglob("*.py") if p.name != "__init__.py" and p.name not in tree
    ]
    assert not missing, f"modules missing from CONTRIBUTING.md's tree: {missing}"


def test_old_names_are_gone():
    files = [
        *LIB.rglob("*.py"),
        *REPO.glob("tests/*.py"),
        *REPO.glob("book/**/*.ipynb"),
        *REPO.glob("book/**/*.md"),
        *REPO.glob("benchmarks/*.py"),
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
    ]
    skip = {Path(__file__).resolve(), REPO / "benchmarks" / "originals.py"}  # originals keep their own names
    found = []
    for f in files:
        if f.resolve() in skip or "_build" in f.parts or ".ipynb_checkpoints" in f.parts:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            for pat in OLD_NAMES:
                if re.search(pat, line) and "orig." not in line:
                    found.append(f"{f.relative_to(REPO)}:{i}: {pat}: {line.strip()[:80]}")
    assert not found, "old names:\n" + "\n".join(found)


def test_every_model_says_what_its_scores_are():
    from capsule_lib import CapsuleOutput

    with pytest.raises(ValueError, match="kind must be one of"):
        CapsuleOutput(torch.zeros(1, 2), "length", torch.zeros(1, 2, 3))
    from capsule_lib.models import CapsNet, SequenceClassifierHead
    from capsule_lib.models.heinsen import SequenceClassifierConfig

    assert CapsNet(TINY)(torch.rand(2, 1, 28, 28)).kind == "lengths"
    cfg = SequenceClassifierConfig(d_depth=3, d_emb=16, d_inp=8, d_out=2, n_parts=6, n_classes=3)
    assert SequenceClassifierHead(cfg)(torch.randn(2, 5, 3, 16)).kind == "logits"
    from capsule_lib.models import EMCapsNet, EMCapsNetConfig

    assert EMCapsNet(EMCapsNetConfig.small())(torch.rand(1, 1, 28, 28)).kind == "activations"


# ------------------------------------------------------------------------------------- one data root
def test_one_data_root_for_the_library_the_chapters_and_the_download_scripts(tmp_path, monkeypatch):
    import importlib.util

    from capsule_lib.data import data_root
    from capsule_lib.notebook import settings

    spec = importlib.util.spec_from_file_location("_download_under_test", REPO / "data_scripts" / "_download.py")
    dl = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, dl)
    spec.loader.exec_module(dl)
    for env in (None, str(tmp_path / "env")):
        for cwd in (REPO / "book", tmp_path):
            monkeypatch.chdir(cwd)
            if env is None:
                monkeypatch.delenv("CAPSULE_DATA", raising=False)
            else:
                monkeypatch.setenv("CAPSULE_DATA", env)
            want = data_root(env).resolve()  # the chapters pass $CAPSULE_DATA down as the root
            assert settings(quiet=True, style=False).data_root == want
            assert dl.default_root().resolve() == want
            assert want == (Path(env) if env else (REPO / "data" if cwd != tmp_path else tmp_path / "data")).resolve()
            assert data_root().resolve() == (REPO / "data" if cwd != tmp_path else tmp_path / "data").resolve()


def test_a_recipe_offline_without_data_trains_on_the_stand_in_and_says_so(tmp_path, capsys):
    empty = tmp_path / "no-data"
    empty.mkdir()
    _, trainer = train(
        "capsnet",
        epochs=1,
        train_subset=64,
        eval_subset=32,
        device="cpu",
        model=TINY,
        data_root=str(empty),
        offline=True,
        out_dir=tmp_path / "run",
        progress=False,
    )
    out = capsys.readouterr().out
    assert "[GENERATED stand-in data] mnist is not available here (offline mode): using 'glyph_digits'" in out
    meta = json.loads((tmp_path / "run" / "history.json").read_text())["meta"]
    assert meta["generated_data"] is True and meta["dataset"] == "glyph_digits" and meta["train_images"] == 64


# ---------------------------------------------------------------------------------- one entry point
def test_make_recipe_applies_overrides_and_names_unknown_fields():
    r = make_recipe("capsnet", epochs="3", lr_decay=0.9, **{"model.iterations": "1", "model__class_dim": 8})
    assert (r.epochs, r.lr_decay, r.model.iterations, r.model.class_dim) == (3, 0.9, 1, 8)
    assert isinstance(r, CapsNetRecipe) and CapsNetRecipe().epochs == 15  # defaults untouched
    assert make_recipe(r, epochs=4).epochs == 4 and r.epochs == 3  # a copy
    with pytest.raises(KeyError, match="CapsNetRecipe has no field 'epoch'; fields: epochs"):
        make_recipe("capsnet", epoch=3)
    with pytest.raises(KeyError, match="unknown recipe 'capsnett'"):
        make_recipe("capsnett")
    assert recipe_config("capsnet", r.config()) == r
    assert set(RECIPES) == {
        "capsnet",
        "baseline_cnn",
        "efficient",
        "efficient_multimnist",
        "capsnet_multimnist",
        "em_norb",
        "baseline_cnn_norb",
        "heinsen_norb",
        "baseline_cnn_norb48",
        "heinsen_sequences",
        "tsai_cifar10",
        "tsai_cifar10_cpu",
        "baseline_backbone_cifar10_cpu",
        "routing_compare_mnist",
        "routing_compare_norb",
        "capsnet_speedrun",
        "baseline_cnn_speedrun",
        "efficient_speedrun",
        "em_norb_speedrun",
        "tsai_cifar10_speedrun",
        "capsnet_multimnist_speedrun",
    }


def _same_kind_of_folder(record: dict, folder: Path) -> str:
    """A folder of random images with the classes, side and channels a run on the reader's images recorded (10
    each); its dataset name."""
    from capsule_lib.data.image_files import write_image_folder

    n, size, c = 10 * len(record["classes"]), record["image_size"], record["channels"]
    images = torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    write_image_folder(images, torch.arange(n) % len(record["classes"]), record["classes"], folder)
    return f"images:{folder}"


@pytest.mark.parametrize("name", sorted(registry()))
def test_shipped_checkpoints_recipes_train_through_the_one_entry_point(name, tmp_path):
    """Each shipped checkpoint's recorded recipe, rebuilt by ``shipped_recipe``, runs a few steps through
    ``train`` on generated data and records the same recipe and model (only the smoke overrides differ)."""
    smoke = {"epochs": 1, "train_subset": 32, "eval_subset": 16, "device": "cpu"}
    shipped = load_pretrained_history(name).meta
    if "images" in shipped:  # trained on a folder of images: a folder of the same classes, size and channels here
        smoke["dataset"] = _same_kind_of_folder(shipped["images"], tmp_path / "images")
    recipe = shipped_recipe(name, **smoke)
    _, trainer = train(
        recipe, data_root=str(tmp_path), offline=True, out_dir=tmp_path / "run", progress=False, test=False
    )
    meta = trainer.history.meta
    assert meta["recipe"] == shipped["recipe"]
    config, recorded = dict(meta["config"]), {**shipped["config"], **smoke}
    # a model field added after the export is recorded now with the default the exported run had implicitly
    later = set(config["model"]) - set(recorded["model"])
    defaults = {"couplings": "routed", "head": "routing", "hidden": (), "hidden_init": "paper", "scaled_votes": False}
    defaults["stem_side"] = None  # #63: the image stem (None: none, the network as exported)
    assert later <= set(defaults), later
    as_read = {k: tuple(v) if isinstance(v := config["model"][k], list) else v for k in later}  # JSON: lists
    assert as_read == {k: defaults[k] for k in later}, as_read
    config["model"] = {k: v for k, v in config["model"].items() if k not in later}
    later_recipe = set(config) - set(recorded)  # likewise a recipe field (the learning-rate warm-up)
    assert later_recipe <= {"warmup_epochs"} and all(config[k] == 0 for k in later_recipe), later_recipe
    config = {k: v for k, v in config.items() if k not in later_recipe}
    assert config == recorded
    assert meta["parameters"] == shipped["parameters"]
    assert len(trainer.history.records) == 1 and trainer.history.records[0]["train_loss"] > 0


def test_the_command_line_trains_a_recipe_with_overrides(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:  # 32 images for one epoch: a run at chance, said and exited with 3
        main(
            [
                "capsnet",
                "--out",
                str(out),
                "--offline",
                "--data-root",
                str(tmp_path),
                "--set",
                "epochs=1",
                "train_subset=32",
                "eval_subset=16",
                "device=cpu",
                "model.conv_channels=8",
                "model.primary_types=4",
                "model.class_dim=8",
                "model.decoder_hidden=[32, 64]",
            ]
        )
    assert e.value.code == 3
    config = json.loads((out / "history.json").read_text())["meta"]["config"]
    assert config["epochs"] == 1 and config["model"]["conv_channels"] == 8
    assert config["model"]["decoder_hidden"] == [32, 64]
    said = capsys.readouterr().out
    assert '"test"' in said and f"{out}: did not learn: validation" in said
    with pytest.raises(SystemExit):
        main(["capsnet", "--out", str(out), "--set", "epoch=1"])
    assert "has no field 'epoch'" in capsys.readouterr().err


#: synonyms of the capsule size retired by CONTRIBUTING.md's glossary ("capsule size")
RETIRED_NAMES = {"d_caps", "d_cap", "capsule_dim", "caps_size", "capsule_size", "d_capsule"}


def test_retired_synonyms_are_not_used():
    """One name per concept: no argument, field, attribute or variable of the library uses a retired synonym."""
    found = []
    for path, module, _ in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [getattr(node, key, None) for key in ("arg", "attr", "id")]
            if isinstance(node, ast.keyword):
                names = [node.arg]
            found += [f"{module}:{node.lineno} {n}" for n in names if n in RETIRED_NAMES]
    assert not found, "retired synonyms (see CONTRIBUTING.md, glossary):\n" + "\n".join(found)
    sample = ast.parse("def f(d_caps): return x.capsule_dim + g(d_cap=1)")
    assert {getattr(n, k, None) for n in ast.walk(sample) for k in ("arg", "attr", "id")} >= {"d_caps", "capsule_dim"}


#: the one check of an option chosen by name (``types`` sits below ``_checks`` and keeps its own)
CHOICE_MESSAGE = re.compile(r"must be one of \{")


def test_options_chosen_by_name_are_checked_in_one_place():
    """``_checks.check_choice`` writes the "must be one of" line for every module (``types`` excepted)."""
    found = [
        f"{module}:{n}"
        for path, module, _ in _modules()
        if module not in ("capsule_lib._checks", "capsule_lib.types")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CHOICE_MESSAGE.search(line)
    ]
    assert not found, "write these with capsule_lib._checks.check_choice:\n" + "\n".join(found)
    assert check_choice("b", ("a", "b"), "kind") == "b"
    with pytest.raises(ValueError, match=r"^kind must be one of \('a', 'b'\), got 'c'$"):
        check_choice("c", ("a", "b"), "kind")
    with pytest.raises(ValueError, match=r"^coupling must be one of \('parents', 'children'\), got 'rows'$"):
        DynamicRouting(4, 2, 3, 3, coupling="rows")


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, key)`` of every ``os.environ[...]``, ``os.environ.get(...)`` and ``os.getenv(...)`` in ``tree``
    (``key`` is ``"?"`` when it is not a string literal)."""
    reads = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("environ.get", "getenv")):
            key = node.args[0] if node.args else None
        else:
            continue
        text = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else "?"
        reads.append((node.lineno, text))
    return reads


def test_only_the_notebook_module_reads_the_capsule_environment_variables():
    """The library below the chapters takes the data root and the offline decision as arguments
    (``DataSource``); ``notebook.environment`` reads ``CAPSULE_*`` once for the chapters and the command line."""
    readers = {}
    for path, module, _ in _modules():
        for line, key in _environment_reads(ast.parse(path.read_text())):
            if key.startswith("CAPSULE_") or key == "?" or "environ" in key:
                readers.setdefault(module, []).append(f"{key} (line {line})")
    assert set(readers) == {"capsule_lib.notebook"}, f"CAPSULE_* read outside capsule_lib.notebook: {readers}"
    sample = ast.parse("import os\nos.environ.get('CAPSULE_X')\nos.getenv(k)\nos.environ['CAPSULE_Y']\n")
    assert _environment_reads(sample) == [(2, "CAPSULE_X"), (3, "?"), (4, "CAPSULE_Y")]  # the detector works


def test_the_library_ignores_the_environment_below_the_notebook(tmp_path, monkeypatch):
    from capsule_lib.data import DatasetUnavailableError, data_root, get_dataset

    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    monkeypatch.setenv("CAPSULE_DATA", str(tmp_path / "env"))
    monkeypatch.chdir(tmp_path)
    assert data_root() == tmp_path / "data"  # not $CAPSULE_DATA
    with pytest.raises(DatasetUnavailableError):  # not offline: no stand-in unless asked for
        get_dataset("mnist", tmp_path, "test", download=False)
    assert get_dataset("mnist", tmp_path, "test", offline=True, n=8).standin_for == "mnist"


def test_the_command_line_takes_its_data_defaults_from_the_environment(tmp_path):
    """``python -m capsule_lib.train`` is the command line's one reader of ``CAPSULE_DATA`` / ``CAPSULE_OFFLINE``
    (through ``notebook.environment``): offline with an empty data root it trains on the stand-in."""
    import os
    import subprocess

    env = {**os.environ, "CAPSULE_OFFLINE": "1", "CAPSULE_DATA": str(tmp_path / "empty"), "OMP_NUM_THREADS": "1"}
    small = ["model.conv_channels=8", "model.primary_types=4", "model.class_dim=8", "model.decoder_hidden=[32, 64]"]
    cmd = [sys.executable, "-m", "capsule_lib.train", "capsnet", "--out", str(tmp_path / "run"), "--set", "epochs=1"]
    cmd += ["train_subset=32", "eval_subset=16", "device=cpu", *small]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 3, res.stderr[-2000:]  # 32 images for one epoch: it trained, and did not learn
    assert "mnist is not available here (offline mode): using 'glyph_digits'" in res.stdout
    assert json.loads((tmp_path / "run" / "history.json").read_text())["meta"]["dataset"] == "glyph_digits"


def test_every_public_module_is_in_the_library_reference():
    documented = set(re.findall(r"automodule:: (capsule_lib[\w.]*)", (REPO / "book/appendix/api.md").read_text()))
    public = {
        m
        for path, m, _ in _modules()
        if path.name != "__init__.py"
        and not any(part.startswith("_") for part in m.split("."))  # routing._kernels
        and m not in SHIMS  # an entry module: its command is documented
    }
    assert public - documented == set(), f"missing from book/appendix/api.md: {sorted(public - documented)}"
