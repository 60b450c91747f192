"""Deprecated forwarders for members vLLM removed after stating what to use instead.

vLLM 0.30 removed ``CommonAttentionMetadata.seq_lens_cpu`` and ``num_computed_tokens_cpu``, whose deprecation
messages (0.19 to 0.29) said how to get the same value from the members that stay. A backend reading them raises
``AttributeError`` on 0.30 and later; with the plugin, each reads as vLLM said, with a warning (once per call site)
saying what to write instead and that it copies from the device. A forwarder is installed only where the running
release lacks the member, never over a member vLLM still has. Which members, and the release that removed each,
come from the manifest (:func:`vllm_attn_compat.manifest.forwardable_members`); what each computes is written
here, the manifest's expression beside it (a test holds the two together).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from vllm_attn_compat import manifest
from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once

METADATA = "vllm.v1.attention.backend.CommonAttentionMetadata"


class Forwarder(NamedTuple):
    compute: Callable[[Any], Any]
    expression: str  # what vLLM's message says, over the instance (`self`): the manifest's successor


def _seq_lens_cpu(metadata: Any) -> Any:
    return metadata.seq_lens.cpu()


def _num_computed_tokens_cpu(metadata: Any) -> Any:
    query_start_loc_cpu = metadata.query_start_loc_cpu
    return metadata.seq_lens.cpu() - (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1])


FORWARDERS: dict[tuple[str, str], Forwarder] = {
    (METADATA, "seq_lens_cpu"): Forwarder(_seq_lens_cpu, "self.seq_lens.cpu()"),
    (METADATA, "num_computed_tokens_cpu"): Forwarder(
        _num_computed_tokens_cpu, "self.seq_lens.cpu() - (self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1])"
    ),
}


class RemovedMember:
    """A property reading a removed member as vLLM said to, warning once per call site."""

    def __init__(self, cls_name: str, name: str, forwarder: Forwarder, removed_in: str) -> None:
        self.name = name
        self.compute = forwarder.compute
        self.message = removed_api_message(
            f"`{cls_name}.{name}`",
            f"read `{forwarder.expression.replace('self.', '')}` of the metadata instead (a copy from the device "
            "to the host at every read: prefer the device tensors where the kernel takes them)",
            "VAC011",
            removed_in=removed_in,
        )

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        warn_once(self.message)
        return self.compute(instance)


def install(cls: type, release: str) -> list[str]:
    """Forwarders on ``cls`` (vLLM's ``CommonAttentionMetadata``) for what ``release`` removed; what was installed."""
    installed = []
    qualified = f"{cls.__module__}.{cls.__qualname__}"
    fields = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name, hook in manifest.forwardable_members(release, qualified).items():
        forwarder = FORWARDERS.get((qualified, name))
        if forwarder is None or name in fields or hasattr(cls, name):
            continue  # none written for it, vLLM still has it, or it is installed already
        setattr(cls, name, RemovedMember(cls.__qualname__, name, forwarder, hook.since))
        installed.append(f"{cls.__qualname__}.{name}")
    return installed
