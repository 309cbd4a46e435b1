import json

import pytest
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from tf_family.data import SOTU_TOKENIZER_DIR, load_sotu


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Short real documents (openings of SOTU addresses) as local JSON-lines train / validation files."""
    sotu = load_sotu()
    folder = tmp_path_factory.mktemp("corpus")
    for split, source, count in (("train", sotu["train"], 8), ("validation", sotu["validation"], 2)):
        rows = [{"text": row["text"][:1200], "year": row["year"]} for row in source.select(range(count))]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"train": str(folder / "train.jsonl"), "validation": str(folder / "validation.jsonl")}


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A plain transformers GPT-2 (no memory, absolute positions up to 64) with the bundled tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(
        vocab_size=8192,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        eos_token_id=0,
        bos_token_id=0,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR).save_pretrained(folder)
    return str(folder)


def data_args(corpus) -> list[str]:
    return ["--train_file", corpus["train"], "--validation_file", corpus["validation"]]


TINY_TXL = ["--arch", "transfo_xl", "--variant", "tiny", "--config_overrides", "dropout=0.1", "--block_size", "16"]


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Each recipe run in this process starts from a fresh accelerate state (it is a process-wide singleton, and a
    second `Accelerator` with another mixed precision would be refused)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
