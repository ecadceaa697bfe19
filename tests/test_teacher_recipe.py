"""The teacher's fine-tuning recipe: per-head defaults, the flags that select each choice, the
first-piece supervision, the head initialisations and the word-label argmax."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import TOY_LABELS, toy_ner_sentences, train_configs
from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers.crf_head import build_crf_teacher
from xtremedistil_tf.teachers.finetune import (FinetuneConfig, loss_count, parameter_groups, predict_piece_tags,
                                               recipe_for, supervised_windows)
from xtremedistil_tf.teachers.model import build_teacher, initialise_head


def test_softmax_recipe_defaults():
    recipe = recipe_for("softmax")
    assert (recipe.head_learning_rate, recipe.layer_decay, recipe.head_init, recipe.supervision) == \
        (1e-3, 1.0, "glorot", "first_piece")
    # Explicit settings win; None means "not given".
    assert recipe_for("softmax", supervision="first_piece", head_learning_rate=None).supervision == "first_piece"
    assert recipe_for("softmax", head_learning_rate=None).head_learning_rate == 1e-3


def test_crf_recipe_is_the_papers_and_refuses_first_piece():
    recipe = recipe_for("crf")
    assert (recipe.head_learning_rate, recipe.layer_decay, recipe.supervision) == (1e-3, 0.9, "all_pieces")
    assert recipe_for("crf", layer_decay=1.0).layer_decay == 1.0
    with pytest.raises(ConfigError, match="--teacher_supervision=first_piece cannot train a CRF head"):
        recipe_for("crf", supervision="first_piece")


def test_unknown_choices_are_refused():
    with pytest.raises(ConfigError, match="head_init='xavier'"):
        FinetuneConfig(head_init="xavier")
    with pytest.raises(ConfigError, match="supervision='words'"):
        FinetuneConfig(supervision="words")


@pytest.fixture
def parsed_flags(tmp_path, tiny_bert_dir):
    """The teacher recipe bin/train makes of each argument list (or {"error": message})."""
    (tmp_path / "train.txt").write_text("John B-PER\nlives O\n\n", encoding="utf-8")
    base = [f"--data_dir={tmp_path}", "--train_file=train.txt", "--dev_fraction=0.5", f"--teacher={tiny_bert_dir}",
            "--teacher_random_init", f"--work_dir={tmp_path / 'w'}", "--nostudent", "--teacher_layer=1"]

    def parse(*argv_lists):
        recipes = train_configs([base + list(a) for a in argv_lists], "cfg.teacher.finetune.to_dict()")
        return [FinetuneConfig(**r) if "error" not in r else r for r in recipes]

    return parse


def test_flags_left_unset_take_the_heads_recipe(parsed_flags):
    softmax, crf, chosen, refused = parsed_flags(
        [], ["--teacher_head=crf"],
        ["--teacher_head_learning_rate=0", "--teacher_head_init=bert", "--warmup_fraction=0",
         "--teacher_supervision=all_pieces", "--layer_decay=0.8"],
        ["--teacher_head=crf", "--teacher_supervision=first_piece"])
    assert (softmax.head_learning_rate, softmax.layer_decay, softmax.warmup_fraction, softmax.head_init,
            softmax.supervision) == (1e-3, 1.0, 0.1, "glorot", "first_piece")
    assert (crf.head_learning_rate, crf.layer_decay, crf.supervision) == (1e-3, 0.9, "all_pieces")
    assert (chosen.head_learning_rate, chosen.head_init, chosen.warmup_fraction, chosen.supervision,
            chosen.layer_decay) == (0.0, "bert", 0.0, "all_pieces", 0.8)
    assert "cannot train a CRF head" in refused["error"]


def test_crf_defaults_give_the_papers_optimizer_groups(parsed_flags, tiny_bert_dir):
    """--teacher_head=crf with no recipe flags: logits and CRF at 1e-3, the top layer at the encoder's
    rate and 0.9 less per layer going down (multi-grained paper, Sec. 5.2)."""
    recipe, = parsed_flags(["--teacher_head=crf", "--teacher_learning_rate=2e-5", "--warmup_fraction=0"])
    teacher, _ = build_crf_teacher(str(tiny_bert_dir), TOY_LABELS, "IOB2", random_init=True)
    groups = parameter_groups(teacher, recipe, total_steps=100)
    rates = [float(opt.learning_rate) for opt, _ in groups]  # step 0, no warm-up
    assert rates == pytest.approx([2e-5, 1.8e-5, 1.62e-5, 1e-3])
    assert {v.name for v in groups[-1][1]} == \
        {v.name for v in teacher.classifier.trainable_variables} | {teacher.crf.raw_transitions.name}


def test_first_piece_supervision_keeps_only_word_labels(tiny_tokenizer, tiny_bert_dir):
    teacher, _ = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, random_init=True)
    vocab = teacher.tag_vocab
    sentences = toy_ner_sentences(20, seed=3) + [
        Sentence(["Johnny", "went", "to", "Berlin"], ["B-PER", "O", "O", "B-LOC"]),
        Sentence(["Mary", "Poppins", "is", "in", "Lyon"], ["B-PER", "I-PER", "O", "O", "B-LOC"])]
    windows = encode(sentences, tiny_tokenizer, vocab, 16)
    assert (windows.label_ids == vocab.x_id).any()  # the toy words have continuation pieces
    first = supervised_windows(windows, vocab, "first_piece")
    words = sum(len(s.tokens) for s in sentences)
    # Exactly one labeled piece per word, carrying the word's label; markers became [PAD].
    kept = first.label_ids != vocab.pad_id
    assert kept.sum() == words
    np.testing.assert_array_equal(first.label_ids[kept], windows.label_ids[windows.word_index >= 0])
    assert supervised_windows(windows, vocab, "all_pieces") is windows
    batch = {"label_ids": tf.constant(first.label_ids), "attention_mask": tf.constant(first.attention_mask)}
    assert float(loss_count(teacher, batch)) == words
    all_batch = {"label_ids": tf.constant(windows.label_ids), "attention_mask": tf.constant(windows.attention_mask)}
    assert float(loss_count(teacher, all_batch)) == int(windows.attention_mask.sum())


def test_head_initialisations(tiny_bert_dir):
    tf.keras.utils.set_random_seed(0)
    teacher, _ = build_teacher(str(tiny_bert_dir), TOY_LABELS, random_init=True)
    fan_in, fan_out = teacher.classifier.kernel.shape
    teacher.classifier.bias.assign(tf.ones_like(teacher.classifier.bias))
    initialise_head(teacher, "glorot")
    kernel = teacher.classifier.kernel.numpy()
    limit = np.sqrt(6 / (fan_in + fan_out))
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.8 * limit
    assert kernel.std() == pytest.approx(limit / np.sqrt(3), rel=0.15)  # uniform(-limit, limit)
    assert not teacher.classifier.bias.numpy().any()
    initialise_head(teacher, "bert")
    kernel = teacher.classifier.kernel.numpy()
    assert np.abs(kernel).max() <= 2 * 0.02  # truncated at two standard deviations
    assert 0.01 < kernel.std() < 0.02


def test_word_positions_never_predict_a_marker(tiny_tokenizer, tiny_bert_dir):
    """A marker column that wins everywhere (an untrained one can) must not turn words into O."""
    teacher, _ = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, random_init=True)
    vocab = teacher.tag_vocab
    bias = np.zeros(len(vocab), np.float32)
    bias[vocab.x_id] = 50.0
    bias[vocab.labels.index("B-PER")] = 10.0
    teacher.classifier.bias.assign(bias)
    windows = encode(toy_ner_sentences(5, seed=4), tiny_tokenizer, vocab, 16)
    tags = predict_piece_tags(teacher, windows)
    assert (tags[windows.attention_mask == 1] == vocab.labels.index("B-PER")).all()
