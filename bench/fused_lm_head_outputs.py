"""Save, for every causal architecture of the registry, what TRL's fused LM head call gives on a tiny model: the fused
fields and loss (``add_fused_lm_head(model, temperature=t, outputs=<all five>)``, then ``model(..., labels=...,
fused_lm_head=True)``), the gradient of that loss for every parameter, and the plain call's logits; at temperatures
1.0 and 0.7. Run it on two trees and compare the files with ``torch.equal`` to show a change left them bit-identical.

Run: ``TF_FAMILY_NATIVE=0 OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/fused_lm_head_outputs.py OUT.pt``
(from the repository root; ``tests/`` provides the tiny models).
"""

from __future__ import annotations

import sys

import torch
from trl.trainer.utils import add_fused_lm_head

from tests.test_trainer import _tiny_model
from tf_family.registry import ARCHITECTURES

FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def main(path: str) -> None:
    saved = {}
    for name, spec in ARCHITECTURES.items():
        if "causal_lm" not in spec.tasks:
            continue
        for temperature in (1.0, 0.7):
            model = _tiny_model(name, "causal_lm").train()
            ids = torch.randint(4, 128, (2, 16), generator=torch.Generator().manual_seed(0))
            labels = ids.clone()
            labels[0, :5] = -100
            add_fused_lm_head(model, temperature=temperature, outputs=FIELDS)
            torch.manual_seed(0)
            fused = model(input_ids=ids, labels=labels, fused_lm_head=True)
            fused.loss.backward()
            case = {key: value.detach().clone() for key, value in fused.items() if torch.is_tensor(value)}
            case.update({f"grad.{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            torch.manual_seed(0)
            with torch.no_grad():
                case["plain_logits"] = model(input_ids=ids).logits
            saved[f"{name}@{temperature}"] = case
    torch.save(saved, path)
    sys.stdout.write(f"{len(saved)} cases, {sum(len(case) for case in saved.values())} tensors\n")


if __name__ == "__main__":
    main(sys.argv[1])
