"""bin/benchmark served_text on a tiny student: the stages it times are `serve`, and every row is printed.

No timing assertions: the machine is shared.
"""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.benchmarks import latency, served_text
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.formats import export_portable
from xtremedistil_tf.export.serving import NerServing
from xtremedistil_tf.students.artifact import StudentMeta
from xtremedistil_tf.students.models import build_bilstm_student


def test_stages_chained_give_the_signature_outputs():
    """The stages the benchmark times one by one, each on the one before's outputs, give what `serve` gives."""
    vocab, texts = latency.word_texts(40, 3, 8)
    student = build_bilstm_student(len(vocab), len(TagVocab(latency.LABELS)), 4, 3, 8)
    module = NerServing(student, StudentMeta(labels=latency.LABELS), vocab)
    batch = tf.constant(list(texts) + ["", "w1 \xe9 w2"])
    text, pieces, start, end, _ = module._tokens(batch)
    windows = module._windows(pieces)
    tags, probs = module._word_tags(module._student_outputs(*windows[:2]), windows, start)
    chained, served = module._entities(text, start, end, tags, probs), module.serve(batch)
    assert chained.keys() == served.keys()
    for name in served:
        np.testing.assert_array_equal(chained[name].numpy(), served[name].numpy(), err_msg=name)
    assert served["num_words"].numpy().tolist() == [6, 6, 6, 0, 3]


def test_every_row_is_printed():
    result = served_text.measure(4, 3, 40, queries=2, seq_length=6, repeats=1)
    assert set(result["ms"]) == {*served_text.STAGES, *served_text.PARTS, "call", "serve", "serving_default",
                                 "student graph"}
    assert all(ms > 0 for ms in result["ms"].values())
    lines = served_text.format_lines(result)
    rows = [line.split("|")[1].strip() for line in lines if line.startswith("| ")]
    assert rows[1:] == ["tokens", "- valid_utf8", "- words", "- pieces", "windows", "student", "word tags",
                        "entities", "sum of the stages", "empty tf.function call (in each stage's time)",
                        "serve (the method, in process)", "serving_default (reloaded SavedModel)",
                        "student graph on ids (keras+xla)"]
    assert lines[-1].startswith("serving_default / student graph: ")


def test_served_exports_side_by_side(tmp_path, monkeypatch):
    """--served_exports: every export gets ids and text timed in each round, rows in the order given, ratios from the
    medians; a path that is no export is named in one line."""
    vocab, _ = latency.word_texts(40, 3, 8)
    student = build_bilstm_student(len(vocab), len(TagVocab(latency.LABELS)), 4, 3, 8)
    module = NerServing(student, StudentMeta(labels=latency.LABELS), vocab)
    signatures = {"serving_default": module.serve.get_concrete_function(), "ids": module.ids.get_concrete_function()}
    paths = [str(tmp_path / name) for name in ("b", "a")]
    for path in paths:
        tf.saved_model.save(module, path, signatures=signatures)
    # TensorFlow has started in this process: keep its threads as they are.
    monkeypatch.setattr(served_text, "set_tensorflow_threads", lambda threads, inter_op: threads or 1)
    result = served_text.compare_exports(paths, rounds=2, seq_length=8, threads=1, inter_op=1, calls=3,
                                         batch_sizes=(1, 3))
    assert list(result["ms"]) == paths
    assert all(len(ms) == 2 and min(ms) > 0 for by_batch in result["ms"].values() for row in by_batch.values()
               for ms in row.values())
    lines = served_text.format_exports(result)
    rows = [line.split("|")[1:-1] for line in lines[3:]]
    assert [(row[0].strip(), row[1].strip()) for row in rows] == [(p, b) for p in paths for b in ("1", "3")]
    for row in rows:
        ids_ms, text_ms, ratio = (float(cell) for cell in row[2:5])
        # The ratio comes from the medians; the cells are rounded to 3 decimals (ids of 0.13 ms hold 0.4% of slack).
        bound = 0.005 + text_ms / ids_ms * (0.0005 / ids_ms + 0.0005 / text_ms)
        assert abs(ratio - text_ms / ids_ms) <= bound
    assert min(float(row[5]) for row in rows) == 1.0
    with pytest.raises(ValueError, match="no such directory: .*missing"):
        served_text.compare_exports([str(tmp_path / "missing")], rounds=1, seq_length=8, threads=1, inter_op=1)
    with pytest.raises(ValueError, match="neither a SavedModel"):
        served_text.compare_exports([str(tmp_path)], rounds=1, seq_length=8, threads=1, inter_op=1)


def test_portable_exports_against_a_baseline_revision(toy_student_dir, tmp_path, monkeypatch):
    """An ONNX export on news-like texts at batch 1 and 4: ids (the model on the text path's own windows), text, and
    the text path of a git revision's portable.py (here HEAD) on the same export; a revision git does not know is
    named in one line."""
    exported = export_portable(toy_student_dir, tmp_path, "ner", "onnx")
    monkeypatch.setattr(served_text, "set_tensorflow_threads", lambda threads, inter_op: threads or 1)
    texts = served_text.news_texts(50)
    assert 13 <= np.mean([len(t.split()) for t in texts]) <= 19
    assert all(any(word[0].isupper() for word in t.split()[1:]) for t in texts)
    result = served_text.compare_exports([str(exported.directory)], rounds=1, seq_length=8, threads=1, inter_op=1,
                                         calls=2, batch_sizes=(1, 4), texts="news", baseline="HEAD")
    row = result["ms"][str(exported.directory)]
    assert set(row) == {1, 4} and all(set(r) == {"ids", "text", "baseline"} for r in row.values())
    lines = served_text.format_exports(result)
    assert "news-like sentences" in lines[0] and "baseline text ms" in lines[1]
    assert len(lines) == 5 and all(len(line.split("|")) == 11 for line in lines[3:])
    baseline = served_text.baseline_portable("HEAD")
    predictor = baseline.Predictor(exported.directory)
    assert predictor.predict(texts) == served_text.portable.Predictor(exported.directory).predict(texts)
    with pytest.raises(ValueError, match="--served_baseline=no-such-rev: "):
        served_text.baseline_portable("no-such-rev")
