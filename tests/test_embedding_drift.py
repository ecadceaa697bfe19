"""bin/benchmark embedding_drift (issue 50, item 3): a student's word embeddings against their SVD start, by where
its training text holds each piece, and what the test's unseen names are made of."""
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from test_bad_inputs import ENV
from test_deployed_benchmark import finished_work_dir  # noqa: F401  (a module fixture: a tiny finished run)

from xtremedistil_tf.benchmarks import embedding_drift
from xtremedistil_tf.errors import ConfigError


@pytest.mark.slow   # a pipeline run (the fixture), then the teacher and student loaded
def test_pieces_the_student_never_read_keep_their_start_and_the_rest_moved(finished_work_dir, tmp_path):
    result = embedding_drift.measure(finished_work_dir)
    groups = result["groups"]
    vocab = (finished_work_dir / "student" / "vocab.txt").read_text(encoding="utf-8").split()
    assert sum(g["pieces"] for g in groups.values()) == len(vocab) == 93   # conftest.write_tiny_vocab's
    # Rows no window looks up get no gradient: exactly where the SVD put them.
    assert groups["neither"]["pieces"] > 0 and groups["neither"]["distance"] == 0.0
    assert groups["neither"]["cosine"] == pytest.approx(1.0)
    assert groups["labeled"]["distance"] > 0.0 and groups["labeled"]["cosine"] < 1.0
    for kind, pieces in result["test_entity_pieces"].items():
        if pieces["pieces"]:
            assert sum(pieces[g] for g in embedding_drift.GROUPS) == pytest.approx(1.0), kind
    assert result["test_entity_pieces"]["seen"]["neither"] == 0.0   # a seen name's pieces are in the labels
    out = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "embedding_drift",
                          f"--work_dir={finished_work_dir}"], capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == embedding_drift.format_lines(result)
    with pytest.raises(ConfigError, match=r"student is missing"):
        embedding_drift.measure(finished_work_dir, tmp_path / "student")
    assert np.isfinite(groups["transfer only"]["relative"]) or groups["transfer only"]["pieces"] == 0
