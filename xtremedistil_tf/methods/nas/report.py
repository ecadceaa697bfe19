"""What a search leaves behind: top architectures, a markdown report, a loss-latency PNG."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from xtremedistil_tf.io import atomic_write_text, markdown_table  # noqa: E402


def _scores(r: dict) -> List[str]:
    return [f"{r['loss']:.4f}", f"{r['latency_ms']:.2f}", f"{r['reward']:.4f}"]


def _row(r: dict) -> List[str]:
    predicted = "" if r.get("predicted") is None else f"{r['predicted']:.4f}"
    return [str(r.get("episode", "")), r["arch"], str(r.get("source", "")), predicted, *_scores(r)]


def _mean_std(values) -> str:
    return f"{np.mean(values):.4f} ± {np.std(values):.4f}"


def comparison_table(top: List[dict], baselines: List[dict]) -> List[str]:
    """The paper's Table 3: chosen architectures against random ones (mean ± std per seed)."""
    rows = []
    for seed in sorted({b["seed"] for b in baselines}):
        runs = [b for b in baselines if b["seed"] == seed]
        rows.append([f"random, seed {seed} ({len(runs)} archs)", "; ".join(b["arch"] for b in runs),
                     *(_mean_std([b[key] for b in runs]) for key in ("loss", "latency_ms", "reward"))])
    rows += [[f"KD-NAS #{n}", r["arch"], *_scores(r)] for n, r in enumerate(top, start=1)]
    return markdown_table(["model", "architecture", "loss", "CPU latency (ms)", "reward"], rows)


def write_report(path, records: List[dict], top: List[dict], baselines: List[dict], header: dict,
                 latency_error: Optional[float], plot_name: str) -> None:
    lines = ["# KD-NAS search report", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    if latency_error is not None:
        lines.append(f"- latency model (overhead + layers x block) mean absolute relative error on full models: "
                     f"{100 * latency_error:.1f}%")
    lines += ["", "## Top architectures", ""]
    lines += markdown_table(["#", "architecture", "loss", "CPU latency (ms)", "reward"],
                            [[str(n), r["arch"], *_scores(r)] for n, r in enumerate(top, start=1)])
    if baselines:
        lines += ["", "## KD-NAS against random architectures (paper Table 3)", ""] + comparison_table(top, baselines)
    lines += ["", "## Every explored state", ""]
    lines += markdown_table(["episode", "architecture (L,A,H,I,act)", "source", "predicted reward", "loss",
                             "CPU latency (ms)", "reward"], [_row(r) for r in records])
    lines += ["", f"![loss against latency]({plot_name})", ""]
    atomic_write_text(path, "\n".join(lines))


def plot_loss_latency(path, records: List[dict], top: List[dict], baselines: List[dict]) -> None:
    """Scatter of proxy loss against CPU latency; the top architectures and random baselines marked."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter([r["latency_ms"] for r in records], [r["loss"] for r in records], s=18, c="tab:blue",
               alpha=0.6, label="explored")
    if baselines:
        ax.scatter([b["latency_ms"] for b in baselines], [b["loss"] for b in baselines], s=30, marker="x",
                   c="tab:gray", label="random baselines")
    ax.scatter([r["latency_ms"] for r in top], [r["loss"] for r in top], s=60, facecolors="none",
               edgecolors="tab:red", label="top")
    for r in top:
        ax.annotate(r["arch"], (r["latency_ms"], r["loss"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("CPU latency, batch 1 (ms)")
    ax.set_ylabel("proxy distillation loss")
    ax.set_title("KD-NAS: loss against latency")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
