"""A run over many files: discovery, reading and the prefilter, the class hierarchy's rounds, the worker
processes, the cache, the atomic writes, the report and the configuration."""
