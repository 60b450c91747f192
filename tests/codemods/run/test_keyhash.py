"""The hash naming what the cache keeps (`run/keyhash.py`): hashlib's BLAKE2b of 32 bytes, without hashlib."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from vllm_attn_compat.codemods.run import keyhash


def test_it_is_hashlib_s_blake2b_of_32_bytes():
    for data in (b"", b"key", bytes(range(256)) * 40):
        assert keyhash.hexdigest(data) == hashlib.blake2b(data, digest_size=32).hexdigest()
        made = keyhash.new(data[:7])
        made.update(data[7:])
        assert made.hexdigest() == keyhash.hexdigest(data)


def test_it_does_not_load_openssl():
    probe = (
        "import sys\nfrom vllm_attn_compat.codemods.run import keyhash\n"
        "keyhash.hexdigest(b'x')\nprint('_hashlib' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split() == ["False"]
