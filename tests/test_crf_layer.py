"""The CRF Keras layer: training signal, decoding, and SavedModel / .keras round trips."""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.crf import ops
from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.errors import ConfigError

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _models(output_mode):
    """A small tagger: ids -> embedding (mask_zero) -> dense scores -> CRF."""
    mask, start, end = ops.allowed_transitions(LABELS, "IOB2")
    ids = tf.keras.Input([None], dtype=tf.int32)
    hidden = tf.keras.layers.Embedding(20, 8, mask_zero=True)(ids)
    scores = tf.keras.layers.Dense(len(LABELS))(hidden)
    crf = CRF(len(LABELS), allowed=mask, start_allowed=start, end_allowed=end, output_mode=output_mode, name="crf")
    return tf.keras.Model(ids, crf(scores)), crf


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 20, [4, 6]).astype(np.int32)
    ids[1, 4:] = 0  # padding -> lengths [6, 4, 6, 6]
    return ids


def test_decoded_tags_follow_the_scheme_and_mask():
    model, crf = _models("tags")
    crf_weights = np.full([5, 5], 3.0, np.float32)  # make every move attractive, so only the mask forbids
    model.build([None, None])
    crf.raw_transitions.assign(crf_weights)
    tags = model(_batch()).numpy()
    assert tags.shape == (4, 6) and tags.dtype == np.int32
    np.testing.assert_array_equal(tags[1, 4:], 0)
    allowed, start, _ = ops.allowed_transitions(LABELS, "IOB2")
    for row, length in zip(tags, [6, 4, 6, 6]):
        assert start[row[0]]
        assert all(allowed[a, b] for a, b in zip(row[: length - 1], row[1:length]))


def test_training_reduces_nll_and_keeps_forbidden_moves_fixed():
    model, crf = _models("potentials")
    ids = _batch()
    gold = np.array([[1, 2, 0, 3, 4, 0]] * 4, np.int32)
    lengths = tf.reduce_sum(tf.cast(ids > 0, tf.int32), axis=1)
    optimizer = tf.keras.optimizers.Adam(0.05)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = crf.nll(model(ids, training=True), gold, lengths)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    losses = [float(train_step()) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    transitions = crf.transitions.numpy()
    allowed, _, _ = ops.allowed_transitions(LABELS, "IOB2")
    np.testing.assert_array_equal(transitions[~allowed], ops.FORBIDDEN)
    decoded, _ = crf.decode(model(ids), lengths)
    np.testing.assert_array_equal(decoded.numpy()[0], gold[0])


@pytest.mark.parametrize("fmt", ["savedmodel", "keras"])
def test_save_and_reload_give_identical_outputs(tmp_path, fmt):
    model, crf = _models("tags")
    model.build([None, None])
    crf.raw_transitions.assign(np.random.default_rng(1).normal(0, 1, [5, 5]).astype(np.float32))
    potentials_model = tf.keras.Model(model.input, crf.input)
    ids = _batch()
    path = str(tmp_path / ("model" if fmt == "savedmodel" else "model.keras"))
    model.save(path)
    restored = tf.keras.models.load_model(path)
    np.testing.assert_array_equal(restored(ids).numpy(), model(ids).numpy())
    restored_crf = restored.get_layer("crf")
    assert isinstance(restored_crf, CRF) and restored_crf.get_config() == crf.get_config()
    np.testing.assert_array_equal(restored_crf.transitions.numpy(), crf.transitions.numpy())
    # Same transitions -> same Viterbi scores (not only the same argmax).
    lengths = np.array([6, 4, 6, 6])
    scores = potentials_model(ids)
    np.testing.assert_array_equal(
        restored_crf.decode(scores, lengths)[1].numpy(), crf.decode(scores, lengths)[1].numpy()
    )


def test_bad_configuration_is_reported():
    with pytest.raises(ConfigError, match="output_mode"):
        CRF(3, output_mode="probabilities")
    with pytest.raises(ConfigError, match="allowed must have shape"):
        CRF(3, allowed=np.ones([2, 2], bool))
    with pytest.raises(ConfigError, match="num_tags=3"):
        CRF(3)(tf.zeros([1, 2, 4]))
