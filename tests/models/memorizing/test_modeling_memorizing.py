"""Memorizing Transformer behaviour beyond the common tester: degenerate reductions, retrieval semantics, isolation,
generation that reads and writes the memory, fine-tuning from Transformer-XL."""

import pytest
import torch
import torch.nn.functional as F

from tf_family import (
    MemorizingMemory,
    TffMemorizingConfig,
    TffMemorizingForCausalLM,
    TffTransfoXLConfig,
    TffTransfoXLLMHeadModel,
)
from tf_family.memory import dense_knn_attention
from tf_family.registry import get_arch

VOCAB = 128


def perturb(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return perturb(TffMemorizingForCausalLM(get_arch("memorizing").tiny_config(**overrides)).eval(), seed)


def tokens(batch, length, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def run_segments(model, ids, size, mask=None, mems=None):
    logits = []
    with torch.no_grad():
        for start in range(0, ids.shape[1], size):
            part = slice(start, start + size)
            out = model(ids[:, part], mems=mems, attention_mask=None if mask is None else mask[:, part])
            logits.append(out.logits)
            mems = out.mems
    return torch.cat(logits, 1), mems


def close_gates(model):
    with torch.no_grad():
        for layer in model.transformer.layers:
            if hasattr(layer, "knn_gate"):
                layer.knn_gate.fill_(float("-inf"))
    return model


# ------------------------------------------------------------------------------------ degenerate: Transformer-XL
@pytest.mark.parametrize(
    "overrides",
    [
        {"knn_retrieval": "token"},
        {"knn_retrieval": "segment", "same_length": True, "untie_r": False, "pre_lnorm": True, "cutoffs": []},
        {"knn_search": "bucketed", "knn_layers": [0, 1], "mem_len": 3},
    ],
    ids=["token", "segment_same_length_tied", "bucketed_two_layers"],
)
def test_gate_closed_is_transformer_xl_on_the_same_weights(overrides):
    model = close_gates(make_model(**overrides))
    xl_fields = {name: getattr(model.config, name) for name in ("cutoffs", "div_val", "d_model", "d_embed", "n_head")}
    xl_fields.update({name: getattr(model.config, name) for name in ("d_head", "d_inner", "n_layer", "mem_len")})
    xl_fields.update({name: getattr(model.config, name) for name in ("clamp_len", "same_length", "untie_r")})
    xl_fields.update(vocab_size=VOCAB, pre_lnorm=model.config.pre_lnorm, dropout=0.0)
    reference = TffTransfoXLLMHeadModel(TffTransfoXLConfig(**xl_fields)).eval()
    missing, unexpected = reference.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(key.rsplit(".", 1)[-1] in ("knn_gate", "knn_scale") for key in unexpected)
    ids = tokens(2, 15)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ours, memory = run_segments(model, ids, 5, mask)
    theirs = []
    mems = None
    with torch.no_grad():
        for start in range(0, 15, 5):
            out = reference(ids[:, start : start + 5], mems=mems, attention_mask=mask[:, start : start + 5])
            theirs.append(out.logits)
            mems = out.mems
    torch.testing.assert_close(ours, torch.cat(theirs, 1), rtol=0, atol=0)
    assert memory.knn.size.tolist() == [15, 13]  # the memory was written all along (padding is not an entry)


@pytest.mark.parametrize("combine", ["gate", "joint"])
def test_an_empty_memory_is_transformer_xl(combine):
    """Memory size 0: nothing is ever retrieved, whatever the gate."""
    model = make_model(knn_memory_size=0, knn_combine=combine)
    closed = close_gates(make_model(knn_memory_size=0, knn_combine="gate"))
    ids = tokens(2, 12)
    torch.testing.assert_close(run_segments(model, ids, 4)[0], run_segments(closed, ids, 4)[0], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ retrieval
def test_top_k_covering_the_memory_is_dense_attention_over_it():
    """The kNN layer with k >= every allowed entry equals local attention mixed with dense attention over all of
    them (computed here from the layer's own projections)."""
    model = make_model(knn_top_k=64, mem_len=2)
    layer = model.transformer.layers[1]
    captured = {}
    layer.register_forward_hook(
        lambda module, args, kwargs, output: captured.update(args=args, kwargs=kwargs, output=output), with_kwargs=True
    )
    ids = tokens(2, 14)
    _, mems = run_segments(model, ids[:, :9], 9)
    keys, values = mems.knn.keys[0].clone(), mems.knn.values[0].clone()
    with torch.no_grad():
        model(ids[:, 9:], mems=mems)
        hidden, memory = captured["args"]
        attention = layer.attention
        query, key, value = attention.project(hidden, memory)
        local, _ = attention.local_attention(query, key, value, captured["kwargs"]["inputs"])
        all_keys = torch.cat([keys[:, :, :9], F.normalize(key[:, :, -5:], dim=-1)], 2)  # 9 old + 5 new entries
        all_values = torch.cat([values[:, :, :9], value[:, :, -5:]], 2)
        allowed_entries = torch.ones(5, 14, dtype=torch.bool).tril(8)[None, None]  # position i sees 9 + i entries
        retrieved = dense_knn_attention(
            F.normalize(query, dim=-1), all_keys, all_values, allowed_entries, layer.knn_scale.abs()
        )
        gate = torch.sigmoid(layer.knn_gate)[:, None, None]
        expected = layer.feed_forward(attention.finish(hidden, local * (1 - gate) + retrieved * gate))
    torch.testing.assert_close(captured["output"][0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("search", ["bucketed", "faiss"])
def test_searches_agree_with_exact_when_exact(search):
    """bucketed is exact when k covers the memory; faiss flat always is."""
    if search == "faiss":
        pytest.importorskip("faiss")
    exact = make_model(knn_top_k=40, mem_len=2)
    other = make_model(knn_top_k=40, mem_len=2, knn_search=search)
    ids = tokens(2, 18)
    torch.testing.assert_close(run_segments(other, ids, 6)[0], run_segments(exact, ids, 6)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("retrieval", ["token", "segment"])
def test_the_grouped_and_native_exact_searches_give_the_model_the_same_outputs(monkeypatch, retrieval):
    """The two-stage exact search (what large memories go through in PyTorch), the native search kernel (float32 on
    CPU) and scoring every slot agree inside the model, with evictions and the segment's own positions merged in."""
    import tf_family.memory.knn_search as knn_search
    from tf_family.attention import native

    model = make_model(mem_len=2, knn_memory_size=40, knn_top_k=3, knn_retrieval=retrieval)
    ids = tokens(2, 60)
    with_kernel = run_segments(model, ids, 12)[0]
    monkeypatch.setattr(native, "_state", {"module": None})
    whole = run_segments(model, ids, 12)[0]
    torch.testing.assert_close(with_kernel, whole, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(knn_search, "DIRECT_SEARCH_SCORES", 0)
    torch.testing.assert_close(run_segments(model, ids, 12)[0], whole, rtol=1e-5, atol=1e-5)


def test_reading_retrieved_pairs_by_slot_gives_the_model_the_same_gradients(monkeypatch):
    """Training over three segments with the memory written in place at the end of each forward (before its
    backward): the gradients through the native pair kernels (pairs read by slot, overwritten slots stashed) equal
    those through the gathered pairs."""
    from tf_family.attention import native
    from tf_family.memory.knn_reader import MemoryReader

    if native.extension() is None:
        pytest.skip("the native kernel could not be built here")
    ids = tokens(2, 36)

    def gradients(by_slot: bool):
        model = make_model(mem_len=2, knn_memory_size=16, knn_top_k=4).train()
        if not by_slot:
            monkeypatch.setattr(MemoryReader, "of", classmethod(lambda cls, *args: None))
        mems = None
        for start in range(0, 36, 12):
            out = model(ids[:, start : start + 12], mems=mems, labels=ids[:, start : start + 12])
            out.loss.backward()
            mems = out.mems
        monkeypatch.undo()
        return {name: parameter.grad for name, parameter in model.named_parameters() if parameter.grad is not None}

    by_slot, gathered = gradients(True), gradients(False)
    assert by_slot.keys() == gathered.keys() and by_slot["transformer.layers.1.knn_scale"].abs().sum() > 0
    for name, grad in by_slot.items():
        torch.testing.assert_close(grad, gathered[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("index", ["flat", "ivf_flat"])
def test_persistent_faiss_indexes_follow_the_stream(index):
    """knn_search="faiss" keeps one index per row and head across segments (updated by the writes, evictions
    included): flat equals the exact search; IVF (trained once enough keys are written) stays close to it."""
    pytest.importorskip("faiss")
    fields = {"mem_len": 2, "knn_memory_size": 16, "knn_top_k": 4}
    exact = make_model(**fields)
    model = make_model(**fields, knn_search="faiss", knn_faiss_index=index, knn_faiss_nlist=4, knn_faiss_nprobe=4)
    ids = tokens(2, 40)
    ours, mems = run_segments(model, ids, 5)
    indexes = mems.knn.shared.faiss
    assert indexes and all(i.count == 16 for i in indexes[0])  # persistent, full, no duplicates
    if index == "flat":
        torch.testing.assert_close(ours, run_segments(exact, ids, 5)[0], rtol=1e-5, atol=1e-5)
    else:
        assert not mems.knn.shared.faiss[0][0].provisional
        assert (ours - run_segments(exact, ids, 5)[0]).abs().mean() < 0.05


@pytest.mark.parametrize("combine", ["gate", "joint"])
def test_token_retrieval_does_not_depend_on_how_the_stream_is_cut(combine):
    """knn_retrieval="token": one forward, segments of 5 and token-by-token agree, also when the memory is smaller
    than the stream (evictions) and the Transformer-XL memory covers the stream (mem_len 16)."""
    model = make_model(mem_len=16, knn_memory_size=6, knn_combine=combine)
    ids = tokens(2, 16)
    whole = run_segments(model, ids, 16)[0]
    torch.testing.assert_close(run_segments(model, ids, 5)[0], whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run_segments(model, ids, 1)[0], whole, rtol=1e-5, atol=1e-5)
    bigger = make_model(mem_len=16, knn_memory_size=32, knn_combine=combine)
    assert not torch.allclose(run_segments(bigger, ids, 16)[0], whole, atol=1e-4)  # the evictions mattered


def test_segment_retrieval_is_meliads_rule():
    """knn_retrieval="segment": a segment retrieves from earlier segments only, so with an empty memory it is
    Transformer-XL, and its outputs before t do not depend on its tokens after t."""
    model = make_model(knn_retrieval="segment", mem_len=2)
    ids = tokens(2, 12)
    closed = close_gates(make_model(knn_retrieval="segment", mem_len=2))
    torch.testing.assert_close(run_segments(model, ids[:, :6], 6)[0], run_segments(closed, ids[:, :6], 6)[0])
    _, mems = run_segments(model, ids[:, :6], 6)
    changed = ids.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % VOCAB
    _, mems_changed = run_segments(model, ids[:, :6], 6)
    with torch.no_grad():
        a = model(ids[:, 6:], mems=mems.clone()).logits[:, :3]  # clone: the write in place consumes a memory
        b = model(changed[:, 6:], mems=mems_changed).logits[:, :3]
        c = close_gates(make_model(knn_retrieval="segment", mem_len=2))(ids[:, 6:], mems=mems).logits[:, :3]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert not torch.allclose(a, c, atol=1e-4)  # the first segment was retrieved


def test_causality_across_segments():
    model = make_model(mem_len=3)
    ids = tokens(2, 14)
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    torch.testing.assert_close(
        run_segments(model, changed, 7)[0][:, :10], run_segments(model, ids, 7)[0][:, :10], rtol=0, atol=1e-6
    )


# ------------------------------------------------------------------------------------------------ isolation
def test_rows_never_retrieve_from_each_other_and_resets_forget():
    model = make_model(mem_len=2)
    ids = tokens(3, 12)
    together = run_segments(model, ids, 4)[0]
    for row in range(3):
        alone = run_segments(model, ids[row : row + 1], 4)[0]
        torch.testing.assert_close(together[row : row + 1], alone, rtol=1e-5, atol=1e-6)
    # a reset at the start of row 1's second document: that row continues as if it started there
    _, mems = run_segments(model, ids[:, :8], 4)
    with torch.no_grad():
        reset = model(ids[:, 8:], mems=mems, reset_mems=torch.tensor([False, True, False])).logits
        fresh = model(ids[1:2, 8:]).logits
        kept = model(ids[:, 8:], mems=run_segments(model, ids[:, :8], 4)[1]).logits
    torch.testing.assert_close(reset[1:2], fresh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reset[[0, 2]], kept[[0, 2]], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(reset[1], kept[1], atol=1e-4)


def test_memory_size_at_inference_can_differ_and_inputs_are_checked():
    model = make_model()
    ids = tokens(2, 10)
    memory = model.empty_memory(2, knn_memory_size=4)
    out = model(ids, mems=memory)
    assert out.mems.knn.capacity == 4 and out.mems.knn.size.tolist() == [4, 4]
    with pytest.raises(TypeError, match="MemorizingMemory"):
        model(ids, mems=[torch.zeros(2, 3, 32)])
    with pytest.raises(ValueError, match="batch rows"):
        model(ids[:1], mems=out.mems)
    with pytest.raises(ValueError, match="knn_layers"):
        get_arch("memorizing").tiny_config(knn_layers=[2])
    with pytest.raises((TypeError, ValueError), match="knn_combine"):
        get_arch("memorizing").tiny_config(knn_combine="sum")
    assert TffMemorizingConfig(n_layer=12).knn_layers == [8]  # meliad's memory layer: the 9th of 12


# ------------------------------------------------------------------------------------------------ generation
def manual_decode(model, sequences, prompt_length):
    """Log-probabilities of ``sequences[:, prompt_length:]`` fed as generate feeds them: the prompt, then one token
    at a time with the memory carried."""
    with torch.no_grad():
        out = model(sequences[:, :prompt_length])
        steps = [out.logits[:, -1].log_softmax(-1)]
        mems = out.mems
        for t in range(prompt_length, sequences.shape[1] - 1):
            out = model(sequences[:, t : t + 1], mems=mems)
            steps.append(out.logits[:, -1].log_softmax(-1))
            mems = out.mems
    return steps, mems


@pytest.mark.parametrize("do_sample", [False, True])
def test_generate_reads_and_writes_the_memory(do_sample):
    model = make_model(mem_len=2)  # the XL cache is short: what the kNN memory holds matters
    prompt = tokens(2, 6)
    torch.manual_seed(3)
    out = model.generate(
        prompt, max_new_tokens=6, do_sample=do_sample, output_logits=True, return_dict_in_generate=True
    )
    steps, mems = manual_decode(model, out.sequences, 6)
    for logits, expected in zip(out.logits, steps, strict=True):
        torch.testing.assert_close(logits.log_softmax(-1), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(out.cache, MemorizingMemory)
    assert out.cache.knn.size.tolist() == [11, 11]  # prompt + 5 fed tokens, all written
    for a, b in zip(out.cache.knn.keys, mems.knn.keys, strict=True):
        torch.testing.assert_close(a, b)


def test_generate_equals_the_full_forward_when_the_cache_covers_it():
    model = make_model(mem_len=16)
    prompt = tokens(2, 5)
    out = model.generate(prompt, max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        full = model(out.sequences[:, :-1]).logits[:, 4:]
    torch.testing.assert_close(torch.stack(out.scores, 1), full, rtol=1e-5, atol=1e-5)


def test_beam_search_reorders_the_memory():
    model = make_model(mem_len=2)
    prompt = tokens(2, 5)
    out = model.generate(
        prompt,
        max_new_tokens=5,
        num_beams=3,
        do_sample=False,
        length_penalty=0.0,
        early_stopping=True,
        output_scores=True,
        return_dict_in_generate=True,
        eos_token_id=None,
    )
    steps, _ = manual_decode(model, out.sequences, 5)
    chosen = out.sequences[:, 5:]
    total = sum(step.gather(1, chosen[:, i : i + 1])[:, 0] for i, step in enumerate(steps))
    torch.testing.assert_close(out.sequences_scores, total, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ fine-tuning
def test_fine_tuning_a_transformer_xl_checkpoint(tmp_path):
    torch.manual_seed(0)
    xl = perturb(TffTransfoXLLMHeadModel(get_arch("transfo_xl").tiny_config()).eval())
    xl.save_pretrained(tmp_path)
    model = TffMemorizingForCausalLM.from_transfo_xl(str(tmp_path), knn_layers=[1], knn_memory_size=16).eval()
    assert model.config.knn_layers == [1] and model.config.d_model == xl.config.d_model
    ids = tokens(2, 12)
    close_gates(model)
    with torch.no_grad():
        first = xl(ids[:, :6])
        expected = torch.cat([first.logits, xl(ids[:, 6:], mems=first.mems).logits], 1)
    # the same operations on the same values; not bit-exact because the loaded weights live in differently aligned
    # memory (safetensors), which makes some CPUs' GEMM kernels round differently (seen: 9.5e-7 on AMD EPYC)
    torch.testing.assert_close(run_segments(model, ids, 6)[0], expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="tff_transfo_xl"):
        TffMemorizingConfig.from_transfo_xl_config(model.config)


# ------------------------------------------------------------------------------------------------ memory size
def test_an_open_gate_reads_the_memory_size_it_is_given():
    """The same weights and inputs give different logits with evaluation memories of 0, 4 and 32 entries (what the
    benchmark's perplexity-against-memory-size table varies), and memory 0 is the closed gate."""
    model = make_model(mem_len=2)
    ids = tokens(2, 24)

    def logits(size):
        return run_segments(model, ids, 6, mems=model.empty_memory(2, size))[0]

    none, small, large = logits(0), logits(4), logits(32)
    torch.testing.assert_close(none, run_segments(close_gates(make_model(mem_len=2)), ids, 6)[0], rtol=0, atol=1e-6)
    assert (none - small).abs().amax() > 1e-2 and (small - large).abs()[:, 6:].amax() > 1e-2
    torch.testing.assert_close(small[:, :5], large[:, :5])  # before any eviction the two memories hold the same


@pytest.mark.parametrize("write", ["in_place", "copy"])
def test_writes_in_place_and_by_copy_agree_and_a_consumed_memory_is_refused(write):
    model = make_model(mem_len=2, knn_write=write)
    reference = make_model(mem_len=2, knn_write="copy")
    ids = tokens(2, 18)
    torch.testing.assert_close(run_segments(model, ids, 6)[0], run_segments(reference, ids, 6)[0], rtol=0, atol=0)
    _, mems = run_segments(model, ids[:, :6], 6)
    kept = mems.clone()
    with torch.no_grad():
        first = model(ids[:, 6:12], mems=mems.reset(torch.tensor([False, True]))).logits
        assert mems.knn.consumed == (write == "in_place") and not kept.knn.consumed  # a reset shares the buffers
        again = model(ids[:, 6:12], mems=kept).logits
    assert not torch.allclose(first[1], again[1], atol=1e-4) and torch.allclose(first[0], again[0], atol=1e-6)
    if write == "in_place":
        with pytest.raises(ValueError, match="updated in place"):
            model(ids[:, 6:12], mems=mems)
    else:
        model(ids[:, 6:12], mems=mems)  # a copy-written memory can be read again
