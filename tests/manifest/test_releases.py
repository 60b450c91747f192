"""The manifest's releases and the resolution of a version string to one of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_attn_compat import manifest


def test_every_release_from_0_19_0_to_the_newest_patch_releases_included():
    releases = manifest.releases()
    assert releases[0] == "0.19.0"
    assert {"0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.22.1", "0.25.1", "0.27.1", "0.34.0"} <= set(releases)
    assert list(releases) == sorted(releases, key=manifest.version_key)
    assert manifest.newest() == releases[-1]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0.34.0", "0.34.0"),
        ("0.34", "0.34.0"),
        ("0.20", "0.20.2"),  # the newest patch release of the series
        ("0.20.0", "0.20.0"),
        ("v0.27.1", "0.27.1"),
        ("0.20.0+cpu", "0.20.0"),  # a local label
        (" 0.25 ", "0.25.1"),
    ],
)
def test_resolve(given, expected):
    assert manifest.resolve(given) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0.35.0.dev12+gabcdef", "0.34.0"),  # a build newer than the data
        ("0.35.0rc1", "0.34.0"),
        ("0.21.1", "0.21.0"),  # a patch release the data lacks
        ("0.20.0.post1", "0.20.0"),
        ("0.20.0rc2", "0.19.1"),  # a pre-release comes before its release
        ("0.99", "0.34.0"),
    ],
)
def test_resolve_nearest(given, expected):
    assert manifest.resolve(given, nearest=True) == expected
    with pytest.raises(manifest.UnknownRelease):
        manifest.resolve(given)


@pytest.mark.parametrize("given", ["0.18.1", "0.18", "latest", ""])
def test_unknown_releases_are_named_with_what_is_known(given):
    with pytest.raises(manifest.UnknownRelease) as raised:
        manifest.resolve(given, nearest=True)
    message = str(raised.value)
    assert repr(given) in message or "is not a version" in message
    assert "0.19.0 to " in message and "0.34.0" in message


def test_version_key_orders_as_pep_440():
    ordered = ["0.20.0.dev1", "0.20.0a1", "0.20.0b2", "0.20.0rc1", "0.20", "0.20.0.post1", "0.20.1", "0.21"]
    keys = [manifest.version_key(v) for v in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert manifest.version_key("0.20") == manifest.version_key("0.20.0")


def test_importing_and_resolving_reads_no_json_and_imports_no_torch_nor_libcst():
    code = (
        "import sys\n"
        "from vllm_attn_compat import manifest\n"
        "manifest.resolve('0.34')\n"
        "assert 'vllm_attn_compat.manifest.data' not in sys.modules\n"
        "assert 'vllm_attn_compat.manifest.query' not in sys.modules\n"
        "manifest.dead_hooks('0.34.0', 'vllm.v1.attention.backend.AttentionBackend')\n"
        "assert 'vllm_attn_compat.manifest.data' in sys.modules\n"
        "heavy = [m for m in ('torch', 'libcst', 'vllm', 'vllm_attn_compat.codemods') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
