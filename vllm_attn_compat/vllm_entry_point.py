"""The ``vllm.general_plugins`` entry point, outside ``compat`` so that loading it never needs torch.

vLLM imports the entry point's module before it calls anything, without a guard of ours around it; a module
inside ``compat`` would run ``compat/__init__``, which raises without torch. vLLM brings torch, so there the
plugin (:func:`vllm_attn_compat.compat.plugin.register`) runs as always; in an environment that somehow lacks
torch, :func:`register` logs why it installed nothing and returns.
"""

from __future__ import annotations

import logging

# The plugin's own logger (compat/plugin.py names it alike): one place for its lines, under vLLM's "vllm".
logger = logging.getLogger("vllm.plugins.vllm_attn_compat")


def register() -> None:
    """Run the plugin; never raises (vLLM calls this without a guard, at every process's start)."""
    try:
        from vllm_attn_compat.compat import plugin
    except Exception as error:  # noqa: BLE001 - no torch (the plain install), or a torch that does not import
        logger.warning("vllm-attn-compat: nothing installed (%s: %s)", type(error).__name__, error)
        return
    plugin.register()
