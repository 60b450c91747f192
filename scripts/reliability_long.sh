#!/usr/bin/env bash
# The long mode of the reliability tier (docs/reliability.md): thousands of hypothesis examples, fresh
# random inputs on each run, 60 SIGKILL trials, 50,000 comment lines in the large-file case; among them 1,500
# generated plugins reached in dynamic ways (test_generated_dynamic_uses.py, about five minutes alone:
#   VAC_RELIABILITY=long python -m pytest tests/reliability/test_generated_dynamic_uses.py).
# Not run by CI; takes tens of minutes on two cores. Reproduce a failure with the seed it prints:
#   scripts/reliability_long.sh --hypothesis-seed=<seed>
set -euo pipefail
cd "$(dirname "$0")/.."
export VAC_RELIABILITY=long
seed="${VAC_RELIABILITY_SEED:-$RANDOM$RANDOM}"
echo "reliability long mode, hypothesis seed ${seed}"
exec python -m pytest tests/reliability -q -rxX --hypothesis-seed="${seed}" --hypothesis-show-statistics "$@"
