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

The rest of the house rules (issue 33) are read from the same syntax trees: only services/, selectors/,
models.py, the migrations and the management commands query the database (adapters parse, call one service or
selector, answer; core, sim, agents and the CLI import no Django at all); no product module is over 600 lines;
a top-level class name is defined in one product module (a model and the core value it stores share one only
where the glossary says so); and there is one wire codec, core/wire.py. Each checker is also run on planted
violations at the end of this file.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
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


# ---------------------------------------------------------------- what the import graph does not show (issue 33)
def product_trees(modules: dict[str, tuple[Path, bool]]) -> dict[str, tuple[ast.Module, int]]:
    """Every product module (migrations are generated, not written) -> (its syntax tree, its line count)."""
    out = {}
    for module, (path, _) in modules.items():
        if layer_of(module) == "models" and module != "controlplane.models":
            continue  # controlplane.migrations.*
        text = path.read_text()
        out[module] = (ast.parse(text, filename=str(path)), len(text.splitlines()))
    return out


def _in(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# Item 4: adapters parse, call one service or selector, answer. Only these may query the database.
ORM_LAYERS = (
    "controlplane.services",
    "controlplane.selectors",
    "controlplane.models",
    "controlplane.migrations",
    "controlplane.management",  # management commands are operator scripts (create a user, launch)
)
# Only the Django side can query (core, sim and agents import no Django: DJANGO_FREE); there, these QuerySet,
# manager and Model methods mean the database (`.get`, `.count`, `.update`, `.values` and `.exists` are left
# out: dicts, lists and paths have them too)
QUERYSET_METHODS = frozenset(
    {
        "all",
        "first",
        "last",
        "earliest",
        "iterator",
        "only",
        "defer",
        "create",
        "save",
        "delete",
        "select_for_update",
        "select_related",
        "prefetch_related",
        "annotate",
        "aggregate",
        "values_list",
        "filter",
        "exclude",
        "order_by",
        "distinct",
        "get_or_create",
        "update_or_create",
        "bulk_create",
        "bulk_update",
        "in_bulk",
        "refresh_from_db",
        "raw",
        "extra",
    }
)
# what an adapter may take from django.db: a type to annotate with, errors to answer with a 4xx; never a query
DJANGO_DB_TYPES = frozenset({"QuerySet", "DataError", "IntegrityError", "OperationalError", "DatabaseError"})


# the layers that never import Django (the node agents run without it; core and sim are pure), by prefix
DJANGO_FREE = ("controlplane.core", "controlplane.sim", "agents", "pearl_cli")
DJANGO_ENTRY_POINTS = {"pearl_cli.manage"}  # `pearl-manage`: the installed manage.py, Django's command line
DJANGO_PACKAGES = frozenset({"django", "rest_framework", "channels", "drf_spectacular", "celery"})


def django_imports(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in DJANGO_PACKAGES]
    return found


def orm_uses(tree: ast.Module) -> list[str]:
    """Where a module queries the database: `Model.objects`, a QuerySet method, `django.db`'s transaction,
    connection or query expressions."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            found.append(f"line {node.lineno}: .objects")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in QUERYSET_METHODS:
            found.append(f"line {node.lineno}: .{node.func.attr}(...)")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[:2] == ["django", "db"]:
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name not in DJANGO_DB_TYPES]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("django.db")]
    return found


# Item 3: no product module over 600 lines (a module that long holds more than one idea).
MAX_LINES = 600


def long_modules(trees: dict[str, tuple[ast.Module, int]]) -> dict[str, int]:
    return {m: n for m, (_, n) in trees.items() if n > MAX_LINES}


# Item 5: one meaning per name. A top-level class name is defined in one product module, except:
# a Django model and the core value it stores (or records) share a name where ARCHITECTURE.md's glossary says
# so: name -> (the modules, by prefix; the glossary's word; what its row must spell, both sides)
GLOSSARY_SHARED_NAMES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "Decision": (
        ("controlplane.core.decision", "controlplane.models"),
        "decision",
        ("`core/decision.Decision`", "`models.Decision`"),
    ),
    "Trajectory": (
        ("controlplane.core.workload", "controlplane.models"),
        "trajectory",
        ("`core/workload.Trajectory`", "`models.Trajectory`"),
    ),
}
# and a name a framework looks a class up by: Django finds each management command's `Command`
FRAMEWORK_NAMES: dict[str, tuple[str, ...]] = {"Command": ("controlplane.management.commands",)}


def class_definitions(trees: dict[str, tuple[ast.Module, int]]) -> dict[str, set[str]]:
    """Top-level class name -> the modules that define it."""
    defined: dict[str, set[str]] = defaultdict(set)
    for module, (tree, _) in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined[node.name].add(module)
    return defined


def duplicated_class_names(defined: dict[str, set[str]]) -> dict[str, set[str]]:
    """The names defined in more than one module, less those the glossary or a framework explains."""
    out = {}
    for name, where in defined.items():
        if len(where) < 2:
            continue
        if name in GLOSSARY_SHARED_NAMES:  # one module on each side of the pair, not two on one side
            sides = GLOSSARY_SHARED_NAMES[name][0]
            ok = all(_in(m, sides) for m in where) and all(sum(_in(m, [p]) for m in where) <= 1 for p in sides)
        else:
            ok = all(_in(m, FRAMEWORK_NAMES.get(name, ())) for m in where)
        if not ok:
            out[name] = where
    return out


def glossary_rows(text: str) -> dict[str, str]:
    """ARCHITECTURE.md's glossary: the bold word of each table row -> the row."""
    rows = {}
    for line in text.split("## Glossary", 1)[-1].split("\n## ", 1)[0].splitlines():
        if line.startswith("| **"):
            rows[line[4:].split("**", 1)[0]] = line
    return rows


# Item 1: one wire codec. core/wire.py alone defines the dump and parse of JSON messages, the error type and the
# error message; each protocol module (its messages) declares its framing once, as a WireProtocol, and writes
# and reads no JSON itself; no code feeds a JSON decoder of its own into a protocol's parse (the protocol's
# `decode` holds its size, depth and string limits).
WIRE = "controlplane.core.wire"
PROTOCOL_MODULES = frozenset({"controlplane.core.agent_link", "controlplane.core.driver_link", "agents.dataplane"})
CODEC_FUNCTIONS = frozenset(
    {
        "dump",
        "_dump",
        "dumps",
        "parse",
        "_parse",
        "loads",
        "_loads",
        "parse_message",
        "parse_control_message",
        "parse_dataclass",
    }
)
CODEC_CLASSES = frozenset({"WireProtocol", "WireError", "LinkError", "ErrorReply", "ErrorMessage"})
JSON_MODULES = frozenset({"json", "orjson", "ujson", "simplejson", "msgspec"})
# functions named like the codec's that are not a codec: (module, qualified name) -> why
NOT_A_CODEC: dict[tuple[str, str], str] = {
    ("controlplane.core.state", "Configuration.parse"): "a configuration label ('3P5D') to a Configuration",
    ("controlplane.core.policies.base", "OptionSpec.parse"): "one policy option's already decoded value",
    ("controlplane.api.parsers", "BoundedJSONParser.parse"): "DRF's hook for REST bodies; it decodes with wire.loads",
}


def _definitions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and class, nested ones included."""
    out: list[tuple[str, ast.AST]] = []
    work: list[tuple[str, ast.AST]] = [("", tree)]
    while work:
        prefix, parent = work.pop()
        for node in ast.iter_child_nodes(parent):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((prefix + node.name, node))
                work.append((prefix + node.name + ".", node))
            else:
                work.append((prefix, node))
    return out


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one function's (or the module's) own body, not of the functions and classes inside it."""
    work = list(ast.iter_child_nodes(scope))
    while work:
        node = work.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            work.extend(ast.iter_child_nodes(node))


def _is_json_decode(node: ast.AST) -> bool:
    """`json.loads(...)` / `orjson.loads(...)` (the module's own decoder, not a protocol's `decode`)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("loads", "load")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in JSON_MODULES
    )


def codec_violations(trees: dict[str, tuple[ast.Module, int]]) -> list[str]:
    found = []
    for module, (tree, _) in trees.items():
        if module == WIRE:
            continue
        for qualname, node in _definitions(tree):
            name = qualname.rpartition(".")[2]
            if isinstance(node, ast.ClassDef) and (name in CODEC_CLASSES or name.endswith(("LinkError", "WireError"))):
                found.append(f"{module}.{qualname}: a codec's class outside {WIRE}")
            elif (
                isinstance(node, ast.ClassDef)
                and module in PROTOCOL_MODULES
                and any(ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases)
            ):
                found.append(f"{module}.{qualname}: an error type of a protocol (its one error type is wire's)")
            elif (
                not isinstance(node, ast.ClassDef) and name in CODEC_FUNCTIONS and (module, qualname) not in NOT_A_CODEC
            ):
                found.append(f"{module}.{qualname}: a codec's function outside {WIRE}")
        protocols = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("WireProtocol"):
                protocols += 1
                if module not in PROTOCOL_MODULES:
                    found.append(f"{module} line {node.lineno}: a WireProtocol outside the protocol modules")
            if module in PROTOCOL_MODULES and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{module} line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in JSON_MODULES]
        if protocols > 1 and module in PROTOCOL_MODULES:
            found.append(f"{module}: {protocols} WireProtocols (one framing per protocol)")
        for fn in [tree, *(n for _, n in _definitions(tree) if not isinstance(n, ast.ClassDef))]:
            scope = list(_own_nodes(fn))
            decoded = {  # names this scope binds to a JSON module's decode
                t.id
                for n in scope
                if isinstance(n, ast.Assign) and _is_json_decode(n.value)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            for n in scope:
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parse" and n.args:
                    first = n.args[0]
                    if _is_json_decode(first) or (isinstance(first, ast.Name) and first.id in decoded):
                        found.append(
                            f"{module} line {n.lineno}: parses what json/orjson decoded (use the protocol's decode)"
                        )
    return sorted(set(found))


@pytest.fixture(scope="module")
def trees() -> dict[str, tuple[ast.Module, int]]:
    return product_trees(project_modules())


def test_only_services_selectors_models_and_commands_query_the_database(trees):
    found = {
        m: uses
        for m, (tree, _) in trees.items()
        if not _in(m, ORM_LAYERS)
        and (uses := django_imports(tree) if _in(m, DJANGO_FREE) and m not in DJANGO_ENTRY_POINTS else orm_uses(tree))
    }
    assert not found, (
        "database queries outside services/, selectors/, models.py and management commands "
        "(or Django imported where it may not be: core, sim, agents, the CLI):\n"
        + "\n".join(f"  {m}: {', '.join(uses)}" for m, uses in sorted(found.items()))
    )


def test_no_product_module_is_over_600_lines(trees):
    long = long_modules(trees)
    assert not long, f"modules over {MAX_LINES} lines (split them by idea):\n" + "\n".join(
        f"  {m}: {n}" for m, n in sorted(long.items())
    )


def test_each_top_level_class_name_is_defined_once(trees):
    twice = duplicated_class_names(class_definitions(trees))
    assert not twice, (
        "class names defined in two product modules (rename one, or say why in the glossary):\n"
        + "\n".join(f"  {name}: {sorted(where)}" for name, where in sorted(twice.items()))
    )


def test_the_names_a_model_shares_are_the_glossarys():
    rows = glossary_rows((ROOT / "ARCHITECTURE.md").read_text())
    for name, (_, word, spellings) in GLOSSARY_SHARED_NAMES.items():
        assert word in rows, f"{name} is shared by a model and a core value: the glossary needs the word {word!r}"
        missing = [s for s in spellings if s not in rows[word]]
        assert not missing, f"the glossary's {word!r} row must name {missing} (they share the name {name})"


def test_one_wire_codec(trees):
    found = codec_violations(trees)
    assert not found, "a second wire codec:\n" + "\n".join(f"  {v}" for v in found)
    assert set(trees) >= PROTOCOL_MODULES | {WIRE}, "the protocol modules moved: update PROTOCOL_MODULES"


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


def _trees_of(files: dict[str, str]) -> dict[str, tuple[ast.Module, int]]:
    return {name: (ast.parse(text), len(text.splitlines())) for name, text in files.items()}


def test_the_orm_checker_sees_queries_and_leaves_dicts_alone():
    query = _trees_of(
        {
            "a": "def f():\n    return Job.objects.all()\n",
            "b": "def f(qs):\n    return qs.select_for_update().first()\n",
            "c": "from django.db import transaction\n",
            "d": "import django.db.models\n",
            "e": "def f(job):\n    return job.workers.filter(alive=True)\n",
        }
    )
    assert all(orm_uses(tree) for tree, _ in query.values())
    clean = _trees_of(
        {
            "a": "from django.db.models import QuerySet\nfrom django.db import DataError\n",
            "b": "def f(d, p):\n    return d.get('x'), d.values(), d.update(y=1), p.exists(), [1].count(1)\n",
        }
    )
    assert not any(orm_uses(tree) for tree, _ in clean.values())
    assert orm_uses(_trees_of({"a": "def f(s):\n    s.save()\n"})["a"][0]) == ["line 2: .save(...)"]


def test_the_django_free_layers_import_no_django():
    trees = _trees_of(
        {
            "a": "def f():\n    from django.conf import settings\n",
            "b": "import rest_framework.fields\n",
            "c": "import json\nfrom . import django\n",
        }
    )
    assert [bool(django_imports(tree)) for tree, _ in trees.values()] == [True, True, False]


def test_the_line_checker_counts_lines():
    trees = _trees_of({"short": "x = 1\n" * MAX_LINES, "long": "x = 1\n" * (MAX_LINES + 1)})
    assert long_modules(trees) == {"long": MAX_LINES + 1}


def test_the_name_checker_allows_only_the_glossarys_pairs_and_djangos_command():
    trees = _trees_of(
        {
            "agents.a": "class Turn:\n    pass\nclass Decision:\n    pass\n",
            "agents.b": "class Turn:\n    pass\n",
            "controlplane.models": "class Decision:\n    pass\nclass Trajectory:\n    pass\n",
            "controlplane.core.decision": "class Decision:\n    pass\n",
            "controlplane.core.workload": "class Trajectory:\n    pass\n",
            "controlplane.management.commands.a": "class Command:\n    pass\n",
            "controlplane.management.commands.b": "class Command:\n    pass\n",
            "agents.c": "def f():\n    class Local:\n        pass\n",
            "agents.d": "class Local:\n    pass\n",
        }
    )
    assert duplicated_class_names(class_definitions(trees)) == {
        "Turn": {"agents.a", "agents.b"},
        "Decision": {"agents.a", "controlplane.models", "controlplane.core.decision"},
    }
    trees.pop("agents.a")
    trees["agents.e"] = (ast.parse("class Command:\n    pass\n"), 2)
    assert duplicated_class_names(class_definitions(trees)) == {
        "Command": {"agents.e", "controlplane.management.commands.a", "controlplane.management.commands.b"}
    }


def test_the_glossary_reader_finds_each_words_row():
    text = "## Glossary\n\n| word | means |\n| --- | --- |\n| **decision** | `models.Decision` |\n\n## Renames\n"
    assert glossary_rows(text) == {"decision": "| **decision** | `models.Decision` |"}


def test_the_codec_checker_sees_a_second_codec():
    ok = {
        WIRE: "import json\nclass WireError(ValueError): ...\ndef loads(raw): ...\nclass WireProtocol:\n"
        "    def dump(self, m): ...\n    def parse(self, d, e): ...\n",
        "agents.dataplane": "from controlplane.core.wire import WireProtocol\nDATA_PLANE = WireProtocol('dp')\n",
        "agents.user": "import orjson\nfrom agents import dataplane as dp\n"
        "def f(raw):\n    return dp.DATA_PLANE.parse(dp.DATA_PLANE.decode(raw), dp.X)\n"
        "def g(path):\n    meta = orjson.loads(path)\n    return meta\n"
        "def h(data):\n    return dp.DATA_PLANE.parse(data, dp.X)\n",
        "controlplane.core.state": "class Configuration:\n    @classmethod\n    def parse(cls, label): ...\n",
    }
    assert codec_violations(_trees_of(ok)) == []
    second = {
        "agents.dataplane": "import orjson\nfrom controlplane.core.wire import WireProtocol\n"
        "DATA_PLANE = WireProtocol('dp')\nOTHER = WireProtocol('dp2')\nclass DataPlaneError(Exception): ...\n",
        "controlplane.core.agent_link": "def dump(message): ...\ndef _parse(data, cls): ...\n",
        "controlplane.core.driver_link": "class LinkError(ValueError): ...\nclass ErrorMessage: ...\n",
        "agents.user": "import json, orjson\nfrom controlplane.core.wire import WireProtocol\n"
        "MINE = WireProtocol('mine')\n"
        "def f(raw):\n    return dp.DATA_PLANE.parse(orjson.loads(raw), dp.X)\n"
        "def g(raw):\n    data = json.loads(raw)\n    return dp.DATA_PLANE.parse(data, dp.X)\n"
        "class C:\n    def parse_message(self, raw): ...\n",
    }
    found = "\n".join(codec_violations(_trees_of(second)))
    for expected in (
        "agents.dataplane line 1: imports orjson",
        "agents.dataplane: 2 WireProtocols",
        "agents.dataplane.DataPlaneError: an error type of a protocol",
        "controlplane.core.agent_link.dump: a codec's function",
        "controlplane.core.agent_link._parse: a codec's function",
        "controlplane.core.driver_link.LinkError: a codec's class",
        "controlplane.core.driver_link.ErrorMessage: a codec's class",
        "agents.user line 3: a WireProtocol outside the protocol modules",
        "agents.user line 5: parses what json/orjson decoded",
        "agents.user line 8: parses what json/orjson decoded",
        "agents.user.C.parse_message: a codec's function",
    ):
        assert expected in found, f"missed: {expected}\nfound:\n{found}"
    assert len(codec_violations(_trees_of(second))) == 11


def test_services_reach_the_simulator_only_through_services_simulations(tmp_path):
    graph = _graph_of(
        tmp_path,
        {
            "controlplane.sim.__init__": "",
            "controlplane.sim.cli": "",
            "controlplane.services.__init__": "",
            "controlplane.services.simulations": "from controlplane.sim import cli\n",
            "controlplane.services.jobs": "import controlplane.sim.cli\n",
        },
    )
    assert layer_violations(graph) == {("controlplane.services.jobs", "controlplane.sim.cli")}
