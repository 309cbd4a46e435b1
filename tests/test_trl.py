"""TRL's `SFTTrainer` and `DPOTrainer` train every causal architecture of the registry, through the real trl.

TRL never reads a model's logits: it patches ``forward`` with a fused LM head (``add_fused_lm_head``) that multiplies
the backbone's last hidden state by ``get_output_embeddings().weight``. The tf_family causal LMs answer that call
themselves (`tf_family.modeling.fused_lm_head`), so the log-probabilities TRL trains on are the model's own. Checked here for
every causal architecture, with transformers' ``LlamaForCausalLM`` of the same size as the control:

- the fused log-probabilities TRL gets equal ``log_softmax(forward(...).logits)`` at the labelled positions;
- `SFTTrainer` on plain text (gradient accumulation 2 x 1 gives the update of one batch of 2), packed text
  (``packing_strategy="wrapped"``) and prompt-completion pairs (loss on the completion only): finite losses, weights
  that move, a saved folder that reloads through the Auto classes with identical weights;
- padding-free batches (``packing_strategy="bfd"``) are refused with a ValueError naming what works;
- `DPOTrainer` on preference pairs, loading the policy and its reference from a saved folder.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer
from trl.trainer.utils import add_fused_lm_head

from tests.models.knn_lm.test_knn_lm import knn_lm_with_a_datastore
from tests.test_trainer import _tiny_model
from tf_family.registry import ARCHITECTURES

CAUSAL = [name for name, spec in ARCHITECTURES.items() if "causal_lm" in spec.tasks]
CONTROL = "llama"  # transformers' LlamaForCausalLM of the same size: what passes there is the bar
MAX_LENGTH = 32  # within every tiny config's positions
SENTENCES = [
    "the cat sat on the mat.",
    "a dog ran in the park",
    "we read long books",
    "memory helps models",
    "sparse attention is cheap",
    "exit early when sure",
]


def _tokenizer() -> PreTrainedTokenizerFast:
    """A character tokenizer (a BPE without merges) of 40 ids, inside every tiny model's 128."""
    characters = list("abcdefghijklmnopqrstuvwxyz .,?!'")
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{char: index + 3 for index, char in enumerate(characters)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _model(name: str) -> torch.nn.Module:
    if name == CONTROL:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
        return LlamaForCausalLM(config)
    return _tiny_model(name, "causal_lm")


def _sft_args(tmp_path, **overrides) -> SFTConfig:
    arguments = {
        "output_dir": str(tmp_path / "run"),
        "max_length": MAX_LENGTH,
        "per_device_train_batch_size": 2,
        "max_steps": 2,
        "learning_rate": 0.05,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    return SFTConfig(**{**arguments, **overrides})


def _train(trainer) -> list[float]:
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _assert_trained_and_reloads(trainer, before: dict[str, torch.Tensor], losses: list[float], folder) -> None:
    assert losses and all(torch.isfinite(torch.tensor(losses))), losses
    model = trainer.model
    moved = [key for key, value in model.state_dict().items() if not torch.equal(value, before[key])]
    assert moved, "no weight moved"
    trainer.save_model(str(folder))
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert type(loaded) is type(model)
    saved, reloaded = model.state_dict(), loaded.state_dict()
    assert saved.keys() == reloaded.keys()
    for key, value in saved.items():
        assert torch.equal(value, reloaded[key]), key


@pytest.mark.parametrize("name", [*CAUSAL, CONTROL])
def test_trl_fused_log_probs_are_the_models_own(name):
    model = _model(name).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 128, (2, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :5] = -100  # a prompt
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)[:, :-1]
    expected = own.gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0] * (labels[:, 1:] != -100)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    with torch.no_grad():
        fused = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    torch.testing.assert_close(fused.log_probs, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(fused.label_mask, labels[:, 1:] != -100)
    assert torch.isfinite(fused.entropy).all() and (fused.entropy >= -1e-6).all()
    # and the plain call still gives the model's outputs (generation is unchanged)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)[:, :-1], own)


@pytest.mark.parametrize("name", ["transfo_xl", "performer"])
def test_trl_patch_stays_installed_and_its_temperature_is_kept(name):
    """TRL's patch is installed as TRL installs it (no attribute interception); the model's forward pre-hook hands the
    fused call to the model's own forward with the patch's temperature and fields, also under accelerate's
    mixed-precision wrapper (which sits on top of the patch)."""
    from accelerate.utils import convert_outputs_to_fp32

    from tf_family.modeling.fused_lm_head import fused_lm_head_output

    model = _model(name).eval()
    ids = torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :4] = -100
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    expected = fused_lm_head_output(logits, labels, None, None, 0.7, ("log_probs", "entropy"))
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    assert "forward" in model.__dict__  # TRL's own patch, not declined
    for wrapped in (False, True):
        if wrapped:  # what accelerate's Accelerator.prepare does under native mixed precision
            model.forward = types.MethodType(convert_outputs_to_fp32(model.forward.__func__), model)
        with torch.no_grad():
            fused = model(input_ids=ids, labels=labels, fused_lm_head=True)
        assert torch.equal(fused.log_probs, expected.log_probs)
        assert torch.equal(fused.entropy, expected.entropy)
        assert fused.is_top1 is None and fused.mean_logits is None  # not asked for by the patch
        assert not torch.equal(fused.log_probs, fused_lm_head_output(logits, labels, None, None, 1.0).log_probs)


@pytest.mark.parametrize("name", [*CAUSAL, CONTROL])
def test_sft_on_plain_text_trains_reloads_and_accumulates_exactly(name, tmp_path):
    tokenizer = _tokenizer()
    dataset = Dataset.from_dict({"text": ["the cat sat on the mat. the end", "we read"]})  # 32 and 8 labels
    model = _model(name)
    before = {key: value.detach().clone() for key, value in model.state_dict().items()}
    twin = copy.deepcopy(model)

    # float32 here (TRL's default is bf16 autocast, which the other tests keep) so that the comparison is tight
    trainer = SFTTrainer(model=model, args=_sft_args(tmp_path, max_steps=1, bf16=False), train_dataset=dataset,
                         processing_class=tokenizer)  # fmt: skip
    losses = _train(trainer)
    _assert_trained_and_reloads(trainer, before, losses, tmp_path / "saved")

    # the same two examples as two micro-batches of one: the same update (the loss sums over num_items_in_batch)
    accumulated = SFTTrainer(
        model=twin,
        args=_sft_args(tmp_path / "accumulated", max_steps=1, bf16=False, per_device_train_batch_size=1,
                       gradient_accumulation_steps=2),
        train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    accumulated_losses = _train(accumulated)
    torch.testing.assert_close(accumulated_losses[0], losses[0], rtol=1e-4, atol=1e-5)
    # the updates agree to float rounding; a loss averaged per micro-batch would weigh the short example's 8 labels
    # like the long one's 32
    # (floating-point entries: an integer buffer counts forward calls, as the Performer's redraw schedule does, and
    # two micro-batches are two calls; the Routing Transformer's k-means centroids are running statistics that move
    # once per training forward, as BatchNorm's do, so two micro-batches move them twice)
    one, two = trainer.model.state_dict(), accumulated.model.state_dict()
    weights = [key for key in before if before[key].is_floating_point() and not key.endswith("self_attn.centroids")]
    update = torch.cat([(one[key] - before[key]).flatten() for key in weights])
    difference = torch.cat([(two[key] - one[key]).flatten() for key in weights])
    assert difference.norm() <= 1e-4 * update.norm(), (difference.norm(), update.norm())


@pytest.mark.parametrize("name", [*CAUSAL, CONTROL])
def test_sft_packed_and_completion_only(name, tmp_path):
    tokenizer = _tokenizer()
    model = _model(name)
    before = {key: value.detach().clone() for key, value in model.state_dict().items()}
    packed = SFTTrainer(
        model=model,
        args=_sft_args(tmp_path, max_steps=1, packing=True, packing_strategy="wrapped", max_length=24),
        train_dataset=Dataset.from_dict({"text": SENTENCES}),
        processing_class=tokenizer,
    )
    _assert_trained_and_reloads(packed, before, _train(packed), tmp_path / "packed")

    # prompt-completion pairs: the loss counts the completion's tokens only
    pairs = Dataset.from_dict({"prompt": ["the cat ", "a dog "], "completion": ["sat on the mat.", "ran far"]})
    before = {key: value.detach().clone() for key, value in model.state_dict().items()}
    completion = SFTTrainer(model=model, args=_sft_args(tmp_path / "completion", max_steps=1), train_dataset=pairs,
                            processing_class=tokenizer)  # fmt: skip
    batch = next(iter(completion.get_train_dataloader()))
    prompt_length = len(tokenizer("the cat ")["input_ids"])
    row = int((batch["input_ids"][:, 0] == tokenizer("the cat ")["input_ids"][0]).nonzero()[0])
    assert (batch["labels"][row, :prompt_length] == -100).all() and (
        batch["labels"][row, prompt_length:] != -100
    ).any()
    _assert_trained_and_reloads(completion, before, _train(completion), tmp_path / "completion_saved")


@pytest.mark.parametrize("name", CAUSAL)
def test_sft_padding_free_packing_is_refused_with_what_works(name, tmp_path):
    trainer = SFTTrainer(
        model=_model(name),
        args=_sft_args(tmp_path, max_steps=1, packing=True, packing_strategy="bfd"),
        train_dataset=Dataset.from_dict({"text": SENTENCES}),
        processing_class=_tokenizer(),
    )
    with pytest.raises(ValueError, match=r"padding-free batch.*packing_strategy='wrapped'"):
        trainer.train()


@pytest.mark.parametrize("name", [*CAUSAL, CONTROL])
def test_dpo_on_preference_pairs(name, tmp_path):
    tokenizer = _tokenizer()
    folder = tmp_path / "policy"
    _model(name).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pairs = Dataset.from_dict(
        {
            "prompt": ["the cat ", "a dog ", "we read "],
            "chosen": ["sat on the mat.", "ran in the park", "long books"],
            "rejected": ["flew to the moon", "sang", "nothing at all ever"],
        }
    )
    arguments = DPOConfig(
        output_dir=str(tmp_path / "run"), max_length=MAX_LENGTH, per_device_train_batch_size=2, max_steps=2,
        learning_rate=0.05, optim="sgd", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        beta=0.5,
    )  # fmt: skip
    trainer = DPOTrainer(model=str(folder), args=arguments, train_dataset=pairs, processing_class=tokenizer)
    assert trainer.ref_model is not None and type(trainer.ref_model) is type(trainer.model)
    before = {key: value.detach().clone() for key, value in trainer.model.state_dict().items()}
    losses = _train(trainer)
    # the first step's policy is its reference: the sigmoid loss starts at log 2
    assert losses[0] == pytest.approx(0.6931, abs=1e-3)
    _assert_trained_and_reloads(trainer, before, losses, tmp_path / "saved")
    assert not any(
        torch.equal(value, trainer.ref_model.state_dict()[key])
        for key, value in trainer.model.state_dict().items()
        if not torch.equal(value, before[key])
    )  # the reference stayed where it was


@pytest.mark.parametrize("name", ["knn_lm", CONTROL])
def test_sft_with_save_steps_keeps_every_checkpoint(name, tmp_path, caplog):
    """A kNN-LM trained by SFTTrainer no longer matches its datastore: every checkpoint keeps the weights and the
    config and leaves the stale datastore out, with one warning that says how to rebuild it."""
    model = knn_lm_with_a_datastore() if name == "knn_lm" else _model(name)
    trainer = SFTTrainer(
        model=model,
        args=_sft_args(tmp_path, bf16=False, save_strategy="steps", save_steps=1),
        train_dataset=Dataset.from_dict({"text": SENTENCES}),
        processing_class=_tokenizer(),
    )
    with caplog.at_level("WARNING"):
        trainer.train()
        trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "run" / "checkpoint-1", tmp_path / "run" / "checkpoint-2", tmp_path / "final"):
        assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file(), folder
        assert not (folder / "datastore").exists()
    if name != "knn_lm":
        return
    stale = [record for record in caplog.records if "datastore" in record.getMessage()]
    assert len(stale) == 1, [record.getMessage() for record in stale]
    assert "build_datastore" in stale[0].getMessage() and "set_datastore" in stale[0].getMessage()
    caplog.clear()
    with caplog.at_level("WARNING"):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert loaded.datastore is None
    assert any("no datastore" in record.getMessage() for record in caplog.records), caplog.text
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
