"""Write a teacher-output cache in a fresh process, as one worker of TF_CONFIG's cluster (or alone
without it), for tests/test_cache_workers.py.

    python tests/cache_worker_driver.py spec.json

spec.json: {"teacher": a saved teacher dir, "out": the cache dir, "sentences": n (toy sentences, seed 3),
            "max_len": pieces per window, "shard_size": n, "batch_size": n,
            "hang_from": null or an example index: computing a batch that starts there or later sleeps
            (the test SIGKILLs the process there, mid-shard)}
Prints "manifest <num_shards>" when write_teacher_outputs returns.
"""
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["HF_HUB_OFFLINE"] = "1"
import xtremedistil_tf  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

from conftest import toy_ner_sentences  # noqa: E402
from xtremedistil_tf.data.alignment import encode  # noqa: E402
from xtremedistil_tf.teachers.saved import load_teacher  # noqa: E402
from xtremedistil_tf.transfer import outputs  # noqa: E402
from xtremedistil_tf.engine.distribute import limit_threads, worker_of_cluster  # noqa: E402
from xtremedistil_tf.transfer.cache import worker_part  # noqa: E402


def windows_and_teacher(spec):
    teacher, tokenizer = load_teacher(spec["teacher"])
    windows = encode(toy_ner_sentences(spec["sentences"], seed=3), tokenizer, teacher.tag_vocab, spec["max_len"])
    return windows, teacher


def write(spec, windows, teacher):
    return outputs.write_teacher_outputs(teacher, windows, spec["out"], layer=1, fingerprint={"test": "workers"},
                                         shard_size=spec["shard_size"], batch_size=spec["batch_size"],
                                         progress=False)


if __name__ == "__main__":
    SPEC = json.loads(Path(sys.argv[1]).read_text())
    limit_threads(1)   # two workers on a 2-core machine
    if SPEC.get("hang_from") is not None:
        compute = outputs.compute_window_outputs

        def hanging(run, windows, rows, first_pieces=False):
            if min(rows) >= SPEC["hang_from"]:
                time.sleep(600)
            return compute(run, windows, rows, first_pieces)

        outputs.compute_window_outputs = hanging
    windows, teacher = windows_and_teacher(SPEC)
    with worker_part(*worker_of_cluster()):
        manifest = write(SPEC, windows, teacher)
    print("manifest", manifest["num_shards"], flush=True)
