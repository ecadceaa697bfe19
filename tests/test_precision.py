"""Mixed precision (--mixed_precision): 16-bit compute where it is safe, float32 for the CRF and the
losses, dynamic loss scaling under float16, for the teacher, the staged loop and multi-grained KD."""
import numpy as np
import pytest
import tensorflow as tf
from conftest import TOY_LABELS, toy_ner_sentences
from test_strategies import NUM_TAGS, _config, _student, toy_data

from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.engine.precision import precision_policy
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.multigrained import MultiGrainedConfig, train_multigrained, windows_dataset
from xtremedistil_tf.methods.staged import train_student
from xtremedistil_tf.students.crf_student import build_bilstm_crf_student, student_crf_constraints
from xtremedistil_tf.teachers.finetune import FinetuneConfig, finetune, make_train_step
from xtremedistil_tf.teachers.model import build_teacher

MIXED = ("mixed_float16", "mixed_bfloat16")


def test_policy_is_restored_and_names_are_checked():
    with precision_policy("mixed_bfloat16"):
        assert tf.keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(ConfigError, match="mixed_float32"):
        with precision_policy("mixed_float32"):
            pass


@pytest.mark.parametrize("policy", MIXED)
def test_crf_stays_float32_under_a_mixed_policy(policy):
    with precision_policy(policy):
        emissions = tf.keras.layers.Dense(4)(tf.random.normal([2, 5, 3]))
        crf = CRF(4)
        potentials = crf(emissions)
    assert emissions.dtype != tf.float32
    assert crf.compute_dtype == "float32" and crf.raw_transitions.dtype == tf.float32
    assert potentials.dtype == tf.float32


@pytest.fixture(scope="module")
def labeled_windows(tiny_tokenizer):
    return encode(toy_ner_sentences(64, seed=5), tiny_tokenizer, TagVocab(TOY_LABELS), 16)


@pytest.mark.parametrize("policy", MIXED)
def test_multigrained_student_trains_in_16_bits(policy, labeled_windows, tiny_tokenizer):
    vocab = TagVocab(TOY_LABELS)
    with precision_policy(policy):
        tf.keras.utils.set_random_seed(0)
        student = build_bilstm_crf_student(len(tiny_tokenizer), len(vocab), student_crf_constraints(vocab, "IOB2"),
                                           embedding_dim=8, hidden=8, dropout=0.0)
        history = train_multigrained(student, windows_dataset(labeled_windows), windows_dataset(labeled_windows),
                                     MultiGrainedConfig(("hard",), epochs=3, batch_size=16, learning_rate=2e-2,
                                                        run_eagerly=True), vocab.pad_id)
    losses = [e["train_loss"] for e in history.epochs]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert student.get_layer("bilstm").compute_dtype == policy.split("_")[1]
    # Weights are kept in float32 (the saved student is float32 whatever the policy).
    assert all(w.dtype == tf.float32 for w in student.weights)


# float16 is the policy with loss scaling (compile wraps the optimizer); the bfloat16 path differs only
# in the dtype, which the multi-grained and CRF tests cover.
@pytest.mark.parametrize("policy", ["mixed_float16"])
@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_staged_loop_scales_the_loss_under_float16(policy, tiny_tokenizer):
    with precision_policy(policy):
        toy = toy_data(tiny_tokenizer)
        student = _student(toy)
        seen = []

        class Optimizers(tf.keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                seen.append(isinstance(self.model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer))

        history = train_student("D1", student, toy["train"], toy["transfer"], toy["dev"],
                                _config(toy, epochs_per_layer=2), callbacks=[Optimizers()])
    step = history.steps[0]
    assert np.isfinite(step.val_losses).all() and step.best_val_loss < step.initial_val_loss
    # The staged loop fits one epoch at a time (exact resume): one train_begin per epoch.
    assert seen == [policy == "mixed_float16"] * 2
    assert student.get_layer("probs").compute_dtype == "float32"


def test_teacher_with_layer_decay_fine_tunes_under_float16(tiny_bert_dir):
    train = toy_ner_sentences(96, seed=1)
    with precision_policy("mixed_float16"):
        tf.keras.utils.set_random_seed(0)
        teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, dropout=0.0,
                                           random_init=True)
        before = [w.numpy().copy() for w in teacher.trainable_weights]
        result = finetune(teacher, tokenizer, train, toy_ner_sentences(20, seed=2), "IOB2",
                          FinetuneConfig(epochs=2, batch_size=16, learning_rate=3e-3, layer_decay=0.9,
                                         head_learning_rate=1e-2, patience=2, progress=False))
    losses = [h["train_loss"] for h in result.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    # Every parameter group (each encoder depth and the head) was updated through the shared scale.
    moved = [not np.allclose(b, w.numpy()) for b, w in zip(before, teacher.trainable_weights)
             if "pooler" not in w.name]
    assert all(moved)
    assert NUM_TAGS == len(teacher.tag_vocab)


def test_an_overflow_in_any_group_skips_every_group_and_lowers_the_scale():
    class Toy:
        """A 'teacher' whose loss overflows (float32 inf once scaled) in the second group only when
        label_ids[0, 0] is 1."""
        top = tf.Variable([1.0, 2.0])
        embeddings = tf.Variable([3.0, 4.0])

        def loss(self, batch, training=False):
            blow_up = tf.cast(batch["label_ids"][0, 0], tf.float32) * 1e35
            return tf.reduce_sum(self.top ** 2) + (1.0 + blow_up) * tf.reduce_sum(self.embeddings)

    toy = Toy()
    with precision_policy("mixed_float16"):
        groups = [(tf.keras.optimizers.Adam(0.1), [toy.top]), (tf.keras.optimizers.Adam(0.1), [toy.embeddings])]
        step = make_train_step(toy, groups)
    batch = {"input_ids": tf.ones([1, 2], tf.int32), "attention_mask": tf.ones([1, 2], tf.int32)}
    step({**batch, "label_ids": tf.zeros([1, 2], tf.int32)})
    top, embeddings = toy.top.numpy().copy(), toy.embeddings.numpy().copy()
    scale = float(step.loss_scaler.loss_scale)
    assert not np.allclose(top, [1.0, 2.0]) and not np.allclose(embeddings, [3.0, 4.0])
    step({**batch, "label_ids": tf.ones([1, 2], tf.int32)})   # overflow in the embeddings' group only
    np.testing.assert_array_equal(toy.top.numpy(), top)
    np.testing.assert_array_equal(toy.embeddings.numpy(), embeddings)
    assert float(step.loss_scaler.loss_scale) == scale / 2
    assert int(groups[1][0].iterations) == 1

