"""A layer that logs which path vLLM <= 0.19 would take."""

import logging

from vllm.model_executor.layers.attention import Attention

logger = logging.getLogger(__name__)


class LoggingAttention(Attention):
    def describe_path(self) -> str:
        if self.use_output:
            path = "unified_attention_with_output"
        else:
            path = "unified_attention"
        logger.debug("attention layer %s uses %s", self.layer_name, path)
        return path
