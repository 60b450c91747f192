"""Files' SHA-256 (`run/sha256.py`): CPython's own module for a process's first half megabyte, OpenSSL's past it,
and the same digests either way."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

from vllm_attn_compat.codemods.run import sha256

PROBE = """
import json, sys
from vllm_attn_compat.codemods.run import sha256
found = []
for size in json.loads(sys.argv[1]):
    source = bytes((size * 7 + n) % 251 for n in range(size))
    found.append([sha256.digest(source).hex(), "_hashlib" in sys.modules])
print(json.dumps(found))
"""


def test_a_fresh_process_hashes_without_openssl_until_half_a_megabyte_and_the_digests_are_sha256():
    rng = random.Random(20261205)
    sizes = [0, 1, 40_000, *(rng.randrange(1, 120_000) for _ in range(12)), 600_000, 3]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(sizes)], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    total = 0
    for size, (digest, openssl) in zip(sizes, found, strict=True):
        source = bytes((size * 7 + n) % 251 for n in range(size))
        assert digest == hashlib.sha256(source).hexdigest()
        total += size
        assert openssl == (total > sha256.BUILTIN_BELOW), (size, total)


def test_in_a_process_that_has_hashlib_it_is_hashlib_s():
    assert "hashlib" in sys.modules  # (this one's: pytest imports it)
    assert sha256._implementation(0) is hashlib.sha256
