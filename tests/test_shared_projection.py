"""Shared projections: zero loss when the student equals the projected teacher, brute-force values,
one matrix pair per shape group shared across layers, Xavier initialisation."""
import numpy as np
import pytest
import tensorflow as tf

from subwords_helpers import tiny_mlm
from xtremedistil_tf.losses.shared_projection import SharedProjections, layer_map, pair_variables
from xtremedistil_tf.methods.subwords.models import encoder_variables


@pytest.fixture(scope="module")
def models():
    student = tiny_mlm(50, hidden=8, layers=2, heads=2, seed=1)
    teacher = tiny_mlm(70, hidden=16, layers=2, heads=2, seed=2)
    return student, teacher


def _pairs(models):
    student, teacher = models
    return pair_variables(encoder_variables(student), encoder_variables(teacher), 2, 2)


def test_pairs_match_names_layer_by_layer_and_leave_the_vocabulary_tables_out(models):
    pairs = _pairs(models)
    keys = [s.name.split("/", 1)[1] for s, _ in pairs]
    assert not any("word_embeddings" in k for k in keys)
    for s, t in pairs:
        assert s.name.split("/", 1)[1] == t.name.split("/", 1)[1]
    # 2 layers x 16 variables + position, token type, LayerNorm gamma/beta of the embeddings.
    assert len(pairs) == 2 * 16 + 4


@pytest.mark.parametrize("direction", ["down", "up"])
def test_loss_is_zero_when_the_target_equals_the_projected_variables(models, direction):
    pairs = _pairs(models)
    proj = SharedProjections(pairs, direction, seed=0)
    assert float(proj.loss()) > 0
    saved = [(v, v.numpy()) for pair in pairs for v in pair]
    try:
        for s, t in pairs:
            (s if direction == "down" else t).assign(proj.project(s, t))
        assert float(proj.loss()) == pytest.approx(0.0, abs=1e-10)
    finally:
        for v, value in saved:
            v.assign(value)


@pytest.mark.parametrize("direction", ["down", "up"])
def test_loss_equals_the_sum_of_per_variable_mse_of_u_x_v(models, direction):
    pairs = _pairs(models)
    proj = SharedProjections(pairs, direction, seed=3)
    expected = 0.0
    for s, t in pairs:
        left, right = proj.groups[proj.group_key(s, t)]
        src, dst = (t.numpy(), s.numpy()) if direction == "down" else (s.numpy(), t.numpy())
        x = src if src.ndim == 2 else src[:, None]
        if left is not None:
            x = left.numpy() @ x
        if right is not None:
            x = x @ right.numpy()
        expected += np.mean((dst - x.reshape(dst.shape)) ** 2)
    assert float(proj.loss()) == pytest.approx(expected, rel=1e-5)


def test_one_xavier_matrix_pair_per_shape_group_shared_across_layers(models):
    pairs = _pairs(models)
    proj = SharedProjections(pairs, "down", seed=0)
    shapes = {(tuple(t.shape), tuple(s.shape)) for s, t in pairs}
    assert len(proj.groups) == len(shapes)
    # Query, key, value and attention output kernels of both layers: 8 pairs, one group.
    square = [p for p in pairs if tuple(p[1].shape) == (16, 16)]
    assert len(square) == 8 and len({proj.group_key(s, t) for s, t in square}) == 1
    left, right = proj.groups["(16, 16)->(8, 8)"]
    assert left.shape == (8, 16) and right.shape == (16, 8)
    # Axes of equal size (512 positions) are not projected.
    left, right = proj.groups["(64, 16)->(64, 8)"]
    assert left is None and right.shape == (16, 8)
    for m in proj.matrices:
        limit = np.sqrt(6.0 / sum(m.shape))
        assert np.abs(m.numpy()).max() <= limit and m.numpy().std() > limit / 4


def test_gradients_reach_student_teacher_and_projections(models):
    pairs = _pairs(models)
    proj = SharedProjections(pairs, "up", seed=0)
    s, t = next(p for p in pairs if "query/kernel" in p[0].name)   # biases start at 0: no gradient there
    with tf.GradientTape() as tape:
        loss = proj.loss()
    grads = tape.gradient(loss, [s, t] + list(proj.groups[proj.group_key(s, t)]))
    assert all(g is not None and float(tf.reduce_sum(tf.abs(g))) > 0 for g in grads)


def test_layer_map_spreads_a_shallower_student_over_the_teacher():
    assert layer_map(6, 6) == {i: i for i in range(6)}
    assert layer_map(3, 6) == {0: 1, 1: 3, 2: 5}
    with pytest.raises(ValueError, match="direction"):
        SharedProjections([], "sideways")
