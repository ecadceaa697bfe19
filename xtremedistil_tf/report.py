"""`write_report(work_dir)`: work_dir/report.md with the run's tables and plots.

Reads work_dir/metrics.json (teacher and student scores, parameters), work_dir/config.json (the
student's E and H, to match latency results) and, when present, a latency JSON written by
`bin/benchmark latency --output_json` (default location work_dir/latency.json). Plots are PNGs in
work_dir/report_plots/, written together (atomic_dir) before report.md, which links them:
    figure1.png    F1 against parameter compression and against speedup, one point per student
                   configuration (E, H) that has both a score and latency results (paper Figure 1)
    languages.png  per-language F1 of teacher and student, when the scores have languages
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from xtremedistil_tf.io import atomic_dir, atomic_write_text, read_json  # noqa: E402

PLOTS_DIR = "report_plots"


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _models(metrics: dict) -> Dict[str, dict]:
    return {name: metrics[name] for name in ("teacher", "student") if name in metrics}


def score_rows(metrics: dict) -> List[List[str]]:
    rows = []
    for name, model in _models(metrics).items():
        for split, s in model["scores"].items():
            spread = (f"{s['f1_mean']:.4f} ± {s['f1_std']:.4f}" if len(s.get("languages", {})) > 1 else "")
            rows.append([name, split, f"{s['all']['precision']:.4f}", f"{s['all']['recall']:.4f}",
                         f"{s['all']['f1']:.4f}", spread])
    return rows


def language_f1(metrics: dict) -> Dict[str, Dict[str, float]]:
    """{"teacher test": {lang: F1}, ...} for each model and split with per-language scores."""
    series = {}
    for name, model in _models(metrics).items():
        for split, s in model["scores"].items():
            if s.get("languages"):
                series[f"{name} {split}"] = {lang: v["f1"] for lang, v in s["languages"].items()}
    return series


def size_rows(metrics: dict, work_dir: Path) -> List[List[str]]:
    rows = []
    for name, model in _models(metrics).items():
        directory = work_dir / name
        size = f"{_dir_size(directory) / 2**20:.1f}" if directory.is_dir() else "-"
        ratio = (f"{metrics['teacher']['parameters'] / model['parameters']:.1f}x"
                 if name != "teacher" and "teacher" in metrics else "")
        rows.append([name, f"{model['parameters']:,}", ratio, size])
    return rows


def _test_f1(scores: dict) -> Optional[float]:
    split = scores.get("test") or scores.get("dev")
    return split["all"]["f1"] if split else None


def figure1_points(metrics: dict, config: dict, latency: Optional[dict]) -> List[dict]:
    """Student configurations with an F1 (test, else dev) and latency results, as plot points.

    F1 comes from the latency entry itself ("f1"), metrics.json "students" keyed by "ExH", or the
    run's own student when config.json's E and H match the entry.
    """
    if not latency:
        return []
    by_name = {name: _test_f1(s["scores"]) for name, s in metrics.get("students", {}).items()}
    own = config.get("student") or {}
    if "student" in metrics and own.get("embedding_dim") and own.get("hidden"):
        by_name.setdefault(f"{own['embedding_dim']}x{own['hidden']}", _test_f1(metrics["student"]["scores"]))
    points = []
    for entry in latency.get("students", []):
        f1 = entry.get("f1", by_name.get(entry["name"]))
        if f1 is not None:
            points.append({"name": entry["name"], "f1": f1, "compression": entry["compression"],
                           "speedup_batch1": entry["speedup_batch1"], "speedup_batch32": entry["speedup_batch32"]})
    return points


def plot_figure1(points: List[dict], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for axis, keys, title in ((left, [("compression", "parameters")], "F1 vs parameter compression"),
                              (right, [("speedup_batch32", "batch 32"), ("speedup_batch1", "batch 1")],
                               "F1 vs speedup")):
        for key, label in keys:
            xs, ys = [p[key] for p in points], [100 * p["f1"] for p in points]
            axis.plot(xs, ys, "o", label=label)
            for p, x, y in zip(points, xs, ys):
                axis.annotate(f"({p['name'].replace('x', ', ')})", (x, y), fontsize=8,
                              textcoords="offset points", xytext=(4, 4))
        axis.set_title(title)
        axis.set_xlabel("x teacher")
        axis.set_ylabel("F1 (%)")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_languages(series: Dict[str, Dict[str, float]], path: Path) -> None:
    languages = sorted({lang for values in series.values() for lang in values})
    width = 0.8 / len(series)
    fig, axis = plt.subplots(figsize=(max(6, 0.5 * len(languages) * len(series) + 2), 4))
    for k, (label, values) in enumerate(series.items()):
        axis.bar([i + k * width for i in range(len(languages))],
                 [100 * values.get(lang, 0.0) for lang in languages], width, label=label)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(languages))], languages)
    axis.set_ylabel("F1 (%)")
    axis.set_title("Per-language F1")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def latency_rows(latency: dict) -> List[List[str]]:
    def best(entry, batch):
        mode, ms = min(entry["latency_ms"][batch].items(), key=lambda kv: kv[1])
        return f"{ms:.3f} ({mode})"

    teacher = latency["teacher"]
    rows = [["teacher", f"{teacher['parameters']:,}", f"{teacher['size_bytes'] / 2**20:.1f}",
             best(teacher, "batch1"), best(teacher, "batch32"), "", "", ""]]
    for s in latency["students"]:
        rows.append([s["name"], f"{s['parameters']:,}", f"{s['size_bytes'] / 2**20:.1f}", best(s, "batch1"),
                     best(s, "batch32"), f"{s['compression']:.1f}x", f"{s['speedup_batch1']:.1f}x",
                     f"{s['speedup_batch32']:.1f}x"])
    return rows


def write_report(work_dir, latency_json=None) -> Path:
    """Write work_dir/report.md (and its plots); returns its path."""
    work_dir = Path(work_dir)
    metrics = read_json(work_dir / "metrics.json")
    config = read_json(work_dir / "config.json") if (work_dir / "config.json").exists() else {}
    latency_path = Path(latency_json) if latency_json else work_dir / "latency.json"
    latency = read_json(latency_path) if latency_path.exists() else None

    lines = [f"# Report: {work_dir.name}", "", "## Scores (entity-level, seqeval)", ""]
    lines += _table(["model", "split", "precision", "recall", "F1", "F1 mean ± std over languages"],
                    score_rows(metrics))
    lines += ["", "## Parameters and size on disk", ""]
    lines += _table(["model", "parameters", "compression", "MiB on disk"], size_rows(metrics, work_dir))
    series = language_f1(metrics)
    points = figure1_points(metrics, config, latency)
    with atomic_dir(work_dir / PLOTS_DIR) as tmp:
        if series:
            plot_languages(series, tmp / "languages.png")
        if len(points) > 1:
            plot_figure1(points, tmp / "figure1.png")
    if series:
        languages = sorted({lang for values in series.values() for lang in values})
        lines += ["", "## Per-language F1", ""]
        lines += _table(["language"] + list(series),
                        [[lang] + [f"{values[lang]:.4f}" if lang in values else "-" for values in series.values()]
                         for lang in languages])
        lines += ["", f"![per-language F1]({PLOTS_DIR}/languages.png)"]
    if latency:
        lines += ["", f"## Latency ({latency['queries']} queries of {latency['seq_length']} pieces, "
                      f"ms per query, best serving mode)", "", f"From {latency_path}.", ""]
        lines += _table(["model", "parameters", "MiB", "batch 1", "batch 32", "compression", "speedup b1",
                         "speedup b32"], latency_rows(latency))
    if len(points) > 1:
        lines += ["", "## F1 vs compression and speedup (paper Figure 1)", "",
                  f"![F1 vs compression and speedup]({PLOTS_DIR}/figure1.png)"]
    path = work_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
