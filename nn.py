"""nn.py: modules, layers, losses, initialisers and checkpoints, on top of tinytorch.

  1. Parameter and Module (parameters, train/eval, state_dict, repr)
  2. layers: Linear, Embedding, LayerNorm, Dropout, activations, containers; for images
     Conv2d, MaxPool2d, AvgPool2d, BatchNorm1d/2d, Flatten
  3. losses: mse_loss, cross_entropy (fused), binary_cross_entropy_with_logits
  4. initialisers (nn.init.normal_, xavier_uniform_, ...)
  5. checkpoints: save / load in NumPy's .npz format or as .safetensors (never pickle),
     written atomically

Needs only NumPy and tinytorch.py.
"""
import json
import math
import os
import tempfile
import zipfile
from collections import OrderedDict
from types import SimpleNamespace

import tinytorch as tt  # before NumPy, so it can set up OpenBLAS's threads (see its top)
import numpy as np

from tinytorch import Tensor, from_op, no_grad, sum_last, sum_leading


# ---------------------------------------------------------------------------
# 1. Parameter and Module
# ---------------------------------------------------------------------------
class Parameter(Tensor):
    """A Tensor that is a learnable part of a Module: it always requires grad."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data.data if isinstance(data, Tensor) else data,
                         requires_grad=requires_grad)

    def __repr__(self):
        return 'Parameter containing:\n' + super().__repr__()


class Module:
    """Base class of every layer and model.

    Assigning a Parameter or a Module as an attribute registers it: parameters()
    walks the attributes in the order they were set, then the sub-modules'.
    """
    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # -- the module tree ------------------------------------------------------
    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def children(self):
        return [m for _, m in self.named_children()]

    def named_modules(self, prefix=''):
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(prefix + ('.' if prefix else '') + name)

    def modules(self):
        return [m for _, m in self.named_modules()]

    def _named_parameters_all(self, prefix=''):
        """Every (dotted name, parameter), shared parameters listed under each name."""
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child._named_parameters_all(prefix + name + '.')

    def named_parameters(self):
        """(dotted name, parameter) pairs, as PyTorch names them ('blocks.0.attn.weight');
        a parameter shared by two modules (weight tying) is listed once."""
        seen = set()
        for name, p in self._named_parameters_all():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def register_buffer(self, name, tensor):
        """A tensor that is state but not learned (BatchNorm's running mean): saved in
        state_dict and checkpoints, never in parameters(), so no optimizer touches it."""
        self.__dict__.setdefault('_buffer_names', []).append(name)
        setattr(self, name, tensor)

    def named_buffers(self, prefix=''):
        for name in vars(self).get('_buffer_names', ()):
            yield prefix + name, getattr(self, name)
        for name, child in self.named_children():
            yield from child.named_buffers(prefix + name + '.')

    def buffers(self):
        return [b for _, b in self.named_buffers()]

    def num_parameters(self):
        return int(np.sum([p.data.size for p in self.parameters()]))

    # -- modes and gradients --------------------------------------------------
    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    # -- state_dict -----------------------------------------------------------
    def _state(self):
        yield from self._named_parameters_all()
        yield from self.named_buffers()

    def state_dict(self):
        """A snapshot: dotted name -> copy of the array of each parameter, then each buffer."""
        return OrderedDict((name, p.data.copy()) for name, p in self._state())

    def load_state_dict(self, state_dict, strict=True):
        """Copy arrays into the parameters. With strict=True, missing keys, unexpected
        keys and shape mismatches are all listed in one error and nothing is changed."""
        own = OrderedDict(self._state())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        mismatched = [f"{k}: checkpoint {tuple(np.shape(_array(v)))} vs model "
                      f"{tuple(own[k].shape)}" for k, v in state_dict.items()
                      if k in own and tuple(np.shape(_array(v))) != tuple(own[k].shape)]
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if mismatched:
            problems.append("shape mismatches: " + "; ".join(mismatched))
        if problems:
            raise KeyError(f"load_state_dict for {type(self).__name__}: " + " | ".join(problems))
        with no_grad():
            for k, v in state_dict.items():
                if k in own:
                    own[k].copy_(_array(v).astype(own[k].dtype))
        return SimpleNamespace(missing_keys=missing, unexpected_keys=unexpected)

    # -- repr -----------------------------------------------------------------
    def extra_repr(self):
        return ''

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if children:
            for name, child in children:
                sub = repr(child).replace('\n', '\n  ')
                lines.append(f"  ({name}): {sub}  # {child.num_parameters():,} params")
            lines.append(')')
        else:
            lines[0] += ')'
        return '\n'.join(lines)


def _array(v):
    return v.data if isinstance(v, Tensor) else np.asarray(v)


class Sequential(Module):
    def __init__(self, *layers):
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def __getitem__(self, i):
        return self.children()[i]

    def __len__(self):
        return len(self.children())

    def forward(self, x):
        for layer in self.children():
            x = layer(x)
        return x


class ModuleList(Module):
    def __init__(self, modules=()):
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self)), module)
        return self

    def __getitem__(self, i):
        return self.children()[i]

    def __len__(self):
        return len(self.children())

    def __iter__(self):
        return iter(self.children())


# ---------------------------------------------------------------------------
# 2. Layers
# ---------------------------------------------------------------------------
def linear(x, weight, bias=None):
    """y = x W^T + b as one op (W is (out, in), as in PyTorch). Leading dims of x are
    folded into rows, so the whole batch is a single 2-D matrix multiply."""
    tt._same_dtype('linear', input=x, weight=weight, bias=bias)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} has {x.shape[-1]} features, "
                         f"but the weight of shape {tuple(weight.shape)} expects {weight.shape[1]}")
    x2 = x.data.reshape(-1, x.shape[-1])
    out = x2 @ weight.data.T
    if bias is not None:
        out += bias.data
    out = out.reshape(x.shape[:-1] + (weight.shape[0],))

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = (g2 @ weight.data).reshape(x.shape) if x.requires_grad else None  # dx = g W
        gw = g2.T @ x2 if weight.requires_grad else None  # dW = g^T x, summed over all rows
        if bias is None:
            return gx, gw
        return gx, gw, sum_leading(g2)  # db = sum of g over all rows (b was broadcast)
    parents = (x, weight) if bias is None else (x, weight, bias)
    return from_op(out, 'linear', parents, backward, saved=(x, weight))


tt.FLOPS['linear'] = lambda out, parents: 2 * out.data.size * parents[1].shape[1]
tt.RULES_IN_WORDS['linear'] = ("dx = g @ W", "dW = g^T @ x, summed over all {rows} rows",
                               "db = sum of g over all rows {g} -> {x}")


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, dtype=None):
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(tt.zeros(out_features, in_features, dtype=dtype))
        self.bias = Parameter(tt.zeros(out_features, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # PyTorch's default: kaiming_uniform_(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), same for bias
        kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def embedding(idx, weight):
    """Rows of weight picked by integer indices: weight[idx]. Its backward (from
    tinytorch's getitem) adds each position's gradient into its row, so a token
    that appears twice gets both contributions."""
    idx = idx if isinstance(idx, Tensor) else tt.tensor(idx)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    n = weight.shape[0]
    if idx.data.size and (idx.data.min() < 0 or idx.data.max() >= n):
        bad = idx.data[(idx.data < 0) | (idx.data >= n)][0]
        raise IndexError(f"embedding: index {bad} is out of range for an embedding of "
                         f"{n} rows")
    return weight[idx]


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, dtype=None):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(tt.randn(num_embeddings, embedding_dim, dtype=dtype))  # N(0, 1)

    def forward(self, idx):
        return embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Fused layer norm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) dims, with a hand-derived backward (one node, not ten)."""
    normalized_shape = tuple(normalized_shape) if not isinstance(normalized_shape, int) \
        else (normalized_shape,)
    k = len(normalized_shape)
    tt._same_dtype('layer_norm', input=x, weight=weight, bias=bias)
    if tuple(x.shape[x.ndim - k:]) != normalized_shape:
        raise ValueError(f"layer_norm: input of shape {tuple(x.shape)} does not end with the "
                         f"normalized shape {normalized_shape}")
    n = math.prod(normalized_shape)
    rows = x.data.reshape(-1, n)  # one row per normalized group
    xhat = rows - sum_last(rows) / n  # x - mean
    rstd = 1.0 / np.sqrt(sum_last(xhat * xhat) / n + eps)  # 1 / sqrt(var + eps)
    xhat *= rstd
    out = xhat.copy() if weight is None else xhat * weight.data.reshape(n)
    if bias is not None:
        out += bias.data.reshape(n)

    def backward(g):
        g = g.reshape(-1, n)
        gx = g.copy() if weight is None else g * weight.data.reshape(n)  # d loss / d xhat
        # x_hat = (x - mu) * rstd. Differentiating through mu and rstd gives
        # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        tmp = gx * xhat
        mean_gx_xhat = sum_last(tmp) / n
        gx -= sum_last(gx) / n
        gx -= np.multiply(xhat, mean_gx_xhat, out=tmp)
        gx *= rstd
        grads = [gx.reshape(x.shape)]
        if weight is not None:  # dweight = sum over rows of g * xhat
            grads.append(sum_leading(np.multiply(g, xhat, out=tmp)).reshape(weight.shape))
        if bias is not None:  # dbias = sum over rows of g
            grads.append(sum_leading(g).reshape(bias.shape))
        return tuple(grads)
    parents = (x,) + ((weight,) if weight is not None else ()) + ((bias,) if bias is not None else ())
    return from_op(out.reshape(x.shape), 'layer_norm', parents, backward,
                   saved=() if weight is None else (weight,))  # backward reads the weight


tt.RULES_IN_WORDS['layer_norm'] = ("dx = rstd * (g*w - mean(g*w) - x_hat * mean(g*w*x_hat))",
                                   "dweight = sum over rows of g * x_hat",
                                   "dbias = sum over rows of g")


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, dtype=None):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(tt.ones(self.normalized_shape, dtype=dtype)) \
            if elementwise_affine else None
        self.bias = Parameter(tt.zeros(self.normalized_shape, dtype=dtype)) \
            if elementwise_affine else None

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


def dropout(x, p=0.5, training=True):
    """Inverted dropout: zero each element with probability p and scale the rest by
    1/(1-p), so the expected value is unchanged and eval mode is the identity."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    mask = dropout_mask(x.shape, p, x.dtype)
    return from_op(x.data * mask, 'dropout', (x,), lambda g: (g * mask,))  # d/dx = mask / (1-p)


tt.RULES_IN_WORDS['dropout'] = "times the dropout mask / (1 - p)"


def dropout_mask(shape, p, dtype):
    """0 with probability p, else 1/(1-p), from the library's seeded generator.

    An element is kept when 32 random bits, read as an integer, are at least p * 2^32.
    The generator's raw output gives 64 bits a draw: twice as fast as drawing floats
    (masks are most of what dropout costs)."""
    n = math.prod(shape)
    bits = tt.default_generator().bit_generator.random_raw((n + 1) // 2).view(np.uint32)
    mask = np.empty(shape, dtype=dtype)
    threshold = np.uint32(min(round(p * 2 ** 32), 2 ** 32 - 1))
    np.greater_equal(bits[:n].reshape(shape), threshold, out=mask)
    mask *= 1.0 / (1.0 - p)
    return mask


class Dropout(Module):
    def __init__(self, p=0.5):
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        return dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class GELU(Module):
    def __init__(self, approximate='none'):
        self.approximate = approximate

    def forward(self, x):
        return x.gelu(approximate=self.approximate)


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class SiLU(Module):
    def forward(self, x):
        return tt.silu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01):
        self.negative_slope = negative_slope

    def forward(self, x):
        return tt.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return tt.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


# nn doubles as torch.nn.functional: `import nn as F` runs F.relu(x), F.softmax(x, -1),
# F.cross_entropy(...). The activations are tinytorch's own ops, under the same names.
relu, gelu, silu, sigmoid, tanh = tt.relu, tt.gelu, tt.silu, tt.sigmoid, tt.tanh
leaky_relu, softplus, softmax, log_softmax = tt.leaky_relu, tt.softplus, tt.softmax, tt.log_softmax


def one_hot(tensor, num_classes=-1):
    """(..., num_classes) int64 tensor with a 1 at each index (no gradient: indices have none)."""
    idx = tensor.data if isinstance(tensor, Tensor) else np.asarray(tensor)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"one_hot: expects integer class indices, got {idx.dtype}")
    n = int(idx.max()) + 1 if num_classes == -1 and idx.size else num_classes
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"one_hot: class values must be in [0, {n}), got {idx.min()}..{idx.max()}")
    return tt.tensor(np.arange(n) == idx[..., None]).long()


# -- images: convolution, pooling, batch norm ----------------------------------
# A convolution is a matmul over patches: tt.unfold turns every kh x kw patch of the
# image into a column, one matmul with the kernels (flattened into rows) gives every
# output channel at every position, and a reshape puts the positions back in a grid.
# Its gradient comes from theirs: the kernel's gradient is the output gradient times
# the patches, the image's is the kernels times the output gradient, folded back.
def _image(x, op, channels=None):
    if x.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D input (N, C, H, W), got shape {tuple(x.shape)}")
    if channels is not None and x.shape[1] != channels:
        raise ValueError(f"{op}: expected {channels} input channels, got {x.shape[1]} "
                         f"(input of shape {tuple(x.shape)})")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1):
    """(N, C, H, W) * weight (O, C, kh, kw) -> (N, O, oh, ow), as F.conv2d (groups=1)."""
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D (out, in, kh, kw), got {tuple(weight.shape)}")
    _image(input, 'conv2d', weight.shape[1])
    tt._same_dtype('conv2d', input=input, weight=weight, bias=bias)
    n, o = input.shape[0], weight.shape[0]
    kernel = weight.shape[2:]
    win = tt.window(input.shape, kernel, dilation, padding, stride, 'conv2d')
    if FUSED_VISION and win.stride == (1, 1):  # the same numbers as one op (section 6, Speed)
        return conv2d_fused(input, weight, bias, win)
    oh, ow = win.out
    cols = tt.unfold(input, kernel, dilation, padding, stride)  # (N, C*kh*kw, oh*ow)
    out = weight.reshape(o, -1) @ cols  # (O, C*kh*kw) @ (N, C*kh*kw, L) -> (N, O, L)
    if bias is not None:
        out = out + bias.reshape(o, 1)
    return out.reshape(n, o, oh, ow)


def _pool_check(input, kernel_size, stride, padding, dilation, op):
    """The pool's window; a wrong input or padding is refused in one line."""
    _image(input, op)
    stride = kernel_size if stride is None else stride  # PyTorch's default: no overlap
    win = tt.window(input.shape, kernel_size, dilation, padding, stride, op)
    if win.padding[0] > win.kernel[0] // 2 or win.padding[1] > win.kernel[1] // 2:
        raise ValueError(f"{op}: padding {win.padding} must be at most half the kernel "
                         f"{win.kernel}, as in PyTorch")
    return win


def _pool_windows(input, win):
    """Each channel's windows as columns: (N*C, kh*kw, L), and the output's shape."""
    n, c, h, w = input.shape
    cols = tt.unfold(input.reshape(n * c, 1, h, w), win.kernel, win.dilation, win.padding,
                     win.stride)
    return cols, (n, c) + win.out


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1):
    """The largest value of each window. Its gradient goes to that one element (the first
    one on ties, as PyTorch); padding never wins."""
    win = _pool_check(input, kernel_size, stride, padding, dilation, 'max_pool2d')
    if FUSED_VISION:  # the same numbers as one op (section 6, Speed)
        return max_pool2d_fused(input, win)
    cols, shape = _pool_windows(input, win)
    if padding:  # unfold pads with 0; a max pool's padding is -inf
        real = tt.unfold(tt.ones(1, 1, *input.shape[2:], dtype=input.dtype), win.kernel,
                         win.dilation, win.padding, win.stride)
        cols = cols.masked_fill(real.data == 0, -np.inf)
    return cols.max(dim=1).values.reshape(shape)


def avg_pool2d(input, kernel_size, stride=None, padding=0):
    """The mean of each window (zero padding counts, as PyTorch's count_include_pad)."""
    cols, shape = _pool_windows(input, _pool_check(input, kernel_size, stride, padding, 1,
                                                   'avg_pool2d'))
    return cols.mean(dim=1).reshape(shape)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Normalize each channel (dim 1) to mean 0, variance 1, then scale and shift.

    In training, by the batch's own statistics (biased variance), and the running
    estimates move toward them: running = (1 - momentum) running + momentum batch, with
    the unbiased variance (as PyTorch). In eval, by the running estimates."""
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected (N, C) or (N, C, ...), got {tuple(input.shape)}")
    c = input.shape[1]
    shape = (1, c) + (1,) * (input.ndim - 2)  # broadcasts over all dims but the channels
    dims = (0,) + tuple(range(2, input.ndim))
    if training:
        count = input.data.size // c
        if count < 2:
            raise ValueError(f"batch_norm: expected more than 1 value per channel when "
                             f"training, got input of shape {tuple(input.shape)}")
        mean = input.mean(dim=dims, keepdim=True)
        var = input.var(dim=dims, correction=0, keepdim=True)
        if running_mean is not None:
            with no_grad():
                running_mean.mul_(1 - momentum).add_(mean.reshape(c) * momentum)
                running_var.mul_(1 - momentum).add_(var.reshape(c) * (momentum * count / (count - 1)))
    else:
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
    out = (input - mean) / (var + eps).sqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, dtype=None):
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = tt._pair(kernel_size, 'kernel_size', 'Conv2d')
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.weight = Parameter(tt.zeros(out_channels, in_channels, *self.kernel_size, dtype=dtype))
        self.bias = Parameter(tt.zeros(out_channels, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # PyTorch's default, as Linear's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C*kh*kw
        kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(_fans(self.weight)[0])
            uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"bias={self.bias is not None}")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation

    def forward(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _BatchNorm(Module):
    dims = None  # the input ranks the layer takes

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, dtype=None):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(tt.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(tt.zeros(num_features, dtype=dtype)) if affine else None
        self.register_buffer('running_mean', tt.zeros(num_features, dtype=dtype))
        self.register_buffer('running_var', tt.ones(num_features, dtype=dtype))

    def forward(self, x):
        name = type(self).__name__
        if x.ndim not in self.dims:
            raise ValueError(f"{name}: expected a {' or '.join(f'{d}-D' for d in self.dims)} "
                             f"input, got shape {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{name}: expected {self.num_features} channels (dim 1), got "
                             f"{x.shape[1]} (input of shape {tuple(x.shape)})")
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          self.training, self.momentum, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    dims = (2, 3)  # (N, C) or (N, C, L)


class BatchNorm2d(_BatchNorm):
    dims = (4,)  # (N, C, H, W)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


# ---------------------------------------------------------------------------
# 3. Losses
# ---------------------------------------------------------------------------
def _reduce(loss, reduction, op):
    if reduction == 'mean':
        return loss.mean()
    if reduction == 'sum':
        return loss.sum()
    if reduction == 'none':
        return loss
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse_loss(input, target, reduction='mean'):
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if input.shape != target.shape:
        raise ValueError(f"mse_loss: input shape {tuple(input.shape)} and target shape "
                         f"{tuple(target.shape)} differ")
    diff = input - target
    return _reduce(diff * diff, reduction, 'mse_loss')


def cross_entropy(input, target, weight=None, *, ignore_index=-100, reduction='mean',
                  label_smoothing=0.0):
    """Fused log-softmax + negative log-likelihood, on (N, C) logits and N class indices.

    loss_i = logsumexp(z_i) - z_i[t_i], computed with the max subtracted (stable for
    logits of +-1e4). Its gradient is short and exact:
        d loss_i / d z_i = softmax(z_i) - onehot(t_i).
    weight (C,) scales class c's loss by weight[c]; 'mean' then divides by the sum
    of the weights of the targets (PyTorch's weighted mean). label_smoothing e mixes
    the one-hot target with a uniform one: loss_i = (1 - e) nll_i + e/C sum_c w_c (lse_i - z_ic).
    Rows whose target is ignore_index contribute nothing and get a zero gradient,
    even when every row is ignored (the loss is then nan, the gradient 0, as PyTorch).
    """
    logits = input
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C), got shape {tuple(logits.shape)}; "
                         "reshape (B, T, C) logits with .reshape(-1, C)")
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in 'iu':
        raise TypeError(f"cross_entropy: targets must be integer class indices, got {t.dtype}")
    n, c = logits.shape
    if t.shape != (n,):
        raise ValueError(f"cross_entropy: logits of shape {tuple(logits.shape)} need targets of "
                         f"shape ({n},), got {tuple(t.shape)}")
    if reduction not in ('mean', 'sum', 'none'):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if weight is not None:
        tt._same_dtype('cross_entropy', input=logits, weight=weight)
        if weight.shape != (c,):
            raise ValueError(f"cross_entropy: weight must have shape ({c},), one per class, "
                             f"got {tuple(weight.shape)}")
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= c))
    if bad.any():
        raise IndexError(f"cross_entropy: target {t[bad][0]} is out of range for {c} classes")
    safe_t = np.where(valid, t, 0)
    rows = np.arange(n)
    w = None if weight is None else weight.data.copy()  # a copy: backward reads it
    w_t = valid if w is None else w[safe_t] * valid  # each row's weight, 0 if ignored
    shifted = logits.data - logits.data.max(axis=1, keepdims=True)
    e = np.exp(shifted)  # softmax numerators, kept for backward
    sumexp = sum_last(e)  # (N, 1)
    lse = np.log(sumexp[:, 0])
    eps = label_smoothing
    loss = (lse - shifted[rows, safe_t]) * w_t  # w_t[i] * nll_i
    if eps:  # the uniform part: e/C sum_c w_c (lse_i - z_ic)
        smooth = lse * c - shifted.sum(axis=1) if w is None else lse * w.sum() - shifted @ w
        loss = (1 - eps) * loss + (eps / c) * smooth * valid
    total = w_t.sum()  # 'mean' divides by the total weight (the count when unweighted)
    if reduction == 'mean':
        with np.errstate(divide='ignore', invalid='ignore'):
            out = (loss.sum() / total).astype(logits.dtype)  # nan if every row is ignored
    else:
        out = loss.sum() if reduction == 'sum' else loss

    def backward(g):
        # d loss_i / d z_i = w_ti (softmax(z_i) - onehot(t_i)); with smoothing:
        #   (1 - e) w_ti (p_i - onehot(t_i)) + e/C (p_i sum(w) - w)
        grad = e / sumexp  # softmax(logits)
        if eps:
            w_all = c if w is None else w.sum()
            grad *= ((1 - eps) * w_t + (eps / c) * w_all)[:, None]
            grad[rows, safe_t] -= (1 - eps) * w_t
            grad -= (eps / c) * (1 if w is None else w)
        else:
            if w is not None:
                grad *= w_t[:, None]
            grad[rows, safe_t] -= w_t
        if reduction == 'mean':
            scale = g / total if total else 0 * g  # all rows ignored: no gradient at all
        else:
            scale = g
        scale = (scale * valid).astype(logits.dtype)
        return (grad * scale[:, None],)  # one scale per row
    return from_op(out, 'cross_entropy', (logits,), backward)  # reads only its own arrays


tt.RULES_IN_WORDS['cross_entropy'] = (
    "softmax(logits) - onehot(target), divided by the number of rows")


def binary_cross_entropy_with_logits(input, target, reduction='mean'):
    """-[y log sigma(x) + (1 - y) log(1 - sigma(x))], computed stably as
    max(x, 0) - x y + log(1 + exp(-|x|)); its gradient is sigma(x) - y for x and -x
    for the target y (a target that requires grad gets it, as in PyTorch)."""
    logits = input
    if not isinstance(target, Tensor):
        target = tt.tensor(np.asarray(target, dtype=logits.dtype))
    if target.shape != logits.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: logits shape {tuple(logits.shape)} "
                         f"and target shape {tuple(target.shape)} differ")
    x, y = logits.data, target.data
    loss = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    sig = 0.5 + 0.5 * np.tanh(0.5 * x)
    per_elem = from_op(loss, 'bce_with_logits', (logits, target),
                       lambda g: (g * (sig - y), -g * x), saved=(logits, target))
    return _reduce(per_elem, reduction, 'binary_cross_entropy_with_logits')


tt.RULES_IN_WORDS['bce_with_logits'] = ("sigmoid(x) - y", "-x")


class MSELoss(Module):
    def __init__(self, reduction='mean'):
        self.reduction = reduction

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    def __init__(self, weight=None, ignore_index=-100, reduction='mean', label_smoothing=0.0):
        self.weight, self.ignore_index = weight, ignore_index
        self.reduction, self.label_smoothing = reduction, label_smoothing

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCEWithLogitsLoss(Module):
    def __init__(self, reduction='mean'):
        self.reduction = reduction

    def forward(self, logits, target):
        return binary_cross_entropy_with_logits(logits, target, self.reduction)


# ---------------------------------------------------------------------------
# 4. Initialisers: in place, under no_grad, with the library's seeded generator
# ---------------------------------------------------------------------------
def _fans(t):
    if t.ndim < 2:
        raise ValueError(f"fan in/out needs a tensor with at least 2 dims, got {tuple(t.shape)}")
    receptive = math.prod(t.shape[2:])  # 1 for a matrix
    return t.shape[1] * receptive, t.shape[0] * receptive


@no_grad()
def uniform_(t, a=0.0, b=1.0):
    return t.copy_(tt.default_generator().uniform(a, b, t.shape).astype(t.dtype))


@no_grad()
def normal_(t, mean=0.0, std=1.0):
    return t.copy_((tt.default_generator().standard_normal(t.shape) * std + mean).astype(t.dtype))


@no_grad()
def zeros_(t):
    return t.zero_()


@no_grad()
def ones_(t):
    return t.fill_(1.0)


def xavier_uniform_(t, gain=1.0):
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))  # keeps the variance of activations
    return uniform_(t, -bound, bound)


def kaiming_uniform_(t, a=0.0, mode='fan_in', nonlinearity='leaky_relu'):
    fan_in, fan_out = _fans(t)
    fan = fan_in if mode == 'fan_in' else fan_out
    gain = math.sqrt(2.0 / (1 + a * a)) if nonlinearity == 'leaky_relu' else \
        (math.sqrt(2.0) if nonlinearity == 'relu' else 1.0)
    bound = gain * math.sqrt(3.0 / fan) if fan > 0 else 0.0
    return uniform_(t, -bound, bound)


init = SimpleNamespace(uniform_=uniform_, normal_=normal_, zeros_=zeros_, ones_=ones_,
                       xavier_uniform_=xavier_uniform_, kaiming_uniform_=kaiming_uniform_)


# ---------------------------------------------------------------------------
# 5. Checkpoints: .npz (a zip of .npy arrays) or .safetensors, plus a JSON
#    description of everything else; never pickle
# ---------------------------------------------------------------------------
class CheckpointError(Exception):
    pass


_META = '__tinytorch_meta__'


def _encode(obj, arrays, names, path=''):
    """Turn nested dicts/lists of arrays, tensors, numbers and strings into JSON,
    moving every array into `arrays` (and its dotted path into `names`) and leaving a
    reference in its place."""
    if isinstance(obj, (Tensor, np.ndarray)):
        arrays.append(obj.data if isinstance(obj, Tensor) else obj)
        names.append(path)
        return {'__tensor__' if isinstance(obj, Tensor) else '__array__': len(arrays) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    sub = (path + '.') if path else ''
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {'__dict__': {k: _encode(v, arrays, names, sub + k) for k, v in obj.items()}}
        return {'__items__': [[_encode(k, arrays, names, sub + 'key'),
                               _encode(v, arrays, names, f'{sub}{k}')] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {'__list__': [_encode(v, arrays, names, f'{sub}{i}') for i, v in enumerate(obj)],
                'tuple': isinstance(obj, tuple)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, 'state_dict'):  # a Module or an optimizer: its numbers are its state_dict
        raise TypeError(f"save: got a {type(obj).__name__}, which holds code as well as numbers; "
                        "save its state_dict(): nn.save(obj.state_dict(), path), and bring it "
                        "back with obj.load_state_dict(nn.load(path))")
    raise TypeError(f"save: cannot store an object of type {type(obj).__name__}")


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if '__tensor__' in obj:
            return tt.tensor(arrays[obj['__tensor__']])
        if '__array__' in obj:
            return arrays[obj['__array__']]
        if '__dict__' in obj:
            return {k: _decode(v, arrays) for k, v in obj['__dict__'].items()}
        if '__items__' in obj:
            return {_decode(k, arrays): _decode(v, arrays) for k, v in obj['__items__']}
        if '__list__' in obj:
            items = [_decode(v, arrays) for v in obj['__list__']]
            return tuple(items) if obj['tuple'] else items
    return obj


def save(obj, path):
    """Write obj (nested dicts and lists of tensors, arrays, numbers and strings: a
    state_dict, a training checkpoint) to path: a .safetensors file when path ends so,
    else NumPy's .npz. Atomically: a temporary file in the same folder, flushed to disk,
    then renamed over path. A crash mid-save leaves the old file intact."""
    arrays, names = [], []
    meta = json.dumps(_encode(obj, arrays, names))
    if str(path).endswith('.safetensors'):
        tensors = dict(zip(_unique(names), arrays))
        _atomic_write(path, lambda f: _write_safetensors(
            f, tensors, {_META: meta, 'names': json.dumps(list(tensors)), 'format': 'pt'}))
        return
    entries = {f'a{i}': a for i, a in enumerate(arrays)}
    entries[_META] = np.frombuffer(meta.encode('utf-8'), dtype=np.uint8)
    _atomic_write(path, lambda f: np.savez(f, **entries))


def _atomic_write(path, write):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp', dir=folder)
    # mkstemp makes the file private (0600); give it the mode open() would: 0666 less the umask
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _unique(names):
    """Tensor names for a .safetensors file: the dotted paths, made unique."""
    seen, out = set(), []
    for i, name in enumerate(names):
        name = name or 'tensor'
        if name in seen:
            name = f'{name}#{i}'
        seen.add(name)
        out.append(name)
    return out


def load(path):
    """Read what save() wrote. Never unpickles, so an untrusted file cannot run code."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.endswith('.safetensors'):
        tensors, metadata = load_safetensors(path)
        if _META not in metadata:
            raise CheckpointError(f"{path} is a safetensors file but not a tinytorch checkpoint "
                                  f"(no {_META} entry in its metadata); read its tensors with "
                                  "nn.load_safetensors")
        try:
            names = json.loads(metadata['names'])
            return _decode(json.loads(metadata[_META]), {i: tensors[n] for i, n in enumerate(names)})
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: its tinytorch description does not match its "
                                  f"tensors ({type(e).__name__}: {e})") from None
    with open(path, 'rb') as f:
        magic = f.read(4)
    if magic != b'PK\x03\x04':  # every .npz is a zip archive, which starts so
        raise CheckpointError(f"{path} is not a tinytorch checkpoint (neither a .npz archive "
                              "nor a .safetensors file)")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _META not in z.files:
                raise CheckpointError(f"{path} is not a tinytorch checkpoint (no {_META} entry)")
            meta = json.loads(bytes(z[_META]).decode('utf-8'))
            arrays = {int(k[1:]): z[k] for k in z.files if k != _META}
    except CheckpointError:
        raise
    except ValueError as e:
        if 'allow_pickle' in str(e):  # an object array: NumPy would have to unpickle it
            raise CheckpointError(f"{path} holds pickled Python objects, which could run code: "
                                  "it is not a tinytorch checkpoint, and tinytorch never loads "
                                  "them") from None
        raise CheckpointError(f"{path} is truncated or corrupt and cannot be loaded "
                              f"({type(e).__name__}: {e})") from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt and cannot be loaded "
                              f"({type(e).__name__}: {e})") from None
    return _decode(meta, arrays)


# safetensors (Hugging Face's format): an 8-byte little-endian length N, N bytes of JSON
# (for each tensor its dtype, shape and [begin, end) byte offsets in the data that
# follows; "__metadata__": a dict of strings), then the tensors' raw little-endian bytes.
_ST_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'I64': np.int64,
              'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U64': np.uint64,
              'U32': np.uint32, 'U16': np.uint16, 'U8': np.uint8, 'BOOL': np.bool_}
_ST_CODES = {np.dtype(t): code for code, t in _ST_DTYPES.items()}


def save_safetensors(tensors, path, metadata=None):
    """Write name -> array (or tensor) as a .safetensors file, atomically."""
    arrays = {k: (v.data if isinstance(v, Tensor) else np.asarray(v)) for k, v in tensors.items()}
    _atomic_write(path, lambda f: _write_safetensors(f, arrays, metadata))


def _write_safetensors(f, tensors, metadata):
    header, offset = {}, 0
    if metadata:
        header['__metadata__'] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        if a.dtype not in _ST_CODES:
            raise TypeError(f"save: safetensors cannot store {name!r} of dtype {a.dtype}")
        header[name] = {'dtype': _ST_CODES[a.dtype], 'shape': list(a.shape),
                        'data_offsets': [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(',', ':')).encode('utf-8')
    text += b' ' * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
    f.write(len(text).to_bytes(8, 'little') + text)
    for a in tensors.values():
        f.write(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder('<')).tobytes())


def load_safetensors(path):
    """Read a .safetensors file: (name -> NumPy array, metadata dict). bfloat16 tensors
    come back as float32 (NumPy has no bfloat16)."""
    def corrupt(why):
        return CheckpointError(f"{path} is truncated or corrupt and cannot be loaded ({why})")
    with open(path, 'rb') as f:
        raw = f.read()
    if len(raw) < 8:
        raise corrupt(f"{len(raw)} bytes, fewer than the 8 of the header length")
    n = int.from_bytes(raw[:8], 'little')
    if n > len(raw) - 8:
        raise corrupt(f"the header claims {n} bytes, the file has {len(raw) - 8} after it")
    try:
        header = json.loads(raw[8:8 + n].decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as e:
        raise corrupt(f"its header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise corrupt("its header is not a JSON object")
    data = memoryview(raw)[8 + n:]
    metadata = header.pop('__metadata__', None) or {}
    tensors = {}
    for name, info in header.items():
        try:
            code, shape, (begin, end) = info['dtype'], tuple(info['shape']), info['data_offsets']
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"bad entry for {name!r}") from None
        dtype = np.dtype(np.uint16 if code == 'BF16' else _ST_DTYPES.get(code, np.void))
        if dtype == np.void:
            raise corrupt(f"{name!r} has dtype {code}, which tinytorch cannot read")
        count = math.prod(shape)
        if not 0 <= begin <= end <= len(data) or end - begin != count * dtype.itemsize:
            raise corrupt(f"{name!r}: offsets {begin}..{end} do not hold {shape} of {code} "
                          f"within the {len(data)} bytes of data")
        a = np.frombuffer(data[begin:end], dtype=dtype.newbyteorder('<')).reshape(shape)
        if code == 'BF16':  # bfloat16 is the top half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = a.astype(a.dtype.newbyteorder('='))
    return tensors, metadata


# ---------------------------------------------------------------------------
# 6. Speed: conv2d and max_pool2d as single ops
# ---------------------------------------------------------------------------
# nn.conv2d and nn.max_pool2d (section 2) are compositions a learner can follow:
# unfold, matmul, reshape, max. The functions below give the same numbers (a test
# proves it) in one op each, with a hand-derived backward. NumPy is slow on the
# short rows of small images (8 numbers a row for 8x8 digits): a loop over 8 numbers
# costs more than the arithmetic. So the stride-1 convolution works on each image
# flattened with its padded width: kernel element (i, j) then reads one contiguous run
# of the flat image, starting i*Wp + j further on, instead of H short rows. Output
# positions that fall in the padding columns are computed too, and dropped.
# Set FUSED_VISION = False to run the compositions instead.
FUSED_VISION = True


def conv2d_fused(input, weight, bias, win):
    """nn.conv2d for stride 1 as one op: columns of the flat padded images, one matmul.
    out = W @ cols,  dW = g @ cols^T,  dcols = W^T @ g, each column's gradient added
    back where it was read (unfold's backward)."""
    (kh, kw), (dh, dw), (ph, pw), _, (oh, ow) = win
    n, c, h, w = input.shape
    o = weight.shape[0]
    hp, wp = h + 2 * ph, w + 2 * pw
    run = oh * wp  # the flat positions of the output rows, padding columns included
    extra = (kw - 1) * dw  # the last row's run reads this far past the image
    xp = np.zeros((c, n, hp * wp + extra), dtype=input.dtype)  # (C, N, flat padded image)
    xp[:, :, :hp * wp].reshape(c, n, hp, wp)[:, :, ph:ph + h, pw:pw + w] = \
        input.data.transpose(1, 0, 2, 3)
    # kernel element (i, j) reads the flat image from i*dh rows and j*dw columns on
    starts = [i * dh * wp + j * dw for i in range(kh) for j in range(kw)]
    cols = np.empty((c, kh * kw, n, run), dtype=input.dtype)
    for k, start in enumerate(starts):
        cols[:, k] = xp[:, :, start:start + run]
    cols = cols.reshape(c * kh * kw, n * run)
    w2 = weight.data.reshape(o, -1)  # (O, C*kh*kw): the same order as cols' rows
    out = (w2 @ cols).reshape(o, n, oh, wp)[..., :ow]  # drop the padding columns
    if bias is not None:
        out += bias.data[:, None, None, None]

    def backward(g):  # dcols = W^T g, folded back;  dW = g cols^T;  db = g summed
        gw = np.zeros((o, n, oh, wp), dtype=g.dtype)  # g, with zeros in the padding columns
        gw[..., :ow] = g.transpose(1, 0, 2, 3)
        gw = gw.reshape(o, n * run)
        gx = gweight = gb = None
        if input.requires_grad:
            gcols = (w2.T @ gw).reshape(c, kh * kw, n, run)
            gp = np.zeros_like(xp)
            for k, start in enumerate(starts):  # each column back where it was read
                gp[:, :, start:start + run] += gcols[:, k]
            gp = gp[:, :, :hp * wp].reshape(c, n, hp, wp)[:, :, ph:ph + h, pw:pw + w]
            gx = np.ascontiguousarray(gp.transpose(1, 0, 2, 3))
        if weight.requires_grad:
            gweight = (gw @ cols.T).reshape(weight.shape)
        if bias is not None and bias.requires_grad:
            gb = g.sum(axis=(0, 2, 3))
        return gx, gweight, gb
    parents = (input, weight) if bias is None else (input, weight, bias)
    return from_op(np.ascontiguousarray(out.transpose(1, 0, 2, 3)), 'conv2d', parents, backward,
                   saved=(weight,))  # cols is a copy of the input, made in the forward pass


def max_pool2d_fused(input, win):
    """nn.max_pool2d as one op: a running maximum over the kh*kw strided slices of the
    padded image (one slice per kernel element), remembering which slice won."""
    (ph, pw) = win.padding
    x = np.pad(input.data, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf) \
        if ph or pw else input.data
    slices = [tt._window_slice(win, i, j) for i in range(win.kernel[0]) for j in range(win.kernel[1])]
    out = x[(..., *slices[0])].copy()
    winner = np.zeros(out.shape, dtype=np.intp)  # which slice won: 0 .. kh*kw - 1
    for k, s in enumerate(slices[1:], 1):
        bigger = x[(..., *s)] > out  # strictly: the first maximum keeps a tie, as PyTorch
        np.copyto(out, x[(..., *s)], where=bigger)
        np.copyto(winner, k, where=bigger)

    def backward(g):  # g goes to the element that won each window
        gx = np.zeros(x.shape, dtype=g.dtype)
        for k, s in enumerate(slices):
            gx[(..., *s)] += np.where(winner == k, g, 0)
        h, w = input.shape[2:]
        return (gx[:, :, ph:ph + h, pw:pw + w],)
    return from_op(out, 'max_pool2d', (input,), backward)


# each output value: a multiply and an add per weight of its kernel (C*kh*kw of them)
tt.FLOPS['conv2d'] = lambda out, parents: 2 * out.data.size * parents[1].data[0].size
tt.RULES_IN_WORDS['conv2d'] = ("weight^T g, folded back into the image",
                               "g times the patches, summed over every position", "summed")
tt.RULES_IN_WORDS['max_pool2d'] = "to the maximum of each window, folded back into the image"
