"""Values that cannot work. Flag values bin/train checks before the data step: each refusal is one line naming the flag,
its value and what is allowed (issue 16, item 3). The checks of sizes and combinations stay in
cli/train.py (check_flags); these are the ranges of real-valued flags, the teacher's config
overrides and the teacher dir's tokenizer.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from transformers import BertConfig

from xtremedistil_tf.errors import ConfigError

# flag -> (least, whether it is allowed, greatest, whether it is allowed, what is allowed in words)
RANGES = {
    **dict.fromkeys(("student_dropout", "teacher_dropout", "teacher_embedding_dropout", "student_word_dropout"),
                    (0.0, True, 1.0, False, "a fraction in [0, 1)")),
    **dict.fromkeys(("teacher_learning_rate", "student_learning_rate"),
                    (0.0, False, math.inf, False, "a finite rate above 0")),
    "teacher_head_learning_rate": (0.0, True, math.inf, False, "a finite rate, 0 or above (0: the encoder's rate)"),
    "warmup_fraction": (0.0, True, 1.0, True, "a fraction in [0, 1]"),
    "weight_decay": (0.0, True, math.inf, False, "a finite value, 0 or above"),
    "layer_decay": (0.0, False, 1.0, True, "a factor in (0, 1]"),
    **dict.fromkeys(("alpha", "beta", "gamma"), (0.0, True, math.inf, False, "a finite weight, 0 or above")),
}
MAX_SEED = 2**31 - 1
# Tokenizer files one of which a local teacher dir needs (WordPiece, fast tokenizers, BPE).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json")


def check_ranges(flag_values) -> None:
    """`flag_values`: absl's FLAGS (or any object with those attributes); flags left unset (None) pass.
    Every value out of range is named in the one ConfigError, joined by "; "."""
    problems = []
    for name, (least, least_ok, greatest, greatest_ok, allowed) in RANGES.items():
        value = getattr(flag_values, name, None)
        if value is None:
            continue
        inside = (value > least or (least_ok and value == least)) and (value < greatest or
                                                                       (greatest_ok and value == greatest))
        if not (math.isfinite(value) and inside):
            problems.append(f"--{name}={value}; expected {allowed}")
    if not 0 <= flag_values.seed <= MAX_SEED:
        problems.append(f"--seed={flag_values.seed}; expected 0 to {MAX_SEED}")
    if flag_values.langs and flag_values.data_format != "wikiann":
        problems.append(f"--langs={','.join(flag_values.langs)} is read only with --data_format=wikiann "
                        f"(not {flag_values.data_format}); drop it")
    if problems:
        raise ConfigError("; ".join(problems))


def check_overrides(overrides: dict, teacher: str, teacher_config: Optional[dict],
                    max_seq_length: Optional[int] = None) -> None:
    """--teacher_config_overrides against the teacher's config: known keys only, hidden size a
    multiple of the heads, and (when given) --max_seq_length within the positions.
    `teacher_config`: teacher_config_of(...), None for a hub name."""
    if not overrides and max_seq_length is None:
        return

    known = set(BertConfig().to_dict()) | set(teacher_config or {})
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"--teacher_config_overrides: unknown key {unknown[0]!r} (a misspelling?); the teacher's "
                          "config has e.g. num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, "
                          "max_position_embeddings")
    if teacher_config is None:
        return
    config = {**teacher_config, **overrides}
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and (heads < 1 or hidden % heads):
        raise ConfigError(f"--teacher_config_overrides={json.dumps(overrides)}: hidden_size={hidden} is not a "
                          f"multiple of num_attention_heads={heads}; expected heads that divide the hidden size")
    positions = config.get("max_position_embeddings")
    if max_seq_length is not None and isinstance(positions, int) and max_seq_length > positions:
        raise ConfigError(f"--max_seq_length={max_seq_length} exceeds the --teacher={teacher} "
                          f"max_position_embeddings={positions}; expected at most {positions}")


def teacher_config_of(teacher: str, random: bool) -> Optional[dict]:
    """The config a teacher starts from: BertConfig's defaults for --teacher=random, a local dir's
    config.json, None for a hub name (known only once downloaded)."""
    if random:
        return BertConfig().to_dict()
    config_file = Path(teacher) / "config.json"
    if not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None   # check_teacher_dir reports it


def check_tokenizer_files(teacher_dir) -> None:
    path = Path(teacher_dir)
    if path.is_dir() and not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ConfigError(f"--teacher={teacher_dir}: teacher directory {path} has no tokenizer (expected one of "
                          f"{', '.join(TOKENIZER_FILES)})")
