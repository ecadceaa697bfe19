"""Distillation losses, one module per family; losses/registry.py lists every one (docs/equations.md)."""
from xtremedistil_tf.losses.reduce import masked_mean
from xtremedistil_tf.losses.xtremedistil import (DEFAULT_REPRESENTATION_LOSS, cross_entropy, label_mask, logit_mse,
                                                 representation_kld, representation_mse)

__all__ = ["DEFAULT_REPRESENTATION_LOSS", "cross_entropy", "label_mask", "logit_mse", "masked_mean",
           "representation_kld", "representation_mse"]
