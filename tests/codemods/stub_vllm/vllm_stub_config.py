"""Which vLLM the stub plays: ``old`` (<= 0.19: the flags and the ops returning their result) or
``new`` (>= 0.20: only the ``_with_output`` ops, no flags). Set before ``vllm`` is imported."""

API = "old"
ACCEPT_OUTPUT_BUFFER = True


def configure(*, api: str, accept_output_buffer: bool) -> None:
    global API, ACCEPT_OUTPUT_BUFFER
    API, ACCEPT_OUTPUT_BUFFER = api, accept_output_buffer
