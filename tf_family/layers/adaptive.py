"""Adaptive input embeddings (Baevski & Auli 2019, arXiv:1809.10853) and the projected adaptive softmax (Grave et al.
2017, arXiv:1609.04309) of the Transformer-XL family, shared by Transformer-XL and the Compressive Transformer.

The vocabulary is cut into clusters at ``cutoffs`` (frequent tokens first); cluster ``i`` has width
``d_embed // div_val**i`` and a projection to ``d_model``. With ``div_val == 1`` one matrix covers the whole
vocabulary (projected only when ``d_embed != d_model``). Parameter names follow transformers 4.x
``TransfoXLLMHeadModel`` after tf_family's key rules (``layers`` / ``out_layers``, ``projections``,
``cluster_weight`` / ``cluster_bias``), so checkpoints convert key by key. The models that use them call
`resize_adaptive_token_embeddings` from their ``resize_token_embeddings`` and `adaptive_embeddings_view` for PEFT's
view of the token embedding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..modeling.losses import IGNORE_INDEX, NumItems, item_mean
from .adaptive_kernels import output_linear


def _cluster_widths(d_embed: int, div_val: int, num_clusters: int) -> list[int]:
    return [d_embed // (div_val**cluster) for cluster in range(num_clusters)]


def _check_new_vocab_size(bounds: Sequence[int], vocab_size: int) -> None:
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= bounds[-2]:
        raise ValueError(
            f"new_num_tokens={vocab_size!r}: an adaptive embedding resizes only its last cluster, which starts at the "
            f"last cutoff {bounds[-2]}, so new_num_tokens must be an int > {bounds[-2]}. To go below it, build a "
            "model whose config has smaller `cutoffs` and copy the weights you keep."
        )


def _resized(
    module: nn.Embedding | nn.Linear, rows: int, init_module: Callable[[nn.Module], None]
) -> nn.Embedding | nn.Linear:
    """A copy of ``module`` with ``rows`` rows (embeddings, or output features): the first rows kept, new ones
    initialised by ``init_module`` (the model's ``_init_weights``)."""
    factory = {"device": module.weight.device, "dtype": module.weight.dtype}
    if isinstance(module, nn.Embedding):
        new = nn.Embedding(rows, module.embedding_dim, **factory)
    else:
        new = nn.Linear(module.in_features, rows, bias=module.bias is not None, **factory)
    init_module(new)
    keep = min(rows, module.weight.shape[0])
    with torch.no_grad():
        new.weight[:keep] = module.weight[:keep]
        if getattr(module, "bias", None) is not None:
            new.bias[:keep] = module.bias[:keep]
    return new


class AdaptiveEmbedding(nn.Module):
    """Adaptive input embeddings: cluster ``i`` has width ``d_embed // div_val**i``, projected to ``d_model`` and
    scaled by ``sqrt(d_model)``."""

    def __init__(self, vocab_size: int, d_embed: int, d_model: int, cutoffs: Sequence[int], div_val: int):
        super().__init__()
        self.bounds = [0, *cutoffs, vocab_size]
        self.scale = d_model**0.5
        self.layers = nn.ModuleList()
        self.projections = nn.ParameterList()
        if div_val == 1:
            self.layers.append(nn.Embedding(vocab_size, d_embed))
            if d_model != d_embed:
                self.projections.append(nn.Parameter(torch.empty(d_model, d_embed)))
        else:
            for cluster, width in enumerate(_cluster_widths(d_embed, div_val, len(self.bounds) - 1)):
                self.layers.append(nn.Embedding(self.bounds[cluster + 1] - self.bounds[cluster], width))
                self.projections.append(nn.Parameter(torch.empty(d_model, width)))

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        if len(self.layers) == 1:
            embeddings = self.layers[0](input_ids)  # (B, T, d_embed)
            if len(self.projections):
                embeddings = F.linear(embeddings, self.projections[0])  # (B, T, D)
            return embeddings * self.scale
        flat_ids = input_ids.reshape(-1)  # (B*T,)
        if torch.compiler.is_exporting():
            return self._embed_every_cluster(flat_ids).view(*input_ids.shape, -1) * self.scale  # (B, T, D)
        embeddings = None
        for cluster, layer in enumerate(self.layers):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            index = ((flat_ids >= low) & (flat_ids < high)).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            cluster_embeddings = F.linear(layer(flat_ids[index] - low), self.projections[cluster])  # (n, D)
            if embeddings is None:  # allocate in the dtype autocast produced
                embeddings = cluster_embeddings.new_zeros(flat_ids.shape[0], cluster_embeddings.shape[-1])
            embeddings = embeddings.index_copy(0, index, cluster_embeddings.to(embeddings.dtype))
        if embeddings is None:
            raise ValueError("input_ids is empty.")
        return embeddings.view(*input_ids.shape, -1) * self.scale  # (B, T, D)

    def _embed_every_cluster(self, flat_ids: torch.Tensor) -> torch.Tensor:
        """``(N, D)`` embeddings with no branch on the data (for `torch.export`, which cannot trace "skip the
        clusters no token falls in"): every cluster embeds every token (ids clamped into its range) and keeps the
        rows of its own tokens. The same values as the gathering path, at the cost of one product per cluster."""
        embeddings = None
        for cluster, layer in enumerate(self.layers):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            local = (flat_ids - low).clamp(0, high - low - 1)  # (N,)
            cluster_embeddings = F.linear(layer(local), self.projections[cluster])  # (N, D)
            inside = ((flat_ids >= low) & (flat_ids < high))[:, None]  # (N, 1)
            if embeddings is None:
                embeddings = cluster_embeddings.new_zeros(cluster_embeddings.shape)
            embeddings = torch.where(inside, cluster_embeddings.to(embeddings.dtype), embeddings)
        return embeddings

    def resize(self, vocab_size: int, init_module: Callable[[nn.Module], None]) -> None:
        """Grow or shrink the vocabulary to ``vocab_size`` by resizing the last cluster (the whole matrix when
        ``div_val == 1``): the cutoffs stay, rows kept keep their values, new rows are initialised by
        ``init_module``. `ValueError` when ``vocab_size`` does not exceed the last cutoff."""
        _check_new_vocab_size(self.bounds, vocab_size)
        start = 0 if len(self.layers) == 1 else self.bounds[-2]
        self.layers[-1] = _resized(self.layers[-1], vocab_size - start, init_module)
        self.bounds[-1] = vocab_size


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Adaptive softmax with projections (Grave et al. 2017): a head over the frequent tokens plus one entry per
    tail cluster, and one small softmax per tail cluster. With no cutoffs it is a plain (projected) softmax.

    Returns log-probabilities ``(N, V)`` or, given labels, negative log-likelihoods ``(N,)`` (0 for label -100).
    """

    def __init__(self, vocab_size: int, d_embed: int, d_model: int, cutoffs: Sequence[int], div_val: int):
        super().__init__()
        self.bounds = [0, *cutoffs, vocab_size]
        self.num_tail_clusters = len(cutoffs)
        if self.num_tail_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.num_tail_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.num_tail_clusters))
        self.out_layers = nn.ModuleList()
        self.projections = nn.ParameterList()
        if div_val == 1:
            self.out_layers.append(nn.Linear(d_embed, vocab_size))
            if d_model != d_embed:
                for _ in range(len(self.bounds) - 1):
                    self.projections.append(nn.Parameter(torch.empty(d_model, d_embed)))
        else:
            for cluster, width in enumerate(_cluster_widths(d_embed, div_val, len(self.bounds) - 1)):
                self.projections.append(nn.Parameter(torch.empty(d_model, width)))
                self.out_layers.append(nn.Linear(width, self.bounds[cluster + 1] - self.bounds[cluster]))

    def resize(self, vocab_size: int, init_module: Callable[[nn.Module], None]) -> None:
        """`AdaptiveEmbedding.resize` for the output side: the last cluster's output layer (the whole one when
        ``div_val == 1``) gets ``vocab_size - last cutoff`` rows; the head, its cluster entries and the
        projections are unchanged, so the tokens of the other clusters keep their log-probabilities."""
        _check_new_vocab_size(self.bounds, vocab_size)
        start = 0 if len(self.out_layers) == 1 else self.bounds[-2]
        self.out_layers[-1] = _resized(self.out_layers[-1], vocab_size - start, init_module)
        self.bounds[-1] = vocab_size

    def _cluster_logits(self, hidden: torch.Tensor, cluster: int) -> torch.Tensor:
        """Unnormalised scores of cluster ``cluster`` (the head also scores the tail clusters)."""
        if len(self.out_layers) == 1:
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            weight, bias = self.out_layers[0].weight[low:high], self.out_layers[0].bias[low:high]
        else:
            weight, bias = self.out_layers[cluster].weight, self.out_layers[cluster].bias
        if cluster == 0 and self.num_tail_clusters:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        if len(self.projections):
            hidden = F.linear(hidden, self.projections[cluster].t())  # (N, d_cluster)
        return output_linear(hidden, weight, bias)  # (N, V_cluster); oneDNN where measured faster (no autograd)

    def forward(self, hidden: torch.Tensor, labels: torch.LongTensor | None = None) -> torch.Tensor:
        head_size = self.bounds[1]
        head_logprobs = F.log_softmax(self._cluster_logits(hidden, 0).float(), dim=-1)  # (N, head + clusters)
        if labels is None:
            if not self.num_tail_clusters:
                return head_logprobs  # (N, V): one cluster, nothing to join
            pieces = [head_logprobs[:, :head_size]]
            for cluster in range(1, self.num_tail_clusters + 1):
                tail = F.log_softmax(self._cluster_logits(hidden, cluster).float(), dim=-1)
                pieces.append(head_logprobs[:, head_size + cluster - 1, None] + tail)
            return torch.cat(pieces, dim=-1)  # (N, V)
        nll = head_logprobs.new_zeros(labels.shape[0])  # (N,)
        for cluster in range(self.num_tail_clusters + 1):
            low, high = self.bounds[cluster], self.bounds[cluster + 1]
            index = ((labels >= low) & (labels < high)).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            target = labels[index] - low
            logprob = head_logprobs[index]
            if cluster == 0:
                logprob = logprob.gather(1, target[:, None]).squeeze(1)
            else:
                tail = F.log_softmax(self._cluster_logits(hidden[index], cluster).float(), dim=-1)
                logprob = logprob[:, head_size + cluster - 1] + tail.gather(1, target[:, None]).squeeze(1)
            nll = nll.index_copy(0, index, -logprob)
        return nll

    def causal_lm_outputs(
        self, hidden: torch.Tensor, labels: torch.LongTensor | None = None, num_items_in_batch: NumItems = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """A causal LM head's ``(logits, losses, loss)`` for hidden states ``(B, T, D)``.

        ``logits`` ``(B, T, V)`` are log-probabilities; with tail clusters and ``labels`` they are not computed
        (only the losses, cluster by cluster). ``labels`` ``(B, T)``: position ``t`` is predicted from positions
        ``<= t - 1`` (the shift happens here), ``-100`` is ignored; ``losses`` ``(B, T - 1)`` are the per-token
        negative log-likelihoods (0 where ignored) and ``loss`` their mean over the counted tokens, or their sum over
        ``num_items_in_batch`` (`Trainer`'s count over the accumulated batch; `tf_family.modeling.losses.item_mean`).
        """
        batch, length, width = hidden.shape
        logits = loss = losses = None
        if labels is None or not self.num_tail_clusters:
            logits = self(hidden.reshape(-1, width)).view(batch, length, -1)  # (B, T, V)
        if labels is not None:
            if labels.shape != (batch, length):
                raise ValueError(f"labels must have shape {(batch, length)}, got {tuple(labels.shape)}.")
            targets = labels[:, 1:].reshape(-1)  # (B*(T-1),)
            if logits is not None:  # the targets' log-probabilities, read in place (no copy of the logits)
                picked = logits[:, :-1].gather(-1, labels[:, 1:, None].clamp(min=0)).reshape(-1)  # (B*(T-1),)
                losses = -picked * (targets != IGNORE_INDEX)
            else:
                losses = self(hidden[:, :-1].reshape(-1, width), targets)
            losses = losses.view(batch, length - 1)  # (B, T-1)
            loss = item_mean(losses, labels[:, 1:] != IGNORE_INDEX, num_items_in_batch)
        return logits, losses, loss

    def tied_weights_keys(
        self,
        embedding: AdaptiveEmbedding,
        tie_word_embeddings: bool,
        tie_projs: Sequence[bool],
        prefix: str,
        embedding_prefix: str,
    ) -> dict[str, str]:
        """Which parameters of this head (under ``prefix``) are tied to which of ``embedding`` (under
        ``embedding_prefix``): output layers to the input embeddings (``tie_word_embeddings``), and cluster ``i``'s
        output projection to the input projection where ``tie_projs[i]`` (the first input projection when there is
        only one), as in the original code."""
        tied = {}
        if tie_word_embeddings:
            for index in range(len(self.out_layers)):
                tied[f"{prefix}.out_layers.{index}.weight"] = f"{embedding_prefix}.layers.{index}.weight"
        if len(self.projections):
            for cluster, tie in enumerate(tie_projs):
                if tie:
                    source = 0 if len(embedding.projections) == 1 else cluster
                    tied[f"{prefix}.projections.{cluster}"] = f"{embedding_prefix}.projections.{source}"
        return tied


def resize_adaptive_token_embeddings(
    model: nn.Module, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None
) -> nn.Module:
    """``resize_token_embeddings`` of a model whose input embeddings are an `AdaptiveEmbedding` and whose
    ``lm_head``, when it has one, is a `ProjectedAdaptiveLogSoftmax` (the Transformer-XL family; its models' method
    calls this). transformers' own resizing needs one embedding matrix; here the last cluster of both is resized
    (`AdaptiveEmbedding.resize`), new rows drawn by ``model._init_weights``, the cutoffs stay, tied weights are tied
    again. ``new_num_tokens`` is rounded up to ``pad_to_multiple_of``; a size at or below the last cutoff raises a
    `ValueError` (the adaptive layout cannot shrink into its frequent-token clusters). Returns the input embeddings."""
    embeddings = model.get_input_embeddings()
    if new_num_tokens is None and pad_to_multiple_of is None:
        return embeddings
    new_num_tokens = embeddings.bounds[-1] if new_num_tokens is None else new_num_tokens
    if pad_to_multiple_of is not None:
        if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}.")
        new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
    embeddings.resize(new_num_tokens, model._init_weights)
    head = getattr(model, "lm_head", None)
    if head is not None:
        head.resize(new_num_tokens, model._init_weights)
    model.config.vocab_size = new_num_tokens
    model.tie_weights()
    return embeddings


def adaptive_embeddings_view(model: nn.Module) -> nn.Module:
    """A view whose ``word_embeddings`` is ``model``'s adaptive input embedding (nothing new is registered or saved):
    the family's ``embeddings`` property.

    PEFT's prompt learning (prompt tuning, P-tuning) looks a model's token embedding up as
    ``embeddings.word_embeddings``, else as the parameter with ``vocab_size`` rows; clustered embeddings have no such
    parameter (and with one cluster, that parameter without its projection and scale would embed wrongly), so this is
    where PEFT finds the whole `AdaptiveEmbedding`."""
    view = nn.Module()
    view.word_embeddings = model.base_model.get_input_embeddings()  # (the base model defines it)
    return view


__all__ = [
    "AdaptiveEmbedding",
    "ProjectedAdaptiveLogSoftmax",
    "adaptive_embeddings_view",
    "resize_adaptive_token_embeddings",
]
