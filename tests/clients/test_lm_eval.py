"""lm-evaluation-harness (the real package) on every causal architecture: `HFLM` log-likelihoods equal a direct
forward of the same tokens, alone or batched; ``generate_until`` gives `model.generate`'s text; tf_family's ``tf_family``
lm-eval model carries the memory models' memory across the rolling windows; the command line evaluates a saved run
on a local text file with no Hub access."""

from __future__ import annotations

import json
import math

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from tf_family.clients.lm_eval import TffLM
from tf_family.clients.lm_eval import main as lm_eval_main

from .tiny_text import CAUSAL, TEXTS, save_tiny_run

MEMORY = ["transfo_xl", "compressive", "memorizing", "spalm"]
MAX_LENGTH = 64  # past Reformer's 16-token LSH chunks and Longformer's windows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {name: save_tiny_run(name, root / name) for name in CAUSAL}


def _hflm(folder, batch_size=1, model_class=HFLM, **kwargs):
    return model_class(
        pretrained=str(folder), device="cpu", batch_size=batch_size, max_length=MAX_LENGTH, dtype="float32", **kwargs
    )


def _pairs():
    """(context, continuation) of every text: different lengths, so a batch pads them."""
    return [(text[: len(text[:60]) // 2], text[len(text[:60]) // 2 : 60]) for text in TEXTS]


def _direct(model, tokenizer, context, continuation):
    """The continuation's log-likelihood from one forward of the unpadded tokens."""
    context_ids, target = tokenizer(context)["input_ids"], tokenizer(continuation)["input_ids"]
    ids = torch.tensor([(context_ids + target)[:-1]])
    with torch.no_grad():
        log_probs = model(ids).logits.float().log_softmax(-1)[0, -len(target) :]
    return float(log_probs.gather(-1, torch.tensor(target)[:, None]).sum())


@pytest.mark.parametrize("name", CAUSAL)
def test_loglikelihood_equals_a_direct_forward_alone_or_batched(runs, name):
    requests = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(_pairs())]
    alone_lm = _hflm(runs[name], batch_size=1)
    alone = [score for score, _ in alone_lm.loglikelihood(requests)]
    batched = [score for score, _ in _hflm(runs[name], batch_size=4).loglikelihood(requests)]
    direct = [_direct(alone_lm.model, alone_lm.tokenizer, *pair) for pair in _pairs()]
    for a, b, c in zip(alone, batched, direct, strict=True):
        assert abs(a - c) <= 1e-4 and abs(b - c) <= 1e-4, (alone, batched, direct)


@pytest.mark.parametrize("name", CAUSAL)
def test_generate_until_equals_model_generate(runs, name):
    lm = _hflm(runs[name], batch_size=2)
    contexts = ["The quick brown fox", "Memory"]
    arguments = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}
    got = lm.generate_until([Instance("generate_until", {}, (c, arguments), i) for i, c in enumerate(contexts)])
    for context, text in zip(contexts, got, strict=True):
        ids = lm.tokenizer(context, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = lm.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        # lm-eval cuts at its stop strings and decodes without special tokens; it stops generating once every row
        # of its batch has given the end-of-text token, so the text runs at least to this row's first one
        new = out[0, ids.shape[1] :]
        full = lm.tokenizer.decode(new, skip_special_tokens=True).split("\n\n")[0]
        ended = (new == lm.tokenizer.eos_token_id).nonzero()
        first = lm.tokenizer.decode(new[: int(ended[0, 0])] if len(ended) else new).split("\n\n")[0]
        assert full.startswith(text) and text.startswith(first), (text, full, first)


def _stream_by_hand(model, tokens, prefix, segment, carry):
    """``[prefix] + tokens[:-1]`` read in segments, each scoring the next tokens, with or without the memory."""
    inputs, total, memory = [prefix, *tokens[:-1]], 0.0, None
    with torch.no_grad():
        for start in range(0, len(tokens), segment):
            ids = torch.tensor([inputs[start : start + segment]])
            outputs = model(input_ids=ids, mems=memory)
            memory = outputs.mems if carry else None
            targets = torch.tensor(tokens[start : start + segment])
            total += float(outputs.logits[0].float().log_softmax(-1).gather(-1, targets[:, None]).sum())
    return total


@pytest.mark.parametrize("name", MEMORY)
def test_rolling_windows_carry_the_memory(runs, name):
    """The ``tf_family`` model's rolling log-likelihood reads the windows in order with the memory carried (a long
    document: 6 windows of 8 tokens); ``carry_memory=False`` is `HFLM`'s disjoint windows; the two differ."""
    text = TEXTS[3][:48]
    request = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    carried = TffLM(pretrained=str(runs[name]), device="cpu", max_length=8, dtype="float32")
    assert carried.carries_memory
    tokens = carried.tok_encode(text)
    with_memory = carried.loglikelihood_rolling(request)[0]
    disjoint = TffLM(pretrained=str(runs[name]), device="cpu", max_length=8, dtype="float32", carry_memory=False)
    without = disjoint.loglikelihood_rolling(request)[0]
    hflm = HFLM(pretrained=str(runs[name]), device="cpu", max_length=8, dtype="float32").loglikelihood_rolling(request)
    model, prefix = carried.model, carried.prefix_token_id
    assert with_memory == pytest.approx(_stream_by_hand(model, tokens, prefix, 8, carry=True), abs=1e-4)
    assert without == pytest.approx(hflm[0], abs=1e-4)
    assert without == pytest.approx(_stream_by_hand(model, tokens, prefix, 8, carry=False), abs=1e-4)
    assert abs(with_memory - without) > 1e-2  # the memory is used


def test_transformer_xl_with_memory_equals_one_forward_over_the_document(runs):
    """With a memory as long as the document, Transformer-XL read in 8-token windows is one forward over the whole
    document (the paper's promise): the ``tf_family`` model's number is the document's exact log-likelihood."""
    lm = TffLM(pretrained=str(runs["transfo_xl"]), device="cpu", max_length=8, dtype="float32")
    text = TEXTS[3][:48]
    tokens = lm.tok_encode(text)
    lm.model.config.mem_len = len(tokens)
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    assert rolling == pytest.approx(
        _stream_by_hand(lm.model, tokens, lm.prefix_token_id, len(tokens), False), abs=1e-4
    )


def test_models_without_memory_are_scored_as_hflm_scores_them(runs):
    request = [Instance("loglikelihood_rolling", {}, (TEXTS[3][:48],), 0)]
    ours = TffLM(pretrained=str(runs["calm"]), device="cpu", max_length=8, dtype="float32")
    assert not ours.carries_memory
    hflm = HFLM(pretrained=str(runs["calm"]), device="cpu", max_length=8, dtype="float32")
    assert ours.loglikelihood_rolling(request) == pytest.approx(hflm.loglikelihood_rolling(request), abs=1e-6)
    with pytest.raises(TypeError, match="carry_memory must be True or False"):
        TffLM(pretrained=str(runs["calm"]), carry_memory="yes")


def test_command_line_evaluates_a_saved_run_on_a_local_text_file(runs, tmp_path):
    """``python -m tf_family.clients.lm_eval --model tf_family ...`` with a task read from a local text file (the
    ``text`` loader of datasets, offline): word perplexity of a saved Transformer-XL, memory carried."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "my_text.yaml").write_text(
        "task: my_text\n"
        "dataset_path: text\n"
        f"dataset_kwargs:\n  data_files:\n    test: {corpus}\n"
        "test_split: test\n"
        "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\n'
        'doc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    output = tmp_path / "results"
    lm_eval_main(
        ["--model", "tf_family", "--model_args", f"pretrained={runs['transfo_xl']},max_length=16,dtype=float32",
         "--tasks", "my_text", "--include_path", str(tasks), "--device", "cpu", "--output_path", str(output)]
    )  # fmt: skip
    written = next(output.rglob("results_*.json"))
    metrics = json.loads(written.read_text())["results"]["my_text"]
    assert math.isfinite(metrics["word_perplexity,none"]) and metrics["word_perplexity,none"] > 1
