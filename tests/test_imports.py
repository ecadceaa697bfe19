"""The package's imports point one way (issue 31): no cycle between modules or between subpackages
(counting imports inside functions, which hide a cycle rather than remove it), and every arrow points
down the layer order of docs/architecture.md."""
from import_graph import (BEGIN, END, ENTRY, LAYERS, _module_names, against_the_layers, cycles,
                          import_graph, layer_of, layer_table, packages_of)

from conftest import REPO

def test_the_walk_sees_imports_inside_functions():
    graph = import_graph()
    # pipeline imports the teacher loader inside a function, the CLI modules import it at the top
    assert "xtremedistil_tf.teachers.saved" in graph["xtremedistil_tf.run.pipeline"]
    assert "xtremedistil_tf.run.pipeline" in graph["xtremedistil_tf.cli.train"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


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


def test_architecture_md_shows_the_graph_as_it_is():
    """docs/architecture.md's layer table is `python tests/import_graph.py`'s output (rerun it after a move)."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert doc[doc.index(BEGIN): doc.index(END) + len(END)] == layer_table()
