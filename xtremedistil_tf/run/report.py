"""`write_report(work_dir)`: work_dir/report.md with the run's tables and plots.

Reads work_dir/metrics.json (teacher and student scores, parameters), work_dir/config.json (the
student's E and H, to match latency results) and, when present, a latency JSON written by
`bin/benchmark latency` (work_dir/latency.json, which `bin/benchmark latency --work_dir=W` writes
for W's own student; or `--output_json`). Plots are PNGs in work_dir/report_plots/, written
together (atomic_dir) before report.md, which links them:
    figure1.png    F1 against parameter compression and against speedup, one point per student
                   configuration (E, H) that has both a score and latency results, and the teacher
                   at 1x (paper Figure 1); report.md lists the same numbers
    languages.png  per-language F1 of teacher and student, when the scores have languages
    types.png      per-entity-type F1 of teacher and student (test split, else dev)
    curves.png     the teacher's dev F1 per epoch; the student's dev loss per epoch over every
                   unfreeze step of the staged loop (XtremeDistil Table 4 as a figure) with the dev
                   F1 after each step, or the multi-grained student's dev loss and F1 per epoch

The teacher's numbers are its metrics.json `scores`, decoded as the students are (pipeline.step_teacher);
the scores table adds its `argmax_scores` as `teacher (argmax)`. In the metrics.json of a run made before
the teacher step recorded decoded scores, the teacher's scores are argmax: the report shows them only
as `teacher (argmax)`, with a one-line hint (`with_argmax_teacher`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from xtremedistil_tf.data.scoring import predates_decoded_teacher_scores, seen_unseen_rows  # noqa: E402
from xtremedistil_tf.errors import ConfigError, DataFormatError  # noqa: E402
from xtremedistil_tf.io import atomic_dir, atomic_write_text, dir_size, markdown_table as _table, read_json  # noqa: E402
from xtremedistil_tf.run.probes import agreement, probe_rows  # noqa: E402

PLOTS_DIR = "report_plots"


def _models(metrics: dict) -> Dict[str, dict]:
    return {name: metrics[name] for name in ("teacher", "student") if name in metrics}


def read_metrics(work_dir) -> Tuple[dict, dict, Optional[str]]:
    """(metrics.json as `with_argmax_teacher` gives it, config.json or {}, the hint or None) of a work dir."""
    work_dir = Path(work_dir)
    config = read_json(work_dir / "config.json") if (work_dir / "config.json").exists() else {}
    metrics, hint = with_argmax_teacher(read_json(work_dir / "metrics.json"), config)
    return metrics, config, hint


def with_argmax_teacher(metrics: dict, config: dict) -> Tuple[dict, Optional[str]]:
    """(metrics, None), or for the metrics.json of a run made before the teacher step recorded its scores
    decoded as the students (a softmax token teacher's `scores` without "decode": argmax at each word's
    first piece) those scores as the teacher's `argmax_scores` and none as decoded, with a one-line hint."""
    teacher = metrics.get("teacher")
    if not teacher or "argmax_scores" in teacher or (config.get("teacher") or {}).get("head") == "crf" or \
            not predates_decoded_teacher_scores(teacher["scores"]):
        return metrics, None
    return ({**metrics, "teacher": {**teacher, "scores": {}, "argmax_scores": teacher["scores"]}},
            "The teacher has only argmax scores here (metrics.json is older than its scores decoded as the "
            "students): rerun the same bin/train command on this work dir to add them (one scoring pass), then "
            "bin/report.")


def score_rows(metrics: dict) -> List[List[str]]:
    rows = []
    for name, model in _models(metrics).items():
        for label, key in ((name, "scores"), (f"{name} (argmax)", "argmax_scores")):
            for split, s in model.get(key, {}).items():
                spread = (f"{s['f1_mean']:.4f} ± {s['f1_std']:.4f}" if len(s.get("languages", {})) > 1 else "")
                spans = f"{s['spans']['all']['f1']:.4f}" if "spans" in s else "-"
                rows.append([label, split, f"{s['all']['precision']:.4f}", f"{s['all']['recall']:.4f}",
                             f"{s['all']['f1']:.4f}", spans, spread])
    return rows


def seen_rows(metrics: dict) -> Tuple[Optional[str], List[List[str]]]:
    """(split, rows): teacher and student side by side on seen and unseen names of the test split (else dev),
    data/scoring.seen_unseen_rows; no rows for a run whose steps predate those scores."""
    models = {name: model["scores"] for name, model in _models(metrics).items()}
    split = next(filter(None, (_eval_split(scores) for scores in models.values())), None)
    return split, seen_unseen_rows({name: scores.get(split, {}).get("seen_unseen") for name, scores in models.items()})


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
        size = f"{dir_size(directory) / 2**20:.1f}" if directory.is_dir() else "-"
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
    student = config.get("student") or {}
    own = student.get("arch", student)   # the config.json of a run before StudentArch: one flat dict
    if "student" in metrics and own.get("embedding_dim") and own.get("hidden"):
        by_name.setdefault(f"{own['embedding_dim']}x{own['hidden']}", _test_f1(metrics["student"]["scores"]))
    points = []
    for entry in latency.get("students", []):
        f1 = entry.get("f1", by_name.get(entry["name"]))
        if f1 is not None:
            points.append({"name": entry["name"], "f1": f1, "compression": entry["compression"],
                           "speedup_batch1": entry["speedup_batch1"], "speedup_batch32": entry["speedup_batch32"]})
    return points


def figure1_rows(points: List[dict], teacher_f1: Optional[float]) -> List[List[str]]:
    """The numbers figure1.png plots: F1 (%), compression and speedups, the teacher (1x) first."""
    rows = [["teacher", f"{100 * teacher_f1:.2f}", "1.0x", "1.0x", "1.0x"]] if teacher_f1 is not None else []
    return rows + [[f"student {p['name']}", f"{100 * p['f1']:.2f}", f"{p['compression']:.1f}x",
                    f"{p['speedup_batch1']:.1f}x", f"{p['speedup_batch32']:.1f}x"] for p in points]


def plot_figure1(points: List[dict], path: Path, teacher_f1: Optional[float] = None) -> None:
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
        if teacher_f1 is not None:
            axis.plot([1.0], [100 * teacher_f1], "k*", markersize=10, label="teacher")
        axis.set_title(title)
        axis.set_xscale("log")
        axis.set_xlabel("x teacher (log scale)")
        axis.set_ylabel("F1 (%)")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_transfer_curve(points: Dict[str, List[Tuple[int, float, float]]], path: Path) -> None:
    """Student F1 as a share of the teacher's (%) against the number of unlabeled transfer sentences,
    one line per strategy ({strategy: [(sentences, share, std over seeds)]}; bin/ablate
    --transfer_sizes), with the teacher (100%) and the papers' 95% marked. Written atomically."""
    fig, axis = plt.subplots(figsize=(6.5, 4.2))
    for name, values in points.items():
        xs, ys, errors = zip(*sorted(values))
        axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
    axis.axhline(100.0, color="k", linewidth=1, label="teacher")
    axis.axhline(95.0, color="k", linewidth=1, linestyle=":", label="95% of the teacher")
    axis.set_xlabel("unlabeled transfer sentences")
    axis.set_ylabel("student F1 / teacher F1 (%)")
    axis.set_title("Student F1 against transfer-set size")
    axis.grid(alpha=0.3)
    axis.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def plot_languages(series: Dict[str, Dict[str, float]], path: Path) -> None:
    languages = sorted({lang for values in series.values() for lang in values})
    grouped_bars(series, languages, "Per-language F1", path)


def grouped_bars(series: Dict[str, Dict[str, float]], groups: List[str], title: str, path: Path) -> None:
    """F1 (%) bars: one group per x label in `groups`, one bar per series (label -> {group: F1})."""
    width = 0.8 / max(1, len(series))
    fig, axis = plt.subplots(figsize=(max(6, 0.5 * len(groups) * len(series) + 2), 4))
    for k, (label, values) in enumerate(series.items()):
        axis.bar([i + k * width for i in range(len(groups))],
                 [100 * values.get(group, 0.0) for group in groups], width, label=label)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)
    axis.set_ylabel("F1 (%)")
    axis.set_title(title)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _eval_split(scores: dict) -> Optional[str]:
    return "test" if "test" in scores else ("dev" if "dev" in scores else None)


def type_rows(metrics: dict) -> List[List[str]]:
    """Per entity type: P / R / F1 of each model on the test split (else dev), and the gold count."""
    models = {name: model["scores"][_eval_split(model["scores"])]["all"].get("types", {})
              for name, model in _models(metrics).items() if _eval_split(model["scores"])}
    kinds = sorted({kind for types in models.values() for kind in types})
    rows = []
    for kind in kinds:
        row, support = [kind], ""
        for types in models.values():
            t = types.get(kind)
            row.append(f"{100 * t['precision']:.1f} / {100 * t['recall']:.1f} / {100 * t['f1']:.1f}" if t else "-")
            support = str(t["support"]) if t else support
        rows.append(row + [support])
    return rows


def plot_types(metrics: dict, path: Path) -> None:
    series = {name: {kind: t["f1"] for kind, t in model["scores"][_eval_split(model["scores"])]["all"]
                     .get("types", {}).items()}
              for name, model in _models(metrics).items() if _eval_split(model["scores"])}
    grouped_bars(series, sorted({kind for values in series.values() for kind in values}), "F1 by entity type", path)


def training_curves(work_dir: Path) -> Dict[str, dict]:
    """What the training steps recorded (their step.json): the teacher's history and the student's."""
    curves = {}
    for name in ("teacher", "student"):
        step = work_dir / name / "step.json"
        if step.exists():
            history = read_json(step).get("info", {}).get("history")
            if history:
                curves[name] = history
    return curves


def plot_curves(curves: Dict[str, dict], path: Path) -> None:
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False)
    for axis, (name, history) in zip(axes[0], curves.items()):
        if name == "teacher":
            axis.plot([h["epoch"] for h in history], [100 * h["dev_f1"] for h in history], "o-")
            axis.set_xlabel("epoch")
            axis.set_ylabel("dev F1 (%)")
            axis.set_title("teacher fine-tuning")
        elif "steps" in history:  # the staged loop: dev loss per epoch over the unfreeze steps
            x, f1_x, f1_y = 0, [], []
            for step in history["steps"]:
                values = step["val_losses"]
                axis.plot(range(x, x + len(values) + 1), [step["initial_val_loss"]] + values, "-",
                          label=f"{step['stage_name']} +{'+'.join(step['unfrozen'])}")
                x += len(values)
                axis.axvline(x, color="0.85", linewidth=0.8)
                if step.get("dev_f1") is not None:
                    f1_x.append(x)
                    f1_y.append(100 * step["dev_f1"])
            axis.set_xlabel("epoch (over all unfreeze steps)")
            axis.set_ylabel("dev loss (each stage's own)")
            axis.set_yscale("log")
            axis.set_title(f"student {history.get('strategy', '')}")
            axis.legend(fontsize=6)
            if f1_x:
                twin = axis.twinx()
                twin.plot(f1_x, f1_y, "k*", label="dev F1 after the step")
                twin.set_ylabel("dev F1 (%)")
        else:  # multi-grained: per epoch
            epochs = history.get("epochs", [])
            axis.plot([e["epoch"] for e in epochs], [e["dev_loss"] for e in epochs], "o-", label="dev loss")
            axis.set_xlabel("epoch")
            axis.set_ylabel("dev loss")
            twin = axis.twinx()
            twin.plot([e["epoch"] for e in epochs], [100 * (e["dev_f1"] or 0) for e in epochs], "k*-")
            twin.set_ylabel("dev F1 (%)")
            axis.set_title("student (multi-grained)")
        axis.grid(alpha=0.3)
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


def read_latency(latency_json, work_dir: Path):
    """(path, results) of the latency results `--latency_json` names (it must exist), else of <work_dir>/latency.json
    when it exists (results None when not); a file that is not such JSON is one line naming it."""
    path = Path(latency_json) if latency_json else work_dir / "latency.json"
    if not path.exists() and not latency_json:
        return path, None
    flag = f"--latency_json={latency_json}" if latency_json else str(path)
    try:
        latency = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise ConfigError(f"{flag}: {error.strerror}") from None
    except ValueError as error:   # not UTF-8, not JSON
        raise DataFormatError(path, None, f"not JSON ({error}); expected the results of `bin/benchmark latency "
                                          "--output_json`") from None
    if not isinstance(latency, dict):
        raise DataFormatError(path, None, "a JSON object is expected (`bin/benchmark latency --output_json`'s "
                                          f"results); found {type(latency).__name__}")
    return path, latency


def write_report(work_dir, latency_json=None, probes_file=None) -> Path:
    """Write work_dir/report.md (and its plots); returns its path. `probes_file`: the probe sentences (one raw
    text a line; default: probes.DEFAULT_PROBES of the run's languages)."""
    work_dir = Path(work_dir)
    latency_path, latency = read_latency(latency_json, work_dir)
    metrics, config, hint = read_metrics(work_dir)

    # The dir's own name: not a symlink's that leads to it (runs/latest), nor "" for --work_dir=.
    lines = [f"# Report: {work_dir.resolve().name}", "", "## Scores (entity-level, seqeval)", "",
             "F1 is over the words the models see (the data's tokens in the served word split, docs/data.md); span F1 "
             "scores the same predictions on exact entity character spans of the raw text, what an export of the "
             "model gives on that text when it was trained on the served split (--word_split=bert, the default).", "", *([hint, ""] if hint else [])]
    lines += _table(["model", "split", "precision", "recall", "F1", "span F1", "F1 mean ± std over languages"],
                    score_rows(metrics))
    split, seen = seen_rows(metrics)
    if seen:
        lines += ["", f"## Seen and unseen names ({split} split)", "",
                  "Recall of the gold entities whose type and words (in the served word split, case counting) are "
                  "those of an entity of the labeled train split (seen) and of the others (unseen), and precision of "
                  "the predicted entities of each kind by the same rule; exact entity character spans of the raw "
                  "text (docs/data.md, \"Seen and unseen names\").", ""]
        lines += _table(["names", "gold entities"] + [f"{name} recall / precision" for name in _models(metrics)], seen)
    lines += ["", "## Parameters and size on disk", ""]
    lines += _table(["model", "parameters", "compression", "MiB on disk"], size_rows(metrics, work_dir))
    series = language_f1(metrics)
    points = figure1_points(metrics, config, latency)
    teacher_f1 = _test_f1(metrics["teacher"]["scores"]) if "teacher" in metrics else None
    types = type_rows(metrics)
    curves = training_curves(work_dir)
    with atomic_dir(work_dir / PLOTS_DIR) as tmp:
        if series:
            plot_languages(series, tmp / "languages.png")
        if points:
            plot_figure1(points, tmp / "figure1.png", teacher_f1)
        if types:
            plot_types(metrics, tmp / "types.png")
        if curves:
            plot_curves(curves, tmp / "curves.png")
    if types:
        models = [name for name, model in _models(metrics).items() if _eval_split(model["scores"])]
        split = next(filter(None, (_eval_split(model["scores"]) for model in _models(metrics).values())))
        lines += ["", f"## Scores by entity type ({split} split; precision / recall / F1, %)", ""]
        lines += _table(["type"] + models + ["gold entities"], types)
        lines += ["", f"![F1 by entity type]({PLOTS_DIR}/types.png)"]
    if curves:
        lines += ["", "## Training curves", "", f"![training curves]({PLOTS_DIR}/curves.png)"]
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
    if points:
        lines += ["", "## F1 vs compression and speedup (paper Figure 1)", "",
                  "F1 on the test split (else dev); compression and speedup over the teacher from the latency "
                  "results (best serving mode of each).", ""]
        lines += _table(["model", "F1 (%)", "compression", "speedup b1", "speedup b32"],
                        figure1_rows(points, teacher_f1))
        lines += ["", f"![F1 vs compression and speedup]({PLOTS_DIR}/figure1.png)"]
    probes = probe_rows(work_dir, probes_file)
    if probes:
        lines += ["", "## Probe sentences: names the training data does not hold", "",
                  "Each text in the served word split, tagged by the teacher (decoded as the students are) and by the "
                  "student: where they differ, the student has not learned what its teacher knows of names it never "
                  "saw (more unlabeled transfer text is the papers' remedy). The last column lists the capitalised "
                  "words of the text that the train split does hold, the last how many of the teacher's entities the "
                  "student finds too (same characters, same type). `bin/report --probes=<file>` (one raw text a "
                  "line) probes others.", ""]
        both, teacher_entities = agreement(probes)
        lines += _table(["text", "teacher", "student", "capitalised words in train", "student finds"], probes)
        lines += ["", f"The student finds {both} of the teacher's {teacher_entities} entities in these sentences"
                      + (f" ({both / teacher_entities:.0%})." if teacher_entities else ".")]
    path = work_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
