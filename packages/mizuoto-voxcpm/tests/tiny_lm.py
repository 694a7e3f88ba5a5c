"""A MiniCPM-4 configuration of any width for unit tests (no vocabulary: the tests feed
embeddings), with LongRoPE factors of 1 so that positions rotate as plain RoPE."""

from __future__ import annotations

from mizuoto_voxcpm.config import RopeScaling, TransformerConfig


def lm_config(hidden_size: int, intermediate_size: int, *, heads: int, kv_heads: int,
              layers: int = 2, max_positions: int = 4096, use_mup: bool = True
              ) -> TransformerConfig:
    half_head = hidden_size // heads // 2
    return TransformerConfig(
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_attention_heads=heads,
        num_hidden_layers=layers, num_key_value_heads=kv_heads, rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=RopeScaling("longrope", (1.0,) * half_head, (1.0,) * half_head,
                                 max_positions),
        max_position_embeddings=max_positions, vocab_size=0, scale_emb=12, scale_depth=1.4,
        dim_model_base=256, use_mup=use_mup)
