"""Custom student layers, registered so saved students reload after `import xtremedistil_tf`."""
from __future__ import annotations

import numpy as np
import tensorflow as tf


# The dtypes of TensorFlow's fused LSTM kernel (BlockLSTMV2).
BLOCK_LSTM_DTYPES = (tf.float32, tf.float16)


def plain_recurrence_on_cpu(model: tf.keras.Model) -> None:
    """On a host with no GPU, make every Keras LSTM and GRU of `model` trace TensorFlow's plain
    recurrent loop alone (where a GPU is visible, they keep Keras' choice at run time).

    Inside a tf.function a Keras LSTM traces two implementations, its cuDNN kernel and the plain
    loop, each with its gradient, for Grappler to pick one at run time. Without a GPU the cuDNN
    one is always discarded, yet tracing and optimising it cost 4-5 s each time a train or test
    step is compiled, which the staged loop does at every unfreeze step (docs/benchmarks.md 1.6).
    The plain loop is the same computation (the same ops in the same order: equal outputs,
    gradients and losses), so only time changes. Keras reads the flag when it traces the layer, so
    a model loaded from disk is as Keras builds it."""
    if tf.config.list_logical_devices("GPU"):
        return
    for layer in model.submodules:
        if isinstance(layer, (tf.keras.layers.LSTM, tf.keras.layers.GRU)):
            layer._could_use_gpu_kernel = False


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


@tf.keras.utils.register_keras_serializable(package="xtremedistil_tf")
class BlockBiLSTM(tf.keras.layers.Layer):
    """Inference-only BiLSTM with a Keras Bidirectional(LSTM)'s weights: what bin/export serves for
    BiLSTM students.

    call(x [B, T, D], mask [B, T] bool, right-padded) -> [B, T, 2 * units]. The backward direction
    runs over each row's real positions reversed (tf.reverse_sequence), so right padding never
    reaches a real position and the recurrence needs no mask; outputs at padded positions are
    meaningless, as in any padded batch. Gates i, f, c, o as Keras.

    By default each direction is one `BlockLSTMV2` op (a core TensorFlow kernel, so TF Serving has
    it), which runs the whole sequence in C++ instead of a while loop of ~15 small ops per step:
    1.7x faster at batch 1 on 2 CPU cores (docs/benchmarks.md); it has no XLA kernel. With
    `unroll=True` and a static T (e.g. under XLA at a fixed length: bin/export --xla_lengths), each
    direction is instead Python-unrolled over T around a plain 2-D recurrent matmul, with the input
    matmul of all steps hoisted out, so XLA fuses each step's gate arithmetic: the fastest graph at
    batch 32 (docs/benchmarks.md; one batched matmul for both directions, or masking each step, were
    1.3-1.4x slower). Without a static T it falls back to the kernel.

    `BlockLSTMV2` takes float32 and float16 only, so a bfloat16 layer (bin/export
    --quantize=bfloat16) runs each direction as a `tf.scan` over T of the same step (the recurrent
    matmul and gates in bfloat16), with the input matmul of all steps hoisted out, as unrolled.
    """

    def __init__(self, units: int, unroll: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.unroll = unroll

    def build(self, input_shape):
        self.dim, gates = int(input_shape[-1]), 4 * self.units
        # Index 0: forward direction, 1: backward; the Keras LSTM's kernel stacked on its recurrent kernel
        # ([D + H, 4H], the `w` BlockLSTMV2 reads: concatenated on every call it cost ~0.1 ms at batch 1),
        # and its bias.
        self.kernels = self.add_weight(name="kernels", shape=(2, self.dim + self.units, gates))
        self.bias = self.add_weight(name="bias", shape=(2, 1, gates))

    @property
    def kernel(self):
        """The Keras LSTM kernels [2, D, 4H]."""
        return self.kernels[:, :self.dim]

    @property
    def recurrent_kernel(self):
        """The Keras LSTM recurrent kernels [2, H, 4H]."""
        return self.kernels[:, self.dim:]

    def set_from_bidirectional(self, layer: tf.keras.layers.Bidirectional) -> None:
        fw_kernel, fw_recurrent, fw_bias, bw_kernel, bw_recurrent, bw_bias = layer.get_weights()
        self.set_weights([np.stack([np.concatenate([fw_kernel, fw_recurrent]), np.concatenate([bw_kernel, bw_recurrent])]),
                          np.stack([fw_bias, bw_bias])[:, None, :]])

    @staticmethod
    def row_lengths(inputs, mask=None):
        """Real positions per row [B] int32 of right-padded inputs [B, T, ...] (all T without a mask)."""
        if mask is None:
            return tf.fill(tf.shape(inputs)[:1], tf.shape(inputs)[1])
        return tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)

    def call(self, inputs, mask=None):
        lengths = self.row_lengths(inputs, mask)
        if self.unroll and inputs.shape[1] is not None:
            return self._unrolled(inputs, lengths)
        if inputs.dtype not in BLOCK_LSTM_DTYPES:
            return self._scanned(inputs, lengths)
        batch, steps = tf.shape(inputs)[0], tf.shape(inputs)[1]
        time_major = tf.transpose(inputs, [1, 0, 2])
        zeros = tf.zeros(tf.stack([batch, self.units]), inputs.dtype)
        peephole = tf.zeros([self.units], inputs.dtype)

        def reverse(x):
            return tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1)

        def direction(k, x):
            return tf.raw_ops.BlockLSTMV2(
                seq_len_max=tf.cast(steps, tf.int64), x=x, cs_prev=zeros, h_prev=zeros, w=self.kernels[k],
                wci=peephole, wcf=peephole, wco=peephole, b=self.bias[k, 0], cell_clip=0.0,
                use_peephole=False).h

        states = tf.concat([direction(0, time_major), reverse(direction(1, reverse(time_major)))], axis=-1)
        return tf.transpose(states, [1, 0, 2])

    def _unrolled(self, inputs, lengths):
        return self._bidirectional(self._unrolled_direction, inputs, lengths)

    def _scanned(self, inputs, lengths):
        return self._bidirectional(self._scanned_direction, inputs, lengths)

    @staticmethod
    def _bidirectional(direction, inputs, lengths):
        """[forward states, backward states over each row's real positions reversed] of `inputs` [B, T, D]."""
        def reverse(x):
            return tf.reverse_sequence(x, lengths, seq_axis=1, batch_axis=0)

        return tf.concat([direction(0, inputs), reverse(direction(1, reverse(inputs)))], axis=-1)

    def _projected(self, k: int, inputs):
        """The input matmul of all steps of direction k, hoisted out of the recurrence: [T, B, 4H]."""
        return tf.einsum("btd,dg->tbg", inputs, self.kernel[k]) + self.bias[k]

    @staticmethod
    def _step(recurrent, projected_t, h, c):
        """One LSTM step from the direction's recurrent kernel [H, 4H], its projected input [B, 4H] and
        states h, c [B, H] -> (h, c)."""
        i, f, g, o = tf.split(projected_t + tf.matmul(h, recurrent), 4, axis=-1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), c

    def _zero_state(self, inputs):
        return tf.zeros(tf.stack([tf.shape(inputs)[0], self.units]), inputs.dtype)

    def _unrolled_direction(self, k: int, inputs):
        """The states [B, T, H] of direction k over `inputs` [B, T, D] (static T) from zero states."""
        projected, recurrent = self._projected(k, inputs), self.recurrent_kernel[k]
        h = c = self._zero_state(inputs)
        states = []
        for t in range(inputs.shape[1]):
            h, c = self._step(recurrent, projected[t], h, c)
            states.append(h)
        return tf.stack(states, axis=1)

    def _scanned_direction(self, k: int, inputs):
        """_unrolled_direction as a tf.scan over any T."""
        zeros, recurrent = self._zero_state(inputs), self.recurrent_kernel[k]
        h, _ = tf.scan(lambda state, projected_t: self._step(recurrent, projected_t, *state), self._projected(k, inputs),
                       initializer=(zeros, zeros))
        return tf.transpose(h, [1, 0, 2])

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        return {**super().get_config(), "units": self.units, "unroll": self.unroll}
