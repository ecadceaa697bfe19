"""predict.py's text path decodes a whole batch at once in NumPy (export/portable.py: `decode_batch`, `viterbi_batch`,
`span_means`, `Predictor._layout` and `_records`); the records are those of the per-text code it replaced, kept here
as the reference (`_old_*`: portable.py before issue 51, item 3), on random probabilities: texts whose greedy path
breaks the scheme (Viterbi), empty texts, texts cut into windows, word shapes."""
import json
import random
import sys

import numpy as np
import pytest
from tokenizers import AddedToken, pre_tokenizers

from conftest import REPO
from xtremedistil_tf.crf.decoding import WordDecoder
from xtremedistil_tf.data.alignment import TagVocab
from xtremedistil_tf.export.formats import write_tokenizer
from xtremedistil_tf.export.serving import tag_tables
from xtremedistil_tf.students.artifact import StudentMeta

sys.path.insert(0, str(REPO / "xtremedistil_tf" / "export"))
import portable  # noqa: E402  (the shipped predict.py)

LABELS = {"IOB2": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
          "BIOES": ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]}


def _old_decode_words(probs, meta):
    """portable.decode_words before it decoded batches: one text's words."""
    num_labels = len(meta["word_start"])
    fold = np.eye(num_labels + 1, dtype=np.float32)[np.array(meta["label_of_tag"])][:, :num_labels]
    scores = (np.asarray(probs, np.float32)[:, :, None] * fold[None]).max(1)
    if meta["decode"] == "argmax":
        labels = scores.argmax(1)
    else:
        potentials = np.log(np.maximum(scores, np.finfo(np.float32).tiny))
        potentials[0, ~np.array(meta["word_start"])] = portable.FORBIDDEN
        potentials[-1, ~np.array(meta["word_end"])] = portable.FORBIDDEN
        transitions, greedy = np.array(meta["word_transitions"], np.float32), potentials.argmax(1)
        valid = (transitions[greedy[:-1], greedy[1:]] == 0).all()
        labels = greedy if valid else portable.viterbi(potentials, transitions)
    return labels, scores[np.arange(len(labels)), labels]


def _old_entities(meta, text, spans_of_words, tags, probs, all_probs=None):
    """Predictor._entities before it decoded batches: one text's records."""
    words = [[int(tags[first]), float(probs[first]), start, end] for first, start, end in spans_of_words]
    if all_probs is not None and words:
        labels, scores = _old_decode_words(np.array([all_probs[first] for first, _, _ in spans_of_words]), meta)
        for word, label, score in zip(words, labels, scores):
            word[0], word[1] = int(label), float(score)
    spans = []
    previous_prefix, previous_type = portable.OUTSIDE, -1
    for index, (tag, prob, _, _) in enumerate(words):
        prefix, type_id = meta["prefixes"][tag], meta["type_ids"][tag]
        continues = (index > 0 and prefix in (portable.INSIDE, portable.END)
                     and previous_prefix in (portable.BEGIN, portable.INSIDE) and previous_type == type_id)
        if continues:
            spans[-1][2] = index
            spans[-1][3].append(prob)
        elif prefix != portable.OUTSIDE:
            spans.append([type_id, index, index, [prob]])
        previous_prefix, previous_type = prefix, type_id
    entities = []
    for type_id, first, last, span_probs in spans:
        start, end = words[first][2], words[last][3]
        entities.append({"start": start, "end": end, "type": meta["types"][type_id], "text": text[start:end],
                         "confidence": round(float(np.mean(np.array(span_probs, np.float32))), 6)})
    return entities


def _meta(scheme, decode):
    config = StudentMeta(LABELS[scheme], scheme=scheme)
    vocab = TagVocab(LABELS[scheme])
    words, prefixes, type_ids, types = tag_tables(config)
    return {"format": "onnx", "prefixes": prefixes, "type_ids": type_ids, "types": types, "tags": config.tags,
            "pad_tag": config.tags.index("[PAD]"), "transitions": None,
            **WordDecoder(vocab.tags, vocab.labels, scheme, decode).export_meta()}


def _random_probs(rng, count, tags, outside=0.0):
    """Peaked random distributions (O's logit raised by `outside`): argmax paths often break the scheme."""
    logits = rng.normal(0, 3, (count, tags)).astype(np.float32)
    logits[:, 0] += outside
    probs = np.exp(logits - logits.max(1, keepdims=True))
    return (probs / probs.sum(1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("scheme", sorted(LABELS))
@pytest.mark.parametrize("decode", ["constrained", "argmax"])
def test_batched_decoding_equals_per_text_decoding(scheme, decode):
    meta, rng = _meta(scheme, decode), np.random.default_rng(0)
    lengths = rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21], 300)
    probs = _random_probs(rng, int(lengths.sum()), len(meta["label_of_tag"]), outside=4.0)
    labels, scores = portable.decode_batch(probs, lengths, meta)
    bounds = np.cumsum(lengths) - lengths
    viterbi_texts = 0
    for start, n in zip(bounds, lengths):
        if n == 0:
            continue
        expected_labels, expected_scores = _old_decode_words(probs[start:start + n], meta)
        np.testing.assert_array_equal(labels[start:start + n], expected_labels)
        np.testing.assert_array_equal(scores[start:start + n], expected_scores)
        one_labels, one_scores = portable.decode_words(probs[start:start + n], meta)
        np.testing.assert_array_equal(one_labels, expected_labels)
        np.testing.assert_array_equal(one_scores, expected_scores)
        viterbi_texts += bool((expected_labels != probs[start:start + n].argmax(1)).any())
    if decode == "constrained":   # texts whose greedy path is invalid, and ones whose is valid
        assert 30 < viterbi_texts < (lengths > 0).sum() - 30, viterbi_texts
    assert portable.decode_batch(probs[:0], [0, 0], meta)[0].shape == (0,)


def test_batched_viterbi_equals_viterbi_with_ties():
    """Integer potentials and transitions: many ties, broken toward the lower tag id as `viterbi` breaks them."""
    rng = np.random.default_rng(1)
    transitions = rng.integers(-2, 1, (5, 5)).astype(np.float32)
    lengths = rng.integers(0, 9, 200)
    potentials = rng.integers(-2, 2, (200, 8, 5)).astype(np.float32)
    paths = portable.viterbi_batch(potentials, lengths, transitions)
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(paths[row, :n], portable.viterbi(potentials[row, :n], transitions))
    assert portable.viterbi_batch(potentials[:0], lengths[:0], transitions).shape == (0, 8)


def _word_probs(meta, rows):
    """Word probabilities [W, tags] from rows of {label: probability} (the rest share what is left)."""
    labels = LABELS["IOB2"]
    probs = np.full((len(rows), len(meta["label_of_tag"])), 0.0, np.float32)
    for i, row in enumerate(rows):
        rest = (1 - sum(row.values())) / (len(labels) - len(row))
        for label in labels:
            probs[i, meta["tags"].index(label)] = row.get(label, rest)
    return probs


def test_constrained_decoding_searches_only_the_stretch_around_broken_moves(monkeypatch):
    """A 40-word text whose greedy path breaks IOB2 once (O then I-PER at words 20-21): the Viterbi searches words
    19-22 (one word before the move; the O after the name may follow anything), and the labels are those of the whole
    text's Viterbi."""
    meta = _meta("IOB2", "constrained")
    rows = [{"O": 0.9}] * 40
    rows[20], rows[21], rows[22] = {"O": 0.5, "B-PER": 0.4}, {"I-PER": 0.6, "B-PER": 0.3}, {"I-PER": 0.7}
    probs = _word_probs(meta, rows)
    searched = []
    real = portable.viterbi
    monkeypatch.setattr(portable, "viterbi", lambda p, t: searched.append(len(p)) or real(p, t))
    labels, _ = portable.decode_batch(probs, [40], meta)
    assert searched == [5]
    assert [LABELS["IOB2"][i] for i in labels[19:24]] == ["O", "B-PER", "I-PER", "I-PER", "O"]
    monkeypatch.setattr(portable, "viterbi", real)
    np.testing.assert_array_equal(labels, _old_decode_words(probs, meta)[0])


def test_constrained_decoding_searches_the_whole_text_where_a_stretch_cannot_follow_the_words_before(monkeypatch):
    """Greedy B-LOC O O O I-PER I-PER O: the stretch of words 1-5 alone would start with I-PER, which may not follow
    B-LOC, so the whole text is searched."""
    meta = _meta("IOB2", "constrained")
    unsure = {"O": 0.40, "I-PER": 0.38, "B-PER": 0.01}
    probs = _word_probs(meta, [{"B-LOC": 0.9}, unsure, unsure, unsure, {"I-PER": 0.9}, {"I-PER": 0.9}, {"O": 0.9}])
    searched = []
    real = portable.viterbi
    monkeypatch.setattr(portable, "viterbi", lambda p, t: searched.append(len(p)) or real(p, t))
    labels, _ = portable.decode_batch(probs, [7], meta)
    assert searched == [5, 7]
    stretch = real(np.log(probs[1:6, [meta["tags"].index(label) for label in LABELS["IOB2"]]]),
                   np.array(meta["word_transitions"], np.float32))
    assert LABELS["IOB2"][stretch[0]] == "I-PER"
    monkeypatch.setattr(portable, "viterbi", real)
    np.testing.assert_array_equal(labels, _old_decode_words(probs, meta)[0])
    assert LABELS["IOB2"][labels[0]] == "B-LOC" and LABELS["IOB2"][labels[1]] != "I-PER"


def test_stretches_that_touch_are_searched_as_one():
    """Greedy O B-PER I-LOC O B-PER I-PER I-LOC I-PER: the stretch of the first broken move ends at word 3, where the
    second's begins. Searched apart, the first turns word 2 into B-PER while the second was checked against the greedy
    I-LOC there and takes I-LOC after it (B-PER then I-LOC: invalid); searched as one, the labels are the whole
    text's Viterbi path."""
    meta = _meta("IOB2", "constrained")
    order = [meta["tags"].index(label) for label in LABELS["IOB2"]]   # O B-PER I-PER B-LOC I-LOC
    rows = np.array([[.677, .022, 0, .183, .119], [.253, .414, .021, .001, .312], [0, .394, .181, .007, .417],
                     [.388, 0, .233, .001, .378], [.023, .428, .003, .209, .336], [.248, .242, .26, .003, .247],
                     [.04, .026, .188, .033, .714], [0, .198, .466, .097, .239]], np.float32)
    probs = np.zeros((8, len(meta["label_of_tag"])), np.float32)
    probs[:, order] = rows
    labels, _ = portable.decode_batch(probs, [8], meta)
    transitions = np.array(meta["word_transitions"], np.float32)
    assert (transitions[labels[:-1], labels[1:]] == 0).all()
    np.testing.assert_array_equal(labels, _old_decode_words(probs, meta)[0])
    assert [LABELS["IOB2"][i] for i in labels] == ["O", "B-PER", "B-PER", "O", "B-PER", "I-PER", "I-PER", "I-PER"]


def test_span_means_are_numpys_means():
    rng = np.random.default_rng(2)
    probs = rng.random(2000).astype(np.float32)
    first = np.sort(rng.choice(1900, 300, replace=False))
    last = np.minimum(first + rng.integers(0, 40, 300), np.append(first[1:] - 1, 1999))
    expected = [np.mean(np.array([float(p) for p in probs[a:b + 1]], np.float32)) for a, b in zip(first, last)]
    assert portable.span_means(probs, first, last).tolist() == [float(e) for e in expected]


class _FakeRun:
    """A model whose outputs at a piece depend on that piece (and its word shape) and its place in its window alone,
    not on the batch. (The place breaks the exact ties of a word repeated: the Viterbi path of a text that has two is
    either of them, `WordDecoding._repair`.)"""

    def __init__(self, vocab_size, tags, case):
        rng = np.random.default_rng(3)
        self.table = _random_probs(rng, vocab_size * 8, tags).reshape(vocab_size, 8, tags)
        self.place = 1 + rng.uniform(-0.01, 0.01, (512, tags)).astype(np.float32)
        self.case = case

    def probs(self, ids, shapes, columns):
        return self.table[ids, shapes] * self.place[columns]

    def __call__(self, input_ids, attention_mask, case_ids=None):
        assert (case_ids is not None) == self.case
        shape = case_ids if case_ids is not None else np.zeros_like(input_ids)
        probs = self.probs(input_ids, shape, np.arange(input_ids.shape[1])) * attention_mask[..., None]
        return {"probs": probs, "tag_ids": probs.argmax(-1).astype(np.int32), "tag_probs": probs.max(-1)}


def _predictor(directory, meta, budget, case, monkeypatch):
    """A Predictor of an export folder whose model is `_FakeRun`."""
    meta = {**meta, "model": "model.onnx", "window": budget + 2 if budget else None, "case": case}
    (directory / "export.json").write_text(json.dumps(meta), encoding="utf-8")
    (directory / "model.onnx").write_bytes(b"fake")
    vocab_size = len(json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"])
    monkeypatch.setattr(portable, "_OnnxRunner", lambda path, threads: _FakeRun(vocab_size, len(meta["tags"]), case))
    return portable.Predictor(directory)


def _old_records(predictor, texts, decode_words):
    """Each text alone, as before: its pieces, the fake model on them piece by piece, `_old_entities`."""
    records = []
    for text, (ids, words) in zip(texts, predictor.pieces(texts)):
        shapes = portable.piece_shapes(text, words, len(ids)) if predictor.case else [0] * len(ids)
        position = np.arange(len(ids))
        columns = 1 + (position % predictor.budget if predictor.budget else position)   # after [CLS]
        probs = predictor.run.probs(np.array(ids, np.int64), np.array(shapes, np.int64), columns)
        tags, tag_probs = probs.argmax(-1), probs.max(-1)
        records.append({"text": text, "entities": _old_entities(predictor.meta, text, words, tags, tag_probs,
                                                                probs if decode_words else None)})
    return records


def _texts():
    rng = random.Random(4)
    words = ["the", "john", "Mary", "PARIS", "berlin", "in", "on", "xyz", "qqqq", "3-2", "1968", ",", ".",
             "McDonald", "É", "東京"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 20))) for _ in range(150)]
    return texts + ["", "   ", "\ufffd", "paris" * 30, "a b c d e f g h i j k l m n o p q r s t u v w x y z"]


@pytest.mark.parametrize("scheme,decode,budget,case", [("IOB2", "constrained", None, False),
                                                       ("BIOES", "constrained", 4, True),
                                                       ("IOB2", "argmax", 3, False),
                                                       ("IOB2", None, None, True)])
def test_batched_records_equal_per_text_records(tiny_tokenizer_dir, tmp_path, monkeypatch, scheme, decode, budget,
                                                  case):
    """Whole batches (of 1, 7 and all texts) give the records the per-text code gave; decode None: an export before
    decode_words (the tags read at the first pieces); budget: windows of that many pieces."""
    vocab = (tiny_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split()
    write_tokenizer(vocab, True, tmp_path / "tokenizer.json")
    meta = _meta(scheme, decode or "constrained")
    if decode is None:
        del meta["label_of_tag"]
    predictor, texts = _predictor(tmp_path, meta, budget, case, monkeypatch), _texts()
    expected = _old_records(predictor, texts, decode is not None)
    assert sum(len(r["entities"]) for r in expected) > 100
    for batch_size in (1, 7, len(texts)):
        assert predictor.predict(texts, batch_size=batch_size) == expected
    # windows(): what the per-text code built, text by text
    input_ids, attention_mask, pieces, case_ids = predictor.windows(texts)
    row = 0
    for text, (ids, words), (got_ids, got_words, first) in zip(texts, predictor.pieces(texts), pieces):
        assert got_ids.tolist() == ids and got_words == words and first == row
        step = budget or max(len(ids), 1)
        shapes = portable.piece_shapes(text, words, len(ids)) if case else None
        for start in range(0, max(len(ids), 1), step):
            window = [predictor.cls] + ids[start:start + step] + [predictor.sep]
            assert input_ids[row, :len(window)].tolist() == window and attention_mask[row].sum() == len(window)
            if case:
                assert case_ids[row, :len(window)].tolist() == [0] + shapes[start:start + step] + [0]
            row += 1
    assert row == len(input_ids) and (case_ids is not None) == case


def _tricky_texts(count, seed):
    """Texts of pieces a space split could get wrong: runs of spaces, tabs, newlines, no-break and ideographic spaces,
    combining accents after a space, CJK, control characters, the tokenizer's own special pieces, words past
    WordPiece's 100 characters, emoji, zero-width and line separators."""
    rng = random.Random(seed)
    alphabet = ["john", "Mary", "PARIS", "berlin", "McDonald", "É", "e\u0301", " \u0301", "  ", " ", " ", "\t", "\n",
                "\u00a0", "\u3000", "東", "京", ",", ".", "-", "'", "\x00", "\x07", "\ufffd", "[UNK]", "[CLS]",
                "x" * 120, "😀", "\u200b", "\u2028", "ﬁ", "ß", "\u0085", "qqqq", "1968"]
    return [""] + [" ", "  a  "] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
                                    for _ in range(count)]


def test_encode_by_chunks_between_spaces_is_the_tokenizers_encoding(tiny_tokenizer_dir, tmp_path):
    """`Tokenization.encode` encodes each chunk between spaces once (remembered) and shifts its offsets; the ids,
    offsets and counts are those of the tokenizer's own `encode_batch` on the whole texts, in batches of 1, 7 and
    all, across a memory cleared when full. A split at every whitespace (tabs, no-break spaces) or offsets shifted by
    a chunk's place among the chunks rather than in its text would differ."""
    vocab = (tiny_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split()
    write_tokenizer(vocab, True, tmp_path / "tokenizer.json")
    tokenization = portable.Tokenization(tmp_path, {})
    assert tokenization._chunks == {}
    texts = _tricky_texts(600, 5)
    pieces = 0
    for size in (1, 7, len(texts)):
        if size == len(texts):   # a full memory: cleared, then refilled
            tokenization._chunks = {f"unused {i}": (0, [], ()) for i in range((1 << 16) + 1)}
        for start in range(0, len(texts), size):
            batch = texts[start:start + size]
            counts, ids, offsets, shapes = tokenization.encode(batch)
            assert shapes is None   # not asked for (chunk_shapes)
            encodings = tokenization.tokenizer.encode_batch(batch, add_special_tokens=False)
            assert counts.tolist() == [len(e.ids) for e in encodings]
            assert ids.tolist() == [i for e in encodings for i in e.ids]
            assert offsets.tolist() == [list(o) for e in encodings for o in e.offsets]
            pieces += len(ids)
    assert pieces > 3 * 6000 and 100 < len(tokenization._chunks) < 1 << 16 and "unused 0" not in tokenization._chunks
    assert [len(a) for a in tokenization.encode([])[:3]] == [0, 0, 0]
    assert max(map(len, tokenization._chunks)) <= 64   # the 120-letter words are encoded, not remembered



def test_remembered_chunks_give_each_pieces_word_shape(tiny_tokenizer_dir, tmp_path):
    """With `chunk_shapes`, `encode` gives each piece the shape of its word in the whole text (`piece_shapes` of the
    tokenizer's own words), from the memory and from chunks seen for the first time."""
    vocab = (tiny_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split()
    write_tokenizer(vocab, True, tmp_path / "tokenizer.json")
    tokenization = portable.Tokenization(tmp_path, {})
    tokenization.chunk_shapes = True
    texts = _tricky_texts(300, 7) + ["McDonald's U.S. iPhone 3-2 ÉCOLE x"]
    for start in range(0, len(texts), 50):
        batch = texts[start:start + 50]
        _, _, _, shapes = tokenization.encode(batch)
        expected = []
        for text, e in zip(batch, tokenization.tokenizer.encode_batch(batch, add_special_tokens=False)):
            words = portable.word_spans(e.ids, e.offsets, tokenization.continuation)
            expected.extend(portable.piece_shapes(text, words, len(e.ids)))
        assert shapes.tolist() == expected
    assert len(set(shapes.tolist())) >= 4   # several shapes, not one

def test_a_tokenizer_whose_words_may_span_a_space_is_encoded_whole(tiny_tokenizer_dir, tmp_path):
    """A tokenizer.json whose pre-tokenizer keeps spaces in its pieces (SentencePiece's Metaspace) or whose added
    token holds a space is not split at spaces: `encode` is its `encode_batch` on the whole texts."""
    vocab = (tiny_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split()
    write_tokenizer(vocab, True, tmp_path / "tokenizer.json")
    tokenizer = portable.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert portable.splits_at_spaces(tokenizer)
    tokenizer.add_tokens([AddedToken("new york", normalized=False)])
    assert not portable.splits_at_spaces(tokenizer)
    tokenizer = portable.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    tokenization = portable.Tokenization(tmp_path, {})
    assert tokenization._chunks is None
    texts = _tricky_texts(50, 6)
    counts, ids, offsets, _ = tokenization.encode(texts)
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    assert ids.tolist() == [i for e in encodings for i in e.ids] and counts.sum() == len(ids) > 100
    assert offsets.tolist() == [list(o) for e in encodings for o in e.offsets]
