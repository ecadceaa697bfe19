"""tf.distribute (engine/distribute.py): the staged student loop and multi-grained KD (both Keras
fit on the engine) under MirroredStrategy on 2 logical CPUs, and under MultiWorkerMirroredStrategy
with 2 local worker processes, follow the single-device loss curve and end at its weights.

Dropout is off: replicas draw different dropout masks than one device does, by design.
Each run is its own process (tests/training_driver.py): logical devices and the multi-worker
strategy must be set up before TensorFlow initialises.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from test_resume import DRIVER, drive, result

pytestmark = pytest.mark.filterwarnings("ignore")


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def assert_same_curve(tmp_path, name, reference, rtol=1e-4, atol=1e-5):
    weights, record = result(tmp_path, name)
    ref_weights, ref_record = result(tmp_path, reference)
    assert len(record["epoch_losses"]) == len(ref_record["epoch_losses"]) > 1
    np.testing.assert_allclose(record["epoch_losses"], ref_record["epoch_losses"], rtol=rtol, atol=atol)
    for got, want in zip(weights, ref_weights):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert ref_record["max_change"] > 1e-3  # the final weights are trained ones, not the starting ones
    return record, ref_record


LOOPS = {"staged": {"loop": "staged", "strategy": "D3.2", "epochs": 1, "dropout": 0.0},
         "multigrained": {"loop": "multigrained", "epochs": 3, "dropout": 0.0}}


@pytest.mark.slow
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_mirrored_on_two_logical_cpus_follows_the_single_device_curve(tmp_path, loop):
    spec = LOOPS[loop]
    single = drive(tmp_path, "single", **spec)
    assert single.returncode == 0, single.stderr[-3000:]
    mirrored = drive(tmp_path, "mirrored", distribution="mirrored", logical_cpus=2, eager=False, **spec)
    assert mirrored.returncode == 0, mirrored.stderr[-3000:]
    assert "replicas=2" in mirrored.stdout
    record, ref = assert_same_curve(tmp_path, "mirrored", "single")
    if loop == "staged":
        steps, ref_steps = record["history"]["steps"], ref["history"]["steps"]
        np.testing.assert_allclose([s["val_losses"] for s in steps], [s["val_losses"] for s in ref_steps], rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_multi_worker_with_two_local_workers_follows_the_single_device_curve(tmp_path, loop):
    spec = LOOPS[loop]
    single = drive(tmp_path, "single", **spec)
    assert single.returncode == 0, single.stderr[-3000:]
    workers = [f"localhost:{port}" for port in free_ports(2)]
    path = tmp_path / "multi.json"
    path.write_text(json.dumps({"out": str(tmp_path / "multi.npz"), "distribution": "multi_worker",
                                "eager": False, **spec}))
    processes = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                      "task": {"type": "worker", "index": index}})}
        processes.append(subprocess.Popen([sys.executable, str(DRIVER), str(path)], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=3600) for p in processes]
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, err[-3000:]
    assert "replicas=2" in outputs[0][0]
    assert_same_curve(tmp_path, "multi", "single")
    # Both workers hold the same model at the end (one collective run, not two runs).
    chief, _ = result(tmp_path, "multi")
    other = np.load(tmp_path / "multi.npz.worker1.npz")
    for i, w in enumerate(chief):
        np.testing.assert_array_equal(other[f"w{i}"], w)
