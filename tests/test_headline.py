"""README's headline table is generated from docs/results/*.json (xtremedistil_tf/benchmarks/headline.py), every
number it shows is in docs/benchmarks.md, and setup.py, the package and CHANGELOG.md name one version."""
import json
import re

import xtremedistil_tf
from xtremedistil_tf.benchmarks import headline

from conftest import REPO


def test_readme_table_is_what_the_script_prints_from_the_recorded_json():
    """Regenerate with `python -m xtremedistil_tf.benchmarks.headline --write`."""
    assert headline.readme_block(REPO / "README.md") == headline.table(headline.load_rows(REPO / "docs" / "results"))


def test_every_number_of_the_table_is_in_benchmarks_md():
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    rows = headline.load_rows(REPO / "docs" / "results")
    assert rows
    for row in rows:
        cells = headline._cells(row, 1)
        numbers = re.findall(r"\d[\d,]*\.?\d*[x%]?", " | ".join(cells[3:8]))
        missing = [n for n in numbers if n not in benchmarks and n not in ("1", "32")]
        assert not missing, f"{row['file']}: {missing} not in docs/benchmarks.md"


def test_every_row_names_its_sources():
    for path in sorted((REPO / "docs" / "results").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if "headline" in record:
            assert record["sources"], path.name
            for source in record["sources"]:
                assert {"numbers", "command", "commit", "date", "machine", "from"} <= set(source), (path.name, source)


def test_a_row_can_read_its_speed_from_a_latency_peers_json(tmp_path):
    def row(model, runtime, fmt, quantize, b1, b32, kind="ids"):
        return {"model": model, "runtime": runtime, "format": fmt, "quantize": quantize, "input": kind,
                "latency_ms": {"batch1": b1, "batch32": b32}}
    peers = {"peers": {"threads": 1, "rows": [
        row("teacher", "tensorflow", "tf.function", "none", 10.0, 4.0),
        row("teacher", "onnxruntime", "onnx", "dynamic_int8", 3.0, 2.0),
        row("50x200", "tensorflow", "saved_model", "none", 2.0, 0.5),
        row("50x200", "tensorflow", "saved_model", "none", 9.0, 9.0, kind="text"),
        row("50x200", "onnxruntime", "onnx", "dynamic_int8", 0.25, 0.125),
    ]}}
    (tmp_path / "latency.json").write_text(json.dumps(peers))
    (tmp_path / "row.json").write_text(json.dumps({"headline": {
        "task": "NER, toy", "teacher": "t", "student": "s", "f1": {"teacher": 80.0, "student": 76.0},
        "parameters": {"teacher": 1000, "student": 100}, "speed": {"latency_json": "latency.json", "student": "50x200"},
        "cpu": "cpu", "note": "toy"}}))
    rows = headline.load_rows(tmp_path)
    assert [r["file"] for r in rows] == ["row.json"]
    assert headline.speedups(rows[0]) == {"tensorflow": [5.0, 8.0], "onnxruntime_int8": [12.0, 16.0]}
    block = headline.table(rows)
    assert ("| NER, toy [1] | t | s | 80.00 / 76.00 (95.0%) | not measured | 1,000 / 100 (10.0x fewer) | 5.0x / 8.0x | "
            "12.0x / 16.0x | cpu |") in block
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{headline.BEGIN}\nold\n{headline.END}\nrest\n")
    readme.write_text(headline.replace_block(readme.read_text(), block))
    assert headline.readme_block(readme) == block and readme.read_text().endswith("\nrest\n")
    record = json.loads((tmp_path / "row.json").read_text())
    record["headline"]["peer"] = {"spacy_f1": 71.5}
    (tmp_path / "row.json").write_text(json.dumps(record))
    assert "| 80.00 / 76.00 (95.0%) | 71.50 | 1,000 / 100" in headline.table(headline.load_rows(tmp_path))


def test_setup_py_the_package_and_the_changelog_name_one_version():
    setup_py = (REPO / "setup.py").read_text(encoding="utf-8")
    assert "version=VERSION" in setup_py and "__version__" in setup_py
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0][0] == xtremedistil_tf.__version__
    assert [v for v, _ in released] == sorted((v for v, _ in released), key=lambda v: tuple(map(int, v.split("."))),
                                              reverse=True)
