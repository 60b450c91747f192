"""``incompatibilities``: which calls a base signature allows that an override rejects, checked against what
Python itself does when the calls are made."""

from __future__ import annotations

import inspect
import itertools

import pytest

from vllm_attn_compat import manifest

KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "POSITIONAL_ONLY",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "POSITIONAL_OR_KEYWORD",
    inspect.Parameter.VAR_POSITIONAL: "VAR_POSITIONAL",
    inspect.Parameter.KEYWORD_ONLY: "KEYWORD_ONLY",
    inspect.Parameter.VAR_KEYWORD: "VAR_KEYWORD",
}


def signature_of(function) -> manifest.Signature:
    parameters = tuple(
        manifest.Parameter(
            p.name, KINDS[p.kind], None if p.default is inspect.Parameter.empty else repr(p.default), None
        )
        for p in inspect.signature(function).parameters.values()
    )
    return manifest.Signature(parameters, None)


def calls(base) -> list[tuple[tuple[object, ...], dict[str, object]]]:
    """Every way a caller may pass the base's parameters: each parameter positionally where it may be, or by name
    where it may be, with or without the ones that have defaults."""
    choices = []
    for p in inspect.signature(base).parameters.values():
        ways = []
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            ways.append(("pos", p.name))
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            ways.append(("kw", p.name))
        if p.kind == p.VAR_POSITIONAL:
            ways.append(("pos", "extra"))
        if p.kind == p.VAR_KEYWORD:
            ways.append(("kw", "extra_kw"))
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            ways.append(("skip", p.name))
        choices.append(ways)
    found = []
    for combination in itertools.product(*choices):
        args, kwargs, positional_ended = [], {}, False
        for how, name in combination:
            if how == "pos":
                if positional_ended:
                    break  # after one skipped or named, a positional argument would take its place
                args.append(name)
            elif how == "kw":
                kwargs[name] = name
                positional_ended = True
            else:
                positional_ended = True
        else:
            found.append((tuple(args), kwargs))
    return found


def rejects(base, override) -> bool:
    """Whether Python refuses some call the base accepts when made on the override."""
    signature = inspect.signature(override)
    for args, kwargs in calls(base):
        try:
            signature.bind(*args, **kwargs)
        except TypeError:
            return True
    return False


# Overrides of vLLM-like hooks, each against its base: (base, override).
def base(self, layer, query, output, output_scale=None): ...
def same(self, layer, query, output, output_scale=None): ...
def renamed(self, layer, q, output, output_scale=None): ...
def lacks_new(self, layer, query, output): ...
def takes_kwargs(self, layer, query, output, **kwargs): ...
def takes_args(self, *args, **kwargs): ...
def extra_required(self, layer, query, output, output_scale=None, block_scale=None, *, mode): ...
def extra_default(self, layer, query, output, output_scale=None, mode="x"): ...
def keyword_only_base(self, x, *, flag=False): ...
def keyword_only_positional(self, x, flag=False): ...
def positional_only_base(self, x, /): ...
def positional_only_renamed(self, y): ...
def star_base(self, *args): ...
def no_star(self, a, b): ...


@pytest.mark.parametrize(
    ("base_fn", "override"),
    [
        (base, same),
        (base, renamed),
        (base, lacks_new),
        (base, takes_kwargs),
        (base, takes_args),
        (base, extra_required),
        (base, extra_default),
        (keyword_only_base, keyword_only_positional),
        (keyword_only_positional, keyword_only_base),
        (positional_only_base, positional_only_renamed),
        (positional_only_renamed, positional_only_base),
        (star_base, no_star),
        (no_star, star_base),
    ],
)
def test_incompatibilities_agree_with_python(base_fn, override):
    drift = manifest.incompatibilities(signature_of(base_fn), signature_of(override))
    assert drift.compatible is not rejects(base_fn, override)


def test_what_drift_names():
    drift = manifest.incompatibilities(signature_of(base), signature_of(lacks_new))
    assert [p.name for p in drift.missing] == ["output_scale"]
    assert drift.missing[0].has_default
    drift = manifest.incompatibilities(signature_of(base), signature_of(extra_required))
    assert drift.missing == () and [p.name for p in drift.extra_required] == ["mode"]
    drift = manifest.incompatibilities(signature_of(base), signature_of(renamed))
    assert [p.name for p in drift.missing] == ["query"]


def test_on_the_manifests_own_signatures():
    # MLAAttentionImpl.forward_mha gained output_scale between 0.20.0 and 0.27.1 (issue 51): an override written
    # against 0.20.0's signature cannot take 0.27.1's calls.
    impl = "vllm.v1.attention.backend.MLAAttentionImpl"
    old = manifest.signature("0.20.0", impl, "forward_mha")
    new = manifest.signature("0.27.1", impl, "forward_mha")
    assert old is not None and new is not None
    drift = manifest.incompatibilities(new, old)
    assert "output_scale" in [p.name for p in drift.missing]
    assert manifest.incompatibilities(new, new).compatible
