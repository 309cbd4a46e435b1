"""Train the bundled byte-level BPE tokenizer on the SOTU train split (see PROVENANCE.md).

    python tf_family/data/sotu/train_tokenizer.py tf_family/data/sotu/tokenizer

Byte-level BPE (GPT-2 style pre-tokenisation, so any text round-trips), 8,192 ids, with one special token
``<|endoftext|>`` (id 0) that separates documents. Trained only on the train split (1790-1994), so validation and
test perplexities are not flattered by the tokenizer having seen them. Deterministic: the same corpus gives the
same ``tokenizer.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tf_family.data.sotu import load_sotu

END_OF_TEXT = "<|endoftext|>"
VOCAB_SIZE = 8192


def train_tokenizer(output_dir: Path, vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    texts = load_sotu()["train"]["text"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=1_000_000,
    )
    fast.save_pretrained(output_dir)
    return fast


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    tok = train_tokenizer(args.output_dir, args.vocab_size)
    sys.stdout.write(f"wrote {args.output_dir} with {len(tok)} ids\n")
