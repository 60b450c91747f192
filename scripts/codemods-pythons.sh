#!/usr/bin/env bash
# Runs the tests of the half a pre-commit hook installs (the CLI, its rules and cache; no torch) on the other
# Pythons the package supports (requires-python >= 3.10; CI's own run is on 3.11), each in a fresh venv holding
# the package's plain install and the test tools, never torch: tests that need torch skip with their reason.
#
#   scripts/codemods-pythons.sh               # 3.10 with the lowest dependencies allowed, 3.13 with the newest
#   scripts/codemods-pythons.sh 3.12 3.11:lowest   # these versions (`:lowest`: see below)
#
# `X.Y:lowest` installs the lowest release each of the package's plain dependencies allows (`libcst>=1.5` gives
# libcst 1.5.0; read from pyproject.toml), as a hook environment may hold where another tool pins them; without
# it pip takes the newest. A version this machine lacks (neither `pythonX.Y` on PATH nor in pyenv) is said and
# passed over; exit status 0 only when every version found installed and passed.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(3.10:lowest 3.13)
# The plain dependencies at their lower bounds (`name>=X` -> `name==X`, markers kept), one per line.
lowest_pins() {
    "${PYTHON:-python3}" - <<'PY'
import re, tomllib
for requirement in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    spec, _, marker = requirement.partition(";")
    match = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*>=\s*([0-9][0-9.]*)\s*", spec)
    if match is None:
        raise SystemExit(f"codemods-pythons: no lower bound to pin in {requirement!r} (expected name>=X)")
    print(f"{match[1]}=={match[2]}" + (f";{marker}" if marker else ""))
PY
}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
status=0
for requested in "${versions[@]}"; do
    version=${requested%:lowest}
    pins=()
    if [ "$version" != "$requested" ]; then
        listed=$(lowest_pins)  # (a failure stops the script here, where a process substitution's would not)
        mapfile -t pins <<<"$listed"
    fi
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
    "$venv/bin/python" -m pip install -q --disable-pip-version-check . "${pins[@]}" pytest pytest-xdist \
        'hypothesis>=6.100' 'hypothesmith>=0.3' pyyaml
    if [ ${#pins[@]} -gt 0 ]; then
        echo "codemods-pythons: Python $version with the lowest dependencies allowed: ${pins[*]}"
    fi
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
