"""What differs between the BERT-family encoders and tokenizers the teachers load through Auto classes.

BERT, DistilBERT and ELECTRA tokenize with WordPiece (`##` continuation pieces); RoBERTa (and
GPT-2-style models) with byte-level BPE, where a word's first piece carries the space before it
(`Ġ`); XLM-R and CamemBERT with a SentencePiece Unigram model, whose word starts carry `▁`.
Word alignment reads the tokenizer's own word ids, so it needs no piece convention, only a
tokenizer that takes words: byte-level BPE must then add the space a word has in running text
(`add_prefix_space=True`), or "John" as a first word and " John" elsewhere would be different pieces.

Special pieces differ too (RoBERTa: <s>=0, <pad>=1, </s>=2; BERT: [PAD]=0, [CLS]=101, [SEP]=102):
the code reads them from the tokenizer (`cls_token_id`, `sep_token_id`, `pad_token_id`), never as
constants. Models without token types (DistilBERT, RoBERTa's single type) get input_ids and
attention_mask only, which is all the teachers pass.

bin/export's in-graph tokenizers (export.words) are tensorflow-text's FastWordpieceTokenizer for WordPiece
(`servable_in_graph`: the student keeps a vocab.txt) and its SentencepieceTokenizer for SentencePiece Unigram (the
teacher's .model file); byte-level BPE has none, so its students are served by ONNX/TFLite exports, whose predict.py
tokenizes with `tokenizers` (students.artifact.check_servable, docs/serving.md).
"""
from __future__ import annotations

from typing import Optional

from transformers import AutoConfig

WORDPIECE = "WordPiece"
BYTE_LEVEL_BPE = "byte-level BPE"
UNIGRAM = "SentencePiece Unigram"

# Model types whose position ids start after the padding id (fairseq's convention): positions
# 0..pad_token_id are never used, so max_position_embeddings=514 holds 512 pieces.
OFFSET_POSITION_TYPES = frozenset({"roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "longformer",
                                   "mpnet", "xlm-roberta-xl", "data2vec-text"})


def tokenizer_family(tokenizer) -> str:
    """WORDPIECE, BYTE_LEVEL_BPE, "BPE", UNIGRAM, or the name of the tokenizer's model or class."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return type(tokenizer).__name__
    model = type(backend.model).__name__
    if model == "BPE" and "ByteLevel(" in repr(backend.pre_tokenizer):
        return BYTE_LEVEL_BPE
    if model == "Unigram":
        return UNIGRAM
    prefix = getattr(backend.model, "continuing_subword_prefix", "##")
    if model == WORDPIECE and prefix != "##":
        return f"{WORDPIECE} ({prefix!r} continuations)"
    return model


def servable_in_graph(tokenizer) -> bool:
    """Whether the export's in-graph WordPiece tokenizer segments as `tokenizer` does: WordPiece
    with `##` continuation pieces (SentencePiece students: export.words.SentencePieces)."""
    return tokenizer_family(tokenizer) == WORDPIECE


def needs_prefix_space(tokenizer) -> bool:
    """True for a byte-level BPE tokenizer that would take a word given alone as a text start
    (transformers refuses `is_split_into_words` for those)."""
    return getattr(tokenizer, "add_prefix_space", None) is False


def usable_positions(config) -> Optional[int]:
    """Pieces per window (special pieces included) the encoder's position embeddings hold:
    max_position_embeddings, less pad_token_id + 1 for fairseq-style models (RoBERTa, XLM-R).
    `config`: a transformers config or any object with those attributes; None if it has none."""
    positions = getattr(config, "max_position_embeddings", None)
    if not positions:
        return None
    if getattr(config, "model_type", None) in OFFSET_POSITION_TYPES:
        return int(positions) - int(getattr(config, "pad_token_id", 1) or 0) - 1
    return int(positions)


def config_from_dict(config: dict):
    """A transformers config of `config` (a config.json's contents), so that each family's own names
    read as the common ones (DistilBERT's n_layers as num_hidden_layers, dim as hidden_size); an
    unknown model type gives its keys as attributes."""
    values = dict(config)
    model_type = values.pop("model_type", None)
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError, KeyError):
        return _Attributes({**values, "model_type": model_type})


class _Attributes:
    def __init__(self, values: dict):
        self.__dict__.update(values)
