"""Command-line entry points. Each module exposes `main(argv)` for absl and `run()` for console scripts.

The scripts in bin/ are thin wrappers that call `run()`.
"""
