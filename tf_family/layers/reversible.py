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


class ReversibleChain:
    """What links the reversible layers of one forward pass: the outputs of the layer run last. In the backward each
    layer reads its own outputs here (kept by the forward for the top layer, reconstructed by the layer above for
    the others) and leaves its reconstructed inputs for the layer below, so no layer keeps activations."""

    def __init__(self):
        self.layers = 0  # layers run so far
        self.outputs: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (layer index, Y1, Y2)


class _ReversibleLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, first, second, f, g, chain, *parameters):
        with torch.no_grad():
            f_state = _rng_state(first.device)
            first = first + f(second)
            g_state = _rng_state(first.device)
            second = second + g(first)
        ctx.f, ctx.g, ctx.chain, ctx.states = f, g, chain, (f_state, g_state)
        ctx.index, chain.layers = chain.layers, chain.layers + 1
        chain.outputs = (ctx.index, first.detach(), second.detach())
        return first, second

    @staticmethod
    def backward(ctx, grad_first, grad_second):
        index, first, second = ctx.chain.outputs
        if index != ctx.index:
            raise RuntimeError(
                "reversible layers: the backward reached layer "
                f"{ctx.index} while the chain holds layer {index}'s outputs; a reversible forward can be "
                "backpropagated once, from the top (retain_graph is not supported)."
            )
        f, g = ctx.f, ctx.g
        f_state, g_state = ctx.states
        device = first.device
        grad_first = torch.zeros_like(first) if grad_first is None else grad_first
        grad_second = torch.zeros_like(second) if grad_second is None else grad_second
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
        ctx.chain.outputs = (ctx.index - 1, first, second.detach())  # this layer's inputs: the outputs below
        return (grad_first, grad_second, None, None, None) + (None,) * (len(ctx.needs_input_grad) - 5)


def reversible_layer(
    first: torch.Tensor,
    second: torch.Tensor,
    f: Callable[[torch.Tensor], torch.Tensor],
    g: Callable[[torch.Tensor], torch.Tensor],
    chain: ReversibleChain,
    parameters: Sequence[torch.Tensor] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """One reversible layer ``(X1, X2) -> (Y1 = X1 + f(X2), Y2 = X2 + g(Y1))`` that keeps no activations: its
    backward recomputes ``f`` and ``g`` from the outputs that ``chain`` holds (see `ReversibleChain`).

    Every layer of a stack shares one ``chain``; the layers' outputs must not be changed in place. A model calls
    it inside each layer's own forward (Reformer's `TffReformerLayer`), so that a wrapper that gathers a layer's
    weights around its calls (FSDP's ``fully_shard``: in the forward, and in the backward before the layer's
    gradient, through hooks on its outputs) has them gathered for the recomputation too. The gradients of the
    parameters of ``f`` and ``g`` are accumulated into their ``.grad``; pass them as ``parameters`` so that the
    backward also runs when no input needs a gradient.
    """
    return _ReversibleLayer.apply(first, second, f, g, chain, *parameters)


def reversible_stack(
    first: torch.Tensor, second: torch.Tensor, blocks: Sequence[Block], parameters: Sequence[torch.Tensor] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run reversible layers ``blocks`` (``(f, g)`` pairs) on ``(X1, X2)`` and return ``(Y1, Y2)`` of the last
    (`reversible_layer` after `reversible_layer`, one chain).

    The backward recomputes each layer (see the module docstring) and accumulates the gradients of the layers'
    parameters into their ``.grad`` as it goes (as `torch.Tensor.backward` does); pass the ``parameters`` so that
    the backward also runs when no input needs a gradient. Use it for training with ``.backward()``; under
    `torch.no_grad` a plain loop is cheaper and gives the same values.
    """
    chain = ReversibleChain()
    for index, (f, g) in enumerate(blocks):
        first, second = reversible_layer(first, second, f, g, chain, parameters if index == 0 else ())
    return first, second


__all__ = ["ReversibleChain", "reversible_layer", "reversible_stack"]
