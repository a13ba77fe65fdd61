"""Under the Triton interpreter: `tl.dot` as a GPU's MMA computes it, each output element on its own.

The interpreter computes `tl.dot` with numpy's matmul, whose summation order can depend on the operands' shapes: on
OpenBLAS's Haswell kernels (an AMD EPYC CI machine) a column of a [64, 64] @ [64, n] product has other bits for
n = 16 than for n = 64. The invariance tests (a row's bits the same whatever the tile or M) would then fail on the
host's BLAS, not on the kernel's order. A GPU's MMA computes an element from its own row and column only, so here
each element is one chain over k, ascending, from the accumulator (fp32 multiply, then add), whatever the shapes.
"""

from __future__ import annotations

from eaglet.kernels._utils import is_interpret


def _elementwise_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """a [.., M, K] @ b [.., K, N] + d, k ascending per element; fp8 inputs as the interpreter takes them."""
    from triton.runtime.interpreter import TensorHandle

    if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
        return _numpy_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    acc_t = d.data.dtype
    x, y = a.data.astype(acc_t), b.data.astype(acc_t)  # [.., M, K], [.., K, N]
    acc = d.data.copy()  # [.., M, N]
    for k in range(x.shape[-1]):
        acc += x[..., :, k:k + 1] * y[..., k:k + 1, :]  # [.., M, 1] * [.., 1, N]
    return TensorHandle(acc, d.dtype.scalar)


_numpy_dot = None
if is_interpret():
    from triton.runtime import interpreter as _interpreter

    _numpy_dot = _interpreter.InterpreterBuilder.create_dot
    _interpreter.InterpreterBuilder.create_dot = _elementwise_dot
