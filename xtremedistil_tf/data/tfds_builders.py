"""The readers as TensorFlow Datasets builders: TFDS prepares the user's files once as TFRecord shards.

Nothing is downloaded: every builder reads the files the user put in `manual_dir` with our own
readers (`xtremedistil_tf.data.readers`), so the sentences TFDS stores are exactly those the
readers return, in file order (`disable_shuffling`), keyed by their index in the split.

- `xd_msra`: manual_dir holds train_dev.char.bmes and test.char.bmes; splits train, dev (held out
  of train as load_splits does), test; configs `dev<fraction>_seed<seed>`, default `dev0.1_seed0`
  (HOLDOUT_FRACTION and HOLDOUT_SEED of data/demo.py, DataConfig's defaults too).
- `xd_wikiann_rahimi`: `<lang>/{train,dev,test}` (`LANG:TOKEN<TAB>TAG`); the config names the
  languages, `en` or `en+de+fr` (no default).
- `xd_conll`: CoNLL column files `train` and, optionally, `dev` and `test`; without dev, dev is held
  out of train. Config `default` (IOB2, tag last); a ConllConfig for other file names or columns.
- `xd_transfer_text`: `transfer.txt`, one sentence a line; split train, tags empty; configs `words`
  (default) and `chars` (Chinese).
- `xd_hf`: a Hugging Face DatasetDict saved with save_to_disk (`train`, optional `validation` and
  `test`), read by read_hf; without validation, dev is held out of train.
- `xd_spans_jsonl`: `train.jsonl` and, optionally, `dev.jsonl` and `test.jsonl` of text with character
  spans, read by read_spans_jsonl; configs `refuse` (default) and `snap` (--span_alignment).

Features: `tokens` (Sequence(Text)), `tags` (Sequence(Text), empty for unlabeled text), `lang`
(Text, "" for none). `prepare` prepares a builder from manual_dir once; `load_tfds_splits` reads a
prepared NER builder's splits back as `list[Sentence]` (`--data_source`). See docs/data.md "TFDS builders".

Prepared data is reused as it is (TFDS's rule). Because a user's files can change under the same
name, each builder records a fingerprint (size and sha256) of the files it read in the dataset's
metadata, and `prepare` refuses prepared data whose fingerprint differs unless `overwrite=True`.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import tensorflow_datasets as tfds

from xtremedistil_tf.data.demo import HOLDOUT_FRACTION, HOLDOUT_SEED, holdout_split
from xtremedistil_tf.data.readers import (
    read_char_bmes,
    read_conll,
    read_dataset,
    read_unlabeled,
    read_wikiann,
    reader_kwargs,
)
from xtremedistil_tf.data.sentence import Sentence
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import file_sha256

PathLike = Union[str, Path]
VERSION = tfds.core.Version("1.0.0")
_RELEASE_NOTES = {"1.0.0": "First release: the user's files read by xtremedistil_tf's readers."}
_FINGERPRINT_KEY = "source_files"


# ---------------------------------------------------------------- examples

def sentence_to_example(sentence: Sentence) -> dict:
    """A Sentence as a TFDS example: empty tags for unlabeled text, "" for no language."""
    return {"tokens": list(sentence.tokens), "tags": list(sentence.tags or ()), "lang": sentence.lang or ""}


def _fingerprint(paths: Sequence[Path], root: Path) -> Dict[str, str]:
    """{path relative to manual_dir: "<size>:<sha256>"} of the files a builder reads."""
    prints = {}
    for path in (p for p in paths if p.is_file()):  # the reader reports a missing file
        prints[path.relative_to(root).as_posix()] = f"{path.stat().st_size}:{file_sha256(path)}"
    return prints


# ---------------------------------------------------------------- the shared builder

@dataclasses.dataclass(eq=False)
class ReaderConfig(tfds.core.BuilderConfig):
    """Reader options every builder passes on. `scheme` None: the reader's own default."""

    scheme: Optional[str] = None
    strict_tags: bool = False


class _ReaderBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A GeneratorBasedBuilder whose splits are lists of Sentence read from manual_dir.

    Subclasses define `_split_readers(manual_dir) -> {split: () -> list[Sentence]}`, the files they
    read (`_source_files`) and, optionally, `_config_from_name` for config names made on demand.
    """

    VERSION = VERSION
    RELEASE_NOTES = _RELEASE_NOTES
    LABELED = True

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=(self.__doc__ or "").strip(),
            features=tfds.features.FeaturesDict({
                "tokens": tfds.features.Sequence(tfds.features.Text()),
                "tags": tfds.features.Sequence(tfds.features.Text()),
                "lang": tfds.features.Text(),
            }),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,  # keep the file order, as the plain readers do
        )

    @classmethod
    def _config_from_name(cls, name: str) -> Optional[tfds.core.BuilderConfig]:
        return None

    def _create_builder_config(self, builder_config, version):
        # Config names such as "en+de" or "dev0.2_seed3" stand for configs made on demand.
        if isinstance(builder_config, str):
            name = builder_config.partition(":")[0]
            if name not in self.builder_configs:
                made = self._config_from_name(name)
                if made is None:
                    raise ConfigError(f"{self.name}: unknown config {name!r}; expected "
                                      f"{self._config_help()}")
                builder_config = made
        return super()._create_builder_config(builder_config, version)

    @classmethod
    def _config_help(cls) -> str:
        return "one of " + ", ".join(cls.builder_configs) if cls.BUILDER_CONFIGS else "a config"

    def _reader_kwargs(self) -> dict:
        config = self.builder_config
        kwargs = {"strict_tags": config.strict_tags}
        if config.scheme:
            kwargs["scheme"] = config.scheme
        return kwargs

    def _source_files(self, manual_dir: Path) -> List[Path]:
        """The user's files a prepared dataset is made from (their fingerprint guards reuse).
        Every builder below defines it; this base is never registered."""
        raise NotImplementedError

    def _split_readers(self, manual_dir: Path) -> Dict[str, Callable[[], List[Sentence]]]:
        """{split: a function reading that split with our readers}; defined by every builder below."""
        raise NotImplementedError

    def _split_generators(self, dl_manager):
        manual_dir = Path(dl_manager.manual_dir)
        self.info.metadata[_FINGERPRINT_KEY] = _fingerprint(self._source_files(manual_dir), manual_dir)
        return {split: self._generate_examples(read) for split, read in self._split_readers(manual_dir).items()}

    def _generate_examples(self, read: Callable[[], List[Sentence]]) -> Iterator[tuple[int, dict]]:
        for index, sentence in enumerate(read()):
            yield index, sentence_to_example(sentence)


def _held_out(read_train: Callable[[], List[Sentence]], config) -> Dict[str, Callable[[], List[Sentence]]]:
    """Readers of train and dev = holdout_split(train, config.dev_fraction, config.seed), reading train once."""
    parts: list = []

    def part(index: int) -> List[Sentence]:
        if not parts:
            parts.extend(holdout_split(read_train(), config.dev_fraction, config.seed))
        return parts[index]

    return {"train": lambda: part(0), "dev": lambda: part(1)}


# ---------------------------------------------------------------- MSRA

@dataclasses.dataclass(eq=False)
class MsraConfig(ReaderConfig):
    dev_fraction: float = HOLDOUT_FRACTION
    seed: int = HOLDOUT_SEED


def msra_config(dev_fraction: float = HOLDOUT_FRACTION, seed: int = HOLDOUT_SEED) -> MsraConfig:
    """The config named `dev<fraction>_seed<seed>`: train/dev as holdout_split(train, dev_fraction, seed)."""
    return MsraConfig(name=f"dev{dev_fraction:g}_seed{seed}", dev_fraction=dev_fraction, seed=seed,
                      description=f"dev = holdout_split(train_dev, {dev_fraction:g}, seed={seed})")


_MSRA_NAME = re.compile(r"dev(\d*\.?\d+(?:e-?\d+)?)_seed(\d+)")


class XdMsra(_ReaderBuilder):
    """MSRA Chinese NER (character level, BMES) from the user's train_dev.char.bmes and test.char.bmes.

    MSRA has no dev split: dev is held out of train_dev with holdout_split(dev_fraction, seed), the
    same split load_splits makes with --data_format=char_bmes and no --dev_file.
    """

    name = "xd_msra"
    TRAIN, TEST = "train_dev.char.bmes", "test.char.bmes"
    MANUAL_DOWNLOAD_INSTRUCTIONS = (f"Put MSRA's `{TRAIN}` and `{TEST}` (CHAR TAG per line, BMES, blank line "
                                    "between sentences) in manual_dir.")
    BUILDER_CONFIGS = [msra_config()]

    @classmethod
    def _config_from_name(cls, name):
        match = _MSRA_NAME.fullmatch(name)
        return msra_config(float(match.group(1)), int(match.group(2))) if match else None

    @classmethod
    def _config_help(cls) -> str:
        return "dev<fraction>_seed<seed>, e.g. dev0.1_seed0"

    def _source_files(self, manual_dir):
        return [manual_dir / self.TRAIN, manual_dir / self.TEST]

    def _split_readers(self, manual_dir):
        config, kwargs = self.builder_config, self._reader_kwargs()
        readers = _held_out(lambda: read_char_bmes(manual_dir / self.TRAIN, **kwargs), config)
        readers["test"] = lambda: read_char_bmes(manual_dir / self.TEST, **kwargs)
        return readers


# ---------------------------------------------------------------- WikiAnn, Rahimi split

@dataclasses.dataclass(eq=False)
class WikiannConfig(ReaderConfig):
    langs: tuple = ()


def wikiann_config(langs: Sequence[str]) -> WikiannConfig:
    """The config named "en+de" for langs ["en", "de"]: each split reads <lang>/<split> in that order."""
    if not langs:
        raise ConfigError("xd_wikiann_rahimi needs at least one language, e.g. 'xd_wikiann_rahimi/en'")
    return WikiannConfig(name="+".join(langs), langs=tuple(langs), description=f"WikiAnn {', '.join(langs)}")


class XdWikiannRahimi(_ReaderBuilder):
    """WikiAnn NER in the Rahimi et al. (2019) train/dev/test split, from the user's language folders.

    The config names the languages (`xd_wikiann_rahimi/en`, `xd_wikiann_rahimi/en+de`); each split
    holds the languages' sentences in that order, as read_wikiann_dirs and load_splits give them.
    """

    name = "xd_wikiann_rahimi"
    SPLITS = ("train", "dev", "test")
    MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put one folder per language in manual_dir, each with the files `train`, `dev` "
                                    "and `test` (`LANG:TOKEN<TAB>TAG` per line, blank line between sentences).")

    @classmethod
    def _config_from_name(cls, name):
        return wikiann_config(name.split("+"))

    @classmethod
    def _config_help(cls) -> str:
        return "languages joined by '+', e.g. en or en+de"

    def _langs(self) -> tuple:
        if self.builder_config is None:
            raise ConfigError(f"{self.name} needs languages as its config, "
                              f"e.g. '{self.name}/en' or '{self.name}/en+de'")
        return self.builder_config.langs

    def _source_files(self, manual_dir):
        return [manual_dir / lang / split for lang in self._langs() for split in self.SPLITS]

    def _split_readers(self, manual_dir):
        kwargs = self._reader_kwargs()

        def read(split: str) -> List[Sentence]:
            return [s for lang in self._langs() for s in read_wikiann(manual_dir / lang / split, lang=lang, **kwargs)]

        return {split: (lambda split=split: read(split)) for split in self.SPLITS}


# ---------------------------------------------------------------- CoNLL columns

def split_files(manual_dir: Path, config) -> Dict[str, Path]:
    """{split: path} of a config's train_file (required), dev_file and test_file (those present) in manual_dir."""
    files = {"train": manual_dir / config.train_file}
    for split, name in (("dev", config.dev_file), ("test", config.test_file)):
        if name and (manual_dir / name).exists():
            files[split] = manual_dir / name
    return files


@dataclasses.dataclass(eq=False)
class ConllConfig(ReaderConfig):
    train_file: str = "train"
    dev_file: str = "dev"
    test_file: str = "test"
    tag_column: int = -1
    token_column: int = 0
    lang: Optional[str] = None
    dev_fraction: float = HOLDOUT_FRACTION  # used when manual_dir has no dev file
    seed: int = HOLDOUT_SEED


class XdConll(_ReaderBuilder):
    """CoNLL column files (token first, tag last, blank line between sentences) from manual_dir.

    Splits are the files present: train (required), dev and test. Without a dev file, dev is held
    out of train with holdout_split(dev_fraction, seed), as load_splits does without --dev_file.
    Other file names or columns: pass a ConllConfig with its own name as the builder's config.
    """

    name = "xd_conll"
    MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put CoNLL column files named `train`, `dev` (optional) and `test` (optional) in "
                                    "manual_dir, or name yours in a ConllConfig.")
    BUILDER_CONFIGS = [ConllConfig(name="default", description="train/dev/test, IOB2, tag in the last column")]

    def _files(self, manual_dir: Path) -> Dict[str, Path]:
        return split_files(manual_dir, self.builder_config)

    def _source_files(self, manual_dir):
        return list(self._files(manual_dir).values())

    def _split_readers(self, manual_dir):
        config = self.builder_config
        files = self._files(manual_dir)
        kwargs = dict(self._reader_kwargs(), tag_column=config.tag_column, token_column=config.token_column,
                      lang=config.lang)
        readers = {split: (lambda path=path: read_conll(path, **kwargs)) for split, path in files.items()}
        if "dev" not in files:
            readers.update(_held_out(readers["train"], config))
        return readers


# ---------------------------------------------------------------- plain-text transfer sets

@dataclasses.dataclass(eq=False)
class TransferTextConfig(tfds.core.BuilderConfig):
    file: str = "transfer.txt"
    char_level: bool = False
    lang: Optional[str] = None


class XdTransferText(_ReaderBuilder):
    """Unlabeled transfer sentences, one a line, from manual_dir/transfer.txt: one split, train, tags empty.

    Config `words` splits lines on whitespace; `chars` takes the non-space characters (Chinese),
    as read_unlabeled(char_level=...) and --transfer_char_level do.
    """

    name = "xd_transfer_text"
    LABELED = False
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Put the unlabeled sentences, one per line, in manual_dir/transfer.txt."
    BUILDER_CONFIGS = [TransferTextConfig(name="words", description="whitespace-separated words"),
                       TransferTextConfig(name="chars", char_level=True, description="non-space characters")]

    def _source_files(self, manual_dir):
        return [manual_dir / self.builder_config.file]

    def _split_readers(self, manual_dir):
        config = self.builder_config
        return {"train": lambda: read_unlabeled(manual_dir / config.file, char_level=config.char_level,
                                                lang=config.lang)}


# ---------------------------------------------------------------- Hugging Face datasets, text with character spans

@dataclasses.dataclass(eq=False)
class SplitFilesConfig(ReaderConfig):
    train_file: str = "train"
    dev_file: str = "dev"
    test_file: str = "test"
    span_alignment: str = "refuse"          # xd_spans_jsonl
    dev_fraction: float = HOLDOUT_FRACTION  # used when manual_dir has no dev file
    seed: int = HOLDOUT_SEED


class _SplitFilesBuilder(_ReaderBuilder):
    """train (required), dev and test files (or save_to_disk folders) in manual_dir, read by the reader of
    --data_format=FORMAT with the options bin/train gives it (readers.reader_kwargs); without dev, dev is held out
    of train with holdout_split(dev_fraction, seed), as load_splits does without --dev_file."""

    FORMAT = ""

    def _files(self, manual_dir: Path) -> Dict[str, Path]:
        return split_files(manual_dir, self.builder_config)

    def _source_files(self, manual_dir):
        # A save_to_disk folder: the files in it.
        return [f for path in self._files(manual_dir).values()
                for f in (sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])]

    def _split_readers(self, manual_dir):
        config = self.builder_config
        files = self._files(manual_dir)

        def read(path: Path, split: str) -> List[Sentence]:
            return read_dataset(self.FORMAT, path, **reader_kwargs(self.FORMAT, config.scheme or "IOB2",
                                                                   config.strict_tags, split, config.span_alignment))

        readers = {split: (lambda path=path, split=split: read(path, split)) for split, path in files.items()}
        if "dev" not in files:
            readers.update(_held_out(readers["train"], config))
        return readers


class XdHf(_SplitFilesBuilder):
    """A Hugging Face token-classification DatasetDict saved with save_to_disk in manual_dir: its train, validation
    (dev) and test folders, read by read_hf (tokens, ner_tags named by their ClassLabel feature)."""

    name = "xd_hf"
    FORMAT = "hf"
    MANUAL_DOWNLOAD_INSTRUCTIONS = ("Save the DatasetDict into manual_dir with save_to_disk (folders `train`, and "
                                    "optionally `validation` and `test`).")
    BUILDER_CONFIGS = [SplitFilesConfig(name="default", dev_file="validation",
                                        description="train/validation/test folders of a DatasetDict")]


class XdSpansJsonl(_SplitFilesBuilder):
    """Text with character-offset entity spans (doccano, Label Studio, Prodigy, spaCy JSON lines) in manual_dir's
    train.jsonl, dev.jsonl and test.jsonl, read by read_spans_jsonl: words of the served split, IOB2 tags."""

    name = "xd_spans_jsonl"
    FORMAT = "spans_jsonl"
    MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put `train.jsonl` and, optionally, `dev.jsonl` and `test.jsonl` (a JSON object "
                                    "a line: text and its entities as [start, end, label]) in manual_dir.")
    BUILDER_CONFIGS = [SplitFilesConfig(name=alignment, train_file="train.jsonl", dev_file="dev.jsonl",
                                        test_file="test.jsonl", span_alignment=alignment,
                                        description=f"spans that cut a word: {alignment}")
                       for alignment in ("refuse", "snap")]


BUILDERS = {cls.name: cls for cls in (XdMsra, XdWikiannRahimi, XdConll, XdTransferText, XdHf, XdSpansJsonl)}


# ---------------------------------------------------------------- preparing and loading

def _builder(name: str, data_dir: PathLike, config: Union[None, str, tfds.core.BuilderConfig]):
    """Our builder `name` ("xd_msra" or "xd_msra/dev0.1_seed0") under data_dir."""
    base, _, config_name = name.partition("/")
    if base not in BUILDERS:
        raise ConfigError(f"unknown TFDS builder {base!r}; expected one of {', '.join(BUILDERS)}")
    if config_name and config is not None:
        raise ConfigError(f"{name!r} names a config and config={config!r} another; give one")
    return BUILDERS[base](data_dir=str(data_dir), config=config_name or config)


def prepare(name: str, manual_dir: PathLike, data_dir: PathLike,
            config: Union[None, str, tfds.core.BuilderConfig] = None,
            overwrite: bool = False, num_shards: Optional[int] = None) -> tfds.core.DatasetBuilder:
    """Prepare builder `name` from the files in `manual_dir` into `data_dir` (once) and return it.

    Prepared data is reused when the files in manual_dir are those it was made from; other files
    (a changed fingerprint) raise ConfigError unless `overwrite=True`, which prepares them anew.
    `num_shards` fixes the TFRecord shard count (for sharding across more workers than TFDS's
    size-based default of one shard for small data).
    """
    manual_dir = Path(manual_dir)
    if not manual_dir.is_dir():
        raise ConfigError(f"manual_dir {manual_dir} is not a directory")
    builder = _builder(name, data_dir, config)
    mode = tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS
    if builder.is_prepared():
        current = _fingerprint(builder._source_files(manual_dir), manual_dir)
        if dict(builder.info.metadata.get(_FINGERPRINT_KEY, {})) != current:
            if not overwrite:
                raise ConfigError(f"{builder.data_dir} was prepared from other files than those now in {manual_dir}; "
                                  "remove it or prepare with overwrite=True")
            mode = tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS  # regenerate the dataset
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=str(manual_dir), download_mode=mode, num_shards=num_shards))
    return builder


# ---------------------------------------------------------------- TFDS's own builders (--data_source)

TFDS_PREFIX = "tfds:"
# Our split -> the names TFDS builders give it (wikiann: validation; conll2003: dev).
TFDS_SPLITS = {"train": ("train",), "dev": ("validation", "dev"), "test": ("test",)}
# The tag feature of a TFDS NER builder (wikiann: tags; conll2003: ner; ours: tags).
TAG_FEATURES = ("tags", "ner")


def parse_data_source(source: str) -> str:
    """"tfds:<name>[/<config>]" -> "<name>[/<config>]", or a ConfigError saying what is expected."""
    spec = source[len(TFDS_PREFIX):] if source.startswith(TFDS_PREFIX) else ""
    if not re.fullmatch(r"[a-z0-9_]+(/[\w.+-]+)?(:[\d.]+)?", spec):
        raise ConfigError(f"--data_source={source!r}; expected tfds:<dataset>[/<config>], e.g. tfds:wikiann/en or "
                          "tfds:conll2003")
    return spec


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"


def tfds_builder(source: str, data_dir: Optional[PathLike] = None, manual_dir: Optional[PathLike] = None):
    """TFDS's builder for `--data_source=tfds:<name>/<config>`, prepared (downloaded on first use;
    `manual_dir` for builders that read local files, ours included). Any failure to have the
    dataset -- an unknown name, no network, a refused download -- is one ConfigError line."""
    spec = parse_data_source(source)
    try:
        builder = tfds.builder(spec, data_dir=None if data_dir is None else str(data_dir))
    except Exception as e:  # noqa: BLE001  (TFDS raises several types for a name it cannot build)
        raise ConfigError(f"--data_source={source}: TFDS cannot build {spec!r} ({_one_line(e)})") from None
    config = tfds.download.DownloadConfig(manual_dir=None if manual_dir is None else str(manual_dir))
    try:
        builder.download_and_prepare(download_config=config)
    except Exception as e:  # noqa: BLE001  (network, checksum and manual-dir errors alike)
        raise ConfigError(f"--data_source={source}: the dataset could not be downloaded or prepared "
                          f"({_one_line(e)}); without internet read local files with --data_format "
                          "(docs/data.md)") from None
    return builder


def tfds_split_sentences(builder, split: str) -> List[Sentence]:
    """A split of a prepared NER builder as Sentences: `tokens`, tags from `tags` or `ner`
    (ClassLabel ids -> their names, or text), the language from `langs` (wikiann) or `lang`."""
    features = builder.info.features
    tag_key = next((k for k in TAG_FEATURES if k in features), None)
    if "tokens" not in features or tag_key is None:
        raise ConfigError(f"TFDS dataset {builder.name} has features {sorted(features)}; --data_source needs "
                          f"tokens and one of {TAG_FEATURES}")
    names = getattr(features[tag_key].feature, "names", None)
    sentences = []
    for index, example in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
        tags = [names[int(t)] if names else t.decode("utf-8") for t in example[tag_key]]
        if len(tags) != len(example["tokens"]):
            raise ConfigError(f"TFDS {builder.name} split {split} example {index}: {len(example['tokens'])} tokens "
                              f"but {len(tags)} {tag_key}; expected one tag per token")
        langs = example.get("langs")
        lang = langs[0].decode("utf-8") if langs is not None and len(langs) else \
            (example["lang"].decode("utf-8") or None) if "lang" in example else None
        sentences.append(Sentence([t.decode("utf-8") for t in example["tokens"]], tags, lang))
    return sentences


def load_tfds_splits(source: str, data_dir: Optional[PathLike] = None,
                     manual_dir: Optional[PathLike] = None) -> Dict[str, List[Sentence]]:
    """{"train", "dev", "test": sentences} of `--data_source=tfds:...`; a split the dataset lacks
    is empty (load_splits holds dev out of train then)."""
    builder = tfds_builder(source, data_dir, manual_dir)
    # A builder without recorded splits (tfds.testing.mock_data's) is read by the first names.
    have = set(builder.info.splits) or {theirs[0] for theirs in TFDS_SPLITS.values()}
    splits = {}
    for ours, theirs in TFDS_SPLITS.items():
        name = next((n for n in theirs if n in have), None)
        splits[ours] = tfds_split_sentences(builder, name) if name else []
    if not splits["train"]:
        raise ConfigError(f"--data_source={source}: the dataset has no train split (it has {sorted(have)})")
    return splits
