"""The house rules of ``hetgmp/`` (issue 29), checked on the source text alone (no import runs):

* no import cycle between modules, counting imports inside functions and those made only for
  type checking (``if TYPE_CHECKING:``), since either kind is a loop in the design even when
  Python tolerates it at run time;
* no file over ``MAX_FILE_LINES`` lines and no function (methods included) over
  ``MAX_FUNCTION_LINES``, from its ``def`` line to the last line of its body;
* the "Import arrows" block of ``docs/architecture.md``: every arrow it states exists in the
  code, every import between top-level packages follows its ``layers:`` line, and a package
  named on its ``surface:`` line is imported from outside only as the package (its
  ``__init__``), never by its modules.

How imports count: ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) import
``a.b.c``; ``from a.b import name`` (not a submodule) imports ``a.b``; importing a module also
imports the packages above it, except the importer's own (a module always runs inside its
package: that is containment, not an import it makes). ``importlib.import_module`` of a
literal name counts as an import.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hetgmp"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
# Compiled modules (built from src/, absent from a source checkout): leaves of the graph.
EXTENSION_MODULES = {"hetgmp._native"}

# Known exceptions, each to be removed once fixed (the tests fail if one no longer applies).
KNOWN_CYCLES: list[set[str]] = []
# Functions over the limit when the rule came in, at their length then (they may shrink).
KNOWN_LONG_FUNCTIONS: dict[str, int] = {}


@dataclasses.dataclass(frozen=True)
class Source:
    """One module of the package: its dotted name, path, text and syntax tree."""

    name: str
    path: Path
    text: str
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@functools.cache
def sources() -> dict[str, Source]:
    """Every module under ``hetgmp/`` by dotted name (parsed once per session)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text()
        out[".".join(parts)] = Source(".".join(parts), path, text, ast.parse(text))
    return out


def _imported(src: Source, node: ast.AST) -> Iterator[str]:
    """The names ``node`` imports explicitly (see the module docstring), resolved."""
    mods = sources()
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # (relative: from the importer's package up)
            pkg = src.name if src.is_package else src.name.rpartition(".")[0]
            for _ in range(node.level - 1):
                pkg = pkg.rpartition(".")[0]
            base = f"{pkg}.{base}" if base else pkg
        for a in node.names:
            sub = f"{base}.{a.name}"
            yield sub if sub in mods or sub in EXTENSION_MODULES else base
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        yield node.args[0].value


def _nearest_module(name: str) -> str | None:
    """``name`` or its nearest enclosing module that exists (a namespace folder has none)."""
    while name and name not in sources():
        name = name.rpartition(".")[0]
    return name or None


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the package's modules it imports, anywhere in its text."""
    graph = {}
    for name, src in sources().items():
        own = set(_ancestors(name))
        out: set[str] = set()
        for node in ast.walk(src.tree):
            for target in _imported(src, node):
                if target in EXTENSION_MODULES or not _within(target, ""):
                    continue
                mod = _nearest_module(target)
                if mod is None:
                    continue
                out.add(mod)
                out.update(a for a in _ancestors(mod) if a in sources() and a not in own)
        out.discard(name)
        graph[name] = frozenset(out)
    return graph


def strongly_connected(graph: dict[str, frozenset[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


# ---------------------------------------------------------------------------- the rules
def test_the_graph_sees_lazy_and_type_only_imports() -> None:
    """(The checker itself) an import inside a function, one under ``TYPE_CHECKING`` and a
    literal ``importlib.import_module`` are all edges; a cycle is found."""
    g = import_graph()
    assert "hetgmp.embedding.rowservice" in g["hetgmp.train.run"]  # (in async_config())
    assert "hetgmp.embedding.rowservice" in g["hetgmp.train.work_steal"]  # (TYPE_CHECKING)
    assert "hetgmp.models.cross_triton" in g["hetgmp.models.cross"]  # (importlib)
    loop = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert strongly_connected(loop) == [{"a", "b", "c"}]


def test_no_import_cycle() -> None:
    cycles = strongly_connected(import_graph())
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import cycles in hetgmp/: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"fixed: remove from KNOWN_CYCLES: {gone}"


def test_no_file_over_the_limit() -> None:
    long = {}
    for s in sources().values():
        n = len(s.text.splitlines())
        if n > MAX_FILE_LINES:
            long[str(s.path.relative_to(ROOT))] = n
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """``(qualified name, lines)`` of every function under ``node``, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            yield name, child.end_lineno - child.lineno + 1  # (def line to body's last)
            yield from _functions(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def test_no_function_over_the_limit() -> None:
    long, seen = {}, set()
    for s in sources().values():
        for name, n in _functions(s.tree):
            key = f"{s.path.relative_to(ROOT)}::{name}"
            if n > MAX_FUNCTION_LINES:
                seen.add(key)
                if n > KNOWN_LONG_FUNCTIONS.get(key, MAX_FUNCTION_LINES):
                    long[key] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (or longer than known): {long}"
    fixed = sorted(set(KNOWN_LONG_FUNCTIONS) - seen)
    assert not fixed, f"within the limit now: remove from KNOWN_LONG_FUNCTIONS: {fixed}"


# ---------------------------------------------------------------------------- the arrows
@dataclasses.dataclass
class Arrows:
    """The "Import arrows" block of the architecture page (names relative to ``hetgmp``)."""

    layers: list[list[str]]  # lowest level first
    surfaces: list[str]
    arrows: list[tuple[str, str, int]]  # (importer, imported, line in the page)


def parse_arrows(text: str) -> Arrows:
    """The first fenced block under a heading ``Import arrows``: ``layers: a, b < c < ...``,
    ``surface: p, q`` and ``a -> b, c`` lines; ``#`` starts a comment."""
    m = re.search(r"^#+ Import arrows\s*$.*?^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    assert m, f"{ARCHITECTURE}: no fenced block under a heading 'Import arrows'"
    first = text[: m.start(1)].count("\n") + 1
    out = Arrows([], [], [])
    for i, raw in enumerate(m.group(1).splitlines()):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("layers:"):
            levels = line.removeprefix("layers:").split("<")
            out.layers = [[p.strip() for p in lv.split(",")] for lv in levels]
        elif line.startswith("surface:"):
            out.surfaces = [p.strip() for p in line.removeprefix("surface:").split(",")]
        else:
            lhs, sep, rhs = line.partition("->")
            assert sep, f"{ARCHITECTURE}:{first + i}: not an arrow: {raw!r}"
            out.arrows += [(lhs.strip(), b.strip(), first + i) for b in rhs.split(",")]
    return out


def _within(module: str, name: str) -> bool:
    """``module`` is ``hetgmp.<name>`` or inside it (``name`` "": the whole package)."""
    full = f"hetgmp.{name}" if name else "hetgmp"
    return module == full or module.startswith(full + ".")


def _top(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


@functools.cache
def stated() -> Arrows:
    return parse_arrows(ARCHITECTURE.read_text())


def test_every_stated_arrow_exists() -> None:
    graph, names = import_graph(), sources()
    arrows = stated().arrows
    assert len(arrows) > 20  # (the block was found and read)
    false = []
    for a, b, line in arrows:
        for n in (a, b):
            assert any(_within(m, n) for m in names), f"architecture.md:{line}: no module {n}"
        if not any(_within(m, a) and any(_within(t, b) for t in graph[m]) for m in graph):
            false.append(f"architecture.md:{line}: {a} -> {b}")
    assert not false, f"arrows the code does not have: {false}"


def test_imports_follow_the_stated_layers() -> None:
    layers = stated().layers
    level = {p: i for i, lv in enumerate(layers) for p in lv}
    assert len(level) >= 6 and all((PKG / p).is_dir() for p in level), layers
    against = []
    for m, targets in import_graph().items():
        for t in targets:
            a, b = _top(m), _top(t)
            if a != b and a in level and b in level and level[b] >= level[a]:
                against.append(f"{m} -> {t}")
    assert not against, f"imports against the layers {layers}: {sorted(against)}"


def test_surfaces_are_imported_as_their_package() -> None:
    surfaces = stated().surfaces
    assert surfaces and all((PKG / p.replace(".", "/") / "__init__.py").is_file() for p in surfaces)
    inside = []
    for m, targets in import_graph().items():
        for p in surfaces:
            if _within(m, p):
                continue
            inside += [f"{m} -> {t}" for t in targets if _within(t, p) and t != f"hetgmp.{p}"]
    assert not inside, f"modules of a public surface imported from outside: {sorted(inside)}"
