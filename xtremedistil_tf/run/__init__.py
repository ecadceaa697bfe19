"""Running the pipeline: bin/train's steps over one locked work dir, the ablations, report.md and its probes."""
