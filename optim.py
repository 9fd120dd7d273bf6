"""optim.py: optimizers, learning-rate schedules and gradient clipping.

An optimizer reads each parameter's .grad and changes the parameter in place
(under no_grad, so the update is not part of any graph). Each update rule below
is PyTorch's, written out on NumPy arrays. Needs only NumPy and tinytorch.py.
"""
import bisect
import math

import tinytorch as tt
import numpy as np

from tinytorch import no_grad


class Optimizer:
    """Holds param_groups (a list of dicts, each with 'params' and its own options, so a
    group can have its own lr or weight_decay) and per-parameter state (momentum
    buffers, ...). PyTorch's flags foreach, fused and capturable choose a faster kernel
    or CUDA graphs there; they are accepted and have no effect here."""

    def __init__(self, params, defaults):
        if isinstance(params, tt.Tensor):
            raise TypeError(f"{type(self).__name__}: params should be an iterable of Tensors "
                            f"or dicts, but got one Tensor (pass [tensor])")
        if defaults.get('differentiable'):
            raise NotImplementedError(f"{type(self).__name__}: differentiable=True (autograd "
                                      f"through the optimizer step) is not supported")
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{'params': params}]
        self.defaults = defaults
        self.param_groups = []
        self.state = {}  # parameter -> dict of its buffers
        for group in params:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        """Add a group of parameters with its own options (the rest from defaults), as
        when unfreezing layers during fine-tuning."""
        group = dict(param_group)
        params = group['params']
        group['params'] = [params] if isinstance(params, tt.Tensor) else list(params)
        for p in group['params']:  # PyTorch's checks and messages
            if not isinstance(p, tt.Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__module__}.{type(p).__name__}")
            if not (p.is_leaf or p._retains_grad):  # step() would change a copy, not a weight
                raise ValueError("can't optimize a non-leaf Tensor")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        seen = {id(p) for p in self._params()}
        if len({id(p) for p in group['params']}) != len(group['params']) or \
                any(id(p) in seen for p in group['params']):
            raise ValueError(f"{type(self).__name__}: some parameters appear in more than one "
                             f"parameter group")
        self.param_groups.append(group)

    def _params(self):
        return [p for group in self.param_groups for p in group['params']]

    def zero_grad(self, set_to_none=True):
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.array[...] = 0

    def step(self, closure=None):
        """One update of every parameter that has a .grad. closure, if given, is called
        first (with gradients on) to recompute the loss, which step returns."""
        loss = None
        if closure is not None:
            with tt.enable_grad():
                loss = closure()
        with no_grad(), tt.record_function(f'{type(self).__name__}.step'):  # a row of lookinside.profile's table
            for group in self.param_groups:
                for p in group['params']:
                    if p.grad is not None:  # a parameter that got no gradient is left alone
                        g = p.grad.array
                        if group.get('maximize'):
                            g = -g  # maximize: climb the objective instead of descending it
                        self._update(p, g, self.state.setdefault(p, {}), group)
                        tt._bump(p)  # an in-place change: the version counter says so
        return loss

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


def _at_least_0(**values):
    """PyTorch's checks of an optimizer's settings: each must be >= 0."""
    for name, v in values.items():
        if isinstance(v, tt.Tensor) and v.numel() != 1:
            raise ValueError(f"Tensor {name} must be 1-element")
        if not 0.0 <= v:
            raise ValueError(f"Invalid {_NAMES.get(name, name + ' value')}: {v}")


_NAMES = {'lr': 'learning rate', 'eps': 'epsilon value'}


def _betas(betas):
    for i in (0, 1):
        if not 0.0 <= betas[i] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")


class SGD(Optimizer):
    """p -= lr * g, with optional momentum (buf = momentum * buf + (1 - dampening) * g),
    Nesterov momentum (g + momentum * buf) and L2 weight decay (g += wd * p)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        _at_least_0(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

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
    weight_decay here is L2 (added to g), as in PyTorch's Adam, unless
    decoupled_weight_decay=True (that is AdamW). amsgrad=True divides by the largest
    v seen so far instead of the current v."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        _at_least_0(lr=lr, eps=eps)
        _betas(betas)
        _at_least_0(weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable, fused=fused,
                                      decoupled_weight_decay=decoupled_weight_decay))

    def _update(self, p, g, state, group):
        lr, (b1, b2), eps, wd = group['lr'], group['betas'], group['eps'], group['weight_decay']
        if wd and group['decoupled_weight_decay']:
            p.array *= 1 - lr * wd  # AdamW: decay the weights directly, not through g
        elif wd:
            g = g + wd * p.array
        if 'step' not in state:
            state['step'] = 0
            state['exp_avg'] = np.zeros_like(p.array)
            state['exp_avg_sq'] = np.zeros_like(p.array)
            if group['amsgrad']:
                state['max_exp_avg_sq'] = np.zeros_like(p.array)
        state['step'] += 1
        if group['amsgrad']:
            adam_step(p.array, g, state['exp_avg'], state['exp_avg_sq'], state['step'], lr, b1,
                      b2, eps, v_max=state['max_exp_avg_sq'])
            return
        step = adam_step_ if tt.fast else adam_step  # the same numbers, faster (Speed section)
        step(p.array, g, state['exp_avg'], state['exp_avg_sq'], state['step'], lr, b1, b2, eps)


def adam_step(p, g, m, v, t, lr, b1, b2, eps, v_max=None):
    """One Adam update of the arrays p, m, v (step number t, counted from 1), plainly.
    With v_max (AMSGrad) the step divides by the largest v so far, so it never grows
    because v shrank."""
    # moving averages of the gradient and of its square, both corrected for starting at 0
    m[...] = b1 * m + (1 - b1) * g
    v[...] = b2 * v + (1 - b2) * g * g
    if v_max is not None:
        np.maximum(v_max, v, out=v_max)
        v = v_max
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= (1 - lr * wd) before the Adam step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)


class RMSprop(Optimizer):
    """Divide g by a running root mean square of the gradients:
    v = alpha v + (1 - alpha) g^2;  p -= lr * g / (sqrt(v) + eps).
    centered=True subtracts the squared running mean of g from v (a variance);
    momentum > 0 keeps buf = momentum * buf + g / (sqrt(v) + eps) and steps by lr * buf.
    weight_decay is L2 (g += wd * p)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        _at_least_0(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay,
                                      capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _update(self, p, g, state, group):
        lr, alpha, eps, momentum = group['lr'], group['alpha'], group['eps'], group['momentum']
        if group['weight_decay']:
            g = g + group['weight_decay'] * p.array
        if 'step' not in state:
            state['step'] = 0
            state['square_avg'] = np.zeros_like(p.array)
            if momentum > 0:
                state['momentum_buffer'] = np.zeros_like(p.array)
            if group['centered']:
                state['grad_avg'] = np.zeros_like(p.array)
        state['step'] += 1
        v = state['square_avg']
        v[...] = alpha * v + (1 - alpha) * g * g
        if group['centered']:
            mean = state['grad_avg']
            mean[...] = alpha * mean + (1 - alpha) * g
            avg = np.sqrt(v - mean * mean) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = state['momentum_buffer']
            buf[...] = momentum * buf + g / avg
            p.array -= lr * buf
        else:
            p.array -= lr * g / avg


class Adagrad(Optimizer):
    """Each element gets its own step size, smaller the more gradient it has seen:
    sum += g^2;  p -= lr_t * g / (sqrt(sum) + eps), with lr_t = lr / (1 + (t - 1) * lr_decay).
    sum starts at initial_accumulator_value; weight_decay is L2 (g += wd * p)."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        _at_least_0(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                    initial_accumulator_value=initial_accumulator_value, eps=eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))

    def _update(self, p, g, state, group):
        if group['weight_decay']:
            g = g + group['weight_decay'] * p.array
        if 'step' not in state:
            state['step'] = 0
            state['sum'] = np.full_like(p.array, group['initial_accumulator_value'])
        state['step'] += 1
        lr_t = group['lr'] / (1 + (state['step'] - 1) * group['lr_decay'])
        state['sum'] += g * g
        p.array -= lr_t * g / (np.sqrt(state['sum']) + group['eps'])


class Adadelta(Optimizer):
    """Adagrad's step size without a learning rate to tune: the step is scaled by the
    running RMS of past steps over the running RMS of gradients:
    v = rho v + (1 - rho) g^2;  delta = sqrt(u + eps) / sqrt(v + eps) * g;
    u = rho u + (1 - rho) delta^2;  p -= lr * delta.  weight_decay is L2."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        _at_least_0(lr=lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        _at_least_0(eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, capturable=capturable,
                                      foreach=foreach, differentiable=differentiable))

    def _update(self, p, g, state, group):
        rho, eps = group['rho'], group['eps']
        if group['weight_decay']:
            g = g + group['weight_decay'] * p.array
        if 'step' not in state:
            state['step'] = 0
            state['square_avg'] = np.zeros_like(p.array)  # v, of the gradients
            state['acc_delta'] = np.zeros_like(p.array)   # u, of the steps
        state['step'] += 1
        v, u = state['square_avg'], state['acc_delta']
        v[...] = rho * v + (1 - rho) * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u[...] = rho * u + (1 - rho) * delta * delta
        p.array -= group['lr'] * delta


class LBFGS(Optimizer):
    """L-BFGS, PyTorch's (after minFunc): a quasi-Newton method for a full-batch problem.
    step(closure) runs up to max_iter iterations, calling closure (which zeroes the
    gradients, computes the loss, calls backward and returns the loss) as often as it
    needs. Each iteration steps along d = -H g, where H, an estimate of the inverse
    Hessian, comes from the last history_size pairs s = x' - x, y = g' - g by the
    two-loop recursion; the step length is lr (lr * min(1, 1 / |g|_1) the very first
    time), or what a strong Wolfe line search finds (line_search_fn='strong_wolfe').
    It stops when max |g| <= tolerance_grad, when the step or the change of the loss is
    below tolerance_change, or after max_eval closure calls (max_iter * 5 // 4).
    All parameters are one flat vector here; there is one parameter group."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None, *,
                 maximize=False):
        _at_least_0(lr=lr)
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                                      tolerance_grad=tolerance_grad,
                                      tolerance_change=tolerance_change,
                                      history_size=history_size, line_search_fn=line_search_fn,
                                      maximize=maximize))
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")

    def _flat_grad(self):
        """Every parameter's gradient as one vector (zeros where there is none)."""
        flat = np.concatenate([p.grad.array.ravel() if p.grad is not None else
                               np.zeros(p.numel(), p.dtype) for p in self._params()])
        return -flat if self.param_groups[0]['maximize'] else flat

    def _add(self, t, d):
        """parameters += t * d, d being one vector for all of them."""
        offset = 0
        for p in self._params():
            p.array += t * d[offset:offset + p.numel()].reshape(p.shape)
            tt._bump(p)
            offset += p.numel()

    def _set(self, arrays):
        for p, a in zip(self._params(), arrays):
            p.array[...] = a
            tt._bump(p)

    def _loss(self, closure):
        with tt.enable_grad():
            loss = closure()
        return loss, (-float(loss) if self.param_groups[0]['maximize'] else float(loss))

    def _evaluate(self, closure, x, t, d):
        """The loss and the gradient at x + t d (for the line search); the parameters are
        set back to x."""
        self._add(t, d)
        loss = self._loss(closure)[1]
        g = self._flat_grad()
        self._set(x)
        return loss, g

    def step(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group['lr'], group['max_iter'], group['max_eval']
        tolerance_grad, tolerance_change = group['tolerance_grad'], group['tolerance_change']
        if group['line_search_fn'] not in (None, 'strong_wolfe'):
            raise RuntimeError(f"LBFGS: line_search_fn={group['line_search_fn']!r}: only "
                               "'strong_wolfe' (or None) is supported")
        state = self.state.setdefault(self._params()[0], {})  # the state lives on the first
        state.setdefault('func_evals', 0)
        state.setdefault('n_iter', 0)
        orig_loss, loss = self._loss(closure)
        current_evals = 1
        state['func_evals'] += 1
        g = self._flat_grad()
        if np.abs(g).max() <= tolerance_grad:  # already at a minimum
            return orig_loss
        d, t, prev_g, prev_loss = (state.get(k) for k in ('d', 't', 'prev_flat_grad', 'prev_loss'))
        old_dirs, old_stps, ro, H_diag = (state.get(k) for k in ('old_dirs', 'old_stps', 'ro', 'H_diag'))
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state['n_iter'] += 1
            if state['n_iter'] == 1:  # the first direction: steepest descent
                d = -g
                old_dirs, old_stps, ro, H_diag = [], [], [], 1
            else:
                y, s = g - prev_g, d * t  # the change of the gradient, the last step
                ys = y @ s
                if ys > 1e-10:  # a pair that keeps H positive definite: remember it
                    if len(old_dirs) == group['history_size']:
                        old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / (y @ y)  # the initial H: a scaled identity
                # the two-loop recursion: d = -H g, from the remembered pairs
                q, al = -g, [0.0] * len(old_dirs)
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = (old_stps[i] @ q) * ro[i]
                    q = q - al[i] * old_dirs[i]
                d = q * H_diag
                for i in range(len(old_dirs)):
                    be_i = (old_dirs[i] @ d) * ro[i]
                    d = d + (al[i] - be_i) * old_stps[i]
            prev_g, prev_loss = g.copy(), loss
            t = min(1.0, 1.0 / np.abs(g).sum()) * lr if state['n_iter'] == 1 else lr
            gtd = g @ d  # the slope along d
            if gtd > -tolerance_change:  # d does not go down: stop
                break
            if group['line_search_fn'] == 'strong_wolfe':
                x0 = [p.array.copy() for p in self._params()]
                loss, g, t, evals = _strong_wolfe(
                    lambda x, t, d: self._evaluate(closure, x, t, d), x0, t, d, loss, g, gtd,
                    max_ls=max_eval - current_evals)
                self._add(t, d)
                opt_cond = np.abs(g).max() <= tolerance_grad
            else:  # a fixed step; the loss and gradient there (unless this is the last)
                self._add(t, d)
                evals, opt_cond = 0, False
                if n_iter != max_iter:
                    loss = self._loss(closure)[1]
                    g = self._flat_grad()
                    opt_cond = np.abs(g).max() <= tolerance_grad
                    evals = 1
            current_evals += evals
            state['func_evals'] += evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if np.abs(d * t).max() <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                break  # the parameters or the loss no longer change
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_g, prev_loss=prev_loss)
        return orig_loss


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimum of the cubic through (x1, f1) and (x2, f2) with slopes g1, g2, kept
    within bounds (default: between x1 and x2); their middle if the cubic has none."""
    lo, hi = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square < 0:
        return (lo + hi) / 2.0
    d2 = math.sqrt(d2_square)
    if x1 <= x2:
        min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(min_pos, lo), hi)


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                  max_ls=25):
    """A step length t along d that satisfies the strong Wolfe conditions: enough
    decrease, f(t) <= f + c1 t gtd, and a flat enough slope, |g(t).d| <= -c2 gtd.
    First t grows until a bracket [lo, hi] holds such a point, then the bracket shrinks
    (cubic interpolation) until one is found. obj_func(x, t, d) -> (loss, gradient).
    Returns the loss, gradient and t found, and the number of evaluations."""
    d_norm = np.abs(d).max()
    f_new, g_new = obj_func(x, t, d)
    evals, ls_iter = 1, 0
    gtd_new = g_new @ d
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    while ls_iter < max_ls:  # 1. find a bracket
        if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:  # t satisfies both conditions
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:  # the slope turned: the minimum is behind
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        # still going down: a longer step, by cubic interpolation within [1.01 t, 10 t]
        t_next = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                                    bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = t, f_new, g_new, gtd_new
        t = t_next
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = g_new @ d
        ls_iter += 1
    if ls_iter == max_ls:  # no bracket found within max_ls evaluations
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    insuf_progress = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:  # 2. shrink the bracket (zoom)
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0],
                               bracket[1], bracket_f[1], bracket_gtd[1])
        # a point too near an end of the bracket makes little progress: move it in
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) \
                    else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = g_new @ d
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= bracket_f[low]:  # not enough decrease: new high
            bracket[high], bracket_f[high] = t, f_new
            bracket_g[high], bracket_gtd[high] = g_new, gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:  # the old low becomes high
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low] = t, f_new
            bracket_g[low], bracket_gtd[low] = g_new, gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals


# ---------------------------------------------------------------------------
# Learning-rate schedules: call scheduler.step() once per optimizer step (or epoch)
# ---------------------------------------------------------------------------
def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):  # PyTorch's check and message
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


class LRScheduler:
    """Sets each param group's lr from its initial lr (base_lr) and the step count t
    (last_epoch). As in PyTorch, creating a scheduler already sets the lr for t = 0;
    last_epoch=-1 means a fresh start, and a larger value resumes at that step (the groups
    must then have 'initial_lr', which a first scheduler stores in them)."""

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault('initial_lr', group['lr'])
            elif 'initial_lr' not in group:
                raise KeyError(f"{type(self).__name__}: param 'initial_lr' is not specified in "
                               f"param_groups[{i}] when resuming with last_epoch={last_epoch}")
        self.base_lrs = [g['initial_lr'] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr, t):
        raise NotImplementedError

    def _lrs(self, t):
        return [self.lr_at(base, t) for base in self.base_lrs]

    def _apply(self):
        for group, lr in zip(self.optimizer.param_groups, self._lrs(self.last_epoch)):
            group['lr'] = lr

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


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(t); lr_lambda is one function or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer(optimizer)
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: expected {n} lr_lambdas, but got {len(self.lr_lambdas)}")
        super().__init__(optimizer, last_epoch)

    def _lrs(self, t):
        return [base * f(t) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    """lr = base_lr * gamma^(t // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        return base_lr * self.gamma ** (t // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma^(number of milestones <= t): times gamma at each milestone."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, t)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma^t."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        return base_lr * self.gamma ** t


class LinearLR(LRScheduler):
    """lr = base_lr * factor, the factor going linearly from start_factor to end_factor
    over total_iters steps, then staying at end_factor (a linear warmup by default)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1]")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        progress = min(self.total_iters, t) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """The 1cycle policy: lr rises from max_lr / div_factor to max_lr over the first
    pct_start of total_steps, then falls to max_lr / div_factor / final_div_factor
    (cosine curves, or straight lines with anneal_strategy='linear'); momentum (SGD's
    momentum, or Adam's beta1) moves the other way, between max_momentum and
    base_momentum. three_phase=True comes back down to the initial lr first, then
    falls to the end. The optimizer's own lr is ignored. Give total_steps, or epochs
    and steps_per_epoch."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy='cos', cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        _check_optimizer(optimizer)
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: You must define either total_steps OR "
                                 "(epochs AND steps_per_epoch)")
            total_steps = epochs * steps_per_epoch
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"OneCycleLR: expected a positive int total_steps, got {total_steps}")
        if anneal_strategy not in ('cos', 'linear'):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', "
                             f"got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
        self.cycle_momentum = cycle_momentum
        n = len(optimizer.param_groups)

        def per_group(x):
            return list(x) if isinstance(x, (list, tuple)) else [x] * n
        # each phase: (its last step, lr from, lr to, momentum from, momentum to)
        up = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(up, 'initial_lr', 'max_lr', 'max_momentum', 'base_momentum'),
                           (2 * up, 'max_lr', 'initial_lr', 'base_momentum', 'max_momentum'),
                           (total_steps - 1, 'initial_lr', 'min_lr', 'max_momentum', 'max_momentum')]
        else:
            self.phases = [(up, 'initial_lr', 'max_lr', 'max_momentum', 'base_momentum'),
                           (total_steps - 1, 'max_lr', 'min_lr', 'base_momentum', 'max_momentum')]
        if cycle_momentum and 'momentum' not in optimizer.defaults and \
                'betas' not in optimizer.defaults:
            raise ValueError("OneCycleLR: optimizer must support momentum or beta1 with "
                             "`cycle_momentum` option enabled")
        if last_epoch == -1:
            for group, top, low, high in zip(optimizer.param_groups, per_group(max_lr),
                                             per_group(base_momentum), per_group(max_momentum)):
                group['initial_lr'] = top / div_factor
                group['max_lr'] = top
                group['min_lr'] = group['initial_lr'] / final_div_factor
                group['base_momentum'], group['max_momentum'] = low, high
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == 'cos':
            return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
        return start + (end - start) * pct

    def _apply(self):
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: Tried to step {t} times. The specified number of "
                             f"total steps is {self.total_steps}")
        for group in self.optimizer.param_groups:
            begin = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
                if t <= end or i == len(self.phases) - 1:
                    pct = (t - begin) / (end - begin)
                    group['lr'] = self._anneal(group[lr0], group[lr1], pct)
                    momentum = self._anneal(group[m0], group[m1], pct)
                    break
                begin = end
            if self.cycle_momentum:
                if 'betas' in group:
                    group['betas'] = (momentum, *group['betas'][1:])
                else:
                    group['momentum'] = momentum


class WarmupCosineLR(LRScheduler):
    """Linear warmup from 0 to base_lr over warmup_steps, then cosine decay to
    min_lr at total_steps (and min_lr after it): nanoGPT's schedule."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0, last_epoch=-1):
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, t):
        if t < self.warmup_steps:
            return base_lr * (t + 1) / (self.warmup_steps + 1)
        if t >= self.total_steps:
            return self.min_lr
        progress = (t - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


@no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
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


@no_grad()
def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value], in place.
    parameters is one tensor or an iterable of them."""
    if isinstance(parameters, tt.Tensor):
        parameters = [parameters]
    for p in parameters:
        if p.grad is not None:
            np.clip(p.grad.array, -clip_value, clip_value, out=p.grad.array)


def parameters_to_vector(parameters):
    """torch.nn.utils.parameters_to_vector: every parameter flattened, one after another,
    into one vector (in the graph: its gradient flows back to each parameter)."""
    return tt.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters):
    """torch.nn.utils.vector_to_parameters: the inverse; each parameter's data becomes its
    slice of vec, in order (outside the graph, and sharing vec's memory, as PyTorch's)."""
    if not isinstance(vec, tt.Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    start = 0
    for p in parameters:
        n = p.numel()
        p.data = vec[start:start + n].reshape(p.shape).detach()  # a view of vec, as PyTorch's
        start += n


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
