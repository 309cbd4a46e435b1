"""Reversible residual layers (Gomez et al. 2017, arXiv:1707.04585; Reformer section 3).

A layer maps ``(X1, X2)`` to ``Y1 = X1 + f(X2)``, ``Y2 = X2 + g(Y1)``; its inputs follow from its outputs
(``X2 = Y2 - g(Y1)``, ``X1 = Y1 - f(X2)``), so `reversible_stack` keeps only the last layer's outputs and, in the
backward, recomputes every layer from the one above it. Activation memory is then flat in depth.

Dropout inside ``f`` and ``g`` is replayed exactly: the forward records the RNG state before each call (it reads the
state; it does not reseed), and the backward recomputes under `torch.random.fork_rng` with that state restored, so
the global RNG ends where the forward left it. Anything else ``f`` must reuse (Reformer's hash buckets) it keeps in
its own closure between the forward call and the backward call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Block = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _replaying(state, device: torch.device):
    """A context that runs with ``state`` as the RNG state and restores the caller's afterwards."""
    devices = [device] if device.type == "cuda" else []
    context = torch.random.fork_rng(devices=devices)

    class _Replay:
        def __enter__(self):
            context.__enter__()
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state(state[1], device)

        def __exit__(self, *exc):
            return context.__exit__(*exc)

    return _Replay()


class _ReversibleStack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, first, second, blocks, *parameters):
        states = []
        with torch.no_grad():
            for f, g in blocks:
                f_state = _rng_state(first.device)
                first = first + f(second)
                g_state = _rng_state(first.device)
                second = second + g(first)
                states.append((f_state, g_state))
        ctx.blocks, ctx.states = blocks, states
        ctx.save_for_backward(first, second)
        return first.clone(), second.clone()

    @staticmethod
    def backward(ctx, grad_first, grad_second):
        first, second = ctx.saved_tensors
        device = first.device
        for (f, g), (f_state, g_state) in zip(reversed(ctx.blocks), reversed(ctx.states), strict=True):
            with torch.enable_grad():
                first = first.detach().requires_grad_(True)
                with _replaying(g_state, device):
                    g_out = g(first)
                torch.autograd.backward(g_out, grad_second)
            with torch.no_grad():
                second = second - g_out.detach()  # X2 = Y2 - g(Y1)
                grad_first = grad_first + first.grad
            with torch.enable_grad():
                second = second.detach().requires_grad_(True)
                with _replaying(f_state, device):
                    f_out = f(second)
                torch.autograd.backward(f_out, grad_first)
            with torch.no_grad():
                first = first.detach() - f_out.detach()  # X1 = Y1 - f(X2)
                grad_second = grad_second + second.grad
            second = second.detach()
        return (grad_first, grad_second, None) + (None,) * (len(ctx.needs_input_grad) - 3)


def reversible_stack(
    first: torch.Tensor, second: torch.Tensor, blocks: Sequence[Block], parameters: Sequence[torch.Tensor] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run reversible layers ``blocks`` (``(f, g)`` pairs) on ``(X1, X2)`` and return ``(Y1, Y2)`` of the last.

    The backward recomputes each layer (see the module docstring) and accumulates the gradients of the layers'
    parameters into their ``.grad`` as it goes (as `torch.Tensor.backward` does); pass the ``parameters`` so that
    the backward also runs when no input needs a gradient. Use it for training with ``.backward()``; under
    `torch.no_grad` a plain loop is cheaper and gives the same values.
    """
    return _ReversibleStack.apply(first, second, list(blocks), *parameters)


__all__ = ["reversible_stack"]
