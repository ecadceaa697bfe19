"""Issue 29: one word split from data to serving (data/wordsplit.py), tags carried onto the parts."""
import json

import pytest
from conftest import REPO
from helpers import divided_tokens
from transformers import BertTokenizerFast

from xtremedistil_tf.data.loading import DataConfig, load_splits, read_jsonl, write_jsonl
from xtremedistil_tf.data.readers import read_char_bmes
from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.scoring import char_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import continue_tags, resplit, split_words, word_offsets
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.run.workdir import WorkDir

TOKENS = ["Mr", "O'Brien", "of", "St.John's", "U.S.", "Navy", "said", "''", "hi", "''"]
# The expected words of TOKENS: O'Brien -> 3, St.John's -> 5 (a token divided into more than three parts inside a
# two-token entity), U.S. -> 4, '' -> 2.
WORDS = ["Mr", "O", "'", "Brien", "of", "St", ".", "John", "'", "s", "U", ".", "S", ".", "Navy", "said", "'", "'",
         "hi", "'", "'"]

# Per scheme: the data's tags of TOKENS ("Mr O'Brien" PER, "St.John's" LOC, "U.S. Navy" ORG), and the expected tags
# of WORDS, written out by hand.
CASES = {
    "IOB2": (["B-PER", "I-PER", "O", "B-LOC", "B-ORG", "I-ORG", "O", "O", "O", "O"],
             ["B-PER", "I-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC", "I-LOC",
              "B-ORG", "I-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "O", "O", "O", "O", "O"]),
    "IOB1": (["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "O", "O", "O", "O"],
             # "U.S. Navy" is a LOC right after the LOC "St.John's": its first part keeps B-.
             ["I-PER", "I-PER", "I-PER", "I-PER", "O", "I-LOC", "I-LOC", "I-LOC", "I-LOC", "I-LOC",
              "B-LOC", "I-LOC", "I-LOC", "I-LOC", "I-LOC", "O", "O", "O", "O", "O", "O"]),
    "BIOES": (["B-PER", "E-PER", "O", "S-LOC", "B-ORG", "E-ORG", "O", "O", "O", "O"],
              ["B-PER", "I-PER", "I-PER", "E-PER", "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC", "E-LOC",
               "B-ORG", "I-ORG", "I-ORG", "I-ORG", "E-ORG", "O", "O", "O", "O", "O", "O"]),
    "BMES": (["B-PER", "E-PER", "O", "S-LOC", "B-ORG", "E-ORG", "O", "O", "O", "O"],
             ["B-PER", "M-PER", "M-PER", "E-PER", "O", "B-LOC", "M-LOC", "M-LOC", "M-LOC", "E-LOC",
              "B-ORG", "M-ORG", "M-ORG", "M-ORG", "E-ORG", "O", "O", "O", "O", "O", "O"]),
}


@pytest.mark.parametrize("scheme", sorted(CASES))
def test_resplit_carries_each_entity_onto_the_parts(scheme):
    tags, expected = CASES[scheme]
    sentence = Sentence(TOKENS, tags, lang="en")
    [split] = resplit([sentence], scheme)
    assert list(split.tokens) == WORDS
    assert list(split.tags) == expected
    assert split.text == " ".join(TOKENS) and split.lang == "en"
    # The same entities, as character spans of the raw text, before and after.
    assert char_spans(split, split.tags, scheme) == char_spans(sentence, tags, scheme)
    assert len(tags_to_spans(split.tags, scheme)) == 3


def test_continue_tags_in_the_middle_of_an_entity():
    """A three-part token inside, at the end of and alone as an entity, for the schemes with an end tag."""
    assert continue_tags("I-X", 3, "BIOES") == ["I-X", "I-X", "I-X"]
    assert continue_tags("E-X", 3, "BIOES") == ["I-X", "I-X", "E-X"]
    assert continue_tags("S-X", 3, "BMES") == ["B-X", "M-X", "E-X"]
    assert continue_tags("M-X", 3, "BMES") == ["M-X", "M-X", "M-X"]
    assert continue_tags("S-X", 2, "BIOES") == ["B-X", "E-X"]
    assert continue_tags("I-X", 3, "IOB2") == ["I-X", "I-X", "I-X"]
    assert continue_tags("O", 3, "BMES") == ["O", "O", "O"]


def test_split_is_the_training_tokenizers(tiny_tokenizer_dir):
    """The words are those BertTokenizerFast makes of the text (its word ids), vanishing characters dropped."""
    tokenizer = BertTokenizerFast.from_pretrained(str(tiny_tokenizer_dir), do_lower_case=False)
    for text in ["O'Brien (U.S.) St.John's", "中国人民 1998年 ok", "a\u200bb c\ufffd \u200b", "wait… Ｐaris!?"]:
        encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        words = {}
        for word, (start, end) in zip(encoding.word_ids, encoding.offsets):
            first, last = words.get(word, (start, end))
            words[word] = (min(first, start), max(last, end))
        assert split_words([text])[0] == list(words.values()), text


def test_unchanged_sentences_stay_as_they_are():
    """Character-level (MSRA) and already-split sentences come back as the same objects, without a text."""
    chars = Sentence(list("中国人民1998年"), ["B-NS", "E-NS", "O", "O", "O", "O", "O", "O", "O"])
    plain = Sentence(["John", "lives", "in", "Paris", "."], ["B-PER", "O", "O", "B-LOC", "O"])
    assert resplit([chars, plain], "BMES") == [chars, plain]
    assert chars.text is None and chars.raw_text == "中 国 人 民 1 9 9 8 年"
    assert divided_tokens([chars, plain, Sentence(TOKENS)]) == (5, 24)


def test_a_vanishing_token_goes_with_its_tag():
    sentence = Sentence(["A", "\u200b", "B."], ["B-ORG", "I-ORG", "I-ORG"])
    [split] = resplit([sentence])
    assert list(split.tokens) == ["A", "B", "."] and list(split.tags) == ["B-ORG", "I-ORG", "I-ORG"]
    assert word_offsets(split) == [(0, 1), (4, 5), (5, 6)]
    assert char_spans(split, split.tags) == {(0, 6, "ORG")}
    # Where the vanished token began or ended an entity, the rest is a valid sequence of the same entity.
    [split] = resplit([Sentence(["\u200b", "John", "Smith"], ["B-PER", "I-PER", "I-PER"])])
    assert list(split.tags) == ["B-PER", "I-PER"]
    [split] = resplit([Sentence(["John", "Smith", "\u200b", "."], ["B-PER", "I-PER", "E-PER", "O"])], "BIOES")
    assert list(split.tags) == ["B-PER", "E-PER", "O"]


def test_data_step_splits_every_split_and_keeps_the_text(tmp_path):
    """load_splits re-splits train, dev, test and the unlabeled transfer text; the snapshot keeps each text."""
    lines = ["Mr B-PER", "O'Brien I-PER", "visited O", "U.S. B-LOC", "", "Kim B-PER", "left O", ""]
    for name in ("train", "dev", "test"):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "transfer").write_text("Dr. Smith's car\n", encoding="utf-8")
    cfg = DataConfig(data_dir=str(tmp_path), dev_file="dev", test_file="test", transfer_file="transfer")
    splits = load_splits(cfg)
    for name in ("train", "dev", "test"):
        first = splits[name][0]
        assert list(first.tokens) == ["Mr", "O", "'", "Brien", "visited", "U", ".", "S", "."]
        assert list(first.tags) == ["B-PER", "I-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC"]
        assert first.text == "Mr O'Brien visited U.S." and splits[name][1].text is None
    assert list(splits["transfer"][0].tokens) == ["Dr", ".", "Smith", "'", "s", "car"]
    write_jsonl(splits["test"], tmp_path / "test.jsonl")
    assert read_jsonl(tmp_path / "test.jsonl") == splits["test"]
    assert "text" not in json.loads((tmp_path / "test.jsonl").read_text(encoding="utf-8").splitlines()[1])
    # --word_split=none: the data's own tokens, and the fingerprint of work dirs made before the flag.
    none = DataConfig(data_dir=str(tmp_path), dev_file="dev", test_file="test", word_split="none")
    assert list(load_splits(none)["test"][0].tokens) == ["Mr", "O'Brien", "visited", "U.S."]
    assert "word_split" not in none.to_dict() and cfg.to_dict()["word_split"] == "bert"
    assert "word_split" not in DataConfig(format="label_tsv").to_dict()   # classification is never split


def test_msra_is_not_changed_by_the_split():
    """MSRA (one character a token): the split divides no token of its test file."""
    path = REPO.parent / "shared" / "data" / "msra" / "test.char.bmes"
    if not path.exists():
        pytest.skip(f"{path} not present (real data lives outside the project)")

    sentences = read_char_bmes(path)
    assert divided_tokens(sentences)[0] == 0
    assert resplit(sentences, "BMES") == sentences


def test_a_work_dir_made_before_the_split_is_refused_with_the_flag_that_reads_it(tmp_path):
    """A data step made before --word_split (its fingerprint lacks the key) is refused by the default split, naming
    --word_split=none, and reused by it."""
    old = DataConfig(data_dir="d", word_split="none").to_dict()
    work = WorkDir(tmp_path)
    work.run_step("data", {"data": old}, lambda tmp: None)
    assert work.is_done("data", {"data": DataConfig(data_dir="d", word_split="none").to_dict()})
    with pytest.raises(ConfigError, match=r"data\.word_split: None in the work dir, 'bert' now.*"
                                          r"--word_split=none keeps the data's own tokens"):
        work.is_done("data", {"data": DataConfig(data_dir="d").to_dict()})
