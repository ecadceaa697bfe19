"""KD-NAS: latency-aware architecture search guided by task-agnostic distillation (docs/nas.md)."""
