"""VAC005 beyond its examples."""

from __future__ import annotations

from rule_testing import run, source, statuses
from vllm_attn_compat.codemods.findings import Status


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


def test_combined_conditions_ternaries_and_assignments_are_reported_only():
    text = source(
        """
        from vllm.config import VllmConfig


        def f(layer, backend, x):
            if layer.use_output and x:
                pass
            y = 1 if backend.accept_output_buffer else 2
            layer.use_output = backend.accept_output_buffer
            ok = hasattr(backend, "accept_output_buffer")
        """
    )
    result = run(text, ["VAC005"], unsafe=True)
    assert result.source.decode() == text
    assert statuses(result) == [Status.MANUAL] * 4


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
    assert result.source.decode() == text.replace("if self.use_output: return self.a(q)", "return self.a(q)")
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
