"""Write docs/rules.md from the rules' docstrings and examples (``--check``: only compare).

Usage::

    python scripts/generate_rules_doc.py          # regenerate
    python scripts/generate_rules_doc.py --check  # exit 1 when docs/rules.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "rules.md"


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from vllm_attn_compat.codemods.engine.docs import render_rules
    from vllm_attn_compat.codemods.registry import all_rules

    return render_rules(all_rules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is stale: run python scripts/generate_rules_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
