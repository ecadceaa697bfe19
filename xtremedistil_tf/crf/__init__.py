"""Linear-chain CRF: tensor ops (ops.py) and a serializable Keras layer (layer.py). See docs/crf.md."""
from xtremedistil_tf.crf.ops import (  # noqa: F401
    FORBIDDEN,
    allowed_transitions,
    apply_boundary_constraints,
    apply_transition_constraints,
    crf_decode,
    crf_kbest_decode,
    crf_log_likelihood,
    crf_log_norm,
    crf_marginals,
    crf_nll_loss,
    crf_sequence_score,
)
