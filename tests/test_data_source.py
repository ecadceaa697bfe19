"""--data_source=tfds:<name>/<config> (issue 9 item 7): the labeled splits from a TFDS builder.

What runs here (no internet): the whole path -- tfds.builder, download_and_prepare, as_dataset,
the feature conversion -- on our own xd_conll builder prepared from a manual_dir, compared with
the plain reader; TFDS's real `wikiann/en` and `conll2003` builders (their features, ClassLabel
tag names and split names) through tfds.testing.mock_data, which replaces their download and
data with generated examples; and the one-line errors. Not run: a real download of wikiann or
conll2003 (it needs internet; here it fails after TFDS's retries with the one-line error).
"""
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from xtremedistil_tf.data.loading import DataConfig, load_splits
from xtremedistil_tf.data.readers import read_conll
from xtremedistil_tf.data.tfds_builders import load_tfds_splits
from xtremedistil_tf.errors import ConfigError

CONLL = {"train": "John B-PER\nlives O\nin O\nParis B-LOC\n\nMary B-PER\nsleeps O\n\nBerlin B-LOC\nsleeps O\n",
         "dev": "Mary B-PER\nin O\nBerlin B-LOC\n",
         "test": "John B-PER\nsleeps O\n"}
WIKIANN_TAGS = {"O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"}


def test_xd_conll_through_the_data_source_equals_the_reader(tmp_path, monkeypatch):
    manual = tmp_path / "manual"
    manual.mkdir()
    for split, text in CONLL.items():
        (manual / split).write_text(text, encoding="utf-8")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    splits = load_splits(DataConfig(source="tfds:xd_conll", data_dir=str(manual)))
    for split in CONLL:
        expected = read_conll(manual / split)
        assert [(s.tokens, s.tags) for s in splits[split]] == [(s.tokens, s.tags) for s in expected]
    assert splits["transfer"] == []
    # The source is part of the data step's fingerprint only when set (old work dirs keep theirs).
    assert "source" not in DataConfig().to_dict() and DataConfig(source="tfds:x").to_dict()["source"] == "tfds:x"


def mock_examples(builder, split, **kwargs):
    """Sentences of the builder's own features (Sequence(Text) and Sequence(ClassLabel) alike),
    every sequence as long as `tokens`: tag i of sentence n is class (n + i) % classes, token i is
    "w<n>_<i>" (mock_data's own generator draws each sequence's length independently)."""
    features = builder.info.features
    rows = {"train": 3, "validation": 2, "dev": 2, "test": 1}[split]

    def column(key, n, length):
        names = getattr(features[key].feature, "names", None)
        if names:
            return tf.constant([(n + i) % len(names) for i in range(length)], tf.int64)
        return tf.constant([f"w{n}_{i}" for i in range(length)])

    examples = [{key: column(key, n, n + 2) for key in features} for n in range(rows)]
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature={
        key: tf.TensorSpec([None], value.dtype) for key, value in examples[0].items()})


@pytest.mark.parametrize("source,tag_key", [("tfds:wikiann/en", "tags"), ("tfds:conll2003", "ner")])
def test_tfds_own_builders_features_and_splits(tmp_path, source, tag_key):
    builder = tfds.builder(source[len("tfds:"):], data_dir=str(tmp_path))
    names = builder.info.features[tag_key].feature.names
    if tag_key == "tags":
        assert set(names) == WIKIANN_TAGS
    with tfds.testing.mock_data(as_dataset_fn=mock_examples, data_dir=str(tmp_path)):
        splits = load_tfds_splits(source, data_dir=tmp_path)
    # dev is the builder's validation/dev split: 2 sentences.
    assert {k: len(v) for k, v in splits.items()} == {"train": 3, "dev": 2, "test": 1}
    for n, sentence in enumerate(splits["train"]):
        assert list(sentence.tokens) == [f"w{n}_{i}" for i in range(n + 2)]
        assert list(sentence.tags) == [names[(n + i) % len(names)] for i in range(n + 2)]


def test_a_dataset_that_cannot_be_had_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"TFDS cannot build 'no_such_set/en'") as unknown:
        load_tfds_splits("tfds:no_such_set/en", data_dir=tmp_path)
    with pytest.raises(ConfigError, match="expected tfds:<dataset>"):
        load_tfds_splits("wikiann/en")

    def offline(self, *args, **kwargs):
        raise ConnectionError("Failed to resolve 'www.dropbox.com'\n[Errno -2] Name or service not known")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    with pytest.raises(ConfigError, match="could not be downloaded or prepared .*dropbox") as no_network:
        load_tfds_splits("tfds:wikiann/en", data_dir=tmp_path)
    for error in (unknown.value, no_network.value):
        assert "\n" not in str(error)
