"""No import cycles between troupe's modules, lazy imports (inside functions) included; and every
package imports only what its ``__init__`` docstring says it may (``rules`` reads the phrases).

Every module of src/ (``troupe``) and tools/ (``troupe.cli``) is parsed with ``ast``; each import
it can run is an edge to the troupe module it loads. ``from pkg import name`` counts as an import
of ``pkg.name`` where that is a module, else of ``pkg``. Importing ``a.b.c`` runs ``a`` and
``a.b`` first, but that is not counted: a package's ``__init__`` may import its own modules, and
is only in a cycle with them if one of them imports the package back (``from troupe.runtime import
Actor`` inside the runtime): modules import their siblings directly, not through the package.
Imports under ``if TYPE_CHECKING:`` never run and are not counted; ``importlib.import_module``
with a literal name is.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, TypeGuard

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"troupe": ROOT / "src", "troupe.cli": ROOT / "tools"}


def _modules() -> dict[str, Path]:
    """Every troupe module (packages under their own name) and its file."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom | ast.Call]:
    """The imports in ``node`` that can run, at any depth, skipping ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(other)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom) or _is_import_module(child):
            yield child
        yield from _import_nodes(child)


def _is_import_module(node: ast.AST) -> TypeGuard[ast.Call]:
    """A call of ``importlib.import_module`` (or of ``import_module`` imported from there)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def _base(module: str, level: int, name: str | None) -> str:
    """What ``from <level dots><name> import ...`` in ``module`` names."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


def _owner(name: str) -> str | None:
    """The troupe module ``name`` loads: itself, or the nearest enclosing module that exists."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str) -> set[str]:
    """The troupe modules ``module`` can import (at load time or lazily), itself left out."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), str(MODULES[module]))
    names: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node.level, node.module) if node.level else (node.module or "")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in MODULES else base)
        elif node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            target = node.args[0].value
            if target.startswith("."):
                level = len(target) - len(target.lstrip("."))
                target = _base(module, level, target.lstrip(".") or None)
            names.add(target)
    found = {owner for name in names if (owner := _owner(name)) is not None}
    found.discard(module)
    return found


def graph() -> dict[str, set[str]]:
    return {module: imports(module) for module in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth: at most the number of modules (~200)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(component: list[str], edges: dict[str, set[str]]) -> str:
    inside = set(component)
    lines = [f"  {m} -> {', '.join(sorted(edges[m] & inside))}" for m in component]
    return "cycle of {}:\n{}".format(len(component), "\n".join(lines))


def test_the_walk_sees_every_module_and_its_lazy_imports() -> None:
    assert "troupe.runtime.core.actor" in MODULES and "troupe.cli.main" in MODULES
    assert MODULES["troupe.runtime"].name == "__init__.py"
    # a package's re-exports are edges to its modules; relative and absolute imports resolve
    assert "troupe.runtime.core.actor" in imports("troupe.runtime")
    assert {"troupe.runtime.core.actor", "troupe.runtime.errors"} <= imports("troupe.runtime.core.cell")
    assert "troupe.cli.commands.run_pipeline" in imports("troupe.cli.preflight")  # a lazy one


def test_the_walk_reads_every_kind_of_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import c\n"
        "def f():\n    from .b import B\n    import importlib\n    importlib.import_module('troupe.x.d')\n"
    )
    (pkg / "b.py").write_text("from . import a\nfrom troupe.x import A\n")
    (pkg / "c.py").write_text("import troupe.x.a\n")
    (pkg / "d.py").write_text("")
    monkeypatch.setattr(
        f"{__name__}.MODULES",
        {"troupe.x": pkg / "__init__.py", **{f"troupe.x.{m}": pkg / f"{m}.py" for m in "abcd"}},
    )
    edges = graph()
    assert edges == {
        "troupe.x": {"troupe.x.a"},
        "troupe.x.a": {"troupe.x.b", "troupe.x.d"},  # lazy ones; not c, for type checking only
        "troupe.x.b": {"troupe.x", "troupe.x.a"},  # a submodule by name; A through the package
        "troupe.x.c": {"troupe.x.a"},
        "troupe.x.d": set(),
    }
    assert cycles(edges) == [["troupe.x", "troupe.x.a", "troupe.x.b"]]


def test_no_import_cycles() -> None:
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles (module -> what it imports in the cycle):\n" + "\n".join(
        _describe(c, edges) for c in found
    )


# -- what each package says it may import ---------------------------------------------------------------

PACKAGE_NAMES = sorted(m for m, path in MODULES.items() if path.name == "__init__.py")


def _docstring(package: str) -> str:
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split())


def _resolve(package: str, name: str) -> str:
    """A name a docstring uses for a module or package: dotted from ``troupe``, a module of the
    package itself, or a sibling of the package or of one of its parents (``node``, ``errors``)."""
    if name.startswith("troupe"):
        return name
    if f"{package}.{name}" in MODULES:
        return f"{package}.{name}"
    parent = package.rpartition(".")[0]
    while parent:
        if f"{parent}.{name}" in MODULES:
            return f"{parent}.{name}"
        parent = parent.rpartition(".")[0]
    raise AssertionError(f"{package}'s docstring names {name!r}, which is no troupe module")


def _names(text: str) -> list[str]:
    """``a, b or c`` / ``a, b and c`` as a list (double backquotes dropped)."""
    return [n.strip("` ") for n in re.split(r",\s*|\s+or\s+|\s+and\s+", text) if n.strip("` ")]


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class Rule(NamedTuple):
    modules: frozenset[str]  # the modules it binds
    forbidden: frozenset[str]  # what none of them may import (modules or packages)
    allowed: frozenset[str]  # if not empty: all they may import (their own package included)


def _package_modules(package: str) -> set[str]:
    return {m for m in MODULES if _inside(m, package)}


def rules(package: str) -> list[Rule]:
    """The import rules ``package``'s docstring states, read from these phrases:

    - "nothing from a, b or c[, except ``m``, ...]": no module of the package imports anything of
      a, b or c (siblings, or dotted names), except module ``m`` (an exception "for type checking
      only" exempts nothing: such imports are not edges);
    - "Imports X only": the package imports nothing outside itself but X;
    - "``m`` and ``n`` import(s) only X": modules m and n import nothing but X and each other;
    - "nothing of the runtime imports it": no other module of troupe.runtime imports the package.
    """
    doc = _docstring(package)
    mine = _package_modules(package)
    found: list[Rule] = []
    for match in re.finditer(r"[Nn]othing from (.+?)(?:[.;](?:\s|$)|$)", doc):
        listed, _, exception = match.group(1).partition(", except")
        exempt = set() if "type checking" in exception else set(re.findall(r"``(\w+)``", exception))
        forbidden = frozenset(_resolve(package, n) for n in _names(listed))
        modules = mine - {m for name in exempt for m in _package_modules(f"{package}.{name}")}
        found.append(Rule(frozenset(modules), forbidden, frozenset()))
    for match in re.finditer(r"Imports (troupe(?:\.\w+)*) only", doc):
        found.append(
            Rule(frozenset(mine), frozenset(), frozenset(mine | {_resolve(package, match.group(1))}))
        )
    for match in re.finditer(r"((?:``\w+``(?:,\s*|\s+and\s+)?)+) imports? only (\w+(?:\.\w+)*)", doc):
        group = frozenset(_resolve(package, name) for name in re.findall(r"``(\w+)``", match.group(1)))
        found.append(Rule(group, frozenset(), group | {_resolve(package, match.group(2))}))
    if "nothing of the runtime imports it" in doc:
        others = _package_modules("troupe.runtime") - mine
        found.append(Rule(frozenset(others), frozenset({package}), frozenset()))
    return found


def broken_rules(edges: dict[str, set[str]]) -> list[str]:
    broken = []
    for package in PACKAGE_NAMES:
        for rule in rules(package):
            for module in sorted(rule.modules):
                for target in sorted(edges[module]):
                    if any(_inside(target, f) for f in rule.forbidden) or (
                        rule.allowed and not any(_inside(target, a) for a in rule.allowed)
                    ):
                        broken.append(f"{module} imports {target}, against {package}'s docstring")
    return broken


def test_every_package_says_what_it_is_and_may_import() -> None:
    vague = [p for p in PACKAGE_NAMES if len(_docstring(p)) < 40 or "import" not in _docstring(p).lower()]
    assert vague == [], "packages whose __init__ docstring does not say what they are and may import"


def test_the_docstrings_rules_are_read() -> None:
    (wire,) = rules("troupe.runtime.wire")
    assert "troupe.runtime.errors" in wire.allowed and "troupe.runtime.wire.codec" in wire.modules
    forbidden = set().union(*(r.forbidden for r in rules("troupe.runtime.transports")))
    assert {"troupe.runtime.node", "troupe.runtime.tasks", "troupe.runtime.testing"} <= forbidden
    (pure,) = [r for r in rules("troupe.runtime.supervision") if r.allowed]
    assert "troupe.runtime.supervision.liveness" in pure.modules
    assert pure.allowed == pure.modules | {"troupe.runtime.errors"}
    exempt = [r for r in rules("troupe.actors.lerobot") if "troupe.actors.datagen" in r.forbidden]
    assert exempt and "troupe.actors.lerobot.flaky_writer" not in exempt[0].modules


def test_packages_import_only_what_their_docstrings_allow() -> None:
    broken = broken_rules(graph())
    assert broken == [], "\n".join(broken)


def test_the_runtime_imports_no_domain_code() -> None:
    """troupe.runtime: "No domain words, no torch": nothing of actors, models or the CLI."""
    edges = graph()
    runtime = _package_modules("troupe.runtime")
    domain = ("troupe.actors", "troupe.models", "troupe.cli")
    wrong = sorted(f"{m} -> {t}" for m in runtime for t in edges[m] if any(_inside(t, d) for d in domain))
    assert wrong == []
