"""The input files a run's data step reads, for the work dir's content fingerprint (run/workdir.py)."""
from __future__ import annotations

from typing import Dict

from xtremedistil_tf.data.loading import DataConfig, _path

WIKIANN_SPLITS = ("train", "dev", "test")


def input_files(cfg: DataConfig) -> Dict[str, str]:
    """{path: the flag that names it} of every file load_splits(cfg) reads (none for the demo
    corpus or a --data_source: those come from packages and TFDS, fingerprinted by their flags)."""
    files: Dict[str, str] = {}
    if cfg.format == "wikiann" and not cfg.source:
        for lang in cfg.langs:
            for split in WIKIANN_SPLITS:
                files[str(_path(cfg, f"{lang}/{split}"))] = f"--data_dir (--langs={lang}, {split})"
    elif cfg.format != "demo" and not cfg.source:
        for name in ("train_file", "dev_file", "test_file"):
            if getattr(cfg, name):
                path = _path(cfg, getattr(cfg, name))
                files[str(path)] = f"--{name}"
                if cfg.format == "hf" and path.is_dir():   # a save_to_disk folder: the files it holds
                    for inner in sorted(p for p in path.rglob("*") if p.is_file()):
                        files[str(inner)] = f"--{name} ({inner.relative_to(path)})"
    if cfg.transfer_file:
        files[str(_path(cfg, cfg.transfer_file))] = "--transfer_file"
    return files
