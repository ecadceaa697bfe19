"""bin/benchmark peers (issue 51): a work dir's student beside spaCy's efficiency NER trained on the same labels,
both scored by one function on the raw test text and timed in one process; refused in one line without spaCy."""
import subprocess
import sys

import pytest
from conftest import REPO
from test_bad_inputs import ENV
from test_deployed_benchmark import finished_work_dir  # noqa: F401  (a module fixture: a tiny finished run)

from xtremedistil_tf.benchmarks import peers, spacy_peer
from xtremedistil_tf.cli.evaluate import evaluate_model
from xtremedistil_tf.data import scoring
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import read_json


def test_without_spacy_the_benchmark_refuses_in_one_line_before_any_work(tmp_path):
    """A `spacy` that cannot be imported (as when it is not installed): one line saying how to install it, exit 2,
    and the work dir not read (it need not even exist)."""
    hidden = tmp_path / "no_spacy" / "spacy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'spacy'\")\n", encoding="utf-8")
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "peers", f"--work_dir={work}"],
                          capture_output=True, text=True, timeout=600,
                          env={**ENV, "PYTHONPATH": str(hidden.parent)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "bin/benchmark peers: spaCy is not installed (an optional extra): pip install \".[peers]\" (or pip install "
        f"spacy=={spacy_peer.SPACY_VERSION})"]
    assert proc.stdout == "" and not work.exists()


def test_the_pin_is_the_requirements_and_the_extras(tmp_path):
    assert f"spacy=={spacy_peer.SPACY_VERSION}" in (REPO / "requirements.txt").read_text(encoding="utf-8").split()
    assert '"spacy": "peers"' in (REPO / "setup.py").read_text(encoding="utf-8")


SENTENCES = [Sentence(["John", "lives", "in", "New", "York", "."], ["B-PER", "O", "O", "B-LOC", "I-LOC", "O"]),
             # the raw text: more than one space, a leading space, punctuation attached to a word
             Sentence(["Mary", "met", "Paris", "Hilton", ",", "in", "Rome"], ["B-PER", "O", "B-PER", "I-PER", "O", "O",
                                                                            "B-LOC"],
                      text=" Mary  met Paris Hilton, in\tRome"),
             Sentence(["nothing", "here"], ["O", "O"])]


def test_one_scorer_scores_every_system(monkeypatch):
    """score_systems hands each system's spans of the raw text to data/scoring.span_scores itself (patched here with
    a recording wrapper: both systems' spans go through it), so identical predictions score identically."""
    seen = []
    real = scoring.span_scores

    def recording(gold, pred):
        seen.append([set(p) for p in pred])
        return real(gold, pred)

    monkeypatch.setattr(scoring, "span_scores", recording)
    gold = [scoring.char_spans(s, s.tags) for s in SENTENCES]
    one_wrong = [gold[0], set(), gold[2]]
    scores = spacy_peer.score_systems(SENTENCES, "IOB2", {"student": lambda texts: [set(g) for g in gold],
                                                          "spacy": lambda texts: [set(g) for g in gold],
                                                          "other": lambda texts: one_wrong})
    assert seen == [gold, gold, one_wrong]
    assert scores["student"] == scores["spacy"] and scores["student"]["all"]["f1"] == 1.0
    assert scores["other"]["all"] == real(gold, one_wrong)
    assert set(scores["student"]["all"]["types"]) == {"LOC", "PER"}


def test_a_sentence_becomes_a_spacy_doc_of_its_raw_text_and_entities():
    """to_doc: the Doc's text is the sentence's raw text and its entities' character spans are char_spans' (what the
    scorer compares); spacy_spans reads them back from a pipeline's docs, through the same scorer."""
    spacy = pytest.importorskip("spacy", reason="spaCy is not installed (requirements.txt pins it: the peers extra)")
    nlp = spacy.blank("en")
    docs = [spacy_peer.to_doc(nlp.vocab, s, "IOB2") for s in SENTENCES]
    assert [doc.text for doc in docs] == [s.raw_text for s in SENTENCES]
    gold = [scoring.char_spans(s, s.tags) for s in SENTENCES]
    assert [{(e.start_char, e.end_char, e.label_) for e in doc.ents} for doc in docs] == gold
    bmes = Sentence(["John", "lives", "in", "New", "York"], ["S-PER", "O", "O", "B-LOC", "E-LOC"])
    assert {(e.start_char, e.end_char, e.label_) for e in spacy_peer.to_doc(nlp.vocab, bmes, "BIOES").ents} == \
        scoring.char_spans(bmes, bmes.tags, "BIOES")

    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "PER", "pattern": "John"}, {"label": "LOC", "pattern": "Rome"}])
    spans = spacy_peer.spacy_spans(nlp, [s.raw_text for s in SENTENCES])
    assert spans == [{(0, 4, "PER")}, {(28, 32, "LOC")}, set()]
    scores = spacy_peer.score_systems(SENTENCES, "IOB2", {"spacy": lambda texts: spacy_peer.spacy_spans(nlp, texts),
                                                          "same": lambda texts: spans})
    assert scores["spacy"] == scores["same"] and scores["spacy"]["all"]["precision"] == 1.0


def test_bin_evaluate_scores_a_spacy_pipeline_as_the_benchmark_does(tmp_path):
    """A spaCy pipeline directory (W/peers/spacy) is a model bin/evaluate scores: its entities of the raw text
    through the scorer of score_systems, seen and unseen names included; a pipeline spaCy cannot read is one line."""
    spacy = pytest.importorskip("spacy", reason="spaCy is not installed (requirements.txt pins it: the peers extra)")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "PER", "pattern": "John"},
                                               {"label": "LOC", "pattern": "Rome"},
                                               {"label": "PER", "pattern": "Paris"}])
    nlp.to_disk(tmp_path / "spacy")
    seen = scoring.train_entities([Sentence(["John", "Smith", "and", "Rome"], ["B-PER", "O", "O", "B-LOC"])])
    scores = spacy_peer.score_systems(SENTENCES, "IOB2", {"spacy": lambda texts: spacy_peer.spacy_spans(nlp, texts)},
                                      seen=seen)["spacy"]
    assert scores["seen_unseen"]["seen"]["recall"] == 1.0 and scores["seen_unseen"]["seen"]["support"] == 2
    assert scores["seen_unseen"]["unseen"]["support"] == 3 and scores["seen_unseen"]["unseen"]["recall"] == 0.0
    assert scores["seen_unseen"]["unseen"]["predicted"] == 1   # "Paris" of "Paris Hilton": unseen, and wrong
    served = []
    evaluated = evaluate_model(tmp_path / "spacy", SENTENCES, "IOB2", served=served, seen=seen)
    assert evaluated["kind"] == "spacy" and served == [{(0, 4, "PER")}, {(11, 16, "PER"), (28, 32, "LOC")}, set()]
    assert {k: evaluated[k] for k in scores} == scores
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.cfg").write_text("[nlp\n", encoding="utf-8")
    (tmp_path / "broken" / "meta.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken: spaCy .* cannot load this pipeline"):
        evaluate_model(tmp_path / "broken", SENTENCES, "IOB2")


@pytest.mark.slow   # a pipeline run, an int8 ONNX export, spaCy trained 20 steps and the timing (about a minute and a half)
def test_the_peers_benchmark_end_to_end(finished_work_dir):
    """bin/benchmark peers on a tiny run: spaCy trained (seeded, its steps capped) and kept in W/peers/spacy/, the
    int8 ONNX export written into W/export/, both systems' span F1 (per type too) and the timing rows in W/peers.json
    and on the console; the pipeline is reused when nothing changed and refused when its settings did."""
    pytest.importorskip("spacy", reason="spaCy is not installed (requirements.txt pins it: the peers extra)")
    spacy_flags = ["--spacy_max_steps=20", "--spacy_eval_frequency=10", "--spacy_seed=1"]
    out = subprocess.run([sys.executable, str(REPO / "bin" / "benchmark"), "peers", f"--work_dir={finished_work_dir}",
                          "--queries=6", *spacy_flags], capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = read_json(finished_work_dir / "peers.json")
    assert out.stdout.splitlines()[:-1] == spacy_peer.format_lines(result)
    assert "[INFO]" not in out.stderr   # spaCy's own log handler is off the console
    for system in ("student", "student_onnx_int8", "spacy"):
        overall = result["scores"][system]["all"]
        assert 0.0 <= overall["f1"] <= 1.0 and overall["sentences"] == 20
        assert set(overall["types"]) <= {"LOC", "PER"}
        split = result["scores"][system]["seen_unseen"]   # against the run's train labels
        assert split["seen"]["support"] + split["unseen"]["support"] == sum(t["support"]
                                                                            for t in overall["types"].values())
        assert split["train_entities"] > 0
    assert result["scores"]["spacy"]["all"]["f1"] > 0.5   # 20 steps learn the toy task
    keys = [tuple(row[k] for k in peers.KEYS) for row in result["rows"]]
    assert keys == [("student", "tensorflow", "student_dir", "none", "text"), spacy_peer.ONNX_ROW,
                    spacy_peer.SPACY_ROW]
    for row in result["rows"]:
        assert set(row["latency_ms"]) == {"batch1", "batch32"} and min(row["latency_ms"].values()) > 0
        assert row["words_per_second_per_core"]["batch1"] == pytest.approx(
            1000 * result["words_per_sentence"] / row["latency_ms"]["batch1"])
    training = result["spacy"]["training"]
    assert result["spacy"]["trained_now"] and training["steps"] == 21 and training["stopped"] == "max_steps"
    assert result["spacy"]["parameters"] > 1e6
    assert (finished_work_dir / "export" / "ner-onnx-dynamic_int8" / "predict.py").exists()

    settings = {"lang": "en", "seed": 1, "max_steps": 20, "patience": 1600, "eval_frequency": 10}
    nlp, record, trained = spacy_peer.spacy_pipeline(finished_work_dir, "IOB2", settings, 60.0, overwrite=False)
    assert not trained and record["training"] == training and nlp.pipe_names == ["tok2vec", "ner"]
    with pytest.raises(ConfigError, match=r"other data or settings \(seed differ\); --overwrite retrains it"):
        spacy_peer.spacy_pipeline(finished_work_dir, "IOB2", {**settings, "seed": 2}, 60.0, overwrite=False)
