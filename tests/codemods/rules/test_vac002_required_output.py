"""VAC002 beyond its examples: annotation forms, defaults before output, keyword-only."""

from __future__ import annotations

import pytest

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses

HEADER = """\
from typing import Optional, Union
import typing

import torch
from torch import Tensor
from vllm.v1.attention.backend import AttentionImpl


class Impl(AttentionImpl):
    def forward(self, query, {param}):
        return query
"""


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("output: Optional[torch.Tensor] = None", "output: torch.Tensor"),
        ("output: typing.Optional[Tensor] = None", "output: Tensor"),
        ("output: torch.Tensor | None = None", "output: torch.Tensor"),
        ("output: None | torch.Tensor = None", "output: torch.Tensor"),
        ("output: Union[torch.Tensor, None] = None", "output: torch.Tensor"),
        ("output: Union[None, Tensor] = None", "output: Tensor"),
        ('output: "Optional[torch.Tensor]" = None', 'output: "torch.Tensor"'),
        ("output: 'torch.Tensor | None' = None", "output: 'torch.Tensor'"),
        ("output: torch.Tensor = None", "output: torch.Tensor"),
        ("output=None", "output: torch.Tensor"),
        ("*, output=None, scale=None", "*, output: torch.Tensor, scale=None"),
        ("scale=1.0, *, output=None", "scale=1.0, *, output: torch.Tensor"),
    ],
)
def test_annotation_forms(before, after):
    result = run(HEADER.format(param=before), ["VAC002"])
    assert result.source.decode() == HEADER.format(param=after)
    assert statuses(result) == [Status.FIXED]


def test_unannotated_without_torch_import_drops_only_the_default():
    text = source(
        """
        from vllm.v1.attention.backend import AttentionImpl


        class Impl(AttentionImpl):
            def forward(self, query, output=None):
                return query
        """
    )
    assert run(text, ["VAC002"]).source.decode() == text.replace("output=None", "output")


def test_parameter_after_a_defaulted_one_is_reported_not_rewritten():
    text = HEADER.format(param="scale: float = 1.0, output: Optional[torch.Tensor] = None")
    result = run(text, ["VAC002"])
    assert result.source.decode() == text
    assert statuses(result) == [Status.MANUAL]
    assert "`scale`" in result.findings[0].message


def test_multi_line_signature_keeps_its_layout_and_comments():
    text = source(
        """
        import torch
        from vllm.v1.attention.backend import AttentionImpl


        class Impl(AttentionImpl):
            def forward(
                self,
                query: torch.Tensor,
                output: torch.Tensor | None = None,  # preallocated by the layer
                output_scale: torch.Tensor | None = None,
            ) -> torch.Tensor:
                return query
        """
    )
    result = run(text, ["VAC002"])
    assert result.source.decode() == text.replace(
        "output: torch.Tensor | None = None,  # preallocated", "output: torch.Tensor,  # preallocated"
    )


def test_functions_and_unrelated_classes_stay():
    text = source(
        """
        import torch
        from mylib import AttentionImpl


        def forward(query, output=None):
            return query


        class Impl(AttentionImpl):
            def forward(self, query, output=None):
                return query
        """
    )
    result = run(text, ["VAC002"])
    assert result.findings == [] and result.source.decode() == text
