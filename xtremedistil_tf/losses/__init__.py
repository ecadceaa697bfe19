"""Distillation losses, one module per family (xtremedistil: representation, logit, CE)."""
from xtremedistil_tf.losses.xtremedistil import (DEFAULT_REPRESENTATION_LOSS, REPRESENTATION_LOSSES,
                                                 cross_entropy, label_mask, logit_mse, masked_mean,
                                                 representation_kld, representation_loss,
                                                 representation_mse)

__all__ = ["DEFAULT_REPRESENTATION_LOSS", "REPRESENTATION_LOSSES", "cross_entropy", "label_mask",
           "logit_mse", "masked_mean", "representation_kld", "representation_loss", "representation_mse"]
