"""A small vLLM attention plugin written against vLLM <= 0.19, before the output buffer became
mandatory. It is the input of ``vllm-attn-compat migrate`` in this repository's README."""


def register():
    """Entry point of the ``vllm.general_plugins`` group: make the SDPA backend selectable."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, "legacy_attn_plugin.sdpa_backend.SdpaBackend")
