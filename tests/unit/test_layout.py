"""The package's layout holds: imports point down, parts stay apart, no
circle between modules (see the docstring of ``adpipe/__init__.py``), and
nothing in it uses the benchmark harness (``bench/``, outside the package).

The graph is read from the source with ``ast`` (function-level imports
included, since adpipe defers heavy imports into functions), so a new
import that breaks a rule fails here before anyone has to find it. A module
a file starts as a subprocess (``python -m adpipe.x``) is an edge as much as
an import: the file cannot work without it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.settings import PROJECT_ROOT

PACKAGE_DIR = PROJECT_ROOT / "include" / "adpipe"

# The pieces of the contract every part may use.
SHARED = {
    "adpipe",
    "adpipe.alert_settings",
    "adpipe.alerting",
    "adpipe.class_archive",
    "adpipe.faults",
    "adpipe.files",
    "adpipe.jars",
    "adpipe.kafka_access",
    "adpipe.kafka_io",
    "adpipe.kafka_io.clients",
    "adpipe.kafka_io.coordinator",
    "adpipe.kafka_io.group_probe",
    "adpipe.kafka_io.groups",
    "adpipe.kafka_io.ledger",
    "adpipe.kafka_io.offsets",
    "adpipe.kafka_io.records",
    "adpipe.kafka_io.topics",
    "adpipe.metrics",
    "adpipe.money",
    "adpipe.pg",
    "adpipe.processes",
    "adpipe.pygc",
    "adpipe.raw_events",
    "adpipe.schemas",
    "adpipe.setting_values",
    "adpipe.settings",
    "adpipe.spark",
    "adpipe.spark_worker",
}
PARTS = ("adpipe.stream", "adpipe.lakehouse", "adpipe.budget", "adpipe.local")
# Rank: a module may import modules of its own rank or lower, never higher.
RANKS = {"shared": 0, "part": 1, "adpipe.orchestration": 2, "adpipe.tools": 3, "entry": 4}
ENTRY = {"adpipe.cli", "adpipe.__main__"}


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(name: str, modules: set[str]) -> str:
    """The module an imported name lives in: itself, or its package."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree``: prose, not commands."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


_PYTHON_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)")


def launched(tree: ast.AST) -> Iterator[str]:
    """The modules a file starts as ``python -m NAME``: ``"-m", "NAME"`` side by
    side in a list or tuple (a subprocess's argv, ``[sys.executable, "-m",
    "adpipe.x"]``), or ``python -m NAME`` in a string of code (a command line
    for a shell); never in a docstring."""
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
            yield from (name for flag, name in zip(words, words[1:]) if flag == "-m" and name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield from _PYTHON_M.findall(node.value)


def names_used(path: Path, this: str = "") -> set[str]:
    """Every module name ``path`` (the module ``this``) imports, at any depth
    of the file, or launches (:func:`launched`): absolute dotted names."""
    tree = ast.parse(path.read_text(), str(path))
    found = set(launched(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    package = package.rsplit(".", 1)[0]
                base = f"{package}.{base}" if base else package
            found.update([f"{base}.{a.name}" for a in node.names] or [base])
    return found


def imports_of(path: Path, modules: set[str], this: str = "") -> set[str]:
    """Every adpipe module ``path`` (the module ``this``) imports or launches.
    ``python -m adpipe`` is the package: the command line any layer may run,
    as a user would (the demo, chaos and the load's verify task do)."""
    found: set[str] = set()
    for name in names_used(path, this):
        if name == "adpipe" or name.startswith("adpipe."):
            target = _resolve(name, modules)
            if target != this:
                found.add(target)
    return found


def uses_of_the_benchmark(root: Path = PACKAGE_DIR) -> list[str]:
    """Each use of the benchmark harness (the top-level ``bench`` package)
    by a module of the package: the shipped package must not depend on what
    it does not ship."""
    return [
        f"{module} imports or launches {name}"
        for module, path in all_modules(root).items()
        for name in sorted(names_used(path, module))
        if name == "bench" or name.startswith("bench.")
    ]


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    modules = all_modules(root)
    return {name: imports_of(path, set(modules), name) for name, path in modules.items()}


def layer(module: str) -> str:
    """``shared``, a part's package name, orchestration, tools or entry."""
    if module in SHARED:
        return "shared"
    if module in ENTRY:
        return "entry"
    for top in (*PARTS, "adpipe.orchestration", "adpipe.tools"):
        if module == top or module.startswith(top + "."):
            return top
    raise ValueError(f"{module} belongs to no layer: add it to a package, or to SHARED in {__file__}")


def rank(module: str) -> int:
    name = layer(module)
    return RANKS["part"] if name in PARTS else RANKS[name]


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every broken rule of the layout, as one line each."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if rank(target) > rank(module):
                found.append(
                    f"upward import: {module} ({layer(module)}) imports or launches {target} ({layer(target)})"
                )
            elif layer(module) in PARTS and layer(target) in PARTS and layer(module) != layer(target):
                found.append(f"part imports another part: {module} imports {target}")
            elif layer(module) == "adpipe.orchestration" and layer(target) == "adpipe.local":
                found.append(f"orchestration imports the local servers: {module} imports {target}")
    return found + [f"import circle: {' -> '.join(c)}" for c in cycles(graph)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

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
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append([*sorted(group), sorted(group)[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer(module)  # raises for a module no rule covers


def test_the_package_keeps_its_layout() -> None:
    graph = import_graph()
    assert len(graph) > 30, sorted(graph)  # the reader found the package
    assert "adpipe.settings" in graph["adpipe.lakehouse.load"]  # and reads its imports
    assert violations(graph) == []


def test_the_package_never_uses_the_benchmark() -> None:
    assert uses_of_the_benchmark() == []


def test_every_package_says_what_it_owns_and_may_import() -> None:
    for package in (*PARTS, "adpipe.orchestration", "adpipe.tools"):
        doc = ast.get_docstring(ast.parse((PACKAGE_DIR.parent / package.replace(".", "/") / "__init__.py").read_text()))
        assert doc and "May import" in doc, package


def test_dags_and_jobs_stay_thin() -> None:
    """DAG files wire tasks from adpipe.orchestration; jobs hand over to the CLI."""
    modules = set(all_modules())
    for folder, allowed in (("dags", ("adpipe.orchestration", *SHARED)), ("jobs", ("adpipe.cli",))):
        for path in sorted((PROJECT_ROOT / folder).glob("*.py")):
            for target in imports_of(path, modules):
                assert target in allowed or target.startswith("adpipe.orchestration."), f"{path.name} imports {target}"


MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 250


def oversized(paths: list[Path], root: Path = PROJECT_ROOT) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES."""
    found = []
    for path in paths:
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                found.append(f"{path.relative_to(root)}: class {node.name}, {size} lines")
    return found


def test_no_module_over_600_lines_and_no_class_over_250() -> None:
    """A module does one job: the package, its DAGs, jobs, benchmark and tests."""
    folders = ("include", "dags", "jobs", "bench", "tests")
    assert oversized(sorted(p for f in folders for p in (PROJECT_ROOT / f).rglob("*.py"))) == []


def test_the_size_rule_catches_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    long_module = tmp_path / "long.py"
    long_module.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    long_class = tmp_path / "big.py"
    long_class.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    short = tmp_path / "short.py"
    short.write_text("class Small:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1))
    assert oversized([long_module, long_class, short], tmp_path) == [
        f"long.py: {MAX_MODULE_LINES + 1} lines", f"big.py: class Big, {MAX_CLASS_LINES + 1} lines"
    ]


def test_unit_tests_mirror_the_packages() -> None:
    """tests/unit/<x> mirrors adpipe.<x>, or the benchmark harness (bench/)."""
    for folder in sorted(p for p in (PROJECT_ROOT / "tests" / "unit").iterdir() if p.is_dir()):
        if folder.name.startswith("__"):
            continue
        mirrored = PACKAGE_DIR / folder.name if folder.name != "bench" else PROJECT_ROOT / "bench"
        assert (mirrored / "__init__.py").exists(), f"tests/unit/{folder.name} mirrors no package"


# The checker itself can fail: each rule on a small made-up graph.
@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"adpipe.settings": {"adpipe.stream.job"}, "adpipe.stream.job": set()}, "upward import"),
        ({"adpipe.stream.job": {"adpipe.tools.verify"}, "adpipe.tools.verify": set()}, "upward import"),
        ({"adpipe.lakehouse.load": {"adpipe.stream.job"}, "adpipe.stream.job": set()}, "part imports another part"),
        ({"adpipe.lakehouse.metastore": {"adpipe.local.postgres"}}, "part imports another part"),
        ({"adpipe.orchestration.x": {"adpipe.local.postgres"}}, "orchestration imports the local servers"),
        ({"adpipe.spark": {"adpipe.pg"}, "adpipe.pg": {"adpipe.spark"}}, "import circle: adpipe.pg -> adpipe.spark"),
    ],
)
def test_the_rules_catch_a_broken_layout(graph: dict[str, set[str]], expected: str) -> None:
    assert any(v.startswith(expected) for v in violations(graph)), violations(graph)


def test_the_rules_pass_a_sound_layout() -> None:
    graph = {
        "adpipe.cli": {"adpipe.tools.demo", "adpipe.stream.cli"},
        "adpipe.tools.demo": {"adpipe.stream.job", "adpipe.local.postgres", "adpipe.settings"},
        "adpipe.stream.job": {"adpipe.stream.sink", "adpipe.kafka_io"},
        "adpipe.stream.sink": {"adpipe.faults"},
        "adpipe.kafka_io": {"adpipe.settings"},
    }
    assert violations(graph) == []


def test_the_reader_sees_imports_inside_functions(tmp_path: Path) -> None:
    root = tmp_path / "adpipe"
    (root / "stream").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "settings.py").write_text("")
    (root / "stream" / "__init__.py").write_text("")
    (root / "stream" / "job.py").write_text("from . import sink\n")
    (root / "stream" / "sink.py").write_text("def f():\n    from adpipe.settings import X\n    import adpipe.stream\n")
    graph = import_graph(root)
    assert graph["adpipe.stream.sink"] == {"adpipe.settings", "adpipe.stream"}
    assert graph["adpipe.stream.job"] == {"adpipe.stream.sink"}


def _package(root: Path, files: dict[str, str]) -> Path:
    """A made-up package under ``root``: its modules' source by path."""
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    return root / "adpipe"


def test_the_reader_sees_subprocess_launches_and_the_rules_judge_them(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "adpipe/__init__.py": "",
            "adpipe/settings.py": (
                '"""Trained by python -m adpipe.tools.prose (a docstring is prose, not an edge)."""\n'
                "import subprocess, sys\n"
                "def train():\n"
                '    subprocess.run([sys.executable, "-m", "adpipe.tools.train", "--layout", "plain"])\n'
                'SHELL = "python -m adpipe.tools.shell --once"\n'
            ),
            "adpipe/tools/__init__.py": "",
            "adpipe/tools/train.py": "",
            "adpipe/tools/shell.py": "",
            "adpipe/tools/prose.py": "",
        },
    )
    graph = import_graph(root)
    assert graph["adpipe.settings"] == {"adpipe.tools.train", "adpipe.tools.shell"}
    assert (
        "upward import: adpipe.settings (shared) imports or launches adpipe.tools.train (adpipe.tools)"
        in violations(graph)
    )


def test_the_benchmark_rule_catches_an_import_and_a_launch(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "adpipe/__init__.py": '"""The harness: python -m bench (prose)."""\n',
            "adpipe/tools/__init__.py": "",
            "adpipe/tools/demo.py": "def f():\n    from bench import stages\n",
            "adpipe/tools/chaos.py": 'import sys\nCMD = [sys.executable, "-m", "bench.spark_rows", "batch"]\n',
        },
    )
    assert uses_of_the_benchmark(root) == [
        "adpipe.tools.chaos imports or launches bench.spark_rows",
        "adpipe.tools.demo imports or launches bench.stages",
    ]
