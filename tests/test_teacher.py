import numpy as np
import pytest
import tensorflow as tf
from conftest import TOY_LABELS, toy_ner_sentences

from xtremedistil_tf.data.alignment import encode, predict_by_length
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers.crf_head import build_crf_teacher
from xtremedistil_tf.teachers.finetune import (
    FinetuneConfig,
    evaluate_teacher,
    finetune,
    layer_depth,
    parameter_groups,
    predict_piece_tags,
    teacher_word_tags,
)
from xtremedistil_tf.teachers import finetune as finetune_module
from xtremedistil_tf.teachers import model as teacher_model
from xtremedistil_tf.teachers.model import build_teacher
from xtremedistil_tf.teachers.saved import load_teacher


@pytest.fixture(scope="module")
def trained(tiny_bert_dir):
    tf.keras.utils.set_random_seed(0)
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16,
                                       dropout=0.0, random_init=True)
    train = toy_ner_sentences(300, seed=1)
    dev = toy_ner_sentences(60, seed=2)
    before = evaluate_teacher(teacher, tokenizer, dev, "IOB2")["all"]["f1"]
    config = FinetuneConfig(epochs=4, batch_size=16, learning_rate=3e-3, warmup_fraction=0.1,
                            patience=4, progress=False)
    result = finetune(teacher, tokenizer, train, dev, "IOB2", config)
    return teacher, tokenizer, dev, before, result


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_tiny_teacher_learns_toy_task(trained):
    teacher, tokenizer, dev, before, result = trained
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.5 * losses[0]
    after = evaluate_teacher(teacher, tokenizer, dev, "IOB2")["all"]["f1"]
    assert after > 0.9
    assert after > before + 0.4
    # The weights left in the teacher are the best epoch's.
    assert after == pytest.approx(result.best_dev_f1)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_save_and_reload_gives_identical_predictions(trained, tmp_path):
    teacher, tokenizer, dev, _, _ = trained
    teacher.save(tmp_path / "teacher", tokenizer)
    reloaded, tokenizer2 = load_teacher(tmp_path / "teacher")
    windows = encode(dev, tokenizer2, reloaded.tag_vocab, reloaded.max_seq_length)
    inputs = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask}
    np.testing.assert_allclose(reloaded(inputs).numpy(), teacher(inputs).numpy(), atol=1e-5)
    assert (predict_piece_tags(reloaded, windows) == predict_piece_tags(teacher, windows)).all()
    assert reloaded.tag_vocab.tags == teacher.tag_vocab.tags
    assert not (tmp_path / "teacher.tmp").exists()


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_hidden_states_of_the_chosen_layer(trained):
    teacher, tokenizer, dev, _, _ = trained
    windows = encode(dev[:3], tokenizer, teacher.tag_vocab, teacher.max_seq_length)
    inputs = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask}
    logits, hidden = teacher.call_with_hidden(inputs, layer=2)
    np.testing.assert_allclose(logits.numpy(), teacher(inputs).numpy(), atol=1e-5)
    # The last layer's hidden states are what the head reads.
    np.testing.assert_allclose(teacher.classifier(hidden).numpy(), logits.numpy(), atol=1e-5)
    with pytest.raises(ConfigError, match="out of range"):
        teacher.call_with_hidden(inputs, layer=3)


def test_layerwise_decay_gives_each_depth_its_rate(tiny_bert_dir):
    teacher, _ = build_teacher(str(tiny_bert_dir), TOY_LABELS, random_init=True)
    config = FinetuneConfig(learning_rate=1e-3, head_learning_rate=1e-2, layer_decay=0.5, warmup_fraction=0.0)
    groups = parameter_groups(teacher, config, total_steps=100)
    rates = [float(opt.learning_rate) for opt, _ in groups]  # at step 0, no warm-up
    # Last encoder layer (depth 0), first layer (depth 1), embeddings (depth 2), then the head.
    assert rates == pytest.approx([1e-3, 5e-4, 2.5e-4, 1e-2])
    names = [[v.name for v in vs] for _, vs in groups]
    assert all("layer_._1/" in n for n in names[0])
    assert all("layer_._0/" in n for n in names[1])
    assert all("embeddings" in n for n in names[2])
    # Everything but the pooler, which a token head never uses.
    assert sum(len(vs) for _, vs in groups) == len(teacher.trainable_variables) - 2


def test_layer_depth_parses_bert_names():
    assert layer_depth("tf_bert_model/bert/encoder/layer_._11/output/dense/kernel:0", 12) == 0
    assert layer_depth("tf_bert_model/bert/encoder/layer_._0/output/dense/kernel:0", 12) == 11
    assert layer_depth("tf_bert_model/bert/embeddings/word_embeddings/weight:0", 12) == 12


def test_teacher_dir_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_teacher(str(tmp_path / "missing"), TOY_LABELS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        build_teacher(str(tmp_path / "empty"), TOY_LABELS)
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no weights"):
        build_teacher(str(tmp_path / "empty"), TOY_LABELS)
    with pytest.raises(ConfigError, match="not a saved teacher"):
        load_teacher(tmp_path / "empty")


def i_per_teacher(tiny_bert_dir):
    """(teacher, tokenizer, sentences, their windows): every piece's logits I-PER > B-PER > O, and the
    [CLS]/[SEP]/X marker columns far above all (a first-piece teacher never learnt them)."""
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, random_init=True)
    kernel, _ = teacher.classifier.get_weights()
    bias = np.full(len(teacher.tag_vocab), -5.0, np.float32)
    bias[[teacher.tag_vocab.tags.index(t) for t in ("O", "B-PER", "I-PER")]] = [1.0, 2.0, 3.0]
    bias[len(TOY_LABELS):] = 100.0
    teacher.classifier.set_weights([np.zeros_like(kernel), bias])
    sentences = [Sentence(["john", "paul", "smith"], ["B-PER", "I-PER", "I-PER"]), Sentence(["paris"], ["B-LOC"])]
    return teacher, tokenizer, sentences, encode(sentences, tokenizer, teacher.tag_vocab, 16)


def test_teacher_decoded_as_the_students_gives_the_best_valid_sequence_over_word_labels(tiny_bert_dir):
    """teacher_word_tags(decode=...): the teacher's own argmax tags every word I-PER; the students'
    constrained decoder gives B-PER then I-PER, the best sequence IOB2 allows, over the word labels
    only; decode="argmax" reads the same columns."""
    teacher, tokenizer, sentences, windows = i_per_teacher(tiny_bert_dir)
    assert teacher_word_tags(teacher, windows, "IOB2") == [["I-PER"] * 3, ["I-PER"]]
    assert teacher_word_tags(teacher, windows, "IOB2", "argmax") == [["I-PER"] * 3, ["I-PER"]]
    assert teacher_word_tags(teacher, windows, "IOB2", "constrained") == [["B-PER", "I-PER", "I-PER"], ["B-PER"]]
    scores = evaluate_teacher(teacher, tokenizer, sentences, "IOB2", decode="constrained")
    assert scores["all"]["f1"] == pytest.approx(2 * 0.5 * 0.5 / (0.5 + 0.5))  # john paul smith found, paris typed wrong
    with pytest.raises(ConfigError, match="--decode=wrong"):
        teacher_word_tags(teacher, windows, "IOB2", "wrong")


def test_every_decode_of_a_teacher_comes_from_one_forward_pass(tiny_bert_dir, monkeypatch):
    """teacher_word_tags_by_decode / evaluate_teacher_by_decode: each decode's tags and scores are those of
    teacher_word_tags / evaluate_teacher with that decode alone, from one pass over the windows."""
    teacher, tokenizer, sentences, windows = i_per_teacher(tiny_bert_dir)
    decodes = (None, "constrained", "argmax")
    alone = {decode: finetune_module.teacher_word_tags(teacher, windows, "IOB2", decode) for decode in decodes}
    scores = {decode: evaluate_teacher(teacher, tokenizer, sentences, "IOB2", decode=decode) for decode in decodes}
    passes = []
    monkeypatch.setattr(finetune_module, "predict_by_length",
                        lambda windows, fn, *args: passes.append(len(windows)) or predict_by_length(windows, fn, *args))
    assert finetune_module.teacher_word_tags_by_decode(teacher, windows, "IOB2", decodes) == alone
    assert passes == [len(windows)]
    assert finetune_module.evaluate_teacher_by_decode(teacher, tokenizer, sentences, "IOB2", decodes) == scores
    assert passes == [len(windows)] * 2
    assert alone["constrained"] != alone[None] == alone["argmax"]  # the decodes differ: a mix-up shows


def test_a_crf_teacher_decodes_with_its_viterbi_only(tiny_bert_dir):
    teacher, tokenizer = build_crf_teacher(str(tiny_bert_dir), TOY_LABELS, "IOB2", max_seq_length=16,
                                           random_init=True)
    windows = encode([Sentence(["john", "went"], ["B-PER", "O"])], tokenizer, teacher.tag_vocab, 16)
    own = teacher_word_tags(teacher, windows, "IOB2")
    assert teacher_word_tags(teacher, windows, "IOB2", "constrained") == own
    with pytest.raises(ConfigError, match="--decode=argmax: a CRF teacher"):
        teacher_word_tags(teacher, windows, "IOB2", "argmax")


NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def test_micro_batches_give_the_batchs_update(tiny_bert_dir):
    """--teacher_micro_batch_size: 7 windows of unequal label counts in parts of 3, 3 and 1 give the whole batch's
    loss and, by plain SGD (whose step is the gradient itself), the same weights; an unweighted mean of the parts'
    losses would not."""
    def teacher_and_step(micro):
        tf.keras.utils.set_random_seed(3)
        teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, dropout=0.0,
                                           random_init=True, config_overrides=NO_DROPOUT)
        variables = [v for v in teacher.trainable_variables if "pooler" not in v.name]
        return teacher, tokenizer, finetune_module.make_train_step(teacher, [(tf.keras.optimizers.SGD(0.5), variables)],
                                                                   micro_batch_size=micro)

    results = []
    for micro in (0, 3):
        teacher, tokenizer, step = teacher_and_step(micro)
        windows = finetune_module.supervised_windows(
            encode(toy_ner_sentences(7, seed=5), tokenizer, teacher.tag_vocab, 16), teacher.tag_vocab, "first_piece")
        batch = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
                 "label_ids": windows.label_ids}
        counts = (windows.label_ids < len(teacher.tag_vocab.labels)).sum(1)
        assert len({counts[:3].sum(), counts[3:6].sum(), counts[6]}) == 3   # parts of unequal weight
        loss = float(step({k: tf.constant(v, tf.int32) for k, v in batch.items()}))
        results.append((loss, [v.numpy() for v in teacher.trainable_variables]))
    (full_loss, full), (parts_loss, parts) = results
    assert parts_loss == pytest.approx(full_loss, rel=1e-5)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(full, parts))
    assert moved < 1e-5
    tf.keras.utils.set_random_seed(3)
    fresh, _ = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, dropout=0.0, random_init=True,
                             config_overrides=NO_DROPOUT)
    assert max(float(np.abs(a - b.numpy()).max()) for a, b in zip(full, fresh.trainable_variables)) > 1e-3


def test_a_teacher_larger_than_a_shard_is_saved_in_shards_and_reloads_whole(tiny_bert_dir, tmp_path, monkeypatch):
    """Teacher weights go to safetensors shards of at most SHARD_SIZE (a base-sized teacher's single file cost its
    step 0.41 GiB of peak memory, docs/benchmarks.md 5.2), with transformers' index; the reload has every weight."""
    monkeypatch.setattr(teacher_model, "SHARD_SIZE", "10KB")
    tf.keras.utils.set_random_seed(3)
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=16, random_init=True)
    teacher.save(tmp_path / "teacher", tokenizer)
    encoder = tmp_path / "teacher" / "encoder"
    shards = sorted(encoder.glob("model-*.safetensors"))
    assert (encoder / "model.safetensors.index.json").exists() and len(shards) > 3
    assert not (encoder / "model.safetensors").exists()
    assert max(shard.stat().st_size for shard in shards) < 100_000
    reloaded, _ = load_teacher(tmp_path / "teacher")
    assert len(reloaded.encoder.weights) == len(teacher.encoder.weights) > 20
    for saved, loaded in zip(teacher.encoder.weights, reloaded.encoder.weights):   # one model's names, scoped apart
        assert saved.name.split("/", 1)[1] == loaded.name.split("/", 1)[1]
        np.testing.assert_array_equal(loaded.numpy(), saved.numpy())
