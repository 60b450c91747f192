"""What the two parsers alone cost on the input `migrate --check` hands them: a floor under this design.

A cold ``migrate --check`` parses, with CPython's ``ast``, every file the class-hierarchy and call-site
analysis indexes, and with libcst the reduced source of every candidate (`engine/spans.py`: the classes and
functions that can hold a finding). No analysis, rule, scan or process of the tool can make those parses
cheaper; the rest of a run comes on top. Time ``parse`` next to ``ruff check --no-cache`` to see how much of
ruff's time the parsers alone take.

Two roles, each run as a process of its own (``python benchmarks/parsers_alone.py record OUT TREE``, then
``... parse OUT TREE``):

* ``record OUT TREE``: one ``migrate --check --jobs 1 TREE`` in this process (the package on
  ``PYTHONPATH``), with `worker.index_file` and ``libcst.parse_module`` wrapped to note their inputs; writes
  the paths indexed and the sources handed to libcst to ``OUT`` (a pickle this module alone reads back).
* ``parse IN TREE``: reads every ``.py`` file of ``TREE`` (as the tool reads them all), then forks: the
  child imports libcst and parses the recorded libcst sources, the parent parses the indexed files with
  ``ast``, in parallel on two cores, as the tool's workers share them. Nothing else runs.

The split is the simplest one, not the best: the CPU time of the command halved is the floor for a perfect
one on two cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import traceback


def record(out: str, tree: str) -> None:
    import libcst

    from vllm_attn_compat.codemods.cli import main
    from vllm_attn_compat.codemods.run import worker

    indexed: list[str] = []
    handed: list[bytes | str] = []
    index_file, parse_module = worker.index_file, libcst.parse_module

    def noting_index(source, path, *rest):
        indexed.append(path)
        return index_file(source, path, *rest)

    def noting_parse(source, *args, **kwargs):
        handed.append(source)
        return parse_module(source, *args, **kwargs)

    worker.index_file = noting_index  # looked up at each call by the runner, as is libcst.parse_module
    libcst.parse_module = noting_parse
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(["migrate", "--check", "--jobs", "1", tree])
    if not indexed or not handed:
        found = f"{len(indexed)} indexed files and {len(handed)} libcst inputs"
        raise SystemExit(f"recorded {found}: expected some of each (is the tree a vLLM before 0.20?)")
    with open(out, "wb") as handle:
        pickle.dump({"indexed": indexed, "libcst": handed}, handle)
    print(f"{len(indexed)} files indexed ({sum(os.path.getsize(p) for p in indexed) / 1e6:.2f} MB), "
          f"{len(handed)} sources to libcst ({sum(map(len, handed)) / 1e6:.2f} MB)")  # fmt: skip


def parse(recorded: str, tree: str) -> None:
    import ast

    with open(recorded, "rb") as handle:
        inputs = pickle.load(handle)
    sources: dict[str, bytes] = {}
    for folder, _, names in os.walk(tree):
        for name in names:
            if name.endswith(".py"):
                path = os.path.normpath(os.path.join(folder, name))
                with open(path, "rb") as handle:
                    sources[path] = handle.read()
    child = os.fork()
    if child == 0:
        try:
            import libcst

            for source in inputs["libcst"]:
                libcst.parse_module(source)
        except Exception:  # noqa: BLE001 - printed, and the exit status fails the command: no fast failure
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    for path in inputs["indexed"]:
        ast.parse(sources[os.path.normpath(path)], filename=path)
    _, status = os.waitpid(child, 0)
    os._exit(0 if status == 0 else 1)  # as the tool does: no interpreter shutdown freeing every file


if __name__ == "__main__":
    role, argument, tree_argument = sys.argv[1:4]
    {"record": record, "parse": parse}[role](argument, tree_argument)
