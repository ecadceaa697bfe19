"""--data_format=hf and --data_format=spans_jsonl (issue 52, item 1): WikiAnn en written as a Hugging Face dataset
(save_to_disk, parquet, JSON lines) and as annotation-tool JSON lines of text and character spans reads as the
wikiann reader reads it, and a tiny run through each gives the same windows and the same student F1 (slow).

Malformed files of both formats are in tests/bad_inputs (test_bad_inputs.py); a byte-order mark, CRLF endings and
no final newline are read as the plain file is (test_bad_inputs.py GOOD)."""
import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA, _require
from test_pipeline import toy_config

from xtremedistil_tf.data import tfds_builders as tb
from xtremedistil_tf.data.loading import DataConfig, check_data_config, load_splits
from xtremedistil_tf.data.readers import read_dataset, read_hf, read_spans_jsonl, read_wikiann
from xtremedistil_tf.data.schemes import entity_types, label_set, tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.wordsplit import apply_word_split
from xtremedistil_tf.errors import ConfigError, DataFormatError
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.transfer.cache import read_sharded

datasets = pytest.importorskip("datasets", reason="datasets is not installed (requirements.txt pins it: the hf extra)")

SIZES = {"train": 200, "dev": 50, "test": 50}
HF_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def wikiann_slice(shared_data, root: Path) -> dict:
    """The first SIZES sentences of WikiAnn en's splits, written as root/en/<split>; {split: sentences}."""
    (root / "en").mkdir(parents=True, exist_ok=True)
    for split, count in SIZES.items():
        blocks = (shared_data / "wikiann" / "en" / split).read_text(encoding="utf-8").split("\n\n")[:count]
        (root / "en" / split).write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return {split: read_wikiann(root / "en" / split) for split in SIZES}


def hf_dataset(sentences, names) -> datasets.Dataset:
    """Sentences as Hugging Face's wikiann has them: tokens, ner_tags (ClassLabel ids), langs."""
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
                                  "langs": datasets.Sequence(datasets.Value("string"))})
    return datasets.Dataset.from_dict({"tokens": [list(s.tokens) for s in sentences],
                                       "ner_tags": [[names.index(t) for t in s.tags] for s in sentences],
                                       "langs": [[s.lang] * len(s) for s in sentences]}, features=features)


def spans_record(sentence: Sentence, index: int) -> dict:
    """The sentence as its tokens joined by spaces with character spans, in the variant `index` picks: spaCy's
    entities, Prodigy's spans (objects) or doccano's label."""
    starts, position = [], 0
    for token in sentence.tokens:
        starts.append(position)
        position += len(token) + 1
    spans = [(starts[a], starts[b - 1] + len(sentence.tokens[b - 1]), etype)
             for etype, a, b in tags_to_spans(sentence.tags, "IOB2")]
    variant = index % 3
    if variant == 1:
        return {"text": " ".join(sentence.tokens), "spans": [{"start": a, "end": b, "label": t} for a, b, t in spans],
                "answer": "accept", "lang": sentence.lang}
    return {"text": " ".join(sentence.tokens), ("entities", "", "label")[variant]: [list(s) for s in spans],
            "lang": sentence.lang}


def write_formats(splits: dict, root: Path) -> None:
    """root/hf (a DatasetDict saved to disk), root/parquet/<split>.parquet, root/jsonl/<split>.jsonl (tag strings)
    and root/spans/<split>.jsonl."""
    names = label_set(entity_types({t for s in splits["train"] for t in s.tags}), "IOB2")
    datasets.DatasetDict({HF_SPLITS[split]: hf_dataset(sentences, names)
                          for split, sentences in splits.items()}).save_to_disk(str(root / "hf"))
    for folder in ("parquet", "jsonl", "spans"):
        (root / folder).mkdir(exist_ok=True)
    for split, sentences in splits.items():
        hf_dataset(sentences, names).to_parquet(str(root / "parquet" / f"{split}.parquet"))
        (root / "jsonl" / f"{split}.jsonl").write_text("".join(
            json.dumps({"tokens": list(s.tokens), "ner_tags": list(s.tags), "lang": s.lang}) + "\n"
            for s in sentences), encoding="utf-8")
        (root / "spans" / f"{split}.jsonl").write_text("".join(
            json.dumps(spans_record(s, i), ensure_ascii=False) + "\n" for i, s in enumerate(sentences)),
            encoding="utf-8")


@pytest.fixture(scope="module")
def wikiann_formats(tmp_path_factory):
    _require(SHARED_DATA / "wikiann" / "en")   # real data lives outside the project: skipped without it
    root = tmp_path_factory.mktemp("wikiann_formats")
    splits = wikiann_slice(SHARED_DATA, root / "wikiann")
    write_formats(splits, root)
    return root, splits


def test_wikiann_reads_the_same_through_hf_and_spans_jsonl(wikiann_formats):
    root, splits = wikiann_formats
    for split, sentences in splits.items():
        assert len(sentences) == SIZES[split] and sentences[0].lang == "en"
        assert read_hf(root / "hf" / HF_SPLITS[split]) == sentences
        assert read_hf(root / "hf", split=split) == sentences   # the DatasetDict folder, the split by name
        assert read_hf(root / "parquet" / f"{split}.parquet") == sentences
        assert read_hf(root / "jsonl" / f"{split}.jsonl") == sentences
        # spans_jsonl's words are the served split of the text: the wikiann sentences re-split as load_splits does
        served = apply_word_split(sentences, "bert", "IOB2")
        assert read_spans_jsonl(root / "spans" / f"{split}.jsonl") == served
        assert served != sentences   # the slice has tokens the split divides (O'Brien, U.S.)


def test_load_splits_gives_the_same_splits_through_every_format(wikiann_formats):
    root, _ = wikiann_formats
    wikiann = load_splits(DataConfig(format="wikiann", data_dir=str(root / "wikiann"), langs=["en"]))
    configs = [DataConfig(format="hf", data_dir=str(root / "hf"), train_file="train", dev_file="validation",
                          test_file="test"),
               DataConfig(format="hf", data_dir=str(root / "parquet"), train_file="train.parquet",
                          dev_file="dev.parquet", test_file="test.parquet"),
               DataConfig(format="spans_jsonl", data_dir=str(root / "spans"), train_file="train.jsonl",
                          dev_file="dev.jsonl", test_file="test.jsonl")]
    for cfg in configs:
        assert load_splits(cfg) == wikiann, cfg.format


def test_tfds_builders_of_both_formats_give_the_readers_sentences(wikiann_formats, tmp_path):
    root, splits = wikiann_formats
    hf = tb.load_tfds_splits("tfds:xd_hf", data_dir=tmp_path / "tfds", manual_dir=root / "hf")
    spans = tb.load_tfds_splits("tfds:xd_spans_jsonl", data_dir=tmp_path / "tfds", manual_dir=root / "spans")
    for split, sentences in splits.items():
        assert hf[split] == sentences
        # TFDS keeps tokens, tags and language (a Sentence's raw text is not a feature)
        assert spans[split] == [Sentence(s.tokens, s.tags, s.lang) for s in apply_word_split(sentences, "bert")]

def test_tags_of_another_scheme_are_detected_and_converted(tmp_path):
    path = tmp_path / "bioes.jsonl"
    path.write_text(json.dumps({"tokens": ["New", "York", "and", "Paris"], "ner_tags": ["B-LOC", "E-LOC", "O", "S-LOC"]})
                    + "\n", encoding="utf-8")
    assert read_hf(path) == [Sentence(("New", "York", "and", "Paris"), ("B-LOC", "I-LOC", "O", "B-LOC"))]
    assert read_hf(path, scheme="BIOES")[0].tags == ("B-LOC", "E-LOC", "O", "S-LOC")
    assert read_hf(path, scheme="BMES")[0].tags == ("B-LOC", "E-LOC", "O", "S-LOC")


def test_a_span_that_cuts_a_word_is_refused_or_snapped_and_named(tmp_path, capsys):
    path = tmp_path / "cut.jsonl"
    path.write_text(json.dumps({"text": "Mr. O'Brien went to New York.", "entities": [[4, 9, "PER"], [20, 28, "LOC"]]})
                    + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"cut.jsonl:1: span \[4, 9, \"PER\"\] \(\"O'Bri\"\) cuts a word: its "
                                              r"words are \"O'Brien\" \[4, 11\]"):
        read_spans_jsonl(path)
    assert read_spans_jsonl(path, span_alignment="snap") == [Sentence(
        ("Mr", ".", "O", "'", "Brien", "went", "to", "New", "York", "."),
        ("O", "O", "B-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"), text="Mr. O'Brien went to New York.")]
    assert capsys.readouterr().err == (f"note: {path}:1: span [4, 9, \"PER\"] (\"O'Bri\") cuts a word: its words are "
                                       "\"O'Brien\" [4, 11], snapped to them\n")
    with pytest.raises(ConfigError, match="span_alignment='guess'"):
        read_spans_jsonl(path, span_alignment="guess")


def test_span_alignment_is_a_spans_jsonl_flag_and_only_snap_changes_the_fingerprint():
    with pytest.raises(ConfigError, match=r"^--span_alignment=snap is for --data_format=spans_jsonl"):
        check_data_config(DataConfig(format="conll", span_alignment="snap"))
    assert "span_alignment" not in DataConfig(format="spans_jsonl").to_dict()
    assert DataConfig(format="spans_jsonl", span_alignment="snap").to_dict()["span_alignment"] == "snap"


def test_hf_column_names_and_languages(tmp_path):
    path = tmp_path / "words.jsonl"
    path.write_text(json.dumps({"words": ["Hans"], "tags": ["B-PER"], "lang": "de"}) + "\n", encoding="utf-8")
    assert read_dataset("hf", path) == [Sentence(("Hans",), ("B-PER",), "de")]
    assert read_dataset("spans_jsonl", write(tmp_path, "s.jsonl", {"text": "Hans", "label": [[0, 4, "PER"]]}),
                        lang="de") == [Sentence(("Hans",), ("B-PER",), "de")]


def write(tmp_path, name, record) -> Path:
    (tmp_path / name).write_text(json.dumps(record) + "\n", encoding="utf-8")
    return tmp_path / name


@pytest.mark.slow
def test_a_tiny_run_through_wikiann_hf_and_spans_jsonl_has_the_same_windows_and_student_f1(wikiann_formats, tmp_path,
                                                                                         tiny_bert_dir):
    """Issue 52's acceptance: the data step's splits, the teacher's cached windows and the student's test F1 are the
    same whichever format the slice of WikiAnn en came in."""
    root, _ = wikiann_formats
    datas = {"wikiann": DataConfig(format="wikiann", data_dir=str(root / "wikiann"), langs=["en"]),
             "hf": DataConfig(format="hf", data_dir=str(root / "hf"), train_file="train", dev_file="validation",
                              test_file="test"),
             "spans_jsonl": DataConfig(format="spans_jsonl", data_dir=str(root / "spans"), train_file="train.jsonl",
                                       dev_file="dev.jsonl", test_file="test.jsonl")}
    runs = {}
    for name, data in datas.items():
        cfg = toy_config(tmp_path / name, root, tiny_bert_dir)
        cfg.data, cfg.teacher.max_seq_length = data, 64
        cfg.teacher.finetune.epochs, cfg.student.epochs_per_layer = 1, 1
        metrics = pipeline.run(cfg)
        work = WorkDir(cfg.work_dir)
        windows = {cache: [{k: v.tolist() for k, v in w.items() if k in ("input_ids", "label_ids", "teacher_mask")}
                           for w in read_sharded(str(work.path(cache))).as_numpy_iterator()]
                   for cache in ("transfer", "transfer_dev")}
        runs[name] = (pipeline.load_data(work), windows, metrics["student"]["scores"]["test"]["all"]["f1"])
    wikiann = runs.pop("wikiann")
    assert len(wikiann[0]["train"]) == SIZES["train"] and len(wikiann[1]["transfer"]) >= SIZES["train"]
    for name, (splits, windows, f1) in runs.items():
        assert splits == wikiann[0], name
        assert windows == wikiann[1], name
        assert f1 == wikiann[2], name
