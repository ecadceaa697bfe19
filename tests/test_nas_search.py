"""KD-NAS space, reward, controller and search loop on synthetic rewards (no distillation)."""
import numpy as np
import pytest
from scipy.stats import spearmanr

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.nas.controller import Controller, ControllerConfig
from xtremedistil_tf.methods.nas.reward import reward
from xtremedistil_tf.methods.nas.search import SearchConfig, epsilon, plan_episode, run_search
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace

ACTIVATION_COST = {"gelu": 1.0, "relu": 0.9, "silu": 0.95}


def synthetic(arch: Arch) -> dict:
    """A reward shaped like the real one: a latency growing with width and depth, a loss falling with
    capacity, with activation and head effects, through Eq. 4."""
    latency = 0.5 + arch.layers * arch.hidden * (arch.hidden + 2 * arch.intermediate) * \
        ACTIVATION_COST[arch.activation] / 3e5 + 0.02 * arch.heads
    loss = (0.05 + 0.6 / (1 + arch.layers * arch.hidden / 600) + 0.05 * 384 / arch.intermediate
            + 0.03 * (arch.activation == "relu") + 0.02 * abs(arch.heads - 6) / 6)
    return {"loss": loss, "latency_ms": latency, "reward": reward(loss, latency, 20.0)}


def test_table1_space_has_2400_valid_states():
    space = SearchSpace()
    assert len(space.states) == 2400 == len(set(space.states))
    assert all(a.hidden % a.heads == 0 for a in space.states)
    odd = SearchSpace(layers=(2,), heads=(3, 4), hidden=(8, 12), intermediate=(16,), activations=("gelu",))
    assert [a.key for a in odd.states] == ["2,3,12,16,gelu", "2,4,8,16,gelu", "2,4,12,16,gelu"]
    assert {a.layers for a in space.restricted_to_depth(6).states} == {3, 4, 6}
    arch = Arch(4, 12, 576, 768, "gelu")
    assert Arch.from_key(arch.key) == arch
    code = space.encode(arch)
    assert code.shape == (space.encoding_size,) == (25,) and code.sum() == 5
    with pytest.raises(ConfigError, match="not among"):
        space.encode(Arch(5, 12, 576, 768, "gelu"))


def test_reward_closed_form():
    # At the target latency (beta * teacher) the latency factor is 1.
    assert reward(0.05, 0.6 * 50.0, 50.0) == pytest.approx(0.95)
    assert reward(0.1, 10.0, 50.0) == pytest.approx(0.9 * (10 / 30) ** -0.06)
    assert reward(0.1, 10.0, 50.0, alpha=0.0) == pytest.approx(0.9)
    assert reward(0.1, 10.0, 50.0) > reward(0.1, 20.0, 50.0)  # faster is better at equal loss
    assert reward(0.1, 10.0, 50.0) > reward(0.2, 10.0, 50.0)  # lower loss is better at equal latency
    with pytest.raises(ConfigError):
        reward(0.1, 0.0, 50.0)


def test_epsilon_decays_from_one_to_the_floor():
    config = SearchConfig()
    assert [round(epsilon(n, config), 2) for n in (1, 2, 10, 19, 20, 40)] == [1.0, 0.95, 0.55, 0.1, 0.05, 0.05]


def test_controller_ranks_unseen_states_of_a_synthetic_reward():
    space = SearchSpace()
    states = space.states
    order = np.random.default_rng(0).permutation(len(states))
    train, unseen = [states[i] for i in order[:200]], [states[i] for i in order[200:700]]
    rewards = [synthetic(a)["reward"] for a in train]
    best = train[int(np.argmax(rewards))]
    controller = Controller(space, ControllerConfig(learning_rate=1e-2, decay_steps=1000, epochs=40,
                                                    batch_size=32))
    controller.fit(train, [best] * len(train), [None] * len(train), rewards)
    predicted = controller.predict(unseen, best, None)
    assert spearmanr(predicted, [synthetic(a)["reward"] for a in unseen]).correlation > 0.8


def test_controller_save_and_load_keep_its_predictions(tmp_path):
    """Resuming a search restores the controller's weights and its reward scale."""
    space = SearchSpace(layers=(3, 4), heads=(2, 4), hidden=(8,), intermediate=(16, 32), activations=("relu",))
    states = space.states
    controller = Controller(space, ControllerConfig(epochs=2, learning_rate=1e-2))
    controller.fit(states, [states[0]] * len(states), [None] * len(states), [10.0 + i for i in range(len(states))])
    controller.save(tmp_path / "controller.weights.h5")
    restored = Controller(space, ControllerConfig(seed=1))
    restored.load(tmp_path / "controller.weights.h5")
    assert (restored.reward_mean, restored.reward_std) == (controller.reward_mean, controller.reward_std)
    assert controller.reward_mean > 10  # the scale is not the default (0, 1), so the check bites
    np.testing.assert_allclose(restored.predict(states, states[0], None), controller.predict(states, states[0], None),
                               rtol=1e-5)


def test_plan_mixes_controller_and_random_picks_and_never_repeats():
    space = SearchSpace(layers=(3, 4), heads=(2, 4), hidden=(8,), intermediate=(16, 32), activations=("relu",))
    controller = Controller(space, ControllerConfig(epochs=1))
    config = SearchConfig(candidates=4, epsilon_start=0.5, epsilon_decay=0.0)
    records = [{"episode": 1, "arch": "3,2,8,16,relu", "reward": 1.0}, {"episode": 1, "arch": "4,4,8,32,relu", "reward": 0.5}]
    plan = plan_episode(space, controller, records, 2, config)
    assert sorted(p["source"] for p in plan) == ["controller", "controller", "random", "random"]
    unexplored = {a.key for a in space.states} - {r["arch"] for r in records}
    assert len({p["arch"] for p in plan}) == 4 and {p["arch"] for p in plan} <= unexplored
    assert plan_episode(space, controller, records, 2, config) == plan  # seeded by (seed, episode)


def evaluations_until(records, arch_key):
    """1-based position of `arch_key` in evaluation order, None when it was never evaluated."""
    return next((n for n, r in enumerate(records, start=1) if r["arch"] == arch_key), None)


def _find_optimum(space, seed, budget):
    optimum = max(space.states, key=lambda a: synthetic(a)["reward"]).key
    config = SearchConfig(episodes=budget, candidates=20, epsilon_decay=0.25, epsilon_min=0.05, seed=seed)
    records = run_search(space, synthetic, config,
                         ControllerConfig(learning_rate=1e-2, decay_steps=1000, epochs=20, batch_size=32, seed=seed),
                         progress=False, stop_when=lambda rs: any(r["arch"] == optimum for r in rs))
    return evaluations_until(records, optimum) or len(space.states)


@pytest.mark.slow
def test_search_finds_the_optimum_faster_than_random_sampling_over_seeds():
    space = SearchSpace()
    optimum = max(space.states, key=lambda a: synthetic(a)["reward"]).key
    searched = [_find_optimum(space, seed, budget=40) for seed in range(3)]
    random = [1 + list(np.random.default_rng(seed).permutation([a.key for a in space.states])).index(optimum)
              for seed in range(3)]
    # Random sampling without replacement needs (2400 + 1) / 2 evaluations on average.
    assert np.mean(searched) < np.mean(random)
    assert np.mean(searched) < (len(space.states) + 1) / 2


@pytest.mark.slow
def test_search_on_a_small_space_beats_random_sampling_over_seeds():
    space = SearchSpace(layers=(3, 6, 12), heads=(2, 12), hidden=(288, 768), intermediate=(384, 1024, 3072),
                        activations=("gelu", "relu", "silu"))  # 108 states
    optimum = max(space.states, key=lambda a: synthetic(a)["reward"]).key
    searched = [_find_optimum(space, seed, budget=6) for seed in range(3)]
    random = [1 + list(np.random.default_rng(seed).permutation([a.key for a in space.states])).index(optimum)
              for seed in range(3)]
    assert np.mean(searched) < min(np.mean(random), (len(space.states) + 1) / 2)


def test_search_resumes_without_evaluating_a_state_twice(tmp_path):
    space = SearchSpace(layers=(3, 4), heads=(2, 4), hidden=(8,), intermediate=(16, 32), activations=("relu", "gelu"))
    calls = []

    def evaluate(arch):
        calls.append(arch.key)
        return synthetic(Arch(arch.layers, arch.heads, 288, 384 * arch.intermediate // 16, arch.activation))

    controller = ControllerConfig(epochs=2)
    first = run_search(space, evaluate, SearchConfig(episodes=1, candidates=3), controller, tmp_path, progress=False)
    assert (tmp_path / "search_state.json").exists() and (tmp_path / "controller.weights.h5").exists()
    both = run_search(space, evaluate, SearchConfig(episodes=2, candidates=3), controller, tmp_path, progress=False)
    assert both[:3] == first and [r["episode"] for r in both] == [1, 1, 1, 2, 2, 2]
    assert len(calls) == len(set(calls)) == 6
    assert both[3]["global_best"] == max(first, key=lambda r: r["reward"])["arch"]
    with pytest.raises(ConfigError, match="other settings"):
        run_search(space, evaluate, SearchConfig(episodes=2, candidates=4), controller, tmp_path, progress=False)
