"""bin/nas_search end to end on a tiny random teacher (slow: several proxy distillations)."""
import json
import os
import subprocess
import sys

import pytest
from transformers import TFBertModel

from tests.conftest import REPO
from tests.test_nas_distil import teacher_dir  # noqa: F401  (fixture)

TINY_SPACE = ["--layers=1,2", "--heads=2", "--hidden=8,16", "--intermediate=16", "--activations=relu"]


def nas_search(*args):
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, str(REPO / "bin" / "nas_search"), "--no_progress", *args],
                          capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
def test_search_report_resume_and_distil(teacher_dir, tmp_path):  # noqa: F811

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"john was in paris {'and berlin ' * (n % 4)}" for n in range(60)) + "\n")
    work = tmp_path / "work"
    common = [f"--teacher={teacher_dir}", f"--text_file={text}", f"--work_dir={work}", "--eval_sentences=10",
              "--max_seq_length=16", "--batch_size=8", "--latency_runs=1", "--latency_verify=1",
              "--latency_lengths=6", *TINY_SPACE]
    search = [*common, "--proxy_sentences=20", "--candidates=2", "--random_baselines=1", "--controller_epochs=2"]
    first = nas_search(*search, "--episodes=1")
    assert first.returncode == 0, first.stderr[-3000:]
    second = nas_search(*search, "--episodes=2")
    assert second.returncode == 0, second.stderr[-3000:]
    state = json.loads((work / "search_state.json").read_text())
    records = state["records"]
    assert [r["episode"] for r in records] == [1, 1, 2, 2] and len({r["arch"] for r in records}) == 4
    # 2 layer counts x 2 hidden sizes fit the 2-layer teacher's depth: all 4 states explored.
    assert {r["arch"] for r in records} == {"1,2,8,16,relu", "2,2,8,16,relu", "1,2,16,16,relu", "2,2,16,16,relu"}
    top = json.loads((work / "top_architectures.json").read_text())
    assert top[0]["reward"] == max(r["reward"] for r in records)
    report = (work / "report.md").read_text()
    assert all(r["arch"] in report for r in records) and "paper Table 3" in report
    assert (work / "loss_latency.png").read_bytes()[:4] == b"\x89PNG"
    table = json.loads((work / "latency_table.json").read_text())
    assert table["complete"] and table["teacher_ms"] > 0

    out = tmp_path / "student"
    distil = nas_search(*common, "--mode=distil", "--arch=best", "--distil_epochs=1", f"--output_dir={out}")
    assert distil.returncode == 0, distil.stderr[-3000:]
    info = json.loads((out / "distillation.json").read_text())
    assert info["arch"] == top[0]["arch"] and info["latency_ms"] == pytest.approx(top[0]["latency_ms"])
    assert TFBertModel.from_pretrained(str(out)).config.num_hidden_layers == int(top[0]["arch"].split(",")[0])

    bad = nas_search(*common, "--mode=distil", "--arch=3,2,8")
    assert bad.returncode == 2 and "expected 'layers,heads,hidden,intermediate,activation'" in bad.stderr
