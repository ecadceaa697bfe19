"""Bounded memory of student training (issue 9, item 6): the input pipelines read from the teacher-output
cache only what the steps taken need plus a shuffle buffer of fixed size, never more for a larger
transfer set, and hold only the features their losses use. docs/benchmarks.md measures peak RSS at
10k and 100k windows (bin/benchmark memory); these tests check the mechanism on tiny caches."""
import shutil

import numpy as np
import pytest
import tensorflow as tf
from transformers import BertConfig, TFBertModel

from xtremedistil_tf import resident
from xtremedistil_tf.benchmarks import finetune_memory, memory
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.transfer.cache import load_manifest, read_sharded
from xtremedistil_tf.methods import multigrained as mg
from xtremedistil_tf.methods import student_run
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import source_keys, staged_sources

SHAPE = dict(seq=8, hidden=4, kbest=2)
BATCH, STEPS, LABELED = 8, 5, 40


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Tiny caches in the benchmark's layout: n and 5n windows (the first LABELED labeled), and a dev set."""
    root = tmp_path_factory.mktemp("memory")
    for name, size in (("small", 400), ("large", 2000), ("dev", 16)):
        memory.write_cache(root / name, size, labeled=LABELED, **SHAPE)
    return root


class Counter:
    """Wraps datasets so that every element pulled from them is counted (one count per wrap)."""

    def __init__(self):
        self.counts = []

    def wrap(self, ds):
        index = len(self.counts)
        self.counts.append(0)

        def count(x):
            self.counts[index] += 1
            return x

        return ds.map(lambda ex: (tf.py_function(count, [tf.constant(0)], tf.int32), ex)[1])

    def read_sharded(self, real):
        return lambda *args, **kwargs: self.wrap(real(*args, **kwargs))


def _pulled_by_staged(monkeypatch, directory, dev, shuffle_buffer=None):
    """Windows the staged transfer pipeline pulls from the cache for STEPS batches."""
    counter = Counter()
    monkeypatch.setattr(student_run, "read_sharded", counter.read_sharded(student_run.read_sharded))
    cfg = DistilConfig(batch_size=BATCH, seed=0)
    _, transfer_for, _ = staged_sources(cfg, directory, dev, LABELED, shuffle_buffer=shuffle_buffer)
    transfer_ds = transfer_for(0)
    assert sum(1 for _ in transfer_ds.take(STEPS)) == STEPS
    train_count, transfer_count, dev_count = counter.counts
    assert train_count == dev_count == 0
    return transfer_count


def test_staged_transfer_reads_the_same_for_a_5x_larger_cache(caches, monkeypatch):
    buffer = min(50_000, 10 * BATCH)  # the default
    small = _pulled_by_staged(monkeypatch, caches / "small", caches / "dev")
    large = _pulled_by_staged(monkeypatch, caches / "large", caches / "dev")
    assert small == large <= buffer + STEPS * BATCH + 1
    assert _pulled_by_staged(monkeypatch, caches / "large", caches / "dev", shuffle_buffer=16) <= 16 + STEPS * BATCH + 1


def test_staged_sets_hold_only_what_their_losses_use(caches):
    train_for, transfer_for, dev_ds = staged_sources(DistilConfig(batch_size=BATCH), caches / "small",
                                                     caches / "dev", LABELED)
    train_ds, transfer_ds = train_for(0), transfer_for(0)
    # The labeled set is shuffled whole: ids, mask and tags only, never the hidden states.
    assert set(train_ds.element_spec) == {"input_ids", "attention_mask", "label_ids"}
    assert set(transfer_ds.element_spec) == {"input_ids", "attention_mask", "label_ids", "logits", "hidden"}
    assert "hidden" in dev_ds.element_spec   # dev selects every stage, so it keeps every target
    assert sum(int(b["input_ids"].shape[0]) for b in train_ds) == LABELED
    assert source_keys("D0-S", "transfer") == ("input_ids", "attention_mask", "label_ids")
    with pytest.raises(ConfigError, match="shuffle_buffer"):
        staged_sources(DistilConfig(), caches / "small", caches / "dev", LABELED, shuffle_buffer=0)


def _pulled_by_multigrained(directory, shuffle_buffer):
    """Windows train_multigrained's stream pulls from the cache for STEPS batches."""
    counter = Counter()
    config = mg.MultiGrainedConfig(batch_size=BATCH, kbest=2, shuffle_buffer=shuffle_buffer)
    source = counter.wrap(read_sharded(directory))
    stream = mg._stream(source, mg._needed_keys(config.losses, list(source.element_spec)), config, shuffle=True)
    assert sum(1 for _ in stream.take(STEPS)) == STEPS
    return counter.counts[0]


def test_multigrained_stream_reads_at_most_its_shuffle_buffer_ahead(caches):
    # prefetch(AUTOTUNE) may run a few batches ahead; nothing scales with the cache.
    bound = 64 + (STEPS + 8) * BATCH
    assert _pulled_by_multigrained(caches / "small", 64) <= bound
    assert _pulled_by_multigrained(caches / "large", 64) <= bound
    # The default buffer holds the whole of a cache smaller than it (a full shuffle).
    assert _pulled_by_multigrained(caches / "small", mg.MultiGrainedConfig().shuffle_buffer) == 400


def test_synthetic_cache_layout(caches):
    features = load_manifest(caches / "small")["features"]
    assert features["hidden"] == {"dtype": "float16", "shape": [8, 4]}
    assert features["kbest_tags"] == {"dtype": "uint8", "shape": [2, 8]}
    labels = np.stack([ex["label_ids"].numpy() for ex in read_sharded(caches / "small").take(LABELED + 5)])
    assert (labels[:LABELED] != memory.PAD_ID).any(axis=1).all()
    assert (labels[LABELED:] == memory.PAD_ID).all()


@pytest.mark.slow   # four tiny fine-tunings, a minute on 2 cores (in CI's slow subset)
def test_finetune_memory_rows_run_the_reference_and_the_package_step(tiny_bert_dir, tmp_path):
    """bin/benchmark finetune_memory's two loops on a tiny saved teacher, whole batch and micro-batches of 2: each
    trains and reports its RSS once built and its peak, which cannot be below it."""
    model = TFBertModel(BertConfig.from_pretrained(tiny_bert_dir))
    model(model.dummy_inputs)
    model.save_pretrained(tmp_path)
    shutil.copy(tiny_bert_dir / "vocab.txt", tmp_path)
    for micro in (0, 2):
        for loop in (finetune_memory.reference, finetune_memory.package):
            result = loop(str(tmp_path), micro, steps=2, batch=5, seq=8)
            # The peak cannot be below the RSS once built, up to the kernel's per-CPU counter slack.
            assert 100 < result["built_mib"] <= result["peak_mib"] + resident.counter_slack_mib(), \
                (loop.__name__, micro, result)
