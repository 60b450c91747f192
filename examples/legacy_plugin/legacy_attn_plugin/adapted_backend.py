"""A backend half-way through the move: its impl still returns a new tensor and leans on
vllm-attn-compat's deprecated adapter, as VAC004's report offers, until it writes into `output`."""

from vllm_attn_compat.compat import adapt_legacy_impl

from legacy_attn_plugin.returning_backend import ReturningBackend, ReturningImpl


class AdaptedBackend(ReturningBackend):
    @staticmethod
    def get_impl_cls():
        return AdaptedImpl


@adapt_legacy_impl
class AdaptedImpl(ReturningImpl):
    pass
