"""The layers of ARCHITECTURE.md ("Layers"), checked over the whole import graph of the project's packages.

Every module under controlplane/, agents/, pearl_site/ and pearl_cli/ is parsed with `ast`; every import
counts, wherever it is written (module level, inside a function, under `if TYPE_CHECKING:`): an import
hidden in a function is still a dependency, and one that would close a cycle at module level closes it
at run time too. Strings are not imports: the services send Celery tasks by name
(`services.dispatch.TaskName`), so the tasks sit on top of the services and never below them.

    core                       imports nothing of the project
    sim, agents                core (agents talk to the control plane over the wire only)
    models, migrations         core
    selectors                  models, core
    services                   selectors, models, core; services.simulations also sim (it runs the dashboard's
                               simulator comparisons: the arrow ARCHITECTURE.md draws from it, no other service's)
    adapters                   tasks, consumers, api, views, admin, management: anything but the site;
                               nothing below imports them
    pearl_site                 the Django project (settings, urls, asgi, the Celery app): on top
    pearl_cli                  a REST client: core only

and no import cycle between any two modules.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controlplane", "agents", "pearl_site", "pearl_cli")

# (layer, module prefixes): the first layer whose prefix matches a module is the module's
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("controlplane.core",)),
    ("sim", ("controlplane.sim",)),
    ("agents", ("agents",)),
    ("models", ("controlplane.models", "controlplane.migrations")),
    ("selectors", ("controlplane.selectors",)),
    ("services", ("controlplane.services",)),
    (
        "adapters",
        (
            "controlplane.tasks",
            "controlplane.consumers",
            "controlplane.api",
            "controlplane.views",
            "controlplane.admin",
            "controlplane.management",
        ),
    ),
    ("app", ("controlplane.apps", "controlplane")),  # the Django app's package and AppConfig
    ("site", ("pearl_site",)),
    ("cli", ("pearl_cli",)),
)
BELOW_ADAPTERS = {"core", "sim", "agents", "models", "selectors", "services", "app"}
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "sim": {"core", "sim"},
    "agents": {"core", "agents"},
    "models": {"core", "models"},
    "selectors": {"core", "models", "selectors"},
    "services": {"core", "models", "selectors", "services"},
    "adapters": BELOW_ADAPTERS | {"adapters", "site"},
    "app": {"core", "models", "app"},
    "site": BELOW_ADAPTERS | {"adapters", "site"},
    "cli": {"core", "cli"},
}

# Arrows ARCHITECTURE.md draws from one module rather than from its whole layer: (importer, imported layer).
MODULE_ARROWS: set[tuple[str, str]] = {("controlplane.services.simulations", "sim")}

# No known violations or cycles are left; an entry here would be a debt, named and dated.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()  # (importer, imported)
KNOWN_CYCLES: set[frozenset[str]] = set()


def project_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the project's packages: dotted name -> (path, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _owner(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The project module an imported name lives in (its longest known prefix), or None (not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """importer -> the project modules it imports, every import statement anywhere in its body."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package, one level up per extra dot
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    package = package[: len(package) - node.level + 1]
                    base = ".".join([*package, *([node.module] if node.module else [])])
                # `from a import b` imports the module a.b when there is one, else a name of a
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for name in names:
                target = _owner(name, modules)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def layer_of(module: str) -> str:
    for layer, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if layer_of(b) not in MAY_IMPORT[layer_of(a)] and (a, layer_of(b)) not in MODULE_ARROWS
    }


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        cycles.append(frozenset(component))
    return cycles


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(project_modules())


def test_every_module_has_a_layer(graph):
    for module in project_modules():
        layer_of(module)


def test_each_layer_imports_only_the_layers_below_it(graph):
    new = sorted(layer_violations(graph) - KNOWN_LAYER_VIOLATIONS)
    assert not new, "imports across the layers of ARCHITECTURE.md:\n" + "\n".join(
        f"  {a} ({layer_of(a)}) imports {b} ({layer_of(b)})" for a, b in new
    )


def test_no_import_cycle_between_modules(graph):
    new = [sorted(c) for c in import_cycles(graph) if c not in KNOWN_CYCLES]
    assert not new, "import cycles (function-local imports included):\n" + "\n".join(f"  {c}" for c in new)


def test_the_services_send_tasks_by_name_and_every_name_is_a_task():
    """The one spelling of each task name (`TaskName`) is what the Celery app registers."""
    import controlplane.tasks  # noqa: F401  (registers the tasks)
    from controlplane.services.dispatch import TaskName
    from pearl_site.celery import app

    assert {str(n) for n in TaskName} <= set(app.tasks)


# ---------------------------------------------------------------- the checker itself
def _graph_of(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    modules = {}
    for name, text in files.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        modules[name.removesuffix(".__init__")] = (path, name.endswith("__init__"))
    return import_graph(modules)


def test_the_checker_sees_function_local_relative_and_type_checking_imports(tmp_path):
    graph = _graph_of(
        tmp_path,
        {
            "controlplane.core.__init__": "",
            "controlplane.core.a": "def f():\n    from controlplane.services import b\n",
            "controlplane.services.__init__": "",
            "controlplane.services.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n",
            "controlplane.services.c": "import controlplane.services.b\n",
        },
    )
    assert graph["controlplane.core.a"] == {"controlplane.services.b"}
    assert graph["controlplane.services.b"] == {"controlplane.services.c"}
    assert layer_violations(graph) == {("controlplane.core.a", "controlplane.services.b")}
    assert import_cycles(graph) == [frozenset({"controlplane.services.b", "controlplane.services.c"})]
