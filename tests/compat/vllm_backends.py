"""A vLLM ``AttentionBackend`` for one impl class, as an out-of-tree plugin declares it (for the ``vllm`` tier).

Imports vLLM only when called, so test modules of the other tiers can import it."""

from __future__ import annotations


def backend_for(impl_cls: type, **flags: object) -> type:
    """A fresh subclass of vLLM's ``AttentionBackend`` whose impl is ``impl_cls``, with ``flags`` (e.g.
    ``accept_output_buffer=False``) set as class attributes."""
    from vllm.v1.attention.backend import AttentionBackend

    class Backend(AttentionBackend):
        @staticmethod
        def get_name():
            return "CUSTOM"

        @staticmethod
        def get_impl_cls():
            return impl_cls

        @staticmethod
        def get_builder_cls():
            raise NotImplementedError

        @staticmethod
        def get_kv_cache_shape(*args, **kwargs):
            raise NotImplementedError

        @classmethod
        def supports_head_size(cls, head_size):
            return True

    for name, value in flags.items():
        setattr(Backend, name, value)
    return Backend
