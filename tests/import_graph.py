"""The package's import graph, its layers and the table docs/architecture.md shows.

    python tests/import_graph.py     # prints the table between the markers of docs/architecture.md

tests/test_imports.py checks the graph (no cycles, every arrow down the layers) and that the doc's table is
this script's output. Imports inside functions count: they hide a cycle rather than remove it.
"""
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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


# What each layer owns, for the table (the folder's docstring says more).
OWNS = {
    "": "user-facing errors, atomic writes and file hashes, console lines, the environment set before TensorFlow loads, "
        "Ctrl-C and SIGTERM recorded from the first line, damaged model files named, the one reader of text files, resident memory per step",
    "data": "readers, tag schemes, the served word split, word shapes, words <-> pieces and windows, splits, batches by length, token and span F1",
    "crf": "CRF ops (checked against tensorflow-addons' outputs), the CRF layer, word decoding under a tag scheme",
    "losses": "every loss as a tensor function, listed in losses/registry.py (docs/equations.md); uncertainty weighting",
    "engine": "the one epoch loop (seeds, best restore, patience, checkpoints, exact resume), tf.distribute, precision",
    "teachers": "BERT-family teachers through Auto classes, their fine-tuning and heads (softmax, CRF, sentence)",
    "transfer": "the teacher's outputs over the transfer set: computed once into the sharded cache, read back",
    "students": "BiLSTM, transformer and CRF students and their artifact (save, load, StudentMeta)",
    "methods": "the methods as tasks on the engine: staged XtremeDistil, multi-grained KD, classification, subwords, NAS",
    "export": "the TF Serving SavedModel, ONNX and TFLite exports (student and teacher), their predictors",
    "run": "bin/train's steps over one locked work dir, the ablations, report.md and its probes",
    "benchmarks": "bin/benchmark's subcommands, each beside an independent reference",
    "cli": "flags, --help and one-line errors of every bin/ command",
}
BEGIN, END = "<!-- import-graph: begin (python tests/import_graph.py) -->", "<!-- import-graph: end -->"


def layer_table() -> str:
    """Markdown: each layer, lowest first, what it owns and the layers its modules import (from the code)."""
    graph = import_graph()
    packages = {m for m, p in _module_names().items() if p.name == "__init__.py"}
    uses = {layer: set() for layer in LAYERS}
    count = dict.fromkeys(LAYERS, 0)
    for module, targets in graph.items():
        if module == ENTRY:
            continue
        here = layer_of(module, packages)
        count[here] += 1
        uses[here].update(layer_of(t, packages) for t in targets if t != ENTRY)
    roots = ", ".join(f"`{m.split('.')[-1]}`" for m in sorted(graph) if m != ENTRY and not layer_of(m, packages))
    name = lambda layer: f"`{layer}/`" if layer else f"root ({roots})"  # noqa: E731
    lines = [BEGIN, "| # | layer | modules | owns | imports (read from the code) |", "|---|---|---|---|---|"]
    for i, layer in enumerate(LAYERS):
        imported = ", ".join(f"`{u}/`" if u else "root" for u in LAYERS if u in uses[layer] and u != layer) or "-"
        lines.append(f"| {i} | {name(layer)} | {count[layer]} | {OWNS[layer]} | {imported} |")
    lines.append(END)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(layer_table() + "\n")
