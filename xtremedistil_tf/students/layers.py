"""Custom student layers, registered so saved students reload after `import xtremedistil_tf`."""
from __future__ import annotations

import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class SequenceMask(tf.keras.layers.Layer):
    """attention_mask [B, T] (0/1 ints) -> boolean mask [B, T] for masked RNN layers.

    The mask comes from attention_mask rather than `mask_zero` because the pad id is not 0 for
    every vocabulary (RoBERTa pads with 1 and uses 0 for <s>).
    """

    def call(self, attention_mask):
        return tf.cast(attention_mask, tf.bool)

    def compute_mask(self, inputs, mask=None):
        return None


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class TransformerEncoder(tf.keras.layers.Layer):
    """Learned positions plus `depth` post-LayerNorm transformer blocks (BERT layout).

    call([x [B, T, E], attention_mask [B, T]]) -> [B, T, E]. Padded keys are masked out of
    attention, so real positions do not depend on padding.
    """

    def __init__(self, width: int, depth: int, heads: int, ffn: int, max_length: int = 512,
                 dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if width % heads:
            raise ValueError(f"embedding_dim={width} is not divisible by heads={heads}")
        self.width, self.depth, self.heads, self.ffn = int(width), int(depth), int(heads), int(ffn)
        self.max_length, self.dropout = int(max_length), float(dropout)
        # Sublayers made here, in a fixed order, so that saved weights map back onto them on load.
        self.attention = [tf.keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout,
                                                             name=f"attention_{i}") for i in range(depth)]
        self.attention_norm = [tf.keras.layers.LayerNormalization(epsilon=1e-12, name=f"attention_norm_{i}")
                               for i in range(depth)]
        self.ffn_in = [tf.keras.layers.Dense(ffn, activation="gelu", name=f"ffn_in_{i}") for i in range(depth)]
        self.ffn_out = [tf.keras.layers.Dense(width, name=f"ffn_out_{i}") for i in range(depth)]
        self.ffn_norm = [tf.keras.layers.LayerNormalization(epsilon=1e-12, name=f"ffn_norm_{i}")
                         for i in range(depth)]
        self.drop = tf.keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.positions = self.add_weight(
            name="position_embeddings", shape=(self.max_length, self.width),
            initializer=tf.keras.initializers.TruncatedNormal(stddev=0.02))
        # Build every sublayer now: MultiHeadAttention otherwise creates its kernels on first call,
        # after a SavedModel's checkpoint was restored, and reloads with fresh random kernels.
        shape = tf.TensorShape([None, None, self.width])
        for i in range(self.depth):
            self.attention[i]._build_from_signature(shape, shape)  # tf_keras has no public MHA.build
            self.attention_norm[i].build(shape)
            self.ffn_in[i].build(shape)
            self.ffn_out[i].build(tf.TensorShape([None, None, self.ffn]))
            self.ffn_norm[i].build(shape)
        super().build(input_shape)

    def call(self, inputs, training=None):
        x, attention_mask = inputs
        length = tf.shape(x)[1]
        x = x + self.positions[tf.newaxis, :length]
        keys = tf.cast(attention_mask, tf.bool)[:, tf.newaxis, :]  # [B, 1, T]: every query sees real keys
        for i in range(self.depth):
            attended = self.attention[i](x, x, attention_mask=keys, training=training)
            x = self.attention_norm[i](x + self.drop(attended, training=training))
            hidden = self.ffn_out[i](self.ffn_in[i](x))
            x = self.ffn_norm[i](x + self.drop(hidden, training=training))
        return x

    def get_config(self) -> dict:
        return {**super().get_config(), "width": self.width, "depth": self.depth, "heads": self.heads, "ffn": self.ffn,
                "max_length": self.max_length, "dropout": self.dropout}
