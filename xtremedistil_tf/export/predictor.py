"""Entities from an exported model directory or a saved student, through the serving signature."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Sequence

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers FastBertNormalize etc., which the SavedModel uses)

from xtremedistil_tf.errors import ConfigError


def _saved_model_dir(path: Path) -> Path:
    """`path` itself when it holds saved_model.pb, else its highest numeric version (as TF Serving picks)."""
    if (path / "saved_model.pb").exists():
        return path
    versions = sorted((int(p.name), p) for p in path.glob("*") if p.is_dir() and p.name.isdigit())
    if not versions or not (versions[-1][1] / "saved_model.pb").exists():
        raise ConfigError(f"{path} is neither a saved student (student.json), a SavedModel nor a directory "
                          "of numeric SavedModel versions")
    return versions[-1][1]


def load_serving_fn(path) -> Callable:
    """The `serving_default` function of `path`: fn(text=tf.string [B]) -> dict of tensors.

    A saved student dir is wrapped in memory (the same graph bin/export writes); an export
    dir <export_dir>/<name> or <export_dir>/<name>/<version> is loaded as a SavedModel.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if (path / "student.json").exists():
        from xtremedistil_tf.export.serving import NerServing

        module = NerServing.from_student_dir(path)
        # A bound tf.function holds its module weakly: the closure keeps the module alive.
        return lambda text: module.serve(text)
    return tf.saved_model.load(str(_saved_model_dir(path))).signatures["serving_default"]


def entities(outputs: Dict[str, tf.Tensor], texts: Sequence[str]) -> List[dict]:
    """One {"text", "entities": [{"start", "end", "type", "text", "confidence"}]} per text.

    start/end are character offsets (Python str indices, end exclusive).
    """
    values = {k: v.numpy() for k, v in outputs.items()}
    records = []
    for i, text in enumerate(texts):
        found = []
        for j in range(int(values["num_entities"][i])):
            found.append({"start": int(values["entity_start"][i, j]), "end": int(values["entity_end"][i, j]),
                          "type": values["entity_type"][i, j].decode("utf-8"),
                          "text": values["entity_text"][i, j].decode("utf-8", errors="replace"),
                          "confidence": round(float(values["entity_confidence"][i, j]), 6)})
        records.append({"text": text, "entities": found})
    return records


def predict(serving_fn: Callable, texts: Sequence[str], batch_size: int = 64) -> List[dict]:
    """Entities of `texts`, `batch_size` texts per call."""
    records = []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start:start + batch_size])
        records.extend(entities(serving_fn(text=tf.constant(batch, tf.string)), batch))
    return records
