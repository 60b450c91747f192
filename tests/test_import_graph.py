"""The package's import graph, read from the sources: no cycle anywhere, and each part imports only what the
layout allows (ARCHITECTURE.md). Every import counts, also those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_attn_compat"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [t if t in modules else node.module for t in targets]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    assert _cycles(_imports()) == []


def _imported_parts(prefix: str) -> set[str]:
    """What modules under ``prefix`` import from outside it: a part of the package (``vllm_attn_compat.compat``),
    or one of ``codemods``' (``vllm_attn_compat.codemods.engine``)."""
    parts = set()
    for name, targets in _imports().items():
        if name == prefix or name.startswith(prefix + "."):
            for target in targets:
                if not (target == prefix or target.startswith(prefix + ".")):
                    depth = 3 if target.startswith("vllm_attn_compat.codemods.") else 2
                    parts.add(".".join(target.split(".")[:depth]))
    return parts


def test_each_part_imports_only_what_the_layout_allows():
    codemods = "vllm_attn_compat.codemods"
    manifest = "vllm_attn_compat.manifest"
    # The manifest of vLLM's attention interface stands alone: the CLI and the runtime half both read it.
    assert _imported_parts(manifest) == set()
    assert _imported_parts("vllm_attn_compat.backends") == set()
    # The plugin installs each feature once vLLM has imported what it patches, through the import hook that
    # imports neither torch nor vLLM.
    assert _imported_parts("vllm_attn_compat.compat") <= {
        "vllm_attn_compat.backends",
        "vllm_attn_compat.deprecated_uses",
        "vllm_attn_compat.import_hook",
        manifest,
    }
    shared = {f"{codemods}.findings", f"{codemods}.noqa", manifest}  # the vocabulary every stage speaks
    assert _imported_parts(f"{codemods}.index") <= shared
    assert _imported_parts(f"{codemods}.engine") <= {*shared, f"{codemods}.index"}
    # Rules see the engine's face and the shared vocabulary only.
    assert _imported_parts(f"{codemods}.rules") <= {*shared, f"{codemods}.engine"}
    assert not any(
        target.startswith(("vllm_attn_compat.backends", "vllm_attn_compat.compat"))
        for name, targets in _imports().items()
        if name.startswith(codemods)
        for target in targets
    )
