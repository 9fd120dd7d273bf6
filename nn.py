"""nn.py: modules, layers, losses, initialisers and checkpoints, on top of tinytorch.

  1. Parameter and Module (parameters, train/eval, state_dict, repr); containers
     (Sequential, ModuleList, ModuleDict, ...) and DataParallel (on the CPU: the module)
  2. layers: Linear, LazyLinear, Embedding, LayerNorm, Dropout, Dropout2d, activations
     (ELU, SELU, Hardtanh, ReLU6, Softmax, ...); pad, ReflectionPad2d, normalize,
     cosine_similarity; for images Conv1d, Conv2d, ConvTranspose2d, MaxPool1d/2d,
     AvgPool2d, AdaptiveAvgPool2d, BatchNorm1d/2d, InstanceNorm2d, Flatten; resizing
     them: interpolate (nearest, linear, bilinear, trilinear), Upsample, PixelShuffle
  3. recurrent layers: the RNN, LSTM and GRU cells (a few lines of linear, sigmoid and
     tanh), and RNN, LSTM, GRU (a loop of the cell over time); batches of sequences of
     different lengths (pad_sequence, PackedSequence, pack_padded_sequence, ...)
  4. attention and the Transformer as PyTorch's modules: scaled_dot_product_attention,
     MultiheadAttention, TransformerEncoderLayer / DecoderLayer, TransformerEncoder /
     Decoder, Transformer
  5. losses: mse_loss, l1_loss, smooth_l1_loss, huber_loss, cross_entropy (fused),
     nll_loss, kl_div, binary_cross_entropy (BCELoss), binary_cross_entropy_with_logits
  6. initialisers (nn.init.normal_, xavier_uniform_, ...)
  7. checkpoints: save / load in NumPy's .npz format or as .safetensors (never pickle),
     written atomically
  8. speed: conv2d and max_pool2d as single ops (the same numbers as section 2's), and
     one direction of a recurrent layer as one op (the same numbers as section 3's)

Needs only NumPy and tinytorch.py. Importing it changes one thing outside it: tt.load
then gives an nn.Parameter for a parameter in a file (tt._TENSOR_CLASSES, section 1).
"""
import copy
import functools
import math
import sys
import types
import warnings
from collections import OrderedDict, namedtuple
from statistics import NormalDist

import tinytorch as tt
import numpy as np

from tinytorch import Tensor, from_op, no_grad, sum_last, sum_leading

functional = sys.modules[__name__]  # nn is also torch.nn.functional: F.relu is nn.relu


# ---------------------------------------------------------------------------
# 1. Parameter and Module
# ---------------------------------------------------------------------------
class Parameter(Tensor):
    """A Tensor that is a learnable part of a Module: it always requires grad."""

    def __init__(self, data=None, requires_grad=True):
        data = tt.empty(0) if data is None else data  # PyTorch's: an empty parameter
        super().__init__(data.array if isinstance(data, Tensor) else data,
                         requires_grad=requires_grad)

    def __repr__(self):
        return 'Parameter containing:\n' + super().__repr__()


# The one thing importing nn.py does outside this file: tinytorch.py's checkpoint reader
# (tt.load, tt.save) is told that a tensor its files call 'Parameter' is this class. Without
# nn.py such a tensor loads as a plain Tensor that requires grad.
tt._TENSOR_CLASSES['Parameter'] = Parameter


class Module:
    """Base class of every layer and model.

    Assigning a Parameter or a Module as an attribute registers it (PyTorch code calls
    super().__init__() first; here it is optional): the tree is the attributes, in the
    order they were first set. parameters(), buffers(), modules() and their named_
    twins are generators that walk it as PyTorch's do: a module's own parameters, then
    each sub-module's, depth first, names joined by dots ('blocks.0.attn.weight').
    """
    training = True

    def __call__(self, *args, **kwargs):
        for hook in list(vars(self).get('_forward_pre_hooks', {}).values()):
            result = hook(self, args)  # pruning's hook sets the masked weight here
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        return self.forward(*args, **kwargs)

    def register_forward_pre_hook(self, hook):
        """hook(module, args) runs before every forward; if it returns something, that is the
        forward's new args. Returns a handle: handle.remove() takes the hook off."""
        hooks = self.__dict__.setdefault('_forward_pre_hooks', OrderedDict())
        key = max(hooks, default=-1) + 1
        hooks[key] = hook
        return RemovableHandle(hooks, key)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __setattr__(self, name, value):
        old = vars(self).get(name)
        if isinstance(old, Parameter) and isinstance(value, Tensor) and not isinstance(value, Parameter):
            raise TypeError(f"cannot assign a Tensor as parameter '{name}' (a Parameter or None "
                            f"expected); wrap it: nn.Parameter(t), or copy into it: "
                            f"self.{name}.data.copy_(t)")
        object.__setattr__(self, name, value)

    # -- registering ------------------------------------------------------------
    def _new_name(self, name, what):
        if not isinstance(name, str) or not name or '.' in name:
            raise KeyError(f"{what} name must be a non-empty string without '.', got {name!r}")
        if hasattr(self, name) and name not in vars(self):  # a method or a class attribute
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name, param):
        """self.name = param, checked as PyTorch checks it (None is allowed: no parameter)."""
        self._new_name(name, 'parameter')
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter "
                            f"'{name}' (nn.Parameter or None required)")
        object.__setattr__(self, name, param)

    def add_module(self, name, module):
        """self.name = module, checked as PyTorch checks it."""
        self._new_name(name, 'module')
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        object.__setattr__(self, name, module)

    register_module = add_module

    def register_buffer(self, name, tensor, persistent=True):
        """A tensor that is state but not learned (BatchNorm's running mean): in state_dict
        and checkpoints (unless persistent=False), never in parameters(), so no optimizer
        touches it; Module.to and .double() cast it."""
        if name not in vars(self).get('_buffer_names', ()):
            self._new_name(name, 'buffer')
            if name in vars(self):
                raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            f"(a Tensor or None required)")
        names = self.__dict__.setdefault('_buffer_names', [])
        if name not in names:
            names.append(name)
        transient = self.__dict__.setdefault('_non_persistent', set())
        (transient.discard if persistent else transient.add)(name)
        object.__setattr__(self, name, tensor)

    # -- the module tree: generators, as PyTorch's -----------------------------
    def _own(self, kind):
        """This module's own (name, value) pairs of one kind, None values left out."""
        if kind == 'buffers':
            return [(n, getattr(self, n)) for n in vars(self).get('_buffer_names', ())
                    if getattr(self, n, None) is not None]
        cls = {'modules': Module, 'parameters': Parameter}[kind]
        return [(n, v) for n, v in vars(self).items() if isinstance(v, cls)]

    def named_children(self):
        """(name, module) of the direct sub-modules; one shared twice is listed once."""
        seen = set()
        for name, child in self._own('modules'):
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self):
        for _, child in self.named_children():
            yield child

    def named_modules(self, memo=None, prefix='', remove_duplicate=True):
        """(dotted name, module) for this module ('' by default) and every one below it,
        depth first; a module reached twice is listed once unless remove_duplicate=False."""
        memo = set() if memo is None else memo
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, child in self._own('modules'):
            yield from child.named_modules(memo, prefix + ('.' if prefix else '') + name,
                                           remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def _named_members(self, kind, prefix, recurse, remove_duplicate):
        seen = set()  # ids: a tensor shared by two modules (weight tying) is listed once
        tree = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse
                else [(prefix, self)])
        for module_prefix, module in tree:
            for name, value in module._own(kind):
                if id(value) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield module_prefix + ('.' if module_prefix else '') + name, value

    def named_parameters(self, prefix='', recurse=True, remove_duplicate=True):
        """(dotted name, parameter) pairs, as PyTorch names them ('blocks.0.attn.weight');
        a parameter shared by two modules (weight tying) is listed once."""
        return self._named_members('parameters', prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix='', recurse=True, remove_duplicate=True):
        return self._named_members('buffers', prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        """model.get_submodule('blocks.0.attn'): the module at that dotted path."""
        module = self
        for item in target.split('.') if target else []:
            if not hasattr(module, item):
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module

    def get_parameter(self, target):
        prefix, _, name = target.rpartition('.')
        p = getattr(self.get_submodule(prefix), name, None)
        if not isinstance(p, Parameter):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return p

    def num_parameters(self):
        return int(np.sum([p.array.size for p in self.parameters()]))

    def apply(self, fn):
        """fn(m) for every sub-module, then for self (model.apply(init_weights)); returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- modes and gradients --------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for child in self.children():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Forget the gradients: .grad = None, or, with set_to_none=False, zeros written
        into the existing .grad tensors."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    # -- device and dtype -----------------------------------------------------
    def _cast(self, dtype):
        """Every floating parameter and buffer (and gradient) to dtype, in place: the same
        Parameter objects, so an optimizer made before still holds them (as PyTorch)."""
        for m in self.modules():
            for _, t in m._own('parameters') + m._own('buffers'):
                if t.dtype.kind == 'f' and t.dtype != dtype:
                    t.array = t.array.astype(dtype)
                    if t.grad is not None:
                        t.grad.array = t.grad.array.astype(dtype)
        return self

    def to(self, *args, **kwargs):
        """model.to('cpu'), .to(device), .to(dtype), .to(device, dtype), .to(tensor):
        tinytorch has one device, the CPU, so only a dtype changes anything (floating
        parameters and buffers; integer ones stay, as in PyTorch). Returns self."""
        device, dtype = kwargs.pop('device', None), kwargs.pop('dtype', None)
        kwargs.pop('non_blocking', None)
        if kwargs:
            raise TypeError(f"to() got an unexpected keyword argument '{next(iter(kwargs))}'")
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif _is_dtype(a):
                dtype = a
            elif not isinstance(a, bool):  # non_blocking given by position
                device = a
        if device is not None:
            _check_cpu(device, 'Module.to')
        if dtype is None:
            return self
        dtype = np.dtype(dtype)
        if dtype.kind not in 'fc':
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but "
                            f"got desired dtype={dtype}")
        return self._cast(dtype)

    def cpu(self):
        return self

    def cuda(self, device=None):
        _check_cpu('cuda', 'Module.cuda')

    def float(self):
        return self._cast(tt.float32)

    def double(self):
        return self._cast(tt.float64)

    def half(self):
        return self._cast(tt.float16)

    # -- state_dict -----------------------------------------------------------
    def _state(self, prefix=''):
        """(dotted name, tensor) for state_dict, as PyTorch orders it: a module's own
        parameters, then its own persistent buffers, then each sub-module's. A shared
        tensor or module is listed under each of its names."""
        transient = vars(self).get('_non_persistent', ())
        for name, t in self._own('parameters') + self._own('buffers'):
            if name not in transient:
                yield prefix + name, t
        for name, child in self._own('modules'):
            yield from child._state(prefix + name + '.')

    def state_dict(self, destination=None, prefix='', keep_vars=False):
        """Dotted name -> each parameter and buffer, detached: tensors outside the graph
        that share the module's memory, as PyTorch's (keep_vars=True: the tensors
        themselves). Copy them to keep a snapshot. Keys and order are PyTorch's."""
        out = OrderedDict() if destination is None else destination
        for name, t in self._state(prefix):
            out[name] = t if keep_vars else t.detach()
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy arrays into the parameters and buffers. Missing and unexpected keys are an
        error with strict=True, shape mismatches always: every problem is listed in one
        error and nothing is changed. Returns (missing_keys, unexpected_keys)."""
        own = OrderedDict(self._state())
        optional = {prefix + ('.' if prefix else '') + name  # state older checkpoints lack
                    for prefix, m in self.named_modules(remove_duplicate=False)
                    for name in getattr(m, '_optional_state', ())}
        missing = [k for k in own if k not in state_dict and k not in optional]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if strict and unexpected:
            problems.append("Unexpected key(s) in state_dict: " +
                            ", ".join(f'"{k}"' for k in unexpected))
        problems += [f"size mismatch for {k}: copying a param with shape {np.shape(_array(v))} "
                     f"from checkpoint, the shape in current model is {tuple(own[k].shape)}"
                     for k, v in state_dict.items()
                     if k in own and tuple(np.shape(_array(v))) != tuple(own[k].shape)]
        if problems:
            raise StateDictError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                                 + "\n\t".join(problems))
        with no_grad():
            for k, v in state_dict.items():
                if k in own:
                    own[k].copy_(_array(v).astype(own[k].dtype))
        return _IncompatibleKeys(missing, unexpected)

    # -- repr -----------------------------------------------------------------
    def extra_repr(self):
        return ''

    def __repr__(self):
        """As PyTorch prints a model (lookinside.summary counts its parameters)."""
        extra = self.extra_repr().split('\n') if self.extra_repr() else []
        children = [f"({name}): " + repr(child).replace('\n', '\n  ')
                    for name, child in self._own('modules')]
        if len(extra) == 1 and not children:
            return f"{type(self).__name__}({extra[0]})"
        body = ''.join('\n  ' + line for line in extra + children)
        return f"{type(self).__name__}({body}\n)" if body else f"{type(self).__name__}()"


class RemovableHandle:
    """What register_forward_pre_hook returns: remove() takes the hook off (again: nothing)."""

    def __init__(self, hooks, key):
        self.hooks_dict_ref, self.id = hooks, key

    def remove(self):
        self.hooks_dict_ref.pop(self.id, None)


class StateDictError(RuntimeError, KeyError):
    """load_state_dict's error: a RuntimeError as PyTorch's, and a KeyError as this
    library raised before (train_charlm.py catches that)."""
    __str__ = RuntimeError.__str__


class _IncompatibleKeys(namedtuple('IncompatibleKeys', ['missing_keys', 'unexpected_keys'])):
    """load_state_dict's result, as PyTorch's: keys = model.load_state_dict(sd, strict=False)."""

    def __repr__(self):
        return '<All keys matched successfully>' if not any(self) else super().__repr__()


def _is_dtype(x):
    """tt.float32 or np.float32 (not a device, although a NumPy dtype has a .type too)."""
    return isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic))


def _check_cpu(device, op):
    """None, 'cpu', 'cpu:0' or a device object whose .type is 'cpu' pass; anything else
    ('cuda', 'mps', a GPU's number) is one line."""
    if device is None:
        return
    kind = device if isinstance(device, str) else getattr(device, 'type', device)
    if not (isinstance(kind, str) and kind.split(':')[0] == 'cpu'):
        raise RuntimeError(f"{op}({device!r}): tinytorch runs on NumPy on the CPU; for a GPU, "
                           f"export the model (see export.py)")


def _factory(device, dtype, op):
    """PyTorch's factory arguments, which every module with parameters takes: the device
    (the CPU only) and the dtype of its parameters (None: tt.get_default_dtype())."""
    _check_cpu(device, op)
    return dtype


def _refuse_if(flag, op, what):
    """A PyTorch argument tinytorch cannot honour, given: one line that says so."""
    if flag:
        raise NotImplementedError(f"{op}: {what} is not supported by tinytorch")


def _array(v):
    return v.array if isinstance(v, Tensor) else np.asarray(v)


# Containers. Each keeps its items as attributes ('0', '1', ... for the lists, the keys
# for the dicts), so the module tree, state_dict and repr need nothing special for them.
class _ListOf(Module):
    """The list operations of Sequential, ModuleList and ParameterList."""
    _kind = 'modules'  # what it holds: 'modules' or 'parameters'

    def _set(self, name, value):
        self.add_module(name, value)

    def _items(self):
        return [v for _, v in self._own(self._kind)]

    def _renumber(self, items):
        for name, _ in self._own(self._kind):
            delattr(self, name)
        for i, value in enumerate(items):
            self._set(str(i), value)

    def _position(self, i):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {type(self).__name__} of length {n}")
        return i % n

    def __len__(self):
        return len(self._own(self._kind))

    def __iter__(self):
        return iter(self._items())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return type(self)._of(self._own(self._kind)[i])
        return self._items()[self._position(i)]

    def __setitem__(self, i, value):
        self._set(self._own(self._kind)[self._position(i)][0], value)

    def __delitem__(self, i):
        items = self._items()
        del items[i if isinstance(i, slice) else self._position(i)]
        self._renumber(items)

    def append(self, value):
        self._set(str(len(self)), value)
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def insert(self, index, value):
        items = self._items()
        items.insert(index, value)
        self._renumber(items)

    def pop(self, i=-1):
        value = self[i]
        del self[i]
        return value

    def __iadd__(self, values):
        return self.extend(values)

    def __dir__(self):  # the numbered attributes are not for tab completion, as in PyTorch
        return [k for k in super().__dir__() if not k.isdigit()]


class Sequential(_ListOf):
    """Modules applied one after the other: Sequential(a, b, c)(x) = c(b(a(x))).
    Sequential(OrderedDict(name=module, ...)) names them."""

    def __init__(self, *layers):
        if len(layers) == 1 and isinstance(layers[0], OrderedDict):
            for name, layer in layers[0].items():
                self.add_module(name, layer)
        else:
            for i, layer in enumerate(layers):
                self.add_module(str(i), layer)

    _of = classmethod(lambda cls, pairs: cls(OrderedDict(pairs)))  # a slice keeps the names

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


class ModuleList(_ListOf):
    """A list of modules whose parameters the model owns (a plain Python list would
    hide them from parameters() and state_dict)."""

    def __init__(self, modules=None):
        self.extend(modules or ())

    _of = classmethod(lambda cls, pairs: cls(v for _, v in pairs))  # a slice is renumbered

    def __repr__(self):
        """As PyTorch's: a run of modules that print alike prints once, as
        `(0-3): 4 x Block(...)`."""
        runs = []  # [first index, last index, text]
        for i, m in enumerate(self):
            text = repr(m).replace('\n', '\n  ')
            if runs and runs[-1][2] == text:
                runs[-1][1] = i
            else:
                runs.append([i, i, text])
        lines = [f"({a}): {t}" if a == b else f"({a}-{b}): {b - a + 1} x {t}" for a, b, t in runs]
        return f"{type(self).__name__}(" + ''.join('\n  ' + line for line in lines) + "\n)" \
            if lines else f"{type(self).__name__}()"


class ParameterList(_ListOf):
    """A list of parameters that the model owns (a tensor put in becomes a Parameter)."""
    _kind = 'parameters'

    def __init__(self, values=None):
        self.extend(values or ())

    _of = classmethod(lambda cls, pairs: cls(v for _, v in pairs))  # a slice is renumbered

    def _set(self, name, value):
        self.register_parameter(name, _as_parameter(value))

    def extra_repr(self):
        return '\n'.join(f"  ({k}): {_describe(p)}" for k, p in self._own('parameters'))


class _DictOf(Module):
    """The dict operations of ModuleDict and ParameterDict."""
    _kind = 'modules'

    def _set(self, name, value):
        self.add_module(name, value)

    def _init(self, values):
        if values is not None:
            self.update(values)

    def __getitem__(self, key):
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key, value):
        self._set(key, value)

    def __delitem__(self, key):
        if key not in self:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self):
        return len(self._own(self._kind))

    def __iter__(self):
        return iter(self.keys())

    def __contains__(self, key):
        return key in self.keys()

    def keys(self):
        return OrderedDict(self._own(self._kind)).keys()

    def items(self):
        return OrderedDict(self._own(self._kind)).items()

    def values(self):
        return OrderedDict(self._own(self._kind)).values()

    def get(self, key, default=None):
        return self[key] if key in self else default

    def update(self, values):
        for key, value in (values.items() if hasattr(values, 'items') else values):
            self[key] = value

    def pop(self, key):
        value = self[key]
        del self[key]
        return value

    def clear(self):
        for key in list(self.keys()):
            del self[key]


class ModuleDict(_DictOf):
    """Named modules whose parameters the model owns: ModuleDict(dict(wte=..., h=...)),
    then self.transformer.wte or self.transformer['wte'] (nanoGPT's layout)."""

    def __init__(self, modules=None):
        self._init(modules)


class ParameterDict(_DictOf):
    """Named parameters that the model owns (a tensor put in becomes a Parameter)."""
    _kind = 'parameters'

    def __init__(self, parameters=None):
        self._init(parameters)

    def _set(self, name, value):
        self.register_parameter(name, _as_parameter(value))

    def extra_repr(self):
        return '\n'.join(f"  ({k}): {_describe(p)}" for k, p in self._own('parameters'))


class DataParallel(Module):
    """nn.DataParallel on a machine without a GPU: as PyTorch there, it calls its module in
    this process. The model is self.module, so state_dict keys start with 'module.' as in
    PyTorch (a checkpoint saved from one loads into the other)."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        self.module = module
        self.device_ids = []  # PyTorch's, when there is no GPU

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


def _as_parameter(value):
    return Parameter(value) if isinstance(value, Tensor) and not isinstance(value, Parameter) \
        else value


def _describe(p):
    """'Parameter containing: [torch.float32 of size 3x4]', as PyTorch's container reprs."""
    return f"Parameter containing: [torch.{p.dtype} of size {'x'.join(map(str, p.shape))}]"


# ---------------------------------------------------------------------------
# 2. Layers
# ---------------------------------------------------------------------------
@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def linear(input, weight, bias=None):
    """y = x W^T + b as one op (W is (out, in), as in PyTorch). Leading dims of x are
    folded into rows, so the whole batch is a single 2-D matrix multiply."""
    x = input
    tt._same_dtype('linear', input=x, weight=weight, bias=bias)
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} has {x.shape[-1]} features, "
                         f"but the weight of shape {tuple(weight.shape)} expects {weight.shape[1]}")
    if bias is not None and bias.shape not in ((weight.shape[0],), (1,), ()):
        raise ValueError(f"linear: bias of shape {tuple(bias.shape)} does not fit a weight of "
                         f"shape {tuple(weight.shape)}: it must be ({weight.shape[0]},), (1,) or ()")
    rows = math.prod(x.shape[:-1])  # not -1: NumPy cannot infer it when a dim is 0
    x2 = x.array.reshape(rows, x.shape[-1])
    out = x2 @ weight.array.T
    if bias is not None:
        out += bias.array  # a bias of shape (1,) or () broadcasts, as in PyTorch
    out = out.reshape(x.shape[:-1] + (weight.shape[0],))

    def backward(g, xs=x.array.shape, outs=weight.array.shape[0],
                 bs=None if bias is None else bias.array.shape):
        """d(x W^T + b)/dx: g @ W
        d(x W^T + b)/dW: g^T @ x  (summed over all rows)
        d(x W^T + b)/db = 1  (g summed over all rows: b was broadcast)"""
        g2 = g.reshape(rows, outs)
        gx = (g2 @ weight.array).reshape(xs) if x.requires_grad else None
        gw = g2.T @ x2 if weight.requires_grad else None
        if bias is None:
            return gx, gw
        return gx, gw, tt.unbroadcast(sum_leading(g2), bs)  # and over (1,) or ()
    parents = (x, weight) if bias is None else (x, weight, bias)
    # dx reads the weight and dW reads x: guard only what a gradient needs, as PyTorch does
    saved = ((weight,) if x.requires_grad else ()) + ((x,) if weight.requires_grad else ())
    return from_op(out, 'linear', parents, backward, saved=saved)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        dtype = _factory(device, dtype, type(self).__name__)
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


class LazyLinear(Linear):
    """A Linear whose in_features is read from its first input (make the optimizer after
    one forward pass, as in PyTorch)."""

    def __init__(self, out_features, bias=True, device=None, dtype=None):
        dtype = _factory(device, dtype, 'LazyLinear')
        self.in_features, self.out_features = 0, out_features
        self.weight = Parameter(tt.zeros(out_features, 0, dtype=dtype))  # made on first use
        self.bias = Parameter(tt.zeros(out_features, dtype=dtype)) if bias else None

    def forward(self, x):
        if self.in_features == 0:
            self.in_features = x.shape[-1]
            self.weight = Parameter(tt.zeros(self.out_features, self.in_features,
                                             dtype=self.weight.dtype))
            self.reset_parameters()
        return super().forward(x)


class NonDynamicallyQuantizableLinear(Linear):
    """A Linear under PyTorch's name for MultiheadAttention's out_proj (PyTorch marks it so
    that dynamic quantization leaves it alone); here it is a Linear, and prints its name."""


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of weight picked by integer indices: weight[input]. Its backward adds each
    position's gradient into its row, so a token that appears twice gets both.
    PyTorch's options: the row padding_idx gets no gradient; max_norm first rescales, in
    place, each row it reads whose norm_type-norm exceeds max_norm; scale_grad_by_freq
    divides each row's gradient by the number of times the batch names it."""
    idx = input if isinstance(input, Tensor) else tt.tensor(input)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    _refuse_if(sparse, 'embedding', 'sparse=True (sparse gradients)')
    n = weight.shape[0]
    if idx.array.size and (idx.array.min() < 0 or idx.array.max() >= n):
        bad = idx.array[(idx.array < 0) | (idx.array >= n)][0]
        raise IndexError(f"embedding: index {bad} is out of range for an embedding of "
                         f"{n} rows")
    if padding_idx is not None:
        padding_idx = _padding_row(padding_idx, n, 'embedding')
    if max_norm is not None:
        _embedding_renorm_(weight, idx, max_norm, norm_type)
    if padding_idx is None and not scale_grad_by_freq:
        return weight[idx]  # getitem's rule adds the rows up
    rows = idx.array.reshape(-1).copy()

    def backward(g):
        """d weight[idx]/d weight = 1 per read of a row (0: padding_idx; 1/count: by freq)"""
        g = g.reshape(rows.size, -1)
        if scale_grad_by_freq:
            g = g / np.bincount(rows, minlength=n)[rows][:, None].astype(g.dtype)
        gw = np.zeros(weight.shape, dtype=g.dtype)
        np.add.at(gw, rows, g)
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw,)
    return from_op(weight.array[rows].reshape(idx.shape + weight.shape[1:]), 'embedding',
                   (weight,), backward)


def _padding_row(padding_idx, n, op):
    """padding_idx as a row number (PyTorch's: -1 is the last row); out of range, one line."""
    if not -n <= padding_idx < n:
        raise AssertionError(f"{op}: padding_idx {padding_idx} must be within num_embeddings "
                             f"({n})")
    return padding_idx % n


def _embedding_renorm_(weight, idx, max_norm, norm_type):
    """PyTorch's max_norm: each row idx names whose norm exceeds max_norm is scaled, in
    place and outside the graph, to max_norm (times max_norm / (norm + 1e-7))."""
    with no_grad():
        rows = np.unique(idx.array)
        w = weight.array[rows]
        norm = np.linalg.norm(w, ord=norm_type, axis=1) if norm_type != 2 else \
            np.sqrt((w * w).sum(1))
        big = norm > max_norm
        if big.any():
            scaled = w[big] * (max_norm / (norm[big] + 1e-7))[:, None].astype(w.dtype)
            weight.array[rows[big]] = scaled
            tt._bump(weight)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        dtype = _factory(device, dtype, 'Embedding')
        _refuse_if(sparse, 'Embedding', 'sparse=True (sparse gradients)')
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = None if padding_idx is None else \
            _padding_row(padding_idx, num_embeddings, 'Embedding')
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = Parameter(tt.randn(num_embeddings, embedding_dim, dtype=dtype),
                                    requires_grad=not _freeze)  # N(0, 1)
            if self.padding_idx is not None:  # PyTorch's: the padding row starts at 0
                with no_grad():
                    self.weight[self.padding_idx].fill_(0)
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight of shape {tuple(_weight.shape)} does not "
                                 f"match num_embeddings, embedding_dim ({num_embeddings}, "
                                 f"{embedding_dim})")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is embeddings (num, dim), such as word vectors trained
        elsewhere; freeze=True (the default, as PyTorch's) keeps it fixed."""
        if embeddings.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-dimensional, got "
                             f"shape {tuple(embeddings.shape)}")
        return cls(*embeddings.shape, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                   sparse, _weight=embeddings.detach().clone(), _freeze=freeze)

    def forward(self, input):
        return embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                         self.scale_grad_by_freq, self.sparse)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        for name, default in (('padding_idx', None), ('max_norm', None), ('norm_type', 2.0),
                              ('scale_grad_by_freq', False), ('sparse', False)):
            if getattr(self, name) != default:  # PyTorch shows what is not the default
                s += f", {name}={getattr(self, name)}"
        return s


@np.errstate(invalid='ignore')  # an inf in a row: inf - inf = nan, silently, as PyTorch's
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Fused layer norm: y = (x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) dims, with a hand-derived backward (one node, not ten)."""
    x = input
    normalized_shape = tuple(normalized_shape) if not isinstance(normalized_shape, int) \
        else (normalized_shape,)
    k = len(normalized_shape)
    tt._same_dtype('layer_norm', input=x, weight=weight, bias=bias)
    if tuple(x.shape[x.ndim - k:]) != normalized_shape:
        raise ValueError(f"layer_norm: input of shape {tuple(x.shape)} does not end with the "
                         f"normalized shape {normalized_shape}")
    n = math.prod(normalized_shape)
    if n == 0:  # nothing to normalize (and a mean over 0 features would warn)
        return x * 1.0 if weight is None else x * weight + (0 if bias is None else bias)
    rows = x.array.reshape(-1, n)  # one row per normalized group
    # the mean as first + mean(x - first): equal values give exactly 0 (as PyTorch's
    # running mean; sum / n of three 2.8s is 2.8000000000000003)
    first = np.where(np.isfinite(rows[:, :1]), rows[:, :1], 0)  # (an inf first: no shift)
    xhat = rows - first
    shift = sum_last(xhat) / n
    xhat -= shift
    mean = first + shift
    with np.errstate(over='ignore'):  # a variance too large for the dtype: NaN, as PyTorch's
        var = sum_last(xhat * xhat) / n
    rstd = 1.0 / np.sqrt(np.where(np.isinf(var), np.nan, var) + eps)  # 1 / sqrt(var + eps)
    xhat *= rstd
    out = xhat.copy() if weight is None else xhat * weight.array.reshape(n)
    out += 0 if bias is None else bias.array.reshape(n)  # + 0: a -0.0 is +0.0, as PyTorch's

    bias_shape = None if bias is None else bias.array.shape  # (as it is now: unsqueeze_)

    def backward(g):
        """d layer_norm/dx: rstd * (g*w - mean(g*w) - x_hat * mean(g*w*x_hat))
        d layer_norm/d weight: g * x_hat  (summed over rows)
        d layer_norm/d bias = 1  (g summed over rows)"""
        g = g.reshape(-1, n)
        gw = g if weight is None else g * weight.array.reshape(n)  # d loss / d xhat
        with np.errstate(invalid='ignore'):  # inf - inf and 0 * inf give nan, as PyTorch's
            sum_gw, sum_gwx = sum_last(gw), sum_last(gw * xhat)
            # the docstring's form, on one new array: (gw - xhat mean(gw xhat) - mean(gw)) rstd
            dx = gw - xhat * (sum_gwx / n)
            dx -= sum_gw / n
            dx *= rstd
            bad = ~np.isfinite(sum_gw + sum_gwx)  # rows where an inf or nan arrived:
            if bad.any():  # PyTorch's arrangement there, for its nan and inf (a whole row of
                # nan where a weight is inf): rstd gw + b x + c with, per row,
                # b = (sum(gw) mean - sum(gw x)) rstd^3 / n and c = -b mean - sum(gw) rstd / n
                b = (sum_gw * mean - sum_last(gw * rows)) * rstd ** 3 / n
                c = -b * mean - sum_gw * rstd / n
                dx = np.where(bad, gw * rstd + b * rows + c, dx)
            grads = [dx.reshape(x.shape)]
            if weight is not None:
                grads.append(sum_leading(g * xhat).reshape(weight.shape))
        if bias is not None:
            grads.append(sum_leading(g).reshape(bias_shape))
        return tuple(grads)
    parents = (x,) + ((weight,) if weight is not None else ()) + ((bias,) if bias is not None else ())
    return from_op(out.reshape(x.shape), 'layer_norm', parents, backward,
                   saved=(x,) if weight is None else (x, weight))  # backward reads both, as PyTorch's


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        dtype = _factory(device, dtype, 'LayerNorm')
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Parameter(tt.ones(self.normalized_shape, dtype=dtype)) \
            if elementwise_affine else None
        self.bias = Parameter(tt.zeros(self.normalized_shape, dtype=dtype)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine="
                f"{self.elementwise_affine}, bias={self.bias is not None}")


def dropout(input, p=0.5, training=True, inplace=False):
    """Inverted dropout: zero each element with probability p and scale the rest by
    1/(1-p), so the expected value is unchanged and eval mode is the identity."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return input
    mask = dropout_mask(input.shape, p, input.dtype)

    def backward(g):
        """d dropout(x)/dx = mask: 0 where dropped, 1/(1-p) where kept"""
        return (g * mask,)
    out = from_op(input.array * mask, 'dropout', (input,), backward)
    return _activation_result(input, out, 'dropout', inplace)


def dropout_mask(shape, p, dtype):
    """0 with probability p, else 1/(1-p), from the library's seeded generator.

    An element is kept when 32 random bits, read as an integer, are at least p * 2^32.
    The generator's raw output gives 64 bits a draw: twice as fast as drawing floats
    (masks are most of what dropout costs)."""
    n = math.prod(shape)
    bits = tt._numpy_rng().bit_generator.random_raw((n + 1) // 2).view(np.uint32)
    mask = np.empty(shape, dtype=dtype)
    threshold = np.uint32(min(round(p * 2 ** 32), 2 ** 32 - 1))
    np.greater_equal(bits[:n].reshape(shape), threshold, out=mask)
    mask *= 1.0 / (1.0 - p)
    return mask


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels (each (n, c) plane) with probability p, scale the rest by
    1/(1-p). An input of 3 dims is read as (N, C, L), with PyTorch's warning (PyTorch 2.15
    does so, though a later release may read it as one image (C, H, W))."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout2d: p must be in [0, 1), got {p}")
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-"
                      "wise 1D dropout behavior is desired - input is interpreted as shape (N, "
                      "C, L), where C is the channel dim (use dropout1d for that)")
    if not training or p == 0:
        return input
    mask = dropout_mask(input.shape[:2] + (1,) * (input.ndim - 2), p, input.dtype)
    return _activation_result(input, input * tt.tensor(mask), 'dropout2d', inplace)


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        if not 0 <= p < 1:
            raise ValueError(f"{type(self).__name__}: p must be in [0, 1), got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout2d(Dropout):
    def forward(self, x):
        return dropout2d(x, self.p, self.training, self.inplace)


def _inplace_repr(module):
    return "inplace=True" if module.inplace else ""  # PyTorch's: shown only when set


class ReLU(Module):
    def __init__(self, inplace=False):
        self.inplace = inplace

    def forward(self, x):
        return relu(x, self.inplace)

    extra_repr = _inplace_repr


class GELU(Module):
    def __init__(self, approximate='none'):
        self.approximate = approximate

    def forward(self, x):
        return x.gelu(approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class SiLU(Module):
    def __init__(self, inplace=False):
        self.inplace = inplace

    def forward(self, x):
        return silu(x, self.inplace)

    extra_repr = _inplace_repr


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return tt.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


# nn doubles as torch.nn.functional: `import nn as F` runs F.relu(x), F.softmax(x, -1),
# F.cross_entropy(...). The activations are tinytorch's own ops, taking F's arguments: an
# in-place form (inplace=True writes the result into the input, as x.relu_()), and
# softmax's dim chosen as PyTorch chooses it when none is given.
gelu, softplus = tt.gelu, tt.softplus


def relu(input, inplace=False):
    return _in_place_activation(input, tt.relu, 'relu', inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _in_place_activation(input, tt.leaky_relu, 'leaky_relu', inplace, negative_slope)


def silu(input, inplace=False):
    return _in_place_activation(input, tt.silu, 'silu', inplace)


def sigmoid(input):
    return tt.sigmoid(input)


def tanh(input):
    return tt.tanh(input)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """tt.softmax; with no dim, PyTorch's implicit choice and its warning (_stacklevel is
    where the warning points, PyTorch's argument)."""
    return tt.softmax(input, _softmax_dim(dim, input.ndim, 'softmax', _stacklevel), dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return tt.log_softmax(input, _softmax_dim(dim, input.ndim, 'log_softmax', _stacklevel),
                          dtype)


def _in_place_activation(input, op, name, inplace, *args):
    """op(input, *args), or with inplace=True written into input's memory (name_); a rule
    that reads the input then reads a copy of its old value."""
    if not inplace:
        return op(input, *args)
    old = input.clone() if input.requires_grad and tt.is_grad_enabled() else input
    return tt._in_place(input, name + '_', op(old, *args))


# -- more activations: ELU, SELU, hardtanh, ReLU6 -------------------------------
# Each selects its branch with np.where, in the forward pass and in the rule, so an
# infinity in the branch not taken never turns into nan (0 * inf would).
def _float_only(x, op):
    if x.dtype.kind != 'f':
        raise TypeError(f"{op}: expects a floating point tensor, got {x.dtype}")


def _activation_result(input, out, op, inplace):
    """out, or out written into input's memory (the in-place form, op_ as PyTorch names it)."""
    return tt._in_place(input, op + '_', out) if inplace else out


def _elu(x, alpha, scale, op):
    """scale * x where x > 0, else scale * alpha * (exp(x) - 1): ELU (scale 1) and SELU."""
    _float_only(x, op)
    neg = x.array <= 0  # nan is not <= 0: it takes the x branch, as in PyTorch
    xneg = np.where(neg, x.array, 0)  # exp only of what is used: no overflow for large x
    out = np.where(neg, (scale * alpha) * np.expm1(xneg), scale * x.array)

    def backward(g):
        """d elu(x)/dx = scale where x > 0, else scale * alpha * exp(x)"""
        return (np.where(neg, g * (scale * alpha) * np.exp(xneg), g * scale),)
    return from_op(out, op, (x,), backward)


def elu(input, alpha=1.0, inplace=False):
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return _activation_result(input, _elu(input, alpha, 1.0, 'elu'), 'elu', inplace)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with SELU's two constants (self-normalizing networks)."""
    return _activation_result(input, _elu(input, _SELU_ALPHA, _SELU_SCALE, 'selu'), 'selu',
                              inplace)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """x clamped to [min_val, max_val]. Unlike clamp, the gradient stops at the bounds
    themselves (PyTorch's rule: it passes only where min_val < x < max_val)."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    x = input.array
    out = np.clip(x, min_val, max_val).astype(x.dtype)
    outside = (x <= min_val) | (x >= max_val)  # nan is neither: its gradient passes

    def backward(g):
        """d hardtanh(x)/dx = 1 where min_val < x < max_val, else 0"""
        return (np.where(outside, 0, g),)
    return _activation_result(input, from_op(out, 'hardtanh', (input,), backward), 'hardtanh',
                              inplace)


def relu6(input, inplace=False):
    """min(max(x, 0), 6): hardtanh(x, 0, 6), so the gradient is 0 at 0 and at 6."""
    return hardtanh(input, 0.0, 6.0, inplace)


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return elu(x, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class SELU(Module):
    def __init__(self, inplace=False):
        self.inplace = inplace

    def forward(self, x):
        return selu(x, self.inplace)

    extra_repr = _inplace_repr


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False, min_value=None,
                 max_value=None):
        if min_value is not None or max_value is not None:  # PyTorch's old names
            warnings.warn("keyword argument `min_value`/`max_value` is deprecated and will be "
                          "removed in future releases, use `min_val`/`max_val` instead",
                          FutureWarning, stacklevel=2)
            min_val = min_val if min_value is None else min_value
            max_val = max_val if max_value is None else max_value
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) cannot be greater than max_val "
                             f"({max_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x):
        return hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (
            ", inplace=True" if self.inplace else "")


class ReLU6(Hardtanh):
    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


def _softmax_dim(dim, ndim, op, stacklevel=3):
    """PyTorch's choice when Softmax() is given no dim (with its warning): dim 0 for
    0-, 1- and 3-d inputs, else 1."""
    if dim is not None:
        return dim
    warnings.warn(f"{op}: implicit dimension choice has been deprecated; pass dim=",
                  stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    def __init__(self, dim=None):
        self.dim = dim

    def forward(self, x):
        return tt.softmax(x, _softmax_dim(self.dim, x.ndim, 'Softmax'))

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Module):
    def __init__(self, dim=None):
        self.dim = dim

    def forward(self, x):
        return tt.log_softmax(x, _softmax_dim(self.dim, x.ndim, 'LogSoftmax'))

    def extra_repr(self):
        return f"dim={self.dim}"


class Identity(Module):
    """Returns its input (a placeholder layer); its arguments are ignored, as in PyTorch."""

    def __init__(self, *args, **kwargs):
        pass

    def forward(self, x):
        return x


def one_hot(tensor, num_classes=-1):
    """(..., num_classes) int64 tensor with a 1 at each index (no gradient: indices have none)."""
    idx = tensor.array if isinstance(tensor, Tensor) else np.asarray(tensor)
    if idx.dtype.kind not in 'iu':
        raise TypeError(f"one_hot: expects integer class indices, got {idx.dtype}")
    n = int(idx.max()) + 1 if num_classes == -1 and idx.size else num_classes
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"one_hot: class values must be in [0, {n}), got {idx.min()}..{idx.max()}")
    # row-major, as PyTorch's (NumPy's == keeps a permuted idx's order of dims)
    return tt.tensor((np.arange(n) == idx[..., None]).astype(np.int64, order='C'))


# -- padding, normalizing, and the cosine of two vectors --------------------------
def pad(input, pad, mode='constant', value=None):
    """Pad the last len(pad) // 2 dims: pad = (left, right) for the last dim, then
    (left, right) for the one before, and so on (PyTorch's order). A negative amount
    crops. mode 'constant' fills with value (0 by default); 'reflect' mirrors the edge
    (without repeating it), 'replicate' repeats the edge, 'circular' wraps around."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: needs an even number of amounts, two per dim and at most "
                         f"{2 * input.ndim} for a {input.ndim}-d input, got {pad}")
    k = len(pad) // 2
    pairs = {input.ndim - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(k)}  # dim: (l, r)
    if mode == 'constant':
        return _pad_constant(input, pairs, 0 if value is None else value)
    if mode not in ('reflect', 'replicate', 'circular'):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', "
                         f"got {mode!r}")
    if value is not None:
        raise ValueError(f"pad: mode {mode!r} takes no value")
    if k not in (1, 2, 3) or input.ndim not in (k + 1, k + 2):
        raise NotImplementedError(f"pad: mode {mode!r} pads the last 1, 2 or 3 dims of a "
                                  f"(batch, channels, ...) input: {2 * k} amounts need a "
                                  f"{k + 1}-d or {k + 2}-d input, got {input.ndim}-d")
    x = input
    for d, (left, right) in pairs.items():  # crop first, then pad what is left
        n = x.shape[d] - max(-left, 0) - max(-right, 0)
        x = x.narrow(d, max(-left, 0), n)
        left, right = max(left, 0), max(right, 0)
        most = n - 1 if mode == 'reflect' else n if mode == 'circular' else math.inf
        if (left or right) and (n == 0 or max(left, right) > most):
            raise ValueError(f"pad: mode {mode!r} cannot pad a dim of size {n} by "
                             f"({left}, {right})")
        j = np.arange(-left, n + right)  # the positions of the output, in x's numbering
        if mode == 'reflect':  # mirror at 0 and at n - 1
            j = np.abs(j) % (2 * n - 2) if n > 1 else np.zeros_like(j)
            j = np.where(j >= n, 2 * n - 2 - j, j)
        elif mode == 'replicate':
            j = np.clip(j, 0, n - 1)
        else:
            j = j % n
        x = x.index_select(d, tt.tensor(j))  # its gradient adds the copies back up
    return x


def _pad_constant(input, pairs, value):
    """Constant padding as one op: the input's kept part is copied into an array of value."""
    shape, src, dst = list(input.shape), [slice(None)] * input.ndim, [slice(None)] * input.ndim
    for d, (left, right) in pairs.items():
        n = input.shape[d]
        shape[d] = n + left + right
        if shape[d] < 0:
            raise ValueError(f"pad: padding ({left}, {right}) makes dim {d} of size {n} "
                             f"negative ({shape[d]})")
        kept = max(n - max(-left, 0) - max(-right, 0), 0)
        src[d] = slice(max(-left, 0), max(-left, 0) + kept)
        dst[d] = slice(max(left, 0), max(left, 0) + kept)
    src, dst = tuple(src), tuple(dst)
    out = np.full(shape, value, dtype=input.dtype)
    out[dst] = input.array[src]

    def backward(g, xs=input.array.shape):
        """d pad(x)/dx = 1 for the elements kept, 0 for those cropped  (g cut back to x's place)"""
        gx = np.zeros(xs, dtype=g.dtype)
        gx[src] = g[dst]
        return (gx,)
    return from_op(out, 'pad', (input,), backward)


class ReflectionPad2d(Module):
    """pad(x, padding, mode='reflect') on the last two dims: the edge mirrored, not repeated."""

    def __init__(self, padding):
        self.padding = tuple(padding) if isinstance(padding, (tuple, list)) else (padding,) * 4

    def forward(self, x):
        return pad(x, self.padding, mode='reflect')

    def extra_repr(self):
        return f"{self.padding}"


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input / max(norm_p(input over dim), eps): unit vectors along dim."""
    if out is not None:
        raise TypeError("normalize: out= is not supported; use the returned tensor")
    return input / input.norm(p, dim, keepdim=True).clamp(min=eps)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum over dim of (x1 / |x1|) * (x2 / |x2|), each norm at least eps (broadcasting x1
    and x2 first). As in PyTorch, the eps floor only guards the division: the gradient
    goes through the norm itself."""
    try:
        shape = np.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise ValueError(f"cosine_similarity: shapes {tuple(x1.shape)} and {tuple(x2.shape)} "
                         "cannot be broadcast together") from None
    tt._dim(dim, len(shape), 'cosine_similarity')  # dim=1 of a 0-d or 1-d pair: refused, as PyTorch
    x1 = x1 if x1.shape == shape else x1.expand(shape)
    x2 = x2 if x2.shape == shape else x2.expand(shape)
    n1, n2 = x1.norm(2, dim, keepdim=True).clone(), x2.norm(2, dim, keepdim=True).clone()
    with no_grad():  # clones: the norms' own rules read the unclamped values
        n1.clamp_(min=eps)
        n2.clamp_(min=eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


class CosineSimilarity(Module):
    def __init__(self, dim=1, eps=1e-8):
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return cosine_similarity(x1, x2, self.dim, self.eps)


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


@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(N, C, H, W) * weight (O, C / groups, kh, kw) -> (N, O, oh, ow), as F.conv2d.
    padding is a number, a pair, or 'valid' (none) or 'same' (the output as large as the
    input, stride 1; an odd total goes to the right, as PyTorch)."""
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D (out, in, kh, kw), got {tuple(weight.shape)}")
    if isinstance(padding, str):
        input, padding = _padding_by_name(input, padding, weight.shape[2:], dilation, stride,
                                          'conv2d')
    if groups != 1:
        return _grouped(conv2d, input, weight, bias, groups, 'conv2d', stride, padding, dilation)
    _image(input, 'conv2d', weight.shape[1])
    tt._same_dtype('conv2d', input=input, weight=weight, bias=bias)
    n, o = input.shape[0], weight.shape[0]
    kernel = weight.shape[2:]
    win = tt.window(input.shape, kernel, dilation, padding, stride, 'conv2d')
    if tt.fast and win.stride == (1, 1):  # the same numbers as one op (section 8, Speed)
        return conv2d_fused(input, weight, bias, win)
    oh, ow = win.out
    cols = tt.unfold(input, kernel, dilation, padding, stride)  # (N, C*kh*kw, oh*ow)
    out = weight.reshape(o, -1) @ cols  # (O, C*kh*kw) @ (N, C*kh*kw, L) -> (N, O, L)
    if bias is not None:
        out = out + bias.reshape(o, 1)
    return out.reshape(n, o, oh, ow)


@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(N, C, L) * weight (O, C / groups, k) -> (N, O, L'): conv2d on images of height 1."""
    if input.ndim not in (2, 3) or weight.ndim != 3:
        raise ValueError(f"conv1d: expected input (N, C, L) or (C, L) and weight (O, C, k), "
                         f"got {tuple(input.shape)} and {tuple(weight.shape)}")
    if input.ndim == 2:  # one unbatched sequence
        return conv1d(input[None], weight, bias, stride, padding, dilation, groups)[0]
    one = (lambda v: (1, v[0] if isinstance(v, (tuple, list)) else v))
    pad = padding if isinstance(padding, str) else (0, one(padding)[1])
    return conv2d(input.unsqueeze(2), weight.unsqueeze(2), bias, one(stride), pad,
                  one(dilation), groups).squeeze(2)


def _grouped(conv, input, weight, bias, groups, op, *args):
    """A convolution of groups > 1: the input's channels split into groups, each group
    convolved with its own slice of the kernels (weight's dim 0), the results side by side
    on the channel dim. Each group is an ordinary convolution, and so is its gradient."""
    if input.ndim < 3 or input.shape[1] % groups or weight.shape[0] % groups:
        raise ValueError(f"{op}: groups={groups} must divide the input's channels (input of "
                         f"shape {tuple(input.shape)}) and weight's dim 0 ({tuple(weight.shape)})")
    c, o = input.shape[1] // groups, weight.shape[0] // groups
    outs = [conv(input.narrow(1, g * c, c), weight.narrow(0, g * o, o), None, *args)
            for g in range(groups)]
    out = tt.cat(outs, 1)
    return out if bias is None else out + bias.reshape((-1,) + (1,) * (out.ndim - 2))


def _same_pads(kernel, dilation):
    """padding='same': per dim (left, right), the total d (k - 1) split with the odd one
    on the right (PyTorch's)."""
    pads = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    return pads


def _padding_by_name(input, padding, kernel, dilation, stride, op):
    """padding 'valid' or 'same' as numbers; an uneven 'same' pads the input's right here."""
    if padding == 'valid':
        return input, 0
    if padding != 'same':
        raise ValueError(f"{op}: Invalid padding string {padding!r}, should be one of "
                         f"['valid', 'same']")
    if tt._pair(stride, 'stride', op) != (1, 1):
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    pads = _same_pads(kernel, tt._pair(dilation, 'dilation', op))
    extra = [r - left for left, r in pads]
    if any(extra):
        input = pad(input, (0, extra[1], 0, extra[0]))
    return input, tuple(left for left, _ in pads)


@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    """The transpose of conv2d (the gradient of conv2d with respect to its input): weight
    (C_in, C_out, kh, kw), out size (H - 1) s - 2 p + d (k - 1) + output_padding + 1.
    Computed as a convolution: spread the input out with s - 1 zeros between neighbours,
    pad it by d (k - 1) - p, and run conv2d with stride 1 and the kernel flipped."""
    if groups != 1:  # weight (C_in, C_out / groups, kh, kw): its dim 0 splits as the input's
        return _grouped(conv_transpose2d, input, weight, bias, groups, 'conv_transpose2d',
                        stride, padding, output_padding, 1, dilation)
    _image(input, 'conv_transpose2d', weight.shape[0])
    n, c, h, w = input.shape
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = (tt._pair(v, name, 'conv_transpose2d') for v, name in (
        (stride, 'stride'), (padding, 'padding'), (output_padding, 'output_padding'),
        (dilation, 'dilation')))
    kh, kw = weight.shape[2:]
    x = input.reshape(n, c, h, 1, w, 1)
    x = pad(x, (0, sw - 1, 0, 0, 0, sh - 1)).reshape(n, c, h * sh, w * sw)
    x = x[:, :, :(h - 1) * sh + 1, :(w - 1) * sw + 1]  # s - 1 zeros between neighbours
    qh, qw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
    x = pad(x, (qw, qw + opw, qh, qh + oph))  # a negative amount crops
    return conv2d(x, weight.transpose(0, 1).flip(2, 3), bias, 1, 0, (dh, dw))


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


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """max_pool2d over (N, C, L) as (N, C, 1, L) with a 1 x kernel_size window."""
    one = lambda v: (1, v[0] if isinstance(v, (tuple, list)) else v)  # noqa: E731
    out = max_pool2d(input.unsqueeze(-2), one(kernel_size),
                     one(stride if stride is not None else kernel_size),
                     (0, one(padding)[1]), one(dilation), ceil_mode, return_indices)
    if return_indices:
        return out[0].squeeze(-2), out[1].squeeze(-2)
    return out.squeeze(-2)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """The largest value of each window. Its gradient goes to that one element (the first
    one on ties, as PyTorch); padding never wins. ceil_mode=True keeps a last window that
    only partly covers the input; return_indices=True also gives each winner's place in
    its (H, W) plane, flattened (h * W + w), for max_unpool."""
    win = _pool_check(input, kernel_size, stride, padding, dilation, 'max_pool2d')
    h, w = input.shape[2:]
    if ceil_mode and any(_ceil_extra(input.shape, win)):  # pad so the last window fits
        eh, ew = _ceil_extra(input.shape, win)
        fill = -np.inf if input.dtype.kind == 'f' else np.iinfo(input.dtype).min
        input = pad(input, (0, ew, 0, eh), value=fill)
        win = tt.window(input.shape, win.kernel, win.dilation, win.padding, win.stride)
    if tt.fast:  # the same numbers as one op (section 8, Speed)
        out = max_pool2d_fused(input, win)
    else:
        cols, shape = _pool_windows(input, win)
        if padding:  # unfold pads with 0; a max pool's padding is -inf
            real = tt.unfold(tt.ones(1, 1, *input.shape[2:], dtype=input.dtype), win.kernel,
                             win.dilation, win.padding, win.stride)
            cols = cols.masked_fill(real.array == 0, -np.inf)
        out = cols.max(dim=1).values.reshape(shape)
    return (out, _max_pool_indices(input.array, win, w)) if return_indices else out


def _ceil_extra(shape, win):
    """ceil_mode: how much to add at the bottom and the right so that one more window fits
    where the last one would start inside the input or its left padding (PyTorch's rule)."""
    extra = []
    for size, k, dil, p, s in zip(shape[2:], win.kernel, win.dilation, win.padding, win.stride):
        span = dil * (k - 1) + 1
        out = -(-(size + 2 * p - span) // s) + 1  # rounded up
        if (out - 1) * s >= size + p:  # the last window would start in the right padding
            out -= 1
        extra.append(max((out - 1) * s + span - (size + 2 * p), 0))
    return tuple(extra)


def _max_pool_indices(x, win, width):
    """Each window's winner (the first maximum) as h * width + w in its unpadded plane."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw), (oh, ow) = win
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf) \
        if ph or pw else x
    best = idx = None
    for i in range(kh):
        for j in range(kw):
            part = xp[(..., *tt._window_slice(win, i, j))]
            flat = (np.arange(oh)[:, None] * sh + i * dh - ph) * width + \
                (np.arange(ow)[None] * sw + j * dw - pw)
            if best is None:
                best, idx = part.copy(), np.broadcast_to(flat, part.shape).copy()
            else:
                bigger = part > best
                best, idx = np.where(bigger, part, best), np.where(bigger, flat, idx)
    return tt.tensor(idx.astype(np.int64))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """The mean of each window. By default zero padding counts (count_include_pad);
    count_include_pad=False divides each window's sum by the input elements it covers,
    divisor_override by that number instead; ceil_mode keeps a last partial window (its
    divisor counts what it covers of the padded input, as PyTorch)."""
    win = _pool_check(input, kernel_size, stride, padding, 1, 'avg_pool2d')
    if not ceil_mode and count_include_pad and divisor_override is None:
        cols, shape = _pool_windows(input, win)
        return cols.mean(dim=1).reshape(shape)
    (ph, pw), (h, w) = win.padding, input.shape[2:]
    eh, ew = _ceil_extra(input.shape, win) if ceil_mode else (0, 0)
    x = pad(input, (pw, pw + ew, ph, ph + eh))  # the padding as zeros, then windows over x
    sums_win = tt.window(x.shape, win.kernel, 1, 0, win.stride, 'avg_pool2d')
    cols, shape = _pool_windows(x, sums_win)
    sums = cols.sum(dim=1).reshape(shape)
    if divisor_override is not None:
        return sums / divisor_override
    covered = np.zeros((1, 1) + tuple(x.shape[2:]), dtype=input.dtype)  # what a window counts
    if count_include_pad:
        covered[..., :h + 2 * ph, :w + 2 * pw] = 1
    else:
        covered[..., ph:ph + h, pw:pw + w] = 1
    counts = tt.unfold(tt.tensor(covered), sums_win.kernel, 1, 0, sums_win.stride).sum(1)
    return sums / counts.reshape(shape[2:])


def adaptive_avg_pool2d(input, output_size):
    """The mean of each of oh x ow windows that tile the image: window i of n covers
    [floor(i H / oh), ceil((i + 1) H / oh)) (PyTorch's bins; they may overlap)."""
    if input.ndim == 3:  # one unbatched image (C, H, W)
        return adaptive_avg_pool2d(input[None], output_size)[0]
    _image(input, 'adaptive_avg_pool2d')
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    out = input
    for d, o in zip((2, 3), sizes):
        size = input.shape[d]
        o = size if o is None else o
        bins = [(i * size // o, -(-(i + 1) * size // o)) for i in range(o)]
        out = tt.cat([out.narrow(d, a, b - a).mean(d, keepdim=True) for a, b in bins], d)
    return out


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
        count = input.array.size // c
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
    return _normalize(input, mean, var, eps, weight, bias, shape)


def _normalize(input, mean, var, eps, weight, bias, shape):
    """(input - mean) / sqrt(var + eps) * weight + bias, weight and bias viewed as shape
    (batch_norm's and instance_norm's last step)."""
    with np.errstate(invalid='ignore'):  # an inf in the batch: inf - inf = nan, silently, as PyTorch
        out = (input - mean) / (var + eps).sqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalize each channel of each sample over its own positions (dims 2, ...) to mean 0
    and variance 1 (biased), then scale and shift per channel."""
    if running_mean is not None or not use_input_stats:
        raise NotImplementedError("instance_norm: running statistics are not supported "
                                  "(track_running_stats=False, PyTorch's default)")
    dims = tuple(range(2, input.ndim))
    mean = input.mean(dims, keepdim=True)
    var = ((input - mean) ** 2).mean(dims, keepdim=True)
    return _normalize(input, mean, var, eps, weight, bias, (1, -1) + (1,) * len(dims))


_PADDING_MODES = ('zeros', 'reflect', 'replicate', 'circular')


def _tuple(v, d, name, op):
    """kernel_size=3 as (3,) or (3, 3): PyTorch keeps a convolution's arguments as tuples."""
    v = tuple(v) if isinstance(v, (tuple, list)) else (v,) * d
    if len(v) != d or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                              for i in v):
        raise TypeError(f"{op}: {name} must be an int or {d} ints, got {v!r}")
    return tuple(int(i) for i in v)


class _ConvNd(Module):
    """What Conv1d, Conv2d and ConvTranspose2d share (PyTorch's _ConvNd): the arguments
    kept as tuples of d numbers (PyTorch's form, which the repr shows), the weight
    (out, in / groups, *kernel) ((in, out / groups, *kernel) when transposed), PyTorch's
    initialisation, and padding_mode: 'zeros' pads inside the convolution; 'reflect',
    'replicate' and 'circular' pad the input with F.pad first."""
    d, transposed = 2, False

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, padding_mode, device, dtype, output_padding=0):
        op = type(self).__name__
        dtype = _factory(device, dtype, op)
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{op}: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must be divisible by groups ({groups})")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{op}: padding_mode must be one of {list(_PADDING_MODES)}, but "
                             f"got padding_mode={padding_mode!r}")
        if self.transposed and padding_mode != 'zeros':
            raise ValueError(f'Only "zeros" padding mode is supported for {op}')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, self.d, 'kernel_size', op)
        self.stride = _tuple(stride, self.d, 'stride', op)
        if isinstance(padding, str):
            if padding not in ('valid', 'same'):
                raise ValueError(f"{op}: Invalid padding string {padding!r}, should be one of "
                                 f"['valid', 'same']")
            if padding == 'same' and set(self.stride) != {1}:
                raise ValueError(f"{op}: padding='same' is not supported for strided "
                                 f"convolutions")
            self.padding = padding
        else:
            self.padding = _tuple(padding, self.d, 'padding', op)
        self.dilation = _tuple(dilation, self.d, 'dilation', op)
        self.output_padding = _tuple(output_padding, self.d, 'output_padding', op)
        self.padding_mode = padding_mode
        shape = ((in_channels, out_channels // groups) if self.transposed
                 else (out_channels, in_channels // groups))
        self.weight = Parameter(tt.zeros(*shape, *self.kernel_size, dtype=dtype))
        self.bias = Parameter(tt.zeros(out_channels, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # PyTorch's default, as Linear's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in =
        # weight.shape[1] * kh * kw (a group's input channels; transposed, its output's)
        kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(_fans(self.weight)[0])
            uniform_(self.bias, -bound, bound)

    def _padded(self, x):
        """(x, the padding the convolution adds): padding_mode other than 'zeros' pads x
        here, with F.pad (the last dim's amounts first), and the convolution adds none."""
        if self.padding_mode == 'zeros':
            return x, self.padding
        pads = (_same_pads(self.kernel_size, self.dilation) if self.padding == 'same' else
                [(0, 0)] * self.d if self.padding == 'valid' else [(p, p) for p in self.padding])
        return pad(x, [a for pair in reversed(pads) for a in pair], mode=self.padding_mode), 0

    def extra_repr(self):
        """PyTorch's: the kernel and stride always, the rest when not the default."""
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        zero, one = (0,) * self.d, (1,) * self.d
        if self.padding != zero:
            s += f", padding={self.padding}"
        if self.dilation != one:
            s += f", dilation={self.dilation}"
        if self.output_padding != zero:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != 'zeros':
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    d = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode='zeros', device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)

    def forward(self, x):
        x, padding = self._padded(x)
        return conv1d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                      self.groups)


class Conv2d(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode='zeros', device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)

    def forward(self, x):
        x, padding = self._padded(x)
        return conv2d(x, self.weight, self.bias, self.stride, padding, self.dilation,
                      self.groups)


class ConvTranspose2d(_ConvNd):
    transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode='zeros',
                 device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    def forward(self, x):
        return conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                self.output_padding, self.groups, self.dilation)


class _MaxPoolNd(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    def forward(self, x):
        return max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)


class MaxPool2d(_MaxPoolNd):
    def forward(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x):
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        self.output_size = output_size

    def forward(self, x):
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class _BatchNorm(Module):
    dims = None  # the input ranks the layer takes
    _optional_state = ('num_batches_tracked',)  # tinytorch's checkpoints before it had one

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, *, bias=True):
        _check_cpu(device, type(self).__name__)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(tt.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(tt.zeros(num_features, dtype=dtype)) if affine and bias else None
        tracked = track_running_stats  # PyTorch's buffers, None when not tracked
        self.register_buffer('running_mean', tt.zeros(num_features, dtype=dtype) if tracked else None)
        self.register_buffer('running_var', tt.ones(num_features, dtype=dtype) if tracked else None)
        self.register_buffer('num_batches_tracked', tt.tensor(0) if tracked else None)

    def forward(self, x):
        name = type(self).__name__
        if x.ndim not in self.dims:
            raise ValueError(f"{name}: expected a {' or '.join(f'{d}-D' for d in self.dims)} "
                             f"input, got shape {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{name}: expected {self.num_features} channels (dim 1), got "
                             f"{x.shape[1]} (input of shape {tuple(x.shape)})")
        momentum = self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                self.num_batches_tracked.add_(1)
            if momentum is None:  # a plain average of every batch seen so far
                momentum = 1.0 / self.num_batches_tracked.item()
        # the batch's statistics in training, and also in eval when nothing was tracked
        by_batch = self.training or self.running_mean is None
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          by_batch, momentum, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    dims = (2, 3)  # (N, C) or (N, C, L)


class BatchNorm2d(_BatchNorm):
    dims = (4,)  # (N, C, H, W)


class InstanceNorm2d(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, bias=True):
        dtype = _factory(device, dtype, 'InstanceNorm2d')
        if track_running_stats:
            raise NotImplementedError("InstanceNorm2d: track_running_stats=True is not "
                                      "supported (each image is normalized by its own statistics)")
        self.num_features, self.eps, self.momentum, self.affine = num_features, eps, momentum, affine
        self.track_running_stats = track_running_stats
        self.weight = Parameter(tt.ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(tt.zeros(num_features, dtype=dtype)) if affine and bias else None

    def forward(self, x):
        if x.ndim not in (3, 4):
            raise ValueError(f"InstanceNorm2d: expected a 3-D or 4-D input, got shape "
                             f"{tuple(x.shape)}")
        if x.ndim == 3:
            return self.forward(x[None])[0]
        return instance_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)

    extra_repr = _BatchNorm.extra_repr  # the same fields, as PyTorch prints them


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


# -- resizing images: interpolate (nearest, linear, bilinear, trilinear), Upsample,
#    and PixelShuffle (channels into pixels) -----------------------------------
def interpolate(input, size=None, scale_factor=None, mode='nearest', align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resize the dims after (N, C), as PyTorch's F.interpolate. Each dim maps output
    position i to an input position through the ratio r = in / out (1 / scale_factor
    when that is given), and
      - mode 'nearest' copies the input element floor(i * r);
      - mode 'linear' (N, C, L), 'bilinear' (N, C, H, W), 'trilinear' (N, C, D, H, W) reads
        src = (i + 1/2) r - 1/2 (at least 0), or src = i (in - 1) / (out - 1) with
        align_corners=True (the corner pixels' centres meet), and mixes the two neighbours
        i0 = floor(src), i1 = i0 + 1 (at most in - 1) as (1 - l) x[i0] + l x[i1], l = src - i0,
        one dim at a time (the last first, as PyTorch's kernel rounds). The gradient is
        index_select's: each input element gets its weights' share of the output gradient."""
    degree = {'linear': 1, 'bilinear': 2, 'trilinear': 3}
    if mode != 'nearest' and mode not in degree:
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported (tinytorch has "
                                  "'nearest', 'linear', 'bilinear' and 'trilinear')")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if mode == 'nearest' and align_corners is not None:
        raise ValueError("interpolate: align_corners option can only be set with the "
                         "interpolating modes: linear | bilinear | bicubic | trilinear")
    k = input.ndim - 2
    if k < 1 or (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give an (N, C, ...) input and one of size or scale_factor")
    if mode in degree:
        _float_only(input, f"interpolate (mode {mode!r})")
        if k != degree[mode]:
            raise NotImplementedError(f"interpolate: Got {input.ndim}D input, but {mode} mode "
                                      f"needs {degree[mode] + 2}D input")
    spatial = input.shape[2:]
    if size is not None:
        out = tuple(size) if isinstance(size, (tuple, list)) else (size,) * k
        scales = [i / o for i, o in zip(spatial, out)]
    else:
        sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * k
        out = tuple(int(math.floor(i * s)) for i, s in zip(spatial, sf))
        scales = [i / o if recompute_scale_factor else 1 / s for i, o, s in zip(spatial, out, sf)]
    if mode == 'nearest':
        for d, (n_in, n_out, s) in enumerate(zip(spatial, out, scales), 2):
            idx = np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * np.float32(s))  # in
                             .astype(np.int64), n_in - 1)  # float32, as PyTorch's kernel
            input = input.index_select(d, tt.tensor(idx))
        return input
    for d in range(input.ndim - 1, 1, -1):  # the last dim first
        n_in, n_out = spatial[d - 2], out[d - 2]
        if align_corners:
            r = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            r = scales[d - 2]
        input = _linear_along(input, d, n_in, n_out, r, align_corners)
    return input


def _linear_along(x, d, n_in, n_out, r, align_corners):
    """Linear interpolation along dim d, in x's dtype (PyTorch's positions and weights)."""
    dt = x.dtype
    i = np.arange(n_out, dtype=dt)
    if align_corners:
        src = i * dt.type(r)
    else:
        src = np.maximum((i + dt.type(0.5)) * dt.type(r) - dt.type(0.5), 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    l1 = np.clip(src - i0, 0, 1).astype(dt)
    shape = [1] * x.ndim
    shape[d] = n_out
    w1 = tt.tensor(l1.reshape(shape))
    w0 = tt.tensor((1 - l1).reshape(shape))
    return x.index_select(d, tt.tensor(i0)) * w0 + x.index_select(d, tt.tensor(i1)) * w1


class Upsample(Module):
    """nn.Upsample: interpolate as a layer (U-Nets, decoders)."""

    def __init__(self, size=None, scale_factor=None, mode='nearest', align_corners=None,
                 recompute_scale_factor=None):
        if isinstance(scale_factor, (tuple, list)):  # PyTorch keeps the factors as floats
            scale_factor = tuple(float(f) for f in scale_factor)
        elif scale_factor:
            scale_factor = float(scale_factor)
        self.size, self.scale_factor, self.mode = size, scale_factor or None, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, input):
        return interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                           self.recompute_scale_factor)

    def extra_repr(self):
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode='{self.mode}'"


def pixel_shuffle(input, upscale_factor):
    """(N, C r^2, H, W) -> (N, C, H r, W r): each group of r^2 channels becomes an r x r
    block of pixels (a sub-pixel convolution's upsampling); a reshape and a permute."""
    r = upscale_factor
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)={c} "
                           f"is not divisible by {r * r}")
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)  # (..., C, H, r, W, r)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


class PixelShuffle(Module):
    def __init__(self, upscale_factor):
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


# ---------------------------------------------------------------------------
# 3. Recurrent layers: RNN, LSTM, GRU
# ---------------------------------------------------------------------------
# A recurrent layer reads a sequence one step at a time and carries a hidden state h
# from each step to the next. A cell is one step: a few lines of linear, sigmoid and
# tanh. The layer is a loop over time that calls the cell; its gradient flows back
# through the loop (backpropagation through time) with no code of its own, since every
# line is a tinytorch op. The weights are PyTorch's, gate blocks in PyTorch's order:
# weight_ih (gates * hidden, input) reads the input, weight_hh (gates * hidden, hidden)
# the previous hidden state.
def rnn_tanh_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)"""
    return (linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)).tanh()


def rnn_relu_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' = relu(x W_ih^T + b_ih + h W_hh^T + b_hh)"""
    return (linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)).relu()


def lstm_cell(x, state, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None):
    """One LSTM step. state = (h, c); the four gates, in PyTorch's order:
    i (input), f (forget), g (the candidate cell), o (output)."""
    h, c = state
    i, f, g, o = (linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)).chunk(4, -1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    c = f * c + i * g            # forget some of the old cell, write some of the new
    h = o * c.tanh()             # show some of the cell
    if w_hr is not None:         # proj_size > 0: h is projected down
        h = linear(h, w_hr)
    return h, c


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """One GRU step, PyTorch's formula (r multiplies h's part of n *after* its bias):
    r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z), n = tanh(x_n + r * h_n),
    h' = (1 - z) * n + z * h, where x_* = x W_i*^T + b_i*, h_* = h W_h*^T + b_h*."""
    x_r, x_z, x_n = linear(x, w_ih, b_ih).chunk(3, -1)
    h_r, h_z, h_n = linear(h, w_hh, b_hh).chunk(3, -1)
    r = (x_r + h_r).sigmoid()    # reset: how much of h the candidate reads
    z = (x_z + h_z).sigmoid()    # update: how much of h is kept
    n = (x_n + r * h_n).tanh()   # the candidate
    return (1 - z) * n + z * h


class _Unbind(tt.autograd.Function):
    """x's slices along dim (PyTorch's torch.unbind) as one op, whose backward stacks the
    slices' gradients. x[t] one step at a time would be an op each, whose backward makes a
    gradient of x's full size: a loop over L steps would cost L times the sequence."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim = tt._dim(dim, x.ndim, 'unbind')
        return tuple(x.select(dim, t).clone() for t in range(x.shape[dim]))  # no graph here

    @staticmethod
    def backward(ctx, *grads):  # d x / d slice_t: slice t's gradient goes back to place t
        return tt.stack(grads, ctx.dim), None


def _unbind(x, dim=0):
    """The slices of x along dim, as a tuple (as tt.unbind, but copies, not views): one op
    for all, which the recurrent layers read their time steps through."""
    return _Unbind.apply(x, dim)


_CELLS = {'RNN_TANH': (rnn_tanh_cell, 1), 'RNN_RELU': (rnn_relu_cell, 1),
          'LSTM': (lstm_cell, 4), 'GRU': (gru_cell, 3)}


def _init_recurrent(module, hidden_size):
    """PyTorch's initialisation of every recurrent weight and bias: U(-1/sqrt(hidden), 1/sqrt(hidden))."""
    bound = 1 / math.sqrt(hidden_size) if hidden_size > 0 else 0
    for p in module.parameters():
        uniform_(p, -bound, bound)


def _check_sequence_input(name, input, ndims, said, input_size):
    """A recurrent cell's or layer's input: a tensor of ndims dims, the last input_size."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}: input must be a Tensor, got {type(input).__name__}")
    if input.ndim not in ndims:
        raise ValueError(f"{name}: expected input to be {said}, got {input.ndim}-D "
                         f"(shape {tuple(input.shape)})")
    if input.shape[-1] != input_size:
        raise ValueError(f"{name}: input has {input.shape[-1]} features (shape "
                         f"{tuple(input.shape)}), expected input_size={input_size}")


class _RNNCellBase(Module):
    def __init__(self, mode, input_size, hidden_size, bias, device, dtype):
        dtype = _factory(device, dtype, type(self).__name__)
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.bias = bias
        gates = _CELLS[mode][1]
        self.weight_ih = Parameter(tt.zeros(gates * hidden_size, input_size, dtype=dtype))
        self.weight_hh = Parameter(tt.zeros(gates * hidden_size, hidden_size, dtype=dtype))
        self.bias_ih = Parameter(tt.zeros(gates * hidden_size, dtype=dtype)) if bias else None
        self.bias_hh = Parameter(tt.zeros(gates * hidden_size, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        _init_recurrent(self, self.hidden_size)

    def _check(self, input, hx):
        name = type(self).__name__
        _check_sequence_input(name, input, (1, 2), "1-D or 2-D", self.input_size)
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        zeros = tt.zeros(x.shape[0], self.hidden_size, dtype=self.weight_ih.dtype)
        states = (hx if isinstance(hx, tuple) else (hx,)) if hx is not None else (None,)
        out = []
        for s in states:
            if s is None:
                out.append(zeros)
                continue
            if tuple(s.shape) != tuple(x.shape[:1] if batched else ()) + (self.hidden_size,):
                raise ValueError(f"{name}: hidden state has shape {tuple(s.shape)}, expected "
                                 f"{tuple(input.shape[:-1]) + (self.hidden_size,)}")
            out.append(s if batched else s.unsqueeze(0))
        return batched, x, out

    def _weights(self):
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")
        if getattr(self, 'nonlinearity', 'tanh') != 'tanh':
            s += f", nonlinearity={self.nonlinearity}"  # PyTorch's, without quotes
        return s


class RNNCell(_RNNCellBase):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu); input (N, input_size) or
    (input_size,), hx like the output (zeros when None)."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity='tanh', device=None,
                 dtype=None):
        if nonlinearity not in ('tanh', 'relu'):
            raise ValueError(f"RNNCell: unknown nonlinearity '{nonlinearity}' (tanh or relu)")
        self.nonlinearity = nonlinearity
        super().__init__('RNN_' + nonlinearity.upper(), input_size, hidden_size, bias, device,
                         dtype)

    def forward(self, input, hx=None):
        batched, x, (h,) = self._check(input, hx)
        h = _CELLS[self.mode][0](x, h, *self._weights())
        return h if batched else h.squeeze(0)


class LSTMCell(_RNNCellBase):
    """(h', c') from input (N, input_size) or (input_size,) and hx = (h, c) (zeros when None)."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__('LSTM', input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):
        batched, x, state = self._check(input, hx)
        if len(state) == 1:
            state = state * 2  # None: h and c both zeros
        h, c = lstm_cell(x, tuple(state), *self._weights())
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(_RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__('GRU', input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):
        batched, x, (h,) = self._check(input, hx)
        h = gru_cell(x, h, *self._weights())
        return h if batched else h.squeeze(0)


class _RNNBase(Module):
    """RNN, LSTM and GRU: num_layers stacked layers, each a loop of its cell over time
    (and a second loop from the end to the start when bidirectional)."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None,
                 dtype=None):
        name = {'LSTM': 'LSTM', 'GRU': 'GRU'}.get(mode, 'RNN')
        dtype = _factory(device, dtype, name)
        if not 0 <= dropout < 1:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {dropout}")
        if proj_size < 0 or (proj_size and proj_size >= hidden_size):
            raise ValueError(f"{name}: proj_size must be in [0, hidden_size={hidden_size}), "
                             f"got {proj_size}")
        if proj_size and mode != 'LSTM':
            raise ValueError(f"{name}: proj_size is only supported by LSTM")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, proj_size
        gates = _CELLS[mode][1]
        directions = 2 if bidirectional else 1
        out_size = proj_size or hidden_size  # what h is (and what the next layer reads)
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else out_size * directions
            for suffix in ('', '_reverse')[:directions]:
                def param(*shape):
                    return Parameter(tt.zeros(*shape, dtype=dtype))
                setattr(self, f'weight_ih_l{layer}{suffix}', param(gates * hidden_size, layer_in))
                setattr(self, f'weight_hh_l{layer}{suffix}', param(gates * hidden_size, out_size))
                if bias:
                    setattr(self, f'bias_ih_l{layer}{suffix}', param(gates * hidden_size))
                    setattr(self, f'bias_hh_l{layer}{suffix}', param(gates * hidden_size))
                if proj_size:
                    setattr(self, f'weight_hr_l{layer}{suffix}', param(proj_size, hidden_size))
        self.reset_parameters()

    def reset_parameters(self):
        _init_recurrent(self, self.hidden_size)

    def _weights(self, layer, suffix):
        get = lambda kind: getattr(self, f'{kind}_l{layer}{suffix}', None)  # noqa: E731
        w = (get('weight_ih'), get('weight_hh'), get('bias_ih'), get('bias_hh'))
        return w + (get('weight_hr'),) if self.mode == 'LSTM' else w

    def _run(self, x, state, weights, reverse):
        """One direction of one layer: the cell at each time step, carrying the state.
        x: (L, N, features) -> the hidden state at every step (L, N, out), the last state."""
        states = state if isinstance(state, tuple) else (state,)
        if tt.fast and (len(weights) < 5 or weights[4] is None) and all(  # one op, the
                t.dtype == weights[0].dtype for t in (x,) + states):  # same numbers (section 8)
            return recurrent_fused(self.mode, x, state, *weights[:4], reverse=reverse)
        cell = _CELLS[self.mode][0]
        xs = _unbind(x, 0)  # x[0], x[1], ... (one op, see _unbind)
        steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
        ys = [None] * x.shape[0]
        for t in steps:
            state = cell(xs[t], state, *weights)
            ys[t] = state[0] if self.mode == 'LSTM' else state
        return tt.stack(ys, 0), state

    def _start_states(self, hx, n, batched):
        """h_0 (and c_0 for an LSTM), each (layers * directions, N, size): hx checked, or zeros."""
        name = type(self).__name__
        directions = 2 if self.bidirectional else 1
        sizes = [self.proj_size or self.hidden_size] + ([self.hidden_size] if self.mode == 'LSTM' else [])
        states = (None,) * len(sizes) if hx is None else hx if isinstance(hx, tuple) else (hx,)
        if len(states) != len(sizes):
            raise ValueError(f"{name}: expected {'(h_0, c_0)' if len(sizes) == 2 else 'h_0'} "
                             f"as the hidden state, got {len(states)} tensors")
        start = []
        for s, size in zip(states, sizes):
            want = (self.num_layers * directions,) + ((n,) if batched else ()) + (size,)
            if s is None:
                s = tt.zeros(*want, dtype=getattr(self, 'weight_ih_l0').dtype)
            elif tuple(s.shape) != want:
                raise ValueError(f"{name}: expected hidden state of shape {want}, got "
                                 f"{tuple(s.shape)}")
            start.append(s if batched else s.unsqueeze(1))
        return start

    def _layers(self, x, start, run):
        """Every layer, each direction of it run by run(x, state, weights, reverse) -> (the
        hidden state at every step, the last state); start: h_0 (and c_0). Returns the last
        layer's output and the final states (layers * directions, N, size)."""
        directions = 2 if self.bidirectional else 1
        last = [[] for _ in start]  # the final state of each layer and direction
        for layer in range(self.num_layers):
            outs = []
            for d, suffix in enumerate(('', '_reverse')[:directions]):
                k = layer * directions + d
                state = tuple(s[k] for s in start) if self.mode == 'LSTM' else start[0][k]
                y, state = run(x, state, self._weights(layer, suffix), reverse=d == 1)
                outs.append(y)
                for kept, s in zip(last, state if self.mode == 'LSTM' else (state,)):
                    kept.append(s)
            x = outs[0] if directions == 1 else tt.cat(outs, -1)  # both directions side by side
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = dropout(x, self.dropout)  # between layers, not after the last
        return x, [tt.stack(s, 0) for s in last]

    def _run_packed(self, data, state, weights, reverse, batch_sizes):
        """One direction of one layer over a packed batch (see PackedSequence): at step t only
        the first batch_sizes[t] sequences (the longest) have a step, so the cell reads and
        updates those rows only; the others keep their state (a sequence that has ended keeps
        its last, one the reverse direction has not reached yet keeps h_0). Returns the packed
        hidden states and the last state of each sequence."""
        cell = _CELLS[self.mode][0]
        states = state if self.mode == 'LSTM' else (state,)
        xs = _unbind(_packed_to_padded(data, batch_sizes, 0.0), 0)  # step t: (N, features)
        steps = range(len(batch_sizes) - 1, -1, -1) if reverse else range(len(batch_sizes))
        ys = [None] * len(batch_sizes)
        for t in steps:
            b = batch_sizes[t]
            now = tuple(s[:b] for s in states)
            new = cell(xs[t][:b], now if self.mode == 'LSTM' else now[0], *weights)
            new = new if self.mode == 'LSTM' else (new,)
            states = tuple(v if b == s.shape[0] else tt.cat([v, s[b:]], 0)
                           for v, s in zip(new, states))
            ys[t] = new[0]
        return tt.cat(ys, 0), (states if self.mode == 'LSTM' else states[0])

    def _forward_packed(self, input, hx):
        """forward of a PackedSequence: a PackedSequence of the outputs (the same batch_sizes
        and order) and the final states, hx and h_n in the batch's own order as PyTorch's."""
        name = type(self).__name__
        data, sizes = input.data, [int(b) for b in input.batch_sizes.tolist()]
        if data.ndim != 2 or data.shape[-1] != self.input_size:
            raise ValueError(f"{name}: a PackedSequence's data must be (steps, input_size="
                             f"{self.input_size}), got shape {tuple(data.shape)}")
        start = self._start_states(hx, sizes[0], True)
        if input.sorted_indices is not None:  # hx is in the batch's order; the rows are sorted
            start = [s.index_select(1, input.sorted_indices) for s in start]
        run = functools.partial(self._run_packed, batch_sizes=sizes)
        out, final = self._layers(data, start, run)
        if input.unsorted_indices is not None:
            final = [s.index_select(1, input.unsorted_indices) for s in final]
        packed = PackedSequence(out, input.batch_sizes, input.sorted_indices,
                                input.unsorted_indices)
        return packed, (tuple(final) if self.mode == 'LSTM' else final[0])

    def forward(self, input, hx=None):
        name = type(self).__name__
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        _check_sequence_input(name, input, (2, 3), "2-D (unbatched) or 3-D", self.input_size)
        batched = input.ndim == 3
        x = input if not batched else input.transpose(0, 1) if self.batch_first else input
        x = x if batched else x.unsqueeze(1)  # x: (L, N, features) from here on
        n = x.shape[1]
        start = self._start_states(hx, n, batched)  # h_0 (and c_0): (layers * directions, N, size)
        x, final = self._layers(x, start, self._run)
        if not batched:
            x, final = x.squeeze(1), [s.squeeze(1) for s in final]
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, (tuple(final) if self.mode == 'LSTM' else final[0])

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"  # PyTorch's (without the nonlinearity)
        for name, default in (('proj_size', 0), ('num_layers', 1), ('bias', True),
                              ('batch_first', False), ('dropout', 0.0), ('bidirectional', False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s


class RNN(_RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu).
    input (L, N, input_size) ((N, L, ...) with batch_first, or (L, input_size)), h_0
    (num_layers * directions, N, hidden_size) or None; returns output, h_n."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ('tanh', 'relu'):
            raise ValueError(f"RNN: unknown nonlinearity '{nonlinearity}' (tanh or relu)")
        self.nonlinearity = nonlinearity
        super().__init__('RNN_' + nonlinearity.upper(), input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, device=device, dtype=dtype)


class LSTM(_RNNBase):
    """Returns output, (h_n, c_n); hx = (h_0, c_0) or None. proj_size > 0 projects h
    (PyTorch's LSTM with projections)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__('LSTM', input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(_RNNBase):
    """Returns output, h_n; hx = h_0 or None."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__('GRU', input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, device=device, dtype=dtype)


# -- batches of sequences of different lengths (torch.nn.utils.rnn): padded with
#    pad_sequence, or packed (PackedSequence, read by RNN, LSTM and GRU) -----------
def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side='right'):
    """torch.nn.utils.rnn.pad_sequence: tensors of shape (L_i, *) -> one (L_max, B, *) (or
    (B, L_max, *) with batch_first), each padded at the end with padding_value."""
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        extra = (0, longest - s.shape[0]) if padding_side == 'right' else (longest - s.shape[0], 0)
        padded.append(pad(s, (0, 0) * (s.ndim - 1) + extra, value=padding_value))
    return tt.stack(padded, 0 if batch_first else 1)


class PackedSequence(namedtuple('PackedSequence', ['data', 'batch_sizes', 'sorted_indices',
                                                   'unsorted_indices'])):
    """torch.nn.utils.rnn.PackedSequence: a batch of sequences of different lengths without
    their padding, time step by time step. The sequences are sorted longest first; data
    holds step 0 of each, then step 1 of each that has one, and so on: batch_sizes[t] rows
    for step t (a non-increasing int64 tensor). sorted_indices[i] is the batch position of
    the i-th longest sequence (None: the batch was sorted already), unsorted_indices its
    inverse. Lengths 3, 1, 2 (batch order) are packed as
        data = [a0 c0 b0 | a1 c1 | a2], batch_sizes = [3, 2, 1], sorted_indices = [0, 2, 1]."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if batch_sizes is None:  # PyTorch's other form: data is the pair (data, batch_sizes)
            data, batch_sizes = data
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = tt.argsort(sorted_indices)  # the inverse permutation
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        """The same sequences with data cast (or moved, to 'cpu') as data.to(...)."""
        return type(self)(self.data.to(*args, **kwargs), *self[1:])

    is_cuda = False


def _packed_positions(batch_sizes):
    """Row r of packed data is step t of the i-th sorted sequence: its place t * N + i in a
    padded (steps, N, ...) tensor flattened to (steps * N, ...), N = batch_sizes[0]."""
    n = batch_sizes[0]
    return np.concatenate([t * n + np.arange(b) for t, b in enumerate(batch_sizes)])


def _packed_to_padded(data, batch_sizes, padding_value, total_length=None):
    """Packed rows -> (steps, N, ...) in sorted order, padding_value where a sequence has
    ended: one gather from data with a padding row appended."""
    steps = len(batch_sizes) if total_length is None else total_length
    n = batch_sizes[0]
    source = np.full(steps * n, data.shape[0])  # every place reads the padding row ...
    source[_packed_positions(batch_sizes)] = np.arange(data.shape[0])  # ... but the steps
    filler = tt.full((1,) + tuple(data.shape[1:]), padding_value, dtype=data.dtype)
    rows = tt.cat([data, filler], 0).index_select(0, tt.tensor(source))
    return rows.reshape((steps, n) + tuple(data.shape[1:]))


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """A padded batch (L, N, *) ((N, L, *) with batch_first) and each sequence's length ->
    a PackedSequence. enforce_sorted=True: the lengths must be non-increasing (and
    sorted_indices is None); False: they are sorted here, longest first."""
    lengths = np.asarray(lengths.tolist() if isinstance(lengths, Tensor) else lengths)
    x = input.transpose(0, 1) if batch_first else input  # (L, N, *)
    if lengths.ndim != 1 or len(lengths) != x.shape[1]:
        raise ValueError(f"pack_padded_sequence: expected one length per sequence ({x.shape[1]} "
                         f"in a batch of shape {tuple(input.shape)}), got {lengths.tolist()}")
    lengths = lengths.astype(np.int64)
    if lengths.size and lengths.min() <= 0:
        raise RuntimeError("pack_padded_sequence: Length of all samples has to be greater than "
                           f"0, but found an element in 'lengths' that is <= 0: {lengths.tolist()}")
    if lengths.size and lengths.max() > x.shape[0]:
        raise RuntimeError(f"pack_padded_sequence: a length {lengths.max()} is longer than the "
                           f"padded sequences ({x.shape[0]} steps, input shape "
                           f"{tuple(input.shape)}; batch_first={batch_first})")
    sorted_indices = None
    if enforce_sorted:
        if np.any(np.diff(lengths) > 0):
            raise RuntimeError(
                f"pack_padded_sequence: `lengths` array must be sorted in decreasing order when "
                f"`enforce_sorted` is True (got {lengths.tolist()}); pass enforce_sorted=False "
                "to sort them here")
    else:
        order = np.argsort(-lengths, kind='stable')  # longest first; ties keep batch order
        sorted_indices = tt.tensor(order)
        x, lengths = x.index_select(1, sorted_indices), lengths[order]
    batch_sizes = [int((lengths > t).sum()) for t in range(int(lengths.max(initial=0)))]
    flat = x.reshape((x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))
    data = flat.index_select(0, tt.tensor(_packed_positions(batch_sizes)))
    return PackedSequence(data, tt.tensor(batch_sizes, dtype=tt.int64), sorted_indices)


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """A PackedSequence -> (padded, lengths): padded (L, N, *) ((N, L, *) with batch_first)
    in the batch's own order, padding_value after each sequence's end, L = total_length
    or the longest; lengths an int64 tensor."""
    sizes = [int(b) for b in sequence.batch_sizes.tolist()]
    if total_length is not None and total_length < len(sizes):
        raise ValueError(f"pad_packed_sequence: Expected total_length to be at least the length "
                         f"of the longest sequence in input, but got total_length={total_length} "
                         f"and max sequence length being {len(sizes)}")
    padded = _packed_to_padded(sequence.data, sizes, padding_value, total_length)
    lengths = tt.tensor([sum(b > i for b in sizes) for i in range(sizes[0])], dtype=tt.int64)
    if sequence.unsorted_indices is not None:  # back to the batch's order
        padded = padded.index_select(1, sequence.unsorted_indices)
        lengths = lengths.index_select(0, sequence.unsorted_indices)
    return (padded.transpose(0, 1) if batch_first else padded), lengths


def pack_sequence(sequences, enforce_sorted=True):
    """A list of tensors (L_i, *) -> a PackedSequence (pad_sequence, then pack_padded_sequence)."""
    return pack_padded_sequence(pad_sequence(sequences), [s.shape[0] for s in sequences],
                                enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """The inverse of pad_sequence: a list of the sequences, each cut to its length."""
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, :int(n)] for i, n in enumerate(lengths.tolist() if isinstance(lengths, Tensor)
                                                 else lengths)]


def unpack_sequence(packed_sequences):
    """The inverse of pack_sequence: the list of sequences, in the batch's own order."""
    return unpad_sequence(*pad_packed_sequence(packed_sequences, batch_first=True),
                          batch_first=True)


# ---------------------------------------------------------------------------
# 4. Attention and the Transformer, as PyTorch's modules
# ---------------------------------------------------------------------------
# attention_weights, below, is attention's one home: softmax(q k^T / sqrt(d) + mask), step
# by step; transformer.py's GPT imports it. The modules after it are PyTorch's general-
# purpose ones, with its names, arguments and state_dict keys, so PyTorch code and
# checkpoints run here: attention_weights, then the weights times v
# (transformer.py's fused kernel is its Speed twin). Query,
# key and value are each projected and split into heads, and an output projection
# joins the heads again. A layer is attention and a two-layer MLP, each added to its
# input and layer-normed (after the sum, or before the sublayer with norm_first).
def _causal_mask(tq, tk, past=0):
    """Boolean (tq, tk) mask, True where a query may look: query i sits at position
    past + i and sees keys 0 .. past + i. past=0 is PyTorch's is_causal (the lower
    triangle from the top-left corner); the KV cache passes the number of cached keys."""
    return np.tril(np.ones((tq, tk), dtype=bool), k=past)


def attention_weights(q, k, mask=None, is_causal=False, scale=None, zero_empty_rows=False):
    """softmax(q @ k^T * scale) over the keys (scale: 1/sqrt(d) unless given), with
    disallowed positions at -inf before the softmax (so they get weight exactly 0).

    mask: a boolean tensor/array broadcastable to (..., Tq, Tk), True = may attend
    (PyTorch's convention), or a float mask that is added to the scores (a float tensor
    gets its gradient). A query that may attend to nothing gets nan weights (a softmax of
    nothing, as PyTorch's MultiheadAttention gives), or with zero_empty_rows weight 0 and
    no gradient (PyTorch's scaled_dot_product_attention).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(~_causal_mask(q.shape[-2], k.shape[-2]), -math.inf)
    if mask is not None:
        m = mask.array if isinstance(mask, Tensor) else np.asarray(mask)
        if m.dtype == bool:
            scores = scores.masked_fill(~m, -math.inf)
        else:
            scores = scores + (mask if isinstance(mask, Tensor)
                               else tt.tensor(m.astype(scores.dtype)))
    if not zero_empty_rows:
        return scores.softmax(-1)
    dead = np.all(scores.array == -math.inf, axis=-1, keepdims=True)  # rows with no key
    if dead.any():  # softmax would give nan: give those rows weight 0 (and no gradient)
        scores = tt.where(dead, 0.0, scores)
    weights = scores.softmax(-1)
    if dead.any():
        weights = tt.where(dead, 0.0, weights)
    return weights


@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's F.scaled_dot_product_attention: softmax(q k^T * scale + mask) v, from
    attention_weights (above).
    query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); scale defaults
    to 1/sqrt(E). attn_mask broadcasts to (..., L, S): a bool mask says True = may attend
    (the opposite of MultiheadAttention's), a float one is added to the scores (and gets
    its gradient). is_causal: query i attends to keys 0..i. A query that may attend to
    nothing gets zeros (PyTorch's answer), not nan. dropout_p drops attention weights
    whenever it is > 0 (pass 0.0 in eval mode, as PyTorch code does). enable_gqa: key and
    value may have fewer heads (dim -3) than query, each shared by a group of queries."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: explicit attn_mask should not be set "
                           "when is_causal=True")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]  # each key/value head serves `group` query heads

        def repeat(x):
            x = x.unsqueeze(-3)
            return x.expand(*x.shape[:-3], group, *x.shape[-2:]).flatten(-4, -3)
        key, value = repeat(key), repeat(value)
    weights = attention_weights(query, key, attn_mask, is_causal, scale, zero_empty_rows=True)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p)
    return weights @ value


def _mask_as_added(mask, shape, what, dtype):
    """A mask as an array added to the scores: a bool True means "may not attend" (-inf;
    PyTorch's convention for these modules), a float mask is added as it is."""
    m = mask.array if isinstance(mask, Tensor) else np.asarray(mask)
    if tuple(m.shape) != shape:
        raise ValueError(f"MultiheadAttention: {what} has shape {tuple(m.shape)}, expected {shape}")
    if m.dtype == bool:
        return np.where(m, -np.inf, 0.0).astype(dtype)
    if isinstance(mask, Tensor) and mask.requires_grad:  # added to the scores:
        return mask.to(dtype)  # it gets their gradient
    return m.astype(dtype)


class MultiheadAttention(Module):
    """PyTorch's nn.MultiheadAttention: attn_output, attn_weights = mha(query, key, value).
    Inputs (L, N, E) ((N, L, E) with batch_first, or unbatched (L, E)); kdim/vdim: the
    features of key and value when they differ from embed_dim (then the projections are
    q_proj_weight, k_proj_weight, v_proj_weight instead of one in_proj_weight)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        dtype = _factory(device, dtype, 'MultiheadAttention')
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim={embed_dim} must be divisible by "
                             f"num_heads={num_heads}")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are "
                                      "not supported")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, float(dropout)
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.head_dim, self.batch_first = embed_dim // num_heads, batch_first
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        E = embed_dim
        if self._qkv_same_embed_dim:  # the three projections stacked: q's rows, k's, v's
            self.in_proj_weight = Parameter(tt.zeros(3 * E, E, dtype=dtype))
        else:
            self.q_proj_weight = Parameter(tt.zeros(E, E, dtype=dtype))
            self.k_proj_weight = Parameter(tt.zeros(E, self.kdim, dtype=dtype))
            self.v_proj_weight = Parameter(tt.zeros(E, self.vdim, dtype=dtype))
        self.in_proj_bias = Parameter(tt.zeros(3 * E, dtype=dtype)) if bias else None
        self.out_proj = NonDynamicallyQuantizableLinear(E, E, bias=bias, dtype=dtype)
        self._reset_parameters()

    def _reset_parameters(self):  # PyTorch's: xavier for the projections, zero biases
        for w in ('in_proj_weight', 'q_proj_weight', 'k_proj_weight', 'v_proj_weight'):
            if w in vars(self):
                xavier_uniform_(getattr(self, w))
        if self.in_proj_bias is not None:
            zeros_(self.in_proj_bias)
            zeros_(self.out_proj.bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if is_causal and attn_mask is None:
            raise RuntimeError("MultiheadAttention: is_causal is a hint that attn_mask is the "
                               "causal mask; pass attn_mask too (nn.Transformer."
                               "generate_square_subsequent_mask(L))")
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: query, key and value must be all 3-D or all "
                             f"2-D (unbatched), got shapes {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        for x, name, size in ((query, 'query', self.embed_dim), (key, 'key', self.kdim),
                              (value, 'value', self.vdim)):
            if x.shape[-1] != size:
                raise ValueError(f"MultiheadAttention: {name} has {x.shape[-1]} features (shape "
                                 f"{tuple(x.shape)}), expected {size}")
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = (key_padding_mask.array if isinstance(key_padding_mask, Tensor)
                                    else np.asarray(key_padding_mask))[None]
        elif self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        (L, N, E), S, H, d = query.shape, key.shape[0], self.num_heads, self.head_dim
        if key.shape[1] != N or value.shape[1] != N or value.shape[0] != S:
            raise ValueError(f"MultiheadAttention: query, key and value must have one batch size "
                             f"and key and value one length; got (length, batch) {(L, N)}, "
                             f"{tuple(key.shape[:2])}, {tuple(value.shape[:2])}")
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else [None] * 3

        def heads(x):  # (T, N, E) -> (N, H, T, d): each head attends on its own d features
            return x.reshape(x.shape[0], N, H, d).permute(1, 2, 0, 3)

        q, k, v = linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)
        q, k, v = heads(q), heads(k), heads(v)
        mask = None  # attn_mask and key_padding_mask as one array added to the scores
        if attn_mask is not None and np.ndim(attn_mask.array if isinstance(attn_mask, Tensor)
                                             else attn_mask) == 2:
            mask = _mask_as_added(attn_mask, (L, S), 'attn_mask', q.dtype)  # the same for all
        elif attn_mask is not None:  # one (L, S) mask per batch item and head
            mask = _mask_as_added(attn_mask, (N * H if batched else H, L, S), 'attn_mask',
                                  q.dtype).reshape(N, H, L, S)
        if key_padding_mask is not None:  # (N, S): keys to ignore, for every query and head
            pad = _mask_as_added(key_padding_mask, (N, S), 'key_padding_mask', q.dtype)
            mask = pad.reshape(N, 1, 1, S) if mask is None else mask + pad.reshape(N, 1, 1, S)
        weights = attention_weights(q, k, mask)  # (N, H, L, S)
        if self.training and self.dropout:
            weights = dropout(weights, self.dropout)
        out = (weights @ v).permute(2, 0, 1, 3).reshape(L, N, E)  # heads side by side again
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = weights.mean(1) if average_attn_weights else weights
        return out, (weights if batched else weights.squeeze(0))


def _activation(activation, name):
    if callable(activation):
        return activation
    if activation == 'relu':
        return relu
    if activation == 'gelu':
        return gelu
    raise ValueError(f"{name}: activation should be 'relu', 'gelu' or a callable, got {activation!r}")


class TransformerEncoderLayer(Module):
    """Self-attention, then a two-layer MLP (d_model -> dim_feedforward -> d_model), each
    with dropout, a residual connection and a LayerNorm (after the sum; before the
    sublayer with norm_first=True)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        dtype = _factory(device, dtype, type(self).__name__)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.activation = _activation(activation, 'TransformerEncoderLayer')

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """Self-attention on the target, attention from the target to the encoder's output
    (memory), then the MLP; each with dropout, a residual connection and a LayerNorm."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        dtype = _factory(device, dtype, type(self).__name__)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _activation(activation, 'TransformerDecoderLayer')

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, need_weights=False,
                                is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer (each with its own parameters), then norm."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        # enable_nested_tensor and mask_check steer PyTorch's fast path for padded batches
        # (the same numbers); tinytorch has one path, so they are kept and change nothing
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """num_layers copies of decoder_layer (each with its own parameters), then norm."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """The encoder-decoder Transformer of "Attention Is All You Need", PyTorch's
    nn.Transformer: output = decoder(tgt, encoder(src))."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation=relu, custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        dtype = _factory(device, dtype, 'Transformer')
        args = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                    layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                    norm_first=norm_first, bias=bias, dtype=dtype)
        if custom_encoder is None:
            custom_encoder = TransformerEncoder(
                TransformerEncoderLayer(d_model, nhead, **args), num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        if custom_decoder is None:
            custom_decoder = TransformerDecoder(
                TransformerDecoderLayer(d_model, nhead, **args), num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self.encoder, self.decoder = custom_encoder, custom_decoder
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():  # PyTorch's: xavier for every matrix
            if p.ndim > 1:
                xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[batch] != tgt.shape[batch]:
            raise ValueError(f"Transformer: src has batch size {src.shape[batch]} but tgt has "
                             f"{tgt.shape[batch]} (shapes {tuple(src.shape)}, {tuple(tgt.shape)})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"Transformer: src and tgt must have d_model={self.d_model} "
                             f"features, got shapes {tuple(src.shape)}, {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, dtype=None):
        """(sz, sz) float mask: 0 where position i may look (j <= i), -inf above the diagonal."""
        return tt.tensor(np.triu(np.full((sz, sz), -np.inf), k=1), dtype=dtype or tt.default_dtype)


# ---------------------------------------------------------------------------
# 5. Losses
# ---------------------------------------------------------------------------
def _reduce(loss, reduction, op):
    if reduction == 'mean':
        return loss.mean()
    if reduction == 'sum':
        return loss.sum()
    if reduction == 'none':
        return loss
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def mse_loss(input, target, size_average=None, reduce=None, reduction='mean', weight=None):
    """(input - target)^2; weight (input's shape) scales each element, and 'mean' then
    divides by its sum (PyTorch's). size_average and reduce: PyTorch's old reduction."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if input.shape != target.shape:  # as PyTorch: a warning, then the two broadcast
        try:
            shape = np.broadcast_shapes(input.shape, target.shape)
        except ValueError:
            raise RuntimeError(f"mse_loss: the size of tensor a (input, shape {tuple(input.shape)}) "
                               f"and of tensor b (target, shape {tuple(target.shape)}) do not "
                               "broadcast") from None
        warnings.warn(f"Using a target size {tuple(target.shape)} that is different to the input "
                      f"size {tuple(input.shape)}. This will likely lead to incorrect results due "
                      "to broadcasting. Please ensure they have the same size.", stacklevel=2)
        input, target = input.expand(shape), target.expand(shape)
    input, target = tt._operands(input, target)
    with np.errstate(invalid='ignore', over='ignore'):  # inf - inf = nan, 1e30^2 = inf, silently
        d = input.array - target.array
        squares = d * d

    def backward(g):
        """d (x - y)^2/dx = 2 (x - y)
        d (x - y)^2/dy = -2 (x - y)"""
        gd = 2 * g * d
        return gd if input.requires_grad else None, -gd if target.requires_grad else None
    # saved: PyTorch's rule reads both, so an in-place change to either raises there too
    loss = from_op(squares, 'mse_loss', (input, target), backward, saved=(input, target))
    if _weights(weight, input, 'mse_loss') is None:
        return _reduce(loss, reduction, 'mse_loss')
    loss = loss * weight
    return loss.sum() / weight.sum() if reduction == 'mean' else _reduce(loss, reduction, 'mse_loss')


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
@np.errstate(invalid='ignore')  # a row with an inf: inf - inf = nan, silently, as PyTorch
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction='mean', label_smoothing=0.0):
    """Fused log-softmax + negative log-likelihood, on (N, C) logits and N class indices.

    loss_i = logsumexp(z_i) - z_i[t_i], computed with the max subtracted (stable for
    logits of +-1e4). Its gradient is short and exact:
        d loss_i / d z_i = softmax(z_i) - onehot(t_i).
    weight (C,) scales class c's loss by weight[c]; 'mean' then divides by the sum
    of the weights of the targets (PyTorch's weighted mean). label_smoothing e mixes
    the one-hot target with a uniform one: loss_i = (1 - e) nll_i + e/C sum_c w_c (lse_i - z_ic).
    Rows whose target is ignore_index contribute nothing and get a zero gradient,
    even when every row is ignored (the loss is then nan, the gradient 0, as PyTorch).

    Other shapes are brought to this one: (N, C, d1, ...) logits with (N, d1, ...)
    targets (an image's pixels, a sequence's positions) become rows, as does one (C,)
    sample with a 0-d target. A float target of the input's shape holds class
    probabilities: loss = -sum_c w_c target_c log_softmax(z)_c, composed of tensor ops.
    size_average and reduce are PyTorch's old spelling of reduction.
    """
    reduction = _legacy_reduction(size_average, reduce, reduction)
    t = target.array if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind == 'f':
        return _cross_entropy_probabilities(input, target, weight, ignore_index, reduction,
                                            label_smoothing)
    if input.ndim != 2 and input.ndim >= 1:
        if input.ndim == 1:  # one sample
            rows, expected = input[None], ()
        else:  # the class dim last, then one row per (n, d1, ...)
            rows = input.permute(0, *range(2, input.ndim), 1).reshape(-1, input.shape[1])
            expected = input.shape[:1] + input.shape[2:]
        if t.shape != expected:
            raise ValueError(f"cross_entropy: logits of shape {tuple(input.shape)} need targets "
                             f"of shape {expected}, got {tuple(t.shape)}")
        loss = cross_entropy(rows, t.reshape(-1), weight, ignore_index=ignore_index,
                             reduction=reduction, label_smoothing=label_smoothing)
        return loss.reshape(expected) if reduction == 'none' else loss
    logits = input
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C), (N, C, d1, ...) or (C,), got "
                         f"shape {tuple(logits.shape)}")
    t = target.array if isinstance(target, Tensor) else np.asarray(target)
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
    w = None if weight is None else weight.array.copy()  # a copy: backward reads it
    w_t = valid if w is None else w[safe_t] * valid  # each row's weight, 0 if ignored
    eps = label_smoothing
    shifted = logits.array - logits.array.max(axis=1, keepdims=True)
    e = np.exp(shifted)  # softmax numerators, kept for backward
    sumexp = sum_last(e)  # (N, 1)
    lse = np.log(sumexp[:, 0])
    logp = shifted - lse[:, None]  # log_softmax
    # ignored rows add 0, chosen by np.where: a mask's 0 * nan would be nan when such a
    # row's logits are nan or inf. nll_i = -logp (not lse - z): -0.0 where logp is 0, as PyTorch
    loss = np.where(valid, -logp[rows, safe_t] * w_t, 0.0)  # w_t[i] * nll_i
    if eps:  # the uniform part: e/C sum_c w_c (lse_i - z_ic)
        smooth = -logp.sum(axis=1) if w is None else -(logp * w).sum(axis=1)
        loss = (1 - eps) * loss + (eps / c) * np.where(valid, smooth, 0.0)
    total = w_t.sum()  # 'mean' divides by the total weight (the count when unweighted)
    if reduction == 'mean':
        with np.errstate(divide='ignore', invalid='ignore'):
            out = (loss.sum() / total).astype(logits.dtype)  # nan if every row is ignored
    else:
        out = loss.sum() if reduction == 'sum' else loss

    def backward(g):
        """d loss_i/d z_i = w_t (softmax(z_i) - onehot(t_i))  (divided by the total weight for 'mean'; 0 for ignored rows)"""
        # As PyTorch's log_softmax rule: p_i sum(q_i) - q_i, where q_i is the row's target
        # weights, (1 - e) w_t onehot(t_i) + e/C w, times the row's upstream gradient s_i.
        # So one class gives exactly 0, and s_i = inf gives nan at the target, as there.
        if reduction == 'mean':
            scale = g / total if total else np.zeros_like(g)  # all rows ignored: nan loss, no gradient
        else:
            scale = g
        # s_i is 0 for an ignored row even when g is nan or inf (np.where, not a mask); that
        # row's gradient is then softmax * 0, nan only where its softmax is (as PyTorch's)
        s = np.where(valid, scale, 0.0).astype(logits.dtype)  # (N,)
        q = np.zeros_like(e)
        if eps:
            q += (eps / c) * (1 if w is None else w) * s[:, None]
        q[rows, safe_t] += (1 - eps) * w_t * s  # set only at the target: 0 * inf elsewhere would be nan
        return (e / sumexp * sum_last(q) - q,)  # softmax(z) sum(q) - q
    return from_op(out, 'cross_entropy', (logits,), backward)  # reads only its own arrays


def _cross_entropy_probabilities(input, target, weight, ignore_index, reduction, smoothing):
    """cross_entropy with class probabilities as the target (soft labels)."""
    if not isinstance(target, Tensor):
        target = tt.tensor(np.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(f"cross_entropy: a probability target must have the input's shape "
                         f"{tuple(input.shape)}, got {tuple(target.shape)}")
    if ignore_index != -100:
        raise ValueError("cross_entropy: ignore_index is not supported for probability targets")
    if reduction not in ('mean', 'sum', 'none'):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    d = 1 if input.ndim >= 2 else 0  # the class dim
    c = input.shape[d]
    if smoothing:
        target = target * (1 - smoothing) + smoothing / c
    terms = input.log_softmax(d) * target
    if weight is not None:
        if weight.shape != (c,):
            raise ValueError(f"cross_entropy: weight must have shape ({c},), one per class, "
                             f"got {tuple(weight.shape)}")
        terms = terms * weight.reshape((c,) + (1,) * (input.ndim - d - 1))
    return _reduce(-terms.sum(d), reduction, 'cross_entropy')  # 'mean': over N, d1, ...


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction='mean', pos_weight=None):
    """-[y log sigma(x) + (1 - y) log(1 - sigma(x))] = (1 - y) x - log sigma(x), computed
    as PyTorch does: log sigma(x) = min(x, 0) - log(1 + exp(-|x|)) is stable, an infinite
    logit gives PyTorch's inf or nan, and each step is rounded to the target's dtype (PyTorch
    computes in place on 1 - y), so the result has the target's dtype. Its gradient is
    sigma(x) - y for x and -x for the target y (a target that requires grad gets it).
    weight scales each element's loss (broadcast); pos_weight (one per class, the last
    dim) weighs the positive term: (1 - y) x - (1 + (pos_weight - 1) y) log sigma(x)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    per_elem = _bce_with_logits(input, target) if pos_weight is None else \
        _bce_with_logits_pos_weight(input, target, pos_weight)
    if weight is not None:
        per_elem = per_elem * weight
    return _reduce(per_elem, reduction, 'binary_cross_entropy_with_logits')


def _bce_with_logits_pos_weight(input, target, pos_weight):
    """pos_weight's loss as a composition (its gradient follows): -log sigma(x) is
    softplus(-x) = max(-x, 0) + log(1 + exp(-|x|))."""
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if target.shape != input.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: logits shape {tuple(input.shape)} "
                         f"and target shape {tuple(target.shape)} differ")
    neg_log_sigmoid = (-input).clamp(min=0) + (-input.abs()).exp().log1p()
    return (1 - target) * input + (1 + (pos_weight - 1) * target) * neg_log_sigmoid


def _bce_with_logits(input, target):
    logits = input
    if not isinstance(target, Tensor):
        target = tt.tensor(np.asarray(target, dtype=logits.dtype))
    if target.shape != logits.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: logits shape {tuple(logits.shape)} "
                         f"and target shape {tuple(target.shape)} differ")
    if target.dtype.kind != 'f':  # the result takes the target's dtype
        raise RuntimeError(f"binary_cross_entropy_with_logits: the target must be a float "
                           f"tensor (probabilities), got {target.dtype}; use target.float()")
    x, y = logits.array, target.array
    e = np.exp(-np.abs(x))  # never overflows
    log_sigmoid = np.minimum(x, 0) - np.log1p(e)
    with np.errstate(invalid='ignore'):  # 0 * inf and inf - inf: nan, as in PyTorch
        loss = ((1 - y) * x).astype(y.dtype, copy=False)
        loss = (loss - log_sigmoid).astype(y.dtype, copy=False)
    sig = tt._sigmoid_of(x)  # as tt.sigmoid computes it

    def backward(g):
        """d bce/dx = sigmoid(x) - y
        d bce/dy = -x"""
        return (g * (sig - y)).astype(x.dtype, copy=False), (-g * x).astype(y.dtype, copy=False)
    return from_op(loss, 'bce_with_logits', (logits, target), backward, saved=(logits, target))


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction='mean'):
    """-w [y log p + (1 - y) log(1 - p)] for probabilities p (after a sigmoid); each log is
    clamped at -100, as PyTorch, so p = 0 or 1 gives a finite loss. Prefer
    binary_cross_entropy_with_logits on the logits: it is stable."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if target.shape != input.shape:
        raise ValueError(f"binary_cross_entropy: target size {tuple(target.shape)} must be the "
                         f"input size {tuple(input.shape)}")
    if input.dtype.kind != 'f':
        raise NotImplementedError(f"binary_cross_entropy: not implemented for {input.dtype} input "
                                  "(as in PyTorch): it takes probabilities, a float tensor")
    if ((input.array < 0) | (input.array > 1)).any():
        raise RuntimeError("binary_cross_entropy: all elements of input should be between 0 "
                           "and 1 (probabilities; for logits use binary_cross_entropy_with_logits)")
    if target.dtype != input.dtype:
        raise RuntimeError(f"binary_cross_entropy: target is {target.dtype} but input is "
                           f"{input.dtype}; they must have the same dtype (target.to(input.dtype))")
    p, y = input.array, target.array
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # inf * 0, silently
        log_p, log_q = np.maximum(np.log(p), -100), np.maximum(np.log1p(-p), -100)
        loss = -(y * log_p + (1 - y) * log_q)

    def backward(g):
        """d bce/dp = (p - y) / max(p (1 - p), 1e-12)  (PyTorch's guard at p = 0 or 1)
        d bce/dy = log(1 - p) - log(p)  (each log clamped at -100)"""
        gp = g * (p - y) / np.maximum(p * (1 - p), 1e-12)
        return gp.astype(p.dtype, copy=False), (g * (log_q - log_p)).astype(y.dtype, copy=False)
    loss = from_op(loss.astype(p.dtype, copy=False), 'binary_cross_entropy', (input, target),
                   backward, saved=(input, target))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, 'binary_cross_entropy')


def _legacy_reduction(size_average, reduce, reduction):
    """PyTorch's old size_average / reduce arguments, read as a reduction."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is False:
        return 'none'
    return 'sum' if size_average is False else 'mean'


def _pair(input, target, op):
    """target as a tensor; shapes that differ broadcast, with PyTorch's warning."""
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if target.shape != input.shape:
        warnings.warn(f"{op}: target size {tuple(target.shape)} differs from input size "
                      f"{tuple(input.shape)}; they will be broadcast, which is often a mistake",
                      stacklevel=3)
    return target


def _weights(weight, input, op):
    if weight is not None and weight.shape != input.shape:
        raise ValueError(f"{op}: weight of shape {tuple(weight.shape)} must have the input's "
                         f"shape {tuple(input.shape)}")
    return weight


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def l1_loss(input, target, size_average=None, reduce=None, reduction='mean', weight=None):
    """|input - target| (its gradient sign(input - target), 0 where they are equal).
    weight (input's shape) scales each element; 'mean' then divides by its sum."""
    target = _pair(input, target, 'l1_loss')
    reduction = _legacy_reduction(size_average, reduce, reduction)
    with np.errstate(invalid='ignore', over='ignore'):  # inf - inf = nan, silently, as PyTorch
        loss = (input - target).abs()
    if _weights(weight, input, 'l1_loss') is None:
        return _reduce(loss, reduction, 'l1_loss')
    loss = loss * weight
    return loss.sum() / weight.sum() if reduction == 'mean' else _reduce(loss, reduction, 'l1_loss')


def _huber(input, target, delta, op):
    """0.5 d^2 where |d| < delta, else delta (|d| - delta / 2), for d = input - target
    (broadcast): quadratic near 0, linear (so robust to outliers) beyond delta."""
    input, target = tt._operands(input, target)
    with np.errstate(invalid='ignore', over='ignore'):  # |nan| < delta: nan, as in PyTorch
        d = input.array - target.array
        ad = np.abs(d)
        small = ad < delta
        out = np.where(small, 0.5 * d * d, delta * (ad - 0.5 * delta)).astype(d.dtype)

    def backward(g):
        """d huber/d input = d where |d| < delta, else delta sign(d)
        d huber/d target = -d where |d| < delta, else -delta sign(d)"""
        gd = g * np.where(small, d, delta * np.sign(d))
        return (tt.unbroadcast(gd, input.shape) if input.requires_grad else None,
                tt.unbroadcast(-gd, target.shape) if target.requires_grad else None)
    return from_op(out, op, (input, target), backward, saved=(input, target))  # as PyTorch's


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction='mean', beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (d = input - target): Huber's
    loss divided by beta, and l1_loss for beta = 0."""
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    target = _pair(input, target, 'smooth_l1_loss')
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if beta == 0:
        return l1_loss(input, target, reduction=reduction)
    return _reduce(_huber(input, target, beta, 'smooth_l1') / beta, reduction, 'smooth_l1_loss')


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def huber_loss(input, target, reduction='mean', delta=1.0, weight=None):
    """0.5 d^2 where |d| < delta, else delta (|d| - delta / 2), d = input - target.
    weight (input's shape) scales each element ('mean' still divides by the count)."""
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be > 0, got {delta}")
    target = _pair(input, target, 'huber_loss')
    loss = _huber(input, target, delta, 'huber')
    if isinstance(input, Tensor) and input.dtype.kind == 'f' and loss.dtype != input.dtype:
        loss = loss.to(input.dtype)  # PyTorch's huber_loss keeps input's dtype (no promotion)
    if _weights(weight, input, 'huber_loss') is not None:
        loss = loss * weight
    return _reduce(loss, reduction, 'huber_loss')


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction='mean'):
    """Negative log-likelihood: loss_i = -weight[t_i] * input[i, t_i], where input holds
    log-probabilities: (N, C) with N targets, (N, C, d1, ...) with targets (N, d1, ...),
    or (C,) with one 0-d target. 'mean' divides by the sum of the targets' weights;
    targets equal to ignore_index contribute 0 (nan for 'mean' if all are ignored)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ('mean', 'sum', 'none'):
        raise ValueError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    t = target.array if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in 'iu':
        raise TypeError(f"nll_loss: targets must be integer class indices, got {t.dtype}")
    if input.ndim == 1:  # one sample: (C,) and a 0-d target
        if t.ndim != 0:
            raise ValueError(f"nll_loss: input of shape {tuple(input.shape)} needs a 0-d target, "
                             f"got shape {tuple(t.shape)}")
        return nll_loss(input[None], t[None], weight, ignore_index=ignore_index,
                        reduction=reduction).reshape(())  # 'none' gives (1,): one 0-d loss
    if input.ndim == 0 or t.shape != input.shape[:1] + input.shape[2:]:
        raise ValueError(f"nll_loss: input of shape {tuple(input.shape)} needs targets of shape "
                         f"{tuple(input.shape[:1] + input.shape[2:])}, got {tuple(t.shape)}")
    c = input.shape[1]
    if weight is not None:
        tt._same_dtype('nll_loss', input=input, weight=weight)
        if weight.shape != (c,):
            raise ValueError(f"nll_loss: weight must have shape ({c},), one per class, "
                             f"got {tuple(weight.shape)}")
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= c))
    if bad.any():
        raise IndexError(f"nll_loss: target {t[bad][0]} is out of range for {c} classes")
    safe_t = np.where(valid, t, 0)
    picked = input.gather(1, tt.tensor(safe_t[:, None])).squeeze(1)  # input[i, t_i]
    w_t = np.where(valid, 1 if weight is None else weight.array[safe_t], 0).astype(input.dtype)
    # select, not multiply by a 0/1 mask: an ignored row's nan or inf stays out
    loss = tt.where(valid, -picked if weight is None else -(picked * w_t), 0.0)
    if reduction == 'none':
        return loss
    if reduction == 'sum':
        return loss.sum()
    total = w_t.sum()
    return loss.sum() / total if total else loss.sum() * np.nan  # PyTorch's 0 / 0


@tt._autocast_op('float32')  # inside torch.autocast: in float32 (tinytorch.py section 6b)
def kl_div(input, target, size_average=None, reduce=None, reduction='mean', log_target=False):
    """Kullback-Leibler divergence of the target distribution from the input one, with
    input as log-probabilities: target (log target - input) pointwise, taking
    0 log 0 = 0. log_target: the target is given as log-probabilities too.
    'batchmean' divides the sum by the batch size (the true KL per sample); 'mean'
    divides by the number of elements, as in PyTorch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ('mean', 'sum', 'none', 'batchmean'):
        raise ValueError(f"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', "
                         f"got {reduction!r}")
    if reduction == 'mean':
        warnings.warn("kl_div: reduction='mean' divides by the number of elements, not the "
                      "batch size; 'batchmean' gives the KL divergence per sample", stacklevel=2)
    target = target if isinstance(target, Tensor) else tt.tensor(target, dtype=input.dtype)
    if input.dtype.kind != 'f' or target.dtype.kind != 'f':
        raise RuntimeError(f"kl_div: integral inputs are not supported (as in PyTorch), got "
                           f"{input.dtype} and {target.dtype}; convert them with .float()")
    loss = _kl_pointwise(input, target, log_target)
    if reduction == 'batchmean':
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction, 'kl_div')


def _kl_pointwise(input, target, log_target):
    input, target = tt._operands(input, target)
    x, y = input.array, target.array
    with np.errstate(divide='ignore', invalid='ignore', over='ignore'):  # silently, as PyTorch
        if log_target:
            ey = np.exp(y)
            out = ey * (y - x)
            gx, gy = -ey, ey * (y - x + 1)
        else:
            # y log y is taken as 0 at y = 0 (xlogy). Its derivative, written as PyTorch's
            # xlogy rule writes it (log y, 0 at y = 0, plus y / y), is nan at y = 0 and inf.
            logy = np.log(y)
            out = np.where(y == 0, 0, y * logy) - y * x
            gx, gy = -y, None

    def backward(g):
        """d kl/d input = -target  (-exp(target) with log_target)
        d kl/d target = log(target) + 1 - input  (exp(target) (target - input + 1) with log_target)"""
        with np.errstate(divide='ignore', invalid='ignore'):
            # g log y is xlogy(g, y): 0 where g is 0, even where log y is nan (y < 0)
            dy = g * gy if log_target else (np.where((g == 0) & ~np.isnan(y) | (y == 0), 0, g * logy)
                                             + g * y / y - g * x)
        return (tt.unbroadcast(g * gx, input.shape) if input.requires_grad else None,
                tt.unbroadcast(dy, target.shape) if target.requires_grad else None)
    return from_op(out.astype(x.dtype), 'kl_div', (input, target), backward, saved=(input, target))


class MSELoss(Module):
    def __init__(self, size_average=None, reduce=None, reduction='mean'):
        self.reduction = _legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return mse_loss(input, target, reduction=self.reduction)


class CrossEntropyLoss(Module):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction='mean', label_smoothing=0.0):
        self.weight, self.ignore_index = weight, ignore_index
        self.reduction = _legacy_reduction(size_average, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction='mean',
                 pos_weight=None):
        self.reduction = _legacy_reduction(size_average, reduce, reduction)
        self.register_buffer('weight', weight)  # buffers, as PyTorch's: Module.to casts them
        self.register_buffer('pos_weight', pos_weight)

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight,
                                                reduction=self.reduction,
                                                pos_weight=self.pos_weight)


class BCELoss(Module):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction='mean'):
        self.weight, self.reduction = weight, _legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class L1Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction='mean'):
        self.reduction = _legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction='mean', beta=1.0):
        self.reduction, self.beta = _legacy_reduction(size_average, reduce, reduction), beta

    def forward(self, input, target):
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(Module):
    def __init__(self, reduction='mean', delta=1.0):
        self.reduction, self.delta = reduction, delta

    def forward(self, input, target):
        return huber_loss(input, target, self.reduction, self.delta)


class NLLLoss(Module):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction='mean'):
        self.weight, self.ignore_index = weight, ignore_index
        self.reduction = _legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return nll_loss(input, target, self.weight, ignore_index=self.ignore_index,
                        reduction=self.reduction)


class KLDivLoss(Module):
    def __init__(self, size_average=None, reduce=None, reduction='mean', log_target=False):
        self.reduction = _legacy_reduction(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


# ---------------------------------------------------------------------------
# 6. Initialisers: in place, under no_grad, with the library's seeded generator (or the
#    one passed as generator=); nn.init is a module holding them, as torch.nn.init
# ---------------------------------------------------------------------------
def _calculate_fan_in_and_fan_out(tensor):
    """PyTorch's fans: fan_in = size(1) * receptive field, fan_out = size(0) * receptive
    field, where the receptive field is the product of the dims after the first two
    (a conv kernel's kh * kw; 1 for a matrix, which is (out, in))."""
    if tensor.ndim < 2:
        raise ValueError(f"Fan in and fan out can not be computed for tensor with fewer than "
                         f"2 dimensions, got shape {tuple(tensor.shape)}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


_fans = _calculate_fan_in_and_fan_out


def _fan(tensor, mode):
    if mode not in ('fan_in', 'fan_out'):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    return _fans(tensor)[0 if mode == 'fan_in' else 1]


# the gain that keeps the variance of activations through a layer followed by each
# nonlinearity (PyTorch's table; leaky_relu's slope is param, 0.01 by default)
_GAINS = {'linear': 1.0, 'conv1d': 1.0, 'conv2d': 1.0, 'conv3d': 1.0, 'conv_transpose1d': 1.0,
          'conv_transpose2d': 1.0, 'conv_transpose3d': 1.0, 'sigmoid': 1.0, 'tanh': 5.0 / 3,
          'relu': math.sqrt(2.0), 'selu': 3.0 / 4}


def calculate_gain(nonlinearity, param=None):
    if nonlinearity == 'leaky_relu':
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in _GAINS:
        raise ValueError(f"Unsupported nonlinearity {nonlinearity}")
    return _GAINS[nonlinearity]


def _rng(generator):
    """The NumPy generator to draw from: the library's, or the one given (a tt.Generator
    or NumPy's: anything with NumPy's Generator methods)."""
    rng = tt._numpy_rng(generator)
    if not all(hasattr(rng, m) for m in ('uniform', 'standard_normal')):
        raise TypeError(f"generator must be a tinytorch or NumPy Generator, got "
                        f"{type(generator).__name__}")
    return rng


def _empty_is_no_op(tensor):
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op")
        return True
    return False


@no_grad()
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    return tensor.uniform_(a, b, generator=_rng(generator))  # Tensor.uniform_'s draw


@no_grad()
def normal_(tensor, mean=0.0, std=1.0, generator=None):
    return tensor.normal_(mean, std, generator=_rng(generator))  # Tensor.normal_'s draw


@no_grad()
def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """N(mean, std) restricted to [a, b]: draws outside are drawn again."""
    rng = _rng(generator)
    cdf = lambda v: 0.5 * (1 + math.erf((v - mean) / (std * math.sqrt(2))))
    if cdf(b) - cdf(a) < 0.01:  # far in a tail: by the inverse CDF, one element at a time
        dist = NormalDist(mean, std)
        u = rng.uniform(cdf(a), cdf(b), tensor.shape)
        draw = np.clip(np.vectorize(dist.inv_cdf, otypes=[float])(u), a, b)
        return tensor.copy_(draw.astype(tensor.dtype))
    draw = rng.standard_normal(tensor.shape) * std + mean
    outside = (draw < a) | (draw > b)
    while outside.any():
        draw[outside] = rng.standard_normal(int(outside.sum())) * std + mean
        outside = (draw < a) | (draw > b)
    return tensor.copy_(draw.astype(tensor.dtype))


@no_grad()
def constant_(tensor, val):
    return tensor.fill_(val)


@no_grad()
def zeros_(tensor):
    return tensor.zero_()


@no_grad()
def ones_(tensor):
    return tensor.fill_(1.0)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a) with a = gain sqrt(6 / (fan_in + fan_out)): the variance 2 / (fan_in +
    fan_out) keeps activations' and gradients' scale (Glorot and Bengio, 2010)."""
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def kaiming_uniform_(tensor, a=0.0, mode='fan_in', nonlinearity='leaky_relu', generator=None):
    """U(-bound, bound) with bound = gain sqrt(3 / fan): the variance gain^2 / fan keeps the
    scale through a layer and its nonlinearity (He et al., 2015)."""
    if _empty_is_no_op(tensor):
        return tensor
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / _fan(tensor, mode))
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode='fan_in', nonlinearity='leaky_relu', generator=None):
    if _empty_is_no_op(tensor):
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)


@no_grad()
def orthogonal_(tensor, gain=1.0, generator=None):
    """A (semi-)orthogonal matrix (the tensor flattened to (rows, rest)), times gain: the
    Q of a Gaussian matrix's QR, its columns' signs fixed by R's diagonal, as PyTorch."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    flat = _rng(generator).standard_normal((rows, tensor.numel() // rows))
    wide = rows < flat.shape[1]  # QR of the tall one, then transposed back
    q, r = np.linalg.qr(flat.T if wide else flat)
    q = q * np.sign(np.diag(r))
    q = q.T if wide else q
    return tensor.copy_((gain * q).reshape(tensor.shape).astype(tensor.dtype))


init = types.ModuleType('tinytorch.nn.init', "PyTorch's torch.nn.init: initialisers that "
                        "fill a tensor in place")
for _f in (uniform_, normal_, trunc_normal_, constant_, zeros_, ones_, xavier_uniform_,
           xavier_normal_, kaiming_uniform_, kaiming_normal_, orthogonal_, calculate_gain,
           _calculate_fan_in_and_fan_out):
    setattr(init, _f.__name__, _f)


# ---------------------------------------------------------------------------
# 7. Checkpoints: nn.save / nn.load (.npz or .safetensors) live in files.py, the one
#    room for files (their reading is files.py's grammar); these names call it, importing
#    it when first used (without files.py beside tinytorch.py: one line saying so)
# ---------------------------------------------------------------------------
def save(obj, path):
    """Write a state_dict or a training checkpoint to path (.npz, or .safetensors when
    path ends so), atomically: files.save."""
    return tt._companion('files').save(obj, path)


def load(path):
    """Read what nn.save wrote; never unpickles (files.load). A bad file: CheckpointError."""
    return tt._companion('files').load(path)


def save_safetensors(tensors, path, metadata=None):
    """Write name -> tensor as Hugging Face's .safetensors, atomically (files.py)."""
    return tt._companion('files').save_safetensors(tensors, path, metadata)


def load_safetensors(path):
    """(name -> array, metadata) of a .safetensors file, every field checked (files.py)."""
    return tt._companion('files').load_safetensors(path)


def __getattr__(name):
    """nn.CheckpointError: files.py's, which a bad checkpoint raises (imported when asked)."""
    if name == 'CheckpointError':
        return tt._companion('files').CheckpointError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------
# 8. Speed: conv2d and max_pool2d as single ops; a recurrent layer's loop as one op
# ---------------------------------------------------------------------------
# nn.conv2d and nn.max_pool2d (section 2) are compositions a learner can follow:
# unfold, matmul, reshape, max. The functions below give the same numbers (a test
# proves it) in one op each, with a hand-derived backward. NumPy is slow on the
# short rows of small images (8 numbers a row for 8x8 digits): a loop over 8 numbers
# costs more than the arithmetic. So the stride-1 convolution works on each image
# flattened with its padded width: kernel element (i, j) then reads one contiguous run
# of the flat image, starting i*Wp + j further on, instead of H short rows. Output
# positions that fall in the padding columns are computed too, and dropped.
# tt.fast = False (the one speed switch; TINYTORCH_PLAIN=1) runs the compositions instead.


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
        input.array.transpose(1, 0, 2, 3)
    # kernel element (i, j) reads the flat image from i*dh rows and j*dw columns on
    starts = [i * dh * wp + j * dw for i in range(kh) for j in range(kw)]
    cols = np.empty((kh * kw, c, n, run), dtype=input.dtype)  # rows: kernel element, channel
    for k, start in enumerate(starts):
        cols[k] = xp[:, :, start:start + run]  # (one contiguous block a kernel element)
    cols = cols.reshape(kh * kw * c, n * run)
    w2 = weight.array.transpose(0, 2, 3, 1).reshape(o, -1)  # (O, kh*kw*C): cols' row order
    out = w2 @ cols
    if bias is not None:  # (added to the padding columns too: one contiguous pass, 5x faster
        out += bias.array[:, None]  # than on the strided view without them)
    out = out.reshape(o, n, oh, wp)[..., :ow]  # drop the padding columns

    def backward(g):
        """d conv2d/d input: W^T g, each column folded back where it was read
        d conv2d/d weight: g @ cols^T  (summed over every position)
        d conv2d/d bias = 1  (g summed over the batch and every position)"""
        # g with zeros in the padding columns, one row per position (as cols' columns): BLAS
        # takes cols @ gw twice as fast as gw^T @ cols^T, the same product transposed
        gw = np.zeros((n, oh, wp, o), dtype=g.dtype)
        gw[:, :, :ow] = g.transpose(0, 2, 3, 1)
        gw = gw.reshape(n * run, o)
        gx = gweight = gb = None
        if input.requires_grad:
            gcols = (w2.T @ gw.T).reshape(kh * kw, c, n, run)
            gp = np.zeros_like(xp)
            for k, start in enumerate(starts):  # each column back where it was read
                gp[:, :, start:start + run] += gcols[k]
            gp = gp[:, :, :hp * wp].reshape(c, n, hp, wp)[:, :, ph:ph + h, pw:pw + w]
            gx = np.ascontiguousarray(gp.transpose(1, 0, 2, 3))
        if weight.requires_grad:
            gweight = (cols @ gw).reshape(kh, kw, c, o).transpose(3, 2, 0, 1).copy()
        if bias is not None and bias.requires_grad:
            gb = g.sum(axis=(0, 2, 3))
        return gx, gweight, gb
    parents = (input, weight) if bias is None else (input, weight, bias)
    return from_op(np.ascontiguousarray(out.transpose(1, 0, 2, 3)), 'conv2d', parents, backward,
                   saved=(weight,))  # cols is a copy of the input, made in the forward pass


def max_pool2d_fused(input, win):
    """nn.max_pool2d as one op: a running maximum over the kh*kw strided slices of the
    padded image (one slice per kernel element), remembering which slice won. Each slice
    is copied to a contiguous array first, and the winner is kept by arithmetic, not by a
    masked copy: on strided rows of 4 numbers, and with a branch per element that the
    processor can't predict, NumPy took 4x longer."""
    (ph, pw) = win.padding
    x = np.pad(input.array, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf) \
        if ph or pw else input.array
    slices = [tt._window_slice(win, i, j) for i in range(win.kernel[0]) for j in range(win.kernel[1])]
    apart = all(s >= (k - 1) * d + 1 for s, k, d in zip(win.stride, win.kernel, win.dilation))
    parts = [np.ascontiguousarray(x[(..., *s)]) for s in slices]
    out = parts[0].copy()
    winner = np.zeros(out.shape, dtype=np.min_scalar_type(len(parts) - 1))  # which slice won
    for k, part in enumerate(parts[1:], 1):
        bigger = part > out  # strictly: the first maximum keeps a tie, as PyTorch
        np.maximum(out, part, out=out)  # (a nan wins: np.maximum keeps it)
        winner += bigger * (k - winner)  # k where bigger, else unchanged
    if out.dtype.kind == 'f' and np.isnan(out).any():  # a window with a nan: its first nan
        for k in range(len(parts) - 1, -1, -1):  # won (as max(dim)'s index)
            winner[np.isnan(parts[k])] = k

    def backward(g):
        """d max_pool2d/dx = 1 at the element that won each window, else 0"""
        gx = np.zeros(x.shape, dtype=g.dtype)
        for k, s in enumerate(slices):
            if apart:  # each element is in one window at most: written once, not added to
                np.multiply(winner == k, g, out=gx[(..., *s)])
            else:
                gx[(..., *s)] += (winner == k) * g
        h, w = input.shape[2:]
        return (gx[:, :, ph:ph + h, pw:pw + w],)
    return from_op(out, 'max_pool2d', (input,), backward)



# The recurrent layers (section 3) loop their cell over time: about ten small ops a step,
# each paying the graph's per-op cost, so a sequence of 64 steps is 640 ops. The function
# below runs one direction of one layer as one op: the input's part of every gate for all
# steps in one matmul before the loop (it does not depend on h), then the loop in plain
# NumPy, keeping each step's gates for a hand-written backpropagation through time.
# Same numbers as the cells (a test proves it); a projection (proj_size) runs the cells.
def recurrent_fused(mode, x, state, w_ih, w_hh, b_ih=None, b_hh=None, reverse=False):
    """One direction of RNN/LSTM/GRU as one op. x (L, N, I); state h0 (N, H), or (h0, c0)
    for LSTM. Returns (all h (L, N, H), last state), as _RNNBase._run.
    Backward, step by step from the last: dh_t = g_t + dh_{t+1} carried through the cell;
    the gates' pre-activation gradients a_t give dx = a W_ih, dW_ih = a^T x, dW_hh = a^T h."""
    lstm, gru = mode == 'LSTM', mode == 'GRU'
    h0, c0 = state if lstm else (state, None)
    L, n, hsize = x.shape[0], x.shape[1], w_hh.shape[1]
    X, Wih, Whh = x.array, w_ih.array, w_hh.array
    WhhT = np.ascontiguousarray(Whh.T)  # h @ WhhT: BLAS is much slower on a transposed view here
    order = range(L - 1, -1, -1) if reverse else range(L)
    xw = X.reshape(L * n, -1) @ Wih.T  # every step's input part of the gates, one matmul
    if b_ih is not None:
        xw += b_ih.array
        if not gru:  # GRU keeps b_hh inside r * (h W_hn^T + b_hn)
            xw += b_hh.array
    xw = xw.reshape(L, n, -1)
    bhh = b_hh.array if (gru and b_hh is not None) else 0
    hs = np.empty((L + 1, n, hsize), dtype=X.dtype)  # h0, then h after each step, in the
    hs[0] = h0.array  # order run (each step writes its h there: the output is a copy of it)
    keep = []  # GRU: what each step's backward reads, in the order the steps ran
    if lstm:  # what its backward reads, written in place by each step k (in the order run)
        S = np.empty((L, n, 4 * hsize), dtype=X.dtype)  # the gates i, f, g, o of step k
        C = np.empty((L + 1, n, hsize), dtype=X.dtype)  # the cell before step k (C[L]: after)
        TC = np.empty((L, n, hsize), dtype=X.dtype)  # tanh of the cell after step k
        C[0] = c0.array
    h = hs[0]
    for k, t in enumerate(order):
        if lstm:  # the four gates side by side: one sigmoid over all of them, tanh for g
            a = xw[t] + h @ WhhT
            s = tt._sigmoid_of(a, out=S[k])
            np.tanh(a[:, 2 * hsize:3 * hsize], out=s[:, 2 * hsize:3 * hsize])
            i, f, g, o = s[:, :hsize], s[:, hsize:2 * hsize], s[:, 2 * hsize:3 * hsize], s[:, 3 * hsize:]
            c = np.multiply(f, C[k], out=C[k + 1])
            c += i * g  # c = f c_prev + i g
            h = np.multiply(o, np.tanh(c, out=TC[k]), out=hs[k + 1])
        elif gru:
            hw = h @ WhhT + bhh
            r = tt._sigmoid_of(xw[t, :, :hsize] + hw[:, :hsize])
            z = tt._sigmoid_of(xw[t, :, hsize:2 * hsize] + hw[:, hsize:2 * hsize])
            hn = hw[:, 2 * hsize:]
            nn_ = np.tanh(xw[t, :, 2 * hsize:] + r * hn)
            h = np.add((1 - z) * nn_, z * h, out=hs[k + 1])
            keep.append((r, z, hn, nn_))
        else:
            a = xw[t] + h @ WhhT
            h = np.tanh(a, out=hs[k + 1]) if mode == 'RNN_TANH' else np.maximum(a, 0, out=hs[k + 1])
    # in time order: the output h (a copy: it may be changed in place) and h before each step
    out = np.empty((L + lstm, n, hsize), dtype=X.dtype)  # LSTM: the last c rides as row L
    out[:L] = hs[L:0:-1] if reverse else hs[1:]
    prev = hs[L - 1::-1] if reverse else hs[:L]
    if lstm:
        out[L] = C[L]

    def backward(g):
        """d each input: steps back from the last; gates' a_t: dx = a W_ih, dW = a^T x (or h)"""
        gH = g[:L]
        dh = np.zeros((n, hsize), dtype=g.dtype)
        dc = g[L] if lstm else None
        A = np.empty_like(xw)  # the gradient of each step's input part of the gates
        AH = np.empty_like(xw) if gru else A  # ... and of its h part (GRU's differ in n)
        if lstm:  # what does not depend on dh and dc, for all steps at once (in step order)
            P, Q = _lstm_step_factors(S, C[:L], TC, hsize)
            Q4 = Q.reshape(L, n, 4, hsize)
            F = S[:, :, hsize:2 * hsize]
        for k, t in zip(range(L - 1, -1, -1), reversed(order)):  # step k ran at time t
            dh = dh + gH[t]
            if lstm:
                dc = dc + dh * P[k]
                A4 = A[t].reshape(n, 4, hsize)  # a's gradient: i, f, g from dc, o from dh
                np.multiply(Q4[k, :, :3], dc[:, None], out=A4[:, :3])
                np.multiply(Q4[k, :, 3], dh, out=A4[:, 3])
                dc = dc * F[k]
                dh = A[t] @ Whh
            elif gru:
                r, z, hn, nn_ = keep[k]
                dn = dh * (1 - z) * (1 - nn_ * nn_)
                A[t, :, :hsize] = AH[t, :, :hsize] = dn * hn * r * (1 - r)
                A[t, :, hsize:2 * hsize] = AH[t, :, hsize:2 * hsize] = \
                    dh * (prev[t] - nn_) * z * (1 - z)
                A[t, :, 2 * hsize:] = dn
                AH[t, :, 2 * hsize:] = dn * r
                dh = dh * z + AH[t] @ Whh
            else:
                h = hs[k + 1]
                A[t] = dh * (1 - h * h) if mode == 'RNN_TANH' else dh * (h > 0)
                dh = A[t] @ Whh
        flat, flat_h = A.reshape(L * n, -1), AH.reshape(L * n, -1)
        grads = [(flat @ Wih).reshape(X.shape) if x.requires_grad else None,
                 dh if h0.requires_grad else None]
        if lstm:
            grads.append(dc if c0.requires_grad else None)
        grads.append(flat.T @ X.reshape(L * n, -1) if w_ih.requires_grad else None)
        grads.append(flat_h.T @ prev.reshape(L * n, -1) if w_hh.requires_grad else None)
        if b_ih is not None:
            grads += [flat.sum(0) if b_ih.requires_grad else None,
                      flat_h.sum(0) if b_hh.requires_grad else None]
        return tuple(grads)
    parents = (x, h0) + ((c0,) if lstm else ()) + (w_ih, w_hh) + \
        ((b_ih, b_hh) if b_ih is not None else ())
    y = from_op(out, mode.lower(), parents, backward, saved=(x, w_ih, w_hh))
    ys = y[:L] if lstm else y
    last_h = ys[0] if reverse else ys[L - 1]
    return ys, ((last_h, y[L]) if lstm else last_h)


def _lstm_step_factors(S, CP, TC, hsize):
    """The LSTM's backward through time, the parts that do not depend on dh and dc: for
    every step at once (one op over all steps instead of one per step). With gates
    s = (i, f, g, o), c = f c_prev + i g and h = o tanh(c):
    dc += dh P, P = o (1 - tanh(c)^2);  a's gradient = (dc, dc, dc, dh) Q, where Q holds
    dc/di sigma'(a_i) = g i (1 - i), c_prev f (1 - f), i (1 - g^2) and tanh(c) o (1 - o)."""
    I, F, G, O = (S[..., k * hsize:(k + 1) * hsize] for k in range(4))
    P = O * (1 - TC * TC)
    Q = np.empty_like(S)
    Q[..., :hsize] = G * I * (1 - I)
    Q[..., hsize:2 * hsize] = CP * F * (1 - F)
    Q[..., 2 * hsize:3 * hsize] = I * (1 - G * G)
    Q[..., 3 * hsize:] = TC * O * (1 - O)
    return P, Q
