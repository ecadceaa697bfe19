"""README's headline table, generated from the recorded results in docs/results/*.json.

    python -m xtremedistil_tf.benchmarks.headline            # print the table (with its markers)
    python -m xtremedistil_tf.benchmarks.headline --write    # replace the table in README.md

Every JSON file in docs/results/ with a "headline" object is one row (docs/results/README.md shows the fields);
rows are ordered by "order", then file name. To add a row, drop in a new file; to replace one, overwrite its file;
then run the command with --write (tests/test_headline.py checks that README's table is what it prints).

A row's speed-ups either are given per runtime as recorded ("teacher_ms", "student_ms" per batch of 1 and 32, and
"speedup" where the benchmark printed it from unrounded times), or are read from the JSON that
`bin/benchmark latency --latency_peers --output_json=...` writes ("latency_json": a file beside it, "student": the
student's name there): TensorFlow is the student's SavedModel against the teacher's `tf.function`, ONNX Runtime int8
the student's int8 export against the teacher's, ids in, at the run's thread count.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
README = REPO / "README.md"
BEGIN = "<!-- headline: begin (python -m xtremedistil_tf.benchmarks.headline --write; do not edit by hand) -->"
END = "<!-- headline: end -->"
RUNTIMES = (("tensorflow", "TensorFlow"), ("onnxruntime_int8", "ONNX Runtime int8"))
# (runtime, format, quantize) of the teacher and the student row of each runtime in a --latency_peers JSON.
PEER_ROWS = {
    "tensorflow": (("tensorflow", "tf.function", "none"), ("tensorflow", "saved_model", "none")),
    "onnxruntime_int8": (("onnxruntime", "onnx", "dynamic_int8"), ("onnxruntime", "onnx", "dynamic_int8")),
}
BATCHES = ("batch1", "batch32")


def load_rows(results: Path = RESULTS) -> List[dict]:
    """The "headline" object of every results file that has one, each with its file's name as "file"."""
    rows = []
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if "headline" in record:
            rows.append({**record["headline"], "file": path.name, "dir": path.parent})
    return sorted(rows, key=lambda row: (row.get("order", 0), row["file"]))


def peer_speedups(latency_json: Path, student: str) -> Dict[str, List[float]]:
    """{runtime: [batch-1, batch-32 speed-up]} of `student` over the teacher, from a --latency_peers JSON (its
    "peers") or a `bin/benchmark deployed` one (its rows at the top; the student is "student")."""
    result = json.loads(latency_json.read_text(encoding="utf-8"))
    rows = result.get("peers", result)["rows"]

    def ms(model: str, key: tuple) -> dict:
        found = [r for r in rows if r["model"] == model and r["input"] == "ids"
                 and (r["runtime"], r["format"], r["quantize"]) == key]
        if len(found) != 1:
            raise ValueError(f"{latency_json}: {len(found)} rows of {model} {key}, ids in; expected one")
        return found[0]["latency_ms"]

    speedups = {}
    for runtime, (teacher_key, student_key) in PEER_ROWS.items():
        teacher, row = ms("teacher", teacher_key), ms(student, student_key)
        speedups[runtime] = [teacher[b] / row[b] for b in BATCHES]
    return speedups


def speedups(row: dict) -> Dict[str, Optional[List[float]]]:
    """{runtime: [batch 1, batch 32] or None (not measured)} for one row."""
    speed = row.get("speed") or {}
    if "latency_json" in speed:
        return peer_speedups(Path(row["dir"]) / speed["latency_json"], speed["student"])
    found: Dict[str, Optional[List[float]]] = {}
    for runtime, _ in RUNTIMES:
        entry = speed.get(runtime)
        if not entry:
            found[runtime] = None
        elif "speedup" in entry:
            found[runtime] = list(entry["speedup"])
        else:
            found[runtime] = [t / s for t, s in zip(entry["teacher_ms"], entry["student_ms"])]
    return found


def _cells(row: dict, number: int) -> List[str]:
    f1, params = row["f1"], row["parameters"]
    ratio = {runtime: (f"{pair[0]:.1f}x / {pair[1]:.1f}x" if pair else "not measured")
             for runtime, pair in speedups(row).items()}
    spacy = (row.get("peer") or {}).get("spacy_f1")
    return [f"{row['task']} [{number}]", row["teacher"], row["student"],
            f"{f1['teacher']:.2f} / {f1['student']:.2f} ({100 * f1['student'] / f1['teacher']:.1f}%)",
            "not measured" if spacy is None else f"{spacy:.2f}",
            f"{params['teacher']:,} / {params['student']:,} ({params['teacher'] / params['student']:.1f}x fewer)",
            *(ratio[runtime] for runtime, _ in RUNTIMES), row["cpu"]]


def table(rows: Sequence[dict]) -> str:
    """The markdown table and one note per row, between BEGIN and END."""
    header = ["task, data", "teacher", "student", "served F1: teacher / student",
              "spaCy on the same labels: served F1", "parameters: teacher / student",
              *(f"speed-up, {name}: batch 1 / 32" for _, name in RUNTIMES), "CPU, threads"]
    lines = [BEGIN, "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cells(row, i)) + " |" for i, row in enumerate(rows, 1)]
    for i, row in enumerate(rows, 1):
        lines += ["", f"[{i}] {row['note']}"]
    lines.append(END)
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with the part from BEGIN to END replaced by `block`."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block + text[end:]


def readme_block(readme: Path = README) -> str:
    """README's table as it stands, from BEGIN to END."""
    text = readme.read_text(encoding="utf-8")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xtremedistil_tf.benchmarks.headline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of results files")
    parser.add_argument("--write", action="store_true", help="replace the table in README.md instead of printing it")
    args = parser.parse_args(argv)
    block = table(load_rows(args.results))
    if args.write:
        README.write_text(replace_block(README.read_text(encoding="utf-8"), block), encoding="utf-8")
        print(f"README.md: headline table of {len(load_rows(args.results))} rows from {args.results}")
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
