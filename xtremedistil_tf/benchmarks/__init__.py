"""One module per benchmark subcommand (see xtremedistil_tf/benchmarks/registry.py)."""
