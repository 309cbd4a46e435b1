"""kNN-LM: datastore building and round trip, fingerprints, degenerate λ, a hand-computed example, faiss vs exact,
generation with the base model's KV cache, save / from_pretrained with the datastore."""

import hashlib
import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from tests.hub_cache import as_hub_cache
from tf_family import ARCHITECTURES, create_model
from tf_family.data.packing import IGNORE_INDEX, pack_into_blocks
from tf_family.memory.knn import dense_knn_search
from tf_family.memory.knn_lm import dense_knn_log_probs
from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM
from tf_family.retrieval.datastore import (
    DatastoreMismatchError,
    KNNDatastore,
    build_datastore,
    fingerprint_model,
    fingerprint_tokenizer,
    resolve_key_module,
)

VOCAB = 128


def base_llama(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    wrapper = create_model("knn_lm", "causal_lm", "tiny", **overrides)
    with torch.no_grad():
        for parameter in wrapper.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return wrapper.lm.eval()


def token_blocks(num_documents: int = 12, block_size: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    # documents repeating short phrases, so that contexts recur and retrieval has something to find
    phrases = torch.randint(1, VOCAB, (6, 5), generator=generator)
    documents = [
        torch.cat([phrases[i] for i in torch.randint(0, 6, (8,), generator=generator)]).tolist()
        for _ in range(num_documents)
    ]
    return pack_into_blocks(documents, block_size, separator_id=0)


def batches_of(blocks, batch_size: int = 4):
    return [blocks.batch(range(i, min(i + batch_size, len(blocks)))) for i in range(0, len(blocks), batch_size)]


def knn_lm_with_a_datastore(k: int = 4, lmbda: float = 0.25) -> TffKNNLMForCausalLM:
    """A tiny kNN-LM with the datastore of its base weights attached (any training step makes it stale)."""
    base = base_llama()
    datastore = build_datastore(base, batches_of(token_blocks()), None, show_progress=False)
    return TffKNNLMForCausalLM.from_base(base, datastore, k=k, lmbda=lmbda)


class FakeTokenizer:
    def __init__(self, shift: int = 0):
        self.shift = shift

    def get_vocab(self):
        return {f"t{i}": i + self.shift for i in range(VOCAB)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = base_llama()
    blocks = token_blocks()
    folder = tmp_path_factory.mktemp("datastore")
    datastore = build_datastore(
        base, batches_of(blocks), folder, tokenizer=FakeTokenizer(), shard_size=150, show_progress=False
    )
    return base, blocks, datastore, folder


# ------------------------------------------------------------------------------------------------------- datastore
def test_datastore_holds_the_lm_head_inputs_and_next_tokens(built):
    base, blocks, datastore, folder = built
    assert datastore.size == blocks.num_targets
    description = json.loads((folder / "datastore.json").read_text())
    assert description["module_path"] == "lm_head" and description["key_point"] == "lm_head_input"
    assert description["dim"] == 32 and description["key_dtype"] == "float16" and description["size"] == datastore.size
    assert len(description["shards"]) == -(-datastore.size // 150)  # shards of 150 keys
    assert not list(folder.glob("*.tmp"))
    with torch.no_grad():
        hidden = base(blocks.input_ids, output_hidden_states=True).hidden_states[-1]  # after the final norm
    keep = blocks.labels != IGNORE_INDEX
    torch.testing.assert_close(torch.cat(datastore.key_shards).float(), hidden[keep].half().float())
    assert torch.equal(datastore.values, blocks.labels[keep])


def test_datastore_round_trip_is_memory_mapped(built):
    _, _, datastore, folder = built
    loaded = KNNDatastore.load(folder)
    assert loaded.size == datastore.size and loaded.description == datastore.description
    assert torch.equal(torch.cat(loaded.key_shards), torch.cat(datastore.key_shards))
    assert torch.equal(loaded.values, datastore.values)
    queries = torch.randn(5, 32)
    for a, b in zip(loaded.search(queries, 4), datastore.search(queries, 4), strict=True):
        assert torch.equal(a, b)


def test_float32_keys_and_the_ffn_key_point(tmp_path):
    base = base_llama()
    name, _ = resolve_key_module(base, "ffn_input")
    assert name == "model.layers.1.mlp"  # the last layer's feed-forward block, found without per-model code
    datastore = build_datastore(
        base, batches_of(token_blocks(4)), None, key_point="ffn_input", key_dtype=torch.float32, show_progress=False
    )
    assert datastore.key_shards[0].dtype == torch.float32 and datastore.description["module_path"] == name
    with pytest.raises(ValueError, match="module_path='model.layers.9.mlp' is not a module"):
        resolve_key_module(base, module_path="model.layers.9.mlp")
    with pytest.raises(ValueError, match="key_dtype"):
        build_datastore(base, [], None, key_dtype=torch.int8)


def test_a_plain_gpt2_and_our_transformer_xl_build_datastores_too():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32)).eval()
    txl = create_model("transfo_xl", "causal_lm", "tiny").eval()
    blocks = token_blocks(3, block_size=8)
    for model, module, ffn in (
        (gpt2, "lm_head", "transformer.h.1.mlp"),
        (txl, "lm_head", "transformer.layers.1.feed_forward"),
    ):
        assert resolve_key_module(model, "ffn_input")[0] == ffn
        datastore = build_datastore(model, batches_of(blocks), None, show_progress=False)
        assert datastore.description["module_path"] == module and datastore.size == blocks.num_targets


# ---------------------------------------------------------------------------------------------------- fingerprints
def test_a_datastore_of_another_model_or_tokenizer_is_refused_unless_forced(built, caplog):
    _, _, _, folder = built
    other = base_llama(seed=1)
    with pytest.raises(DatastoreMismatchError, match="built by another model"):
        KNNDatastore.load(folder, model=other)
    with pytest.raises(DatastoreMismatchError, match="another tokenizer"):
        KNNDatastore.load(folder, tokenizer=FakeTokenizer(shift=1))
    KNNDatastore.load(folder, model=built[0], tokenizer=FakeTokenizer())  # the right ones pass
    assert fingerprint_tokenizer(FakeTokenizer()) != fingerprint_tokenizer(FakeTokenizer(1))
    with caplog.at_level(logging.WARNING):
        forced = KNNDatastore.load(folder, model=other, force=True)
    assert forced.size == built[2].size
    wrapper = TffKNNLMForCausalLM.from_base(other)
    with pytest.raises(DatastoreMismatchError):
        wrapper.set_datastore(forced)


# ------------------------------------------------------------------------------------------------------- the model
def test_lambda_zero_is_the_base_model_exactly(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.0)
    ids = blocks.input_ids[:3]
    with torch.no_grad():
        expected = torch.log_softmax(base(ids).logits.float(), -1)
        out = model(ids, labels=ids)
        alone = TffKNNLMForCausalLM.from_base(base, k=8, lmbda=0.5)(ids)  # no datastore: the base model
    assert torch.equal(out.logits, expected) and out.knn_tokens is None
    assert torch.equal(alone.logits, expected)
    manual = torch.nn.functional.cross_entropy(expected[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, manual)


def test_lambda_one_is_the_knn_distribution(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=6, lmbda=1.0, knn_temperature=2.0)
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        out = model(ids)
        queries = base(ids, output_hidden_states=True).hidden_states[-1].reshape(-1, 32)
    keys = torch.cat(datastore.key_shards).float()
    scores, found = dense_knn_search(queries, keys, 6)
    expected = dense_knn_log_probs(scores, datastore.values[found], VOCAB, 2.0).view(2, -1, VOCAB)
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    assert out.knn_scores.shape == (2, ids.shape[1], 6)
    # a context seen in the datastore puts most kNN mass on the token that followed it there
    assert (out.logits.exp().amax(-1) > 0.5).float().mean() > 0.5


def test_a_hand_computed_three_token_example():
    """Vocabulary of 3; three neighbours at squared distances 1, 2 and 3 carrying tokens 2, 0, 2; λ = 0.4."""
    tiny = ARCHITECTURES["knn_lm"].variants["tiny"]["base_config"]
    base = base_llama(base_config={**tiny, "vocab_size": 3})
    ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        hidden = base(ids, output_hidden_states=True).hidden_states[-1][0, -1]  # the query at the last position
        p_lm = torch.softmax(base(ids).logits[0, -1].float(), -1)
    offsets = torch.zeros(3, 32)
    offsets[0, 0], offsets[1, 1], offsets[2, 2] = 1.0, 2.0**0.5, 3.0**0.5
    description = {"dim": 32, "module_path": "lm_head", "model_fingerprint": fingerprint_model(base)}
    datastore = KNNDatastore([(hidden + offsets).float()], [torch.tensor([2, 0, 2])], description)
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=3, lmbda=0.4)
    with torch.no_grad():
        p = model(ids).logits[0, -1].exp()
    e1, e2, e3 = torch.exp(torch.tensor([-1.0, -2.0, -3.0]))
    p_knn = torch.stack([e2, torch.tensor(0.0), e1 + e3]) / (e1 + e2 + e3)
    torch.testing.assert_close(p, 0.4 * p_knn + 0.6 * p_lm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))


@pytest.mark.faiss
def test_faiss_indexes_against_the_exact_search(built, tmp_path):
    pytest.importorskip("faiss")
    base, blocks, datastore, folder = built
    ids = blocks.input_ids[:2]
    exact = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.3)
    with torch.no_grad():
        expected = exact(ids).logits
    copy = KNNDatastore.load(folder)
    copy.build_index("flat", show_progress=False)
    with torch.no_grad():
        flat = TffKNNLMForCausalLM.from_base(base, copy, k=8, lmbda=0.3, index_type="flat")(ids).logits
    torch.testing.assert_close(flat, expected, rtol=1e-4, atol=1e-4)
    # an approximate index whose scores are recomputed from the stored keys: exact scores of whatever it found
    approx = KNNDatastore.load(folder)
    approx.build_index("ivf_pq", nlist=4, nprobe=4, pq_m=4, pq_bits=4, show_progress=False)
    assert (folder / "index-ivf_pq" / "index.faiss").is_file()
    queries = torch.randn(6, 32)
    scores, tokens = approx.search(queries, 5, recompute_distances=True)
    _, found = approx.index.search(queries, 5)
    exact_scores = -(queries[:, None] - torch.cat(approx.key_shards).float()[found]).pow(2).sum(-1)
    torch.testing.assert_close(scores, exact_scores.sort(-1, descending=True).values, rtol=1e-5, atol=1e-4)
    reloaded = KNNDatastore.load(folder, index_type="ivf_pq")
    assert reloaded.index.index_type == "ivf_pq" and reloaded.index.size == datastore.size


def test_generation_reuses_the_kv_cache(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.5)
    prompt = blocks.input_ids[:2, :5]
    kwargs = {"max_new_tokens": 6, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=True, **kwargs)
        full = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **kwargs)
        whole = model(cached.sequences).logits
    assert torch.equal(cached.sequences, full.sequences)
    for step, (a, b) in enumerate(zip(cached.scores, full.scores, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        # each step's scores are the interpolated log-probabilities of a full forward at that position
        torch.testing.assert_close(a, whole[:, 4 + step], rtol=1e-4, atol=1e-4)
    assert cached.cache is not None and cached.cache.get_seq_length() > 0


def test_save_and_from_pretrained_keep_the_datastore(built, tmp_path):
    base, blocks, datastore, folder = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4)
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path / "with")
    assert (tmp_path / "with" / "datastore" / "datastore.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "with")
    assert type(loaded) is TffKNNLMForCausalLM and loaded.datastore.size == datastore.size
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)
    # a config pointing at a datastore elsewhere: nothing is copied, and it is found again on loading
    elsewhere = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4, datastore_path=str(folder))
    elsewhere.save_pretrained(tmp_path / "pointer")
    assert not (tmp_path / "pointer" / "datastore").exists()
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "pointer")(ids).logits, expected)


def test_the_datastore_arguments_go_through_the_one_from_pretrained_hook(built, tmp_path):
    """``datastore=`` is the kNN-LM's own ``from_pretrained`` argument, taken by its loading step
    (`_finish_loading`), with every transformers argument still meaning what it means: ``output_loading_info=True``
    returns ``(model, info)`` with the datastore attached (the kNN-LM's own override used to fail on the tuple)."""
    base, blocks, datastore, _ = built
    TffKNNLMForCausalLM.from_base(base, None, k=8, lmbda=0.4).save_pretrained(tmp_path)
    loaded, info = TffKNNLMForCausalLM.from_pretrained(tmp_path, datastore=datastore, output_loading_info=True)
    assert loaded.datastore is datastore and info["missing_keys"] == set()
    assert AutoModelForCausalLM.from_pretrained(tmp_path).datastore is None  # no datastore saved, none passed


def test_a_hub_id_brings_its_datastore_folder(built, tmp_path, monkeypatch):
    """Loaded by Hub id, the repository's datastore/ is fetched with the weights (it used to be read only from a
    local folder, so a pushed kNN-LM came back as its base model)."""
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4)
    model.save_pretrained(tmp_path / "saved")
    as_hub_cache(tmp_path / "saved", tmp_path / "cache", "org/tiny-knn-lm")
    monkeypatch.chdir(tmp_path / "cache")  # nothing called org/tiny-knn-lm on disk where it runs
    loaded = AutoModelForCausalLM.from_pretrained(
        "org/tiny-knn-lm", cache_dir=tmp_path / "cache", local_files_only=True
    )
    assert loaded.datastore is not None and loaded.datastore.size == datastore.size
    assert str(loaded.datastore.folder).startswith(str(tmp_path / "cache"))
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_wrapped_gpt2_with_tied_embeddings_round_trips(tmp_path):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=32)).eval()
    datastore = build_datastore(gpt2, batches_of(token_blocks(3, block_size=8)), None, show_progress=False)
    model = TffKNNLMForCausalLM.from_base(gpt2, datastore, k=4, lmbda=0.5)
    ids = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = TffKNNLMForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm.lm_head.weight is loaded.lm.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="lmbda must be in"):
        create_model("knn_lm", lmbda=1.5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        create_model("knn_lm", k=0)
    with pytest.raises(TypeError, match="distance"):
        create_model("knn_lm", distance="cosine")


def test_the_config_shows_the_base_models_sizes_without_saving_them(tmp_path):
    """PEFT's prompt learning reads the layer count, width and heads off the model's config (``to_dict()``): the
    kNN-LM's are its base model's, shown by to_dict, not written to config.json, accepted back when they agree."""
    from tf_family.models.knn_lm.configuration_knn_lm import TffKNNLMConfig

    gpt2 = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=3, n_head=2, n_positions=32, bos_token_id=1, eos_token_id=1)
    config = TffKNNLMConfig(base_config=gpt2.to_dict())
    sizes = {"num_hidden_layers": 3, "hidden_size": 16, "num_attention_heads": 2}
    assert {name: getattr(config, name) for name in sizes} == sizes
    assert sizes.items() <= config.to_dict().items()
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not sizes.keys() & saved.keys()
    assert TffKNNLMConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    with pytest.raises(
        ValueError, match=r"num_hidden_layers=4 is not the base model's \(num_hidden_layers=3 in base_c"
    ):
        TffKNNLMConfig.from_dict({**config.to_dict(), "num_hidden_layers": 4})


def test_retrieval_keeps_the_model_causal_and_batch_independent(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.5)
    ids = blocks.input_ids[:2, :12]
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
    state = torch.random.get_rng_state()
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
        alone = model(ids[1:]).logits
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-5)
    torch.testing.assert_close(alone[0], a[1], rtol=1e-5, atol=1e-5)


def test_generation_around_transformer_xl_carries_its_segment_memory():
    """A segment-memory base (no KV cache): decoding carries `mems` and equals a full forward at every step."""
    torch.manual_seed(0)
    txl = create_model("transfo_xl", "causal_lm", "tiny").eval()
    ids = torch.randint(0, VOCAB, (2, 8))
    datastore = build_datastore(txl, [{"input_ids": ids, "labels": ids}], None, show_progress=False)
    model = TffKNNLMForCausalLM.from_base(txl, datastore, k=4, lmbda=0.5)
    prompt = ids[:, :3]
    kwargs = {"max_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=True, **kwargs)
        full = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **kwargs)
        whole = model(cached.sequences).logits
    assert torch.equal(cached.sequences, full.sequences)
    for step, score in enumerate(cached.scores):
        torch.testing.assert_close(score, whole[:, 2 + step], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- ecosystem
def test_the_datastore_serves_the_model_in_any_load_dtype(built, tmp_path):
    """The fingerprint is of the weights' values: ``from_pretrained(dtype=torch.bfloat16)``, and ``dtype="auto"`` on
    a bfloat16 save, keep the datastore (both used to be refused as "built by another model")."""
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4)
    model.save_pretrained(tmp_path / "float32")
    half = TffKNNLMForCausalLM.from_pretrained(tmp_path / "float32", dtype=torch.bfloat16)
    assert half.lm.dtype == torch.bfloat16 and half.datastore is not None
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        torch.testing.assert_close(half(ids).logits, model(ids).logits, rtol=0.1, atol=0.1)
    half.save_pretrained(tmp_path / "bfloat16")
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "bfloat16", dtype="auto")
    assert auto.lm.dtype == torch.bfloat16 and auto.datastore is not None
    assert TffKNNLMForCausalLM.from_pretrained(tmp_path / "bfloat16", dtype=torch.float32).datastore is not None
    changed = base_llama(seed=1)  # other weights are still refused, whatever their dtype
    with pytest.raises(DatastoreMismatchError, match="built by another model"):
        TffKNNLMForCausalLM.from_base(changed.to(torch.bfloat16), datastore)


def _old_fingerprint(model):
    """The model fingerprint datastores carried before it ignored the dtype: the tensors' own dtypes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def test_a_float32_model_keeps_its_old_fingerprint(built):
    """Datastores written before fingerprints ignored the dtype stay valid: a float32 model's fingerprint is the
    bytes-and-dtype hash tf_family always wrote, and an old description (that hash alone) is still accepted, also
    for a bfloat16 model whose datastore was built in bfloat16."""
    base, _, datastore, _ = built
    assert fingerprint_model(base) == _old_fingerprint(base)
    old = {key: value for key, value in datastore.description.items() if key != "model_fingerprint_rounded"}
    TffKNNLMForCausalLM.from_base(base, KNNDatastore(datastore.key_shards, datastore.value_shards, old))
    half = base_llama().to(torch.bfloat16)
    old_half = {**old, "model_fingerprint": _old_fingerprint(half)}
    TffKNNLMForCausalLM.from_base(half, KNNDatastore(datastore.key_shards, datastore.value_shards, old_half))


def test_return_dict_false_gives_a_tuple(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4)
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        expected = model(ids, labels=ids)
        output = model(ids, labels=ids, return_dict=False)
    assert isinstance(output, tuple)
    assert torch.equal(output[0], expected.loss) and torch.equal(output[1], expected.logits)


def test_resize_token_embeddings_keeps_the_datastore(built, tmp_path):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base_llama(), datastore, k=8, lmbda=0.4)
    ids = blocks.input_ids[:2]
    with torch.no_grad():
        before = model(ids).lm_log_probs
    model.resize_token_embeddings(VOCAB + 8)
    assert model.get_input_embeddings().num_embeddings == VOCAB + 8
    assert model.get_output_embeddings().out_features == VOCAB + 8
    assert model.config.base_config.vocab_size == VOCAB + 8 and model.lm.config.vocab_size == VOCAB + 8
    with torch.no_grad():
        after = model(ids)
    assert after.logits.shape[-1] == VOCAB + 8 and model.datastore is not None
    # the old tokens keep their logits: their log-probabilities differ only by the new rows' share of the softmax
    shift = (after.lm_log_probs[..., :VOCAB] - before).mean(dim=-1, keepdim=True)
    torch.testing.assert_close(after.lm_log_probs[..., :VOCAB], before + shift, rtol=1e-4, atol=1e-4)
    model.save_pretrained(tmp_path)
    loaded = TffKNNLMForCausalLM.from_pretrained(tmp_path)  # its datastore copy matches the resized model
    assert loaded.datastore is not None
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, after.logits)
    with pytest.raises(ValueError, match="which the attached datastore predicts"):
        model.resize_token_embeddings(4)


def test_generate_from_inputs_embeds_retrieves_like_generate_from_ids(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.5)
    prompt = blocks.input_ids[:2, :5]
    kwargs = {"max_new_tokens": 6, "do_sample": False, "attention_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        expected = model.generate(prompt, **kwargs)[:, 5:]
        got = model.generate(inputs_embeds=model.get_input_embeddings()(prompt), **kwargs)
    assert torch.equal(got, expected)


def test_exporting_retrieval_is_refused_clearly(built):
    base, blocks, datastore, _ = built
    model = TffKNNLMForCausalLM.from_base(base, datastore, k=8, lmbda=0.4).eval()
    ids = blocks.input_ids[:2]
    with pytest.raises(NotImplementedError, match=r"torch.export cannot trace the kNN-LM's retrieval.*model.lm"):
        torch.export.export(model, args=(ids,), kwargs={"use_cache": False}, strict=False)
    exported = torch.export.export(model, args=(ids,), kwargs={"use_cache": False, "lmbda": 0.0}, strict=False)
    with torch.no_grad():
        expected = model(ids, use_cache=False, lmbda=0.0).logits
        torch.testing.assert_close(exported.module()(ids, use_cache=False, lmbda=0.0).logits, expected)


def test_the_attention_implementation_is_the_base_models(tmp_path):
    # the wrapper computes no attention: its config names what its base runs, in every way it is built, and a client
    # that copies it into from_pretrained (TRL's DPO builds its reference model so) gets a value the base accepts
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    wrapped = TffKNNLMForCausalLM.from_base(gpt2)
    assert wrapped.config._attn_implementation == gpt2.config._attn_implementation == "sdpa"
    wrapped.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == loaded.lm.config._attn_implementation == "sdpa"
    again = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=loaded.config._attn_implementation)
    assert again.lm.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="tff_native"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="tff_native")
    # around one of ours, the wrapper takes tf_family's rule, as its base does
    xl = create_model("transfo_xl", "causal_lm", "tiny")
    assert TffKNNLMForCausalLM.from_base(xl).config._attn_implementation == xl.config._attn_implementation
