"""The package's imports point one way (issue 31): no cycle between modules or between subpackages
(counting imports inside functions, which hide a cycle rather than remove it), and every arrow points
down the layer order of docs/architecture.md."""
import ast

from conftest import REPO

PACKAGE = REPO / "xtremedistil_tf"
# The layers, lowest first (docs/architecture.md): a module may import its own layer and the layers before it.
# "" is the package's root modules (errors, io, console, _env), which everything may use.
LAYERS = ("", "data", "crf", "losses", "engine", "teachers", "transfer", "students", "methods", "export", "run",
          "benchmarks", "cli")
# The package's __init__ only imports what registers the custom Keras objects (crf, losses, students, engine):
# it is the entry point above every layer, not a layer. Importing it is no arrow either: Python runs it before any
# `from xtremedistil_tf.x import y` anyway.
ENTRY = "xtremedistil_tf"


def layer_of(module: str, packages: set) -> str:
    """The top folder a module lives in; "" for a root module (xtremedistil_tf.errors)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module in packages else ""


def _module_names():
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph():
    """{module: the package's modules it imports anywhere in its file}."""
    modules = _module_names()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                               for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_imports_inside_functions():
    graph = import_graph()
    # pipeline imports the teacher loader inside a function, the CLI modules import it at the top
    assert "xtremedistil_tf.teachers.saved" in graph["xtremedistil_tf.run.pipeline"]
    assert "xtremedistil_tf.run.pipeline" in graph["xtremedistil_tf.cli.train"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def packages_of(graph):
    """{package: packages its modules import}: the subpackage graph (a module's package is its folder)."""
    modules = _module_names()
    folder = {m: m if modules[m].name == "__init__.py" else m.rsplit(".", 1)[0] for m in graph}
    folder[ENTRY] = ENTRY   # the root modules (errors, io, ...) are the package "xtremedistil_tf"; the entry is not
    packaged = {}
    for m, targets in graph.items():
        packaged.setdefault(folder[m], set()).update(
            folder[t] for t in targets if m != ENTRY and t != ENTRY and folder[t] != folder[m])
    return packaged


def against_the_layers(graph):
    """{module: [its imports of a layer above its own]}."""
    packages = {m for m, p in _module_names().items() if p.name == "__init__.py"}
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    found = {}
    for module, targets in graph.items():
        if module == ENTRY:
            continue
        here = rank[layer_of(module, packages)]
        up = sorted(t for t in targets if t != ENTRY and rank[layer_of(t, packages)] > here)
        if up:
            found[module] = up
    return found


def test_every_module_is_in_a_declared_layer():
    packages = {m for m, p in _module_names().items() if p.name == "__init__.py"}
    assert {layer_of(m, packages) for m in import_graph() if m != ENTRY} <= set(LAYERS)


def test_no_cycles_between_subpackages():
    graph = packages_of(import_graph())
    assert "xtremedistil_tf.methods.nas" in graph   # nested packages are nodes of their own
    assert cycles(graph) == []


def test_every_arrow_points_down_the_layers():
    graph = import_graph()
    # The check itself catches an upward arrow: an export module importing the pipeline would be one.
    bad = dict(graph, **{"xtremedistil_tf.export.formats": graph["xtremedistil_tf.export.formats"]
                         | {"xtremedistil_tf.run.pipeline"}})
    assert against_the_layers(bad) == {"xtremedistil_tf.export.formats": ["xtremedistil_tf.run.pipeline"]}
    assert against_the_layers(graph) == {}
