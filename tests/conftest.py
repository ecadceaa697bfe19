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
