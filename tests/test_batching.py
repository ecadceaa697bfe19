"""data/batching.group_by_length: batches of windows of similar length, every window once per epoch."""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.data.batching import group_by_length
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.staged import DistilConfig, batched
from xtremedistil_tf.run.pipeline import student_fingerprint
from xtremedistil_tf.teachers.finetune import arrays_dataset

N, T, B, GROUP = 203, 40, 8, 5    # N is not a multiple of B or of GROUP x B


def windows(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, N)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, np.arange(N)[:, None] + 1, 0).astype(np.int32)   # row i holds i + 1
    return {"input_ids": ids, "attention_mask": mask, "label_ids": np.where(mask > 0, 1, -1).astype(np.int32)}, lengths


def batches_of(ds):
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


def test_every_window_once_in_batches_of_similar_length_and_less_padding():
    data, lengths = windows()
    ds = tf.data.Dataset.from_tensor_slices(data).shuffle(N, seed=3, reshuffle_each_iteration=False)
    grouped = batches_of(group_by_length(ds, B, GROUP, seed=1, reshuffle=False, padding={"label_ids": -1}))
    plain = batches_of(ds.batch(B))
    rows = [int(r) - 1 for b in grouped for r in b["input_ids"][:, 0]]
    assert sorted(rows) == list(range(N))                              # each window exactly once
    assert [len(b["input_ids"]) for b in grouped].count(B) >= N // B - GROUP
    for b in grouped:                                                   # values survive the padding
        r = b["input_ids"][:, 0] - 1
        np.testing.assert_array_equal(b["attention_mask"].sum(1), lengths[r])
        assert (b["label_ids"][b["attention_mask"] == 0] == -1).all()
    # The windows of one group (GROUP x B consecutive shuffled windows) are cut into batches in length order.
    order = [int(r) - 1 for b in plain for r in b["input_ids"][:, 0]]
    for g in range(0, N, GROUP * B):
        members = set(order[g:g + GROUP * B])
        mine = [lengths[b["input_ids"][:, 0] - 1] for b in grouped if int(b["input_ids"][0, 0]) - 1 in members]
        assert sum(len(m) for m in mine) == len(members)
        spans = sorted((m.min(), m.max()) for m in mine)
        assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))   # no two batches interleave
    work = lambda bs: sum(len(b["attention_mask"]) * b["attention_mask"].sum(1).max() for b in bs)
    assert work(grouped) < 0.8 * work(plain)
    again = batches_of(group_by_length(ds, B, GROUP, seed=1, reshuffle=False, padding={"label_ids": -1}))
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(grouped, again))   # seeded


def test_the_training_loops_take_it_and_trim_each_batch():
    data, lengths = windows(1)
    teacher = batches_of(arrays_dataset(data, B, shuffle=True, seed=2, reshuffle=False, group=GROUP))
    assert sorted(int(r) - 1 for b in teacher for r in b["input_ids"][:, 0]) == list(range(N))
    for b in teacher:   # trimmed to the batch's longest window
        assert b["input_ids"].shape[1] == lengths[b["input_ids"][:, 0] - 1].max()
    ragged = tf.data.Dataset.from_generator(
        lambda: ({k: v[i, :lengths[i]] for k, v in data.items()} for i in range(N)),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in data})
    student = batches_of(batched(ragged, B, shuffle_buffer=10 * B, seed=4, reshuffle=False,
                                 padding={"label_ids": -1}, group=GROUP))
    assert sorted(int(r) - 1 for b in student for r in b["input_ids"][:, 0]) == list(range(N))
    with pytest.raises(ConfigError, match="group >= 1"):
        group_by_length(ragged, B, 0)


def test_off_leaves_the_student_fingerprint_as_before_the_option():
    assert "group_by_length" not in student_fingerprint(DistilConfig())
    assert student_fingerprint(DistilConfig(group_by_length=10))["group_by_length"] == 10
