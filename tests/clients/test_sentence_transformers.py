"""sentence-transformers (the real package) on the long-document encoders: Longformer, BigBird and Reformer through
``models.Transformer(folder)`` encode, save and reload, take documents of 4,096 tokens, and give a sentence the same
embedding alone or in a batch (Longformer, Reformer: within 1e-5). BigBird's depends on the batch's padded length,
exactly as transformers' BigBird's does: which attention runs (full below a few blocks, block sparse above) and where
its blocks fall are decided by the padded length; the test shows transformers' model moving by the same amount."""

from __future__ import annotations

import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

import tf_family
from tf_family.registry import get_arch

from .tiny_text import char_tokenizer

LONG = 4096
# positions for 4,096 tokens (Longformer counts from padding_idx + 1, as RoBERTa)
POSITIONS = {
    "longformer": {"max_position_embeddings": LONG + 2},
    "big_bird": {"max_position_embeddings": LONG},
    "reformer": {"axial_pos_shape": [64, 64]},
}
SENTENCES = [
    "A short one.",
    "A much longer sentence, with many more characters than the first, so that the batch pads the others. " * 2,
    "A sentence of middle length.",
]


def _encoder(folder) -> SentenceTransformer:
    body = Transformer(str(folder), max_seq_length=LONG)  # models.Transformer, by its 6.x path
    # Reformer's output holds both residual streams, 2 * hidden_size wide (transformers' ReformerModel too), while
    # sentence-transformers reads config.hidden_size: give the pooling the width (tf_family models name it)
    width = getattr(body.auto_model, "last_hidden_size", body.get_embedding_dimension())
    pooling = Pooling(width, pooling_mode="mean")
    return SentenceTransformer(modules=[body, pooling], device="cpu")


def _save_encoder(name, folder):
    torch.manual_seed(0)
    spec = get_arch(name)
    model = spec.model_classes["base"](spec.tiny_config(**POSITIONS[name])).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def _alone_and_batched(encoder):
    batched = encoder.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_tensor=True)
    alone = torch.stack([encoder.encode([sentence], convert_to_tensor=True)[0] for sentence in SENTENCES])
    return alone, batched


@pytest.mark.parametrize("name", ["longformer", "big_bird", "reformer"])
def test_encode_save_reload_and_long_documents(name, tmp_path):
    encoder = _encoder(_save_encoder(name, tmp_path / "model"))
    document = ("The encoder reads the whole document. " * 120)[:LONG]
    assert len(encoder.tokenize([document])["input_ids"][0]) == LONG
    long_embedding = encoder.encode([document], convert_to_tensor=True)
    assert long_embedding.shape == (1, encoder.get_embedding_dimension())
    assert torch.isfinite(long_embedding).all()
    alone, batched = _alone_and_batched(encoder)
    if name != "big_bird":
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5)
    encoder.save(str(tmp_path / "saved"))
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert type(reloaded[0].auto_model).__name__.startswith("Tff")
    torch.testing.assert_close(reloaded.encode(SENTENCES, convert_to_tensor=True), batched, rtol=0, atol=1e-6)


def test_big_bird_depends_on_the_padded_length_exactly_as_transformers(tmp_path):
    """A short sentence alone runs full attention; padded to a long one's length it runs block sparse. transformers'
    BigBird (same weights; its eval points random blocks at the first block, which tf_family mimics on its
    checkpoints) moves each embedding by the same amount as tf_family's."""
    config = transformers.BigBirdConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        block_size=4, num_random_blocks=1, max_position_embeddings=512, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.BigBirdModel(config, add_pooling_layer=False).eval()
    theirs.save_pretrained(tmp_path / "transformers")
    char_tokenizer().save_pretrained(tmp_path / "transformers")
    tf_family.TffBigBirdModel.from_pretrained(tmp_path / "transformers").save_pretrained(tmp_path / "ours")
    char_tokenizer().save_pretrained(tmp_path / "ours")
    ours_alone, ours_batched = _alone_and_batched(_encoder(tmp_path / "ours"))
    # transformers' model switches to full attention for good on a short input (its issue #20031): batched first
    their_encoder = _encoder(tmp_path / "transformers")
    their_batched = their_encoder.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_tensor=True)
    their_alone = torch.stack(
        [_encoder(tmp_path / "transformers").encode([s], convert_to_tensor=True)[0] for s in SENTENCES]
    )
    assert float((ours_batched - ours_alone).abs().max()) > 1e-3  # the dependence is real
    torch.testing.assert_close(ours_batched, their_batched, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_alone, their_alone, rtol=0, atol=1e-5)
