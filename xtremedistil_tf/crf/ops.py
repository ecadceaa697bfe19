"""Linear-chain CRF ops in plain TensorFlow (a replacement for `tfa.text.crf_*`).

Shapes: B batch, T time, N tags, K paths. `potentials` [B, T, N] are unary
(emission) scores, `transitions` [N, N] with `transitions[i, j]` the score of
moving from tag i to tag j, `lengths` [B] the number of real positions of each
(left-aligned) sequence. A path's score is the sum of its potentials and of the
transitions between consecutive positions; there are no start/end transition
vectors (see `apply_boundary_constraints`).

Conventions (docs/crf.md has the long form):
- Everything is computed in float32: float16/bfloat16 inputs are cast, outputs
  are float32, gradients flow back through the cast.
- Forbidden moves score `FORBIDDEN` (-1e4), never -inf, so every log-norm,
  log-likelihood and gradient stays finite even when every path is forbidden,
  while exp(-1e4) is exactly 0 in float32, so forbidden paths get probability 0
  whenever an allowed path exists. -1e4 also fits in float16.
- A zero-length sequence has exactly one labeling, the empty one, with score 0:
  log-norm, sequence score and log-likelihood are 0, its decoded
  tags are all 0 with score 0, and k-best gives it one valid path (score 0,
  log-prob 0). tfa agrees except for the 1-best decode score (tfa returns the
  best first-position potential).
- Outputs past a sequence's length are 0 (tags, marginals).
- All ops loop over time with `tf.scan` on [B, N] or [B, K, N] states, so they
  run eagerly and in `tf.function` with unknown B and T. The Viterbi's two loops
  (`crf_decode`) use `chunked_scan`, the same steps `SCAN_CHUNK` to a loop iteration:
  in a graph each iteration pays the loop's own ops, which at serving sizes (one
  text of ~30 words) cost more than the steps (docs/benchmarks.md).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from xtremedistil_tf.errors import ConfigError

FORBIDDEN = -1e4
# A single potential or transition at or below this is a hard constraint (see
# crf_kbest_decode); half of FORBIDDEN so bfloat16's rounding of -1e4 (-9984) still counts.
FORBIDDEN_THRESHOLD = FORBIDDEN / 2
_TINY = float(np.finfo(np.float32).tiny)
# A step sum below this lost precision (float32 denormals start at ~1.2e-38).
_UNDERFLOW = 1e-30
# Steps of chunked_scan per loop iteration: at 30 words a text 16 was 5% faster than 8 for the whole
# served text signature; a short text pays the padded steps, a long one more iterations.
SCAN_CHUNK = 16


def chunked_scan(fn, elems, initializer, reverse: bool = False, chunk: int = SCAN_CHUNK):
    """tf.scan(fn, elems, initializer, reverse=reverse) for one tensor `elems` [T, ...] and one
    tensor state, with `chunk` steps unrolled in each iteration of the loop.

    Each step is the same `fn` on the same values as in tf.scan, so the outputs are identical to
    the bit. T is padded with zeros to a multiple of `chunk` (after the end, or before the start
    when `reverse`); the padded steps run after the real ones and their outputs are dropped, so
    `fn` must accept zero elements and must not carry anything other than its state.
    """
    elems = tf.convert_to_tensor(elems)
    initializer = tf.convert_to_tensor(initializer)
    steps = tf.shape(elems)[0]
    chunks = (steps + chunk - 1) // chunk
    padding = chunks * chunk - steps
    pad = tf.stack([padding, 0]) if reverse else tf.stack([0, padding])
    padded = tf.pad(elems, tf.concat([pad[None], tf.zeros([tf.rank(elems) - 1, 2], tf.int32)], axis=0))
    blocks = tf.reshape(padded, tf.concat([[chunks, chunk], tf.shape(elems)[1:]], axis=0))
    order = range(chunk - 1, -1, -1) if reverse else range(chunk)

    def body(i, state, outputs):
        index = chunks - 1 - i if reverse else i
        # One unstack, not a slice (and its three constants) per step: in a graph loop every op counts.
        block, states = tf.unstack(blocks[index], num=chunk), [None] * chunk
        for j in order:
            state = fn(state, block[j])
            states[j] = state
        return i + 1, state, outputs.write(index, tf.stack(states))

    outputs = tf.TensorArray(initializer.dtype, size=chunks, element_shape=tf.TensorShape([chunk]).concatenate(
        initializer.shape))
    _, _, outputs = tf.while_loop(lambda i, *_: i < chunks, body, (0, initializer, outputs))
    stacked = outputs.stack()
    stacked = tf.reshape(stacked, tf.concat([[chunks * chunk], tf.shape(stacked)[2:]], axis=0))
    result = stacked[padding:] if reverse else stacked[:steps]
    return tf.ensure_shape(result, elems.shape[:1].concatenate(initializer.shape))


def _prepare(potentials, lengths, transitions=None):
    """Casts to float32/int32 and checks shapes.

    Returns (potentials [B, max(T, 2), N] float32, lengths [B] int32 clipped to
    [0, T], transitions [N, N] float32 or None, T as a scalar tensor). Time is
    padded to at least 2 so every loop has an initial state and at least one
    step: a tf.scan over zero elements fails in graphs with an unknown batch size
    (it cannot stack an empty list of unknown shape). The padding lies past every
    length, so it changes no result.
    """
    potentials = tf.convert_to_tensor(potentials)
    if potentials.shape.rank is not None and potentials.shape.rank != 3:
        raise ValueError(f"potentials must be [batch, time, num_tags]; got shape {potentials.shape}")
    if not potentials.dtype.is_floating:
        raise ValueError(f"potentials must be floating point; got {potentials.dtype.name}")
    potentials = tf.cast(potentials, tf.float32)
    num_steps = tf.shape(potentials)[1]
    potentials = tf.pad(potentials, [[0, 0], [0, tf.maximum(2 - num_steps, 0)], [0, 0]])
    lengths = tf.convert_to_tensor(lengths)
    if lengths.shape.rank is not None and lengths.shape.rank != 1:
        raise ValueError(f"lengths must be [batch]; got shape {lengths.shape}")
    lengths = tf.clip_by_value(tf.cast(lengths, tf.int32), 0, num_steps)
    if transitions is not None:
        transitions = tf.cast(tf.convert_to_tensor(transitions), tf.float32)
        num_tags = potentials.shape[-1]
        if transitions.shape.rank is not None and (
            transitions.shape.rank != 2 or not transitions.shape.is_compatible_with([num_tags, num_tags])
        ):
            raise ValueError(
                f"transitions must be [num_tags, num_tags] = [{num_tags}, {num_tags}]; got shape {transitions.shape}"
            )
    return potentials, lengths, transitions, num_steps


def _time_mask(lengths, num_steps):
    """[B, T] float32: 1 at real positions."""
    return tf.sequence_mask(lengths, num_steps, dtype=tf.float32)


def _forward(potentials, transitions):
    """Forward algorithm. potentials [B, T, N] (T >= 2) -> alphas [B, T, N].

    alphas[b, t, j] = log-sum of the scores of all prefixes 0..t ending in tag j.
    Computed for every t regardless of length; callers gather at length - 1.
    Runs the fast exp-space recursion and, only if it underflowed anywhere, the
    exact log-space one (see both).
    """
    alphas, smallest = _forward_scaled(potentials, transitions)
    return tf.cond(smallest < _UNDERFLOW, lambda: _forward_exact(potentials, transitions), lambda: alphas)


def _forward_scaled(potentials, transitions):
    """Forward recursion as a matmul in exp space; returns (alphas [B, T, N], smallest step sum).

    Shifted by the row max of alpha and the column max of the transitions. On CPU
    graphs the loop costs per op, and this needs fewer and cheaper ops than a
    [B, N, N] logsumexp (about 40% less time). It underflows when every
    predecessor of a tag is far (> ~80) below the shift, which happens when all
    paths to it are forbidden (-1e4); the smallest sum seen tells the caller.
    """
    column_max = tf.stop_gradient(tf.reduce_max(transitions, axis=0))
    exp_transitions = tf.exp(transitions - column_max)
    time_major = tf.transpose(potentials, [1, 0, 2])

    def step(carry, potential_t):
        alpha, smallest = carry
        peak = tf.stop_gradient(tf.reduce_max(alpha, axis=1, keepdims=True))
        total = tf.matmul(tf.exp(alpha - peak), exp_transitions)
        # The clamp keeps log finite (and gradients NaN-free) when the fallback is not taken.
        alpha = tf.math.log(tf.maximum(total, _TINY)) + peak + potential_t
        return alpha, tf.minimum(smallest, tf.reduce_min(total))

    rest, smallest = tf.scan(step, time_major[1:] + column_max, initializer=(time_major[0], tf.constant(np.inf)))
    alphas = tf.transpose(tf.concat([time_major[:1], rest], axis=0), [1, 0, 2])
    return alphas, tf.reduce_min(tf.concat([[np.inf], smallest], axis=0))


def _forward_exact(potentials, transitions):
    """Forward recursion as a [B, N, N] logsumexp per step: exact for any finite scores."""
    time_major = tf.transpose(potentials, [1, 0, 2])

    def step(alpha, potential_t):
        scores = alpha[:, :, None] + transitions[None]
        # The max cancels analytically, so it needs no gradient.
        peak = tf.stop_gradient(tf.reduce_max(scores, axis=1))
        return tf.math.log(tf.reduce_sum(tf.exp(scores - peak[:, None, :]), axis=1)) + peak + potential_t

    rest = tf.scan(step, time_major[1:], initializer=time_major[0])
    return tf.transpose(tf.concat([time_major[:1], rest], axis=0), [1, 0, 2])


def _at_last(values, lengths):
    """values [B, T, ...] -> values[b, lengths[b] - 1] ([B, ...]); index 0 when the length is 0."""
    return tf.gather(values, tf.maximum(lengths - 1, 0), batch_dims=1)


def _log_norm_from_alphas(alphas, lengths):
    """[B] log partition from forward scores; 0 for zero-length sequences."""
    last = _at_last(alphas, lengths)
    return tf.where(lengths > 0, tf.reduce_logsumexp(last, axis=-1), 0.0)


def crf_sequence_score(potentials, tags, lengths, transitions):
    """Score of given tag sequences.

    Args: potentials [B, T, N]; tags [B, T] int (values past the length are
    ignored); lengths [B]; transitions [N, N].
    Returns: [B] float32, sum of potentials[b, t, tags[b, t]] for t < length and
    transitions[tags[t-1], tags[t]] for 1 <= t < length.
    """
    potentials, lengths, transitions, num_steps = _prepare(potentials, lengths, transitions)
    mask = _time_mask(lengths, num_steps)
    # Padding tags may be anything (-1, garbage): zero them so the gathers stay in range.
    tags = tf.cast(tags, tf.int32) * tf.cast(mask, tf.int32)
    unary = tf.gather(potentials[:, :num_steps], tags, batch_dims=2)
    pairs = tf.stack([tags[:, :-1], tags[:, 1:]], axis=-1)
    binary = tf.gather_nd(transitions, pairs)
    return tf.reduce_sum(unary * mask, axis=1) + tf.reduce_sum(binary * mask[:, 1:], axis=1)


def crf_log_norm(potentials, lengths, transitions):
    """Log partition function. potentials [B, T, N], lengths [B], transitions [N, N] -> [B] float32."""
    potentials, lengths, transitions, _ = _prepare(potentials, lengths, transitions)
    return _log_norm_from_alphas(_forward(potentials, transitions), lengths)


def crf_log_likelihood(potentials, tags, lengths, transitions):
    """Log-probability of `tags` under the CRF: sequence score - log norm. Returns [B] float32."""
    return crf_sequence_score(potentials, tags, lengths, transitions) - crf_log_norm(
        potentials, lengths, transitions
    )


def crf_nll_loss(potentials, tags, lengths, transitions, rows=None):
    """The CRF negative log-likelihood of `tags`, -log p(tags | x), averaged over the rows: every
    CRF loss of the package (the CRF layer's, the CRF teacher's, a CRF student's L_hard) is this one.

    `rows` [B] (bool or float; None: every row) weights each row's NLL: the mean is
    sum(nll * rows) / sum(rows), e.g. over the labeled rows only. A scalar float32, 0 when no row
    counts (an empty batch)."""
    nll = -crf_log_likelihood(potentials, tags, lengths, transitions)
    rows = tf.ones_like(nll) if rows is None else tf.cast(rows, tf.float32)
    return tf.math.divide_no_nan(tf.reduce_sum(nll * rows), tf.reduce_sum(rows))


def crf_marginals(potentials, lengths, transitions):
    """Posterior tag marginals p(y_t = j | x) by forward-backward.

    Returns [B, T, N] float32; each real position sums to 1, positions at or past
    the length are all 0.
    """
    potentials, lengths, transitions, num_steps = _prepare(potentials, lengths, transitions)
    alphas = _forward(potentials, transitions)
    # The backward pass is the forward pass over each sequence reversed within its
    # length, with transposed transitions: betas_rev[t] = suffix score from t, incl. potential_t.
    reversed_pots = tf.reverse_sequence(potentials, lengths, seq_axis=1, batch_axis=0)
    suffix = tf.reverse_sequence(
        _forward(reversed_pots, tf.transpose(transitions)), lengths, seq_axis=1, batch_axis=0
    )
    log_z = _log_norm_from_alphas(alphas, lengths)
    log_marginals = alphas + suffix - potentials - log_z[:, None, None]
    mask = tf.sequence_mask(lengths, tf.shape(potentials)[1])[:, :, None]
    # where() on both sides: exp of garbage past the length must not leak inf into gradients.
    safe = tf.where(mask, log_marginals, 0.0)
    return tf.where(mask, tf.exp(safe), 0.0)[:, :num_steps]


def _backtrack(backpointers, last_index, lengths, num_steps):
    """Follows backpointers from the last real position to 0.

    backpointers [T-1, B, M] int32, time-major: entry t maps a state at t+1 to its
    state at t; last_index [B, P] int32 the states at position length-1 of P paths
    per sequence. Returns [B, P, T] int32 states, 0 past the length.

    One [B, P] gather per step in a reverse scan. Pointer doubling (log2 T batched
    gathers over all M states) measured slower on CPU: 3.5 vs 1.6 ms at M = 9 and
    11 vs 2.2 ms at M = 45 (B = 32, T = 128), as each round moves all B*T*M pointers.
    """
    num_padded = tf.shape(backpointers)[0] + 1
    # A move out of position t+1 only exists while t+1 < length; the identity before
    # that carries the final state back from T-1 to length-1.
    keep = (tf.range(1, num_padded)[:, None] < lengths[None, :])[:, :, None]
    maps = tf.where(keep, backpointers, tf.range(tf.shape(backpointers)[2]))
    states = chunked_scan(lambda state, m: tf.gather(m, state, batch_dims=1), maps, last_index, reverse=True)
    states = tf.transpose(tf.concat([states, last_index[None]], 0), [1, 2, 0])
    mask = tf.sequence_mask(lengths, num_padded, dtype=tf.int32)
    return (states * mask[:, None, :])[:, :, :num_steps]


def crf_decode(potentials, transitions, lengths):
    """Viterbi decoding (tfa's argument order).

    Returns (tags [B, T] int32, 0 past the length; scores [B] float32, the best
    path's score, 0 for zero-length sequences).
    """
    potentials, lengths, transitions, num_steps = _prepare(potentials, lengths, transitions)
    time_major = tf.transpose(potentials, [1, 0, 2])

    def step(best, potential_t):
        # [B, N, 1] + [N, N]: the same sums as best[:, :, None] + transitions[None], in fewer graph ops.
        return tf.reduce_max(tf.expand_dims(best, 2) + transitions, axis=1) + potential_t

    best = chunked_scan(step, time_major[1:], time_major[0])
    best = tf.concat([time_major[:1], best], axis=0)  # [T, B, N]
    # Backpointers for all steps at once, outside the loop (argmax in the loop costs as much again).
    pointers = tf.argmax(best[:-1, :, :, None] + transitions[None, None], axis=2, output_type=tf.int32)
    best = tf.transpose(best, [1, 0, 2])
    last = _at_last(best, lengths)
    last_tag = tf.argmax(last, axis=-1, output_type=tf.int32)
    tags = _backtrack(pointers, last_tag[:, None], lengths, num_steps)[:, 0]
    return tags, tf.where(lengths > 0, tf.reduce_max(last, axis=-1), 0.0)


def _check_k(k):
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        if k < 1:
            raise ConfigError(f"k must be a positive number of paths; got k={k}")
        return int(k)
    raise ConfigError(f"k must be a Python int (it fixes output shapes); got {k!r}")


def crf_kbest_decode(potentials, transitions, lengths, k):
    """The k highest-scoring paths of each sequence (k-best Viterbi).

    Per tag and step the loop keeps the top-k (score, backpointer to (previous
    rank, previous tag)) over the k*N candidates, then backtracks each of the
    k best final states.

    Hard constraints: a potential or transition at or below FORBIDDEN_THRESHOLD
    (-5000; `apply_transition_constraints` and `apply_boundary_constraints` write
    -1e4) removes the paths through it, so paths that break a tag scheme are never
    returned, even when fewer than k labelings remain.

    Args: potentials [B, T, N]; transitions [N, N]; lengths [B]; k a Python int >= 1.
    Returns:
      tags [B, k, T] int32, best first, 0 past the length;
      scores [B, k] float32, descending;
      log_probs [B, k] float32, score - log_norm (log_norm with the -1e4 moves included,
        i.e. the same normaliser as crf_log_likelihood);
      valid [B, k] bool. A sequence with fewer than k allowed labelings (short, or
        constrained) fills the remaining slots with tags 0, score -inf, log_prob -inf,
        valid False. A zero-length sequence has one valid path (all-0 tags, score 0).
    """
    k = _check_k(k)
    potentials, lengths, transitions, num_steps = _prepare(potentials, lengths, transitions)
    # Static when known, so the loop state keeps a fixed [B, N, k] shape in graphs.
    num_tags = potentials.shape[2] or tf.shape(potentials)[2]
    log_z = _log_norm_from_alphas(_forward(potentials, transitions), lengths)
    neg_inf = tf.constant(-np.inf, tf.float32)
    hard_pots = tf.where(potentials <= FORBIDDEN_THRESHOLD, neg_inf, potentials)
    hard_trans = tf.where(transitions <= FORBIDDEN_THRESHOLD, neg_inf, transitions)
    # Tag-major state [B, N, k] (index tag * k + rank): the candidates for each tag
    # are then contiguous, so the step needs no transposes.
    time_major = tf.transpose(hard_pots, [1, 0, 2])[:, :, :, None]  # [T, B, N, 1]
    moves = tf.transpose(hard_trans)[None, :, :, None]  # [1, N_to, N_from, 1]
    batch = tf.shape(potentials)[0]

    def step(carry, potential_t):
        # candidates[b, j, i * k + r]: rank r of tag i at t-1, then a move to j.
        candidates = tf.reshape(carry[0][:, None] + moves, [batch, num_tags, num_tags * k])
        # The kept set need not be ordered (the final top_k sorts); sorted=False is cheaper.
        # k rounds of argmax + mask instead measured ~18% faster for k=5 in tf.function,
        # but slower for k >= 8 and 2-3x slower under XLA.
        values, indices = tf.math.top_k(candidates, k=k, sorted=False)
        return values + potential_t, indices

    # Only rank 0 exists at t = 0; the other ranks start as -inf (no path).
    first_scores = tf.concat([time_major[0], tf.fill([batch, num_tags, k - 1], neg_inf)], axis=2)
    first = (first_scores, tf.zeros([batch, num_tags, k], tf.int32))
    scores, pointers = tf.scan(step, time_major[1:], initializer=first)
    scores = tf.concat([first_scores[None], scores], 0)  # [T, B, N, k]
    # Gathered time-major: transposing all T steps of scores costs more than the gather.
    at_last = tf.stack([tf.maximum(lengths - 1, 0), tf.range(batch)], axis=1)
    last = tf.reshape(tf.gather_nd(scores, at_last), [batch, num_tags * k])
    best, last_index = tf.math.top_k(last, k=k, sorted=True)
    pointers = tf.reshape(pointers, [-1, batch, num_tags * k])
    tags = _backtrack(pointers, last_index, lengths, num_steps) // k
    empty = tf.equal(lengths, 0)[:, None]
    first_rank = tf.equal(tf.range(k), 0)[None, :]
    best = tf.where(empty, tf.where(first_rank, 0.0, neg_inf), best)
    valid = tf.math.is_finite(best)
    tags = tags * tf.cast(valid, tf.int32)[:, :, None]
    return tags, best, best - log_z[:, None], valid


def apply_transition_constraints(transitions, mask):
    """Sets forbidden moves to FORBIDDEN (-1e4).

    transitions [N, N] float, mask [N, N] bool (True = allowed). Setting rather
    than adding keeps the forbidden value exact (k-best treats it as a hard
    constraint) and gives those entries zero gradient, so training cannot revive them.
    """
    transitions = tf.convert_to_tensor(transitions)
    return tf.where(tf.cast(mask, tf.bool), transitions, tf.cast(FORBIDDEN, transitions.dtype))


def apply_boundary_constraints(potentials, lengths, start_allowed=None, end_allowed=None):
    """Sets the potentials of tags that may not start / end a sequence to FORBIDDEN.

    The ops have no start/end transition vectors, so constraints on the first and
    last tags go into the potentials of position 0 and position length-1 (both for
    length 1). potentials [B, T, N] (dtype kept), lengths [B], start_allowed /
    end_allowed [N] bool or None (no constraint). Gold tags that break them get a
    log-likelihood near -1e4, so do not apply them to windows cut mid-sentence.
    """
    potentials = tf.convert_to_tensor(potentials)
    num_steps = tf.shape(potentials)[1]
    positions = tf.range(num_steps)[None, :, None]
    allowed = tf.ones_like(potentials, tf.bool)
    if start_allowed is not None:
        start = tf.cast(start_allowed, tf.bool)[None, None, :]
        allowed &= (positions != 0) | start
    if end_allowed is not None:
        end = tf.cast(end_allowed, tf.bool)[None, None, :]
        last = tf.cast(lengths, tf.int32)[:, None, None] - 1
        allowed &= (positions != last) | end
    return tf.where(allowed, potentials, tf.cast(FORBIDDEN, potentials.dtype))


SCHEMES = {
    # scheme -> (prefix of a chunk's first tag, inside, last, single); None: the scheme has no such tag.
    "IOB1": ("B", "I", None, None),
    "IOB2": ("B", "I", None, None),
    "BIOES": ("B", "I", "E", "S"),
    "BMES": ("B", "M", "E", "S"),
}


def _parse_label(label, scheme, prefixes):
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', None); other labels without a prefix -> (None, None)."""
    if label == "O":
        return "O", None
    prefix, sep, entity = label.partition("-")
    if sep and len(prefix) == 1 and prefix.isalpha() and entity:
        if prefix not in prefixes:
            raise ConfigError(
                f"label {label!r} has prefix {prefix!r}, which scheme {scheme} does not use "
                f"(its prefixes: {', '.join(sorted(prefixes))}, O)"
            )
        return prefix, entity
    return None, None


def _move_allowed(scheme, src, dst):
    """Whether tag src = (prefix, entity) may be followed by dst under the scheme."""
    (sp, se), (dp, de) = src, dst
    same = se == de
    if scheme == "IOB2":
        return dp != "I" or (sp in ("B", "I") and same)
    if scheme == "IOB1":
        return dp != "B" or (sp in ("B", "I") and same)
    inside = SCHEMES[scheme][1]
    if dp in ("O", "B", "S"):
        return sp in ("O", "E", "S")
    return sp in ("B", inside) and same  # dp is inside or E


def allowed_transitions(labels, scheme):
    """Allowed moves, first tags and last tags of a tag scheme.

    Args: labels, a sequence of N label strings ("O", "B-PER", "I-PER", "E-PER",
    "S-PER", "M-NR", ...); scheme one of "IOB1", "IOB2", "BIOES", "BMES" (BIOES
    and BMES also accept O).
    Returns numpy bool arrays (mask [N, N] with mask[i, j] = may labels[j] follow
    labels[i], start [N], end [N]).

    Labels that are neither "O" nor PREFIX-ENTITY (X, [CLS], [SEP], [PAD], ...)
    are unconstrained: every move into and out of them is allowed and they may
    start and end a sequence. That keeps word-piece continuations legal
    (B-PER X I-PER), at the price of not checking a constraint across them.
    Raises ConfigError for an unknown scheme or a prefix the scheme does not use.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    prefixes = {p for p in SCHEMES[scheme] if p is not None}
    parsed = [_parse_label(label, scheme, prefixes) for label in labels]
    n = len(parsed)
    mask = np.ones([n, n], dtype=bool)
    start = np.ones([n], dtype=bool)
    end = np.ones([n], dtype=bool)
    outside = ("O", None)
    for i, src in enumerate(parsed):
        if src[0] is None:
            continue
        # A sequence starts as if after O and ends as if followed by O.
        start[i] = _move_allowed(scheme, outside, src)
        end[i] = _move_allowed(scheme, src, outside)
        for j, dst in enumerate(parsed):
            if dst[0] is not None:
                mask[i, j] = _move_allowed(scheme, src, dst)
    return mask, start, end
