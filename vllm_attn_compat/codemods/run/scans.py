"""The questions a run asks of a file's bytes, each made from its kind and its terms alone.

`runner` asks them through `answers.Answers`, which keeps each answer by the file's digest and the question;
`bystanders` asks a file an edit changed the questions the run before asked of its old bytes. Both make a
question's test here, from the same kind and terms, so a rerun cannot ask a different question than a run.

The terms are spelled as `answers.spell` spells them (strings; tokens decoded with ``surrogateescape``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_attn_compat.codemods.engine.rule import Rule

Test = Callable[[bytes], bool]

# The kinds a rerun can ask again (``scan``, whose answer is a class scan, is not one: a file it was asked of
# took part in the run's class index).
KINDS = frozenset({"prefilter", "probable", "vllm", "flag", "words", "uses", "names", "parse"})


class UnknownQuestion(ValueError):
    """A kind of question this version of the package does not know."""


def test(kind: str, terms: Sequence[str], *, once: bool = False) -> Test:
    """The test of the question ``kind`` with ``terms``: a function of a file's bytes (``once``: of a file or
    two, made for that, `scan.TokenScan`).

    * ``prefilter``: holds one of the tokens ``terms`` (a rule's token: worth parsing at all);
    * ``probable``: will probably need libcst for the rules of ``terms`` (`rule_terms`; `tokens.probably_libcst`);
    * ``vllm``: names vLLM; ``flag``: holds ``accept_output_buffer`` (no terms);
    * ``words``: names one of the attention classes ``terms`` as a whole identifier;
    * ``uses``: may use one of the methods ``terms`` (`calltext.may_use`);
    * ``names``: holds one of the names ``terms`` whose fixes the accounting still decides (`calltext.holds_names`);
    * ``parse``: needs libcst for the rules of ``terms`` where the attention classes are ``class NAME``
      (`tokens.needs_libcst`).
    """
    from vllm_attn_compat.codemods.run.scan import TokenScan

    if kind == "prefilter":
        return TokenScan(_encoded(terms), once=once)
    if kind == "words":
        return TokenScan(_encoded(terms), whole_words=True, once=once)
    if kind == "vllm":
        return lambda source: b"vllm" in source
    if kind == "flag":
        from vllm_attn_compat.codemods.index.names import FLAG_BYTES

        return lambda source: FLAG_BYTES in source
    if kind == "uses":
        from vllm_attn_compat.codemods.index import calltext

        methods = frozenset(terms)
        pattern = calltext.uses_pattern(methods)
        return lambda source: calltext.may_use(source, methods, pattern)
    if kind == "names":
        from vllm_attn_compat.codemods.index import calltext

        needles = calltext.names_needles(frozenset(terms))
        return lambda source: calltext.holds_names(source, needles)
    if kind == "probable" or kind == "parse":
        from vllm_attn_compat.codemods.engine import tokens

        anywhere = tuple(_encoded(_after(terms, "anywhere ")))
        scoped = tuple(_encoded(_after(terms, "scoped ")))
        if kind == "probable":
            return lambda source: tokens.probably_libcst(source, anywhere, scoped)
        names = tuple(_after(terms, "class "))
        return lambda source: tokens.needs_libcst(source, anywhere, scoped, names)
    raise UnknownQuestion(f"unknown kind of question {kind!r}: expected one of {', '.join(sorted(KINDS))}")


def rule_terms(rules: Iterable[type[Rule]]) -> list[str]:
    """The terms of the questions ``probable`` and ``parse`` that stand for ``rules``: their own tokens, by
    whether they act anywhere or only in attention code (`engine.tokens`)."""
    from vllm_attn_compat.codemods.engine.tokens import own_tokens

    rules = list(rules)
    return [
        *(f"anywhere {token.decode('utf-8', 'surrogateescape')}" for token in own_tokens(rules, scoped=False)),
        *(f"scoped {token.decode('utf-8', 'surrogateescape')}" for token in own_tokens(rules, scoped=True)),
    ]


def _after(terms: Sequence[str], prefix: str) -> list[str]:
    return [term.removeprefix(prefix) for term in terms if term.startswith(prefix)]


def _encoded(terms: Sequence[str]) -> list[bytes]:
    return [term.encode("utf-8", "surrogateescape") for term in terms]
