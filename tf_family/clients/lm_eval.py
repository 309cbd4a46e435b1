"""lm-evaluation-harness with tf_family's memory models evaluated as their papers evaluate them.

lm-eval's ``hf`` model (`HFLM`) already loads every tf_family causal LM (``import tf_family`` registers the Auto
classes) and scores it correctly, but ``loglikelihood_rolling`` (perplexity tasks: wikitext, a local text file)
cuts a document into disjoint windows of ``max_length`` tokens and scores each window on its own. Transformer-XL, the
Compressive Transformer and the Memorizing Transformer are evaluated in their papers over the whole stream, each
segment attending to the memory the earlier segments left (Dai et al. 2019 section 3.2; Rae et al. 2020 section 5;
Wu et al. 2022 section 4). The ``tf_family`` model registered here is `HFLM` with one difference: for a model whose
class carries a memory between calls (``carried_state``), it reads each document's rolling windows in order as one
batch-of-one stream and passes every window the memory (``mems``) the previous one returned. The windows and the
scored tokens are lm-eval's own (`lm_eval.utils.get_rolling_token_windows`), so without memory the number is
`HFLM`'s; other architectures (and ``carry_memory=False``) go through `HFLM` unchanged.

lm-eval finds models in its registry and has no plugin entry point, so the model is registered when this module is
imported. From the command line, run lm-eval through this module (all of lm-eval's arguments)::

    python -m tf_family.clients.lm_eval --model tf_family --model_args pretrained=RUN_DIR,max_length=128 \\
        --tasks my_text --include_path TASK_DIR --device cpu

and from Python ``import tf_family.clients.lm_eval`` before ``lm_eval.simple_evaluate(model="tf_family", ...)``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_eval_utils
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

__all__ = ["TffLM", "main"]


@register_model("tf_family")
class TffLM(HFLM):
    """`HFLM` whose rolling log-likelihood carries a memory model's memory across a document's windows.

    Args (``--model_args``, besides `HFLM`'s: ``pretrained``, ``max_length`` (the segment length), ``batch_size``
    ...):
        carry_memory: carry the memory across windows (default True; False gives `HFLM`'s disjoint windows).
    """

    def __init__(self, pretrained, carry_memory: bool = True, **kwargs):
        if not isinstance(carry_memory, bool):
            raise TypeError(
                f"carry_memory must be True or False (--model_args carry_memory=False), got {carry_memory!r}."
            )
        super().__init__(pretrained=pretrained, **kwargs)
        self.carries_memory = carry_memory and getattr(self.model, "carried_state", None) is not None

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        if not self.carries_memory:
            return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)
        if self.world_size > 1:
            raise ValueError(
                "carry_memory reads each document as one stream on one process; run it single-process, or pass "
                "carry_memory=False (disjoint windows, HFLM's evaluation)."
            )
        results = []
        for (text,) in tqdm([request.args for request in requests], disable=disable_tqdm or self.rank != 0):
            total = self.stream_log_likelihood(self.tok_encode(text))
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return results

    def stream_log_likelihood(self, tokens: list[int]) -> float:
        """The log-likelihood of ``tokens`` read as lm-eval's rolling windows, in order, each window given the
        memory the previous one returned."""
        windows = map(
            lm_eval_utils.make_disjoint_window,
            lm_eval_utils.get_rolling_token_windows(
                token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
            ),
        )
        memory, total = None, 0.0
        with torch.no_grad():
            for context, continuation in windows:
                # the input HFLM builds for a window (its context and continuation, less the last token)
                window = (context + continuation)[-(self.max_length + 1) :][:-1]
                ids = torch.tensor([window], dtype=torch.long, device=self.device)
                outputs = self.model(input_ids=ids, mems=memory)
                memory = outputs.mems
                log_probs = F.log_softmax(outputs.logits[0, -len(continuation) :].float(), dim=-1)
                targets = torch.tensor(continuation, dtype=torch.long, device=self.device)
                total += float(log_probs.gather(-1, targets[:, None]).sum())
        return total


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the ``tf_family`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
