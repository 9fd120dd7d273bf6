"""distributions.py: probability distributions, as torch.distributions has them.

    Categorical(probs=None, logits=None)   one of k classes (the last dim holds the k)
    Bernoulli(probs=None, logits=None)     0 or 1
    Normal(loc, scale)                     a Gaussian; rsample() is differentiable
    kl_divergence(p, q)                    for two Normals or two Categoricals

Each has sample(sample_shape), log_prob(value) and entropy(), and mean, variance, stddev.
log_prob and entropy are a few tinytorch ops each, so their gradients reach the
parameters (a policy gradient: -(dist.log_prob(action) * reward).sum().backward()).
sample() draws without a graph; Normal's rsample() draws loc + scale * eps with
eps ~ N(0, 1), so the draw itself is differentiable in loc and scale (the
reparameterisation trick of a VAE). The draws come from tinytorch's generator
(tt.manual_seed fixes them): NumPy's random numbers, not PyTorch's.

The arguments are checked as PyTorch checks them (validate_args=False skips it): a
scale > 0, probabilities in [0, 1], a value in the support. Needs only NumPy,
tinytorch.py and nn.py.
"""
import math

import numpy as np

import tinytorch as tt
import nn

from tinytorch import Tensor


def _as_tensor(x, dtype=None):
    """A number becomes a tensor of the default float dtype (or dtype), as PyTorch's."""
    return x if isinstance(x, Tensor) else tt.tensor(float(x), dtype=dtype)


def _broadcast(*values):
    """Tensors and numbers -> tensors of one shape (numbers take the tensors' dtype)."""
    dtype = next((v.dtype for v in values if isinstance(v, Tensor)), None)
    tensors = [_as_tensor(v, dtype) for v in values]
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return [t if tuple(t.shape) == shape else t.expand(shape) for t in tensors]  # the leaf
    # itself where it can be: a second backward through the distribution works, as in PyTorch


def _invalid(name, constraint, dist, values):
    return ValueError(f"Expected parameter {name} (Tensor of shape {tuple(values.shape)}) of "
                      f"distribution {dist} to satisfy the constraint {constraint}, but found "
                      f"invalid values: {values.tolist()}")


class Distribution:
    """What every distribution has: batch_shape (independent distributions side by side),
    event_shape (the shape of one draw: () here), sample, and the checks."""
    has_rsample = False

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self.batch_shape, self.event_shape = tuple(batch_shape), tuple(event_shape)
        self._validate_args = validate_args is not False

    def _extended_shape(self, sample_shape=()):
        return tuple(sample_shape) + self.batch_shape + self.event_shape

    def sample(self, sample_shape=()):
        """Draws of shape sample_shape + batch_shape, without a graph."""
        with tt.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no rsample (its draws cannot be "
                                  "differentiated); use sample()")

    def _value(self, value):
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        return value

    @property
    def stddev(self):
        return self.variance.sqrt()

    def __repr__(self):
        shape = lambda t: f"torch.Size({list(t.shape)})" if t.ndim else str(t.item())  # noqa: E731
        return f"{type(self).__name__}({', '.join(f'{k}: {shape(v)}' for k, v in self._params())})"


class Normal(Distribution):
    """N(loc, scale^2): density exp(-(x - loc)^2 / (2 scale^2)) / (scale sqrt(2 pi))."""
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast(loc, scale)
        super().__init__(self.loc.shape, validate_args=validate_args)
        if self._validate_args and not (self.scale.array > 0).all():
            raise _invalid('scale', 'GreaterThan(lower_bound=0.0)', self, self.scale)

    def _params(self):
        return [('loc', self.loc), ('scale', self.scale)]

    def rsample(self, sample_shape=()):
        """loc + scale * eps, eps ~ N(0, 1): d/d loc = 1, d/d scale = eps."""
        eps = tt.randn(*self._extended_shape(sample_shape), dtype=self.loc.dtype)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        """log N(x; loc, scale) = -(x - loc)^2 / (2 scale^2) - log scale - log sqrt(2 pi)"""
        value = self._value(value)
        return (-((value - self.loc) ** 2) / (2 * self.scale ** 2) - self.scale.log()
                - math.log(math.sqrt(2 * math.pi)))

    def entropy(self):
        """1/2 + 1/2 log(2 pi) + log scale"""
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    def cdf(self, value):
        """P(X <= x) = (1 + erf((x - loc) / (scale sqrt 2))) / 2"""
        value = self._value(value)
        return 0.5 * (1 + tt.erf((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self.scale ** 2

    @property
    def stddev(self):
        return self.scale


def _probs_or_logits(name, probs, logits):
    if (probs is None) == (logits is None):
        raise ValueError(f"{name}: Either `probs` or `logits` must be specified, but not both.")


class Categorical(Distribution):
    """One of k classes 0..k-1 with probabilities probs (the last dim; each row is
    normalised to sum to 1), or softmax(logits). Draws are int64."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        _probs_or_logits('Categorical', probs, logits)
        given = probs if probs is not None else logits
        if given.ndim < 1:
            raise ValueError(f"`{'probs' if probs is not None else 'logits'}` parameter must be "
                             "at least one-dimensional.")
        super().__init__(given.shape[:-1], validate_args=validate_args)
        if probs is not None:
            if self._validate_args and not (probs.array >= 0).all():
                raise _invalid('probs', 'Simplex()', 'Categorical', probs)
            self.probs = probs / probs.sum(-1, keepdim=True)
            eps = np.finfo(probs.dtype).eps  # log 0 would be -inf: PyTorch clamps first
            self.logits = self.probs.clamp(eps, 1 - eps).log()
        else:
            self.logits = logits - logits.logsumexp(-1, keepdim=True)  # log-probabilities
            self.probs = self.logits.softmax(-1)
        self._num_events = given.shape[-1]

    def _params(self):
        return [('probs', self.probs)]

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        n = math.prod(sample_shape)
        with tt.no_grad():
            draws = tt.multinomial(self.probs.reshape(-1, self._num_events), n, True)  # (B, n)
        return draws.T.reshape(shape)

    def log_prob(self, value):
        """log probs[value], read from the normalised logits (gather)."""
        value = self._value(value)
        k = self._num_events
        if self._validate_args and not ((value.array == np.round(value.array)).all() and
                                        (value.array >= 0).all() and (value.array < k).all()):
            raise ValueError(f"Expected value argument (Tensor of shape {tuple(value.shape)}) to "
                             f"be within the support (IntegerInterval(lower_bound=0, "
                             f"upper_bound={k - 1})) of the distribution {self}, but found "
                             f"invalid values: {value.tolist()}")
        index = value.long().unsqueeze(-1)
        shape = np.broadcast_shapes(tuple(index.shape), tuple(self.logits.shape))
        log_pmf = self.logits.expand(shape)
        return log_pmf.gather(-1, index.expand(shape[:-1] + (1,))).squeeze(-1)

    def entropy(self):
        """-sum_k p_k log p_k"""
        logits = self.logits.clamp(min=np.finfo(self.logits.dtype).min)  # -inf * 0 would be nan
        return -(logits * self.probs).sum(-1)

    @property
    def mode(self):
        return self.probs.argmax(-1)

    @property
    def mean(self):
        return tt.full(self._extended_shape(), math.nan, dtype=self.probs.dtype)

    @property
    def variance(self):
        return tt.full(self._extended_shape(), math.nan, dtype=self.probs.dtype)


class Bernoulli(Distribution):
    """1 with probability probs (or sigmoid(logits)), else 0. Draws have probs' dtype."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        _probs_or_logits('Bernoulli', probs, logits)
        if probs is not None:
            self.probs = _as_tensor(probs)
            super().__init__(self.probs.shape, validate_args=validate_args)
            if self._validate_args and not ((self.probs.array >= 0).all() and
                                            (self.probs.array <= 1).all()):
                raise _invalid('probs', 'Interval(lower_bound=0.0, upper_bound=1.0)',
                               'Bernoulli', self.probs)
            eps = np.finfo(self.probs.dtype).eps
            p = self.probs.clamp(eps, 1 - eps)
            self.logits = p.log() - (-p).log1p()  # log(p / (1 - p))
        else:
            self.logits = _as_tensor(logits)
            super().__init__(self.logits.shape, validate_args=validate_args)
            self.probs = self.logits.sigmoid()

    def _params(self):
        return [('probs', self.probs)]

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        p = self.probs.detach().expand(shape).array
        u = tt._numpy_rng(None).random(shape)
        return tt.tensor((u < p).astype(p.dtype))

    def log_prob(self, value):
        """x log p + (1 - x) log(1 - p) = -binary_cross_entropy_with_logits(logits, x)"""
        value = self._value(value)
        if self._validate_args and not np.isin(value.array, (0, 1)).all():
            raise ValueError(f"Expected value argument (Tensor of shape {tuple(value.shape)}) to "
                             f"be within the support (Boolean()) of the distribution {self}, "
                             f"but found invalid values: {value.tolist()}")
        logits, value = _broadcast(self.logits, value.to(self.logits.dtype))
        return -nn.binary_cross_entropy_with_logits(logits, value, reduction='none')

    def entropy(self):
        """-p log p - (1 - p) log(1 - p)"""
        return nn.binary_cross_entropy_with_logits(self.logits, self.probs, reduction='none')

    @property
    def mean(self):
        return self.probs

    @property
    def variance(self):
        return self.probs * (1 - self.probs)


def kl_divergence(p, q):
    """KL(p || q) = E_p[log p(x) - log q(x)], in closed form for two Normals or two
    Categoricals (others are refused, as PyTorch refuses pairs it has no formula for)."""
    if isinstance(p, Normal) and isinstance(q, Normal):
        # 1/2 (s_p^2 / s_q^2 + (m_p - m_q)^2 / s_q^2 - 1 - log(s_p^2 / s_q^2))
        var_ratio = (p.scale / q.scale) ** 2
        t1 = ((p.loc - q.loc) / q.scale) ** 2
        return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        # sum_k p_k (log p_k - log q_k); a class q never gives but p does: inf; p_k = 0: 0
        t = p.probs * (p.logits - q.logits)
        t = tt.where(q.probs.expand(t.shape) == 0, math.inf, t)
        t = tt.where(p.probs.expand(t.shape) == 0, 0.0, t)
        return t.sum(-1)
    raise NotImplementedError(f"kl_divergence: no formula for {type(p).__name__} and "
                              f"{type(q).__name__} (tinytorch has Normal-Normal and "
                              "Categorical-Categorical)")


def __getattr__(name):  # torch.distributions.Beta and the others tinytorch lacks
    if name.startswith('__'):
        raise AttributeError(name)
    raise AttributeError(f"torch.distributions.{name}: tinytorch has Categorical, Bernoulli, "
                         "Normal and kl_divergence only")
