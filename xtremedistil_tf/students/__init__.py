"""Students: embeddings (random / SVD / teacher-frozen), BiLSTM and transformer bodies, the heads."""
from xtremedistil_tf.students.embeddings import svd_reduce
from xtremedistil_tf.students.layers import SequenceMask, TransformerEncoder
from xtremedistil_tf.students.models import (OUTPUTS, StudentArch, build_bilstm_classifier, build_bilstm_student,
                                             build_transformer_student, encoder_layer_name)

__all__ = ["OUTPUTS", "SequenceMask", "StudentArch", "TransformerEncoder", "build_bilstm_classifier",
           "build_bilstm_student", "build_transformer_student", "encoder_layer_name", "svd_reduce"]
