"""The byte-level model: transformers' own Llama, small enough to commit (bf16, < 10 MB).

GQA (4 query heads over 2 KV heads) with head dim 64, which every int8attn target takes.
"""

from __future__ import annotations

from pathlib import Path

from corpus import END, VOCAB

WEIGHTS = Path(__file__).resolve().parent / "weights"
CONTEXT = 1024

SHAPE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=CONTEXT, rope_theta=10000.0, tie_word_embeddings=True,
             bos_token_id=None, eos_token_id=END, pad_token_id=None)


def config():
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPE)


def load(folder: Path = WEIGHTS, dtype=None):
    """The trained model in `dtype` (default float32), in eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"error: no trained weights in {folder}; make them with "
                         f"python examples/byte_model/train.py --out {folder}")
    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
    model.generation_config.eos_token_id = END
    model.generation_config.pad_token_id = END
    return model.eval()
