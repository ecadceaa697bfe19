"""Uncertainty weighting (Cipolla et al.; multi-grained KD Eq. 9) and the equal-sum alternative."""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.uncertainty import EqualWeighting, UncertaintyWeighting, loss_weighting

LOSSES = np.array([0.7, 2.5, 0.05], np.float32)
LOG_LAMBDAS = np.array([0.3, -1.2, 2.0], np.float32)


def _layer():
    layer = UncertaintyWeighting(3)
    layer.build([3])
    layer.log_lambdas.assign(LOG_LAMBDAS)
    return layer


def test_importing_the_package_registers_both_layers():
    get = tf.keras.utils.get_registered_object
    assert get("xtremedistil_tf>UncertaintyWeighting") is UncertaintyWeighting
    assert get("xtremedistil_tf>EqualWeighting") is EqualWeighting


def test_value_is_weighted_sum_minus_half_log_lambdas():
    lam = np.exp(LOG_LAMBDAS)
    expected = (lam * LOSSES).sum() - 0.5 * np.log(lam).sum()
    layer = _layer()
    np.testing.assert_allclose(layer(tf.constant(LOSSES)).numpy(), expected, rtol=1e-6)
    # A list of scalar losses is the same as a stacked vector.
    np.testing.assert_allclose(layer([tf.constant(v) for v in LOSSES]).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(layer.lambdas.numpy(), lam, rtol=1e-6)


def test_gradient_wrt_lambda_is_loss_minus_half_inverse_lambda():
    layer = _layer()
    losses = tf.constant(LOSSES)
    with tf.GradientTape() as tape:
        total = layer(losses)
    grad_log = tape.gradient(total, layer.log_lambdas).numpy()
    lam = np.exp(LOG_LAMBDAS)
    # Chain rule: dL/ds = dL/dlambda * dlambda/ds = dL/dlambda * lambda.
    np.testing.assert_allclose(grad_log / lam, LOSSES - 1 / (2 * lam), rtol=1e-5)
    # And dL/dL_i = lambda_i.
    with tf.GradientTape() as tape:
        tape.watch(losses)
        total = layer(losses)
    np.testing.assert_allclose(tape.gradient(total, losses).numpy(), lam, rtol=1e-6)


def test_training_drives_lambda_to_half_inverse_loss():
    layer = _layer()
    optimizer = tf.keras.optimizers.SGD(0.2)
    for _ in range(400):
        with tf.GradientTape() as tape:
            total = layer(tf.constant(LOSSES))
        optimizer.apply_gradients([(tape.gradient(total, layer.log_lambdas), layer.log_lambdas)])
    np.testing.assert_allclose(layer.lambdas.numpy(), 1 / (2 * LOSSES), rtol=1e-3)


def test_equal_weighting_is_a_plain_sum():
    layer = loss_weighting("equal", 3)
    assert isinstance(layer, EqualWeighting)
    np.testing.assert_allclose(layer(tf.constant(LOSSES)).numpy(), LOSSES.sum(), rtol=1e-6)
    np.testing.assert_array_equal(layer.lambdas.numpy(), [1, 1, 1])
    assert layer.trainable_weights == []
    assert isinstance(loss_weighting("uncertainty", 3), UncertaintyWeighting)
    with pytest.raises(ConfigError, match="unknown loss weighting"):
        loss_weighting("grid", 3)
    with pytest.raises(ConfigError, match="built for 3 losses"):
        UncertaintyWeighting(3)(tf.zeros([4]))


def _model(weighting):
    inputs = tf.keras.Input([3], name="losses")
    return tf.keras.Model(inputs, weighting(inputs))


@pytest.mark.parametrize("fmt", ["savedmodel", "keras"])
def test_saves_and_reloads_with_its_weights(tmp_path, fmt):
    layer = UncertaintyWeighting(3, name="weighting")
    model = _model(layer)
    layer.log_lambdas.assign(LOG_LAMBDAS)
    batch = np.stack([LOSSES, 2 * LOSSES])
    expected = model(batch).numpy()
    path = tmp_path / ("model.keras" if fmt == "keras" else "model")
    model.save(str(path))
    reloaded = tf.keras.models.load_model(str(path))
    restored = reloaded.get_layer("weighting")
    assert isinstance(restored, UncertaintyWeighting)
    np.testing.assert_allclose(restored.lambdas.numpy(), np.exp(LOG_LAMBDAS), rtol=1e-6)
    np.testing.assert_allclose(reloaded(batch).numpy(), expected, rtol=1e-6)
