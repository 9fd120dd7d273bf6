"""amp.py: mixed precision on the CPU, PyTorch's torch.autocast and torch.amp.GradScaler.

    with torch.autocast('cpu', dtype=torch.float16):   # matmul, linear, conv in float16
        loss = model(x, y)[1]                          # the losses in float32
    scaler.scale(loss).backward()                      # the loss times 65536: small
    scaler.unscale_(optimizer)                         # gradients don't underflow to 0
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)                             # skipped if a gradient is inf/nan
    scaler.update()                                    # the scale: x0.5 then, x2 after 2000 good steps

  1. autocast: sets tinytorch.py's autocast dtype (its section 6b) for the block; the ops
     PyTorch's CPU autocast lists consult it (matmul in tinytorch.py, linear, the
     convolutions, attention and the losses in nn.py)
  2. GradScaler: the loss scale and its schedule, as PyTorch's (the same defaults)

compat.py maps torch.autocast, torch.amp and torch.cpu.amp here. Needs only NumPy and
tinytorch.py.
"""
import functools
import math
import warnings

import numpy as np

import tinytorch as tt


# ---------------------------------------------------------------------------
# 1. autocast
# ---------------------------------------------------------------------------
_UNSUPPORTED = ("In CPU autocast, but the target dtype is not supported. Disabling autocast. "
                "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently.")


class autocast:
    """torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None), as a
    context manager or a decorator. On the CPU, float16 computes the listed ops in float16;
    a dtype PyTorch's CPU autocast refuses (float32, float64, ...) gets PyTorch's warning
    and the block runs as it is, and so does bfloat16, which NumPy lacks."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        tt._cpu_only(device_type, 'autocast')
        self.device = device_type
        self.fast_dtype = dtype
        self._enabled = bool(enabled)
        if not enabled:
            return
        if dtype is None or getattr(dtype, 'name', None) == 'bfloat16':  # CPU's default
            warnings.warn("autocast: tinytorch has no bfloat16 (NumPy lacks it), so the block "
                          "runs as it is; use dtype=torch.float16 for mixed precision")
            self._enabled = False
        elif not (isinstance(dtype, (np.dtype, type)) and np.dtype(dtype) == tt.float16):
            warnings.warn(_UNSUPPORTED)
            self._enabled = False

    def __enter__(self):
        self._prev = tt._autocast_dtype
        tt._autocast_dtype = tt.float16 if self._enabled else None
        return self

    def __exit__(self, *exc):
        tt._autocast_dtype = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def under_autocast(*args, **kwargs):
            with autocast(self.device, self.fast_dtype, self._enabled):
                return fn(*args, **kwargs)
        return under_autocast


def is_autocast_enabled(device_type=None):
    """Whether an autocast block for device_type is on (no argument: CUDA's, as PyTorch's:
    never here)."""
    return device_type == 'cpu' and tt._autocast_dtype is not None


def is_autocast_available(device_type):
    return device_type == 'cpu'


# ---------------------------------------------------------------------------
# 2. GradScaler
# ---------------------------------------------------------------------------
# float16's largest number is 65504 and its smallest (subnormal) 6e-8: small gradients of a
# float16 graph become 0. GradScaler multiplies the loss by a large scale before backward, so
# every gradient is that much larger, and divides the gradients by it before the step. If a
# gradient overflowed (inf or nan), the step is skipped and the scale halved; after
# growth_interval good steps in a row it is doubled, to stay as large as is safe.
_READY, _UNSCALED, _STEPPED = 'ready', 'unscaled', 'stepped'


class GradScaler:
    """torch.amp.GradScaler('cpu', init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True). On another device (PyTorch's default is 'cuda'),
    there is no GPU: it is disabled, with a warning, as PyTorch's is then: scale() returns
    the loss as it is and step() steps."""

    def __init__(self, device='cuda', init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        self._enabled = enabled
        if enabled and device != 'cpu':
            warnings.warn("GradScaler is enabled, but there is no GPU (tinytorch computes on "
                          "the CPU; use GradScaler('cpu')). Disabling.")
            self._enabled = False
        if self._enabled and not growth_factor > 1.0:  # PyTorch's asserts
            raise AssertionError("The growth factor must be > 1.0.")
        if self._enabled and not backoff_factor < 1.0:
            raise AssertionError("The backoff factor must be < 1.0.")
        self.device = device
        self._init_scale, self._growth_factor = float(init_scale), float(growth_factor)
        self._backoff_factor, self._growth_interval = float(backoff_factor), int(growth_interval)
        self._scale = None  # float32, made at the first scale() (PyTorch's is lazy too)
        self._growth_tracker = 0  # good steps in a row since the scale last changed
        self._per_optimizer = {}  # id(optimizer) -> {'stage', 'found_inf'} until update()

    def is_enabled(self):
        return self._enabled

    def _state(self, optimizer):
        return self._per_optimizer.setdefault(id(optimizer), {'stage': _READY, 'found_inf': None})

    def scale(self, outputs):
        """outputs (a tensor, or a list or tuple of them) times the scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = np.float32(self._init_scale)
        if isinstance(outputs, tt.Tensor):
            return outputs * tt.tensor(self._scale)  # a float32 0-d tensor, as PyTorch's
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def unscale_(self, optimizer):
        """Divide the gradients of the optimizer's parameters by the scale, in place (before
        clipping them), and note whether one holds inf or nan."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state['stage'] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if state['stage'] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if self._scale is None:
            raise RuntimeError("Attempted unscale_ but _scale is None.  This may indicate your "
                               "script did not use scaler.scale(loss or outputs) earlier in "
                               "the iteration.")
        inv_scale = np.float32(1.0 / float(self._scale))  # in float64, rounded: PyTorch's
        found_inf, checked = False, 0
        for group in optimizer.param_groups:
            for p in group['params']:
                if p.grad is None:
                    continue
                if p.grad.dtype == tt.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                g = p.grad.array
                found_inf = found_inf or not np.isfinite(g).all()
                g *= inv_scale.astype(g.dtype)
                checked += 1
        state['found_inf'] = found_inf if checked else None
        state['stage'] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step() if no gradient held inf or nan (unscaling them first if
        unscale_ was not called); else the step is skipped and None returned."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if 'closure' in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        state = self._state(optimizer)
        if state['stage'] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state['stage'] == _READY:
            self.unscale_(optimizer)
        if state['found_inf'] is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        result = None if state['found_inf'] else optimizer.step(*args, **kwargs)
        state['stage'] = _STEPPED
        return result

    def update(self, new_scale=None):
        """The scale for the next iteration: new_scale if given; else halved (backoff_factor)
        if a gradient overflowed in this one, doubled (growth_factor) after growth_interval
        iterations in a row without, unchanged otherwise."""
        if not self._enabled:
            return
        if self._scale is None:
            raise RuntimeError("Attempted update but _scale is None.  This may indicate your "
                               "script did not use scaler.scale(loss or outputs) earlier in "
                               "the iteration.")
        if new_scale is not None:
            self._scale = np.float32(new_scale.item() if isinstance(new_scale, tt.Tensor)
                                     else new_scale)
        else:
            found = [s['found_inf'] for s in self._per_optimizer.values()
                     if s['found_inf'] is not None]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale = np.float32(self._scale * np.float32(self._backoff_factor))
                self._growth_tracker = 0
            elif self._growth_tracker + 1 == self._growth_interval:
                with np.errstate(over='ignore'):  # a scale past float32's range: kept, silently
                    grown = np.float32(self._scale * np.float32(self._growth_factor))
                if math.isfinite(grown):
                    self._scale = grown
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
        self._per_optimizer = {}

    def get_scale(self):
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        self._growth_interval = int(new_interval)

    def state_dict(self):
        """PyTorch's keys; empty when disabled."""
        if not self._enabled:
            return {}
        return {'scale': self.get_scale(), 'growth_factor': self._growth_factor,
                'backoff_factor': self._backoff_factor, 'growth_interval': self._growth_interval,
                '_growth_tracker': self._growth_tracker}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = float(state_dict['scale'])
        self._scale = np.float32(state_dict['scale'])
        self._growth_factor = float(state_dict['growth_factor'])
        self._backoff_factor = float(state_dict['backoff_factor'])
        self._growth_interval = int(state_dict['growth_interval'])
        self._growth_tracker = int(state_dict['_growth_tracker'])
