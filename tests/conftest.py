import os
import sys
from pathlib import Path

# Before anything imports TensorFlow (DESIGN.md: Keras 2 through tf-keras, no hub).
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# ../shared/data next to the checkout during development and in CI; absent elsewhere.
SHARED = Path(os.environ.get("XTREMEDISTIL_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"
FIXTURES = SHARED / "fixtures"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (real data lives outside the project)")
    return path


@pytest.fixture
def shared_data():
    return _require(SHARED_DATA)


@pytest.fixture
def fixtures_dir():
    return _require(FIXTURES)


def write_tiny_vocab(directory: Path) -> Path:
    """A WordPiece vocab where short words are whole pieces and longer ones split into
    character continuations, so tests see both single- and multi-piece words."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = ["the", "in", "of", "to", "and", "at", "on", "is", "was", "paris", "berlin", "john", "mary"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "-"] + letters + \
        ["##" + c for c in letters] + words + [str(d) for d in range(10)] + ["##" + str(d) for d in range(10)]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    return write_tiny_vocab(tmp_path_factory.mktemp("tiny_tokenizer"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab_file=str(tiny_tokenizer_dir / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A local BERT dir with the tiny vocab and a 2-layer, hidden-32 config (no weights)."""
    from transformers import BertConfig

    directory = write_tiny_vocab(tmp_path_factory.mktemp("tiny_bert"))
    vocab_size = len((directory / "vocab.txt").read_text(encoding="utf-8").split())
    BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=128).save_pretrained(str(directory))
    return directory


def toy_ner_sentences(n, seed, lang=None):
    """A toy tagging task: names are PER, cities LOC (a following city continues it), the rest O."""
    import numpy as np

    from xtremedistil_tf.data.sentence import Sentence

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


def read_scalars(log_dir) -> dict:
    """{tag: [(step, value), ...]} of every TensorBoard scalar under `log_dir` (event files read
    with TensorFlow's own summary iterator)."""
    import tensorflow as tf

    scalars = {}
    for path in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return scalars
