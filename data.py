"""data.py: datasets, samplers and a DataLoader, as torch.utils.data has them.

A DataLoader is an index order and a slice: a sampler says in which order to visit the
indices 0..N-1 (in order, shuffled, weighted, ...), a batch sampler cuts that order into
lists of batch_size indices, and collate_fn stacks the examples of each list into tensors.

  Dataset        anything with __len__ and __getitem__(i) -> an example
  TensorDataset  examples are the i-th rows of some tensors (images, labels)
  IterableDataset  a stream of examples (__iter__), read in order
  Subset, random_split
  SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler, BatchSampler
  DistributedSampler (one replica: this process)
  DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
             num_workers=0, collate_fn=None, drop_last=False, generator=None, ...)
  default_collate, default_convert

Everything runs in the calling process: num_workers > 0 is accepted with a notice.
Needs only NumPy and tinytorch.py.
"""
import collections.abc
import itertools
import math
import warnings

import tinytorch as tt
import numpy as np


class Dataset:
    """A dataset: len(ds) examples, ds[i] is one (a tensor, or a tuple of tensors)."""

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __getitem__(self, i):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


class IterableDataset(Dataset):
    """A dataset that is a stream: __iter__ yields the examples (lines of a file too big to
    index, generated data). A DataLoader reads it in order, batch_size at a time, and
    takes no sampler and no shuffle (the stream has no indices to choose from). In this
    process get_worker_info() is None: the whole stream is this process's."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __len__(self):  # as PyTorch's: a TypeError, unless the stream defines its length
        raise TypeError(f"object of type '{type(self).__name__}' has no len() (an "
                        "IterableDataset has a length only if it defines __len__)")

    def __getitem__(self, i):
        raise NotImplementedError(f"{type(self).__name__} is an IterableDataset: iterate "
                                  "over it (it has no ds[i])")


class TensorDataset(Dataset):
    """Example i is (t[i] for each tensor): the tensors must agree on their first dim."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: give at least one tensor")
        sizes = [len(t) for t in tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"TensorDataset: the tensors must have the same first dim, got "
                             f"sizes {sizes}")
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.dataset[self.indices[i]]


def random_split(dataset, lengths, generator=tt.default_generator):
    """Split into Subsets of the given lengths (or fractions that add up to 1), at random."""
    n = len(dataset)
    if all(isinstance(x, float) for x in lengths) and math.isclose(sum(lengths), 1.0):
        counts = [int(math.floor(n * f)) for f in lengths]
        for k in range(n - sum(counts)):  # the remainder, one each, as PyTorch
            counts[k % len(counts)] += 1
    else:
        counts = list(lengths)
    if sum(counts) != n or min(counts) < 0:
        raise ValueError(f"random_split: the lengths {list(lengths)} do not add up to the "
                         f"dataset's length {n}")
    order = tt._numpy_rng(generator).permutation(n).tolist()
    starts = np.cumsum([0] + counts)
    return [Subset(dataset, order[a:b]) for a, b in zip(starts[:-1], starts[1:])]


# ---------------------------------------------------------------------------
# Samplers: each yields dataset indices in some order
# ---------------------------------------------------------------------------
class Sampler:
    """Yields dataset indices; subclasses define __iter__ (and __len__ when they can)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


def _private_rng(generator):
    """The generator's NumPy generator; with none, as PyTorch: a fresh one, seeded from
    tinytorch's default generator (so tt.manual_seed fixes the order, and the draws
    made while iterating don't depend on other random ops in between)."""
    if generator is not None:
        return tt._numpy_rng(generator)
    return np.random.default_rng(int(tt._numpy_rng(None).integers(2 ** 63)))


class RandomSampler(Sampler):
    """The indices in a random order (a new one each epoch). replacement=True draws
    num_samples indices independently instead; without replacement, num_samples larger
    than the dataset chains several permutations."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement should be a boolean value, but got "
                            f"replacement={replacement!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"RandomSampler: num_samples should be a positive integer value, "
                             f"but got num_samples={num_samples!r}")
        self.data_source, self.replacement = data_source, replacement
        self._num_samples, self.generator = num_samples, generator

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n, rng = len(self.data_source), _private_rng(self.generator)
        if self.replacement:
            for start in range(0, self.num_samples, 1024):  # in chunks: makemore asks for 1e10
                yield from rng.integers(0, n, size=min(1024, self.num_samples - start)).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from rng.permutation(n).tolist()
            yield from rng.permutation(n)[:self.num_samples % n].tolist()

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices, in a random order."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        for k in _private_rng(self.generator).permutation(len(self.indices)).tolist():
            yield self.indices[k]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices drawn with probability proportional to weights[i] (to
    balance classes, say), with replacement by default."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"WeightedRandomSampler: num_samples should be a positive integer "
                             f"value, but got num_samples={num_samples!r}")
        if not isinstance(replacement, bool):
            raise ValueError(f"WeightedRandomSampler: replacement should be a boolean value, "
                             f"but got replacement={replacement!r}")
        w = weights.array if isinstance(weights, tt.Tensor) else weights
        self.weights = tt.tensor(np.asarray(w, dtype=np.float64))
        if self.weights.dim() != 1:
            raise ValueError(f"WeightedRandomSampler: weights should be a 1d sequence, but got "
                             f"shape {tuple(self.weights.shape)}")
        self.num_samples, self.replacement, self.generator = num_samples, replacement, generator

    def __iter__(self):
        w = self.weights.array
        yield from _private_rng(self.generator).choice(
            len(w), size=self.num_samples, replace=self.replacement, p=w / w.sum()).tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Cuts another sampler's indices into lists of batch_size; the last, shorter list is
    kept unless drop_last=True."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"BatchSampler: batch_size should be a positive integer value, but "
                             f"got batch_size={batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"BatchSampler: drop_last should be a boolean value, but got "
                             f"drop_last={drop_last!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        return _batches(len(self.sampler), self.batch_size, self.drop_last)


def _batches(n, batch_size, drop_last):
    """How many batches n examples make: the short last one counts unless it is dropped."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


class DistributedSampler(Sampler):
    """torch.utils.data.distributed.DistributedSampler for the one process tinytorch runs
    in (num_replicas=1, rank=0; None means that): each epoch every index once, in order
    with shuffle=False, else in the order randperm gives with a generator seeded
    seed + epoch, so the order changes when set_epoch(epoch) is called, as PyTorch's
    (PyTorch's random numbers are not NumPy's: the shuffled order is another one)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        num_replicas = 1 if num_replicas is None else num_replicas
        rank = 0 if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"DistributedSampler: Invalid rank {rank}, rank should be in the "
                             f"interval [0, {num_replicas - 1}]")
        if num_replicas != 1:
            raise RuntimeError(f"DistributedSampler: num_replicas={num_replicas}: tinytorch "
                               "trains in one process on the CPU (num_replicas=1, rank=0; run "
                               "the program without torchrun)")
        self.dataset, self.num_replicas, self.rank, self.epoch = dataset, 1, 0, 0
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.num_samples = self.total_size = len(dataset)  # one replica: all of them

    def __iter__(self):
        if not self.shuffle:
            return iter(range(len(self.dataset)))
        g = tt.Generator()
        g.manual_seed(self.seed + self.epoch)
        return iter(tt.randperm(len(self.dataset), generator=g).tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """The next epoch's order: call it before each epoch (the same epoch, the same order)."""
        self.epoch = epoch


# ---------------------------------------------------------------------------
# DataLoader
# ---------------------------------------------------------------------------
class DataLoader:
    """Batches of a dataset, as torch.utils.data.DataLoader: each epoch (each
    `for batch in loader`) the batch sampler gives lists of indices and collate_fn turns
    the examples of each list into a batch.

    By default the order is 0..N-1, or shuffled when shuffle=True (by the generator you
    give, else by tinytorch's, so tt.manual_seed makes it reproducible); batches have
    batch_size examples, the last one fewer unless drop_last=True. Give your own sampler
    (an order of indices) or batch_sampler (lists of indices) instead, with PyTorch's
    rules on which arguments go together. batch_size=None yields single examples.
    num_workers, pin_memory, timeout, worker_init_fn, prefetch_factor and
    persistent_workers are accepted as PyTorch checks them, and all the work is done in
    this process."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device='',
                 in_order=True):
        if num_workers < 0:
            raise ValueError("DataLoader: num_workers option should be non-negative; use "
                             "num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("DataLoader: timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("DataLoader: prefetch_factor option could only be specified in "
                             "multiprocessing: let num_workers > 0, or set prefetch_factor=None.")
        if persistent_workers and num_workers == 0:
            raise ValueError("DataLoader: persistent_workers option needs num_workers > 0")
        if num_workers > 0:
            warnings.warn(f"DataLoader: num_workers={num_workers} loads in this process "
                          f"(tinytorch has no worker processes); the batches are the same",
                          stacklevel=2)
        if isinstance(dataset, IterableDataset):  # a stream: nothing to sample from
            for name, value in (('shuffle', shuffle), ('sampler', sampler),
                                ('batch_sampler', batch_sampler)):
                if value not in (None, False):
                    raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                     f"{name} option, but got {name}={value}")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("DataLoader: batch_sampler option is mutually exclusive with "
                                 "batch_size, shuffle, sampler, and drop_last")
            batch_size = None
        elif batch_size is None:
            if drop_last:
                raise ValueError("DataLoader: batch_size=None option disables auto-batching "
                                 "and is mutually exclusive with drop_last")
        elif not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int or None, got "
                             f"{batch_size!r}")
        if isinstance(dataset, IterableDataset):
            sampler = None  # the stream is read in its own order (_stream)
        elif sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else \
                SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and sampler is not None:
            batch_sampler = BatchSampler(sampler, batch_size, bool(drop_last))
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler, self.batch_sampler, self.generator = sampler, batch_sampler, generator
        self.num_workers, self.pin_memory, self.timeout = num_workers, pin_memory, timeout
        self.worker_init_fn, self.prefetch_factor = worker_init_fn, prefetch_factor
        self.persistent_workers = persistent_workers
        if collate_fn is None:
            collate_fn = default_convert if batch_size is None and batch_sampler is None \
                else default_collate
        self.collate_fn = collate_fn

    def __len__(self):
        if isinstance(self.dataset, IterableDataset):  # the stream's length, if it has one
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return _batches(n, self.batch_size, self.drop_last)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def __iter__(self):
        if isinstance(self.dataset, IterableDataset):
            yield from self._stream()
            return
        if self.batch_sampler is None:  # batch_size=None: one example at a time
            for i in self.sampler:
                yield self.collate_fn(self.dataset[i])
            return
        for indices in self.batch_sampler:
            yield self._batch(indices)

    def _stream(self):
        """An IterableDataset's batches: its examples in order, batch_size at a time (the
        last, shorter batch dropped with drop_last), or one at a time with batch_size=None."""
        examples = iter(self.dataset)
        if self.batch_size is None:
            for example in examples:
                yield self.collate_fn(example)
            return
        while True:
            batch = list(itertools.islice(examples, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield self.collate_fn(batch)

    def _batch(self, indices):
        ds = self.dataset
        if isinstance(ds, TensorDataset) and self.collate_fn is default_collate:
            index = tt.tensor(np.asarray(indices, dtype=np.int64))
            return [t[index] for t in ds.tensors]  # one slice per tensor, not one per example
        return self.collate_fn([ds[i] for i in indices])


def get_worker_info():
    """PyTorch's: information about the worker process running this code; None in the
    main process, which is where tinytorch always loads."""
    return None


# ---------------------------------------------------------------------------
# Collating: a list of examples -> a batch
# ---------------------------------------------------------------------------
def default_collate(batch):
    """Stack a list of examples into a batch, as PyTorch's default_collate: tensors and
    NumPy arrays are stacked along a new first dim; Python ints become an int64 tensor,
    floats a float64 one, bools a bool one; strings stay a list; dicts, tuples and
    lists are collated field by field (a tuple of fields comes back as a list)."""
    elem = batch[0]
    if isinstance(elem, tt.Tensor):
        return tt.stack(batch)
    if isinstance(elem, np.ndarray):
        return tt.stack([tt.tensor(x) for x in batch])
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        return tt.tensor(np.array(batch))  # NumPy scalars keep their dtype
    if isinstance(elem, bool):
        return tt.tensor(batch, dtype=tt.bool_)
    if isinstance(elem, int):
        return tt.tensor(batch, dtype=tt.int64)
    if isinstance(elem, float):
        return tt.tensor(batch, dtype=tt.float64)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return {key: default_collate([d[key] for d in batch]) for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, '_fields'):  # a namedtuple keeps its type
        return type(elem)(*(default_collate(list(field)) for field in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(example) != len(elem) for example in batch):
            raise RuntimeError("default_collate: each element in list of batch should be of "
                               "equal size")
        return [default_collate(list(field)) for field in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(elem).__name__}")


def default_convert(data):
    """What batch_size=None applies to each example: NumPy arrays (and scalars) become
    tensors, inside dicts, tuples and lists too; anything else is left as it is."""
    if isinstance(data, np.ndarray) or \
            (isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_))):
        return tt.tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return {key: default_convert(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, '_fields'):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, list):
        return [default_convert(d) for d in data]
    return data
