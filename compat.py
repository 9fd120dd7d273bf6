"""compat.py: what a PyTorch program reaches for beyond the ops, for tinytorch.

A PyTorch program runs on tinytorch with its imports changed (`import torch` becomes
`import tinytorch as torch`). Then it imports PyTorch's module paths (torch.nn.functional,
torch.utils.data, torch.optim.lr_scheduler) and asks what a machine without a GPU answers
(torch.cuda.is_available(), torch.backends.cudnn.benchmark = True, GradScaler, autocast).
This file gives those, and nothing computes here:

  - the import rule: `import tinytorch.nn.functional as F` is nn.py, `tinytorch.utils.data`
    is data.py (each taken from tinytorch.py's own folder), `tinytorch.float` is float32;
  - stand-ins for torch.cuda, torch.backends, torch.accelerator on a CPU (torch.amp and
    torch.autocast are amp.py's, which computes: mixed precision);
  - one clear line for what tinytorch deliberately lacks (several processes, a compiler,
    bfloat16), at the point of use.

tinytorch.py loads this file at the end of its import when it is beside it (tinytorch.py
copied alone computes the same; only these names are missing). It imports only NumPy and
tinytorch.py.
"""
import enum
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
                'int16': np.dtype(np.int16), 'bfloat16': _NoSuchDtype('bfloat16'),
                'qint8': np.dtype(np.int8)}  # quantized weights' storage (compress.py)


def _refuse(what, why):
    def refused(*args, **kwargs):
        raise RuntimeError(f"{what}: {why}")
    refused.__name__ = what.rsplit('.', 1)[-1]
    return refused


_ONE_PROCESS = "tinytorch trains in one process on the CPU (run the program without torchrun)"
_NO_GPU = ("tinytorch computes with NumPy on the CPU: there is no GPU here (to run a model "
           "on a GPU, export it to PyTorch with export.py)")


def _amp():
    """amp.py: torch.autocast and torch.amp.GradScaler, computing (mixed precision)."""
    return tt._companion('amp')


def _module(name, doc, **attrs):
    """A stand-in module for one of PyTorch's module paths (tinytorch.cuda, ...)."""
    m = types.ModuleType(f'{tt.__name__}.{name}', doc)
    m.__dict__.update(attrs, __path__=[])
    return m


def _refusing_module(name, why):
    """A module path tinytorch deliberately lacks: importing works (`from torch.onnx import
    export` too), and calling any name in it says why in one line."""
    m = _module(name, f"torch.{name}: {why}")
    m.__tinytorch_lacks__ = why  # its children (torch.fx.passes) lack it too

    def refuse(attr):
        if attr.startswith('__'):
            raise AttributeError(attr)
        return _refuse(f"torch.{name}.{attr}", why)
    m.__getattr__ = refuse
    return m


def _partial_module(name, why, **attrs):
    """A module path of which tinytorch has some names (attrs): the others say why they are
    missing, in one line, when used."""
    m = _refusing_module(name, why)
    m.__dict__.update(attrs)
    return m


def _deprecated_clip_grad_norm(parameters, max_norm, norm_type=2.0,
                               error_if_nonfinite=False, foreach=None):
    """torch.nn.utils.clip_grad_norm, PyTorch's old name: clip_grad_norm_, with its warning."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return tt._companion('optim').clip_grad_norm_(parameters, max_norm, norm_type,
                                                  error_if_nonfinite, foreach)


def _nn_utils():
    optim_ = tt._companion('optim')
    return _module('nn.utils', "torch.nn.utils: gradient clipping and parameters as one vector "
                               "(optim.py's)",
                   clip_grad_norm_=optim_.clip_grad_norm_,
                   clip_grad_value_=getattr(optim_, 'clip_grad_value_', None),
                   clip_grad_norm=_deprecated_clip_grad_norm,
                   parameters_to_vector=optim_.parameters_to_vector,
                   vector_to_parameters=optim_.vector_to_parameters,
                   **{n: _refuse(f'torch.nn.utils.{n}', f"tinytorch has no {n}") for n in (
                       'weight_norm', 'spectral_norm', 'remove_weight_norm',
                       'remove_spectral_norm')})


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
        DataParallel=tt._companion('nn').DataParallel),
    'optim': lambda: tt._companion('optim'),
    'optim.lr_scheduler': lambda: tt._companion('optim'),
    'utils': lambda: _module('utils', "torch.utils"),
    'utils.data': lambda: tt._companion('data'),
    'utils.data.dataloader': lambda: tt._companion('data'),
    'utils.data.dataset': lambda: tt._companion('data'),
    'utils.data.sampler': lambda: tt._companion('data'),
    'utils.tensorboard': lambda: tt._companion('lookinside'),
    'utils.checkpoint': lambda: _module(
        'utils.checkpoint', "torch.utils.checkpoint: activation checkpointing (tinytorch.py's, "
                            "section 16)", checkpoint=tt._checkpoint),
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
        amp=_module('cuda.amp', "torch.cuda.amp: there is no GPU (amp.py's GradScaler disables itself)",
                    GradScaler=lambda *a, **k: _amp().GradScaler('cuda', *a, **k),
                    autocast=lambda *a, **k: _amp().autocast('cuda', *a, **k)),
        current_device=_refuse('torch.cuda.current_device', _NO_GPU),
        get_device_name=_refuse('torch.cuda.get_device_name', _NO_GPU),
        # the memory a GPU holds: 0 bytes, PyTorch's answer on a machine without one
        **{n: (lambda device=None: 0) for n in (
            'memory_allocated', 'memory_reserved', 'max_memory_allocated', 'max_memory_reserved')},
        **{n: _refuse(f'torch.cuda.{n}', _NO_GPU) for n in (
            'set_device', 'get_device_capability', 'get_device_properties',
            'reset_peak_memory_stats', 'Event', 'Stream', 'device', 'FloatTensor',
            'DoubleTensor', 'HalfTensor', 'LongTensor', 'IntTensor', 'ByteTensor',
            'BoolTensor')}),
    # torch.backends: each backend a module (`import torch.backends.cudnn as cudnn`), with
    # the flags a GPU program sets (accepted; nothing reads them here) and PyTorch's answers
    # on a machine without that backend
    'backends': lambda: _module('backends', "torch.backends: the flags a GPU program sets, "
                                            "accepted"),
    'backends.cudnn': lambda: _module(
        'backends.cudnn', "torch.backends.cudnn: there is no GPU (the flags are accepted)",
        allow_tf32=True, benchmark=False, benchmark_limit=10, deterministic=False, enabled=True,
        is_available=lambda: False, is_acceptable=lambda tensor: False, version=lambda: None),
    'backends.cuda': lambda: _module(
        'backends.cuda', "torch.backends.cuda: there is no GPU (the flags are accepted)",
        matmul=types.SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                                     allow_bf16_reduced_precision_reduction=True),
        is_built=lambda: False, **{f'{n}_sdp_enabled': (lambda: True) for n in (
            'flash', 'mem_efficient', 'math', 'cudnn')},
        **{f'enable_{n}_sdp': (lambda enabled: None) for n in (
            'flash', 'mem_efficient', 'math', 'cudnn')}),
    'backends.mps': lambda: _module(
        'backends.mps', "torch.backends.mps: there is no Apple GPU here",
        is_available=lambda: False, is_built=lambda: False, is_macos13_or_newer=lambda *a: False),
    'backends.cpu': lambda: _module(
        'backends.cpu', "torch.backends.cpu: NumPy computes", get_cpu_capability=lambda: 'DEFAULT'),
    **{f'backends.{n}': functools.partial(
        _module, f'backends.{n}', f"torch.backends.{n}: not used by tinytorch (NumPy computes)",
        is_available=lambda: False, enabled=False) for n in (
        'mkldnn', 'mkl', 'openmp', 'opt_einsum', 'nnpack', 'xnnpack', 'quantized', 'miopen',
        'cusparselt', 'kleidiai', 'mha', 'python_native', 'xeon')},
    'cuda.amp': lambda: tt.cuda.amp,  # the stand-in's own (below)
    'accelerator': lambda: _module(
        'accelerator', "torch.accelerator: there is none",
        is_available=lambda: False, current_accelerator=lambda: None,
        device_count=lambda: 0),
    'amp': lambda: _amp(),
    'testing': lambda: _module('testing', "torch.testing", assert_close=tt.assert_close),
    'random': lambda: _module('random', "torch.random: the default generator's seed",
                              manual_seed=tt.manual_seed, seed=tt.seed, initial_seed=tt.initial_seed,
                              get_rng_state=tt.get_rng_state, set_rng_state=tt.set_rng_state),
    'version': lambda: _module('version', "torch.version", __version__=tt.__version__,
                               cuda=None, hip=None, git_version='tinytorch'),
    'multiprocessing': lambda: _refusing_module('multiprocessing', _ONE_PROCESS),
    'utils.data.distributed': lambda: _module(
        'utils.data.distributed', "torch.utils.data.distributed: one replica, this process",
        DistributedSampler=tt._companion('data').DistributedSampler),
    'profiler': lambda: _partial_module(
        'profiler', "tinytorch's profiler is lookinside.profile (docs/lookinside.md)",
        profile=tt._companion('lookinside').torch_profile, record_function=tt.record_function,
        ProfilerActivity=enum.Enum('ProfilerActivity', 'CPU CUDA XPU MTIA'),
        schedule=lambda **steps: steps,  # accepted; the profile covers the whole block
        tensorboard_trace_handler=_refuse(
            'torch.profiler.tensorboard_trace_handler', "tinytorch's profiler writes no "
            "trace files; print prof.key_averages().table() instead")),
    'nn.modules': lambda: _module(  # torch.nn.modules.linear.Linear is nn.Linear
        'nn.modules', "torch.nn.modules: PyTorch's files of nn; here all are nn.py",
        **{f: tt._companion('nn') for f in ('module', 'linear', 'conv', 'activation', 'loss',
                                         'pooling', 'batchnorm', 'dropout', 'sparse', 'rnn',
                                         'normalization', 'container', 'flatten')},
        Module=tt._companion('nn').Module),
    'ao': lambda: _module('ao', "torch.ao: quantization (compress.py's)"),
    'ao.quantization': lambda: _module(
        'ao.quantization', "torch.ao.quantization: dynamic quantization (compress.py's)",
        quantize_dynamic=tt._companion('compress').quantize_dynamic),
    'nn.utils.prune': lambda: _module(
        'nn.utils.prune', "torch.nn.utils.prune: pruning (compress.py's)",
        **{n: getattr(tt._companion('compress'), n) for n in (
            'l1_unstructured', 'random_unstructured', 'global_unstructured', 'remove',
            'is_pruned', 'L1Unstructured', 'RandomUnstructured')}),
    'nn.utils.rnn': lambda: _module(
        'nn.utils.rnn', "torch.nn.utils.rnn: padded and packed batches of sequences (nn.py's)",
        **{n: getattr(tt._companion('nn'), n) for n in (
            'pad_sequence', 'pack_padded_sequence', 'pad_packed_sequence', 'pack_sequence',
            'PackedSequence', 'unpad_sequence', 'unpack_sequence')}),
    'distributions': lambda: tt._companion('distributions'),
    # PyTorch's files of modules that are one file here: torch.optim.adam is optim.py, and
    # torch.optim.adam.Adam is optim.Adam (a class tinytorch lacks is an AttributeError)
    **{f'distributions.{f}': (lambda: tt._companion('distributions')) for f in (
        'normal bernoulli beta binomial categorical cauchy chi2 constraint_registry constraints '
        'continuous_bernoulli dirichlet distribution exp_family exponential fishersnedecor gamma '
        'generalized_pareto geometric gumbel half_cauchy half_normal independent inverse_gamma kl '
        'kumaraswamy laplace lkj_cholesky log_normal logistic_normal lowrank_multivariate_normal '
        'mixture_same_family multinomial multivariate_normal negative_binomial one_hot_categorical '
        'pareto poisson relaxed_bernoulli relaxed_categorical studentT transformed_distribution '
        'transforms uniform utils von_mises weibull wishart').split()},
    **{f'optim.{f}': (lambda: tt._companion('optim')) for f in (
        'adadelta adagrad adam adamax adamw asgd lbfgs nadam optimizer radam rmsprop rprop sgd '
        'sparse_adam swa_utils').split()},
    **{f'amp.{f}': _amp for f in ('autocast_mode', 'grad_scaler')},
    **{f'autograd.{f}': (lambda: _as_module('autograd', tt.autograd)) for f in (
        'anomaly_mode forward_ad function functional grad_mode gradcheck graph profiler '
        'profiler_legacy profiler_util variable').split()},
    **{f'nn.modules.{f}': (lambda: tt._companion('nn')) for f in (
        'activation adaptive batchnorm channelshuffle container conv distance dropout flatten '
        'fold instancenorm lazy linear linear_cross_entropy linear_cross_entropy_options loss '
        'module normalization padding pixelshuffle pooling rnn sparse transformer upsampling '
        'utils').split()},
}
_NOTED = set()  # the notes given once per process


def _note_once(key, message):
    if key not in _NOTED:
        _NOTED.add(key)
        warnings.warn(message, stacklevel=3)


def compile(model=None, *, fullgraph=False, dynamic=None, backend=None, mode=None,
            options=None, name=None, disable=False, recompile_limit=None,
            isolate_recompiles=False, dynamic_shapes=None):
    """torch.compile: the module or function itself, unchanged (the eager code PyTorch
    falls back to), with one note, the first time, that tinytorch has no compiler. Used
    as a decorator, with or without arguments, it returns the function too."""
    if model is None:  # @torch.compile(mode=...): the decorator
        return lambda fn: compile(fn)
    _note_once('compile', "torch.compile: tinytorch has no compiler; the model runs as it is "
                          "(eagerly), with the same results")
    return model


# Every other module PyTorch 2.15 has under torch (pkgutil over torch, torch.utils, torch.nn
# and torch.nn.utils, names without a leading _): `import torch.onnx` works, and calling a
# name in it says in one line which feature tinytorch lacks. (torch.types is left out:
# tinytorch.types is Python's types module, which tinytorch.py uses.)
_LACKING = {
    'compiler': "compiler (torch.compile returns the model "
    "as it is)", 'contrib': "torch.contrib", 'export': "graph export (torch.export; export.py "
    "writes safetensors for PyTorch and Hugging Face)", 'fft': "Fourier transforms (torch.fft)",
    'foreach': "foreach kernels (torch.foreach)", 'func': "function transforms (torch.func: "
    "vmap, grad, jacrev; use tt.autograd.grad)", 'futures': "futures (one process here)",
    'fx': "graph capture (torch.fx)", 'hub': "model downloads (torch.hub; load a file with "
    "torch.load)", 'jit': "TorchScript (torch.jit; run the model as it is)",
    'library': "custom operators (torch.library)", 'linalg': "linear algebra routines "
    "(torch.linalg; tt.matmul, tt.norm and tt.einsum are here)", 'masked': "masked tensors "
    "(torch.masked)", 'monitor': "torch.monitor", 'nativert': "torch.nativert",
    'nested': "nested tensors (torch.nested; pad with nn.utils.rnn.pad_sequence)",
    'numa': "NUMA binding (torch.numa)", 'onnx': "ONNX export (torch.onnx; export.py writes "
    "safetensors for PyTorch and Hugging Face)", 'overrides': "__torch_function__ overrides "
    "(torch.overrides)", 'package': "torch.package", 'quantization': "quantization "
    "(torch.quantization)", 'quasirandom': "quasi-random sequences (torch.quasirandom)",
    'return_types': "torch.return_types", 'signal': "signal windows (torch.signal)",
    'sparse': "sparse tensors (torch.sparse)", 'special': "special functions (torch.special)",
    'storage': "storages (a tensor's memory is its NumPy array, x.array)",
    'torch_version': "torch.torch_version (tinytorch.__version__ is a string)",
    'mtia': "MTIA devices: " + _NO_GPU, 'xpu': "XPU devices: " + _NO_GPU,
    'mps': "MPS devices: " + _NO_GPU,
    'nn.attention': "attention backends (torch.nn.attention; tinytorch has one attention "
    "kernel, nn.scaled_dot_product_attention)", 'nn.backends': "torch.nn.backends",
    'nn.common_types': "torch.nn.common_types", 'nn.cpp': "torch.nn.cpp", 'nn.grad':
    "torch.nn.grad (convolution gradients: tt.autograd.grad of nn.conv2d)",
    'nn.intrinsic': "quantization (torch.nn.intrinsic)", 'nn.qat': "quantization "
    "(torch.nn.qat)", 'nn.quantizable': "quantization (torch.nn.quantizable)",
    'nn.quantized': "quantization (torch.nn.quantized)", 'nn.utils.convert_parameters':
    "torch.nn.utils.convert_parameters", 'nn.utils.fusion': "module fusion "
    "(torch.nn.utils.fusion)", 'nn.utils.memory_format': "memory formats (NumPy's arrays "
    "have strides, no channels_last)", 'nn.utils.parametrizations': "parametrizations "
    "(weight_norm, spectral_norm, orthogonal)", 'nn.utils.parametrize': "parametrizations "
    "(torch.nn.utils.parametrize)",
    'nn.utils.stateless': "functional calls (torch.nn.utils.stateless; use torch.func)",
    'optim.functional': "functional optimizers (torch.optim.functional; use the optimizer "
    "classes)",
    'utils._pytree': "PyTorch's private pytree helpers (torch.utils._pytree)",
    **{f'utils.{n}': f"torch.utils.{n}" for n in (
        'backcompat', 'backend_registration', 'benchmark', 'bundled_inputs', 'collect_env',
        'cpp_backtrace', 'cpp_extension', 'debug_log', 'deterministic', 'dlpack', 'file_baton',
        'flop_counter', 'hipify', 'hooks', 'jit', 'mkldnn', 'mobile_optimizer', 'model_dump',
        'model_zoo', 'module_tracker', 'serialization', 'show_pickle', 'throughput_benchmark',
        'viz', 'weak')},
}
_PATHS.update({
    'cpu': lambda: _partial_module(
        'cpu', "torch.cpu: tinytorch has only the CPU's basics", is_available=lambda: True,
        device_count=lambda: 1, current_device=lambda: 'cpu', synchronize=lambda device=None: None),
    'functional': lambda: _partial_module(
        'functional', "tinytorch has no such function in torch.functional",
        **{n: getattr(tt, n) for n in ('einsum', 'meshgrid', 'norm', 'split', 'unique', 'cdist',
                                       'tensordot')}),
    'serialization': lambda: _partial_module(
        'serialization', "tinytorch has torch.serialization's save, load and list of safe "
                         "globals (files.py) only",
        save=tt.save, load=tt.load, **{n: getattr(tt._companion('files'), n) for n in (
            'add_safe_globals', 'get_safe_globals', 'clear_safe_globals', 'safe_globals')}),
    'nn.parameter': lambda: _partial_module(
        'nn.parameter', "tinytorch has nn.Parameter only", Parameter=tt._companion('nn').Parameter),
    'nn.utils.clip_grad': lambda: _partial_module(
        'nn.utils.clip_grad', "tinytorch has clip_grad_norm_ and clip_grad_value_ only",
        clip_grad_norm_=tt._companion('optim').clip_grad_norm_,
        clip_grad_value_=tt._companion('optim').clip_grad_value_),
    'nn.utils.init': lambda: _as_module('nn.init', tt._companion('nn').init),
    **{name: functools.partial(_refusing_module, name, f"tinytorch has no {feature}")
       for name, feature in _LACKING.items()},
})


def set_default_device(device):
    """torch.set_default_device: the CPU (or None) is what tinytorch always uses; any
    other device says so in one line."""
    tt._cpu_only(device, 'set_default_device')


def get_default_device():
    return tt.device('cpu')


def set_default_tensor_type(t):
    """torch.set_default_tensor_type (deprecated in PyTorch): FloatTensor, tinytorch's
    default already, is accepted; another type says so in one line."""
    name = t if isinstance(t, str) else getattr(t, '__name__', str(t))
    if name.rsplit('.', 1)[-1] != 'FloatTensor' or 'cuda' in str(t):
        raise RuntimeError(f"set_default_tensor_type({name}): tinytorch's default is float32 "
                           "on the CPU (torch.FloatTensor); give dtype= where you need another")


_NO_COMPLEX = ("tinytorch has no complex tensors; write the rotation with cos and sin (as "
               "rotary embeddings can be written)")


def set_float32_matmul_precision(precision):
    """Accepted: NumPy's float32 matmul has one precision."""


def get_float32_matmul_precision():
    return 'highest'

# Names a program reads from tinytorch itself: tinytorch.float, tinytorch.nn (no import
# needed), tinytorch.autocast, tinytorch.compile, ...
_ATTRIBUTES = {'compile': compile,
               'set_default_tensor_type': set_default_tensor_type,
               **{n: _refuse(n, _NO_COMPLEX) for n in ('view_as_real', 'view_as_complex',
                                                        'polar', 'complex')},
               'set_default_device': set_default_device, 'get_default_device': get_default_device,
               'set_float32_matmul_precision': set_float32_matmul_precision,
               'get_float32_matmul_precision': get_float32_matmul_precision}


def attribute(name):
    """tinytorch.<name> for a name tinytorch.py itself lacks (its __getattr__ asks here)."""
    if name in _DTYPE_NAMES:
        return _DTYPE_NAMES[name]
    if name in _ATTRIBUTES:
        return _ATTRIBUTES[name]
    if name in ('autocast', 'is_autocast_enabled', 'is_autocast_available'):
        return getattr(_amp(), name)
    if name in _PATHS:
        return importlib.import_module(f'{tt.__name__}.{name}')
    raise AttributeError(f"module {tt.__name__!r} has no attribute {name!r}")


class _PathFinder:
    """Python's import system asks each finder on sys.meta_path for a module by name;
    this one answers for tinytorch.<a path in _PATHS> with the module _PATHS makes."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        sub = fullname[len(tt.__name__) + 1:] if fullname.startswith(tt.__name__ + '.') else None
        if sub in _PATHS or _refusing_parent(sub) is not None:
            return importlib.util.spec_from_loader(fullname, _PathFinder)
        return None

    @staticmethod
    def create_module(spec):
        sub = spec.name[len(tt.__name__) + 1:]
        module = _PATHS[sub]() if sub in _PATHS else _refusing_module(sub, _refusing_parent(sub))
        if not hasattr(module, '__path__'):
            module.__path__ = []  # so that its own children (nn.functional) can be imported
        sub = spec.name[len(tt.__name__) + 1:]
        own = module.__dict__.get('__getattr__')  # nn.py has one (nn.CheckpointError)
        if not isinstance(own, functools.partial):  # tinytorch.nn.utils without an import
            module.__getattr__ = functools.partial(_child, sub, own)
        return module

    @staticmethod
    def exec_module(module):
        pass


# Module paths below these are PyTorch's, and what they hold tinytorch lacks: each imports,
# and refuses at use, in one line (the modules themselves are above, in _PATHS).
_LACKS_BELOW = {
    'cuda': _NO_GPU, 'accelerator': _NO_GPU, 'backends.cudnn': "cuDNN: " + _NO_GPU,
    'backends.xeon': "this backend (NumPy computes)",
    'distributed': _ONE_PROCESS, 'nn.parallel': _ONE_PROCESS, 'multiprocessing': _ONE_PROCESS,
    'ao': "quantization beyond quantize_dynamic (compress.py)",
    'utils.data': "datapipes and the data loader's internals (tinytorch's DataLoader is "
                  "data.py)",
    'nn.utils': "this part of torch.nn.utils", 'profiler': "this part of torch.profiler",
    'cpu': "this part of torch.cpu",
}


def _refusing_parent(sub):
    """The reason of the feature tinytorch lacks, when sub is a module path under one (torch.fx
    lacking, torch.fx.passes.shape_prop is lacking too: it imports, and refuses at use)."""
    if not sub or '.' not in sub:
        return None
    parent = sub.rsplit('.', 1)[0]
    if f'{tt.__name__}.{parent}' not in sys.modules:
        return None  # Python imports the parent first; a name under none is no module
    for prefix, why in _LACKS_BELOW.items():
        if parent == prefix or parent.startswith(prefix + '.'):
            return "tinytorch has no " + why if not why.startswith('tinytorch') else why
    return getattr(sys.modules[f'{tt.__name__}.{parent}'], '__tinytorch_lacks__', None)


def _child(parent, own, name):
    """A module's missing attribute: its own __getattr__'s answer if it has one, else a
    child module of PyTorch's paths (tinytorch.nn.utils), imported when first asked."""
    if f'{parent}.{name}' in _PATHS:
        return importlib.import_module(f'{tt.__name__}.{parent}.{name}')
    if own is not None:
        return own(name)  # its answer, or its own one-line refusal
    raise AttributeError(f"module '{tt.__name__}.{parent}' has no attribute {name!r}")


# The import rule is on from here: Python asks each finder on sys.meta_path in turn.
if not any(getattr(f, '__qualname__', '') == '_PathFinder' for f in sys.meta_path):
    sys.meta_path.append(_PathFinder)
