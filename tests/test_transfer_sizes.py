"""Students of part of the unlabeled transfer set (issue 20's transfer-set size curve, bin/ablate
--transfer_sizes): which cached windows a student of N unlabeled sentences reads, the checks on N,
and the report's table and plot."""
import numpy as np
import pytest
import tensorflow as tf
from conftest import toy_ner_sentences

from xtremedistil_tf.benchmarks import memory
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.methods.student_run import staged_sources
from xtremedistil_tf.run import ablate, pipeline
from xtremedistil_tf.run.report import plot_transfer_curve
from xtremedistil_tf.transfer.cache import read_arrays, subset

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_evenly_spaced_takes_count_distinct_indices_spread_over_the_range():
    assert pipeline.evenly_spaced(10, 4).tolist() == [0, 2, 5, 7]
    assert pipeline.evenly_spaced(7, 7).tolist() == list(range(7))
    assert pipeline.evenly_spaced(5, 0).tolist() == []
    # Text that comes language by language keeps each language's share.
    langs = np.array(["en"] * 8000 + ["de"] * 8000 + ["fr"] * 8000)
    picked = langs[pipeline.evenly_spaced(len(langs), 3000)]
    assert {lang: int((picked == lang).sum()) for lang in ("en", "de", "fr")} == {"en": 1000, "de": 1000, "fr": 1000}


def test_subset_keeps_the_marked_elements_in_order_with_their_count():
    ds = tf.data.Dataset.range(10)
    kept = subset(ds, np.arange(10) % 3 == 0)
    assert list(kept.as_numpy_iterator()) == [0, 3, 6, 9]
    assert int(kept.cardinality()) == 4
    # A shorter mask ends the subset there (the labeled prefix of a cache, say).
    assert list(subset(ds, [True, False, True]).as_numpy_iterator()) == [0, 2]


class FakeWork:
    """What transfer_subset reads of a work dir: the transfer step's window count and a name."""

    def __init__(self, windows):
        self.root = "work"
        self._windows = windows

    def step_info(self, name):
        assert name == "transfer"
        return {"windows": self._windows}


class Teacher:
    tag_vocab = TagVocab(LABELS)
    max_seq_length = 6    # 4 pieces a window: long sentences take several windows


def test_transfer_subset_marks_every_window_of_the_labeled_and_chosen_unlabeled_sentences(tiny_tokenizer):
    train = toy_ner_sentences(3, seed=1, lang="en")
    unlabeled = [Sentence(s.tokens, None, lang) for lang, seed in (("en", 2), ("de", 3))
                 for s in toy_ner_sentences(4, seed=seed, lang=lang)]
    per_sentence = [len(encode([s], tiny_tokenizer, Teacher.tag_vocab, Teacher.max_seq_length))
                    for s in train + unlabeled]
    assert max(per_sentence) > 1          # the mask has to follow sentences, not windows
    cfg = pipeline.RunConfig(work_dir="work", student=DistilConfig(transfer_sentences=2))
    keep = pipeline.transfer_subset(FakeWork(sum(per_sentence)), cfg, {"train": train, "transfer": unlabeled},
                                    tiny_tokenizer, Teacher)
    # The 3 labeled sentences, then unlabeled sentences 0 (en) and 4 (de) of 8.
    chosen = [True] * 3 + [k in (0, 4) for k in range(8)]
    expected = np.concatenate([[c] * n for c, n in zip(chosen, per_sentence)])
    np.testing.assert_array_equal(keep, expected)

    with pytest.raises(ConfigError, match=r"the transfer set of work: \d+ windows, but the teacher-output cache "
                                          r"holds 3; rerun with --overwrite"):
        pipeline.transfer_subset(FakeWork(3), cfg, {"train": train, "transfer": unlabeled}, tiny_tokenizer, Teacher)


@pytest.mark.parametrize("count, available, message", [
    (8, 8, r"^--transfer_sizes: 8 unlabeled sentences; the data has 8 unlabeled transfer sentences, so give 0 "
           r"to 7 \(all of them is the run without a limit\)$"),
    (-1, 8, r"^--transfer_sizes: -1 unlabeled"),
    (None, 8, r"^--transfer_sizes: None unlabeled"),
    (1, 0, r"the data has no unlabeled transfer sentences \(--transfer_file or --transfer_from_train_rest\)$"),
])
def test_check_transfer_sentences_names_the_limit(count, available, message):
    with pytest.raises(ConfigError, match=message):
        pipeline.check_transfer_sentences(count, available)


def test_check_transfer_sizes_sorts_and_refuses_what_is_not_a_count():
    assert ablate.check_transfer_sizes(["40000", "0", "10_000"]) == [0, 10000, 40000]
    for values, message in ((["all"], r"'all' is not a number"), (["1e4"], r"'1e4' is not a number"),
                            (["-5"], r"'-5' is not a number"), (["5", "5"], r"names \['5'\] more than once"),
                            ([], r"is empty")):
        with pytest.raises(ConfigError, match=message):
            ablate.check_transfer_sizes(values)


def test_a_student_of_all_the_transfer_set_keeps_its_fingerprint():
    """Students trained before the field existed are still recognised as done."""
    assert "transfer_sentences" not in pipeline.student_fingerprint(DistilConfig())
    assert pipeline.student_fingerprint(DistilConfig(transfer_sentences=0))["transfer_sentences"] == 0


def test_staged_sources_reads_only_the_kept_windows_of_the_transfer_cache(tmp_path):
    memory.write_cache(tmp_path / "transfer", 60, labeled=10, seq=8, hidden=4, kbest=2)
    memory.write_cache(tmp_path / "dev", 8, labeled=8, seq=8, hidden=4, kbest=2)
    keep = np.random.default_rng(0).random(60) < 0.3
    keep[:10] = True
    cfg = DistilConfig(batch_size=8, strategy="D4.2")
    train_for, transfer_for, _ = staged_sources(cfg, tmp_path / "transfer", tmp_path / "dev", 10,
                                                transfer_keep=keep)
    rows = np.concatenate([batch["input_ids"].numpy() for batch in transfer_for(0)])
    cached = read_arrays(tmp_path / "transfer", length=rows.shape[1])["input_ids"]
    assert sorted(map(bytes, rows)) == sorted(map(bytes, cached[keep]))
    # The labeled source is the first 10 windows, whatever the transfer source keeps.
    labeled = np.concatenate([batch["input_ids"].numpy() for batch in train_for(0)])
    assert sorted(map(bytes, labeled)) == sorted(map(bytes, cached[:10]))
    # Without labeled windows the label stages learn the teacher's argmax over the same kept windows.
    teacher_labeled_for, _, _ = staged_sources(cfg, tmp_path / "transfer", tmp_path / "dev", 0,
                                               pad_id=memory.PAD_ID, transfer_keep=keep)
    relabeled = np.concatenate([batch["input_ids"].numpy() for batch in teacher_labeled_for(0)])
    assert sorted(map(bytes, relabeled)) == sorted(map(bytes, cached[keep]))


def _info(f1_by_lang):
    return {"scores": {"test": {"f1_mean": float(np.mean(list(f1_by_lang))), "all": {"f1": 0.0}}}}


def test_transfer_table_and_curve_give_each_size_mean_std_and_share_of_the_teacher(tmp_path):
    teacher = {"f1_mean": 0.8, "all": {"f1": 0.8}}
    curve = {"D0-S": {0: [_info([0.4]), _info([0.5])], None: [_info([0.4]), _info([0.5])]},
             "D4.2": {0: [_info([0.6]), _info([0.7])], None: [_info([0.8]), _info([0.84])]}}
    table = ablate.transfer_table("test", teacher, curve, 40000)
    assert table[0] == "| unlabeled sentences | D0-S | D4.2 |"
    assert table[2] == "| 0 | 45.00 ± 7.07 (56.2%) | 65.00 ± 7.07 (81.2%) |"
    assert table[3] == "| 40,000 (all) | 45.00 ± 7.07 (56.2%) | 82.00 ± 2.83 (102.5%) |"
    points = ablate.curve_points("test", teacher, curve, 40000)
    assert points["D4.2"][0] == (0, pytest.approx(81.25), pytest.approx(100 * np.std([0.75, 0.875], ddof=1)))
    assert points["D4.2"][1][:2] == (40000, pytest.approx(102.5))

    plot_transfer_curve(points, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp"))
