"""What a user sees: each command's --help lists its own flags (never TensorFlow's), and a run's
console shows the project's lines with correct epoch counters and none of the libraries' noise."""
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, toy_ner_sentences
from test_pipeline import write_conll
from xtremedistil_tf import console
from xtremedistil_tf.console import _forward, duration, epoch_line
from xtremedistil_tf.engine.callbacks import BatchBar
from xtremedistil_tf.engine.loop import Engine, FitOptions

ENV = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "HF_HUB_OFFLINE": "1"}
ENV.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user's shell has: nothing set
NOISE = ("functional_saver", "cuda", "I0000", "Some weights of", "absl::InitializeLog", "oneDNN",
         "INFO:tensorflow:", "WARNING:tensorflow:")

# Each command, and flags its --help must list (its own, not another command's).
COMMANDS = {
    "train": ["--data_format", "--teacher_supervision", "--teacher_head_init", "--strategy", "--work_dir"],
    "ablate": ["--strategies", "--variants", "--teacher"],
    "benchmark": ["--repeats", "--students", "--memory_sizes", "--teacher_epochs"],
    "evaluate": ["--model", "--output_json"],
    "export": ["--prune_vocab", "--xla_lengths", "--model_name"],
    "predict": ["--model"],
    "report": ["--work_dir"],
    "distil_lm": ["--hidden", "--variant"],
    "nas_search": ["--mode", "--arch"],
    "transfer_text": ["--source", "--max_sentences", "--output"],
    "fetch_teacher": ["--teacher", "--wheels_dir"],
}


def test_duration_and_epoch_line():
    assert [duration(s) for s in (5, 252, 3780)] == ["5s", "4m12s", "1h03m"]
    assert epoch_line("teacher", 1, 3, 252, loss=0.49, dev_f1=0.732) == \
        "[teacher] epoch 1/3  loss 0.4900  dev F1 73.20  (4m12s)"
    assert epoch_line("student", 2, 10, 3, "D4.2 stage 2/3 (logits) step 1/4 +logits", loss=0.1, dev_f1=None) == \
        "[student] D4.2 stage 2/3 (logits) step 1/4 +logits epoch 2/10  loss 0.1000  (3s)"


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_every_commands_help_lists_its_own_flags():
    procs = {name: subprocess.Popen([sys.executable, str(REPO / "bin" / name), "--help"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=ENV) for name in COMMANDS}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err[-2000:])
        for flag in COMMANDS[name]:
            assert re.search(rf"^  (--|--\[no\]){flag[2:]} \(default", out, re.M), (name, flag)
        # TensorFlow's and absl's own flags are not ours to list; nor is another command's.
        assert not re.search(r"--(\[no\])?(tpu|test_srcdir|xml_output_file|logtostderr)\b", out), name
        if name not in ("train", "ablate", "benchmark"):
            assert "--teacher_supervision" not in out, name
        assert out.rstrip().splitlines()[-1].startswith(f"Example: {'echo' if name == 'predict' else 'bin/' + name}")
        assert not any(noise in out + err for noise in NOISE), (name, err[-2000:])


def test_helpfull_adds_flagfile_but_no_tensorflow_flags():
    out = subprocess.run([sys.executable, str(REPO / "bin" / "export"), "--helpfull"], capture_output=True, text=True,
                         env=ENV, timeout=300).stdout
    assert "--flagfile (default" in out and "--[no]prune_vocab (default" in out
    assert not re.search(r"--(\[no\])?(tpu|test_srcdir|xml_output_file|logtostderr|verbosity)\b", out)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("console")
    write_conll(root / "train.txt", toy_ner_sentences(120, seed=1))
    write_conll(root / "dev.txt", toy_ner_sentences(30, seed=2))
    result = subprocess.run(
        [sys.executable, str(REPO / "bin" / "train"), "--data_format=conll", f"--data_dir={root}",
         "--train_file=train.txt", "--dev_file=dev.txt", f"--teacher={tiny_bert_dir}", "--teacher_random_init",
         "--teacher_layer=1", "--max_seq_length=16", "--teacher_epochs=2", "--patience=2",
         "--teacher_learning_rate=3e-3", "--strategy=D3.1", "--epochs_per_layer=2", "--student_patience=2",
         "--student_hidden=8", "--student_embedding_dim=8", "--student_batch_size=32", "--shard_size=100",
         f"--work_dir={root / 'work'}"],
        capture_output=True, text=True, env=ENV, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


# tiny_run is a whole bin/train in a subprocess: the two tests that read its console are in the slow tier, and CI
# runs them (Makefile CI_SLOW_TESTS). No default-tier test stands in for them.
@pytest.mark.slow
def test_a_run_shows_no_library_noise(tiny_run):
    for noise in NOISE:
        assert noise not in tiny_run, noise
    assert "Epoch 1/1" not in tiny_run and "Epoch 2/2" not in tiny_run  # Keras' per-fit-call counters


@pytest.mark.slow
def test_epoch_lines_count_the_steps_epochs(tiny_run):
    teacher = re.findall(r"^\[teacher\] epoch (\d)/(\d)  loss [\d.]+  dev F1 [\d.]+  \([0-9hms]+\)$", tiny_run, re.M)
    assert teacher == [("1", "2"), ("2", "2")]
    # D3.1: stage 1 (representation) and stage 2 (labels + logits), one end-to-end step each, 2 epochs.
    student = re.findall(r"^\[student\] D3\.1 stage (\d)/2 \(([^)]+)\) step 1/1 \+\S+ epoch (\d)/(\d)  loss", tiny_run,
                         re.M)
    assert [(s, e, n) for s, _, e, n in student] == [("1", "1", "2"), ("1", "2", "2"), ("2", "1", "2"), ("2", "2", "2")]
    assert "dev F1 None" not in tiny_run


def test_quiet_import_leaves_devices_configurable_and_says_the_float16_notice_early():
    """The package's import catches TensorFlow's one-time notices (oneDNN's float16 one included)
    without initialising the eager context: logical devices, and so --distribution's virtual CPUs
    and multi-worker collectives, can still be configured after `import xtremedistil_tf`."""
    code = ("import sys, xtremedistil_tf, tensorflow as tf\n"
            "cpu = tf.config.list_physical_devices('CPU')[0]\n"
            "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
            "tf.cast(tf.io.decode_raw(tf.constant(b'\\x00\\x3c'), tf.float16), tf.float32)\n"
            "print(len(tf.config.list_logical_devices('CPU')))\n")
    env = {k: v for k, v in os.environ.items() if k != "XTREMEDISTIL_VERBOSE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "2"
    assert "DT_HALF" not in result.stderr and "oneDNN" not in result.stderr, result.stderr[-2000:]


def test_stderr_filter_drops_library_log_lines_and_keeps_everything_else():
    """After the import, TensorFlow's C++ lines of noise (oneDNN's per-graph "supports DT_BOOL only on
    platforms with AVX-512", an E line) are dropped from a command's stderr; errors, blank lines, a line
    that only mentions CUDA, and a progress bar's text before a C++ line stay, in order."""
    onednn = (b"2026-11-26 11:20:33.123456: E tensorflow/core/util/util.cc:131] oneDNN supports DT_BOOL only on "
              b"platforms with AVX-512. Falling back to the default Eigen-based implementation if present.\n")
    absl = b"I0000 00:00:1764151233.123456  4242 cuda_executor.cc:1] could not open cuda drivers\n"
    real_error = b"2026-11-26 11:20:34.000001: E tensorflow/core/framework/op_kernel.cc:1] OOM when allocating\n"
    chunks = [b"error: --data_dir: CUDA_data does not exist\n", onednn, b"\n", b"\r[student] 25%|##  | 1/4",
              onednn[:-1] + b"\n" + absl, real_error, b"\r[student] 50%"]
    source_read, source_write = os.pipe()
    target_read, target_write = os.pipe()
    for chunk in chunks:
        os.write(source_write, chunk)
    os.close(source_write)
    _forward(source_read, target_write)
    os.close(source_read)
    os.close(target_write)
    with os.fdopen(target_read, "rb") as shown:
        assert shown.read() == (b"error: --data_dir: CUDA_data does not exist\n\n\r[student] 25%|##  | 1/4" + real_error
                                + b"\r[student] 50%")


def test_a_command_filters_its_stderr_until_exit():
    """Through console.setup: a oneDNN line written to fd 2 after setup is gone, the lines around it
    (the last one written just before exit, unflushed by the filter thread yet) are shown."""
    code = ("import os, sys, xtremedistil_tf\n"
            "from xtremedistil_tf import console\n"
            "console.setup(False)\n"
            "print('before', file=sys.stderr, flush=True)\n"
            "os.write(2, b'2026-11-26 11:20:33.123456: E tensorflow/core/util/util.cc:131] oneDNN supports DT_BOOL\\n')\n"
            "print('after', file=sys.stderr)\n"
            "sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=ENV,
                            timeout=300)
    assert result.returncode == 3
    assert result.stderr.splitlines()[-2:] == ["before", "after"], result.stderr[-2000:]
    assert "oneDNN" not in result.stderr


def test_stderr_filter_keeps_draining_when_the_real_stderr_is_gone():
    """A closed real stderr (stderr piped to a reader that quit) must not leave writers blocked on a full pipe:
    the filter reads everything to EOF and drops it."""
    source_read, source_write = os.pipe()
    target_read, target_write = os.pipe()
    os.close(target_read)  # writing to target_write now fails (EPIPE; SIGPIPE is ignored by Python)
    data = b"x" * 100 + b"\n"
    for _ in range(100):  # 10 KB: fits the pipe, so the writer does not need the reader to run first
        os.write(source_write, data)
    os.close(source_write)
    _forward(source_read, target_write)
    assert os.read(source_read, 1) == b""  # read to EOF
    os.close(source_read)
    os.close(target_write)


def test_the_old_spelling_still_runs_and_says_it_is_deprecated():
    """bin/distill_lm (the old spelling of bin/distil_lm) runs the same command and says which to use."""
    done = subprocess.run([sys.executable, str(REPO / "bin" / "distill_lm"), "--help"], capture_output=True,
                          text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bin/distill_lm is deprecated (the old spelling): use bin/distil_lm" in done.stderr
    assert re.search(r"^  --hidden \(default", done.stdout, re.M)


def test_progress_bars_of_batches_of_unknown_count_get_the_last_epochs_count_as_total(capsys):
    """Batches grouped by length have no known count (Keras' params["steps"] is None): the first epoch's bar counts
    them, each later epoch's bar over the same stage's data shows that count as its total (so a time left), and an
    estimate short of an epoch's batches grows to the count."""
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((40, 2), np.float32), np.ones((40, 1), np.float32)))
    unknown = lambda seed, epoch: data.filter(lambda x, y: True).batch(8)   # noqa: E731  (5 batches, count unknown)
    totals = []

    class Totals(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                totals.append(self.params.get("steps"))

    engine = Engine(verbose=True, callbacks=[Totals()])
    bars = []
    original = BatchBar.on_epoch_begin

    def seen(self, epoch, logs=None):
        original(self, epoch, logs)
        bars.append(self.bar.total)

    BatchBar.on_epoch_begin = seen
    try:
        engine.fit(model, FitOptions(unknown, epochs=3, baseline=False, where=(0, 0)))
        engine.fit(model, FitOptions(unknown, epochs=1, baseline=False, where=(0, 1)))   # the same stage, next step
        engine.fit(model, FitOptions(unknown, epochs=1, baseline=False, where=(1, 0)))   # another stage's data
    finally:
        BatchBar.on_epoch_begin = original
    assert totals == [None] * 5   # Keras never knew the count
    assert bars == [None, 5, 5, 5, None]
    short = BatchBar("x", estimate=3)
    short.params = {"steps": None}
    short.on_epoch_begin(0)
    for batch in range(5):
        short.on_train_batch_end(batch)
    assert (short.bar.total, short.count) == (5, 5)
    short.on_epoch_end(0)


def test_the_root_loggers_records_reach_the_console_only_from_our_code():
    """ONNX Runtime's quantizer logs "Quantization parameters for tensor ... not specified" with logging.info, the root
    logger: such records are dropped unless they are errors; the project's own (its package or bin/) are shown."""
    def record(name, path, level=logging.INFO):
        return logging.LogRecord(name, level, path, 1, "message", None, None)

    ours = console._ProjectOnly()
    quantizer = str(Path(logging.__file__).parent / "onnxruntime" / "quantization" / "onnx_quantizer.py")
    assert not ours.filter(record("root", quantizer))
    assert not ours.filter(record("root", quantizer, logging.WARNING))
    assert ours.filter(record("root", quantizer, logging.ERROR))
    assert ours.filter(record("root", str(REPO / "xtremedistil_tf" / "run" / "pipeline.py")))
    assert ours.filter(record("root", str(REPO / "bin" / "train")))
    assert not ours.filter(record("tf2onnx.tfonnx", str(REPO / "xtremedistil_tf" / "x.py")))
    assert ours.filter(record("xtremedistil_tf.export.formats", quantizer))
