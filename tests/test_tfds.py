"""TFDS builders over our readers (issue 9 item 7): prepared from a manual_dir, read back with
tfds.load, equal to the plain readers' and load_splits' sentences in the same order (the builders
keep file order with disable_shuffling, so lists are compared, not multisets)."""
import itertools
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from xtremedistil_tf.data import tfds_builders as tb
from xtremedistil_tf.data.loading import DataConfig, load_splits
from xtremedistil_tf.data.readers import read_unlabeled
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError, DataFormatError

MSRA_FILES = {"train": tb.XdMsra.TRAIN, "test": tb.XdMsra.TEST}


def example_to_sentence(example: dict, labeled: bool = True) -> Sentence:
    """The inverse of tb.sentence_to_example, from a numpy example (bytes) of `tfds.as_numpy`."""
    tags = [t.decode("utf-8") for t in example["tags"]]
    lang = example["lang"].decode("utf-8")
    return Sentence([t.decode("utf-8") for t in example["tokens"]], tags if labeled else None, lang or None)


def load_sentences(name, split, manual_dir, data_dir, config=None, input_context=None, overwrite=False):
    """The sentences of `split` of our TFDS builder `name`, prepared from manual_dir on first use (tb.prepare).

    Read with `tfds.load`, in file order. `split` may be any TFDS split spec ("train[:10%]", one of
    `tfds.even_splits("train", n)`). `input_context` (a tf.distribute.InputContext) gives this
    worker its share of the TFRecord shards through tfds.ReadConfig (the split needs at least as
    many shards as input pipelines: prepare with num_shards).
    """
    builder = tb.prepare(name, manual_dir, data_dir, config, overwrite=overwrite)
    dataset = tfds.load(builder.name, split=split, data_dir=str(data_dir), shuffle_files=False,
                        builder_kwargs={"config": builder.builder_config},
                        read_config=tfds.ReadConfig(input_context=input_context),
                        download_and_prepare_kwargs={
                            "download_config": tfds.download.DownloadConfig(manual_dir=str(manual_dir))})
    return [example_to_sentence(example, builder.LABELED) for example in tfds.as_numpy(dataset)]


def _write_blocks(path: Path, blocks) -> None:
    """Sentences as blank-line-separated blocks of lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join("\n".join(lines) for lines in blocks) + "\n", encoding="utf-8")


def _bmes_blocks(n: int, seed: int):
    """n tiny char-level sentences: a place (B-NS M-NS E-NS), a person (S-NR) or O characters."""
    chars = itertools.cycle("我们在北京上海见到了他她你好天")
    blocks = []
    for i in range(n):
        lines = [f"{next(chars)} O" for _ in range(1 + (i * 7 + seed) % 4)]
        if i % 3 == 0:
            lines += [f"{next(chars)} {tag}" for tag in ("B-NS", "M-NS", "E-NS")]
        if i % 2 == 0:
            lines.append(f"{next(chars)} S-NR")
        blocks.append(lines)
    return blocks


def _msra_reference(manual_dir: Path):
    return load_splits(DataConfig(format="char_bmes", data_dir=str(manual_dir), train_file=MSRA_FILES["train"],
                                  test_file=MSRA_FILES["test"], scheme="BMES"))


def _assert_msra_equal(manual_dir: Path, data_dir: Path) -> None:
    reference = _msra_reference(manual_dir)
    for split in ("train", "dev", "test"):
        assert reference[split], split
        assert load_sentences("xd_msra", split, manual_dir, data_dir) == reference[split], split


def test_msra_synthetic_equals_load_splits(tmp_path):
    manual = tmp_path / "manual"
    _write_blocks(manual / MSRA_FILES["train"], _bmes_blocks(30, 0))
    _write_blocks(manual / MSRA_FILES["test"], _bmes_blocks(10, 1))
    _assert_msra_equal(manual, tmp_path / "tfds")
    # The registered name works with tfds.load itself (the data is prepared: nothing is regenerated).
    dataset = tfds.load("xd_msra", split="test", data_dir=str(tmp_path / "tfds"),
                        download_and_prepare_kwargs={
                            "download_config": tfds.download.DownloadConfig(manual_dir=str(manual))})
    assert [example_to_sentence(e) for e in tfds.as_numpy(dataset)] == _msra_reference(manual)["test"]
    assert sorted(p.name for p in (tmp_path / "tfds" / "xd_msra" / "dev0.1_seed0" / "1.0.0").glob("*.tfrecord*")) == [
        "xd_msra-dev.tfrecord-00000-of-00001", "xd_msra-test.tfrecord-00000-of-00001",
        "xd_msra-train.tfrecord-00000-of-00001"]


def _first_sentences(source: Path, target: Path, n: int) -> None:
    blocks, current = [], []
    with open(source, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                current.append(line.rstrip("\n"))
            elif current:
                blocks.append(current)
                current = []
                if len(blocks) == n:
                    break
    _write_blocks(target, blocks + ([current] if current and len(blocks) < n else []))


def test_msra_shared_sample_equals_load_splits(tmp_path, shared_data):
    manual = tmp_path / "manual"
    for name in MSRA_FILES.values():
        _first_sentences(shared_data / "msra" / name, manual / name, 200)
    _assert_msra_equal(manual, tmp_path / "tfds")


def test_msra_other_holdout_config(tmp_path):
    manual = tmp_path / "manual"
    _write_blocks(manual / MSRA_FILES["train"], _bmes_blocks(30, 0))
    _write_blocks(manual / MSRA_FILES["test"], _bmes_blocks(5, 1))
    reference = load_splits(DataConfig(format="char_bmes", data_dir=str(manual), train_file=MSRA_FILES["train"],
                                       scheme="BMES", dev_fraction=0.2, seed=3))
    assert load_sentences("xd_msra/dev0.2_seed3", "dev", manual, tmp_path / "tfds") == reference["dev"]
    assert load_sentences("xd_msra", "dev", manual, tmp_path / "tfds",
                             config=tb.msra_config(0.2, 3)) == reference["dev"]


def test_prepare_twice_reuses_shards_and_refuses_changed_files(tmp_path, monkeypatch):
    manual, data_dir = tmp_path / "manual", tmp_path / "tfds"
    _write_blocks(manual / MSRA_FILES["train"], _bmes_blocks(30, 0))
    _write_blocks(manual / MSRA_FILES["test"], _bmes_blocks(10, 1))
    calls = []
    real_reader = tb.read_char_bmes
    monkeypatch.setattr(tb, "read_char_bmes",
                        lambda path, **kw: calls.append(Path(path).name) or real_reader(path, **kw))

    builder = tb.prepare("xd_msra", manual, data_dir)
    assert sorted(calls) == sorted(MSRA_FILES.values())  # train read once for both train and dev
    shards = {p: p.stat().st_mtime_ns for p in Path(builder.data_dir).glob("*.tfrecord*")}
    assert len(shards) == 3
    tb.prepare("xd_msra", manual, data_dir)
    load_sentences("xd_msra", "train", manual, data_dir)
    assert len(calls) == 2, "preparing again must reuse the shards"
    assert {p: p.stat().st_mtime_ns for p in Path(builder.data_dir).glob("*.tfrecord*")} == shards

    _write_blocks(manual / MSRA_FILES["test"], _bmes_blocks(4, 2))  # the user's files change
    with pytest.raises(ConfigError, match="prepared from other files"):
        tb.prepare("xd_msra", manual, data_dir)
    assert load_sentences("xd_msra", "test", manual, data_dir, overwrite=True) == _msra_reference(manual)["test"]
    assert len(calls) == 4


def _wikiann_dir(root: Path) -> Path:
    words = {"en": ["Paris", "is", "in", "France", "John", "lives"], "de": ["Berlin", "ist", "in", "Deutschland"]}
    for lang, vocab in words.items():
        for s, split in enumerate(("train", "dev", "test")):
            blocks = []
            for i in range(4 + s):
                tokens = vocab[i % len(vocab):] + vocab[:i % len(vocab)]
                tags = ["B-LOC" if t[0].isupper() and t not in ("John",) else ("B-PER" if t == "John" else "O")
                        for t in tokens]
                blocks.append([f"{lang}:{t}\t{g}" for t, g in zip(tokens, tags)])
            _write_blocks(root / lang / split, blocks)
    return root


def test_wikiann_rahimi_equals_load_splits(tmp_path):
    manual = _wikiann_dir(tmp_path / "manual")
    reference = load_splits(DataConfig(format="wikiann", data_dir=str(manual), langs=["en", "de"]))
    for split in ("train", "dev", "test"):
        assert load_sentences("xd_wikiann_rahimi/en+de", split, manual, tmp_path / "tfds") == reference[split]
    assert {s.lang for s in reference["train"]} == {"en", "de"}
    english = load_splits(DataConfig(format="wikiann", data_dir=str(manual), langs=["en"]))
    assert load_sentences("xd_wikiann_rahimi", "test", manual, tmp_path / "tfds",
                             config=tb.wikiann_config(["en"])) == english["test"]
    dataset = tfds.load("xd_wikiann_rahimi/en", split="dev", data_dir=str(tmp_path / "tfds"))  # config from its name
    assert [example_to_sentence(e) for e in tfds.as_numpy(dataset)] == english["dev"]
    assert sorted(p.name for p in (tmp_path / "tfds" / "xd_wikiann_rahimi").iterdir() if not p.name.startswith(".")) \
        == ["en", "en+de"]


def _conll_dir(root: Path, with_dev: bool) -> Path:
    rows = [("EU", "B-ORG"), ("rejects", "O"), ("German", "B-MISC"), ("call", "O"), ("Peter", "B-PER"),
            ("Blackburn", "I-PER")]
    blocks = [[f"{t} NNP {g}" for t, g in rows[i % 3:] + rows[:i % 3]] for i in range(20)]
    _write_blocks(root / "train", [["-DOCSTART- -X- O"]] + blocks)
    _write_blocks(root / "test", blocks[:5])
    if with_dev:
        _write_blocks(root / "dev", blocks[5:9])
    return root


@pytest.mark.parametrize("with_dev", [False, True])
def test_conll_equals_load_splits(tmp_path, with_dev):
    manual = _conll_dir(tmp_path / "manual", with_dev)
    reference = load_splits(DataConfig(format="conll", data_dir=str(manual), train_file="train",
                                       dev_file="dev" if with_dev else "", test_file="test"))
    for split in ("train", "dev", "test"):
        assert reference[split]
        assert load_sentences("xd_conll", split, manual, tmp_path / "tfds") == reference[split], split


def test_transfer_text_words_and_chars(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "transfer.txt").write_text("the cat sat\n\n我们 在北京\n  spaced   words  \n", encoding="utf-8")
    for config, char_level in (("words", False), ("chars", True)):
        sentences = load_sentences(f"xd_transfer_text/{config}", "train", manual, tmp_path / "tfds")
        assert sentences == read_unlabeled(manual / "transfer.txt", char_level=char_level)
        assert all(s.tags is None and s.lang is None for s in sentences)
    assert [len(s) for s in load_sentences("xd_transfer_text", "train", manual, tmp_path / "tfds")] == [3, 2, 2]


def test_sharding_across_workers(tmp_path):
    manual = _conll_dir(tmp_path / "manual", with_dev=True)
    full = load_splits(DataConfig(format="conll", data_dir=str(manual), dev_file="dev", test_file="test"))["train"]
    # tfds.even_splits: contiguous parts of a split, in order, whatever the shard count.
    parts = [load_sentences("xd_conll", part, manual, tmp_path / "tfds") for part in tfds.even_splits("train", n=2)]
    assert all(parts) and parts[0] + parts[1] == full
    # ReadConfig(input_context=...): one TFRecord shard per input pipeline (needs as many shards as pipelines).
    tb.prepare("xd_conll", manual, tmp_path / "tfds2", num_shards=2)
    shares = [load_sentences("xd_conll", "train", manual, tmp_path / "tfds2",
                                input_context=tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i))
              for i in range(2)]
    assert all(shares) and sorted(shares[0] + shares[1], key=repr) == sorted(full, key=repr)  # a multiset: shard order


def test_errors(tmp_path):
    manual = _wikiann_dir(tmp_path / "manual")
    with pytest.raises(ConfigError, match="unknown TFDS builder 'wikiann'"):
        tb.prepare("wikiann", manual, tmp_path / "tfds")
    with pytest.raises(ConfigError, match="needs languages"):
        tb.prepare("xd_wikiann_rahimi", manual, tmp_path / "tfds")
    with pytest.raises(ConfigError, match="dev<fraction>_seed<seed>"):
        tb.prepare("xd_msra/whatever", manual, tmp_path / "tfds")
    with pytest.raises(ConfigError, match="not a directory"):
        tb.prepare("xd_msra", tmp_path / "missing", tmp_path / "tfds")
    with pytest.raises(DataFormatError, match="fr/train: file does not exist"):  # a missing language folder
        tb.prepare("xd_wikiann_rahimi/fr", manual, tmp_path / "tfds")
