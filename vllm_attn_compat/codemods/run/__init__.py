"""A run over many files: discovery, reading and the prefilter, the index rounds, the worker processes and the
hand-off to them, the cache, the atomic writes, the report and the configuration."""
