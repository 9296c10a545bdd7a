"""Small model configurations shared by the suites (built from configs: no weights)."""


def tiny_llama(transformers):
    """A 2-layer Llama with SDPA attention, 32-d, GQA (4 heads, 2 key/value heads)."""
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)
