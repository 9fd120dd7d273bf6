"""compat.py: what a PyTorch program reaches for beyond the ops, for tinytorch.

A PyTorch program runs on tinytorch with its imports changed (`import torch` becomes
`import tinytorch as torch`). Then it imports PyTorch's module paths (torch.nn.functional,
torch.utils.data, torch.optim.lr_scheduler) and asks what a machine without a GPU answers
(torch.cuda.is_available(), torch.backends.cudnn.benchmark = True, GradScaler, autocast).
This file gives those, and nothing computes here:

  - the import rule: `import tinytorch.nn.functional as F` is nn.py, `tinytorch.utils.data`
    is data.py (each taken from tinytorch.py's own folder), `tinytorch.float` is float32;
  - stand-ins for torch.cuda, torch.backends, torch.amp, torch.accelerator on a CPU;
  - one clear line for what tinytorch deliberately lacks (several processes, a compiler,
    bfloat16), at the point of use.

tinytorch.py loads this file at the end of its import when it is beside it (tinytorch.py
copied alone computes the same; only these names are missing). It imports only NumPy and
tinytorch.py.
"""
import functools
import importlib
import importlib.util
import sys
import types
import warnings

import numpy as np

import tinytorch as tt


class _NoSuchDtype:
    """torch.bfloat16 and the like: a name a program may mention but tinytorch (NumPy)
    cannot compute in; np.dtype() of it fails."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"tinytorch.{self.name} (not supported: NumPy has no {self.name})"


# Module attributes PyTorch has and tinytorch gives only when asked for (float and int are
# also Python's own names, which the code above keeps using). Section 1 has float32 and co.
_DTYPE_NAMES = {'float': tt.float32, 'double': tt.float64, 'half': tt.float16, 'long': tt.int64,
                'int': tt.int32, 'short': np.dtype(np.int16), 'bool': tt.bool_,
                'uint8': np.dtype(np.uint8), 'int8': np.dtype(np.int8),
                'int16': np.dtype(np.int16), 'bfloat16': _NoSuchDtype('bfloat16')}


def _refuse(what, why):
    def refused(*args, **kwargs):
        raise RuntimeError(f"{what}: {why}")
    refused.__name__ = what.rsplit('.', 1)[-1]
    return refused


_ONE_PROCESS = "tinytorch trains in one process on the CPU (run the program without torchrun)"
_NO_GPU = ("tinytorch computes with NumPy on the CPU: there is no GPU here (to run a model "
           "on a GPU, export it to PyTorch with export.py)")


class _GradScaler:
    """torch.amp.GradScaler on a machine without a GPU: PyTorch disables it (a warning if
    enabled=True was asked for), so scale() returns the loss as it is and step() steps."""

    def __init__(self, device='cuda', init_scale=65536.0, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        if enabled:
            warnings.warn("GradScaler is enabled, but there is no GPU (tinytorch computes in "
                          "float32 or float64 on the CPU). Disabling.")
        self._enabled = False

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer):
        pass

    def step(self, optimizer, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        pass

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return 1.0

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


class _autocast:
    """torch.autocast on the CPU: tinytorch has no lower-precision kernels, so the block
    runs in the tensors' own dtype (a warning says so once); on 'cuda', the one clear line."""

    def __init__(self, device_type='cpu', dtype=None, enabled=True, cache_enabled=None):
        tt._cpu_only(device_type, 'autocast')
        if enabled:
            warnings.warn("autocast: tinytorch computes in each tensor's own dtype (no "
                          "float16 or bfloat16 kernels); the block runs as it is")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        return fn


def _module(name, doc, **attrs):
    """A stand-in module for one of PyTorch's module paths (tinytorch.cuda, ...)."""
    m = types.ModuleType(f'{tt.__name__}.{name}', doc)
    m.__dict__.update(attrs, __path__=[])
    return m


def _refusing_module(name, why):
    """A module path tinytorch deliberately lacks: importing works, using any name in it
    says why in one line."""
    m = _module(name, f"torch.{name}: {why}")

    def refuse(attr):
        if attr.startswith('__'):
            raise AttributeError(attr)
        raise RuntimeError(f"torch.{name}.{attr}: {why}")
    m.__getattr__ = refuse
    return m


def _nn_utils():
    optim_ = tt._companion('optim')
    return _module('nn.utils', "torch.nn.utils: gradient clipping (optim.py's)",
                   clip_grad_norm_=optim_.clip_grad_norm_,
                   clip_grad_value_=getattr(optim_, 'clip_grad_value_', None))


def _as_module(name, obj):
    """A module holding obj's public names (nn.init, autograd)."""
    if isinstance(obj, types.ModuleType):
        return obj
    return _module(name, obj.__doc__, **{k: getattr(obj, k) for k in dir(obj)
                                         if not k.startswith('_')})


# PyTorch's module path -> what it is here. `import tinytorch.X` and `tinytorch.X` (no
# import) both reach these; `torch` in a program's import lines becomes `tinytorch`.
_PATHS = {
    'nn': lambda: tt._companion('nn'),
    'nn.functional': lambda: tt._companion('nn'),
    'nn.init': lambda: _as_module('nn.init', tt._companion('nn').init),
    'nn.utils': _nn_utils,
    'nn.parallel': lambda: _module(
        'nn.parallel', "torch.nn.parallel: one process here",
        DistributedDataParallel=_refuse('DistributedDataParallel', _ONE_PROCESS),
        DataParallel=_refuse('DataParallel', _NO_GPU)),
    'optim': lambda: tt._companion('optim'),
    'optim.lr_scheduler': lambda: tt._companion('optim'),
    'utils': lambda: _module('utils', "torch.utils"),
    'utils.data': lambda: tt._companion('data'),
    'utils.data.dataloader': lambda: tt._companion('data'),
    'utils.data.dataset': lambda: tt._companion('data'),
    'utils.data.sampler': lambda: tt._companion('data'),
    'utils.tensorboard': lambda: tt._companion('lookinside'),
    'autograd': lambda: _as_module('autograd', tt.autograd),
    'distributed': lambda: _module(
        'distributed', "torch.distributed: one process here",
        is_available=lambda: False, is_initialized=lambda: False,
        **{n: _refuse(f'torch.distributed.{n}', _ONE_PROCESS) for n in (
            'init_process_group', 'destroy_process_group', 'barrier', 'all_reduce',
            'broadcast', 'get_rank', 'get_world_size')}),
    'cuda': lambda: _module(
        'cuda', "torch.cuda on a machine without a GPU",
        is_available=lambda: False, device_count=lambda: 0, is_bf16_supported=lambda: False,
        manual_seed=lambda seed: None, manual_seed_all=lambda seed: None,
        synchronize=lambda device=None: None, empty_cache=lambda: None,
        amp=_module('cuda.amp', "torch.cuda.amp", GradScaler=_GradScaler,
                    autocast=lambda *a, **k: _autocast('cuda', *a, **k)),
        current_device=_refuse('torch.cuda.current_device', _NO_GPU),
        get_device_name=_refuse('torch.cuda.get_device_name', _NO_GPU),
        **{n: _refuse(f'torch.cuda.{n}', _NO_GPU) for n in (
            'set_device', 'get_device_capability', 'get_device_properties', 'memory_allocated',
            'memory_reserved', 'max_memory_allocated', 'reset_peak_memory_stats', 'Event',
            'Stream')}),
    'backends': lambda: _module(
        'backends', "torch.backends: the flags a GPU program sets, accepted",
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False),
                                   is_built=lambda: False),
        cudnn=types.SimpleNamespace(allow_tf32=False, benchmark=False, deterministic=False,
                                    enabled=False, is_available=lambda: False),
        mps=types.SimpleNamespace(is_available=lambda: False, is_built=lambda: False)),
    'accelerator': lambda: _module(
        'accelerator', "torch.accelerator: there is none",
        is_available=lambda: False, current_accelerator=lambda: None,
        device_count=lambda: 0),
    'amp': lambda: _module('amp', "torch.amp on the CPU", GradScaler=_GradScaler,
                           autocast=_autocast),
    'testing': lambda: _module('testing', "torch.testing", assert_close=tt.assert_close),
    'random': lambda: _module('random', "torch.random: the default generator's seed",
                              manual_seed=tt.manual_seed, seed=tt.seed, initial_seed=tt.initial_seed,
                              get_rng_state=tt.get_rng_state, set_rng_state=tt.set_rng_state),
    'version': lambda: _module('version', "torch.version", __version__=tt.__version__,
                               cuda=None, hip=None, git_version='tinytorch'),
    'multiprocessing': lambda: _refusing_module('multiprocessing', _ONE_PROCESS),
    'utils.data.distributed': lambda: _refusing_module('utils.data.distributed', _ONE_PROCESS),
    'profiler': lambda: _refusing_module(
        'profiler', "tinytorch has its own profiler: `with lookinside.profile() as p:` "
                    "(README, 'Look inside a run')"),
    'nn.modules': lambda: _module(  # torch.nn.modules.linear.Linear is nn.Linear
        'nn.modules', "torch.nn.modules: PyTorch's files of nn; here all are nn.py",
        **{f: tt._companion('nn') for f in ('module', 'linear', 'conv', 'activation', 'loss',
                                         'pooling', 'batchnorm', 'dropout', 'sparse', 'rnn',
                                         'normalization', 'container', 'flatten')},
        Module=tt._companion('nn').Module),
    'nn.utils.rnn': lambda: _module(
        'nn.utils.rnn', "torch.nn.utils.rnn: padded batches (nn.py's pad_sequence)",
        pad_sequence=tt._companion('nn').pad_sequence,
        **{n: tt._companion('nn')._no_packed_sequences(n) for n in (
            'pack_padded_sequence', 'pad_packed_sequence', 'pack_sequence', 'PackedSequence')}),
    'distributions': lambda: _refusing_module(
        'distributions', "tinytorch has no probability distributions; sample with "
                         "torch.multinomial, torch.normal or torch.rand"),
}
compile = _refuse('compile', "tinytorch has no compiler; run the model as it is "
                             "(nanoGPT: --compile=False)")


def set_float32_matmul_precision(precision):
    """Accepted: NumPy's float32 matmul has one precision."""


def get_float32_matmul_precision():
    return 'highest'

# Names a program reads from tinytorch itself: tinytorch.float, tinytorch.nn (no import
# needed), tinytorch.autocast, tinytorch.compile, ...
_ATTRIBUTES = {'autocast': _autocast, 'compile': compile,
               'set_float32_matmul_precision': set_float32_matmul_precision,
               'get_float32_matmul_precision': get_float32_matmul_precision}


def attribute(name):
    """tinytorch.<name> for a name tinytorch.py itself lacks (its __getattr__ asks here)."""
    if name in _DTYPE_NAMES:
        return _DTYPE_NAMES[name]
    if name in _ATTRIBUTES:
        return _ATTRIBUTES[name]
    if name in _PATHS:
        return importlib.import_module(f'{tt.__name__}.{name}')
    raise AttributeError(f"module {tt.__name__!r} has no attribute {name!r}")


class _PathFinder:
    """Python's import system asks each finder on sys.meta_path for a module by name;
    this one answers for tinytorch.<a path in _PATHS> with the module _PATHS makes."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        sub = fullname[len(tt.__name__) + 1:] if fullname.startswith(tt.__name__ + '.') else None
        return importlib.util.spec_from_loader(fullname, _PathFinder) if sub in _PATHS else None

    @staticmethod
    def create_module(spec):
        module = _PATHS[spec.name[len(tt.__name__) + 1:]]()
        if not hasattr(module, '__path__'):
            module.__path__ = []  # so that its own children (nn.functional) can be imported
        sub = spec.name[len(tt.__name__) + 1:]
        if '__getattr__' not in module.__dict__:  # tinytorch.nn.utils without an import
            module.__getattr__ = functools.partial(_child, sub)
        return module

    @staticmethod
    def exec_module(module):
        pass


def _child(parent, name):
    if f'{parent}.{name}' in _PATHS:
        return importlib.import_module(f'{tt.__name__}.{parent}.{name}')
    raise AttributeError(f"module '{tt.__name__}.{parent}' has no attribute {name!r}")


# The import rule is on from here: Python asks each finder on sys.meta_path in turn.
if not any(getattr(f, '__qualname__', '') == '_PathFinder' for f in sys.meta_path):
    sys.meta_path.append(_PathFinder)
