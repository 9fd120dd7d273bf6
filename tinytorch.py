"""tinytorch: a Tensor with reverse-mode automatic differentiation, on NumPy.

Read this file top to bottom:

  1. dtypes and grad mode
  2. the Tensor and how an op enters the graph
  3. type promotion and elementwise arithmetic (with broadcasting and its backward:
     "unbroadcast")
  4. elementwise functions (exp, tanh, gelu, ...)
  5. reductions (sum, mean, var, max, logsumexp, ...)
  6. shape and indexing (reshape, permute, getitem, cat, ...)
  7. matmul, and unfold (im2col): a convolution is a matmul over patches
  8. softmax and log_softmax
  9. backward: walking the graph in reverse topological order
 10. in-place ops: the graph is rewritten (views too), the version counter keeps it safe
 11. creation functions and the random generator
 12. gradcheck: finite differences against the analytic gradient
 13. seeing the graph: draw_graph (Graphviz DOT) and grad_path (a gradient's way back);
     looking inside a run: profile (time, FLOPs, memory per op) and detect_anomaly
 14. speed: the allocator and thread settings, parallel_for, and the fast kernels that
     some ops call in one line (each computes what the op's plain code says, faster;
     a test checks that they agree). Nothing before it needs it to be understood.

Every op is a forward line on NumPy arrays plus a backward rule: a function that
receives g = dLoss/dOut and returns dLoss/dInput for each input (the chain rule,
one op at a time). Inside ops, NumPy functions are applied to the arrays
(np.exp(x), np.matmul(a, b), np.add.at(...)) and tensor data is never converted
with np.asarray, so array libraries that implement NumPy's dispatch protocols
(CuPy) can run the same code.
"""
import builtins  # sum, max, min and abs are redefined below as tensor ops
import itertools
import math
import os
import sys
import threading
import time
import weakref
from collections import namedtuple

# A speed setting that must come before NumPy loads OpenBLAS (section 14, Speed, has the
# rest): OpenBLAS's idle worker threads spin for ~0.1 s after every matmul, taking the
# cores from tinytorch's own threads; ask them to spin ~20 us and then sleep. A value
# the user set wins; TINYTORCH_TUNE_THREADS=0 leaves it alone.
if os.environ.get('TINYTORCH_TUNE_THREADS', '1') != '0' and 'numpy' not in sys.modules:
    os.environ.setdefault('OPENBLAS_THREAD_TIMEOUT', '16')  # 2^16 cycles: ~20 us
import numpy as np  # noqa: E402

# ---------------------------------------------------------------------------
# 1. dtypes and grad mode
# ---------------------------------------------------------------------------
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
float16 = np.dtype(np.float16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
long = int64
bool_ = np.dtype(np.bool_)
default_dtype = float32  # PyTorch's default for Python floats

_grad_enabled = True


def is_grad_enabled():
    return _grad_enabled


class _GradMode:
    """Base of no_grad / enable_grad: a context manager and a decorator."""
    enabled = True

    def __enter__(self):
        global _grad_enabled
        self._prev = _grad_enabled
        _grad_enabled = self.enabled

    def __exit__(self, *exc):
        global _grad_enabled
        _grad_enabled = self._prev
        return False

    def __call__(self, fn):
        mode = type(self)

        def wrapper(*args, **kwargs):
            with mode():
                return fn(*args, **kwargs)
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper


class no_grad(_GradMode):
    """Inside `with no_grad():` (or a function decorated @no_grad()) no graph is built."""
    enabled = False


class enable_grad(_GradMode):
    enabled = True


# ---------------------------------------------------------------------------
# 2. The Tensor and how an op enters the graph
# ---------------------------------------------------------------------------
class Tensor:
    """An n-dimensional array (`.data`) that can remember how it was computed.

    A leaf is a tensor you created (`requires_grad=True` asks autograd to fill its
    `.grad`). Every op on tensors that require grad returns a non-leaf that keeps
    its inputs (`_parents`), its op name (`_op`) and a backward rule (`_backward`).

    Fields: `data` (the NumPy array), `grad` (a NumPy array or None), `requires_grad`,
    `_parents` (the input tensors), `_backward` (the rule: gradient of the output ->
    gradients of the inputs), `_op` (a name, for repr and the graph), `_saved`
    ((version counter, version, shape) of each array the rule reads, checked by
    backward), `_vc` (the version counter: a one-element list, shared with views and
    bumped by every in-place change), `_seq` (when its op ran: a number that grows with
    every graph node, 0 for leaves; section 10 explains why), `_view` ((base, how to
    make it from base) for a view of another tensor's memory, else None), `name`
    (optional, for draw_graph).
    """
    __slots__ = ('data', 'grad', 'requires_grad', '_parents', '_backward', '_op',
                 '_saved', '_vc', '_seq', '_view', 'name', '__weakref__', '__dict__')
    __array_ufunc__ = None  # numpy_array * tensor calls Tensor.__rmul__, not NumPy

    def __init__(self, data, dtype=None, requires_grad=False):
        if isinstance(data, Tensor):
            data = data.data
        arr = _dtype_of_python_data(data) if dtype is None else np.asarray(data, dtype=dtype)
        if arr is data:
            arr = np.copy(arr)  # like torch.tensor: never alias the caller's array (keeps layout)
        _init_result(self, arr)  # no graph, a fresh version counter
        if requires_grad:
            self.requires_grad_(True)

    # -- properties ---------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    is_leaf = property(lambda self: self._backward is None)
    _version = property(lambda self: self._vc[0])

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[_dim(dim, self.ndim, 'size')]

    def dim(self):
        return self.ndim

    def numel(self):
        return self.data.size

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item(): only a one-element tensor can be converted to a Python "
                             f"number, got shape {tuple(self.shape)}")
        return self.data.reshape(()).item()

    def numpy(self):
        if self.requires_grad:
            raise RuntimeError("numpy(): this tensor requires grad; call .detach().numpy()")
        return self.data

    def tolist(self):
        return self.data.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        if self.data.size != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {tuple(self.shape)} "
                               "is ambiguous; use .any() or .all()")
        return bool(self.data.reshape(()))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    __hash__ = object.__hash__  # __eq__ is elementwise, so hash by identity

    def __repr__(self):
        body = np.array2string(self.data, separator=', ', prefix='tensor(', precision=4)
        extra = ''
        if self.dtype not in (default_dtype, int64, bool_):
            extra += f', dtype={self.dtype}'
        if self._backward is not None:
            extra += f', grad_fn=<{self._op}>'
        elif self.requires_grad:
            extra += ', requires_grad=True'
        return f'tensor({body}{extra})'

    def requires_grad_(self, requires_grad=True):
        if requires_grad and self.data.dtype.kind not in 'fc':
            raise TypeError(f"only floating point tensors can require grad, got dtype "
                            f"{self.dtype} (integer tensors are indices, they have no gradient)")
        if not self.is_leaf:
            raise RuntimeError("requires_grad_() can only change a leaf tensor; use detach()")
        self.requires_grad = requires_grad
        return self

    def detach(self):
        """Same data (shared, as in PyTorch), outside the graph."""
        self._shared = True  # an in-place op on self must write into the shared memory
        out = Tensor.__new__(Tensor)
        _init_result(out, self.data, self._vc)
        return out

    def clone(self):
        return from_op(self.data.copy(), 'clone', (self,), lambda g: (g,))  # d copy / dx = 1

    def contiguous(self):
        return self

    def to(self, dtype):
        """Cast to a dtype; between float dtypes the gradient is cast back."""
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        src = self.dtype
        # d cast / dx = 1: the gradient comes back in the input's dtype
        out = from_op(self.data.astype(dtype), 'to', (self,), lambda g: (g.astype(src),))
        if dtype.kind not in 'fc':
            out = out.detach()
        return out

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    def long(self):
        return self.to(int64)

    def retain_grad(self):
        """Ask backward to also store .grad on this non-leaf tensor."""
        self._retains_grad = True
        return self


def _init_result(out, data, vc=None):
    out.data = data
    out.grad = None
    out.requires_grad = False
    out._parents = ()
    out._backward = None
    out._op = None
    out._saved = ()
    out._vc = [0] if vc is None else vc  # version counter, shared with views
    out._seq = 0
    out._view = None
    out.name = None


_clock = itertools.count(1)  # numbers the graph's nodes in the order their ops ran
_hooks = []  # what watches every op and rule: tt.profile, tt.detect_anomaly (section 13)


def from_op(data, op, parents, backward, saved=(), view_of=None, saves_output=False):
    """Wrap an op's result. If grad mode is on and any input requires grad, the
    result joins the graph: it keeps its inputs, the op name and the backward rule.

    `saved` lists the tensors whose values the backward rule reads (inputs, masks,
    indices), and `saves_output` says that it reads the result itself (exp, softmax):
    their version counters are recorded, so that backward can detect a later
    in-place change instead of returning a wrong gradient.
    `view_of` shares the input's version counter, since the output is a view of it.
    """
    if isinstance(data, np.generic):  # NumPy's full reductions return scalars: keep arrays
        data = np.asarray(data)
    out = Tensor.__new__(Tensor)
    _init_result(out, data, None if view_of is None else view_of._vc)
    out._op = op
    if _grad_enabled:
        try:
            needs_grad = False
            for p in parents:
                if p.requires_grad:
                    needs_grad = True
                    break
        except AttributeError:
            bad = next(p for p in parents if not isinstance(p, Tensor))
            raise TypeError(f"{op}: expected a Tensor, got {type(bad).__name__}; wrap arrays "
                            "and numbers with tt.tensor(...)") from None
        if needs_grad:
            out.requires_grad = True
            out._parents = parents
            out._backward = backward
            out._seq = next(_clock)
            # (counter, version now, shape): the counter, not the tensor, so that an
            # output saving itself makes no reference cycle
            if saved:
                out._saved = tuple((t._vc, t._vc[0], t.data.shape) for t in saved)
            if saves_output:
                out._saved += ((out._vc, out._vc[0], data.shape),)
    if _hooks:  # a profile or detect_anomaly is watching (section 13); else one check
        for hook in _hooks:
            hook.op(out, op, parents)
    return out


def _dtype_of_python_data(data):
    """tensor([1.5, 2]) is float32, tensor([1, 2]) is int64, as in PyTorch."""
    try:
        arr = np.asarray(data)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"tensor: {e}") from None
    if arr.dtype.kind not in 'biufc':
        raise TypeError(f"tensor: data must be numbers or booleans (nested lists or a NumPy "
                        f"array of them), got {type(data).__name__} of dtype {arr.dtype}")
    if isinstance(data, (np.ndarray, np.generic)):  # NumPy data keeps its dtype
        return arr
    if arr.dtype.kind == 'f':
        return arr.astype(default_dtype)
    if arr.dtype.kind in 'iu':
        return arr.astype(int64)
    return arr


def tensor(data, dtype=None, requires_grad=False):
    """Create a leaf tensor. Python floats become float32, ints int64; a NumPy array
    keeps its dtype (float64 stays float64)."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _constant(data, vc=None):
    """A tensor outside the graph around an array (no copy): constants, masks, indices.
    vc: the version counter of the tensor whose array this is a view of."""
    out = Tensor.__new__(Tensor)
    _init_result(out, data, vc)
    return out


def _tensors_in(idx):
    """The tensors in an index, mask or condition (an op's backward reads them)."""
    return tuple(i for i in (idx if isinstance(idx, tuple) else (idx,)) if isinstance(i, Tensor))


def _dim(d, ndim, op):
    """Normalize a (possibly negative) dim and name it in the error if out of range."""
    n = builtins.max(ndim, 1)
    if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
        raise TypeError(f"{op}: dim must be an int, got {d!r}")
    if not -n <= d < n:
        raise IndexError(f"{op}: dim {d} is out of range for a tensor with ndim {ndim} "
                         f"(expected a dim in [{-n}, {n - 1}])")
    return d % n


def _dims(dim, ndim, op):
    """dim may be None (all dims), an int or a tuple; returns a tuple of axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (tuple, list)):
        axes = tuple(_dim(d, ndim, op) for d in dim)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{op}: dim {tuple(dim)} repeats a dimension")
        return axes
    return (_dim(dim, ndim, op),) if ndim > 0 else ()


# ---------------------------------------------------------------------------
# 3. Type promotion, elementwise arithmetic and broadcasting
# ---------------------------------------------------------------------------
# Type promotion: the dtype of a + b when a and b differ, PyTorch's rule.
#   1. Categories rank bool < integer < floating.
#   2. Operands rank in three tiers: tensors with dims > 0-d tensors > scalars
#      (Python or NumPy numbers; a scalar counts as bool, int64 or the default float32,
#      whatever its NumPy width).
#   3. Within a tier, the higher category wins and keeps its own width (int64 with
#      float32 is float32, where NumPy says float64); within a category the wider wins.
#   4. A lower tier changes the result only when its category is higher than the
#      tiers above it:
#        float32 tensor * 2.5 -> float32            int64 tensor * 2.5 -> float32
#        float32 tensor * float64 0-d -> float32    int32 tensor * float64 0-d -> float64
#        int32 tensor + int64 tensor -> int64       int tensor / int tensor -> float32
_CATEGORY = {'b': 0, 'i': 1, 'u': 1, 'f': 2, 'c': 3}


def promote_types(type1, type2):
    """The dtype that holds both (rule 3 above), as torch.promote_types."""
    type1, type2 = np.dtype(type1), np.dtype(type2)
    c1, c2 = _CATEGORY[type1.kind], _CATEGORY[type2.kind]
    if c1 != c2:
        return type1 if c1 > c2 else type2
    return np.promote_types(type1, type2)


def _scalar_dtype(x):
    """A Python or NumPy number as an operand: bool, int64 or the default float."""
    if isinstance(x, (bool, np.bool_)):
        return bool_
    if isinstance(x, (int, np.integer)):
        return int64
    if isinstance(x, (float, np.floating)):
        return default_dtype
    raise TypeError(f"expected a Tensor or a number, got {type(x).__name__}")


def result_type(*operands):
    """The dtype of an op's result on these operands (tensors, arrays or numbers),
    by the promotion rule above; as torch.result_type."""
    tiers = [None, None, None]  # tensors with dims, 0-d tensors, scalars
    for x in operands:
        if isinstance(x, (Tensor, np.ndarray)):
            tier, dt = (0 if x.ndim else 1), x.dtype
        else:
            tier, dt = 2, _scalar_dtype(x)
        tiers[tier] = dt if tiers[tier] is None else promote_types(tiers[tier], dt)
    result = None
    for dt in tiers:  # from the highest tier down: a lower one needs a higher category
        if dt is not None and (result is None or _CATEGORY[dt.kind] > _CATEGORY[result.kind]):
            result = dt
    return result


def _as(x, dtype):
    """x as a tensor of dtype: a cast in the graph for a tensor (its gradient comes
    back in its own dtype), a constant for a number or an array."""
    if isinstance(x, Tensor):
        return x if x.dtype == dtype else x.to(dtype)
    if isinstance(x, (list, tuple, np.ndarray, np.generic, bool, int, float)):
        return _constant(np.array(x, dtype=dtype))  # a copy: later changes to x can't leak in
    raise TypeError(f"expected a Tensor or a number, got {type(x).__name__}")


def _operands(a, b, floating=False):
    """Both operands of a binary op as tensors of the promoted dtype (a float one
    if floating: int / int is float32)."""
    # the common cases first: two tensors of one dtype, a float tensor with a Python number
    # (rule 4: a number never changes a float tensor's dtype)
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            if a.dtype == b.dtype and (not floating or a.dtype.kind == 'f'):
                return a, b
        elif type(b) in (float, int) and a.dtype.kind == 'f':
            return a, _constant(np.array(b, dtype=a.dtype))
    elif type(a) in (float, int) and isinstance(b, Tensor) and b.dtype.kind == 'f':
        return _constant(np.array(a, dtype=b.dtype)), b
    dtype = result_type(a, b)
    if floating and dtype.kind not in 'fc':
        dtype = default_dtype
    return _as(a, dtype), _as(b, dtype)


def unbroadcast(grad, shape):
    """Undo broadcasting in backward: sum grad down to the operand's shape.

    In the forward pass an operand of shape (3,) was broadcast to (4, 3): it was
    used 4 times, so its gradient is the sum of the 4 row gradients. Leading dims
    that broadcasting added are summed away, dims of size 1 are summed with keepdims.
    """
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    grad = grad.sum(axis=axes, keepdims=True) if axes else grad
    return grad.reshape(shape)


def _broadcast_op(op, fn, a, b):
    """Run a broadcasting forward; a shape mismatch names the op and both shapes."""
    try:
        return fn(a.data, b.data)
    except ValueError:
        raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                         "broadcast together") from None


def add(a, b):
    a, b = _operands(a, b)

    def backward(g):  # d(a+b)/da = 1, d(a+b)/db = 1, then undo broadcasting
        return (unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(g, b.shape) if b.requires_grad else None)
    return from_op(_broadcast_op('add', np.add, a, b), 'add', (a, b), backward)


def sub(a, b):
    a, b = _operands(a, b)

    def backward(g):  # d(a-b)/da = 1, d(a-b)/db = -1
        return (unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(-g, b.shape) if b.requires_grad else None)
    return from_op(_broadcast_op('sub', np.subtract, a, b), 'sub', (a, b), backward)


def mul(a, b):
    a, b = _operands(a, b)

    def backward(g):  # d(a*b)/da = b, d(a*b)/db = a
        return (unbroadcast(g * b.data, a.shape) if a.requires_grad else None,
                unbroadcast(g * a.data, b.shape) if b.requires_grad else None)
    # saved: what the rule reads, b for a's gradient and a for b's (so x.mul_(2) needs no copy)
    saved = (a, b) if a.requires_grad and b.requires_grad else (b,) if a.requires_grad else (a,)
    return from_op(_broadcast_op('mul', np.multiply, a, b), 'mul', (a, b), backward, saved=saved)


def div(a, b):
    a, b = _operands(a, b, floating=True)  # int / int is a float32 in PyTorch
    out = _broadcast_op('div', np.true_divide, a, b)

    def backward(g):  # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
        return (unbroadcast(g / b.data, a.shape) if a.requires_grad else None,
                unbroadcast(-g * a.data / (b.data * b.data), b.shape) if b.requires_grad else None)
    # saved: what the rule reads (b always, a only for b's gradient)
    return from_op(out, 'div', (a, b), backward, saved=(a, b) if b.requires_grad else (b,))


def pow(a, b):
    """a ** b for a tensor and a Python number (either side) or two tensors."""
    if isinstance(a, Tensor) and isinstance(b, (bool, int, float, np.number)):  # tensor ** number
        a = _as(a, result_type(a, b))
        p = b.item() if isinstance(b, np.generic) else b  # a NumPy scalar acts as a Python one

        def backward_scalar(g):  # d(x^p)/dx = p * x^(p-1)  (0 for p = 0, even at x = 0)
            return (g * (p * a.data ** (p - 1)) if p != 0 else np.zeros_like(g),)
        return from_op(a.data ** p, 'pow', (a,), backward_scalar, saved=(a,))
    a, b = _operands(a, b)
    out = _broadcast_op('pow', np.power, a, b)

    def backward(g):
        # d(a^b)/da = b * a^(b-1)  (0 where b == 0)
        # d(a^b)/db = a^b * log(a)  (0 where a == 0 and b >= 0, as PyTorch)
        ga = gb = None
        if a.requires_grad:
            with np.errstate(divide='ignore', invalid='ignore'):
                ga = np.where(b.data == 0, 0, b.data * a.data ** (b.data - 1))
            ga = unbroadcast(g * ga, a.shape)
        if b.requires_grad:
            with np.errstate(divide='ignore', invalid='ignore'):
                gb = np.where((a.data == 0) & (b.data >= 0), 0, out * np.log(a.data))
            gb = unbroadcast(g * gb, b.shape)
        return ga, gb
    return from_op(out, 'pow', (a, b), backward, saved=(a, b), saves_output=True)


def neg(a):
    return from_op(-a.data, 'neg', (a,), lambda g: (-g,))  # d(-x)/dx = -1


Tensor.__add__ = Tensor.add = add
Tensor.__radd__ = lambda self, other: add(other, self)
Tensor.__sub__ = Tensor.sub = sub
Tensor.__rsub__ = lambda self, other: sub(other, self)
Tensor.__mul__ = Tensor.mul = mul
Tensor.__rmul__ = lambda self, other: mul(other, self)
Tensor.__truediv__ = Tensor.div = div
Tensor.__rtruediv__ = lambda self, other: div(other, self)
Tensor.__pow__ = Tensor.pow = pow
Tensor.__rpow__ = lambda self, other: pow(_as(other, result_type(other, self)), self)
Tensor.__neg__ = Tensor.neg = neg


# Comparisons give boolean tensors outside the graph (they have no gradient).
def _compare(fn):
    def compare(self, other):
        a, b = _operands(self, other)
        return _constant(_broadcast_op(fn.__name__, fn, a, b))
    return compare


Tensor.__lt__, Tensor.__le__ = _compare(np.less), _compare(np.less_equal)
Tensor.__gt__, Tensor.__ge__ = _compare(np.greater), _compare(np.greater_equal)
Tensor.__eq__, Tensor.__ne__ = _compare(np.equal), _compare(np.not_equal)
Tensor.eq, Tensor.ne, Tensor.lt, Tensor.gt = Tensor.__eq__, Tensor.__ne__, Tensor.__lt__, Tensor.__gt__
Tensor.any = lambda self: Tensor(np.any(self.data))
Tensor.all = lambda self: Tensor(np.all(self.data))
Tensor.__invert__ = lambda self: _constant(np.logical_not(self.data))


# ---------------------------------------------------------------------------
# 4. Elementwise functions
# ---------------------------------------------------------------------------
def exp(x):
    out = np.exp(x.data)
    return from_op(out, 'exp', (x,), lambda g: (g * out,), saves_output=True)  # d e^x = e^x


def log(x):
    return from_op(np.log(x.data), 'log', (x,), lambda g: (g / x.data,), saved=(x,))  # d/dx log x = 1/x


def sqrt(x):
    out = np.sqrt(x.data)
    # d/dx sqrt x = 1/(2 sqrt x)
    return from_op(out, 'sqrt', (x,), lambda g: (g / (2 * out),), saves_output=True)


def abs(x):
    return from_op(np.abs(x.data), 'abs', (x,), lambda g: (g * np.sign(x.data),), saved=(x,))  # d|x|/dx = sign(x)


def sin(x):
    return from_op(np.sin(x.data), 'sin', (x,), lambda g: (g * np.cos(x.data),), saved=(x,))  # d sin = cos


def cos(x):
    return from_op(np.cos(x.data), 'cos', (x,), lambda g: (-g * np.sin(x.data),), saved=(x,))  # d cos = -sin


def tanh(x):
    out = np.tanh(x.data)
    # d/dx tanh x = 1 - tanh^2 x
    return from_op(out, 'tanh', (x,), lambda g: (g * (1 - out * out),), saves_output=True)


def sigmoid(x):
    # sigma(x) = 1 / (1 + e^-x), written as (1 + tanh(x/2)) / 2 so that it never overflows
    out = 0.5 + 0.5 * np.tanh(0.5 * x.data)
    # d sigma = sigma (1 - sigma)
    return from_op(out, 'sigmoid', (x,), lambda g: (g * out * (1 - out),), saves_output=True)


def relu(x):
    mask = x.data > 0
    return from_op(x.data * mask, 'relu', (x,), lambda g: (g * mask,))  # d relu = 1 where x > 0


def log1p(x):
    # log(1 + x), accurate for tiny x;  d/dx = 1 / (1 + x)
    return from_op(np.log1p(x.data), 'log1p', (x,), lambda g: (g / (1 + x.data),), saved=(x,))


def expm1(x):
    out = np.expm1(x.data)  # e^x - 1, accurate for tiny x;  d/dx = e^x = out + 1
    return from_op(out, 'expm1', (x,), lambda g: (g * (out + 1),), saves_output=True)


def silu(x):
    """x * sigmoid(x) (also called swish)."""
    with np.errstate(over='ignore'):  # exp(-x) = inf for x < -88 (float32): s = 0, right
        s = 1 / (1 + np.exp(-x.data))
    # d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s))
    return from_op(x.data * s, 'silu', (x,), lambda g: (g * s * (1 + x.data * (1 - s)),),
                   saved=(x,))


def leaky_relu(x, negative_slope=0.01):
    slope = np.where(x.data > 0, 1, negative_slope).astype(x.dtype)  # 1 for x > 0, else the slope
    return from_op(x.data * slope, 'leaky_relu', (x,), lambda g: (g * slope,))  # d/dx = slope


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch)."""
    bx = x.data * beta
    linear = bx > threshold
    with np.errstate(over='ignore'):
        out = np.where(linear, x.data, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)
    with np.errstate(over='ignore'):
        s = 1 / (1 + np.exp(-bx))  # d/dx = sigmoid(beta x), 1 on the linear part
    return from_op(out.astype(x.dtype), 'softplus', (x,), lambda g: (g * np.where(linear, 1, s),))


def erf(x):
    # erf(x) = 2/sqrt(pi) * integral of exp(-t^2) from 0 to x: NumPy has none, so _erf_np
    # (section 14) evaluates Cody's rational approximations, to double precision.
    # d/dx erf(x) = 2/sqrt(pi) * exp(-x^2)
    return from_op(_erf_np(x.data), 'erf', (x,),
                   lambda g: (g * (2 / math.sqrt(math.pi)) * np.exp(-x.data * x.data),), saved=(x,))


def gelu(x, approximate='none'):
    """GELU(x) = x * Phi(x), Phi the standard normal CDF (exact, with erf), or
    PyTorch's approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    xd = x.data
    if approximate == 'tanh':
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (xd + 0.044715 * xd ** 3))
        out = 0.5 * xd * (1 + t)

        def backward_tanh(g):  # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2)
            return (g * (0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * k * (1 + 0.134145 * xd * xd)),)
        return from_op(out, 'gelu', (x,), backward_tanh, saved=(x,))
    if approximate != 'none':
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if xd.dtype != np.float32:
        cdf = 0.5 * (1 + _erf_np(xd * (1 / math.sqrt(2))))  # Phi(x)
        dgelu = cdf + xd * np.exp(-0.5 * xd * xd) * (1 / math.sqrt(2 * math.pi))  # Phi + x phi
        out = xd * cdf
    else:  # the same two arrays, in fewer passes and on every core (section 14, Speed)
        out, dgelu = gelu_float32(xd)

    def backward(g):  # d/dx x Phi(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
        return (g * dgelu,)  # (computed in the forward pass, which had phi at hand)
    return from_op(out, 'gelu', (x,), backward)


def clamp(x, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    out = np.clip(x.data, min, max)
    inside = np.ones_like(x.data, dtype=bool) if min is None else x.data >= min
    if max is not None:
        inside &= x.data <= max
    return from_op(out, 'clamp', (x,), lambda g: (g * inside,))  # d clamp = 1 where min <= x <= max


def maximum(a, b):
    a, b = _operands(a, b)
    out = _broadcast_op('maximum', np.maximum, a, b)

    def backward(g):  # the larger input gets g; ties share it half and half (as PyTorch)
        wa = ((a.data > b.data) + 0.5 * (a.data == b.data)).astype(g.dtype)
        return (unbroadcast(g * wa, a.shape) if a.requires_grad else None,
                unbroadcast(g * (1 - wa), b.shape) if b.requires_grad else None)
    return from_op(out, 'maximum', (a, b), backward, saved=(a, b))


def minimum(a, b):
    a, b = _operands(a, b)
    out = _broadcast_op('minimum', np.minimum, a, b)

    def backward(g):  # the smaller input gets g; ties share it half and half
        wa = ((a.data < b.data) + 0.5 * (a.data == b.data)).astype(g.dtype)
        return (unbroadcast(g * wa, a.shape) if a.requires_grad else None,
                unbroadcast(g * (1 - wa), b.shape) if b.requires_grad else None)
    return from_op(out, 'minimum', (a, b), backward, saved=(a, b))


def where(condition, a, b):
    """where(cond, a, b): a where cond is true, else b (broadcasting all three)."""
    cond = condition.data if isinstance(condition, Tensor) else condition
    a, b = _operands(a, b)
    try:
        out = np.where(cond, a.data, b.data)
    except ValueError:
        raise ValueError(f"where: shapes {tuple(np.shape(cond))}, {tuple(a.shape)} and "
                         f"{tuple(b.shape)} cannot be broadcast together") from None

    def backward(g):  # g flows to a where cond holds, to b elsewhere
        return (unbroadcast(np.where(cond, g, 0), a.shape) if a.requires_grad else None,
                unbroadcast(np.where(cond, 0, g), b.shape) if b.requires_grad else None)
    return from_op(out, 'where', (a, b), backward, saved=_tensors_in(condition))


def masked_fill(x, mask, value):
    """Positions where mask is true become `value`; they pass no gradient."""
    m = mask.data if isinstance(mask, Tensor) else mask
    try:
        out = np.where(m, np.asarray(value, dtype=x.dtype), x.data)
    except ValueError:
        raise ValueError(f"masked_fill: mask of shape {tuple(np.shape(m))} cannot be "
                         f"broadcast to the tensor's shape {tuple(x.shape)}") from None
    if out.shape != x.shape:
        raise ValueError(f"masked_fill: mask of shape {tuple(np.shape(m))} cannot be "
                         f"broadcast to the tensor's shape {tuple(x.shape)}")
    # d/dx = 0 where masked
    return from_op(out, 'masked_fill', (x,), lambda g: (np.where(m, 0, g),), saved=_tensors_in(mask))


for _f in (exp, log, sqrt, abs, sin, cos, tanh, sigmoid, relu, log1p, expm1, erf, gelu, clamp,
           maximum,
           minimum, masked_fill):
    setattr(Tensor, _f.__name__, _f)
Tensor.__abs__ = abs
Tensor.clip = clamp


# ---------------------------------------------------------------------------
# 5. Reductions
# ---------------------------------------------------------------------------
def _expand_back(g, shape, axes, keepdim):
    """Backward of a reduction: put the reduced axes back (as size 1) and
    broadcast g over them: every input element of a reduced slice receives it."""
    if not keepdim and axes:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


def sum(x, dim=None, keepdim=False):
    axes = _dims(dim, x.ndim, 'sum')
    # d sum / dx_i = 1: each input element gets the gradient of its slice's sum
    return from_op(np.sum(x.data, axis=axes, keepdims=keepdim), 'sum', (x,),
                 lambda g: (_expand_back(g, x.shape, axes, keepdim),))


def mean(x, dim=None, keepdim=False):
    axes = _dims(dim, x.ndim, 'mean')
    n = math.prod(x.shape[a] for a in axes)
    # d mean / dx_i = 1/n
    return from_op(np.mean(x.data, axis=axes, keepdims=keepdim), 'mean', (x,),
                 lambda g: (_expand_back(g / n, x.shape, axes, keepdim),))


def _centered(x, dim, correction, unbiased, op):
    """What var and std share: the axes, x - mean, the divisor N - correction."""
    if unbiased is not None:
        correction = 1 if unbiased else 0
    axes = _dims(dim, x.ndim, op)
    n = math.prod(x.shape[a] for a in axes)
    return axes, x.data - np.mean(x.data, axis=axes, keepdims=True), n - correction


def var(x, dim=None, *, correction=1, keepdim=False, unbiased=None):
    """Variance sum((x - mean)^2) / (N - correction); correction=1 is Bessel's (the default).
    With N <= correction the divisor is 0, as in PyTorch: the variance is inf (nan if all
    the values are equal)."""
    axes, centered, dof = _centered(x, dim, correction, unbiased, 'var')
    with np.errstate(divide='ignore', invalid='ignore'):
        out = np.sum(centered * centered, axis=axes, keepdims=keepdim) / builtins.max(dof, 0)

    def backward(g):  # d var / dx_i = 2 (x_i - mean) / (N - correction)
        g = _expand_back(g, x.shape, axes, keepdim)
        if dof <= 0 and dim is None:  # PyTorch's value: nan where x_i == mean, else inf
            return (g * np.where(centered == 0, np.nan, np.inf),)
        with np.errstate(divide='ignore', invalid='ignore'):
            return (g * centered * (np.float64(2.0) / dof).astype(g.dtype),)
    return from_op(out, 'var', (x,), backward)


def std(x, dim=None, *, correction=1, keepdim=False, unbiased=None):
    """sqrt(var), one op, so that its gradient at zero spread is 0 (as PyTorch), not 0/0."""
    axes, centered, dof = _centered(x, dim, correction, unbiased, 'std')
    with np.errstate(divide='ignore', invalid='ignore'):
        out = np.sqrt(np.sum(centered * centered, axis=axes, keepdims=True) / builtins.max(dof, 0))

    def backward(g):  # d std / dx_i = (x_i - mean) / ((N - correction) std), 0 where std = 0
        g = _expand_back(g, x.shape, axes, keepdim)
        with np.errstate(divide='ignore', invalid='ignore'):
            if dof <= 0 and dim is None:  # as PyTorch: var's inf/nan, times 1 / (2 std) = 0
                var_grad = np.where(centered == 0, np.nan, np.inf)
                return (g * np.where(out == 0, 0, 0.5 / out) * var_grad,)
            return (g * np.where(out == 0, 0, centered / (dof * out)),)
    return from_op(out if keepdim else np.squeeze(out, axis=axes), 'std', (x,), backward,
                   saves_output=True)  # backward reads out


def _extreme(x, dim, keepdim, op, fn):
    axes = _dims(dim, x.ndim, op)
    if any(x.shape[a] == 0 for a in axes):
        raise RuntimeError(f"{op}: cannot reduce over an empty dim (tensor of shape "
                           f"{tuple(x.shape)}): the {op[1:]} of no values is undefined")
    out = fn(x.data, axis=axes, keepdims=True)
    # Gradient goes to the positions that hold the extreme value; when several tie,
    # they share it evenly (PyTorch's amax/amin rule): d out / dx_i = [x_i == out] / count
    mask = x.data == out
    count = np.sum(mask, axis=axes, keepdims=True).astype(x.dtype)
    res = out if keepdim else np.squeeze(out, axis=axes)
    return from_op(res, op, (x,), lambda g: (_expand_back(g, x.shape, axes, keepdim) * mask / count,))


def amax(x, dim=None, keepdim=False):
    return _extreme(x, dim, keepdim, 'amax', np.max)


def amin(x, dim=None, keepdim=False):
    return _extreme(x, dim, keepdim, 'amin', np.min)


MaxResult = namedtuple('max', ['values', 'indices'])
MinResult = namedtuple('min', ['values', 'indices'])


def _extreme_dim(x, dim, keepdim, op, argfn, result):
    d = _dim(dim, x.ndim, op)
    if x.ndim and x.shape[d] == 0:
        raise RuntimeError(f"{op}: cannot reduce over an empty dim (tensor of shape "
                           f"{tuple(x.shape)}, dim {dim})")
    idx = np.expand_dims(argfn(x.data, axis=d), d)  # first extreme, as PyTorch on the CPU
    values = np.take_along_axis(x.data, idx, axis=d)

    def backward(g):  # only the selected index receives the gradient
        gx = np.zeros_like(g, shape=x.shape)
        np.put_along_axis(gx, idx, g if keepdim else np.expand_dims(g, d), axis=d)
        return (gx,)
    if keepdim:
        return result(from_op(values, op, (x,), backward), Tensor(idx))
    return result(from_op(np.squeeze(values, d), op, (x,), backward), Tensor(np.squeeze(idx, d)))


def max(x, dim=None, keepdim=False):
    """max() -> the largest value; max(dim) -> (values, indices); max(other) -> maximum."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return amax(x)
    return _extreme_dim(x, dim, keepdim, 'max', np.argmax, MaxResult)


def min(x, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return amin(x)
    return _extreme_dim(x, dim, keepdim, 'min', np.argmin, MinResult)


def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) computed as m + log(sum(exp(x - m))) with m the max (no overflow)."""
    axes = _dims(dim, x.ndim, 'logsumexp')
    m = np.max(x.data, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # an all -inf slice gives -inf, not nan
    with np.errstate(divide='ignore'):
        out = np.log(np.sum(np.exp(x.data - m), axis=axes, keepdims=True)) + m

    def backward(g):  # d lse / dx_i = exp(x_i - lse) = softmax(x)_i
        return (_expand_back(g, x.shape, axes, keepdim) * np.exp(x.data - out),)
    return from_op(out if keepdim else np.squeeze(out, axis=axes), 'logsumexp', (x,), backward,
                   saved=(x,), saves_output=True)


def norm(x, p='fro', dim=None, keepdim=False):
    """The vector p-norm over dim (all elements by default): (sum |x|^p)^(1/p);
    'fro' and 2 are the Euclidean norm, inf the largest |x|, -inf the smallest,
    0 the number of non-zero elements."""
    if p == 'fro':
        p = 2
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise ValueError(f"norm: p must be a number, inf or 'fro', got {p!r}")
    axes = _dims(dim, x.ndim, 'norm')
    ax = np.abs(x.data)
    if p == math.inf or p == -math.inf:
        out = (np.max if p > 0 else np.min)(ax, axis=axes, keepdims=True)
    elif p == 0:
        out = np.sum(ax != 0, axis=axes, keepdims=True).astype(x.dtype)
    else:
        out = np.sum(ax ** p, axis=axes, keepdims=True) ** (1.0 / p)

    def backward(g):
        g = _expand_back(g, x.shape, axes, keepdim)
        sign = np.sign(x.data)
        with np.errstate(divide='ignore', invalid='ignore'):
            if p == math.inf or p == -math.inf:  # to the extreme elements, ties share evenly
                hit = ax == out
                return (g * sign * hit / np.sum(hit, axis=axes, keepdims=True),)
            if p == 0:  # a count of non-zeros is flat in x: d/dx_i = 0
                return (np.zeros_like(g),)
            if p == 1:  # d/dx_i = sign(x_i)
                return (g * sign,)
            # d/dx_i = sign(x_i) |x_i|^(p-1) / norm^(p-1), and 0 where the norm is 0
            return (g * np.where(out == 0, 0, sign * ax ** (p - 1) / out ** (p - 1)),)
    return from_op(out if keepdim else np.squeeze(out, axis=axes), 'norm', (x,), backward,
                   saved=(x,), saves_output=True)


def prod(x, dim=None, keepdim=False):
    """The product of the elements (over one dim, or all of them)."""
    axes = _dims(dim, x.ndim, 'prod') if dim is None else (_dim(dim, x.ndim, 'prod'),)
    out = np.prod(x.data, axis=axes, keepdims=True)
    zero = x.data == 0
    zeros = np.sum(zero, axis=axes, keepdims=True)

    def backward(g):
        # d prod / dx_i = the product of the others: prod / x_i when no element is 0;
        # with one 0, only that element gets the product of the others; with two, none
        g = _expand_back(g, x.shape, axes, keepdim)
        others = np.prod(np.where(zero, 1, x.data), axis=axes, keepdims=True)  # zeros left out
        with np.errstate(divide='ignore', invalid='ignore'):
            grad = np.where(zeros == 0, out / np.where(zero, 1, x.data),
                            np.where((zeros == 1) & zero, others, 0))
        return (g * grad,)
    return from_op(out if keepdim else np.squeeze(out, axis=axes), 'prod', (x,), backward,
                   saved=(x,), saves_output=True)


def cumsum(x, dim):
    """Running sums along dim: out_i = x_0 + ... + x_i."""
    d = _dim(dim, x.ndim, 'cumsum')
    data = x.data.astype(int64) if x.dtype.kind in 'biu' else x.data  # ints sum as int64

    def backward(g):  # x_i is in every out_j with j >= i: dx_i = g_i + ... + g_last
        return (np.flip(np.cumsum(np.flip(g, d), axis=d), d),)
    return from_op(np.cumsum(data, axis=d), 'cumsum', (x,), backward)


SortResult = namedtuple('sort', ['values', 'indices'])
TopkResult = namedtuple('topk', ['values', 'indices'])


def _select_along(x, idx, d, op, result):
    """values = x at idx along dim d, as a pair (values, indices); each value's gradient
    goes back to the position it came from."""
    indices = _constant(idx)

    def backward(g):
        gx = np.zeros_like(g, shape=x.shape)
        np.put_along_axis(gx, idx, g, axis=d)  # positions are distinct: no adding needed
        return (gx,)
    values = from_op(np.take_along_axis(x.data, idx, axis=d), op, (x,), backward,
                     saved=(indices,))  # the indices returned are the ones backward reads
    return result(values, indices)


def argsort(x, dim=-1, descending=False, stable=False):
    """The indices that sort x along dim (ties keep their order: a stable sort)."""
    d = _dim(dim, x.ndim, 'argsort')
    if not descending:
        return _constant(np.argsort(x.data, axis=d, kind='stable').astype(int64))
    # descending and stable: sort the reversed array ascending, then reverse back
    n = x.shape[d] if x.ndim else 1
    idx = np.flip(np.argsort(np.flip(x.data, d), axis=d, kind='stable'), d)
    return _constant((n - 1 - idx).astype(int64))


def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices) of x sorted along dim."""
    d = _dim(dim, x.ndim, 'sort')
    return _select_along(x, argsort(x, d, descending).data, d, 'sort', SortResult)


def topk(x, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) elements along dim."""
    d = _dim(dim, x.ndim, 'topk')
    n = x.shape[d] if x.ndim else 1
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {n}")
    idx = np.take(argsort(x, d, descending=largest).data, np.arange(k), axis=d)
    return _select_along(x, idx, d, 'topk', TopkResult)


def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return Tensor(np.argmax(x.data))
    return Tensor(np.argmax(x.data, axis=_dim(dim, x.ndim, 'argmax'), keepdims=keepdim))


def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return Tensor(np.argmin(x.data))
    return Tensor(np.argmin(x.data, axis=_dim(dim, x.ndim, 'argmin'), keepdims=keepdim))


for _f in (sum, mean, var, std, amax, amin, max, min, logsumexp, norm, prod, cumsum, argsort,
           sort, topk, argmax, argmin):
    setattr(Tensor, _f.__name__, _f)


# ---------------------------------------------------------------------------
# 6. Shape and indexing
# ---------------------------------------------------------------------------
def _sizes(args):
    """Accept both f(2, 3) and f((2, 3))."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _view(out, x, remake):
    """out is a view of x's memory (a reshape, a transpose, x[0], ...). Remember its base
    (the tensor at the bottom of a chain of views) and how to make it again from the
    base, so that an in-place change through a view can rewrite the base's history and
    a change of the base can rewrite its views' (section 10)."""
    if x._view is None:
        base, make = x, remake
    else:  # a view of a view: made from the base in two steps
        base, first = x._view
        make = lambda t: remake(first(t))  # noqa: E731
    out._view = (base, make)
    if not (base.requires_grad and base._backward is None):  # a parameter's history never changes
        refs = base.__dict__.get('_views')  # weak references: a view can still be freed
        if refs is None:
            base._views = refs = []
        elif len(refs) >= 16 and len(refs) & (len(refs) - 1) == 0:  # at 16, 32, 64, ...
            refs[:] = [r for r in refs if r() is not None]  # forget the views that are gone
        refs.append(weakref.ref(out))
    return out


def reshape(x, *shape):
    shape = _sizes(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} "
                         f"({x.data.size} elements) into {shape}") from None
    # the same numbers in a new shape: the gradient takes the old shape back
    backward = lambda g: (g.reshape(x.shape),)  # noqa: E731
    if not np.may_share_memory(out, x.data):  # NumPy had to copy: not a view
        return from_op(out, 'reshape', (x,), backward)
    return _view(from_op(out, 'reshape', (x,), backward, view_of=x), x, lambda t: reshape(t, shape))


def permute(x, *dims):
    dims = _sizes(dims)
    axes = tuple(_dim(d, x.ndim, 'permute') for d in dims)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the {x.ndim} dims "
                         f"of a tensor of shape {tuple(x.shape)}")
    inverse = tuple(np.argsort(axes))
    # backward: move the gradient's axes back with the inverse permutation
    return _view(from_op(x.data.transpose(axes), 'permute', (x,),
                         lambda g: (g.transpose(inverse),), view_of=x), x, lambda t: permute(t, axes))


def transpose(x, dim0, dim1):
    d0, d1 = _dim(dim0, x.ndim, 'transpose'), _dim(dim1, x.ndim, 'transpose')
    # swapping two axes is its own inverse
    return _view(from_op(np.swapaxes(x.data, d0, d1), 'transpose', (x,),
                         lambda g: (np.swapaxes(g, d0, d1),), view_of=x),
                 x, lambda t: transpose(t, d0, d1))


def unsqueeze(x, dim):
    d = _dim(dim, x.ndim + 1, 'unsqueeze')
    return _view(from_op(np.expand_dims(x.data, d), 'unsqueeze', (x,),
                         lambda g: (g.reshape(x.shape),), view_of=x), x, lambda t: unsqueeze(t, d))


def squeeze(x, dim=None):
    if dim is None:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    else:
        axes = tuple(a for a in _dims(dim, x.ndim, 'squeeze') if x.shape[a] == 1)
    out = np.squeeze(x.data, axis=axes)
    return _view(from_op(out, 'squeeze', (x,), lambda g: (g.reshape(x.shape),), view_of=x),
                 x, lambda t: reshape(t, out.shape))


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, 1)
    s, e = _dim(start_dim, x.ndim, 'flatten'), _dim(end_dim, x.ndim, 'flatten')
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def expand(x, *sizes):
    sizes = _sizes(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: cannot expand shape {tuple(x.shape)} to {sizes} (fewer dims)")
    target = tuple(x.shape[i - lead] if (n == -1 and i >= lead) else n for i, n in enumerate(sizes))
    try:
        out = np.broadcast_to(x.data, target)
    except ValueError:
        raise ValueError(f"expand: shape {tuple(x.shape)} cannot be expanded to {sizes}") from None
    # each input element was repeated along the expanded dims: sum the gradient back
    return _view(from_op(out, 'expand', (x,), lambda g: (unbroadcast(g, x.shape),), view_of=x),
                 x, lambda t: expand(t, target))


def _is_basic_index(idx):
    """ints, slices, None and ... select a view; anything else is advanced indexing."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return all(i is None or i is Ellipsis or isinstance(i, (slice, int, np.integer))
               and not isinstance(i, bool) for i in items)


def _index_data(idx):
    if isinstance(idx, Tensor):
        idx = idx.data
    if isinstance(idx, np.ndarray) and idx.dtype == bool:
        return np.nonzero(idx)  # a boolean mask selects the positions where it is true
    if isinstance(idx, np.ndarray):
        return idx
    if isinstance(idx, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    return idx


def getitem(x, idx):
    index_tensors = _tensors_in(idx)  # read by backward: guarded like saved inputs
    idx = _index_data(idx)
    try:
        out = x.data[idx]
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor of shape {tuple(x.shape)})") from None
    basic = _is_basic_index(idx)
    rows = isinstance(idx, np.ndarray) and idx.dtype.kind in 'iu' and x.ndim > 0

    def backward(g):
        if rows:  # x[int array]: rows picked several times get their gradients added
            return (_scatter_add_rows(x.shape, idx, g),)
        gx = np.zeros_like(g, shape=x.shape)
        if basic:
            gx[idx] = g  # a view picks each element at most once: just place g there
        else:
            np.add.at(gx, idx, g)  # a gather may pick an element twice: add, don't overwrite
        return (gx,)
    if not basic:
        return from_op(out, 'index', (x,), backward, saved=index_tensors)
    return _view(from_op(out, 'index', (x,), backward, view_of=x), x, lambda t: getitem(t, idx))


def _along(index, dim):
    """The full NumPy index that picks, for every position of index, the element whose
    coordinate in dim is index's value there and whose other coordinates are the
    position's own: out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (gather)."""
    ix = list(np.indices(index.shape, sparse=True))
    ix[dim] = index
    return tuple(ix)


def _index_tensor(index, op, ndim=None):
    """An index argument (a tensor or array of integers) as an int array."""
    idx = index.data if isinstance(index, Tensor) else np.asarray(index)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"{op}: index must hold integers, got {idx.dtype}")
    if ndim is not None and idx.ndim != ndim:
        raise ValueError(f"{op}: index must have {ndim} dims (as the input), got shape "
                         f"{tuple(idx.shape)}")
    return idx


def gather(input, dim, index):
    """Pick along dim: out[i][j][k] = input[index[i][j][k]][j][k] (dim 0);
    out has index's shape."""
    d = _dim(dim, input.ndim, 'gather')
    idx = _index_tensor(index, 'gather', input.ndim)
    where_ = _along(idx, d)
    try:
        out = input.data[where_]
    except IndexError as e:
        raise IndexError(f"gather: {e} (input of shape {tuple(input.shape)}, index of shape "
                         f"{tuple(idx.shape)}, dim {dim})") from None

    def backward(g):  # each picked element gets its gradient back; picked twice: added
        gx = np.zeros_like(g, shape=input.shape)
        np.add.at(gx, where_, g)
        return (gx,)
    return from_op(out, 'gather', (input,), backward, saved=_tensors_in(index))


def _scatter(input, dim, index, src, op, add):
    """What scatter and scatter_add share: write (or add) src into a copy of input at
    the positions _along(index, dim) picks; src is a tensor (its first index.shape
    block is used) or a number."""
    d = _dim(dim, input.ndim, op)
    idx = _index_tensor(index, op, input.ndim)
    where_ = _along(idx, d)
    block = tuple(slice(0, n) for n in idx.shape)
    is_tensor = isinstance(src, Tensor)
    if is_tensor:
        src = _as(src, input.dtype)
    values = src.data[block] if is_tensor else np.asarray(src, dtype=input.dtype)
    out = input.data.copy()
    written = None  # scatter: where input's values were replaced
    try:
        if add:
            np.add.at(out, where_, values)  # repeated indices add up
        else:
            out[where_] = values
            written = np.zeros(input.shape, dtype=bool)
            written[where_] = True
    except (IndexError, ValueError) as e:
        raise IndexError(f"{op}: {e} (input of shape {tuple(input.shape)}, index of shape "
                         f"{tuple(idx.shape)}, dim {dim})") from None

    def backward(g):
        # input: g where its value was kept (everywhere for scatter_add), 0 where replaced;
        # src: the gradient of the place each of its values went to (a gather of g)
        gi = g if add else np.where(written, 0, g)
        gs = None
        if is_tensor and src.requires_grad:
            gs = np.zeros_like(g, shape=src.shape)
            gs[block] = g[where_]
        return gi, gs
    parents = (input, src) if is_tensor else (input,)
    return from_op(out, op, parents, backward, saved=_tensors_in(index))


def scatter(input, dim, index, src=None, *, value=None):
    """A copy of input with out[index[i][j][k]][j][k] = src[i][j][k] (dim 0); src may be
    a number (or give value=). Where an index repeats, which write wins is not defined
    (as in PyTorch)."""
    if (src is None) == (value is None):
        raise ValueError("scatter: give exactly one of src and value")
    return _scatter(input, dim, index, src if src is not None else value, 'scatter', add=False)


def scatter_add(input, dim, index, src):
    """A copy of input with src[i][j][k] added into out[index[i][j][k]][j][k] (dim 0);
    repeated indices add up."""
    return _scatter(input, dim, index, src, 'scatter_add', add=True)


def index_select(input, dim, index):
    """The slices number index[0], index[1], ... along dim (index is 1-D)."""
    d = _dim(dim, input.ndim, 'index_select')
    idx = _index_tensor(index, 'index_select')
    if idx.ndim > 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {tuple(idx.shape)}")
    try:
        out = np.take(input.data, idx, axis=d)
    except IndexError as e:
        raise IndexError(f"index_select: {e} (input of shape {tuple(input.shape)})") from None

    def backward(g):  # slices picked several times get their gradients added
        gx = np.zeros_like(g, shape=input.shape)
        np.add.at(np.moveaxis(gx, d, 0), idx.reshape(-1), np.moveaxis(g, d, 0))
        return (gx,)
    return from_op(out, 'index_select', (input,), backward, saved=_tensors_in(index))


def take_along_dim(input, indices, dim=None):
    """gather with broadcasting (NumPy's take_along_axis); dim=None works on the
    flattened input."""
    if dim is None:
        flat = indices if isinstance(indices, Tensor) else _constant(np.asarray(indices))
        return take_along_dim(reshape(input, -1), reshape(flat, -1), 0)
    d = _dim(dim, input.ndim, 'take_along_dim')
    idx = _index_tensor(indices, 'take_along_dim', input.ndim)
    others = np.broadcast_shapes(input.shape[:d] + (1,) + input.shape[d + 1:],
                                 idx.shape[:d] + (1,) + idx.shape[d + 1:])
    x = expand(input, others[:d] + (input.shape[d],) + others[d + 1:])
    idx = np.broadcast_to(idx, others[:d] + (idx.shape[d],) + others[d + 1:])
    vc = indices._vc if isinstance(indices, Tensor) else None  # a view: the same counter
    return gather(x, d, _constant(idx, vc))


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    first = tensors[0]
    d = _dim(dim, first.ndim, 'cat')
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != d):
            raise ValueError(f"cat: tensors must have the same shape except in dim {dim}; got "
                             f"shapes {tuple(first.shape)} and {tuple(t.shape)}")
    ends = np.cumsum([t.shape[d] for t in tensors])[:-1]

    def backward(g):  # each input gets back its own slice of the gradient
        return tuple(np.split(g, ends, axis=d))
    return from_op(np.concatenate([t.data for t in tensors], axis=d), 'cat', tuple(tensors), backward)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: all tensors must have the same shape; got shapes "
                             f"{tuple(tensors[0].shape)} and {tuple(t.shape)}")
    d = _dim(dim, tensors[0].ndim + 1, 'stack')

    def backward(g):  # input i gets the gradient's slice i along the new dim
        return tuple(np.take(g, i, axis=d) for i in range(len(tensors)))
    return from_op(np.stack([t.data for t in tensors], axis=d), 'stack', tuple(tensors), backward)


def narrow(x, dim, start, length):
    d = _dim(dim, x.ndim, 'narrow')
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def split(x, split_size_or_sections, dim=0):
    """Pieces of split_size (the last may be smaller), or of the listed sizes."""
    d = _dim(dim, x.ndim, 'split')
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        sizes = [split_size_or_sections] * (n // split_size_or_sections)
        if n % split_size_or_sections:
            sizes.append(n % split_size_or_sections)
    else:
        sizes = list(split_size_or_sections)
        if builtins.sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} do not add up to {n}, the size of dim {dim} "
                             f"of a tensor of shape {tuple(x.shape)}")
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def chunk(x, chunks, dim=0):
    """`chunks` pieces of ceil(n / chunks) (as PyTorch, possibly fewer pieces)."""
    n = x.shape[_dim(dim, x.ndim, 'chunk')]
    return split(x, -(-n // chunks), dim)


def flip(x, *dims):
    """Reverse the order of the elements along the given dims."""
    axes = _dims(_sizes(dims), x.ndim, 'flip')
    return from_op(np.flip(x.data, axes), 'flip', (x,), lambda g: (np.flip(g, axes),))  # flip back


def roll(x, shifts, dims=None):
    """Shift the elements along dims, wrapping around (all elements, flattened, if dims
    is None)."""
    if dims is None:
        return reshape(roll(reshape(x, -1), shifts, 0), x.shape)
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    axes = _dims(dims if isinstance(dims, (tuple, list)) else (dims,), x.ndim, 'roll')
    if len(shifts) != len(axes):
        raise ValueError(f"roll: {len(shifts)} shifts for {len(axes)} dims")
    back = tuple(-s for s in shifts)
    # backward: roll the gradient back the other way
    return from_op(np.roll(x.data, shifts, axes), 'roll', (x,), lambda g: (np.roll(g, back, axes),))


def repeat(x, *sizes):
    """Tile x: sizes[i] copies along dim i (more sizes than dims add leading dims)."""
    sizes = _sizes(sizes)
    if len(sizes) < x.ndim:
        raise ValueError(f"repeat: {len(sizes)} sizes for a tensor of {x.ndim} dims; give at "
                         "least one per dim")
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)

    def backward(g):  # every copy sends its gradient back: sum over the copies
        pairs = [n for r, s in zip(sizes, shape) for n in (r, s)]  # (r0, s0, r1, s1, ...)
        return (g.reshape(pairs).sum(axis=tuple(range(0, len(pairs), 2))).reshape(x.shape),)
    return from_op(np.tile(x.data.reshape(shape), sizes), 'repeat', (x,), backward)


def tril(x, diagonal=0):
    # zeroed entries do not depend on x: only the kept triangle passes gradient
    return from_op(np.tril(x.data, diagonal), 'tril', (x,), lambda g: (np.tril(g, diagonal),))


def triu(x, diagonal=0):
    # zeroed entries do not depend on x: only the kept triangle passes gradient
    return from_op(np.triu(x.data, diagonal), 'triu', (x,), lambda g: (np.triu(g, diagonal),))


for _f in (reshape, permute, transpose, unsqueeze, squeeze, flatten, expand, narrow, split,
           chunk, tril, triu, gather, scatter, scatter_add, index_select, take_along_dim, flip,
           roll, repeat):
    setattr(Tensor, _f.__name__, _f)
Tensor.view = reshape
Tensor.__getitem__ = getitem
Tensor.T = property(lambda self: permute(self, tuple(range(self.ndim - 1, -1, -1))))
Tensor.mT = property(lambda self: transpose(self, -2, -1))
Tensor.expand_as = lambda self, other: expand(self, other.shape)
Tensor.view_as = Tensor.reshape_as = lambda self, other: reshape(self, other.shape)


# ---------------------------------------------------------------------------
# 7. Matrix multiplication, and unfold: a convolution is a matmul over patches
# ---------------------------------------------------------------------------
def _same_dtype(op, **tensors):
    """Matrix products refuse mixed dtypes, as PyTorch does: promoting a float32 weight
    to float64 silently would double the memory and the time of a whole model."""
    given = [(name, t) for name, t in tensors.items() if t is not None]
    for name, t in given:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}; wrap "
                            "arrays with tt.tensor(...)")
    name0, t0 = given[0]
    for name, t in given[1:]:
        if t.data.dtype != t0.data.dtype:
            raise RuntimeError(f"{op}: {name0} is {t0.dtype} but {name} is {t.dtype}; they must "
                               f"have the same dtype: convert one (x.float() for a float32 model)")


def matmul(a, b):
    """a @ b for 1-D, 2-D and batched N-D operands (batch dims broadcast).

    A 1-D left operand is treated as a row (1, n), a 1-D right operand as a
    column (n, 1); the added dim is removed from the result, as in PyTorch.
    """
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dim, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    _same_dtype('matmul', first=a, second=b)
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} are not "
                         f"compatible: {ka} (last dim of the first) != {kb} (rows of the second)")
    try:
        out = np.matmul(a.data, b.data)
    except ValueError:
        raise ValueError(f"matmul: batch dims of shapes {tuple(a.shape)} and {tuple(b.shape)} "
                         "cannot be broadcast together") from None

    def backward(g):
        # out = A B  =>  dA = g B^T,  dB = A^T g, on the operands as matrices: a 1-D a is
        # a row (1, n), a 1-D b a column (n, 1), and g gets back the dims they lost.
        # Batch dims that were broadcast are summed back (unbroadcast).
        A = a.data if a.ndim > 1 else a.data[None, :]
        B = b.data if b.ndim > 1 else b.data[:, None]
        G = g[..., None] if b.ndim == 1 else g
        G = G[..., None, :] if a.ndim == 1 else G
        ga = gb = None
        if a.requires_grad:
            ga = unbroadcast(np.matmul(G, np.swapaxes(B, -1, -2)), A.shape).reshape(a.shape)
        if b.requires_grad:
            if B.ndim == 2 < A.ndim and A.shape[:-2] == G.shape[:-2]:  # a matrix shared by
                gb = shared_matrix_grad(A, G)  # the whole batch: one 2-D product (Speed)
            else:
                gb = unbroadcast(np.matmul(np.swapaxes(A, -1, -2), G), B.shape)
            gb = gb.reshape(b.shape)
        return ga, gb
    return from_op(out, 'matmul', (a, b), backward, saved=(a, b))


Tensor.__matmul__ = Tensor.matmul = matmul
Tensor.__rmatmul__ = lambda self, other: matmul(_as(other, self.dtype), self)


def _pair(v, name, op):
    """kernel_size=3 means (3, 3): an int or a pair of ints, as PyTorch takes them."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in v):
        return int(v[0]), int(v[1])
    raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")


Window = namedtuple('Window', 'kernel dilation padding stride out')


def window(shape, kernel_size, dilation=1, padding=0, stride=1, op='unfold'):
    """Where a kh x kw window slides over the last two dims of `shape` (each argument an
    int or a pair): the sizes as pairs, and `out`, the number of window positions
    (oh, ow) = ((H + 2 padding - dilation (k - 1) - 1) // stride + 1, same for W)."""
    k, d = _pair(kernel_size, 'kernel_size', op), _pair(dilation, 'dilation', op)
    p, s = _pair(padding, 'padding', op), _pair(stride, 'stride', op)
    if builtins.min(k + d + s) < 1 or builtins.min(p) < 0:
        raise ValueError(f"{op}: kernel_size, dilation and stride must be >= 1 and padding "
                         f">= 0, got kernel_size={k}, dilation={d}, stride={s}, padding={p}")
    size = [shape[-2 + i] + 2 * p[i] for i in (0, 1)]  # the padded input
    span = [d[i] * (k[i] - 1) + 1 for i in (0, 1)]  # what one window covers
    if span[0] > size[0] or span[1] > size[1]:
        raise ValueError(f"{op}: the kernel {k[0]}x{k[1]} (dilation {d}) spans {span[0]}x"
                         f"{span[1]}, larger than the padded input {size[0]}x{size[1]}")
    out = tuple((size[i] - span[i]) // s[i] + 1 for i in (0, 1))
    return Window(k, d, p, s, out)


def _window_slice(w, i, j):
    """The positions that kernel element (i, j) visits, in the padded input: a strided slice."""
    (dh, dw), (sh, sw), (oh, ow) = w.dilation, w.stride, w.out
    return (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col, as torch.nn.functional.unfold: every kh x kw patch of the image becomes a
    column. (N, C, H, W) -> (N, C*kh*kw, L) with L = oh*ow patches; row c*kh*kw + i*kw + j
    of column y*ow + x holds input[n, c, y*sh + i*dh - ph, x*sw + j*dw - pw] (0 in the
    padding). A convolution is then one matmul: weight (O, C*kh*kw) @ columns."""
    if input.ndim != 4:
        raise ValueError(f"unfold: expected a 4-D input (N, C, H, W), got shape "
                         f"{tuple(input.shape)}")
    w = window(input.shape, kernel_size, dilation, padding, stride)
    (kh, kw), (ph, pw), (oh, ow) = w.kernel, w.padding, w.out
    n, c, h, wd = input.shape
    x = np.pad(input.data, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else input.data
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):  # kernel element (i, j) sees one strided copy of the image
            cols[:, :, i, j] = x[(..., *_window_slice(w, i, j))]

    def backward(g):  # fold (col2im): each patch's gradient goes back where the patch came
        gx = np.zeros(x.shape, dtype=g.dtype)  # from; overlapping patches add up
        g = g.reshape(n, c, kh, kw, oh, ow)
        for i in range(kh):
            for j in range(kw):
                gx[(..., *_window_slice(w, i, j))] += g[:, :, i, j]
        return (gx[:, :, ph:ph + h, pw:pw + wd],)  # the padding's gradient is dropped
    return from_op(cols.reshape(n, c * kh * kw, oh * ow), 'unfold', (input,), backward)


# ---------------------------------------------------------------------------
# 8. Softmax and log-softmax (fused: one op, one hand-derived backward)
# ---------------------------------------------------------------------------
def softmax(x, dim):
    """exp(x - max) / sum(exp(x - max)): subtracting the max avoids overflow and
    leaves the result unchanged. -inf entries (masked positions) get probability 0."""
    d = _dim(dim, x.ndim, 'softmax')
    e = np.exp(x.data - np.max(x.data, axis=d, keepdims=True))
    out = e / np.sum(e, axis=d, keepdims=True)

    def backward(g):  # dx = p * (g - sum(p * g))   (the Jacobian diag(p) - p p^T applied to g)
        return (out * (g - np.sum(g * out, axis=d, keepdims=True)),)
    return from_op(out, 'softmax', (x,), backward, saves_output=True)


def log_softmax(x, dim):
    """x - logsumexp(x), computed stably."""
    d = _dim(dim, x.ndim, 'log_softmax')
    shifted = x.data - np.max(x.data, axis=d, keepdims=True)
    out = shifted - np.log(np.sum(np.exp(shifted), axis=d, keepdims=True))

    def backward(g):  # dx = g - softmax(x) * sum(g)
        return (g - np.exp(out) * np.sum(g, axis=d, keepdims=True),)
    return from_op(out, 'log_softmax', (x,), backward, saves_output=True)


Tensor.softmax = softmax
Tensor.log_softmax = log_softmax


# ---------------------------------------------------------------------------
# 9. Backward: reverse-mode automatic differentiation
# ---------------------------------------------------------------------------
def _freed_graph(g):
    raise RuntimeError("backward: trying to backward through the graph a second time (its "
                       "buffers were freed by the first backward); pass retain_graph=True to "
                       "the first backward if you need to go through it twice")


def _topological_order(root):
    """Every tensor that root depends on (and that requires grad), inputs before
    outputs. Iterative depth-first search, so a chain of 100,000 ops is no problem
    (a recursive version would hit Python's recursion limit)."""
    order, visited = [], set()
    todo = [(root, False)]
    while todo:
        node, expanded = todo.pop()
        if expanded:
            order.append(node)  # all of node's inputs are already in order
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        todo.append((node, True))
        for p in node._parents:
            if p._seq >= node._seq:  # changed in place since node read it: its older self
                p = _as_read_by(node, p)
            if p.requires_grad and id(p) not in visited:
                todo.append((p, False))
    return order


def _inputs(node):
    """node's inputs as node read them: an input changed in place after node's op ran is
    represented by its older self (section 10). Usually just node._parents."""
    return tuple(p if p._seq < node._seq else _as_read_by(node, p) for p in node._parents)


def _as_read_by(node, p):
    """The version of p that node's op read (p's history was rewritten since)."""
    while p._seq >= node._seq:
        p = p._older
    return p


def backward(tensor, gradient=None, retain_graph=False):
    """Fill .grad of every leaf that `tensor` depends on: d tensor / d leaf.

    Walks the graph from the output back to the leaves (reverse topological
    order), calling each op's backward rule with the gradient of its output and
    adding what it returns into the gradients of its inputs. A tensor used twice
    receives the sum of both contributions (the multivariable chain rule).
    """
    grads = {id(tensor): _initial_gradient(tensor, gradient)}  # id(tensor) -> d out / d tensor
    for node in reversed(_topological_order(tensor)):
        g = grads.pop(id(node), None)
        if g is None:
            continue  # no gradient reached it
        if node._backward is None:  # a leaf: add into its .grad
            _accumulate(node, g)
            continue
        if getattr(node, '_retains_grad', False):  # asked for by x.retain_grad()
            _accumulate(node, g)
        if node._saved:
            _check_saved(node)  # nothing the rule reads was changed in place since the forward pass
        rule_out = node._backward(g) if not _hooks else _watched_rule(node, g)
        for p, pg in zip(node._parents, rule_out):  # the op's rule: the chain rule
            if pg is None:
                continue
            if p._seq >= node._seq:  # p was changed in place after node's op read it
                p = _as_read_by(node, p)
            if p.requires_grad:
                if getattr(pg, 'shape', None) != p.data.shape or pg.dtype != p.data.dtype:
                    _wrong_gradient(node, p, pg)  # a guard rail for the rules you write
                key = id(p)
                grads[key] = grads[key] + pg if key in grads else pg  # two paths add up
        if not retain_graph:
            _free(node)


def _initial_gradient(tensor, gradient):
    """d tensor / d tensor: ones for a single number, else the gradient the caller gave."""
    if not tensor.requires_grad:
        raise RuntimeError("backward: this tensor does not require grad and has no grad_fn "
                           "(no input had requires_grad=True, or it was made under no_grad)")
    if gradient is None:
        if tensor.data.size != 1:
            raise RuntimeError(f"backward: grad can be created implicitly only for a "
                               f"single-element output, got shape {tuple(tensor.shape)}; "
                               "pass gradient=...")
        return np.ones_like(tensor.data)
    gradient = gradient.data if isinstance(gradient, Tensor) else gradient
    if tuple(np.shape(gradient)) != tuple(tensor.shape):
        raise RuntimeError(f"backward: gradient has shape {tuple(np.shape(gradient))} but "
                           f"the tensor has shape {tuple(tensor.shape)}")
    return gradient


def _accumulate(t, g):
    """t.grad += g: gradients accumulate across backward calls, never overwrite."""
    if t.grad is not None:
        t.grad += g
    elif g.dtype == t.dtype and unshared(g):  # g itself, no copy needed (section 14, Speed)
        t.grad = g
    else:
        t.grad = g.astype(t.dtype, copy=True)  # g may be shared: .grad gets its own array


def _wrong_gradient(node, x, pg):
    """A rule returned a gradient that can't be input x's: say which op, which input,
    what was wrong and the likely cause."""
    i = next(k for k, p in enumerate(_inputs(node)) if p is x)
    shape, dtype = getattr(pg, 'shape', None), getattr(pg, 'dtype', None)
    if shape is None or dtype is None:
        problem = f"returned a {type(pg).__name__}, not an array"
    elif shape != tuple(x.shape):
        problem = (f"returned a gradient of shape {shape} for an input of shape "
                   f"{tuple(x.shape)}; a rule must sum the gradient back to its input's shape "
                   "(see unbroadcast)")
    else:
        problem = (f"returned a {dtype} gradient for a {x.dtype} input; a gradient has its "
                   "input's dtype (cast with .astype(x.dtype))")
    raise RuntimeError(f"backward through '{node._op}': its rule {problem} (input {i})")


def _check_saved(node):
    """Refuse to run a rule whose saved arrays were changed in place after the forward pass
    (it would return a wrong gradient without a word)."""
    for counter, version, shape in node._saved:
        if counter[0] != version:
            raise RuntimeError(
                f"backward through '{node._op}': a tensor of shape {tuple(shape)} that it "
                f"saved for backward was modified in place (it is at version {counter[0]}, "
                f"expected version {version}); use an out-of-place op or .clone() first")


def _free(node):
    """Drop what the rule holds (its inputs, their arrays): the graph can't be walked again."""
    node._backward = _freed_graph
    node._parents = ()
    node._saved = ()


Tensor.backward = backward


# ---------------------------------------------------------------------------
# 10. In-place ops: the graph is rewritten, the version counter keeps it safe
# ---------------------------------------------------------------------------
# h.add_(1) (or h += 1) writes into h's own memory. If h is part of a graph, its
# history is rewritten, as PyTorch does:
#
#   before:   x --mul--> h                 after:   x --mul--> (old h) --add_--> h
#
# The Python object h stays the same; it is now the output of add_, whose input is
# h's old value: a snapshot object that keeps h's old history (h._older). An op that
# read h before the change must still send its gradient to the old value. So every
# graph node carries the number of its op in the order ops ran (_seq), and backward
# sends a node's gradient to the version of each input that existed when the node
# was made (_as_read_by, section 9).
#
# The old values themselves are gone: h's memory holds the new ones. If a rule saved
# h to read it in backward (mul saves its inputs, exp its output), the version counter
# sees the change and backward refuses. An op that saved nothing (add) doesn't mind.
# So an in-place op saves the memory of a new tensor, except when its own rule needs
# the old value (h.mul_(w) with w requiring grad: d(h*w)/dw = h): it keeps a copy,
# a visible 'clone' node, as PyTorch keeps one.
#
# Each in-place op below computes its result with its out-of-place twin and hands it to
# _in_place, which writes it into x's memory (or, when nothing else shares that memory,
# gives x the result's memory: no copy) and rewrites x's history to be the twin's.
# Through views: y = h[0]; y += 1 changes h's memory too. Then h's history becomes
# CopySlices(old h, y) (y's region from y, the rest from the old h), and every other
# live view of h is made again from the new h, so that its history matches its values.
def _check_inplace(x, op):
    if not x.data.flags.writeable:
        raise RuntimeError(f"{op}: this tensor is read-only (an expanded view: several of its "
                           "elements are one memory location); call .clone() first")
    if not _grad_enabled:
        return
    if x.requires_grad and x.is_leaf:
        raise RuntimeError(f"{op}: a leaf tensor that requires grad cannot be changed in "
                           "place while grad mode is on; do it inside `with no_grad():`")
    info = x._view
    if info is not None and info[0].requires_grad and info[0].is_leaf:
        raise RuntimeError(f"{op}: a view of a leaf tensor that requires grad cannot be "
                           "changed in place while grad mode is on; do it inside `with "
                           "no_grad():`, or change a clone (x.clone()) instead")


def _bump(x):
    x._vc[0] += 1  # views share the counter, so they see the change too
    return x


def _in_place_operand(x, other, op, floating=False):
    """other for an in-place op on x, as a number or a tensor of x's dtype: the promoted
    dtype (result_type) must fit back into x's dtype, as in PyTorch (an int tensor can't
    take += 1.5)."""
    if x.dtype.kind == 'f' and (type(other) in (float, int) or
                                isinstance(other, Tensor) and other.dtype == x.dtype):
        return other  # the common cases: nothing to promote, the op takes it as it is
    dtype = result_type(x, other)
    if floating and dtype.kind not in 'fc':
        dtype = default_dtype
    if _CATEGORY[dtype.kind] > _CATEGORY[x.dtype.kind]:
        raise RuntimeError(f"{op}: result type {dtype} can't be cast to {x.dtype}, the tensor's "
                           f"dtype; use the out-of-place form (x = x.{op[:-1]}(...)) or convert "
                           f"x first (x.float())")
    return _as(other, x.dtype)


def _in_place(x, op, result):
    """The end of every in-place op: result (the op's value, computed out of place)
    goes into x's memory, and x becomes result in the graph."""
    _check_inplace(x, op)
    if result.shape != x.shape:
        raise RuntimeError(f"{op}: the result has shape {tuple(result.shape)} but the tensor "
                           f"has shape {tuple(x.shape)}; an in-place op can't change a shape")
    if result.requires_grad and result.dtype == x.dtype and _sole_owner(x):
        x.data = result.data  # no one else reads x's memory: take the result's, no copy
    else:
        x.data[...] = result.data  # views, aliases and leaves see the new values
    _bump(x)
    if result.requires_grad:
        for hook in _hooks:  # a profile counted the twin under its own name: move it
            hook.renamed(result, op)
        result._op = op
        _record(x, result)
    return x


def _sole_owner(x):
    """x's memory is x's alone: x is an op's output, not a view, with no live views, never
    detached. Its in-place op can then keep the result's memory instead of copying."""
    views = x.__dict__.get('_views')
    return (x._backward is not None and x._view is None and x.data.base is None
            and '_shared' not in x.__dict__ and not (views and any(r() is not None for r in views)))


def _record(x, node):
    """x was changed in place: x takes node's history, then the base it is a view of and
    the other views of that base get histories that match their new values."""
    _rewrite(x, node)
    info = x._view
    base = x if info is None else info[0]
    if info is not None:  # the base's region under x holds x's new values
        _rewrite(base, _copy_slices(base, x, info[1]))
    if base.requires_grad:
        for ref in list(base.__dict__.get('_views', ())):
            v = ref()
            if v is not None and v is not x:  # made again from the new base
                _rewrite(v, v._view[1](base))


_NOTHING = np.zeros(2, dtype=np.float64)  # 16 bytes: one element of any dtype, read-only
_NOTHING.flags.writeable = False


def _rewrite(x, node):
    """x (the same Python object) becomes the output of node; its old history moves to a
    snapshot, x._older, for the ops that read x before the change."""
    old = Tensor.__new__(Tensor)
    # the old values are gone (x's memory holds the new ones): the snapshot keeps only the
    # shape and dtype, in an array of that shape whose elements all sit on one (zero) value
    _init_result(old, np.ndarray(x.shape, x.dtype, _NOTHING, 0, (0,) * x.ndim), x._vc)
    old.requires_grad, old._parents, old._backward = x.requires_grad, x._parents, x._backward
    old._op, old._saved, old._seq = x._op, x._saved, x._seq
    if '_older' in x.__dict__:
        old._older = x._older
    x.requires_grad, x._parents, x._backward = node.requires_grad, node._parents, node._backward
    x._op, x._seq = node._op, node._seq
    # a rule that reads node's output now reads x's memory: guard it with x's counter
    x._saved = tuple((x._vc, x._vc[0], s) if c is node._vc else (c, v, s)
                     for c, v, s in node._saved)
    x._older = old


def _copy_slices(base, view, remake):
    """base's value after a write through its view: view's new values in view's region,
    base's old values elsewhere. remake(t) cuts the view's region out of t."""
    def backward(g):  # g outside the region flows to the old base, inside it to the view
        gb = g.copy()
        region = remake(_constant(gb)).data  # a view of gb
        gv = region.copy()
        region[...] = 0
        return gb, gv
    return from_op(base.data, 'CopySlices', (base, view), backward)


def _keep_old(x, other, needed):
    """x's old value for a rule that reads it (d(x*w)/dw = x): a clone in the graph, the
    one copy an in-place op can't avoid. `other` is x itself in x.mul_(x)."""
    if not (needed and _grad_enabled):
        return x, other
    old = x.clone()
    return old, (old if other is x else other)


def _requires_grad(t):
    return isinstance(t, Tensor) and t.requires_grad


def add_(x, other, alpha=1):
    o = _in_place_operand(x, other, 'add_')
    return _in_place(x, 'add_', add(x, o if alpha == 1 else o * alpha))


def sub_(x, other, alpha=1):
    o = _in_place_operand(x, other, 'sub_')
    return _in_place(x, 'sub_', sub(x, o if alpha == 1 else o * alpha))


def mul_(x, other):
    old, o = _keep_old(x, _in_place_operand(x, other, 'mul_'), _requires_grad(other))
    return _in_place(x, 'mul_', mul(old, o))


def div_(x, other):
    old, o = _keep_old(x, _in_place_operand(x, other, 'div_', floating=True),
                       _requires_grad(other))
    return _in_place(x, 'div_', div(old, o))


def pow_(x, exponent):
    old, e = _keep_old(x, exponent, x.requires_grad or _requires_grad(exponent))
    if isinstance(e, Tensor):
        e = _in_place_operand(x, e, 'pow_')
    return _in_place(x, 'pow_', pow(old, e))


def clamp_(x, min=None, max=None):
    return _in_place(x, 'clamp_', clamp(x, min, max))


def relu_(x):
    return _in_place(x, 'relu_', relu(x))


def masked_fill_(x, mask, value):
    return _in_place(x, 'masked_fill_', masked_fill(x, mask, value))


def fill_(x, value):
    """Every element becomes value (a number or a 0-d tensor, which gets the gradient)."""
    v = _as(_in_place_operand(x, value, 'fill_'), x.dtype)
    if v.ndim != 0:
        raise RuntimeError(f"fill_: the value must be a number or a 0-d tensor, got shape "
                           f"{tuple(v.shape)}")

    def backward(g):  # the old values are forgotten: d/dx = 0; each element is the value: d/dv = sum
        return np.zeros_like(g), g.sum().astype(g.dtype).reshape(())
    return _in_place(x, 'fill_', from_op(np.full_like(x.data, v.data), 'fill', (x, v), backward))


def zero_(x):
    return fill_(x, 0)


def copy_(x, src):
    """x's elements become src's (broadcast to x's shape, cast to x's dtype)."""
    s = src if isinstance(src, Tensor) else _constant(np.asarray(src))
    try:
        data = np.broadcast_to(s.data, x.shape).astype(x.dtype)
    except ValueError:
        raise ValueError(f"copy_: source of shape {tuple(s.shape)} cannot be copied into a "
                         f"tensor of shape {tuple(x.shape)}") from None

    def backward(g):  # the old values are forgotten: d/dx = 0; d/dsrc = 1, summed where broadcast
        return (np.zeros_like(g),
                unbroadcast(g, s.shape).astype(s.dtype) if s.requires_grad else None)
    return _in_place(x, 'copy_', from_op(data, 'copy', (x, s), backward))


def _last_writes(shape, idx):
    """For x[idx] = v with an index that may name a position twice: which slots of the
    written region are the last write to their position (they stay; the earlier writes
    are overwritten, as in PyTorch) - NumPy's own assignment decides, as in the forward."""
    owner = np.full(shape, -1, dtype=np.intp)
    slots = np.arange(owner[idx].size).reshape(owner[idx].shape)
    owner[idx] = slots
    return owner[idx] == slots


def setitem(x, idx, value):
    """x[idx] = value, with every index getitem takes. In the graph, x's history becomes
    this write: the written positions get their gradient from value, the others from x's
    old value."""
    _check_inplace(x, '__setitem__')
    i = _index_data(idx)
    v = value if not isinstance(value, Tensor) or value.dtype == x.dtype else value.to(x.dtype)
    recording = _grad_enabled and (x.requires_grad or _requires_grad(v))
    last = None if not recording or _is_basic_index(i) else _last_writes(x.shape, i)
    try:
        x.data[i] = v.data if isinstance(v, Tensor) else v
    except (ValueError, IndexError) as e:
        raise type(e)(f"setitem: {e} (tensor of shape {tuple(x.shape)})") from None
    _bump(x)
    if not recording:
        return
    parents = (x, v) if _requires_grad(v) else (x,)

    def backward(g):  # d/dx = 1 where not written, 0 where written; d/dvalue = g at its places
        gx = g.copy()
        gx[i] = 0  # written over: no gradient to the old values there
        if len(parents) == 1:
            return (gx,)
        gv = g[i] if last is None else g[i] * last  # only the last write to a position counts
        gv = gv.reshape((1,) * (v.ndim - gv.ndim) + gv.shape)
        return gx, unbroadcast(gv, v.shape)  # a broadcast value: its uses add up
    _record(x, from_op(x.data, '__setitem__', parents, backward, saved=_tensors_in(idx)))


for _f in (add_, sub_, mul_, div_, pow_, clamp_, relu_, masked_fill_, fill_, zero_, copy_):
    setattr(Tensor, _f.__name__, _f)
Tensor.clip_ = clamp_
Tensor.__setitem__ = setitem
Tensor.__iadd__ = lambda self, o: add_(self, o)
Tensor.__isub__ = lambda self, o: sub_(self, o)
Tensor.__imul__ = lambda self, o: mul_(self, o)
Tensor.__itruediv__ = lambda self, o: div_(self, o)
Tensor.__ipow__ = lambda self, o: pow_(self, o)


# ---------------------------------------------------------------------------
# 11. Creation functions
# ---------------------------------------------------------------------------
# One generator for the whole library: manual_seed(s) makes every random op,
# dropout and sampling included, reproducible.
_rng = np.random.default_rng()


def manual_seed(seed):
    global _rng
    _rng = np.random.default_rng(seed)


def default_generator():
    """The library's numpy Generator (used by randn, rand, dropout, multinomial, ...)."""
    return _rng


def get_rng_state():
    return _rng.bit_generator.state


def set_rng_state(state):
    _rng.bit_generator.state = state


def _leaf(data, requires_grad):
    return Tensor(data, requires_grad=requires_grad) if requires_grad else \
        _constant(data)


def from_numpy(ndarray):
    """A tensor that shares memory with a NumPy array (no copy, as torch.from_numpy):
    a change to one is seen in the other. Keeps the array's dtype."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(ndarray).__name__}")
    if ndarray.dtype.kind not in 'biufc':
        raise TypeError(f"from_numpy: the array must hold numbers or booleans, got {ndarray.dtype}")
    return _constant(ndarray)


def zeros(*size, dtype=None, requires_grad=False):
    return _leaf(np.zeros(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def ones(*size, dtype=None, requires_grad=False):
    return _leaf(np.ones(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def full(size, fill_value, dtype=None, requires_grad=False):
    if dtype is None:
        dtype = default_dtype if isinstance(fill_value, float) else \
            (bool_ if isinstance(fill_value, bool) else int64)
    return _leaf(np.full(tuple(size) if not isinstance(size, int) else (size,), fill_value,
                         dtype=dtype), requires_grad)


def zeros_like(x, dtype=None, requires_grad=False):
    return _leaf(np.zeros(x.shape, dtype=dtype or x.dtype), requires_grad)


def ones_like(x, dtype=None, requires_grad=False):
    return _leaf(np.ones(x.shape, dtype=dtype or x.dtype), requires_grad)


def arange(start, end=None, step=1, dtype=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = default_dtype if any(isinstance(v, float) for v in (start, end, step)) else int64
    return _leaf(np.arange(start, end, step, dtype=dtype), requires_grad)


def randn(*size, dtype=None, requires_grad=False):
    return _leaf(_rng.standard_normal(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def rand(*size, dtype=None, requires_grad=False):
    return _leaf(_rng.random(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def randint(low, high=None, size=(), dtype=int64):
    if high is None:
        low, high = 0, low
    return _leaf(_rng.integers(low, high, size=size, dtype=dtype), False)


def randperm(n):
    return _leaf(_rng.permutation(n).astype(int64), False)


def multinomial(probs, num_samples=1):
    """Sample indices from each row of probs (rows need not be normalised), with replacement."""
    p = probs.data if isinstance(probs, Tensor) else probs
    p2 = p.reshape(-1, p.shape[-1]).astype(np.float64)
    cdf = np.cumsum(p2, axis=-1)
    u = _rng.random((p2.shape[0], num_samples)) * cdf[:, -1:]
    idx = np.sum(cdf[:, None, :] <= u[:, :, None], axis=-1)  # first index whose cdf exceeds u
    idx = np.minimum(idx, p.shape[-1] - 1)
    return _leaf(idx.reshape(p.shape[:-1] + (num_samples,)).astype(int64), False)


def eye(n, dtype=None):
    return _leaf(np.eye(n, dtype=dtype or default_dtype), False)


# Functional forms: tinytorch.exp(x), tinytorch.sum(x, dim=1), ... are the same functions.
# (sum, max, min and abs shadow Python's builtins inside this module only.)


# ---------------------------------------------------------------------------
# 12. gradcheck: compare the analytic gradient with central finite differences
# ---------------------------------------------------------------------------
class GradcheckError(AssertionError):
    pass


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0, fast_mode=False):
    """Check the backward rules used by fn against finite differences.

    fn(*inputs) returns a tensor; a non-scalar output is reduced to
    sum(out * v) with a fixed random v, so every element of the output counts.
    For each input that requires grad (it must be float64) every element is
    nudged by +-eps: numeric = (f(x + eps) - f(x - eps)) / (2 eps), and each element
    must satisfy |analytic - numeric| <= atol + rtol |numeric|.
    fast_mode=True checks 3 random directions u instead (all inputs at once): the
    directional derivative <grad, u> against (f(x + eps u) - f(x - eps u)) / (2 eps),
    2 evaluations per direction instead of 2 per element: cheap for large inputs
    (PyTorch's fast_mode, JAX's check_grads).
    Returns True, or raises GradcheckError saying what is wrong: a backward that
    fails (a rule returning a gradient of the wrong shape or dtype), an input that
    got no gradient although the output depends on it, or the worst mismatch (which
    input, which element, both values, the tolerance).
    """
    inputs = list(inputs)
    wrt = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    for i in wrt:
        if inputs[i].dtype != float64:
            raise TypeError(f"gradcheck: input {i} is {inputs[i].dtype}; finite differences "
                            "need float64")
    out = fn(*inputs)
    v = np.random.default_rng(seed).standard_normal(out.shape)

    def f():
        with no_grad():
            return float(np.sum(fn(*inputs).data * v))

    analytic = _analytic_gradients(out, v, inputs, wrt)
    if fast_mode:
        return _check_directions(f, inputs, wrt, analytic, eps, atol, rtol, seed)
    for i in wrt:
        x = inputs[i]
        numeric = np.zeros(x.shape)
        for idx in np.ndindex(*x.shape):
            old = x.data[idx]
            x.data[idx] = old + eps
            plus = f()
            x.data[idx] = old - eps
            minus = f()
            x.data[idx] = old
            numeric[idx] = (plus - minus) / (2 * eps)
        a = analytic[i]
        tolerance = atol + rtol * np.abs(numeric)
        if a is None:
            if np.any(np.abs(numeric) > tolerance):
                worst = tuple(int(w) for w in np.unravel_index(np.argmax(np.abs(numeric)), x.shape))
                raise GradcheckError(
                    f"gradcheck: input {i} (shape {tuple(x.shape)}) got no gradient (None), but "
                    f"the output depends on it: numeric {numeric[worst]:.8g} at element {worst}; "
                    "does a backward rule return None for it?")
            continue
        err = np.abs(a - numeric) - tolerance
        if err.size and err.max() > 0:
            worst = np.unravel_index(np.argmax(err), x.shape)
            raise GradcheckError(f"gradcheck: input {i} (shape {tuple(x.shape)}) element "
                                 f"{tuple(int(w) for w in worst)}: analytic {a[worst]:.8g} vs "
                                 f"numeric {numeric[worst]:.8g} (allowed: atol + rtol * |numeric| "
                                 f"= {tolerance[worst]:.3g})")
    return True


def _analytic_gradients(out, v, inputs, wrt):
    """d sum(out * v) / d input for each input in wrt (None where none arrived), leaving
    the inputs' own .grad as they were; a failing backward becomes a GradcheckError."""
    kept = {i: inputs[i].grad for i in wrt}
    try:
        for i in wrt:
            inputs[i].grad = None
        try:
            out.backward(v.astype(out.dtype))
        except RuntimeError as e:
            raise GradcheckError(f"gradcheck: backward failed: {e}") from None
        return {i: inputs[i].grad for i in wrt}
    finally:
        for i in wrt:
            inputs[i].grad = kept[i]


def _check_directions(f, inputs, wrt, analytic, eps, atol, rtol, seed):
    """gradcheck's fast_mode: 3 random directions instead of every element."""
    rng = np.random.default_rng(seed + 1)
    for k in range(3):
        u = {i: rng.standard_normal(inputs[i].shape) for i in wrt}
        predicted = builtins.sum(float(np.sum(analytic[i] * u[i])) for i in wrt
                                 if analytic[i] is not None)
        olds = {i: inputs[i].data.copy() for i in wrt}
        try:
            for i in wrt:
                inputs[i].data[...] = olds[i] + eps * u[i]
            plus = f()
            for i in wrt:
                inputs[i].data[...] = olds[i] - eps * u[i]
            minus = f()
        finally:
            for i in wrt:
                inputs[i].data[...] = olds[i]
        numeric = (plus - minus) / (2 * eps)
        tolerance = atol + rtol * builtins.abs(numeric)
        if builtins.abs(predicted - numeric) > tolerance:
            raise GradcheckError(f"gradcheck (fast_mode): along random direction {k}, the "
                                 f"analytic directional derivative <grad, u> = {predicted:.8g} vs "
                                 f"numeric {numeric:.8g} (allowed: {tolerance:.3g}); run without "
                                 "fast_mode to find the element")
    return True


# ---------------------------------------------------------------------------
# 13. Seeing the graph: draw_graph and grad_path; profile and detect_anomaly
# ---------------------------------------------------------------------------
def _param_names(names):
    """id -> name, from a Module (anything with named_parameters()) or a dict name -> tensor."""
    if names is None:
        return {}
    items = names.named_parameters() if hasattr(names, 'named_parameters') else names.items()
    return {id(t): n for n, t in items}


def _op_label(node):
    """The op's name as the graph shows it: add_ (in place) for an in-place op."""
    return f'{node._op} (in place)' if node._op.endswith('_') else node._op


def _check_intact(root):
    if root._backward is _freed_graph:
        raise RuntimeError("the graph behind this tensor was freed by backward(); call "
                           "backward(retain_graph=True) first, or look before backward()")


def _shape(shape):
    """(12, 64) or (128,): a shape written as Python writes a tuple."""
    return str(tuple(int(n) for n in shape))


def draw_graph(tensor, path=None, names=None, max_nodes=150):
    """The computation graph behind `tensor` as Graphviz DOT text.

    Each box is an op (name, output shape, dtype); leaves are ellipses, parameters
    filled and named when `names` (a Module, or a dict name -> tensor) is given.
    Arrows point the way data flows; gradients flow back against them. At most
    max_nodes nodes are drawn, nearest the output first, with a note of how many
    were left out. With path ending in .svg, .png or .pdf the graph is rendered with
    Graphviz's `dot` when it is installed; .dot, .gv or .txt get the DOT text; any other
    extension is refused with the list.
    """
    _check_intact(tensor)
    from collections import deque
    label = _param_names(names)
    seen, order, queue = {id(tensor)}, [], deque([tensor])
    while queue:  # breadth first from the output: every node, inputs and constants included
        node = queue.popleft()
        order.append(node)
        for p in _inputs(node):
            if id(p) not in seen:
                seen.add(id(p))
                queue.append(p)
    hidden = len(order) - max_nodes
    order = order[:max_nodes]  # the nodes nearest the output
    ids = {id(node): f'n{i}' for i, node in enumerate(order)}
    lines = ['digraph tinytorch {', '  rankdir=BT;',
             '  node [shape=box, fontname="Helvetica", fontsize=10];']
    for node in order:
        text = f'{_shape(node.shape)} {node.dtype}'
        if node._parents:
            attrs = f'label="{_op_label(node)}\\n{text}"'
        elif id(node) in label:
            attrs = (f'label="{label[id(node)]}\\n{text}", shape=ellipse, style=filled, '
                     'fillcolor="#cfe2ff"')
        else:
            kind = 'leaf (requires grad)' if node.requires_grad else 'input'
            attrs = f'label="{kind}\\n{text}", shape=ellipse'
        lines.append(f'  {ids[id(node)]} [{attrs}];')
    for node in order:
        for p in _inputs(node):
            if id(p) in ids:
                lines.append(f'  {ids[id(p)]} -> {ids[id(node)]};')
    if hidden > 0:
        lines.append(f'  note [shape=note, label="{hidden} more nodes not drawn '
                     f'(max_nodes={max_nodes})"];')
    lines.append('}')
    dot = '\n'.join(lines) + '\n'
    if path is not None:
        _write_graph(dot, path)
    return dot


_RENDERED = ('svg', 'png', 'pdf')  # drawn by Graphviz's dot
_DOT_TEXT = ('dot', 'gv', 'txt')  # the DOT text itself


def _write_graph(dot, path):
    import os
    import shutil
    import subprocess
    fmt = os.path.splitext(path)[1].lstrip('.').lower()
    if fmt not in _RENDERED + _DOT_TEXT:
        raise ValueError(f"draw_graph: can't write {os.path.basename(path)!r}: give a path ending "
                         f"in {', '.join('.' + f for f in _RENDERED)} (drawn with Graphviz) or "
                         f"{', '.join('.' + f for f in _DOT_TEXT)} (the DOT text)")
    if fmt in _DOT_TEXT:
        with open(path, 'w') as f:
            f.write(dot)
        return
    if shutil.which('dot') is None:
        dot_path = os.path.splitext(path)[0] + '.dot'
        with open(dot_path, 'w') as f:
            f.write(dot)
        print(f"draw_graph: Graphviz's `dot` is not installed, so {path} was not drawn; the DOT "
              f"text is in {dot_path}. Install Graphviz (apt-get install graphviz, brew install "
              f"graphviz) and run: dot -T{fmt} {dot_path} -o {path}")
        return
    subprocess.run(['dot', f'-T{fmt}', '-o', path], input=dot.encode(), check=True)


# What each op's backward rule does to the gradient, in words, for grad_path. Each file
# fills in its own ops (nn.py adds linear, layer_norm, ...; transformer.py its fused
# attention). A value is one text, or a tuple with one text per input; {g} and {x} stand
# for the shapes of the gradient at the op's output and of the input, {rows} for the
# number of rows (all dims of the output but the last).
RULES_IN_WORDS = {
    'add': "d(a+b) = 1: passed on unchanged",
    'sub': ("d(a-b): passed on unchanged", "d(a-b)/db = -1: negated"),
    'mul': "d(a*b)/da = b: multiplied by the other factor",
    'div': ("d(a/b)/da = 1/b: divided by b", "d(a/b)/db = -a/b^2"),
    'matmul': ("d(A@B)/dA: g @ B^T", "d(A@B)/dB: A^T @ g"),
    'softmax': "softmax backward: p * (g - sum(p * g))",
    'log_softmax': "log_softmax backward: g - softmax * sum(g)",
    'exp': "times exp(x)", 'log': "divided by x", 'sqrt': "divided by 2 sqrt(x)",
    'tanh': "times 1 - tanh(x)^2", 'sigmoid': "times sigma(x) (1 - sigma(x))",
    'relu': "kept where x > 0, zero elsewhere", 'gelu': "times GELU'(x) = Phi(x) + x phi(x)",
    'abs': "times sign(x)", 'sin': "times cos(x)", 'cos': "times -sin(x)",
    'erf': "times 2/sqrt(pi) exp(-x^2)", 'pow': "times p x^(p-1)", 'neg': "negated",
    'log1p': "divided by 1 + x", 'expm1': "times exp(x)",
    'silu': "times sigma(x) (1 + x (1 - sigma(x)))",
    'leaky_relu': "times 1 where x > 0, else the slope",
    'softplus': "times sigma(beta x)",
    'clamp': "kept where min <= x <= max", 'masked_fill': "zeroed where the mask is true",
    'sum': "broadcast back over the summed dims {g} -> {x}",
    'mean': "broadcast back {g} -> {x} and divided by the count",
    'var': "times 2 (x - mean) / (N - correction)",
    'std': "times (x - mean) / ((N - correction) std)",
    'norm': "times sign(x) |x|^(p-1) / norm^(p-1)", 'prod': "times the product of the others",
    'cumsum': "reversed running sums", 'sort': "back to the positions the values came from",
    'topk': "back to the positions the values came from",
    'reshape': "reshaped back {g} -> {x}",
    'permute': "axes permuted back", 'transpose': "the two axes swapped back",
    'unsqueeze': "the added dim removed", 'squeeze': "the removed dim put back",
    'expand': "summed over the expanded dims {g} -> {x}",
    'index': "placed into a zero tensor of shape {x} (repeated indices added)",
    'fill': ("zero: the old values were overwritten", "summed: every element is the value"),
    'copy': ("zero: the old values were overwritten", "passed on (summed where broadcast)"),
    '__setitem__': ("zeroed where x[i] = v wrote", "the written positions' gradient, g[i]"),
    'CopySlices': ("zeroed in the view's region", "the view's region of g"),
    'unfold': "folded back: each patch's gradient added where the patch came from",
    'gather': "added back at the gathered positions of a zero tensor {x}",
    'index_select': "added back at the selected slices of a zero tensor {x}",
    'scatter': ("kept where not overwritten", "the gradient at the places written to"),
    'scatter_add': ("passed on unchanged", "the gradient at the places added to"),
    'flip': "flipped back", 'roll': "rolled back", 'repeat': "summed over the copies {g} -> {x}",
    'cat': "its own slice of the gradient", 'stack': "its own slice of the gradient",
    'tril': "lower triangle kept", 'triu': "upper triangle kept",
    'amax': "to the position(s) of the max, ties sharing",
    'amin': "to the position(s) of the min, ties sharing",
    'max': "to the index of the max", 'min': "to the index of the min",
    'logsumexp': "times softmax(x)", 'where': "kept where the condition picked this input",
    'clone': "passed on unchanged", 'to': "cast back to the input's dtype",
}
_BROADCASTING = ('add', 'sub', 'mul', 'div', 'where', 'maximum', 'minimum', 'pow')


def _rule_in_words(node, i, g_out, g_in):
    """What node's backward rule does to the gradient on its way to input i."""
    op, x = node._op, _inputs(node)[i]
    if op.endswith('_') and op[:-1] in RULES_IN_WORDS:  # add_ (in place) has add's rule
        op = op[:-1]
    words = RULES_IN_WORDS.get(op, f"backward of {op}")
    if isinstance(words, tuple):
        words = words[i]
    words = words.format(g=_shape(g_out.shape), x=_shape(x.shape),
                         rows=math.prod(g_out.shape[:-1]))
    other = _inputs(node)[1 - i] if len(node._parents) == 2 else None
    if op == 'mul' and other is not None and other.data.size == 1:
        words = f"d(a*b)/da = b: multiplied by {float(other.data.reshape(-1)[0]):.4g}"
    if tuple(g_out.shape) != tuple(x.shape) and op in _BROADCASTING:
        words += f"; summed over the broadcast dims {_shape(g_out.shape)} -> {_shape(x.shape)}"
    return words


def grad_path(loss, param, names=None, max_paths=6, file=None):
    """Print how the gradient travels from `loss` back to `param`, op by op.

    For each step: the op, the shapes in and out, its backward rule in words and
    the norm of the gradient there. When `param` is reached along several paths,
    each path's own contribution is shown, and their sum, which is param's gradient
    (the multivariable chain rule adds them). With more than max_paths paths, the
    ops they pass through are listed once each instead, from the loss down.
    The graph must be intact: call it before loss.backward(), or after
    loss.backward(retain_graph=True). Returns the text it printed.
    """
    import sys
    _check_intact(loss)
    label = _param_names(names)
    pname = label.get(id(param), 'the parameter')
    order = _topological_order(loss)
    if not any(n is param for n in order):
        raise ValueError(f"grad_path: {pname} does not affect this loss (no path reaches it)")
    # which nodes lie on a path to param, and how many paths leave each of them
    paths = {id(param): 1}
    for node in order:
        n = builtins.sum(paths.get(id(p), 0) for p in _inputs(node))
        if n and node is not param:
            paths[id(node)] = n
    seed = np.ones_like(loss.data)
    out = [f"gradient of the loss {_shape(loss.shape)} with respect to {pname} {_shape(param.shape)}",
           "each step: op, gradient shape at its output -> at its input [that input], "
           "|grad| there, and the backward rule"]

    def step_line(node, i, g, pg):
        x = _inputs(node)[i]
        src = label.get(id(x), 'x' if not x._parents else _op_label(x))
        return (f"  {_op_label(node):<14} {_shape(g.shape)} -> {_shape(x.shape)} [{src}]  |grad| "
                f"{np.linalg.norm(g):.4g} -> {np.linalg.norm(pg):.4g}:  "
                f"{_rule_in_words(node, i, g, pg)}")

    if paths[id(loss)] <= max_paths:
        # walk each path on its own, sending the gradient along that path's edges only
        total = np.zeros(param.shape)
        todo = [(loss, seed, [])]
        found = []
        while todo:
            node, g, lines = todo.pop()
            if node is param:
                found.append((lines, g))
                continue
            grads = node._backward(g)
            for i, p in reversed(list(enumerate(_inputs(node)))):
                if id(p) in paths and grads[i] is not None:
                    todo.append((p, grads[i], lines + [step_line(node, i, g, grads[i])]))
        for k, (lines, g) in enumerate(found, 1):
            out.append(f"path {k} of {len(found)}:")
            out.extend(lines)
            out.append(f"  = contribution {np.linalg.norm(g):.4g}")
            total = total + g
        if len(found) > 1:
            out.append(f"the {len(found)} contributions are added (chain rule): "
                       f"|grad of {pname}| = {np.linalg.norm(total):.4g}")
        else:
            out.append(f"|grad of {pname}| = {np.linalg.norm(total):.4g}")
    else:
        # too many paths to list: run backward once and list each op on some path
        out.append(f"{paths[id(loss)]} paths reach it (more than max_paths={max_paths}); the "
                   "ops they pass through, from the loss down (where a tensor feeds several ops, "
                   "the gradients coming back from them are added):")
        grads = {id(loss): seed}
        total = None
        for node in reversed(order):
            g = grads.pop(id(node), None)
            if g is None or id(node) not in paths:
                continue
            if node is param:
                total = g
                continue
            for i, (p, pg) in enumerate(zip(_inputs(node), node._backward(g))):
                if pg is None or id(p) not in paths:
                    continue
                out.append(step_line(node, i, g, pg))
                grads[id(p)] = grads[id(p)] + pg if id(p) in grads else pg
        out.append(f"all contributions added: |grad of {pname}| = {np.linalg.norm(total):.4g}")
    text = '\n'.join(out)
    print(text, file=file or sys.stdout)
    return text


# -- Looking inside a run: profile and detect_anomaly -----------------------------
# Both watch every op (from_op calls their .op) and every backward rule (backward calls
# _watched_rule); when neither is on, that costs one check of the list _hooks per op.
def _watched_rule(node, g):
    """Run node's backward rule for the hooks that watch: they see it start and end."""
    for hook in _hooks:
        hook.rule_start(node)
    grads = node._backward(g)
    for hook in _hooks:
        hook.rule_end(node, grads)
    return grads


class _Hook:
    """Turned on by `with`, off at the end of the block, even after an error."""

    def __enter__(self):
        _hooks.append(self)
        return self

    def __exit__(self, *exc):
        _hooks.remove(self)

    def op(self, out, op, parents):
        pass

    def rule_start(self, node):
        pass

    def rule_end(self, node, grads):
        pass

    def renamed(self, node, op):  # an in-place op's twin (add) became add_
        pass


# FLOPs of an op from its output and inputs, forward pass; backward does one such
# product per input that gets a gradient (dA = g B^T and dB = A^T g for a matmul).
# nn.py and transformer.py add their ops (linear, conv2d, causal_attention).
def _matmul_flops(out, parents):
    a = parents[0]
    return 2 * out.data.size * (a.shape[-1] if a.ndim else 1)  # multiply and add per k


FLOPS = {'matmul': _matmul_flops}
BACKWARD_FLOPS_FACTOR = {}  # backward FLOPs / forward FLOPs where it is not the count above


def _kept_bytes(node, seen):
    """Bytes an op keeps alive for backward: its output, if it is in the graph, and the
    arrays its rule captured (masks, probabilities, copies). A memory block is counted
    once, for the first op that holds it (`seen`: the blocks counted so far, by id)."""
    blocks = {}
    # a view's memory is its base's, counted there
    arrays = [node.data] if node.requires_grad and node._view is None else []
    for cell in getattr(node._backward, '__closure__', None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, np.ndarray):
            arrays.append(v)
    for a in arrays:
        base = a if a.base is None else a.base
        counted = seen.get(id(base))
        if isinstance(base, np.ndarray) and (counted is None or counted() is not base):
            blocks[id(base)] = base
    seen.update((i, weakref.ref(b)) for i, b in blocks.items())  # weak: a freed block's id
    return builtins.sum(b.nbytes for b in blocks.values())  # may be reused by a new one


class profile(_Hook):
    """Where the time, the FLOPs and the memory of a block go, per op:

        with tt.profile() as prof:
            loss = model(x, y)[1]; loss.backward(); optimizer.step()
        print(prof)

    An op's forward time runs from the end of the previous event (op, rule, or a
    record_function block such as the optimizer's step) to the end of this op, so it
    includes the Python that prepared it; each backward rule is timed on its own. The
    row "(outside ops)" is the rest of the block, so the rows add up to prof.total_ms,
    the wall time of the block. "kept" is what each op holds for backward (its output
    and the arrays its rule captured); prof.peak_kept_bytes is the most held at once.
    """

    def __init__(self):
        self.rows = {}  # op -> {'calls', 'forward_ms', 'backward_ms', 'flops', 'out_bytes', 'kept_bytes'}
        self.total_ms = 0.0
        self.kept, self.peak_kept_bytes, self.peak_by_op = 0, 0, {}
        self._held = {}  # id(rule) -> (op, bytes) still held for backward
        self._seen = {}  # id -> weak reference of each memory block counted so far
        self._last_op = None

    def _row(self, op):
        if op not in self.rows:
            self.rows[op] = dict(calls=0, forward_ms=0.0, backward_ms=0.0, flops=0,
                                 out_bytes=0, kept_bytes=0)
        return self.rows[op]

    def __enter__(self):
        self._start = self._last = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.total_ms = (time.perf_counter() - self._start) * 1000

    def op(self, out, op, parents):
        now = time.perf_counter()
        row = self._row(op)
        this = dict(calls=1, forward_ms=(now - self._last) * 1000, out_bytes=out.data.nbytes,
                    flops=FLOPS[op](out, parents) if op in FLOPS else 0, kept_bytes=0)
        if out.requires_grad:
            this['kept_bytes'] = kept = _kept_bytes(out, self._seen)
            self._held[id(out._backward)] = (op, kept)  # the rule moves with the history
            self.kept += kept
            if self.kept > self.peak_kept_bytes:
                self.peak_kept_bytes = self.kept
                self.peak_by_op = self._by_op()
        for key, value in this.items():
            row[key] += value
        self._last_op = (op, this)  # an in-place op renames it (renamed, above)
        self._last = time.perf_counter()  # the bookkeeping above is not the next op's time

    def renamed(self, node, op):
        """The op just counted as node._op is the in-place op (add as add_): move it."""
        last, old = self._last_op, node._op
        if last is None or last[0] != old:
            return
        src, row = self.rows[old], self._row(op)
        for key, value in last[1].items():
            src[key] -= value
            row[key] += value
        if not src['calls']:
            del self.rows[old]
        key = id(node._backward)
        if key in self._held:
            self._held[key] = (op, self._held[key][1])
        self._last_op = None

    def _by_op(self):
        by_op = {}
        for op, kept in self._held.values():
            by_op[op] = by_op.get(op, 0) + kept
        return by_op

    def rule_start(self, node):
        self._rule_start = time.perf_counter()

    def rule_end(self, node, grads):
        now = time.perf_counter()
        row = self._row(node._op)
        row['backward_ms'] += (now - self._rule_start) * 1000
        if node._op in FLOPS:
            n = BACKWARD_FLOPS_FACTOR.get(node._op) or builtins.sum(
                1 for p, pg in zip(node._parents, grads) if pg is not None and p.ndim >= 2)
            row['flops'] += n * FLOPS[node._op](node, node._parents)  # bias gradients: sums
        op_kept = self._held.pop(id(node._backward), None)
        if op_kept is not None:  # backward is done with it: freed
            self.kept -= op_kept[1]
        self._last = now

    def region(self, name, ms):
        row = self._row(name)
        row['calls'] += 1
        row['forward_ms'] += ms
        self._last = time.perf_counter()

    @property
    def outside_ms(self):
        return self.total_ms - builtins.sum(r['forward_ms'] + r['backward_ms']
                                            for r in self.rows.values())

    @property
    def flops(self):
        return builtins.sum(r['flops'] for r in self.rows.values())

    def table(self):
        ms = lambda r: r['forward_ms'] + r['backward_ms']  # noqa: E731
        lines = [f"{'op':<20} {'calls':>6} {'fwd ms':>8} {'bwd ms':>8} {'total ms':>9} "
                 f"{'share':>6} {'GFLOP':>7} {'out MB':>7} {'kept MB':>8}"]
        total = self.total_ms or 1.0
        for op, r in sorted(self.rows.items(), key=lambda kv: -ms(kv[1])):
            lines.append(f"{op:<20} {r['calls']:>6} {r['forward_ms']:>8.2f} "
                         f"{r['backward_ms']:>8.2f} {ms(r):>9.2f} {ms(r) / total:>6.1%} "
                         f"{r['flops'] / 1e9:>7.3f} {r['out_bytes'] / 1e6:>7.2f} "
                         f"{r['kept_bytes'] / 1e6:>8.2f}")
        lines.append(f"{'(outside ops)':<20} {'':>6} {'':>8} {'':>8} {self.outside_ms:>9.2f} "
                     f"{self.outside_ms / total:>6.1%}")
        lines.append(f"{'total':<20} {'':>6} {'':>8} {'':>8} {self.total_ms:>9.2f} {1:>6.0%} "
                     f"{self.flops / 1e9:>7.3f}")
        rate = self.flops / (self.total_ms / 1000) / 1e9 if self.total_ms else 0.0
        top = sorted(self.peak_by_op.items(), key=lambda kv: -kv[1])[:4]
        held = ', '.join(f"{op} {b / 1e6:.1f} MB" for op, b in top)
        lines.append(f"{self.flops / 1e9:.3f} GFLOP in {self.total_ms:.1f} ms: {rate:.1f} GFLOP/s; "
                     f"peak held for backward {self.peak_kept_bytes / 1e6:.1f} MB"
                     + (f" ({held})" if held else ""))
        return '\n'.join(lines)

    __str__ = table


class record_function:
    """A named row in an active profile for a block that is not an op (the optimizer's
    step, data loading): `with tt.record_function('optimizer.step'): ...`. Free when no
    profile is on."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        for hook in _hooks:
            if isinstance(hook, profile):
                hook.region(self.name, (time.perf_counter() - self._start) * 1000)


class AnomalyError(RuntimeError):
    pass


_LIBRARY = ('tinytorch.py', 'nn.py', 'optim.py', 'transformer.py', 'data.py')


def _user_line():
    """Where an op was called: the innermost line outside tinytorch.py and nn.py (a
    model's forward), and, if that is in the library (transformer.py), the user's line
    that called it."""
    import traceback
    stack = list(reversed(traceback.extract_stack()))
    name = lambda f: os.path.basename(f.filename)  # noqa: E731
    text = lambda f: f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"  # noqa: E731
    model = next((f for f in stack if name(f) not in ('tinytorch.py', 'nn.py')), None)
    if model is None:
        return "(unknown)"
    if name(model) not in _LIBRARY:
        return text(model)
    user = next((f for f in stack if name(f) not in _LIBRARY), None)
    return text(model) + ("" if user is None else f", called from {text(user)}")


class detect_anomaly(_Hook):
    """Find where a NaN was born. Forward: the first op whose output holds a NaN raises,
    naming the op, its inputs' shapes and the line of your code that called it
    (infinities alone are allowed: masks use -inf). Backward: the first rule that returns
    a NaN or infinite gradient raises, naming the op, the input, and the line that made
    the op in the forward pass. Off by default; slow when on (it checks every array)."""

    def op(self, out, op, parents):
        where = _user_line()
        if out.requires_grad:
            out._made_at = where
        if out.data.dtype.kind == 'f' and np.isnan(out.data).any():
            shapes = ', '.join(str(tuple(p.shape)) for p in parents)
            raise AnomalyError(f"detect_anomaly: '{op}' returned NaN in its output "
                               f"{tuple(out.shape)} (inputs {shapes}), at {where}")

    def rule_end(self, node, grads):
        for i, (p, pg) in enumerate(zip(node._parents, grads)):
            if pg is not None and np.issubdtype(np.asarray(pg).dtype, np.floating) and \
                    not np.isfinite(pg).all():
                kind = 'NaN' if np.isnan(pg).any() else 'an infinite value'
                raise AnomalyError(
                    f"detect_anomaly: the backward rule of '{node._op}' returned {kind} in the "
                    f"gradient of its input {i} (shape {tuple(p.shape)}); the op was made at "
                    f"{getattr(node, '_made_at', '(before detect_anomaly was on)')}")


# ---------------------------------------------------------------------------
# 14. Speed
# ---------------------------------------------------------------------------
def tune_malloc():
    """Keep freed memory in the process instead of handing it back to the OS.

    A training step allocates and frees the same large arrays every time. glibc's
    malloc serves blocks over a (dynamic) threshold with mmap and returns them to
    the OS on free, and trims the top of the heap as soon as 128 KiB are free, so
    each step pays for fresh zeroed pages again (page faults cost as much as the
    arithmetic here). Raising both thresholds keeps those pages for reuse: about
    25% faster steps, while the peak memory stays the same. Called when tinytorch is
    imported on Linux; set TINYTORCH_TUNE_MALLOC=0 to leave the allocator alone.
    Returns True if the settings were applied.
    """
    import ctypes
    if os.environ.get('TINYTORCH_TUNE_MALLOC', '1') == '0' or not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL('libc.so.6')
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)  # glibc's maximum
                    and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 30))
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to do
        return False


malloc_tuned = tune_malloc()


def _threads_from_env():
    for var in ('TINYTORCH_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
        if os.environ.get(var, '').isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


_num_threads = _threads_from_env()
_pool, _pool_pid = None, None
PARALLEL_MIN_SIZE = 2 ** 17  # below this many elements a job stays on one thread (waking
# a thread costs 20-60 us here: GELU on 2^17 floats took 268 us on 2 threads, 232 on one)


def get_num_threads():
    return _num_threads


def set_num_threads(n):
    """How many threads tinytorch's own kernels (GELU, attention, ...) use, as
    torch.set_num_threads. BLAS (the matmuls) has its own setting: OPENBLAS_NUM_THREADS.
    The default comes from TINYTORCH_NUM_THREADS, OMP_NUM_THREADS or
    OPENBLAS_NUM_THREADS, else the number of cores. 1 turns the threads off."""
    global _num_threads, _pool
    if int(n) < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    if _pool is not None:
        _pool.shutdown()
        _pool = None
    _num_threads = int(n)


def parallel_for(fn, n, size, threads=None):
    """Call fn(lo, hi) on [0, n) cut into get_num_threads() contiguous ranges, all at
    once; fn must write its results into arrays it was given, range by range.

    Why threads help in Python: every NumPy ufunc and matmul lets go of the GIL while
    it computes, so two threads working on different rows of the same arrays really
    run side by side. BLAS spreads a big matmul over the cores by itself, but the
    small per-head matmuls of attention and every elementwise op (GELU) run on one
    core; here they get all of them. size (the elements involved) keeps small jobs,
    where starting threads would cost more than it saves, on this thread; threads
    (at most get_num_threads()) lets a caller ask for fewer.
    """
    global _pool, _pool_pid
    k = builtins.min(_num_threads, n, threads or _num_threads)
    if k < 2 or size < PARALLEL_MIN_SIZE or threading.current_thread().name.startswith(
            'tinytorch'):  # a job started on one of the pool's threads stays on it: the
        fn(0, n)  # pool could otherwise end up waiting on itself
        return
    if _pool is None or _pool_pid != os.getpid():  # a forked child has none of its threads
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(_num_threads - 1, thread_name_prefix='tinytorch')
        _pool_pid = os.getpid()
    bounds = [n * i // k for i in range(k + 1)]
    futures = [_pool.submit(fn, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        fn(bounds[0], bounds[1])  # this thread takes the first range
    finally:
        for f in futures:
            f.result()  # waits, and re-raises an error from a worker


_ones_cache = {}


def _ones(n, like):
    """A cached vector of n ones of like's dtype and array type (NumPy, or CuPy, ...)."""
    key = (n, like.dtype, type(like))
    if key not in _ones_cache:
        _ones_cache[key] = np.ones_like(like, shape=(n,))
    return _ones_cache[key]


def sum_last(a):
    """a.sum(axis=-1, keepdims=True), computed as a matrix-vector product with a vector
    of ones: BLAS does that 3-5x faster than NumPy's reduction for rows of 32-512
    floats (it runs on all cores). Used inside the fused ops (layer norm, attention)."""
    return np.matmul(a, _ones(a.shape[-1], a))[..., None]


def sum_second_last(a):
    """a.sum(axis=-2, keepdims=True) (a sum down each column of each matrix), as
    ones @ a."""
    return np.matmul(_ones(a.shape[-2], a), a)[..., None, :]


def sum_leading(a):
    """Sum over every axis but the last (a bias gradient: one sum per feature), as
    ones @ a on a viewed as (rows, features)."""
    a2 = a.reshape(-1, a.shape[-1])
    return np.matmul(_ones(a2.shape[0], a), a2)


# erf(x) by W. J. Cody's rational Chebyshev approximations (Math. Comp. 23, 1969),
# accurate to double precision: one rational function for |x| <= 0.5, and two for
# erfc(|x|) * exp(x^2) on (0.5, 4] and (4, inf). NumPy has no erf of its own.
_ERF_A = (3.16112374387056560e0, 1.13864154151050156e2, 3.77485237685302021e2,
          3.20937758913846947e3, 1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e1, 2.44024637934444173e2, 1.28261652607737228e3,
          2.84423683343917062e3)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e0, 6.61191906371416295e1,
          2.98635138197400131e2, 8.81952221241769090e2, 1.71204761263407058e3,
          2.05107837782607147e3, 1.23033935479799725e3, 2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e1, 1.17693950891312499e2, 5.37181101862009858e2,
          1.62138957456669019e3, 3.29079923573345963e3, 4.36261909014324716e3,
          3.43936767414372164e3, 1.23033935480374942e3)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e0, 1.87295284992346047e0, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)


def _erf_np(x):
    """Vectorised erf of an array, accurate to double precision, in x's dtype."""
    ax = np.abs(x).astype(np.float64)
    out = np.empty_like(ax)
    small, mid, big = ax <= 0.5, (ax > 0.5) & (ax <= 4.0), ax > 4.0
    if small.any():  # erf(y) = y * A(y^2) / B(y^2)
        y = ax[small]
        z = y * y
        num, den = _ERF_A[4] * z, z
        for i in range(3):
            num, den = (num + _ERF_A[i]) * z, (den + _ERF_B[i]) * z
        out[small] = y * (num + _ERF_A[3]) / (den + _ERF_B[3])
    if mid.any():  # erfc(y) = exp(-y^2) * C(y) / D(y)
        y = ax[mid]
        num, den = _ERF_C[8] * y, y
        for i in range(7):
            num, den = (num + _ERF_C[i]) * y, (den + _ERF_D[i]) * y
        out[mid] = 1.0 - np.exp(-y * y) * (num + _ERF_C[7]) / (den + _ERF_D[7])
    if big.any():  # erfc(y) = exp(-y^2) / y * (1/sqrt(pi) - P(1/y^2) / (y^2 Q(1/y^2)))
        y = ax[big]
        z = 1.0 / (y * y)
        num, den = _ERF_P[5] * z, z
        for i in range(4):
            num, den = (num + _ERF_P[i]) * z, (den + _ERF_Q[i]) * z
        r = z * (num + _ERF_P[4]) / (den + _ERF_Q[4])
        out[big] = 1.0 - np.exp(-y * y) * (1.0 / math.sqrt(math.pi) - r) / y
    return np.copysign(out, x).astype(x.dtype, copy=False)


# Abramowitz & Stegun 26.2.17 (Zelen & Severo) for the normal tail:
# Phi(-|x|) = phi(x) t (b1 + b2 t + ... + b5 t^4), t = 1 / (1 + p |x|), error < 7.5e-8.
_ZS_P = 0.2316419
_ZS_B = (0.319381530, -0.356563782, 1.781477937, -1.821255978, 1.330274429)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gelu_float32(x):
    """GELU of a float32 array and its derivative Phi(x) + x phi(x), the arrays gelu's plain
    code computes, cut into one piece per thread (flat views: contiguous pieces)."""
    out, dgelu = np.empty_like(x, order='C'), np.empty_like(x, order='C')
    xf, of, df = (a.reshape(-1) for a in (x, out, dgelu))  # xf: a copy if x is strided
    parallel_for(lambda lo, hi: _gelu_float32(xf[lo:hi], of[lo:hi], df[lo:hi]), x.size, x.size)
    return out, dgelu


def _gelu_float32(x, out, dgelu):
    """GELU of a float32 array into out, and its derivative Phi(x) + x phi(x) into
    dgelu (all the backward rule needs), cheaply and without cancellation.

    phi(x) = exp(-x^2/2) / sqrt(2 pi) is the normal density and h = Phi(-|x|) the tail
    from A&S 26.2.17 (above), absolute error < 7.5e-8, below float32's resolution
    near 1. Then Phi(x) = h for x < 0 and 1 - h for x >= 0, i.e. |step(x) - h|.
    Every step writes into an array it was given.
    """
    t = np.abs(x, out=dgelu)  # dgelu holds t until t is no longer needed
    t += np.float32(1 / _ZS_P)
    np.divide(np.float32(1 / _ZS_P), t, out=t)  # t = 1 / (1 + p |x|) = (1/p) / (1/p + |x|)
    h = np.multiply(t, np.float32(_ZS_B[4]), out=out)
    for b in _ZS_B[3::-1]:
        h += np.float32(b)
        h *= t  # Horner: t (b1 + t (b2 + ...))
    phi = np.square(x, out=dgelu)
    phi *= np.float32(-0.5)
    phi -= np.float32(_LOG_SQRT_2PI)
    np.exp(phi, out=phi)  # phi(x) = exp(-x^2/2 - log sqrt(2 pi))
    h *= phi  # h = Phi(-|x|)
    h -= np.greater_equal(x, 0)  # h - step(x), step(x) = 1 where x >= 0
    cdf = np.abs(h, out=h)  # Phi(x) = |step(x) - h|
    phi *= x
    phi += cdf  # dgelu = Phi(x) + x phi(x)
    np.multiply(cdf, x, out=out)  # GELU(x) = x Phi(x)


def _scatter_add_rows(shape, idx, g):
    """Backward of x[idx] for an integer array idx (an embedding lookup, a gather):
    row r of the gradient is the sum of g's rows whose index is r. Sorting puts equal
    indices next to each other, so np.add.reduceat sums each group in one pass (the
    same result as np.add.at(gx, idx, g), several times faster)."""
    flat = idx.reshape(-1)
    flat = np.where(flat < 0, flat + shape[0], flat)
    gx = np.zeros_like(g, shape=shape)
    if flat.size == 0:
        return gx
    rows = g.reshape((flat.size,) + tuple(shape[1:]))
    order = np.argsort(flat, kind='stable')
    sorted_idx = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_idx[1:] != sorted_idx[:-1])))
    gx[sorted_idx[starts]] = np.add.reduceat(rows[order], starts, axis=0)
    return gx


def shared_matrix_grad(A, G):
    """matmul's dB = sum over the batch of A^T G, for a matrix B (a weight) that every
    batch item shared: the batch folded into the rows makes it one 2-D product, with
    the sum inside BLAS, instead of a batched product and then a sum."""
    return np.matmul(A.reshape(-1, A.shape[-1]).T, G.reshape(-1, G.shape[-1]))


def unshared(a):
    """True when nothing but backward's own variable holds gradient array a (and a is not
    a view of another array): backward then stores a as a leaf's .grad instead of a copy,
    as PyTorch's AccumulateGrad does. The references counted: backward's variable g,
    _accumulate's argument, this function's argument and getrefcount's own."""
    return sys.getrefcount(a) <= _UNSHARED_REFS and a.base is None


def _count_refs(a):
    return sys.getrefcount(a)


def _refs_through_two_calls():
    """What unshared() counts for an array only backward holds: 4 on CPython 3.11 and
    later, 6 on 3.9 and 3.10 (whose calls hold their arguments twice). Measured once,
    through the same two calls as backward -> _accumulate -> unshared."""
    def accumulate(g):  # as _accumulate, passing its argument on
        return _count_refs(g)
    g = np.ones(1)
    return accumulate(g)


_UNSHARED_REFS = _refs_through_two_calls()
