#!/usr/bin/env bash
# Runs the tests of the half a pre-commit hook installs (the CLI, its rules and cache; no torch) on the other
# Pythons the package supports (requires-python >= 3.10; CI's own run is on 3.11), each in a fresh venv holding
# the package's plain install and the test tools, never torch: tests that need torch skip with their reason.
#
#   scripts/codemods-pythons.sh               # 3.10 and 3.13 where this machine has them
#   scripts/codemods-pythons.sh 3.12          # these versions
#
# A version this machine lacks (neither `pythonX.Y` on PATH nor in pyenv) is said and passed over; exit status 0
# only when every version found installed and passed.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(3.10 3.13)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
status=0
for version in "${versions[@]}"; do
    python=$(command -v "python$version" || true)
    if { [ -z "$python" ] || ! "$python" -c pass 2>/dev/null; } && command -v pyenv >/dev/null; then
        # (pyenv's shim of a version it does not enable is on PATH but does not run)
        found=$(pyenv versions --bare | grep -E "^$version(\.[0-9]+)?$" | tail -1 || true)
        python=$([ -n "$found" ] && echo "$(pyenv prefix "$found")/bin/python" || true)
    fi
    if [ -z "$python" ] || ! "$python" -c pass 2>/dev/null; then
        echo "codemods-pythons: Python $version: not on this machine, passed over"
        continue
    fi
    venv="$root/$version"
    "$python" -m venv "$venv"
    # The plain install (what the hooks get), then the test tools of the `test` extra but torch.
    "$venv/bin/python" -m pip install -q --disable-pip-version-check . pytest pytest-xdist 'hypothesis>=6.100' \
        'hypothesmith>=0.3' pyyaml
    if (cd "$root" && "$venv/bin/python" -c "import torch" 2>/dev/null); then
        echo "codemods-pythons: Python $version: torch got installed, which this run is without" >&2
        exit 1
    fi
    if "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider \
        tests/codemods tests/test_without_torch.py tests/test_import_graph.py; then
        echo "codemods-pythons: Python $version: passed"
    else
        echo "codemods-pythons: Python $version: FAILED"
        status=1
    fi
done
exit $status
