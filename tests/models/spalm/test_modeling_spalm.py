"""SPALM (Yogatama et al. 2021): each rule of its prediction written as a test, the Transformer-XL it is without a
datastore, the datastore's fingerprint (the stack's, so the gate trains with it attached), save/load with the datastore
and the config's checks. The common tester runs every other check with a datastore attached
(`tests.common.tester.ATTACHED_STATE`)."""

from __future__ import annotations

import logging

import pytest
import torch

from tf_family.memory import SegmentMemory
from tf_family.models.spalm.configuration_spalm import TffSpalmConfig
from tf_family.models.spalm.modeling_spalm import RETRIEVAL_POINT, TffSpalmForCausalLM, spalm_mix
from tf_family.models.transfo_xl.configuration_transfo_xl import TffTransfoXLConfig
from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel
from tf_family.registry import get_arch
from tf_family.retrieval import DatastoreMismatchError, KNNDatastore

VOCAB = 128


def tiny(seed: int = 0, **overrides) -> TffSpalmForCausalLM:
    torch.manual_seed(seed)
    model = TffSpalmForCausalLM(get_arch("spalm").make_config("tiny", **overrides)).eval()
    with torch.no_grad():  # away from the small init, so that the gate and the attention over neighbours matter
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def batches(seed: int = 1, rows: int = 4, length: int = 16) -> list[dict]:
    ids = torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full((rows, 1), -100)], dim=1)}]


def ids(seed: int = 2, rows: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------------ the rules
def test_each_rule_of_the_prediction_by_hand():
    model = tiny()
    datastore = model.build_datastore(batches(), show_progress=False)
    x = ids()
    with torch.no_grad():
        out = model(x)
        h = model.transformer(x).last_hidden_state  # (B, T, D) h_t
    keys = torch.cat([shard.float() for shard in datastore.key_shards])  # (S, D)
    values = torch.cat([shard.long() for shard in datastore.value_shards])  # (S,)
    W, b, w_g = model.lm_head.out_layers[0].weight, model.lm_head.out_layers[0].bias, model.gate.weight[0]
    k = model.config.k
    for row in range(x.shape[0]):
        for t in range(x.shape[1]):
            h_t = h[row, t]
            # retrieval: the next tokens of the k keys nearest to h_t (squared Euclidean distance)
            nearest = ((keys - h_t.float()) ** 2).sum(-1).topk(k, largest=False).indices
            assert sorted(values[nearest].tolist()) == sorted(out.knn_tokens[row, t].tolist())
            y = out.knn_tokens[row, t]
            u = W[y]  # (K, D) output embeddings of the retrieved tokens
            attention = torch.softmax(u @ h_t, dim=0)  # softmax_k(u_k . h_t)
            m_t = (attention[:, None] * u).sum(0)
            g_t = torch.sigmoid(w_g @ h_t)  # a scalar gate, no bias
            z_t = (1 - g_t) * h_t + g_t * m_t
            expected = torch.log_softmax(W @ z_t + b, dim=-1)
            torch.testing.assert_close(out.gate[row, t], g_t, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out.logits[row, t], expected, rtol=1e-4, atol=1e-5)
    assert 0.05 < out.gate.mean() < 0.95  # both memories weigh in at these weights


def test_the_output_embedding_matrix_embeds_the_neighbours_and_is_tied_to_the_input():
    model = tiny()
    assert model.neighbour_embeddings() is model.lm_head.out_layers[0].weight
    assert model.neighbour_embeddings().data_ptr() == model.transformer.word_embeddings.layers[0].weight.data_ptr()


def test_missing_neighbours_get_no_weight_and_none_at_all_leave_only_the_gated_hidden_state():
    torch.manual_seed(0)
    hidden, embeddings, gate = torch.randn(1, 2, 4), torch.randn(6, 4), torch.randn(1, 4)
    tokens = torch.tensor([[[3, 5, -1], [-1, -1, -1]]])
    mixed, g = spalm_mix(hidden, tokens, embeddings, gate)
    present, _ = spalm_mix(hidden[:, :1], tokens[:, :1, :2], embeddings, gate)
    torch.testing.assert_close(mixed[:, :1], present)  # a missing neighbour changes nothing
    torch.testing.assert_close(mixed[0, 1], (1 - g[0, 1]) * hidden[0, 1])  # m_t = 0


def test_a_closed_gate_is_the_hidden_state_and_an_open_one_the_neighbours_mixture():
    torch.manual_seed(0)
    hidden, embeddings, tokens = torch.randn(1, 1, 8), torch.randn(10, 8), torch.tensor([[[1, 4, 7]]])
    direction = hidden[0, 0] / hidden[0, 0].square().sum()  # w_g . h_t = 200 * sign
    closed, g_closed = spalm_mix(hidden, tokens, embeddings, -200 * direction[None])
    opened, g_open = spalm_mix(hidden, tokens, embeddings, 200 * direction[None])
    assert g_closed.item() == 0.0 and g_open.item() == 1.0
    assert torch.equal(closed, hidden)  # z_t = h_t: the Transformer-XL's prediction
    u = embeddings[tokens[0, 0]]
    torch.testing.assert_close(opened[0, 0], torch.softmax(u @ hidden[0, 0], 0) @ u)  # z_t = m_t


def test_without_a_datastore_it_is_transformer_xl_over_three_segments():
    spalm = tiny()
    config = TffTransfoXLConfig(**{k: v for k, v in spalm.config.to_diff_dict().items() if k in _XL_FIELDS})
    xl = TffTransfoXLLMHeadModel(config).eval()
    missing, unexpected = xl.load_state_dict(spalm.state_dict(), strict=False)
    assert not missing and unexpected == ["gate.weight"]
    x = ids(length=18)
    mems_a = mems_b = None
    with torch.no_grad():
        for segment in x.split(6, dim=1):
            a, b = spalm(segment, mems=mems_a), xl(segment, mems=mems_b)
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
            mems_a, mems_b = a.mems, b.mems
    assert isinstance(mems_a, SegmentMemory) and a.gate is None


_XL_FIELDS = set(TffTransfoXLConfig.__dataclass_fields__) - {"model_type"}


def test_generation_with_the_datastore_reads_one_new_token_per_step():
    model = tiny()
    model.build_datastore(batches(), show_progress=False)
    x = ids(rows=1, length=5)
    calls = []
    handle = model.transformer.register_forward_pre_hook(
        lambda _m, args, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    cached = model.generate(x, max_new_tokens=6, do_sample=False)
    handle.remove()
    assert calls == [5, 1, 1, 1, 1, 1]
    tokens = x
    for _ in range(6):  # recomputing the whole prefix at every step gives the same tokens
        with torch.no_grad():
            tokens = torch.cat([tokens, model(tokens, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(cached, tokens)


# ----------------------------------------------------------------------------------------------------- datastore
def test_the_datastore_holds_the_stacks_final_hidden_states_and_next_tokens():
    model = tiny()
    batch = batches()[0]
    datastore = model.build_datastore([batch], show_progress=False)
    with torch.no_grad():
        h = model.transformer(batch["input_ids"]).last_hidden_state
    keep = batch["labels"] != -100
    assert datastore.description["module_path"] == RETRIEVAL_POINT
    torch.testing.assert_close(datastore.key_shards[0].float(), h[keep].half().float())
    assert torch.equal(datastore.values, batch["labels"][keep])


def test_training_the_gate_keeps_the_datastore_training_the_stack_makes_it_stale(tmp_path, caplog):
    model = tiny()
    model.build_datastore(batches(), show_progress=False)
    model.train()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name == "gate.weight")
    optimizer = torch.optim.SGD([model.gate.weight], lr=1.0)
    x = ids(seed=5, rows=4, length=16)
    before = model.gate.weight.detach().clone()
    for _ in range(3):
        optimizer.zero_grad()
        model(x, labels=x).loss.backward()
        optimizer.step()
    assert not torch.equal(before, model.gate.weight)
    model.eval().save_pretrained(tmp_path / "gate")
    loaded = TffSpalmForCausalLM.from_pretrained(tmp_path / "gate").eval()
    assert (tmp_path / "gate" / "datastore" / "datastore.json").is_file() and loaded.datastore is not None
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    with torch.no_grad():  # a step of the stack: its hidden states, the datastore's keys, are no longer these
        model.transformer.layers[0].attention.qkv.weight.add_(0.01)
    with caplog.at_level(logging.WARNING):
        model.save_pretrained(tmp_path / "stale")
    assert "datastore is left out" in caplog.text
    assert not (tmp_path / "stale" / "datastore").exists()
    assert TffSpalmForCausalLM.from_pretrained(tmp_path / "stale").datastore is None
    with pytest.raises(ValueError, match="save_datastore=True"):
        model.save_pretrained(tmp_path / "refused", save_datastore=True)


def test_a_datastore_of_another_stack_is_refused_unless_checks_are_off(tmp_path):
    datastore = tiny(seed=0).build_datastore(batches(), tmp_path / "ds", show_progress=False)
    other = tiny(seed=1)
    with pytest.raises(DatastoreMismatchError, match="another model"):
        other.set_datastore(datastore)
    with pytest.raises(DatastoreMismatchError):
        other(ids(), datastore=datastore)
    other.set_datastore(datastore, force=True)
    relaxed = tiny(seed=1, check_datastore=False)
    relaxed.set_datastore(KNNDatastore.load(tmp_path / "ds"))
    assert relaxed(ids()).gate is not None
    narrow = tiny(seed=0, d_model=16, d_head=8)
    with pytest.raises(ValueError, match="width 32"):
        narrow.set_datastore(datastore)


def test_from_pretrained_takes_a_datastore_or_the_configs_path(tmp_path):
    model = tiny()
    datastore = model.build_datastore(batches(), tmp_path / "elsewhere", show_progress=False)
    model.save_pretrained(tmp_path / "model", save_datastore=False)
    assert not (tmp_path / "model" / "datastore").exists()
    assert TffSpalmForCausalLM.from_pretrained(tmp_path / "model").datastore is None
    given = TffSpalmForCausalLM.from_pretrained(tmp_path / "model", datastore=datastore)
    assert given.datastore is datastore
    model.config.datastore_path = str(tmp_path / "elsewhere")
    model.save_pretrained(tmp_path / "pointer")
    assert not (tmp_path / "pointer" / "datastore").exists()
    assert TffSpalmForCausalLM.from_pretrained(tmp_path / "pointer").datastore.size == datastore.size


def test_k_per_call_and_its_check():
    model = tiny()
    model.build_datastore(batches(), show_progress=False)
    assert model(ids(), k=2).knn_tokens.shape[-1] == 2
    with pytest.raises(ValueError, match="k"):
        model(ids(), k=0)


# --------------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"cutoffs": [32]}, ValueError, "cutoffs=\\[32\\].*set cutoffs=\\[\\]"),
        ({"div_val": 2}, ValueError, "div_val=2"),
        ({"d_embed": 16}, ValueError, "d_embed=16 differs from d_model=32"),
        ({"k": 0}, ValueError, "k must be >= 1"),
        ({"k": 2.5}, TypeError, "k must be int"),
        ({"distance": "cosine"}, TypeError, "distance must be one of 'l2', 'ip'"),
        ({"datastore_path": 3}, TypeError, "datastore_path"),
        ({"check_datastore": "yes"}, TypeError, "check_datastore"),
    ],
)
def test_config_fields_are_checked_by_name(overrides, error, match):
    with pytest.raises(error, match=match):
        TffSpalmConfig(**{**get_arch("spalm").variants["tiny"], **overrides})


def test_config_round_trips_its_fields():
    config = TffSpalmConfig(**get_arch("spalm").variants["tiny"], distance="ip", datastore_path="/x")
    again = TffSpalmConfig.from_dict(config.to_dict())
    assert (again.k, again.distance, again.datastore_path, again.cutoffs) == (4, "ip", "/x", [])
