"""A stub of vLLM's attention layers: just the contract the migrated layer code relies on."""

from __future__ import annotations

import torch
import vllm_stub_config as config

OLD_API = config.API == "old"
LAYERS: dict[str, torch.nn.Module] = {}


class ReferenceImpl:
    """Grouped-query attention over the whole batch; writes into ``output`` when given one, else
    returns a new ``[T, num_heads * head_size_v]`` tensor (what 0.19 backends supporting both paths did)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        q = query.view(-1, layer.num_heads, layer.head_size)
        k = key.view(-1, layer.num_kv_heads, layer.head_size)
        v = value.view(-1, layer.num_kv_heads, layer.head_size_v)
        groups = layer.num_heads // layer.num_kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = torch.einsum("thd,shd->hts", q, k) * layer.head_size**-0.5
        result = torch.einsum("hts,shd->thd", scores.softmax(-1), v)
        if output is None:
            return result.reshape(-1, layer.num_heads * layer.head_size_v)
        output.view(-1, layer.num_heads, layer.head_size_v).copy_(result)
        return output


class Backend:
    impl_cls = ReferenceImpl


if OLD_API:
    Backend.accept_output_buffer = config.ACCEPT_OUTPUT_BUFFER


class Attention(torch.nn.Module):
    def __init__(self, num_heads, head_size, num_kv_heads, head_size_v, prefix):
        super().__init__()
        self.num_heads, self.head_size = num_heads, head_size
        self.num_kv_heads, self.head_size_v = num_kv_heads, head_size_v
        self.layer_name = prefix
        self.attn_backend = Backend
        self.impl = Backend.impl_cls()
        if OLD_API:
            self.use_output = self.attn_backend.accept_output_buffer
        LAYERS[prefix] = self


class MLAAttention(torch.nn.Module):
    def __init__(self, num_heads, v_head_dim, kv_lora_rank, qk_rope_head_dim, prefix):
        super().__init__()
        self.num_heads, self.v_head_dim = num_heads, v_head_dim
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.layer_name = prefix
        self.attn_backend = Backend
        if OLD_API:
            self.use_output = self.attn_backend.accept_output_buffer
        LAYERS[prefix] = self

    def forward_impl(self, q, kv_c_normed, k_pe, kv_cache, attn_metadata, output=None):
        q = q.view(-1, self.num_heads, self.kv_lora_rank + self.qk_rope_head_dim)
        mixed = q[..., : self.v_head_dim] * kv_c_normed[:, None, : self.v_head_dim]
        result = (mixed + k_pe.view(-1, 1, self.qk_rope_head_dim).sum(-1, keepdim=True)).flatten(1)
        if output is None:
            return result
        output.view_as(result).copy_(result)
        return output


def unified_attention_with_output(query, key, value, output, layer_name, kv_cache_dummy_dep=None):
    layer = LAYERS[layer_name]
    layer.impl.forward(layer, query, key, value, None, None, output=output)


def unified_mla_attention_with_output(q, kv_c_normed, k_pe, output, layer_name, kv_cache_dummy_dep=None):
    LAYERS[layer_name].forward_impl(q, kv_c_normed, k_pe, None, None, output=output)


def unified_attention(query, key, value, layer_name):
    layer = LAYERS[layer_name]
    return layer.impl.forward(layer, query, key, value, None, None)


def unified_mla_attention(q, kv_c_normed, k_pe, layer_name, kv_cache_dummy_dep=None):
    return LAYERS[layer_name].forward_impl(q, kv_c_normed, k_pe, None, None)


_lib = torch.library.Library("vllm", "FRAGMENT")
_OPS = {
    "unified_attention_with_output": (
        "(Tensor query, Tensor key, Tensor value, Tensor(a!) output, str layer_name, "
        "Tensor? kv_cache_dummy_dep=None) -> ()",
        unified_attention_with_output,
    ),
    "unified_mla_attention_with_output": (
        "(Tensor q, Tensor kv_c_normed, Tensor k_pe, Tensor(a!) output, str layer_name, "
        "Tensor? kv_cache_dummy_dep=None) -> ()",
        unified_mla_attention_with_output,
    ),
}
if OLD_API:
    _OPS["unified_attention"] = (
        "(Tensor query, Tensor key, Tensor value, str layer_name) -> Tensor", unified_attention,
    )  # fmt: skip
    _OPS["unified_mla_attention"] = (
        "(Tensor q, Tensor kv_c_normed, Tensor k_pe, str layer_name, Tensor? kv_cache_dummy_dep=None) -> Tensor",
        unified_mla_attention,
    )
else:  # vLLM 0.20 deleted them, and their Python functions
    del unified_attention, unified_mla_attention
for _name, (_schema, _kernel) in _OPS.items():
    _lib.define(_name + _schema)
    _lib.impl(_name, _kernel, "CompositeExplicitAutograd")
