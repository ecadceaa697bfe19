"""xtremedistil_tf: distil large transformer NER / classification teachers into small students."""
# First, before TensorFlow loads (seconds): a command's Ctrl-C or SIGTERM is recorded from here on (stop.py).
from xtremedistil_tf import stop as _stop

if _stop.is_command():
    _stop.install(exit_before_work=True)

from xtremedistil_tf import _env  # noqa: E402,F401  (must run before TensorFlow is imported)

# Importing the package registers every custom Keras object, so a saved student reloads with
# tf.keras.models.load_model after `import xtremedistil_tf`. This loads TensorFlow; the data
# readers alone (xtremedistil_tf.data.readers) do not need it but come with it.
from xtremedistil_tf import crf, losses, students  # noqa: E402,F401
from xtremedistil_tf.losses import uncertainty as _uncertainty  # noqa: E402,F401
from xtremedistil_tf.crf import layer as _crf_layer  # noqa: E402,F401
from xtremedistil_tf.engine import schedules as _schedules  # noqa: E402,F401

__version__ = "0.9.0"   # setup.py reads it; CHANGELOG.md names it
