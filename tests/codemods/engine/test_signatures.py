"""`signatures.drift` and `signatures.misfit` against Python itself: an override is compatible exactly when every
call vLLM makes binds (its required arguments by position, those it names by name, any of the defaulted ones by
name), over overrides generated from the manifest's own hooks."""

from __future__ import annotations

import inspect

import pytest

from vllm_attn_compat.codemods.engine import signatures
from vllm_attn_compat.codemods.rules.vac012_signature_drift import PASSED_BY_NAME
from vllm_attn_compat.manifest import Parameter, Signature
from vllm_attn_compat.manifest.interface import base_member

HOOKS = [
    ("vllm.v1.attention.backend.AttentionBackend", "validate_configuration"),
    ("vllm.v1.attention.backend.AttentionBackend", "supports_combination"),
    ("vllm.v1.attention.backend.AttentionImpl", "forward"),
    ("vllm.v1.attention.backend.MLAAttentionImpl", "forward_mha"),
    ("vllm.v1.attention.backend.MLAAttentionImpl", "do_kv_cache_update"),
    ("vllm.model_executor.layers.attention.mla_attention.MLACommonMetadataBuilder", "_build_decode"),
]


def _base(owner: str, name: str) -> tuple[Signature, object]:
    member = base_member("0.34.0", (owner,), name)
    assert member is not None and member.signature is not None, (owner, name)
    return signatures.bound(member.signature, member.kind), PASSED_BY_NAME.get(name, frozenset())


def _source(parameters: list[str]) -> str:
    return f"def override({', '.join(parameters)}):\n    pass\n"


def _overrides(base: Signature) -> list[list[str]]:
    """Parameter lists a plugin's override may have: the base's, each parameter dropped, renamed, given or denied a
    default, two swapped, the tail made keyword-only, with ``*args``/``**kwargs``, with a parameter of its own."""
    plain = [p.name if p.default is None else f"{p.name}=None" for p in base.parameters]
    found = [plain, [*plain, "**kwargs"], ["*args", "**kwargs"], [*plain, "extra"], [*plain, "extra=None"]]
    for index, parameter in enumerate(plain):
        name = parameter.partition("=")[0]
        found.append(plain[:index] + plain[index + 1 :])
        found.append([*(plain[:index] + plain[index + 1 :]), "**kwargs"])
        found.append([*plain[:index], f"renamed{index}", *plain[index + 1 :]])
        found.append([*plain[:index], f"{name}=None", *plain[index + 1 :]])
        if index + 1 < len(plain):
            swapped = list(plain)
            swapped[index], swapped[index + 1] = swapped[index + 1], swapped[index]
            found.append(swapped)
        found.append([*plain[:index], "*", *(p if "=" in p else f"{p}=None" for p in plain[index:])])
    return [parameters for parameters in found if _valid(parameters)]


def _valid(parameters: list[str]) -> bool:
    try:
        compile(_source(parameters), "override.py", "exec")
    except SyntaxError:  # a required parameter after a defaulted one
        return False
    return True


def _signature(function: object) -> Signature:
    return Signature(
        tuple(
            Parameter(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else "None", None)  # type: ignore[arg-type]
            for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
        ),
        None,
    )


def _vllm_calls(base: Signature, named: object) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """The calls vLLM may make: its required arguments by position but for those it names, and none, each, or all
    of the defaulted ones by name."""
    positional = tuple(p.name for p in base.parameters if p.default is None and p.name not in named)  # type: ignore[operator]
    keywords = {p.name: p.name for p in base.parameters if p.default is None and p.name in named}  # type: ignore[operator]
    defaulted = [p.name for p in base.parameters if p.default is not None]
    choices = [[], defaulted, *([name] for name in defaulted)]
    return [(positional, {**keywords, **{name: name for name in chosen}}) for chosen in choices]


def _binds_every_call(function: object, calls: list[tuple[tuple[str, ...], dict[str, str]]]) -> bool:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    for args, kwargs in calls:
        try:
            signature.bind(*args, **kwargs)
        except TypeError:
            return False
    return True


@pytest.mark.parametrize(("owner", "name"), HOOKS, ids=[name for _, name in HOOKS])
def test_drift_is_compatible_exactly_when_every_call_vllm_makes_binds(owner: str, name: str) -> None:
    base, named = _base(owner, name)
    calls = _vllm_calls(base, named)
    checked = 0
    for parameters in _overrides(base):
        namespace: dict[str, object] = {}
        exec(compile(_source(parameters), "override.py", "exec"), namespace)
        function = namespace["override"]
        found = _signature(function)
        binds = _binds_every_call(function, calls)
        assert signatures.drift(base, found, named).compatible is binds, parameters  # type: ignore[arg-type]
        if signatures.misfit(base, found, named) is not None:  # type: ignore[arg-type]
            assert not binds, parameters
        checked += 1
    assert checked > 20


def test_misfit_names_what_the_override_lacks_or_fills_twice() -> None:
    base, named = _base("vllm.v1.attention.backend.AttentionBackend", "supports_combination")
    lacks = Signature(tuple(p for p in base.parameters if p.name != "use_mm_prefix"), None)
    misfit = signatures.misfit(base, lacks, named)  # type: ignore[arg-type]
    assert misfit is not None
    assert (misfit.passed, misfit.takes, misfit.clashes) == (9, 8, ())
    assert [p.name for p in misfit.lacked] == ["use_mm_prefix"]

    base, named = _base("vllm.v1.attention.backend.AttentionImpl", "forward")
    no_layer = Signature(
        tuple(
            Parameter(p.name, "POSITIONAL_OR_KEYWORD", "None" if p.name == "output" else p.default, None)
            for p in base.parameters
            if p.name != "layer"
        ),
        None,
    )
    misfit = signatures.misfit(base, no_layer, named)  # type: ignore[arg-type]
    assert misfit is not None
    assert misfit.clashes == ("output",)
    assert [p.name for p in misfit.lacked] == ["layer"]

    renamed = Signature(tuple(p._replace(name=f"x{i}") for i, p in enumerate(base.parameters[:3])), None)
    misfit = signatures.misfit(base, renamed, named)  # type: ignore[arg-type]
    assert misfit is not None and misfit.lacked == ()  # names of its own: which it lacks is not for us to say


# Where the manifest declares each hook vLLM passes arguments of by name.
OWNERS = {
    "validate_configuration": "vllm.v1.attention.backend.AttentionBackend",
    "_build_decode": "vllm.model_executor.layers.attention.mla_attention.MLACommonMetadataBuilder",
    "forward": "vllm.v1.attention.backend.AttentionImpl",
    "forward_mha": "vllm.v1.attention.backend.MLAAttentionImpl",
    "forward_impl": "vllm.model_executor.layers.attention.mla_attention.MLAAttention",
    "_context_parallel_compute_prefill_context": "vllm.model_executor.layers.attention.mla_attention.MLACommonImpl",
}


@pytest.mark.parametrize("name", sorted(PASSED_BY_NAME))
def test_the_parameters_vllm_names_are_the_hook_s_own(name: str) -> None:
    member = base_member("0.34.0", (OWNERS[name],), name)
    assert member is not None and member.signature is not None, name
    named = PASSED_BY_NAME[name]
    if isinstance(named, frozenset):
        assert named <= {p.name for p in member.signature.parameters if p.default is None}
