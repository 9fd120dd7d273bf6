"""compress.py: a smaller model, PyTorch's way: pruning (torch.nn.utils.prune).

    prune.l1_unstructured(model.fc, 'weight', amount=0.5)   # the smallest half of |w| -> 0
    prune.global_unstructured([(m, 'weight') for m in linears],
                              pruning_method=prune.L1Unstructured, amount=0.8)
    prune.remove(model.fc, 'weight')                        # make it permanent

  1. pruning: a pruned parameter `weight` becomes two entries of the state_dict, the
     parameter `weight_orig` (what the optimizer trains) and the buffer `weight_mask` (0
     where pruned, 1 elsewhere), and `weight` is a plain tensor, weight_orig * weight_mask,
     set again before every forward by a forward pre-hook; so a pruned weight stays 0
     while the rest trains. Pruning a pruned weight again prunes among what is left.
  2. dynamic quantization (torch.ao.quantization.quantize_dynamic): each nn.Linear's
     weight stored as int8 (per-tensor symmetric: w ~ scale * q, q in [-128, 127]), its
     input quantized at every call (per-tensor affine, from that input's own range), the
     product summed in int32 and scaled back to float32: a quarter of the weights' bytes.

compat.py maps torch.nn.utils.prune and torch.ao.quantization here. Needs only NumPy, tinytorch.py and nn.py.
"""
import copy
import numbers

import numpy as np

import tinytorch as tt
import nn


# ---------------------------------------------------------------------------
# 1. Pruning
# ---------------------------------------------------------------------------
def _check_amount(amount):
    """amount: a fraction in [0, 1] of the entries, or a number of them (an int >= 0)."""
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
            not isinstance(amount, numbers.Integral) and not 0.0 <= float(amount) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a "
                         "non-negative integer")


def _how_many(amount, size):
    """The number of entries to prune: amount itself (an int), or round(amount * size)."""
    if isinstance(amount, numbers.Integral):
        if amount > size:
            raise ValueError(f"amount={amount} should be smaller than the number of parameters "
                             f"to prune={size}")
        return int(amount)
    return round(amount * size)


class L1Unstructured:
    """Prune the `amount` entries of smallest absolute value (their L1 norm)."""
    PRUNING_TYPE = 'unstructured'

    def __init__(self, amount):
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t, default_mask):
        """default_mask with the k entries of t of smallest |t| set to 0 (ties: the first)."""
        mask = default_mask.copy()
        k = _how_many(self.amount, t.size)
        mask.reshape(-1)[np.argsort(np.abs(t).reshape(-1), kind='stable')[:k]] = 0
        return mask

    @classmethod
    def apply(cls, module, name, amount, importance_scores=None):
        return _prune(module, name, cls(amount), importance_scores)


class RandomUnstructured(L1Unstructured):
    """Prune `amount` entries chosen at random (tinytorch's generator: tt.manual_seed)."""

    def compute_mask(self, t, default_mask):
        mask = default_mask.copy()
        k = _how_many(self.amount, t.size)
        prob = tt.rand(*t.shape, dtype=tt.float64).array  # the k largest draws are pruned
        mask.reshape(-1)[np.argsort(-prob.reshape(-1), kind='stable')[:k]] = 0
        return mask


class _ApplyMask:
    """The forward pre-hook of a pruned parameter: module.<name> = <name>_orig * <name>_mask."""

    def __init__(self, name):
        self._tensor_name = name

    def apply_mask(self, module):
        name = self._tensor_name
        return getattr(module, name + '_orig') * getattr(module, name + '_mask')

    def __call__(self, module, args):
        setattr(module, self._tensor_name, self.apply_mask(module))


def _hook_of(module, name):
    """(key, hook) of the pruning hook of module.<name>, or (None, None) if it is not pruned."""
    for key, hook in vars(module).get('_forward_pre_hooks', {}).items():
        if isinstance(hook, _ApplyMask) and hook._tensor_name == name:
            return key, hook
    return None, None


def _prune(module, name, method=None, importance_scores=None, mask=None):
    """Prune module.<name> with method's mask (or the mask given); on a pruned parameter,
    among the entries left."""
    _, hook = _hook_of(module, name)
    if hook is None:
        orig = getattr(module, name, None)
        if not isinstance(orig, nn.Parameter):
            raise AttributeError(f"Parameter '{name}' of module {type(module).__name__} has "
                                 "no parameter of that name to prune")
        old_mask = np.ones_like(orig.array)
    else:
        orig, old_mask = getattr(module, name + '_orig'), getattr(module, name + '_mask').array
    scores = orig.array if importance_scores is None else nn._array(importance_scores)
    if scores.shape != orig.shape:
        raise ValueError(f"importance_scores should have the same shape as parameter {name} "
                         f"of {type(module).__name__}: {scores.shape} != {tuple(orig.shape)}")
    if mask is None:
        mask = old_mask.copy()
        left = old_mask == 1  # pruning again prunes among what is left (PruningContainer's way)
        mask[left] = method.compute_mask(scores[left], old_mask[left])
    if hook is None:
        object.__delattr__(module, name)
        module.register_parameter(name + '_orig', orig)  # the same Parameter: optimizers keep it
        hook = _ApplyMask(name)
        module.register_forward_pre_hook(hook)
    module.register_buffer(name + '_mask', tt.tensor(mask))
    setattr(module, name, hook.apply_mask(module))
    return module


def l1_unstructured(module, name, amount, importance_scores=None):
    """torch.nn.utils.prune.l1_unstructured: prune `amount` (a fraction in [0, 1] or a count)
    of module.<name>'s entries, those of smallest absolute value."""
    return L1Unstructured.apply(module, name, amount, importance_scores)


def random_unstructured(module, name, amount):
    """torch.nn.utils.prune.random_unstructured: prune `amount` entries chosen at random."""
    return RandomUnstructured.apply(module, name, amount)


def global_unstructured(parameters, pruning_method, importance_scores=None, **kwargs):
    """Prune across several parameters at once, as one: with L1Unstructured, the smallest
    |w| of all of them together (a layer with small weights loses more)."""
    if getattr(pruning_method, 'PRUNING_TYPE', None) != 'unstructured':
        raise TypeError('Only "unstructured" PRUNING_TYPE supported for the `pruning_method`.')
    parameters = list(parameters)
    importance_scores = importance_scores or {}
    scores, masks = [], []
    for module, name in parameters:
        scores.append(nn._array(importance_scores.get((module, name), getattr(module, name)))
                      .reshape(-1))
        pruned = _hook_of(module, name)[1] is not None
        masks.append(getattr(module, name + '_mask').array.reshape(-1) if pruned
                     else np.ones(scores[-1].size, dtype=scores[-1].dtype))
    t, default = np.concatenate(scores), np.concatenate(masks)
    mask = default.copy()
    left = default == 1
    mask[left] = pruning_method(**kwargs).compute_mask(t[left], default[left])
    start = 0
    for module, name in parameters:
        shape = getattr(module, name).shape
        n = int(np.prod(shape))
        _prune(module, name, mask=mask[start:start + n].reshape(shape))
        start += n


def remove(module, name):
    """Make the pruning permanent: module.<name> is a Parameter again, holding the pruned
    values (the same Parameter object as <name>_orig); <name>_orig, <name>_mask and the
    hook are gone."""
    key, hook = _hook_of(module, name)
    if hook is None:
        raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before "
                         "pruning can be removed")
    orig = getattr(module, name + '_orig')
    orig.array = orig.array * getattr(module, name + '_mask').array
    object.__delattr__(module, name)
    object.__delattr__(module, name + '_orig')
    object.__delattr__(module, name + '_mask')
    module._buffer_names.remove(name + '_mask')
    module._non_persistent.discard(name + '_mask')
    del module._forward_pre_hooks[key]
    module.register_parameter(name, orig)
    return module


def is_pruned(module):
    """Whether module or a module in it has a pruned parameter."""
    return any(isinstance(h, _ApplyMask) for m in module.modules()
               for h in vars(m).get('_forward_pre_hooks', {}).values())


# ---------------------------------------------------------------------------
# 2. Dynamic quantization
# ---------------------------------------------------------------------------
qint8 = np.dtype(np.int8)  # torch.qint8: what the weights are stored in


def _input_qparams(x, qmin=0, qmax=127):
    """(scale, zero point) of an input, from its own range: x ~ scale * (q - zero_point), q
    in [qmin, qmax] (uint8 with one bit less, PyTorch's reduce_range on x86), 0 exact.
    FBGEMM's ChooseQuantizationParams: the zero point from whichever end errs less."""
    lo, hi = np.float32(min(x.min(), 0.0)), np.float32(max(x.max(), 0.0))
    scale = np.float32((np.float64(hi) - lo) / (qmax - qmin)) or np.float32(0.1)
    from_min, from_max = qmin - lo / np.float64(scale), qmax - hi / np.float64(scale)
    err_min = abs(qmin) + abs(lo / np.float64(scale))
    err_max = abs(qmax) + abs(hi / np.float64(scale))
    zero = from_min if err_min < err_max else from_max
    return scale, int(np.clip(np.rint(zero), qmin, qmax))


class DynamicQuantizedLinear(nn.Module):
    """torch.ao.nn.quantized.dynamic.Linear: y = x W^T + b with W stored in int8.

    The weight: scale_w = max|W| / 127.5 (PyTorch's symmetric int8 observer), W_q =
    round(W / scale_w) in [-128, 127]. At each call the input x gets its own scale_x and
    zero point z (its range over [0, 127]), x_q = round(x / scale_x) + z, and
        y = scale_x * scale_w * (x_q W_q^T - z * (row sums of W_q)) + b,
    the integer product summed in int32 (no gradient: an inference module)."""

    def __init__(self, linear):
        w = linear.weight.detach().array.astype(np.float32)
        scale = max(float(np.abs(w).max()) / 127.5, float(np.finfo(np.float32).eps))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        inv = np.float32(1.0) / np.float32(scale)  # PyTorch multiplies by the float32 inverse
        self.register_buffer('weight', tt.tensor(np.clip(np.rint(w * inv), -128, 127)
                                                 .astype(qint8)))
        self.register_buffer('weight_scale', tt.tensor(np.float32(scale)))
        self.register_buffer('bias', None if linear.bias is None else
                             tt.tensor(linear.bias.detach().array.astype(np.float32)))

    def forward(self, x):
        xs = x.detach().array.astype(np.float32)
        scale_x, zero = _input_qparams(xs)
        xq = np.clip(np.rint(xs * (np.float32(1.0) / scale_x)) + zero, 0, 127).astype(np.int32)
        wq = self.weight.array.astype(np.int32)
        acc = xq.reshape(-1, self.in_features) @ wq.T - zero * wq.sum(axis=1)  # int32 sums
        y = acc.astype(np.float32) * (scale_x * self.weight_scale.array)
        if self.bias is not None:
            y = y + self.bias.array
        return tt.tensor(y.reshape(xs.shape[:-1] + (self.out_features,)))

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype=torch.qint8, qscheme=torch.per_tensor_symmetric")


def quantize_dynamic(model, qconfig_spec=None, dtype=qint8, mapping=None, inplace=False):
    """torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8): a copy of
    model (the model itself with inplace=True) with every nn.Linear replaced by a
    DynamicQuantizedLinear. Only nn.Linear and qint8 are supported (one line otherwise)."""
    kinds = set(qconfig_spec) if qconfig_spec is not None else {nn.Linear}
    if kinds - {nn.Linear} or np.dtype(dtype) != qint8:
        raise NotImplementedError("quantize_dynamic: tinytorch quantizes nn.Linear to "
                                  "torch.qint8 only (as PyTorch's default)")
    model = model if inplace else copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:  # replaced where it stands: a Sequential keeps its order
                parent.add_module(name, DynamicQuantizedLinear(child))
    return model


def model_bytes(model):
    """The bytes of a model's state: its parameters and buffers (a tensor shared by two
    modules counted once)."""
    seen = {}
    for _, t in list(model.named_parameters()) + list(model.named_buffers()):
        seen[id(t)] = t.array.nbytes
    return sum(seen.values())
