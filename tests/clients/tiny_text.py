"""What the client tests share: a character-level tokenizer (no download) and tiny causal LMs saved with it."""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tf_family.registry import ARCHITECTURES

CAUSAL = [name for name, spec in ARCHITECTURES.items() if "causal_lm" in spec.model_classes]
SPECIALS = ["<pad>", "<eos>", "<unk>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable character (ids 3-102), pad 0 (what lm-eval pads with), eos 1: fits the tiny vocab."""
    vocab = {token: index for index, token in enumerate(SPECIALS + list(string.printable))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<eos>", unk_token="<unk>"
    )


def save_tiny_run(name: str, folder: Path, **overrides) -> Path:
    """A tiny causal LM of ``name`` (weights pushed off the init, so every input matters) with the tokenizer."""
    torch.manual_seed(0)
    spec = ARCHITECTURES[name]
    model = spec.model_classes["causal_lm"](spec.tiny_config(**overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


TEXTS = [
    "The quick brown fox jumps over the lazy dog, again and again, until the dog gets up.",
    "Memory models read a document as one stream.",
    "Short.",
    "A longer document that needs several windows: segment after segment, each one attends to the memory left "
    "behind by the segments before it, as the papers evaluate their models.",
]
