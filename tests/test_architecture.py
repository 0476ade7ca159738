"""The shape of the code: the package layers, no import circles, modules cut by concept (a warning past 800 lines).

The layers and the circle rule for ``ragen`` and ``ragen_external`` are import-linter contracts in pyproject.toml
(``[tool.importlinter]``; the layer order and the reason for each place are on docs/design.md, "Package layers").
Every import counts, those inside functions included. The scripts of bench/ and scripts/ import each other by file
name, outside any package: their circles are found here from the files' syntax trees.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 800  # a warning: likely more than one concept
HARD_MAX_LINES = 1200  # a failure
LINE_LIMIT_FOLDERS = ("ragen", "external", "bench", "scripts", "tests")
SCRIPT_FOLDERS = ("bench", "scripts")
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint_imports(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` (import-linter, the ``dev`` extra) in ``cwd``, no cache folder written."""
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed: pip install -e '.[dev]' (it checks the package layers)")
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    """pyproject.toml's contracts: ragen's packages are layered (the run layer ``ragen.trainer`` below both algorithm
    families, ``ragen.ppo`` and ``ragen.archer``), the config package imports nothing that starts or runs anything,
    no package or module circles at any depth, ragen does not import ragen_external. A broken contract prints each
    offending import with its line."""
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in proc.stdout, proc.stdout[-3000:]


def test_layers_contract_catches_an_upward_import_inside_a_function(tmp_path):
    """The check can fail: a lower layer importing a higher one inside a function body breaks a layers contract,
    and the report names the import and its line."""
    pkg = tmp_path / "toypkg"
    for name, body in {"__init__.py": "", "high.py": "X = 1\n",
                       "low.py": "def f():\n    from toypkg.high import X\n\n    return X\n"}.items():
        (pkg / name).parent.mkdir(exist_ok=True)
        (pkg / name).write_text(body)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_packages = ["toypkg"]

        [[tool.importlinter.contracts]]
        name = "toy layers"
        type = "layers"
        layers = ["toypkg.high", "toypkg.low"]
        """))
    proc = _lint_imports(tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "toypkg.low -> toypkg.high (l.2)" in proc.stdout, proc.stdout[-3000:]


def module_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each an import circle), sorted; ``edges``:
    importer -> imported modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_module_circles_are_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert module_circles(edges) == [["a", "b", "c"]]
    assert module_circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    """No circle between any modules of ragen or ragen_external, a package and its own modules included (a module
    importing its package's ``__init__``, which imports the module): the contracts compare siblings only."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter: pip install -e '.[dev]'")
    graph = grimp.build_graph("ragen", "ragen_external", cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    problems = []
    for circle in module_circles(edges):
        for a in circle:
            for b in sorted(edges[a] & set(circle)):
                lines = [d["line_number"] for d in graph.get_import_details(importer=a, imported=b)]
                problems.append(f"{a} (line {', '.join(map(str, lines))}) imports {b}")
    assert not problems, "import circle(s):\n" + "\n".join(problems)


def script_imports(folder: Path) -> dict[str, dict[str, int]]:
    """For each script of ``folder``: the sibling scripts it imports (by module name, as ``sys.path`` holds the
    folder when it runs) and the line of the first such import, function bodies included."""
    names = {p.stem for p in folder.glob("*.py")}
    out: dict[str, dict[str, int]] = {}
    for path in sorted(folder.glob("*.py")):
        found: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module.split(".")[0]]
            else:
                continue
            for t in targets:
                if t in names and t != path.stem:
                    found[t] = min(found.get(t, node.lineno), node.lineno)
        out[path.stem] = found
    return out


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_no_circles_between_scripts(folder):
    imports = script_imports(ROOT / folder)
    edges = {k: set(v) for k, v in imports.items()}
    problems = [f"{folder}/{a}.py (line {imports[a][b]}) imports {b}"
                for circle in module_circles(edges) for a in circle for b in sorted(edges[a] & set(circle))]
    assert not problems, "import circle(s):\n" + "\n".join(problems)


def test_script_circle_is_reported(tmp_path):
    (tmp_path / "one.py").write_text("import two\n")
    (tmp_path / "two.py").write_text("def f():\n    from one import g\n")
    (tmp_path / "three.py").write_text("import one\n")
    imports = script_imports(tmp_path)
    assert imports == {"one": {"two": 1}, "three": {"one": 1}, "two": {"one": 2}}
    assert module_circles({k: set(v) for k, v in imports.items()}) == [["one", "two"]]


def test_module_length_warns_past_800_lines_and_fails_past_1200():
    """A Python file of ragen/, external/, bench/, scripts/ or tests/ past ~800 lines likely holds more than one
    concept: a warning asks to cut it by concept (one module, one idea), never by size. Past 1200 lines it fails."""
    long, too_long = [], []
    for folder in LINE_LIMIT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                (too_long if n > HARD_MAX_LINES else long).append(f"{path.relative_to(ROOT)}: {n} lines")
    if long:
        warnings.warn(f"modules over {MAX_LINES} lines (cut by concept where they hold more than one):\n"
                      + "\n".join(long), stacklevel=1)
    assert not too_long, f"modules over {HARD_MAX_LINES} lines:\n" + "\n".join(too_long)
