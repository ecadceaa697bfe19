"""The latency lookup table: the additive model, caching, resuming (timers replaced by known costs)."""
import json

import pytest

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.methods.nas import latency
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace

SPACE = SearchSpace(layers=(1, 3), heads=(2, 4), hidden=(8, 16), intermediate=(16, 32), activations=("relu", "gelu"))
TEACHER = {"vocab_size": 30, "max_position_embeddings": 16, "type_vocab_size": 2, "num_hidden_layers": 2,
           "hidden_size": 16, "num_attention_heads": 4, "intermediate_size": 32}


def true_attention(heads, hidden):
    return 0.01 * heads + 0.002 * hidden


def true_ffn(hidden, intermediate, activation):
    return 0.001 * hidden * intermediate / 8 + (0.05 if activation == "gelu" else 0.0)


def true_model(config):
    """A model whose latency is exactly 1 + hidden/16 + layers * block."""
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    block = true_attention(config.get("num_attention_heads", 12), hidden) + true_ffn(
        hidden, config.get("intermediate_size", 3072), config.get("hidden_act", "gelu"))
    return 1.0 + hidden / 16 + layers * block


@pytest.fixture
def fake_timers(monkeypatch):
    calls = []

    def attention(base, heads, hidden, lengths, runs, reps):
        calls.append(("attention", heads, hidden))
        return true_attention(heads, hidden)

    def ffn(base, hidden, intermediate, activation, lengths, runs, reps):
        calls.append(("ffn", hidden, intermediate, activation))
        return true_ffn(hidden, intermediate, activation)

    def model(config, lengths, runs):
        calls.append(("model", config["num_hidden_layers"], config["hidden_size"]))
        return true_model(config)

    monkeypatch.setattr(latency, "attention_latency", attention)
    monkeypatch.setattr(latency, "ffn_latency", ffn)
    monkeypatch.setattr(latency, "model_latency", model)
    return calls


def test_table_predicts_every_state_from_sub_blocks_and_overheads(tmp_path, fake_timers):
    verify = [Arch(3, 4, 16, 32, "gelu"), Arch(1, 2, 8, 16, "relu")]
    table = latency.build_latency_table(tmp_path / "t.json", SPACE, TEACHER, [4, 8], runs=1, verify=verify,
                                        progress=False)
    # 4 attention (heads x hidden) + 8 FFN (hidden x intermediate x activation) timings, not 32 states.
    assert sum(c[0] == "attention" for c in fake_timers) == 4 and sum(c[0] == "ffn" for c in fake_timers) == 8
    for arch in SPACE.states:
        assert table.latency(arch) == pytest.approx(true_model(arch.bert_config()))
    assert table.teacher_ms == pytest.approx(true_model(TEACHER))
    assert table.verification_error() == pytest.approx(0.0, abs=1e-12)
    assert json.loads((tmp_path / "t.json").read_text())["complete"] is True


def test_cached_table_is_reused_and_interrupted_build_resumes(tmp_path, fake_timers, monkeypatch):
    path = tmp_path / "t.json"
    real_ffn = latency.ffn_latency
    count = {"n": 0}

    def dying_ffn(*args, **kwargs):
        count["n"] += 1
        if count["n"] == 6:
            raise KeyboardInterrupt
        return real_ffn(*args, **kwargs)

    monkeypatch.setattr(latency, "ffn_latency", dying_ffn)
    with pytest.raises(KeyboardInterrupt):
        latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False, save_every=2)
    partial = json.loads(path.read_text())
    assert partial["complete"] is False and len(partial["attention"]) == 4 and len(partial["ffn"]) == 4
    monkeypatch.setattr(latency, "ffn_latency", real_ffn)
    fake_timers.clear()
    latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False)
    assert sum(c[0] == "ffn" for c in fake_timers) == 4 and not any(c[0] == "attention" for c in fake_timers)
    fake_timers.clear()
    table = latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False)
    assert fake_timers == [] and table.latency(Arch(3, 4, 16, 32, "gelu")) == pytest.approx(
        true_model(Arch(3, 4, 16, 32, "gelu").bert_config()))
    with pytest.raises(ConfigError, match="other settings"):
        latency.build_latency_table(path, SPACE, TEACHER, [4, 8], runs=1, progress=False)


@pytest.mark.slow
def test_real_timers_measure_bigger_blocks_as_slower():
    base = {"vocab_size": 30, "max_position_embeddings": 64, "type_vocab_size": 2}
    # 64 pieces: the 64x larger FFN is compute, not call overhead, so a busy machine cannot swap them.
    small = latency.ffn_latency(base, 32, 64, "relu", [64], runs=3, reps=2)
    large = latency.ffn_latency(base, 32, 4096, "relu", [64], runs=3, reps=2)
    assert 0 < small < large
    assert latency.attention_latency(base, 2, 32, [8], runs=2, reps=2) > 0
    assert latency.model_latency({**base, "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                  "intermediate_size": 64}, [8], runs=2) > 0


def test_finished_table_is_read_under_other_threads_but_a_partial_one_is_not_resumed(tmp_path, fake_timers):
    path = tmp_path / "t.json"
    latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False)
    data = json.loads(path.read_text())
    data["settings"]["intra_op_threads"] += 7  # as if built by a process with other threads
    path.write_text(json.dumps(data))
    fake_timers.clear()
    latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False)
    assert fake_timers == []
    data["complete"] = False
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="other settings"):
        latency.build_latency_table(path, SPACE, TEACHER, [4], runs=1, progress=False)
