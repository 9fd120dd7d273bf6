"""Tests for tinytorch: finite-difference checks for every op, autograd semantics,
modules, optimizers, the Transformer and the training scripts end to end."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import tinytorch as tt

HERE = os.path.dirname(os.path.abspath(__file__))


def t64(*shape, seed=0, low=None, requires_grad=True):
    """A float64 leaf with random values (kept away from 0 when low is given)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if low is not None:
        a = np.sign(a) * (np.abs(a) + low)
    return tt.tensor(a, requires_grad=requires_grad)


def check(fn, *inputs):
    assert tt.gradcheck(fn, list(inputs))


# ---------------------------------------------------------------------------
# gradcheck itself can fail
# ---------------------------------------------------------------------------
def test_gradcheck_catches_a_wrong_backward():
    x = t64(3, 4)

    def wrong_square(x):  # forward x^2, backward claims 3x
        return tt._make(x.data ** 2, 'wrong', (x,), lambda g: (g * 3 * x.data,))
    with pytest.raises(tt.GradcheckError, match=r"input 0 \(shape \(3, 4\)\) element"):
        tt.gradcheck(wrong_square, [x])


def test_gradcheck_refuses_float32():
    with pytest.raises(TypeError, match="float64"):
        tt.gradcheck(lambda x: x * 2, [tt.randn(3, requires_grad=True)])


# ---------------------------------------------------------------------------
# Arithmetic and broadcasting
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
                                lambda a, b: a / b], ids=["add", "sub", "mul", "div"])
@pytest.mark.parametrize("sa,sb", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)),
                                   ((2, 1, 4), (3, 1)), ((), (2, 3))])
def test_binary_ops_with_broadcasting(op, sa, sb):
    check(op, t64(*sa, seed=1, low=0.5), t64(*sb, seed=2, low=0.5))


@pytest.mark.parametrize("op", [lambda a: a + 2.5, lambda a: 2.5 + a, lambda a: a - 1.5,
                                lambda a: 1.5 - a, lambda a: a * 3, lambda a: 3 * a,
                                lambda a: a / 4, lambda a: 4 / a, lambda a: -a,
                                lambda a: a ** 3, lambda a: a ** -1.5, lambda a: 2.0 ** a],
                         ids=["add", "radd", "sub", "rsub", "mul", "rmul", "div", "rdiv", "neg",
                              "pow3", "pow-1.5", "rpow"])
def test_ops_with_python_scalars(op):
    x = tt.tensor(np.random.default_rng(0).uniform(0.5, 2.0, (3, 4)), requires_grad=True)
    check(op, x)


def test_pow_tensor_exponent_and_broadcast():
    base = tt.tensor(np.random.default_rng(0).uniform(0.5, 2.0, (2, 3)), requires_grad=True)
    check(lambda a, b: a ** b, base, t64(3, seed=5))


def test_transposed_non_contiguous_inputs():
    a = tt.tensor(np.random.default_rng(0).standard_normal((4, 3)).T, requires_grad=True)
    assert not a.data.flags['C_CONTIGUOUS']
    check(lambda a, b: (a * b).tanh() @ b.T, a, t64(3, 4, seed=1))
    check(lambda a: a.transpose(0, 1).reshape(12).exp(), a)


# ---------------------------------------------------------------------------
# Elementwise functions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "sin", "cos", "relu", "abs", "gelu",
                                  "erf"])
def test_unary_functions(name):
    check(lambda x: getattr(x, name)(), t64(3, 5, low=0.05))


@pytest.mark.parametrize("name", ["log", "sqrt"])
def test_positive_domain_functions(name):
    x = tt.tensor(np.random.default_rng(0).uniform(0.3, 3.0, (4, 3)), requires_grad=True)
    check(lambda x: getattr(tt, name)(x), x)


def test_gelu_tanh_approximation():
    check(lambda x: tt.gelu(x, approximate='tanh'), t64(4, 5))


def test_gelu_values_match_math_erf():
    xs = np.linspace(-8, 8, 401)
    out = tt.gelu(tt.tensor(xs)).data
    ref = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in xs])
    np.testing.assert_allclose(out, ref, rtol=1e-14, atol=1e-15)
    approx = tt.gelu(tt.tensor(xs), approximate='tanh').data
    np.testing.assert_allclose(approx, ref, atol=2e-3)


def test_clamp_maximum_minimum_where_masked_fill():
    x = t64(4, 5, low=0.1)
    check(lambda x: x.clamp(-0.8, 0.9), x)
    check(lambda x: x.clamp(min=0.0), x)
    check(lambda a, b: tt.maximum(a, b), t64(4, 5, seed=1), t64(5, seed=2))
    check(lambda a, b: tt.minimum(a, b), t64(4, 5, seed=1), t64(4, 1, seed=2))
    cond = np.random.default_rng(3).random((4, 5)) > 0.5
    check(lambda a, b: tt.where(tt.tensor(cond), a, b), t64(4, 5, seed=1), t64(5, seed=2))
    check(lambda a: a.masked_fill(tt.tensor(cond), 0.0), t64(4, 5))


def test_maximum_ties_share_the_gradient():
    a = tt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = tt.tensor([1.0, 5.0, 0.0], requires_grad=True)
    tt.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(b.grad, [0.5, 1.0, 0.0])


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "amax", "amin", "logsumexp"])
@pytest.mark.parametrize("dim", [0, -1, (0, 2), -2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(name, dim, keepdim):
    check(lambda x: getattr(x, name)(dim=dim, keepdim=keepdim), t64(3, 4, 5))


@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "amax", "amin"])
def test_full_reductions(name):
    check(lambda x: getattr(x, name)(), t64(3, 4))


def test_var_correction_matches_numpy():
    x = t64(5, 6)
    np.testing.assert_allclose(x.var(1).data, np.var(x.data, axis=1, ddof=1))
    np.testing.assert_allclose(x.var(1, correction=0).data, np.var(x.data, axis=1))
    np.testing.assert_allclose(x.std(unbiased=False).data, np.std(x.data))
    check(lambda x: x.var(0, correction=0), x)


def test_max_min_with_dim_return_values_and_indices():
    x = t64(3, 4)
    values, indices = x.max(dim=1)
    np.testing.assert_array_equal(indices.data, np.argmax(x.data, axis=1))
    np.testing.assert_array_equal(values.data, np.max(x.data, axis=1))
    assert x.min(0, keepdim=True).values.shape == (1, 4)
    check(lambda x: x.max(dim=1).values, x)
    check(lambda x: x.min(dim=0, keepdim=True).values, x)
    check(lambda x: x.max(), x)


def test_ties_in_amax_share_evenly_but_max_dim_picks_one():
    x = tt.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], requires_grad=True)
    x.amax(dim=1).sum().backward()
    np.testing.assert_allclose(x.grad, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    x.grad = None
    x.max(dim=1).values.sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 1, 0], [1, 0, 0]])


def test_argmax_argmin_have_no_gradient():
    x = t64(3, 4)
    assert not x.argmax(dim=1).requires_grad
    assert x.argmax().item() == int(np.argmax(x.data))
    assert x.argmin(dim=0, keepdim=True).shape == (1, 4)


def test_logsumexp_is_stable():
    x = tt.tensor([1000.0, 1000.0, -np.inf])
    assert abs(x.logsumexp(0).item() - (1000 + math.log(2))) < 1e-3


# ---------------------------------------------------------------------------
# Shape and indexing
# ---------------------------------------------------------------------------
def test_shape_ops():
    x = t64(2, 3, 4)
    check(lambda x: x.reshape(4, 6), x)
    check(lambda x: x.view(-1, 2), x)
    check(lambda x: x.permute(2, 0, 1), x)
    check(lambda x: x.transpose(-1, 0), x)
    check(lambda x: x.unsqueeze(1).unsqueeze(-1), x)
    check(lambda x: x.reshape(2, 1, 12).squeeze(1), x)
    check(lambda x: x.flatten(1), x)
    check(lambda x: x.T, t64(3, 4))
    check(lambda x: x.reshape(2, 3, 1, 4).expand(2, 3, 5, 4), x)
    check(lambda x: x.expand(3, -1, -1, -1), x)
    check(lambda x: x.tril(), t64(4, 4))
    check(lambda x: x.triu(1), t64(4, 4))


@pytest.mark.parametrize("index", [
    1, -1, (slice(None), 2), (slice(None, None, 2), slice(3, 0, -1)), (None, Ellipsis, 1),
    (Ellipsis, slice(-3, None)), np.array([0, 2, 2, 1, 0]), (slice(None), np.array([3, 3, 0])),
], ids=["int", "neg", "col", "steps", "none-ellipsis", "tail", "gather-repeats", "col-gather"])
def test_getitem(index):
    check(lambda x: x[index], t64(4, 5))


def test_repeated_indices_accumulate():
    x = tt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[tt.tensor([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 0.0, 1.0])


def test_boolean_mask_index():
    x = t64(4, 5)
    mask = x.data > 0
    out = x[tt.tensor(mask)]
    np.testing.assert_array_equal(out.data, x.data[mask])
    check(lambda x: x[tt.tensor(mask)], x)


def test_cat_stack_split_chunk():
    a, b = t64(2, 3, seed=1), t64(4, 3, seed=2)
    check(lambda a, b: tt.cat([a, b], dim=0), a, b)
    check(lambda a, b: tt.cat([a.T, b.T], dim=-1), a, b)
    check(lambda a, b: tt.stack([a, b[:2]], dim=1), a, b)
    x = t64(7, 3)
    assert [p.shape[0] for p in x.split(3)] == [3, 3, 1]
    assert [p.shape[0] for p in x.split([2, 5])] == [2, 5]
    assert [p.shape[0] for p in x.chunk(3)] == [3, 3, 1]
    check(lambda x: x.split([2, 5])[1] * x.chunk(3, dim=0)[2].sum(), x)


# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)),
                                   ((5, 2, 4), (4, 3)), ((2, 4), (5, 4, 3)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((4,), (5, 4, 3)), ((5, 2, 4), (4,))])
def test_matmul(sa, sb):
    a, b = t64(*sa, seed=1), t64(*sb, seed=2)
    np.testing.assert_allclose((a @ b).data, np.matmul(a.data, b.data))
    check(lambda a, b: a @ b, a, b)


# ---------------------------------------------------------------------------
# softmax and log_softmax
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dim):
    x = t64(3, 4, 5)
    check(lambda x: x.softmax(dim), x)
    check(lambda x: x.log_softmax(dim), x)
    np.testing.assert_allclose(x.softmax(dim).data.sum(axis=dim), 1.0)


def test_softmax_is_stable_and_handles_masks():
    big = tt.tensor([[1e4, 1e4 - 1, -1e4]])
    p = big.softmax(-1).data
    assert np.all(np.isfinite(p)) and abs(p.sum() - 1) < 1e-6
    assert np.all(np.isfinite(big.log_softmax(-1).data))
    mask = np.triu(np.ones((4, 4), dtype=bool), 1)
    x = t64(4, 4)
    check(lambda x: x.masked_fill(tt.tensor(mask), -np.inf).softmax(-1), x)
    check(lambda x: x.masked_fill(tt.tensor(mask), -np.inf).log_softmax(-1)
          .masked_fill(tt.tensor(mask), 0.0), x)
    p = x.masked_fill(tt.tensor(mask), -np.inf).softmax(-1).data
    assert np.all(p[mask] == 0)


def test_fused_softmax_equals_composed():
    x = t64(3, 6)
    composed = lambda x: (x - x.amax(-1, keepdim=True)).exp() / \
        (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)  # noqa: E731
    np.testing.assert_allclose(x.softmax(-1).data, composed(x).data, rtol=1e-12)
    np.testing.assert_allclose(x.log_softmax(-1).data, (x - x.logsumexp(-1, keepdim=True)).data,
                               rtol=1e-12)


# ---------------------------------------------------------------------------
# Tensor basics and dtype discipline
# ---------------------------------------------------------------------------
def test_tensor_creation_dtypes():
    assert tt.tensor([1.0, 2.0]).dtype == np.float32
    assert tt.tensor(3.5).dtype == np.float32
    assert tt.tensor(np.zeros(3)).dtype == np.float64
    assert tt.tensor([1, 2]).dtype == np.int64
    assert tt.zeros(2, 3).dtype == np.float32 and tt.ones((2, 3)).shape == (2, 3)
    assert tt.arange(5).dtype == np.int64 and tt.arange(0.0, 1.0, 0.25).dtype == np.float32
    assert tt.randn(2, 2).dtype == np.float32 and tt.rand(3).dtype == np.float32
    assert tt.full((2,), 7.0).data.tolist() == [7.0, 7.0]
    with pytest.raises(TypeError, match="floating point"):
        tt.tensor([1, 2], requires_grad=True)


def test_float32_is_preserved_through_every_op():
    x = tt.randn(3, 4, requires_grad=True)
    w = tt.randn(4, 2)
    y = ((x * 0.5 + 1) ** 2 / 3.0 - 2).exp().log().tanh().sigmoid().gelu().relu()
    y = (y.softmax(-1) + y.log_softmax(-1)).var(0, keepdim=True) + x.std() + x.amax(1, True)
    z = (y @ w).mean() * math.pi + x.clamp(-1, 1).sum() + tt.maximum(x, 0.1).sum()
    assert y.dtype == np.float32 and z.dtype == np.float32
    z.backward()
    assert x.grad.dtype == np.float32
    d = tt.tensor(np.ones((2, 2)), requires_grad=True)
    assert (d * 2.0 + 1).dtype == np.float64


def test_tensor_attributes():
    x = tt.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    assert x.shape == (2, 2) and x.ndim == 2 and len(x) == 2 and x.T.shape == (2, 2)
    assert x[1, 0].item() == 3.0
    assert "requires_grad=True" in repr(x)
    assert "grad_fn=<mul>" in repr(x * 2)
    assert "float64" in repr(tt.tensor(np.ones(2)))
    with pytest.raises(RuntimeError, match="detach"):
        x.numpy()
    assert x.detach().numpy() is x.data
    assert x.grad is None
    comparisons = [x < 2, x <= 2, x > 2, x >= 2, x == 2, x != 2]
    assert all(c.dtype == np.bool_ and not c.requires_grad for c in comparisons)
    assert (x > 2).data.tolist() == [[False, False], [True, True]]


def test_manual_seed_is_reproducible():
    tt.manual_seed(123)
    a = tt.randn(5).data.copy(), tt.randint(0, 10, (4,)).data.copy()
    tt.manual_seed(123)
    b = tt.randn(5).data.copy(), tt.randint(0, 10, (4,)).data.copy()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_multinomial_follows_the_probabilities():
    tt.manual_seed(0)
    probs = tt.tensor([[0.1, 0.0, 0.9], [0.0, 1.0, 0.0]])
    s = tt.multinomial(probs, num_samples=2000).data
    assert np.all(s[1] == 1) and not np.any(s[0] == 1)
    assert abs(np.mean(s[0] == 2) - 0.9) < 0.03


# ---------------------------------------------------------------------------
# Autograd semantics
# ---------------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls():
    x = tt.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad, [6.0, 6.0])


def test_tensor_used_twice_gets_both_contributions():
    x = tt.tensor([2.0], requires_grad=True)
    (x * x + x).sum().backward()  # d/dx (x^2 + x) = 2x + 1
    assert x.grad.tolist() == [5.0]


def test_second_backward_needs_retain_graph():
    x = tt.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, 4 * np.exp([1.0, 2.0]), rtol=1e-6)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_implicit_gradient_only_for_scalars():
    x = tt.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"single-element output, got shape \(2,\)"):
        (x * 2).backward()
    (x * 2).backward(tt.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        tt.tensor([1.0]).sum().backward()


def test_no_grad_context_and_decorator():
    x = tt.tensor([1.0], requires_grad=True)
    with tt.no_grad():
        y = x * 2
    assert not y.requires_grad and y.is_leaf
    assert tt.is_grad_enabled()

    @tt.no_grad()
    def f(t):
        return t * 3
    assert not f(x).requires_grad and (x * 3).requires_grad


def test_detach_cuts_the_graph():
    x = tt.tensor([3.0], requires_grad=True)
    y = x * x.detach()  # gradient only through the first factor
    y.backward()
    assert x.grad.tolist() == [3.0]
    assert x.detach().data is x.data


def test_long_chain_has_no_recursion_error():
    x = tt.tensor([1.0], dtype=tt.float64, requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.0
    y.sum().backward()
    assert x.grad.tolist() == [1.0]


def test_version_counter_detects_in_place_change():
    x = tt.tensor([1.0, 2.0], requires_grad=True)
    w = tt.tensor([3.0, 4.0])
    y = (x * w).sum()
    w.add_(1.0)
    with pytest.raises(RuntimeError, match="'mul'.*modified in place"):
        y.backward()
    # an op that saves nothing is unaffected
    z = (x + w).sum()
    w.mul_(2)
    z.backward()
    # a leaf changed under no_grad (as an optimizer would) between forward and backward
    p = tt.tensor([1.0, 2.0], requires_grad=True)
    loss = (p.exp() * p).sum()
    with tt.no_grad():
        p.sub_(0.1)
    with pytest.raises(RuntimeError, match="version 1, expected version 0"):
        loss.backward()


def test_views_share_the_version_counter():
    w = tt.tensor([[1.0, 2.0], [3.0, 4.0]])
    x = tt.tensor([1.0, 1.0], requires_grad=True)
    y = (x * w).sum()
    w[0].fill_(5.0)  # a view of w: changes w's storage
    with pytest.raises(RuntimeError, match="modified in place"):
        y.backward()


def test_in_place_on_leaf_requiring_grad_is_an_error():
    x = tt.tensor([1.0], requires_grad=True)
    for op in (lambda: x.add_(1), lambda: x.mul_(2), lambda: x.zero_(), lambda: x.fill_(3),
               lambda: x.sub_(1), lambda: x.copy_(tt.tensor([2.0]))):
        with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
            op()
    with pytest.raises(RuntimeError, match="leaf tensor"):
        x[0] = 2.0
    with tt.no_grad():
        x.add_(1)
        x[0] = x[0].item() * 2
    assert x.item() == 4.0 and x._version == 2


# ---------------------------------------------------------------------------
# Errors name what was wrong
# ---------------------------------------------------------------------------
def test_error_messages_name_op_and_shapes():
    a, b = tt.zeros(2, 3), tt.zeros(4, 5)
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4, 5\)"):
        a @ b
    with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4, 5\) cannot be broadcast"):
        a + b
    with pytest.raises(ValueError, match=r"mul: shapes \(2, 3\) and \(4, 5\)"):
        a * b
    with pytest.raises(ValueError, match=r"cat: .*\(2, 3\) and \(4, 5\)"):
        tt.cat([a, b], dim=0)
    with pytest.raises(ValueError, match=r"matmul: batch dims of shapes \(2, 2, 3\) and \(3, 3, 4\)"):
        tt.zeros(2, 2, 3) @ tt.zeros(3, 3, 4)
    with pytest.raises(IndexError, match=r"sum: dim 3 is out of range for a tensor with ndim 2"):
        a.sum(dim=3)
    with pytest.raises(IndexError, match=r"softmax: dim -3 .* ndim 2"):
        a.softmax(-3)
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(2, 3\)"):
        a.reshape(4, 2)
    with pytest.raises(IndexError, match=r"tensor of shape \(2, 3\)"):
        a[5]


# ---------------------------------------------------------------------------
# Against PyTorch, when it is installed
# ---------------------------------------------------------------------------
def test_ops_match_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 5))
    b = rng.standard_normal((5, 2))

    def both(fn_tt, fn_torch, *arrays):
        xs = [tt.tensor(x, requires_grad=True) for x in arrays]
        ts = [torch.tensor(x, requires_grad=True) for x in arrays]
        out_tt, out_t = fn_tt(*xs), fn_torch(*ts)
        np.testing.assert_allclose(out_tt.data, out_t.detach().numpy(), rtol=1e-10, atol=1e-12)
        v = rng.standard_normal(out_tt.shape)
        out_tt.backward(v)
        out_t.backward(torch.tensor(v))
        for x, t in zip(xs, ts):
            np.testing.assert_allclose(x.grad, t.grad.numpy(), rtol=1e-10, atol=1e-12)

    both(lambda x: x.var(1, keepdim=True), lambda x: x.var(1, keepdim=True), a)
    both(lambda x: x.std((0, 2), correction=0), lambda x: x.std((0, 2), correction=0), a)
    both(lambda x: x.logsumexp(-1), lambda x: x.logsumexp(-1), a)
    both(lambda x: x.gelu(), lambda x: torch.nn.functional.gelu(x), a)
    both(lambda x: x.gelu(approximate='tanh'),
         lambda x: torch.nn.functional.gelu(x, approximate='tanh'), a)
    both(lambda x, w: (x @ w).log_softmax(1), lambda x, w: (x @ w).log_softmax(1), a, b)
    both(lambda x: x[:, [0, 0, 2]].amax(1), lambda x: x[:, [0, 0, 2]].amax(1), a)
    both(lambda x: x.permute(2, 0, 1).flatten(1).sigmoid(),
         lambda x: x.permute(2, 0, 1).flatten(1).sigmoid(), a)
