"""xtremedistil_tf: distil large transformer NER / classification teachers into small students."""
from xtremedistil_tf import _env  # noqa: F401  (must run before TensorFlow is imported)

__version__ = "0.1.0"
