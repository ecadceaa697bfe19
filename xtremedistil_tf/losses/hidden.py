"""Task-agnostic transformer-to-transformer losses (KD-NAS paper, section 2 and appendices A, E).

* Layer mappings g(i): which teacher layers each student layer learns from.
* Multi-layer hidden-state loss: sum over student layers i and teacher layers j in g(i) of
  MSE(H^S_i W_i^j, H^T_j), through learnable linear projections W_i^j (d_S x d_T).
* MiniLMv2 self-attention relations: Q-Q, K-K, V-V scaled-dot-product relations split into
  relation heads, from one teacher layer into one student layer.

Layers are 1-based as in the paper: layer l's output is `hidden_states[l]` of a Hugging Face
model (`hidden_states[0]` is the embedding output).
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.reduce import masked_mean
from xtremedistil_tf.losses.xtremedistil import mse

MAPPINGS = ("last-1", "last", "uniform", "uniform+last")
RELATIONS = ("query", "key", "value")


def _clamp(layer: int, num_teacher: int) -> int:
    return min(max(layer, 1), num_teacher)


def layer_mapping(strategy: str, num_teacher: int, num_student: int) -> List[Tuple[int, ...]]:
    """g(i) for i = 1..num_student: a sorted tuple of 1-based teacher layers per student layer.

    last-1:        only the last student layer, from the last teacher layer (other layers get ()).
    last:          student i <- teacher L_T - L_S + i.
    uniform:       student i <- teacher (i-1)*k + 1, k = ceil(L_T / L_S) (the "skip" strategy).
    uniform+last:  the union of the two, the paper's Eq. 2.

    Eq. 2 can leave the teacher's range: (i-1)*ceil(L_T/L_S)+1 exceeds L_T for some pairs
    (L_T=12, L_S=10 gives 19; L_T=6, L_S=4 gives 7), and L_T - L_S + i < 1 when the student is
    deeper than the teacher. Such layers are clamped to [1, L_T]; where both members of g(i)
    coincide the set has one element.
    """
    if strategy not in MAPPINGS:
        raise ConfigError(f"unknown layer mapping {strategy!r}; expected one of {', '.join(MAPPINGS)}")
    if num_teacher < 1 or num_student < 1:
        raise ConfigError(f"layer mapping needs >= 1 layer on each side, got teacher {num_teacher}, "
                          f"student {num_student}")
    step = math.ceil(num_teacher / num_student)
    mapping = []
    for i in range(1, num_student + 1):
        uniform = _clamp((i - 1) * step + 1, num_teacher)
        last = _clamp(num_teacher - num_student + i, num_teacher)
        if strategy == "last-1":
            layers = {num_teacher} if i == num_student else set()
        elif strategy == "last":
            layers = {last}
        elif strategy == "uniform":
            layers = {uniform}
        else:
            layers = {uniform, last}
        mapping.append(tuple(sorted(layers)))
    return mapping


def mapped_pairs(strategy: str, num_teacher: int, num_student: int) -> List[Tuple[int, int]]:
    """The (student layer i, teacher layer j) pairs of g, both 1-based, in order."""
    return [(i, j) for i, layers in enumerate(layer_mapping(strategy, num_teacher, num_student), start=1)
            for j in layers]


class HiddenStateProjections(tf.keras.layers.Layer):
    """The learnable W_i^j (d_S x d_T, no bias: the paper's linear projection) for each mapped pair."""

    def __init__(self, pairs: Sequence[Tuple[int, int]], teacher_hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.pairs = [tuple(p) for p in pairs]
        self.teacher_hidden = int(teacher_hidden)
        self.projections = {f"s{i}_t{j}": tf.keras.layers.Dense(self.teacher_hidden, use_bias=False,
                                                                name=f"w_s{i}_t{j}")
                            for i, j in self.pairs}

    def call(self, student_hidden: Sequence[tf.Tensor]) -> Dict[Tuple[int, int], tf.Tensor]:
        """student_hidden: the student's hidden_states tuple ([B, T, d_S] each, index 0 = embeddings).
        Returns {(i, j): H^S_i W_i^j of shape [B, T, d_T]}."""
        return {(i, j): self.projections[f"s{i}_t{j}"](student_hidden[i]) for i, j in self.pairs}

    def get_config(self) -> dict:
        return {**super().get_config(), "pairs": self.pairs, "teacher_hidden": self.teacher_hidden}


def hidden_state_loss(projected: Dict[Tuple[int, int], tf.Tensor], teacher_hidden: Sequence[tf.Tensor],
                      mask: tf.Tensor, reduction: str = "sum") -> tf.Tensor:
    """L_HS (paper Eq. 1): MSE(H^S_i W_i^j, H^T_j) over the mapped pairs.

    projected: output of HiddenStateProjections; teacher_hidden: the teacher's hidden_states tuple;
    mask: [B, T]. reduction "sum" is Eq. 1; "mean" divides by the number of pairs, so the value
    does not grow with the student's depth (what the NAS reward uses by default, see docs/nas.md).
    """
    if reduction not in ("sum", "mean"):
        raise ConfigError(f"hidden-state loss reduction {reduction!r}; expected sum or mean")
    terms = [mse(pred, teacher_hidden[j], mask) for (_, j), pred in projected.items()]
    total = tf.add_n(terms)
    return total / len(terms) if reduction == "mean" else total


def attention_inputs(model, hidden_states: Sequence[tf.Tensor], layer: int) -> Dict[str, tf.Tensor]:
    """Q, K, V of a Hugging Face TF BERT `model` at 1-based `layer`, each [B, T, d_h].

    TFBertModel does not return them, but they are linear maps of the layer's input
    hidden_states[layer - 1], so they are recomputed here with the layer's own Dense weights.
    """
    encoder_layers = model.bert.encoder.layer
    if not 1 <= layer <= len(encoder_layers):
        raise ConfigError(f"attention layer {layer} out of range: the model has {len(encoder_layers)} layers")
    attention = encoder_layers[layer - 1].attention.self_attention
    x = hidden_states[layer - 1]
    return {"query": attention.query(x), "key": attention.key(x), "value": attention.value(x)}


def relation_logits(vectors: tf.Tensor, num_heads: int) -> tf.Tensor:
    """Scaled dot products A A^T / sqrt(d_r) per relation head.

    vectors: [B, T, d_h] (the concatenated heads' Q, K or V); d_h must divide into num_heads.
    Returns [B, num_heads, T, T].
    """
    hidden = vectors.shape[-1]
    if hidden % num_heads:
        raise ConfigError(f"{num_heads} relation heads do not divide hidden size {hidden}")
    head_dim = hidden // num_heads
    batch, length = tf.shape(vectors)[0], tf.shape(vectors)[1]
    heads = tf.transpose(tf.reshape(vectors, [batch, length, num_heads, head_dim]), [0, 2, 1, 3])
    return tf.matmul(heads, heads, transpose_b=True) / math.sqrt(head_dim)


def relation_kl(student_vectors: tf.Tensor, teacher_vectors: tf.Tensor, mask: tf.Tensor,
                num_heads: int) -> tf.Tensor:
    """KL(R^T || R^S) of one relation (Q-Q, K-K or V-V), averaged over heads and real query tokens.

    Paper Eq. 6 writes the cross entropy CE(R^T, R^S); KL = CE - H(R^T) has the same gradient for
    the student and is 0 when the student reproduces the teacher's relations, which makes the
    value comparable across teachers. Padding keys get no probability mass; padding queries are
    not counted. student_vectors [B, T, d_S], teacher_vectors [B, T, d_T], mask [B, T]. Scalar.
    """
    mask = tf.cast(mask, tf.float32)
    key_bias = (1.0 - mask)[:, None, None, :] * -1e9
    t_logp = tf.nn.log_softmax(relation_logits(tf.cast(teacher_vectors, tf.float32), num_heads) + key_bias)
    s_logp = tf.nn.log_softmax(relation_logits(tf.cast(student_vectors, tf.float32), num_heads) + key_bias)
    key_mask = mask[:, None, None, :]
    kl = tf.reduce_sum(tf.exp(t_logp) * (t_logp - s_logp) * key_mask, axis=-1)  # [B, H, T]
    return masked_mean(kl, mask[:, None, :])


def minilm_v2_loss(student_qkv: Dict[str, tf.Tensor], teacher_qkv: Dict[str, tf.Tensor], mask: tf.Tensor,
                   num_heads: int = 48, relations: Sequence[str] = RELATIONS) -> tf.Tensor:
    """L_MiniLM (paper Eq. 6 with alpha = beta): the sum over Q-Q, K-K, V-V of relation_kl.

    student_qkv / teacher_qkv: attention_inputs() of the chosen student and teacher layers.
    num_heads relation heads (paper: 48) must divide both hidden sizes.
    """
    return tf.add_n([relation_kl(student_qkv[r], teacher_qkv[r], mask, num_heads) for r in relations])


def default_relation_layer(num_teacher: int) -> int:
    """The paper's choice: the teacher's second-last layer (its last when it has only one)."""
    return max(1, num_teacher - 1)
