"""Turning the output guard on and off: :func:`check_output` for code that does not load vLLM's plugins.

The vLLM plugin turns it on from ``VLLM_ATTN_COMPAT_CHECK_OUTPUT`` each time it installs; this is the same switch
as a function. See :mod:`vllm_attn_compat.compat.output_guard` for what the guard does.
"""

from __future__ import annotations

from vllm_attn_compat.backends.layer import Attention, MLAAttention
from vllm_attn_compat.compat import output_guard

_OWN_LAYERS = ((Attention, False), (MLAAttention, True))


def check_output(mode: str | bool | None = "error") -> list[str]:
    """Turn the output guard on (``"error"``, ``"warn"``; ``True`` or ``"1"`` mean ``"error"``) or off (``None``,
    ``False``, ``"off"``, ``"0"``) for the layers built from now on: this package's ``Attention`` and
    ``MLAAttention``, and vLLM's when vLLM >= 0.20 is installed (importing its attention layer modules). Returns
    what was installed now. Off removes the hooks (where no later hook wraps them) and makes the wrappers of layers
    already built call straight through.
    """
    if isinstance(mode, bool) or mode is None:
        parsed = "error" if mode else None
    elif isinstance(mode, str):
        parsed = output_guard.parse_mode(mode, source="check_output(mode)")
    else:
        raise TypeError(f"check_output(mode): expected 'error', 'warn', True, False or None; found {mode!r}")
    output_guard.set_mode(parsed)
    if parsed is None:
        for layer_cls, _ in _OWN_LAYERS:
            output_guard.remove_from(layer_cls)
        if _vllm_supported():
            from vllm_attn_compat.compat import vllm_install

            vllm_install.remove_output_guard()
        return []
    installed = [
        f"output guard on vllm_attn_compat {layer_cls.__name__}"
        for layer_cls, mla in _OWN_LAYERS
        if output_guard.install_on(layer_cls, mla=mla)
    ]
    if _vllm_supported():
        from vllm_attn_compat.compat import vllm_install

        installed += vllm_install.guard_vllm_layers(parsed)
    return installed


def _vllm_supported() -> bool:
    """Whether vLLM >= 0.20 is installed here (importing its backend base)."""
    from vllm_attn_compat.compat import plugin

    return plugin.vllm_api_reason() is None
