"""No module of rljax (kernels/ included, as rljax.kernels) takes part in an import cycle.

The graph is read from the source, not by importing it: an edge A -> B for every ``import B``
or ``from B import x`` (or ``from A's package import B``) in A. Two graphs are checked:

- import time: the imports that run when A is imported (module level, outside
  ``if TYPE_CHECKING:``). A cycle here breaks on import order.
- deferred too: imports inside functions count as well. An import moved into a function to
  dodge a cycle still ties the two modules into one (models/sharding.py imported the
  Decoder from models/transformer.py that way). Only a module's ``__getattr__`` (PEP 562) is
  left out: it is how a package resolves its public names lazily, and it closes no loop of
  code that calls back and forth. ``if TYPE_CHECKING:`` imports are left out of both: they
  never run, and naming a collaborator's type (the run a hosting builds parts for) is how
  two modules that call each other through a Protocol are annotated.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Each importable package prefix and the folder that holds it (see pyproject.toml's
# package-dir: rljax.kernels lives in the top-level kernels/ folder).
PACKAGE_DIRS = {"rljax": ROOT / "rljax", "rljax.kernels": ROOT / "kernels"}


def package_modules(package_dirs=None) -> dict[str, pathlib.Path]:
    """Every module name under the package folders, mapped to its source file."""
    modules = {}
    for prefix, folder in (package_dirs or PACKAGE_DIRS).items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((prefix, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body):
    """The import statements of ``body`` that run at import time (not in defs or TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_time_statements(block)
            for handler in node.handlers:
                yield from _import_time_statements(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            # A class body runs at import time, so its imports count.
            yield from _import_time_statements(node.body)


def _all_statements(body):
    """Every import statement in ``body`` that can run, in functions too, except a module's
    __getattr__; an ``if TYPE_CHECKING:`` block never runs (types only)."""
    for top in body:
        if isinstance(top, ast.FunctionDef) and top.name == "__getattr__":
            continue
        if isinstance(top, ast.If) and _is_type_checking(top.test):
            yield from _all_statements(top.orelse)
            continue
        for node in ast.walk(top):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


def module_imports(name: str, path: pathlib.Path, known: set[str], deferred=False) -> set[str]:
    """The package modules that ``name`` imports directly (at import time, or also deferred)."""
    is_package = path.name == "__init__.py"
    body = ast.parse(path.read_text(), str(path)).body
    out = set()
    for node in (_all_statements if deferred else _import_time_statements)(body):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
            continue
        base = node.module or ""
        if node.level:
            anchor = name.split(".")
            anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            # `from pkg import sub` imports the submodule; `from mod import fn` imports mod.
            target = f"{base}.{alias.name}"
            out.add(target if target in known else base)
    return {m for m in out if m in known and m != name}


def import_graph(package_dirs=None, *, deferred=False) -> dict[str, set[str]]:
    """Module name -> the package modules it imports (see the module docstring)."""
    modules = package_modules(package_dirs)
    known = set(modules)
    return {name: module_imports(name, path, known, deferred) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None; deterministic (sorted traversal)."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node):
        colour[node] = grey
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt, black) == grey:
                return [*stack[stack.index(nxt) :], nxt]
            if colour.get(nxt) == white and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_the_packages_and_their_edges():
    graph = import_graph()
    assert "rljax.kernels.flash_attention.ops" in graph
    assert "rljax.models.transformer" in graph
    assert "rljax.models.sharding" in graph["rljax.models.transformer"]


@pytest.mark.parametrize("deferred", [False, True], ids=["import_time", "deferred_too"])
def test_no_import_cycle_in_rljax_or_kernels(deferred):
    cycle = find_cycle(import_graph(deferred=deferred))
    assert cycle is None, (
        "import cycle: " + " -> ".join(cycle) + "; move the piece both modules need into the "
        "lower one (or a new module both import) instead of importing back up."
    )


def _write(folder: pathlib.Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_is_found_through_from_imports_relative_imports_and_packages(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.sub import b\n",
            "sub/__init__.py": "",
            "sub/b.py": "from ..c import helper\n",
            "c.py": "import pkg.a\n\ndef helper():\n    pass\n",
        },
    )
    cycle = find_cycle(import_graph({"pkg": tmp_path}))
    assert cycle == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]


def test_deferred_imports_count_only_in_the_deferred_graph(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "def __getattr__(name):\n    from pkg import a\n    return a\n",
            "a.py": "import pkg.b\nimport pkg\n",
            "b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n\n"
                "def late():\n    from pkg import a\n    return a\n"
            ),
        },
    )
    graph = import_graph({"pkg": tmp_path})
    assert graph["pkg.a"] == {"pkg.b", "pkg"} and graph["pkg.b"] == set()
    assert find_cycle(graph) is None
    # The function-level import closes a cycle; the package's lazy __getattr__ does not.
    deferred = import_graph({"pkg": tmp_path}, deferred=True)
    assert deferred["pkg"] == set()
    assert find_cycle(deferred) == ["pkg.a", "pkg.b", "pkg.a"]


def test_type_checking_imports_count_in_neither_graph(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "import pkg.b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
                "else:\n    import pkg.c\n"
            ),
            "c.py": "def late():\n    import pkg.a\n",
        },
    )
    assert find_cycle(import_graph({"pkg": tmp_path})) is None
    deferred = import_graph({"pkg": tmp_path}, deferred=True)
    assert deferred["pkg.b"] == {"pkg.c"}  # the else branch runs; the TYPE_CHECKING one never
    assert find_cycle(deferred) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
