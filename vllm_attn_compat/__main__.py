from vllm_attn_compat.codemods.cli import run

run()
