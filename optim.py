"""optim.py: optimizers, learning-rate schedules and gradient clipping.

An optimizer reads each parameter's .grad and changes the parameter in place
(under no_grad, so the update is not part of any graph). Each update rule below
is PyTorch's, written out on NumPy arrays. Needs only NumPy and tinytorch.py.
"""
import math

import tinytorch as tt  # before NumPy, so it can set up OpenBLAS's threads (see its top)
import numpy as np

from tinytorch import no_grad


class Optimizer:
    """Holds param_groups (each a dict with 'params' and its hyperparameters, so a
    group can have its own lr) and per-parameter state (momentum buffers, ...)."""

    def __init__(self, params, defaults):
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{'params': params}]
        self.defaults = defaults
        self.param_groups = []
        for group in params:
            group = dict(group)
            group['params'] = list(group['params'])
            for k, v in defaults.items():
                group.setdefault(k, v)
            self.param_groups.append(group)
        self.state = {}  # parameter -> dict of its buffers

    def _params(self):
        return [p for group in self.param_groups for p in group['params']]

    def zero_grad(self, set_to_none=True):
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.array[...] = 0

    @no_grad()
    def step(self):
        with tt.record_function(f'{type(self).__name__}.step'):  # a row of lookinside.profile's table
            for group in self.param_groups:
                for p in group['params']:
                    if p.grad is not None:  # a parameter that got no gradient is left alone
                        self._update(p, p.grad.array, self.state.setdefault(p, {}), group)
                        tt._bump(p)  # an in-place change: the version counter says so

    def _update(self, p, g, state, group):
        raise NotImplementedError

    # -- state_dict: parameters are referred to by their position --------------
    def state_dict(self):
        index = {id(p): i for i, p in enumerate(self._params())}
        state = {index[id(p)]: {k: (v.copy() if isinstance(v, np.ndarray) else v)
                                for k, v in s.items()} for p, s in self.state.items()}
        groups = [{**{k: v for k, v in g.items() if k != 'params'},
                   'params': [index[id(p)] for p in g['params']]} for g in self.param_groups]
        return {'state': state, 'param_groups': groups}

    def load_state_dict(self, state_dict):
        params = self._params()
        groups = state_dict['param_groups']
        sizes = [len(g['params']) for g in groups]
        if sizes != [len(g['params']) for g in self.param_groups]:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved parameter groups "
                             f"have sizes {sizes}, this optimizer's have "
                             f"{[len(g['params']) for g in self.param_groups]}")
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != 'params'})
        self.state = {}
        for i, s in state_dict['state'].items():
            p = params[int(i)]  # keys may come back from a checkpoint as strings
            self.state[p] = {k: (v.astype(p.dtype) if isinstance(v, np.ndarray) else v)
                             for k, v in s.items()}


class SGD(Optimizer):
    """p -= lr * g, with optional momentum (buf = momentum * buf + (1 - dampening) * g),
    Nesterov momentum (g + momentum * buf) and L2 weight decay (g += wd * p)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _update(self, p, g, state, group):
        if group['weight_decay']:
            g = g + group['weight_decay'] * p.array
        momentum = group['momentum']
        if momentum:
            buf = state.get('momentum_buffer')
            if buf is None:
                buf = state['momentum_buffer'] = g.copy()  # first step: buf = g
            else:
                buf *= momentum
                buf += (1 - group['dampening']) * g
            g = g + momentum * buf if group['nesterov'] else buf
        p.array -= group['lr'] * g


class Adam(Optimizer):
    """m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    weight_decay here is L2 (added to g), as in PyTorch's Adam."""

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def _update(self, p, g, state, group):
        lr, (b1, b2), eps, wd = group['lr'], group['betas'], group['eps'], group['weight_decay']
        if wd and self.decoupled:
            p.array *= 1 - lr * wd  # AdamW: decay the weights directly, not through g
        elif wd:
            g = g + wd * p.array
        if 'step' not in state:
            state['step'] = 0
            state['exp_avg'] = np.zeros_like(p.array)
            state['exp_avg_sq'] = np.zeros_like(p.array)
        state['step'] += 1
        step = adam_step_ if tt.fast else adam_step  # the same numbers, faster (Speed section)
        step(p.array, g, state['exp_avg'], state['exp_avg_sq'], state['step'], lr, b1, b2, eps)


def adam_step(p, g, m, v, t, lr, b1, b2, eps):
    """One Adam update of the arrays p, m, v (step number t, counted from 1), plainly."""
    # moving averages of the gradient and of its square, both corrected for starting at 0
    m[...] = b1 * m + (1 - b1) * g
    v[...] = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= (1 - lr * wd) before the Adam step."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


# ---------------------------------------------------------------------------
# Learning-rate schedules: call scheduler.step() once per optimizer step (or epoch)
# ---------------------------------------------------------------------------
class LRScheduler:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.base_lrs = [g.setdefault('initial_lr', g['lr']) for g in optimizer.param_groups]
        self.last_epoch = 0
        self._apply()

    def lr_at(self, base_lr, t):
        raise NotImplementedError

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group['lr'] = self.lr_at(base, self.last_epoch)

    def step(self):
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self):
        return [g['lr'] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {'last_epoch': self.last_epoch, 'base_lrs': list(self.base_lrs)}

    def load_state_dict(self, state):
        self.last_epoch, self.base_lrs = int(state['last_epoch']), list(state['base_lrs'])
        self._apply()


class StepLR(LRScheduler):
    """lr = base_lr * gamma^(t // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr, t):
        return base_lr * self.gamma ** (t // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2."""

    def __init__(self, optimizer, T_max, eta_min=0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, base_lr, t):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class WarmupCosineLR(LRScheduler):
    """Linear warmup from 0 to base_lr over warmup_steps, then cosine decay to
    min_lr at total_steps (and min_lr after it): nanoGPT's schedule."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        super().__init__(optimizer)

    def lr_at(self, base_lr, t):
        if t < self.warmup_steps:
            return base_lr * (t + 1) / (self.warmup_steps + 1)
        if t >= self.total_steps:
            return self.min_lr
        progress = (t - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


@no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale all gradients together so that their global norm is at most max_norm.

    The global norm treats every gradient as one long vector: for p = norm_type,
    total = (sum over all elements of |g|^p)^(1/p), the largest |g| for p = inf.
    Each gradient is multiplied by min(1, max_norm / (total + 1e-6)). parameters is
    one tensor or an iterable of them. Returns the total norm before clipping, as a
    tensor in the gradients' dtype (as PyTorch)."""
    if isinstance(parameters, tt.Tensor):
        parameters = [parameters]
    grads = [p.grad.array for p in parameters if p.grad is not None]
    if not grads:
        return tt.tensor(0.0)
    norm_type = float(norm_type)
    norms = [np.linalg.norm(g.reshape(-1), ord=norm_type) for g in grads]  # one per tensor
    dtype = grads[0].dtype
    total = np.linalg.norm(np.array(norms, dtype=np.float64), ord=norm_type)  # norm of norms
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {total}; pass error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g *= np.asarray(coef, dtype=g.dtype)
    return tt.tensor(np.asarray(total, dtype=dtype))


# ---------------------------------------------------------------------------
# Speed
# ---------------------------------------------------------------------------
def adam_step_(p, g, m, v, t, lr, b1, b2, eps):
    """adam_step's arithmetic with one scratch array and no other temporaries (a third
    of the memory traffic; a test checks that both give the same numbers)."""
    bias1, bias2 = 1 - b1 ** t, 1 - b2 ** t
    m *= b1
    tmp = np.multiply(g, 1 - b1)
    m += tmp  # m = b1 m + (1 - b1) g
    v *= b2
    np.multiply(g, g, out=tmp)
    tmp *= 1 - b2
    v += tmp  # v = b2 v + (1 - b2) g^2
    np.sqrt(v, out=tmp)
    tmp /= math.sqrt(bias2)
    tmp += eps  # sqrt(v / (1 - b2^t)) + eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / bias1
    p -= tmp  # p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
