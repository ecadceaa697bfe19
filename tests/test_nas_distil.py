"""Task-agnostic distillation of a random BERT student (methods/nas/distil.py) and the saved student."""
import json

import numpy as np
import pytest
import tensorflow as tf
from transformers import BertConfig, BertTokenizerFast, TFBertModel

from tests.conftest import write_tiny_vocab
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.nas.distil import (
    NasDistilConfig,
    Distiller,
    build_student,
    encode_texts,
    load_teacher,
    save_student,
    split_texts,
)
from xtremedistil_tf.methods.nas.space import Arch

WORDS = ["the", "in", "of", "to", "and", "paris", "berlin", "john", "mary", "was", "at", "on"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A randomly initialised 2-layer, hidden-32 BERT saved with weights and the tiny vocab."""
    directory = write_tiny_vocab(tmp_path_factory.mktemp("nas_teacher"))
    vocab_size = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    tf.keras.utils.set_random_seed(0)
    model = TFBertModel(BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=64, initializer_range=0.2))
    model.build_in_name_scope()
    model.save_pretrained(str(directory))
    BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(str(directory))
    return directory


def texts(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 10)))) for _ in range(n)]


def test_a_distilled_student_saves_and_reloads_with_identical_outputs(teacher_dir, tmp_path):
    teacher, tokenizer, teacher_config = load_teacher(str(teacher_dir))
    ids = encode_texts(tokenizer, texts(16, 0), 16)
    arch = Arch(1, 2, 16, 32, "silu")
    student = build_student(arch, teacher_config, seed=0)
    Distiller(teacher, student, NasDistilConfig(batch_size=16, learning_rate=1e-2)).train(ids, progress=False)
    out = save_student(student, tokenizer, tmp_path / "student", {"arch": arch.key})
    reloaded = TFBertModel.from_pretrained(str(out))
    batch = tf.constant(ids[0][None, :])
    np.testing.assert_array_equal(reloaded(batch).last_hidden_state.numpy(), student(batch).last_hidden_state.numpy())
    assert reloaded.config.hidden_act == "silu" and reloaded.config.vocab_size == teacher_config["vocab_size"]
    assert json.loads((out / "distillation.json").read_text())["arch"] == arch.key
    _, reloaded_tokenizer, _ = load_teacher(str(out))  # what bin/train --teacher=<dir> loads
    assert reloaded_tokenizer("paris was").input_ids == tokenizer("paris was").input_ids


@pytest.mark.slow
def test_distillation_lowers_the_held_out_loss_and_the_student_reloads(teacher_dir, tmp_path):
    teacher, tokenizer, teacher_config = load_teacher(str(teacher_dir))
    train_ids, eval_ids = (encode_texts(tokenizer, texts(n, s), 16) for n, s in ((96, 0), (32, 1)))
    arch = Arch(1, 2, 16, 32, "relu")
    config = NasDistilConfig(objective="hs+minilm", relation_heads=4, epochs=3, batch_size=16, learning_rate=3e-3)
    student = build_student(arch, teacher_config, seed=0)
    assert student.config.vocab_size == teacher_config["vocab_size"]
    assert student.config.hidden_act == "relu" and student.config.num_hidden_layers == 1
    distiller = Distiller(teacher, student, config)
    assert distiller.pairs == [(1, 1), (1, 2)]  # Uniform+Last for (2, 1)
    before = distiller.evaluate(eval_ids)
    distiller.train(train_ids, progress=False)
    after = distiller.evaluate(eval_ids)
    assert set(after) == {"hs", "minilm", "total"}
    assert after["hs"] < 0.8 * before["hs"] and after["minilm"] < before["minilm"]

    out = save_student(student, tokenizer, tmp_path / "student", {"arch": arch.key})
    reloaded = TFBertModel.from_pretrained(str(out))
    ids = tf.constant(eval_ids[0][None, :])
    np.testing.assert_array_equal(reloaded(ids).last_hidden_state.numpy(), student(ids).last_hidden_state.numpy())
    assert json.loads((out / "distillation.json").read_text())["arch"] == arch.key
    _, reloaded_tokenizer, _ = load_teacher(str(out))  # what bin/train --teacher=<dir> loads
    assert reloaded_tokenizer("paris was").input_ids == tokenizer("paris was").input_ids


def test_data_helpers_and_bad_configs(teacher_dir):
    teacher, tokenizer, teacher_config = load_teacher(str(teacher_dir))
    sentences = [f"john was in paris {n}" for n in range(40)]
    train, held_out = split_texts(sentences, train=20, evaluation=8, seed=0)
    assert len(train) == 20 and len(held_out) == 8 and not set(train) & set(held_out)
    assert split_texts(sentences, train=0, evaluation=8, seed=0)[0][:20] == train  # 0: all the rest
    ids = encode_texts(tokenizer, train, 8)
    assert max(len(x) for x in ids) <= 8 and all(x[0] == tokenizer.cls_token_id for x in ids)
    student = build_student(Arch(1, 2, 8, 16, "gelu"), teacher_config)
    with pytest.raises(ConfigError, match="relation heads"):
        Distiller(teacher, student, NasDistilConfig(objective="minilm", relation_heads=3))
    with pytest.raises(ConfigError, match="not divisible"):
        build_student(Arch(1, 3, 8, 16, "gelu"), teacher_config)
    with pytest.raises(ConfigError, match="objective"):
        NasDistilConfig(objective="kl")
