"""The distillation methods as tasks on the engine: staged XtremeDistil (strategies D0..D4.2), multi-grained KD, sentence classification, optimal subwords (subwords/) and KD-NAS (nas/)."""
