"""Custom Keras layers; importing the package registers them for (de)serialization."""
from xtremedistil_tf.layers.uncertainty import (LOSS_WEIGHTINGS, EqualWeighting, UncertaintyWeighting,
                                                loss_weighting)

__all__ = ["LOSS_WEIGHTINGS", "EqualWeighting", "UncertaintyWeighting", "loss_weighting"]
