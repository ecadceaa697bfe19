"""Shared projections (Zhao et al., 2019, section 3.3): align student and teacher variables directly.

Every pair (student variable S, teacher variable T) of corresponding variables is compared after a
projection; the projection matrices are shared by all pairs of the same (teacher shape, student shape)
group, i.e. across all layers, and Xavier (Glorot-uniform) initialised. For a matrix pair T [a, b],
S [c, d]:

    down (student space, Eq. 1):  L = sum_pairs MSE(S, U T V),      U [c, a], V [b, d]
    up   (teacher space, Eq. 2):  L = sum_pairs MSE(T, U' S V'),    U' [a, c], V' [d, b]

A vector pair (biases, LayerNorm) uses U (or U') alone. An axis whose size is the same in both models
(512 positions, 2 token types) indexes the same things in both, so it is not projected (identity).
MSE is the mean over a variable's elements; the pairs are summed, the paper's sum over theta.
Gradients reach the student, the teacher (which trains too) and the projections.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from xtremedistil_tf.losses.reduce import masked_mean

DIRECTIONS = ("down", "up")

_LAYER = re.compile(r"layer_\._(\d+)/")


def _key(name: str) -> str:
    """A variable's name without its model scope and ':0': 'bert/encoder/layer_._0/.../kernel'."""
    name = name.split(":")[0]
    return name.split("/", 1)[1] if "/" in name else name


def layer_map(student_layers: int, teacher_layers: int) -> Dict[int, int]:
    """Student layer i -> teacher layer: the identity for equal depths, else spread evenly
    (i -> (i+1) * L_t // L_s - 1, so the top layers correspond)."""
    return {i: (i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)}


def pair_variables(student_vars: Sequence[tf.Variable], teacher_vars: Sequence[tf.Variable],
                   student_layers: int, teacher_layers: int,
                   skip: Tuple[str, ...] = ("word_embeddings",)) -> List[Tuple[tf.Variable, tf.Variable]]:
    """(student, teacher) pairs of corresponding variables, matched by name (layers through
    `layer_map`); variables whose name contains one of `skip` (the vocabulary tables, whose rows are
    different pieces) and variables of the same rank but without a counterpart are left out."""
    mapping = layer_map(student_layers, teacher_layers)
    teacher_by_key = {_key(v.name): v for v in teacher_vars}
    pairs = []
    for s in student_vars:
        key = _key(s.name)
        if any(k in key for k in skip):
            continue
        key = _LAYER.sub(lambda m: f"layer_._{mapping[int(m.group(1))]}/", key)
        t = teacher_by_key.get(key)
        if t is not None and t.shape.rank == s.shape.rank and t.shape.rank in (1, 2):
            pairs.append((s, t))
    if not pairs:
        raise ValueError("no student variable has a teacher counterpart (are both BERT models?)")
    return pairs


def variable_mse(prediction: tf.Tensor, target: tf.Tensor, mask: Optional[tf.Tensor] = None) -> tf.Tensor:
    """MSE of a projected variable against its counterpart: the mean over the elements `mask` counts (all)."""
    return masked_mean(tf.square(tf.convert_to_tensor(target) - prediction), mask)


def _glorot(rows: int, cols: int, seed: int) -> tf.Variable:
    return tf.Variable(tf.keras.initializers.GlorotUniform(seed)((rows, cols)), name=f"projection_{rows}x{cols}")


class SharedProjections(tf.Module):
    """The projection matrices of one direction, one (left, right) pair per shape group.

    pairs: (student variable, teacher variable) from `pair_variables`.
    """

    def __init__(self, pairs: Sequence[Tuple[tf.Variable, tf.Variable]], direction: str = "up", seed: int = 0):
        super().__init__(name=f"shared_projections_{direction}")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction={direction!r}; expected one of {DIRECTIONS}")
        self.direction = direction
        self.pairs = list(pairs)
        self.groups: Dict[str, Tuple[Optional[tf.Variable], Optional[tf.Variable]]] = {}
        for s, t in self.pairs:
            key = self.group_key(s, t)
            if key not in self.groups:
                self.groups[key] = self._make(tuple(t.shape), tuple(s.shape), seed + len(self.groups))
        self.matrices = [m for pair in self.groups.values() for m in pair if m is not None]

    @staticmethod
    def group_key(student: tf.Variable, teacher: tf.Variable) -> str:
        return f"{tuple(teacher.shape)}->{tuple(student.shape)}"

    def _make(self, t_shape, s_shape, seed):
        """(left, right) for one group; None where an axis is not projected."""
        src, dst = (t_shape, s_shape) if self.direction == "down" else (s_shape, t_shape)
        left = _glorot(dst[0], src[0], seed) if dst[0] != src[0] else None
        right = _glorot(src[1], dst[1], seed + 1000) if len(src) == 2 and dst[1] != src[1] else None
        return left, right

    def project(self, student: tf.Variable, teacher: tf.Variable) -> tf.Tensor:
        """The projected source: U T V (down) or U' S V' (up), in the other model's shape."""
        left, right = self.groups[self.group_key(student, teacher)]
        x = tf.convert_to_tensor(teacher if self.direction == "down" else student)
        vector = x.shape.rank == 1
        if vector:
            x = x[:, None]
        if left is not None:
            x = tf.matmul(left, x)
        if right is not None:
            x = tf.matmul(x, right)
        return x[:, 0] if vector else x

    def loss(self) -> tf.Tensor:
        """Sum over pairs of the MSE between the target variable and the projected one."""
        total = tf.constant(0.0)
        for s, t in self.pairs:
            target = s if self.direction == "down" else t
            total += variable_mse(self.project(s, t), target)
        return total
