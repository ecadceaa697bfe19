"""Exact resume after a kill: a run SIGKILLed at several points and rerun each time ends with the
weights and metrics of an uninterrupted run with the same seed (engine/resume.py): the staged
XtremeDistil loop, multi-grained KD, KD-NAS distillation, subwords dual training and teacher fine-tuning.

Each run is a fresh process (tests/training_driver.py) that kills itself with SIGKILL, the way a
lost machine ends a run: nothing is flushed or cleaned up after the last epoch checkpoint.
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DRIVER = Path(__file__).resolve().parent / "training_driver.py"


def drive(tmp_path: Path, name: str, **spec) -> subprocess.CompletedProcess:
    spec = {"out": str(tmp_path / f"{name}.npz"), **spec}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return subprocess.run([sys.executable, str(DRIVER), str(path)], capture_output=True, text=True, timeout=3600)


def kill_and_rerun(tmp_path: Path, kills, **common) -> None:
    """The uninterrupted run ("reference"), then the same run ("resumed") SIGKILLed at each of
    `kills` ([epoch, batch] as in training_driver.py) and rerun each time, then run to its end."""
    reference = drive(tmp_path, "reference", **common)
    assert reference.returncode == 0, reference.stderr[-3000:]
    checkpoint = str(tmp_path / "checkpoints")
    for epoch, batch in kills:
        killed = drive(tmp_path, "resumed", checkpoint_dir=checkpoint, kill_at=[epoch, batch], **common)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert not (tmp_path / "resumed.npz").exists()
    finished = drive(tmp_path, "resumed", checkpoint_dir=checkpoint, **common)
    assert finished.returncode == 0, finished.stderr[-3000:]


def result(tmp_path: Path, name: str):
    data = np.load(tmp_path / f"{name}.npz")
    weights = [data[f"w{i}"] for i in range(len(data.files) - 1)]
    return weights, json.loads(str(data["record"]))


def assert_same_run(tmp_path, resumed: str, reference: str):
    weights, record = result(tmp_path, resumed)
    ref_weights, ref_record = result(tmp_path, reference)
    assert len(weights) == len(ref_weights)
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    steps, ref_steps = record["history"]["steps"], ref_record["history"]["steps"]
    assert [s["unfrozen"] for s in steps] == [s["unfrozen"] for s in ref_steps]
    for step, ref in zip(steps, ref_steps):
        np.testing.assert_allclose(step["val_losses"], ref["val_losses"], rtol=1e-6)
        assert step["best_epoch"] == ref["best_epoch"] and step["dev_f1"] == ref["dev_f1"]


@pytest.mark.slow
def test_staged_run_killed_three_times_ends_as_the_uninterrupted_one(tmp_path):
    # D4.2, 2 epochs per unfreeze step: stage 1 is epochs 1-2, stage 2's steps epochs 3-10,
    # stage 3's 11-18. Epochs are counted over the whole run, the killed parts included.
    kill_and_rerun(tmp_path, [(2, 3),    # mid stage 1, its second epoch (after the first epoch's checkpoint)
                              (7, 0),    # between unfreezing steps: stage 2's third step (+bilstm) is about to begin
                              (18, 1)],  # mid final step (stage 3, +word_embedding; 2 batches an epoch), its last epoch
                   loop="staged", strategy="D4.2", epochs=2)
    assert_same_run(tmp_path, "resumed", "reference")
    # The final run trained only what the last kill lost: part of one epoch redone.
    _, record = result(tmp_path, "resumed")
    assert len(record["epoch_losses"]) == 1


def history_values(record):
    """The loss history of a multi-grained, KD-NAS or subwords run, without wall times."""
    history = record["history"]
    if isinstance(history, dict) and "epochs" in history:  # multi-grained: each loss, lambda, dev loss
        return [[e["train_loss"], e["dev_loss"], *e["losses"].values(), *e["lambdas"].values()]
                for e in history["epochs"]]
    if isinstance(history, dict):
        return history["train_loss"]
    return [[v for k, v in sorted(epoch.items()) if k != "seconds"] for epoch in history]


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["multigrained", "nas", "subwords"])
def test_distillation_killed_twice_ends_as_the_uninterrupted_one(tmp_path, loop):
    # 4 engine epochs: multi-grained 4 batches each, KD-NAS 5, subwords 3 steps each (with dropout
    # on: stateful_dropout).
    kill_and_rerun(tmp_path, [(2, 2),   # mid second epoch, after the first epoch's checkpoint
                              (4, 0)],  # as the last epoch begins
                   loop=loop, epochs=4)
    weights, record = result(tmp_path, "resumed")
    ref_weights, ref_record = result(tmp_path, "reference")
    assert len(weights) == len(ref_weights) and ref_record["max_change"] > 1e-3
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert len(history_values(record)) == len(history_values(ref_record)) == 4
    np.testing.assert_allclose(history_values(record), history_values(ref_record), rtol=1e-6)
    if loop == "multigrained":  # the same epoch selected (on the dev NLL)
        assert record["history"]["best_epoch"] == ref_record["history"]["best_epoch"] > 0
    assert len(record["epoch_losses"]) == 1  # the final run trained only the last epoch


@pytest.mark.slow
@pytest.mark.parametrize("spec", [{"loop": "teacher"},
                                  # the classifier learns the toy texts at a larger rate; seed 6: its dev F1 peaks last
                                  {"loop": "sequence_teacher", "learning_rate": 1e-2, "seed": 6}])
def test_teacher_finetuning_killed_twice_ends_as_the_uninterrupted_one(tmp_path, spec):
    # A tiny random BERT token (or sentence-classification) teacher, dropout 0.1 (its generators
    # are reseeded every epoch; the token teacher on first-piece supervision): 3 epochs of 6
    # batches, the best dev F1 in the last epoch (the best weights, which the teacher is left with,
    # are the last epoch's).
    kill_and_rerun(tmp_path, [(2, 3),   # mid second epoch, after the first epoch's checkpoint
                              (3, 2)],  # mid last epoch, after the second's
                   epochs=3, **spec)
    weights, record = result(tmp_path, "resumed")
    ref_weights, ref_record = result(tmp_path, "reference")
    assert ref_record["best_epoch"] == 3 and ref_record["max_change"] > 1e-3
    assert len(weights) == len(ref_weights)
    for got, want in zip(weights, ref_weights):
        np.testing.assert_array_equal(got, want)
    assert record["history"] == ref_record["history"] and record["best_epoch"] == 3
    assert len(record["epoch_losses"]) == 1  # the final run trained only the last epoch
