"""The ``[tool.vllm-attn-compat]`` table of the nearest ``pyproject.toml``.

Settings are validated strictly: a misspelt key would otherwise be ignored silently and a run would
quietly do something else than the user configured.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

TABLE = "tool.vllm-attn-compat"


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the file, the key and the value."""


class Config(NamedTuple):
    """Settings for one run; ``base`` is the folder that ``exclude`` globs are relative to, ``source`` the file
    they come from."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    old_op_calls: str = "with-output"
    base: str = "."
    cache_dir: str | None = None  # `cache-dir`, relative to ``base``
    target_version: str | None = None  # `target-version`, as written (a release the manifest knows)
    source: str | None = None


def _string_list(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


# How VAC007's unsafe fix rewrites calls of the removed ops (see its documentation).
OLD_OP_CALLS = ("with-output", "forwarder")


# key -> (Config field, converter returning None for a wrong type, expected type in words)
_KEYS = {
    "select": ("select", _string_list, "a list of rule codes or prefixes (strings)"),
    "ignore": ("ignore", _string_list, "a list of rule codes or prefixes (strings)"),
    "exclude": ("exclude", _string_list, "a list of glob patterns (strings)"),
    "unsafe-fixes": ("unsafe_fixes", lambda v: v if isinstance(v, bool) else None, "a boolean (true or false)"),
    "old-op-calls": (
        "old_op_calls",
        lambda v: v if isinstance(v, str) and v in OLD_OP_CALLS else None,
        "one of the strings " + ", ".join(repr(choice) for choice in OLD_OP_CALLS),
    ),
    "cache-dir": (
        "cache_dir",
        lambda v: v if isinstance(v, str) and v.strip() else None,
        "a folder (a non-empty string)",
    ),
    "target-version": (
        "target_version",
        lambda v: v if isinstance(v, str) and v.strip() else None,
        'a vLLM release as a string (like "0.34")',
    ),
}


def find_pyproject(start: str) -> str | None:
    """The ``pyproject.toml`` in ``start``'s folder or the closest folder above it, if any."""
    from vllm_attn_compat.codemods.target_version import nearest_folder_holding

    folder = nearest_folder_holding(start, ("pyproject.toml",))
    return None if folder is None else os.path.join(folder, "pyproject.toml")


def parse_config(text: str, source: str) -> Config:
    """Validate the tool table of a ``pyproject.toml``'s text; ``source`` names the file in errors."""
    base = os.path.dirname(os.path.abspath(source))
    if "vllm-attn-compat" not in text:
        return Config(base=base, source=source)  # nothing here can configure the tool: skip the parse
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: invalid TOML: {error}") from None
    tool = document.get("tool")
    table = tool.get("vllm-attn-compat") if isinstance(tool, dict) else None
    if table is None:
        return Config(base=base, source=source)
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{TABLE}] must be a table, found {table!r}")
    values: dict[str, object] = {}
    for key, value in table.items():
        if key not in _KEYS:
            raise ConfigError(f"{source}: [{TABLE}] unknown key {key!r}; expected one of: {', '.join(sorted(_KEYS))}")
        name, convert, expected = _KEYS[key]
        converted = convert(value)
        if converted is None:
            raise ConfigError(
                f"{source}: [{TABLE}] {key}: expected {expected}, found {value!r} ({type(value).__name__})"
            )
        values[name] = converted
    if "target_version" in values:  # a release the manifest knows, named here rather than when the run starts
        from vllm_attn_compat.codemods.target_version import TargetVersionError, parse_target_version

        try:
            parse_target_version(values["target_version"], f"{source}: [{TABLE}] target-version")
        except TargetVersionError as error:
            raise ConfigError(str(error)) from None
    if "cache_dir" in values:  # relative to the pyproject.toml's folder, as the excludes are
        values["cache_dir"] = os.path.join(base, str(values["cache_dir"]))
    return Config(base=base, source=source, **values)  # type: ignore[arg-type]  # each value converted by its key


def load_config(start: str) -> Config:
    """The configuration that applies to a run starting at ``start`` (a path given on the command line)."""
    source = find_pyproject(start)
    if source is None:
        return Config(base=os.getcwd())
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{source}: could not read the configuration: {error}") from None
    return parse_config(text, source)
