"""The bad-input suite (issue 9, item 5).

1. tests/bad_inputs/: malformed files of every reader format, listed in cases.json with the line
   and message each must be reported with (a DataFormatError naming file, line and problem).
2. Bad flag and directory combinations through bin/train: exit status 2, one `error:` line on
   stderr that names the problem, no traceback unless --verbose, the work dir left as it was.
   Most run in one process (tests/train_cli_driver.py, one TensorFlow import for all); a few go
   through bin/train itself.
"""
import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_pipeline import toy_corpus  # noqa: F401  (a fixture, used by `corpus`)

from xtremedistil_tf.cli.common import one_line
from xtremedistil_tf.data.loading import DataConfig, check_data_config, load_splits
from xtremedistil_tf.data.readers import READERS, read_dataset
from xtremedistil_tf.errors import ConfigError, DataFormatError, WorkDirError
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.workdir import WorkDir

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
CASES = json.loads((CORPUS / "cases.json").read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the corpus

def read(case):
    path = CORPUS / case["file"]
    return read_dataset(case["format"], path, **case.get("kwargs", {}))


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_bad_file_is_reported_with_its_path_line_and_problem(case):
    with pytest.raises(DataFormatError) as info:
        read(case)
    error, path = info.value, CORPUS / case["file"]
    assert (error.path, error.line) == (str(path), case["line"])
    assert case["message"] in error.message
    where = f"{path}:{case['line']}" if case["line"] is not None else str(path)
    assert str(error) == f"{where}: {error.message}" and "\n" not in str(error)


def test_corpus_covers_every_reader_and_lists_every_file():
    assert len(CASES) >= 25
    assert {c["format"] for c in CASES} == set(READERS)
    listed = {c["file"] for c in CASES}
    # damaged_models.json: the damaged model files of tests/test_damaged_models.py (made from a student at test time)
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file()} - {"cases.json",
                                                                                        "damaged_models.json"}
    # A listed folder's files: the directory case's README, the save_to_disk folders of the hf cases.
    inside = {f for f in on_disk if any(f.startswith(d + "/") for d in listed)}
    assert on_disk - listed - inside == set() and "conll/a_directory/README" in inside
    assert listed - on_disk == {"conll/a_directory", "conll/missing.conll", "hf/ignored_piece_id",
                                "hf/dataset_dict_without_split"}
    binary = [c["file"] for c in CASES if (CORPUS / c["file"]).is_file()
              and not _is_utf8((CORPUS / c["file"]).read_bytes())]
    assert len(binary) >= 10   # stored byte for byte: Latin-1, cp1252, GBK, UTF-16, gzip


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# What is NOT a bad input: CRLF endings, a UTF-8 byte-order mark, no final newline.
GOOD = {
    "conll": "John B-PER\nlives O\n\nParis B-LOC\n",
    "char_bmes": "\u5317 B-NS\n\u4eac E-NS\n\n\u597d O\n",
    "wikiann": "en:John\tB-PER\nen:lives\tO\n\nen:Paris\tB-LOC\n",
    "xtremedistil_tsv": "John lives\ten:B-PER en:O\nParis\ten:B-LOC\n",
    "label_tsv": "pos\tgreat film\nneg\tawful film\n",
    "unlabeled": "john was in paris\nmary at berlin .\n",
    "hf": '{"tokens": ["John", "lives"], "ner_tags": ["B-PER", "O"]}\n{"tokens": ["Paris"], "ner_tags": ["B-LOC"]}\n',
    "spans_jsonl": '{"text": "John lives", "entities": [[0, 4, "PER"]]}\n{"text": "Paris", "spans": []}\n',
}


@pytest.mark.parametrize("fmt", GOOD)
def test_crlf_bom_and_missing_final_newline_are_accepted(tmp_path, fmt):
    variants = {"lf": GOOD[fmt].encode(), "crlf": GOOD[fmt].replace("\n", "\r\n").encode(),
                "bom_crlf": b"\xef\xbb\xbf" + GOOD[fmt].replace("\n", "\r\n").encode(),
                "no_final_newline": GOOD[fmt].rstrip("\n").encode()}
    results = {}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        results[name] = read({"file": str(tmp_path / name), "format": fmt})
    assert all(result == results["lf"] for result in results.values())


# ----------------------------------------------------------------------------- labels train lacks

@pytest.fixture(scope="module")
def corpus(toy_corpus):
    """test_pipeline's toy PER/LOC corpus (train.txt, test.txt), a test file with MISC entities, one
    with inside tags only, an empty transfer file, a training file without entities (only O) and a
    training file too large for a full disk."""
    (toy_corpus / "test_misc.txt").write_text("john B-PER\nsays O\nhallo B-MISC\nwelt I-MISC\n\n", encoding="utf-8")
    (toy_corpus / "only_inside_tags.txt").write_text("paris I-LOC\nberlin I-LOC\n\n", encoding="utf-8")
    (toy_corpus / "empty.txt").write_bytes(b"")
    (toy_corpus / "all_o.txt").write_text("john O\nsays O\n\nparis O\n\n" * 20, encoding="utf-8")
    (toy_corpus / "big_train.txt").write_text((toy_corpus / "train.txt").read_text(encoding="utf-8") * 8,
                                              encoding="utf-8")
    return toy_corpus


def test_dev_or_test_labels_the_training_set_lacks_are_refused(corpus):
    cfg = DataConfig(data_dir=str(corpus), train_file="train.txt", dev_file="train.txt", test_file="test_misc.txt")
    with pytest.raises(ConfigError, match=r"^--test_file=test_misc.txt: labels that the training data lacks, "
                                          r"so the teacher cannot learn them: B-MISC, I-MISC$"):
        load_splits(cfg)
    cfg.max_train_sentences = 1   # a cap can leave types out of train: the message says so
    with pytest.raises(ConfigError, match=r"training data \(its first --max_train_sentences=1\) lacks"):
        load_splits(cfg)


def test_known_types_and_held_out_dev_are_accepted(corpus):
    # An I-LOC when train has B-LOC is the same entity type, known to the teacher.
    splits = load_splits(DataConfig(data_dir=str(corpus), train_file="train.txt", dev_file="only_inside_tags.txt"))
    assert splits["dev"][0].tags == ("I-LOC", "I-LOC")
    # A dev split held out of train is not checked: a rare type the split put only in dev is
    # not the user's doing (docs/data.md, Errors).
    (corpus / "rare.txt").write_text("john B-PER\n\n" * 9 + "hallo B-MISC\n\n", encoding="utf-8")
    splits = load_splits(DataConfig(data_dir=str(corpus), train_file="rare.txt", dev_fraction=0.5, seed=0))
    assert [s.tags for s in splits["dev"]].count(("B-MISC",)) == 1 and len(splits["train"]) == 5


def test_classification_and_wikiann_test_labels_are_checked_too(tmp_path):
    (tmp_path / "train.tsv").write_text("pos\tgreat film\nneg\tawful film\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("pos\tgood\nmixed\tso so\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^--test_file=test.tsv: labels .* cannot learn them: mixed$"):
        load_splits(DataConfig(format="label_tsv", data_dir=str(tmp_path), train_file="train.tsv",
                               dev_file="train.tsv", test_file="test.tsv"))
    for lang, split, text in (("en", "train", "en:John\tB-PER\n"), ("en", "dev", "en:John\tB-PER\n"),
                              ("en", "test", "en:IBM\tB-ORG\n"), ("de", "train", "de:Hans\tB-PER\n"),
                              ("de", "dev", "de:Hans\tB-PER\n"), ("de", "test", "de:Hans\tB-PER\n")):
        (tmp_path / lang).mkdir(exist_ok=True)
        (tmp_path / lang / split).write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^the test files of --langs=en,de: labels .*: B-ORG$"):
        load_splits(DataConfig(format="wikiann", data_dir=str(tmp_path), langs=["en", "de"]))


@pytest.mark.parametrize("fields, message", [
    ({"format": "wikiann"}, "--data_format=wikiann needs --langs (e.g. en,de)"),
    ({"dev_fraction": 1.5}, "--dev_fraction=1.5; expected a fraction in [0, 1)"),
    ({"format": "demo", "dev_fraction": 0.5, "test_fraction": 0.5}, "--dev_fraction + test_fraction = 1.0"),
    ({"max_eval_sentences": -1}, "--max_eval_sentences=-1; expected 0 (all) or a positive count"),
])
def test_data_flags_that_cannot_work_are_refused_before_reading(fields, message):
    with pytest.raises(ConfigError) as info:
        check_data_config(DataConfig(train_file="/nonexistent", **fields))
    assert str(info.value).startswith(message)


def test_a_step_that_fails_to_write_keeps_nothing_and_says_so(tmp_path):
    work = WorkDir(tmp_path / "w")
    work.run_step("data", {"a": 1}, lambda tmp: {"bytes": (tmp / "x").write_text("ok")})
    before = tree_digest(work.root)

    def full_disk(tmp):
        (tmp / "part.jsonl").write_text("half")
        raise OSError(28, "No space left on device")

    # The OSError names no file (a library's write() on a full disk): the file the step was writing is named.
    with pytest.raises(WorkDirError, match=r"^step teacher failed: No space left on device "
                                           rf"\({tmp_path / 'w' / 'teacher.tmp' / 'part.jsonl'}\); nothing of it "
                                           rf"was kept in {tmp_path / 'w' / 'teacher'} \(rerun"):
        work.run_step("teacher", {"a": 1}, full_disk)
    assert tree_digest(work.root) == before   # no teacher/, no teacher.tmp/, data/ as it was
    assert one_line(PermissionError(13, "Permission denied", "/w/run.log")) == "/w/run.log: Permission denied"
    assert one_line(ConfigError("first\n  second\n")) == "first; second"


def tree_digest(root) -> dict:
    """{relative path: sha256} of every file under root."""
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- bin/train

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
# Only logs: a refused run may leave these in a fresh work dir, never a step's artifact.
LOG_FILES = {"run.log", "config.json", ".lock"}   # .lock: the work dir's lock (run/lock.py)


def base_flags(corpus, teacher_dir, work_dir):
    """A tiny run: every case below must be refused before any training starts."""
    return [f"--work_dir={work_dir}", f"--data_dir={corpus}", "--train_file=train.txt", "--test_file=test.txt",
            f"--teacher={teacher_dir}", "--teacher_random_init", "--teacher_layer=1", "--max_seq_length=16",
            "--teacher_epochs=1", "--student_embedding_dim=8", "--student_hidden=8", "--epochs_per_layer=1",
            "--student_epochs=1", "--no_progress"]


def cli_cases(corpus, teacher_dir, root):
    """name -> (flags added to base_flags, text the error line must contain)."""
    no_config = root / "teacher_without_config"
    no_config.mkdir(exist_ok=True)
    (no_config / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    corrupt = root / "teacher_with_corrupt_weights"
    corrupt.mkdir(exist_ok=True)
    for name in ("config.json", "vocab.txt"):
        (corrupt / name).write_bytes((teacher_dir / name).read_bytes())
    (corrupt / "tf_model.h5").write_bytes(b"<html>404</html>")   # a failed download saved as the weights
    unreadable = root / "teacher_with_unreadable_weights"
    (unreadable / "tf_model.h5").mkdir(parents=True, exist_ok=True)   # unreadable also as root
    for name in ("config.json", "vocab.txt"):
        (unreadable / name).write_bytes((teacher_dir / name).read_bytes())
    labeled_transfer = root / "labeled_transfer.txt"
    labeled_transfer.write_text("john\tB-PER\nsays\tO\n\nparis\tB-LOC\n", encoding="utf-8")
    no_vocab = root / "teacher_without_vocab"
    no_vocab.mkdir(exist_ok=True)
    (no_vocab / "config.json").write_text((teacher_dir / "config.json").read_text(encoding="utf-8"), encoding="utf-8")
    cases = {
        "labels_train_lacks": (["--test_file=test_misc.txt"],
                               "--test_file=test_misc.txt: labels that the training data lacks, so the teacher "
                               "cannot learn them: B-MISC, I-MISC"),
        # Issue 32, item 5: a train split with no entity, refused in the data step, before the teacher.
        "train_without_entities": (["--train_file=all_o.txt"],
                                   "--train_file=all_o.txt: the training data has no entities (labels found: O); "
                                   "expected B-/I-/... entity tags besides O"),
        "empty_transfer_file": (["--transfer_file=empty.txt"],
                                f"{corpus / 'empty.txt'}: empty file: expected one sentence per line"),
        "teacher_without_weights": (["--noteacher_random_init"],
                                    f"teacher directory {teacher_dir} has no weights (expected one of tf_model.h5"),
        "teacher_without_config": ([f"--teacher={no_config}"], f"teacher directory {no_config} has no config.json"),
        "teacher_dir_missing": ([f"--teacher={root / 'nope'}"], f"teacher directory {root / 'nope'} does not exist"),
        "teacher_layer_too_high": (["--teacher_layer=3"],
                                   "--teacher_layer=3 is out of range: the teacher has 2 layers (0 is the embedding"),
        "teacher_layer_negative": (["--teacher_layer=-1"], "--teacher_layer=-1; expected at least 0"),
        "max_seq_length_beyond_teacher": (["--max_seq_length=1024"],
                                          "--max_seq_length=1024 exceeds the teacher's max_position_embeddings=128"),
        "kbest_above_15": (["--method=multigrained", "--teacher_head=crf", "--kbest=16"],
                           "--kbest=16 must be between 1 and 15"),
        "kbest_zero": (["--method=multigrained", "--teacher_head=crf", "--kbest=0"], "--kbest=0 must be between 1"),
        "multigrained_softmax_teacher": (["--method=multigrained", "--teacher_head=softmax"],
                                         "--method=multigrained distils from a CRF teacher's k-best paths: "
                                         "add --teacher_head=crf"),
        "wikiann_without_langs": (["--data_format=wikiann"], "--data_format=wikiann needs --langs"),
        "dev_fraction_above_1": (["--dev_fraction=1.5"], "--dev_fraction=1.5; expected a fraction in [0, 1)"),
        "batch_size_zero": (["--student_batch_size=0"], "--student_batch_size=0; expected at least 1"),
        "overrides_not_an_object": (["--teacher_config_overrides=[4]"],
                                    "--teacher_config_overrides=[4]; expected a JSON object"),
        # Issue 16, item 3: values refused before the data step, naming flag, value and what is allowed.
        "student_dropout_above_1": (["--student_dropout=1.5"], "--student_dropout=1.5; expected a fraction in [0, 1)"),
        "teacher_dropout_negative": (["--teacher_dropout=-0.1"],
                                     "--teacher_dropout=-0.1; expected a fraction in [0, 1)"),
        "seed_negative": (["--seed=-1"], "--seed=-1; expected 0 to 2147483647"),
        # Issue 32, item 6: every bad value named in the one line, not only the first.
        "three_bad_values": (["--student_dropout=1.5", "--seed=-1", "--student_batch_size=0"],
                             "--student_dropout=1.5; expected a fraction in [0, 1); --seed=-1; expected 0 to "
                             "2147483647; --student_batch_size=0; expected at least 1"),
        "teacher_learning_rate_nan": (["--teacher_learning_rate=nan"],
                                      "--teacher_learning_rate=nan; expected a finite rate above 0"),
        "overrides_heads_do_not_divide_hidden": (['--teacher_config_overrides={"num_attention_heads": 7}'],
                                                 '--teacher_config_overrides={"num_attention_heads": 7}: '
                                                 "hidden_size=32 is not a multiple of num_attention_heads=7"),
        "overrides_misspelt_key": (['--teacher_config_overrides={"num_hiden_layers": 1}'],
                                   "--teacher_config_overrides: unknown key 'num_hiden_layers' (a misspelling?)"),
        "random_teacher_max_seq_length_beyond_positions": (["--teacher=random", "--max_seq_length=600"],
                                                           "--max_seq_length=600 exceeds the --teacher=random "
                                                           "max_position_embeddings=512"),
        "teacher_without_vocab": ([f"--teacher={no_vocab}"], f"--teacher={no_vocab}: teacher directory {no_vocab} "
                                                             "has no tokenizer (expected one of vocab.txt"),
        "langs_with_conll": (["--langs=en"], "--langs=en is read only with --data_format=wikiann (not conll)"),
        # Issue 16, item 10: the model or file named in one line.
        "hub_name_misspelt": (["--teacher=bert-base-uncasd"],
                              "--teacher=bert-base-uncasd: no local directory of that name, and the Hugging Face "
                              "hub cache (HF_HUB_OFFLINE=1) has no model of that name (a misspelling?)"),
        "teacher_weights_corrupt": ([f"--teacher={corrupt}", "--noteacher_random_init"],
                                    f"{corrupt / 'tf_model.h5'}: not a h5 weight file (16 bytes, starting "
                                    "b'<html>40'); re-download or re-save the teacher"),
        "teacher_weights_unreadable": ([f"--teacher={unreadable}", "--noteacher_random_init"],
                                       f"{unreadable / 'tf_model.h5'}: the teacher's weights cannot be read: "
                                       "Is a directory"),
        "labeled_conll_as_transfer_file": ([f"--transfer_file={labeled_transfer}"],
                                           f"{labeled_transfer}:1: 'john\\tB-PER' is a token and its tag 'B-PER', "
                                           "as are the next 2 lines: this is labeled CoNLL data"),
        # Not a flag error: training runs and its loss stops being finite (tested on its own below).
        "teacher_loss_diverges": (["--teacher_learning_rate=1e30", "--teacher_epochs=2"],
                                  "step teacher: the training loss became nan in epoch 1; nothing of the step was kept"),
        "work_dir_under_a_file": ([f"--work_dir={corpus / 'train.txt' / 'w'}"],
                                  f"--work_dir={corpus / 'train.txt' / 'w'} cannot be written: "
                                  f"{corpus / 'train.txt' / 'w'}: Not a directory"),
    }
    read_only = root / "read_only"
    read_only.mkdir(exist_ok=True)
    read_only.chmod(0o555)
    if not os.access(read_only, os.W_OK):   # root ignores the mode: tested where it means something
        cases["work_dir_read_only"] = ([f"--work_dir={read_only / 'w'}"],
                                       f"--work_dir={read_only / 'w'} cannot be written: ")
    return cases


def error_line(stderr: str) -> str:
    """The one `error:` line, which must be the last line and come without a traceback."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], stderr[-3000:]
    return lines[-1]


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory, corpus, tiny_bert_dir):
    root = tmp_path_factory.mktemp("cli")
    cases = cli_cases(corpus, tiny_bert_dir, root)
    argvs = [base_flags(corpus, tiny_bert_dir, root / "work" / name) + extra for name, (extra, _) in cases.items()]
    (root / "cases.json").write_text(json.dumps(argvs), encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "tests" / "train_cli_driver.py"), str(root / "cases.json"),
                    str(root / "results.json")], env=ENV, check=True, capture_output=True, timeout=600)
    results = json.loads((root / "results.json").read_text(encoding="utf-8"))
    return root, {name: (expected, result) for (name, (_, expected)), result in zip(cases.items(), results)}


CLI_CASES = ["labels_train_lacks", "train_without_entities", "empty_transfer_file", "teacher_without_weights", "teacher_without_config",
             "teacher_dir_missing", "teacher_layer_too_high", "teacher_layer_negative",
             "max_seq_length_beyond_teacher", "kbest_above_15", "kbest_zero", "multigrained_softmax_teacher",
             "wikiann_without_langs", "dev_fraction_above_1", "batch_size_zero", "overrides_not_an_object",
             "student_dropout_above_1", "teacher_dropout_negative", "seed_negative", "three_bad_values", "teacher_learning_rate_nan",
             "overrides_heads_do_not_divide_hidden", "overrides_misspelt_key",
             "random_teacher_max_seq_length_beyond_positions", "teacher_without_vocab", "langs_with_conll",
             "hub_name_misspelt", "teacher_weights_corrupt", "teacher_weights_unreadable",
             "labeled_conll_as_transfer_file",
             "work_dir_under_a_file", "work_dir_read_only"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_bad_flags_give_one_error_line_and_exit_2(cli_results, name):
    root, results = cli_results
    if name not in results:
        pytest.skip("running as root: chmod 0o555 does not stop root from writing, so no read-only work dir")
    expected, result = results[name]
    assert result["code"] == 2, result["stderr"][-3000:]
    assert error_line(result["stderr"]).startswith("error: " + expected)
    work = root / "work" / name
    # Refused before any step: at most the run's log and config, no step dir, no .tmp leftovers.
    assert not work.exists() or {p.name for p in work.iterdir()} <= LOG_FILES


def test_a_training_loss_that_is_no_longer_finite_stops_the_run_naming_step_and_epoch(cli_results):
    root, results = cli_results
    expected, result = results["teacher_loss_diverges"]
    assert result["code"] == 2, result["stderr"][-3000:]
    assert error_line(result["stderr"]).startswith("error: " + expected)
    work = root / "work" / "teacher_loss_diverges"
    assert (work / "data" / "step.json").exists() and not (work / "teacher").exists()
    assert not (work / "teacher.tmp").exists() and not (work / "metrics.json").exists()


def bin_train(args, **kwargs):
    return subprocess.run([sys.executable, str(REPO / "bin" / "train"), *args], capture_output=True, text=True,
                          env=ENV, timeout=600, **kwargs)


def test_work_dir_of_another_config_is_refused_in_one_line_and_left_intact(tmp_path, corpus, tiny_bert_dir):
    work = tmp_path / "work"
    flags = base_flags(corpus, tiny_bert_dir, work)
    data = DataConfig(data_dir=str(corpus), train_file="train.txt", test_file="test.txt", dev_fraction=0.2, seed=42)
    pipeline.step_data(WorkDir(work), pipeline.RunConfig(work_dir=str(work), data=data))
    before = tree_digest(work)
    proc = bin_train(flags + ["--dev_fraction=0.3"])
    assert proc.returncode == 2
    assert error_line(proc.stderr).startswith(
        f"error: {work / 'data'} was made by another configuration (data.dev_fraction: 0.2 in the work dir, "
        "0.3 now); use a new --work_dir, or pass --overwrite")
    after = tree_digest(work)
    assert {k: v for k, v in after.items() if k not in LOG_FILES} == before   # data/step.json byte for byte


def test_verbose_shows_the_traceback(tmp_path, corpus, tiny_bert_dir):
    proc = bin_train(base_flags(corpus, tiny_bert_dir, tmp_path / "w") + ["--method=multigrained",
                                                                          "--teacher_head=crf", "--kbest=16",
                                                                          "--verbose"])
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "ConfigError: --kbest=16 must be between 1 and 15" in proc.stderr
    assert not any(line.startswith("error:") for line in proc.stderr.splitlines())


def test_full_disk_during_a_step_gives_one_line_and_keeps_no_half_step(tmp_path, corpus, tiny_bert_dir):
    # RLIMIT_FSIZE makes writes past 64 KiB fail as a full disk does (EFBIG; Python ignores
    # SIGXFSZ), and works as root, unlike a read-only dir. data/train.jsonl is ~200 KiB.
    limit = 64 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    work = tmp_path / "work"
    proc = bin_train(base_flags(corpus, tiny_bert_dir, work) + ["--train_file=big_train.txt"], preexec_fn=small_files)
    assert proc.returncode == 2
    assert error_line(proc.stderr) == (f"error: step data failed: File too large ({work / 'data.tmp' / 'train.jsonl'}); "
                                       f"nothing of it was kept in {work / 'data'} (rerun the same command once fixed)")
    assert {p.name for p in work.iterdir()} <= LOG_FILES   # no data/, no data.tmp/
