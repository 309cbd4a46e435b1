"""Log-likelihoods through lm-evaluation-harness's `HFLM` against a direct forward, alone and batched, for every
causal architecture (tiny random models, a character tokenizer, no download), and each model's bfloat16 logits
against float32. Prints a Markdown table; the tests (`tests/clients/`, the common tester) hold the bounds.

    python bench/clients_consistency.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tf_family and tests

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from tests.clients.test_lm_eval import _direct, _pairs  # noqa: E402
from tests.clients.tiny_text import CAUSAL, save_tiny_run  # noqa: E402
from tf_family.registry import get_arch  # noqa: E402


def bf16_error(name: str) -> float:
    """Relative norm of (bf16 - fp32) centred logits, the model as initialised, 48 tokens."""
    spec = get_arch(name)
    torch.manual_seed(0)
    model = spec.model_classes["causal_lm"](spec.tiny_config()).eval()
    ids = torch.randint(0, 100, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits.double()
        half = model.to(torch.bfloat16)(ids).logits.double()
    full, half = full - full.mean(-1, keepdim=True), half - half.mean(-1, keepdim=True)
    return float((half - full).norm() / full.norm())


def main() -> None:
    print("| architecture | max abs(alone - direct) | max abs(batched - direct) | bf16 vs fp32 logits |")
    print("|---|---|---|---|")
    requests = [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(_pairs())]
    for name in CAUSAL:
        with tempfile.TemporaryDirectory() as folder:
            save_tiny_run(name, Path(folder))
            scores = {}
            for batch_size in (1, 4):
                lm = HFLM(pretrained=folder, device="cpu", batch_size=batch_size, max_length=64, dtype="float32")
                scores[batch_size] = [score for score, _ in lm.loglikelihood(requests, disable_tqdm=True)]
            direct = [_direct(lm.model, lm.tokenizer, *pair) for pair in _pairs()]
        alone = max(abs(a - d) for a, d in zip(scores[1], direct, strict=True))
        batched = max(abs(b - d) for b, d in zip(scores[4], direct, strict=True))
        print(f"| {name} | {alone:.1e} | {batched:.1e} | {bf16_error(name):.3%} |")


if __name__ == "__main__":
    main()
