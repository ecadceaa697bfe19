"""Reload any saved teacher: teacher.json names its class (token, CRF, sequence or pretrained
checkpoint). Kept apart from teachers.model, whose subclasses import it, so imports point one way.
"""
from __future__ import annotations

import json
from pathlib import Path

from transformers import TFAutoModel

from xtremedistil_tf.damage import RETRAIN, reading
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers.classifier import SequenceTeacher
from xtremedistil_tf.teachers.crf_head import CRFTokenTeacher
from xtremedistil_tf.teachers.model import FORMAT_VERSION, TokenTeacher, load_tokenizer
from xtremedistil_tf.teachers.pretrained import load_pretrained_teacher


def load_teacher(directory):
    """Reload a teacher written by `TokenTeacher.save`, `CRFTokenTeacher.save`, `SequenceTeacher.save`
    or `PretrainedTokenTeacher.save` (teacher.json says which); returns (teacher, tokenizer)."""
    directory = Path(directory)
    meta_path = directory / "teacher.json"
    if not meta_path.exists():
        raise ConfigError(f"{directory} is not a saved teacher (no teacher.json)")
    with reading(directory, RETRAIN):   # a damaged or missing file named in one line
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format_version") != FORMAT_VERSION:
            raise ConfigError(f"{meta_path}: format_version {meta.get('format_version')} is not {FORMAT_VERSION}")
        if meta.get("head") == "pretrained":
            return load_pretrained_teacher(directory, meta)
        cls = TokenTeacher
        if meta.get("head") == "crf":
            cls = CRFTokenTeacher
        elif meta.get("task") == "classification":
            cls = SequenceTeacher
        teacher = cls.from_meta(TFAutoModel.from_pretrained(str(directory / "encoder")), meta)
        teacher.build_for_length()
        teacher.load_head(directory)
        return teacher, load_tokenizer(str(directory / "encoder"))
