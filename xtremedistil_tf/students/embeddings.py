"""Word-embedding initialisation for students: random, SVD/PCA of the teacher's matrix, or a copy.

The student shares the teacher's WordPiece vocabulary, so row i of the teacher's word-embedding
matrix [V, D] is the teacher's vector for student token i. XtremeDistil (Table 7) finds SVD of the
fine-tuned teacher's matrix reduced to E=300 dims the best initialisation.
"""
from __future__ import annotations

import numpy as np

from xtremedistil_tf.errors import ConfigError


def svd_reduce(matrix: np.ndarray, dim: int, center: bool = False) -> np.ndarray:
    """The rows of `matrix` [V, D] as coordinates [V, dim] in its best `dim`-dimensional subspace.

    Returns U_E * S_E from the thin SVD M = U S V^T, i.e. M V_E: the projection of each row onto
    the top-`dim` right singular vectors, which minimises the sum of squared residuals of the
    rows (Eckart-Young), so `result @ V_E^T` is M's best rank-`dim` approximation. `center=True`
    subtracts the column means first, which makes this PCA.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ConfigError(f"svd_reduce needs a [vocab, dim] matrix, got shape {matrix.shape}")
    if not 0 < dim <= min(matrix.shape):
        raise ConfigError(f"embedding_dim={dim} must be in [1, {min(matrix.shape)}] for a "
                          f"teacher embedding matrix of shape {matrix.shape}")
    if center:
        matrix = matrix - matrix.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(matrix, full_matrices=False)
    return (u[:, :dim] * s[:dim]).astype(np.float32)


def check_embeddings(embeddings: np.ndarray, vocab_size: int, embedding_dim: int) -> np.ndarray:
    """Validate an initial embedding matrix against the student's vocabulary and width."""
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if embeddings.shape != (vocab_size, embedding_dim):
        raise ConfigError(f"initial word embeddings have shape {embeddings.shape}, the student needs "
                          f"({vocab_size}, {embedding_dim}) (vocab_size, embedding_dim); reduce a "
                          "teacher matrix with svd_reduce(matrix, embedding_dim)")
    return embeddings
