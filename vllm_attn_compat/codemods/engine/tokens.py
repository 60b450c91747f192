"""Whether libcst must see a file, by the rules' tokens alone: the rules' own tokens, split into those of rules
that act anywhere and those of rules scoped to attention code (`Rule.scoped`).

In terms of tokens, not rules, so that a rerun asks a changed file these questions again without importing a
rule (`run.scans`); `migrate.needs_parsing` is `needs_libcst` of the rules' tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from vllm_attn_compat.codemods.index.names import BASE_TOKENS

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.rule import Rule


def own_tokens(rules: Iterable[type[Rule]], *, scoped: bool) -> tuple[bytes, ...]:
    """The tokens of the rules that act anywhere (``scoped`` False) or only in attention code (True)."""
    return tuple(dict.fromkeys(token for rule in rules if rule.scoped == scoped for token in rule.tokens))


def needs_libcst(
    source: bytes, anywhere: Sequence[bytes], scoped: Sequence[bytes], class_names: Iterable[str] = ()
) -> bool:
    """Some rule has its own token in ``source``, and, for a rule scoped to attention code (``scoped``: the
    tokens of those), a scope token (`BASE_TOKENS`) or the name of an attention class of the run too."""
    if holds(source, tuple(anywhere)):
        return True
    if not holds(source, tuple(scoped)):
        return False
    return holds(source, BASE_TOKENS) or any(name.encode() in source for name in class_names)


def probably_libcst(source: bytes, anywhere: Sequence[bytes], scoped: Sequence[bytes]) -> bool:
    """Whether libcst will probably parse this file: it holds the token of a rule that acts anywhere,
    or mentions vLLM and holds a scoped rule's token and a scope token too. A file naming ``class Attention(``
    alone (torch has one) is left to the hierarchy pass: most such classes are no vLLM attention class."""
    return holds(source, tuple(anywhere)) or (b"vllm" in source and needs_libcst(source, (), scoped))


def holds(source: bytes, tokens: tuple[bytes, ...]) -> bool:
    """``any(token in source for token in tokens)``, by anchors (`scan.TokenScan`): the rules' tokens are asked of
    hundreds of files, VAC011's sixty-nine each time."""
    return _scan(tokens)(source)


@functools.lru_cache(maxsize=64)
def _scan(tokens: tuple[bytes, ...]) -> Callable[[bytes], bool]:
    from vllm_attn_compat.codemods.engine.scan import TokenScan

    return TokenScan(tokens, once=len(tokens) < 3)
