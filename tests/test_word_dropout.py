"""--student_word_dropout (DistilConfig.word_dropout, methods/student_run.WordDropout): whole words of the training
batches become the unknown piece, seeded by the epoch and the batch's place, specials and padding never; 0 leaves
the fingerprint as it was."""
import numpy as np
import pytest
import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import WordDropout
from xtremedistil_tf.run.pipeline import student_fingerprint
from xtremedistil_tf.run.validation import check_ranges


def _batches(tokenizer, rows=400, batches=3, seed=0):
    """Windows of 3-9 random words of the tiny vocab (short words one piece, long ones several), padded to 16."""
    rng = np.random.default_rng(seed)
    words = ["the", "paris", "berlin", "xylophone", "mary", "quartz", "of", "jump", "42"]
    out = []
    for _ in range(batches):
        ids = np.full((rows, 16), tokenizer.pad_token_id, np.int32)
        for row in ids:
            pieces = tokenizer(" ".join(rng.choice(words, rng.integers(3, 10))), add_special_tokens=True,
                               truncation=True, max_length=16)["input_ids"]
            row[:len(pieces)] = pieces
        out.append({"input_ids": ids, "attention_mask": (ids != tokenizer.pad_token_id).astype(np.int32),
                    "label_ids": np.arange(16, dtype=np.int32)[None].repeat(rows, 0)})
    return out


def _apply(dropout, batches, seed):
    ds = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature={
        k: tf.TensorSpec([None, 16], tf.int32) for k in batches[0]})
    return [{k: v.numpy() for k, v in b.items()} for b in dropout.apply(ds, seed)]


def _words(tokenizer, ids):
    """Per row, lists of piece positions, one list a word (a piece not starting "##" and the "##" after it)."""
    rows = []
    for row in ids:
        words = []
        for position, piece in enumerate(tokenizer.convert_ids_to_tokens(row.tolist())):
            if piece in tokenizer.all_special_tokens:
                continue
            if piece.startswith("##"):
                words[-1].append(position)
            else:
                words.append([position])
        rows.append(words)
    return rows


def test_whole_words_are_dropped_at_the_rate_seeded_by_epoch_and_batch(tiny_tokenizer):
    batches = _batches(tiny_tokenizer)
    dropout = WordDropout(tiny_tokenizer, 0.3)
    first, again, other = _apply(dropout, batches, 7), _apply(dropout, batches, 7), _apply(dropout, batches, 8)
    unk = tiny_tokenizer.unk_token_id
    dropped_words = all_words = split_words = 0
    for before, after in zip(batches, first):
        np.testing.assert_array_equal(after["label_ids"], before["label_ids"])   # the targets stay
        np.testing.assert_array_equal(after["attention_mask"], before["attention_mask"])
        changed = after["input_ids"] != before["input_ids"]
        assert (after["input_ids"][changed] == unk).all()
        special = np.isin(before["input_ids"], tiny_tokenizer.all_special_ids)
        assert not (changed & special).any()   # [CLS], [SEP], [PAD] never
        for row, words in zip(changed, _words(tiny_tokenizer, before["input_ids"])):
            for positions in words:
                assert row[positions].all() or not row[positions].any(), positions   # a word goes whole
                dropped_words += bool(row[positions[0]])
                all_words += 1
                split_words += len(positions) > 1
    assert all_words > 5000 and split_words > 1000
    assert abs(dropped_words / all_words - 0.3) < 0.02
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert any((a["input_ids"] != b["input_ids"]).any() for a, b in zip(first, other))
    # the same windows in another batch of the epoch get other draws
    same = _apply(dropout, [batches[0], batches[0]], 7)
    assert (same[0]["input_ids"] != same[1]["input_ids"]).any()
    everything = _apply(WordDropout(tiny_tokenizer, 1.0), batches[:1], 0)[0]["input_ids"]
    real = (batches[0]["attention_mask"] > 0) & ~np.isin(batches[0]["input_ids"], tiny_tokenizer.all_special_ids)
    assert (everything[real] == unk).all() and (everything[~real] == batches[0]["input_ids"][~real]).all()


def test_off_leaves_the_fingerprint_as_before_and_the_flag_is_a_fraction():
    assert "word_dropout" not in student_fingerprint(DistilConfig())
    assert student_fingerprint(DistilConfig(word_dropout=0.1))["word_dropout"] == 0.1

    class Flags:
        seed, langs, data_format = 0, [], "conll"
        student_word_dropout = 1.0

    with pytest.raises(ConfigError, match=r"--student_word_dropout=1.0; expected a fraction in \[0, 1\)"):
        check_ranges(Flags)
