"""The ``vllm.general_plugins`` entry point: installs the compatibility layer into a real vLLM >= 0.20.

vLLM calls :func:`register` once per process (engine, each worker), possibly more than once; it must be cheap
and idempotent. It detects features instead of parsing versions: it acts only when vLLM's ``AttentionBackend``
no longer defines ``accept_output_buffer`` (the change of vLLM 0.20), does nothing without vLLM or on an older
one, and nothing when ``VLLM_ATTN_COMPAT_DISABLE_PLUGIN=1``. Each feature needs its own vLLM names; one whose
names a release lacks is skipped and named in the log line, the others installed all the same.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading

ENV_DISABLE = "VLLM_ATTN_COMPAT_DISABLE_PLUGIN"

# Under vLLM's "vllm" logger, so the line appears with vLLM's own logging configuration.
logger = logging.getLogger("vllm.plugins.vllm_attn_compat")

_lock = threading.Lock()
_done = False
_supported = False  # the first call found vLLM >= 0.20 and installed into it


def register() -> None:
    """Install into vLLM (once per process) and log one line saying what was installed and what was skipped.

    Never raises: vLLM calls it without a guard, so an exception here would stop vLLM from starting.
    """
    global _done, _supported
    if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
        logger.info("vllm-attn-compat: plugin disabled by %s; nothing installed", ENV_DISABLE)
        return
    with _lock:
        if _done:
            _install_guard_again()
            return
        _done = True
        try:
            reason = _unsupported_reason()
            if reason is not None:
                logger.info("vllm-attn-compat: nothing installed (%s)", reason)
                return
            from vllm_attn_compat.compat import vllm_install

            installed, skipped = vllm_install.install_features()
            _supported = True
        except Exception as error:  # noqa: BLE001 - anything the feature checks did not foresee
            logger.warning("vllm-attn-compat: nothing installed (unexpected %s: %s)", type(error).__name__, error)
            return
    line = "vllm-attn-compat: installed " + (", ".join(installed) or "nothing new (already installed)")
    if skipped:
        logger.warning("%s; skipped %s", line, "; ".join(skipped))
    else:
        logger.info("%s", line)


def _install_guard_again() -> None:
    """A later call installs the output guard if ``VLLM_ATTN_COMPAT_CHECK_OUTPUT`` now asks for it (the pytest
    plugin sets it, then registers; vLLM's loader may have registered first). Off, this reads one variable."""
    if not _supported:
        return
    from vllm_attn_compat.compat.output_guard import ENV_CHECK_OUTPUT

    if os.environ.get(ENV_CHECK_OUTPUT, "").strip() in ("", "0"):
        return
    try:
        from vllm_attn_compat.compat import vllm_install

        installed, skipped = vllm_install.install_features(vllm_install.GUARD_FEATURES)
    except Exception as error:  # noqa: BLE001 - as in register: never raise into vLLM's loader
        logger.warning("vllm-attn-compat: output guard not installed (unexpected %s: %s)", type(error).__name__, error)
        return
    if installed or skipped:
        line = "vllm-attn-compat: installed " + (", ".join(installed) or "nothing new")
        (logger.warning if skipped else logger.info)("%s%s", line, "; skipped " + "; ".join(skipped) if skipped else "")


def _unsupported_reason() -> str | None:
    """Why this vLLM gets nothing, or None when it has the >= 0.20 attention API."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        from vllm.v1.attention.backend import AttentionBackend
    except Exception as error:  # noqa: BLE001 - ImportError, or whatever a broken vLLM raises while importing
        return f"vLLM's v1 AttentionBackend does not import: {type(error).__name__}: {error}"
    return old_api_reason(AttentionBackend)


def old_api_reason(backend_base: type) -> str | None:
    """The reason to leave a vLLM alone whose ``AttentionBackend`` still declares ``accept_output_buffer``."""
    from vllm_attn_compat.compat.flags import AlwaysTrueFlag

    declared = backend_base.__dict__.get("accept_output_buffer")
    if declared is None or isinstance(declared, AlwaysTrueFlag):
        return None
    return "this vLLM still has AttentionBackend.accept_output_buffer: vLLM < 0.20 needs no compatibility layer"
