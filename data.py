"""data.py: datasets and a DataLoader, as torch.utils.data has them.

A DataLoader is an index permutation and a slice: each epoch it shuffles the numbers
0..N-1 (or not), cuts them into batches of batch_size, and stacks the examples of each
batch into tensors.

  Dataset        anything with __len__ and __getitem__(i) -> an example
  TensorDataset  examples are the i-th rows of some tensors (images, labels)
  Subset, random_split
  DataLoader(dataset, batch_size=1, shuffle=False, drop_last=False, generator=None)

Needs only NumPy and tinytorch.py.
"""
import math

import tinytorch as tt  # before NumPy, so it can set up OpenBLAS's threads (see its top)
import numpy as np


class Dataset:
    """A dataset: len(ds) examples, ds[i] is one (a tensor, or a tuple of tensors)."""

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __getitem__(self, i):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


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


def _rng(generator):
    return tt._numpy_rng(generator)  # None: the library's default generator


def random_split(dataset, lengths, generator=None):
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
    order = _rng(generator).permutation(n).tolist()
    starts = np.cumsum([0] + counts)
    return [Subset(dataset, order[a:b]) for a, b in zip(starts[:-1], starts[1:])]


class DataLoader:
    """Batches of a dataset: each epoch (each `for batch in loader`), the indices 0..N-1,
    shuffled when shuffle=True (by tinytorch's generator, so tt.manual_seed makes the order
    reproducible, or by the NumPy generator you give), are cut into batches of
    batch_size; the examples of a batch are stacked along a new first dim. The last,
    smaller batch is kept unless drop_last=True."""

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, generator=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.drop_last, self.generator = shuffle, drop_last, generator

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        n = len(self.dataset)
        order = _rng(self.generator).permutation(n) if self.shuffle else np.arange(n)
        for k in range(len(self)):
            yield self._batch(order[k * self.batch_size:(k + 1) * self.batch_size])

    def _batch(self, idx):
        ds = self.dataset
        if isinstance(ds, TensorDataset):  # one slice per tensor instead of one per example
            return tuple(t[tt.tensor(idx)] for t in ds.tensors)
        return collate([ds[int(i)] for i in idx])


def collate(examples):
    """Stack a list of examples into a batch: tensors (or numbers) along a new first dim,
    tuples of them field by field."""
    first = examples[0]
    if isinstance(first, (tuple, list)):
        return tuple(collate([e[k] for e in examples]) for k in range(len(first)))
    if isinstance(first, tt.Tensor):
        return tt.stack(examples)
    return tt.tensor(np.array(examples))
