"""Students: outputs and layer names, masking, SVD init, frozen teacher embeddings, save/load."""
import numpy as np
import pytest
import tensorflow as tf
from helpers import predict_tags

import xtremedistil_tf  # noqa: F401
from xtremedistil_tf.data.alignment import Windows
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.students import (
    build_bilstm_classifier,
    build_bilstm_student,
    build_transformer_student,
    svd_reduce,
)

VOCAB, TAGS, TEACHER_HIDDEN = 40, 9, 10


def _bilstm(**kw):
    tf.keras.utils.set_random_seed(0)
    return build_bilstm_student(VOCAB, TAGS, embedding_dim=8, hidden=6, teacher_hidden=TEACHER_HIDDEN, **kw)


def _transformer(**kw):
    tf.keras.utils.set_random_seed(0)
    return build_transformer_student(VOCAB, TAGS, embedding_dim=8, depth=2, heads=2, ffn=16,
                                     teacher_hidden=TEACHER_HIDDEN, max_length=32, **kw)


def _batch(seed=0, lengths=(7, 4, 2), width=7):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (len(lengths), width)).astype(np.int32)
    mask = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int32)
    return {"input_ids": np.where(mask == 1, ids, 0).astype(np.int32), "attention_mask": mask}


@pytest.mark.parametrize("build,body", [(_bilstm, "bilstm"), (_transformer, "encoder")])
def test_outputs_names_and_heads_on_projection(build, body):
    model = build()
    out = model(_batch())
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "projection": (3, 7, TEACHER_HIDDEN), "logits": (3, 7, TAGS), "probs": (3, 7, TAGS)}
    names = {layer.name for layer in model.layers}
    assert {"word_embedding", body, "projection", "logits", "softmax"} <= names
    # Both heads read the projection (through dropout), as in the authors' code.
    for head in ("logits", "softmax"):
        assert model.get_layer(head).input.shape[-1] == TEACHER_HIDDEN
    assert model.get_layer("softmax").bias is None  # Eq. 1: W^s only
    np.testing.assert_allclose(out["probs"].numpy().sum(-1), 1.0, rtol=1e-5)
    assert np.all(out["projection"].numpy() >= -0.17)  # GELU's minimum is about -0.17


@pytest.mark.parametrize("build", [_bilstm, _transformer])
def test_padding_does_not_leak_into_real_positions(build):
    model = build()
    batch = _batch()
    reference = model(batch)
    # Other ids under the padding, and extra padding columns, change nothing at real positions.
    noisy = {"input_ids": np.concatenate([np.where(batch["attention_mask"] == 1, batch["input_ids"], 5),
                                          np.full((3, 4), 9, np.int32)], axis=1),
             "attention_mask": np.concatenate([batch["attention_mask"], np.zeros((3, 4), np.int32)], 1)}
    changed = model(noisy)
    real = batch["attention_mask"] == 1
    for key in ("projection", "logits", "probs"):
        np.testing.assert_allclose(changed[key].numpy()[:, :7][real], reference[key].numpy()[real], atol=1e-5)


def test_svd_reduce_spans_best_rank_e_approximation():
    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(50, 12)) @ np.diag(np.linspace(3, 0.1, 12))
    reduced = svd_reduce(matrix, 4)
    assert reduced.shape == (50, 4) and reduced.dtype == np.float32
    u, s, vt = np.linalg.svd(matrix, full_matrices=False)
    best = (u[:, :4] * s[:4]) @ vt[:4]
    # The reduced rows reconstruct the best rank-4 approximation through a linear map...
    back, *_ = np.linalg.lstsq(reduced.astype(np.float64), matrix, rcond=None)
    np.testing.assert_allclose(reduced @ back, best, atol=1e-4)
    # ...and keep its geometry: same Gram matrix, i.e. an isometry of the best subspace.
    np.testing.assert_allclose(reduced @ reduced.T, best @ best.T, atol=1e-3)
    centered = svd_reduce(matrix, 4, center=True)  # PCA
    np.testing.assert_allclose(centered.mean(0), 0.0, atol=1e-5)
    with pytest.raises(ConfigError, match="embedding_dim"):
        svd_reduce(matrix, 13)


def test_initial_and_frozen_teacher_embeddings():
    teacher = np.random.default_rng(1).normal(size=(VOCAB, 8)).astype(np.float32)
    model = _bilstm(embeddings=teacher, freeze_embeddings=True)
    layer = model.get_layer("word_embedding")
    np.testing.assert_array_equal(layer.get_weights()[0], teacher)
    assert not layer.trainable and layer.trainable_weights == []
    assert _bilstm(embeddings=svd_reduce(np.random.default_rng(2).normal(size=(VOCAB, 20)), 8)) is not None
    with pytest.raises(ConfigError, match="svd_reduce"):
        _bilstm(embeddings=np.zeros((VOCAB, 5), np.float32))


def test_classifier_uses_last_states():
    tf.keras.utils.set_random_seed(0)
    model = build_bilstm_classifier(VOCAB, 3, embedding_dim=8, hidden=6, teacher_hidden=TEACHER_HIDDEN)
    batch = _batch()
    out = model(batch)
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "projection": (3, TEACHER_HIDDEN), "logits": (3, 3), "probs": (3, 3)}
    padded = {k: np.pad(v, ((0, 0), (0, 3))) for k, v in batch.items()}
    np.testing.assert_allclose(model(padded)["probs"].numpy(), out["probs"].numpy(), atol=1e-6)


@pytest.mark.parametrize("build", [_bilstm, _transformer])
@pytest.mark.parametrize("suffix", ["", ".keras"])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_save_and_load_give_identical_predictions(tmp_path, build, suffix):
    model = build()
    batch = _batch(seed=3)
    path = str(tmp_path / f"student{suffix}")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    before, after = model(batch), loaded(batch)
    for key in before:
        np.testing.assert_array_equal(after[key].numpy(), before[key].numpy())
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]


def test_predict_tags_batches_by_length_and_matches_argmax():
    model = _bilstm()
    batch = _batch(seed=4, lengths=(3, 7, 5, 1), width=9)
    n = len(batch["input_ids"])
    windows = Windows(batch["input_ids"], batch["attention_mask"], np.zeros_like(batch["input_ids"]),
                      np.full_like(batch["input_ids"], -1), np.zeros(batch["input_ids"].shape, bool),
                      np.arange(n, dtype=np.int32), np.ones(n, np.int32))
    out = model(batch)
    real = batch["attention_mask"] == 1
    for head, key in (("softmax", "probs"), ("logits", "logits")):
        tags = predict_tags(model, windows, batch_size=2, head=head)
        np.testing.assert_array_equal(tags[real], out[key].numpy().argmax(-1)[real])
        assert np.all(tags[~real] == 0)


def test_bilstm_traces_only_the_plain_loop_on_cpu_with_the_same_outputs_and_gradients():
    """students.layers.plain_recurrence_on_cpu: on this GPU-less host a built student's LSTMs trace no cuDNN
    variant (what made each compiled train step cost 4-5 s more), and compute what the Keras default does."""
    plain = _bilstm()
    default = _bilstm()
    default.set_weights(plain.get_weights())
    lstms = [layer for layer in default.submodules if isinstance(layer, tf.keras.layers.LSTM)]
    assert lstms and all(not layer._could_use_gpu_kernel for layer in plain.submodules
                         if isinstance(layer, tf.keras.layers.LSTM))
    for layer in lstms:
        layer._could_use_gpu_kernel = True  # Keras' default: both implementations, Grappler picks one
    batch = {k: tf.constant(v) for k, v in _batch(lengths=(7, 4, 2)).items()}
    results = {}
    for name, model in (("plain", plain), ("default", default)):
        @tf.function
        def step(batch, model=model):
            with tf.GradientTape() as tape:
                out = model(batch, training=False)
                loss = tf.reduce_sum(out["projection"] * tf.cast(batch["attention_mask"], tf.float32)[..., None])
            return out["projection"], tape.gradient(loss, model.trainable_variables)
        graph = step.get_concrete_function(batch).graph.as_graph_def()
        traced = " ".join(f.signature.name for f in graph.library.function)
        results[name] = (step(batch), traced)
    assert "gpu_lstm" in results["default"][1] and "gpu_lstm" not in results["plain"][1]
    (out_plain, grads_plain), (out_default, grads_default) = results["plain"][0], results["default"][0]
    np.testing.assert_allclose(out_plain.numpy(), out_default.numpy(), rtol=0, atol=1e-6)
    assert [g is None for g in grads_plain] == [g is None for g in grads_default]
    compared = [(a, b) for a, b in zip(grads_plain, grads_default) if a is not None]
    assert len(compared) >= 6  # embeddings, both directions' kernels, recurrent kernels and biases, projection
    for a, b in compared:
        a, b = (tf.convert_to_tensor(g).numpy() for g in (a, b))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
