"""The package's shape, read from its source with ast: no import cycle anywhere in diag/, and the analyzer
(diag/capture) in files and functions a reader can hold in mind.

An import counts wherever it is written (a function-local import hides a cycle, it does not remove it),
except under ``if TYPE_CHECKING:``, which never runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "diag"
CAPTURE = PACKAGE / "capture"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_CAPTURE_LINES = 4600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node outside `if TYPE_CHECKING:` blocks."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The diag modules that module `name` imports (a name imported from a package that is itself a module
    counts as that module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import diag.capture.reader` names the module itself
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("diag"):
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_import_cycle() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    # A package's __init__ is imported before any of its modules: an edge from a module to its own package
    # is not a choice the module makes, so it is left out (a package that imports its modules eagerly and is
    # imported back would still show through the modules' other edges).
    for name, targets in graph.items():
        targets -= {parent for parent in targets if name.startswith(parent + ".")}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_cycle_finder_sees_a_cycle(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_capture_files_and_functions_are_small() -> None:
    long_files, long_functions, total = [], [], 0
    for path in sorted(CAPTURE.glob("*.py")):
        lines = len(path.read_text().splitlines())
        total += lines
        if lines > MAX_FILE_LINES:
            long_files.append(f"{path.name} ({lines})")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.name}:{node.lineno} {node.name} ({length})")
    assert not long_files, f"diag/capture files over {MAX_FILE_LINES} lines: {', '.join(long_files)}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(long_functions)}"
    assert total <= MAX_CAPTURE_LINES, f"diag/capture holds {total} lines of Python (at most {MAX_CAPTURE_LINES})"


# What runs experiments: the report reads the files they write through the schemas (records, trialspec,
# runinfo, advisefile, capture.schema), never through these.
RUNNERS = ("diag.trial", "diag.external", "diag.worker", "diag.harness", "diag.plan", "diag.runplan", "diag.launch", "diag.inplace",
           "diag.advise", "diag.reproduce", "diag._sweep", "diag.cli")


def test_the_report_imports_schemas_never_runners() -> None:
    known = modules()
    found = {name: sorted(t for t in imports(name, path, known) if any(t == r or t.startswith(f"{r}.") for r in RUNNERS))
             for name, path in known.items() if name.startswith("diag.report")}
    assert {name: runners for name, runners in found.items() if runners} == {}


def test_benchmarks_are_not_shipped_in_the_package() -> None:
    """The wheel holds diag/ only; the benchmark commands live beside it, run from a checkout."""
    assert not (PACKAGE / "bench").exists() and (PACKAGE.parent / "bench" / "fault_scenarios.py").is_file()
    assert 'include = ["diag*"]' in (PACKAGE.parent / "pyproject.toml").read_text()
    assert not [name for name in modules() if ".bench" in name]
