"""One module per benchmark subcommand (see xtremedistil_tf/benchmark.py)."""
