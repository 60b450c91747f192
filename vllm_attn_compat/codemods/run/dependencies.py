"""A dependency of the command that is missing or broken, named with the command that installs it.

An environment installed with ``pip install --no-deps`` lacks libcst, and the failure shows where libcst is
first imported: in this process or in a worker, for every file. The worker hands it back as a value (like a
file's error), the run stops, and the command says once what to install (exit code 2), rather than reporting
an internal error per file.
"""

from __future__ import annotations

import shlex

_PACKAGE = "vllm_attn_compat"
# Import names whose distribution is named otherwise (libcst needs pyyaml).
_DISTRIBUTIONS = {"yaml": "pyyaml"}


class MissingDependency(ImportError):
    """``module`` (a top-level import name) cannot be imported: it is not installed, or importing it failed
    with ``detail`` (then what it needs is missing or broken)."""

    def __init__(self, module: str, detail: str, installed: bool) -> None:
        self.module, self.detail, self.installed = module, detail, installed
        requirement = _requirement(module)
        if installed:
            what = f"the module {module!r} cannot be imported ({detail}); reinstall it with its dependencies"
            command = f"pip install --force-reinstall {shlex.quote(requirement)}"
        else:
            what = f"the module {module!r} is not installed (vllm-attn-compat needs it); install it"
            command = f"pip install {shlex.quote(requirement)}"
        super().__init__(f"{what}: {command}")

    # Rebuilt from its fields in the process it travels to.
    def __reduce__(self) -> tuple[type[MissingDependency], tuple[str, str, bool]]:
        return type(self), (self.module, self.detail, self.installed)


def missing(error: BaseException) -> MissingDependency | None:
    """The dependency that ``error`` shows missing or broken; None for anything else, including a failed
    import of this package's own modules (a bug, to be reported as one)."""
    if isinstance(error, MissingDependency):
        return error
    if not isinstance(error, ImportError):
        return None
    detail = f"{type(error).__name__}: {error}"
    # A dependency whose own module code failed (what it imports is missing or broken) is the outermost
    # module body outside this package on the traceback; CPython leaves importlib's frames out, and a
    # function's frame (an import hook's find_spec, say) is no module being imported.
    traceback = error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        module = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if frame.f_code.co_name == "<module>" and module and module != _PACKAGE:
            return MissingDependency(module, detail, installed=True)
        traceback = traceback.tb_next
    module = (error.name or "").partition(".")[0]
    if not module or module == _PACKAGE:
        return None
    not_found = isinstance(error, ModuleNotFoundError) and error.name == module
    return MissingDependency(module, detail, installed=not not_found)


def _requirement(module: str) -> str:
    """The requirement on ``module``'s distribution as this package declares it (``libcst>=1.5``), or its name."""
    from importlib import metadata

    name = _DISTRIBUTIONS.get(module, module)
    try:
        declared = metadata.requires("vllm-attn-compat") or []
    except metadata.PackageNotFoundError:  # run from a source tree
        return name
    for requirement in declared:
        spec, _, marker = requirement.partition(";")
        if "extra" not in marker and _normalized(spec) == _normalized(name):
            return spec.strip()
    return name


def _normalized(spec: str) -> str:
    """A requirement's distribution name as pip compares it: ``Typing_Extensions>=4`` -> ``typing-extensions``."""
    import re

    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    return re.sub(r"[-_.]+", "-", match[1]).lower() if match else ""
