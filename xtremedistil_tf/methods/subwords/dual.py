"""Word-level segmentation with two vocabularies and the masked-LM batches of dual training.

Both tokenizers share the teacher's normalisation and pre-tokenisation (vocab.py), so every input word
maps to pieces of either vocabulary. The student always reads the student segmentation. The teacher
reads each word in the student segmentation with probability p and in its own otherwise (paper 3.2);
`t_is_student` marks which embedding table (and, at masked positions, which softmax) each teacher
position uses. Masking is by whole word and shared by the two models, so both predict the same words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from xtremedistil_tf.methods.subwords.vocab import plain_backend

IGNORE = -100   # label of a position that is not predicted

Word = Tuple[int, ...]          # the piece ids of one word


@dataclass(frozen=True)
class Specials:
    """Ids of one vocabulary's special tokens, and its size (for random replacements)."""
    pad: int
    cls: int
    sep: int
    mask: int
    size: int
    first_regular: int   # random replacements are drawn from [first_regular, size)

    @classmethod
    def of(cls, tokenizer) -> "Specials":
        vocab = tokenizer.get_vocab()
        ids = [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
        # BERT vocabularies put [unusedN] and specials first; drawing from above the last special
        # keeps random replacements regular pieces for both vocabularies.
        return cls(pad=vocab["[PAD]"], cls=vocab["[CLS]"], sep=vocab["[SEP]"], mask=vocab["[MASK]"],
                   size=len(vocab), first_regular=max(ids) + 1)


def segment(tokenizer, sentences: Sequence[Sequence[str]]) -> List[List[Word]]:
    """Per sentence, per input word, the tuple of piece ids (a word the normaliser deletes gets ())."""
    backend = plain_backend(tokenizer)
    out = []
    for words, enc in zip(sentences, backend.encode_batch([list(s) for s in sentences], is_pretokenized=True,
                                                          add_special_tokens=False)):
        pieces: List[List[int]] = [[] for _ in words]
        for piece, w in zip(enc.ids, enc.word_ids):
            pieces[w].append(piece)
        out.append([tuple(p) for p in pieces])
    return out


@dataclass
class DualSentence:
    """One sentence as words segmented by both vocabularies (words empty in either are dropped)."""
    student: List[Word]
    teacher: List[Word]


def dual_corpus(student_tokenizer, teacher_tokenizer, sentences: Sequence[Sequence[str]]) -> List[DualSentence]:
    out = []
    for s_words, t_words in zip(segment(student_tokenizer, sentences), segment(teacher_tokenizer, sentences)):
        keep = [i for i in range(len(s_words)) if s_words[i] and t_words[i]]
        if keep:
            out.append(DualSentence([s_words[i] for i in keep], [t_words[i] for i in keep]))
    return out


def fitting_words(sentence: DualSentence, max_len: int) -> int:
    """How many leading words fit `max_len` positions with [CLS] and [SEP] in either segmentation."""
    used = 0
    for n, (s, t) in enumerate(zip(sentence.student, sentence.teacher)):
        used += max(len(s), len(t))
        if used > max_len - 2:
            return max(n, 1)
    return len(sentence.student)


def choose_masked(n_words: int, mask_prob: float, rng: np.random.Generator) -> np.ndarray:
    """Bool [n_words]: words to predict; each with `mask_prob`, at least one per sentence."""
    chosen = rng.random(n_words) < mask_prob
    if not chosen.any():
        chosen[rng.integers(n_words)] = True
    return chosen


def corrupt(word: Word, how: str, spec: Specials, rng: np.random.Generator) -> List[int]:
    """The input pieces of a masked word: all [MASK], random pieces, or kept (BERT's 80/10/10)."""
    if how == "mask":
        return [spec.mask] * len(word)
    if how == "random":
        return [int(i) for i in rng.integers(spec.first_regular, spec.size, len(word))]
    return list(word)


def _how(rng: np.random.Generator, train: bool) -> str:
    if not train:
        return "mask"
    u = rng.random()
    return "mask" if u < 0.8 else ("random" if u < 0.9 else "keep")


def _row(words, vocab_flags, masked, hows, specs, rng, word_offset):
    """One sequence: ids, vocabulary flag, labels and word index per position (with [CLS]/[SEP])."""
    ids, flags, labels, word_index = [specs[0].cls], [0], [IGNORE], [-1]
    for w, (word, flag) in enumerate(zip(words, vocab_flags)):
        spec = specs[flag]
        pieces = corrupt(word, hows[w], spec, rng) if masked[w] else list(word)
        ids += pieces
        flags += [flag] * len(word)
        labels += list(word) if masked[w] else [IGNORE] * len(word)
        word_index += [word_offset + w] * len(word)
    ids.append(specs[0].sep)
    flags.append(0)
    labels.append(IGNORE)
    word_index.append(-1)
    return ids, flags, labels, word_index


def _pad(rows: List[List[int]], value: int) -> np.ndarray:
    width = max(len(r) for r in rows)
    return np.array([r + [value] * (width - len(r)) for r in rows], dtype=np.int32)


def build_batch(sentences: Sequence[DualSentence], rng: np.random.Generator, student_spec: Specials,
                teacher_spec: Specials, p: float = 0.5, mask_prob: float = 0.15, max_len: int = 64,
                train: bool = True, with_teacher: bool = True) -> Dict[str, np.ndarray]:
    """Masked-LM inputs for a batch, padded to its longest row.

    Student: s_ids, s_attn, s_labels (piece id at masked positions, IGNORE elsewhere), s_word (a batch-wide
    word index at word positions, -1 at [CLS]/[SEP]/padding), all int32 [B, Ls].
    Teacher (with_teacher): t_ids, t_is_student (1: the id is a student piece, read through the student
    table and predicted with the student softmax; [CLS]/[SEP]/padding are teacher tokens), t_attn,
    t_labels, all int32 [B, Lt]. A masked word is predicted in the vocabulary it was segmented with.
    train: BERT's 80% [MASK] / 10% random / 10% kept inputs per masked word; otherwise always [MASK].
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p}; expected a probability in [0, 1]")
    s_rows: Dict[str, list] = {"ids": [], "labels": [], "word": []}
    t_rows: Dict[str, list] = {"ids": [], "flags": [], "labels": []}
    offset = 0
    for sentence in sentences:
        n = fitting_words(sentence, max_len)
        # Every draw is made whether or not the teacher is built, from streams of their own, so NoKD and
        # the dual variants see the same student batches for the same seed.
        masked = choose_masked(n, mask_prob, rng)
        hows = [_how(rng, train) for _ in range(n)]
        use_student = (rng.random(n) < p).astype(int)
        teacher_rng = np.random.default_rng(rng.integers(2**63))
        # The student's [CLS]/[SEP] are its own: both entries of its spec pair are the student vocabulary.
        ids, _, labels, word = _row(sentence.student[:n], [1] * n, masked, hows, (student_spec, student_spec),
                                    rng, offset)
        s_rows["ids"].append(ids)
        s_rows["labels"].append(labels)
        s_rows["word"].append(word)
        if with_teacher:
            words = [sentence.student[w] if use_student[w] else sentence.teacher[w] for w in range(n)]
            ids, flags, labels, _ = _row(words, use_student, masked, hows, (teacher_spec, student_spec),
                                         teacher_rng, offset)
            t_rows["ids"].append(ids)
            t_rows["flags"].append(flags)
            t_rows["labels"].append(labels)
        offset += n
    batch = {"s_ids": _pad(s_rows["ids"], student_spec.pad), "s_labels": _pad(s_rows["labels"], IGNORE),
             "s_word": _pad(s_rows["word"], -1)}
    batch["s_attn"] = _pad([[1] * len(r) for r in s_rows["ids"]], 0)
    if with_teacher:
        batch.update(t_ids=_pad(t_rows["ids"], teacher_spec.pad), t_is_student=_pad(t_rows["flags"], 0),
                     t_labels=_pad(t_rows["labels"], IGNORE),
                     t_attn=_pad([[1] * len(r) for r in t_rows["ids"]], 0))
    return batch
