"""VAC005 beyond its examples."""

from __future__ import annotations

from vllm_attn_compat.codemods.findings import Status

from rule_testing import run, source, statuses


def test_negated_read_keeps_the_else_branch_or_goes():
    text = source(
        """
        import vllm


        def run(backend, layer):
            # check the flag
            if not backend.accept_output_buffer:
                raise RuntimeError("needs output")
            if not layer.use_output:
                return layer.legacy()
            else:
                # the only path now
                return layer.modern()
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == source(
        """
        import vllm


        def run(backend, layer):
            # check the flag
            # the only path now
            return layer.modern()
        """
    )
    assert statuses(result) == [Status.FIXED, Status.FIXED]


def test_combined_conditions_and_other_uses_are_reported_only():
    text = source(
        """
        from vllm.config import VllmConfig


        def f(layer, backend, x):
            if layer.use_output and x:
                pass
            y = 1 if backend.accept_output_buffer and x else 2
            layer.legacy = backend.accept_output_buffer
            ok = hasattr(backend, "accept_output_buffer")
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == text
    assert statuses(result) == [Status.MANUAL] * 4


def test_conditional_expressions_keep_the_branch_that_runs():
    text = source(
        """
        import vllm


        def f(layer, q):
            a = q.view(-1, 8) if layer.use_output else q
            b = q if not layer.use_output else q * 2
            c = (
                q.view(-1, 8)  # heads
                if layer.use_output
                else q  # legacy
            )
            return a, b, c
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == source(
        """
        import vllm


        def f(layer, q):
            a = q.view(-1, 8)
            b = q * 2
            c = q.view(-1, 8)
            return a, b, c
        """
    )
    # Comments between the parts of the expression have no place left; they are declared removed.
    assert sorted(result.removed_comments) == ["# heads", "# legacy"]


def test_inline_if_and_scope_of_attention_classes():
    text = source(
        """
        from plugin.base import Layer


        class Mine(Layer):
            def forward(self, q):
                if self.use_output: return self.a(q)
                return self.b(q)
        """
    )
    base = """
        from vllm.model_executor.layers.attention import Attention


        class Layer(Attention):
            pass
    """
    result = run(text, ["VAC005"], unsafe=True, path="plugin/mine.py", others=[("plugin/base.py", base)])
    # The old path after the one-line guard is dead once the guard's branch always runs.
    assert result.source.decode() == text.replace(
        "if self.use_output: return self.a(q)\n        return self.b(q)", "return self.a(q)"
    )
    alone = run(text, ["VAC005"], unsafe=True, path="plugin/mine.py")
    assert alone.findings == []


def test_comments_closing_the_kept_branch_stay_after_its_statements():
    text = source(
        """
        import vllm


        def forward(layer, q, output):
            if layer.use_output:
                output.copy_(q)
                # written in place
            else:
                # the old way
                output = q.clone()
            return output


        def last(layer, q):
            if layer.use_output:
                return q
                # nothing after this
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == source(
        """
        import vllm


        def forward(layer, q, output):
            output.copy_(q)
            # written in place
            return output


        def last(layer, q):
            return q
            # nothing after this
        """
    )
    assert result.removed_comments == ("# the old way",)


def _safe_rewrite(text: str) -> str:
    """The unsafe migration of ``text``, after the same safety checks the runner makes before writing."""
    from vllm_attn_compat.codemods.engine import safety

    result = run(text, ["VAC005"], unsafe=True)
    problems = safety.check_rewrite(
        text.encode(), result.source, result.removed_comments, lambda again: run(again, ["VAC005"], unsafe=True).source
    )
    assert problems == []
    return result.source.decode()


def test_code_after_a_branch_that_always_exits_goes():
    text = source(
        """
        import vllm


        def loop(layers, q):
            for layer in layers:
                if layer.use_output:
                    layer.run(q)
                    continue
                # old layers
                layer.legacy(q)
            return q


        def nested(layer, q, k):
            if layer.attn_backend.accept_output_buffer:
                if k is None:
                    return layer.a(q)
                else:
                    raise ValueError(k)

            # kept: separated from the dead code by a blank line

            layer.b(q)
            return layer.c(q)  # old


        def falls_through(layer, q):
            if layer.use_output:
                if q is None:
                    return None
            return layer.d(q)


        def negated(layer, q):
            if not layer.use_output:
                q = layer.legacy(q)
            else:
                return layer.modern(q)
            return q
        """
    )
    assert _safe_rewrite(text) == source(
        """
        import vllm


        def loop(layers, q):
            for layer in layers:
                layer.run(q)
                continue
            return q


        def nested(layer, q, k):
            if k is None:
                return layer.a(q)
            else:
                raise ValueError(k)
            # kept: separated from the dead code by a blank line


        def falls_through(layer, q):
            if q is None:
                return None
            return layer.d(q)


        def negated(layer, q):
            return layer.modern(q)
        """
    )


def test_two_guards_in_a_row_the_second_is_dead():
    text = source(
        """
        import vllm


        def f(layer, q):
            if layer.use_output:
                return layer.a(q)
            if layer.use_output:  # never reached now
                return layer.b(q)
            return layer.c(q)
        """
    )
    assert _safe_rewrite(text) == source(
        """
        import vllm


        def f(layer, q):
            return layer.a(q)
        """
    )


def test_comments_around_else_in_the_layouts_of_real_forks():
    text = source(
        """
        import vllm


        def a(self, q):
            if self.use_output:
                out = self.alloc(q)  # buffer
                self.impl(q, out)
                # the result is in out
            # fallback
            else:
                # Legacy backends:
                # they return a new tensor.

                out = self.impl(q)
                # done
            return out


        def b(self, q):
            if self.attn_backend.accept_output_buffer:  # new path
                return self.run(q)
            else:  # old path
                # TODO(fork): remove
                pass
            # unreachable now
            return self.legacy(q)
        """
    )
    assert _safe_rewrite(text) == source(
        """
        import vllm


        def a(self, q):
            out = self.alloc(q)  # buffer
            self.impl(q, out)
            # the result is in out
            return out


        def b(self, q):
            # new path
            return self.run(q)
        """
    )


def test_a_presence_test_keeps_what_runs_on_vllm_0_20():
    text = source(
        """
        import vllm


        def f(backend, q):
            a = q.view(-1, 8) if hasattr(backend, "accept_output_buffer") else q
            if not hasattr(backend, "accept_output_buffer"):
                q = q * 2
            return a, q
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == source(
        """
        import vllm


        def f(backend, q):
            a = q
            q = q * 2
            return a, q
        """
    )
    assert statuses(result) == [Status.FIXED] * 2
