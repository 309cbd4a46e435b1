"""Building CALM from an existing decoder: transformers Llama / GPT-2 objects, a zoo kNN-LM around a Llama, a CALM
model (new exit fields), folders; every other zoo architecture is refused with the reason and the fix."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from tf_family import TffCalmForCausalLM
from tf_family.models.calm.convert_calm import UNSUPPORTED_DECODERS
from tf_family.registry import get_arch, list_architectures

IDS = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_llama_and_gpt2_objects_convert_with_identical_logits():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64)).eval()
    for source in (tiny_llama(), gpt2):
        calm = TffCalmForCausalLM.from_decoder(source, first_exit=1, exit_interval=1).eval()
        assert calm.config.exit_points() == [1, 2, 3]
        with torch.no_grad():
            torch.testing.assert_close(calm(IDS).logits, source(IDS).logits, rtol=1e-5, atol=1e-5)


def test_zoo_knn_lm_converts_its_base_decoder(tmp_path):
    llama = tiny_llama()
    knn = get_arch("knn_lm").model_classes["causal_lm"].from_base(llama)
    calm = TffCalmForCausalLM.from_decoder(knn, first_exit=2).eval()
    with torch.no_grad():  # without a datastore the kNN-LM is its base model (its logits are log-probabilities)
        expected = llama(IDS).logits
        torch.testing.assert_close(calm(IDS).logits, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(calm(IDS).logits.log_softmax(-1), knn(IDS).logits, rtol=1e-5, atol=1e-5)
    knn.save_pretrained(tmp_path / "knn")  # and from its folder
    from_folder = TffCalmForCausalLM.from_decoder(tmp_path / "knn", first_exit=2).eval()
    with torch.no_grad():
        torch.testing.assert_close(from_folder(IDS).logits, calm(IDS).logits, rtol=0, atol=0)


def test_calm_model_copies_with_new_exit_fields():
    source = TffCalmForCausalLM(get_arch("calm").tiny_config()).eval()
    copy = TffCalmForCausalLM.from_decoder(source, first_exit=2, confidence_measure="state").eval()
    assert copy.config.first_exit == 2 and source.config.first_exit == 1
    ids = IDS % 128
    with torch.no_grad():
        torch.testing.assert_close(copy(ids).logits, source(ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not_a_field"):
        TffCalmForCausalLM.from_decoder(source, not_a_field=1)


@pytest.mark.parametrize("name", [name for name in list_architectures() if name not in ("calm", "knn_lm")])
def test_other_zoo_architectures_are_refused_with_reason_and_fix(name, tmp_path):
    spec = get_arch(name)
    config = spec.tiny_config()
    assert config.model_type in UNSUPPORTED_DECODERS  # every zoo architecture is either built from or refused
    task = next(iter(spec.model_classes.values()))
    model = task(config)
    with pytest.raises(ValueError, match="--arch calm") as error:
        TffCalmForCausalLM.from_decoder(model)
    assert config.model_type in str(error.value)
    config.save_pretrained(tmp_path)  # a folder is refused from its config alone
    with pytest.raises(ValueError, match=config.model_type):
        TffCalmForCausalLM.from_decoder(tmp_path)
