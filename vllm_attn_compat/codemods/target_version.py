"""The vLLM release a run targets: ``--target-version``, else ``target-version`` in ``[tool.vllm-attn-compat]``,
else the project's own vLLM requirement, else the newest release the manifest knows.

The requirement is read as django-upgrade reads Django's, from the project's root, never running its code:
``pyproject.toml`` (``[project] dependencies``, then ``optional-dependencies``, then PEP 735
``[dependency-groups]``), ``setup.cfg`` (``[options] install_requires``, then ``[options.extras_require]``), a
``setup.py`` whose ``setup(install_requires=...)``/``extras_require`` are literals (read with ``ast``), and the
requirements files (``requirements*.txt``, ``requirements/*.txt``, following ``-r``/``-c``). The first of these
that names vLLM decides; several vLLM lines there allow the union of what each allows (each may apply, under its
marker or extra).

Which allowed release is the target? ruff and django-upgrade take the *lowest* supported version, because their
fixes rewrite code to a newer API that must exist on every version the project supports. This tool does two
things with a release: it names what that release breaks (dead overrides, removed names, signature drift,
abstract members: all of them removals and additions of *newer* releases), and it fixes code where the fix is
correct on every supported release. Targeting the lowest release would hide every break of the newer ones, the
silent failures this package exists for (a plugin declaring ``vllm>=0.27`` that runs on 0.34 would hear nothing
of the hooks 0.34 ignores). So the target (``Target.release``) is the *newest* allowed release, and the lowest
(``Target.oldest``) comes with it for the fixes' safety: a fix whose new code needs release R is safe only when
``oldest`` is R or later (the 0.20 fixes are withheld where 0.19 is allowed). An explicit target version names
both: the code is to run on that release.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from vllm_attn_compat import manifest
from vllm_attn_compat.manifest import version_key

from .specifiers import Requirement, SpecifierError, allows, clauses, parse_requirement

if TYPE_CHECKING:
    import ast

KEY = "target-version"
PROJECT = "vllm"
# What marks a project's root, where its vLLM requirement is read.
_ROOT_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt")
# Text that may name vLLM in a requirement (PEP 503 compares names case-insensitively, separators alike): a file
# without any is not parsed.
_NAMES_VLLM = re.compile(rb"(?i)v[-_.]*llm")


class TargetVersionError(ValueError):
    """A target version or a vLLM requirement that cannot be used; the message names where it was found, what
    was expected and what was found."""


class Target(NamedTuple):
    """The release a run targets, and why.

    ``release``: the manifest release findings are computed for. ``oldest``: the lowest release the project
    supports, for the fixes' safety (None where nothing bounds it: no requirement, or one without specifiers).
    ``allowed``: every manifest release the project supports, oldest first. ``reason``: for the run's summary
    (``from pyproject.toml: vllm>=0.30,<0.35``). ``source``: the file it was read from, if any."""

    release: str
    oldest: str | None
    allowed: tuple[str, ...]
    reason: str
    source: str | None

    def describe(self) -> str:
        """One line for the run's summary: the release, and why (``vLLM 0.34.0, from --target-version 0.34``)."""
        oldest = f"; fixes must hold from vLLM {self.oldest} on" if self.oldest not in (None, self.release) else ""
        return f"vLLM {self.release}, {self.reason}{oldest}"


def newest_target() -> Target:
    """The target where nothing names one: the newest release, no oldest (nothing bounds the fixes)."""
    newest = manifest.newest()
    return Target(newest, None, manifest.releases(), f"the newest release the manifest knows, {newest}", None)


def start_folder(start: str) -> str:
    """``start`` (a file or folder) as the folder a search upwards begins in."""
    folder = os.path.abspath(start)
    return folder if os.path.isdir(folder) else os.path.dirname(folder)


def nearest_folder_holding(start: str, names: tuple[str, ...]) -> str | None:
    """The nearest folder, at or above ``start`` (a file or folder), holding a file named one of ``names``."""
    folder = start_folder(start)
    while True:
        if any(os.path.isfile(os.path.join(folder, name)) for name in names):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def project_root(start: str) -> str:
    """The folder whose files state the project's requirements: the nearest folder, at or above ``start`` (a file
    or folder), holding a ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``requirements.txt``; else
    ``start``'s folder."""
    return nearest_folder_holding(start, _ROOT_FILES) or start_folder(start)


def parse_target_version(value: object, where: str) -> str:
    """The manifest release a target version names ("0.34" -> the newest 0.34 patch release, "0.34.0"), for the
    command line and the configuration reader. Raises TargetVersionError starting with ``where`` (the option or
    the file and key: ``pyproject.toml: [tool.vllm-attn-compat] target-version``), saying what was expected and
    what was found."""
    if not isinstance(value, str) or not value.strip():
        raise TargetVersionError(
            f'{where}: expected a vLLM release as a string (like "0.34"), found {value!r} ({type(value).__name__})'
        )
    try:
        return manifest.resolve(value)
    except manifest.UnknownRelease as error:
        raise TargetVersionError(f"{where}: {error}") from None


def configured_target_version(pyproject: str) -> str | None:
    """The release ``target-version`` names in the ``[tool.vllm-attn-compat]`` table of the ``pyproject.toml`` at
    ``pyproject``, or None where the table or the key is absent. Raises TargetVersionError for a bad value or a
    file that is no TOML."""
    document = _toml(pyproject)
    tool = document.get("tool")
    table = tool.get("vllm-attn-compat") if isinstance(tool, dict) else None
    if not isinstance(table, dict) or KEY not in table:
        return None
    return parse_target_version(table[KEY], f"{pyproject}: [tool.vllm-attn-compat] {KEY}")


def target_for(root: str, *, explicit: str | None = None, configured: str | None = None) -> Target:
    """The target of a run over the project at ``root`` (the folder holding its ``pyproject.toml``, ``setup.py``
    or requirements files). ``explicit`` is ``--target-version``'s value, ``configured`` the release read from
    ``[tool.vllm-attn-compat]`` (``parse_target_version``); either one decides, else the project's vLLM
    requirement, else the newest release. Raises TargetVersionError for an explicit value the manifest does not
    know, or a requirement file that cannot be read."""
    if explicit is not None:
        release = parse_target_version(explicit, "--target-version")
        return Target(release, release, (release,), f"from --target-version {explicit}", None)
    if configured is not None:
        release = parse_target_version(configured, f"[tool.vllm-attn-compat] {KEY}")
        return Target(release, release, (release,), f'from [tool.vllm-attn-compat] {KEY} = "{configured}"', None)
    found = find_requirements(root)
    if found is None:
        newest = manifest.newest()
        # (no path: the same project gives the same report wherever it is checked out)
        reason = "no vLLM requirement found (--target-version X.Y sets one): "
        reason += f"the newest release the manifest knows, {newest}"
        return Target(newest, None, manifest.releases(), reason, None)
    source, requirements = found
    return _from_requirements(root, source, requirements)


def _from_requirements(root: str, source: str, requirements: list[Requirement]) -> Target:
    known = manifest.releases()
    where = os.path.relpath(source, root)
    written = ", ".join(r.text for r in requirements)
    bounded = [r for r in requirements if r.specifiers and r.url is None]
    if len(bounded) < len(requirements):  # a line without specifiers (or a URL) allows every release
        reason = f"from {where}: {written} (any release): the newest release the manifest knows, {known[-1]}"
        return Target(known[-1], None, known, reason, source)
    interfaces = [_as_built_from(r.specifiers) for r in bounded]
    allowed = tuple(v for v in known if any(allows(specifiers, v) for specifiers in interfaces))
    # (by PEP 440 such a pin allows no release: the summary says why it was read as one)
    built = "; a local build has its release's interface" if interfaces != [r.specifiers for r in bounded] else ""
    if allowed:
        return Target(allowed[-1], allowed[0], allowed, f"from {where}: {written}{built}", source)
    nearest = _nearest(known, interfaces)
    reason = (
        f"from {where}: {written} allows no release the manifest knows ({known[0]} to {known[-1]}): "
        f"the nearest, {nearest}"
    )
    return Target(nearest, nearest, (nearest,), reason, source)


def _as_built_from(specifiers: str) -> str:
    """``specifiers`` as they bear on the attention interface: a pin on a local build (``==0.22.0+cpu``, a
    platform's own wheel) pins the release it was built from, whose interface it has. (By PEP 440 it allows no
    release, as no release carries that label; ``!=`` a local build still allows its release.)"""
    read = clauses(specifiers)
    built = [
        ("==", version.partition("+")[0]) if operator in ("==", "===") and "+" in version else (operator, version)
        for operator, version in read
    ]
    return specifiers if built == read else ",".join(operator + version for operator, version in built)


def _nearest(known: tuple[str, ...], specifiers: list[str]) -> str:
    """The release nearest to what requirements that allow no known release name: the newest at or below the
    highest version a clause names (a pin on a patch release the manifest does not know, ``==0.22.5``, has
    0.22.1's interface; ``>=0.40``, the newest), else the oldest."""
    named = []
    for _, version in (clause for text in specifiers for clause in clauses(text)):
        try:
            named.append(version_key(version.removesuffix(".*").partition("+")[0]))
        except ValueError:
            continue  # an arbitrary string (``===``) names no version to be near
    below = [release for release in known if named and version_key(release) <= max(named)]
    return below[-1] if below else known[0]


def find_requirements(root: str) -> tuple[str, list[Requirement]] | None:
    """(the file, the vLLM requirements it states) of the first source in the module docstring's order that
    names vLLM, or None."""
    for source, texts in _sources(root):
        requirements = []
        for text in texts:
            try:
                requirement = parse_requirement(text)
            except SpecifierError as error:
                if re.match(r"\s*vllm\b", text, re.IGNORECASE):
                    raise TargetVersionError(f"{source}: {error}") from None
                continue  # another project's requirement, in a form this reader does not need to understand
            if requirement.name == PROJECT:
                requirements.append(requirement)
        if requirements:
            return source, requirements
    return None


def _sources(root: str) -> Iterator[tuple[str, list[str]]]:
    pyproject = os.path.join(root, "pyproject.toml")
    if os.path.isfile(pyproject) and _may_name_vllm(pyproject):
        project = _toml(pyproject).get("project")
        project = project if isinstance(project, dict) else {}
        yield pyproject, _strings(project.get("dependencies"), pyproject, "[project] dependencies")
        extras = project.get("optional-dependencies")
        yield pyproject, _grouped(extras, pyproject, "[project.optional-dependencies]")
        groups = _toml(pyproject).get("dependency-groups")
        yield pyproject, _grouped(groups, pyproject, "[dependency-groups]")
    setup_cfg = os.path.join(root, "setup.cfg")
    if os.path.isfile(setup_cfg) and _may_name_vllm(setup_cfg):
        import configparser

        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(setup_cfg, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as error:
            raise TargetVersionError(f"{setup_cfg}: cannot be read as a setup.cfg: {error}") from None
        yield setup_cfg, _lines(parser.get("options", "install_requires", fallback=""))
        if parser.has_section("options.extras_require"):
            yield setup_cfg, [line for _, value in parser.items("options.extras_require") for line in _lines(value)]
    setup_py = os.path.join(root, "setup.py")
    if os.path.isfile(setup_py) and _may_name_vllm(setup_py):
        install, extras = _setup_py(setup_py)
        yield setup_py, install
        yield setup_py, extras
    for path in _requirement_files(root):
        yield path, list(_requirement_lines(path, set()))


def _may_name_vllm(path: str) -> bool:
    """Whether the file's text may name vLLM (a file that cannot be read is left to its reader to report)."""
    try:
        with open(path, "rb") as handle:
            return _NAMES_VLLM.search(handle.read()) is not None
    except OSError:
        return True


def _toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            document: dict[str, Any] = tomllib.load(handle)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise TargetVersionError(f"{path}: cannot be read as TOML: {error}") from None
    return document


def _strings(value: object, path: str, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TargetVersionError(f"{path}: {where}: expected a list of requirement strings, found {value!r}")
    return list(value)


def _grouped(value: object, path: str, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise TargetVersionError(f"{path}: {where}: expected a table of requirement lists, found {value!r}")
    # PEP 735 groups may also hold {include-group = "..."} tables: only the strings are requirements.
    return [item for items in value.values() if isinstance(items, list) for item in items if isinstance(item, str)]


def _lines(value: str) -> list[str]:
    """The requirements of a multi-line setup.cfg value (one a line; ``#`` comments and blank lines left out)."""
    return [
        line.split(" #", 1)[0].strip()
        for line in value.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _setup_py(path: str) -> tuple[list[str], list[str]]:
    """(install_requires, extras_require's requirements) of a setup.py's ``setup(...)`` call where they are
    literals, or names bound once at module level to literals. Read with ``ast``; never executed."""
    import ast

    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as error:
        raise TargetVersionError(f"{path}: cannot be read as Python: {error}") from None
    assigned: dict[str, ast.expr] = {}
    for statement in tree.body:
        if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
            continue
        if isinstance(statement.targets[0], ast.Name):
            assigned[statement.targets[0].id] = statement.value
    install: list[str] = []
    extras: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _call_name(node.func) != "setup":
            continue
        for keyword in node.keywords:
            value = keyword.value
            if isinstance(value, ast.Name):
                value = assigned.get(value.id, value)
            if keyword.arg == "install_requires":
                install += _literal_strings(value)
            elif keyword.arg == "extras_require" and isinstance(value, ast.Dict):
                for item in value.values:
                    extras += _literal_strings(assigned.get(item.id, item) if isinstance(item, ast.Name) else item)
    return install, extras


def _call_name(node: ast.expr) -> str:
    import ast

    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _literal_strings(node: ast.expr) -> list[str]:
    import ast

    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _lines(node.value)
    return []


def _requirement_files(root: str) -> list[str]:
    found = []
    for folder, pattern in ((root, r"requirements.*\.txt"), (os.path.join(root, "requirements"), r".*\.txt")):
        if os.path.isdir(folder):
            found += sorted(
                os.path.join(folder, name)
                for name in os.listdir(folder)
                if re.fullmatch(pattern, name) and os.path.isfile(os.path.join(folder, name))
            )
    return found


def _requirement_lines(path: str, seen: set[str]) -> Iterator[str]:
    """The requirements of a requirements file, with those of the files it includes (``-r``/``-c``, relative to
    it), each file read once."""
    real = os.path.realpath(path)
    if real in seen:
        return
    seen.add(real)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise TargetVersionError(f"{path}: cannot be read: {error}") from None
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line:
            continue
        include = re.match(r"(?:-r|--requirement|-c|--constraint)(?:\s+|=)(\S+)", line)
        if include:
            yield from _requirement_lines(os.path.join(os.path.dirname(path), include.group(1)), seen)
        elif not line.startswith("-"):
            yield line.split(" --", 1)[0].strip()  # per-requirement options (--hash=...) are no specifiers
