"""--transfer_augment (data/augment.py): entity-swap variants of the labeled train sentences as unlabeled text."""
from dataclasses import replace

import pytest

from xtremedistil_tf.data.augment import entity_swaps, mentions_by_type
from xtremedistil_tf.data.loading import DataConfig, load_splits
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError

TRAIN = [Sentence(("John", "Smith", "flew", "to", "Paris"), ("B-PER", "I-PER", "O", "O", "B-LOC")),
         Sentence(("no", "names", "here"), ("O", "O", "O")),
         Sentence(("Mary", "met", "Ann", "in", "New", "York", "."), ("B-PER", "O", "B-PER", "O", "B-LOC", "I-LOC", "O"))]


def test_each_mention_is_swapped_for_one_of_its_type_and_the_rest_kept():
    assert mentions_by_type(TRAIN, "IOB2") == {"PER": [("John", "Smith"), ("Mary",), ("Ann",)],
                                               "LOC": [("Paris",), ("New", "York")]}
    out = entity_swaps(TRAIN, 40, "IOB2", seed=3)
    assert len(out) == 80 and all(s.tags is None for s in out)   # the sentence without names gives none
    people, places = {"John Smith", "Mary", "Ann"}, {"Paris", "New York"}
    seen = set()
    for variant in out[:40]:   # "<PER> flew to <LOC>"
        text = " ".join(variant.tokens)
        person, place = text.split(" flew to ")
        assert person in people and place in places
        seen.add((person, place))
    assert len(seen) == 6   # every pairing drawn: the draws are not stuck on the original
    for variant in out[40:]:   # "<PER> met <PER> in <LOC> ."
        first, rest = " ".join(variant.tokens).split(" met ")
        second, rest = rest.split(" in ")
        assert first in people and second in people and rest[:-2] in places and rest.endswith(" .")
    assert entity_swaps(TRAIN, 40, "IOB2", seed=3) == out and entity_swaps(TRAIN, 40, "IOB2", seed=4) != out


def test_the_variants_join_the_transfer_set(tmp_path):
    (tmp_path / "train.txt").write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n"
                                                for s in TRAIN * 4), encoding="utf-8")
    cfg = DataConfig(format="conll", data_dir=str(tmp_path), train_file="train.txt", dev_fraction=0.25,
                     word_split="none")
    assert load_splits(cfg)["transfer"] == []
    splits = load_splits(replace(cfg, transfer_augment=2))
    with_names = [s for s in splits["train"] if any(t != "O" for t in s.tags)]
    assert len(splits["transfer"]) == 2 * len(with_names) > 0
    assert "transfer_augment" not in cfg.to_dict() and replace(cfg, transfer_augment=2).to_dict()["transfer_augment"] == 2
    with pytest.raises(ConfigError, match=r"--transfer_augment=-1; expected 0 \(none\) or a positive number"):
        load_splits(replace(cfg, transfer_augment=-1))
