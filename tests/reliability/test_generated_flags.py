"""Generated hierarchies declaring ``accept_output_buffer``: the safe fixes change no read of the flag.

The promise of a safe fix: every read of the flag in the run (on the class, on a subclass, through
``getattr``/``hasattr`` with the name, through an instance, through ``self``) gives the same result before
and after `migrate`, on the vLLM the fix targets. That vLLM is 0.20 or later, whose ``AttentionBackend``
no longer declares the flag: the unmigrated code and the migrated code both run on it (a stub of 0.20's
base here; the real vLLM 0.20 in the ``vllm`` tier). On vLLM 0.19 the base declares it False and vLLM itself
reads it, so deleting ``= True`` there changes what vLLM does: that is the migration, not a regression,
and the fix does not target 0.19. The only change the safe fixes may make is a class attribute that
nothing in the run reads and that vLLM >= 0.20 no longer reads.

The oracle runs both versions, each in its own interpreter (`legacy_callers.probe`): every reader returns,
or raises, the same before and after. A second check keeps the property from passing by doing nothing:
the flags the safe fixes deleted are exactly those the model in `legacy_flags.FlagPlugin.deletable` says
nothing can see.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from hypothesis import event, given

from .legacy_callers import probe_around_migrate
from .legacy_flags import STUBS_020, FlagPlugin, flag_plugins
from .profile import reliability_settings


def _declares(tree: Path, plugin: FlagPlugin, number: int) -> bool:
    cls = plugin.classes[number]
    module = ast.parse((tree / f"plugin/m{cls.module}.py").read_text())
    (node,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls.name]
    return any(
        (isinstance(s, ast.Assign) and any(getattr(t, "id", None) == "accept_output_buffer" for t in s.targets))
        or (isinstance(s, ast.AnnAssign) and getattr(s.target, "id", None) == "accept_output_buffer")
        for s in node.body
    )


def _check(plugin: FlagPlugin, root: Path, stubs: dict[str, str]) -> None:
    before, after = probe_around_migrate(root, plugin.files, stubs, plugin.callers)
    assert after == before

    deleted = {n for n, cls in enumerate(plugin.classes) if cls.flag and not _declares(root / "tree", plugin, n)}
    assert deleted == {n for n in range(len(plugin.classes)) if plugin.deletable(n)}
    # How often the property bites (`--hypothesis-show-statistics`): flags deleted, reads kept, reads that raise.
    event(f"flags deleted: {min(len(deleted), 2)}{'+' if len(deleted) >= 2 else ''}")
    event(f"flags kept: {min(sum(1 for c in plugin.classes if c.flag) - len(deleted), 2)}")
    event(f"readers that raise: {'some' if any(o == 'raised' for o, _ in before.values()) else 'none'}")


@reliability_settings(ci=25, long=2000)
@given(plugin=flag_plugins())
def test_no_read_of_the_flag_changes_after_the_safe_fixes(plugin: FlagPlugin, tmp_path_factory) -> None:
    _check(plugin, tmp_path_factory.mktemp("flags"), STUBS_020)


@pytest.mark.vllm
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)",
)
@reliability_settings(ci=3, long=30)  # each probe imports the real vLLM: seconds
@given(plugin=flag_plugins())
def test_no_read_of_the_flag_changes_on_the_real_vllm(plugin: FlagPlugin, tmp_path_factory) -> None:
    # Only the stub's own modules (no `vllm` package): the probe imports the real vLLM from the environment.
    stubs = {path: text for path, text in STUBS_020.items() if not path.startswith("vllm/")}
    _check(plugin, tmp_path_factory.mktemp("flags"), stubs)
