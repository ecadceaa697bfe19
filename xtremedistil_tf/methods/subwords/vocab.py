"""The student vocabulary: a WordPiece vocabulary of a chosen size learned on the training text.

Learned with Hugging Face `tokenizers` (already pinned for the fast tokenizers the pipeline needs; its
WordPiece trainer is maintained and fast, and the result loads as a BertTokenizerFast, which the NER
pipeline's word alignment needs). The student splits text exactly as the uncased MiniLM/BERT teacher
does before WordPiece (BertNormalizer: lowercase, strip accents, Chinese characters apart;
BertPreTokenizer: whitespace and punctuation), so a "word" is the same unit for both vocabularies and
dual training can pick either segmentation word by word.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, List, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, BertTokenizerFast

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir, atomic_write_json

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def learn_vocab(sentences: Iterable[Sequence[str]], size: int = 5000, min_frequency: int = 1):
    """A `tokenizers.Tokenizer` with a WordPiece vocabulary of `size` pieces (special tokens included)
    learned on `sentences` (lists of words). Raises ConfigError if the text cannot fill `size` pieces."""
    if size < len(SPECIAL_TOKENS) + 1:
        raise ConfigError(f"--vocab_size={size}; expected at least {len(SPECIAL_TOKENS) + 1}")
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=None, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
                                        show_progress=False)
    tokenizer.train_from_iterator((" ".join(words) for words in sentences), trainer=trainer)
    got = tokenizer.get_vocab_size()
    if got != size:
        raise ConfigError(f"the training text yields only {got} WordPieces, fewer than --vocab_size={size}: "
                          "use more text or a smaller vocabulary")
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", tokenizer.token_to_id("[SEP]")),
                                                         ("[CLS]", tokenizer.token_to_id("[CLS]")))
    return tokenizer


def vocab_list(tokenizer) -> List[str]:
    """Pieces in id order (the lines of vocab.txt)."""
    vocab = tokenizer.get_vocab()
    pieces = sorted(vocab, key=vocab.__getitem__)
    if [vocab[p] for p in pieces] != list(range(len(pieces))):
        raise ValueError("vocabulary ids are not 0..n-1")
    return pieces


def save_vocab(tokenizer, directory) -> Path:
    """Write vocab.txt and a BertTokenizerFast (uncased, as the teacher) to `directory`, atomically.

    Returns the directory; `transformers.AutoTokenizer.from_pretrained(directory)` loads it."""
    with atomic_dir(directory) as tmp:
        (tmp / "vocab.txt").write_text("".join(p + "\n" for p in vocab_list(tokenizer)), encoding="utf-8")
        fast = BertTokenizerFast(vocab_file=str(tmp / "vocab.txt"), do_lower_case=True, strip_accents=None,
                                 tokenize_chinese_chars=True)
        fast.save_pretrained(str(tmp))
    return Path(directory)


def load_vocab_tokenizer(directory):
    """The BertTokenizerFast saved by `save_vocab` (or any BERT tokenizer dir, e.g. the teacher's)."""
    if not (Path(directory) / "vocab.txt").exists():
        raise ConfigError(f"{directory} has no vocab.txt (expected a directory written by save_vocab)")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{directory}: expected a fast (BertTokenizerFast) tokenizer")
    return tokenizer


@dataclass
class VocabStats:
    """How the student vocabulary compares with the teacher's on a text."""
    student_size: int
    teacher_size: int
    overlap: int                      # student pieces that are also teacher pieces
    overlap_fraction: float           # overlap / student_size
    words: int
    student_pieces_per_word: float
    teacher_pieces_per_word: float
    student_unk_rate: float           # [UNK] pieces / pieces
    teacher_unk_rate: float

    def as_dict(self) -> dict:
        return asdict(self)


def plain_backend(tokenizer):
    """A copy of a fast tokenizer's `tokenizers.Tokenizer` without padding or truncation (the
    sentence-transformers tokenizer.json of MiniLM pads every encoding to 128)."""
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    backend = Tokenizer.from_str(backend.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


def pieces_per_word(tokenizer, sentences: Sequence[Sequence[str]]):
    """(words, pieces, unk pieces) of `sentences` segmented word by word with a fast tokenizer."""
    backend = plain_backend(tokenizer)
    unk = backend.token_to_id("[UNK]")
    words = pieces = unks = 0
    for enc in backend.encode_batch([list(s) for s in sentences], is_pretokenized=True, add_special_tokens=False):
        words += len({w for w in enc.word_ids if w is not None})
        pieces += len(enc.ids)
        unks += sum(1 for i in enc.ids if i == unk)
    return words, pieces, unks


def vocab_stats(student_tokenizer, teacher_tokenizer, sentences: Sequence[Sequence[str]]) -> VocabStats:
    """Overlap of the two vocabularies and their pieces per word and [UNK] rates on `sentences`."""
    student_vocab = set(student_tokenizer.get_vocab())
    teacher_vocab = set(teacher_tokenizer.get_vocab())
    overlap = len(student_vocab & teacher_vocab)
    words, s_pieces, s_unk = pieces_per_word(student_tokenizer, sentences)
    _, t_pieces, t_unk = pieces_per_word(teacher_tokenizer, sentences)
    return VocabStats(student_size=len(student_vocab), teacher_size=len(teacher_vocab), overlap=overlap,
                      overlap_fraction=overlap / len(student_vocab), words=words,
                      student_pieces_per_word=s_pieces / max(words, 1),
                      teacher_pieces_per_word=t_pieces / max(words, 1),
                      student_unk_rate=s_unk / max(s_pieces, 1), teacher_unk_rate=t_unk / max(t_pieces, 1))


def write_stats(stats: VocabStats, path) -> None:
    atomic_write_json(path, stats.as_dict())
