"""The KD-NAS search loop (section 3, B): episodes of N candidates, epsilon-greedy over the controller.

Episode n (1-based):
1. epsilon_n = max(epsilon_min, epsilon_start - epsilon_decay * (n - 1)); round(epsilon_n * N) candidates
   are drawn uniformly from the unexplored states, the rest are the unexplored states the controller
   predicts the highest reward for, given the global best and previous best states.
2. Each candidate is evaluated (`evaluate(arch)` -> {"reward": ..., other fields kept}).
3. The controller is trained on every (context, state, reward) seen so far.

No state is evaluated twice. The search state (every record, the planned candidates of the running
episode) is written atomically after each evaluation and the controller's weights after each
episode, so a killed search resumes where it stopped; the random draws of episode n are seeded by
(seed, n) so a resumed search makes the same choices.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
from tqdm import tqdm

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, read_json
from xtremedistil_tf.methods.nas.controller import Controller, ControllerConfig
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace


@dataclass
class SearchConfig:
    episodes: int = 15               # M
    candidates: int = 20             # N per episode
    epsilon_start: float = 1.0       # the exploration ratio of episode 1 (`epsilon`)
    epsilon_min: float = 0.05
    epsilon_decay: float = 0.05      # per episode
    seed: int = 0


def epsilon(episode: int, config: SearchConfig) -> float:
    """Exploration ratio of 1-based `episode`."""
    return max(config.epsilon_min, config.epsilon_start - config.epsilon_decay * (episode - 1))


def best_record(records: List[dict]) -> Optional[dict]:
    return max(records, key=lambda r: r["reward"]) if records else None


def contexts(records: List[dict], episode: int) -> tuple:
    """(global best, previous best) Arch before `episode`: the best of episodes < n and of episode n-1."""
    earlier = [r for r in records if r["episode"] < episode]
    previous = [r for r in records if r["episode"] == episode - 1]
    g, p = best_record(earlier), best_record(previous)
    return (Arch.from_key(g["arch"]) if g else None), (Arch.from_key(p["arch"]) if p else None)


def plan_episode(space: SearchSpace, controller: Controller, records: List[dict], episode: int,
                 config: SearchConfig) -> List[dict]:
    """The candidates of `episode`: [{"arch": key, "source": "random"|"controller", "predicted": float|None}]."""
    explored = {r["arch"] for r in records}
    unexplored = [a for a in space.states if a.key not in explored]
    if not unexplored:
        return []
    rng = np.random.default_rng([config.seed, episode])
    count = min(config.candidates, len(unexplored))
    n_random = int(round(epsilon(episode, config) * count)) if records else count
    plan = []
    if count - n_random > 0:
        global_best, previous_best = contexts(records, episode)
        predicted = controller.predict(unexplored, global_best, previous_best)
        for index in np.argsort(-predicted, kind="stable")[: count - n_random]:
            plan.append({"arch": unexplored[index].key, "source": "controller", "predicted": float(predicted[index])})
    chosen = {p["arch"] for p in plan}
    rest = [a for a in unexplored if a.key not in chosen]
    for index in rng.choice(len(rest), size=min(n_random, len(rest)), replace=False):
        plan.append({"arch": rest[index].key, "source": "random", "predicted": None})
    return plan


def train_controller(controller: Controller, records: List[dict], epochs: Optional[int] = None) -> float:
    states = [Arch.from_key(r["arch"]) for r in records]
    gbest = [Arch.from_key(r["global_best"]) if r.get("global_best") else None for r in records]
    pbest = [Arch.from_key(r["previous_best"]) if r.get("previous_best") else None for r in records]
    return controller.fit(states, gbest, pbest, [r["reward"] for r in records], epochs)


def _fresh_state(space: SearchSpace, config: SearchConfig, controller_config: ControllerConfig, extra: dict) -> dict:
    return {"space": space.to_dict(), "search": asdict(config), "controller": asdict(controller_config),
            "settings": extra, "episodes_done": 0, "records": [], "plan": None}


def _load_state(path: Path, fresh: dict) -> dict:
    state = read_json(path)
    for key in ("space", "controller", "settings"):
        if state.get(key) != fresh[key]:
            raise ConfigError(f"{path}: the search there used other {key} ({state.get(key)} vs {fresh[key]}); "
                              "use another --work_dir or the same flags")
    old, new = dict(state["search"]), dict(fresh["search"])
    old.pop("episodes"), new.pop("episodes")  # more episodes may be asked of a finished search
    if old != new:
        raise ConfigError(f"{path}: the search there used other settings ({state['search']}); "
                          "use another --work_dir or the same flags")
    state["search"] = fresh["search"]
    return state


def run_search(space: SearchSpace, evaluate: Callable[[Arch], Dict], config: SearchConfig,
               controller_config: Optional[ControllerConfig] = None, work_dir=None, settings: Optional[dict] = None,
               progress: bool = True, stop_when: Optional[Callable[[List[dict]], bool]] = None) -> List[dict]:
    """Run (or resume, when `work_dir` holds search_state.json) the search; returns every record.

    A record: {"episode", "arch", "source", "predicted", "reward", "global_best", "previous_best", ...the
    fields `evaluate` returned}. `settings` (e.g. the proxy's data and epochs) must match on resume.
    `stop_when(records)` ends the search early (tests stop at the known optimum).
    """
    controller_config = controller_config or ControllerConfig(seed=config.seed)
    controller = Controller(space, controller_config)
    fresh = _fresh_state(space, config, controller_config, settings or {})
    state_path = Path(work_dir) / "search_state.json" if work_dir else None
    weights_path = Path(work_dir) / "controller.weights.h5" if work_dir else None
    state = _load_state(state_path, fresh) if state_path and state_path.exists() else fresh
    if weights_path and weights_path.exists() and state["episodes_done"]:
        controller.load(weights_path)
    records = state["records"]

    def save():
        if state_path:
            atomic_write_json(state_path, state)

    bar = tqdm(total=config.episodes * config.candidates, initial=len(records), desc="NAS candidates",
               disable=not progress)
    for episode in range(state["episodes_done"] + 1, config.episodes + 1):
        if stop_when and stop_when(records):
            break
        if not state["plan"] or state["plan"]["episode"] != episode:
            state["plan"] = {"episode": episode, "candidates": plan_episode(space, controller, records, episode, config)}
            save()
        if not state["plan"]["candidates"]:
            break
        global_best, previous_best = contexts(records, episode)
        done = {r["arch"] for r in records if r["episode"] == episode}
        for candidate in state["plan"]["candidates"]:
            if candidate["arch"] in done:
                continue
            result = dict(evaluate(Arch.from_key(candidate["arch"])))
            records.append({**result, **candidate, "episode": episode,
                            "global_best": global_best.key if global_best else None,
                            "previous_best": previous_best.key if previous_best else None})
            bar.update()
            save()
            if stop_when and stop_when(records):
                break
        train_controller(controller, records)
        if weights_path:
            controller.save(weights_path)
        state["episodes_done"] = episode
        state["plan"] = None
        save()
    bar.close()
    return records


def top_records(records: List[dict], k: int) -> List[dict]:
    return sorted(records, key=lambda r: -r["reward"])[:k]
