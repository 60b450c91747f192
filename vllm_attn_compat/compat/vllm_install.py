"""What the plugin installs into a real vLLM >= 0.20, feature by feature (imported only by the plugin).

Each :class:`Feature` names the vLLM modules it patches (:attr:`Feature.needs`); the plugin installs it once vLLM
has imported them, and nothing here imports a vLLM module: an installer takes what it needs from ``sys.modules``
(:func:`require`), so installing never re-enters vLLM's imports. A name that is missing or changed in some vLLM
release skips that feature alone, with the reason, and the others are installed regardless. Each installer is
idempotent and returns the names of what it installed now.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_attn_compat.compat import forwarders, output_guard
from vllm_attn_compat.compat.adopt import adopt_returned_result, outside
from vllm_attn_compat.compat.deprecation import removed_api_message, warn_once
from vllm_attn_compat.compat.flags import AlwaysTrueFlag, after_init, install_backend_flag, install_layer_flag
from vllm_attn_compat.compat.op_names import RENAMED_OPS, normalize_splitting_ops, renamed_in

# Where each vLLM name lives, newest layout first: a release that moves a module gets its path added here.
BACKEND_MODULES = ("vllm.v1.attention.backend",)
ATTENTION_MODULES = ("vllm.model_executor.layers.attention.attention",)  # also registers the with-output op
MLA_MODULES = ("vllm.model_executor.layers.attention.mla_attention",)  # also registers the MLA with-output op
TORCH_UTILS_MODULES = ("vllm.utils.torch_utils",)
FORWARD_CONTEXT_MODULES = ("vllm.forward_context",)
CONFIG_MODULES = ("vllm.config",)


class Skipped(Exception):
    """A feature this vLLM cannot take; the message says why (for the plugin's log line)."""


class OldApi(Skipped):
    """This vLLM still has the pre-0.20 attention API: the plugin installs nothing into it."""


def require(modules: tuple[str, ...], name: str) -> Any:
    """``name`` from the first of ``modules`` that is imported and has it; :class:`Skipped` naming what failed.

    Never imports: the plugin calls an installer once its feature's modules are imported (:attr:`Feature.needs`),
    and :func:`import_needs` imports them for a caller outside vLLM's imports.
    """
    failures = []
    for module_name in modules:
        module = sys.modules.get(module_name)
        if module is None:
            failures.append(f"{module_name} is not imported")
        elif hasattr(module, name):
            return getattr(module, name)
        else:
            failures.append(f"{module_name}.{name} does not exist")
    raise Skipped("; ".join(failures))


def import_needs(needs: Iterable[tuple[str, ...]]) -> None:
    """Import each of ``needs`` (the first of its paths that imports), for callers that ask outside vLLM's imports
    (``check_output``, :func:`install`); a path that does not import is left to :func:`require` to report."""
    for modules in needs:
        for module_name in modules:
            try:
                importlib.import_module(module_name)
                break
            except Exception:  # noqa: BLE001 - a module of a newer or broken vLLM may fail with anything
                continue


class VllmRoute(forwarders.Route):
    """vLLM's forward context, layers and ``torch.ops.vllm.*_with_output`` ops."""

    def __init__(self, get_forward_context: Callable[[], Any], encode: Callable[[str], Any]) -> None:
        self.get_forward_context = get_forward_context
        self.encode = encode  # type: ignore[method-assign, assignment]  # the layer name as vLLM's ops take it

    def layer(self, layer_name: str) -> Any:
        layers = self.get_forward_context().no_compile_layers
        try:
            return layers[layer_name]
        except KeyError:
            raise KeyError(
                f"layer_name: expected the name of an attention layer in vLLM's forward context "
                f"({len(layers)} known, e.g. {sorted(layers)[:4]}); found {layer_name!r}"
            ) from None

    def allocate(self, layer: Any, query: torch.Tensor) -> torch.Tensor:
        # As vLLM's Attention.forward / MLAAttention callers do: [T, num_heads * head_size_v], query's dtype.
        size_v = layer.v_head_dim if hasattr(layer, "v_head_dim") else layer.head_size_v
        return torch.empty((query.shape[0], layer.num_heads * size_v), dtype=query.dtype, device=query.device)

    def attention_op(self) -> Callable[..., None]:
        return torch.ops.vllm.unified_attention_with_output

    def mla_attention_op(self) -> Callable[..., None]:
        return torch.ops.vllm.unified_mla_attention_with_output


ROUTE: VllmRoute | None = None  # set by install_route


def install_backend_flags() -> list[str]:
    return install_backend_flag(require(BACKEND_MODULES, "AttentionBackend"))


def install_layer_flags() -> list[str]:
    return install_layer_flag(require(ATTENTION_MODULES, "Attention"))


_ADOPTS_IMPL = "__vllm_attn_compat_adopts_impl_results__"
_ADOPTS_MLA = "__vllm_attn_compat_adopts_mla_results__"


def install_result_adoption() -> list[str]:
    """SGLang's rule on out-of-tree impls' ``forward``, wrapped once per class as layers are built."""
    if after_init(require(ATTENTION_MODULES, "Attention"), _ADOPTS_IMPL, adopt_impl_results):
        return ["result copy for out-of-tree Attention impls that return it"]
    return []


def install_mla_result_adoption() -> list[str]:
    """The same for MLA: an out-of-tree impl's ``forward_mha``, an out-of-tree layer's ``forward_impl``."""
    if after_init(require(MLA_MODULES, "MLAAttention"), _ADOPTS_MLA, adopt_mla_results):
        return ["result copy for out-of-tree MLA impls and layers that return it"]
    return []


# Where `output` is among the arguments after self, for callers that pass it by position (vLLM uses keywords):
# impl.forward(layer, query, key, value, kv_cache, attn_metadata, output, ...),
# impl.forward_mha(q, kv_c_normed, k_pe, kv_cache, attn_metadata, k_scale, output, ...),
# layer.forward_impl(q, k_c_normed, k_pe, kv_cache, attn_metadata, output, ...).
_OUTPUT_INDEX = {"forward": 6, "forward_mha": 6, "forward_impl": 5}


def adopt_impl_results(layer: Any) -> None:
    _adopt_outside_vllm(type(layer.impl), "forward")


def adopt_mla_results(layer: Any) -> None:
    _adopt_outside_vllm(type(layer.impl), "forward_mha")
    _adopt_outside_vllm(type(layer), "forward_impl")


def _adopt_outside_vllm(cls: type, name: str) -> None:
    """Wrap ``cls.<name>`` when the class and the method's code both live outside vLLM (vLLM's own write)."""
    if outside(cls, "vllm") and outside(getattr(cls, name, None), "vllm"):
        adopt_returned_result(cls, name, _OUTPUT_INDEX[name])


def layer_name_encoder() -> Callable[[str], Any]:
    """How vLLM's ops take a layer name: ``_encode_layer_name`` (an opaque ``LayerName`` on torch >= 2.11), or
    ``str`` itself where the helper is gone and vLLM's op schema says ``str``."""
    try:
        encode: Callable[[str], Any] = require(TORCH_UTILS_MODULES, "_encode_layer_name")
        return encode
    except Skipped as missing:
        if _vllm_layer_name_type() == "str":
            return str
        raise Skipped(f"{missing}, and vLLM's unified_attention_with_output does not take a str layer_name") from None


def layer_name_resolver() -> Callable[[Any], str]:
    """The inverse of :func:`layer_name_encoder`, for the op kernels: ``_resolve_layer_name``, or ``str``."""
    try:
        resolve: Callable[[Any], str] = require(TORCH_UTILS_MODULES, "_resolve_layer_name")
        return resolve
    except Skipped as missing:
        if _vllm_layer_name_type() == "str":
            return str
        raise Skipped(f"{missing}, and vLLM's unified_attention_with_output does not take a str layer_name") from None


def _vllm_layer_name_type() -> str | None:
    """The type of ``layer_name`` in vLLM's own ``unified_attention_with_output`` schema, if that op exists."""
    op = getattr(torch.ops.vllm, "unified_attention_with_output", None)
    if op is None:
        return None
    return next((str(a.type) for a in op.default._schema.arguments if a.name == "layer_name"), None)


def vllm_route() -> VllmRoute:
    """The one route to vLLM, built on first use from vLLM's forward context and layer-name encoder."""
    global ROUTE
    if ROUTE is None:
        ROUTE = VllmRoute(require(FORWARD_CONTEXT_MODULES, "get_forward_context"), layer_name_encoder())
    return ROUTE


def install_route() -> list[str]:
    if ROUTE is not None and forwarders.current_route() is ROUTE:
        return []
    forwarders.set_route(vllm_route())
    return ["vllm_attn_compat.compat.unified_attention/unified_mla_attention -> vLLM"]


_vllm_lib: torch.library.Library | None = None  # kept alive: the ops live as long as their library
_defined: set[str] = set()


def install_op(name: str, modules: tuple[str, ...], layer_cls_name: str) -> list[str]:
    """``torch.ops.vllm.<name>``, forwarding to ``<name>_with_output`` (registered by ``modules``)."""
    global _vllm_lib
    if name in _defined:
        return []
    require(modules, layer_cls_name)  # importing the layer module registers vLLM's with-output op
    if hasattr(torch.ops.vllm, name):
        raise Skipped(f"vLLM defines torch.ops.vllm.{name} itself")
    if not hasattr(torch.ops.vllm, f"{name}_with_output"):
        raise Skipped(f"torch.ops.vllm.{name}_with_output does not exist")
    route, resolve = vllm_route(), layer_name_resolver()
    # The layer-name type as vLLM's own ops declare it: the opaque LayerName (torch >= 2.11) or str.
    name_type = type(route.encode("probe"))

    def probe(layer_name: object) -> None:  # annotations replaced below: a string annotation (this module's
        ...  # __future__ import) of a local type would not resolve

    probe.__annotations__ = {"layer_name": name_type, "return": None}
    schema = torch.library.infer_schema(probe, mutates_args=())  # "(<type> layer_name) -> ()"
    kernel = forwarders.forwarder_kernels(route, resolve)[name]
    _vllm_lib = _vllm_lib or torch.library.Library("vllm", "FRAGMENT")
    forwarders.define_forwarder_ops(_vllm_lib, schema[1 : schema.index(" layer_name")], {name: kernel})
    _defined.add(name)
    return [f"torch.ops.vllm.{name}"]


_SPLITTING_OPS_HOOK = "__vllm_attn_compat_normalizes_splitting_ops__"


def install_splitting_ops_normalization() -> list[str]:
    config_cls = require(CONFIG_MODULES, "CompilationConfig")
    if "vllm::unified_attention" in getattr(config_cls, "_attention_ops", ()):
        raise OldApi(
            "this vLLM's CompilationConfig still splits on vllm::unified_attention: vLLM < 0.20 needs no "
            "compatibility layer"
        )
    original = config_cls.__dict__.get("__post_init__")
    if original is None:
        raise Skipped("vllm.config.CompilationConfig defines no __post_init__ to normalise splitting_ops in")
    if getattr(original, _SPLITTING_OPS_HOOK, False):
        return []

    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "splitting_ops", None):
            stale = renamed_in(self.splitting_ops)
            if stale:
                self.splitting_ops = normalize_splitting_ops(self.splitting_ops)
                _warn_stale_ops(stale)
        original(self, *args, **kwargs)

    setattr(__post_init__, _SPLITTING_OPS_HOOK, True)
    config_cls.__post_init__ = __post_init__
    return ["CompilationConfig.splitting_ops normalization"]


def _warn_stale_ops(stale: list[str]) -> None:
    for old in stale:
        message = removed_api_message(
            f"The op {old!r} named in splitting_ops",
            f"the entry now reads {RENAMED_OPS[old]!r} (update your config)",
            "VAC006",
        )
        # The user's line is the CompilationConfig(...) call, above pydantic's and vLLM's frames.
        warn_once(message, depth=_depth_outside(("vllm", "pydantic", "pydantic_core", "vllm_attn_compat")))


def _depth_outside(packages: tuple[str, ...]) -> int:
    """How many frames above our caller's caller the first frame outside ``packages`` is (the user's line)."""
    frame, depth = sys._getframe(2), 1
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "")
        if not any(module == p or module.startswith(p + ".") for p in packages):
            break
        frame, depth = frame.f_back, depth + 1
    return depth


def guard_mode_from_env() -> str | None:
    """The output guard's mode from ``VLLM_ATTN_COMPAT_CHECK_OUTPUT``; a value it cannot read skips the guard."""
    try:
        return output_guard.parse_mode(os.environ.get(output_guard.ENV_CHECK_OUTPUT))
    except ValueError as error:
        raise Skipped(str(error)) from None


def install_attention_guard() -> list[str]:
    """The output guard on vLLM's ``Attention``, when ``VLLM_ATTN_COMPAT_CHECK_OUTPUT`` asks for it (read at each
    install: the pytest plugin sets it before it installs the shim). Off, nothing is installed."""
    mode = guard_mode_from_env()
    return [] if mode is None else _guard(mode, ATTENTION_MODULES, "Attention", mla=False)


def install_mla_guard() -> list[str]:
    mode = guard_mode_from_env()
    return [] if mode is None else _guard(mode, MLA_MODULES, "MLAAttention", mla=True)


def _guard(mode: str, modules: tuple[str, ...], layer_cls_name: str, *, mla: bool) -> list[str]:
    layer_cls = require(modules, layer_cls_name)
    output_guard.set_mode(mode)
    return [f"output guard ({mode}) on {layer_cls_name}"] if output_guard.install_on(layer_cls, mla=mla) else []


def guard_vllm_layers(mode: str) -> list[str]:
    """The output guard on vLLM's ``Attention`` and ``MLAAttention`` (for ``check_output``, which runs outside
    vLLM's imports and imports the layer modules); a layer class this vLLM lacks is left out."""
    installed: list[str] = []
    for modules, name, mla in ((ATTENTION_MODULES, "Attention", False), (MLA_MODULES, "MLAAttention", True)):
        import_needs([modules])
        try:
            installed += _guard(mode, modules, name, mla=mla)
        except Skipped:
            continue
    return installed


def remove_output_guard() -> None:
    for modules, name in ((ATTENTION_MODULES, "Attention"), (MLA_MODULES, "MLAAttention")):
        try:
            output_guard.remove_from(require(modules, name))
        except Skipped:
            continue


def running_release() -> str:
    """The manifest's entry for the installed vLLM (the newest it knows before a release it does not know yet)."""
    from importlib.metadata import PackageNotFoundError, version

    from vllm_attn_compat import manifest

    try:
        installed = version("vllm")
    except PackageNotFoundError:
        raise Skipped("vLLM's distribution metadata is missing: its release is unknown") from None
    try:
        return manifest.resolve(installed, nearest=True)
    except manifest.UnknownRelease as error:
        raise Skipped(str(error)) from None


_CHECKS_DEAD_OVERRIDES = "__vllm_attn_compat_checks_dead_overrides__"


def install_dead_override_checks(modules: tuple[str, ...], layer_cls_name: str) -> list[str]:
    """Warn about a layer's backend, builder and impl overriding hooks the running vLLM no longer has or calls."""
    from vllm_attn_compat.compat.dead_overrides import DeadOverrides

    layer_cls = require(modules, layer_cls_name)
    checks = DeadOverrides(running_release())
    if after_init(layer_cls, _CHECKS_DEAD_OVERRIDES, checks.check_layer):
        return [f"dead-override warnings on {layer_cls_name} (vLLM {checks.release})"]
    return []


def install_removed_member_forwarders() -> list[str]:
    """Forwarders for the members of vLLM's CommonAttentionMetadata that this release removed, where vLLM said what
    to use instead."""
    from vllm_attn_compat.compat import removed_members

    return removed_members.install(require(BACKEND_MODULES, "CommonAttentionMetadata"), running_release())


def old_api_reason(backend_base: type) -> str | None:
    """The reason to leave a vLLM alone whose ``AttentionBackend`` still declares ``accept_output_buffer``."""
    declared = backend_base.__dict__.get("accept_output_buffer")
    if declared is None or isinstance(declared, AlwaysTrueFlag):
        return None
    return "this vLLM still has AttentionBackend.accept_output_buffer: vLLM < 0.20 needs no compatibility layer"


@dataclass(frozen=True)
class Feature:
    """One thing the plugin installs, once vLLM has imported the modules it patches."""

    name: str  # as the plugin's log line names it when skipped
    install: Callable[[], list[str]]
    needs: tuple[tuple[str, ...], ...]  # each a module's paths, newest layout first: one of them must be imported
    new_api: bool = True  # only into a vLLM whose AttentionBackend has the >= 0.20 API (its module is needed too)
    again: bool = False  # installed again by each later register() (the output guard: its switch may change)


GUARD_FEATURES = (
    Feature("the output guard on Attention", install_attention_guard, (ATTENTION_MODULES,), again=True),
    Feature("the output guard on MLAAttention", install_mla_guard, (MLA_MODULES,), again=True),
)

_ROUTE_NEEDS = (FORWARD_CONTEXT_MODULES, TORCH_UTILS_MODULES)

# In order: a batch that installs several runs them in this order.
FEATURES = (
    Feature("AttentionBackend.accept_output_buffer", install_backend_flags, (BACKEND_MODULES,)),
    Feature("Attention.use_output and the legacy adapter", install_layer_flags, (ATTENTION_MODULES,)),
    Feature("result copy for Attention impls", install_result_adoption, (ATTENTION_MODULES,)),
    Feature("result copy for MLA impls", install_mla_result_adoption, (MLA_MODULES,)),
    Feature(
        "torch.ops.vllm.unified_attention",
        lambda: install_op("unified_attention", ATTENTION_MODULES, "Attention"),
        (ATTENTION_MODULES, *_ROUTE_NEEDS),
    ),
    Feature(
        "torch.ops.vllm.unified_mla_attention",
        lambda: install_op("unified_mla_attention", MLA_MODULES, "MLAAttention"),
        (MLA_MODULES, *_ROUTE_NEEDS),
    ),
    Feature("the forwarders' route to vLLM", install_route, _ROUTE_NEEDS),
    Feature(
        "dead-override warnings on Attention",
        lambda: install_dead_override_checks(ATTENTION_MODULES, "Attention"),
        (ATTENTION_MODULES,),
    ),
    Feature(
        "dead-override warnings on MLAAttention",
        lambda: install_dead_override_checks(MLA_MODULES, "MLAAttention"),
        (MLA_MODULES,),
    ),
    Feature("forwarders for removed CommonAttentionMetadata members", install_removed_member_forwarders, ()),
    # Its own check of the API (the config module does not import AttentionBackend's).
    Feature(
        "CompilationConfig.splitting_ops normalization",
        install_splitting_ops_normalization,
        (CONFIG_MODULES,),
        new_api=False,
    ),
    # Last: its hook on a layer's __init__ then runs after the result copy's and the legacy adapter's.
    *GUARD_FEATURES,
)


def install_features(features: Iterable[Feature]) -> tuple[list[str], list[str]]:
    """Install ``features`` (their modules imported): (what was installed now, ``"feature (why it was skipped)"``).

    :class:`OldApi` propagates: the caller then installs nothing more.
    """
    installed: list[str] = []
    skipped: list[str] = []
    features = list(features)
    if any(feature.new_api for feature in features):
        reason = old_api_reason(require(BACKEND_MODULES, "AttentionBackend"))
        if reason is not None:
            raise OldApi(reason)
    for feature in features:
        try:
            installed += feature.install()
        except OldApi:
            raise
        except Skipped as reason:
            skipped.append(f"{feature.name} ({reason})")
        except Exception as error:  # noqa: BLE001 - a vLLM that changed in a way no check foresaw: skip, never break vLLM's loader
            skipped.append(f"{feature.name} (unexpected {type(error).__name__}: {error})")
    return installed, skipped


def install() -> list[str]:
    """Import what every feature needs and install what this vLLM can take; what was installed now. For callers
    outside vLLM's imports (tests, a script); the plugin installs each feature as vLLM imports its modules."""
    import_needs([BACKEND_MODULES, *(modules for feature in FEATURES for modules in feature.needs)])
    return install_features(FEATURES)[0]
