"""Routing Transformer: the efficient path equals the dense twin (values and gradients, both memberships, lengths that
are not multiples of the block; the kernels alone: tests/attention/test_routing.py); the efficient path builds no
``T x T`` tensor; padding changes nothing; centroids
are saved and reloaded, move in training only; the nearest membership is causal and decodes with a cache; the
balanced membership gives equal cluster sizes; ``sparsity_skip_first`` layers have no routing heads; config errors
name the field."""

import pytest
import torch

import tf_family.attention.routing as routing_module
import tf_family.models.routing_transformer.modeling_routing_transformer as modeling
from tf_family import create_model
from tf_family.attention.routing import centroid_similarity, nearest_centroid

MEMBERSHIPS = ["nearest", "balanced"]


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = create_model("routing_transformer", "causal_lm", "tiny", **overrides).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _ids(batch=3, length=13, seed=1):
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def _routing_modules(model):
    return [layer.self_attn for layer in model.model.layers if layer.self_attn.routing_heads]


# --------------------------------------------------------------------------------------------------- model paths
@pytest.mark.parametrize("membership", MEMBERSHIPS)
def test_efficient_path_equals_dense_twin(membership):
    model = _model(routing_membership=membership)
    ids = _ids(length=14)  # blocks of 4 do not divide 14
    model.config._attn_implementation = "sdpa"
    fast = model(input_ids=ids, labels=ids)
    model.config._attn_implementation = "eager"
    dense = model(input_ids=ids, labels=ids)
    torch.testing.assert_close(fast.logits, dense.logits, rtol=1e-10, atol=1e-10)
    parameters = list(model.parameters())
    fast_grads = torch.autograd.grad(fast.loss, parameters)
    dense_grads = torch.autograd.grad(dense.loss, parameters)
    for (name, _), got, expected in zip(model.named_parameters(), fast_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10, msg=name)


def test_efficient_path_builds_no_dense_mask(monkeypatch):
    """Without padding or a cache, neither the routing twin nor the local pattern's dense mask is called."""

    def refuse(*args, **kwargs):
        raise AssertionError("the efficient path took the dense twin")

    monkeypatch.setattr(modeling, "routing_attention_reference", refuse)
    monkeypatch.setattr(modeling, "nearest_routing_attention", refuse)
    monkeypatch.setattr(modeling, "build_image_local_mask", refuse)
    for membership in MEMBERSHIPS:
        with torch.no_grad():
            _model(routing_membership=membership)(input_ids=_ids(length=40))


def test_padding_takes_the_dense_path_and_changes_nothing():
    model = _model()
    ids = _ids(batch=1, length=9)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        left = model(input_ids=padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(left, alone, rtol=1e-10, atol=1e-10)


def test_output_attentions_follow_clusters_and_blocks():
    model = _model(num_hidden_layers=2, sparsity_skip_first=0)
    ids = _ids(batch=1, length=12)
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions[0][0]  # (H, T, T)
        attention = model.model.layers[0].self_attn
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        query = attention.q_proj(hidden).view(1, 12, 2, 8).transpose(1, 2)
    assert torch.equal(probs[:2].triu(1), torch.zeros_like(probs[:2]))  # causal
    assert (probs[:2, 9, :4] == 0).all()  # local: block 2 (8..11) sees block 1 and itself, not block 0
    # routing heads: position 11 attends only to tokens of its own (nearest) cluster; rotary does not change a norm,
    # so the clusters can be read from the rotated keys of the model
    positions = torch.arange(12)[None]
    cos, sin = modeling._interleaved_tables(*modeling.rotary_cos_sin(positions, 8, 10000.0, query.dtype))
    keys = torch.nn.functional.normalize(modeling._rotate_interleaved(query, cos, sin), dim=-1)
    clusters = nearest_centroid(centroid_similarity(keys, attention.centroids))[0]  # (2, T)
    for head in range(2):
        seen = probs[2 + head, 11] > 0
        expected = clusters[head] == clusters[head, 11]
        expected[11] = not bool(expected[:11].any())  # its own key only when nothing earlier shares the cluster
        assert torch.equal(seen, expected)


# ---------------------------------------------------------------------------------------------------- centroids
def test_centroids_are_saved_and_reloaded(tmp_path):
    from transformers import AutoModelForCausalLM

    model = _model()
    for attention in _routing_modules(model):
        attention.centroids.copy_(torch.nn.functional.normalize(torch.randn_like(attention.centroids), dim=-1))
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    for mine, theirs in zip(_routing_modules(model), _routing_modules(loaded), strict=True):
        assert torch.equal(mine.centroids, theirs.centroids)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-12, atol=1e-12)
    assert any("centroids" in key for key in model.state_dict())


def test_centroids_move_in_training_only():
    model = _model()
    before = [a.centroids.clone() for a in _routing_modules(model)]
    ids = _ids()
    with torch.no_grad():
        model(input_ids=ids)
    for attention, old in zip(_routing_modules(model), before, strict=True):
        assert torch.equal(attention.centroids, old), "eval moved the centroids"
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    for attention, old in zip(_routing_modules(model), before, strict=True):
        assert not torch.equal(attention.centroids, old), "training did not move the centroids"
        # one EMA step of decay 0.999 towards unit vectors: a small move
        assert float((attention.centroids - old).abs().max()) < 2 * (1 - model.config.kmeans_ema_decay) + 1e-12


def test_centroid_update_is_one_ema_kmeans_step():
    model = _model(kmeans_ema_decay=0.5)
    ids = _ids()
    attention = _routing_modules(model)[0]
    old = attention.centroids.clone()
    captured = {}

    def keep(module, args, kwargs, output):
        captured["hidden"] = kwargs["hidden"] if "hidden" in kwargs else args[0]

    hook = attention.register_forward_hook(keep, with_kwargs=True)
    model.train()
    model(input_ids=ids)
    hook.remove()
    with torch.no_grad():
        hidden = captured["hidden"]
        query = attention.q_proj(hidden).view(3, 13, 2, 8).transpose(1, 2)
        cos, sin = modeling._interleaved_tables(
            *modeling.rotary_cos_sin(torch.arange(13)[None], 8, 10000.0, query.dtype)
        )
        keys = torch.nn.functional.normalize(modeling._rotate_interleaved(query, cos, sin), dim=-1)
        clusters = nearest_centroid(centroid_similarity(keys, old))
        moved = routing_module.kmeans_step(keys, clusters, old)
    torch.testing.assert_close(attention.centroids, 0.5 * old + 0.5 * moved, rtol=1e-12, atol=1e-12)


def test_gradient_checkpointing_reads_the_centroids_of_the_forward():
    ids = _ids()
    grads, centroids = [], []
    for checkpointing in (False, True):
        model = _model(kmeans_ema_decay=0.0)  # the largest possible move: a recompute that read it would differ
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        centroids.append([a.centroids.clone() for a in _routing_modules(model)])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-12, msg=name)
    for a, b in zip(*centroids, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------- causality, cache
def test_nearest_membership_is_causal_and_balanced_is_not_in_membership():
    ids = _ids(batch=4, length=16)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 128
    nearest = _model()
    with torch.no_grad():
        torch.testing.assert_close(
            nearest(input_ids=changed).logits[:, :8], nearest(input_ids=ids).logits[:, :8], rtol=0, atol=0
        )
    # balanced: attention is masked on the original positions, but a later token can take an earlier one's place in
    # a cluster (the membership is a top-k over the whole sequence); documented, and what this shows
    balanced = _model(routing_membership="balanced", cluster_size=2)
    with torch.no_grad():
        before = balanced(input_ids=ids).logits[:, :8]
        after = balanced(input_ids=changed).logits[:, :8]
    assert not torch.allclose(before, after)


def test_cached_generation_equals_uncached():
    model = _model().float()
    prompt = _ids(batch=2, length=7)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # left padding
    kwargs = {"max_new_tokens": 9, "do_sample": False, "attention_mask": mask, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kwargs)
        full = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, full)


def test_balanced_membership_generates_without_a_cache_and_refuses_one():
    model = _model(routing_membership="balanced").float()
    prompt = _ids(batch=2, length=6)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        assert out.cache is None
        generated = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert generated.shape == (2, 10)
        expected = prompt
        for _ in range(4):
            expected = torch.cat([expected, model(input_ids=expected).logits[:, -1:].argmax(-1)], dim=1)
        assert torch.equal(generated, expected)
        cache = _model().float()(input_ids=prompt, use_cache=True).cache
        with pytest.raises(ValueError, match="routing_membership"):
            model(input_ids=prompt[:, :1], cache=cache)


def test_sparsity_skip_first_layers_are_local_only():
    model = _model(num_hidden_layers=3, sparsity_skip_first=2)
    attentions = [layer.self_attn for layer in model.model.layers]
    assert [a.routing_heads for a in attentions] == [0, 0, 2]
    assert [a.local_heads for a in attentions] == [4, 4, 2]
    assert not hasattr(attentions[0], "centroids") and not hasattr(attentions[0], "q_proj")
    state = model.state_dict()
    assert [key for key in state if "centroids" in key] == ["model.layers.2.self_attn.centroids"]
    # a local-only layer: changing its (absent) routing cannot matter, and tokens 5 blocks back are out of reach
    only_local = _model(num_hidden_layers=1, sparsity_skip_first=1)
    ids = _ids(batch=2, length=16)
    changed = ids.clone()
    changed[:, :4] = (changed[:, :4] + 1) % 128  # block 0: out of reach of block 2 and 3 in one local layer
    with torch.no_grad():
        torch.testing.assert_close(
            only_local(input_ids=changed).logits[:, 8:], only_local(input_ids=ids).logits[:, 8:], rtol=0, atol=0
        )


# ------------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"num_local_heads": 5}, "num_local_heads"),
        ({"num_local_heads": -1}, "num_local_heads"),
        ({"sparsity_skip_first": 3}, "sparsity_skip_first"),
        ({"num_clusters": 0}, "num_clusters"),
        ({"cluster_size": 0}, "cluster_size"),
        ({"local_window": 0}, "local_window"),
        ({"routing_membership": "sinkhorn"}, "routing_membership"),
        ({"kmeans_ema_decay": 1.0}, "kmeans_ema_decay"),
        ({"kmeans_ema_decay": -0.1}, "kmeans_ema_decay"),
        ({"hidden_size": 30}, "hidden_size"),
        ({"hidden_size": 12, "num_attention_heads": 4}, "odd"),
        ({"rope_base": 0.0}, "rope_base"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"num_local_heads": 2.0}, "num_local_heads"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises((ValueError, TypeError), match=field):
        create_model("routing_transformer", "causal_lm", "tiny", **overrides)


def test_all_local_heads_and_all_routing_heads():
    ids = _ids()
    for overrides in ({"num_local_heads": 4}, {"num_local_heads": 0, "sparsity_skip_first": 0}):
        model = _model(**overrides)
        with torch.no_grad():
            fast = model(input_ids=ids).logits
            model.config._attn_implementation = "eager"
            torch.testing.assert_close(model(input_ids=ids).logits, fast, rtol=1e-10, atol=1e-10)


def _data_parallel_worker(rank, world, port, folder):
    import os

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _model(kmeans_ema_decay=0.0).train()
        ids = _ids(batch=4)
        model(input_ids=ids[rank * 2 : rank * 2 + 2], labels=ids[rank * 2 : rank * 2 + 2])
        centroids = [a.centroids for a in _routing_modules(model)]
        torch.save(centroids, f"{folder}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_data_parallel_ranks_move_the_centroids_as_one_process(tmp_path):
    """Two gloo ranks, two rows each: the k-means sums are added over the ranks, so both take the step one process
    takes on the four rows (decay 0: the step itself)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_data_parallel_worker, args=(2, port, str(tmp_path)), nprocs=2)
    single = _model(kmeans_ema_decay=0.0).train()
    ids = _ids(batch=4)
    single(input_ids=ids, labels=ids)
    expected = [a.centroids for a in _routing_modules(single)]
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
