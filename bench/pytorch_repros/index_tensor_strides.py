"""PyTorch's own bug behind BigBird's compiled training step failing, reduced to ten lines (no tf_family).

Advanced indexing with a non-contiguous index tensor (``x[:, idx]`` with ``idx`` a transposed tensor) returns a
tensor whose eager strides follow the index's layout, while the meta / fake-tensor kernel that ``torch.compile``
traces with returns contiguous strides. A ``reshape`` of the result is then traced as a ``view`` (legal for the
fake strides) and fails on the real tensor under AOTAutograd (``backend="aot_eager"``): "view size is not compatible
with input tensor's size and stride". Inductor recomputes the layout and passes. The same class of mismatch is
described in pytorch/pytorch#144736 (the ``index.Tensor`` meta kernel's strides differ from eager's).

tf_family's workaround (`tf_family/attention/block_sparse.py`, ``block_sparse_attention``): the gathered slab mask
is copied to the standard layout (``clone(memory_format=torch.contiguous_format)``) before its reshape.

    python bench/pytorch_repros/index_tensor_strides.py     # prints the strides and each backend's outcome
"""

import torch


def gather_and_merge(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    y = x[:, idx]  # (B, M, H, K, b): advanced indexing with a non-contiguous index
    return y.reshape(y.shape[0] * y.shape[1], y.shape[2], y.shape[3] * y.shape[4])  # merge (B, M) and (K, b)


def main() -> None:
    x = torch.randn(2, 20, 2)  # (B, blocks, block size)
    idx = torch.randint(0, 20, (2, 18, 6)).transpose(0, 1)  # (M, H, K), strides (6, 108, 1)
    print(f"torch {torch.__version__}")
    print(f"eager strides of x[:, idx]: {x[:, idx].stride()}")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        print(f"fake strides of x[:, idx]:  {mode.from_tensor(x)[:, mode.from_tensor(idx)].stride()}")
    want = gather_and_merge(x, idx)
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        try:
            got = torch.compile(gather_and_merge, backend=backend, fullgraph=True)(x, idx)
            print(f"{backend}: runs, equal to eager: {torch.equal(got, want)}")
        except RuntimeError as error:
            print(f"{backend}: fails: {str(error).splitlines()[0]}")


if __name__ == "__main__":
    main()
