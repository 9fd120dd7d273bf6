"""dev/fuzz.py: the differential fuzzer, tinytorch against PyTorch.

It writes random programs of 3 to 12 statements over the public API, runs each in
tinytorch and in PyTorch (float64, then float32) from the same input values, and
compares after every statement every live variable (shape, dtype, values with nan/inf
positions, requires_grad, whether it is contiguous, and whether the statement raised),
then every .grad after backward of a scalar made from the live tensors. Mismatches are
grouped by cause, and each group is printed as a minimised program, runnable as-is in both
frameworks.

  python dev/fuzz.py --seed 7 --count 20000 [--families views,inplace]

A program is a list of source lines in a neutral dialect: `T` is the library (tinytorch
or torch), `F` its functional module (nn or torch.nn.functional), `T.DT` the run's
float dtype, and `T.bool` PyTorch's name for bool (tinytorch's is `T.bool_`). PyTorch
is also the generator's shape oracle: each new statement is run there first, so the
next one knows every variable's shape and dtype.

Its tests (a family each on fixed seeds, a planted bug, the tables against README's
lists) are in test_tinytorch.py, at its end. PyTorch must be installed.
"""
import math
import os
import re
import sys
import time as _time
import warnings as _warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run as `python dev/fuzz.py`: the project beside dev/
import tinytorch as tt  # noqa: E402
import nn  # noqa: E402


def _need_torch():
    """PyTorch, the oracle; without it the command line says so in one line (exit 2)."""
    try:
        import torch
    except ImportError as e:
        if __name__ == '__main__':
            print(f"dev/fuzz.py: the fuzzer compares with PyTorch, which does not import ({e}); "
                  "install it (pip install torch==2.15.0)", file=sys.stderr)
            sys.exit(2)
        raise
    return torch


# The deliberate differences listed in docs/differences.md ("Deliberate differences from
# PyTorch"), the fuzzer's only exclusions. Each entry: a phrase of the listed line (a
# test checks it is still there), and what the fuzzer does about it.
FUZZ_DIFFERENCES = {
    'setitem-duplicates': ("an index that names a position twice",
                           "setitem indices never name a position twice"),
    'cross-entropy-weight': ("`cross_entropy`'s `weight` is a constant",
                             "cross_entropy gets (N, C) logits, int targets, no weight"),
    'stable-sort': ("`sort`, `argsort` and `topk` are always stable",
                    "sort and argsort are called with stable=True"),
    'no-float16': ("float16 and complex numbers are not supported",
                   "no float16 or complex casts"),
    'data-attribute': ("a `.data` or\n  `.array` taken before it", "programs never touch .data or .array"),
    'int-requires-grad': ("leaves an integer or bool tensor without grad",
                          "requires_grad is compared on float tensors only"),
    'var-std-empty-dims': ("`var` and `std` with `dim=()` reduce every dim",
                           "var and std never get dim=()"),
    'median-of-expanded': ("`median(dim)` of an expanded tensor",
                           "median gets no tensor with a stride of 0 in a dim of size > 1"),
    'gelu-inf': ("`gelu(inf)` is `inf` in float32",
                 "PyTorch's float32 gelu answers inf at +inf (_TorchFunctional)"),
    'failed-write': ("An in-place change that raises leaves the tensor as it was",
                     "after an in-place change that both refuse, nothing is compared"),
    'hardtanh-nan': ("`hardtanh`, `relu6`, `elu` and `selu` treat a nan input as PyTorch's scalar",
                     "hardtanh, relu6, elu and selu get no operand holding a nan"),
    'mode-nan': ("`mode` counts the nans of a row as one value",
                 "mode gets no operand holding a nan (and no row of more than 16)"),
    'layer-norm-no-spread': ("`layer_norm` over a row with no spread",
                             "layer_norm normalizes no row of equal values (nor a dim of size 1)"),
    'retained-grads-after-in-place': ("the `.grad` that `retain_grad()` keeps on that",
                                      "a program with an in-place change compares the .grad of "
                                      "leaves only"),
    'bool-base-powers': ("A Python bool as the base of a power",
                         "no `False ** x` (PyTorch 2.14 on differentiates it as log(0) 0^x)"),
    'numpy-ufuncs': ("NumPy's ufuncs refuse a tensor", "no NumPy ufunc gets a tensor (_g_numpy)"),
    'numpy-copy-false': ("`np.array(t, copy=False)` gives the tensor's memory",
                         "np.array gets no copy=False (_g_numpy)"),
    'logit-negative-zero': ("`logit`'s gradient at `-0.0` is", "logit gets no operand holding a -0.0"),
}


# Rules PyTorch changed between 2.13 (the oldest release the suite runs with) and 2.15 (the
# one tinytorch follows), as docs/differences.md lists them ("Older PyTorch releases"): each
# names its phrase, the release that brought the rule, and what the fuzzer leaves out when the
# installed PyTorch is older (_torch_older_than).
FUZZ_RULE_CHANGES = {
    'clamp-bounds': ("clamp's gradient at a bound", '2.14',
                     "no clamp whose operand meets a bound or holds a nan (_clamp_rule_met)"),
}


def _clamp_rule_met(g, x, args):
    """Whether `x.clamp(args)` meets the rule PyTorch changed in 2.14 (x at a bound; with
    tensor bounds, a nan anywhere) while an older PyTorch is the oracle."""
    if not _torch_older_than(g.torch, FUZZ_RULE_CHANGES['clamp-bounds'][1]):
        return False
    try:
        lo_hi = eval(_render(f"(lambda min=None, max=None: (min, max))({args})", 'torch', 'float64'),
                     dict(g.env))
    except Exception:
        return False  # PyTorch refuses it: nothing to compare
    torch, v = g.torch, g.env[x].detach().double()
    bounds = [b.detach().double() if isinstance(b, torch.Tensor) else
              torch.tensor(float(b), dtype=torch.float64) for b in lo_hi if b is not None]
    # a near tie too: the float32 run may round onto the bound where float64 does not
    return bool(v.isnan().any() or any(torch.isclose(v, b, rtol=1e-6, atol=1e-7).any()
                                       or b.isnan().any() for b in bounds))


_FLOAT_DTYPES = ('float16', 'float32', 'float64')


# Refusals that are deliberate differences (docs/differences.md): one framework raises where the other
# computes, by design. A program whose statement is refused this way is not compared any
# further. Each names its README line, the refusing side and the start of its message.
FUZZ_REFUSALS = {
    'split-views': ("the pieces of `split`, `chunk` and `unbind`", 'torch',
                    r"Output \d+ of \w+ is a view and (its base or another view|is being modified)"),
    'no-grad-views': ("a view made under `no_grad`", 'torch',
                      r"A view was created in no_grad mode and (its base|is being modified)"),
    'saved-tensors': ("Backward refuses an in-place change only where a rule reads", 'either',
                      r"one of the variables needed for gradient computation has been modified"
                      r"|backward through '\w+': a tensor of shape .* saved for backward was "
                      r"modified in place"),
    'overlap': ("whose operand shares some of its memory with the tensor it writes", 'either',
                r"unsupported operation: (some elements of the input tensor and the written-to "
                r"tensor|more than one element of the written-to tensor) refer"
                r"|the operand shares some of its memory with the tensor it changes"),
    'expanded-writes': ("an expanded view (several elements, one memory location)", 'tt',
                        r"this tensor is read-only \(an expanded view"),
    'index-put-dtype': ("`x[idx] = v` casts `v` to `x`'s dtype", 'torch',
                        r"Index put requires the source and destination dtypes match"),
    'bool-base-powers': ("A Python bool as the base of a power", 'torch',
                         r"INTERNAL ASSERT FAILED at .*Scalar\.cpp"),
    'int-tensor-without-grad': ("leaves an integer or bool tensor without grad", 'either',
                                r"can't retain_grad on Tensor that has requires_grad=False"
                                r"|Autograd not support dtype: (Bool|Long|Int)"),
    'backward-without-a-pytorch-formula': ("Backward differentiates where PyTorch's has no formula", 'torch',
                                           r"derivative for aten::remainder is not implemented"
                                           r"|Found dtype (Double|Float) but expected (Float|Double)"
                                           r"|Negation, the `-` operator, on a bool tensor"),
    'views-of-a-new-graph-tensor': ("a view taken before its base first joined the graph", 'torch',
                                    r"a leaf Variable that requires grad is being used in an "
                                    r"in-place operation"),
}


def _refused_by_design(e_tt, e_torch):
    """True when only one side raised, and that refusal is a deliberate difference."""
    for phrase, side, pattern in FUZZ_REFUSALS.values():
        error = e_torch if e_tt is None else e_tt
        raiser = 'torch' if e_tt is None else 'tt'
        if side in (raiser, 'either') and re.search(pattern, error):
            return True
    return False


# Statements that name functions tinytorch lacks today (issue 23's list) are generated
# like any other: tinytorch raises where PyTorch answers, and the fuzzer reports it.
# They make up the family 'names' (each generator's second list), so that the other
# families test what tinytorch has.
_UNARY = ('exp log sqrt abs sin cos tanh sigmoid relu log1p expm1 erf neg '
          # the table functions (issue 46: what their rules save; an in-place change follows)
          'sign floor ceil round trunc frac square rsqrt reciprocal log2 log10 exp2 sinh cosh '
          'asin acos atan '
          'asinh acosh atanh arcsinh arccosh arctanh logit sinc').split()


_UNARY_23 = ('sign floor ceil round trunc frac square rsqrt reciprocal log2 log10 exp2 sinh '
             'cosh asin acos atan isnan isinf isfinite logical_not').split()


def _lit(a):
    """A NumPy array as a Python literal (floats short; inf and nan by name)."""
    if a.ndim == 0:
        v = a.item()
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else ('nan' if v != v else ('inf' if v > 0 else '-inf'))
        return repr(v)
    return '[' + ', '.join(_lit(r) for r in a) + ']'


def _new_tensor(a, kind, requires_grad=False):
    """Source that builds a tensor with the values of array a."""
    dt = {'float': 'T.DT', 'int': 'T.int64', 'bool': 'T.bool'}[kind]
    rg = ', requires_grad=True' if requires_grad else ''
    if a.size == 0:
        return f"T.zeros({', '.join(map(str, a.shape))}, dtype={dt}{rg})"
    return f"T.tensor({_lit(a)}, dtype={dt}{rg})"


class _Gen:
    """Writes one program, statement by statement, with PyTorch (float64) as the oracle."""

    def __init__(self, rng, torch, families, edges):
        self.rng, self.torch, self.edges = rng, torch, edges
        self.lines = []  # (source, op, family)
        self.env = _namespace(torch, 'float64')
        self.count = 0
        self.families = families
        self.names = families == ['names']

    def op(self, common, issue23=()):
        """An op name: from issue 23's list in the family 'names', else from the common one."""
        return self.choice(list(issue23) if self.names and issue23 else common)

    # -- drawing things -----------------------------------------------------------
    def chance(self, p):
        return self.rng.random() < p

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def name(self):
        self.count += 1
        return f"t{self.count}"

    def tensors(self, pred=lambda v: True):
        return [k for k, v in self.env.items()
                if k[0] != '_' and isinstance(v, self.torch.Tensor) and pred(v)]

    def pick(self, pred=lambda v: True):
        names = self.tensors(pred)
        return self.choice(names) if names else None

    def pick_float(self, pred=lambda v: True):
        return self.pick(lambda v: v.is_floating_point() and pred(v))

    def dim(self, v):
        return int(self.rng.integers(-v.ndim, v.ndim)) if v.ndim else self.choice([0, -1])

    def values(self, shape, kind='float'):
        """Input values: short decimals; with edges, also 0, +-inf, nan and large ones."""
        if kind == 'int':
            return np.asarray(self.rng.integers(-3, 5, size=shape))
        if kind == 'bool':
            return np.asarray(self.rng.random(shape) < 0.5)
        a = np.asarray(np.round(self.rng.standard_normal(shape) * 1.5, 2))
        if self.edges and a.size and self.chance(0.5):
            specials = np.array([0.0, np.inf, -np.inf, np.nan, 25.0, -25.0, -45.0, 1e4])
            where = self.rng.random(shape) < 0.3
            a[where] = self.rng.choice(specials, size=int(where.sum()))
        return a

    def scalar(self, kind=None):
        """A Python or NumPy number."""
        kind = kind or self.choice(['float', 'float', 'int', 'bool', 'np.float64', 'np.float32',
                                    'np.int64', 'np.bool_'])
        v = float(np.round(self.rng.standard_normal() * 2, 1))
        return {'float': repr(v), 'int': str(int(v)), 'bool': self.choice(['True', 'False']),
                'np.float64': f"np.float64({v})", 'np.float32': f"np.float32({v})",
                'np.int64': f"np.int64({int(v)})", 'np.bool_': f"np.bool_({self.choice(['True', 'False'])})"}[kind]

    def operand_like(self, v, exact=False):
        """A tensor that broadcasts to v's shape (exact: has it), else a number."""
        def fits(o):
            try:
                return np.broadcast_shapes(o.shape, v.shape) == tuple(v.shape) and (
                    not exact or o.shape == v.shape)
            except ValueError:
                return False
        name = self.pick(fits)
        return name if name and self.chance(0.7) else self.scalar()

    def leaf(self, shape, kind='float', requires_grad=True):
        """Adds a statement making a new leaf; returns its name."""
        name = self.name()
        return name, f"{name} = {_new_tensor(self.values(shape, kind), kind, requires_grad)}"

    # -- the program ------------------------------------------------------------------
    def inputs(self):
        """1 to 3 input leaves of broadcast-compatible shapes."""
        bases = [(3,), (2, 3), (2, 3, 4), (4,), (2, 2, 3), (3, 2)]
        if self.edges:
            bases += [(), (), (0,), (2, 0), (0, 3), (1,)]
        base = self.choice(bases)
        for i in range(int(self.rng.integers(1, 4))):
            shape = base if i == 0 else tuple(
                1 if self.chance(0.3) else s for s in base[int(self.rng.integers(0, len(base) + 1)):])
            kind = 'float'
            if self.edges and self.chance(0.35):
                kind = self.choice(['int', 'bool'])
            rg = kind == 'float' and self.chance(0.8)
            name = self.name()
            self.add(f"{name} = {_new_tensor(self.values(shape, kind), kind, rg)}", 'input', 'input')

    def add(self, src, op, family):
        """Runs src in PyTorch; keeps it (most statements that raise are dropped)."""
        try:
            _exec(src, self.env, 'float64')
        except Exception:
            if not self.chance(0.15):
                return False
        self.lines.append((src, op, family))
        return True

    def statement(self):
        family = self.choice(self.families)
        gen = self.choice(_FAMILIES[family])
        for _ in range(5):  # a generator may find nothing to work on
            try:
                made = gen(self)
            except Exception:  # the oracle refused what the generator asked it (a 0-d split)
                made = None
            if made:
                return self.add(made[0], made[1], family)
        return False


# -- generators: each returns (source, op name) or None -----------------------------------
def _g_binary(g):
    a = g.pick()
    if a is None:
        return None
    op = g.op(['+', '-', '*', '/', '**', '+', '*', '>', '==', '<=', '!=', '<'], ['//', '%', '&', '|', '^'])
    b = g.operand_like(g.env[a]) if g.chance(0.8) else g.pick() or g.scalar()
    left, right = (a, b) if g.chance(0.6) else (b, a)
    if op == '**' and left == 'False':
        return None  # FUZZ_DIFFERENCES['bool-base-powers']
    if op in ('&', '|', '^'):  # bitwise ops, on masks
        left, right = (f"({t} > 0)" if t.startswith('t') else 'True' for t in (left, right))
    return f"{g.name()} = {left} {op} {right}", op


def _g_binary_fn(g):
    a = g.pick()
    if a is None:
        return None
    b = g.operand_like(g.env[a])
    f = g.op(['T.maximum({a}, {b})', 'T.minimum({a}, {b})', '{a}.add({b})', '{a}.sub({b})',
              '{a}.mul({b})', '{a}.div({b})', '{a}.pow({b})', '{a}.eq({b})', '{a}.ne({b})',
              '{a}.gt({b})', '{a}.lt({b})', 'T.xlogy({a}, {b})', '{a}.xlogy({b})'],
             ['{a}.ge({b})', '{a}.le({b})', '{a}.add({b}, alpha=2)', '{a}.sub({b}, alpha=2)',
              'T.atan2({a}, {b})'])
    if 'T.' in f and not b.startswith('t'):
        b = f"T.tensor({b})"
    return f"{g.name()} = {f.format(a=a, b=b)}", f.split('(')[0].replace('{a}', '')


def _g_unary(g):
    x = g.pick()
    if x is None:
        return None
    f = g.op(_UNARY, _UNARY_23 + ['~'])
    if f == '~':
        return f"{g.name()} = ~({x} > 0)", f
    if f == 'logit' and ((g.env[x] == 0) & g.env[x].signbit()).any():
        return None  # FUZZ_DIFFERENCES['logit-negative-zero']
    call = f"T.{f}({x})" if g.chance(0.5) else f"{x}.{f}()"
    return f"{g.name()} = {call}", f


def _g_clamp_where(g):
    x = g.pick()
    if x is None:
        return None
    v = g.env[x]
    form = g.choice(['clamp', 'clamp', 'where', 'masked_fill', 'leaky'])
    if form == 'clamp':
        lo, hi = sorted([round(float(g.rng.standard_normal()), 1) for _ in range(2)])
        args = g.choice([f"min={lo}", f"max={hi}", f"{lo}, {hi}"])
        if g.names:  # tensor bounds (issue 23)
            args = g.choice([f"min=T.tensor({lo}, dtype=T.DT)", f"{x}, {x} + 1"])
        if _clamp_rule_met(g, x, args):
            return None  # FUZZ_RULE_CHANGES['clamp-bounds']
        return f"{g.name()} = {x}.clamp({args})", 'clamp'
    if form == 'where':
        c = g.pick(lambda o: o.dtype == g.torch.bool) if g.chance(0.3) else None
        cond = c or f"{x} > 0"
        return f"{g.name()} = T.where({cond}, {x}, {g.operand_like(v)})", 'where'
    if form == 'masked_fill':
        value = g.scalar('float')
        if g.chance(0.4):  # a 0-d tensor value, maybe requiring grad
            value = g.pick_float(lambda o: o.ndim == 0) or f"T.tensor({value}, dtype=T.DT)"
        m = g.pick(lambda o: _broadcasts(o, v)) if g.chance(0.3) else None  # the result broadcasts
        mask = f"{m} > 0" if m else f"{x} > 0"
        if m and g.chance(0.5):
            return f"{g.name()} = T.masked_fill({x}, {mask}, {value})", 'masked_fill'
        return f"{g.name()} = {x}.masked_fill({mask}, {value})", 'masked_fill'
    return f"{g.name()} = F.leaky_relu({x}, 0.1)", 'leaky_relu'


def _g_reduce(g):
    x = g.pick()
    if x is None:
        return None
    v = g.env[x]
    f = g.op(['sum', 'mean', 'var', 'std', 'amax', 'amin', 'max', 'min', 'logsumexp', 'norm',
              'prod', 'cumsum', 'argmax', 'argmin'],
             ['median', 'nansum', 'nanmean', 'cumprod', 'cummax', 'any', 'all', 'sum_dtype'])
    if f == 'median' and any(st == 0 and n > 1 for st, n in zip(v.stride(), v.shape)):
        return None  # FUZZ_DIFFERENCES['median-of-expanded']
    if f == 'sum_dtype':
        return f"{g.name()} = {x}.{g.choice(['sum', 'mean'])}(dtype=T.float64)", 'sum(dtype=)'
    if f in ('any', 'all'):
        return f"{g.name()} = {x}.{f}(dim={g.dim(v)})", f + '(dim=)'
    args = []
    if f in ('cumsum', 'cumprod', 'cummax', 'logsumexp') or g.chance(0.6):
        if f in ('sum', 'mean', 'var', 'std', 'amax', 'amin', 'logsumexp', 'nansum',
                 'nanmean', 'norm') and g.chance(0.3):  # a tuple of dims, sometimes ()
            k = int(g.rng.integers(0 if f not in ('var', 'std') else 1, v.ndim + 1))  # (*)
            args.append(str(tuple(int(d) for d in g.rng.permutation(v.ndim)[:k])))
            if f == 'norm':
                args = [f"dim={args[0]}"]
            # (*) FUZZ_DIFFERENCES['var-std-empty-dims']: no var or std with dim=()
        else:
            args.append(str(g.dim(v)) if f != 'norm' else f"dim={g.dim(v)}")
        if f not in ('cumsum', 'cumprod', 'cummax') and g.chance(0.4):
            args.append('keepdim=True')
    if f in ('var', 'std') and g.chance(0.5):
        args.append(f"correction={g.choice([0, 1, 2, 5])}")
    if f == 'norm' and g.chance(0.6):
        args.insert(0, 'p=' + g.choice(['1', '2', '0.5', '3', 'inf', "float('inf')", '0']))
    code = f"{g.name()} = {x}.{f}({', '.join(args)})"
    if f in ('max', 'min', 'median', 'cummax') and args:  # (values, indices)
        code = f"{g.name()}, {g.name()} = {x}.{f}({', '.join(args)})"
    return code, f + ('(dim=())' if '()' in args else '')


def _g_sort(g):
    x = g.pick(lambda v: not v.dtype == g.torch.bool)
    if x is None:
        return None
    v = g.env[x]
    d = g.dim(v)
    desc = g.choice(['True', 'False'])
    # FUZZ_DIFFERENCES['stable-sort']: ties are sorted stably in both
    form = g.choice(['sort', 'argsort', 'topk'])
    if form == 'sort':
        return f"{g.name()}, {g.name()} = {x}.sort(dim={d}, descending={desc}, stable=True)", 'sort'
    if form == 'argsort':
        return f"{g.name()} = {x}.argsort(dim={d}, descending={desc}, stable=True)", 'argsort'
    k = int(g.rng.integers(0, v.shape[d] + 1)) if v.ndim else 1
    if len(v.flatten().unique()) < v.numel() or int(v.isnan().sum()) > 1:  # nans tie too
        return None  # FUZZ_DIFFERENCES['stable-sort']: topk has no stable=True to ask for
    return f"{g.name()}, {g.name()} = {x}.topk({k}, {d}, largest={desc})", 'topk'


def _g_view(g):
    x = g.pick()
    if x is None:
        return None
    v, out = g.env[x], g.name()
    n = v.ndim
    f = g.op(['view', 'reshape', 'transpose', 'permute', 'T', 'mT', 'expand', 'squeeze',
              'unsqueeze', 'narrow', 'select', 'split', 'chunk', 'flatten', 'flip', 'roll',
              'contiguous', 'detach', 'clone', 'cat', 'stack', 'repeat', 'tril'],
             ['t', 'diagonal', 'unbind', 'unsqueeze_', 't_', 'unflatten'])
    if f in ('view', 'reshape'):
        shape = list(v.shape)
        if v.numel() and g.chance(0.5):
            shape = [-1]
        elif n >= 2 and g.chance(0.5):
            shape = shape[:-2] + [shape[-2] * shape[-1]]
        elif g.chance(0.5):
            shape = shape[::-1]
        return f"{out} = {x}.{f}({', '.join(map(str, shape))})", f
    if f == 'transpose':
        return f"{out} = {x}.transpose({g.dim(v)}, {g.dim(v)})", f
    if f == 'permute':
        return f"{out} = {x}.permute({', '.join(str(int(d)) for d in g.rng.permutation(n))})", f
    if f in ('T', 'mT', 'contiguous', 'detach', 'clone', 't'):
        return f"{out} = {x}.{f}" + ('()' if f in ('contiguous', 'detach', 'clone', 't') else ''), f
    if f == 'expand':
        return f"{out} = {x}.expand({', '.join(['2'] + ['-1'] * n)})", f
    if f == 'squeeze':
        return f"{out} = {x}.squeeze({g.dim(v) if g.chance(0.6) else ''})", f
    if f == 'unsqueeze':
        return f"{out} = {x}.unsqueeze({int(g.rng.integers(-n - 1, n + 1))})", f
    if f == 'narrow':
        d = g.dim(v)
        size = v.shape[d] if n else 1
        start = int(g.rng.integers(-size, size)) if size else 0
        length = int(g.rng.integers(0, size - (start % size if size else 0) + 1))
        return f"{out} = {x}.narrow({d}, {start}, {length})", f
    if f == 'select':
        if not n or not v.shape[0]:
            return None
        return f"{out} = {x}[{int(g.rng.integers(-v.shape[0], v.shape[0]))}]", 'x[i]'
    if f in ('split', 'chunk', 'unbind'):
        d = g.dim(v)
        k = int(g.rng.integers(1, 4))
        pieces = len(getattr(v, f)(k, d)) if f != 'unbind' else (v.shape[d] if n else 0)
        if not pieces:
            return None
        call = f"{x}.{f}({k}, {d})" if f != 'unbind' else f"{x}.unbind({d})"
        return f"{out} = {call}[{int(g.rng.integers(0, pieces))}]", f
    if f == 'flatten':
        return f"{out} = {x}.flatten({g.dim(v)}, {g.dim(v)})" if g.chance(0.6) else f"{out} = {x}.flatten()", f
    if f == 'flip':
        return f"{out} = {x}.flip({g.dim(v)})", f
    if f == 'roll':
        return f"{out} = {x}.roll({int(g.rng.integers(-2, 3))}, {g.dim(v)})", f
    if f == 'unflatten':
        return (f"{out} = {x}.unflatten({g.dim(v)}, (1, -1))", f) if n else None
    if f == 'diagonal':
        return f"{out} = {x}.diagonal()", f
    if f == 'movedim':
        return f"{out} = {x}.movedim({g.dim(v)}, {g.dim(v)})", f
    if f in ('cat', 'stack'):
        other = g.pick(lambda o: o.shape == v.shape) or x
        if f == 'cat' and g.chance(0.2):  # an empty operand: (0,) is skipped (PyTorch's legacy rule)
            other = g.choice(["T.tensor([], dtype=T.DT)", "T.zeros(0, dtype=T.int64)",
                              f"{x}[:0]", "T.zeros(0, 3, dtype=T.DT)"])
        return f"{out} = T.{f}([{x}, {other}], {g.dim(v) if f == 'cat' else 0})", f
    if f == 'repeat':
        return f"{out} = {x}.repeat({', '.join(['2'] * max(n, 1))})", f
    if f == 'tril':
        return f"{out} = {x}.tril()", f
    if f == 'unsqueeze_':
        return f"{x}.unsqueeze_(0)", f
    return f"{x}.t_()", f


def _g_index(g):
    """x[idx] with every index form: ints, slices with steps, None, ..., masks, int tensors."""
    x = g.pick(lambda v: v.ndim > 0)
    if x is None:
        return None
    if g.chance(0.15):
        return f"{g.name()} = {x}[{x} > 0]", 'x[mask]'
    idx = _index(g, g.env[x], unique=False)
    return (f"{g.name()} = {x}[{idx}]", _index_kind(idx)) if idx is not None else None


def _g_scatter(g):
    """The index ops out of place (issue 46: a source of another dtype is refused)."""
    x = g.pick(lambda v: v.ndim >= 1 and v.numel() > 0 and v.dtype != g.torch.bool)
    if x is None:
        return None
    v, out = g.env[x], g.name()
    d = g.dim(v)
    n = v.shape[d]
    f = g.choice(['scatter', 'scatter_add', 'index_add', 'index_fill', 'gather', 'index_select'])
    dt = g.choice([f"{x}.dtype"] * 3 + ['T.DT', 'T.float32', 'T.int64'])
    if f in ('index_add', 'index_fill', 'index_select'):
        i = g.rng.permutation(n)[:int(g.rng.integers(1, n + 1))]
        shape = list(v.shape)
        shape[d] = len(i)
        arg = {'index_add': f"T.ones({tuple(shape)}, dtype={dt})", 'index_fill': '-1.5',
               'index_select': None}[f]
        args = f"{d}, T.tensor({_lit(i)})" + (f", {arg}" if arg else '')
        return f"{out} = {x}.{f}({args})", f
    # scatter and gather: an index of x's ndim, no longer than x along each dim, naming no
    # position twice along dim (scatter's winner would be undefined)
    shape = [int(g.rng.integers(1, k + 1)) for k in v.shape]
    full = list(shape)
    full[d] = n
    i = np.take(np.argsort(g.rng.random(full), axis=d), np.arange(shape[d]), axis=d)
    idx = _new_tensor(i, 'int')
    if f == 'gather':
        return f"{out} = {x}.gather({d}, {idx})", f
    src = '2.5' if f == 'scatter' and g.chance(0.3) else f"T.ones({tuple(shape)}, dtype={dt})"
    return f"{out} = {x}.{f}({d}, {idx}, {src})", f


def _index(g, v, unique):
    """Source of a random index for v (unique: no position named twice, for setitem)."""
    parts, d, used_ellipsis = [], 0, False
    for _ in range(int(g.rng.integers(1, v.ndim + 2))):
        r = g.rng.random()
        if d >= v.ndim or r < 0.08:
            if r < 0.04 and not used_ellipsis:
                parts.append('...')
                used_ellipsis = True
            else:
                parts.append('None')
            continue
        size = v.shape[d]
        if not v.numel() and g.chance(0.2):  # out of range, picking nothing: it passes
            parts.append(f"T.tensor([{size}])")
        elif r < 0.35 and size:
            k = int(g.rng.integers(-size, size))
            parts.append(f"T.tensor({k})" if g.chance(0.25) else str(k))  # a 0-d tensor: its number
        elif r < 0.6:
            start = int(g.rng.integers(-size - 1, size + 1)) if g.chance(0.5) else ''
            stop = int(g.rng.integers(-size - 1, size + 2)) if g.chance(0.5) else ''
            step = int(g.rng.integers(1, 4)) if g.chance(0.4) else ''
            if g.chance(0.03):
                step = -1  # PyTorch refuses negative steps
            parts.append(f"{start}:{stop}" + (f":{step}" if step != '' else ''))
        elif r < 0.85 and size:
            k = int(g.rng.integers(1, size + 1))
            vals = g.rng.permutation(size)[:k] if unique or g.chance(0.5) else g.rng.integers(-size, size, k)
            parts.append(f"T.tensor({_lit(np.asarray(vals))})")
        elif size:
            parts.append(f"T.tensor({_lit(g.rng.random(size) < 0.5)})")
        else:
            parts.append(':')
        d += 1
    if unique and sum(p.startswith('T.tensor([') and 'True' not in p and 'False' not in p
                      for p in parts) > 1:
        return None  # two int tensors could name a position twice
    return ', '.join(parts) if len(parts) != 1 else parts[0] + (',' if g.chance(0.2) else '')


def _index_kind(idx):
    """A short name for an index's form, for grouping mismatches."""
    if '>' in idx:
        return 'x[mask]'
    kinds = []
    for p in _split_index(idx):
        p = p.strip()
        kinds.append('bool' if 'True' in p or 'False' in p else 'tensor' if p.startswith('T.tensor([')
                     else '0-d tensor' if p.startswith('T.')
                     else 'slice' if ':' in p else p if p in ('None', '...', '()') else 'int' if p else '')
    return 'x[' + ', '.join(k for k in kinds if k) + ']'


def _split_index(idx):
    """An index's source split at its top-level commas (not those inside T.tensor([...]))."""
    out, depth, cur = [], 0, ''
    for ch in idx:
        depth += (ch in '([') - (ch in ')]')
        if ch == ',' and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += ch
    return out + [cur]


def _target(g, pred=lambda v: True):
    """A tensor to change in place, and the `with T.no_grad():` that a leaf (or a view of
    one) requiring grad needs, as an optimizer's step has (sometimes left out: both raise)."""
    x = g.pick(pred)
    if x is None:
        return None, ''
    v = g.env[x]
    base = v._base if v._base is not None else v
    guarded = v.requires_grad and base.is_leaf
    return x, 'with T.no_grad(): ' if (guarded and g.chance(0.9)) or g.chance(0.1) else ''


def _g_setitem(g):
    x, guard = _target(g)
    if x is None:
        return None
    v = g.env[x]
    if v.ndim == 0:
        idx = g.choice(['None', '...', '()'])
    elif g.chance(0.15):
        idx = f"{x} > 0"
    else:
        idx = _index(g, v, unique=True)  # FUZZ_DIFFERENCES['setitem-duplicates']
        if idx is None:
            return None
    try:
        shape = tuple(eval(f"{x}[{idx}]", dict(g.env)).shape)
    except Exception:
        shape = ()
    value = g.scalar('float')
    if g.chance(0.6):
        value = g.pick(lambda o: o.shape == shape) if g.chance(0.5) else None
        if value is None:
            name, make = g.leaf(shape[int(g.rng.integers(0, len(shape) + 1)):], requires_grad=g.chance(0.6))
            return f"{make}; {guard}{x}[{idx}] = {name}", 'setitem ' + _index_kind(idx)
    return f"{guard}{x}[{idx}] = {value}", 'setitem ' + _index_kind(idx)


def _g_inplace(g):
    x, guard = _target(g)
    if x is None:
        return None
    v = g.env[x]
    f = g.op(['add_', 'sub_', 'mul_', 'div_', '+=', '-=', '*=', '/=', 'clamp_', 'relu_',
              'masked_fill_', 'fill_', 'zero_', 'copy_', 'pow_', 'retain_grad',
              # issue 46: the unary ops in place (what their rules read), the index writes
              g.choice(_IN_PLACE_UNARY_OPS), g.choice(_IN_PLACE_UNARY_OPS),
              g.choice(['index_fill_', 'index_add_', 'scatter_add_', 'scatter_'])],
             ['abs_', 'exp_', 'log_', 'tanh_', 'sigmoid_', 'sqrt_', 'neg_', 'floor_',
              'clamp_min_', 'clamp_max_', 'add_alpha', 'index_fill_', 'index_add_',
              'scatter_add_', 'scatter_'])
    if f in ('add_', 'sub_', 'mul_', 'div_', 'pow_', 'copy_'):
        return f"{guard}{x}.{f}({g.operand_like(v) if f != 'copy_' else g.pick(lambda o: _fits(o, v)) or x})", f
    if f in ('+=', '-=', '*=', '/='):
        return f"{guard}{x} {f} {g.operand_like(v)}", f
    if f == 'add_alpha':
        return f"{guard}{x}.add_({g.operand_like(v)}, alpha=2)", 'add_(alpha=)'
    if f in ('clamp_', 'clamp_min_', 'clamp_max_'):
        lo = round(float(g.rng.standard_normal()), 1)
        args = {'clamp_': g.choice([f"{lo}, {lo + 1}", f"min={lo}", f"max={lo}"]),
                'clamp_min_': str(lo), 'clamp_max_': str(lo)}[f]
        if _clamp_rule_met(g, x, args if f == 'clamp_' else f"{f[6:9]}={lo}"):
            return None  # FUZZ_RULE_CHANGES['clamp-bounds']
        return f"{guard}{x}.{f}({args})", f
    if f == 'masked_fill_':
        value = g.scalar('float')
        if g.chance(0.3):
            value = g.pick_float(lambda o: o.ndim == 0) or value
        return f"{guard}{x}.masked_fill_({x} > 0, {value})", f
    if f == 'fill_':
        return f"{guard}{x}.fill_({g.scalar('float')})", f
    if f == 'retain_grad':
        return f"{x}.retain_grad()", f
    if f in ('index_fill_', 'index_add_', 'scatter_add_', 'scatter_'):
        if v.ndim != 1 or not v.numel():
            return None
        i = f"T.tensor({_lit(g.rng.permutation(v.shape[0])[:2])})"
        # a source of x's dtype, of another (refused, issue 46), or a part of x itself (refused)
        src = g.choice([f"T.ones(len({i}), dtype={x}.dtype)"] * 3 + [
            f"T.ones(len({i}), dtype={g.choice(['T.DT', 'T.float32', 'T.int64'])})",
            f"{x}[:len({i})].detach()", f"{x}[:len({i})]"])
        return f"{guard}{x}.{f}(0, {i}, {src if f != 'index_fill_' else '1.5'})", f
    return f"{guard}{x}.{f}()", f


_IN_PLACE_UNARY_OPS = ['abs_', 'exp_', 'log_', 'tanh_', 'sigmoid_', 'sqrt_', 'neg_', 'floor_',
                       'ceil_', 'round_', 'trunc_', 'sign_', 'sin_', 'cos_', 'square_',
                       'reciprocal_', 'clamp_min_', 'clamp_max_']


def _broadcasts(o, v):
    try:
        np.broadcast_shapes(o.shape, v.shape)
        return True
    except ValueError:
        return False


def _fits(o, v):
    try:
        return np.broadcast_shapes(o.shape, v.shape) == tuple(v.shape)
    except ValueError:
        return False


def _g_nn(g):
    x = g.pick_float()
    if x is None:
        return None
    v, out = g.env[x], g.name()
    f = g.op(['softmax', 'log_softmax', 'gelu', 'gelu_tanh', 'silu', 'softplus', 'relu',
              'layer_norm', 'linear', 'linear', 'cross_entropy', 'cross_entropy', 'mse_loss',
              'bce_with_logits', 'matmul', 'one_hot', 'logsumexp'],
             ['elu', 'selu', 'hardtanh', 'relu6', 'normalize', 'l1_loss', 'smooth_l1_loss',
              'huber_loss', 'nll_loss', 'kl_div', 'cosine_similarity', 'pad'])
    if f in ('softmax', 'log_softmax'):
        return f"{out} = F.{f}({x}, dim={g.dim(v)})", f
    if f == 'gelu_tanh':
        return f"{out} = F.gelu({x}, approximate='tanh')", f
    if f in ('hardtanh', 'relu6', 'elu', 'selu') and v.isnan().any():
        return None  # FUZZ_DIFFERENCES['hardtanh-nan']
    if f in ('gelu', 'silu', 'softplus', 'relu', 'elu', 'selu', 'hardtanh', 'relu6'):
        return f"{out} = F.{f}({x})", f
    if f == 'normalize':
        return f"{out} = F.normalize({x}, dim={g.dim(v)})", f
    if f == 'pad':
        return f"{out} = F.pad({x}, (1, 1))", f
    if f == 'logsumexp':
        return f"{out} = T.logsumexp({x}, {g.dim(v)})", f
    if f == 'layer_norm':
        rows = v.reshape(-1, v.shape[-1]) if v.ndim else None
        if rows is None or v.shape[-1] == 1 or rows.numel() and (rows == rows[:, :1]).all(1).any():
            return None  # FUZZ_DIFFERENCES['layer-norm-no-spread']
        w, mw = g.leaf(v.shape[-1:])
        b, mb = g.leaf(v.shape[-1:])
        args = g.choice(['', f", {w}", f", {w}, {b}"])
        return f"{mw}; {mb}; {out} = F.layer_norm({x}, {tuple(v.shape[-1:])}{args})", f
    if f in ('linear', 'matmul'):
        if not v.ndim:
            return None
        k = int(g.rng.integers(0, 4)) if g.edges else int(g.rng.integers(1, 4))
        w, mw = g.leaf((k, v.shape[-1]) if f == 'linear' else (v.shape[-1], k))
        if f == 'matmul':
            return f"{mw}; {out} = {x} @ {w}", f
        b, mb = g.leaf(g.choice([(k,), (k,), (1,), ()]))
        return f"{mw}; {mb}; {out} = F.linear({x}, {w}, {b if g.chance(0.7) else 'None'})", f
    if f in ('cross_entropy', 'nll_loss'):
        # FUZZ_DIFFERENCES['cross-entropy-forms']: (N, C) logits and class indices only
        if v.ndim != 2 or not v.shape[1]:
            return None
        target = g.rng.integers(0, v.shape[1], v.shape[0])
        target[g.rng.random(v.shape[0]) < 0.3] = -100  # ignore_index
        args = ''
        if f == 'cross_entropy' and g.chance(0.5):
            args += f", reduction='{g.choice(['sum', 'none', 'mean'])}'"
        if f == 'cross_entropy' and g.chance(0.3):
            args += ", label_smoothing=0.1"
        return f"{out} = F.{f}({x}, {_new_tensor(target, 'int')}{args})", f
    if f in ('mse_loss', 'l1_loss', 'smooth_l1_loss', 'huber_loss', 'kl_div', 'cosine_similarity'):
        other = g.pick_float(lambda o: o.shape == v.shape) or x
        return f"{out} = F.{f}({x}, {other})", f
    if f == 'bce_with_logits':
        kind = g.choice(['T.DT', 'T.DT', 'T.float32'])
        target = np.round(g.rng.random(tuple(v.shape)), 2)
        return (f"{out} = F.binary_cross_entropy_with_logits({x}, "
                f"{_new_tensor(target, 'float').replace('T.DT', kind)})"), f
    y = g.pick(lambda o: o.dtype == g.torch.int64 and o.ndim <= 2 and bool((o >= 0).all()))
    return (f"{out} = F.one_hot({y}, 6)", f) if y else None


def _g_cast(g):
    x = g.pick()
    if x is None:
        return None
    # FUZZ_DIFFERENCES['no-float16']: no half() or float16
    f = g.op(['float()', 'double()', 'long()', 'to(T.float32)', 'to(T.float64)', 'to(T.int64)',
              'to(T.bool)', 'item()', 'tolist()', 'numel()'],
             ['int()', 'bool()', 'type_as({y})', 'nelement()', 'element_size()', 'new_zeros(2)',
              'new_ones(2)', 'new_full((2,), 1.5)', 'new_tensor([1, 2])'])
    if f == 'item()' and g.env[x].numel() != 1:
        return None
    f = f.format(y=g.pick() or x)
    return f"{g.name()} = {x}.{f}", f.split('(')[0]


def _g_functions(g):
    """Functions of tensors issue 23 names (most missing in tinytorch today)."""
    x = g.pick()
    if x is None:
        return None
    v = g.env[x]
    other = g.pick(lambda o: o.shape == v.shape) or x
    f = g.choice(['T.zeros_like({x}, dtype=T.float64)', 'T.ones_like({x}, dtype=T.float64)', 'T.full_like({x}, 2.0)',
                  'T.hstack([{x}, {o}])', 'T.vstack([{x}, {o}])', 'T.concat([{x}, {o}])',
                  'T.logical_and({x}, {o})', 'T.logical_or({x}, {o})', 'T.all({x})', 'T.any({x})',
                  'T.allclose({x}, {o})', 'T.isclose({x}, {o})', 'T.outer({x}.flatten(), {o}.flatten())',
                  'T.einsum("...->...", {x})', 'T.tensordot({x}, {o}, 0)', '{x}.masked_select({x} > 0)',
                  '{x}.repeat_interleave(2)', '{x}.diff()', '{x}.unique()', '{x}.any(dim=0)',
                  '{x}.all(dim=0)', 'T.linspace(0, 1, 5)', 'T.logspace(0, 1, 3)',
                  'T.meshgrid({x}.flatten(), {o}.flatten(), indexing="ij")[0]', 'T.cdist({x}, {o})',
                  '{x}.mode()[0]', '{x}.softmax(-1, dtype=T.float64)'])
    if f.startswith('{x}.mode') and (v.is_floating_point() and v.isnan().any() or v.ndim and v.shape[-1] > 16):
        return None  # FUZZ_DIFFERENCES['mode-nan']
    return f"{g.name()} = {f.format(x=x, o=other)}", f.split('(')[0].replace('{x}', '')


def _g_numpy(g):
    """NumPy interop: np.asarray / np.array (copy=, dtype=) of a tensor, the array written
    (an alias changes the tensor, a copy does not), NumPy functions that take tensors as
    arrays, and tensors made from arrays. FUZZ_DIFFERENCES['numpy-ufuncs'] and
    ['numpy-copy-false']: no ufunc on a tensor, no copy=False."""
    x = g.pick()
    if x is None:
        return None
    v, out = g.env[x], g.name()
    src = f"{x}.detach()" if g.chance(0.85) else x  # a tensor that requires grad: refused
    dt = g.choice(['', '', ', dtype=np.float64', ', dtype=np.float32', ', dtype=np.int64'])
    f = g.choice(['asarray', 'asarray', 'array', 'array copy', 'concatenate', 'stack', 'where',
                  'tensor of', 'from_numpy', 'as_tensor', 'tolist'])
    write = "; {a}[...] = 7" if v.ndim else ""
    if f == 'asarray':  # written through only where no graph reads it (FUZZ_DIFFERENCES['data-attribute'])
        if g.chance(0.5):
            return f"{out} = np.asarray({src}{dt})", 'np.asarray'
        return (f"{out} = {x}.detach().clone(); _a = np.asarray({out}{dt})" + write.format(a='_a'),
                'np.asarray')
    if f == 'array':
        return f"{out} = np.array({src}{dt})" + write.format(a=out), 'np.array'
    if f == 'array copy':
        return f"{out} = np.array({src}{dt}, copy=True)" + write.format(a=out), 'np.array(copy=True)'
    if f in ('concatenate', 'stack'):
        if not v.ndim:
            return None
        return f"{out} = np.{f}([{src}, {src}])", 'np.' + f
    if f == 'where':
        return f"{out} = np.where({src} > 0, {src}, 0)", 'np.where'
    if f == 'tensor of':
        return f"{out} = T.tensor(np.asarray({src}{dt}) * 2)", 'T.tensor(np.asarray)'
    if f == 'from_numpy':
        return f"_a = np.array({src}{dt}); {out} = T.from_numpy(_a); _a[...] = 5", 'T.from_numpy'
    if f == 'as_tensor':
        dt = dt.replace('np.', 'T.')
        return f"_a = np.array({src}); {out} = T.as_tensor(_a{dt}); _a[...] = 5", 'T.as_tensor'
    return f"{out} = np.array({src}.tolist(){dt})", 'np.array(tolist)'


# Op families: a run may select some (tests run one each). 'edges' draws 0-d, empty,
# inf/nan, int and bool inputs and runs every family's generators on them.
_FAMILIES = {
    'elementwise': [_g_binary, _g_binary, _g_binary_fn, _g_unary, _g_unary, _g_clamp_where],
    'reductions': [_g_reduce, _g_reduce, _g_reduce, _g_sort, _g_unary],
    # (issue 46: layouts meet views; changes in place follow functions that save)
    'views': [_g_view, _g_view, _g_view, _g_view, _g_inplace, _g_setitem, _g_binary, _g_clamp_where],
    'indexing': [_g_index, _g_index, _g_index, _g_setitem, _g_setitem, _g_inplace, _g_scatter],
    'inplace': [_g_inplace, _g_inplace, _g_inplace, _g_view, _g_setitem, _g_binary, _g_unary,
                _g_clamp_where],
    'nn': [_g_nn, _g_nn, _g_nn, _g_binary, _g_unary],
    'casts': [_g_cast, _g_cast, _g_binary, _g_clamp_where, _g_numpy, _g_numpy],  # NumPy interop too
}


_FAMILIES['edges'] = [gen for family in list(_FAMILIES.values()) for gen in family]


# issue 23's names (each generator draws from its second list)
_FAMILIES['names'] = [_g_binary, _g_binary_fn, _g_unary, _g_unary, _g_reduce, _g_view,
                      _g_inplace, _g_nn, _g_cast, _g_functions, _g_functions, _g_clamp_where]


# -- running a program in one framework ----------------------------------------------------
_HEADERS = {'tt': "import numpy as np, tinytorch as T, nn as F\nfrom math import inf, nan",
            'torch': "import numpy as np, torch as T, torch.nn.functional as F\nfrom math import inf, nan"}


# the scalar that backward starts from: every live float tensor that requires grad,
# weighted (so a gradient sent to the wrong element shows)
_WEIGHTS = ("def W(v): return T.tensor(np.cos(np.arange(v.numel())).reshape(tuple(v.shape)), "
            "dtype=v.dtype)")


_CODE = {}


def _render(src, lib, dt):
    src = src.replace('T.DT', 'T.' + dt)
    return src.replace('T.bool)', 'T.bool_)').replace('T.bool,', 'T.bool_,') if lib == 'tt' else src


class _TorchFunctional:
    """torch.nn.functional as the fuzzer's PyTorch programs see it: the same, except that a
    float32 gelu of +inf is inf (FUZZ_DIFFERENCES['gelu-inf'], PyTorch's float64 answer and
    tinytorch's), so the difference follows the data into every later value and gradient."""
    def __init__(self, functional):
        self._functional = functional

    def __getattr__(self, name):
        return getattr(self._functional, name)

    def gelu(self, x, approximate='none'):
        import torch
        y = self._functional.gelu(x, approximate=approximate)
        return torch.where(x == math.inf, x.detach(), y) if x.dtype == torch.float32 else y


def _namespace(lib, dt):
    if lib == 'tt':
        ns = {'T': tt, 'F': nn}
    else:
        import torch
        import torch.nn.functional
        ns = {'T': torch, 'F': _TorchFunctional(torch.nn.functional)}
        lib = 'torch'
    ns.update(np=np, inf=math.inf, nan=math.nan, _lib=lib, _dt=dt)
    exec(_WEIGHTS, ns)
    return ns


def _exec(src, ns, dt):
    key = (src, ns['_lib'], dt)
    if key not in _CODE:
        _CODE[key] = compile(_render(src, ns['_lib'], dt), '<fuzz>', 'exec')
    with np.errstate(all='ignore'), _warnings.catch_warnings():
        _warnings.simplefilter('ignore')
        exec(_CODE[key], ns)


def _snap(v):
    """What is compared of a value: a tensor's (shape, dtype, requires_grad, whether it is
    contiguous, values); a .grad's without the layout."""
    if isinstance(v, tt.Tensor) or type(v).__name__ == 'Tensor':
        if isinstance(v, tt.Tensor):
            a, dtype = np.array(v.array, copy=True), str(v.dtype).rstrip('_')
        else:
            a, dtype = v.detach().numpy().copy(), str(v.dtype).replace('torch.', '')
        # the layout shows where a later view or reshape shares memory in one framework only
        return ('tensor', a.shape, dtype, bool(v.requires_grad), bool(v.is_contiguous()), a)
    if isinstance(v, np.ndarray):  # a tinytorch .grad
        return ('tensor', v.shape, str(v.dtype), False, v.copy())
    if v is None:
        return ('None',)
    if isinstance(v, (tuple, list)):
        return ('seq', tuple(_snap(e) for e in v))
    if isinstance(v, (bool, np.bool_)):
        return ('bool', bool(v))
    if isinstance(v, (int, np.integer)):
        return ('int', int(v))
    if isinstance(v, (float, np.floating)):
        return ('float', np.array(float(v)))
    return ('other', type(v).__name__)


def _variables(ns):
    return {k: v for k, v in ns.items() if k[0] == 't' and k[1:].isdigit()}


def _fuzz_run(lines, lib, dt, loss=None):
    """Runs the lines; after each: (error or None, {name: snap}). Ends with backward of
    `loss` (PyTorch's run chooses it from its live tensors)."""
    ns, steps = _namespace(lib, dt), []
    for src in lines:
        try:
            _exec(src, ns, dt)
            err = None
        except Exception as e:  # both raising counts as agreeing, whatever the types
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
        steps.append((err, {k: _snap(v) for k, v in _variables(ns).items()}))
    if loss is None:
        live = [k for k, v in _variables(ns).items()
                if type(v).__name__ == 'Tensor' and v.is_floating_point() and v.requires_grad]
        loss = f"_loss = sum((v * W(v)).sum() for v in [{', '.join(live)}]); _loss.backward()" if live else ''
    err = None
    if loss:
        try:
            _exec(loss, ns, dt)
        except Exception as e:
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    with _warnings.catch_warnings():
        _warnings.simplefilter('ignore')  # PyTorch warns when .grad of a non-leaf is read
        grads = {k: _snap(_grad(v)) for k, v in _variables(ns).items()
                 if (isinstance(v, (tt.Tensor,)) or type(v).__name__ == 'Tensor')
                 and (_is_leaf(v) and v.is_floating_point() or not _in_place_in(lines))}
    steps.append((err, grads))
    return steps, loss


def _is_leaf(v):
    try:
        return v.is_leaf
    except RuntimeError:  # PyTorch refuses to regenerate some views' history
        return False


def _in_place_in(lines):
    """Whether the program changes a tensor in place: then the retained .grad of non-leaf
    tensors is not compared (FUZZ_DIFFERENCES['retained-grads-after-in-place'])."""
    return any(re.search(r"\w_\(|[-+*/]= |\] = ", line) for line in lines)


def _grad(v):
    """.grad as a NumPy array (in both libraries .grad is a Tensor or None)."""
    g = getattr(v, 'grad', None)
    return g if g is None else np.asarray(g)


_TOLERANCES = {'float64': (1e-7, 1e-9), 'float32': (2e-4, 2e-4)}


# T.tensor(...) of a float written without a dtype: a float32 tensor in both libraries
_FLOAT32_LITERAL = r'T\.tensor\((?:(?!dtype)[^()])*\d\.(?:(?!dtype)[^()])*\)'


def _float32_taint(taint, src, snaps):
    """The variables whose values may carry float32 rounding once src has run: float32
    tensors, what src assigns from a tainted operand, and, after an in-place change with a
    tainted operand, every variable (views share the changed memory). A float64 value
    computed from a float32 one is no more precise than it: two correct float32 roundings
    (NumPy's cos and PyTorch's may differ in the last bit) stay apart by a float32 ulp
    after any cast to float64, so such a value is compared at float32's tolerance."""
    operands = set(taint) | {n for n, v in snaps.items() if _holds_float32(v)}
    out = set(operands)
    for part in src.split(';'):
        part = part.replace('with T.no_grad():', '')
        # a float32 number written in the statement (np.float32(-0.7), T.tensor(0.6)) is a
        # float32 operand too
        if not (operands & set(re.findall(r'\bt\d+\b', part)) or 'np.float32(' in part
                or re.search(_FLOAT32_LITERAL, part)):
            continue
        assigned = re.match(r'\s*((?:t\d+\s*,\s*)*t\d+)\s*=(?!=)', part)
        out |= set(re.findall(r'\bt\d+\b', assigned.group(1))) if assigned else set(snaps)
    return out


def _holds_float32(snap):
    if snap[0] == 'seq':
        return any(_holds_float32(s) for s in snap[1])
    return snap[0] == 'tensor' and snap[2] == 'float32'


def _differs(a, b, dt, value_underflow=True, float32_rounded=False, atol_more=0.0,
             requires_grad=True):
    """What differs between two snaps (None: they agree). float32_rounded: the value may
    carry float32 rounding (_float32_taint), so it is compared at float32's tolerance.
    value_underflow: True, or a mask of the elements where a 0 in tinytorch alone counts.
    atol_more: an absolute tolerance added per element (_unary_allowances).
    requires_grad: False compares values only (_pytorch_on_tinytorch_values)."""
    if a is None or b is None:
        return 'missing' if a is None else 'extra'
    if a[0] != b[0]:
        return f"{a[0]} in tinytorch, {b[0]} in PyTorch"
    if a[0] == 'seq':
        if len(a[1]) != len(b[1]):
            return 'length'
        return next((w for w in (_differs(x, y, dt, value_underflow, float32_rounded,
                                          requires_grad=requires_grad)
                                 for x, y in zip(a[1], b[1])) if w), None)
    if a[0] in ('tensor', 'float'):
        if a[0] == 'tensor':
            if a[1] != b[1]:
                return 'shape'
            if a[2] != b[2]:
                return 'dtype'
            if a[3] != b[3] and a[2] in _FLOAT_DTYPES and requires_grad:  # FUZZ_DIFFERENCES['int-requires-grad']
                return 'requires_grad'
            if len(a) == len(b) == 6 and a[4] != b[4] and requires_grad:  # (not a .grad)
                return f"layout (contiguous in {'tinytorch' if a[4] else 'PyTorch'} only)"
        x, y = np.asarray(a[-1]), np.asarray(b[-1])
        if x.dtype.kind in 'biu' or y.dtype.kind in 'biu':
            return None if np.array_equal(x, y) else 'value'
        x, y = x.astype(np.float64), y.astype(np.float64)
        if (np.isnan(x) != np.isnan(y)).any() or (np.isinf(x) != np.isinf(y)).any() or (
                x[np.isinf(x)] != y[np.isinf(y)]).any():
            return 'nan/inf'
        # a value is compared at its own precision (a float32 result in a float64 program too)
        rtol, atol = _TOLERANCES['float32' if float32_rounded else
                                 a[2] if a[0] == 'tensor' and a[2] in _TOLERANCES else dt]
        ok = np.isfinite(x)
        atol = (atol + np.broadcast_to(atol_more, x.shape))[ok]
        if not (np.abs(x[ok] - y[ok]) <= atol + rtol * np.abs(y[ok])).all():
            return 'value'
        # an elementwise function's value (not a sum or a gradient, where rounding leaves
        # 1e-17s) that underflows to 0 in tinytorch, but not in PyTorch
        flushed = (x[ok] == 0) & (np.abs(y[ok]) > 1e3 * np.finfo(dt).tiny)
        flushed &= np.broadcast_to(value_underflow, x.shape)[ok]
        return 'value (0 where PyTorch is not)' if flushed.any() else None
    return None if a == b else 'value'


def _unary_allowances(src, op, s1, s2, rounded):
    """For an elementwise function's result: where a 0 in tinytorch alone is an underflow
    (only where both computed it from the same argument: log1p of a rounding error of 1e-8
    in PyTorch's argument and of an exact 0 in tinytorch's is no underflow), and an added
    absolute tolerance for sin and cos of float32-rounded arguments: an argument x carries a
    rounding error of up to eps |x| (a float32 ulp or so), and sin and cos have slopes up to
    1, so their values may differ by eps |x|, far beyond the relative tolerance when |x| is
    in the thousands (sin(-5270.3)); in any dtype, by the arguments' own difference. The
    operand is the statement's other variable."""
    names = re.findall(r'\bt\d+\b', src.split(';')[-1])
    a1, a2 = (s.get(names[1]) if len(names) == 2 else None for s in (s1, s2))
    if not (a1 and a2 and a1[0] == a2[0] == 'tensor' and a1[1] == a2[1]):
        return True, 0.0
    x, y = np.asarray(a1[-1], dtype=np.float64), np.asarray(a2[-1], dtype=np.float64)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    if op not in ('sin', 'cos'):
        return same, 0.0
    # and at least the arguments' own difference: a float64 argument computed by an earlier
    # op may be an ulp apart (4.4e38 from a power), and |cos a - cos b| <= |a - b|
    with np.errstate(invalid='ignore'):  # (inf - inf, where np.where doesn't look)
        apart = np.abs(np.where(np.isfinite(x) & np.isfinite(y), x - y, 0))
    ulp32 = np.finfo(np.float32).eps * np.abs(np.where(np.isfinite(y), y, 0)) if rounded else 0.0
    return same, np.maximum(ulp32, apart)


_COMPARISONS = ('.eq', '.ne', '.gt', '.lt', '.ge', '.le', '>', '==', '<=', '!=', '<')


def _near_ties_undecided(src, s1, s2, name):
    """PyTorch's answer to a comparison of values that may carry float32 rounding, with
    tinytorch's taken where the two operands are within float32's tolerance of each other:
    there a rounding decides (log(exp(x)) == x), not the op. Elsewhere it must agree."""
    rhs = src.split('=', 1)[1]
    names = re.findall(r'\bt\d+\b', rhs)
    values = [np.asarray(s2[n][-1], dtype=np.float64) for n in names
              if s2.get(n) and s2[n][0] == 'tensor']
    if len(names) == 1:  # the other operand is a number written in the statement
        number = re.findall(r'(?<![\w.])-?(?:\d+\.?\d*(?:e-?\d+)?|inf)', rhs.replace(names[0], ''))
        values += [float(number[0])] if number else []
    got, ref = s1.get(name), s2.get(name)
    if len(values) != 2 or not (got and ref and got[0] == ref[0] == 'tensor' and got[1] == ref[1]):
        return ref
    rtol, atol = _TOLERANCES['float32']
    x, y = values
    with np.errstate(invalid='ignore'):
        near = np.abs(x - y) <= atol + rtol * np.maximum(np.abs(x), np.abs(y))
    try:
        near = np.broadcast_to(near, np.shape(ref[-1]))
    except ValueError:
        return ref
    return ref[:-1] + (np.where(near, got[-1], ref[-1]),)


class _Mismatch:
    def __init__(self, lines, ops, dt, k, name, what, tt_side, torch_side, loss):
        self.lines, self.ops, self.dt, self.k, self.name = lines, ops, dt, k, name
        self.what, self.tt_side, self.torch_side, self.loss = what, tt_side, torch_side, loss
        self.op = ops[k] if k < len(ops) else 'backward'

    def cause(self):
        """What stays while minimising: the op, what differed, and whether it showed in
        another variable than the statement's own (aliasing)."""
        where = ''
        if self.op != 'backward' and self.name and self.name != _target_of(self.lines[self.k]):
            where = ' (seen in another variable: aliasing)'
        return f"{self.op}: {self.what}{where}"

    def key(self):
        """The cause, named after minimising: a gradient's by the ops of the program, an
        aliasing one by the ops that made the views (whatever changed them in place)."""
        ops = sorted(set(o for o in self.ops if o != 'input'))
        if self.op == 'backward':
            return f"backward after {' + '.join(ops) or 'inputs'}: {self.what}"
        if 'aliasing' in self.cause():
            views = [o for o in ops if not _changes_in_place(o)]
            return f"aliasing after {' + '.join(views) or 'inputs'} and an in-place change: {self.what}"
        return self.cause()


def _target_of(src):
    """The variable a statement assigns or changes in place (in its last part)."""
    last = src.split(';')[-1].replace('with T.no_grad():', '')
    return re.search(r'\bt\d+\b', last).group() if re.search(r'\bt\d+\b', last) else None


def _unchanged(name, before, after):
    """Whether a variable's snap is the same after a statement as before it."""
    a, b = before.get(name), after.get(name)
    return a is not None and b is not None and _same_snap(a, b)


def _same_snap(a, b):
    if a[0] != b[0]:
        return False
    if a[0] == 'seq':
        return len(a[1]) == len(b[1]) and all(map(_same_snap, a[1], b[1]))
    if a[0] in ('tensor', 'float'):
        return a[:-1] == b[:-1] and np.array_equal(a[-1], b[-1], equal_nan=a[-1].dtype.kind == 'f')
    return a == b


def _from_snap(torch, snap):
    """A PyTorch value holding a snap's values (a tensor without grad); None for a snap
    that can't be rebuilt."""
    kind = snap[0]
    if kind == 'tensor':
        return torch.tensor(snap[-1], dtype=getattr(torch, snap[2]))
    if kind == 'seq':
        items = [_from_snap(torch, s) for s in snap[1]]
        return None if any(i is None and s[0] != 'None' for i, s in zip(items, snap[1])) else tuple(items)
    return {'int': lambda: snap[1], 'bool': lambda: snap[1], 'float': lambda: float(snap[1]),
            'None': lambda: None}.get(kind, lambda: None)()


def _pytorch_on_tinytorch_values(lines, k, dt, before):
    """The snaps after PyTorch runs statement k with tinytorch's values of every variable
    before it ({} if it can't). Where an earlier statement left the two a rounding apart
    (within the tolerance), a later op can turn that into a large difference: floor of
    0.9999999999999999 and of 1.0, a sum over values that cancel, cos of 1e13. The op is
    right when PyTorch's, given tinytorch's operands, gives tinytorch's answer."""
    import torch
    ns = _namespace('torch', dt)
    for name, snap in before.items():
        value = _from_snap(torch, snap)
        if value is None and snap[0] != 'None':
            return {}
        ns[name] = value
    try:
        _exec(lines[k], ns, dt)
    except Exception:
        return {}
    return {n: _snap(v) for n, v in _variables(ns).items()}


def _pytorch_gradients_on(lines, dt, loss, got):
    """The .grad snaps of PyTorch's run with each statement's result given tinytorch's
    values (through .data: what PyTorch's rules saved sees them, and no version changes),
    {} if it can't. The gradient analogue of _pytorch_on_tinytorch_values: asin's rule at
    a cosine similarity of 1.0000001 in one and 0.99999994 in the other is nan in one and
    finite in the other, and both rules are right."""
    import torch
    ns = _namespace('torch', dt)
    with _warnings.catch_warnings():
        _warnings.simplefilter('ignore')
        try:
            for k, src in enumerate(lines):
                try:
                    _exec(src, ns, dt)
                except Exception:
                    pass
                name = _target_of(src)
                v, snap = ns.get(name), got[k][1].get(name)
                if type(v).__name__ == 'Tensor' and snap and snap[0] == 'tensor' and \
                        tuple(v.shape) == snap[1] and str(v.dtype) == f"torch.{snap[2]}":
                    v.data.copy_(torch.from_numpy(np.array(snap[-1])))
            _exec(loss, ns, dt)
        except Exception:
            return {}
        return {k: _snap(_grad(v)) for k, v in _variables(ns).items() if type(v).__name__ == 'Tensor'}


def _gradient_rounding(lines, dt, loss):
    """How far rounding alone may move a gradient: 16 ulps of the largest gradient that any
    tensor of PyTorch's run carries. A leaf's gradient sums terms as large as that (they may
    cancel: normalize of a zero vector sends 1e12 back along two paths), and each sum
    rounds at their scale, in an order the two engines choose differently."""
    ns = _namespace('torch', dt)
    with _warnings.catch_warnings():
        _warnings.simplefilter('ignore')
        for src in lines:
            try:
                _exec(src, ns, dt)
            except Exception:
                pass
        tensors = [v for v in _variables(ns).values() if type(v).__name__ == 'Tensor']
        try:
            for v in tensors:
                if v.requires_grad and not v.is_leaf:
                    v.retain_grad()
            _exec(loss, ns, dt)
        except Exception:
            return 0.0
        grads = [np.abs(v.grad.numpy()) for v in tensors if v.grad is not None]
    largest = max((g[np.isfinite(g)].max(initial=0.0) for g in grads), default=0.0)
    return 16 * np.finfo(dt).eps * largest


def _float64_run_allows(a, b, ref64_step, name):
    """Whether PyTorch's own float64 run of the program allows tinytorch's float32 value or
    gradient a, where PyTorch's float32 one b differs: elementwise, a is within float32's
    tolerance of the float64 answer (rounded to float32: an overflow is inf there too), or
    within 4 times b's distance from it (two float32 computations that round in different
    places), or b is not within that tolerance of it either. Float32 rounding
    amplified (1 + erf(-3.04) in gelu's tail, sin of 1.5e8, a sum that nearly cancels)
    leaves PyTorch's float32 answer off the true one as well: such an element says nothing
    about the op (the float64 run, compared first, holds the op to PyTorch's answer)."""
    err, snaps = ref64_step
    c = snaps.get(name) if not err else None
    if not (a and b and c and a[0] == b[0] == c[0] == 'tensor' and a[1] == b[1] == c[1]
            and a[2] == b[2] == 'float32' and c[2] == 'float64'):
        return False
    x, y, z = (np.asarray(s[-1], dtype=np.float64) for s in (a, b, c))
    rtol, atol = _TOLERANCES['float32']
    with np.errstate(all='ignore'):
        z32 = z.astype(np.float32).astype(np.float64)
        agree = lambda u: ((u == z32) | (np.isnan(u) & np.isnan(z32)) | np.isfinite(u) & np.isfinite(z32)
                           & (np.abs(u - z32) <= atol + rtol * np.abs(z32)))
        nearer = np.isfinite(x) & np.isfinite(y) & np.isfinite(z) & (np.abs(x - z) <= 4 * np.abs(y - z))
    return bool((agree(x) | nearer | ~agree(y)).all())


def _refuses_a_change_it_does_not_read(lines, dt, loss, grads):
    """README: backward refuses an in-place change only where a rule reads the changed
    tensor (FUZZ_REFUSALS['saved-tensors']). Where tinytorch alone refused, its backward is
    run again without the version check: if it then gives PyTorch's gradients, the rule it
    refused did not need what changed (it saved more than it reads: issue 46's y.abs_(),
    and z = y.round() before y.mul_(-1))."""
    check = tt._check_saved
    tt._check_saved = lambda node: None
    try:
        got, _ = _fuzz_run(lines, 'tt', dt, loss)
    finally:
        tt._check_saved = check
    err, unchecked = got[-1]
    return err is None and bool(grads) and all(
        _differs(unchecked.get(n), grads[n], dt, float32_rounded=True) is None for n in grads)


def _changes_in_place(op):
    return op.endswith('_') or op.startswith('setitem') or op in ('+=', '-=', '*=', '/=', 'retain_grad')


def _compare(lines, ops, torch, dts=('float64', 'float32')):
    """The first mismatch of the program (float64 first, then float32), or None."""
    for dt in dts:
        ref, loss = _fuzz_run(lines, 'torch', dt)
        got, _ = _fuzz_run(lines, 'tt', dt, loss)
        # a program that uses a name a dropped statement defined is no reproducer
        broken = any(e1 and e2 and e1.startswith('NameError') and e2.startswith('NameError')
                     for (e1, _), (e2, _) in zip(got[:-1], ref[:-1]))
        taint = set()  # variables that may carry float32 rounding (_float32_taint)
        ref64 = None  # PyTorch's float64 run, for a float32 mismatch (_float64_run_allows)
        for k, ((e1, s1), (e2, s2)) in enumerate(zip(got, ref)):
            what = None
            if k < len(lines):
                taint = _float32_taint(taint, lines[k], s2)
            if e1 and e2 and k == len(lines):
                break  # both backwards raised: the gradients they left half-done don't count
            if e1 and e2 and _changes_in_place(ops[k]):
                break  # FUZZ_DIFFERENCES['failed-write']: PyTorch may have written a part
            if k < len(lines) and any(v[0] == 'tensor' and v[3] and v[2] not in _FLOAT_DTYPES
                                      for v in s2.values()):
                break  # FUZZ_DIFFERENCES['int-requires-grad']: what follows differs by design
            if (e1 is None) != (e2 is None):
                if k == len(lines) and e1 and _refuses_a_change_it_does_not_read(lines, dt, loss, ref[-1][1]):
                    what = "refuses an in-place change that its rule does not read"
                elif _refused_by_design(e1, e2):
                    break  # FUZZ_REFUSALS: not compared further
                else:
                    what = f"raises only in {'tinytorch' if e1 else 'PyTorch'}"
                # the error's type and first words tell causes apart
                what, name = what + f" ({re.sub(r'[0-9]+', '#', e1 or e2)[:60]})", None
            else:
                for name in sorted(set(s1) | set(s2), key=lambda n: int(n[1:])):
                    # the underflow check is for the statement's own result; a gradient
                    # flows through every tensor, so after a float32 one all are rounded so
                    own = k < len(lines) and name == _target_of(lines[k])
                    if 0 < k < len(lines) and not own and _unchanged(name, got[k - 1][1], s1) \
                            and _unchanged(name, ref[k - 1][1], s2):
                        continue  # judged when it was last written, on both sides
                    rounded = dt == 'float32' or (name in taint if k < len(lines) else bool(taint))
                    underflow, more = own and ops[k] in _UNARY, 0.0
                    if underflow:
                        underflow, more = _unary_allowances(lines[k], ops[k], s1, s2, rounded)
                    b = s2.get(name)
                    if own and ops[k] in _COMPARISONS and rounded:
                        b = _near_ties_undecided(lines[k], s1, s2, name)
                    what = _differs(s1.get(name), b, dt, underflow, rounded, more)
                    if what and what.startswith(('value', 'nan/inf', 'shape')) and k < len(lines) and \
                            _differs(s1.get(name), _pytorch_on_tinytorch_values(
                                lines, k, dt, got[k - 1][1] if k else {}).get(name),
                                dt, underflow, rounded, more, requires_grad=False) is None:
                        what = None  # PyTorch's op, given tinytorch's operands, agrees
                    if what and k == len(lines):  # a gradient: PyTorch's rules, given
                        alt = _pytorch_gradients_on(lines, dt, loss, got).get(name)  # tinytorch's
                        if _differs(s1.get(name), alt, dt, float32_rounded=rounded) is None:
                            what = None  # forward values, agree
                        else:  # or agree to the rounding of the large gradients summed into
                            rounding = _gradient_rounding(lines, dt, loss)  # it, or PyTorch's
                            if _differs(s1.get(name), alt, dt, False, rounded, rounding) is None \
                                    or what == 'value' and _differs(  # own gradient does
                                        s1.get(name), b, dt, atol_more=rounding) is None:
                                what = None
                    if what and what.startswith(('value', 'nan/inf')) and dt == 'float32':
                        if ref64 is None:
                            ref64 = _fuzz_run(lines, 'torch', 'float64', loss)[0]
                        if _float64_run_allows(s1.get(name), s2.get(name), ref64[k], name):
                            what = None
                    if what:
                        if k == len(lines):
                            what = f".grad {what}"
                        break
            if what:
                side = (lambda e, s: e if (e1 is None) != (e2 is None) else s.get(name))
                m = _Mismatch(lines, ops, dt, k, name, what, side(e1, s1), side(e2, s2), loss)
                m.broken = broken
                return m
    return None


def _minimise(m, torch):
    """Drops statements while the same cause stays (delta debugging, one line at a time)."""
    lines, ops, key = list(m.lines), list(m.ops), m.cause()
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(lines))):
            trial_l, trial_o = lines[:i] + lines[i + 1:], ops[:i] + ops[i + 1:]
            t = _compare(trial_l, trial_o, torch, (m.dt,))
            if t is not None and t.cause() == key and not t.broken:
                lines, ops, m, changed = trial_l, trial_o, t, True
    return m


def _shown(side):
    if side is None or isinstance(side, str):
        return str(side)
    if side[0] == 'tensor':
        return f"{np.array2string(side[-1], precision=6, threshold=20).replace(chr(10), '')} {side[2]}" + (
            ' requires_grad' if side[3] else '')
    if side[0] == 'None':
        return 'None'
    return repr(side[1] if side[0] != 'seq' else [_shown(e) for e in side[1]])


def _reproducer(m):
    """The minimised program, runnable as-is, for each framework, with each one's answer."""
    out = []
    for lib, side, label in (('tt', m.tt_side, 'tinytorch'), ('torch', m.torch_side, 'PyTorch')):
        out.append(f"  # {label}")
        body = _HEADERS[lib].split('\n') + [_WEIGHTS] * (m.op == 'backward')
        body += [_render(s, lib, m.dt) for s in m.lines[:m.k + 1]]
        if m.op == 'backward':
            body.append(m.loss)
        if m.name:
            body.append(f"print({m.name}{'.grad' if m.op == 'backward' else ''})")
        out += ['  ' + b for b in body]
        out.append(f"  # -> {_shown(side)}")
    return '\n'.join(out)


def fuzz(seed=0, count=1000, families=None, minimise=True):
    """Runs `count` random programs; returns {cause: [programs, a minimised mismatch,
    the families it was seen in]}."""
    torch = _need_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only cost time
    try:
        return _fuzz(torch, seed, count, list(families or _FAMILIES), minimise)
    finally:
        torch.set_num_threads(threads)


def _fuzz(torch, seed, count, families, minimise):
    rng = np.random.default_rng(seed)
    causes, seen, pre_key = {}, {}, {}
    for _ in range(count):
        family = families[int(rng.integers(len(families)))]
        # 'edges' draws edge inputs and the statements of every family but 'names'
        drawn = [f for f in _FAMILIES if f not in ('edges', 'names')] if family == 'edges' else [family]
        g = _Gen(rng, torch, drawn, edges=family == 'edges')
        g.inputs()
        for _ in range(int(rng.integers(3, 13))):
            g.statement()
        lines, ops = [src for src, _, _ in g.lines], [op for _, op, _ in g.lines]
        m = _compare(lines, ops, torch)
        if m is None:
            continue
        # minimise the first program of each cause; gradient and aliasing causes are
        # named by their minimised program, so minimise up to ten of those
        pre = (m.cause(), m.dt)
        if seen.get(pre, 0) < (10 if m.op == 'backward' or 'aliasing' in pre[0] else 1):
            seen[pre] = seen.get(pre, 0) + 1
            if minimise:
                m = _minimise(m, torch)
        else:
            m = None
        key = (m.key() + (' (float32 only)' if m.dt == 'float32' else '')) if m else pre_key[pre]
        pre_key.setdefault(pre, key)
        entry = causes.setdefault(key, [0, m, set()])
        entry[0] += 1
        entry[2].add(family)
    return causes


def _report(causes):
    return '\n\n'.join(f"{key}   ({n} programs; {', '.join(sorted(fams))})\n{_reproducer(m)}"
                       for key, (n, m, fams) in sorted(causes.items()))


def _fuzz_main(argv):
    import argparse
    p = argparse.ArgumentParser(prog='python dev/fuzz.py')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--count', type=int, default=2000)
    p.add_argument('--families', default=','.join(_FAMILIES),
                   help='comma-separated, from: ' + ', '.join(_FAMILIES))
    args = p.parse_args(argv)
    start = _time.perf_counter()
    causes = fuzz(args.seed, args.count, args.families.split(','))
    seconds = _time.perf_counter() - start
    print(_report(causes))
    print(f"\n{args.count} programs in {seconds:.1f} s ({args.count / seconds:.0f} programs/s, "
          f"minimising included); {sum(n for n, _, _ in causes.values())} mismatched, "
          f"{len(causes)} causes")


def _torch_older_than(torch, release):
    """Whether the installed PyTorch is older than `release` ('2.14'). tinytorch follows
    PyTorch 2.15; a comparison that meets a rule changed since 2.13 (README, "Older PyTorch
    releases") asks this and holds an older PyTorch to its own rule."""
    have = tuple(int(n) for n in re.findall(r'\d+', torch.__version__)[:2])
    return have < tuple(int(n) for n in release.split('.'))




if __name__ == '__main__':
    _fuzz_main(sys.argv[1:])
