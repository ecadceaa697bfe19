"""MPNet (all-mpnet-base-v2's family, `--teacher=mpnet-base`) as a first-class teacher, on a tiny MPNet made here
(MPNetConfig, 2 layers, hidden 32; an MPNet WordPiece tokenizer whose specials are <s>, </s>, <pad>, [UNK]): through
the pipeline, its student exported for TF Serving (fresh process), ONNX and TFLite serving the student directory's
entities, its teacher's ONNX export against the TensorFlow teacher (the exact GELU's erf converts), and a fine-tuned
MPNetForTokenClassification checkpoint brought as a teacher."""
import json
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import tensorflow as tf
from test_export import ENV, LOAD_AND_CALL
from test_sentencepiece_export import _assert_same_entities, portable_export, served_texts, trained_student
from test_transfer_text import small_config, write_small_corpus
from transformers import MPNetConfig, MPNetTokenizerFast, TFMPNetForTokenClassification

from xtremedistil_tf.export import portable
from xtremedistil_tf.export.predictor import entities, load_serving_fn, predict
from xtremedistil_tf.export.serving import export_student
from xtremedistil_tf.export.teacher import export_teacher, teacher_function
from xtremedistil_tf.export.words import WordPieces
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.students.artifact import check_specials, read_config, special_pieces
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers.families import WORDPIECE, tokenizer_family
from xtremedistil_tf.teachers.model import load_tokenizer
from xtremedistil_tf.teachers.saved import load_teacher

LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
WORDS = ["the", "in", "of", "to", "and", "at", "on", "is", "was", "paris", "berlin", "john", "mary"]


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory):
    """A tiny MPNet: its tokenizer (MPNet's specials at MPNet's ids: <s>=0, <pad>=1, </s>=2) and config, no weights.
    Like all-mpnet-base-v2's, the vocabulary also holds BERT's [PAD] [CLS] [SEP] [MASK] after MPNet's own, which its
    tokenizer does not use."""
    directory = tmp_path_factory.mktemp("mpnet")
    vocab = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<mask>", ".", ",", "-"] + \
        LETTERS + ["##" + c for c in LETTERS] + WORDS + [str(d) for d in range(10)] + ["##" + str(d) for d in range(10)]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    MPNetTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(str(directory))
    MPNetConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=130, pad_token_id=1).save_pretrained(str(directory))
    return directory


def test_mpnet_pieces_and_specials_are_its_own(mpnet_dir):
    """The served WordPiece tokenizer reads MPNet's specials by their names (<s>, </s>, <pad>, [UNK]) and cuts the
    words as MPNet's own tokenizer does."""
    tokenizer = load_tokenizer(str(mpnet_dir))
    assert tokenizer_family(tokenizer) == WORDPIECE
    vocab = (mpnet_dir / "vocab.txt").read_text(encoding="utf-8").split()
    assert special_pieces(vocab) == {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "[UNK]", "mask": "<mask>"}
    served = WordPieces(vocab, lower_case=True)
    assert (served.cls_id, served.sep_id, served.pad_id) == (tokenizer.cls_token_id, tokenizer.sep_token_id,
                                                             tokenizer.pad_token_id) == (0, 2, 1)
    words = ["John", "Berlin", "Zürich", "xyz", "paris", "42", "ß", "😀"]
    pieces = served.pieces(tf.constant(words)).to_list()
    assert pieces == [tokenizer(w, add_special_tokens=False).input_ids or [tokenizer.unk_token_id] for w in words]


def test_the_served_markers_must_be_the_ones_the_students_tokenizer_declares(mpnet_dir, tmp_path):
    vocab = (mpnet_dir / "vocab.txt").read_text(encoding="utf-8").split()
    check_specials(vocab, mpnet_dir)   # MPNet's tokenizer declares <s> </s> <pad> [UNK]: what special_pieces gives
    declared = json.loads((mpnet_dir / "special_tokens_map.json").read_text(encoding="utf-8"))
    declared["cls_token"] = "[CLS]"
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(declared), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"declares cls '\[CLS\]' but the vocabulary's markers would be '<s>'"):
        check_specials(vocab, tmp_path)


@pytest.fixture(scope="module")
def mpnet_run(tmp_path_factory, mpnet_dir):
    corpus = write_small_corpus(tmp_path_factory.mktemp("corpus"))
    cfg = small_config(tmp_path_factory.mktemp("work"), corpus, mpnet_dir)
    return cfg, pipeline.run(cfg)


@pytest.mark.slow  # a pipeline run and an ONNX conversion of the teacher
def test_mpnet_teacher_through_the_pipeline_and_its_onnx_export(mpnet_run, tmp_path):
    cfg, metrics = mpnet_run
    teacher, _ = load_teacher(f"{cfg.work_dir}/teacher/model")
    assert teacher.encoder.config.model_type == "mpnet" and metrics["student"]["parameters"] > 0
    assert read_config(f"{cfg.work_dir}/student").tokenizer_family == WORDPIECE
    exported = export_teacher(f"{cfg.work_dir}/teacher/model", tmp_path)
    ids = np.random.default_rng(0).integers(5, 70, (4, 12)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    mask = np.ones_like(ids)
    expected = teacher_function(teacher)(input_ids=ids, attention_mask=mask)
    session = onnxruntime.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, tags = session.run(["logits", "tag_ids"], {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(logits, expected["logits"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(tags, expected["tag_ids"].numpy())


@pytest.fixture(scope="module")
def mpnet_student(mpnet_dir, tmp_path_factory):
    """(student dir of a toy student on MPNet's pieces, served_texts(), its entities from the student dir)."""
    student_dir = trained_student(load_tokenizer(str(mpnet_dir)), tmp_path_factory.mktemp("mpnet_student") / "student")
    texts = served_texts()
    expected = predict(load_serving_fn(student_dir), texts)
    assert sum(len(r["entities"]) for r in expected) > 150, "the toy student finds entities: the test is not vacuous"
    return student_dir, texts, expected


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_mpnet_student_saved_model_serves_the_student_dirs_entities_in_a_fresh_process(mpnet_student, tmp_path):
    student_dir, texts, expected = mpnet_student
    exported = export_student(student_dir, tmp_path / "export")[0]
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_CALL, str(exported)], input=json.dumps(texts),
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {k: tf.constant(v) for k, v in json.loads(proc.stdout.splitlines()[-1])["out"].items()}
    _assert_same_entities(entities(out, texts), expected)


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_mpnet_student_portable_predict_gives_the_student_dirs_entities(mpnet_student, tmp_path, fmt):
    student_dir, texts, expected = mpnet_student
    exported, served = portable_export(student_dir, tmp_path, fmt, texts)
    # MPNet's own <s> </s> <pad> and [UNK], not the [CLS] [SEP] [PAD] its vocabulary also holds (6, 7, 4).
    assert json.loads((exported.directory / "export.json").read_text())["special_ids"] == \
        {"cls": 0, "sep": 2, "pad": 1, "unk": 5}
    _assert_same_entities(portable.load(exported.directory).predict(served),
                          [record for record in expected if record["text"] in served])


@pytest.mark.slow  # a teacher-only pipeline run
def test_a_finetuned_mpnet_checkpoint_is_used_as_it_is(mpnet_dir, tmp_path):
    """An MPNetForTokenClassification checkpoint brought as --teacher: used as it is (no fine-tuning), its own
    predictions are the teacher's argmax scores' source."""
    checkpoint = tmp_path / "checkpoint"
    config = MPNetConfig.from_pretrained(str(mpnet_dir), num_labels=5,
                                         id2label=dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])))
    model = TFMPNetForTokenClassification(config)
    model(model.dummy_inputs)
    model.save_pretrained(str(checkpoint))
    load_tokenizer(str(mpnet_dir)).save_pretrained(str(checkpoint))
    cfg = small_config(tmp_path / "work", write_small_corpus(tmp_path / "corpus"), checkpoint)
    cfg.student, cfg.teacher.random_init = None, False
    metrics = pipeline.run(cfg)
    assert metrics["teacher"]["best_epoch"] == 0   # not fine-tuned
    teacher, _ = load_teacher(f"{cfg.work_dir}/teacher/model")
    assert type(teacher).__name__ == "PretrainedTokenTeacher"
    assert teacher.model.config.model_type == "mpnet"
