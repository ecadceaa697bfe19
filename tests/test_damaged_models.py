"""Damaged or missing model files (issue 42, item 2): tests/bad_inputs/damaged_models.json lists each damage (a
file of an export or a student cut to half, emptied or deleted) and the commands that read it; each must end in one
`error:` line naming the file, what is wrong with it and what to do, exit 2, no traceback (--verbose shows it).

The export and student are the session's toy student (conftest.toy_student_dir) with its tokenizer, exported once
here; every case damages its own copy.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, toy_ner_sentences
from test_bad_inputs import ENV, error_line
from test_pipeline import write_conll

from xtremedistil_tf import damage, stop
from xtremedistil_tf.errors import ConfigError, DamagedArtifact
from xtremedistil_tf.export.formats import export
from xtremedistil_tf.cli.evaluate import evaluate_model
from xtremedistil_tf.export.predictor import load_serving_fn
from xtremedistil_tf.transfer.cache import cache_complete, write_sharded

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
CASES = json.loads((CORPUS / "damaged_models.json").read_text(encoding="utf-8"))
REMEDY = {"export": damage.REEXPORT, "student": damage.RETRAIN}
PAIRS = [(i, command) for i, case in enumerate(CASES) for command in case["commands"]]


def ids(pair):
    case = CASES[pair[0]]
    return f"{case['artifact']}-{case['file'].replace('/', '.')}-{case['damage']}-{pair[1]}"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory, toy_student_dir, tiny_tokenizer):
    """<root>/student (the toy student with its tokenizer), <root>/export/ner/1 (it, exported) and test data."""
    root = tmp_path_factory.mktemp("damaged") / "healthy"
    shutil.copytree(toy_student_dir, root / "student")
    tiny_tokenizer.save_pretrained(str(root / "student" / "tokenizer"))   # as methods.student_run.save_student
    export(root / "student", root / "export", version=1)
    write_conll(root / "test.txt", toy_ner_sentences(12, seed=7))
    (root / "lines.txt").write_text("john lives in paris\nmary\n", encoding="utf-8")
    return root


def damaged_copy(healthy, where, case) -> Path:
    """A copy of `healthy` at `where` with the case's file damaged; returns the damaged file."""
    shutil.copytree(healthy, where)
    path = where / ("student" if case["artifact"] == "student" else "export/ner/1") / case["file"]
    assert path.is_file()
    if case["damage"] == "delete":
        path.unlink()
    elif case["damage"] == "zero":
        path.write_bytes(b"")
    else:
        assert case["damage"] == "half"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def argv(command, where, case, verbose=False):
    model = where / ("student" if case["artifact"] == "student" else "export/ner")
    args = {"predict": [f"--model={model}", f"--input={where / 'lines.txt'}", f"--output={where / 'out.jsonl'}"],
            "evaluate": [f"--model={model}", f"--data_dir={where}", "--test_file=test.txt"],
            "export": [f"--student_dir={model}", f"--export_dir={where / 'out'}"]}[command]
    return args + (["--verbose"] if verbose else [])


# ----------------------------------------------------------------------------- default tier: the diagnosis

def test_the_corpus_covers_the_three_commands_and_both_artifacts():
    assert {c for case in CASES for c in case["commands"]} == {"predict", "evaluate", "export"}
    assert {(case["artifact"], case["damage"]) for case in CASES} >= {
        ("export", "half"), ("export", "zero"), ("export", "delete"), ("student", "half")}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c['artifact']}-{c['file']}-{c['damage']}" for c in CASES])
def test_find_damage_names_the_damaged_file(healthy, tmp_path, index):
    case = CASES[index]
    assert damage.find_damage(healthy / "student") is None and damage.find_damage(healthy / "export") is None
    path = damaged_copy(healthy, tmp_path / "copy", case)
    artifact = tmp_path / "copy" / ("student" if case["artifact"] == "student" else "export/ner/1")
    found, problem = damage.find_damage(artifact)
    assert found == path
    assert problem.startswith(case["problem"]), problem


def test_a_damaged_export_is_one_line_naming_the_file_and_the_remedy(healthy, tmp_path):
    path = damaged_copy(healthy, tmp_path / "copy", CASES[0])
    with pytest.raises(DamagedArtifact) as info:
        load_serving_fn(tmp_path / "copy" / "export" / "ner")
    assert str(info.value) == (f"{path}: damaged or cut short (Read less bytes than requested); export it again: "
                               "bin/export with --overwrite")
    assert isinstance(info.value.__cause__, IndexError)   # TensorFlow's own error, what --verbose shows


def test_errors_no_damaged_file_explains_and_interrupts_pass_unchanged(healthy):
    with pytest.raises(ValueError, match="^a bug$"):   # every file reads: not damage, a traceback
        with damage.reading(healthy / "student", damage.RETRAIN):
            raise ValueError("a bug")
    with pytest.raises(ConfigError, match="^already one line$"):
        with damage.reading(healthy / "nowhere", damage.RETRAIN):
            raise ConfigError("already one line")
    stop.INTERRUPT.set()   # a Ctrl-C turned into another error on the way: the interrupt, not damage
    try:
        with pytest.raises(TypeError):
            with damage.reading(healthy / "nowhere", damage.RETRAIN):
                raise TypeError("from tf.nest")
    finally:
        stop.reset()


@pytest.mark.parametrize("name", ["manifest.json", "cache_state.json"])
def test_a_damaged_json_of_the_teacher_output_cache_is_one_line_naming_it(tmp_path, name):
    out = tmp_path / "transfer"
    compute = lambda rows: {"x": rows.astype(np.float32)[:, None] * np.ones((1, 3), np.float32)}
    manifest = write_sharded(out, 5, compute, shard_size=2, batch_size=2, fingerprint={"t": 1}, progress=False)
    assert manifest["num_shards"] == 3 and cache_complete(out, {"t": 1})
    if name == "cache_state.json":   # a run stopped after its first shard: the state of a partial cache
        (out / "manifest.json").unlink()
        (out / name).write_text(json.dumps({"identity": {"fingerprint": {"t": 1}}, "features": None}))
    text = (out / name).read_text(encoding="utf-8")
    (out / name).write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(DamagedArtifact) as info:
        write_sharded(out, 5, compute, shard_size=2, batch_size=2, fingerprint={"t": 1}, progress=False)
    assert str(info.value).startswith(f"{out / name}: damaged or cut short ({len(text) // 2} bytes: ")
    assert str(info.value).endswith(f"; delete {out} and rerun the same command (the teacher outputs are computed "
                                    "again)")


@pytest.fixture(scope="module")
def portable_exports(healthy):
    """<root>/ner-onnx and <root>/ner-tflite: the toy student exported for ONNX Runtime and TFLite."""
    root = healthy.parent / "portable"
    for fmt in ("onnx", "tflite"):
        export(healthy / "student", root, fmt=fmt)
    return root


@pytest.mark.slow   # two conversions and four predict.py processes (about a minute); in CI's slow subset
@pytest.mark.parametrize("fmt", ["onnx", "tflite"])
def test_a_damaged_onnx_or_tflite_model_is_one_line_for_bin_evaluate_and_predict_py(portable_exports, tmp_path, fmt):
    """A model.onnx / model.tflite cut short (a copy interrupted, a full disk): bin/evaluate's loader and the
    export's own predict.py name the file and say to export again; the healthy copy serves."""
    copy = tmp_path / f"ner-{fmt}"
    shutil.copytree(portable_exports / f"ner-{fmt}", copy)
    healthy = subprocess.run([sys.executable, str(copy / "predict.py"), str(copy)], input=b"john lives in paris\n",
                             capture_output=True, timeout=300)
    assert healthy.returncode == 0 and len(healthy.stdout.splitlines()) == 1, healthy.stderr[-2000:]
    model = copy / f"model.{fmt}"
    record = json.loads((copy / "export.json").read_text(encoding="utf-8"))["model_file"]
    assert record["bytes"] == model.stat().st_size
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    with pytest.raises(DamagedArtifact) as info:
        evaluate_model(copy, toy_ner_sentences(4, seed=7), "IOB2")
    assert str(info.value) == (f"{model}: cut short or damaged ({record['bytes'] // 2} bytes; export.json records "
                               f"{record['bytes']}); {damage.REEXPORT}")
    served = subprocess.run([sys.executable, str(copy / "predict.py"), str(copy)], input=b"john\n",
                            capture_output=True, timeout=300)
    stderr = served.stderr.decode()
    assert served.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == f"error: {info.value}", stderr
    # The same size, other bytes (a bit flipped on the way): the checksum export.json records finds it.
    shutil.copyfile(portable_exports / f"ner-{fmt}" / f"model.{fmt}", model)
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(DamagedArtifact, match=r"damaged \(its SHA-256 differs from the one export.json records"):
        evaluate_model(copy, toy_ner_sentences(4, seed=7), "IOB2")


# ----------------------------------------------------------------------------- the commands (slow: three processes)

@pytest.fixture(scope="module")
def command_results(healthy, tmp_path_factory):
    """(case index, command) -> (the damaged file, the command's {code, stderr}, where it ran); ("healthy", predict)
    and ("verbose", predict) besides."""
    root = tmp_path_factory.mktemp("damaged_commands")
    runs = {command: [] for command in ("predict", "evaluate", "export")}
    for index, command in PAIRS:
        where = root / f"{index}-{command}"
        runs[command].append(((index, command), damaged_copy(healthy, where, CASES[index]), where,
                              argv(command, where, CASES[index])))
    shutil.copytree(healthy, root / "healthy")
    runs["predict"].append((("healthy", "predict"), None, root / "healthy", argv("predict", root / "healthy", CASES[0])))
    where = root / "verbose"
    runs["predict"].append((("verbose", "predict"), damaged_copy(healthy, where, CASES[0]), where,
                            argv("predict", where, CASES[0], verbose=True)))
    results = {}
    for command, cases in runs.items():
        (root / f"{command}.json").write_text(json.dumps([args for *_, args in cases]), encoding="utf-8")
        subprocess.run([sys.executable, str(REPO / "tests" / "train_cli_driver.py"), str(root / f"{command}.json"),
                        str(root / f"{command}.results.json"), command], env=ENV, check=True, capture_output=True,
                       timeout=600)
        outcome = json.loads((root / f"{command}.results.json").read_text(encoding="utf-8"))
        results.update({key: (path, result, where) for (key, path, where, _), result in zip(cases, outcome)})
    return results


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=[ids(p) for p in PAIRS])
def test_a_damaged_model_file_is_one_error_line_naming_it(command_results, pair):
    path, result, where = command_results[pair]
    case = CASES[pair[0]]
    assert result["code"] == 2, result["stderr"][-3000:]
    line = error_line(result["stderr"])   # the last line, the only `error:` one, no traceback
    assert line.startswith(f"error: {path}: {case['problem']}"), line
    assert line.endswith(f"; {REMEDY[case['artifact']]}")
    assert not (where / "out.jsonl").exists() and not (where / "out").exists()   # nothing written


@pytest.mark.slow
def test_the_healthy_copy_serves_and_verbose_shows_the_traceback(command_results):
    _, healthy_result, where = command_results[("healthy", "predict")]
    assert healthy_result["code"] == 0, healthy_result["stderr"][-3000:]
    assert len((where / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 2
    _, verbose, _ = command_results[("verbose", "predict")]
    assert verbose["code"] == "traceback"   # run_main re-raises under --verbose
    assert "IndexError: Read less bytes than requested" in verbose["stderr"]
    assert "DamagedArtifact: " in verbose["stderr"]
