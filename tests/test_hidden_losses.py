"""Layer mappings, the multi-layer hidden-state loss and MiniLMv2 relations (losses/hidden.py)."""
import math

import numpy as np
import pytest
import tensorflow as tf
from transformers import BertConfig, TFBertModel

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.hidden import (
    HiddenStateProjections,
    attention_inputs,
    hidden_state_loss,
    layer_mapping,
    mapped_pairs,
    minilm_v2_loss,
    relation_kl,
)
from xtremedistil_tf.losses.xtremedistil import mse as masked_mse


def test_uniform_last_12_to_4_is_the_papers_example():
    assert layer_mapping("uniform+last", 12, 4) == [(1, 9), (4, 10), (7, 11), (10, 12)]


@pytest.mark.parametrize("teacher,student", [(12, 3), (12, 6), (12, 12), (24, 6), (6, 3), (6, 6), (6, 2), (8, 3)])
def test_uniform_last_matches_eq2_where_it_stays_in_range(teacher, student):
    k = -(-teacher // student)
    expected = [tuple(sorted({(i - 1) * k + 1, teacher - student + i})) for i in range(1, student + 1)]
    assert all(1 <= j <= teacher for layers in expected for j in layers)  # these pairs need no clamping
    assert layer_mapping("uniform+last", teacher, student) == expected


def test_out_of_range_teacher_layers_are_clamped():
    # (6, 4): ceil(6/4) = 2, so student 4's uniform layer would be 7 > 6.
    assert layer_mapping("uniform+last", 6, 4) == [(1, 3), (3, 4), (5,), (6,)]
    # (12, 10): uniform layers 1, 3, ..., 19 run past 12.
    assert layer_mapping("uniform", 12, 10)[-3:] == [(12,), (12,), (12,)]
    # A student deeper than the teacher: Last's L_T - L_S + i < 1 for the first layers.
    assert layer_mapping("last", 3, 5) == [(1,), (1,), (1,), (2,), (3,)]


def test_single_layer_mappings():
    assert layer_mapping("last", 12, 4) == [(9,), (10,), (11,), (12,)]
    assert layer_mapping("uniform", 12, 4) == [(1,), (4,), (7,), (10,)]
    assert layer_mapping("last-1", 12, 4) == [(), (), (), (12,)]
    assert mapped_pairs("last-1", 12, 4) == [(4, 12)]
    with pytest.raises(ConfigError, match="unknown layer mapping"):
        layer_mapping("skip", 12, 4)


def test_masked_mse_ignores_padding_against_numpy():
    rng = np.random.default_rng(0)
    pred, target = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 3))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    expected = np.mean([np.mean((pred[b, t] - target[b, t]) ** 2) for b in range(2) for t in range(5) if mask[b, t]])
    got = masked_mse(tf.constant(pred, tf.float32), tf.constant(target, tf.float32), tf.constant(mask))
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_hidden_state_loss_sums_or_averages_the_mapped_pairs():
    rng = np.random.default_rng(1)
    student = [tf.constant(rng.normal(size=(1, 4, 6)), tf.float32) for _ in range(3)]  # 2 student layers
    teacher = [tf.constant(rng.normal(size=(1, 4, 8)), tf.float32) for _ in range(5)]  # 4 teacher layers
    mask = tf.ones((1, 4), tf.int32)
    pairs = mapped_pairs("uniform+last", 4, 2)
    assert pairs == [(1, 1), (1, 3), (2, 3), (2, 4)]
    projections = HiddenStateProjections(pairs, 8)
    projected = projections(student)
    expected = [float(masked_mse(student[i] @ projections.projections[f"s{i}_t{j}"].kernel, teacher[j], mask))
                for i, j in pairs]
    assert float(hidden_state_loss(projected, teacher, mask, "sum")) == pytest.approx(sum(expected), rel=1e-5)
    assert float(hidden_state_loss(projected, teacher, mask, "mean")) == pytest.approx(np.mean(expected), rel=1e-5)


def _relation_kl_numpy(t, s, mask, heads):
    total, count = 0.0, 0
    for b in range(t.shape[0]):
        keep = np.flatnonzero(mask[b])
        for h in range(heads):
            def rel(x):
                d = x.shape[-1] // heads
                a = x[b][keep][:, h * d:(h + 1) * d]
                logits = a @ a.T / math.sqrt(d)
                p = np.exp(logits - logits.max(-1, keepdims=True))
                return p / p.sum(-1, keepdims=True)
            rt, rs = rel(t), rel(s)
            total += np.sum(rt * (np.log(rt) - np.log(rs)))
            count += len(keep)
    return total / count


def test_relation_kl_against_numpy_with_padding_and_different_widths():
    rng = np.random.default_rng(2)
    teacher, student = rng.normal(size=(2, 5, 12)), rng.normal(size=(2, 5, 6))
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    got = relation_kl(tf.constant(student, tf.float32), tf.constant(teacher, tf.float32), tf.constant(mask), 3)
    assert float(got) == pytest.approx(_relation_kl_numpy(teacher, student, mask, 3), rel=1e-4)


def _tiny_bert(seed, hidden=32, layers=2, heads=4, init=0.02):
    tf.keras.utils.set_random_seed(seed)
    model = TFBertModel(BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=48, max_position_embeddings=16,
                                   initializer_range=init))
    model(tf.constant([[1, 2]]))
    return model


def _minilm(teacher, student, ids, mask, t_layer, heads=4):
    t_out = teacher(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    s_out = student(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return float(minilm_v2_loss(attention_inputs(student, s_out.hidden_states, student.config.num_hidden_layers),
                                attention_inputs(teacher, t_out.hidden_states, t_layer), mask, heads))


def test_minilm_loss_is_zero_for_a_copy_of_the_teacher_and_positive_otherwise():
    teacher = _tiny_bert(0)
    copy = _tiny_bert(1)
    copy.set_weights(teacher.get_weights())
    # Wide initial weights: at BERT's 0.02 both models' relations are near uniform and close.
    other = _tiny_bert(2, hidden=16, heads=2, init=0.5)
    ids = tf.constant([[2, 5, 9, 7, 3, 0], [2, 11, 3, 0, 0, 0]])
    mask = tf.cast(ids > 0, tf.int32)
    assert _minilm(teacher, copy, ids, mask, t_layer=2) == pytest.approx(0.0, abs=1e-6)
    assert _minilm(teacher, other, ids, mask, t_layer=2) > 1e-2
    # Padding must not count: other ids in the padded positions leave the loss unchanged.
    noisy = tf.where(mask > 0, ids, 17)
    assert _minilm(teacher, other, noisy, mask, t_layer=2) == pytest.approx(
        _minilm(teacher, other, ids, mask, t_layer=2), rel=1e-5)


def test_recomputed_queries_and_keys_give_the_models_own_attention():
    model = _tiny_bert(3)
    ids = tf.constant([[2, 5, 9, 7, 3]])
    out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    for layer in (1, 2):
        qkv = attention_inputs(model, out.hidden_states, layer)
        q = tf.reshape(qkv["query"], [1, 5, 4, 8])
        k = tf.reshape(qkv["key"], [1, 5, 4, 8])
        probs = tf.nn.softmax(tf.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8), axis=-1)
        np.testing.assert_allclose(probs.numpy(), out.attentions[layer - 1].numpy(), atol=1e-5)
