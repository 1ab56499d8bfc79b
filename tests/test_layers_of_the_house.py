"""The layers of the package: each imports only from itself and the layers below it.

Walks every module's syntax tree, imports inside functions and under TYPE_CHECKING included, so
that a dependency on a layer above cannot hide in a lazy import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import transduce

PACKAGE = Path(transduce.__file__).parent

# Lowest first. A unit is a top-level module or package of transduce.
LAYERS: list[set[str]] = [
    {"errors", "console"},  # user errors; lines on stderr for long work without a terminal
    {"device", "runtime", "presets"},
    {"config"},
    {"kernels"},  # device and dtype dispatch: matrix library, dropout, attention paths
    {"data"},  # corpora, trees, vocabularies (PAD, BOS, EOS), batches
    # the paper's model; the recurrent baseline it argues against; metrics (BLEU, EVALB)
    {"model", "recurrent", "evaluation"},
    {"architectures"},  # build the model a config names
    {"checkpoint", "plotting"},  # model files; figures from plain data
    {"inference"},  # searches, the inference engine, Translator and translation evaluation
    {"parsing"},  # Parser: linearised trees decoded (constrained or not), EVALB evaluation
    # training; models for other engines; the HTTP server (it needs only errors, and is handed
    # a Translator)
    {"training", "export", "serve"},
    {"demo"},
    {"experiments"},  # several runs and their figures
    {"cli"},
    {"__main__"},
]
LEVEL = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    """'transduce.model.attention' -> 'model'."""
    return module.split(".")[1]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every transduce import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("transduce.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "transduce":  # from transduce import kernels
                found += [(node.lineno, f"transduce.{a.name}") for a in node.names]
            elif node.module.startswith("transduce."):
                found.append((node.lineno, node.module))
    return found


def test_every_unit_has_a_layer() -> None:
    units = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _modules()}
    assert units - set(LEVEL) == set(), "place new modules in LAYERS"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_from_itself_and_below(path: Path) -> None:
    unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    above = [
        f"line {line}: {module}"
        for line, module in _imports(path)
        if _unit(module) != unit and LEVEL[_unit(module)] >= LEVEL[unit]
    ]
    assert not above, f"{unit} (layer {LEVEL[unit]}) imports from its layer or above: {above}"


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from transduce.training.run import train\n    import transduce.cli\n"
    )
    assert _imports(bad) == [(2, "transduce.training.run"), (3, "transduce.cli")]


def test_the_model_names_no_cpu_vendor_or_matrix_library() -> None:
    # the paper's model says what it computes; how (MKL, oneDNN, AVX-512 on AMD or Intel) is the
    # kernels' business, and measured figures live in benchmarks/RESULTS.md
    words = re.compile(r"\b(mkl|onednn|mkldnn|amd|intel|avx\w*|zen|results\.md)\b", re.I)
    hits = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted((PACKAGE / "model").glob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if words.search(line)
    ]
    assert not hits
    lines = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "model").glob("*.py"))
    assert lines < 1100, f"model/ has {lines} lines: speed code belongs in kernels/ or inference/"


# No two modules import each other, even inside one layer and even lazily: a cycle held apart by an
# import inside a function is still two modules that cannot be understood one without the other.


def _module_name(path: Path, package: Path) -> str:
    """src/transduce/training/run.py -> 'transduce.training.run'; a package's __init__ -> the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: Path) -> dict[str, set[str]]:
    """Each module -> the transduce modules it imports (`from pkg import sub` names the submodule)."""
    paths = sorted(package.rglob("*.py"))
    names = {_module_name(p, package) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        targets = {module for _, module in _imports(path)}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:  # from transduce.training import saving: the submodule
                    if f"{node.module}.{alias.name}" in names:
                        targets.discard(node.module)
                        targets.add(f"{node.module}.{alias.name}")
        name = _module_name(path, package)
        graph[name] = {t for t in targets if t in names} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other() -> None:
    cycles = _cycles(_import_graph(PACKAGE))
    assert not cycles, f"modules that import each other (lazy imports included): {cycles}"


def test_the_cycle_check_sees_a_lazy_cycle_inside_a_layer(tmp_path: Path) -> None:
    package = tmp_path / "transduce"
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "training" / "__init__.py").write_text("")
    (package / "training" / "run.py").write_text("from transduce.training import tasks\n")
    (package / "training" / "tasks.py").write_text(
        "def f():\n    from transduce.training.run import train\n"
    )
    (package / "training" / "alone.py").write_text("import transduce.training.run\n")
    cycles = _cycles(_import_graph(package))
    assert cycles == [["transduce.training.run", "transduce.training.tasks"]]
