"""A tiny causal LM built offline from config, with a character-level tokenizer.

Used by the text-only RLVR task (`toy_arithmetic`) and the tests: a real
`transformers.Qwen2ForCausalLM` with a `PreTrainedTokenizerFast`, saved with `save_pretrained`
(safetensors) into the model cache, then loaded with the `Auto*` classes like any hub model.
"""

from __future__ import annotations

from pathlib import Path

from mmrl.models.cache import cached_build

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def build_char_tokenizer(chars: str):
    """A character-level fast tokenizer: one id per character, plus <pad>, <bos>, <eos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(set(chars))
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for c in alphabet:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
    )
    return fast


def build_tiny_causal_lm(
    chars: str,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    max_positions: int = 128,
    cache_root: Path | None = None,
) -> Path:
    """Build (once, cached) a tiny Qwen2 causal LM over ``chars`` and return its folder."""
    spec = {
        "chars": "".join(sorted(set(chars))),
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "seed": seed,
        "max_positions": max_positions,
        "v": 1,
    }

    def build(folder: Path) -> None:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = build_char_tokenizer(chars)
        config = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    return cached_build("tiny_lm", spec, build, root=cache_root)
