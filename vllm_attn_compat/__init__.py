"""vllm-attn-compat: vLLM's mandatory attention output buffer, its deprecated
forwarders, and codemods that migrate backend code to it.

Importing the top-level package imports nothing heavy: ``backends`` and
``compat`` need torch, ``codemods`` needs only libcst (and only when a file
has to be parsed), so the command-line tool starts fast.
"""

__version__ = "0.1.0.dev0"
