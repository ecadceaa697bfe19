"""A serializable linear-chain CRF Keras layer (tf.keras, Keras 2 API).

The layer owns the transition matrix; the emission scores come from the layer
before it (usually a Dense with `num_tags` units). Usage:

    potentials = CRF(num_tags, name="crf")(logits, mask=mask)   # training model
    loss = crf_layer.nll(potentials, tags, lengths)            # or crf_nll_loss(...)
    tags, scores = crf_layer.decode(potentials, lengths)       # inference

`output_mode="tags"` makes `call` return the decoded tags [B, T] int32 instead,
for an export/serving model. The mode is a constructor flag rather than the
`training` argument on purpose: `model.evaluate` runs with training=False and
still needs potentials for the loss.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from xtremedistil_tf.crf import ops
from xtremedistil_tf.errors import ConfigError

OUTPUT_MODES = ("potentials", "tags")


def _bool_list(value, shape, name):
    """A constraint mask as nested Python bools (JSON-friendly for get_config), or None."""
    if value is None:
        return None
    array = np.asarray(value, dtype=bool)
    if array.shape != shape:
        raise ConfigError(f"CRF {name} must have shape {shape}; got {array.shape}")
    return array.tolist()


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class CRF(tf.keras.layers.Layer):
    """Linear-chain CRF over potentials [B, T, N].

    Args:
      num_tags: N.
      allowed: optional [N, N] bool mask of allowed moves (`ops.allowed_transitions`);
        forbidden moves score -1e4 and get no gradient.
      start_allowed, end_allowed: optional [N] bool masks of tags that may start /
        end a sequence, applied to the potentials of the first / last position.
      output_mode: "potentials" (call returns float32 potentials with the boundary
        constraints applied) or "tags" (call returns Viterbi tags [B, T] int32).
      transitions_initializer: initializer of the [N, N] transition weight.

    call(inputs, mask=None, training=None): inputs [B, T, N] of any float dtype;
    mask [B, T] bool marks real positions, left-aligned (lengths = mask sums);
    without a mask every position is real. The mask passes through.
    """

    def __init__(
        self,
        num_tags,
        allowed=None,
        start_allowed=None,
        end_allowed=None,
        output_mode="potentials",
        transitions_initializer="glorot_uniform",
        **kwargs,
    ):
        # float32 under any mixed-precision policy: the forward algorithm's log-sum-exps and the
        # -1e4 forbidden transitions do not fit float16 (engine/precision.py).
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        if output_mode not in OUTPUT_MODES:
            raise ConfigError(f"CRF output_mode must be one of {OUTPUT_MODES}; got {output_mode!r}")
        self.num_tags = int(num_tags)
        self.allowed = _bool_list(allowed, (self.num_tags, self.num_tags), "allowed")
        self.start_allowed = _bool_list(start_allowed, (self.num_tags,), "start_allowed")
        self.end_allowed = _bool_list(end_allowed, (self.num_tags,), "end_allowed")
        self.output_mode = output_mode
        self.transitions_initializer = tf.keras.initializers.get(transitions_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape[-1] is not None and input_shape[-1] != self.num_tags:
            raise ConfigError(
                f"CRF {self.name} has num_tags={self.num_tags} but its inputs have {input_shape[-1]} scores per position"
            )
        self.raw_transitions = self.add_weight(
            name="transitions",
            shape=[self.num_tags, self.num_tags],
            initializer=self.transitions_initializer,
            dtype=tf.float32,
            trainable=True,
        )
        super().build(input_shape)

    @property
    def transitions(self):
        """[N, N] float32 transitions with the forbidden moves set to -1e4."""
        if self.allowed is None:
            return tf.convert_to_tensor(self.raw_transitions)
        return ops.apply_transition_constraints(self.raw_transitions, self.allowed)

    @staticmethod
    def lengths_from_mask(inputs, mask=None):
        """[B] int32 lengths: mask sums, or T for every sequence without a mask."""
        if mask is None:
            return tf.fill([tf.shape(inputs)[0]], tf.shape(inputs)[1])
        return tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)

    def call(self, inputs, mask=None, training=None):
        lengths = self.lengths_from_mask(inputs, mask)
        potentials = ops.apply_boundary_constraints(
            tf.cast(inputs, tf.float32), lengths, self.start_allowed, self.end_allowed
        )
        if self.output_mode == "tags":
            return ops.crf_decode(potentials, self.transitions, lengths)[0]
        return potentials

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        return input_shape[:-1] if self.output_mode == "tags" else input_shape

    def log_likelihood(self, potentials, tags, lengths):
        """[B] log p(tags) of potentials returned by call()."""
        return ops.crf_log_likelihood(potentials, tags, lengths, self.transitions)

    def nll(self, potentials, tags, lengths, rows=None):
        """Mean negative log-likelihood over the rows (scalar; `rows`: see ops.crf_nll_loss)."""
        return ops.crf_nll_loss(potentials, tags, lengths, self.transitions, rows)

    def decode(self, potentials, lengths):
        """Viterbi: (tags [B, T] int32, scores [B])."""
        return ops.crf_decode(potentials, self.transitions, lengths)

    def kbest(self, potentials, lengths, k):
        """k-best Viterbi: (tags [B, k, T], scores, log_probs, valid), see ops.crf_kbest_decode."""
        return ops.crf_kbest_decode(potentials, self.transitions, lengths, k)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_tags=self.num_tags,
            allowed=self.allowed,
            start_allowed=self.start_allowed,
            end_allowed=self.end_allowed,
            output_mode=self.output_mode,
            transitions_initializer=tf.keras.initializers.serialize(self.transitions_initializer),
        )
        return config
