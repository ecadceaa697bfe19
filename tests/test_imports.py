"""The package's imports point one way: no import cycles (counting imports inside functions, which
hide a cycle rather than remove it), and the base layers import nothing above them."""
import ast

from conftest import REPO

PACKAGE = REPO / "xtremedistil_tf"
# Each base layer and the package modules it may import (besides itself).
BASE_LAYERS = {
    "data": {"errors", "io"},
    "crf": {"errors"},
    "losses": {"errors", "crf"},
    "layers": {"errors"},
    "engine": {"errors", "console"},
}


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
    assert "xtremedistil_tf.teachers.saved" in graph["xtremedistil_tf.pipeline"]
    assert "xtremedistil_tf.pipeline" in graph["xtremedistil_tf.cli.train"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_base_layers_import_nothing_above_them():
    graph = import_graph()
    above = {}
    for module, targets in graph.items():
        layer = module.split(".")[1] if module.count(".") else ""
        if layer in BASE_LAYERS:
            bad = {t for t in targets if t.split(".")[1] not in BASE_LAYERS[layer] | {layer}}
            if bad:
                above[module] = sorted(bad)
    assert above == {}
