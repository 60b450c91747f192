"""The installed vLLM's attention interface, read with ``inspect`` from its imported modules, against the manifest's
entry for exactly that release: the classes and their bases, each member's kind, parameters (names, kinds,
whether each has a default) and abstract-ness, the modules' names, the module-level functions and the ops it
registers. Runs in the ``vllm`` tier (0.20.0 here; CI's matrix runs it on the newest release too).
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import typing
from importlib.metadata import version

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="the real vLLM package is not installed (run scripts/install-vllm-tier.sh)")

from vllm_attn_compat import manifest  # noqa: E402
from vllm_attn_compat.manifest import interface  # noqa: E402

try:
    RELEASE = manifest.resolve(version("vllm"))  # exact: the data must describe the installed release itself
except manifest.UnknownRelease as error:
    pytest.fail(f"{error}: regenerate the manifest (python scripts/attention_manifest.py)", pytrace=False)
CALLABLE = {"method", "classmethod", "staticmethod", "property"}


MODULES = sorted(
    {cls.rpartition(".")[0] for cls in manifest.classes(RELEASE)}
    | {f.rpartition(".")[0] for f in manifest.functions(RELEASE)}
)


def module(name: str):
    """vLLM's module ``name``, imported; skipped where it imports a GPU-only package this machine lacks (0.34.0's
    sparse_mla_mask.py imports NVIDIA's cutlass DSL at its top)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == "vllm":
            raise
        pytest.skip(f"{name} imports {error.name}, which is not installed here (a GPU-only dependency)")


def runtime_kind(raw: object) -> str:
    if isinstance(raw, staticmethod):
        return "staticmethod"
    if isinstance(raw, classmethod):
        return "classmethod"
    if isinstance(raw, property | functools.cached_property):
        return "property"
    if inspect.isfunction(raw):
        return "method"
    if inspect.isclass(raw):
        return "class"
    return "data"


def function_of(raw: object):
    inner = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
    if isinstance(inner, property):
        inner = inner.fget
    if isinstance(inner, functools.cached_property):
        inner = inner.func
    return inspect.unwrap(inner)


def parameters(function) -> list[tuple[str, str, bool]]:
    return [
        (p.name, p.kind.name, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(function, follow_wrapped=False).parameters.values()
    ]


def expected(signature: manifest.Signature) -> list[tuple[str, str, bool]]:
    return [(p.name, p.kind, p.has_default) for p in signature.parameters]


def resolve_dotted(name: str) -> object:
    """The object a dotted name the manifest records stands for (``torch.nn.Module``, ``enum.EnumMeta``)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise ImportError(name)


def defined_in_body(cls: type, name: str, raw: object) -> bool:
    """Whether ``name`` is a function the class's own body defines (not one a decorator like ``@dataclass``
    generated, nor one assigned from elsewhere)."""
    if runtime_kind(raw) not in CALLABLE:
        return False
    function = function_of(raw)
    code = getattr(function, "__code__", None)
    source = inspect.getsourcefile(inspect.getmodule(cls))
    return code is not None and code.co_filename == source and function.__qualname__ == f"{cls.__qualname__}.{name}"


@pytest.mark.parametrize("qualified", manifest.classes(RELEASE))
def test_each_class_is_the_manifests(qualified):
    module_name, _, short = qualified.rpartition(".")
    cls = getattr(module(module_name), short)
    assert inspect.isclass(cls), f"{qualified} is no class in vLLM {RELEASE}"
    info = manifest.class_info(RELEASE, qualified)
    namespace = vars(cls)
    written = namespace.get("__orig_bases__", cls.__bases__)  # as the class statement wrote them: Generic[T]
    written = () if written == (object,) else written  # `class C:` names no base
    assert [resolve_dotted(base) for base in info.bases] == [typing.get_origin(b) or b for b in written], qualified
    own_annotations = namespace.get("__annotations__", {})
    enum_members = set(cls.__members__) if issubclass(cls, enum.Enum) else set()
    members = manifest.own_members(RELEASE, qualified)
    for name, member in members.items():
        where = f"{qualified}.{name} in vLLM {RELEASE}"
        if member.kind in CALLABLE:
            raw = namespace.get(name)
            assert raw is not None, f"{where}: the manifest has a {member.kind}, vLLM's class has none"
            assert runtime_kind(raw) == member.kind, where
            assert parameters(function_of(raw)) == expected(member.signature), where
            assert bool(getattr(raw, "__isabstractmethod__", False)) == member.abstract, where
        elif member.kind == "enum_member":
            assert name in enum_members, where
        elif member.kind == "class":
            assert inspect.isclass(namespace.get(name)), where
        else:  # an attribute or a field: assigned, annotated, or both
            assert name in namespace or name in own_annotations, where
            if member.annotation is not None:
                assert name in own_annotations, where
    for name, raw in namespace.items():
        if defined_in_body(cls, name, raw):
            assert name in members, f"vLLM {RELEASE}'s {qualified} defines {name}, the manifest does not"
    for name in own_annotations:
        assert name in members, f"vLLM {RELEASE}'s {qualified} annotates {name}, the manifest does not"
    for name in enum_members:
        assert name in members, f"vLLM {RELEASE}'s {qualified} has the enum member {name}, the manifest does not"
    # A plain assignment is not checked this way round: one a class decorator makes (CustomOp.register sets
    # `name`) cannot be told from one in the body.


@pytest.mark.parametrize("module_name", MODULES)
def test_each_module_level_function_and_name(module_name):
    imported = module(module_name)
    for qualified, signature in manifest.functions(RELEASE).items():
        if qualified.rpartition(".")[0] == module_name:
            function = getattr(imported, qualified.rpartition(".")[2])
            assert parameters(inspect.unwrap(function)) == expected(signature), qualified
    names = manifest.module_names(RELEASE, module_name)
    for name in names:
        assert hasattr(imported, name), f"{module_name}.{name} in vLLM {RELEASE}"
    for name, value in vars(imported).items():
        defined_here = getattr(value, "__module__", None) == module_name and (
            inspect.isclass(value) or inspect.isfunction(value)
        )
        if defined_here and getattr(value, "__qualname__", None) == name:
            assert name in names, f"vLLM {RELEASE}'s {module_name} defines {name}, the manifest does not"


def test_each_op_is_registered_with_the_manifests_schema():
    import torch

    for name, op in manifest.ops(RELEASE).items():
        module(op.module)  # registers it
        namespace, _, short = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace), short)
        schema = packet.default._schema
        assert [a.name for a in schema.arguments] == list(op.signature.names()), name
        mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutated == set(op.mutates_args), name


@pytest.mark.parametrize("qualified", sorted(interface.left_out(RELEASE)))
def test_each_class_said_to_leave_out_abstract_members_does(qualified):
    """vLLM's own concrete classes the manifest says leave abstract members of the interface out: imported, each
    derives from the members' classes, and the members of theirs Python counts abstract in it are those named
    (VAC013 asks no backend of a plugin for what a backend of vLLM's own of the same shape goes without)."""
    lacking = interface.left_out(RELEASE)[qualified]
    try:
        cls = getattr(module(qualified.rpartition(".")[0]), qualified.rpartition(".")[2])
    except Exception as error:  # a model's module may ask for a GPU when imported (an assert, a driver's error)
        import torch

        if torch.cuda.is_available():
            raise
        pytest.skip(
            f"{qualified.rpartition('.')[0]} cannot be imported without a GPU ({type(error).__name__}: {error})"
        )
    owners = {member.rpartition(".")[0] for member in lacking}
    for owner in owners:
        base = getattr(module(owner.rpartition(".")[0]), owner.rpartition(".")[2])
        assert issubclass(cls, base), f"vLLM {RELEASE}'s {qualified} does not derive from {owner}"
    abstract = {
        f"{owner}.{name}"
        for owner in manifest.classes(RELEASE)
        for name, value in manifest.own_members(RELEASE, owner).items()
        if value.abstract and name in cls.__abstractmethods__
        if issubclass(cls, getattr(module(owner.rpartition(".")[0]), owner.rpartition(".")[2]))
    }
    assert abstract == lacking, f"vLLM {RELEASE}'s {qualified}"


def test_the_attention_packages_modules_are_the_manifests():
    """Every module of vLLM's attention packages (`interface.MODULE_TREES`), as the installed release's files lay
    them out, is one the manifest lists for the release, of the same kind, and the reverse (VAC011 reports an import
    of one the target lacks)."""
    import pathlib

    from vllm_attn_compat.manifest import data

    root = pathlib.Path(importlib.import_module("vllm").__file__).parent.parent
    found = {}
    for tree in interface.MODULE_TREES:
        folder = root.joinpath(*tree.split("."))
        for path in folder.rglob("*.py") if folder.is_dir() else ():
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                found[".".join(parts[:-1])] = "package"
            else:
                found[".".join(parts)] = "module"
    listed = {
        name: state
        for name, changes in data.load()["module_files"].items()
        if (state := data.state_at(changes, RELEASE)) is not None
    }
    assert found == listed
