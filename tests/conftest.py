import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path

# Before anything imports TensorFlow: Keras 2 through tf-keras (docs/architecture.md, "The stack"), no model hub.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest  # noqa: E402
import tensorflow as tf
from transformers import BertConfig, BertTokenizerFast
from xdist.scheduler import LoadFileScheduling

from xtremedistil_tf.crf.layer import CRF
from xtremedistil_tf.data.alignment import TagVocab, encode
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.io import atomic_write_text
from xtremedistil_tf.students.artifact import StudentMeta, write_student_dir
from xtremedistil_tf.students.models import build_bilstm_student

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# ../shared/data next to the checkout during development and in CI; absent elsewhere.
SHARED = Path(os.environ.get("XTREMEDISTIL_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"
# Reference outputs the project ships (tests/fixtures/README.md says what and from where).
FIXTURES = REPO / "tests" / "fixtures"


# bin/train's flags are parsed in a subprocess: a pytest worker may already hold another command's
# flags of the same names (absl keeps one registry per process).
_TRAIN_CONFIGS = """
import json, sys
import xtremedistil_tf
from absl import flags
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.cli import train as cli
from xtremedistil_tf.errors import ConfigError
out = []
for argv in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", *argv])
    try:
        cfg = cli.config_from_flags()
        out.append(json.loads(json.dumps(eval(sys.argv[2]), default=str)))
    except ConfigError as e:
        out.append({"error": str(e)})
print(json.dumps(out))
"""


def train_configs(argv_lists, of: str) -> list:
    """What bin/train makes of each argument list: the JSON of the expression `of` over its
    RunConfig `cfg` (and `pipeline`), or {"error": message}."""
    result = subprocess.run([sys.executable, "-c", _TRAIN_CONFIGS, json.dumps(argv_lists), of], capture_output=True,
                            text=True, cwd=str(REPO), timeout=300,
                            env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


# `--dist loadfile` (make test) hands the files out in order of their number of tests, so a slow
# file of few tests would start last and run alone at the end. These go first, slowest first
# (CPU time of one `make test`; test_pipeline.py's module run is its largest fixture since its formats
# table moved to the slow tier); the rest follow in xdist's order.
SLOW_FILES_FIRST = ("test_pipeline.py",)


class _SlowFilesFirst(OrderedDict):
    """xdist's queue of files (scope -> tests); popitem(last=False) gives the next file to a worker."""

    def popitem(self, last=True):
        slow = [scope for scope in self if Path(scope).name in SLOW_FILES_FIRST]
        if last or not slow:
            return super().popitem(last)
        scope = min(slow, key=lambda s: SLOW_FILES_FIRST.index(Path(s).name))
        return scope, self.pop(scope)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None

    scheduler = LoadFileScheduling(config, log)
    scheduler.workqueue = _SlowFilesFirst()
    return scheduler


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (real data lives outside the project)")
    return path


@pytest.fixture
def shared_data():
    return _require(SHARED_DATA)


@pytest.fixture
def fixtures_dir():
    return FIXTURES


def write_tiny_vocab(directory: Path) -> Path:
    """A WordPiece vocab where short words are whole pieces and longer ones split into
    character continuations, so tests see both single- and multi-piece words."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = ["the", "in", "of", "to", "and", "at", "on", "is", "was", "paris", "berlin", "john", "mary"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "-"] + letters + \
        ["##" + c for c in letters] + words + [str(d) for d in range(10)] + ["##" + str(d) for d in range(10)]
    # Atomic, with a temporary file of this process's own: the two worker processes of a multi-worker test write
    # the same file at once, and a plain write_text let one read it truncated (WordPiece: "Missing [UNK] token").
    atomic_write_text(directory / "vocab.txt", "\n".join(vocab) + "\n", own_tmp=True)
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    return write_tiny_vocab(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    return BertTokenizerFast(vocab_file=str(tiny_tokenizer_dir / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A local BERT dir with the tiny vocab and a 2-layer, hidden-32 config (no weights)."""
    directory = write_tiny_vocab(tmp_path_factory.mktemp("tiny_bert"))
    vocab_size = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=128).save_pretrained(str(directory))
    return directory


def toy_ner_sentences(n, seed, lang=None):
    """A toy tagging task: names are PER, cities LOC (a following city continues it), the rest O."""
    rng = np.random.default_rng(seed)
    fillers = ["the", "in", "of", "to", "and", "at", "on", "is", "was"]
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(int(rng.integers(3, 9))):
            r = rng.random()
            if r < 0.2:
                tokens.append(str(rng.choice(["john", "mary"])))
                tags.append("B-PER")
            elif r < 0.4:
                tokens.append(str(rng.choice(["paris", "berlin"])))
                tags.append("I-LOC" if tags and tags[-1] in ("B-LOC", "I-LOC") else "B-LOC")
            else:
                tokens.append(str(rng.choice(fillers)))
                tags.append("O")
        sentences.append(Sentence(tokens, tags, lang))
    return sentences


TOY_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def toy_student_model(tokenizer):
    """The untrained tiny BiLSTM student (E = H = 16) of train_toy_student."""
    return build_bilstm_student(tokenizer.vocab_size, len(TagVocab(TOY_LABELS)), embedding_dim=16, hidden=16,
                                teacher_hidden=8, dropout=0.0)


def train_toy_student(tokenizer):
    """A tiny BiLSTM student (E = H = 16) trained for a few epochs on the toy task (names PER,
    cities LOC): what the export tests serve."""
    tf.keras.utils.set_random_seed(0)
    windows = encode(toy_ner_sentences(300, seed=1), tokenizer, TagVocab(TOY_LABELS), max_seq_length=16)
    model = toy_student_model(tokenizer)
    model.compile(tf.keras.optimizers.Adam(0.02), loss={"probs": tf.keras.losses.SparseCategoricalCrossentropy()})
    model.fit({"input_ids": windows.input_ids, "attention_mask": windows.attention_mask},
              {"probs": windows.label_ids}, sample_weight={"probs": windows.attention_mask},
              epochs=4, batch_size=32, verbose=0)
    return model


def built_once(tmp_path_factory, name: str, build) -> Path:
    """<run's temp dir>/<name>, written by `build(path)` once per test run and shared by the
    pytest-xdist workers (their temp dirs have one parent; a lock makes the others wait for the
    first). Read it, never write into it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    target = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / f"{name}.done").exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            (root / f"{name}.done").touch()
    return target


@pytest.fixture(scope="session")
def toy_student_dir(tmp_path_factory, tiny_tokenizer, tiny_tokenizer_dir):
    """train_toy_student's student, trained and saved (write_student_dir) once per test run; its
    trained weights beside it in ../weights.npz (see toy_student)."""
    def build(path):
        model = train_toy_student(tiny_tokenizer)
        write_student_dir(model, path / "student", StudentMeta(TOY_LABELS), tiny_tokenizer_dir / "vocab.txt")
        np.savez(path / "weights.npz", *model.get_weights())

    return built_once(tmp_path_factory, "toy_student", build) / "student"


@pytest.fixture(scope="session")
def toy_student(toy_student_dir, tiny_tokenizer):
    """(the trained toy student as a Keras model, its student dir): the model is rebuilt with the
    trained weights, not loaded from the dir, so it is a reference independent of write_student_dir."""
    model = toy_student_model(tiny_tokenizer)
    with np.load(toy_student_dir.parent / "weights.npz") as weights:
        model.set_weights([weights[f"arr_{i}"] for i in range(len(weights.files))])
    return model, toy_student_dir


def sticky_crf_student(tokenizer):
    """A random tiny BiLSTM-CRF student (E = H = 8) whose transitions are sticky (10 on the diagonal), so
    Viterbi keeps one tag along a sequence where the argmax of the emissions would not."""
    tags = len(TagVocab(TOY_LABELS))
    tf.keras.utils.set_random_seed(2)
    base = build_bilstm_student(tokenizer.vocab_size, tags, embedding_dim=8, hidden=8, teacher_hidden=8, dropout=0.0)
    crf = CRF(tags, name="crf")
    potentials = crf(base.output["logits"], mask=base.get_layer("sequence_mask").output)
    model = tf.keras.Model(base.inputs, {**base.output, "potentials": potentials})
    crf.raw_transitions.assign(10.0 * np.eye(tags, dtype=np.float32))
    return model


def o_iper_student(tokenizer, seed=5):
    """An untrained tiny BiLSTM student (E = H = 8) whose softmax favours O and I-PER, so its argmax often
    reads I-PER after O: constrained decoding has something to fix."""
    vocab = TagVocab(TOY_LABELS)
    tf.keras.utils.set_random_seed(seed)
    model = build_bilstm_student(tokenizer.vocab_size, len(vocab), embedding_dim=8, hidden=8, teacher_hidden=8,
                                 dropout=0.0)
    softmax = model.get_layer("softmax")
    weights = softmax.get_weights()[0]
    weights[:, [vocab.id("O"), vocab.id("I-PER")]] += 0.4
    softmax.set_weights([weights])
    return model


def _long_toy_text(min_chars=2000):
    rng = np.random.default_rng(3)
    words = ["john", "mary", "paris", "berlin", "the", "in", "at", "johnson", "xyz", "."]
    text = ""
    while len(text) < min_chars:
        text += str(rng.choice(words)) + " "
    return text.strip()


# Texts the export tests serve: an empty one, non-ASCII before entities, CJK, and one of 2,000+ characters.
EXPORT_TEXTS = ["john was in paris .", "", "Москва : john and mary at berlin paris", "中国 , mary in berlin",
                _long_toy_text()]


def read_scalars(log_dir) -> dict:
    """{tag: [(step, value), ...]} of every TensorBoard scalar under `log_dir` (event files read
    with TensorFlow's own summary iterator)."""
    scalars = {}
    for path in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return scalars


FILLERS = ["the", "in", "of", "to", "and", "at", "on", "is", "was"]


def toy_texts(n, seed):
    """A toy task: 'people' when the text names a person and no city, 'places' for a city and no
    person, 'none' for neither; the class depends on words anywhere in the text. Lines of a
    label TSV: "<label>\t<text>"."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        label = str(rng.choice(["people", "places", "none"]))
        words = [str(w) for w in rng.choice(FILLERS, int(rng.integers(3, 8)))]
        if label != "none":
            key = rng.choice(["john", "mary"] if label == "people" else ["paris", "berlin"])
            words.insert(int(rng.integers(0, len(words) + 1)), str(key))
        lines.append(f"{label}\t{' '.join(words)}")
    return lines


@contextlib.contextmanager
def stderr_line_of(proc, prefix: bytes, limit_s: float = 300):
    """Yield the first line of `proc`'s stderr that starts with `prefix` (b"" if none came). The
    process is killed after `limit_s` (so a blocked command never hangs the suite: its stderr then
    ends) and on leaving, if it is still running."""
    timer = threading.Timer(limit_s, proc.kill)
    timer.start()
    line = b""
    try:
        for line in iter(proc.stderr.readline, b""):
            if line.startswith(prefix):
                break
        yield line.decode().rstrip("\n")
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
