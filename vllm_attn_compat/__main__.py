import sys

from vllm_attn_compat.codemods.cli import main

sys.exit(main())
