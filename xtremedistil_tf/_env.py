"""Process environment that must be in place before TensorFlow is imported.

tf.keras must resolve to Keras 2 (tf-keras): `TFBertModel` cannot live inside a
Keras 3 functional model and Keras 3 cannot reload a SavedModel with
`load_model`. TensorFlow reads `TF_USE_LEGACY_KERAS` once, at import, so this
module is imported first by the package and by every entry point.
"""
import os
import sys
import tempfile

from xtremedistil_tf import stop
from xtremedistil_tf.console import IMPORT_NOISE

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if os.environ["TF_USE_LEGACY_KERAS"] != "1":
    raise RuntimeError(
        "xtremedistil_tf needs TF_USE_LEGACY_KERAS=1 (Keras 2 through tf-keras); "
        f"it is set to {os.environ['TF_USE_LEGACY_KERAS']!r}."
    )


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow and let it probe its devices (and run its first float16 kernel) with the
    process's stderr caught, then show only the lines that are not its load-time notices (CUDA probing on a CPU machine, oneDNN,
    "All log messages before absl::InitializeLog() ..."; `console.IMPORT_NOISE`). `--verbose` on
    the command line, or XTREMEDISTIL_VERBOSE=1, shows everything. A failed import shows all."""
    if "--verbose" in sys.argv or os.environ.get("XTREMEDISTIL_VERBOSE") == "1" or "tensorflow" in sys.modules:
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to catch
        return
    caught = tempfile.TemporaryFile()
    failed = True
    try:
        sys.stderr.flush()
        os.dup2(caught.fileno(), 2)
        # The one import that must stay here (ruff PLC0415 allowed): TensorFlow loads while stderr is caught, after
        # the environment above is set. A Ctrl-C meanwhile prints its line to the terminal's stderr (stop.py).
        with stop.console_at(saved):
            import tensorflow as tf  # noqa: PLC0415

            tf.config.list_physical_devices()  # CUDA probing happens here, while stderr is caught
            # oneDNN says once per process, at the first float16 kernel, that this CPU (no AVX512-FP16)
            # computes float16 with Eigen: the cached teacher states are float16, so say it here. In a
            # graph session of its own: an eager op would initialise the eager context, after which
            # logical devices and multi-worker collectives can no longer be configured (--distribution).
            # The session sees the CPU only, so that no GPU is set up before --distribution's settings.
            graph = tf.Graph()
            with graph.as_default(), tf.device("/CPU:0"):
                half = tf.constant(0.0, tf.float16) + tf.constant(1.0, tf.float16)
            cpu_only = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
            with tf.compat.v1.Session(graph=graph, config=cpu_only) as session:
                session.run(half)
        failed = False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", errors="replace")
        caught.close()

        shown = [line for line in text.splitlines() if failed or not IMPORT_NOISE.search(line)]
        if shown:
            sys.stderr.write("\n".join(shown) + "\n")


_import_tensorflow_quietly()
