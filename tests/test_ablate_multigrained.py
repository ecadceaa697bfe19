"""bin/ablate --method=multigrained: the variants of the paper's Tables 1-3, their report, a tiny run."""
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO
from test_ablate import parse_tables, pct
from test_pipeline import toy_corpus  # noqa: F401  (fixture: CoNLL train/test, 2 unlabeled lines)

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.multigrained import MultiGrainedConfig
from xtremedistil_tf.methods.staged import DistilConfig
from xtremedistil_tf.run import ablate, pipeline
from xtremedistil_tf.run import ablate_multigrained as mg

SEQ = ("hard", "seq_fuzzy", "seq_ce")
# The student rows of the paper's Table 1 and what they set: embeddings, losses, DA.
PAPER_TABLE1 = {
    "vanilla": ("random", ("hard",), False),
    "TE": ("teacher", ("hard",), False),
    "TE+TOKEN-EM": ("teacher", ("hard", "token_em"), False),
    "TE+TOKEN-POS": ("teacher", ("hard", "token_pos"), False),
    "TE+SEQ": ("teacher", SEQ, False),
    "TE+DA": ("teacher", ("hard",), True),
    "TE+DA+TOKEN-EM": ("teacher", ("hard", "token_em"), True),
    "TE+DA+TOKEN-POS": ("teacher", ("hard", "token_pos"), True),
    "TE+DA+SEQ": ("teacher", SEQ, True),
}
# Table 2 (all TE+DA): L^u_Seq-all, + L_Token-pos, - L_Seq-fuzzy, - L_Seq-ce.
PAPER_TABLE2 = {"TE+DA+SEQ": SEQ, "TE+DA+SEQ+TOKEN-POS": SEQ + ("token_pos",),
                "TE+DA+SEQ-FUZZY": ("hard", "seq_ce"), "TE+DA+SEQ-CE": ("hard", "seq_fuzzy")}


def test_every_paper_row_is_a_default_variant_with_the_papers_settings():
    names = [v.name for v in mg.VARIANTS]
    assert len(names) == len(set(names))
    for name, (embeddings, losses, unlabeled) in PAPER_TABLE1.items():
        sc = mg.get_variant(name).apply(MultiGrainedConfig(weighting="equal"))
        assert (sc.arch.embeddings, sc.losses, sc.use_unlabeled, sc.weighting) == \
            (embeddings, losses, unlabeled, "uncertainty")
    assert [n for n in mg.TABLE1 if n in PAPER_TABLE1] == list(PAPER_TABLE1)
    for name, losses in PAPER_TABLE2.items():
        assert mg.get_variant(name).losses == losses and mg.get_variant(name).unlabeled and name in mg.TABLE2
    assert mg.get_variant("TE+DA+ALL").losses == ("hard", "seq_fuzzy", "seq_ce", "token_em", "token_pos")
    # Table 3: SEQ without and with DA (the paper's columns), and all five losses; auto against equal.
    assert mg.TABLE3[:2] == (("TE+SEQ", "TE+SEQ@equal"), ("TE+DA+SEQ", "TE+DA+SEQ@equal"))
    for auto, equal in mg.TABLE3:
        a, e = mg.get_variant(auto), mg.get_variant(equal)
        assert (a.weighting, e.weighting) == ("uncertainty", "equal")
        assert replace(a.apply(MultiGrainedConfig()), weighting="equal") == e.apply(MultiGrainedConfig())
    tabled = set(mg.TABLE1) | set(mg.TABLE2) | {n for pair in mg.TABLE3 for n in pair}
    assert tabled == set(names)
    assert set(PAPER_TABLE1) | set(PAPER_TABLE2) | {"TE+SEQ@equal", "TE+DA+SEQ@equal"} <= set(mg.DEFAULT_VARIANTS)
    for variant in mg.VARIANTS:  # each is a valid student configuration
        sc = variant.apply(MultiGrainedConfig())   # replace() checks it as MultiGrainedConfig() does
        assert (sc.arch.embeddings, sc.losses, sc.use_unlabeled) == (variant.embeddings, variant.losses, variant.unlabeled)


def test_unknown_repeated_or_no_variants_are_refused():
    with pytest.raises(ConfigError, match=r"unknown variant 'TE\+SEQUENCE'; expected one of vanilla, "):
        mg.check_variants(["TE", "TE+SEQUENCE"])
    with pytest.raises(ConfigError, match=r"--variants names \['TE'\] more than once"):
        mg.check_variants(["TE", "vanilla", "TE"])
    with pytest.raises(ConfigError, match="--variants is empty"):
        mg.check_variants([])
    assert mg.check_variants(("vanilla", "TE+DA+SEQ@equal")) == ["vanilla", "TE+DA+SEQ@equal"]


def multigrained_config(work_dir, head="crf", cache_k=5, student_k=5, method="multigrained"):
    return pipeline.RunConfig(work_dir=str(work_dir), teacher=pipeline.TeacherConfig(head=head),
                              transfer=pipeline.TransferConfig(kbest=cache_k),
                              student=MultiGrainedConfig(kbest=student_k) if method == "multigrained" else DistilConfig())


@pytest.mark.parametrize("kwargs, variants, message", [
    ({}, ["TE", "TE+SEQ", "SEQ"], "unknown variant 'SEQ'"),
    ({"head": "softmax"}, ["TE+SEQ"], "--teacher_head=softmax; add --teacher_head=crf"),
    ({"cache_k": 3}, ["TE+SEQ"], "K=5 surrogates but the teacher-output cache keeps 3"),
    ({"method": "xtremedistil"}, ["TE"], "--method=xtremedistil compares --strategies"),
])
def test_bad_configurations_are_refused_before_any_work(tmp_path, kwargs, variants, message):
    cfg = multigrained_config(tmp_path / "w", **kwargs)
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        mg.run_variants(cfg, variants)
    assert not (tmp_path / "w").exists()


def test_strategies_point_a_multigrained_run_to_variants(tmp_path):
    with pytest.raises(ConfigError, match="--method=multigrained compares --variants"):
        ablate.run_ablation(multigrained_config(tmp_path / "w"), ["D4.2"])
    assert not (tmp_path / "w").exists()


def scores(dev, test, precision=None, recall=None):
    def split(f1, p=None, r=None):
        return {"all": {"f1": f1, "precision": p if p is not None else f1, "recall": r if r is not None else f1}}
    return {"dev": split(dev), "test": split(test, precision, recall)}


def step(dev, test, best_epoch=1, lambdas=None, seconds=12.0, **kwargs):
    epochs = [{"epoch": e, "lambdas": lambdas or {"hard": 1.0}} for e in range(1, 4)]
    return {"scores": scores(dev, test, **kwargs), "train_seconds": seconds,
            "history": {"losses": list(lambdas or {"hard": 1.0}), "epochs": epochs, "best_epoch": best_epoch}}


def fake_report():
    teacher = scores(0.95, 0.9)
    teacher["test"]["f1_mean"] = 0.91   # languages: the mean across them is the headline number
    results = {
        "TE+DA+SEQ": step(0.9, 0.88, lambdas={"hard": 0.5, "seq_fuzzy": 2.0, "seq_ce": 0.1234}, precision=0.87,
                          recall=0.89),
        "vanilla": step(0.7, 0.6, best_epoch=0, seconds=3.4),
        "TE": step(0.75, 0.7),
        "TE+DA+SEQ@equal": step(0.85, 0.86),
        "TE+SEQ@equal": step(0.8, 0.8),
    }
    data = {"train_sentences": 1000, "dev_sentences": 100, "test_sentences": 200, "transfer_sentences": 5000}
    return mg.render_report("/runs/x", data, teacher, {name: [info] for name, info in results.items()})


def test_report_tables_from_step_results():
    report = fake_report()
    assert "1,000 train, 100 dev, 200 test; 5,000 unlabeled transfer sentences (DA)." in report
    table1, table2, table3, runs = parse_tables(report)
    assert table1 == [["model", "dev F1", "↑ dev", "test F1", "↑ test"],
                      ["BERT+CRF (teacher)", "95.00", "+25.00", "91.00", "+31.00"],
                      ["vanilla", "70.00", "+0.00", "60.00", "+0.00"],
                      ["TE", "75.00", "+5.00", "70.00", "+10.00"],
                      ["TE+DA+SEQ", "90.00", "+20.00", "88.00", "+28.00"]]
    assert table2 == [["model", "losses", "dev F1", "test P", "test R", "test F1", "↑ test"],
                      ["TE+DA+SEQ", "hard + seq_fuzzy + seq_ce", "90.00", "87.00", "89.00", "88.00", "+28.00"]]
    # TE+SEQ ran with equal weighting only: its auto cells are empty.
    assert table3 == [["losses", "DA", "auto dev", "auto test", "equal dev", "equal test", "auto − equal (test)"],
                      ["hard + seq_fuzzy + seq_ce", "no", "–", "–", "80.00", "80.00", "–"],
                      ["hard + seq_fuzzy + seq_ce", "yes", "90.00", "88.00", "85.00", "86.00", "+2.00"]]
    assert runs[0] == ["model", "embeddings", "losses", "weighting", "DA", "best epoch / run", "λ (best epoch)",
                       "train s"]
    assert runs[1] == ["TE+DA+SEQ", "teacher", "hard + seq_fuzzy + seq_ce", "uncertainty", "yes", "1 / 3",
                       "hard 0.5, seq_fuzzy 2, seq_ce 0.123", "12"]
    assert runs[2] == ["vanilla", "random", "hard", "uncertainty", "no", "0 / 3", "start", "3"]
    assert [r[0] for r in runs[1:]] == ["TE+DA+SEQ", "vanilla", "TE", "TE+DA+SEQ@equal", "TE+SEQ@equal"]


def test_runs_table_says_which_form_of_eq10_the_token_losses_took():
    runs = parse_tables("\n".join(mg.runs_table({"TE+DA+TOKEN-POS": [{**step(0.8, 0.79), "token_loss": "kl"}],
                                                  "TE+DA+SEQ": [step(0.9, 0.88)]})))[0]
    assert [row[2] for row in runs[1:]] == ["hard + token_pos (token losses: kl)", "hard + seq_fuzzy + seq_ce"]


def sd(*values):
    """The report's std over seeds (n - 1), in %."""
    return pct(np.std(values, ddof=1))


def test_report_with_seeds_gives_mean_std_per_seed_values_and_auto_against_equal_seed_by_seed():
    teacher = scores(0.95, 0.9)
    teacher["test"]["f1_mean"] = 0.91
    results = {"vanilla": [step(0.7, 0.6), step(0.72, 0.64, best_epoch=2)],
               "TE+DA+SEQ": [step(0.9, 0.88, precision=0.87, recall=0.89),
                             step(0.92, 0.84, precision=0.85, recall=0.83)],
               "TE+DA+SEQ@equal": [step(0.85, 0.86), step(0.88, 0.85)]}
    data = {"train_sentences": 10, "dev_sentences": 2, "test_sentences": 2, "transfer_sentences": 5}
    report = mg.render_report("/runs/x", data, teacher, results, seeds=[3, 5])
    table1, table2, table3, per_seed, order, runs = parse_tables(report)
    # Cells: mean ± std over the seeds; gains: mean ± std of each seed's gain over the same seed's vanilla.
    assert table1 == [["model", "dev F1", "↑ dev", "test F1", "↑ test"],
                      ["BERT+CRF (teacher)", "95.00", "+24.00", "91.00", "+29.00"],
                      ["vanilla", f"71.00 ± {sd(0.7, 0.72)}", "+0.00 ± 0.00", f"62.00 ± {sd(0.6, 0.64)}",
                       "+0.00 ± 0.00"],
                      ["TE+DA+SEQ", f"91.00 ± {sd(0.9, 0.92)}", f"+20.00 ± {sd(0.2, 0.2)}",
                       f"86.00 ± {sd(0.88, 0.84)}", f"+24.00 ± {sd(0.28, 0.2)}"]]
    assert table2[1] == ["TE+DA+SEQ", "hard + seq_fuzzy + seq_ce", f"91.00 ± {sd(0.9, 0.92)}",
                         f"86.00 ± {sd(0.87, 0.85)}", f"86.00 ± {sd(0.89, 0.83)}", f"86.00 ± {sd(0.88, 0.84)}",
                         f"+24.00 ± {sd(0.28, 0.2)}"]
    assert table3[1:] == [["hard + seq_fuzzy + seq_ce", "yes", f"91.00 ± {sd(0.9, 0.92)}",
                           f"86.00 ± {sd(0.88, 0.84)}", f"86.50 ± {sd(0.85, 0.88)}", f"85.50 ± {sd(0.86, 0.85)}",
                           f"+0.50 ± {sd(0.02, -0.01)}"]]
    # The Seeds table and the ordering are run/ablate.py's, on the variants.
    assert per_seed == [["variant", "seed 3", "seed 5", "mean ± std"],
                        ["vanilla", "60.00", "64.00", f"62.00 ± {sd(0.6, 0.64)}"],
                        ["TE+DA+SEQ", "88.00", "84.00", f"86.00 ± {sd(0.88, 0.84)}"],
                        ["TE+DA+SEQ@equal", "86.00", "85.00", f"85.50 ± {sd(0.86, 0.85)}"]]
    assert "## Seeds: test F1 (%) of each student" in report and "--seeds=3,5" in report
    assert order == [["ordering", "seed 3", "seed 5", "holds"],
                     ["TE+DA+SEQ ≥ TE+DA+SEQ@equal", "yes: 88.00 vs 86.00", "NO: 84.00 vs 85.00", "1 of 2"]]
    assert runs[0][:2] == ["model", "seed"]
    assert [row[:2] + row[6:7] for row in runs[1:3]] == [["vanilla", "3", "1 / 3"], ["vanilla", "5", "2 / 3"]]
    assert len(runs) == 1 + 2 * len(results)
    # No pair of Table 3: the section says so.
    alone = mg.render_report("/runs/x", data, teacher, {"vanilla": results["vanilla"]}, seeds=[3, 5])
    assert "No auto and equal pair of Table 3 was run." in alone


def test_report_without_vanilla_or_unlabeled_text_says_so():
    report = mg.render_report("/runs/x", {"train_sentences": 10, "dev_sentences": 2}, scores(0.9, 0.8),
                              {"TE+DA": [step(0.5, 0.4)]})
    assert "0 unlabeled transfer sentences (DA) — none, so +DA variants train on the labeled windows only." in report
    table1, table2 = parse_tables(report)[:2]
    assert table1[2] == ["TE+DA", "50.00", "–", "40.00", "–"]
    assert table2[1] == ["TE+DA", "hard", "50.00", "40.00", "40.00", "40.00", "–"]
    assert len(parse_tables(report)[2]) == 1   # Table 3: header only


# ----------------------------------------------------------------------------- end to end (bin/ablate)

def bin_ablate(corpus, teacher_dir, work_dir, variants, *extra):
    """bin/ablate on the toy corpus: a tiny random BERT+CRF teacher and one-epoch CRF students."""
    args = [f"--data_dir={corpus}", "--train_file=train.txt", "--test_file=test.txt", "--dev_fraction=0.2",
            "--transfer_file=unlabeled.txt", f"--teacher={teacher_dir}", "--teacher_random_init",
            "--teacher_head=crf", "--max_seq_length=16", "--teacher_dropout=0", "--teacher_embedding_dropout=0",
            "--teacher_epochs=1", "--teacher_batch_size=16", "--teacher_learning_rate=3e-3", "--teacher_layer=1",
            "--shard_size=64", "--transfer_batch_size=32", "--method=multigrained", "--kbest=3",
            "--student_embedding_dim=8", "--student_hidden=8", "--student_epochs=1", "--student_patience=1",
            "--student_batch_size=16", "--student_learning_rate=2e-2", "--no_progress",
            f"--work_dir={work_dir}", f"--variants={','.join(variants)}", *extra]
    return subprocess.run([sys.executable, str(REPO / "bin" / "ablate"), *args], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)


def step_json(work_dir, name):
    return os.path.join(work_dir, "ablate", name, "step.json")


@pytest.mark.slow
def test_bin_ablate_multigrained_resumes_and_reports_each_variant(tmp_path, toy_corpus, tiny_bert_dir):
    # About 3 minutes of CPU on 2 cores: a teacher, its k-best cache, three CRF students saved as SavedModels.
    work = tmp_path / "work"
    first = bin_ablate(toy_corpus, tiny_bert_dir, work, ["vanilla", "TE+SEQ"])
    assert first.returncode == 0, first.stderr[-3000:]
    stamps = {name: os.stat(step_json(work, name)).st_mtime_ns for name in ("vanilla", "TE+SEQ")}
    second = bin_ablate(toy_corpus, tiny_bert_dir, work, ["vanilla", "TE+SEQ", "TE+DA+SEQ"])
    assert second.returncode == 0, second.stderr[-3000:]
    # The finished variants were read, not retrained; only the new one trained.
    assert {name: os.stat(step_json(work, name)).st_mtime_ns for name in stamps} == stamps
    report = (work / "ablation.md").read_text(encoding="utf-8")
    assert report in second.stdout
    infos = {name: json.load(open(step_json(work, name)))["info"] for name in ("vanilla", "TE+SEQ", "TE+DA+SEQ")}
    table1, table2, table3, runs = parse_tables(report)
    assert [row[0] for row in table1[1:]] == ["BERT+CRF (teacher)", "vanilla", "TE+SEQ", "TE+DA+SEQ"]
    for row in table1[2:]:
        f1 = {split: infos[row[0]]["scores"][split]["all"]["f1"] for split in ("dev", "test")}
        vanilla = {split: infos["vanilla"]["scores"][split]["all"]["f1"] for split in ("dev", "test")}
        assert row[1:] == [pct(f1["dev"]), f"{100 * (f1['dev'] - vanilla['dev']):+.2f}",
                           pct(f1["test"]), f"{100 * (f1['test'] - vanilla['test']):+.2f}"]
    assert [row[0] for row in table2[1:]] == ["TE+DA+SEQ"]
    seq = "hard + seq_fuzzy + seq_ce"
    assert [row[:2] for row in table3[1:]] == [[seq, "no"], [seq, "yes"]]
    assert [row[0] for row in runs[1:]] == ["vanilla", "TE+SEQ", "TE+DA+SEQ"]
    assert all(row[5].endswith("/ 1") for row in runs[1:])
    # Each variant really trained with its own settings: the report's settings are the step's fingerprint.
    fingerprint = json.load(open(step_json(work, "TE+DA+SEQ")))["fingerprint"]["student"]
    # The fingerprint lists loss terms in one canonical order (pipeline.student_fingerprint).
    assert (fingerprint["arch"]["embeddings"], sorted(fingerprint["losses"]), fingerprint["use_unlabeled"]) == \
        ("teacher", sorted(SEQ), True)
    assert infos["TE+SEQ"]["history"]["losses"] == list(SEQ)
    # A typo is refused in one line before any work.
    bad = bin_ablate(toy_corpus, tiny_bert_dir, tmp_path / "other", ["TE", "TE+SEQUENCE"])
    assert bad.returncode == 2 and "unknown variant 'TE+SEQUENCE'" in bad.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_bin_ablate_multigrained_seeds_trains_a_student_per_seed_and_reports_mean_std(tmp_path, toy_corpus,
                                                                                      tiny_bert_dir):
    # About 3 minutes of CPU on 2 cores: a teacher, its k-best cache, four CRF students.

    work = tmp_path / "work"
    variants = ["TE+SEQ", "TE+SEQ@equal"]
    proc = bin_ablate(toy_corpus, tiny_bert_dir, work, variants, "--seeds=1,2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stored = {(name, seed): json.load(open(step_json(work, f"seed-{seed}/{name}"))) for name in variants
              for seed in (1, 2)}
    # One teacher and one cache: the fingerprints differ only in the student's seed.
    for name in variants:
        a, b = stored[name, 1]["fingerprint"], stored[name, 2]["fingerprint"]
        assert (a["student"]["seed"], b["student"]["seed"]) == (1, 2)
        assert {k: v for k, v in a.items() if k != "student"} == {k: v for k, v in b.items() if k != "student"}
        assert {**a["student"], "seed": 0} == {**b["student"], "seed": 0}
        assert stored[name, 1]["info"]["history"]["epochs"] != stored[name, 2]["info"]["history"]["epochs"]
    report = (work / "ablation.md").read_text(encoding="utf-8")
    assert report in proc.stdout
    f1 = {key: value["info"]["scores"]["test"]["all"]["f1"] for key, value in stored.items()}

    def mean_std(values):
        return f"{pct(np.mean(values))} ± {pct(np.std(values, ddof=1))}"

    table1, table2, table3, per_seed, order, runs = parse_tables(report)
    assert table1[2][0] == "TE+SEQ" and table1[2][3] == mean_std([f1["TE+SEQ", 1], f1["TE+SEQ", 2]])
    gains = [f1["TE+SEQ", s] - f1["TE+SEQ@equal", s] for s in (1, 2)]
    assert table3[1] == ["hard + seq_fuzzy + seq_ce", "no",
                         *[mean_std([stored[name, s]["info"]["scores"][split]["all"]["f1"] for s in (1, 2)])
                           for name in variants for split in ("dev", "test")],
                         f"{100 * np.mean(gains):+.2f} ± {pct(np.std(gains, ddof=1))}"]
    assert per_seed == [["variant", "seed 1", "seed 2", "mean ± std"],
                        *[[name, pct(f1[name, 1]), pct(f1[name, 2]), mean_std([f1[name, 1], f1[name, 2]])]
                          for name in variants]]
    assert order[1][0] == "TE+SEQ ≥ TE+SEQ@equal" and order[1][-1] == \
        f"{sum(f1['TE+SEQ', s] >= f1['TE+SEQ@equal', s] for s in (1, 2))} of 2"
    assert [row[:2] for row in runs[1:]] == [[name, str(s)] for name in variants for s in (1, 2)]
