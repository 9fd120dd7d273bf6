"""tinytorch: a Tensor with reverse-mode automatic differentiation, on NumPy.

Read this file top to bottom. Part I is the engine as it runs: the Tensor, how an op
enters the graph (from_op) and the first op, add, come first; then mul, matmul, sum, exp,
log and relu, each with its backward rule; then backward. A reader who stops at the line
"END OF PART I" (about line 1,450) has seen everything a gradient needs; every name Part I
uses is defined there once, in the form that runs, and it calls nothing below it (a test
runs the same programs on it alone and on the whole file).

Part I: the engine
  1. dtypes and grad mode            4. matmul
  2. the Tensor; from_op             5. sum and mean, exp and log, relu
  3. add, sub, mul, div, pow, neg;   6. backward: the graph walked in reverse
     unbroadcast; comparisons           topological order; no_grad
  Part I, continued: PyTorch's finer rules, which a first reading may skip. Each op above
     reaches them in one call whose name says what it does: type promotion, the layout of
     a result in memory, pow's special cases, making tensors, a tensor as a Python value,
     printing, devices, the version counter, the tools' hooks, autocast, the speed switch.
Part II: the rest, each section saying what it adds to Part I
  7. casts by name                  14. creation functions, the random generator
  8. indices, masks, conditions     15. gradcheck: finite differences
  9. elementwise functions          16. autograd.Function, autograd.grad, backward
 10. reductions                     17. record_function, for lookinside.py's tools
 11. shape and indexing; views      18. PyTorch's other forms (x.to(device), ...)
 12. unfold (im2col); softmax       19. saving and loading
 13. in-place ops                   20. speed (TINYTORCH_PLAIN=1 turns it all off)
 21. running PyTorch programs: compat.py, beside this file, gives PyTorch's module paths

How Tensor gets its methods: the class holds what every tensor is (its fields, grad,
shape, printing). Each op is a plain function, add(a, b), and the section that defines
it ends with one table, `_methods(add=add, __add__=add, ...)`, that makes it a method:
x.add(y) and x + y call add(x, y). The class and those tables are the whole list.

What importing does: nothing outside this module until a PyTorch-style import such as
`import tinytorch.nn` asks for a submodule. Importing adds one finder to sys.meta_path
that answers only for names under tinytorch (section 21); the first such import loads
compat.py, and tuning (section 20) starts only when tune() is called.

Every op is a forward line on NumPy arrays plus a backward rule: a function that
receives g = dLoss/dOut and returns dLoss/dInput for each input (the chain rule,
one op at a time). The rule's docstring is its math, one line per input; it is also
what grad_path prints. Inside ops, NumPy functions are applied to the arrays
(np.exp(x), np.matmul(a, b), np.add.at(...)) and tensor data is never converted
with np.asarray, so array libraries that implement NumPy's dispatch protocols
(__array_ufunc__, __array_function__: np.exp(a) calls a's own exp; CuPy's GPU arrays) run the same code.
"""
import builtins  # sum, max, min, abs, round, any and all are redefined below as tensor ops
import contextvars
import functools
import itertools
import math
import os
import sys
import threading
import time
import warnings
import weakref
from collections import namedtuple

import numpy as np


# ===========================================================================
# PART I: THE ENGINE
# ===========================================================================

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


_grad_enabled = True  # False inside `with no_grad():` (section 6): then no op builds a graph


# ---------------------------------------------------------------------------
# 2. The Tensor and how an op enters the graph
# ---------------------------------------------------------------------------
class Tensor:
    """An n-dimensional array (`.array`) that can remember how it was computed.

    A leaf is a tensor you created (`requires_grad=True` asks autograd to fill its
    `.grad`). Every op on tensors that require grad returns a non-leaf that keeps
    its inputs (`_parents`), its op name (`_op`) and a backward rule (`_backward`).

    The fields Part I uses: `array` (the NumPy array holding the values), `grad` (a
    Tensor or None; the array behind it is `grad.array`),
    `requires_grad`, `_parents` (the input tensors), `_backward` (the rule: gradient of
    the output -> gradients of the inputs), `_op` (a name, for repr and the graph),
    `_retains_grad` (x.retain_grad() asks backward to fill a non-leaf's .grad too) and
    `name` (optional, for draw_graph), `_saved` and `_vc` (the version counter,
    section 6b) and `_seq` and `_older` (the order ops ran, and what an in-place op
    rewrote: _inputs, section 6). A Part I reader can skip the others, explained later:
    `_view` and `_views` in section 11 (views), `_shared` in section 13 (in-place ops).
    """
    __slots__ = ('array', '_grad', 'requires_grad', '_parents', '_backward', '_op',
                 '_retains_grad', 'name', '_saved', '_vc', '_view', '_views', '_seq',
                 '_older', '_shared', '__weakref__')
    __array_ufunc__ = None  # numpy_array * tensor calls Tensor.__rmul__, not NumPy

    def __init__(self, data, dtype=None, requires_grad=False):
        if isinstance(data, Tensor):
            data = data.array
        arr = _dtype_of_python_data(data) if dtype is None else np.asarray(data, dtype=dtype)
        if arr is data:
            arr = np.copy(arr)  # like torch.tensor: never alias the caller's array (keeps layout)
        _init_result(self, arr)  # no graph yet
        if requires_grad:
            self.requires_grad_(True)

    @property
    def grad(self):  # d loss / d self after backward(): a Tensor of self's shape, or None
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None and not (isinstance(value, Tensor) and value.shape == self.shape):
            raise TypeError(f"assigned grad must be None or a Tensor of shape {tuple(self.shape)}, "
                            f"got a {type(value).__name__} of shape {tuple(np.shape(value))}")
        self._grad = value

    shape = property(lambda self: Size(self.array.shape))
    ndim = property(lambda self: self.array.ndim)
    dtype = property(lambda self: self.array.dtype)
    is_leaf = property(lambda self: self._backward is None)


    __hash__ = object.__hash__  # __eq__ is elementwise, so hash by identity

    def __repr__(self):  # as PyTorch prints it (section 6b: _tensor_text, _grad_fn_name)
        extra = [f'dtype=torch.{self.dtype}'] if self.dtype not in (default_dtype, int64, bool_) else []
        if self._backward is not None:
            extra.append(f'grad_fn=<{_grad_fn_name(self)}>')  # PyTorch's name for the node
        elif self.requires_grad:
            extra.append('requires_grad=True')
        return _tensor_text(self.array, extra)

    def requires_grad_(self, requires_grad=True):
        if requires_grad and self.array.dtype.kind not in 'fc':
            raise TypeError(f"only floating point tensors can require grad, got dtype "
                            f"{self.dtype} (integer tensors are indices, they have no gradient)")
        if not self.is_leaf:
            raise RuntimeError("requires_grad_() can only change a leaf tensor; use detach()")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self):
        """Ask backward to also store .grad on this non-leaf tensor."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        self._retains_grad = True
        return self


def _init_result(out, data, vc=None):
    """The fields of a new tensor, outside the graph. (_views, _older and _shared are set
    only by views and in-place ops, sections 11 and 13, and read with a default.)"""
    out.array = data
    out._grad = None
    out.requires_grad = False
    out._parents = ()
    out._backward = None
    out._op = None
    out._retains_grad = False
    out.name = None
    out._saved = ()  # the version counter (_guard_saved, section 6b)
    out._vc = [0] if vc is None else vc  # the version counter, shared with views
    out._view = None  # section 11
    out._seq = 0  # the order its op ran (from_op; _inputs, section 6)


def _methods(**fns):
    """Make functions Tensor's methods: _methods(add=add) makes x.add(y) add(x, y). Each
    section ends with one such line, listing what it adds to Tensor (each name once)."""
    for name, fn in fns.items():
        setattr(Tensor, name, fn)


_clock = itertools.count(1)  # numbers the graph's nodes in the order their ops ran
_hooks = []  # tools watching every op and rule (lookinside.py; _watch_op, section 6b): usually none


def from_op(data, op, parents, backward, saved=(), view_of=None, saves_output=False):
    """Wrap an op's result. If grad mode is on and any input requires grad, the
    result joins the graph: it keeps its inputs, the op name and the backward rule.

    `saved` lists the tensors whose values the backward rule reads (inputs, masks,
    indices), and `saves_output` says that it reads the result itself (exp, softmax):
    _guard_saved (section 6b) guards them against later in-place changes. `view_of`: the
    output is a view of that input's memory (section 11).
    """
    if type(data) is not np.ndarray:  # (an array, the usual result, needs neither check)
        if isinstance(data, np.generic):  # NumPy's full reductions return scalars: keep arrays
            data = np.asarray(data)
        elif isinstance(data, Tensor):  # (it would fail later, far from here)
            raise TypeError(f"from_op: {op}'s result must be a NumPy array, not a Tensor (use .array)")
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
            out._seq = next(_clock)  # the order ops ran (_inputs, section 6, reads it)
            if saved or saves_output:
                _guard_saved(out, saved, saves_output)
    if _hooks:
        _watch_op(out, op, parents)  # (section 6b)
    return out


def _constant(data, vc=None):
    """A tensor outside the graph around an array (no copy): constants, masks, indices.
    vc: the version counter of the tensor whose array this is a view of."""
    if isinstance(data, np.generic):  # NumPy's ops on 0-d arrays give (read-only) scalars
        data = np.asarray(data)
    out = Tensor.__new__(Tensor)
    _init_result(out, data, vc)
    return out


# ---------------------------------------------------------------------------
# 3. Arithmetic with broadcasting
# ---------------------------------------------------------------------------
# The first op. Each op below is a forward line on NumPy arrays and a backward rule, handed
# to from_op. In a two-input rule each input's gradient is computed only if that input
# requires grad, then summed back to the input's shape (unbroadcast, below). _scaled gives
# add both operands in one dtype, PyTorch's (section 6b), and _broadcast_op computes,
# naming both shapes if they do not broadcast.
def add(a, b, alpha=1):
    a, b = _scaled(a, b, alpha)  # a + alpha b

    # sa, sb: the shapes now (a later unsqueeze_, squeeze_ or t_ may reshape a or b in place)
    def backward(g, sa=a.array.shape, sb=b.array.shape):
        """d(a+b)/da = 1
        d(a+b)/db = 1"""
        return (unbroadcast(g, sa) if a.requires_grad else None,
                unbroadcast(g, sb) if b.requires_grad else None)
    return from_op(_broadcast_op('add', np.add, a, b), 'add', (a, b), backward)


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


def sub(a, b, alpha=1):
    _no_bool_subtraction(a, b)
    a, b = _scaled(a, b, alpha)  # a - alpha b

    def backward(g, sa=a.array.shape, sb=b.array.shape):
        """d(a-b)/da = 1
        d(a-b)/db = -1"""
        return (unbroadcast(g, sa) if a.requires_grad else None,
                unbroadcast(-g, sb) if b.requires_grad else None)
    return from_op(_broadcast_op('sub', np.subtract, a, b), 'sub', (a, b), backward)


def mul(a, b):
    a, b = _operands(a, b)

    def backward(g, sa=a.array.shape, sb=b.array.shape):
        """d(a*b)/da = b
        d(a*b)/db = a"""
        return (unbroadcast(g * b.array, sa) if a.requires_grad else None,
                unbroadcast(g * a.array, sb) if b.requires_grad else None)
    return from_op(_broadcast_op('mul', np.multiply, a, b), 'mul', (a, b), backward,
                   saved=_each_reads_the_other(a, b))


def div(a, b):
    a, b = _operands(a, b, floating=True)  # int / int is a float32 in PyTorch
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # 1/0 = inf, 0/0 = nan
        out = _broadcast_op('div', np.true_divide, a, b)  # silently, as PyTorch

    def backward(g, sa=a.array.shape, sb=b.array.shape):
        """d(a/b)/da = 1/b
        d(a/b)/db = -a/b^2"""
        return (unbroadcast(g / b.array, sa) if a.requires_grad else None,
                unbroadcast(-g * a.array / (b.array * b.array), sb) if b.requires_grad else None)
    # saved: what the rule reads (b always, a only for b's gradient)
    return from_op(out, 'div', (a, b), backward, saved=(a, b) if b.requires_grad else (b,))


def pow(a, b):
    """a ** b for a tensor and a Python number (either side) or two tensors."""
    if isinstance(a, Tensor) and isinstance(b, (bool, int, float, np.number, np.bool_)):
        return _pow_number(a, b)
    if (isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype.kind == 'f'
            and b.dtype.kind in 'iub' and result_type(a, b) == a.dtype):
        return _pow_integer_exponent(a, b)
    number_base = not isinstance(a, Tensor)
    a, b = _operands(a, b)
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # 0 ** -1 = inf, silently,
        out = _broadcast_op('pow', _power, a, b)  # as PyTorch
    if number_base and not out.flags.c_contiguous:  # number ** x is row-major in PyTorch
        out = out.copy(order='C')  # (a tensor ** x keeps x's layout, as NumPy does)

    def backward(g):
        """d(a^b)/da = b a^(b-1)  (0 where b = 0, even for a nan g)
        d(a^b)/db = a^b log(a)  (0 where a = 0 and b >= 0, as PyTorch)"""
        ga = gb = None
        if a.requires_grad:
            with np.errstate(divide='ignore', invalid='ignore'):
                ga = np.where(b.array == 0, 0, g * (b.array * a.array ** (b.array - 1)))
            ga = unbroadcast(ga, a.shape)
        if b.requires_grad:
            with np.errstate(divide='ignore', invalid='ignore'):
                gb = np.where((a.array == 0) & (b.array >= 0), 0, out * np.log(a.array))
            gb = unbroadcast(g * gb, b.shape)
        return ga, gb
    return from_op(out, 'pow', (a, b), backward, saved=(a, b), saves_output=True)


def _rtruediv(x, other):
    """number / tensor as PyTorch's Tensor.__rtruediv__ computes it: (1 / x) * number, two
    roundings (0.6 / -0.2 is then -3.0000000000000004, not -2.9999999999999996; an int
    tensor's 1 / x is float32). Anything else (an array) divides."""
    if not isinstance(other, (bool, int, float, np.number, np.bool_)):
        return div(other, x)
    x = _floating(x)
    c = other.item() if isinstance(other, np.generic) else other  # in x's dtype, as a number
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # 1/0 = inf, 0 * inf = nan
        r = 1 / x.array  # (r is the rule's own: no later change of x can reach it)
        out = r * c

    def backward(g):
        """d(c/x)/dx = -c/x^2  (as PyTorch: (g c) times d(1/x)/dx = -(1/x)^2)"""
        with np.errstate(over='ignore', invalid='ignore'):
            return (-(g * c) * (r * r),)
    return from_op(out, 'div', (x,), backward)


def neg(a):
    if a.dtype == bool_:
        raise TypeError("neg: negation, the `-` operator, of a bool tensor is not supported; "
                        "to invert a mask use `~mask` or mask.logical_not()")

    def backward(g):
        """d(-x)/dx = -1"""
        return (-g,)
    return from_op(-a.array, 'neg', (a,), backward)


# Comparisons give boolean tensors outside the graph: a step has no gradient (as PyTorch).
def _compare(fn):
    def compare(self, other):
        a, b = _operands(self, other)
        return _constant(_broadcast_op(fn.__name__, fn, a, b))
    return compare


eq, ne, lt, le, gt, ge = (_compare(f) for f in (np.equal, np.not_equal, np.less, np.less_equal,
                                                np.greater, np.greater_equal))


_methods(__add__=add, add=add, __radd__=lambda self, other: add(other, self), __sub__=sub, sub=sub,
         __rsub__=lambda self, other: sub(other, self), __mul__=mul, mul=mul,
         __rmul__=lambda self, other: mul(other, self), __truediv__=div, div=div,
         __rtruediv__=_rtruediv, __pow__=pow, pow=pow,
         __rpow__=lambda self, other: pow(other, self), __neg__=neg, neg=neg,
         __eq__=eq, __ne__=ne, __lt__=lt, __le__=le, __gt__=gt, __ge__=ge, eq=eq, ne=ne, lt=lt,
         le=le, gt=gt, ge=ge)


# ---------------------------------------------------------------------------
# 4. Matrix multiplication
# ---------------------------------------------------------------------------
def matmul(a, b):
    """a @ b for 1-D, 2-D and batched N-D operands (batch dims broadcast).

    A 1-D left operand is treated as a row (1, n), a 1-D right operand as a
    column (n, 1); the added dim is removed from the result, as in PyTorch.
    """
    if _autocast_dtype is not None:  # inside torch.autocast: in float16 (section 6b)
        return _autocast_call(matmul, 'lower', (a, b), {})
    _same_dtype('matmul', first=a, second=b)  # two tensors of one dtype (below)
    x, y = a.array, b.array
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dim, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    ka = x.shape[-1]
    kb = y.shape[-2] if y.ndim > 1 else y.shape[0]
    if ka != kb:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} are not "
                         f"compatible: {ka} (last dim of the first) != {kb} (rows of the second)")
    try:
        with np.errstate(invalid='ignore', over='ignore'):  # 1e30 * 1e30 = inf, silently, as PyTorch
            out = np.matmul(x, y)
    except ValueError:
        raise ValueError(f"matmul: batch dims of shapes {tuple(a.shape)} and {tuple(b.shape)} "
                         "cannot be broadcast together") from None

    def backward(g):
        """d(A@B)/dA: g @ B^T
        d(A@B)/dB: A^T @ g"""
        # On the operands as matrices: a 1-D a is a row (1, n), a 1-D b a column (n, 1),
        # and g gets back the dims they lost. Broadcast batch dims are summed back.
        x, y = a.array, b.array
        A = x if x.ndim > 1 else x[None, :]
        B = y if y.ndim > 1 else y[:, None]
        G = g[..., None] if y.ndim == 1 else g
        G = G[..., None, :] if x.ndim == 1 else G
        ga = gb = None
        if a.requires_grad:
            ga = unbroadcast(np.matmul(G, np.swapaxes(B, -1, -2)), A.shape).reshape(x.shape)
        if b.requires_grad:
            gb = unbroadcast(np.matmul(np.swapaxes(A, -1, -2), G), B.shape).reshape(y.shape)
        return ga, gb
    return from_op(out, 'matmul', (a, b), backward, saved=_each_reads_the_other(a, b))


def _same_dtype(op, **tensors):
    """Matrix products refuse mixed dtypes, as PyTorch does: promoting a float32 weight
    to float64 silently would double the memory and the time of a whole model."""
    given = []  # (name, tensor) of each one given
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}; wrap "
                            "arrays with tt.tensor(...)")
        given.append((name, t))
    name0, t0 = given[0]
    for name, t in given[1:]:
        if t.array.dtype != t0.array.dtype:
            raise RuntimeError(f"{op}: {name0} is {t0.dtype} but {name} is {t.dtype}; they must "
                               f"have the same dtype: convert one (x.float() for a float32 model)")


def _each_reads_the_other(a, b):
    """What a product's rule reads (mul's, matmul's): b for a's gradient and a for b's, only
    where that gradient is wanted (so x.mul_(2) needs no copy, and w of x @ w can change)."""
    return (a, b) if a.requires_grad and b.requires_grad else (b,) if a.requires_grad else (a,)


_methods(__matmul__=matmul, matmul=matmul,
         __rmatmul__=lambda self, other: matmul(_operands(other, self)[0], self))


# ---------------------------------------------------------------------------
# 5. Sum and mean, exp and log, relu
# ---------------------------------------------------------------------------
def _numpy_keywords(fn):
    """PyTorch also takes NumPy's keyword names: x.sum(axis=1, keepdims=True)."""
    @functools.wraps(fn)
    def reduction(*args, **kwargs):
        if 'keepdims' in kwargs:
            kwargs['keepdim'] = kwargs.pop('keepdims')
        if 'axis' in kwargs:
            kwargs['dim'] = kwargs.pop('axis')
        return fn(*args, **kwargs)
    return reduction


@_numpy_keywords  # x.sum(axis=, keepdims=) too, as PyTorch
def sum(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = to(x, dtype)  # sum in that dtype (a cast)
    axes = _dims(dim, x.array.ndim, 'sum')

    def backward(g, xs=x.array.shape):
        """d sum / dx_i = 1  (g broadcast back over the summed dims)"""
        return (_expand_back(g, xs, axes, keepdim),)
    with np.errstate(invalid='ignore', over='ignore'):  # inf + -inf = nan, silently, as PyTorch
        out = np.sum(x.array, axis=axes, keepdims=keepdim)
    return from_op(_row_major(out), 'sum', (x,), backward)


def _expand_back(g, shape, axes, keepdim):
    """Backward of a reduction: put the reduced axes back (as size 1) and
    broadcast g over them: every input element of a reduced slice receives it."""
    if not keepdim and axes:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


@_numpy_keywords  # x.mean(axis=, keepdims=) too, as PyTorch
def mean(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = to(x, dtype)
    if x.dtype.kind not in 'fc':
        raise TypeError(f"mean: the mean of a {x.dtype} tensor needs a float dtype; pass "
                        "dtype=tt.float32 or convert it with .float()")
    axes = _dims(dim, x.ndim, 'mean')
    n = math.prod(x.shape[a] for a in axes)

    def backward(g, xs=x.array.shape):
        """d mean / dx_i = 1/n  (g broadcast back over the n averaged elements)"""
        return (_expand_back(g / n, xs, axes, keepdim),)
    with np.errstate(invalid='ignore', over='ignore'):  # inf + -inf = nan, silently, as PyTorch
        out = (np.mean(x.array, axis=axes, keepdims=keepdim) if n else  # (np.mean warns of 0/0:
               np.sum(x.array, axis=axes, keepdims=keepdim) / n)  # the mean of nothing is nan)
    return from_op(_row_major(out), 'mean', (x,), backward)


def _row_major(a):
    """A reduction's (or a scan's) result in row-major order, as PyTorch's: NumPy keeps the
    input's order of dims in memory (x.T.sum(0) is strided), so a later view would fail."""
    return a if a.flags.c_contiguous else a.copy(order='C')


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
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):  # () as None
        return tuple(range(ndim))
    if isinstance(dim, (tuple, list)):
        axes = tuple(_dim(d, ndim, op) for d in dim)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{op}: dim {tuple(dim)} repeats a dimension")
        return axes if ndim > 0 else ()  # a 0-d tensor's dim 0 is no axis of its array
    return (_dim(dim, ndim, op),) if ndim > 0 else ()


def exp(x):
    x = _floating(x)
    with np.errstate(over='ignore'):  # exp(1000) = inf, silently, as PyTorch
        out = np.exp(x.array)

    def backward(g):
        """d e^x/dx = e^x"""
        return (g * out,)
    return from_op(out, 'exp', (x,), backward, saves_output=True)


def log(x):
    x = _floating(x)

    def backward(g):
        """d log(x)/dx = 1/x"""
        return (g / x.array,)
    with np.errstate(divide='ignore', invalid='ignore'):  # log(0) = -inf, log(-1) = nan, silently
        return from_op(np.log(x.array), 'log', (x,), backward, saved=(x,))


def relu(x):
    if x.array.dtype == bool_:
        raise TypeError("relu: bool inputs are not supported (as in PyTorch)")
    out = np.maximum(x.array, 0)  # nan stays nan, -inf becomes 0
    zero = x.array == 0
    if zero.any():  # and -0.0 stays -0.0, as PyTorch's (NumPy's maximum gives +0.0)
        out = np.where(zero, x.array, out)
    keep = ~(out <= 0)  # where the gradient passes: x > 0 (and nan, as PyTorch)

    def backward(g):
        """d relu(x)/dx = 1 where x > 0, else 0"""
        gx = g * keep
        # an inf or nan in g where relu passes nothing makes 0 * inf = nan: select there
        # instead (slower, so only then)
        if np.isnan(gx).any():
            gx = np.where(keep, g, 0)
        return (gx,)
    return from_op(out, 'relu', (x,), backward)


_methods(sum=sum, mean=mean, exp=exp, log=log, relu=relu)


# ---------------------------------------------------------------------------
# 6. Backward: reverse-mode automatic differentiation
# ---------------------------------------------------------------------------
def backward(tensor, gradient=None, retain_graph=False):
    """Fill .grad of every leaf that `tensor` depends on: d tensor / d leaf.

    Walks the graph from the output back to the leaves (reverse topological
    order), calling each op's backward rule with the gradient of its output and
    adding what it returns into the gradients of its inputs. A tensor used twice
    receives the sum of both contributions (the multivariable chain rule).
    """
    for node, g, _ in _walk(tensor, _initial_gradient(tensor, gradient), retain_graph):
        if node._backward is None or node._retains_grad:  # a leaf, or asked for
            _accumulate(node, g)


def _walk(root, g_root, retain_graph=False):
    """The walk behind backward: yields (tensor, d root / d tensor, what its rule
    returned for each of its inputs) for every tensor the gradient reaches, outputs
    before inputs. A leaf has no rule: its third item is None."""
    grads = {id(root): g_root}  # id(tensor) -> d root / d tensor, summed over paths
    order = _topological_order(root)
    if not retain_graph:  # no rule saved a tensor (x + 1): nothing to free, and a 2nd walk runs
        retain_graph = True
        for n in order:
            if n._saved:
                retain_graph = False
                break
    # A rule computes inf and nan silently, as PyTorch's (log's g / x at x = 0 is inf): NumPy's
    # warnings are off for the walk, once (per rule it would cost more than a small op), and
    # so also while the caller adds up what it yields (inf + -inf is nan, silently).
    with np.errstate(all='ignore'):
        for node in reversed(order):
            key = id(node)
            if key not in grads:
                continue  # no gradient reached it
            if isinstance(grads[key], np.generic):  # NumPy's arithmetic on 0-d arrays gives
                grads[key] = np.asarray(grads[key])  # scalars; a gradient is always an array
            if node._backward is None:  # a leaf
                yield node, grads.pop(key), None
                continue
            g = grads.pop(key)
            if node._saved:
                _check_saved(node)  # the version counter (below)
            # the op's rule: one step of the chain rule (_run_rule lets the tools watch it)
            rule_out = node._backward(g) if not _hooks else _run_rule(node, g)
            yield node, g, rule_out
            for p, pg in zip(_inputs(node), rule_out):
                if pg is None or not p.requires_grad:
                    continue
                if getattr(pg, 'shape', None) != p.array.shape or pg.dtype != p.array.dtype:
                    _wrong_gradient(node, p, pg)  # a guard rail for the rules you write
                key = id(p)
                grads[key] = grads[key] + pg if key in grads else pg  # two paths add up
            if not retain_graph:  # drop what the rule holds: the graph can't be walked again
                node._backward, node._parents, node._saved = _freed_graph, (), ()


def _inputs(node):
    """node's inputs as node's op read them. Usually just node._parents; but an input
    changed in place after node's op ran (h += 1: section 13 (in-place ops)) has a new
    history since, and its value as node read it is an older self: h._older, numbered by
    the order ops ran (_seq). Without in-place ops, every input ran before node and this
    returns _parents."""
    parents = node._parents
    for p in parents:
        if p._seq >= node._seq:
            return tuple(p if p._seq < node._seq else _as_read_by(node, p) for p in parents)
    return parents


def _as_read_by(node, p):
    """The version of p that node's op read (p's history was rewritten since)."""
    while p._seq >= node._seq:
        p = p._older
    return p


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
        for p in _inputs(node):
            if p.requires_grad and id(p) not in visited:
                todo.append((p, False))
    return order


def _initial_gradient(tensor, gradient):
    """d tensor / d tensor: ones for a single number, else the gradient the caller gave."""
    if not tensor.requires_grad:
        raise RuntimeError("backward: this tensor does not require grad and has no grad_fn "
                           "(no input had requires_grad=True, or it was made under no_grad)")
    if gradient is None:
        if tensor.array.size != 1:
            raise RuntimeError(f"backward: grad can be created implicitly only for a "
                               f"single-element output, got shape {tuple(tensor.shape)}; "
                               "pass gradient=...")
        return np.ones_like(tensor.array)
    gradient = gradient.array if isinstance(gradient, Tensor) else gradient
    if tuple(np.shape(gradient)) != tuple(tensor.shape):
        raise RuntimeError(f"backward: gradient has shape {tuple(np.shape(gradient))} but "
                           f"the tensor has shape {tuple(tensor.shape)}")
    return gradient


def _accumulate(t, g):
    """t.grad += g: gradients accumulate across backward calls, never overwrite."""
    if t._grad is not None:
        t._grad.array += g
    else:  # (add's rule gives its one g to both inputs)
        t._grad = _constant(g.astype(t.array.dtype, copy=True))  # g may be shared: a copy


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


def _freed_graph(g):
    raise RuntimeError("backward: trying to backward through the graph a second time (its "
                       "buffers were freed by the first backward); pass retain_graph=True to "
                       "the first backward if you need to go through it twice")


# Grad mode: inside `with no_grad():` from_op builds no graph (an optimizer's step, an
# evaluation). no_grad and enable_grad set _grad_enabled (section 1) and put it back.


def is_grad_enabled():
    return _grad_enabled


class _GradMode:
    """Base of no_grad / enable_grad: a context manager and a decorator, with or without
    parentheses (@no_grad() and @no_grad both decorate, as in PyTorch)."""
    enabled = True

    def __new__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):  # @no_grad, bare: args[0] is fn
            return cls()(args[0])
        return object.__new__(cls)

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

        @functools.wraps(fn)  # help(fn) still shows fn's own signature and docstring
        def wrapper(*args, **kwargs):
            with mode():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradMode):
    """Inside `with no_grad():` (or a function decorated @no_grad()) no graph is built."""
    enabled = False


class enable_grad(_GradMode):
    enabled = True


_methods(backward=backward)


# ===========================================================================
# PART I, CONTINUED: PYTORCH'S FINER RULES
# ===========================================================================
# A first reading may skip to END OF PART I: the engine above is complete. What follows is
# what makes its answers PyTorch's to the last dtype, layout and printed digit; each op
# above reaches it through one call whose name says what it does.


# ---------------------------------------------------------------------------
# 6b. Part I, continued: PyTorch's finer rules
# ---------------------------------------------------------------------------
# Type promotion (_operands, _scaled, _floating: the dtype of a result); the layout of a
# result in memory (_broadcast_op, _in_torch_order, _row_major); pow's special cases;
# making tensors and casts (tensor, _constant, to, detach); a tensor as a Python value
# (x.item(), len(x), if x); printing (_array_text, the grad_fn's name); devices
# (_cpu_only); the version counter (_guard_saved); the tools' hooks (_watch_op); autocast
# (_autocast_call); and the one speed switch, fast.


# -- Type promotion: the dtype of a result -------------------------------------
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
    """A Python or NumPy number as an operand: bool, int64 or the default float (a NumPy
    bool scalar too: PyTorch reads np.bool_(True) as 1.0)."""
    if isinstance(x, bool):
        return bool_
    if isinstance(x, (int, np.integer)):
        return int64
    if isinstance(x, (float, np.floating, np.bool_)):
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
        return x if x.dtype == dtype else to(x, dtype)
    if isinstance(x, (list, tuple, np.ndarray, np.generic, bool, int, float)):
        return _constant(np.array(x, dtype=dtype))  # a copy: later changes to x can't leak in
    raise TypeError(f"expected a Tensor or a number, got {type(x).__name__}")


def _operands(a, b, floating=False):
    """Both operands of a binary op as tensors of the promoted dtype (a float one
    if floating: int / int is float32)."""
    # the common cases first: two tensors of one dtype, a float tensor with a Python number
    # (rule 4: a number never changes a float tensor's dtype)
    if isinstance(a, Tensor):
        dtype = a.array.dtype
        if isinstance(b, Tensor):
            if dtype == b.array.dtype and (not floating or dtype.kind == 'f'):
                return a, b
        elif type(b) in (float, int) and dtype.kind == 'f':
            return a, _constant(np.array(b, dtype=dtype))
    elif type(a) in (float, int) and isinstance(b, Tensor) and b.array.dtype.kind == 'f':
        return _constant(np.array(a, dtype=b.array.dtype)), b
    dtype = result_type(a, b)
    if floating and dtype.kind not in 'fc':
        dtype = default_dtype
    return _as(a, dtype), _as(b, dtype)


def _floating(x):
    """A float function (exp, log, sin, ...) of an integer or bool tensor computes in the
    default float dtype, as in PyTorch; a float tensor stays as it is."""
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a Tensor, got {type(x).__name__}; wrap arrays with tt.tensor(...)")
    return x if x.dtype.kind in 'fc' else _constant(_cast_copy(x.array, default_dtype))


def _scaled(a, b, alpha):
    """add's and sub's operands a and alpha * b: alpha never changes the result's dtype
    (that of a + b), and, as PyTorch, a float alpha needs a float result and a bool alpha
    a bool one; for bools, alpha * b is b and bool(alpha)."""
    if type(alpha) is int and alpha == 1:
        return _operands(a, b)
    dtype = result_type(a, b)
    if isinstance(alpha, bool) and dtype != bool_:
        raise TypeError(f"add/sub: a bool alpha needs a bool result, got {dtype}")
    if isinstance(alpha, (float, np.floating, np.bool_)) and dtype.kind in 'biu':
        raise TypeError(f"add/sub: for an integer or bool result ({dtype}), alpha must not be "
                        f"a float, got {alpha!r}")
    if dtype == bool_:
        return _as(a, dtype), _as(b if alpha else b * False, dtype)
    return _as(a, dtype), _as(b, dtype) * alpha  # cast, then scale: 2 * an int32 b can overflow


def _no_bool_subtraction(a, b):
    """PyTorch refuses a bool tensor or a Python bool in a subtraction."""
    for x in (a, b):
        if isinstance(x, bool) or isinstance(x, Tensor) and x.dtype == bool_:
            raise TypeError("sub: subtraction, the `-` operator, with a bool tensor is not "
                            "supported; to invert a mask use `~mask` or mask.logical_not()")


# -- The layout of a result in memory ------------------------------------------
def _broadcast_op(op, fn, a, b):
    """Run a broadcasting forward, its result laid out in memory as PyTorch's (below); a
    shape mismatch names the op and both shapes."""
    x, y = a.array, b.array
    try:
        out = fn(x, y)
    except ValueError as e:
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise ValueError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                             "broadcast together") from None
        raise ValueError(f"{op}: {e}") from None  # another reason (int ** negative int)
    if x.flags.c_contiguous and y.flags.c_contiguous or x.ndim == 0 or y.ndim == 0:
        return out  # row-major operands, or one that orders alone: NumPy's order is PyTorch's
    return _in_torch_order(out, x, y)


# The order of a result's dims in memory. When the operands lie in different orders (x.T + y,
# with x and y row-major), NumPy lets row-major win; PyTorch sorts the dims by the operands'
# strides, asking them in turn: x.T + y is column-major, as x.T, and y + x.T row-major.
def _in_torch_order(out, *operands):
    """out, an elementwise op's result on these arrays (in the op's order), in PyTorch's
    order of dims in memory (_torch_order): a copy where NumPy's differs."""
    order = _torch_order(out.shape, *operands)
    laid = np.empty([out.shape[d] for d in order], out.dtype)
    laid = laid.transpose([order.index(d) for d in range(out.ndim)])  # dims back in their places
    if laid.strides == out.strides:
        return out
    np.copyto(laid, out)
    return laid


def _torch_order(shape, *operands):
    """The dims, from outer to inner in memory, of PyTorch's result of this shape from an
    elementwise op on these arrays: starting row-major, dims move inner by an insertion
    sort, as TensorIterator writes it; for a pair of dims the first operand whose strides
    differ decides (equal strides: the smaller dim goes inner). A dim an operand is
    broadcast along (stride 0) gives that operand no say."""
    nd = len(shape)
    strides = [(0,) * (nd - a.ndim) + tuple(0 if n != m else s for n, m, s in  # (n != m: n is 1)
                                            zip(a.shape, shape[nd - a.ndim:], a.strides))
               for a in operands]

    def should_swap(d0, d1):  # 1: d0, placed inside d1, belongs outside it; 0: nobody says
        for s in strides:
            if s[d0] == 0 or s[d1] == 0:
                continue
            if s[d0] != s[d1]:
                return -1 if s[d0] < s[d1] else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0
    perm = list(range(nd - 1, -1, -1))  # dims from inner to outer: row-major to start
    for i in range(1, nd):  # PyTorch's insertion sort, as it writes it
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return perm[::-1]


def _overlaps(a):
    """Whether some elements of array a share memory (a stride of 0 over a dim of size > 1,
    as expand makes): PyTorch copies any other tensor in its own order, such a one in the
    order of an op's result on it (_in_torch_order, above: the stride-0 dims keep their
    row-major place, the others are ordered by stride around them)."""
    return builtins.any(s == 0 and n > 1 for s, n in zip(a.strides, a.shape))


def _cast_copy(a, dtype):
    """Array a cast to dtype: a copy laid out as PyTorch's cast lays it out (_overlaps)."""
    if _overlaps(a):
        return _in_torch_order(a.astype(dtype, order='C'), a)
    return a.astype(dtype, order='K')


# -- pow's special cases -------------------------------------------------------
def _pow_number(a, p):
    """tensor ** number."""
    if a.dtype.kind in 'iub' and isinstance(p, (int, np.integer)) and not isinstance(p, bool) \
            and p < 0:  # (an empty tensor too, as PyTorch)
        raise RuntimeError(f"pow: integers to negative integer powers are not allowed "
                           f"({a.dtype} ** {p}); use a float exponent ({p}.0) or .float()")
    a = _operands(a, p)[0]
    # a NumPy scalar acts as a Python number; a NumPy bool as a float (PyTorch reads it so)
    p = float(p) if isinstance(p, np.bool_) else p.item() if isinstance(p, np.generic) else p

    def backward(g):
        """d(x^p)/dx = p x^(p-1)  (0 for p = 0, even at x = 0; a bool p as PyTorch: not)"""
        return (g * (p * _power_of(a.array, p - 1)) if p != 0 or p is False else np.zeros_like(g),)
    out = _power_of(a.array, p)  # x ** 0.5 as sqrt(x), as PyTorch (_power_of, below)
    return from_op(out.astype(a.dtype, copy=False), 'pow', (a,), backward, saved=(a,))


def _pow_integer_exponent(a, b):
    """float tensor ** integer tensor: the rule takes b - 1 in b's integer dtype, as PyTorch
    (INT64_MIN - 1 wraps to INT64_MAX, whose float is even: (-inf)^(b-1) = +inf), and only
    then the base's float dtype."""
    e = _as(b, a.dtype)  # the exponent in the base's dtype
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # 0 ** -1 = inf, silently
        out = _broadcast_op('pow', _power, a, e)

    def backward(g):
        """d(a^b)/da = b a^(b-1)  (b - 1 in b's integer dtype; 0 where b = 0, even for a nan g)"""
        if b.dtype == bool_:  # as PyTorch, whose rule computes b - 1
            raise RuntimeError("pow backward: subtraction, the `-` operator, with a bool "
                               "tensor is not supported (the rule computes exponent - 1)")
        with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
            below = (b.array - 1).astype(a.dtype)
            return (unbroadcast(np.where(e.array == 0, 0, g * (e.array * a.array ** below)), a.shape),)
    return from_op(out, 'pow', (a,), backward, saved=(a, b))


def _power(a, b):
    """a ** b of arrays. NumPy refuses an integer to a negative integer power; PyTorch
    truncates 1 / a ** n to an integer: 1 for a = 1, +-1 for a = -1 (by n's parity), else 0.
    A bool to a bool tensor power is refused, as PyTorch's (a bool ** True is Part I's)."""
    if a.dtype == bool_ and np.asarray(b).dtype == bool_:
        raise RuntimeError("pow: a bool to the power of a bool tensor is not supported, as in "
                           "PyTorch; cast one of them with .int() or .float()")
    if a.dtype.kind not in 'iu' or not (np.asarray(b) < 0).any():
        return np.power(a, b)
    a, b = np.broadcast_arrays(a, b)
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(a.dtype)
    return np.where(b < 0, neg, np.power(a, np.where(b < 0, 0, b)))


def _power_of(x, p):
    """x ** p for a number p as PyTorch computes it: sqrt for 0.5 and 1 / sqrt for -0.5, so
    that sqrt(-inf) is nan and (-0.0) ** -0.5 is -inf (NumPy's pow says inf and inf). pow's
    rule uses it too: d(x^0.5)/dx = 0.5 x^(-0.5) is nan at -inf, as PyTorch's."""
    with np.errstate(invalid='ignore', divide='ignore', over='ignore'):  # nan and inf, silently,
        return np.sqrt(x) if p == 0.5 else 1 / np.sqrt(x) if p == -0.5 else x ** p


# -- Making tensors; casts -----------------------------------------------------
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


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """Create a leaf tensor. Python floats become float32, ints int64; a NumPy array
    keeps its dtype (float64 stays float64). device: the CPU (None, 'cpu'); pin_memory is
    accepted and changes nothing (it speeds copies to a GPU)."""
    _cpu_only(device, 'tensor')
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def to(self, dtype):
    """Cast to a dtype; between float dtypes the gradient is cast back."""
    dtype = np.dtype(dtype)
    if dtype == self.dtype:
        return self
    src = self.dtype

    def backward(g):
        """d cast(x)/dx = 1  (g cast back to the input's dtype)"""
        return (g.astype(src),)
    with np.errstate(invalid='ignore'):  # nan to an integer: silently, as PyTorch
        out = from_op(_cast_copy(self.array, dtype), 'to', (self,), backward)
    if dtype.kind not in 'fc':
        out = detach(out)
    return out


def detach(x):
    """Same data (shared, as in PyTorch), outside the graph."""
    out = Tensor.__new__(Tensor)
    _init_result(out, x.array, x._vc)
    x._shared = out._shared = True  # an in-place op on either writes into the shared memory
    return out


# -- A tensor as a Python value (x.item(), len(x), if x: ...; the table at the end of 6b) -
def _size(self, dim=None):
    return self.shape if dim is None else self.shape[_dim(dim, self.ndim, 'size')]


def _dim_count(self):
    return self.ndim


def _numel(self):
    return self.array.size


def _len(self):
    if self.ndim == 0:
        raise TypeError("len() of a 0-d tensor")
    return self.shape[0]


def _item(self):
    if self.array.size != 1:
        raise ValueError(f"item(): only a one-element tensor can be converted to a Python "
                         f"number, got shape {tuple(self.shape)}")
    return self.array.reshape(()).item()


def _numpy(self):
    if self.requires_grad:
        raise RuntimeError("numpy(): this tensor requires grad; call .detach().numpy()")
    return self.array


def _tolist(self):
    return self.array.tolist()


def _float(self):
    return float(self.item())


def _int(self):
    return int(self.item())


def _bool(self):
    if self.array.size != 1:
        raise RuntimeError(f"the truth value of a tensor of shape {tuple(self.shape)} "
                           "is ambiguous; use .any() or .all()")
    return bool(self.array.reshape(()))


def _iter(self):
    return (self[i] for i in range(len(self)))


# -- Printing: as PyTorch prints -----------------------------------------------
class Size(tuple):
    """torch.Size: a tensor's shape, a tuple that prints as PyTorch prints it."""
    __slots__ = ()

    def __repr__(self):
        return f'torch.Size({list(self)})'

    def numel(self):
        return math.prod(self)


# How a tensor prints: as PyTorch prints it, with set_printoptions' options (section 18).
_PRINT_DEFAULTS = dict(precision=4, threshold=1000, edgeitems=3, linewidth=80, sci_mode=None)
_print_options = dict(_PRINT_DEFAULTS)


def _tensor_text(a, suffixes):
    """tensor(values, suffix, ...) as PyTorch writes it: a suffix (dtype=..., grad_fn=...) that
    would pass the line width goes on a line of its own."""
    text = 'tensor(' + _array_text(a)
    last = len(text) - text.rfind('\n') + 1  # the last line's length, as PyTorch counts it
    for suffix in suffixes:
        if last + len(suffix) + 2 > _print_options['linewidth']:
            text += ',\n' + ' ' * len('tensor(') + suffix
            last = len('tensor(') + len(suffix)
        else:
            text += ', ' + suffix
            last += len(suffix) + 2
    return text + ')'


def _array_text(a):
    """A tensor's values as PyTorch prints them: 4 decimals, or e-notation where the
    magnitudes span more than 1000x (or pass 1e8, or go under 1e-4); floats that are whole
    numbers as "2."; lines of at most 80 characters; an empty tensor with more than one dim
    says its size. Other digits, widths or sci_mode, once set_printoptions set them."""
    if a.size == 0 and a.ndim > 1:
        return f'[], size={a.shape}'
    o = _print_options
    threshold = sys.maxsize if o['threshold'] == math.inf else o['threshold']
    # a row cut short by a summary ('...' in it) is laid out as PyTorch's (_summarised_rows)
    cut = a.ndim > 0 and a.size > threshold and a.shape[-1] > 2 * o['edgeitems']
    width = o['linewidth']
    # the format is chosen from the elements shown, as PyTorch's (a summary hides the rest)
    shown = _shown(a, o['edgeitems']) if a.size > threshold else a
    # True alone prints as True, as PyTorch's; NumPy pads it to the width of False
    formatter = {'bool': str} if a.dtype == bool_ and shown.all() else {}
    with np.printoptions(threshold=threshold, edgeitems=o['edgeitems']):
        if o['sci_mode'] is not None or (o['precision'], o['linewidth']) != (4, 80):
            sci = o['sci_mode']
            if sci:
                formatter['float_kind'] = lambda v: f"{v:.{o['precision']}e}"
            text = np.array2string(a, separator=', ', prefix='tensor(', precision=o['precision'],
                                   max_line_width=width, floatmode='fixed',
                                   suppress_small=not sci, formatter=formatter or None)
        else:
            finite = np.abs(shown[np.isfinite(shown)]) if a.dtype.kind == 'f' else np.ones(1)
            nonzero = finite[finite != 0]
            wide = nonzero.size > 0 and (nonzero.max() > 1e8 or nonzero.max() > 1000 * nonzero.min())
            whole = np.all(finite == np.floor(finite)) and not wide
            small = nonzero.size > 0 and nonzero.min() < 1e-4 and not whole
            text = np.array2string(a, separator=', ', prefix='tensor(', precision=4,
                                   max_line_width=width,
                                   floatmode='maxprec_equal' if whole else 'fixed',
                                   suppress_small=not (wide or small), formatter=formatter or None)
    return _summarised_rows(text, a.ndim, width) if cut else text


def _shown(a, edge):
    """The elements a summary shows: the first and last `edge` along every longer dim."""
    for d, n in enumerate(a.shape):
        if n > 2 * edge:
            a = np.take(a, np.r_[0:edge, n - edge:n], axis=d)
    return a


def _summarised_rows(text, ndim, width):
    """NumPy's text of a tensor whose rows a summary cut short, each row laid out again as
    PyTorch lays it out: its elements right-aligned to one width w, the summary an element
    ' ...' of its own ('...' in NumPy), and floor((width - indent) / (w + 2)) elements on
    each line (NumPy fills each line instead)."""
    indent = len('tensor(') + ndim - 1  # where a row's elements start, after its brackets
    wrap = '\n' + ' ' * (indent + 1)

    def row(inside):
        items = inside.replace(',' + wrap, ', ').split(', ')
        w = builtins.max(len(t) for t in items if t != '...')
        items = [' ...' if t == '...' else t.rjust(w) for t in items]
        per_line = builtins.max(1, (width - indent) // (w + 2))
        lines = [', '.join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
        return '[' + (',' + wrap).join(lines) + ']'
    pieces, done = [], 0  # each innermost [...] (no bracket inside) is a row
    close = text.find(']')
    while close >= 0:
        start = text.rfind('[', done, close)
        if start >= 0:
            pieces += [text[done:start], row(text[start + 1:close])]
            done = close + 1
        close = text.find(']', close + 1)
    return ''.join(pieces) + text[done:]


# tinytorch's op names -> PyTorch's node names, where the rule "snake_case op -> CamelCase +
# Backward0" does not give PyTorch's (docs/pytorch-code.md: "grad_fn").
_GRAD_FN_NAMES = {'reshape': 'ViewBackward0', 'view': 'ViewBackward0',
                  'clamp': 'ClampBackward1', 'layer_norm': 'NativeLayerNormBackward0',
                  'bce_with_logits': 'BinaryCrossEntropyWithLogitsBackward0',
                  'pad': 'ConstantPadNdBackward0', 'log1p': 'Log1PBackward0',
                  'max_pool2d': 'MaxPool2DWithIndicesBackward0',
                  'norm': 'LinalgVectorNormBackward0', 'CopySlices': 'CopySlices'}


def _grad_fn_name(t):
    """PyTorch's name for the node that made t: 'mul' -> 'MulBackward0'. PyTorch numbers
    the variants of an op: sum() is SumBackward0, sum(dim) SumBackward1; max() is
    MaxBackward1, max(dim) MaxBackward0; matmul is Dot, Mv or Mm by its operands' dims.
    Each output of a Function has the Function's node."""
    if t._op.endswith(' output') and len(t._parents) == 1:
        t = t._parents[0]
    op = t._op
    if op.endswith('Backward') or op in ('CopySlices',):  # a Function subclass: its own name
        return _GRAD_FN_NAMES.get(op, op)
    op = op.rstrip('_')  # an in-place op has its out-of-place twin's node
    full = t.ndim == 0  # a reduction to one number (PyTorch: the variant without dim)
    if op in ('sum', 'mean'):
        return op.capitalize() + ('Backward0' if full else 'Backward1')
    if op in ('max', 'min'):
        return op.capitalize() + ('Backward1' if full else 'Backward0')
    if op == 'matmul' and len(t._parents) == 2:
        dims = tuple(p.ndim for p in t._parents)
        return {(1, 1): 'DotBackward0', (2, 1): 'MvBackward0',
                (2, 2): 'MmBackward0'}.get(dims, 'MatmulBackward0')
    if op in _GRAD_FN_NAMES:
        return _GRAD_FN_NAMES[op]
    return ''.join(w[:1].upper() + w[1:] for w in op.replace(' ', '_').split('_')) + 'Backward0'


# -- Devices: the one device is the CPU ----------------------------------------
class device:
    """torch.device: where a tensor lives. tinytorch computes with NumPy on the CPU, so
    'cpu' is its one device; naming another is fine, using it is refused (_cpu_only)."""

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        type, _, number = str(type).partition(':')
        self.type, self.index = type, int(number) if number else index

    def __repr__(self):
        more = '' if self.index is None else f', index={self.index}'
        return f"device(type='{self.type}'{more})"

    def __str__(self):
        return self.type if self.index is None else f'{self.type}:{self.index}'

    def __eq__(self, other):
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))


_CPU = device('cpu')


def _cpu_only(where, what):
    """device=... arguments: None or the CPU; any other device gets one clear line."""
    if where is None or where == 'cpu' or (isinstance(where, (str, device)) and
                                          device(where).type == 'cpu'):
        return _CPU
    raise RuntimeError(f"{what}: device {str(where)!r} is not available: tinytorch computes with "
                       "NumPy on the CPU (use 'cpu'; to run a model on a GPU, export it to "
                       "PyTorch with export.py)")


# -- The version counter -------------------------------------------------------
# The version counter. A rule often reads arrays from the forward pass: mul's rule reads
# both factors, exp's its own output. If one of them is changed in place before backward
# (x += 1), the rule would return a wrong gradient without a word. So every tensor has a
# version counter, `_vc`: a one-element list, shared with its views and bumped by every
# in-place change (section 13). from_op records (counter, version now, shape) of each
# array the rule reads in the output's `_saved`, and backward compares before it runs the
# rule (_check_saved, in section 6).
def _guard_saved(out, saved, saves_output):
    """Record the version of each array out's rule reads."""
    # the counter, not the tensor, so that an output saving itself makes no reference cycle
    records = []
    for t in saved:
        records.append((t._vc, t._vc[0], t.array.shape))
    if saves_output:
        records.append((out._vc, out._vc[0], out.array.shape))
    out._saved = records


# -- The tools' hooks ----------------------------------------------------------
# The tools in lookinside.py (profile, detect_anomaly) watch every op and every backward
# rule: `with` puts them in the list _hooks, and then from_op and backward call these two.
# When no tool is on, that costs one check of an empty list per op.
def _watch_op(out, op, parents):
    """Tell the tools that watch that op made out."""
    for hook in _hooks:
        hook.op(out, op, parents)


def _run_rule(node, g):
    """Run node's backward rule; the tools that watch see it start and end."""
    for hook in _hooks:
        hook.rule_start(node)
    grads = node._backward(g)
    for hook in _hooks:
        hook.rule_end(node, grads)
    return grads


# -- Mixed precision: autocast -------------------------------------------------
# Mixed precision: inside `with torch.autocast('cpu', dtype=torch.float16)` (amp.py) this is
# float16, and the ops PyTorch's CPU autocast lists run through _autocast_op (one decorator
# line each): matmul (below), and in nn.py linear, the convolutions and attention compute
# in float16; the losses compute in float32. Outside the block: None, and every op is as is.
_autocast_dtype = None


def _autocast_op(policy):
    """The decorator of an op autocast lists. policy 'lower': under autocast the op computes
    in the autocast dtype; 'float32': in float32 (the losses)."""
    def decorate(op):
        @functools.wraps(op)
        def op_or_autocast(*args, **kwargs):
            if _autocast_dtype is None:  # the usual case: the op itself
                return op(*args, **kwargs)
            return _autocast_call(op, policy, args, kwargs)
        return op_or_autocast
    return decorate


def _autocast_call(op, policy, args, kwargs):
    """op(*args, **kwargs) under autocast, with autocast off inside it (as PyTorch's). 'float32':
    float16 tensor arguments cast to float32. 'lower': float32 and float16 ones rounded to the
    autocast dtype, the op computed in float32 on those values and its result rounded to the
    autocast dtype (NumPy's float16 matmul is about 20x slower than its float32 one; this
    is float16 products with float32 sums). float64 tensors are left as they are."""
    global _autocast_dtype
    low, _autocast_dtype = _autocast_dtype, None
    try:
        if policy == 'float32':
            def cast(t):
                return to(t, float32) if isinstance(t, Tensor) and t.dtype == low else t
        else:
            def cast(t):
                if isinstance(t, Tensor) and t.dtype in (float32, low):
                    return to(to(t, low), float32)
                return t
        out = op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        lowered = policy == 'lower' and isinstance(out, Tensor) and out.dtype == float32
        return to(out, low) if lowered else out
    finally:
        _autocast_dtype = low


# -- The one speed switch ------------------------------------------------------
# The one speed switch. Part I has no fast code: every op in it is the plain code. Later
# ops may have a fast twin (a Speed kernel in section 20, nn.py's fused conv, pool and
# recurrent direction, transformer.py's fused attention, optim.py's adam_step_), which
# computes the same numbers and runs only while this is True: TINYTORCH_PLAIN=1 in the
# environment, or tt.fast = False, runs the plain code everywhere.
fast = os.environ.get('TINYTORCH_PLAIN', '0') != '1'


# Part I, continued, gives Tensor these methods: a tensor as a Python value, and x._version
# (how often x was changed in place: the version counter)
_methods(size=_size, dim=_dim_count, numel=_numel, __len__=_len, item=_item, numpy=_numpy,
         tolist=_tolist, __float__=_float, __int__=_int, __bool__=_bool, __iter__=_iter,
         _version=property(lambda self: self._vc[0]))

# END OF PART I: a working engine. Everything below adds to it.


# ===========================================================================
# PART II: THE REST
# ===========================================================================

# ---------------------------------------------------------------------------
# 7. Casts by name
# ---------------------------------------------------------------------------
# Part I (section 6b) has PyTorch's rule for operands of different dtypes and to(dtype);
# here are the casts by name (x.float(), ...) and the test for a float dtype.
def is_floating_point(x):
    return x.dtype.kind == 'f'


# legacy names: torch.FloatTensor, x.type(), x.new(...)
_TYPE_NAMES = {float32: 'FloatTensor', float64: 'DoubleTensor', float16: 'HalfTensor',
               int64: 'LongTensor', int32: 'IntTensor', np.dtype(np.int16): 'ShortTensor',
               np.dtype(np.int8): 'CharTensor', np.dtype(np.uint8): 'ByteTensor',
               bool_: 'BoolTensor'}


class _LegacyTensorType(type):
    """torch.FloatTensor and co: FloatTensor([1, 2]) is tensor([1., 2.]); FloatTensor(2, 3)
    a tensor of that shape (PyTorch leaves it uninitialized, tinytorch fills zeros);
    isinstance(x, torch.FloatTensor) asks for x's dtype."""

    def __call__(cls, *args):
        if args and builtins.all(isinstance(a, int) for a in args):
            return zeros(*args, dtype=cls.dtype)
        return tensor(args[0] if args else [], dtype=cls.dtype)

    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype == cls.dtype

    def __repr__(cls):
        return f"<class 'torch.{cls.__name__}'>"


for _dt, _name in _TYPE_NAMES.items():
    globals()[_name] = _LegacyTensorType(_name, (), {'dtype': _dt})


def _type(x, dtype=None, non_blocking=False, **kwargs):
    """x.type(): PyTorch's name of x's type ('torch.FloatTensor'); x.type(dtype), also
    x.type(torch.LongTensor) or x.type('torch.LongTensor'): x in that dtype."""
    if dtype is None:
        return 'torch.' + _TYPE_NAMES[x.dtype]
    if isinstance(dtype, str):
        name = dtype.rsplit('.', 1)[-1]
        dtype = next((d for d, n in _TYPE_NAMES.items() if n == name), None)
        if dtype is None:
            raise ValueError(f"type: no tensor type named {name!r} (FloatTensor, LongTensor, ...)")
    dtype = getattr(dtype, 'dtype', dtype)
    return x if x.dtype == dtype else to(x, dtype)


def _bfloat16(x, *args, **kwargs):
    raise TypeError("bfloat16(): tinytorch computes with NumPy, which has no bfloat16; "
                    "use .float() (float32)")


_methods(is_floating_point=is_floating_point, float=lambda self: to(self, float32),
         double=lambda self: to(self, float64), long=lambda self: to(self, int64),
         type=_type, bfloat16=_bfloat16, byte=lambda x: to(x, np.dtype(np.uint8)))


# ---------------------------------------------------------------------------
# 8. Indices, masks and conditions: what a rule reads besides its inputs
# ---------------------------------------------------------------------------
# where, masked_fill, indexing, gather and scatter read tensors that are not inputs of the
# graph (an index has no gradient); the version counter guards them like saved inputs.
def _tensors_in(idx):
    """The tensors in an index, mask or condition (an op's backward reads them)."""
    return tuple(i for i in (idx if isinstance(idx, tuple) else (idx,)) if isinstance(i, Tensor))


# ---------------------------------------------------------------------------
# 9. Elementwise functions
# ---------------------------------------------------------------------------
def sqrt(x):
    x = _floating(x)
    with np.errstate(invalid='ignore'):  # sqrt(-1) = nan, silently, as PyTorch
        out = np.sqrt(x.array)

    def backward(g):
        """d sqrt(x)/dx = 1/(2 sqrt(x))"""
        return (g / (2 * out),)
    return from_op(out, 'sqrt', (x,), backward, saves_output=True)


def _no_bools(x, op):
    if x.dtype == bool_:
        raise TypeError(f"{op}: bool inputs are not supported (as in PyTorch)")


def abs(x):
    _no_bools(x, 'abs')

    def backward(g):
        """d|x|/dx = sign(x)  (0 at nan, as PyTorch)"""
        return (g * np.where(np.isnan(x.array), 0, np.sign(x.array)).astype(g.dtype, copy=False),)
    return from_op(np.abs(x.array), 'abs', (x,), backward, saved=(x,))


def sin(x):
    x = _floating(x)

    def backward(g):
        """d sin(x)/dx = cos(x)"""
        return (g * np.cos(x.array),)
    with np.errstate(invalid='ignore'):  # sin(inf) = nan, silently, as PyTorch
        return from_op(np.sin(x.array), 'sin', (x,), backward, saved=(x,))


def cos(x):
    x = _floating(x)

    def backward(g):
        """d cos(x)/dx = -sin(x)"""
        return (-g * np.sin(x.array),)
    with np.errstate(invalid='ignore'):  # cos(inf) = nan, silently, as PyTorch
        return from_op(np.cos(x.array), 'cos', (x,), backward, saved=(x,))


def tan(x):
    x = _floating(x)
    with np.errstate(invalid='ignore'):  # tan(inf) = nan, silently, as PyTorch
        out = np.tan(x.array)

    def backward(g):
        """d tan(x)/dx = 1 + tan(x)^2"""
        return (g * (1 + out * out),)
    return from_op(out, 'tan', (x,), backward, saves_output=True)


def tanh(x):
    x = _floating(x)  # an integer tensor's tanh is a float32 one, as in PyTorch
    out = np.tanh(x.array)

    def backward(g):
        """d tanh(x)/dx = 1 - tanh(x)^2"""
        return (g * (1 - out * out),)
    return from_op(out, 'tanh', (x,), backward, saves_output=True)


def _sigmoid_of(a, out=None):
    # sigma(a) = 1 / (1 + e^-a), as PyTorch computes it. Its tail keeps its precision
    # (sigma(-20) = 2e-9 in float32, not 0). Below a = -88.7 (float32) e^-a overflows to inf
    # and the result is 0, as PyTorch's: the true value is below float32's normal numbers.
    # out: an array to write the result into (the fused LSTM's), else a new one
    if a.dtype == np.float16:  # e^-a overflows float16 below a = -11, yet sigma(-12) = 6e-6
        # is a float16: float32 inside, then rounded, as PyTorch computes half precision
        r = _sigmoid_of(a.astype(np.float32)).astype(np.float16)
        if out is None:
            return r
        out[...] = r
        return out
    with np.errstate(over='ignore'):
        e = np.exp(np.negative(a, out=out), out=out)  # e^-a
        return np.divide(1, np.add(e, 1, out=out), out=out)


def sigmoid(x):
    x = _floating(x)
    out = _sigmoid_of(x.array)

    def backward(g):
        """d sigma(x)/dx = sigma(x) (1 - sigma(x))"""
        return (g * out * (1 - out),)
    return from_op(out, 'sigmoid', (x,), backward, saves_output=True)


def log1p(x):
    x = _floating(x)

    def backward(g):
        """d log(1 + x)/dx = 1/(1 + x)"""
        return (g / (1 + x.array),)
    with np.errstate(divide='ignore', invalid='ignore'):  # log1p(-1) = -inf, silently, as PyTorch
        return from_op(np.log1p(x.array), 'log1p', (x,), backward, saved=(x,))  # accurate for tiny x


def expm1(x):
    x = _floating(x)
    with np.errstate(over='ignore'):  # expm1(1000) = inf, silently, as PyTorch
        out = np.expm1(x.array)  # e^x - 1, accurate for tiny x

    def backward(g):
        """d (e^x - 1)/dx = e^x = out + 1"""
        return (g * (out + 1),)
    return from_op(out, 'expm1', (x,), backward, saves_output=True)


def silu(x):
    """x * sigmoid(x) (also called swish)."""
    x = _floating(x)
    with np.errstate(over='ignore', invalid='ignore'):  # exp(-x) = inf for x < -88 (float32):
        s = 1 / (1 + np.exp(-x.array))  # s = 0, right; silu(-inf) = -inf * 0 = nan, as PyTorch
        out = x.array * s

    def backward(g):
        """d x s(x)/dx = s + x s (1 - s) = s (1 + x (1 - s)),  s = sigma(x)"""
        return (g * s * (1 + x.array * (1 - s)),)
    return from_op(out, 'silu', (x,), backward, saved=(x,))


def leaky_relu(x, negative_slope=0.01):
    if x.dtype.kind != 'f':
        raise TypeError(f"leaky_relu: a {x.dtype} tensor is not supported; it needs a float one")
    slope = np.where(x.array > 0, 1, negative_slope).astype(x.dtype)  # 1 for x > 0, else the slope

    def backward(g):
        """d leaky_relu(x)/dx = 1 where x > 0, else negative_slope"""
        return (g * slope,)
    return from_op(x.array * slope, 'leaky_relu', (x,), backward)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch)."""
    x = _floating(x)
    bx = x.array * beta
    linear = bx > threshold
    with np.errstate(over='ignore'):
        out = np.where(linear, x.array, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)
        s = 1 / (1 + np.exp(-bx))

    def backward(g):
        """d softplus(x)/dx = sigma(beta x), and 1 where beta x > threshold"""
        return (g * np.where(linear, 1, s),)
    return from_op(out.astype(x.dtype), 'softplus', (x,), backward)


def _erf_plain(x):
    """erf of an array by Python's math.erf, one element at a time (the plain path)."""
    return np.array(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)  # 0-d: an array too


def erf(x):
    # erf(x) = 2/sqrt(pi) * integral of exp(-t^2) from 0 to x. NumPy has none: the plain path
    # asks math.erf element by element; section 20's _erf_np does the array at once.
    x = _floating(x)
    out = _erf_np(x.array) if fast else _erf_plain(x.array)

    def backward(g):
        """d erf(x)/dx = 2/sqrt(pi) exp(-x^2)"""
        return (g * (2 / math.sqrt(math.pi)) * np.exp(-x.array * x.array),)
    return from_op(out, 'erf', (x,), backward, saved=(x,))


def gelu(x, approximate='none'):
    """GELU(x) = x * Phi(x), Phi the standard normal CDF (exact, with erf), or
    PyTorch's approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _floating(x)
    xd = x.array
    if approximate == 'tanh':
        k = math.sqrt(2 / math.pi)
        with np.errstate(over='ignore', invalid='ignore'):  # inf and nan, silently, as PyTorch
            t = np.tanh(k * (xd + 0.044715 * xd ** 3))
            out = 0.5 * xd * (1 + t)

        def backward_tanh(g):
            """d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2),  t = tanh(k (x + 0.044715 x^3))"""
            return (g * (0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * k * (1 + 0.134145 * xd * xd)),)
        return from_op(out, 'gelu', (x,), backward_tanh, saved=(x,))
    if approximate != 'none':
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    with np.errstate(over='ignore', invalid='ignore'):  # x phi(x) at inf: inf * 0, silently
        if fast and xd.dtype == np.float32:  # the same two arrays, faster (section 20)
            out, dgelu = gelu_float32(xd)
        else:
            erf_ = _erf_np if fast else _erf_plain
            cdf = 0.5 * (1 + erf_(xd * (1 / math.sqrt(2))))  # Phi(x)
            dgelu = cdf + xd * np.exp(-0.5 * xd * xd) * (1 / math.sqrt(2 * math.pi))  # Phi + x phi
            out = xd * cdf

    def backward(g):
        """d x Phi(x)/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2) / sqrt(2 pi)"""
        return (g * dgelu,)  # (computed in the forward pass, which had phi at hand)
    return from_op(out, 'gelu', (x,), backward)


def clamp(x, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, Tensor) or isinstance(max, Tensor):  # bounds per element
        return _clamp_per_element(x, min, max)
    dtype = result_type(x, *(b for b in (min, max) if b is not None))
    if dtype != x.dtype:  # an int tensor with a float bound: a float result, as PyTorch
        x = _as(x, dtype)
    out = _clip(x.array, min, max)
    inside = np.ones_like(x.array, dtype=bool) if min is None else x.array > min
    if max is not None:  # (PyTorch 2.14 on: 0 at a bound, as relu at 0; before, 1)
        inside &= x.array < max

    def backward(g):
        """d clamp(x)/dx = 1 where min < x < max, else 0 (at a bound too)"""
        return (np.where(inside, g, 0),)
    return from_op(out, 'clamp', (x,), backward)


def _clip(a, lo, hi):
    """min(max(a, lo), hi) as PyTorch's: a bound replaces a only where a is beyond it (so
    0.0 clamped at min=-0.0 stays 0.0), and a nan anywhere gives nan."""
    with np.errstate(invalid='ignore'):
        if lo is not None:
            a = np.where((a < lo) | np.isnan(lo), lo, a)
        if hi is not None:
            a = np.where((a > hi) | np.isnan(hi), hi, a)
    return a


def _clamp_per_element(x, lo, hi):
    """clamp with tensor bounds: max(x, lo), then min(., hi); a nan anywhere gives nan.
    One bound: maximum's (minimum's) rule. Two: PyTorch 2.14's rule (below)."""
    dtype = result_type(*(v for v in (x, lo, hi) if v is not None))
    x, lo, hi = (None if v is None else _as(v, dtype) for v in (x, lo, hi))
    out = _clip(x.array, None if lo is None else lo.array, None if hi is None else hi.array)
    inputs = tuple(v for v in (x, lo, hi) if v is not None)
    if not builtins.all(v.array.flags.c_contiguous for v in inputs):
        out = _in_torch_order(out, *(v.array for v in inputs))  # as PyTorch's (section 6b)

    def backward(g):
        """d clamp/dx = 1 unless x < lo or x > hi (so 1 at a nan); 1/2 at x = lo < hi or lo < hi = x
        d clamp/dlo = 1 where x < lo <= hi, 1/2 where x = lo < hi
        d clamp/dhi = 1 where hi < lo or x > hi >= lo, 1/2 where lo < hi = x"""
        if hi is None or lo is None:  # max(x, lo) or min(x, hi): their rule (ties halved)
            return _extreme_pair_grads(g, x, lo if hi is None else hi,
                                       np.greater if hi is None else np.less)
        a, l, h = x.array, lo.array, hi.array
        with np.errstate(invalid='ignore'):
            half, apart = g * 0.5, l < h
            gx = np.where((a < l) | (a > h), 0, np.where(((a == l) | (a == h)) & apart, half, g))
            gl = np.where((a < l) & (l <= h), g, np.where((a == l) & apart, half, 0))
            gh = np.where((h < l) | (a > h) & (l <= h), g, np.where((a == h) & apart, half, 0))
        return tuple(unbroadcast(d, v.shape) if v.requires_grad else None
                     for d, v in zip((gx, gl, gh), inputs))  # selected, never g * mask (0 * inf)
    return from_op(out, 'clamp', inputs, backward, saved=inputs)  # the masks read all three


def _extreme_pair_grads(g, a, b, wins):
    """maximum's and minimum's rules: g to the winner, half to each of a tie, all of it to
    both where either is nan (as PyTorch); selected, never multiplied by a mask (0 * inf)."""
    nan = np.isnan(a.array) | np.isnan(b.array)
    a_wins, b_wins = wins(a.array, b.array) | nan, wins(b.array, a.array) | nan
    tie = np.where(a.array == b.array, g * 0.5, 0)
    return (unbroadcast(np.where(a_wins, g, tie), a.shape) if a.requires_grad else None,
            unbroadcast(np.where(b_wins, g, tie), b.shape) if b.requires_grad else None)


def maximum(a, b):
    a, b = _operands(a, b)
    out = _broadcast_op('maximum', np.maximum, a, b)

    def backward(g):
        """d max(a,b)/da = 1 where a > b (or a nan), 1/2 where a = b (as PyTorch), else 0
        d max(a,b)/db = 1 where b > a (or a nan), 1/2 where a = b, else 0"""
        return _extreme_pair_grads(g, a, b, np.greater)
    return from_op(out, 'maximum', (a, b), backward, saved=(a, b))


def minimum(a, b):
    a, b = _operands(a, b)
    out = _broadcast_op('minimum', np.minimum, a, b)

    def backward(g):
        """d min(a,b)/da = 1 where a < b (or a nan), 1/2 where a = b, else 0
        d min(a,b)/db = 1 where b < a (or a nan), 1/2 where a = b, else 0"""
        return _extreme_pair_grads(g, a, b, np.less)
    return from_op(out, 'minimum', (a, b), backward, saved=(a, b))


def where(condition, a, b):
    """where(cond, a, b): a where cond is true, else b (broadcasting all three)."""
    cond = condition.array if isinstance(condition, Tensor) else condition
    a, b = _operands(a, b)
    try:
        out = np.where(cond, a.array, b.array)
    except ValueError:
        raise ValueError(f"where: shapes {tuple(np.shape(cond))}, {tuple(a.shape)} and "
                         f"{tuple(b.shape)} cannot be broadcast together") from None
    c = np.asarray(cond)
    if not (c.flags.c_contiguous and a.array.flags.c_contiguous and b.array.flags.c_contiguous):
        out = _in_torch_order(out, c, a.array, b.array)  # as PyTorch's (section 6b)

    def backward(g, sa=a.shape, sb=b.shape):
        """d where(c,a,b)/da = 1 where c, else 0
        d where(c,a,b)/db = 0 where c, else 1"""
        return (unbroadcast(np.where(cond, g, 0), sa) if a.requires_grad else None,
                unbroadcast(np.where(cond, 0, g), sb) if b.requires_grad else None)
    return from_op(out, 'where', (a, b), backward, saved=_tensors_in(condition))


def _fits(value, dtype, op):
    """A number to be written into an integer tensor must fit its dtype, as PyTorch checks
    (a float is truncated: 2.7 gives 2; nan, inf and 1e30 are refused)."""
    if dtype.kind not in 'iu':  # a float or bool tensor takes any number
        return value
    v = value.item() if isinstance(value, Tensor) and value.array.size == 1 else value
    if isinstance(v, (int, float, np.number)):
        info = np.iinfo(dtype)
        if isinstance(v, (float, np.floating)) and not math.isfinite(v) or not info.min <= v <= info.max:
            raise RuntimeError(f"{op}: value {v} cannot be converted to {dtype} without overflow")
    return value


def masked_fill(x, mask, value):
    """Positions where mask is true become `value`; they pass no gradient to x. A 0-d
    tensor value gets the gradient of the positions it filled. The result is row-major
    whatever x's layout, as PyTorch's (which clones x row-major, then fills it)."""
    return _fill_where(x, mask, value, 'masked_fill', row_major=True)


def _fill_where(x, mask, value, op, row_major):
    """masked_fill's work, and index_fill's (row_major=False: the result has x's layout,
    as PyTorch's index_fill)."""
    _fits(value, x.dtype, op)
    m = mask.array if isinstance(mask, Tensor) else np.asarray(mask)
    try:  # the result has the shape x and mask broadcast to (in place: x's own, checked there)
        shape = np.broadcast_shapes(x.shape, m.shape)
    except ValueError:
        raise ValueError(f"{op}: mask of shape {tuple(m.shape)} cannot be broadcast to the "
                         f"tensor's shape {tuple(x.shape)}") from None
    if shape != x.shape:
        x = expand(x, shape)
    v = None  # a 0-d tensor value, cast to x's dtype (in the graph)
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"{op}: only a 0-dim value tensor can fill, got one with "
                               f"{value.ndim} dim(s)")
        v = _as(value, x.dtype)
    m = m.astype(bool, copy=False)
    out = np.array(x.array, order='C') if row_major else _copy_keeping_layout(x.array)
    np.copyto(out, v.array if v is not None else np.asarray(value, dtype=x.dtype), where=m)

    def backward(g):
        """d masked_fill(x)/dx = 0 where the mask is true, else 1
        d masked_fill(x)/d value = 1 at each position it filled  (g summed there)"""
        gx = np.where(m, 0, g) if x.requires_grad else None
        if v is None or not v.requires_grad:
            return (gx,) if v is None else (gx, None)
        return gx, np.asarray(np.where(m, g, 0).sum(), dtype=g.dtype)
    parents = (x,) if v is None else (x, v)
    return from_op(out, op, parents, backward, saved=_tensors_in(mask))


clamp_min = lambda x, min: clamp(x, min=min)
clamp_max = lambda x, max: clamp(x, max=max)


# The smaller elementwise functions, one table: each row is the function on arrays, what
# its rule reads ('x' the input, 'y' the output, None nothing), the derivative as a
# function of that (or a number, where it is one) and the rule's math, which grad_path
# prints. A rule saves only what it reads: a later in-place change of anything else is
# fine (section 8 guards what is saved), as PyTorch's rules save (1/x reads its output).
_FUNCTIONS = {
    'square': (np.square, 'x', lambda x: 2 * x, "d x^2/dx = 2x"),
    'rsqrt': (lambda x: 1 / np.sqrt(x), 'y', lambda y: -0.5 * y ** 3, "d x^(-1/2)/dx = -x^(-3/2) / 2"),
    'reciprocal': (lambda x: 1 / x, 'y', lambda y: -y * y, "d (1/x)/dx = -1/x^2"),
    'log2': (np.log2, 'x', lambda x: 1 / (x * math.log(2)), "d log2(x)/dx = 1/(x ln 2)"),
    'log10': (np.log10, 'x', lambda x: 1 / (x * math.log(10)), "d log10(x)/dx = 1/(x ln 10)"),
    'exp2': (np.exp2, 'y', lambda y: y * math.log(2), "d 2^x/dx = 2^x ln 2"),
    'sinh': (np.sinh, 'x', np.cosh, "d sinh(x)/dx = cosh(x)"),
    'cosh': (np.cosh, 'x', np.sinh, "d cosh(x)/dx = sinh(x)"),
    'asin': (np.arcsin, 'x', lambda x: 1 / np.sqrt(1 - x * x), "d asin(x)/dx = 1/sqrt(1 - x^2)"),
    'acos': (np.arccos, 'x', lambda x: -1 / np.sqrt(1 - x * x), "d acos(x)/dx = -1/sqrt(1 - x^2)"),
    'atan': (np.arctan, 'x', lambda x: 1 / (1 + x * x), "d atan(x)/dx = 1/(1 + x^2)"),
    'asinh': (np.arcsinh, 'x', lambda x: 1 / np.sqrt(x * x + 1), "d asinh(x)/dx = 1/sqrt(x^2 + 1)"),
    'acosh': (np.arccosh, 'x', lambda x: 1 / np.sqrt(x * x - 1), "d acosh(x)/dx = 1/sqrt(x^2 - 1)"),
    'atanh': (np.arctanh, 'x', lambda x: 1 / (1 - x * x), "d atanh(x)/dx = 1/(1 - x^2)"),
    'frac': (lambda x: x - np.trunc(x), None, 1, "d frac(x)/dx = 1"),
    # steps: flat almost everywhere, so their gradient is 0 (as PyTorch's)
    'sign': (lambda x: np.where(np.isnan(x), 0, np.sign(x)), None, 0,
             "d sign(x)/dx = 0"),  # sign(nan) is 0, as PyTorch's
    'floor': (np.floor, None, 0, "d floor(x)/dx = 0"),
    'ceil': (np.ceil, None, 0, "d ceil(x)/dx = 0"),
    'round': (np.round, None, 0, "d round(x)/dx = 0"),
    'trunc': (np.trunc, None, 0, "d trunc(x)/dx = 0"),
}
_KEEP_INTEGERS = ('square', 'sign', 'floor', 'ceil', 'round', 'trunc')  # int in, int out


def _function(name):
    fn, reads, derivative, words = _FUNCTIONS[name]

    def op(x):
        if name == 'frac' and x.dtype.kind != 'f':
            raise TypeError(f"frac: a {x.dtype} tensor has no fractional part (as PyTorch: "
                            "frac is for float tensors)")
        if x.dtype == bool_ and name in ('floor', 'ceil', 'round', 'trunc'):
            raise TypeError(f"{name}: bool inputs are not supported (as in PyTorch)")
        if x.dtype == bool_ and name == 'sign':
            return _constant(_copy_keeping_layout(x.array))  # a bool is its own sign
        if x.dtype == bool_ and name == 'square':
            x = _constant(x.array.astype(int64))  # PyTorch: an int64 result
        elif name not in _KEEP_INTEGERS:
            x = _floating(x)
        with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
            out = fn(x.array).astype(x.dtype, copy=False)

        def backward(g):
            """d f(x)/dx: its row of _FUNCTIONS (the words, set below)"""
            if reads is None:  # 1: g itself; 0: zeros, even where g is nan (as PyTorch)
                return (g if derivative == 1 else np.zeros_like(g),)
            with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
                slope = derivative(x.array if reads == 'x' else out)
                return (g * slope.astype(g.dtype, copy=False),)
        backward.__doc__ = words
        return from_op(out, name, (x,), backward, saved=(x,) if reads == 'x' else (),
                       saves_output=reads == 'y')
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{name}(x), elementwise; {words}."
    return op


square, rsqrt, reciprocal, log2, log10, exp2, sinh, cosh, asin, acos, atan, asinh, acosh, atanh, \
    frac, sign, floor, ceil, round, trunc = (_function(name) for name in _FUNCTIONS)
arcsin, arccos, arctan, arcsinh, arccosh, arctanh, fix = asin, acos, atan, asinh, acosh, atanh, trunc


def atan2(input, other):
    """The angle of the point (other, input): atan(input / other) in the right quadrant."""
    a, b = _operands(input, other, floating=True)
    # float32 in float64, rounded once: NumPy's float32 arctan2 can be an ulp off (atan2(1, 1)
    # would be below the float32 nearest pi/4, and x % atan2(1, 1) jump by a whole period)
    out = _broadcast_op('atan2', lambda p, q: np.arctan2(p, q, dtype=np.float64).astype(p.dtype), a, b)

    def backward(g):
        """d atan2(a,b)/da = b / (a^2 + b^2)
        d atan2(a,b)/db = -a / (a^2 + b^2)"""
        r = a.array * a.array + b.array * b.array
        # 1/r, but 0 where r is 0: at the origin there is no derivative and PyTorch answers 0
        recip = np.divide(1, r, out=np.zeros_like(r), where=r != 0)
        return (unbroadcast(g * b.array * recip, a.shape) if a.requires_grad else None,
                unbroadcast(-g * a.array * recip, b.shape) if b.requires_grad else None)
    return from_op(out, 'atan2', (a, b), backward, saved=(a, b))


arctan2 = atan2


def sinc(x):
    """sin(pi x) / (pi x), and 1 at x = 0 (the normalized sinc, as PyTorch's)."""
    x = _floating(x)
    with np.errstate(divide='ignore', invalid='ignore'):  # 0/0 at x = 0 (then 1), sinc(inf) = nan
        out = np.where(x.array == 0, 1, np.sin(np.pi * x.array) / (np.pi * x.array))

    def backward(g):
        """d sinc(x)/dx = (pi x cos(pi x) - sin(pi x)) / (pi x^2)  (0 where pi x^2 is 0, as PyTorch)"""
        px, pxx = np.pi * x.array, x.array * x.array * np.pi
        return (np.where(pxx == 0, 0, g * (px * np.cos(px) - np.sin(px)) / pxx).astype(g.dtype),)
    return from_op(out.astype(x.dtype, copy=False), 'sinc', (x,), backward, saved=(x,))


def logit(x, eps=None):
    """log(z / (1 - z)), the inverse of sigmoid, with z = x, or x clamped to [eps, 1 - eps]."""
    x = _floating(x)
    lo, hi = (0, 1) if eps is None else (eps, 1 - eps)
    z = x.array if eps is None else _clip(x.array, lo, hi)
    with np.errstate(divide='ignore', invalid='ignore'):  # logit(0) = -inf, logit(2) = nan, silently
        out = np.log(z / (1 - z)).astype(x.dtype, copy=False)

    def backward(g):
        """d logit(x)/dx = 1/(x (1 - x))  (0 outside [eps, 1 - eps]; without eps, nan outside [0, 1])"""
        a = x.array
        return (np.where((a < lo) | (a > hi), np.nan if eps is None else 0, g / (a * (1 - a))).astype(g.dtype),)
    return from_op(out, 'logit', (x,), backward, saved=(x,))


def _xlogy(x, y):
    """x log(y) of arrays, 0 where x is 0 (unless y is nan), as PyTorch's xlogy."""
    return np.where((x == 0) & ~np.isnan(y), 0, x * np.log(y))


def xlogy(input, other):
    """input * log(other), 0 where input is 0 (even at other = 0; nan at other = nan)."""
    a, b = _operands(input, other, floating=True)  # int tensors give float32, as PyTorch
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # log(0) = -inf, silently
        out = _broadcast_op('xlogy', _xlogy, a, b)

    def backward(g):
        """d xlogy(a,b)/da = log(b)  (xlogy(g, b); 0 where a = 0 and b <= 0, as PyTorch)
        d xlogy(a,b)/db = a/b"""
        ga = np.where((a.array == 0) & (b.array <= 0), 0, _xlogy(g, b.array)) if a.requires_grad else None
        gb = g * a.array / b.array if b.requires_grad else None
        return (None if ga is None else unbroadcast(ga.astype(g.dtype, copy=False), a.shape),
                None if gb is None else unbroadcast(gb, b.shape))
    return from_op(out.astype(a.dtype, copy=False), 'xlogy', (a, b), backward, saved=(a, b))


# Tests and logic give boolean tensors outside the graph (no gradient), as the comparisons
# do (section 3); so do the bitwise ops, and // and % give no gradient either (as PyTorch).
def _constant_op(fn, name):
    """An op outside the graph: a constant result from the tensors' values."""
    def op(a, b):
        a, b = _operands(a, b)
        return _constant(_broadcast_op(name, fn, a, b))
    op.__name__ = name
    return op


def remainder(a, b):
    """a - floor(a / b) * b: the sign of the divisor, as PyTorch (Python's %)."""
    return _modulo(a, b, _remainder, np.floor_divide, 'remainder')  # Python's a // b


def _remainder(a, b):
    """Python's % as PyTorch computes it: fmod, then + b where the signs differ (so a 0 keeps
    fmod's sign, the dividend's: -0.6 % 0.3 is -0.0, where np.remainder gives 0.0)."""
    mod = np.fmod(a, b)
    return np.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def fmod(a, b):
    """a - trunc(a / b) * b: the sign of the dividend (C's fmod)."""
    return _modulo(a, b, np.fmod, lambda a, b: np.trunc(a / b), 'fmod')


def _integer_division(a, b, name):
    """The operands of //, % and fmod, refused where PyTorch refuses them: for bools (the
    result would be a bool) and for an integer divisor of 0 (there is no integer answer)."""
    a, b = _operands(a, b)
    if a.dtype == bool_:
        raise NotImplementedError(f"{name}: not defined for bool tensors (as in PyTorch); "
                                  "convert them first, e.g. with .long()")
    if a.dtype.kind in 'iu' and (b.array == 0).any() and a.array.size:  # (an empty a: no division)
        raise RuntimeError(f"ZeroDivisionError: {name} of integers by 0 (as in PyTorch)")
    return a, b


def _modulo(a, b, fn, rounding, name):
    a, b = _integer_division(a, b, name)
    with np.errstate(divide='ignore', invalid='ignore'):  # x % 0.0 is nan, silently
        out = _broadcast_op(name, fn, a, b)

    def backward(g):
        """d mod(a,b)/da = 1
        d mod(a,b)/db = -q, the quotient in mod(a,b) = a - q b (floor or trunc of a/b)"""
        with np.errstate(divide='ignore', invalid='ignore'):
            gb = -g * rounding(a.array, b.array) if b.requires_grad else None
        return (unbroadcast(g, a.shape) if a.requires_grad else None,
                None if gb is None else unbroadcast(gb.astype(g.dtype, copy=False), b.shape))
    # saved: what the rule reads, both operands for b's gradient (a's is g itself)
    return from_op(out, name, (a, b), backward, saved=(a, b) if b.requires_grad else ())


def floor_divide(a, b):
    """floor(a / b). In the graph, but without a gradient: PyTorch defines none either."""
    a, b = _integer_division(a, b, 'floor_divide')

    def backward(g):
        """d floor(a/b)/da: not defined (PyTorch raises too)
        d floor(a/b)/db: not defined"""
        raise RuntimeError("backward through floor_divide (//): its derivative is not "
                           "implemented (as in PyTorch); use torch-style a / b and floor()")
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # 1.0 // 0 = inf, silently
        return from_op(_broadcast_op('floor_divide', np.floor_divide, a, b), 'floor_divide',
                       (a, b), backward)
bitwise_and, bitwise_or, bitwise_xor = (_constant_op(f, n) for f, n in (
    (np.bitwise_and, 'bitwise_and'), (np.bitwise_or, 'bitwise_or'), (np.bitwise_xor, 'bitwise_xor')))
logical_and, logical_or, logical_xor = (_constant_op(f, n) for f, n in (
    (np.logical_and, 'logical_and'), (np.logical_or, 'logical_or'), (np.logical_xor, 'logical_xor')))


def _bitwise_not(x):
    if x.dtype.kind == 'f':
        raise TypeError("bitwise_not: ~ is for bool and integer tensors, got a float one")
    return _constant(np.invert(x.array))


def logical_not(x):
    return _constant(np.logical_not(x.array))


def isnan(x):
    return _constant(np.isnan(x.array))


def isinf(x):
    return _constant(np.isinf(x.array))


def isfinite(x):
    return _constant(np.isfinite(x.array))


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
        raise RuntimeError(f"isclose: {a.dtype} did not match {b.dtype} (as in PyTorch)")
    a, b = _operands(a, b)
    out = np.isclose(a.array, b.array, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if not (a.array.flags.c_contiguous and b.array.flags.c_contiguous):
        out = _in_torch_order(out, a.array, b.array)  # as PyTorch's a == b (section 6b)
    return _constant(out)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(isclose(a, b, rtol, atol, equal_nan).array.all())


@_numpy_keywords  # x.any(axis=, keepdims=) too, as PyTorch
def any(x, dim=None, keepdim=False):
    """Whether any element (along dim) is non-zero: a bool tensor."""
    return _constant(np.any(x.array, axis=_dims(dim, x.ndim, 'any') if dim is not None else None,
                            keepdims=keepdim))


@_numpy_keywords  # x.all(axis=, keepdims=) too, as PyTorch
def all(x, dim=None, keepdim=False):
    return _constant(np.all(x.array, axis=_dims(dim, x.ndim, 'all') if dim is not None else None,
                            keepdims=keepdim))


def equal(input, other):
    """torch.equal: True if both have the same shape and the same values (nan is not equal
    to nan; the dtypes may differ: tensor([1, 2]) equals tensor([1., 2.]))."""
    for name, t in (('input', input), ('other', other)):
        if not isinstance(t, Tensor):
            raise TypeError(f"equal(): argument '{name}' must be a Tensor, not "
                            f"{type(t).__name__}")
    return input.shape == other.shape and bool(np.array_equal(input.array, other.array))


multiply = mul


_methods(sqrt=sqrt, abs=abs, sin=sin, cos=cos, tanh=tanh, sigmoid=sigmoid, log1p=log1p,
         expm1=expm1, erf=erf, gelu=gelu, clamp=clamp, maximum=maximum, minimum=minimum,
         masked_fill=masked_fill, __abs__=abs, clip=clamp, clamp_min=clamp_min,
         clamp_max=clamp_max, square=square, rsqrt=rsqrt, reciprocal=reciprocal, log2=log2,
         log10=log10, exp2=exp2, sinh=sinh, cosh=cosh, asin=asin, acos=acos, atan=atan, frac=frac,
         sign=sign, floor=floor, ceil=ceil, round=round, trunc=trunc, atan2=atan2, arcsin=asin,
         arccos=acos, arctan=atan, arctan2=atan2, fix=trunc, asinh=asinh, acosh=acosh, atanh=atanh,
         arcsinh=asinh, arccosh=acosh, arctanh=atanh, sinc=sinc, logit=logit, xlogy=xlogy,
         __floordiv__=floor_divide, __mod__=remainder,
         __rfloordiv__=lambda self, other: floor_divide(other, self),
         __rmod__=lambda self, other: remainder(other, self), __and__=bitwise_and,
         __or__=bitwise_or, __xor__=bitwise_xor, __rand__=bitwise_and, __ror__=bitwise_or,
         __rxor__=bitwise_xor, floor_divide=floor_divide, remainder=remainder, fmod=fmod,
         logical_and=logical_and, logical_or=logical_or, logical_xor=logical_xor,
         __invert__=_bitwise_not, bitwise_not=_bitwise_not, logical_not=logical_not, isnan=isnan,
         isinf=isinf, isfinite=isfinite, isclose=isclose, allclose=allclose, any=any, all=all,
         tan=tan, equal=equal, multiply=multiply,
         where=lambda x, condition, other: where(condition, x, other))


# ---------------------------------------------------------------------------
# 10. Reductions
# ---------------------------------------------------------------------------
def _no_dim(dim):
    """dim=None or dim=(): the whole tensor is reduced."""
    return dim is None or isinstance(dim, (tuple, list)) and len(dim) == 0


def _centered(x, dim, correction, unbiased, op, keepdim):
    """What var and std share: the axes, x - mean, the divisor N - correction."""
    if unbiased is not None and dim is None and keepdim is not None:  # keepdim None: not given
        raise TypeError(f"{op}: unbiased= with keepdim= needs a dim (PyTorch's {op}(unbiased) "
                        f"takes no keepdim): give dim, or use correction= instead of unbiased")
    if x.dtype.kind not in 'fc':
        raise TypeError(f"{op}: only a float tensor has a {op}, got {x.dtype}; convert it with .float()")
    if unbiased is not None:
        correction = 1 if unbiased else 0
    axes = _dims(dim, x.ndim, op)
    n = math.prod(x.shape[a] for a in axes)
    # x - mean as (x - first) - mean(x - first): equal values give exactly 0, as PyTorch's
    # running mean (np.mean of three -0.7s is -0.7000000000000001)
    first = x.array[tuple(slice(0, 1) if a in axes else slice(None) for a in range(x.ndim))]
    shifted = x.array - np.where(np.isfinite(first), first, 0)  # (an inf first: no shift)
    with np.errstate(invalid='ignore'):  # inf - inf and the mean of nothing are nan, silently
        mean = np.mean(shifted, axis=axes, keepdims=True) if n else shifted.sum(axes, keepdims=True) / n
        return axes, shifted - mean, n - correction


@_numpy_keywords  # x.var(axis=, keepdims=) too, as PyTorch
def var(x, dim=None, *, correction=1, keepdim=None, unbiased=None):
    """Variance sum((x - mean)^2) / (N - correction); correction=1 is Bessel's (the default).
    With N <= correction the divisor is 0, as in PyTorch: the variance is inf (nan if all
    the values are equal)."""
    axes, centered, dof = _centered(x, dim, correction, unbiased, 'var', keepdim)
    keepdim = bool(keepdim)
    with np.errstate(divide='ignore', invalid='ignore'):
        out = np.sum(centered * centered, axis=axes, keepdims=keepdim) / builtins.max(dof, 0)

    def backward(g, xs=x.shape):
        """d var / dx_i = 2 (x_i - mean) / (N - correction)"""
        g = _expand_back(g, xs, axes, keepdim)
        if dof <= 0 and x.array.size and (_no_dim(dim) or len(xs) == 0):  # PyTorch's (0-d too): nan
            same = x.array == np.mean(x.array, axis=axes, keepdims=True)  # where x_i == mean,
            return (g * np.where(same, np.nan, np.inf).astype(g.dtype),)  # else inf
        with np.errstate(divide='ignore', invalid='ignore'):
            return (g * centered * (np.float64(2.0) / dof).astype(g.dtype),)
    return from_op(_row_major(out), 'var', (x,), backward)


@_numpy_keywords  # x.std(axis=, keepdims=) too, as PyTorch
def std(x, dim=None, *, correction=1, keepdim=None, unbiased=None):
    """sqrt(var), one op, so that its gradient at zero spread is 0 (as PyTorch), not 0/0."""
    axes, centered, dof = _centered(x, dim, correction, unbiased, 'std', keepdim)
    keepdim = bool(keepdim)
    with np.errstate(divide='ignore', invalid='ignore'):
        out = np.sqrt(np.sum(centered * centered, axis=axes, keepdims=True) / builtins.max(dof, 0))

    def backward(g, xs=x.shape):
        """d std / dx_i = (x_i - mean) / ((N - correction) std),  0 where std = 0"""
        g = _expand_back(g, xs, axes, keepdim)
        with np.errstate(divide='ignore', invalid='ignore'):
            if dof <= 0 and _no_dim(dim):  # as PyTorch: var's inf/nan, times 1 / (2 std) = 0
                var_grad = np.where(centered == 0, np.nan, np.inf).astype(g.dtype)
                return (g * np.where(out == 0, 0, 0.5 / out) * var_grad,)
            return (np.where(out == 0, 0, g * (centered / (dof * out))),)  # 0 even for g = nan
    return from_op(_row_major(out if keepdim else np.squeeze(out, axis=axes)), 'std', (x,), backward,
                   saves_output=True)  # backward reads out


def _extreme(x, dim, keepdim, op, fn, select=False):
    axes = _dims(dim, x.ndim, op)
    if builtins.any(x.shape[a] == 0 for a in axes):
        raise RuntimeError(f"{op}: cannot reduce over an empty dim (tensor of shape "
                           f"{tuple(x.shape)}): the {op[1:]} of no values is undefined")
    out = fn(x.array, axis=axes, keepdims=True)
    mask = x.array == out
    if select:  # max() and min() of the whole tensor: a nan is the extreme (it gets g)
        mask |= np.isnan(x.array) & np.isnan(out)
    count = np.sum(mask, axis=axes, keepdims=True).astype(x.dtype)
    res = out if keepdim else np.squeeze(out, axis=axes)

    def backward(g, xs=x.shape):
        """d amax / dx_i = [x_i == amax] / count  (the tied extremes share it evenly, as PyTorch)"""
        # PyTorch's amax multiplies by the mask (a nan upstream reaches every element, and
        # a nan amax, equal to no element, gives g / 0 * 0: nan); its max() of the whole
        # tensor selects
        with np.errstate(divide='ignore', invalid='ignore'):
            share = _expand_back(g, xs, axes, keepdim) / count
            return (np.where(mask, share, 0) if select else share * mask,)
    return from_op(_row_major(res), op, (x,), backward)


@_numpy_keywords  # x.amax(axis=, keepdims=) too, as PyTorch
def amax(x, dim=None, keepdim=False):
    return _extreme(x, dim, keepdim, 'amax', np.max)


@_numpy_keywords  # x.amin(axis=, keepdims=) too, as PyTorch
def amin(x, dim=None, keepdim=False):
    return _extreme(x, dim, keepdim, 'amin', np.min)


def _on_0d(fn, x, *args):
    """PyTorch lets dim 0 (or -1) of a 0-d tensor name a dim of size 1: fn on x seen as
    shape (1,), then the result (or each of a pair of results) seen as 0-d again."""
    out = fn(reshape(x, 1), 0, *args)
    if isinstance(out, tuple):
        return type(out)(*(reshape(t, ()) for t in out))
    return reshape(out, ())


MaxResult = namedtuple('max', ['values', 'indices'])
MinResult = namedtuple('min', ['values', 'indices'])


def _extreme_dim(x, dim, keepdim, op, argfn, result):
    d = _dim(dim, x.ndim, op)
    if x.ndim == 0:
        return _on_0d(lambda t, d: _extreme_dim(t, d, keepdim, op, argfn, result), x)
    if x.ndim and x.shape[d] == 0:
        raise RuntimeError(f"{op}: cannot reduce over an empty dim (tensor of shape "
                           f"{tuple(x.shape)}, dim {dim})")
    idx = np.expand_dims(argfn(x.array, axis=d), d)  # first extreme, as PyTorch on the CPU
    values = np.take_along_axis(x.array, idx, axis=d)

    def backward(g, xs=x.shape):
        """d max(dim) / dx_i = 1 at the index returned, else 0"""
        gx = np.zeros_like(g, shape=xs)
        np.put_along_axis(gx, idx, g if keepdim else np.expand_dims(g, d), axis=d)
        return (gx,)
    if keepdim:
        return result(from_op(_row_major(values), op, (x,), backward), Tensor(_row_major(idx)))
    return result(from_op(_row_major(np.squeeze(values, d)), op, (x,), backward),
                  Tensor(_row_major(np.squeeze(idx, d))))


@_numpy_keywords  # x.max(axis=, keepdims=) too, as PyTorch
def max(x, dim=None, keepdim=False):
    """max() -> the largest value; max(dim) -> (values, indices); max(other) -> maximum."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return _extreme(x, None, False, 'max', np.max, select=True)
    return _extreme_dim(x, dim, keepdim, 'max', np.argmax, MaxResult)


@_numpy_keywords  # x.min(axis=, keepdims=) too, as PyTorch
def min(x, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return _extreme(x, None, False, 'min', np.min, select=True)
    return _extreme_dim(x, dim, keepdim, 'min', np.argmin, MinResult)


@_numpy_keywords  # x.logsumexp(axis=, keepdims=) too, as PyTorch
def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) computed as m + log(sum(exp(x - m))) with m the max (no overflow)."""
    x = _floating(x)
    if isinstance(dim, (tuple, list)) and len(dim) == 0 and x.array.size and x.ndim and not keepdim:
        # PyTorch reduces every dim for dim=() but refuses to drop them (keepdim=True works)
        raise RuntimeError("logsumexp: dim=() with keepdim=False is refused, as in PyTorch; "
                           "give the dims to reduce (dim=tuple(range(x.ndim)) for all)")
    axes = _dims(dim, x.ndim, 'logsumexp')
    m = np.max(x.array, axis=axes, keepdims=True, initial=-np.inf)  # -inf for an empty dim
    m = np.where(np.isfinite(m), m, 0)  # an all -inf slice gives -inf, not nan
    with np.errstate(divide='ignore', over='ignore', invalid='ignore'):  # inf and nan, silently
        out = np.log(np.sum(np.exp(x.array - m), axis=axes, keepdims=True)) + m

    def backward(g):
        """d logsumexp / dx_i = exp(x_i - logsumexp) = softmax(x)_i"""
        return (_expand_back(g, x.shape, axes, keepdim) * np.exp(x.array - out),)
    return from_op(_row_major(out if keepdim else np.squeeze(out, axis=axes)), 'logsumexp', (x,), backward,
                   saved=(x,), saves_output=True)


def _no_out(out, what):
    """out=...: tinytorch returns new tensors and writes into none; any out but None is one
    line."""
    if out is not None:
        raise RuntimeError(f"{what}: tinytorch has no out= (it writes into no tensor); use the "
                           f"result instead: y = torch.{what}(...), or y.copy_(torch.{what}(...))")


@_numpy_keywords  # x.norm(axis=, keepdims=) too, as PyTorch
def norm(input, p='fro', dim=None, keepdim=False, out=None, dtype=None):
    """The vector p-norm over dim (all elements by default): (sum |x|^p)^(1/p);
    'fro' and 2 are the Euclidean norm, inf the largest |x|, -inf the smallest,
    0 the number of non-zero elements. dtype: computed in that (as wide or wider) dtype."""
    x = input
    _no_out(out, 'norm')
    if x.dtype.kind != 'f':
        raise TypeError(f"norm: expected a floating point tensor, got {x.dtype}")
    if dtype is not None:  # x cast first (differentiably), never narrowed, as PyTorch
        if np.promote_types(x.dtype, dtype) != np.dtype(dtype):
            raise RuntimeError(f"norm: the dtype of the input ({x.dtype}) should be convertible "
                               f"without narrowing to the specified dtype ({np.dtype(dtype)})")
        x = to(x, dtype)
    if p == 'fro':  # PyTorch's 'fro' is a matrix norm: over 2 dims at most
        if isinstance(dim, (tuple, list)) and len(dim) > 2:
            raise RuntimeError(f"norm: p='fro' takes at most 2 dims, got {tuple(dim)}; use "
                               "p=2 for the Euclidean norm over more (as in PyTorch)")
        p = 2
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise ValueError(f"norm: p must be a number, inf or 'fro', got {p!r}")
    axes = _dims(dim, x.ndim, 'norm')
    ax = np.abs(x.array)
    if p == math.inf or p == -math.inf:
        out = (np.max if p > 0 else np.min)(ax, axis=axes, keepdims=True)
    elif p == 0:
        out = np.sum(ax != 0, axis=axes, keepdims=True).astype(x.dtype)
    else:
        with np.errstate(over='ignore', invalid='ignore'):  # 1e30 ** 2 = inf, silently, as PyTorch
            out = np.sum(ax ** p, axis=axes, keepdims=True) ** (1.0 / p)

    def backward(g, xs=x.shape):
        """d norm / dx_i = sign(x_i) |x_i|^(p-1) / norm^(p-1)  (0 where the norm is 0; p = inf: to the largest |x_i|; p = 0: none)"""
        if p == 0:  # a count of non-zeros is flat in x: no gradient at all (not zeros, which
            return (None,)  # the op before would multiply: 0 * nan is nan), as PyTorch
        g = _expand_back(g, xs, axes, keepdim)
        sign = np.where(np.isnan(x.array), 0, np.sign(x.array))  # PyTorch's sign(nan) is 0
        with np.errstate(divide='ignore', invalid='ignore'):
            if p == math.inf or p == -math.inf:  # to the extreme elements (and nans), ties share
                hit = (ax == out) | np.isnan(ax)  # evenly; multiplied by the mask, as PyTorch
                return (sign * (g / np.sum(hit, axis=axes, keepdims=True) * hit).astype(g.dtype),)
            if p == 1:  # d/dx_i = sign(x_i)
                return (g * sign,)
            # written as PyTorch's rule: a 0 where the norm is 0 is selected, a 0 element
            # multiplies (so it is nan where the norm is nan)
            if p == 2:  # d/dx_i = x_i / norm
                return (g * np.where(out == 0, 0, x.array / out),)
            if p < 1:  # d/dx_i = sign(x_i) |x_i|^(p-1) norm^(1-p), the inf at x_i = 0 taken as 0
                return (sign * np.where(ax == 0, 0, ax ** (p - 1)) * g * out ** (1 - p),)
            # d/dx_i = sign(x_i) |x_i|^(p-1) / norm^(p-1)
            return (sign * ax ** (p - 1) * np.where(out == 0, 0, g / out ** (p - 1)),)
    return from_op(_row_major(out if keepdim else np.squeeze(out, axis=axes)), 'norm', (x,), backward,
                   saved=(x,) if p != 0 else (), saves_output=p not in (0, 1))  # what it reads


@_numpy_keywords  # x.prod(axis=, keepdims=) too, as PyTorch
def prod(x, dim=None, keepdim=False):
    """The product of the elements (over one dim, or all of them)."""
    axes = _dims(dim, x.ndim, 'prod') if dim is None else (_dim(dim, x.ndim, 'prod'),)
    if x.ndim == 0:  # one element is its own product
        data = x.array.astype(int64) if x.dtype.kind in 'biu' else x.array.copy()

        def backward_0d(g):
            """d prod / dx = 1  (even at x = inf or nan, as PyTorch)"""
            return (g,)
        return from_op(data, 'prod', (x,), backward_0d)
    with np.errstate(invalid='ignore', over='ignore'):  # 0 * inf is nan, silently, as PyTorch
        out = np.prod(x.array, axis=axes, keepdims=True)
    zeros = int(np.sum(x.array == 0))

    def backward(g, xs=x.shape):
        """d prod / dx_i = the product of the others (prod / x_i when no element is 0)"""
        # As PyTorch: with no 0 anywhere in x, prod / x_i (inf / inf is then nan); with a 0
        # anywhere, running products from both sides for every slice (no division: a -inf
        # gets a finite gradient, a nan reaches the others); prod() with two 0s: zeros
        if x.array.size == 0 or dim is None and zeros > 1:
            return (np.zeros(xs, g.dtype),)
        g = _expand_back(g, xs, axes, keepdim)
        with np.errstate(divide='ignore', invalid='ignore'):
            if zeros == 0:
                return (g * (out / x.array),)
            if dim is None:
                return (g * _prod_of_others(x.array.reshape(-1), 0).reshape(xs),)
            return (g * _prod_of_others(x.array, axes[0]),)
    return from_op(_row_major(out if keepdim else np.squeeze(out, axis=axes)), 'prod', (x,), backward,
                   saved=(x,), saves_output=True)


def _prod_of_others(a, d):
    """For each element along axis d, the product of the others: the running product of
    those before it times that of those after it ([a, b, c] -> [1 bc, a c, ab 1])."""
    n = a.shape[d]
    ones = np.ones_like(np.take(a, [0], axis=d))
    before = np.concatenate([ones, np.take(a, np.arange(n - 1), axis=d)], axis=d)
    after = np.concatenate([ones, np.flip(np.take(a, np.arange(1, n), axis=d), d)], axis=d)
    with np.errstate(invalid='ignore', over='ignore'):
        return _scan(np.cumprod, before, d) * np.flip(_scan(np.cumprod, after, d), d)


def cumsum(x, dim):
    """Running sums along dim: out_i = x_0 + ... + x_i."""
    d = _dim(dim, x.ndim, 'cumsum')
    if x.ndim == 0:
        return _on_0d(cumsum, x)
    data = x.array.astype(int64) if x.dtype.kind in 'biu' else x.array  # ints sum as int64

    def backward(g):
        """d cumsum_j / dx_i = 1 for j >= i: dx_i = g_i + ... + g_last"""
        return (np.flip(_scan(np.cumsum, np.flip(g, d), d), d),)
    out = _scan(np.cumsum, data, d)
    if out.dtype.kind == 'f':
        out += 0.0  # PyTorch's running sum starts at +0.0: a run of -0.0 sums to +0.0
    return from_op(_row_major(out), 'cumsum', (x,), backward)


def _scan(fn, a, d):
    """np.cumsum or np.cumprod along d; float32 adds up in float64, then rounds each running
    value once, as PyTorch's CPU scans do (1.86 - 0.04 - 1.82 is then -3.7e-8, not 0)."""
    with np.errstate(invalid='ignore', over='ignore'):  # inf - inf = nan, silently, as PyTorch
        if a.dtype == np.float32:
            return fn(a, axis=d, dtype=np.float64).astype(a.dtype)
        return fn(a, axis=d)


def cumprod(x, dim):
    """Running products along dim: out_i = x_0 * ... * x_i."""
    d = _dim(dim, x.ndim, 'cumprod')
    if x.ndim == 0:
        return _on_0d(cumprod, x)
    data = x.array.astype(int64) if x.dtype.kind in 'biu' else x.array  # ints multiply as int64
    out = _scan(np.cumprod, data, d)

    def backward(g, xs=x.shape):
        """d cumprod_j / dx_i = prod_{k <= j, k != i} x_k for j >= i"""
        if xs[d] == 1:  # out = x (PyTorch returns g as it is, even at inf or nan)
            return (g,)

        def rev_cumsum(a):
            return np.flip(np.cumsum(np.flip(a, d), axis=d), d)
        zero = x.array == 0
        with np.errstate(divide='ignore', invalid='ignore'):
            if not zero.any():  # sum over j >= i of g_j out_j / x_i: a reversed running sum
                return ((rev_cumsum(g * out) / x.array).astype(x.dtype, copy=False),)
            # as PyTorch: before a line's first zero z1, as above; at z1, out_{z1-1} times
            # sum_{z1 <= j < z2} g_j prod_{z1 < k <= j} x_k (g set to 0 outside [z1, z2), the
            # running product not: 0 * inf is nan); after z1, 0 (selected, never g * 0)
            zeros_so_far = np.cumsum(zero, axis=d)
            before, first = zeros_so_far == 0, zero & (zeros_so_far == 1)
            gx = np.where(before, rev_cumsum(np.where(before, g * out, 0)) / np.where(before, x.array, 1), 0)
            segment = zeros_so_far == 1
            inner = np.cumprod(np.where(segment & ~first, x.array, 1), axis=d)
            total = np.sum(np.where(segment, g, 0) * inner, axis=d, keepdims=True)
            previous = np.concatenate([np.ones_like(np.take(out, [0], axis=d)),
                                       np.take(out, np.arange(xs[d] - 1), axis=d)], axis=d)
            gx = np.where(first, previous * total, gx)
        return (gx.astype(x.dtype, copy=False),)
    return from_op(_row_major(out), 'cumprod', (x,), backward, saved=(x,), saves_output=True)


CummaxResult = namedtuple('cummax', ['values', 'indices'])
CumminResult = namedtuple('cummin', ['values', 'indices'])


def _cumulative_extreme(x, dim, op, better, result):
    """The running max (or min) along dim, and where each was found (the last of ties, as
    PyTorch); the gradient goes to that position."""
    d = _dim(dim, x.ndim, op)
    if x.ndim == 0:
        return _on_0d(lambda t, d: _cumulative_extreme(t, d, op, better, result), x)
    xs = np.moveaxis(x.array, d, 0)
    values, idx = np.empty_like(xs), np.zeros(xs.shape, dtype=int64)
    values[:1] = xs[:1]  # (an empty dim has no first value)
    for i in range(1, xs.shape[0]):  # one step per position along dim, vectorised across
        take = better(xs[i], values[i - 1]) | (xs[i] == values[i - 1]) | np.isnan(xs[i])
        values[i] = np.where(take, xs[i], values[i - 1])
        idx[i] = np.where(take, i, idx[i - 1])
    values, idx = np.moveaxis(values, 0, d), np.moveaxis(idx, 0, d)

    def backward(g, xs=x.shape):
        """d cummax_j / dx_i = 1 where the running extreme at j was found at i"""
        gx = np.zeros_like(g, shape=xs)
        np.add.at(np.moveaxis(gx, d, 0), (np.moveaxis(idx, d, 0),) + tuple(np.indices(
            np.moveaxis(idx, d, 0).shape, sparse=True)[1:]), np.moveaxis(g, d, 0))
        return (gx,)
    return result(from_op(_row_major(values), op, (x,), backward), _constant(_row_major(idx)))


def cummax(x, dim):
    return _cumulative_extreme(x, dim, 'cummax', np.greater, CummaxResult)


def cummin(x, dim):
    return _cumulative_extreme(x, dim, 'cummin', np.less, CumminResult)


MedianResult = namedtuple('median', ['values', 'indices'])


@_numpy_keywords  # x.median(axis=, keepdims=) too, as PyTorch
def median(x, dim=None, keepdim=False):
    """The lower median (the smaller of the two middle values, as PyTorch); with dim, the
    pair (values, indices)."""
    if x.dtype == bool_:
        raise TypeError("median: bool inputs are not supported (as in PyTorch)")
    if dim is None:
        if x.array.size == 0:  # as PyTorch: nan (an integer dtype's smallest value)
            empty = np.array(np.nan if x.dtype.kind == 'f' else np.iinfo(x.dtype).min, x.dtype)

            def backward_empty(g):
                """d median / dx = nothing (x has no elements)"""
                return (np.zeros(x.shape, g.dtype),)
            return from_op(empty, 'median', (x,), backward_empty)
        value = median(reshape(x, -1).detach(), 0).values.array
        hit = np.isnan(x.array) if np.isnan(value) else x.array == value

        def backward(g):
            """d median / dx_i = 1/k for each of the k elements equal to it (or k nans)"""
            return (np.where(hit, g / np.sum(hit), 0).astype(g.dtype),)
        return from_op(value, 'median', (x,), backward, saved=(x,))
    d = _dim(dim, x.ndim, 'median')
    if x.ndim and x.shape[d] == 0:
        raise IndexError(f"median(): the reduced dim {d} has size 0 (shape {tuple(x.shape)}); "
                         "an empty dim has no median, as in PyTorch")
    values, indices = sort(x, d)  # nan sorts last
    n = x.shape[d] if x.ndim else 1
    nans = np.sum(np.isnan(x.array), axis=d, keepdims=True) if x.ndim else np.isnan(x.array)
    at = np.where(nans > 0, n - nans, (n - 1) // 2)  # a slice with a nan has median nan
    if not x.ndim:
        pick, where_ = values, indices
    else:
        pick = squeeze(take_along_dim(values, _constant(at.astype(int64)), d), d)
        where_ = _constant(np.squeeze(np.take_along_axis(indices.array, at.astype(int64), d), d))
    if keepdim and x.ndim:
        pick, where_ = unsqueeze(pick, d), unsqueeze(where_, d)
    return MedianResult(pick, where_)


SortResult = namedtuple('sort', ['values', 'indices'])
TopkResult = namedtuple('topk', ['values', 'indices'])


def _select_along(x, idx, d, op, result, layout=None):
    """values = x at idx along dim d, as a pair (values, indices); each value's gradient
    goes back to the position it came from. layout: an array whose order of dims in memory
    both take (sort's are x's, as PyTorch's), else row-major."""
    data = np.take_along_axis(x.array, idx, axis=d)
    if layout is not None:
        data, idx = _laid_out_as(data, layout), _laid_out_as(idx, layout)
    indices = _constant(idx)

    def backward(g, xs=x.shape):
        """d values_j / dx_i = 1 where value j came from position i"""
        gx = np.zeros_like(g, shape=xs)
        np.put_along_axis(gx, idx, g, axis=d)  # positions are distinct: no adding needed
        return (gx,)
    values = from_op(data, op, (x,), backward, saved=(indices,))  # the indices returned are the ones backward reads
    return result(values, indices)


def argsort(x, dim=-1, descending=False, stable=False):
    """The indices that sort x along dim (ties keep their order: a stable sort)."""
    d = _dim(dim, x.ndim, 'argsort')
    if x.ndim == 0:
        return _on_0d(argsort, x, descending)
    if not descending:
        idx = np.argsort(x.array, axis=d, kind='stable')
    else:  # descending and stable: sort the reversed array ascending, then reverse back
        n = x.shape[d] if x.ndim else 1
        idx = n - 1 - np.flip(np.argsort(np.flip(x.array, d), axis=d, kind='stable'), d)
    return _constant(_laid_out_as(idx.astype(int64), x.array))  # in x's layout, as PyTorch's


def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices) of x sorted along dim."""
    d = _dim(dim, x.ndim, 'sort')
    if x.ndim == 0:
        return _on_0d(sort, x, descending)
    return _select_along(x, argsort(x, d, descending).array, d, 'sort', SortResult, x.array)


def topk(x, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) elements along dim."""
    d = _dim(dim, x.ndim, 'topk')
    if x.ndim == 0:
        return _on_0d(lambda t, d: topk(t, k, d, largest, sorted), x)
    n = x.shape[d]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {n}")
    idx = np.take(argsort(x, d, descending=largest).array, np.arange(k), axis=d)
    return _select_along(x, idx, d, 'topk', TopkResult)


def _no_bool_arg(x, op):
    if x.dtype == bool_:
        raise TypeError(f"{op}(): does not support bool input (as in PyTorch); use .long()")


@_numpy_keywords  # x.argmax(axis=, keepdims=) too, as PyTorch
def argmax(x, dim=None, keepdim=False):
    _no_bool_arg(x, 'argmax')
    if dim is None:
        return Tensor(np.argmax(x.array))
    d = _dim(dim, x.ndim, 'argmax')
    if x.ndim == 0:
        return _on_0d(argmax, x, keepdim)
    return Tensor(np.argmax(x.array, axis=d, keepdims=keepdim))


@_numpy_keywords  # x.argmin(axis=, keepdims=) too, as PyTorch
def argmin(x, dim=None, keepdim=False):
    _no_bool_arg(x, 'argmin')
    if dim is None:
        return Tensor(np.argmin(x.array))
    d = _dim(dim, x.ndim, 'argmin')
    if x.ndim == 0:
        return _on_0d(argmin, x, keepdim)
    return Tensor(np.argmin(x.array, axis=d, keepdims=keepdim))


def bincount(input, weights=None, minlength=0):
    """torch.bincount: how often each value 0, 1, ... occurs in a 1-D int tensor (no
    gradient)."""
    if input.ndim != 1 or input.dtype.kind not in 'iu':
        raise RuntimeError(f"bincount: expected a 1-D integer tensor, got {input.ndim}-D "
                           f"{input.dtype}")
    w = None if weights is None else weights.array
    out = np.bincount(input.array, w, minlength)
    return _constant(out.astype(int64 if w is None else
                                (w.dtype if w.dtype == float32 else float64)))


@_numpy_keywords
def _norm_method(self, p='fro', dim=None, keepdim=False, dtype=None):
    """x.norm(...): torch.norm as PyTorch's method takes it (no out=: dtype is 4th)."""
    return norm(self, p, dim, keepdim, dtype=dtype)


_methods(cumprod=cumprod, cummax=cummax, cummin=cummin, median=median, var=var,
         std=std, amax=amax, amin=amin, max=max, min=min, logsumexp=logsumexp, norm=_norm_method,
         prod=prod, cumsum=cumsum, argsort=argsort, sort=sort, topk=topk, argmax=argmax,
         argmin=argmin,
         bincount=bincount)


# ---------------------------------------------------------------------------
# 11. Shape and indexing; views
# ---------------------------------------------------------------------------
# A view shares its base's memory: x.T, x[0], x.reshape(...) where NumPy can, detach().
# A change through one is seen through the other, and they share the version counter.
def clone(x):
    """A copy with x's layout (a transposed x gives a transposed copy), as PyTorch's."""
    def backward(g):
        """d clone(x)/dx = 1"""
        return (g,)
    return from_op(_copy_keeping_layout(x.array), 'clone', (x,), backward)


def _laid_out_as(a, like):
    """a (an array of like's shape) copied into like's order of dims in memory, unless it
    already lies so (sort's values and indices take the input's layout, as PyTorch's)."""
    out = _empty_in_layout_of(like, a.dtype)
    if out.strides == a.strides:
        return a
    np.copyto(out, a)
    return out


def _copy_keeping_layout(a):
    """A copy of a with a's order of dims in memory (a transposed matrix stays transposed,
    a transposed slice too) when no two of a's elements share memory; else (expand) a
    row-major copy, as PyTorch's clone."""
    out = _empty_in_layout_of(a)
    np.copyto(out, a)
    return out


def _empty_in_layout_of(a, dtype=None):
    """An empty array of a's shape whose dims lie in memory in a's order (gaps closed),
    as PyTorch's empty_like: when a is expanded, its dims of stride 0 keep their row-major
    place and the others are ordered by stride around them (infer_dense_strides). dtype:
    another than a's."""
    dtype = a.dtype if dtype is None else dtype
    if _overlaps(a):
        order = _torch_order(a.shape, a)  # as an op's result on a alone (section 6b)
    else:
        order = np.argsort([-s for s in a.strides], kind='stable')  # dims from outer to inner
    return np.empty(tuple(a.shape[i] for i in order), dtype).transpose(np.argsort(order))


def contiguous(x):
    """x itself when its elements lie in memory in row-major order, else such a copy."""
    if x.array.flags.c_contiguous:
        return x

    def backward(g):
        """d contiguous(x)/dx = 1"""
        return (g,)
    return from_op(np.ascontiguousarray(x.array), 'contiguous', (x,), backward)


def stride(x, dim=None):
    """How many elements apart x's neighbours lie in memory along each dim (NumPy's
    strides count bytes): (4, 1) for a 3x4 tensor, (1, 4) for its transpose."""
    steps = tuple(s // x.array.itemsize for s in x.array.strides)
    return steps if dim is None else steps[_dim(dim, x.ndim, 'stride')]


def is_contiguous(x):
    return bool(x.array.flags.c_contiguous)


def _get_data(x):
    """x.data, as PyTorch's: a tensor outside the graph that shares x's memory (a change
    made through it is not seen by the version counter, as in PyTorch)."""
    return _constant(x.array)


def _set_data(x, value):
    """x.data = t: x takes t's values (and shape), outside the graph."""
    if not isinstance(value, Tensor):
        raise TypeError(f"assigned data must be a Tensor, got {type(value).__name__}")
    x.array = value.array


def _as_numpy(x, dtype=None, copy=None):
    """np.asarray(tensor): its values as a NumPy array, as tensor.numpy() gives them (the
    same memory); np.array(tensor) asks for copy=True: a copy. copy=False: never a copy."""
    arr = x.numpy()
    if copy is False and dtype is not None and np.dtype(dtype) != arr.dtype:
        raise ValueError(f"np.array(tensor, copy=False): a {arr.dtype} tensor cannot be read as "
                         f"{np.dtype(dtype)} without a copy")
    if copy:
        return np.array(arr, dtype=dtype, copy=True)
    return arr if dtype is None else arr.astype(dtype, copy=False)


def _sizes(args):
    """Accept both f(2, 3) and f((2, 3))."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _view(out, x, remake):
    """out is a view of x's memory (a reshape, a transpose, x[0], ...). Remember its base
    (the tensor at the bottom of a chain of views) and how to make it again from the
    base, so that an in-place change through a view can rewrite the base's history and
    a change of the base can rewrite its views' (section 13)."""
    if x._view is None:
        base, make = x, remake
    else:  # a view of a view: made from the base in two steps
        base, first = x._view
        make = lambda t: remake(first(t))  # noqa: E731
    out._view = (base, make)
    if not (base.requires_grad and base._backward is None):  # a parameter's history never changes
        refs = getattr(base, '_views', None)  # weak references: a view can still be freed
        if refs is None:
            base._views = refs = []
        elif len(refs) >= 16 and len(refs) & (len(refs) - 1) == 0:  # at 16, 32, 64, ...
            refs[:] = [r for r in refs if r() is not None]  # forget the views that are gone
        refs.append(weakref.ref(out))
    return out


def _needs(args, op, what):
    if not args:
        raise TypeError(f"{op}() missing 1 required positional argument: '{what}'")


def reshape(x, *shape):
    """The same elements in a new shape: a view of x when its strides allow one (as
    view), else a copy."""
    _needs(shape, 'reshape', 'shape')
    shape = _sizes(shape)
    try:
        out = x.array.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} "
                         f"({x.array.size} elements) into {shape}") from None
    return _reshaped(x, out, shape)


def view(x, *shape):
    """The same memory seen in a new shape; refused where x's strides allow no view
    (a transposed matrix flattened, say): then reshape copies."""
    _needs(shape, 'view', 'size')
    shape = _sizes(shape)
    known = math.prod(n for n in shape if n != -1)
    if shape.count(-1) > 1 or (x.array.size != known if -1 not in shape else
                               known == 0 or x.array.size % known):
        raise ValueError(f"view: cannot view a tensor of shape {tuple(x.shape)} "
                         f"({x.array.size} elements) as {shape}")
    out = x.array.reshape(shape)
    if out.size and not np.may_share_memory(out, x.array):  # NumPy had to copy
        raise RuntimeError("view size is not compatible with input tensor's size and stride "
                           "(at least one dimension spans across two contiguous subspaces). "
                           "Use .reshape(...) instead.")
    return _reshaped(x, out, shape)


def _reshaped(x, out, shape):
    in_shape = x.shape  # (x's own shape may change later: unsqueeze_)

    def backward(g):
        """d reshape(x)/dx = 1  (the same numbers: g takes x's shape back)"""
        return (g.reshape(in_shape),)
    if out.size and not np.may_share_memory(out, x.array):  # NumPy had to copy: not a view
        return from_op(out, 'reshape', (x,), backward)
    return _view(from_op(out, 'reshape', (x,), backward, view_of=x), x, lambda t: reshape(t, shape))


def permute(x, *dims):
    _needs(dims, 'permute', 'dims')
    dims = _sizes(dims)
    axes = tuple(_dim(d, x.ndim, 'permute') for d in dims)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the {x.ndim} dims "
                         f"of a tensor of shape {tuple(x.shape)}")
    inverse = tuple(np.argsort(axes))

    def backward(g):
        """d permute(x)/dx = 1  (g's axes moved back by the inverse permutation)"""
        return (g.transpose(inverse),)
    return _view(from_op(x.array.transpose(axes), 'permute', (x,), backward, view_of=x),
                 x, lambda t: permute(t, axes))


def transpose(x, dim0, dim1):
    d0, d1 = _dim(dim0, x.ndim, 'transpose'), _dim(dim1, x.ndim, 'transpose')
    if x.ndim == 0:
        return view(x, ())  # a 0-d tensor's dims 0 and -1 are the same: itself, as a view

    def backward(g):
        """d transpose(x)/dx = 1  (g's two axes swapped back)"""
        return (np.swapaxes(g, d0, d1),)
    return _view(from_op(np.swapaxes(x.array, d0, d1), 'transpose', (x,), backward, view_of=x),
                 x, lambda t: transpose(t, d0, d1))


def unsqueeze(x, dim):
    d = _dim(dim, x.ndim + 1, 'unsqueeze')
    in_shape = x.shape  # (x's own shape may change later: unsqueeze_)

    def backward(g):
        """d unsqueeze(x)/dx = 1  (the added dim removed from g)"""
        return (g.reshape(in_shape),)
    return _view(from_op(np.expand_dims(x.array, d), 'unsqueeze', (x,), backward, view_of=x),
                 x, lambda t: unsqueeze(t, d))


def squeeze(x, dim=None):
    if dim is None:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    else:
        axes = tuple(a for a in _dims(dim, x.ndim, 'squeeze') if x.shape[a] == 1)
    out = np.squeeze(x.array, axis=axes)

    in_shape = x.shape  # (x's own shape may change later: unsqueeze_)

    def backward(g):
        """d squeeze(x)/dx = 1  (the removed dims put back into g)"""
        return (g.reshape(in_shape),)
    return _view(from_op(out, 'squeeze', (x,), backward, view_of=x),
                 x, lambda t: reshape(t, out.shape))


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, 1)
    s, e = _dim(start_dim, x.ndim, 'flatten'), _dim(end_dim, x.ndim, 'flatten')
    if s > e:
        raise RuntimeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    if s == e:
        return x  # nothing to flatten: x itself, as PyTorch returns it
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def ravel(input):
    """torch.ravel: the elements as one dim (a view where the memory allows, else a copy)."""
    return reshape(input, -1)


def expand(x, *sizes):
    sizes = _sizes(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: cannot expand shape {tuple(x.shape)} to {sizes} (fewer dims)")
    target = tuple(x.shape[i - lead] if (n == -1 and i >= lead) else n for i, n in enumerate(sizes))
    try:
        out = np.broadcast_to(x.array, target)
    except ValueError:
        raise ValueError(f"expand: shape {tuple(x.shape)} cannot be expanded to {sizes}") from None
    if not _overlaps(out):  # nothing repeated:
        out = np.lib.stride_tricks.as_strided(x.array, out.shape, out.strides)  # writable

    in_shape = x.shape  # (x's own shape may change later: unsqueeze_)

    def backward(g):
        """d expand(x)/dx = 1 for each copy  (g summed over the expanded dims)"""
        return (unbroadcast(g, in_shape),)
    return _view(from_op(out, 'expand', (x,), backward, view_of=x),
                 x, lambda t: expand(t, target))


def expand_copy(x, *sizes):
    """expand(x, sizes) in memory of its own, row-major, as PyTorch's expand_copy."""
    e = expand(x, *sizes)

    def backward(g):
        """d expand_copy(x)/d expand(x) = 1  (expand's rule then sums the copies)"""
        return (g,)
    return from_op(np.array(e.array, order='C'), 'expand_copy', (e,), backward)


def _is_basic_index(idx):
    """ints, slices, None and ... select a view; anything else is advanced indexing."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return builtins.all(i is None or i is Ellipsis or isinstance(i, (slice, int, np.integer))
               and not isinstance(i, bool) for i in items)


def _index_data(idx):
    for i in (idx if isinstance(idx, tuple) else (idx,)):
        if isinstance(i, slice) and i.step is not None and i.step <= 0:
            raise ValueError("step must be greater than zero (x.flip(dim) reverses a dim)")
    if isinstance(idx, tuple):  # a 0-d integer tensor is its number (x[t] is x[1], a view)
        idx = tuple(_index_number(i) for i in idx)
    else:
        idx = _index_number(idx)
    if isinstance(idx, Tensor):
        idx = idx.array
    if isinstance(idx, np.ndarray) and idx.dtype == bool and idx.ndim:
        return np.nonzero(idx)  # a boolean mask selects the positions where it is true
    if isinstance(idx, np.ndarray):
        return idx
    if isinstance(idx, tuple):
        return tuple(i.array if isinstance(i, Tensor) else i for i in idx)
    return idx


def _index_number(i):
    """A 0-d integer tensor in an index as the int it holds, as PyTorch reads it."""
    if isinstance(i, Tensor) and i.ndim == 0 and i.dtype.kind in 'iu':
        return int(i.array)
    return i


def _without_ellipsis(items, ndim):
    """The index with its Ellipsis replaced by as many full slices as dims it stands for."""
    used = builtins.sum(0 if i is None or i is Ellipsis else
                        (i.ndim if getattr(i, 'dtype', None) == bool else 1) for i in items)
    k = next(n for n, i in enumerate(items) if i is Ellipsis)
    return items[:k] + (slice(None),) * (ndim - used) + items[k + 1:]


def _ints_first(idx, ndim):
    """PyTorch's advanced indexing, in two NumPy steps: the integers of the index select
    first (basic indexing, a view), then the tensors and masks index what is left. So
    x[0, :, [0, 0]] of a (2, 3, 4) x is (3, 2) as in PyTorch, where NumPy's one step
    (which counts the 0 among the advanced indices) gives (2, 3)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if builtins.any(i is Ellipsis for i in items):  # an Ellipsis that stands for no dim separates
        items = _without_ellipsis(items, ndim)  # nothing in PyTorch: spell it out
    if not builtins.any(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items):
        return None, items
    first, rest = [], []
    for i in items:
        if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            first.append(i)
        elif i is None:
            rest.append(i)
        elif i is Ellipsis or isinstance(i, slice):
            first.append(Ellipsis if i is Ellipsis else slice(None))
            rest.append(i)
        else:  # an index array: a mask covers as many dims as it has
            first.extend([slice(None)] * (i.ndim if getattr(i, 'dtype', None) == bool else 1))
            rest.append(i)
    return tuple(first), tuple(rest)


def _check_mask(x, idx, op):
    """A boolean mask as the whole index must have the shape of the dims it covers (NumPy
    would read a shorter one as a list of positions)."""
    m = idx.array if isinstance(idx, Tensor) else idx
    if isinstance(m, np.ndarray) and m.dtype == bool and m.shape != x.shape[:m.ndim]:
        raise IndexError(f"{op}: the shape of the mask {list(m.shape)} does not match the "
                         f"shape of the indexed tensor {list(x.shape[:m.ndim])}")


def _into_an_empty_dim(a, idx):
    """Whether an index array with elements indexes a dim of size 0 of a: PyTorch refuses
    that even where the result is empty (NumPy 2.0 only warns; later NumPy refuses too)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    arrays = [(np.count_nonzero(i),) if i.dtype == bool else i.shape
              for i in items if isinstance(i, np.ndarray)]
    try:
        if math.prod(np.broadcast_shapes(*arrays)) == 0:  # the index arrays pick nothing
            return False
    except ValueError:  # (arrays that don't broadcast: NumPy's own error says so)
        return False

    def dims_taken(i):  # how many of a's dims an index item stands for
        if i is None or isinstance(i, (bool, np.bool_)):  # a new dim of size 1 (or 0)
            return 0
        return i.ndim if isinstance(i, np.ndarray) and i.dtype == bool else 1
    dim = 0
    for i in items:
        if i is Ellipsis:
            dim += a.ndim - builtins.sum(dims_taken(j) for j in items if j is not Ellipsis)
            continue
        if isinstance(i, np.ndarray) and i.dtype.kind in 'iu' and i.size and a.shape[dim] == 0:
            return True
        dim += dims_taken(i)
    return False


def _picking_nothing(a, idx):
    """PyTorch checks an index tensor only where the result has elements: x[1:1, :, [5]] is
    empty, not an error. For an index that NumPy refused, (the same index with its tensors'
    values all 0, the empty result) when the result is empty, else None."""
    items = idx if isinstance(idx, tuple) else (idx,)
    zeros = tuple(np.zeros_like(i) if isinstance(i, np.ndarray) and i.dtype.kind in 'iu' else i
                  for i in items)
    zeros = zeros if isinstance(idx, tuple) else zeros[0]
    try:
        out = a[zeros]
    except IndexError:  # an index into a dim of size 0: refused, as in PyTorch
        return None
    if _into_an_empty_dim(a, zeros):
        return None
    return (zeros, out) if out.size == 0 else None


def getitem(x, idx):
    _check_mask(x, idx, 'index')
    index_tensors = _tensors_in(idx)  # read by backward: guarded like saved inputs
    idx = _index_data(idx)
    basic = _is_basic_index(idx)
    first = None
    if basic:  # x[0] of a vector is NumPy's copy of one number; x[0, ...] a 0-d view of it
        items = idx if isinstance(idx, tuple) else (idx,)
        idx = items if builtins.any(i is Ellipsis for i in items) else items + (Ellipsis,)
    else:
        first, idx = _ints_first(idx, x.ndim)
    try:
        out = x.array[idx] if first is None else x.array[first][idx]
        if out.size == 0 and _into_an_empty_dim(x.array if first is None else x.array[first], idx):
            raise IndexError("an index is out of bounds for a dim of size 0")
    except IndexError as e:
        nothing = _picking_nothing(x.array if first is None else x.array[first], idx)
        if nothing is None:
            raise IndexError(f"index: {e} (tensor of shape {tuple(x.shape)})") from None
        idx, out = nothing
    rows = (first is None and isinstance(idx, tuple) and len(idx) == 1 and x.ndim > 0
            and isinstance(idx[0], np.ndarray) and idx[0].dtype.kind in 'iu')  # x[int array]

    def backward(g, xs=x.shape):
        """d x[idx]/dx = 1 at the picked positions  (g placed there, repeats added)"""
        if fast and rows:  # x[int array]: np.add.at below, faster (section 20)
            return (_scatter_add_rows(xs, idx[0], g),)
        gx = np.zeros_like(g, shape=xs)
        if basic:
            gx[idx] = g  # a view picks each element at most once: just place g there
        else:  # a gather may pick an element twice: add, don't overwrite
            np.add.at(gx if first is None else gx[first], idx, g)
        return (gx,)
    if not basic:  # a copy, laid out in memory as PyTorch's index kernel lays it out
        out = _index_laid_out(out, x.array if first is None else x.array[first], idx)
        return from_op(out, 'index', (x,), backward, saved=index_tensors)
    return _view(from_op(out, 'index', (x,), backward, view_of=x), x, lambda t: getitem(t, idx))


_Strided = namedtuple('_Strided', 'ndim shape strides')  # what _torch_order reads of an array


def _index_laid_out(out, src, items):
    """out = src[items] (slices, None and integer arrays, the ints applied already) as
    PyTorch lays it out: its index kernel orders the dims as an elementwise op does
    (_torch_order, section 6b), over the source with its indexed dims' strides set to 0 and
    over each index array (its strides on the dims it makes, 0 elsewhere; a list is an
    array, a mask the arrays of its positions). Row-major where all of them are (and for any
    other kind of index)."""
    if src.flags.c_contiguous and builtins.all(
            not isinstance(i, np.ndarray) or i.flags.c_contiguous for i in items):
        return np.ascontiguousarray(out)  # (a list or a mask makes row-major arrays)
    listed = [np.asarray(i) if isinstance(i, list) else i for i in items]
    items = [k for i in listed for k in (np.nonzero(i) if isinstance(i, np.ndarray)
                                         and i.dtype == bool and i.ndim else (i,))]
    arrays = [i for i in items if isinstance(i, np.ndarray)]
    if not builtins.all(i is None or isinstance(i, slice) or isinstance(i, np.ndarray)
                        and i.dtype.kind in 'iu' for i in items):
        return np.ascontiguousarray(out)
    made = np.broadcast_shapes(*(a.shape for a in arrays))  # the dims the arrays make
    at = [k for k, i in enumerate(items) if isinstance(i, np.ndarray)]
    others, d = [], 0  # the other dims of out, in order: their strides in src
    for k, i in enumerate(items):
        if k == at[0]:  # the arrays' dims go here if the arrays stand together, else first
            place = len(others) if at == list(range(at[0], at[-1] + 1)) else 0
        if i is None:
            others.append(0)
        elif isinstance(i, slice):
            others.append(src.strides[d] * (i.step or 1))
        d += i is not None
    others += src.strides[d:]
    if out.ndim != len(others) + len(made):
        return np.ascontiguousarray(out)
    source = _Strided(out.ndim, out.shape,
                      tuple(others[:place]) + (0,) * len(made) + tuple(others[place:]))
    indices = [_Strided(out.ndim, out.shape, (0,) * place + np.broadcast_to(a, made).strides
                        + (0,) * (len(others) - place)) for a in arrays]
    return _in_torch_order(out, source, *indices)


def _along(index, dim):
    """The full NumPy index that picks, for every position of index, the element whose
    coordinate in dim is index's value there and whose other coordinates are the
    position's own: out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (gather)."""
    ix = list(np.indices(index.shape, sparse=True))
    ix[dim] = index
    return tuple(ix)


def _index_tensor(index, op, ndim=None, size=None, dim=None, shape=None):
    """An index argument (a tensor or array of integers) as an int array; with size, each
    index must lie in [0, size) of dim (NumPy would wrap -1 round, PyTorch refuses it)."""
    idx = index.array if isinstance(index, Tensor) else np.asarray(index)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"{op}: index must hold integers, got {idx.dtype}")
    if ndim is not None and idx.ndim != ndim:
        raise ValueError(f"{op}: index must have {ndim} dims (as the input), got shape "
                         f"{tuple(idx.shape)}")
    if size is not None and idx.size:
        bad = (idx < 0) | (idx >= size)
        if bad.any():
            raise IndexError(f"{op}: index {idx[bad].flat[0]} is out of bounds for dimension "
                             f"{dim} with size {size} (input of shape {shape}, index of shape "
                             f"{tuple(idx.shape)})")
    return idx


def _size_of(x, d):
    return x.shape[d] if x.ndim else 1  # a 0-d tensor: one element along its dim 0


def gather(input, dim, index):
    """Pick along dim: out[i][j][k] = input[index[i][j][k]][j][k] (dim 0);
    out has index's shape."""
    d = _dim(dim, input.ndim, 'gather')
    idx = _index_tensor(index, 'gather', input.ndim, _size_of(input, d), d, tuple(input.shape))
    where_ = _along(idx, d)
    try:
        out = input.array[where_]
    except IndexError as e:
        raise IndexError(f"gather: {e} (input of shape {tuple(input.shape)}, index of shape "
                         f"{tuple(idx.shape)}, dim {dim})") from None

    def backward(g, ins=input.shape):
        """d gather/dx = 1 at the gathered positions  (g added back there; picked twice: added)"""
        gx = np.zeros_like(g, shape=ins)
        np.add.at(gx, where_, g)
        return (gx,)
    return from_op(out, 'gather', (input,), backward, saved=_tensors_in(index))


def _scatter(input, dim, index, src, op, add):
    """What scatter and scatter_add share: write (or add) src into a copy of input at
    the positions _along(index, dim) picks; src is a tensor (its first index.shape
    block is used) or a number."""
    d = _dim(dim, input.ndim, op)
    idx = _index_tensor(index, op, input.ndim, _size_of(input, d), d, tuple(input.shape))
    where_ = _along(idx, d)
    block = tuple(slice(0, n) for n in idx.shape)
    is_tensor = isinstance(src, Tensor)
    if is_tensor and src.dtype != input.dtype:  # (a number is cast, as in PyTorch)
        raise RuntimeError(f"{op}(): Expected self.dtype to be equal to src.dtype (got "
                           f"{input.dtype} and {src.dtype}), as in PyTorch; convert src first: "
                           f"src.to({input.dtype})")
    values = src.array[block] if is_tensor else np.asarray(src, dtype=input.dtype)
    out = input.array.copy()
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

    def backward(g, ss=np.shape(src)):
        """d scatter/d input = 1 where its value was kept (everywhere for scatter_add), 0 where replaced
        d scatter/d src = 1 at the place each of its values went  (a gather of g)"""
        gi = g if add else np.where(written, 0, g)
        gs = None
        if is_tensor and src.requires_grad:
            gs = np.zeros_like(g, shape=ss)
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
    idx = _index_tensor(index, 'index_select', None, _size_of(input, d), d, tuple(input.shape))
    if idx.ndim > 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {tuple(idx.shape)}")
    try:
        out = np.take(input.array, idx, axis=d)
    except IndexError as e:
        raise IndexError(f"index_select: {e} (input of shape {tuple(input.shape)})") from None

    def backward(g, ins=input.shape):
        """d index_select/dx = 1 at the selected slices  (slices picked several times: added)"""
        gx = np.zeros_like(g, shape=ins)
        np.add.at(np.moveaxis(gx, d, 0), idx.reshape(-1), np.moveaxis(g, d, 0))
        return (gx,)
    return from_op(out, 'index_select', (input,), backward, saved=_tensors_in(index))


def index_add(input, dim, index, source, alpha=1):
    """A copy of input with source's slices added at the positions index names along dim
    (a position named twice gets both)."""
    d = _dim(dim, input.ndim, 'index_add')
    idx = _index_tensor(index, 'index_add')
    if source.dtype != input.dtype:
        raise RuntimeError(f"index_add(): self ({input.dtype}) and source ({source.dtype}) must "
                           f"have the same dtype, as in PyTorch; convert source first: "
                           f"source.to({input.dtype})")
    out = input.array.copy()
    np.add.at(np.moveaxis(out, d, 0), idx.reshape(-1), np.moveaxis(source.array * alpha, d, 0))

    def backward(g):
        """d index_add/d input = 1
        d index_add/d source = alpha at the positions it was added to  (g's slices picked)"""
        return g, (np.take(g, idx, axis=d) * alpha if source.requires_grad else None)
    return from_op(out, 'index_add', (input, source), backward, saved=_tensors_in(index))


def index_fill(input, dim, index, value):
    """A copy of input with the slices index names along dim set to value (a number)."""
    d = _dim(dim, input.ndim, 'index_fill')
    idx = _index_tensor(index, 'index_fill').reshape(-1)
    mask = np.zeros(input.shape[d] if input.ndim else 1, dtype=bool)
    mask[idx] = True
    shape = [1] * input.ndim
    if input.ndim:
        shape[d] = -1
    return _fill_where(input, _constant(mask.reshape(shape)), value, 'index_fill', row_major=False)


ModeResult = namedtuple('mode', ['values', 'indices'])


@_numpy_keywords  # x.mode(axis=, keepdims=) too, as PyTorch
def mode(x, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest of those tied; nans count as one
    value, after every number) and the index of its last occurrence; outside the graph's
    gradient except through the values' positions."""
    d = _dim(dim, x.ndim, 'mode')
    if x.ndim == 0:
        return _on_0d(lambda t, d: mode(t, d, keepdim), x)
    xs = np.moveaxis(x.array, d, -1)
    flat = xs.reshape(-1, xs.shape[-1])
    values = np.empty(flat.shape[0], dtype=x.dtype)
    where_ = np.empty(flat.shape[0], dtype=int64)
    for r, row in enumerate(flat):  # one np.unique per row (mode is rare in a hot loop)
        u, counts = np.unique(row, return_counts=True)
        values[r] = u[np.argmax(counts)]
        same = (row == values[r]) | (np.isnan(row) & np.isnan(values[r]))
        where_[r] = np.flatnonzero(same)[-1]  # the last occurrence, as PyTorch
    idx = where_.reshape(xs.shape[:-1])
    picked = take_along_dim(x, _constant(np.expand_dims(idx, d)), d)
    return ModeResult(picked if keepdim else squeeze(picked, d),
                      _constant(np.expand_dims(idx, d) if keepdim else idx))


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
    dtype = result_type(*tensors)  # the promotion rule over all of them (section 6b)
    tensors = [_as(t, dtype) for t in tensors]  # a cast sends each gradient back in its dtype
    parents = tuple(tensors)
    # PyTorch's legacy rule: a tensor of shape (0,) is skipped, whatever the others' shape
    kept = [t for t in tensors if t.shape != (0,)] or tensors
    skipped = [t.shape == (0,) and kept is not tensors for t in tensors]
    tensors = kept
    first = tensors[0]
    d = _dim(dim, first.ndim, 'cat')
    for t in tensors[1:]:
        if t.ndim != first.ndim or builtins.any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != d):
            raise ValueError(f"cat: tensors must have the same shape except in dim {dim}; got "
                             f"shapes {tuple(first.shape)} and {tuple(t.shape)}")
    ends = np.cumsum([t.shape[d] for t in tensors])[:-1]

    def backward(g):
        """d cat/d(each input) = 1 on its own slice  (each input gets back its slice of g)"""
        pieces = iter(np.split(g, ends, axis=d))
        return tuple(np.zeros_like(g, shape=(0,)) if skip else next(pieces) for skip in skipped)
    out = np.ascontiguousarray(np.concatenate([t.array for t in tensors], axis=d))  # row-major
    return from_op(out, 'cat', parents, backward)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    dtype = result_type(*tensors)
    tensors = [_as(t, dtype) for t in tensors]
    for t in tensors[1:]:
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: all tensors must have the same shape; got shapes "
                             f"{tuple(tensors[0].shape)} and {tuple(t.shape)}")
    d = _dim(dim, tensors[0].ndim + 1, 'stack')

    def backward(g):
        """d stack/d(each input) = 1 on its own slice  (input i gets slice i of g along the new dim)"""
        return tuple(np.take(g, i, axis=d) for i in range(len(tensors)))
    out = np.ascontiguousarray(np.stack([t.array for t in tensors], axis=d))  # row-major
    return from_op(out, 'stack', tuple(tensors), backward)


def narrow(x, dim, start, length):
    """The view x[..., start:start + length, ...] along dim (a negative start counts from
    the end)."""
    d = _dim(dim, x.ndim, 'narrow')
    n = x.shape[d] if x.ndim else 1
    start = start + n if start < 0 else start
    if not (0 <= start and length >= 0 and start + length <= n):
        raise IndexError(f"narrow: start {start} and length {length} are out of range for "
                         f"dim {dim} of size {n}")
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def select(x, dim, index):
    """The view x[..., index, ...] along dim: that dim removed."""
    d = _dim(dim, x.ndim, 'select')
    return getitem(x, (slice(None),) * d + (index,))


def unbind(x, dim=0):
    """The slices of x along dim, each a view (select), as a tuple."""
    d = _dim(dim, x.ndim, 'unbind')
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def unflatten(x, dim, sizes):
    """Dim `dim` split into several of the given sizes (one may be -1): a view."""
    d = _dim(dim, x.ndim, 'unflatten')
    sizes, known = tuple(sizes), math.prod(n for n in sizes if n != -1)
    if -1 in sizes and known and x.shape[d] % known == 0:  # -1 from the dim's own size (an
        sizes = tuple(x.shape[d] // known if n == -1 else n for n in sizes)  # empty x too)
    return view(x, x.shape[:d] + sizes + x.shape[d + 1:])


def _diagonal_view(a, offset, d1, d2):
    """The diagonal of dims d1 and d2 of array a, as a writable view (NumPy's own is
    read-only): the other dims first, the diagonal last."""
    start = [slice(None)] * a.ndim
    start[d1 if offset < 0 else d2] = slice(builtins.abs(offset), None)
    b = a[tuple(start)]
    n = builtins.max(0, builtins.min(b.shape[d1], b.shape[d2]))
    keep = [i for i in range(a.ndim) if i not in (d1, d2)]
    return np.lib.stride_tricks.as_strided(
        b, tuple(b.shape[i] for i in keep) + (n,),
        tuple(b.strides[i] for i in keep) + (b.strides[d1] + b.strides[d2],))


def diagonal(x, offset=0, dim1=0, dim2=1):
    """The view of the elements x[..., i, i + offset, ...] of dims dim1 and dim2, put last."""
    d1, d2 = _dim(dim1, x.ndim, 'diagonal'), _dim(dim2, x.ndim, 'diagonal')
    if d1 == d2:
        raise ValueError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")

    def backward(g, xs=x.shape):
        """d diagonal(x)/dx = 1 on the diagonal, else 0"""
        gx = np.zeros_like(g, shape=xs)
        _diagonal_view(gx, offset, d1, d2)[...] = g
        return (gx,)
    return _view(from_op(_diagonal_view(x.array, offset, d1, d2), 'diagonal', (x,), backward,
                         view_of=x), x, lambda t: diagonal(t, offset, d1, d2))


def split(tensor, split_size_or_sections, dim=0):
    """Pieces of split_size (the last may be smaller), or of the listed sizes."""
    x = tensor
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
    if n == 0 and isinstance(split_size_or_sections, int):  # one empty piece, as PyTorch
        return (narrow(x, d, 0, 0),)
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def _split_method(self, split_size, dim=0):
    """x.split(...): torch.split as PyTorch's method names it (split_size, sizes or a list)."""
    return split(self, split_size, dim)


def chunk(x, chunks, dim=0):
    """`chunks` pieces of ceil(n / chunks) (as PyTorch, possibly fewer pieces)."""
    if chunks < 1:
        raise ValueError(f"chunk: chunks must be at least 1, got {chunks}")
    n = x.shape[_dim(dim, x.ndim, 'chunk')]
    if n == 0:  # an empty dim: `chunks` empty pieces, as PyTorch
        return tuple(narrow(x, dim, 0, 0) for _ in range(chunks))
    return split(x, -(-n // chunks), dim)


def flip(x, *dims):
    """Reverse the order of the elements along the given dims (none: a copy)."""
    dims = _sizes(dims)
    axes = _dims(dims, x.ndim, 'flip') if len(dims) else ()  # (): no dim, not every dim

    def backward(g):
        """d flip(x)/dx = 1  (g flipped back)"""
        return (np.flip(g, axes),)
    out = _empty_in_layout_of(x.array)  # a copy, in x's layout, as PyTorch's
    np.copyto(out, np.flip(x.array, axes))
    return from_op(out, 'flip', (x,), backward)


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

    def backward(g):
        """d roll(x)/dx = 1  (g rolled back the other way)"""
        return (np.roll(g, back, axes),)
    return from_op(np.ascontiguousarray(np.roll(x.array, shifts, axes)), 'roll', (x,), backward)


def repeat(x, *sizes):
    """Tile x: sizes[i] copies along dim i (more sizes than dims add leading dims)."""
    sizes = _sizes(sizes)
    if len(sizes) < x.ndim:
        raise ValueError(f"repeat: {len(sizes)} sizes for a tensor of {x.ndim} dims; give at "
                         "least one per dim")
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)

    def backward(g, xs=x.shape):
        """d repeat(x)/dx = 1 for each copy  (g summed over the copies)"""
        pairs = [n for r, s in zip(sizes, shape) for n in (r, s)]  # (r0, s0, r1, s1, ...)
        return (g.reshape(pairs).sum(axis=tuple(range(0, len(pairs), 2))).reshape(xs),)
    return from_op(_row_major(np.tile(x.array.reshape(shape), sizes)), 'repeat', (x,), backward)


def _matrix(x, op):
    if x.ndim < 2:
        raise RuntimeError(f"{op}: input tensor must have at least 2 dimensions, got shape "
                           f"{tuple(x.shape)}")


def tril(x, diagonal=0):
    _matrix(x, 'tril')

    def backward(g):
        """d tril(x)/dx = 1 in the kept triangle, 0 where zeroed"""
        return (np.tril(g, diagonal),)
    return from_op(np.ascontiguousarray(np.tril(x.array, diagonal)), 'tril', (x,), backward)


def triu(x, diagonal=0):
    _matrix(x, 'triu')

    def backward(g):
        """d triu(x)/dx = 1 in the kept triangle, 0 where zeroed"""
        return (np.triu(g, diagonal),)
    return from_op(np.ascontiguousarray(np.triu(x.array, diagonal)), 'triu', (x,), backward)


def _mT(x):
    """The last two dims swapped (a batch of matrices transposed); a 0-d tensor is itself."""
    if x.ndim == 1:
        raise RuntimeError("tensor.mT is only supported on matrices or batches of matrices. "
                           "Got 1-D tensor.")
    return transpose(x, -2, -1) if x.ndim else x


def _t(x):
    """x.t(): a 2-d tensor transposed, a 0-d or 1-d one as it is (more dims: refused, as PyTorch)."""
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dims, got {x.ndim}; use transpose or .mT")
    return view(x, x.shape) if x.ndim < 2 else transpose(x, 0, 1)


# More of PyTorch's names, composed from the ops above (their gradients come from those).
def masked_select(x, mask):
    """The elements where mask is true (the two broadcast together), as a 1-D tensor."""
    m = mask.array if isinstance(mask, Tensor) else np.asarray(mask)
    shape = np.broadcast_shapes(x.shape, m.shape) or (1,)  # a 0-d pair: one element
    return getitem(expand(reshape(x, (1,) * (len(shape) - x.ndim) + x.shape), shape),
                   np.broadcast_to(m, shape))


def nonzero(input, *, as_tuple=False):
    """torch.nonzero: the indices of the nonzero elements, one row each (as_tuple: one
    index tensor per dim, for x[x.nonzero(as_tuple=True)])."""
    if as_tuple:
        return tuple(_constant(i.astype(int64)) for i in np.nonzero(input.array.reshape(
            input.shape or (1,))))
    return _constant(np.argwhere(input.array).astype(int64))


def repeat_interleave(x, repeats, dim=None):
    """Each element (or slice along dim) repeated `repeats` times in place: [1, 2] -> [1, 1, 2, 2]."""
    if dim is None:
        x, dim = reshape(x, -1), 0
    d = _dim(dim, x.ndim, 'repeat_interleave')
    r = repeats.array if isinstance(repeats, Tensor) else repeats
    return index_select(x, d, np.repeat(np.arange(x.shape[d]), r))


def diff(x, n=1, dim=-1):
    """x[i + 1] - x[i] along dim, n times."""
    d = _dim(dim, x.ndim, 'diff')
    for _ in range(n):
        k = x.shape[d]  # (an empty dim stays empty)
        later, earlier = narrow(x, d, builtins.min(k, 1), builtins.max(k - 1, 0)), narrow(x, d, 0, builtins.max(k - 1, 0))
        x = logical_xor(later, earlier) if x.dtype == bool_ else later - earlier  # bools: !=
    return x


@_numpy_keywords  # x.nansum(axis=, keepdims=) too, as PyTorch
def nansum(x, dim=None, keepdim=False):
    """The sum with nan counted as 0."""
    if x.dtype.kind not in 'fc':
        return sum(x, dim, keepdim)  # integers have no nan
    axes, kept = _dims(dim, x.ndim, 'nansum'), ~np.isnan(x.array)

    def backward(g):
        """d nansum / dx_i = [x_i is not nan]  (a product, as PyTorch: an inf g gives nan at a nan)"""
        return (_expand_back(g, kept.shape, axes, keepdim) * kept,)
    with np.errstate(invalid='ignore', over='ignore'):  # inf - inf = nan, silently, as PyTorch
        return from_op(np.nansum(x.array, axis=axes, keepdims=keepdim), 'nansum', (x,), backward)


@_numpy_keywords  # x.nanmean(axis=, keepdims=) too, as PyTorch
def nanmean(x, dim=None, keepdim=False):
    """The mean of the elements that are not nan."""
    if x.dtype.kind not in 'fc':
        raise TypeError(f"nanmean: expected a floating point tensor, got {x.dtype}")
    kept = logical_not(isnan(x))
    return nansum(x, dim, keepdim) / sum(kept, dim, keepdim)


def _matmul_of(op, dims):
    def product(input, other):
        for name, t in (('self', input), (op == 'dot' and 'tensor' or 'mat2', other)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if (input.ndim, other.ndim) != (dims, dims):
            raise RuntimeError(f"{op}: expected {dims}-D tensors, got {input.ndim}-D and "
                               f"{other.ndim}-D (matmul, the @ operator, takes any dims)")
        if dims == 3 and input.shape[0] != other.shape[0]:
            raise RuntimeError(f"bmm: the batch sizes differ ({input.shape[0]} and "
                               f"{other.shape[0]})")
        if input.shape[-1] != other.shape[-1 if dims == 1 else -2]:
            raise RuntimeError(f"{op}: shapes {tuple(input.shape)} and {tuple(other.shape)} "
                               "cannot be multiplied")
        return matmul(input, other)
    product.__name__ = op
    product.__doc__ = f"torch.{op}: matmul of two {dims}-D tensors only."
    return product


mm, bmm, dot = _matmul_of('mm', 2), _matmul_of('bmm', 3), _matmul_of('dot', 1)


def outer(a, b):
    """a[i] * b[j] for vectors a and b."""
    return unsqueeze(a, 1) * unsqueeze(b, 0)


def tensordot(a, b, dims=2, out=None):
    """Sum over the last `dims` dims of a and the first of b (or the listed pairs)."""
    _no_out(out, 'tensordot')
    if bool_ in (a.dtype, b.dtype) and a.numel() and b.numel():  # (empty: nothing to add up)
        raise TypeError("tensordot: not defined for bool tensors (as in PyTorch)")
    if isinstance(dims, int):
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        da, db = [list(d) if isinstance(d, (list, tuple)) else [d] for d in dims]
    da, db = [_dim(d, a.ndim, 'tensordot') for d in da], [_dim(d, b.ndim, 'tensordot') for d in db]
    keep_a, keep_b = [d for d in range(a.ndim) if d not in da], [d for d in range(b.ndim) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    a2 = reshape(permute(a, keep_a + da), (math.prod(a.shape[d] for d in keep_a), k))
    b2 = reshape(permute(b, db + keep_b), (k, math.prod(b.shape[d] for d in keep_b)))
    return reshape(a2 @ b2, tuple(a.shape[d] for d in keep_a) + tuple(b.shape[d] for d in keep_b))


def einsum(equation, *operands):
    """Sums of products named by letters, as torch.einsum('ij,jk->ik', a, b): the forward is
    NumPy's einsum; the gradient of each operand is the einsum of the output's gradient
    with the other operands (a letter only that operand has is broadcast back)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = _einsum_without_ellipsis(equation.replace(' ', ''), operands)
    if '->' not in eq:  # the implicit form: the letters used once, in order
        letters = eq.replace(',', '')
        eq += '->' + ''.join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins, out_subs = eq.split('->')
    subs = ins.split(',')
    if len(subs) != len(operands):
        raise ValueError(f"einsum: {equation!r} needs one term per operand ({len(operands)})")
    for s in subs:
        if len(set(s)) != len(s):
            raise ValueError(f"einsum: a letter repeated in one operand ({s!r}, a diagonal) is "
                             "not supported; use diagonal() first")
    if len(operands) == 1 and sorted(out_subs) == sorted(subs[0]):  # only a reordering:
        return permute(operands[0], tuple(subs[0].index(c) for c in out_subs))  # a view, as PyTorch
    dtype = result_type(*operands)
    operands = tuple(_as(t, dtype) for t in operands)
    sizes = {c: n for s, t in zip(subs, operands) for c, n in zip(s, t.shape)}
    out = np.einsum(eq, *(t.array for t in operands))

    def backward(g):
        """d einsum/d(each operand): einsum of g with the other operands"""
        grads = []
        for k, (s, t) in enumerate(zip(subs, operands)):
            if not t.requires_grad:
                grads.append(None)
                continue
            others = [(subs[j], operands[j].array) for j in range(len(operands)) if j != k]
            present = set(out_subs) | {c for o, _ in others for c in o}
            kept = ''.join(c for c in s if c in present)
            gk = np.einsum(','.join([out_subs] + [o for o, _ in others]) + '->' + kept,
                           g, *(a for _, a in others))
            shape = tuple(sizes[c] if c in kept else 1 for c in s)  # the rest broadcast back
            order = [kept.index(c) for c in s if c in kept]
            gk = np.transpose(gk, order).reshape(shape) if kept else gk.reshape(shape)
            grads.append(np.broadcast_to(gk, t.shape).astype(t.dtype))
        return tuple(grads)
    return from_op(np.asarray(out), 'einsum', operands, backward, saved=operands)


def _einsum_without_ellipsis(eq, operands):
    """'...' spelled out in letters the equation does not use, one per broadcast dim,
    aligned from the right as broadcasting aligns them; the implicit output puts them first."""
    if '...' not in eq:
        return eq
    ins, arrow, out = eq.partition('->')
    terms = ins.split(',')
    free = [c for c in 'ABCDEFGHIJKLMNOPQRSTUVWXYZ' if c not in eq]
    widths = [t.ndim - len(term.replace('...', '')) for term, t in zip(terms, operands)]
    width = builtins.max(widths)
    dots = ''.join(free[:width])
    terms = [term.replace('...', dots[width - w:]) for term, w in zip(terms, widths)]
    if not arrow:  # implicit: the broadcast dims, then the letters used once, sorted
        letters = ''.join(terms)
        out = dots + ''.join(sorted(c for c in set(letters) if letters.count(c) == 1
                                    and c not in dots))
    return ','.join(terms) + '->' + out.replace('...', dots)


def hstack(tensors):
    tensors = [t if t.ndim else reshape(t, 1) for t in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    return cat([t if t.ndim > 1 else reshape(t, 1, -1) for t in tensors], 0)


def cdist(x1, x2, p=2.0, compute_mode='use_mm_for_euclid_dist_if_necessary'):
    """The p-norm distance between each row of x1 and each row of x2: (..., P, R).
    compute_mode: PyTorch may compute p=2 by a matrix product (faster, less exact);
    tinytorch always takes the differences, the exact way, whichever mode is named."""
    if compute_mode not in ('use_mm_for_euclid_dist_if_necessary', 'use_mm_for_euclid_dist',
                            'donot_use_mm_for_euclid_dist'):
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    if x1.dtype.kind != 'f' or x2.dtype.kind != 'f':  # no promotion, as in PyTorch
        raise RuntimeError(f"cdist only supports floating-point dtypes, got {x1.dtype} and {x2.dtype}")
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"cdist: both operands need one dtype, got {x1.dtype} and {x2.dtype}")
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: "
                           f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    with np.errstate(invalid='ignore', over='ignore'):  # inf - inf = nan, silently, as PyTorch
        diff = x1.array[..., :, None, :] - x2.array[..., None, :, :]  # (..., P, R, M)
        ad = np.abs(diff)
        if p == math.inf:  # PyTorch's kernel takes max(so far, |d|), which passes a nan by
            out = np.max(np.where(np.isnan(ad), 0, ad), axis=-1, initial=0)
        elif p == 0:  # min(ceil(|d|), 1) counts a non-zero (and keeps a nan)
            out = np.sum(np.minimum(np.ceil(ad), 1), axis=-1)
        elif p == 2:
            out = np.sqrt(np.sum(ad * ad, axis=-1))
        else:
            out = np.sum(ad ** p, axis=-1) ** (1.0 / p)

    def backward(g):
        """d cdist_ij / dx1_i = sign(d) |d|^(p-1) / cdist^(p-1), d = x1_i - x2_j  (0 at cdist 0)
        d cdist_ij / dx2_j = the same with d = x2_j - x1_i"""
        g, dist = g[..., None], out[..., None]
        return (unbroadcast(np.sum(_cdist_rule(diff, g, dist, p), axis=-2), x1.shape)
                if x1.requires_grad else None,
                unbroadcast(np.sum(_cdist_rule(-diff, g, dist, p), axis=-3), x2.shape)
                if x2.requires_grad else None)
    return from_op(out, 'cdist', (x1, x2), backward)


def _cdist_rule(d, g, dist, p):
    """PyTorch's cdist backward for each pair (x1_i, x2_j), d = x1_i - x2_j: the p-norm's
    derivative, but 0 where the distance is 0 whatever g is (even nan) for p other than 1
    and inf, and sign(nan) = nan."""
    sign = np.sign(d)
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):
        if p == 0:  # a count: flat
            return np.zeros_like(d)
        if p == 1:
            return g * sign
        if p == math.inf:  # to the components whose |d| is the distance
            return g * sign * (1 - np.minimum(1, np.ceil(np.abs(np.abs(d) - dist))))
        if p == 2:
            return np.where(dist == 0, 0, g * d / dist)
        if p > 2:
            return np.where(dist == 0, 0, d * np.abs(d) ** (p - 2) * g / dist ** (p - 1))
        grad = np.where(dist == 0, 0, sign * np.abs(d) ** (p - 1) * g / dist ** (p - 1))
        return np.where((d == 0) & (p < 1), 0, grad)  # |0|^(p-1) = inf for p < 1: 0


def unique(x, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values (sorted), outside the graph; optionally where each element's
    value sits among them, and how often each occurs."""
    if dim is not None:
        raise NotImplementedError("unique: dim= is not supported; flatten first")
    values, inverse, counts = np.unique(x.array, return_inverse=True, return_counts=True,
                                        equal_nan=False)  # each nan its own value, as PyTorch

    def backward(g):
        """d unique/dx: not defined (PyTorch raises too)"""
        raise RuntimeError("backward through unique: its derivative is not implemented (as in "
                           "PyTorch)")
    out = [from_op(values, 'unique', (x,), backward)]
    if return_inverse:
        out.append(_constant(inverse.reshape(x.shape).astype(int64)))
    if return_counts:
        out.append(_constant(counts.astype(int64)))
    return out[0] if len(out) == 1 else tuple(out)


concat = concatenate = cat


_methods(detach=detach, clone=clone, contiguous=contiguous, stride=stride,
         is_contiguous=is_contiguous, data=property(_get_data, _set_data), __array__=_as_numpy,
         index_add=index_add, index_fill=index_fill, mode=mode, reshape=reshape, permute=permute,
         transpose=transpose, unsqueeze=unsqueeze, squeeze=squeeze, flatten=flatten, expand=expand,
         narrow=narrow, select=select, unbind=unbind, unflatten=unflatten, diagonal=diagonal,
         split=_split_method, chunk=chunk, tril=tril, triu=triu, gather=gather, scatter=scatter,
         scatter_add=scatter_add, index_select=index_select, take_along_dim=take_along_dim,
         flip=flip, roll=roll, repeat=repeat, view=view, __getitem__=getitem,
         T=property(lambda self: permute(self, tuple(range(self.ndim - 1, -1, -1)))),
         mT=property(_mT), swapaxes=transpose, swapdims=transpose, t=_t,
         expand_as=lambda self, other: expand(self, other.shape),
         view_as=lambda self, other: view(self, other.shape),
         reshape_as=lambda self, other: reshape(self, other.shape), masked_select=masked_select,
         repeat_interleave=repeat_interleave, diff=diff, nansum=nansum, nanmean=nanmean,
         outer=outer, unique=unique, ger=outer, nelement=Tensor.numel,
         element_size=lambda self: self.array.itemsize, int=lambda self: to(self, int32),
         bool=lambda self: to(self, bool_), half=lambda self: to(self, float16),
         type_as=lambda self, other: to(self, other.dtype),
         ravel=ravel, nonzero=nonzero, mm=mm, bmm=bmm, dot=dot,
         data_ptr=lambda x: x.array.__array_interface__['data'][0])


# ---------------------------------------------------------------------------
# 12. Unfold (im2col): a convolution is a matmul over patches; softmax
# ---------------------------------------------------------------------------
def _pair(v, name, op):
    """kernel_size=3 means (3, 3): an int or a pair of ints, as PyTorch takes them."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and builtins.all(
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
    x = np.pad(input.array, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else input.array
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):  # kernel element (i, j) sees one strided copy of the image
            cols[:, :, i, j] = x[(..., *_window_slice(w, i, j))]

    def backward(g, xs=x.shape):
        """d unfold(x)/dx = 1 where each patch came from  (fold, col2im: columns back to the image)"""
        gx = np.zeros(xs, dtype=g.dtype)  # overlapping patches add up
        g = g.reshape(n, c, kh, kw, oh, ow)
        for i in range(kh):
            for j in range(kw):
                gx[(..., *_window_slice(w, i, j))] += g[:, :, i, j]
        return (gx[:, :, ph:ph + h, pw:pw + wd],)  # the padding's gradient is dropped
    return from_op(cols.reshape(n, c * kh * kw, oh * ow), 'unfold', (input,), backward)


def _max_or_0(a, d):
    """The max along dim d, kept as a dim of size 1 (0 for an empty dim: nothing to shift)."""
    return np.max(a, axis=d, keepdims=True) if a.shape[d] else np.zeros_like(a, shape=a.shape[:d] + (1,) + a.shape[d + 1:])


def softmax(x, dim, dtype=None):
    """exp(x - max) / sum(exp(x - max)): subtracting the max avoids overflow and
    leaves the result unchanged. -inf entries (masked positions) get probability 0."""
    if dtype is not None:
        x = x.to(dtype)
    d = _dim(dim, x.ndim, 'softmax')
    if x.ndim == 0:
        return _on_0d(softmax, x)
    with np.errstate(invalid='ignore'):  # an all -inf slice: -inf - -inf, nan as PyTorch
        e = np.exp(x.array - _max_or_0(x.array, d))
        out = _row_major(e / np.sum(e, axis=d, keepdims=True))  # row-major, as PyTorch's

    def backward(g):
        """d softmax/dx: p * (g - sum(p * g))  (the Jacobian diag(p) - p p^T applied to g)"""
        return (out * (g - np.sum(g * out, axis=d, keepdims=True)),)
    return from_op(out, 'softmax', (x,), backward, saves_output=True)


def log_softmax(x, dim, dtype=None):
    """x - logsumexp(x), computed stably."""
    if dtype is not None:
        x = x.to(dtype)
    d = _dim(dim, x.ndim, 'log_softmax')
    if x.ndim == 0:
        return _on_0d(log_softmax, x)
    with np.errstate(divide='ignore', invalid='ignore'):  # an empty dim: log(0) = -inf, as
        shifted = x.array - _max_or_0(x.array, d)        # PyTorch; an all -inf slice: nan
        out = _row_major(shifted - np.log(np.sum(np.exp(shifted), axis=d, keepdims=True)))

    def backward(g):
        """d log_softmax/dx: g - softmax(x) * sum(g)"""
        return (g - np.exp(out) * np.sum(g, axis=d, keepdims=True),)
    return from_op(out, 'log_softmax', (x,), backward, saves_output=True)


_methods(softmax=softmax, log_softmax=log_softmax)


# ---------------------------------------------------------------------------
# 13. In-place ops: the graph is rewritten (views too)
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
# was made (_inputs and _as_read_by, below).
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
# CopySlices(old h, y) (PyTorch's node: y's region from y, the rest from the old h), and every other
# live view of h is made again from the new h, so that its history matches its values.
#
# Backward, and the tools, ask _inputs (section 6) for the inputs of a node as its op
# read them.


def _check_inplace(x, op, written=None):
    """Refuse an in-place op that can't be done (or differentiated). written: the array the
    op writes, when it is not all of x's (x[idx] = v writes a region)."""
    w = x.array if written is None else written
    flags = w.flags
    if not (flags.c_contiguous or flags.f_contiguous) and _overlaps_itself(w):
        raise RuntimeError(f"{op}: unsupported operation: more than one element of the "
                           "written-to tensor refers to a single memory location (an expanded "
                           "view, or strides that reach a location twice); call .clone() first")
    if not (flags if written is None else x.array.flags).writeable:
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
    if isinstance(other, Tensor):
        _no_partial_overlap(x.array, other.array, op)
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
    return other  # the op computes in the promoted dtype; _in_place rounds into x's


def _overlaps_itself(a):
    """Whether two elements of array a are one memory location: a stride of 0 (expand), or
    strides such as (1, 1) over a (3, 3) view (as_strided, or a file that says so)."""
    if a.size < 2:
        return False
    reach = a.itemsize  # the bytes the dims taken so far span: a dim whose stride is at
    for stride, n in sorted((builtins.abs(s), n) for s, n in zip(a.strides, a.shape) if n > 1):
        if stride < reach:  # least that can't step into them; else look at every offset
            offsets = np.zeros(1, dtype=np.int64)
            for s, k in zip(a.strides, a.shape):
                offsets = (offsets[:, None] + np.arange(k, dtype=np.int64) * s).reshape(-1)
            return bool((np.diff(np.sort(offsets)) < a.itemsize).any())
        reach += stride * (n - 1)
    return False


_ONE_LOCATION = ("unsupported operation: some elements of the input tensor and the written-to "
                 "tensor refer to a single memory location")  # PyTorch's words


def _no_partial_overlap(written, operand, op):
    """Refuse an operand that shares some, but not all, of its memory with the array an
    in-place op writes: the answer would depend on the order the elements are visited."""
    if not np.may_share_memory(written, operand):  # cheap: the two memory ranges are apart
        return
    same = (written.__array_interface__['data'][0] == operand.__array_interface__['data'][0]
            and written.shape == operand.shape and written.strides == operand.strides)
    if not same and np.shares_memory(written, operand):
        raise RuntimeError(f"{op}: {_ONE_LOCATION} (the operand shares some of its memory with "
                           "the tensor it changes); pass a copy of it (.clone())")


def _no_shared_memory(x, operands, op):
    """An index write (x[idx] = v, scatter_, index_add_) refuses a source or index that
    shares any memory with x, as PyTorch does: its writes would read values they changed."""
    for t in operands:
        if isinstance(t, Tensor) and np.may_share_memory(x.array, t.array) and \
                np.shares_memory(x.array, t.array):
            raise RuntimeError(f"{op}: {_ONE_LOCATION} (its source or index is a part of the "
                               "tensor it changes); pass a copy of it (.clone())")


def _in_place(x, op, result):
    """The end of every in-place op: result (the op's value, computed out of place)
    goes into x's memory, and x becomes result in the graph."""
    _check_inplace(x, op)
    if result.shape != x.shape:
        raise RuntimeError(f"{op}: the result has shape {tuple(result.shape)} but the tensor "
                           f"has shape {tuple(x.shape)}; an in-place op can't change a shape")
    if _CATEGORY[result.dtype.kind] > _CATEGORY[x.dtype.kind]:  # int x, float result
        raise RuntimeError(f"{op}: result type {result.dtype} can't be cast to {x.dtype}, the "
                           f"tensor's dtype; use the out-of-place form or convert x first")
    if result.dtype != x.dtype:  # computed in the promoted dtype (a float64 operand of a
        result = _as(result, x.dtype)  # float32 x), then rounded once into x's, as PyTorch
    if (fast and result.requires_grad and result.dtype == x.dtype
            and result.array.strides == x.array.strides and _sole_owner(x)):  # x keeps its layout
        x.array = result.array  # no one else reads x's memory: take the result's, no copy
    else:
        x.array[...] = result.array  # views, aliases and leaves see the new values
    _bump(x)
    if result.requires_grad:
        for hook in _hooks:  # a profile counted the twin under its own name (section 6b)
            hook.renamed(result, op)
        result._op = op
        _record(x, result)
    return x


def _sole_owner(x):
    """x's memory is x's alone: x is an op's output, not a view, with no live views, never
    detached. Its in-place op can then keep the result's memory instead of copying."""
    views = getattr(x, '_views', None)
    return (x._backward is not None and x._view is None and x.array.base is None
            and not getattr(x, '_shared', False) and not (views and builtins.any(r() is not None for r in views)))


def _record(x, node):
    """x was changed in place: x takes node's history. If x is a view, its base's history
    becomes CopySlices(old base, x), and x and the base's other views are made again from
    the new base, so that each history matches its values (as PyTorch records it)."""
    _rewrite(x, node)
    info = x._view
    base = x if info is None else info[0]
    if info is not None:  # the base's region under x holds x's new values, and x is again
        _rewrite(base, _copy_slices(base, x, info[1]))  # a view of the base, as in PyTorch
        _rewrite(x, info[1](base))
    if base.requires_grad:
        for ref in list(getattr(base, '_views', None) or ()):
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
    old._older = getattr(x, '_older', None)
    x.requires_grad, x._parents, x._backward = node.requires_grad, node._parents, node._backward
    x._op, x._seq = node._op, node._seq
    # a rule that reads node's output now reads x's memory: guard it with x's counter
    x._saved = tuple((x._vc, x._vc[0], s) if c is node._vc else (c, v, s)
                     for c, v, s in node._saved)
    x._older = old


def _copy_slices(base, view, remake):
    """base's value after a write through its view: view's new values in view's region,
    base's old values elsewhere. remake(t) cuts the view's region out of t."""
    def backward(g):
        """d CopySlices/d base = 1 outside the view's region, 0 inside
        d CopySlices/d view = 1 inside the view's region"""
        gb = g.copy()
        region = remake(_constant(gb)).array  # a view of gb
        gv = region.copy()
        region[...] = 0
        return gb, gv
    return from_op(base.array, 'CopySlices', (base, view), backward)


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
    return _in_place(x, 'add_', add(x, o, alpha))


def sub_(x, other, alpha=1):
    _no_bool_subtraction(x, other)
    o = _in_place_operand(x, other, 'sub_')
    return _in_place(x, 'sub_', sub(x, o, alpha))


def mul_(x, other):
    old, o = _keep_old(x, _in_place_operand(x, other, 'mul_'), _requires_grad(other))
    return _in_place(x, 'mul_', mul(old, o))


def div_(x, other):
    old, o = _keep_old(x, _in_place_operand(x, other, 'div_', floating=True),
                       _requires_grad(other))
    return _in_place(x, 'div_', div(old, o))


def pow_(x, exponent):
    _in_place_operand(x, exponent, 'pow_')  # an int tensor can't take a float power
    old, e = _keep_old(x, exponent, x.requires_grad or _requires_grad(exponent))
    if isinstance(e, Tensor):
        e = _in_place_operand(x, e, 'pow_')
    return _in_place(x, 'pow_', pow(old, e))


def clamp_(x, min=None, max=None):
    for bound in (min, max):
        if bound is not None:
            _in_place_operand(x, bound, 'clamp_')  # an int tensor can't take a float bound
    return _in_place(x, 'clamp_', clamp(x, min, max))


def relu_(x):
    return _in_place(x, 'relu_', relu(x))


def masked_fill_(x, mask, value):
    return _in_place(x, 'masked_fill_', masked_fill(x, mask, value))


def fill_(x, value):
    """Every element becomes value (a number or a 0-d tensor, which gets the gradient)."""
    v = _as(value if isinstance(value, Tensor) else _fits(value, x.dtype, 'fill_'), x.dtype)
    if v.ndim != 0:
        raise RuntimeError(f"fill_: the value must be a number or a 0-d tensor, got shape "
                           f"{tuple(v.shape)}")

    def backward(g):
        """d fill_/dx = 0  (the old values are forgotten)
        d fill_/d value = 1 for each element  (g summed)"""
        return np.zeros_like(g), g.sum().astype(g.dtype).reshape(())
    return _in_place(x, 'fill_', from_op(np.full_like(x.array, v.array), 'fill', (x, v), backward))


def zero_(x):
    return fill_(x, 0)


def copy_(x, src):
    """x's elements become src's (broadcast to x's shape, cast to x's dtype)."""
    s = src if isinstance(src, Tensor) else _constant(np.asarray(src))
    _no_partial_overlap(x.array, s.array, 'copy_')
    if x.dtype.kind not in 'fc':
        s = s.detach()  # an integer or bool tensor has no gradient: nothing flows to src
    try:
        data = np.broadcast_to(s.array, x.shape).astype(x.dtype)
    except ValueError:
        raise ValueError(f"copy_: source of shape {tuple(s.shape)} cannot be copied into a "
                         f"tensor of shape {tuple(x.shape)}") from None

    def backward(g, ss=s.shape):
        """d copy_/dx = 0  (the old values are forgotten)
        d copy_/d src = 1  (summed where src was broadcast)"""
        return (np.zeros_like(g),
                unbroadcast(g, ss).astype(s.dtype) if s.requires_grad else None)
    return _in_place(x, 'copy_', from_op(data, 'copy', (x, s), backward))


def _last_writes(shape, idx):
    """For x[idx] = v with an index that may name a position twice: which slots of the
    written region are the last write to their position (they stay; the earlier writes
    are overwritten, as in PyTorch) - NumPy's own assignment decides, as in the forward."""
    owner = np.full(shape, -1, dtype=np.intp)
    slots = np.arange(owner[idx].size).reshape(owner[idx].shape)
    owner[idx] = slots
    return owner[idx] == slots


def _writes_nothing(a, items):
    """Whether a[items] = v reaches no element (items: what _ints_first leaves: slices, None
    and index arrays). PyTorch checks an index's values only where it writes, so an index
    out of range passes then, even into a dim of size 0 (zeros(0, 2)[tensor([0]), 1:1] = v),
    where NumPy (and reading, in PyTorch too) refuses it."""
    d, arrays, sliced = 0, [], []
    for i in items:
        if i is None:
            continue
        if isinstance(i, slice):
            sliced.append(len(range(*i.indices(a.shape[d]))))
            d += 1
        else:  # an index array: a mask picks its true positions over as many dims as it has
            if i.dtype == bool and i.shape != a.shape[d:d + i.ndim]:
                return False  # a mask of the wrong shape: refused (NumPy's words)
            arrays.append(np.zeros(int(i.sum())) if i.dtype == bool else i)
            d += i.ndim if i.dtype == bool else 1
    try:
        picked = np.broadcast_shapes(*(np.shape(i) for i in arrays))
    except ValueError:
        return False  # index arrays of shapes that don't broadcast: refused (NumPy's words)
    return 0 in picked or 0 in sliced or 0 in a.shape[d:]


def setitem(x, idx, value):
    """x[idx] = value, with every index getitem takes. In the graph, x's history becomes
    this write: the written positions get their gradient from value, the others from x's
    old value."""
    _check_mask(x, idx, '__setitem__')
    i = _index_data(idx)
    basic = _is_basic_index(i)
    first, i = (None, i) if basic else _ints_first(i, x.ndim)  # PyTorch's placement

    def at(a):  # the part of a the index (its tensors, masks, slices) then picks from
        return a if first is None else a[first]  # a view: writing into it writes into a
    try:
        region = at(x.array)[i] if basic else at(x.array)  # what the write may reach
    except IndexError:
        region = np.zeros(0)  # an index out of range: refused below, with the shape named
    _check_inplace(x, '__setitem__', region)
    if not isinstance(value, Tensor) or not basic and value.array.size == 1:  # as PyTorch
        _fits(value, x.dtype, '__setitem__')  # a number (one value with a mask) must fit
    if isinstance(value, Tensor) and basic:  # a copy into a region: the very same memory is fine
        _no_partial_overlap(region, value.array, '__setitem__')
    elif not basic:  # an index write: no shared memory at all (a mask is copied, as PyTorch's)
        _no_shared_memory(x, (value,) + tuple(t for t in _tensors_in(idx) if t.dtype != bool_),
                          '__setitem__')
    v = value if not isinstance(value, Tensor) or value.dtype == x.dtype else value.to(x.dtype)
    recording = _grad_enabled and (x.requires_grad or _requires_grad(v))
    nothing = False  # a write to no element (its out-of-range index passes, as in PyTorch)
    try:
        last = None if not recording or basic else _last_writes(at(x.array).shape, i)
        at(x.array)[i] = v.array if isinstance(v, Tensor) else v
    except (ValueError, IndexError) as e:
        if not (isinstance(e, IndexError) and not basic and _writes_nothing(at(x.array), i)):
            raise type(e)(f"setitem: {e} (tensor of shape {tuple(x.shape)})") from None
        nothing = True
    _bump(x)
    if not recording:
        return
    parents = (x, v) if _requires_grad(v) else (x,)

    def backward(g, vs=np.shape(v)):
        """d setitem/dx = 1 where not written, 0 where written
        d setitem/d value = 1 at the places it was written to  (the last write, where repeated)"""
        if nothing:  # (x still joins the graph, as PyTorch's: the value's gradient is 0)
            return (g,) if len(parents) == 1 else (g, np.zeros(vs, g.dtype))
        gx = g.copy()
        at(gx)[i] = 0  # written over: no gradient to the old values there
        if len(parents) == 1:
            return (gx,)
        gv = at(g)[i]
        gv = gv if last is None else np.where(last, gv, 0)  # only the last write to a place counts
        gv = gv.reshape((1,) * (len(vs) - gv.ndim) + gv.shape)
        return gx, unbroadcast(gv, vs)  # a broadcast value: its uses add up
    _record(x, from_op(x.array, '__setitem__', parents, backward, saved=_tensors_in(idx)))


# The index writes: their out-of-place op written back, after _no_shared_memory.
def scatter_(x, dim, index, src=None, *, value=None):
    _no_shared_memory(x, (index, src), 'scatter_')
    return _in_place(x, 'scatter_', scatter(x, dim, index, src, value=value))


def scatter_add_(x, dim, index, src):
    _no_shared_memory(x, (index, src), 'scatter_add_')
    return _in_place(x, 'scatter_add_', scatter_add(x, dim, index, src))


def index_add_(x, dim, index, source, alpha=1):
    _no_shared_memory(x, (index, source), 'index_add_')
    return _in_place(x, 'index_add_', index_add(x, dim, index, source, alpha))


def index_fill_(x, dim, index, value):
    _no_shared_memory(x, (index,), 'index_fill_')  # (a 0-d value tensor is read once, first)
    return _in_place(x, 'index_fill_', index_fill(x, dim, index, value))


# More in-place forms: the out-of-place op, written back by _in_place. reads_input: the
# op's rule reads its input (d|x|/dx = sign(x), d sin(x)/dx = cos(x)), whose old values the
# write destroys, so it gets a copy of them (_keep_old), as mul_ by a tensor does. A rule
# that reads its output (exp, 1/x) reads x's new values, and the steps (floor) read nothing.
def _in_place_form(name, fn, reads_input=False):
    def op(x, *args, **kwargs):
        old = _keep_old(x, None, reads_input and x.requires_grad)[0]
        return _in_place(x, name, fn(old, *args, **kwargs))
    op.__name__ = name
    return op


def _new_shape_in_place(x, op, make):
    """unsqueeze_, squeeze_, t_: x takes a new shape over the same memory; in the graph it
    becomes that view of its old self."""
    new, old_shape = make(x), x.array.shape
    if new.requires_grad:
        new._op = op
        _rewrite(x, new)
    x.array = new.array
    _bump(x)  # a change, as in PyTorch: a rule that saved x's old self refuses to run
    if x._view is not None:  # still a view of its base: made from it one step further
        base, remake = x._view
        x._view = (base, lambda t: make(remake(t)))
    undo = (lambda t: t.t()) if op == 't_' else (lambda t: t.reshape(old_shape))
    for ref in getattr(x, '_views', None) or ():  # x's views: made from x's old shape
        v = ref()
        if v is not None:
            v._view = (x, lambda t, remake=v._view[1]: remake(undo(t)))
    return x


def _resize_(x, *sizes, memory_format=None):
    """x.resize_(2, 3): x takes that shape over its own memory when the number of elements
    stays the same (as reshape, in place); tinytorch cannot grow or shrink a tensor's memory."""
    shape = _sizes(sizes)
    if x.requires_grad:
        raise RuntimeError("resize_: cannot resize a tensor that requires grad; use reshape")
    if math.prod(shape) != x.numel() or not x.array.flags.c_contiguous:
        raise RuntimeError(f"resize_: tinytorch cannot change a tensor's memory (shape "
                           f"{tuple(x.shape)} to {tuple(shape)}); make a new tensor "
                           "(torch.zeros(...)) or use reshape")
    return _new_shape_in_place(x, 'resize_', lambda t: reshape(t, shape))


def _addcmul_(x, tensor1, tensor2, *, value=1):
    """x += value * tensor1 * tensor2"""
    return x.add_(tensor1 * tensor2 * value)


def _addcdiv_(x, tensor1, tensor2, *, value=1):
    """x += value * tensor1 / tensor2"""
    return x.add_(tensor1 / tensor2 * value)


def _detach_(x):
    """x.detach_(): x leaves the graph and becomes a leaf (in place)."""
    x._parents, x._backward, x._op, x.requires_grad = (), None, None, False
    return x


_methods(abs_=_in_place_form('abs_', abs, reads_input=True), exp_=_in_place_form('exp_', exp),
         log_=_in_place_form('log_', log, reads_input=True), tanh_=_in_place_form('tanh_', tanh),
         sigmoid_=_in_place_form('sigmoid_', sigmoid), sqrt_=_in_place_form('sqrt_', sqrt),
         neg_=_in_place_form('neg_', neg), floor_=_in_place_form('floor_', floor),
         ceil_=_in_place_form('ceil_', ceil), round_=_in_place_form('round_', round),
         trunc_=_in_place_form('trunc_', trunc), sign_=_in_place_form('sign_', sign),
         sin_=_in_place_form('sin_', sin, reads_input=True),
         cos_=_in_place_form('cos_', cos, reads_input=True),
         square_=_in_place_form('square_', square, reads_input=True),  # (its table row says 'x')
         reciprocal_=_in_place_form('reciprocal_', reciprocal),  # (its rule reads the output)
         sinc_=_in_place_form('sinc_', sinc, reads_input=True),
         logit_=_in_place_form('logit_', logit, reads_input=True),
         xlogy_=_in_place_form('xlogy_', xlogy, reads_input=True),
         clamp_min_=_in_place_form('clamp_min_', clamp_min),
         clamp_max_=_in_place_form('clamp_max_', clamp_max),
         scatter_=scatter_, scatter_add_=scatter_add_, index_add_=index_add_,
         index_fill_=index_fill_,
         unsqueeze_=lambda self, dim: _new_shape_in_place(self, 'unsqueeze_', lambda t: unsqueeze(t, dim)),
         squeeze_=lambda self, dim=None: _new_shape_in_place(self, 'squeeze_', lambda t: squeeze(t, dim)),
         t_=lambda self: _new_shape_in_place(self, 't_', lambda t: t.t()), add_=add_, sub_=sub_,
         mul_=mul_, div_=div_, pow_=pow_, clamp_=clamp_, relu_=relu_, masked_fill_=masked_fill_,
         fill_=fill_, zero_=zero_, copy_=copy_, clip_=clamp_, __setitem__=setitem,
         __iadd__=lambda self, o: add_(self, o), __isub__=lambda self, o: sub_(self, o),
         __imul__=lambda self, o: mul_(self, o), __itruediv__=lambda self, o: div_(self, o),
         __ipow__=lambda self, o: pow_(self, o),
         addcmul_=_addcmul_, addcdiv_=_addcdiv_, detach_=_detach_, resize_=_resize_,
         tan_=_in_place_form('tan_', tan))


# ---------------------------------------------------------------------------
# 14. Creation functions and the random generator
# ---------------------------------------------------------------------------
# Every random op (randn, dropout, sampling, shuffling) draws from a Generator: the one
# you pass as generator=..., else the library's default_generator, which manual_seed(s)
# reseeds. A Generator wraps a NumPy one.
class Generator:
    """torch.Generator: a seeded source of random numbers, for generator=... arguments."""

    def __init__(self, device='cpu'):
        _cpu_only(device, 'Generator')
        self.device = _CPU
        self.seed()

    def manual_seed(self, seed):
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self

    def seed(self):
        """Reseed from the operating system's entropy; returns the new seed."""
        self.manual_seed(int(np.random.SeedSequence().entropy) % 2 ** 63)
        return self._seed

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return self._rng.bit_generator.state  # a new dict each time

    def set_state(self, state):
        self._rng.bit_generator.state = state
        return self


default_generator = Generator()


def _numpy_rng(generator=None):
    """The NumPy generator behind generator=... (None: the library's default_generator;
    a NumPy Generator is taken as it is)."""
    if generator is None:
        return default_generator._rng
    return generator._rng if isinstance(generator, Generator) else generator


def manual_seed(seed):
    """Seed the default generator: every random op after it is reproducible."""
    return default_generator.manual_seed(seed)


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(new_state):
    default_generator.set_state(new_state)


def as_tensor(data, dtype=None, device=None):
    """torch.as_tensor: no copy where none is needed (a tensor, or a NumPy array of the
    dtype asked for, is shared)."""
    _cpu_only(device, 'as_tensor')
    if isinstance(data, Tensor):
        return data if dtype is None else to(data, dtype)
    if isinstance(data, np.ndarray) and (dtype is None or np.dtype(dtype) == data.dtype):
        return from_numpy(data)
    return tensor(data, dtype=dtype)


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


def zeros(*size, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'zeros')
    return _leaf(np.zeros(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'ones')
    return _leaf(np.ones(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'full')
    if isinstance(fill_value, Tensor):  # a 0-d tensor counts as its number, as in PyTorch
        if fill_value.ndim != 0:
            raise TypeError(f"full: fill_value must be a number (or a 0-d tensor), got a tensor "
                            f"of shape {tuple(fill_value.shape)}")
        fill_value = fill_value.item()
    if dtype is None:  # a float (np.float32 and np.bool_ too) gives the default float dtype
        dtype = _scalar_dtype(fill_value)
    _fits(fill_value, np.dtype(dtype), 'full')
    return _leaf(np.full(tuple(size) if not isinstance(size, int) else (size,), fill_value,
                         dtype=dtype), requires_grad)


def _filled_like(x, value, dtype, op):
    """x's shape and order of dims in memory (a transposed x gives a transposed result, as
    PyTorch's *_like: memory_format=torch.preserve_format), filled with value."""
    out = _empty_in_layout_of(x.array, np.dtype(dtype or x.dtype))
    out[...] = _fits(value, out.dtype, op)
    return out


def zeros_like(x, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'zeros_like')
    return _leaf(_filled_like(x, 0, dtype, 'zeros_like'), requires_grad)


def ones_like(x, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'ones_like')
    return _leaf(_filled_like(x, 1, dtype, 'ones_like'), requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """torch.empty: a tensor whose values are not set; here they are zeros."""
    return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def empty_like(x, dtype=None, device=None, requires_grad=False):
    return zeros_like(x, dtype=dtype, device=device, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'arange')
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = default_dtype if builtins.any(isinstance(v, float) for v in (start, end, step)) else int64
    return _leaf(np.arange(start, end, step, dtype=dtype), requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'randn')
    rng = _numpy_rng(generator)
    return _leaf(rng.standard_normal(_sizes(size), dtype=dtype or default_dtype), requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False):
    """torch.normal: samples of N(mean, std); mean and std are numbers or tensors (then
    the shape is theirs, broadcast), or numbers with a size."""
    _cpu_only(device, 'normal')
    m, s = (v.array if isinstance(v, Tensor) else v for v in (mean, std))
    shape = _sizes((size,)) if size is not None else np.broadcast_shapes(np.shape(m), np.shape(s))
    like = next((v.dtype for v in (mean, std) if isinstance(v, Tensor)), default_dtype)
    draw = _numpy_rng(generator).standard_normal(shape) * s + m
    return _leaf(draw.astype(dtype or like), requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'rand')
    return _leaf(_numpy_rng(generator).random(_sizes(size), dtype=dtype or default_dtype),
                 requires_grad)


def randint(low=0, high=None, size=None, *, generator=None, dtype=int64, device=None,
            requires_grad=False):
    """Integers in [low, high): randint(high, size) or randint(low, high, size)."""
    _cpu_only(device, 'randint')
    if size is None and isinstance(high, (tuple, list)):  # PyTorch's randint(high, size)
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    size = () if size is None else (size,) if isinstance(size, int) else tuple(size)
    return _leaf(_numpy_rng(generator).integers(low, high, size=size, dtype=dtype), requires_grad)


def randperm(n, *, generator=None, dtype=int64, device=None, requires_grad=False):
    _cpu_only(device, 'randperm')
    return _leaf(_numpy_rng(generator).permutation(n).astype(dtype), requires_grad)


def multinomial(probs, num_samples=1, replacement=False, *, generator=None):
    """Sample num_samples indices from each row of probs (rows need not be normalised);
    without replacement an index comes at most once per row."""
    p = probs.array if isinstance(probs, Tensor) else probs
    p2 = p.reshape(-1, p.shape[-1]).astype(np.float64)
    rng = _numpy_rng(generator)
    if replacement or num_samples == 1:
        cdf = np.cumsum(p2, axis=-1)
        u = rng.random((p2.shape[0], num_samples)) * cdf[:, -1:]
        idx = np.sum(cdf[:, None, :] <= u[:, :, None], axis=-1)  # first index whose cdf exceeds u
        idx = np.minimum(idx, p.shape[-1] - 1)
    else:
        if num_samples > p.shape[-1]:
            raise RuntimeError(f"multinomial: cannot take {num_samples} samples from "
                               f"{p.shape[-1]} categories without replacement")
        # the largest log p + Gumbel noise, num_samples of them: draws without replacement
        with np.errstate(divide='ignore'):
            keys = np.log(p2) - np.log(-np.log(rng.random(p2.shape)))
        idx = np.argsort(-keys, axis=-1, kind='stable')[:, :num_samples]
    return _leaf(idx.reshape(p.shape[:-1] + (num_samples,)).astype(int64), False)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'eye')
    return _leaf(np.eye(n, m, dtype=dtype or default_dtype), requires_grad)


def full_like(x, fill_value, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'full_like')
    return _leaf(_filled_like(x, fill_value, dtype, 'full_like'), requires_grad)


def rand_like(x, dtype=None, device=None, requires_grad=False):
    r = rand(*x.shape, dtype=dtype or x.dtype, device=device)
    return _leaf(_laid_out_as(r.array, x.array), requires_grad)  # x's layout, as zeros_like


def randn_like(x, dtype=None, device=None, requires_grad=False):
    r = randn(*x.shape, dtype=dtype or x.dtype, device=device)
    return _leaf(_laid_out_as(r.array, x.array), requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'linspace')
    return _leaf(np.linspace(start, end, steps, dtype=dtype or default_dtype), requires_grad)


def logspace(start, end, steps, base=10.0, dtype=None, device=None, requires_grad=False):
    _cpu_only(device, 'logspace')
    return _leaf(np.logspace(start, end, steps, base=base, dtype=dtype or default_dtype),
                 requires_grad)


def meshgrid(*tensors, indexing=None):
    """Coordinate grids: each 1-D tensor expanded along the others' dims (views). indexing
    None is 'ij', with PyTorch's warning that it should be named."""
    tensors = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
    if indexing is None:
        warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass the "
                      "indexing argument.", UserWarning, stacklevel=2)
        indexing = 'ij'
    if indexing not in ('ij', 'xy'):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeError("meshgrid: expects all tensors to have the same dtype, got "
                           f"{', '.join(str(t.dtype) for t in tensors)}")
    shape = tuple(t.numel() for t in tensors)
    grids = [expand(reshape(t, tuple(-1 if i == k else 1 for i in range(len(tensors)))), shape)
             for k, t in enumerate(tensors)]
    if indexing == 'xy' and len(grids) >= 2:  # the first two dims swapped
        grids = [transpose(g, 0, 1) for g in grids]
    return tuple(grids)


def _new_zeros(self, *size, dtype=None, requires_grad=False):
    """x.new_zeros(size): zeros of x's dtype (or dtype); x.new_empty is the same."""
    return zeros(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)


def _normal_(x, mean=0.0, std=1.0, *, generator=None):
    """x.normal_(mean, std): x's elements become samples of N(mean, std)."""
    draw = _numpy_rng(generator).standard_normal(x.shape) * std + mean
    return copy_(x, _constant(draw.astype(x.dtype)))


def _uniform_(x, from_=0.0, to=1.0, *, generator=None, **kwargs):
    """x.uniform_(a, b): x's elements become samples of U[a, b)."""
    from_, to = kwargs.pop('from', from_), kwargs.pop('to', to)
    draw = _numpy_rng(generator).random(x.shape) * (to - from_) + from_
    return copy_(x, _constant(draw.astype(x.dtype)))


def _random_(x, from_=None, to=None, *, generator=None):
    """x.random_(from, to): integers in [from, to) (x.random_(to): in [0, to)); x.random_():
    as PyTorch, in [0, 2^24] for float32, [0, 2^53] for float64, [0, max] for an integer."""
    if from_ is None:  # the range the dtype holds exactly
        from_, to = 0, (2 ** (np.finfo(x.dtype).nmant + 1) + 1 if x.dtype.kind == 'f'
                        else 2 if x.dtype == bool_ else int(np.iinfo(x.dtype).max))
    elif to is None:
        from_, to = 0, from_
    return copy_(x, _constant(_numpy_rng(generator).integers(from_, to, x.shape)))


def _new(x, *args):
    """x.new(2, 3): a tensor of that shape in x's dtype (zeros here); x.new(data): data in
    x's dtype."""
    if not args:
        return zeros(0, dtype=x.dtype)  # x.new(): an empty tensor, as PyTorch's
    if builtins.all(isinstance(a, int) for a in args):
        return zeros(*args, dtype=x.dtype)
    return tensor(args[0], dtype=x.dtype)


_methods(new_zeros=_new_zeros, new_empty=_new_zeros,
         new_ones=lambda self, *size, dtype=None, requires_grad=False: ones(
             *size, dtype=dtype or self.dtype, requires_grad=requires_grad),
         new_full=lambda self, size, fill_value, dtype=None, requires_grad=False: full(
             size, fill_value, dtype=dtype or self.dtype, requires_grad=requires_grad),
         new_tensor=lambda self, data, dtype=None, requires_grad=False: tensor(
             data, dtype=dtype or self.dtype, requires_grad=requires_grad),
         multinomial=multinomial, normal_=_normal_, uniform_=_uniform_, random_=_random_,
         new=_new)


# Functional forms: tinytorch.exp(x), tinytorch.sum(x, dim=1), ... are the same functions.
# (sum, max, min and abs shadow Python's builtins inside this module only.)


# ---------------------------------------------------------------------------
# 15. gradcheck: compare the analytic gradient with central finite differences
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
            return float(np.sum(fn(*inputs).array * v))

    analytic = _analytic_gradients(out, v, inputs, wrt)
    if fast_mode:
        return _check_directions(f, inputs, wrt, analytic, eps, atol, rtol, seed)
    for i in wrt:
        x = inputs[i]
        numeric = np.zeros(x.shape)
        for idx in np.ndindex(*x.shape):
            old = x.array[idx]
            x.array[idx] = old + eps
            plus = f()
            x.array[idx] = old - eps
            minus = f()
            x.array[idx] = old
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
        return {i: None if inputs[i].grad is None else inputs[i].grad.array for i in wrt}
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
        olds = {i: inputs[i].array.copy() for i in wrt}
        try:
            for i in wrt:
                inputs[i].array[...] = olds[i] + eps * u[i]
            plus = f()
            for i in wrt:
                inputs[i].array[...] = olds[i] - eps * u[i]
            minus = f()
        finally:
            for i in wrt:
                inputs[i].array[...] = olds[i]
        numeric = (plus - minus) / (2 * eps)
        tolerance = atol + rtol * builtins.abs(numeric)
        if builtins.abs(predicted - numeric) > tolerance:
            raise GradcheckError(f"gradcheck (fast_mode): along random direction {k}, the "
                                 f"analytic directional derivative <grad, u> = {predicted:.8g} vs "
                                 f"numeric {numeric:.8g} (allowed: {tolerance:.3g}); run without "
                                 "fast_mode to find the element")
    return True


def assert_close(actual, expected, *, rtol=None, atol=None, equal_nan=False, check_dtype=True,
                 msg=None, **kwargs):
    """torch.testing.assert_close: |actual - expected| <= atol + rtol |expected| everywhere,
    with PyTorch's default tolerances for the dtype (float32: rtol 1.3e-6, atol 1e-5;
    float64: 1e-7 both; integers: exact)."""
    a = actual.array if isinstance(actual, Tensor) else np.asarray(actual)
    b = expected.array if isinstance(expected, Tensor) else np.asarray(expected)
    if a.shape != b.shape:
        raise AssertionError(msg or f"The values for attribute 'shape' do not match: "
                             f"{tuple(a.shape)} != {tuple(b.shape)}.")
    if check_dtype and isinstance(actual, Tensor) and a.dtype != b.dtype:
        raise AssertionError(msg or f"The values for attribute 'dtype' do not match: "
                             f"{a.dtype} != {b.dtype}.")
    if (rtol is None) != (atol is None):
        raise ValueError("Both 'rtol' and 'atol' must be either specified or omitted, but got "
                         f"no {'rtol' if rtol is None else 'atol'}.")
    if rtol is None:
        rtol, atol = {float16: (1e-3, 1e-5), float32: (1.3e-6, 1e-5),
                      float64: (1e-7, 1e-7)}.get(np.promote_types(a.dtype, b.dtype), (0, 0))
    close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if not close.all():
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        raise AssertionError(msg or f"Tensor-likes are not close!\n\nMismatched elements: "
                             f"{int((~close).sum())} / {close.size}\nGreatest absolute "
                             f"difference: {np.nanmax(np.where(close, 0, diff))} (up to "
                             f"{atol} allowed)")
# ---------------------------------------------------------------------------
# 16. Your own op as a class: autograd.Function; autograd.grad and autograd.backward
# ---------------------------------------------------------------------------
# Every op above is a forward line plus a rule handed to from_op; the rule is a closure
# that reads what it needs (inputs, masks) from the function around it. PyTorch code
# writes the same op as a class with two static methods, forward(ctx, ...) and
# backward(ctx, grad_output), and a context object ctx that carries what backward needs
# (ctx.save_for_backward(x) ... ctx.saved_tensors). Function.apply is the bridge: it
# runs forward without a graph, then hands the result to from_op with a rule that calls
# backward. So a Function is one graph node like any other: the same walk, the same
# version check of what it saved, the same shape and dtype check of what it returns.
class FunctionCtx:
    """The `ctx` a Function's forward and backward share."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad  # one bool per argument of apply
        self.to_save = ()
        self.non_differentiable = ()

    def save_for_backward(self, *tensors):
        """Keep tensors for backward; backward refuses to run if one of them is changed in
        place after the forward pass (the version counter, as for every op's saved=)."""
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward: expected Tensors (or None), got "
                                f"{type(t).__name__}; keep other values as ctx attributes")
        self.to_save = tensors

    @property
    def saved_tensors(self):
        return self.to_save

    def mark_non_differentiable(self, *tensors):
        """These outputs get no gradient (indices, masks): they stay outside the graph."""
        self.non_differentiable = tensors


class Function:
    """Subclass it with static methods forward(ctx, *args) and backward(ctx, *grads), then
    call YourFunction.apply(*args). backward returns one gradient per argument of forward
    (None for an argument that is not a tensor or needs none)."""

    @staticmethod
    def forward(ctx, *args):
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass must define backward(ctx, *grads) "
                                  "to be differentiated")

    @classmethod
    def apply(cls, *args):
        ctx = FunctionCtx(tuple(isinstance(a, Tensor) and a.requires_grad for a in args))
        with no_grad():  # forward computes values only; the graph node is made below
            result = cls.forward(ctx, *args)
        if not (_grad_enabled and builtins.any(ctx.needs_input_grad)):
            return result
        outputs = result if isinstance(result, tuple) else (result,)
        inputs = tuple(a for a in args if isinstance(a, Tensor))
        name = cls.__name__ + 'Backward'
        saved = tuple(t for t in ctx.to_save if t is not None)

        def rule(*gs):
            """d Function/d(each input): what its backward(ctx, *grads) returns"""
            with no_grad():
                grads = cls.backward(ctx, *(None if g is None else _constant(g) for g in gs))
            grads = grads if isinstance(grads, tuple) else (grads,)
            if len(grads) != len(args):
                raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                                   f"(expected {len(args)}, got {len(grads)})")
            for i, (a, g) in enumerate(zip(args, grads)):
                if g is not None and not isinstance(a, Tensor):
                    raise RuntimeError(f"function {name} returned a gradient different from "
                                       f"None at position {i}, but that argument of forward "
                                       f"is a {type(a).__name__}, not a Tensor")
            return tuple(g.array if isinstance(g, Tensor) else g
                         for a, g in zip(args, grads) if isinstance(a, Tensor))

        def differentiable(o):
            return isinstance(o, Tensor) and o.dtype.kind == 'f' and not builtins.any(
                o is t for t in ctx.non_differentiable)

        if len(outputs) == 1:
            o = outputs[0]
            if not differentiable(o):
                return result
            # the node shares o's memory and version counter (view_of): a Function may
            # save its own output, as exp and tanh do, and an in-place change is caught
            node = from_op(o.array, name, inputs, rule, saved=saved, view_of=o)
            return (node,) if isinstance(result, tuple) else node  # (y,) stays a tuple
        # Several outputs hang off one hidden node: its "gradient" holds one gradient per
        # output (an object array: 0 where none arrived), so backward runs once, with all.
        def joint_rule(gs):
            """d Function/d(each input): its backward, given every output's gradient"""
            return rule(*(g if not isinstance(g, int) else
                          np.zeros_like(o.array) if isinstance(o, Tensor) else None
                          for g, o in zip(gs, outputs)))

        joint = from_op(np.zeros(len(outputs), dtype=object), name, inputs, joint_rule,
                        saved=saved)
        made = []
        for k, o in enumerate(outputs):
            if differentiable(o):
                def pick(g, k=k):
                    """d output_k/d(the outputs together) = 1 in slot k"""
                    gs = np.zeros(len(outputs), dtype=object)
                    gs[k] = g
                    return (gs,)
                o = from_op(o.array, name + ' output', (joint,), pick, view_of=o)
            made.append(o)
        return tuple(made)


def _roots(outputs, grad_outputs, op):
    """The outputs to differentiate and d(whatever)/d(output) for each (ones for a single
    number when none is given), checked."""
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = (grad_outputs,) * (len(outputs) if grad_outputs is None else 1)
    grad_outputs = tuple(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"{op}: got {len(grad_outputs)} grad_outputs for {len(outputs)} "
                           "outputs; give one per output (None for a single number)")
    gs = []
    for k, (o, g) in enumerate(zip(outputs, grad_outputs)):
        if not o.requires_grad:
            raise RuntimeError(f"{op}: element {k} of the outputs does not require grad and "
                               "has no grad_fn")
        g = _initial_gradient(o, g)
        if not hasattr(g, 'dtype'):  # a Python number for a one-element output
            g = np.full(o.shape, g, dtype=o.dtype)
        gs.append(g if g.dtype == o.dtype else g.astype(o.dtype))
    return outputs, gs


def _root(outputs, gs):
    """One tensor to walk back from, and its gradient: the output itself, or, for several,
    a root node they all feed, whose rule hands each output its gradient."""
    if len(outputs) == 1:
        return outputs[0], gs[0]

    def hand_out(g):
        """d root/d(each output): the gradient given for it"""
        return tuple(gs)
    with enable_grad():
        return from_op(np.zeros(()), 'autograd root', outputs, hand_out), np.ones(())


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
                   allow_unused=False):
    """d outputs / d inputs (weighted by grad_outputs), returned as a tuple of tensors
    instead of accumulated into .grad: no tensor's .grad changes."""
    if create_graph:
        raise NotImplementedError("autograd.grad: create_graph=True is not supported: backward "
                                  "rules compute NumPy arrays, so a gradient has no graph of its "
                                  "own (no second derivatives)")
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    for k, x in enumerate(inputs):
        if not (isinstance(x, Tensor) and x.requires_grad):
            raise RuntimeError(f"autograd.grad: input {k} does not require grad")
    outputs, gs = _roots(outputs, grad_outputs, 'autograd.grad')
    # backward's own walk (section 6) gives every tensor's gradient on the way; keep the
    # inputs' and store nothing in .grad
    wanted = {id(x): k for k, x in enumerate(inputs)}
    grads = [None] * len(inputs)
    for node, g, _ in _walk(*_root(outputs, gs), bool(retain_graph)):
        if id(node) in wanted:
            grads[wanted[id(node)]] = g.copy()  # its own memory, as a new tensor
    for k, g in enumerate(grads):
        if g is None and not allow_unused:
            raise RuntimeError(f"autograd.grad: input {k} was not used to compute the outputs; "
                               "pass allow_unused=True to get None for it")
    return tuple(None if g is None else _constant(g) for g in grads)


def _autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                       inputs=None):
    """tensor.backward() for several tensors at once (their gradients add up in .grad);
    inputs=...: accumulate into these tensors' .grad only."""
    if create_graph:
        raise NotImplementedError("autograd.backward: create_graph=True is not supported "
                                  "(no second derivatives)")
    if inputs is not None:
        inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
        for x, g in zip(inputs, _autograd_grad(tensors, inputs, grad_tensors, retain_graph,
                                               allow_unused=True)):
            if g is not None:
                _accumulate(x, g.array.copy())
        return
    outputs, gs = _roots(tensors, grad_tensors, 'autograd.backward')
    backward(*_root(outputs, gs), retain_graph=bool(retain_graph))


class autograd:
    """tt.autograd, PyTorch's torch.autograd: Function, grad, backward."""
    Function = Function
    FunctionCtx = FunctionCtx
    grad = staticmethod(_autograd_grad)
    backward = staticmethod(_autograd_backward)


# Activation checkpointing, PyTorch's torch.utils.checkpoint.checkpoint (compat.py's path):
# memory for time. The function (a Transformer block, say) runs under no_grad, so none of
# its intermediates are kept; ONE graph node stands for it, holding only its inputs. The
# node's rule runs the function again, this time with a graph and the same random numbers
# (dropout), walks back through that graph (autograd.grad) and hands on the gradients of
# the function's inputs and of the parameters it read, which are the node's inputs too.


class _Reads:
    """A tool (section 6b's hooks) noting the tensors that require grad an op reads: under
    no_grad those are the function's inputs, its parameters, and tensors from outside."""

    def __init__(self):
        self.found = {}  # id -> tensor, in the order first read

    def op(self, out, op, parents):
        for p in parents:
            if isinstance(p, Tensor) and p.requires_grad:
                self.found.setdefault(id(p), p)

    def rule_start(self, node):
        pass

    def rule_end(self, node, grads):
        pass

    def renamed(self, node, op):
        pass

    def region(self, name, ms):
        pass


def _checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, **kwargs):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False): function(*args,
    **kwargs), whose intermediates are recomputed in backward instead of kept."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed "
                      "explicitly; use_reentrant=False is recommended", stacklevel=2)
    elif use_reentrant:
        raise NotImplementedError("checkpoint: tinytorch has the non-reentrant variant only; "
                                  "pass use_reentrant=False (PyTorch's recommendation)")
    rng = get_rng_state() if preserve_rng_state else None
    reads = _Reads()
    _hooks.append(reads)
    try:
        with no_grad():
            out = function(*args, **kwargs)
    finally:
        _hooks.remove(reads)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: the function must return one Tensor, got "
                        f"{type(out).__name__} (checkpoint each output's function separately)")
    given = {id(a) for a in args if isinstance(a, Tensor)}
    for t in reads.found.values():
        if id(t) not in given and t._backward is not None:
            raise RuntimeError("checkpoint: the function reads a tensor computed outside it "
                               f"(made by '{t._op}', shape {tuple(t.shape)}) that requires "
                               "grad; pass it to checkpoint as an argument")
    inputs = tuple(a for a in args if isinstance(a, Tensor))
    params = tuple(t for t in reads.found.values() if id(t) not in given)

    def backward(g):
        """d function/d(inputs, parameters): function run again with a graph, walked back"""
        now = get_rng_state()
        if rng is not None:
            set_rng_state(rng)  # the same dropout masks as the forward pass
        try:
            with enable_grad():
                copies = [detach(a).requires_grad_(a.requires_grad) if isinstance(a, Tensor)
                          else a for a in args]
                again = function(*copies, **kwargs)
        finally:
            set_rng_state(now)
        leaves = [c for c in copies if isinstance(c, Tensor)] + list(params)
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(_autograd_grad(again, wanted, _constant(g), allow_unused=True)
                     if again.requires_grad else [None] * len(wanted))
        return tuple(_array_or_none(next(grads)) if t.requires_grad else None for t in leaves)
    return from_op(out.array, 'checkpoint', inputs + params, backward, saved=inputs + params)


def _array_or_none(t):
    return None if t is None else t.array


# y.grad_fn: the graph as PyTorch shows it. tinytorch's graph is the tensors themselves
# (each non-leaf keeps _op, _parents and _backward); grad_fn is a view onto that: a small
# node object per non-leaf, with PyTorch's name() and next_functions, so that
# loss.grad_fn.next_functions[0][0].name() walks back as in PyTorch's tutorials. A leaf
# that requires grad appears as an AccumulateGrad node (its .variable is the leaf), an
# input that needs no gradient as (None, 0). Nothing here is used by backward.
class _GraphNode:
    """y.grad_fn: the op that made y, as one node of the backward graph."""

    def __init__(self, tensor):
        self._tensor = tensor  # the non-leaf this node stands for (kept alive by the node)
        self._name = _grad_fn_name(tensor)  # now: matmul's name needs its inputs' dims

    def name(self):
        return self._name

    @property
    def next_functions(self):
        """One (node, index) pair per input of the op: the input's grad_fn, its
        AccumulateGrad if it is a leaf that requires grad, (None, 0) if it needs none.
        Empty once backward has freed the graph (pass retain_graph=True to keep it)."""
        t = self._tensor
        if t._op.endswith(' output') and len(t._parents) == 1:  # one of several outputs
            t = t._parents[0]  # of a Function: the node is the Function's own (below)
        return tuple(_next_function(p) for p in _inputs(t))

    def __repr__(self):
        return f'<{self.name()} object at {id(self):#x}>'


class AccumulateGrad:
    """The node where a leaf's gradient ends: backward adds it into .variable.grad."""

    def __init__(self, variable):
        self.variable = variable
        self.next_functions = ()

    def name(self):
        return 'torch::autograd::AccumulateGrad'

    def __repr__(self):
        return f'<AccumulateGrad object at {id(self):#x}>'


# one node object per tensor while someone holds it (y.grad_fn is y.grad_fn, as PyTorch)
_grad_fns = weakref.WeakValueDictionary()  # id(tensor) -> its _GraphNode
_accumulators = weakref.WeakValueDictionary()  # id(leaf) -> its AccumulateGrad


def _grad_fn(t):
    if t._backward is None:
        return None  # a leaf (or made under no_grad): PyTorch's grad_fn is None too
    if t._op.endswith(' output') and len(t._parents) == 1:
        t = t._parents[0]  # several outputs of one Function share its node
    node = _grad_fns.get(id(t))
    if node is None:
        node = _grad_fns[id(t)] = _GraphNode(t)
    return node


def _next_function(p):
    if not p.requires_grad:
        return (None, 0)
    if p._backward is not None:
        k = 0
        if p._op.endswith(' output') and p._backward.__defaults__:
            k = p._backward.__defaults__[0]  # which output of the Function p is
        return (_grad_fn(p), k)
    acc = _accumulators.get(id(p))
    if acc is None:
        acc = _accumulators[id(p)] = AccumulateGrad(p)
    return (acc, 0)


def _variable(data, requires_grad=False, volatile=False):
    """torch.autograd.Variable (PyTorch before 0.4): today a Variable is a Tensor."""
    return data.requires_grad_(True) if requires_grad else data


autograd.Variable = staticmethod(_variable)  # adds to section 16's namespace (bound nowhere else)


_methods(grad_fn=property(_grad_fn))


# ---------------------------------------------------------------------------
# 17. record_function: a named region for the tools
# ---------------------------------------------------------------------------
# A named row in lookinside's profile (the hooks the tools watch through are in section 6b).
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
            hook.region(self.name, (time.perf_counter() - self._start) * 1000)


# ---------------------------------------------------------------------------
# 18. PyTorch's other forms: x.to(device), print options, histograms
# ---------------------------------------------------------------------------
# Tensor methods and functions PyTorch programs reach for that compute nothing new: the
# device forms of to() (the one device is the CPU) and the device predicates, grad mode's
# other forms (inference_mode, set_grad_enabled), is_tensor and numel, set_printoptions,
# histogram, pi and e, __version__. (PyTorch's module paths and the stand-ins of a machine
# without a GPU are compat.py's, section 21. The names teaching code reaches for, which
# dev/CENSUS.md counts, are each in the section of their subject.)
import operator  # noqa: E402
import types  # noqa: E402


def _to(self, *args, dtype=None, device=None, non_blocking=False, copy=False, **_):
    """x.to(dtype), x.to(device), x.to(device, dtype), x.to(other_tensor): PyTorch's forms
    (this extends Part I's to(dtype), section 6b; the one device is the CPU)."""
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (str, type(_CPU))):  # a device ('device' is the argument here)
            device = a
        else:
            dtype = a
    _cpu_only(device, 'to')
    out = self if dtype is None else to(self, dtype)
    return clone(out) if copy and out is self else out


def _format(self, spec):
    """f'{loss:.4f}': a one-element tensor formats as its number, as in PyTorch."""
    if spec and self.numel() == 1:
        return format(self.item(), spec)
    return format(repr(self), spec)


class inference_mode(no_grad):
    """torch.inference_mode: here the same as no_grad (no graph is built)."""

    def __init__(self, mode=True):
        self.enabled = not mode


class set_grad_enabled(_GradMode):
    """torch.set_grad_enabled(mode): switches the graph on or off at once; as a context
    manager it restores the previous mode at the end, as a decorator it sets the mode for
    each call of the function only."""

    def __init__(self, mode):
        global _grad_enabled
        self._prev, self.enabled = _grad_enabled, bool(mode)
        _grad_enabled = self.enabled

    def __enter__(self):
        pass  # already set by __init__

    def __call__(self, fn):
        global _grad_enabled
        _grad_enabled = self._prev  # decorating changes nothing now; each call does
        enabled = self.enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(enabled):
                return fn(*args, **kwargs)
        return wrapper


def is_tensor(obj):
    """torch.is_tensor: is obj a Tensor (a Parameter is one)."""
    return isinstance(obj, Tensor)


def numel(input):
    """torch.numel: the number of elements."""
    return input.numel()


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None):
    """torch.set_printoptions: digits after the point, how many elements before a tensor is
    summarized with '...', the line width, and e-notation always (sci_mode=True), never
    (False) or where the magnitudes need it (None). profile: 'default', 'short', 'full'."""
    if profile not in (None, 'default', 'short', 'full'):
        raise ValueError(f"set_printoptions: unknown profile {profile!r}; use 'default', "
                         "'short' or 'full'")
    if profile is not None:
        _print_options.update(_PRINT_DEFAULTS)
        _print_options.update({'short': dict(precision=2, threshold=1000, edgeitems=2),
                               'full': dict(threshold=math.inf)}.get(profile, {}))
    for k, v in (('precision', precision), ('threshold', threshold),
                 ('edgeitems', edgeitems), ('linewidth', linewidth)):
        if v is not None:
            _print_options[k] = v
    _print_options['sci_mode'] = sci_mode


HistogramResult = namedtuple('histogram', ['hist', 'bin_edges'])


def histogram(input, bins=100, *, range=None, weight=None, density=False):
    """torch.histogram: counts of a float tensor's values in equal bins (no gradient)."""
    w = None if weight is None else weight.array
    hist, edges = np.histogram(input.array, bins.array if isinstance(bins, Tensor) else bins,
                               range=range, weights=w, density=density)
    return HistogramResult(_constant(hist.astype(input.dtype)), _constant(edges.astype(input.dtype)))


def histc(input, bins=100, min=0, max=0):
    """torch.histc: histogram's counts; min = max = 0 takes the data's own range."""
    lo, hi = (min, max) if (min, max) != (0, 0) else (input.array.min(), input.array.max())
    return histogram(input, bins, range=(float(lo), float(hi))).hist


# x.is_cuda, x.is_xpu, ...: PyTorch's device and layout predicates, as its CPU tensors answer
_never = property(lambda self: False)


pi, e, inf, nan = math.pi, math.e, math.inf, math.nan


__version__ = '2.15.0+tinytorch'  # the PyTorch release whose semantics tinytorch follows


_methods(to=_to, device=property(lambda self: _CPU), is_cpu=property(lambda self: True),
         is_cuda=_never, is_xpu=_never, is_mps=_never, is_meta=_never, is_quantized=_never,
         is_sparse=_never, is_sparse_csr=_never, is_mkldnn=_never, is_ipu=_never, is_maia=_never,
         is_mtia=_never, is_vulkan=_never, is_xla=_never, is_nested=_never,
         cpu=lambda self: self, cuda=lambda self, *args, **kwargs: _cpu_only('cuda', 'cuda()'),
         pin_memory=lambda self: self,
         __index__=lambda self: operator.index(self.item()),  # a 0-d int tensor slices a list
         __format__=_format, histc=histc)


# ---------------------------------------------------------------------------
# 19. Saving and loading: files.py reads and writes the files
# ---------------------------------------------------------------------------
# torch.save / torch.load live in files.py, the one room for files: PyTorch's zip format,
# written as PyTorch writes it and read back by a grammar that runs nothing in the file.
# Here are the two names (each imports files.py when first called: tinytorch.py copied
# alone says in one line that saving needs it), how pickle and copy.deepcopy rebuild a
# tensor, and what files.py uses of the engine besides its public names (_FOR_FILES).
import pickle  # noqa: E402

_FOR_FILES = ('_rebuild_tensor', '_TENSOR_CLASSES', '_cpu_only')  # files.py's whole interface
_TENSOR_CLASSES = {}  # 'Parameter' -> nn.Parameter once nn.py is imported (nn.py adds it)


def save(obj, f, pickle_module=pickle, pickle_protocol=2, _use_new_zipfile_serialization=True,
         _disable_byteorder_record=False):
    """torch.save: obj to a path or a binary file, in PyTorch's zip format (torch.load reads
    it); a path is written atomically. files.py (beside this file) does the writing (its own
    pickler: pickle_module and the two underscored flags are accepted and change nothing)."""
    return _companion('files').torch_save(obj, f, pickle_module, pickle_protocol,
                                          _use_new_zipfile_serialization)


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """torch.load: what save() wrote, or a PyTorch file, read by files.py's checkpoint
    grammar (nothing in the file runs; weights_only=False unpickles a file you trust). A
    bad file is one line (pickle.UnpicklingError) naming it."""
    return _companion('files').torch_load(f, map_location, pickle_module,
                                          weights_only=weights_only, mmap=mmap, **kwargs)


def _rebuild_tensor(cls, array, requires_grad):
    """A tensor of class cls over array with its requires_grad (never its graph): how
    pickle and copy.deepcopy rebuild one, and how files.py makes each tensor it loads."""
    t = cls.__new__(cls)
    _init_result(t, array)
    t.requires_grad = bool(requires_grad)
    return t


def _no_setstate(self, state):
    raise pickle.UnpicklingError("sets a tensor's fields directly (BUILD), which no save writes; "
                                 "the file is damaged or was made to attack: do not use it")


_methods(__reduce__=lambda self: (_rebuild_tensor, (type(self), self.array, self.requires_grad)),
         __setstate__=_no_setstate)  # pickle's BUILD on a tensor: refused (load's safety)


# ---------------------------------------------------------------------------
# 20. Speed
# ---------------------------------------------------------------------------
# What a user may call is everything public above this line (`from tinytorch import *`
# gives it, but the modules this file uses and the names that would hide Python's builtins:
# sum, max, abs, round, pow, ...; after it sum([1, 2]) is still Python's), and of this
# section tune() and the thread count. The kernels below are the ops' business.
__all__ = [name for name, value in list(globals().items()) if not name.startswith('_')
           and not isinstance(value, types.ModuleType) and not hasattr(builtins, name)]
__all__ += ['tune', 'get_num_threads', 'set_num_threads']


def _threads_from_env():
    for var in ('TINYTORCH_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
        if os.environ.get(var, '').isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


_num_threads = _threads_from_env()
_threads_pinned = False  # set_num_threads(n) pins the number
_pool, _pool_pid = None, None
_sharing = None  # tuning.py, once tune() turned on sharing the cores with other programs


def tune():
    """Tune this process for training; the scripts (train_*.py, bench.py) call it first
    thing. Importing tinytorch changes no setting of the process (it adds one import
    finder, section 21); this call does, for the whole process: glibc keeps freed memory for
    reuse, and tinytorch's threads and OpenBLAS's follow the cores other programs leave free.
    tuning.py, beside this file, holds both (and says why). Returns the names of the
    settings made."""
    global _sharing
    tuning = _companion('tuning')
    done = tuning.tune()
    _sharing = tuning if 'share_cores' in done else None
    return done


def _share_cores():
    """Once tune() turned sharing on: look at the machine if it is time (tuning.share_cores)."""
    if _sharing is not None:
        _sharing.share_cores()


def _threads_now():
    """The threads parallel_for uses: the setting, less what other programs take."""
    if _threads_pinned or _sharing is None:
        return _num_threads
    return builtins.min(_num_threads, _sharing.cores_free())
# Below this many elements a job stays on one thread (waking a thread costs 20-60 us here:
# GELU on 2^17 floats took 268 us on 2 threads, 232 on one).
PARALLEL_MIN_SIZE = 2 ** 17


def get_num_threads():
    return _num_threads


def set_num_threads(n):
    """How many threads tinytorch's own kernels (GELU, attention, ...) use, as
    torch.set_num_threads. BLAS (the matmuls) has its own setting: OPENBLAS_NUM_THREADS.
    The default comes from TINYTORCH_NUM_THREADS, OMP_NUM_THREADS or
    OPENBLAS_NUM_THREADS, else the number of cores, and is a most: fewer are used while
    other programs keep the cores busy (share_cores). A number set here is used as it is.
    1 turns the threads off."""
    global _num_threads, _pool, _threads_pinned
    if int(n) < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    if _pool is not None:
        _pool.shutdown()
        _pool = None
    _num_threads = int(n)
    _threads_pinned = True  # n, also on a busy machine (share_cores leaves it alone)


def parallel_for(fn, n, size, threads=None, piece=None):
    """Call fn(lo, hi) on [0, n) cut into get_num_threads() contiguous ranges, all at
    once; fn must write its results into arrays it was given, range by range. With
    piece, each range is worked through in pieces of at most piece, one after another
    (pieces whose arrays stay in the cache across fn's passes: CACHE_BLOCK).

    Why threads help in Python: every NumPy ufunc and matmul lets go of the GIL while
    it computes, so two threads working on different rows of the same arrays really
    run side by side. BLAS spreads a big matmul over the cores by itself, but the
    small per-head matmuls of attention and every elementwise op (GELU) run on one
    core; here they get all of them. size (the elements involved) keeps small jobs,
    where starting threads would cost more than it saves, on this thread; threads
    (at most get_num_threads()) lets a caller ask for fewer.
    """
    global _pool, _pool_pid
    if piece:
        whole = fn

        def fn(lo, hi):
            for a in range(lo, hi, piece):
                whole(a, builtins.min(a + piece, hi))
    # A job started on one of the pool's threads stays on it: the pool could otherwise end
    # up waiting on itself.
    on_a_worker = threading.current_thread().name.startswith('tinytorch')
    if not on_a_worker:
        _share_cores()  # fewer threads while other programs take the cores (tune())
    k = builtins.min(_threads_now(), n, threads or _num_threads)
    if not fast or k < 2 or size < PARALLEL_MIN_SIZE or on_a_worker:
        fn(0, n)
        return
    if _pool is None or _pool_pid != os.getpid():  # a forked child has none of its threads
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(_num_threads - 1, thread_name_prefix='tinytorch')
        _pool_pid = os.getpid()
    bounds = [n * i // k for i in range(k + 1)]
    # each range in a copy of this thread's context: np.errstate (a context variable) holds there
    futures = [_pool.submit(contextvars.copy_context().run, fn, lo, hi)
               for lo, hi in zip(bounds[1:-1], bounds[2:])]
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
    if not fast:
        return np.sum(a, axis=-1, keepdims=True)
    return np.matmul(a, _ones(a.shape[-1], a))[..., None]


def sum_second_last(a):
    """a.sum(axis=-2, keepdims=True) (a sum down each column of each matrix), as
    ones @ a."""
    if not fast:
        return np.sum(a, axis=-2, keepdims=True)
    return np.matmul(_ones(a.shape[-2], a), a)[..., None, :]


def sum_leading(a):
    """Sum over every axis but the last (a bias gradient: one sum per feature), as
    ones @ a on a viewed as (rows, features)."""
    _share_cores()  # (here too: models without parallel_for, an LSTM's, call it every step)
    a2 = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])  # (not -1: 0 features are allowed)
    if not fast:
        return np.sum(a2, axis=0)
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
    out = np.full_like(ax, np.nan)  # nan stays nan: it is in none of the three ranges
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


# The pieces a thread works through one by one: _gelu_float32 makes 20 passes over its
# arrays, and pieces of 2^18 floats (1 MiB an array) stay in the processor's caches from
# the first pass to the last, where a whole range is read from memory 20 times (GELU of
# 4096 x 1536 floats: 22 ms in one piece, 11 in pieces). Smaller pieces lose more to
# NumPy's cost per call than they gain (pieces of 2^15: 1024 x 256 floats took 1.0 ms, 0.55
# in one piece).
CACHE_BLOCK = 2 ** 18


def gelu_float32(x):
    """GELU of a float32 array and its derivative Phi(x) + x phi(x), the arrays gelu's plain
    code computes, cut into one range per thread, each in pieces of CACHE_BLOCK (flat views:
    contiguous pieces)."""
    out, dgelu = np.empty_like(x, order='C'), np.empty_like(x, order='C')
    xf, of, df = (a.reshape(-1) for a in (x, out, dgelu))  # xf: a copy if x is strided
    parallel_for(lambda lo, hi: _gelu_float32(xf[lo:hi], of[lo:hi], df[lo:hi]), x.size, x.size,
                 piece=CACHE_BLOCK)
    if not x.flags.c_contiguous:  # the result laid out as the plain code's (one copy)
        laid_out = _empty_in_layout_of(x)
        laid_out[...] = out
        return laid_out, dgelu
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


# ---------------------------------------------------------------------------
# 21. Running PyTorch programs: compat.py takes over
# ---------------------------------------------------------------------------
# A PyTorch program with `import tinytorch as torch` goes on to import torch.nn.functional
# and to ask torch.cuda.is_available(). compat.py, beside this file, answers: PyTorch's
# module paths (tinytorch.nn is nn.py, tinytorch.utils.data is data.py) and the stand-ins
# of a machine without a GPU. This file loads it on first use (a PyTorch-style import, or
# a name only compat.py has, as tinytorch.cuda); copied alone, tinytorch.py computes all
# the same, and only those names are missing.
import importlib  # noqa: E402 (this section's own tools)
import importlib.util  # noqa: E402

__path__ = []  # a module with __path__ counts as a package: tinytorch.nn can be imported


def _companion(file):
    """One of the files beside tinytorch.py (nn.py, optim.py, data.py), imported from that
    folder and never from elsewhere on sys.path: a learner's own data.py must not become
    tinytorch.utils.data. It is the module `import nn` gives where that finds the same file;
    else it is imported under a name of its own (tinytorch._nn)."""
    folder = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(folder, file + '.py')
    if not os.path.isfile(path):
        raise ImportError(f"{__name__}: this path needs {file}.py, and there is none beside "
                          f"tinytorch.py (in {folder}); copy {file}.py from the tinytorch project "
                          "into that folder")
    mod = sys.modules.get(file)
    if mod is None:
        try:
            spec = importlib.util.find_spec(file)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and _same_file(spec.origin, path):
            return importlib.import_module(file)
    elif _same_file(getattr(mod, '__file__', None), path):
        return mod
    own = f'{__name__}._{file}'
    if own not in sys.modules:
        spec = importlib.util.spec_from_file_location(own, path)
        sys.modules[own] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[own])
        except BaseException:
            del sys.modules[own]
            raise
    return sys.modules[own]


def _same_file(a, b):
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def __getattr__(name):
    """tinytorch.float, tinytorch.nn, tinytorch.cuda, ...: compat.py's, made on first use
    (PEP 562: Python calls this only for a name the module does not have)."""
    if name.startswith('__'):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        compat = _companion('compat')
    except ImportError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (PyTorch's "
                             "module paths and stand-ins are in compat.py, which is not "
                             "beside tinytorch.py)") from None
    return compat.attribute(name)


class _Submodules:
    """What importing tinytorch adds to the process: this finder on sys.meta_path, which
    Python asks about each module imported after it. It answers only for names under
    tinytorch (`import tinytorch.nn.functional as F`), by compat.py's rule, and loads
    compat.py on the first such import; without compat.py it says in one line what to copy."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith(__name__ + '.'):
            return None  # not a name of ours: Python asks the next finder
        return _companion('compat')._PathFinder.find_spec(fullname, path, target)


if not builtins.any(getattr(f, '__qualname__', '') == '_Submodules' and f.__module__ == __name__
                    for f in sys.meta_path):
    sys.meta_path.append(_Submodules)
