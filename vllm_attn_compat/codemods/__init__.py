"""libcst codemods that migrate attention-backend code to vLLM's mandatory output buffer.

Nothing here imports torch, and libcst is imported only once a file needs parsing,
so ``vllm-attn-compat`` starts fast and scans trees without old-API code cheaply.
"""
