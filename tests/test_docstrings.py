"""The library's docstrings are valid reStructuredText (the API appendix renders them with ``-W``: a malformed
table or list there fails the book build after every notebook has run; here it fails in a second)."""

import importlib
import inspect
import io
import pkgutil
import re

import docutils.core
import docutils.utils
import pytest
from docutils.parsers.rst import roles

import capsule_lib

SPHINX_ROLES = ("class", "func", "meth", "mod", "attr", "data", "obj", "exc", "cite", "doc", "ref", "math")
for _role in SPHINX_ROLES:
    roles.register_generic_role(_role, docutils.nodes.literal)

#: a cross-reference role naming a private name (no target in the rendered API: fails the build under -n)
PRIVATE_REF = re.compile(r":(?:class|func|meth|attr|data|obj):`~?(?:[\w.]+\.)?_\w+`")

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(capsule_lib.__path__, "capsule_lib.")
    if not m.name.split(".")[-1].startswith("_")
)


def _docstrings(module):
    yield module.__name__, inspect.getdoc(module)
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", inspect.getdoc(obj)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, classmethod)):
                    fn = member.__func__ if isinstance(member, classmethod) else member
                    yield f"{module.__name__}.{name}.{attr}", inspect.getdoc(fn)


def _rst_problems(text: str) -> list[str]:
    """docutils' warnings and errors (what ``-W`` fails on) for one docstring, one line each."""
    stream = io.StringIO()
    settings = {"report_level": 2, "halt_level": 5, "warning_stream": stream}
    docutils.core.publish_doctree(text, settings_overrides=settings)
    return [
        line for line in stream.getvalue().splitlines() if any(f"({k}/" in line for k in ("WARNING", "ERROR", "SEVERE"))
    ]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstrings_are_valid_rst(module_name):
    module = importlib.import_module(module_name)
    bad = []
    for where, doc in _docstrings(module):
        if doc:
            bad += [f"{where}: {p}" for p in _rst_problems(doc)]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_malformed_table():
    table = "=====  =====\nname   value\n=====  =====\n``a_long_name``  1\n=====  =====\n"
    assert any("Malformed table" in p for p in _rst_problems(table))


@pytest.mark.parametrize("module_name", MODULES)
def test_public_docstrings_do_not_cross_reference_private_names(module_name):
    """The API appendix renders public docstrings with ``-n``: a role such as :class:`_Private` has no target there
    and fails the strict build (write private names as ``_Private``)."""
    module = importlib.import_module(module_name)
    bad = [f"{where}: {m}" for where, doc in _docstrings(module) if doc for m in PRIVATE_REF.findall(doc)]
    assert not bad, "\n".join(bad)


def test_the_private_reference_check_has_teeth():
    assert PRIVATE_REF.findall("uses :class:`_FusedRouting` and :func:`capsule_lib.x._helper`")
    assert not PRIVATE_REF.findall("uses :class:`DynamicRouting` and ``_FusedRouting``")


#: the packages whose public functions and classes document every parameter and result in numpydoc sections
SECTIONED = ("capsule_lib.routing.", "capsule_lib.layers.", "capsule_lib.models.")


def _missing_sections(name: str, obj) -> list[str]:
    """What ``obj``'s docstring lacks: ``Parameters`` (or a dataclass's ``Attributes``) when it takes arguments,
    ``Returns`` when a function returns something. A class's ``Parameters`` describe its ``__init__``."""
    import dataclasses

    doc = inspect.getdoc(obj) or ""
    has = {s for s in ("Parameters", "Attributes", "Returns") if re.search(rf"^{s}\n-+$", doc, re.M)}
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            return [] if dataclasses.fields(obj) == () or "Attributes" in has else ["Attributes"]
        params = [p for p in inspect.signature(obj.__init__).parameters if p not in ("self", "args", "kwargs")]
        return [] if not params or "Parameters" in has else ["Parameters"]
    sig = inspect.signature(obj)
    missing = [] if not sig.parameters or "Parameters" in has else ["Parameters"]
    if sig.return_annotation not in (None, "None", inspect.Signature.empty) and "Returns" not in has:
        missing.append("Returns")
    return missing


def test_routing_layers_and_models_document_parameters_and_results_in_numpydoc():
    """CONTRIBUTING: every public function and class of routing/, layers/ and models/ (and the training entry
    point) has numpydoc sections; the reference forms (``*_reference``, the chapters' short definitions, <= 45
    lines) are exempt: their public twin documents the same arguments."""
    from capsule_lib.train.run import train

    gaps = [] if not _missing_sections("train", train) else ["capsule_lib.train.run.train"]
    for module_name in MODULES:
        if not module_name.startswith(SECTIONED) or "._kernels." in module_name:  # kernels: private
            continue
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if name.startswith("_") or name.endswith("_reference") or getattr(obj, "__module__", None) != module_name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                gaps += [f"{module_name}.{name}: no {s}" for s in _missing_sections(name, obj)]
    assert not gaps, "missing numpydoc sections:\n" + "\n".join(gaps)
