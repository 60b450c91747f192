"""Settings for the whole suite."""

from __future__ import annotations

import os

from vllm_attn_compat.codemods.run.cachedir import NO_CACHE_VARIABLE

# The command line keeps a cache at the project's root by default. Runs of the real CLI in this suite's
# trees (and in the repository) must neither leave one behind nor answer from one another left: the tests of
# the cache itself clear this (monkeypatch) or pass --cache-dir. Set at import, before any test or
# subprocess starts; subprocesses inherit it.
os.environ[NO_CACHE_VARIABLE] = "1"
