"""The compact teacher-output cache (issue 30 item 1): windows at their real length, int8 hidden
states with a scale per position, top-k logits, hidden states only where a loss reads them, and
the old padded format refused."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.multigrained import MultiGrainedConfig
from xtremedistil_tf.methods.staged import DistilConfig, batched
from xtremedistil_tf.methods.student_run import check_cached
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.teachers.finetune import trim_to_longest
from xtremedistil_tf.transfer import cache

N, T, C, H = 60, 16, 7, 24
PAD_TAG = 9
SEQUENCE = {"input_ids": 0, "attention_mask": 0, "label_ids": 0, "logits": 0, "hidden": 0}


def windows(seed: int = 0) -> dict:
    """Padded windows as compute_window_outputs gives them: zeros (PAD_TAG for tags) past each length;
    hidden rows whose magnitudes span six orders, so one scale per window would lose the small ones."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, T + 1, N)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    real = mask[..., None].astype(np.float32)
    magnitude = 10.0 ** rng.uniform(-3, 3, (N, T, 1))
    return {"input_ids": rng.integers(1, 1000, (N, T)).astype(np.int32) * mask,
            "attention_mask": mask,
            "label_ids": np.where(mask > 0, rng.integers(0, PAD_TAG, (N, T)), PAD_TAG).astype(np.int32),
            "logits": (rng.normal(0, 3, (N, T, C)) * real).astype(np.float32),
            "hidden": (rng.normal(size=(N, T, H)) * magnitude * real).astype(np.float32)}


def write(out_dir, arrays: dict, ragged: bool = True, **options) -> dict:
    def compute(rows):
        return {k: v[rows] for k, v in arrays.items()}

    layout = {"ragged": {k: a for k, a in SEQUENCE.items() if k in arrays}, "pad_values": {"label_ids": PAD_TAG}}
    return cache.write_sharded(out_dir, N, compute, shard_size=25, batch_size=7, fingerprint={"test": 1},
                               progress=False, **(layout if ragged else {}), **options)


def read_padded(out_dir) -> dict:
    """Every example, padded back to T (the padded layout's arrays)."""
    ds = cache.padded_batch(cache.read_sharded(out_dir), N, cache.padding_values(out_dir), length=T)
    return {k: v.numpy() for k, v in next(iter(ds)).items()}


def per_row_bound(x: np.ndarray) -> np.ndarray:
    """Half a quantization step of the row's own scale, max|x_row| / 127 / 2 (plus float32 rounding)."""
    return np.abs(x).max(axis=-1, keepdims=True) / 254 * (1 + 1e-5) + 1e-30


def test_int8_round_trip_is_within_half_a_step_of_each_rows_scale(tmp_path):
    arrays = windows()
    write(tmp_path / "c", arrays, encodings={"hidden": "int8"})
    features = cache.load_manifest(tmp_path / "c")["features"]
    assert features["hidden"] == {"dtype": "int8", "shape": [None, H], "ragged_axis": 0, "pad": 0,
                                  "encoding": "int8", "scale_dtype": "float32"}
    read = read_padded(tmp_path / "c")
    x = arrays["hidden"]
    assert read["hidden"].dtype == np.float32
    assert np.all(np.abs(read["hidden"] - x) <= per_row_bound(x))
    # The same bound holds relative to each row, down to the smallest rows.
    real = arrays["attention_mask"] > 0
    relative = np.abs(read["hidden"] - x).max(-1)[real] / np.abs(x).max(-1)[real]
    assert relative.max() <= 1 / 254 * (1 + 1e-5)
    np.testing.assert_array_equal(read["hidden"][~real], 0)
    # One scale per window applied to every row (a wrong implementation) breaks the bound on small rows.
    scale = np.abs(x).max(axis=(-2, -1), keepdims=True) / 127
    per_window = np.clip(np.rint(x / np.where(scale > 0, scale, 1)), -127, 127) * scale
    assert not np.all(np.abs(per_window - x) <= per_row_bound(x))


def test_quantize_int8_zero_rows_and_extremes():
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [-1e-8, 3e-9, 0.0]], np.float32)
    q, scale = cache.quantize_int8(x)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    assert scale[0] == 0 and not q[0].any()
    assert np.abs(q).max() == 127 and q[1, 1] == -127
    assert np.all(np.abs(cache.dequantize_int8(q, scale) - x) <= per_row_bound(x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_top_k_logits_keep_the_top_k_probabilities_and_the_rest_mass(tmp_path):
    arrays = windows()
    k = 3
    write(tmp_path / "c", arrays, encodings={"logits": f"top{k}"}, dtypes={"hidden": "float16"})
    features = cache.load_manifest(tmp_path / "c")["features"]
    assert features["logits"]["encoding"] == "topk" and features["logits"]["k"] == k
    assert features["logits"]["index_dtype"] == "uint8"
    read = read_padded(tmp_path / "c")
    real = arrays["attention_mask"] > 0
    x, y = arrays["logits"][real], read["logits"][real]
    order = np.argsort(-x, axis=-1, kind="stable")
    top, rest = order[:, :k], order[:, k:]
    # The top k as computed, at their classes; the argmax kept.
    np.testing.assert_array_equal(np.take_along_axis(y, top, -1), np.take_along_axis(x, top, -1))
    np.testing.assert_array_equal(y.argmax(-1), x.argmax(-1))
    # Their probabilities, and the total probability of the other classes, within float32 rounding.
    p, q = softmax(x.astype(np.float64)), softmax(y.astype(np.float64))
    assert np.abs(np.take_along_axis(q, top, -1) - np.take_along_axis(p, top, -1)).max() < 1e-6
    mass = lambda probs: np.take_along_axis(probs, rest, -1).sum(-1)  # noqa: E731
    assert np.abs(mass(q) - mass(p)).max() < 1e-6
    # The rest spread evenly, below the k-th value.
    filled = np.take_along_axis(y, rest, -1)
    assert np.all(filled == filled[:, :1]) and np.all(filled[:, 0] <= np.take_along_axis(x, top[:, -1:], -1)[:, 0])
    np.testing.assert_array_equal(read["logits"][~real], 0)
    # Filling the rest with its mean logit (a wrong reconstruction) loses mass: the check above sees it.
    wrong = y.copy()
    np.put_along_axis(wrong, rest, np.take_along_axis(x, rest, -1).mean(-1, keepdims=True), -1)
    assert np.abs(mass(softmax(wrong.astype(np.float64))) - mass(p)).max() > 1e-3


def test_top_k_numpy_helpers_agree_with_the_reader():
    x = np.random.default_rng(3).normal(0, 4, (5, 11)).astype(np.float32)
    values, index, rest = cache.top_k(x, 4)
    full = cache.from_top_k(values, index, rest, 11)
    np.testing.assert_array_equal(full.argmax(-1), x.argmax(-1))
    p, q = softmax(x.astype(np.float64)), softmax(full.astype(np.float64))
    np.testing.assert_allclose(np.sort(q, -1)[:, -4:], np.sort(p, -1)[:, -4:], atol=1e-6)


@pytest.mark.parametrize("shuffle", [0, 17])
def test_padded_and_ragged_caches_give_the_same_batches_after_trimming(tmp_path, shuffle):
    arrays = windows()
    padded = write(tmp_path / "padded", arrays, ragged=False, dtypes={"hidden": "float16"})
    ragged = write(tmp_path / "ragged", arrays, dtypes={"hidden": "float16"})
    assert padded["features"]["label_ids"] == {"dtype": "int32", "shape": [T]}
    assert ragged["features"]["label_ids"] == {"dtype": "int32", "shape": [None], "ragged_axis": 0, "pad": PAD_TAG}
    assert ragged["total_bytes"] < padded["total_bytes"]

    def batches(out_dir):
        ds = batched(cache.read_sharded(out_dir), 8, shuffle_buffer=shuffle, seed=5, reshuffle=False,
                     padding=cache.padding_values(out_dir))
        return [{k: v.numpy() for k, v in trim_to_longest(b).items()} for b in ds]

    one, other = batches(tmp_path / "padded"), batches(tmp_path / "ragged")
    assert len(one) == len(other) == -(-N // 8)
    for a, b in zip(one, other):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_ragged_storage_refuses_values_past_the_length(tmp_path):
    arrays = windows()
    arrays["input_ids"][3] = 7      # ids past the length that the mask below drops
    arrays["attention_mask"][3] = 0
    arrays["attention_mask"][3, :2] = 1
    with pytest.raises(ConfigError, match=r"example 3: 'input_ids' holds values other than 0 past its real length"):
        write(tmp_path / "c", arrays)


def test_an_old_format_cache_is_refused_in_one_line(tmp_path):
    out = tmp_path / "c"
    write(out, windows())
    manifest = json.loads((out / cache.MANIFEST).read_text())
    (out / cache.MANIFEST).write_text(json.dumps({**manifest, "format_version": 1}))
    pattern = (rf"{out} holds a teacher-output cache of format v1 \(every window padded to --max_seq_length\); "
               r"this version reads v2 .* regenerate it \(bin/train --overwrite")
    for refused in (lambda: cache.read_sharded(out), lambda: write(out, windows()), lambda: cache.check_format(out)):
        with pytest.raises(ConfigError, match=pattern) as error:
            refused()
        assert "\n" not in str(error.value)
    assert not cache.cache_complete(out, {"test": 1})
    write(out, windows(), overwrite=True)
    assert cache.load_manifest(out)["format_version"] == cache.FORMAT_VERSION == 2


def test_the_cache_identity_covers_the_storage_options(tmp_path):
    out = tmp_path / "c"
    write(out, windows(), dtypes={"hidden": "float16"})
    for options, key in (({"encodings": {"hidden": "int8"}}, "spec.encodings"),
                         ({"encodings": {"hidden": "int8", "logits": "top3"}}, "spec.encodings"),
                         ({"dtypes": {"hidden": "float32"}}, "spec.dtypes")):
        with pytest.raises(ConfigError, match=rf"(?s)differing keys:.*\n  {key}: on disk"):
            write(out, windows(), **options)
    with pytest.raises(ConfigError, match="differing keys:\n  spec.length_key.*\n  spec.pad_values.*\n  spec.ragged"):
        write(out, windows(), ragged=False, dtypes={"hidden": "float16"})
    # Only the keys stored: a cache without hidden states is another cache.
    without = {k: v for k, v in windows().items() if k != "hidden"}
    with pytest.raises(ConfigError, match=r"(?s)differing keys:.*\n  spec.ragged: on disk"):
        write(out, without)


def test_the_transfer_fingerprint_covers_dtype_topk_hidden_and_format():
    cfg = pipeline.RunConfig(work_dir="unused")
    base = pipeline.transfer_fingerprint(cfg, {"teacher": 1})
    assert base["cache_format"] == cache.FORMAT_VERSION
    for change in ({"hidden_dtype": "int8"}, {"logits_topk": 3}, {"hidden": False}):
        changed = pipeline.RunConfig(work_dir="unused", transfer=pipeline.TransferConfig(**change))
        assert pipeline.transfer_fingerprint(changed, {"teacher": 1}) != base, change


def test_hidden_states_are_cached_only_for_students_that_read_them():
    reads = {name: pipeline.reads_hidden(DistilConfig(strategy=name))
             for name in ("D0", "D0-S", "D1", "D2", "D3.1", "D3.2", "D4.1", "D4.2")}
    assert reads == {"D0": False, "D0-S": False, "D1": False, "D2": True, "D3.1": True, "D3.2": True,
                     "D4.1": True, "D4.2": True}
    assert not pipeline.reads_hidden(MultiGrainedConfig(losses=("hard", "seq_ce", "token_em")))
    with pytest.raises(ConfigError, match="strategy D4.2 reads the teacher's hidden states"):
        pipeline.check_cache(DistilConfig(strategy="D4.2"), pipeline.TransferConfig(hidden=False))


def test_top_k_is_refused_with_the_logit_mse_before_any_work():
    topk = pipeline.TransferConfig(logits_topk=3)
    for name in ("D1", "D2", "D3.1", "D3.2", "D4.1", "D4.2"):
        with pytest.raises(ConfigError, match=rf"^--cache_logits_topk=3: strategy {name}'s logit loss "
                                              r"\(XtremeDistil Eq. 4, the MSE over all N logits\) needs every logit; "
                                              r"use --cache_logits_topk=0"):
            pipeline.check_cache(DistilConfig(strategy=name), topk)
    for student in (DistilConfig(strategy="D0"), DistilConfig(strategy="D0-S"),
                    MultiGrainedConfig(losses=("hard", "seq_ce", "token_em"))):
        pipeline.check_cache(student, pipeline.TransferConfig(logits_topk=3, hidden=False))


def test_a_cache_without_hidden_states_is_refused_for_a_student_that_reads_them(tmp_path):
    without = {k: v for k, v in windows().items() if k != "hidden"}
    write(tmp_path / "c", without)
    check_cached(tmp_path / "c", ["input_ids", "attention_mask", "label_ids", "logits"], "D1")
    with pytest.raises(ConfigError, match=r"cache in .* was written without \['hidden'\] .* strategy D4.2 reads "
                                          r"them: regenerate it \(bin/train --overwrite"):
        check_cached(tmp_path / "c", ["input_ids", "attention_mask", "logits", "hidden"], "D4.2")


def test_sequence_level_keys_stay_whole(tmp_path):
    """A classification cache: ids and mask ragged, label [] and [CLS] state [H] whole, int8 with one scale."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, T + 1, N)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": rng.integers(1, 50, (N, T)).astype(np.int32) * mask, "attention_mask": mask,
              "label_ids": rng.integers(0, 3, N).astype(np.int32),
              "hidden": rng.normal(size=(N, H)).astype(np.float32)}
    cache.write_sharded(tmp_path / "c", N, lambda rows: {k: v[rows] for k, v in arrays.items()},
                        fingerprint={}, ragged={"input_ids": 0, "attention_mask": 0}, encodings={"hidden": "int8"},
                        progress=False)
    element = cache.read_sharded(tmp_path / "c").element_spec
    assert element["label_ids"].shape == [] and element["hidden"].shape == [H]
    assert element["input_ids"].shape.as_list() == [None]
    read = read_padded(tmp_path / "c")
    np.testing.assert_array_equal(read["input_ids"], arrays["input_ids"])
    assert np.all(np.abs(read["hidden"] - arrays["hidden"]) <= per_row_bound(arrays["hidden"]))
    assert tf.reduce_all(tf.constant(read["label_ids"] == arrays["label_ids"]))


def test_the_transfer_step_reuses_a_cache_with_hidden_states_and_refuses_one_without(tmp_path):
    upstream = {"teacher": 1}
    cfg = pipeline.RunConfig(work_dir=str(tmp_path / "a"))
    reads_none = replace(cfg, transfer=replace(cfg.transfer, hidden=False))
    # A cache with hidden states serves a student that reads none, as it is (no teacher is loaded).
    work = WorkDir(tmp_path / "a")
    work.mark_done("transfer", pipeline.transfer_fingerprint(cfg, upstream))
    assert pipeline.step_transfer(work, reads_none, upstream) == pipeline.transfer_fingerprint(cfg, upstream)
    # One without them is refused for a student that reads them, naming the setting.
    work = WorkDir(tmp_path / "b")
    work.mark_done("transfer", pipeline.transfer_fingerprint(reads_none, upstream))
    with pytest.raises(ConfigError, match=r"transfer was made by another configuration \(transfer.hidden: False"):
        pipeline.step_transfer(work, cfg, upstream)
    # An old-format cache in the step dir is refused before anything else.
    (work.path("transfer") / cache.MANIFEST).write_text(json.dumps({"format": cache.FORMAT, "format_version": 1}))
    with pytest.raises(ConfigError, match="holds a teacher-output cache of format v1"):
        pipeline.step_transfer(work, cfg, upstream)
