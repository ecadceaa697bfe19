"""bin/export --format=onnx for softmax BiLSTM students: the graph built from the weights
(export.onnx_bilstm, one bidirectional LSTM op) gives the Keras graph's tags; other students keep
the tf2onnx conversion (issue 33 item 3)."""
import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import TOY_LABELS, sticky_crf_student

from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export import onnx_bilstm
from xtremedistil_tf.export.formats import ONNX_OPSET, _ids_function, export_portable, onnx_from_function
from xtremedistil_tf.export.serving import NerServing
from xtremedistil_tf.students.artifact import StudentMeta, write_student_dir
from xtremedistil_tf.students.layers import BlockBiLSTM, SequenceMask
from xtremedistil_tf.students.models import build_bilstm_student

onnx = pytest.importorskip("onnx", reason="onnx is not installed (requirements.txt pins it)")
onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (requirements.txt pins it)")
pytest.importorskip("tf2onnx", reason="tf2onnx is not installed (requirements.txt pins it)")


def _padded_batches(vocab_size, seed=0):
    """Right-padded batches of random pieces: mixed lengths (0 to 20), all full, and one row."""
    rng = np.random.default_rng(seed)
    batches = []
    for lengths in ([20, 1, 2, 9, 0, 15, 20, 3, 11], [12] * 4, [7]):
        width = max(lengths)
        mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
        batches.append(((rng.integers(4, vocab_size, mask.shape) * mask).astype(np.int32), mask))
    return batches


def _run(path, ids, mask):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"input_ids": ids, "attention_mask": mask})))


def _ops(path):
    return [node.op_type for node in onnx.load(str(path)).graph.node]


@pytest.fixture(scope="module")
def student_dirs(tmp_path_factory, toy_student_dir, tiny_tokenizer, tiny_tokenizer_dir):
    """The trained toy student (heads on the projection) and an untrained one with heads on the states."""
    tf.keras.utils.set_random_seed(7)
    states = build_bilstm_student(tiny_tokenizer.vocab_size, len(TagVocab(TOY_LABELS)), embedding_dim=8, hidden=8,
                                  teacher_hidden=8, dropout=0.0, heads_on="states")
    return {"projection": toy_student_dir,
            "states": write_student_dir(states, tmp_path_factory.mktemp("states"), StudentMeta(TOY_LABELS),
                                        tiny_tokenizer_dir / "vocab.txt")}


@pytest.mark.parametrize("heads_on", ["projection", "states"])
def test_bilstm_graph_gives_the_keras_tags_with_one_bidirectional_lstm(student_dirs, tmp_path, heads_on):
    """float32: the export is the graph built from the weights (one bidirectional LSTM op, no
    ReverseSequence), and its tags equal the Keras graph's (NerServing.ids, what the SavedModel
    serves) and the tf2onnx conversion's on padded batches of mixed lengths; probabilities within
    float rounding at real positions."""
    exported = export_portable(student_dirs[heads_on], tmp_path, "ner", "onnx")
    assert json.loads((exported.directory / "export.json").read_text())["onnx_graph"] == "bilstm"
    ops = _ops(exported.model_file)
    assert ops.count("LSTM") == 1 and "ReverseSequence" not in ops and len(ops) <= 25, ops
    lstm = next(n for n in onnx.load(str(exported.model_file)).graph.node if n.op_type == "LSTM")
    assert {a.name: a for a in lstm.attribute}["direction"].s == b"bidirectional"
    assert (heads_on == "states") == ("Erf" not in ops)  # the projection (GELU) is training-only there

    module = exported.module
    converted = tmp_path / "tf2onnx.onnx"
    onnx_from_function(_ids_function(module, None), converted)
    vocab_size = len(module.vocab)
    for ids, mask in _padded_batches(vocab_size):
        got = _run(exported.model_file, ids, mask)
        reference = {k: v.numpy() for k, v in module.ids(tf.constant(ids), tf.constant(mask)).items()}
        old = _run(converted, ids, mask)
        np.testing.assert_array_equal(got["tag_ids"], reference["tag_ids"])
        np.testing.assert_array_equal(got["tag_ids"], old["tag_ids"])
        np.testing.assert_allclose(got["tag_probs"], reference["tag_probs"], atol=1e-5)
        real = mask.astype(bool)
        np.testing.assert_allclose(got["probs"][real], reference["probs"][real], atol=1e-5)
        assert got["tag_ids"].dtype == np.int32 and got["tag_probs"].dtype == np.float32


def test_int8_bilstm_graph_quantizes_the_lstm_and_agrees_with_the_float_graph(student_dirs, tmp_path):
    """dynamic_int8: one DynamicQuantizeLSTM; piece tags within the int8 rate tests/test_export_formats.py
    allows (5%) of the float32 graph's."""
    float_dir = export_portable(student_dirs["projection"], tmp_path, "ner", "onnx")
    int8_dir = export_portable(student_dirs["projection"], tmp_path, "ner", "onnx", "dynamic_int8")
    ops = _ops(int8_dir.model_file)
    assert ops.count("DynamicQuantizeLSTM") == 1 and "LSTM" not in ops
    differ = real = 0
    for ids, mask in _padded_batches(len(float_dir.module.vocab), seed=1):
        a, b = _run(float_dir.model_file, ids, mask), _run(int8_dir.model_file, ids, mask)
        np.testing.assert_array_equal(a["tag_ids"][mask == 0], b["tag_ids"][mask == 0])
        differ += int((a["tag_ids"] != b["tag_ids"])[mask > 0].sum())
        real += int(mask.sum())
    assert differ <= 0.05 * real, f"{differ} of {real} piece tags differ"


@pytest.mark.slow  # end to end: CI runs it (Makefile CI_SLOW_TESTS)
def test_other_students_keep_the_tf2onnx_conversion(tiny_tokenizer, tiny_tokenizer_dir, tmp_path):
    """A CRF student has no graph built from the weights (its potentials and Viterbi are
    predict.py's); its export says why and is tf2onnx's (two forward LSTMs)."""
    crf_dir = write_student_dir(sticky_crf_student(tiny_tokenizer), tmp_path / "crf",
                                StudentMeta(TOY_LABELS, decoder="crf"), tiny_tokenizer_dir / "vocab.txt")
    module = NerServing.from_student_dir(crf_dir)
    model, why = onnx_bilstm.bilstm_graph(module, ONNX_OPSET)
    assert model is None and "crf" in why
    exported = export_portable(crf_dir, tmp_path, "crf", "onnx")
    assert json.loads((exported.directory / "export.json").read_text())["onnx_graph"].startswith("tf2onnx (")
    assert _ops(exported.model_file).count("LSTM") == 2


def test_served_chain_refuses_layers_it_has_no_form_for():
    """served_chain names what it cannot build (here a ReLU Dense) instead of building a wrong graph."""
    ids = tf.keras.Input((None,), dtype=tf.int32, name="input_ids")
    mask = tf.keras.Input((None,), dtype=tf.int32, name="attention_mask")
    x = tf.keras.layers.Embedding(20, 4, name="word_embedding")(ids)
    x = BlockBiLSTM(3, name="bilstm")(x, mask=SequenceMask(name="sequence_mask")(mask))
    x = tf.keras.layers.Dense(5, activation="relu", name="projection")(x)
    x = tf.keras.layers.Dense(4, use_bias=False, name="softmax")(x)
    model = tf.keras.Model([ids, mask], {"probs": tf.keras.layers.Activation("softmax", name="probs")(x)})
    chain, why = onnx_bilstm.served_chain(model)
    assert chain is None and "relu" in why
