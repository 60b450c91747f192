"""The PEP 508/440 subset the target version needs, held to ``packaging`` (the reference implementation) on every
release of the manifest where ``packaging`` is installed."""

from __future__ import annotations

import pytest

from vllm_attn_compat import manifest
from vllm_attn_compat.codemods.specifiers import SpecifierError, allows, normalize, parse_requirement

SPECIFIERS = [
    "",
    ">=0.30",
    ">=0.30,<0.35",
    "<0.25",
    "<=0.25.1",
    ">0.27.0",
    ">0.27",
    "==0.20.*",
    "!=0.20.*",
    "==0.20",
    "==0.20.0",
    "!=0.22.1",
    "~=0.27.0",
    "~=0.27",
    "===0.34.0",
    ">=0.30.0rc1",
    "<0.30.0rc1",
    ">=0.20.0.post1",
    ">=0.21.0.dev0,<0.23",
    "== 0.20.*, != 0.20.1",
    "==0.20.0+cpu",
]


@pytest.mark.parametrize("specifiers", SPECIFIERS)
def test_allows_agrees_with_packaging_on_every_release(specifiers):
    packaging_specifiers = pytest.importorskip("packaging.specifiers")
    reference = packaging_specifiers.SpecifierSet(specifiers)
    for release in manifest.releases():
        assert allows(specifiers, release) == reference.contains(release), (specifiers, release)


@pytest.mark.parametrize(
    ("text", "name", "specifiers", "url"),
    [
        ("vllm>=0.30,<0.35", "vllm", ">=0.30,<0.35", None),
        ("vLLM[tensorizer] >= 0.30 ; python_version >= '3.10'", "vllm", ">= 0.30", None),
        ("vllm (>=0.30)", "vllm", ">=0.30", None),
        ("vllm", "vllm", "", None),
        (
            "vllm @ git+https://github.com/vllm-project/vllm@v0.34.0",
            "vllm",
            "",
            "git+https://github.com/vllm-project/vllm@v0.34.0",
        ),
        ("v_LLM==0.34.0", "v-llm", "==0.34.0", None),
        ("torch==2.13.0", "torch", "==2.13.0", None),
    ],
)
def test_parse_requirement(text, name, specifiers, url):
    requirement = parse_requirement(text)
    assert (requirement.name, requirement.specifiers, requirement.url) == (name, specifiers, url)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("vllm>=", "no version clause"),
        ("vllm>=banana", "is no version"),
        ("vllm>=0.30,", "an empty clause"),
        ("vllm~=1", "~= needs at least two version parts"),
        ("vllm>=0.30.*", "only == and != take a .* suffix"),
        (">=0.30", "is not a requirement"),
    ],
)
def test_bad_requirements_are_named(text, complaint):
    with pytest.raises(SpecifierError, match=complaint):
        parse_requirement(text)


def test_normalize_as_pep_503():
    assert normalize("vLLM") == "vllm" != normalize("vllm-ascend")
    assert normalize("V_LLM") == normalize("v.llm") == normalize("v--llm") == "v-llm"
