"""bin/benchmark cache on a tiny teacher's work dir: every layout is written and read back, and the sizes
order as the layouts say (no timing: only bytes and int8's error, which do not depend on the machine)."""
import numpy as np
import tensorflow as tf

from conftest import TOY_LABELS, toy_ner_sentences
from xtremedistil_tf.benchmarks import cache_size
from xtremedistil_tf.data.loading import write_jsonl
from xtremedistil_tf.teachers.model import build_teacher


def test_layouts_sizes_and_int8_error(tiny_bert_dir, tmp_path):
    tf.keras.utils.set_random_seed(0)
    teacher, tokenizer = build_teacher(str(tiny_bert_dir), TOY_LABELS, max_seq_length=32, dropout=0.0,
                                       random_init=True)
    teacher.save(tmp_path / "teacher" / "model", tokenizer)
    (tmp_path / "data").mkdir()
    write_jsonl(toy_ner_sentences(30, seed=3), tmp_path / "data" / "train.jsonl")

    rows = cache_size.measure(tmp_path, windows_wanted=24, max_seq_length=32, layer=1, topk=2)
    by_name = {row["layout"]: row for row in rows}
    assert list(by_name) == [name for name, *_ in cache_size.LAYOUTS]
    assert {row["windows"] for row in rows} == {24}
    mean_length = rows[0]["mean_length"]
    assert mean_length < 32 / 2     # toy sentences are short: most of a padded window is padding
    mb = {name: row["mb_per_1000"] for name, row in by_name.items()}
    padded, ragged, int8, topk, no_hidden = (mb[name] for name, *_ in cache_size.LAYOUTS)
    # The padding is what ragged storage saves: at least half here, since windows are under half full.
    assert ragged < padded / 2
    assert no_hidden < topk <= int8 < ragged
    assert by_name["ragged int8 + top-k logits"]["topk"] == 2
    assert np.isclose(rows[0]["factor"], 1.0) and all(row["factor"] > 1 for row in rows[1:])
    # int8 with one scale per position: error at most half a step of the row's scale (docs/cache.md).
    errors = [row["int8_error"] for row in rows if "int8_error" in row]
    assert len(errors) == 2 and 0 < max(errors) <= 1 / 254 + 1e-6
