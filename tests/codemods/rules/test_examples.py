"""Every example a rule declares is a test: its source, fixed and unfixed, must come out as the
example says, with the findings it lists. The same examples are the rules' documentation."""

from __future__ import annotations

import ast

import pytest

from vllm_attn_compat.codemods.registry import all_rules

from rule_testing import run, statuses

CASES = [
    pytest.param(rule, example, id=f"{rule.code}-{index}")
    for rule in all_rules()
    for index, example in enumerate(rule.examples)
]


@pytest.mark.parametrize(("rule", "example"), CASES)
@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_example(rule, example, unsafe):
    result = run(example.source(), [rule.code], unsafe=unsafe, path="example.py", target=example.release())
    expected = example.expected(unsafe=unsafe)
    assert result.source.decode() == expected
    ast.parse(expected)
    assert [f.code for f in result.findings] == [rule.code] * len(result.findings)
    expected_statuses = [
        s if not (unsafe and s.value == "unsafe-fix-available") else type(s)("fixed") for s in example.findings
    ]
    assert statuses(result) == expected_statuses


def test_every_rule_has_a_changing_and_an_unchanged_example():
    for rule in all_rules():
        assert any(e.expected(unsafe=True) != e.source() or e.findings for e in rule.examples), rule.code
        assert any(e.after is None and e.unsafe_after is None and not e.findings for e in rule.examples), rule.code


def test_unchanged_examples_come_out_byte_identical():
    for rule in all_rules():
        for example in rule.examples:
            if example.after is None and example.unsafe_after is None:
                for unsafe in (False, True):
                    migrated = run(
                        example.source(), [rule.code], unsafe=unsafe, path="example.py", target=example.release()
                    )
                    assert migrated.source == example.source().encode()


def _both_ways(rule, example, unsafe: bool):
    """The example migrated through every stub `spans` can make of it (however little that saves), and whole:
    the two results, and whether anything was stubbed."""
    from vllm_attn_compat.codemods.engine import spans
    from vllm_attn_compat.codemods.engine.migrate import migrate_source
    from vllm_attn_compat.codemods.index.hierarchy import ClassHierarchy, index_module

    source = example.source().encode()
    settings = dict(
        path="example.py",
        rules=[rule],
        hierarchy=ClassHierarchy.build([index_module(source, "example.py")]),
        unsafe_fixes=unsafe,
        target=example.release(),
    )
    saved, reduce, made = spans._MIN_SAVED, spans.reduce, []
    spans._MIN_SAVED = -(1 << 30)
    spans.reduce = lambda *args, **kwargs: made.append(reduce(*args, **kwargs)) or made[-1]
    try:
        stubbed = migrate_source(source, **settings, reduce_spans=True)
    finally:
        spans._MIN_SAVED, spans.reduce = saved, reduce
    whole = migrate_source(source, **settings, reduce_spans=False)
    results = [(r.source, r.findings, r.removed_comments) for r in (stubbed, whole)]
    return results[0], results[1], any(reduction is not None for reduction in made)


@pytest.mark.parametrize(("rule", "example"), CASES)
@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
def test_example_migrates_the_same_with_the_code_the_rule_does_not_read_stubbed(rule, example, unsafe):
    """A rule declares what it matches and reads (`Rule.tokens`, `Rule.reads`); libcst is handed the rest as stubs
    (`engine/spans.py`). Every example, stubbed wherever it can be, migrates as the whole file does: a rule that
    reads code it does not declare fails here, on its own examples, rather than seeing a stub in a real run."""
    stubbed, whole, _ = _both_ways(rule, example, unsafe)
    assert stubbed == whole


DECLARED = [
    pytest.param(rule, what, id=f"{rule.code}-{what}")
    for rule in all_rules()
    for what in ("reads", "reads_in_class", "reads_statements")
    if getattr(rule, what)
]


@pytest.mark.parametrize(("rule", "what"), DECLARED)
def test_a_rule_declaring_less_than_it_reads_fails_its_own_examples(rule, what, monkeypatch):
    """Each declaration of what a rule reads is needed, and its examples show it: VAC007 reads a layer's shape from
    the attributes its other methods set, VAC008 the imports that bind the forwarders, VAC001, VAC003 and VAC009
    the statements naming `output`. Without the declaration, some example comes out otherwise."""
    monkeypatch.setattr(rule, what, ())
    assert any(
        stubbed != whole
        for example in rule.examples
        for unsafe in (False, True)
        for stubbed, whole, _ in [_both_ways(rule, example, unsafe)]
    )
