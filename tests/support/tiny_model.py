"""Build a tiny causal LM and its tokenizer on the fly, so the local backend is tested without downloads.

The tokenizer is a byte-level BPE trained here on the text below (it has accents and an emoji, so some
tokens are partial UTF-8 sequences); the model is a 2-layer Llama with random weights. Both are saved
with `save_pretrained`, exactly what a real model directory holds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TRAINING_TEXT = """
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.
A gateway receives chat requests, routes them to a model, and streams the answer back.
Every dialect keeps its own rules: finish reasons, error bodies, stream framing and limits.
Tokens arrive one by one; the client reads them as they come and prints them on the screen.
Sampling picks the next token from a distribution shaped by temperature, top p and top k.
A seed makes the choice repeatable: the same seed gives the same words in the same order.
Stop sequences end the answer early, and the maximum number of tokens ends it at a length.
The café on the corner serves crème brûlée, naïve cooks learn from über chefs, señor.
Zoë and Chloé met at the façade of the old théâtre; déjà vu, they said, with a smile 🙂.
Numbers like 1, 2, 3, 42 and 2026 appear in logs, and so do words like error, retry, ready.
The river flows past green hills, small houses, tall trees, quiet fields and a stone bridge.
In the morning the baker opens the shop, bakes bread, sells rolls and greets every neighbour.
Engineers write tests that start real servers, send real requests and check every answer.
When the model is small and random, its text is nonsense, yet the machinery must be exact.
Questions, answers, stories, lists, poems and recipes all pass through the same pipeline.
Blue, red, yellow, purple, orange and silver colours paint the evening sky over the sea.
"""

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int = 512, chat_template: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on TRAINING_TEXT, wrapped for transformers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in TRAINING_TEXT.splitlines() if line]
    tokenizer.train_from_iterator(lines * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE if chat_template else None,
    )


# Llama shapes over the same tokenizer: `tiny` (139,584 parameters, head_dim 16) is the suite's;
# `tiny-long` the same with a 4096-token window (llama.cpp's server caps its own at the model's);
# `tiny64` has head_dim 64, the smallest that vLLM's CPU attention takes (it rejects 16);
# `medium` (25.7M parameters) is big enough for prompt processing to take seconds on a CPU, so a
# server's prefix cache shows (the fleet benchmark).
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512),
    "tiny-long": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096),
    "tiny64": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=512),
    "medium": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, max_position_embeddings=4096),
}  # fmt: skip


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, size: str = "tiny") -> LlamaForCausalLM:
    """A Llama of one of SIZES with random weights (fixed by `seed`)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **SIZES[size],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Random init with std 0.02 gives an almost flat distribution; a wider output layer gives the
    # model preferences, so greedy and sampled outputs differ and logprobs are far from uniform.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)
    return model.eval()


def save_tiny_model(directory: Path, chat_template: bool = True, size: str = "tiny") -> Path:
    """Write a tokenizer and a model of SIZES into `directory` (created if needed) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(chat_template=chat_template)
    tokenizer.save_pretrained(directory)
    build_model(tokenizer, size=size).save_pretrained(directory)
    return directory
