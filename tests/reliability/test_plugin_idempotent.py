"""The vLLM plugin's install is idempotent: called again and again, from many threads at once, and in
several processes started together (as vLLM does for its engine and workers), against the real vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .cli_run import REPO_ROOT, cli_env
from .profile import scaled

pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")
pytestmark = pytest.mark.vllm

# One vLLM process: 8 threads call register() at once, vLLM's own loader runs it again, then every
# install step is forced once more past the once-per-process latch; what is installed must not change.
_PROCESS = textwrap.dedent("""
    import json, logging, threading
    import torch
    import vllm.plugins
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backend import AttentionBackend
    from vllm_attn_compat.compat import plugin

    def state():
        return {
            "accept_output_buffer": repr(type(AttentionBackend.__dict__.get("accept_output_buffer"))),
            "use_output": repr(type(Attention.__dict__.get("use_output"))),
            "ops": sorted(n for n in ("unified_attention", "unified_mla_attention") if hasattr(torch.ops.vllm, n)),
            "schemas": sorted(
                str(getattr(torch.ops.vllm, n).default._schema)
                for n in ("unified_attention", "unified_mla_attention")
                if hasattr(torch.ops.vllm, n)
            ),
        }

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    plugin.logger.addHandler(handler)
    plugin.logger.setLevel(logging.INFO)
    barrier = threading.Barrier(8)
    errors = []
    def call():
        try:
            barrier.wait()
            plugin.register()
        except BaseException as error:
            errors.append(repr(error))
    threads = [threading.Thread(target=call) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    first = state()
    vllm.plugins.load_general_plugins()
    from vllm_attn_compat.compat import vllm_install
    again = vllm_install.install()
    print(json.dumps({"errors": errors, "logs": records, "first": first, "after": state(), "again": again,
                      "flag": AttentionBackend.accept_output_buffer}))
""")


def test_register_is_idempotent_in_threads_and_concurrent_processes() -> None:
    env = cli_env()
    env.pop("VLLM_PLUGINS", None)
    env.pop("VLLM_ATTN_COMPAT_DISABLE_PLUGIN", None)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(scaled(2, 6))
    ]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode(errors="replace")[-3000:]
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    for report in reports:
        assert not report["errors"], report["errors"]
        installed = [line for line in report["logs"] if "installed" in line and "nothing" not in line]
        assert len(installed) == 1, f"expected one install line per process, got {report['logs']}"
        assert report["first"] == report["after"], "a second install changed what was installed"
        assert report["again"] == [], f"a forced second install installed again: {report['again']}"
        assert report["flag"] is True
        assert report["first"]["ops"] == ["unified_attention", "unified_mla_attention"]
    assert all(r["first"] == reports[0]["first"] for r in reports), "processes installed different things"
