"""Process environment that must be in place before TensorFlow is imported.

tf.keras must resolve to Keras 2 (tf-keras): `TFBertModel` cannot live inside a
Keras 3 functional model and Keras 3 cannot reload a SavedModel with
`load_model`. TensorFlow reads `TF_USE_LEGACY_KERAS` once, at import, so this
module is imported first by the package and by every entry point.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if os.environ["TF_USE_LEGACY_KERAS"] != "1":
    raise RuntimeError(
        "xtremedistil_tf needs TF_USE_LEGACY_KERAS=1 (Keras 2 through tf-keras); "
        f"it is set to {os.environ['TF_USE_LEGACY_KERAS']!r}."
    )
