"""files.py: the one room for files. torch.save / torch.load (tt.save and tt.load call
torch_save and torch_load here: PyTorch's zip format, read by a grammar), nn.save /
nn.load (.npz or .safetensors), Hugging Face's .safetensors, and the reading that
export.py does of Hugging Face and nanoGPT files.

One threat model for every file a program reads: a file from someone else is hostile.
Reading one never runs code from it, never reads memory outside it, never allocates more
than what its arrays declare (and those are checked against the bytes that hold them),
takes time linear in its size, and a bad file is one line naming it and what is wrong
(pickle.UnpicklingError from torch_load; a CheckpointError from nn.load and
load_safetensors), never a traceback. Zip archives (PyTorch's files, .npz) are read by
one strict reader (_Zip: directory and local headers cross-checked, no overlapping or
duplicate members, inflation bounded by the declared size, CRCs checked); an .npy
member's header is parsed by the small grammar below, not by NumPy; a .safetensors
header is JSON whose every field is checked. Every write is atomic (atomic_write): a
temporary beside the file, renamed over it.

Formats: tt.save (PyTorch's zip: torch.load reads it) for a state_dict to share with
PyTorch, or a whole model (loaded back under safe_globals([...]), as PyTorch's); nn.save
(.npz + JSON, never pickle) for tinytorch's own training checkpoints; .safetensors for
Hugging Face.

What this file uses of the engine: its public names, and the three that tinytorch.py's
section 19 lists for it (its _FOR_FILES): _rebuild_tensor (a tensor of a class over an
array), _TENSOR_CLASSES (nn.py's Parameter, once nn.py is imported) and _cpu_only.
"""
import errno
import io
import json
import math
import os
import pickle
import re
import reprlib
import secrets
import stat
import struct
import sys
import zipfile
import zlib
from collections import OrderedDict as _OrderedDict

import numpy as np

import tinytorch as tt
from tinytorch import Size, Tensor, device

fcntl = __import__('fcntl') if os.name == 'posix' else None  # a live save locks its temporary
_NO_FOLLOW, _NO_BLOCK = getattr(os, 'O_NOFOLLOW', 0), getattr(os, 'O_NONBLOCK', 0)


class NotARegularFile(OSError):
    """A path that is a FIFO, a device, a folder (or, where links are not followed, a link):
    no reader here opens it."""


def open_regular(path, follow=True):
    """path opened for reading in binary, only if it is a regular file: without blocking (a
    FIFO would wait for a writer forever) and, with follow=False (a run folder's own
    files), without following a link. Else NotARegularFile, one line."""
    try:
        fd = os.open(path, os.O_RDONLY | _NO_BLOCK | getattr(os, 'O_BINARY', 0)
                     | (0 if follow else _NO_FOLLOW))
    except OSError as e:
        if not follow and e.errno == errno.ELOOP:
            raise NotARegularFile(f"{path} is a link, which a run folder's files never are; move "
                                  "it aside") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(f"{path} is not a regular file (a FIFO, a device or a folder)")
    f = os.fdopen(fd, 'rb')
    f.raw.name = os.fspath(path)  # as open() names it
    return f


# ---------------------------------------------------------------------------
# torch.save / torch.load: a checkpoint is data, read by a grammar
# ---------------------------------------------------------------------------
# torch.save / torch.load. A file from someone else is hostile: it is read, never run.
#
# The format torch_save() writes is PyTorch's own: a zip archive of archive/data.pkl (a pickle
# of the containers, in which each tensor is _rebuild_tensor_v2(storage, offset, size,
# stride, requires_grad, hooks)), archive/data/<key> (each storage's raw little-endian
# bytes), archive/byteorder and archive/version. So torch.load(weights_only=True) reads
# a tinytorch checkpoint, and tinytorch reads PyTorch's. An object outside the grammar (a
# whole model) is pickled into data.pkl as PyTorch pickles it: its class named, built by
# NEWOBJ, its fields set by BUILD; weights_only loads it only when the user listed its
# classes (safe_globals, as PyTorch's), or with weights_only=False (a NumPy array or
# scalar also loads with the default: the pattern NumPy's pickle writes is read below).
#
# torch_load() never hands the file to pickle's or NumPy's own code (unless
# weights_only=False: then the user trusts it). _Grammar is a loop over exactly the pickle
# opcodes a checkpoint needs; a GLOBAL names one of a closed table of constructions
# (_MAKERS) or a class the user listed, never another callable; every array is made by
# np.frombuffer from bytes of the file, with a dtype from a fixed table (_CODES) and its
# extent checked, then copied (the array the user gets owns its memory). Every budget is a
# function of the file's own bytes, checked as the work is done: the work (each opcode,
# value, memo entry, object: _PER_BYTE), bytes of arrays made against bytes of the
# pickle, the expanded size of values shared through the memo, the nesting depth, a
# deflated member's inflation (_INFLATION). Dict keys are strings, bytes, bools, None or
# integers of at most 60 bits, so no key set can make a dict quadratic. The zip archive is
# read by _Zip: one end record, whose comment holds no zip record (else zipfile, NumPy
# and PyTorch could read another archive than this), a central directory cross-checked
# with every local header (names, sizes, methods, CRCs; no two members overlap), a member
# inflating to exactly its declared size. Everything wrong is one line: "load: <file> <what>".
class _BadFile(pickle.UnpicklingError):
    """What is wrong with a file load() reads; load() adds the file's name in front."""


_HOSTILE = "the file is damaged or was made to attack: do not use it"
_MAX_DEPTH = 200  # containers inside containers (a state_dict is 3 or 4 deep)
_MAX_DIMS = 64  # NumPy's limit
_MAX_PICKLE = 1 << 28  # 256 MiB: data.pkl holds a checkpoint's structure, not its numbers
_INT_KEY = 1 << 60  # |key| below this: distinct int keys have distinct hashes (-1, -2 aside)
# The work a pickle may make the grammar do, in units of about a byte of memory, is a
# function of the file's own bytes (its size on disk: a deflated pickle earns what its
# deflated bytes do), checked as the work is done: each opcode and each value on the stack
# costs 4, a new memo entry 32, a tensor, array, storage or other object 1024 (a tensor
# takes about a KiB; PyTorch's pickle spends about 100 bytes on one, its file about 300).
_PER_BYTE, _FLOOR = 16, 1 << 20  # the budget: 16 units per byte of the file, and 1 MiB
_OBJECT = 1024
_INFLATION = 64  # a deflated member inflates at most 64 times its bytes (and 64 KiB)
_MAX_INFLATED = 1 << 32  # and all of an archive's deflated members at most 4 GiB
_INDEX_LIMIT = np.iinfo(np.intp).max  # elements x itemsize NumPy can index, zeros aside

# The plain numeric dtypes a checkpoint holds: NumPy's code (in a pickled array's dtype)
# and PyTorch's storage name and dtype name. Nothing else becomes an array.
_CODES = {'b1': (np.bool_, 'BoolStorage', 'bool'), 'u1': (np.uint8, 'ByteStorage', 'uint8'),
          'i1': (np.int8, 'CharStorage', 'int8'), 'i2': (np.int16, 'ShortStorage', 'int16'),
          'i4': (np.int32, 'IntStorage', 'int32'), 'i8': (np.int64, 'LongStorage', 'int64'),
          'f2': (np.float16, 'HalfStorage', 'float16'),
          'f4': (np.float32, 'FloatStorage', 'float32'),
          'f8': (np.float64, 'DoubleStorage', 'float64'),
          'c8': (np.complex64, 'ComplexFloatStorage', 'complex64'),
          'c16': (np.complex128, 'ComplexDoubleStorage', 'complex128')}
_STORAGE_DTYPES = {storage: np.dtype(t) for t, storage, _ in _CODES.values()}
_STORAGE_NAMES = {d: s for s, d in _STORAGE_DTYPES.items()}
_TORCH_DTYPES = {**{name: np.dtype(t) for t, _, name in _CODES.values()},  # and PyTorch's aliases
                 'float': tt.float32, 'double': tt.float64, 'half': tt.float16, 'long': tt.int64,
                 'int': tt.int32,
                 'short': np.dtype(np.int16)}
_DTYPE_NAMES_OUT = {np.dtype(t): name for t, _, name in _CODES.values()}


def _one_line(text):
    """text with each character a file may have put there that is not printable (a line end,
    a terminal's escape) shown escaped, as repr shows it: a refusal stays one line."""
    return ''.join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fail(what):
    """Refuse the file in one line."""
    raise _BadFile(_one_line(what))


class _Make:
    """A construction a GLOBAL names: a token the interpreter acts on, never called."""

    def __init__(self, kind, arg=None):
        self.kind, self.arg = kind, arg


class _Box:
    """A value made in two steps (REDUCE or NEWOBJ, then BUILD): NumPy's array and dtype,
    tinytorch's old device. Usable only once built, and built once."""

    def __init__(self, kind, arg):
        self.kind, self.arg, self.value = kind, arg, None


class _Args(tuple):
    """A tuple that holds a construction or a storage: only ever a construction's arguments."""


class _Storage:
    """A storage of a PyTorch file (BINPERSID): usable only as a tensor's first argument."""

    def __init__(self, array, member):
        self.array, self.member = array, member


_NUMPY_CORE = ('numpy.core.multiarray', 'numpy._core.multiarray')
_MAKERS = {('collections', 'OrderedDict'): _Make('OrderedDict'),
           ('torch._utils', '_rebuild_tensor_v2'): _Make('tensor'),
           ('torch._utils', '_rebuild_parameter'): _Make('parameter'),
           ('torch', 'Size'): _Make('Size'), ('torch', 'device'): _Make('device'),
           ('_codecs', 'encode'): _Make('latin1'),  # bytes in a protocol-2 pickle
           **{('torch', s): _Make('storage type', d) for s, d in _STORAGE_DTYPES.items()},
           **{('torch', n): d for n, d in _TORCH_DTYPES.items()},  # torch.float32: a value
           # what earlier tinytorch saves wrote (a plain pickle of tensors over NumPy arrays)
           (tt.__name__, '_rebuild_tensor'): _Make('old tensor'),
           (tt.__name__, 'Tensor'): _Make('class', 'Tensor'), (tt.__name__, 'Size'): _Make('Size'),
           (tt.__name__, 'device'): _Make('device'), ('numpy', 'ndarray'): _Make('ndarray'),
           ('numpy', 'dtype'): _Make('dtype'),
           **{(m, 'Parameter'): _Make('class', 'Parameter')
              for m in ('nn', f'{tt.__name__}.nn', f'{tt.__name__}._nn')},
           **{(m, '_reconstruct'): _Make('array') for m in _NUMPY_CORE},
           **{(m, 'scalar'): _Make('scalar') for m in _NUMPY_CORE}}


def _count(v, what):
    """A size, stride or shape: a tuple of at most 64 ints, each 0 <= n < 2**62."""
    if not (type(v) in (tuple, Size) and len(v) <= _MAX_DIMS
            and all(type(n) is int and 0 <= n < 1 << 62 for n in v)):
        _fail(f"has a tensor whose {what} is {_show(v)} (a tuple of at most {_MAX_DIMS} counts of "
              f"0 or more); {_HOSTILE}")
    return tuple(v)


def _key(k):
    """A dict key from the file: str, bytes, bool, None or an int of at most 60 bits, the
    keys a checkpoint needs (names, parameter ids, steps). Strings and bytes are hashed with
    the process's secret seed and such ints to themselves, so no set of keys a file holds
    collides; a tuple's hash is a fixed mix of its items', which a file can solve for."""
    t = type(k)
    if t in (str, bytes, bool) or k is None or (t is int and -_INT_KEY < k < _INT_KEY):
        return k
    _fail(f"has a dict key {_show(k)} of type {t.__name__} (a checkpoint's keys are strings or "
          f"integers below 2**60); {_HOSTILE}")


def _indexable(shape, itemsize, what):
    """shape's elements (its zeros aside) times itemsize fit NumPy's index: else NumPy
    refuses the shape with its own error, even for an array of no elements."""
    if math.prod(n for n in shape if n) * itemsize > _INDEX_LIMIT:
        _fail(f"{what} shape {shape}: more elements than NumPy can index (a zero among them "
              f"does not make the others fit); {_HOSTILE}")


def _make_tensor(array, requires_grad, cls='Tensor'):
    if type(requires_grad) is not bool:
        _fail(f"has a tensor whose requires_grad is {_show(requires_grad)}, not True or False; "
              f"{_HOSTILE}")
    if requires_grad and array.dtype.kind not in 'fc':
        _fail(f"has a tensor of {array.dtype} that requires grad (only floating point tensors "
              f"can); {_HOSTILE}")
    kind = tt._TENSOR_CLASSES.get(cls, Tensor)  # a Parameter without nn.py: a tensor that requires grad
    return tt._rebuild_tensor(kind, array, requires_grad)


def _array_from(raw, dtype, shape, fortran, made):
    """An array of `shape` from exactly the bytes `raw` (copied: the result owns its memory)."""
    shape = _count(shape, 'shape')
    _indexable(shape, dtype.itemsize, 'has an array of')
    need = math.prod(shape) * dtype.itemsize
    if len(raw) != need:
        _fail(f"has an array of shape {shape} and {dtype} ({need:,} bytes) over {len(raw):,} "
              f"bytes; {_HOSTILE}")
    made[0] += need
    if made[0] > made[1]:
        _fail(f"makes arrays of {made[0]:,} bytes from a pickle of {made[1]:,}; {_HOSTILE}")
    return _owned(np.frombuffer(raw, dtype).reshape(shape, order='F' if fortran else 'C'))


def _owned(a):
    """A copy in native byte order, C order, that owns its memory; a bool is 0 or 1 (a
    byte of the file that is neither would read as True here and as itself elsewhere)."""
    if a.dtype == np.bool_:
        return np.array(a.view(np.uint8) != 0, order='C')
    return np.array(a, dtype=a.dtype.newbyteorder('='), order='C')


def _old_dtype(code, state):
    """np.dtype(code, False, True) and the BUILD state NumPy's pickle gives it."""
    if not (type(state) is tuple and len(state) == 8 and state[0] == 3
            and state[2:] == (None, None, None, -1, -1, 0) and state[1] in ('<', '>', '|')):
        _fail(f"holds a NumPy dtype state {_show(state)} that is not a plain number's; {_HOSTILE}")
    dtype = np.dtype(_CODES[code][0])
    if (state[1] == '|') != (dtype.itemsize == 1):
        _fail(f"holds a NumPy dtype {code} with byte order {state[1]!r}; {_HOSTILE}")
    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big']) else dtype.newbyteorder(state[1])


class _Grammar:
    """One pass over a pickle: each opcode below pushes, pops or builds a value of the
    checkpoint grammar; any other opcode, or a construction used against its form, is
    refused. `files` is the PyTorch archive's storages (None: a plain pickle); `size` the
    file's bytes on disk, which set the budget of work (_PER_BYTE)."""

    def __init__(self, data, files=None, size=None):
        self.data, self.at, self.files = data, 0, files
        self.stack, self.marks, self.memo = [], [], {}
        self.size = len(data) if size is None else size
        self.spent, self.budget = 0, _PER_BYTE * min(self.size, _MAX_PICKLE) + _FLOOR
        self.made = [0, len(data) + 1024]  # bytes of arrays made / the most the pickle allows
        self.objects = {}  # id -> an object of a listed class this pickle made (BUILD sets it)

    def spend(self, units):
        self.spent += units
        if self.spent > self.budget:
            _fail(f"makes more values than its {self.size:,} bytes can describe (more than "
                  f"{self.budget:,} units of work: each opcode, value and memo entry counts, each "
                  f"tensor or array {_OBJECT}); {_HOSTILE}")

    def take(self, n):
        if n > len(self.data) - self.at:
            _fail(f"is truncated: its pickle ends inside an opcode (at byte {self.at:,}); save "
                  "or download it again")
        self.at += n
        return self.data[self.at - n:self.at]

    def number(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def push(self, v):
        self.spend(4)
        self.stack.append(v)

    def pop(self):
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):  # nothing above the MARK
            _fail(f"pops an empty stack (opcode at byte {self.at - 1:,}); {_HOSTILE}")
        return self.stack.pop()

    def unbox(self, v):
        """v with a built box replaced by its value (an unbuilt one is refused)."""
        if type(v) is _Box:
            if v.value is None:
                _fail(f"uses a NumPy {v.kind} before its BUILD; {_HOSTILE}")
            return v.value
        if type(v) is _Args:
            _fail(f"puts a construction's arguments inside another's; {_HOSTILE}")
        return v

    def value(self, v):
        """v as a value of the grammar (constructions and storages are not values)."""
        v = self.unbox(v)
        if type(v) in (_Make, _Storage):
            _fail(f"uses {getattr(v, 'kind', 'a storage')} as a value; {_HOSTILE}")
        return v

    def args(self):
        """The arguments of REDUCE, NEWOBJ or BINPERSID: a tuple."""
        v = self.pop()
        return tuple(v) if type(v) is _Args else self.value(v)

    def make_tuple(self, items):
        """A tuple; one that holds a construction or a storage can only be arguments."""
        items = tuple(self.unbox(v) for v in items)
        return _Args(items) if any(type(v) in (_Make, _Storage) for v in items) else items

    def since_mark(self, as_values=True):
        if not self.marks:
            _fail(f"closes a MARK it never opened (at byte {self.at - 1:,}); {_HOSTILE}")
        start = self.marks.pop()
        items = [self.value(v) if as_values else v for v in self.stack[start:]]
        del self.stack[start:]
        self.spend(4 * len(items))
        return items

    def text(self, n):
        try:
            return bytes(self.take(n)).decode('utf-8', 'surrogatepass')
        except UnicodeDecodeError:
            _fail(f"has a string that is not UTF-8 (at byte {self.at:,}); {_HOSTILE}")

    def put(self, i):
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            _fail(f"memoizes an empty stack; {_HOSTILE}")
        if i not in self.memo:
            self.spend(32)
        self.memo[i] = self.stack[-1]

    def get(self, i):
        if i not in self.memo:
            _fail(f"refers to memo entry {i}, which it never stored; {_HOSTILE}")
        self.push(self.memo[i])

    def fill(self, d, pairs):
        if type(d) not in (dict, _OrderedDict):
            _fail(f"sets items of a {type(d).__name__}, not a dict; {_HOSTILE}")
        for k, v in pairs:
            if _key(k) in d:
                _fail(f"has the key {_show(k)} twice in one dict; {_HOSTILE}")
            d[k] = v

    def run(self):
        ops = self.OPS
        if self.take(1) != b'\x80' or self.take(1)[0] > 5:
            _fail("is not a pickle of protocol 2 to 5 (PROTO is not its first opcode): it is not a "
                  "checkpoint save() wrote, or it is damaged; save or download it again")
        while True:
            op = self.take(1)
            self.spend(4)
            name = ops.get(op)
            if name is None:
                _fail(f"has the pickle opcode {bytes(op)!r} at byte {self.at - 1:,}, which no "
                      f"checkpoint needs; {_HOSTILE}")
            if name == 'stop':
                if len(self.stack) != 1 or self.marks:
                    _fail(f"stops with {len(self.stack)} values on its stack; {_HOSTILE}")
                result = self.value(self.stack[0])
                _check_depth(result, 4 * min(self.size, _MAX_PICKLE) + (1 << 16), self.objects)
                if self.at != len(self.data):
                    _fail(f"has {len(self.data) - self.at:,} bytes after its pickle's end; {_HOSTILE}")
                return result
            getattr(self, name)()

    OPS = {b'.': 'stop', b'\x95': 'frame', b'N': 'none', b'\x88': 'true', b'\x89': 'false',
           b'J': 'binint', b'K': 'binint1', b'M': 'binint2', b'\x8a': 'long1', b'\x8b': 'long4',
           b'G': 'binfloat', b'X': 'binunicode', b'\x8c': 'short_binunicode',
           b'\x8d': 'binunicode8', b'C': 'short_binbytes', b'B': 'binbytes',
           b'\x8e': 'binbytes8', b'\x96': 'binbytes8', b')': 'empty_tuple', b'(': 'mark',
           b't': 'tuple', b'\x85': 'tuple1', b'\x86': 'tuple2', b'\x87': 'tuple3',
           b']': 'empty_list', b'a': 'append', b'e': 'appends', b'l': 'list',
           b'}': 'empty_dict', b's': 'setitem', b'u': 'setitems', b'd': 'dict',
           b'q': 'binput', b'r': 'long_binput', b'\x94': 'memoize', b'h': 'binget',
           b'j': 'long_binget', b'c': 'global_', b'\x93': 'stack_global', b'R': 'reduce',
           b'\x81': 'newobj', b'b': 'build', b'Q': 'binpersid'}

    def frame(self):
        if self.number('<Q') > len(self.data) - self.at:
            _fail("has a frame longer than the rest of the file: it is truncated; save or "
                  "download it again")

    def none(self):
        self.push(None)

    def true(self):
        self.push(True)

    def false(self):
        self.push(False)

    def binint(self):
        self.push(self.number('<i'))

    def binint1(self):
        self.push(self.take(1)[0])

    def binint2(self):
        self.push(self.number('<H'))

    def long1(self):
        self.push(int.from_bytes(self.take(self.take(1)[0]), 'little', signed=True))

    def long4(self):
        n = self.number('<i')
        if not 0 <= n <= 64:
            _fail(f"has an integer of {n:,} bytes; {_HOSTILE}")
        self.push(int.from_bytes(self.take(n), 'little', signed=True))

    def binfloat(self):
        self.push(self.number('>d'))

    def binunicode(self):
        self.push(self.text(self.number('<I')))

    def short_binunicode(self):
        self.push(self.text(self.take(1)[0]))

    def binunicode8(self):
        self.push(self.text(self.number('<Q')))

    def short_binbytes(self):
        self.push(bytes(self.take(self.take(1)[0])))

    def binbytes(self):
        self.push(bytes(self.take(self.number('<I'))))

    def binbytes8(self):
        self.push(bytes(self.take(self.number('<Q'))))

    def empty_tuple(self):
        self.push(())

    def mark(self):
        self.marks.append(len(self.stack))

    def tuple(self):
        self.push(self.make_tuple(self.since_mark(as_values=False)))

    def tuple1(self):
        self.push(self.make_tuple([self.pop()]))

    def tuple2(self):
        b, a = self.pop(), self.pop()
        self.push(self.make_tuple([a, b]))

    def tuple3(self):
        c, b, a = self.pop(), self.pop(), self.pop()
        self.push(self.make_tuple([a, b, c]))

    def empty_list(self):
        self.push([])

    def list(self):
        self.push(self.since_mark())

    def append(self):
        v = self.value(self.pop())
        self.extend([v])

    def appends(self):
        self.extend(self.since_mark())

    def extend(self, items):
        target = self.value(self.pop())
        if type(target) is not list:
            _fail(f"appends to a {type(target).__name__}, not a list; {_HOSTILE}")
        target.extend(items)
        self.stack.append(target)

    def empty_dict(self):
        self.push({})

    def dict(self):
        items = self.since_mark()
        if len(items) % 2:
            _fail(f"builds a dict from an odd number of items; {_HOSTILE}")
        d = {}
        self.fill(d, zip(items[::2], items[1::2]))
        self.push(d)

    def setitem(self):
        v, k = self.value(self.pop()), self.value(self.pop())
        d = self.value(self.pop())
        self.fill(d, [(k, v)])
        self.stack.append(d)

    def setitems(self):
        items = self.since_mark()
        if len(items) % 2:
            _fail(f"sets a dict's items from an odd number of values; {_HOSTILE}")
        d = self.value(self.pop())
        self.fill(d, zip(items[::2], items[1::2]))
        self.stack.append(d)

    def binput(self):
        self.put(self.take(1)[0])

    def long_binput(self):
        self.put(self.number('<I'))

    def memoize(self):
        self.put(len(self.memo))

    def binget(self):
        self.get(self.take(1)[0])

    def long_binget(self):
        self.get(self.number('<I'))

    def global_(self):
        module, name = self.line(), self.line()
        self.push_global(module, name)

    def line(self):
        end = self.data.find(b'\n', self.at, self.at + 256)
        if end < 0:
            _fail(f"has a GLOBAL without its line end (at byte {self.at:,}); {_HOSTILE}")
        return self.text(end - self.at + 1)[:-1]

    def stack_global(self):
        name, module = self.value(self.pop()), self.value(self.pop())
        if type(module) is not str or type(name) is not str:
            _fail(f"names a global by something other than two strings; {_HOSTILE}")
        self.push_global(module, name)

    def push_global(self, module, name):
        make = _MAKERS.get((module, name))
        if make is None:
            listed = _listed(module, name)
            if listed is None:
                _fail(f"holds a pickled {module:.100}.{name:.100} (a whole model saved with "
                      f"save(model), or other code), and weights_only=True loads only tensors, "
                      f"numbers, strings, containers and the classes you list: if you trust "
                      f"{name:.100}, list it with torch.serialization.add_safe_globals([{name:.100}]) "
                      f"or load inside torch.serialization.safe_globals([{name:.100}]); if you "
                      f"trust the file, pass weights_only=False")
            make = _Make('listed', listed)
        self.push(make)

    def binpersid(self):
        self.spend(_OBJECT)
        pid = self.args()
        if self.files is None:
            _fail(f"refers to data outside its pickle (a persistent id), which only a PyTorch zip "
                  f"file does; {_HOSTILE}")
        self.push(self.files.storage(pid))

    def reduce(self):
        self.spend(_OBJECT)
        args, make = self.args(), self.pop()
        if type(make) is not _Make or type(args) is not tuple:
            _fail(f"calls something that is not one of a checkpoint's constructions; {_HOSTILE}")
        kind, n = make.kind, len(args)
        if kind == 'OrderedDict' and n == 0:
            return self.push(_OrderedDict())
        if kind == 'tensor' and n in (6, 7) and self.files is not None:
            return self.push(self.files.tensor(*args))
        if kind == 'parameter' and n == 3 and isinstance(args[0], Tensor):
            _no_hooks(args[2])
            return self.push(_make_tensor(args[0].array, args[1], 'Parameter'))
        if kind == 'Size' and n == 1:
            return self.push(Size(_count(args[0], 'size')))
        if kind == 'device' and n in (1, 2):
            return self.push(_device(*args))
        if kind == 'latin1' and args[1:] == ('latin1',) and type(args[0]) is str:
            if max(map(ord, args[0]), default=0) > 255:
                _fail(f"has latin-1 bytes that are not latin-1; {_HOSTILE}")
            return self.push(args[0].encode('latin1'))
        if kind == 'old tensor' and n == 3 and type(args[0]) is _Make and args[0].kind == 'class' \
                and type(args[1]) is np.ndarray:
            return self.push(_make_tensor(args[1], args[2], args[0].arg))
        if kind == 'array' and n == 3 and type(args[0]) is _Make and args[0].kind == 'ndarray' \
                and args[1] == (0,) and args[2] == b'b':
            return self.push(_Box('array', None))
        if kind == 'dtype' and n == 3 and type(args[0]) is str and args[0] in _CODES \
                and args[1:] == (False, True):
            return self.push(_Box('dtype', args[0]))
        if kind == 'scalar' and n == 2 and isinstance(args[0], np.dtype) and type(args[1]) is bytes:
            return self.push(_array_from(args[1], args[0], (), False, self.made)[()])
        if kind == 'listed':  # a class or function the user listed: called, as PyTorch does
            return self.push(self.made_object(make.arg(*args)))
        _fail(f"calls {kind} with arguments {_show(args)}, a form no save writes; {_HOSTILE}")

    def newobj(self):
        self.spend(_OBJECT)
        args, make = self.args(), self.pop()
        if type(make) is _Make and make.kind == 'listed' and type(args) is tuple and \
                isinstance(make.arg, type) and not issubclass(make.arg, Tensor):
            return self.push(self.made_object(make.arg.__new__(make.arg, *args)))  # PyTorch's rule
        if type(make) is _Make and type(args) is tuple:
            if make.kind == 'Size' and len(args) == 1:
                return self.push(Size(_count(args[0], 'size')))
            if make.kind == 'device' and args == ():
                return self.push(_Box('device', None))
        what = make.arg if type(make) is _Make and make.kind == 'class' else 'an object'
        _fail(f"makes {what} without its fields (NEWOBJ), which no save writes; {_HOSTILE}")

    def made_object(self, obj):
        if type(obj) not in (tuple, list, dict, _OrderedDict, str, bytes, int, float, bool) \
                and obj is not None and not isinstance(obj, Tensor):
            self.objects[id(obj)] = obj  # a listed class's object: BUILD may set its state
        return obj

    def build(self):
        self.spend(_OBJECT)
        state, obj = self.value(self.pop()), self.pop()
        if id(obj) in self.objects:  # PyTorch's rule: __setstate__, else the instance dict
            setstate = getattr(obj, '__setstate__', None)
            if setstate is not None and getattr(type(obj), '__setstate__', None) is not \
                    getattr(object, '__setstate__', None):
                setstate(state)
            elif type(state) is dict and all(type(k) is str for k in state) and \
                    hasattr(obj, '__dict__'):
                obj.__dict__.update(state)
            else:
                _fail(f"sets the fields of a {type(obj).__name__:.100} from {_show(state)}, which "
                      f"is not its instance dict; {_HOSTILE}")
            return self.stack.append(obj)
        if type(obj) is _Box and obj.value is None:
            if obj.kind == 'dtype':
                obj.value = _old_dtype(obj.arg, state)
            elif obj.kind == 'array' and type(state) is tuple and len(state) == 5 \
                    and state[0] == 1 and isinstance(state[2], np.dtype) \
                    and type(state[3]) is bool and type(state[4]) is bytes:
                obj.value = _array_from(state[4], state[2], state[1], state[3], self.made)
            elif obj.kind == 'device' and type(state) is dict and set(state) == {'type', 'index'}:
                obj.value = _device(state['type'], state['index'])
            else:
                _fail(f"builds a NumPy {obj.kind} from {_show(state)}, a state NumPy never writes; "
                      f"{_HOSTILE}")
            return self.stack.append(obj)
        if type(obj) is _OrderedDict and type(state) is dict and list(state) == ['_metadata'] \
                and type(state['_metadata']) in (dict, _OrderedDict) and not vars(obj):
            obj._metadata = state['_metadata']  # the attribute PyTorch's state_dicts carry
            return self.stack.append(obj)
        what = 'a tensor' if isinstance(obj, Tensor) else 'a storage' if type(obj) is _Storage \
            else f'a NumPy {obj.kind} a second time' if type(obj) is _Box \
            else f'a {getattr(obj, "kind", type(obj).__name__)}'
        _fail(f"sets the fields of {what} (BUILD), which no save writes; {_HOSTILE}")


# ---------------------------------------------------------------------------
# safe globals: the classes and functions a user lists for weights_only loading (PyTorch's
# torch.serialization.add_safe_globals / safe_globals / get_safe_globals / clear_safe_globals)
# ---------------------------------------------------------------------------
_SAFE_GLOBALS = []


def add_safe_globals(safe_globals):
    """List classes or functions (or (object, 'module.name') pairs) that load() with
    weights_only=True may build: a class by __new__ then its __setstate__ or instance
    dict, a function called, always with values of the grammar."""
    _SAFE_GLOBALS.extend(safe_globals)


def get_safe_globals():
    return list(_SAFE_GLOBALS)


def clear_safe_globals():
    _SAFE_GLOBALS.clear()


class safe_globals:
    """with safe_globals([MyModel, nn.Linear]): the classes listed only inside the block."""

    def __init__(self, safe_globals):
        self.listed, self.before = list(safe_globals), None

    def __enter__(self):
        self.before = list(_SAFE_GLOBALS)
        _SAFE_GLOBALS.extend(self.listed)

    def __exit__(self, *exc):
        _SAFE_GLOBALS[:] = self.before


def _listed(module, name):
    """The listed object a GLOBAL module.name names, or None."""
    for entry in _SAFE_GLOBALS:
        obj, full = entry if type(entry) is tuple else \
            (entry, f"{getattr(entry, '__module__', '')}.{getattr(entry, '__qualname__', '')}")
        if full == f"{module}.{name}":
            return obj
    return None


def _no_hooks(h):
    if not (type(h) in (dict, _OrderedDict) and not h):
        _fail(f"has a tensor with backward hooks {_show(h)} (a save writes an empty OrderedDict); "
              f"{_HOSTILE}")


def _device(kind, index=None):
    if not (type(kind) is str and re.fullmatch(r'[a-z]{1,16}(:[0-9]{1,4})?', kind)
            and (index is None or (type(index) is int and 0 <= index < 10000))):
        _fail(f"has a device ({_show(kind)}, {_show(index)}) that is not a device type and "
              f"index; {_HOSTILE}")
    return device(kind, index)


def _check_depth(result, limit, objects=()):
    """The loaded value nests at most _MAX_DEPTH containers, holds no cycle, and written out
    with every shared value repeated (as print, save and a walk see it) has at most `limit`
    values (a tensor or array counts its elements, up to 1,024; `limit` is 4 per byte of the
    file, and 64 Ki): each
    container's height and expanded size are found once (an iterative walk, no recursion),
    so a file of values that share values that share values is refused here, before
    anything after the load walks it."""
    height, size, todo = {}, {}, [(result, False)]
    while todo:
        v, children_done = todo.pop()
        if type(v) not in (tuple, list, dict, _OrderedDict) and id(v) not in objects:
            continue
        if children_done:
            inside = list(_inside(v))
            height[id(v)] = h = 1 + max((height.get(id(x), 0) for x in inside), default=0)
            size[id(v)] = n = 1 + len(inside) + sum(size.get(id(x), 0) if id(x) in size else
                                                    _elements(x) for x in inside)
            if h > _MAX_DEPTH:
                _fail(f"nests containers more than {_MAX_DEPTH} deep; {_HOSTILE}")
            if n > limit:
                _fail(f"shares values that expand to more than {limit:,} (containers that hold "
                      f"one container many times, each holding another so); {_HOSTILE}")
        elif id(v) in height:
            if height[id(v)] is None:
                _fail(f"holds a container that contains itself; {_HOSTILE}")
        else:
            height[id(v)] = None  # being walked
            todo.append((v, True))
            todo.extend((x, False) for x in _inside(v))


def _elements(v):
    """A tensor's or array's elements, up to the 1,024 a walk reads of each time it meets
    it (print shows at most 1,000; save writes a shared one once): a model that reuses one
    layer twelve times holds each of its tensors twelve times, and loads."""
    n = v.array.size if isinstance(v, Tensor) else v.size if isinstance(v, np.ndarray) else 0
    return min(n, 1024)


def _inside(v):
    if type(v) not in (tuple, list, dict, _OrderedDict):  # a listed class's object
        return list(getattr(v, '__dict__', {}).values())
    if type(v) in (dict, _OrderedDict):
        return [*v.values(), *vars(v).values()] if type(v) is _OrderedDict else v.values()
    return v


def _show(v):
    """A value of the file in a message: short, whatever its size or depth."""
    r = reprlib.Repr()
    r.maxtuple = r.maxlist = 10
    return r.repr(v)


_ZIP_RECORDS = (b'PK\x01\x02', b'PK\x03\x04', b'PK\x05\x06', b'PK\x06\x06', b'PK\x06\x07',
                b'PK\x07\x08')  # a directory entry, local header, end records, descriptor


def _find_all(raw, sig):
    at = raw.find(sig)
    while at >= 0:
        yield at
        at = raw.find(sig, at + 1)


class _Member:
    def __init__(self, name, method, crc, packed, size, header):
        self.name, self.method, self.crc, self.packed, self.size = name, method, crc, packed, size
        self.header, self.start, self.end = header, None, None  # start, end: of its bytes


class _Zip:
    """A zip archive read strictly: the end record where the file ends, a central
    directory that lists each member once, each member's local header agreeing with it
    (name, method, sizes, CRC), members that neither overlap nor reach past the
    directory, stored or deflated only. read() inflates to exactly the declared size and
    checks the CRC. Every fault is one _BadFile line."""

    def __init__(self, f):
        self.f = f
        self.size = f.seek(0, 2)
        tail = self.at(max(0, self.size - 22 - 65535), min(self.size, 22 + 65535))
        ends = [at for at in _find_all(tail, b'PK\x05\x06') if at + 22 <= len(tail) and  # each record
                at + 22 + struct.unpack('<H', tail[at + 20:at + 22])[0] == len(tail)]  # whose comment
        if not ends:                                                                  # ends the file
            _fail("is a zip archive without its end record: it is truncated; save or download it "
                  "again")
        end = ends[-1]
        if len(ends) > 1 or any(sig in tail[end + 22:] for sig in _ZIP_RECORDS):
            _fail(f"has a zip comment that holds zip records (a second archive: Python's zipfile, "
                  f"NumPy and PyTorch could read other members than these); {_HOSTILE}")
        end_at = self.size - len(tail) + end
        disk, cd_disk, here, count, cd_size, cd_at = struct.unpack('<HHHHII', tail[end + 4:end + 20])
        if end_at >= 20 and self.at(end_at - 20, 4) == b'PK\x06\x07':  # zip64 (PyTorch's writer
            wide = self.zip64(end_at)                                  # always adds it)
            for short, full in zip((disk, cd_disk, here, count, cd_size, cd_at), wide[1:]):
                if short not in (full, 0xFFFF, 0xFFFFFFFF):
                    _fail(f"has a zip end record and a zip64 end record that disagree; {_HOSTILE}")
            end_at, disk, cd_disk, here, count, cd_size, cd_at = wide
        elif 0xFFFF in (count, here) or 0xFFFFFFFF in (cd_size, cd_at):
            _fail(f"is a zip archive whose end record needs a zip64 record it lacks; {_HOSTILE}")
        if disk or cd_disk or here != count:
            _fail(f"is a zip archive split over disks; {_HOSTILE}")
        if cd_at + cd_size != end_at:
            _fail(f"has a zip directory of {cd_size:,} bytes at {cd_at:,} that does not end where "
                  f"its end record starts ({end_at:,}); {_HOSTILE}")
        self.members, self.cd_at = {}, cd_at
        directory, at, inflated = self.at(cd_at, cd_size), 0, 0
        for _ in range(count):
            m, at = self.entry(directory, at)
            if m.name in self.members:
                _fail(f"has two members named {m.name}; {_HOSTILE}")
            self.members[m.name] = m
            if m.method == 8:
                inflated += m.size
                if m.size > _INFLATION * m.packed + (1 << 16) or inflated > _MAX_INFLATED:
                    _fail(f"has a member {m.name} that inflates {m.packed:,} bytes to {m.size:,} "
                          f"(more than {_INFLATION} times, or past {_MAX_INFLATED >> 30} GiB in "
                          f"all); {_HOSTILE}")
        if at != cd_size:
            _fail(f"has a zip directory of {cd_size:,} bytes holding {at:,} bytes of entries; "
                  f"{_HOSTILE}")
        last, last_name = 0, None
        for m in sorted(self.members.values(), key=lambda m: m.header):
            self.local(m)
            if m.header < last:
                _fail(f"has members {last_name} and {m.name} that overlap; {_HOSTILE}")
            last, last_name = m.end, m.name
        if last > cd_at:
            _fail(f"has a member {last_name} that runs into the zip directory; {_HOSTILE}")

    def at(self, offset, n):
        if offset < 0 or n < 0 or offset + n > self.size:
            _fail(f"points at bytes {offset:,}..{offset + n:,} of a file of {self.size:,}: it is "
                  "truncated or damaged; save or download it again")
        self.f.seek(offset)
        raw = self.f.read(n)
        if len(raw) != n:
            _fail("could not be read whole (it changed while being read?); read it again")
        return raw

    def zip64(self, end_at):
        locator = self.at(end_at - 20, 20)
        disk, rec_at, disks = struct.unpack('<IQI', locator[4:])
        rec = self.at(rec_at, 56)
        if rec[:4] != b'PK\x06\x06' or disk or disks != 1 or rec_at + 56 != end_at - 20:
            _fail(f"has a zip64 end record that is not where its locator says; {_HOSTILE}")
        return (rec_at,) + struct.unpack('<IIQQQQ', rec[16:56])

    def entry(self, d, at):
        if d[at:at + 4] != b'PK\x01\x02' or at + 46 > len(d):
            _fail(f"has a zip directory entry that is not one (at byte {self.cd_at + at:,}); "
                  f"{_HOSTILE}")
        (flags, method, _, _, crc, packed, size, n_name, n_extra, n_comment, disk, _, _,
         header) = struct.unpack('<HHHHIIIHHHHHII', d[at + 8:at + 46])
        name = self.name(d[at + 46:at + 46 + n_name], flags)
        extra = d[at + 46 + n_name:at + 46 + n_name + n_extra]
        if at + 46 + n_name + n_extra + n_comment > len(d):
            _fail(f"has a zip directory entry {name} longer than the directory; {_HOSTILE}")
        size, packed, header = self.wide(extra, name, size, packed, header)
        if flags & 1 or method not in (0, 8) or disk:
            _fail(f"has a member {name} that is encrypted, on another disk or compressed by a "
                  f"method other than deflate (method {method}); {_HOSTILE}")
        if method == 0 and packed != size:
            _fail(f"has a member {name} stored as {packed:,} bytes but declared as {size:,}; "
                  f"{_HOSTILE}")
        return _Member(name, method, crc, packed, size, header), at + 46 + n_name + n_extra + n_comment

    @staticmethod
    def name(raw, flags):
        try:
            return raw.decode('utf-8' if flags & 0x800 else 'cp437')
        except UnicodeDecodeError:
            _fail(f"has a member name that is not UTF-8; {_HOSTILE}")

    @staticmethod
    def wide(extra, name, size, packed, header):
        """The zip64 extra field: the 64-bit values of the fields that read 0xFFFFFFFF."""
        at = 0
        while at + 4 <= len(extra):
            kind, n = struct.unpack('<HH', extra[at:at + 4])
            if at + 4 + n > len(extra):
                break
            if kind == 1:
                values, k = extra[at + 4:at + 4 + n], 0
                out = []
                for v in (size, packed, header):
                    if v == 0xFFFFFFFF:
                        if k + 8 > n:
                            _fail(f"has a member {name} whose zip64 field is too short; {_HOSTILE}")
                        v = struct.unpack('<Q', values[k:k + 8])[0]
                        k += 8
                    out.append(v)
                return tuple(out)
            at += 4 + n
        if at != len(extra):
            _fail(f"has a member {name} with a malformed extra field; {_HOSTILE}")
        return size, packed, header

    def local(self, m):
        """Cross-check the member's local header with its directory entry; find its bytes."""
        head = self.at(m.header, 30)
        flags, method, _, _, crc, packed, size, n_name, n_extra = struct.unpack('<HHHHIIIHH',
                                                                                 head[6:30])
        name = self.name(self.at(m.header + 30, n_name), flags) if head[:4] == b'PK\x03\x04' \
            else None
        if name != m.name or method != m.method or flags & 1:
            _fail(f"has a member {m.name} whose local header disagrees with the zip directory "
                  f"(name {name!r}, method {method}); {_HOSTILE}")
        m.start = m.header + 30 + n_name + n_extra
        m.end = m.start + m.packed
        if flags & 8:  # sizes in a descriptor after the data (PyTorch's writer does so)
            if (crc, packed, size) not in ((0, 0, 0), (m.crc, m.packed, m.size)):
                _fail(f"has a member {m.name} whose local header declares sizes that its "
                      f"descriptor does not; {_HOSTILE}")
            sig = 4 if self.size - m.end >= 4 and self.at(m.end, 4) == b'PK\x07\x08' else 0
            for fmt in ('<III', '<IQQ'):
                n = struct.calcsize(fmt)
                if m.end + sig + n <= self.size and \
                        struct.unpack(fmt, self.at(m.end + sig, n)) == (m.crc, m.packed, m.size):
                    m.end += sig + n
                    break
            else:
                _fail(f"has a member {m.name} whose data descriptor disagrees with the zip "
                      f"directory; {_HOSTILE}")
        else:
            size, packed, _ = self.wide(self.at(m.header + 30 + n_name, n_extra), m.name, size,
                                        packed, 0)
            if (crc, packed, size) != (m.crc, m.packed, m.size):
                _fail(f"has a member {m.name} whose local header declares {size:,} bytes ({packed:,} "
                      f"stored) and its directory {m.size:,} ({m.packed:,}); {_HOSTILE}")

    def head(self, m, n):
        """The first n bytes of a stored member: a header to check before reading it whole."""
        if m.method != 0 or n > m.size:
            _fail(f"has a member {m.name} that is compressed or shorter than its header ({n} "
                  f"bytes); {_HOSTILE}")
        return self.at(m.start, n)

    def read(self, m, into=None):
        """The member's bytes (into a writable buffer of exactly m.size bytes if given),
        inflated to at most its declared size, checked against its CRC."""
        out = memoryview(bytearray(m.size) if into is None else into).cast('B')
        self.f.seek(m.start)
        got, crc, left, pending = 0, 0, m.packed, b''
        inflate = zlib.decompressobj(-15) if m.method == 8 else None
        while left or pending:
            if inflate is None:  # stored: straight into the buffer
                n = self.f.readinto(out[got:got + min(left, 1 << 24)])
                if not n:
                    break
                crc = zlib.crc32(out[got:got + n], crc)
                got, left = got + n, left - n
                continue
            if not pending:
                pending = self.f.read(min(left, 1 << 22))
                if not pending:
                    break
                left -= len(pending)
            try:
                chunk = inflate.decompress(pending, m.size - got + 1)  # one byte past: detected
            except zlib.error as e:
                _fail(f"has a member {m.name} whose deflated bytes are damaged ({e}); {_HOSTILE}")
            pending = inflate.unconsumed_tail
            if got + len(chunk) > m.size:
                _fail(f"has a member {m.name} that inflates past its declared {m.size:,} bytes; "
                      f"{_HOSTILE}")
            out[got:got + len(chunk)] = chunk
            crc, got = zlib.crc32(chunk, crc), got + len(chunk)
            if inflate.eof:
                break
        if got != m.size or left or pending or (inflate is not None and (not inflate.eof
                                                                     or inflate.unused_data)):
            _fail(f"has a member {m.name} whose {m.packed:,} bytes do not hold the {m.size:,} "
                  f"declared: it is truncated or damaged; save or download it again")
        if crc != m.crc:
            _fail(f"has a member {m.name} whose bytes do not match their CRC: it is damaged; save "
                  "or download it again")
        return out.obj


class _TorchFiles:
    """The storages of a PyTorch archive, each read once when data.pkl first refers to it
    (so tensors that share one come back as views of one array, as in PyTorch)."""

    def __init__(self, archive, folder):
        self.archive, self.folder, self.storages = archive, folder, {}
        order = archive.members.get(folder + 'byteorder')
        self.order = '<'
        if order is not None:
            text = bytes(archive.read(order)) if order.size <= 16 else b''
            if text not in (b'little', b'big'):
                _fail(f"has a byteorder record {_show(text)} (PyTorch writes little or big); "
                      f"{_HOSTILE}")
            self.order = '<' if text == b'little' else '>'

    def storage(self, pid):
        """BINPERSID ('storage', torch.<Type>Storage, key, location, numel)."""
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == 'storage'):
            _fail(f"refers to its data in a way PyTorch never writes ({_show(pid)}); {_HOSTILE}")
        _, kind, key, location, numel = pid
        if not (type(kind) is _Make and kind.kind == 'storage type' and type(key) is str
                and re.fullmatch(r'[A-Za-z0-9_.]{1,64}', key) and type(location) is str
                and type(numel) is int and 0 <= numel < 1 << 62):
            _fail(f"has a storage reference {_show(pid)} that is not (type, key, location, size); "
                  f"{_HOSTILE}")
        dtype, member = kind.arg, f'{self.folder}data/{key}'
        if key in self.storages:
            old = self.storages[key]
            if old.array.dtype != dtype or old.array.size != numel:
                _fail(f"declares its storage {member} twice, with different types or sizes; "
                      f"{_HOSTILE}")
            return old
        m = self.archive.members.get(member)
        if m is None:
            _fail(f"lacks {member}, which its data.pkl refers to: the file is incomplete; save or "
                  "download it again")
        if m.size != numel * dtype.itemsize:
            _fail(f"has a storage {member} of {m.size:,} bytes, declared as {numel:,} elements of "
                  f"{dtype} ({numel * dtype.itemsize:,} bytes); {_HOSTILE}")
        array = np.empty(numel, dtype.newbyteorder(self.order))
        self.archive.read(m, array)
        self.storages[key] = _Storage(_owned(array) if self.order == '>' or dtype == np.bool_
                                      else array, member)
        return self.storages[key]

    def tensor(self, storage, offset, size, stride, requires_grad, hooks, metadata=None):
        """torch._utils._rebuild_tensor_v2: a view of the storage, after checking that every
        element it reaches lies inside it."""
        if type(storage) is not _Storage:
            _fail(f"builds a tensor on something that is not one of its storages; {_HOSTILE}")
        size, stride = _count(size, 'size'), _count(stride, 'stride')
        _indexable(size, storage.array.itemsize if type(storage) is _Storage else 1,
                   'has a tensor of')
        if type(offset) is not int or not 0 <= offset < 1 << 62 or len(size) != len(stride):
            _fail(f"has a tensor of size {size}, stride {stride} at offset {_show(offset)} (each "
                  f"must be counts of 0 or more, one stride per dimension); {_HOSTILE}")
        _no_hooks(hooks)
        if metadata not in (None, {}) and not (type(metadata) is _OrderedDict and not metadata):
            _fail(f"has tensor metadata {_show(metadata)}, which tinytorch cannot keep; {_HOSTILE}")
        n = storage.array.size
        last = offset + sum((k - 1) * s for k, s in zip(size, stride)) \
            if all(size) else offset - 1  # the last element it reaches
        if last >= n or offset > n:
            _fail(f"has a tensor of size {size}, stride {stride} at offset {offset} that reaches "
                  f"element {last:,} of a storage of {n:,}; {_HOSTILE}")
        a = storage.array
        view = np.lib.stride_tricks.as_strided(a[offset:], size, [s * a.itemsize for s in stride])
        return _make_tensor(view, requires_grad)


def _load_archive(f, weights_only):
    archive = _Zip(f)
    pickles = [n for n in archive.members if n.endswith('data.pkl')
               and n.count('/') <= 1 and n.rpartition('/')[2] == 'data.pkl']
    if len(pickles) != 1:
        _fail("is a zip archive but not a PyTorch file (no data.pkl, or more than one; an "
              "nn.save checkpoint? read that with nn.load)")
    m = archive.members[pickles[0]]
    if m.size > _MAX_PICKLE:
        _fail(f"has a member {m.name} of {m.size:,} bytes, more than the {_MAX_PICKLE >> 20} MiB "
              f"a checkpoint's structure takes; {_HOSTILE}")
    files = _TorchFiles(archive, m.name[:-len('data.pkl')])
    data = archive.read(m)
    if weights_only:
        return _Grammar(bytes(data), files, archive.size).run()
    return _TrustedUnpickler(io.BytesIO(data), files).load()


class _TrustedUnpickler(pickle.Unpickler):
    """weights_only=False: full unpickling (the user trusts the file), PyTorch's names
    mapped to tinytorch's constructions, storages read as _TorchFiles reads them."""

    def __init__(self, file, files=None):
        super().__init__(file)
        self.files = files

    def find_class(self, module, name):
        make = _MAKERS.get((module, name))
        if self.files is not None and type(make) is _Make and make.kind == 'tensor':
            return self.files.tensor
        if type(make) is _Make and make.kind == 'parameter':
            return lambda t, requires_grad, hooks: _make_tensor(t.array, requires_grad, 'Parameter')
        if type(make) is _Make and make.kind == 'storage type' or isinstance(make, np.dtype):
            return make
        if module == 'torch' and name in ('Size', 'device'):
            return getattr(tt, name)
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if self.files is None:
            _fail(f"refers to data outside its pickle (a persistent id); {_HOSTILE}")
        return self.files.storage(pid)


# -- writing ----------------------------------------------------------------
def _in_grammar(obj, depth=0, path=None):
    """obj is what data.pkl can hold (else save() pickles it whole): containers of
    numbers, strings, tensors of a storage dtype, Size, device and dtype, no cycle."""
    path = set() if path is None else path
    t = type(obj)
    if obj is None or t in (bool, int, float, str, bytes, Size, device):
        return t is not int or -(1 << 63) <= obj < 1 << 63
    if isinstance(obj, np.dtype):
        return obj in _DTYPE_NAMES_OUT
    if isinstance(obj, Tensor):
        return (t is Tensor or t is tt._TENSOR_CLASSES.get('Parameter')) and \
            obj.array.dtype in _STORAGE_NAMES
    if t not in (tuple, list, dict, _OrderedDict) or depth >= _MAX_DEPTH or id(obj) in path:
        return False
    path.add(id(obj))
    if t in (dict, _OrderedDict):
        try:
            for k in obj:
                _key(k)
        except _BadFile:
            return False
        if t is _OrderedDict and set(vars(obj)) - {'_metadata'}:
            return False
        inside = [*obj.values(), *vars(obj).values()] if t is _OrderedDict else obj.values()
    else:
        inside = obj
    ok = all(_in_grammar(v, depth + 1, path) for v in inside)
    path.discard(id(obj))
    return ok


class _Writer:
    """data.pkl as PyTorch writes it (protocol 2), and the storages beside it: one per
    distinct array (a tensor saved twice, or two tensors over one array, share it)."""

    def __init__(self):
        self.out, self.storages, self.memo = [], {}, {}

    def op(self, *parts):
        self.out.extend(parts)

    def global_(self, module, name):
        self.op(b'c', f'{module}\n{name}\n'.encode())

    def write(self, obj):
        t = type(obj)
        if obj is None:
            self.op(b'N')
        elif t is bool:
            self.op(b'\x88' if obj else b'\x89')
        elif t is int:
            self.op(b'J', struct.pack('<i', obj)) if -(1 << 31) <= obj < 1 << 31 else \
                self.op(b'\x8a\x08', obj.to_bytes(8, 'little', signed=True))
        elif t is float:
            self.op(b'G', struct.pack('>d', obj))
        elif t is str:
            raw = obj.encode('utf-8', 'surrogatepass')
            self.op(b'X', struct.pack('<I', len(raw)), raw)
        elif t is bytes:  # as pickle's protocol 2 writes bytes (PyTorch's reader has no BINBYTES)
            self.global_('_codecs', 'encode')
            self.tuple((obj.decode('latin1'), 'latin1'))
            self.op(b'R')
        elif isinstance(obj, np.dtype):
            self.global_('torch', _DTYPE_NAMES_OUT[obj])
        elif t is Size:
            self.global_('torch', 'Size')
            self.tuple(tuple(obj))
            self.op(b'\x85R')
        elif t is device:
            self.global_('torch', 'device')
            self.tuple((obj.type,) if obj.index is None else (obj.type, obj.index))
            self.op(b'R')
        elif isinstance(obj, Tensor):
            self.tensor(obj)
        elif t is tuple:
            self.tuple(obj)
        elif t is list:
            self.op(b']')
            if obj:
                self.op(b'(')
                for v in obj:
                    self.write(v)
                self.op(b'e')
        else:  # dict or OrderedDict
            if t is _OrderedDict:
                self.global_('collections', 'OrderedDict')
                self.op(b')R')
            else:
                self.op(b'}')
            if obj:
                self.op(b'(')
                for k, v in obj.items():
                    self.write(k)
                    self.write(v)
                self.op(b'u')
            if t is _OrderedDict and '_metadata' in vars(obj):
                self.op(b'}')
                self.write('_metadata')
                self.write(obj._metadata)
                self.op(b'sb')

    def tuple(self, items):
        self.op(b'(')
        for v in items:
            self.write(v)
        self.op(b't')

    def tensor(self, t):
        if id(t) in self.memo:  # the same tensor twice (a tied weight): one object on load
            self.op(b'j', struct.pack('<I', self.memo[id(t)][0]))
            return
        a = t.array
        key = self.storages.setdefault(id(a), (str(len(self.storages)), a))[0]
        parameter = type(t) is not Tensor
        if parameter:
            self.global_('torch._utils', '_rebuild_parameter')
            self.op(b'(')
        self.global_('torch._utils', '_rebuild_tensor_v2')
        self.op(b'((')
        self.write('storage')
        self.global_('torch', _STORAGE_NAMES[a.dtype])
        for v in (key, 'cpu', a.size):
            self.write(v)
        self.op(b'tQ')
        self.write(0)
        self.tuple(a.shape)
        self.tuple(tuple(math.prod(a.shape[i + 1:]) for i in range(a.ndim)))  # C order
        self.write(bool(t.requires_grad) and not parameter)
        self.global_('collections', 'OrderedDict')
        self.op(b')Rt', b'R')
        if parameter:
            self.write(bool(t.requires_grad))
            self.global_('collections', 'OrderedDict')
            self.op(b')Rt', b'R')
        self.memo[id(t)] = (len(self.memo), t)  # t kept alive: its id stays its own
        self.op(b'r', struct.pack('<I', self.memo[id(t)][0]))


class _Named:
    """A name PyTorch's data.pkl holds (torch._utils._rebuild_tensor_v2, torch.FloatStorage)
    that this process need not be able to import: _ObjectPickler writes it as its GLOBAL."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # (pickle writes only what is callable as a REDUCE's function)
        raise TypeError(f"{self.module}.{self.name} is a name written into a file, not called")


class _StorageRef:
    def __init__(self, key, array):
        self.key, self.array = key, array


_REBUILD_TENSOR = _Named('torch._utils', '_rebuild_tensor_v2')
_REBUILD_PARAMETER = _Named('torch._utils', '_rebuild_parameter')
_STORAGE_TYPES = {d: _Named('torch', s) for d, s in _STORAGE_NAMES.items()}
_ORDERED_DICT = _Named('collections', 'OrderedDict')


class _PlainTensor:
    """A Parameter's data as _rebuild_parameter's first argument: a plain tensor."""

    def __init__(self, tensor):
        self.tensor = tensor


class _ObjectPickler(pickle._Pickler):
    """data.pkl for an object outside the grammar (a whole model), as torch.save pickles
    it: pickle's protocol 2 (each object its class's GLOBAL, NEWOBJ, then its state by
    BUILD), every tensor _rebuild_tensor_v2 (or _rebuild_parameter) over a storage that
    is a persistent id (the storages beside data.pkl). Python's own pickler, with
    PyTorch's names written as they are (torch need not be importable here)."""

    def __init__(self, fh, storages):
        super().__init__(fh, protocol=2)
        self.storages = storages  # id(array) -> (key, array), as _Writer's

    def persistent_id(self, obj):
        if type(obj) is _StorageRef:
            a = obj.array
            return ('storage', _STORAGE_TYPES[a.dtype], obj.key, 'cpu', a.size)
        return None

    def reducer_override(self, obj):
        if type(obj) is _PlainTensor or isinstance(obj, Tensor) and \
                type(obj) in (Tensor, tt._TENSOR_CLASSES.get('Parameter')) and \
                obj.array.dtype in _STORAGE_NAMES:
            t = obj.tensor if type(obj) is _PlainTensor else obj
            if type(obj) is not _PlainTensor and type(t) is not Tensor:  # a Parameter
                return _REBUILD_PARAMETER, (_PlainTensor(t), bool(t.requires_grad), _OrderedDict())
            a = t.array
            key = self.storages.setdefault(id(a), (str(len(self.storages)), a))[0]
            stride = tuple(math.prod(a.shape[i + 1:]) for i in range(a.ndim))  # C order
            return _REBUILD_TENSOR, (_StorageRef(key, a), 0, tuple(a.shape), stride,
                                     bool(t.requires_grad) and type(obj) is Tensor, _OrderedDict())
        return NotImplemented

    def save_global(self, obj, name=None):
        if type(obj) is _Named:
            self.write(b'c' + f'{obj.module}\n{obj.name}\n'.encode())
            return self.memoize(obj)
        return super().save_global(obj, name)

    dispatch = {**pickle._Pickler.dispatch, _Named: save_global}


def _write_archive(obj, fh):
    """PyTorch's zip format: archive/data.pkl, archive/byteorder, archive/data/<key> (the
    storages' bytes, little-endian, C order), archive/version. data.pkl is written by
    _Writer for what the grammar holds, by _ObjectPickler for anything else."""
    if _in_grammar(obj):
        w = _Writer()
        w.op(b'\x80\x02')
        w.write(obj)
        w.op(b'.')
        data, storages = b''.join(w.out), w.storages
    else:
        out, storages = io.BytesIO(), {}
        _ObjectPickler(out, storages).dump(obj)
        data = out.getvalue()
    with zipfile.ZipFile(fh, 'w', zipfile.ZIP_STORED) as z:
        z.writestr('archive/data.pkl', data)
        z.writestr('archive/byteorder', b'little')
        for key, a in storages.values():
            raw = np.ascontiguousarray(a, a.dtype.newbyteorder('<'))
            with z.open(f'archive/data/{key}', 'w', force_zip64=raw.nbytes >= 1 << 31) as out:
                out.write(memoryview(raw.reshape(-1)).cast('B'))
        z.writestr('archive/version', b'3\n')


def torch_save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True):
    """torch.save: obj to a path or a binary file, in PyTorch's zip format (torch.load
    reads it). A state_dict, an optimizer's, a dict of tensors, numbers and strings loads
    back with the default weights_only=True; anything else (a whole model: pickled with
    its classes, as PyTorch does) only with those classes listed in safe_globals, or with
    weights_only=False. To a path atomically: a kill or a crash in the middle leaves the
    old file or the new one, never half of one."""
    write = lambda fh: _write_archive(obj, fh)  # noqa: E731
    if isinstance(f, (str, os.PathLike)):
        return atomic_write(f, write)
    write(f)


def atomic_write(path, write):
    """write(file) into a temporary file beside path, flushed to the disk, then renamed over
    path (a rename within one folder is atomic). The temporary's name is short (.<the name's
    first 40 characters>.<its hash><random>.tmp: any name that fits the folder saves), made with
    open()'s mode (the umask applies; nothing process-wide changes). While a save runs it
    holds a lock on its temporary; a save first removes its path's temporaries that no one
    holds (left by a killed save), and only those, so kills leave at most one behind and
    two processes saving one path both finish."""
    folder, base = os.path.split(os.path.abspath(os.fspath(path)))
    start = f'.{base[:40]}.{zlib.crc32(base.encode("utf-8", "surrogateescape")):08x}'
    ours = re.compile(re.escape(start) + r'[0-9a-f]{8}\.tmp')
    for name in os.listdir(folder):
        if ours.fullmatch(name):
            _remove_if_unheld(os.path.join(folder, name))
    tmp = fd = None
    try:
        while fd is None:
            tmp = os.path.join(folder, f'{start}{secrets.token_hex(4)}.tmp')
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_BINARY', 0),
                             0o666)
            except FileExistsError:
                continue
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    ours = os.path.samestat(os.stat(tmp), os.fstat(fd))
                except FileNotFoundError:  # another save removed it before we locked it
                    ours = False
                if not ours:
                    os.close(fd)
                    fd = tmp = None
        with os.fdopen(fd, 'wb') as fh:
            fd = None
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)  # while the lock is held: no other save removes it first
        tmp = None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def _remove_if_unheld(tmp):
    """Remove a temporary no running save holds (its save was killed). One that is not a
    regular file (a FIFO would block the open forever; a link leads outside the folder) is
    refused in one line, never opened."""
    try:
        mode = os.lstat(tmp).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        what = 'a link' if stat.S_ISLNK(mode) else 'a FIFO' if stat.S_ISFIFO(mode) else 'a folder' \
            if stat.S_ISDIR(mode) else 'a device or socket'
        raise FileExistsError(f"save: {tmp} is a leftover temporary that is not a regular file "
                              f"({what}); remove it to save")
    if fcntl is None:
        return
    try:
        fd = os.open(tmp, os.O_RDONLY | _NO_FOLLOW | _NO_BLOCK)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.remove(tmp)
    except OSError:
        pass
    finally:
        os.close(fd)


def torch_load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **kwargs):
    """torch.load: what save() wrote, or a PyTorch file. weights_only=None or True (as
    PyTorch 2.6+) reads the file with the checkpoint grammar above: tensors, numbers,
    strings, containers, Size, device, dtypes; nothing in it runs. weights_only=False
    unpickles anything: only for a file you trust. A file that is not a checkpoint, or is
    damaged or hostile, is refused with one line (pickle.UnpicklingError) naming it."""
    if isinstance(map_location, (str, device)):
        tt._cpu_only(map_location, 'load')
    trusted = weights_only is not None and not weights_only
    if isinstance(f, (str, os.PathLike)):
        try:
            fh = open_regular(f)
        except NotARegularFile as e:
            raise pickle.UnpicklingError(f"load: {e}: it holds no checkpoint") from None
        with fh:
            return torch_load(fh, map_location, weights_only=not trusted)
    name = getattr(f, 'name', None)
    name = name if isinstance(name, str) else 'the file'
    try:
        start = f.read(2)
        f.seek(-len(start), 1)
        if not start:
            _fail("is empty (0 bytes): it holds no checkpoint; save or download it again")
        if start == b'PK':  # a zip archive: PyTorch's format
            return _load_archive(f, not trusted)
        if trusted:
            return _TrustedUnpickler(f).load()
        return _Grammar(f.read()).run()
    except _BadFile as e:
        raise pickle.UnpicklingError(f"load: {name} {e}") from None
    except Exception as e:  # noqa: BLE001 (full unpickling fails many ways; the grammar should not)
        what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if isinstance(e, MemoryError):
            what = "MemoryError: it declares a size larger than the memory"
        if trusted and isinstance(e, (AttributeError, ImportError)):
            raise pickle.UnpicklingError(
                f"load: {name} could not be unpickled ({what:.200}); a whole model needs its class "
                "defined or imported where you load it") from None
        raise pickle.UnpicklingError(
            f"load: {name} is not a checkpoint that save() wrote, or it is truncated or damaged "
            f"({what:.200}); save or download it again".replace('\n', ' ')) from None


class CheckpointError(Exception):
    """What is wrong with a file nn.load or load_safetensors reads: one line naming it."""


_META = '__tinytorch_meta__'


# ---------------------------------------------------------------------------
# nn.save / nn.load: arrays in an .npz (or .safetensors), everything else as JSON
# ---------------------------------------------------------------------------
def _encode(obj, arrays, names, path=''):
    """Turn nested dicts/lists of arrays, tensors, numbers and strings into JSON,
    moving every array into `arrays` (and its dotted path into `names`) and leaving a
    reference in its place."""
    if isinstance(obj, (Tensor, np.ndarray)):
        arrays.append(obj.array if isinstance(obj, Tensor) else obj)
        names.append(path)
        return {'__tensor__' if isinstance(obj, Tensor) else '__array__': len(arrays) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    sub = (path + '.') if path else ''
    if isinstance(obj, dict):
        for k in obj:  # what load reads back (_key), and nothing else
            if not (type(k) in (str, bool) or k is None or (type(k) is int and -_INT_KEY < k < _INT_KEY)):
                raise TypeError(f"save: a dict key {k!r:.40} of type {type(k).__name__} (a "
                                "checkpoint's keys are strings or integers below 2**60)")
        if all(isinstance(k, str) for k in obj):
            return {'__dict__': {k: _encode(v, arrays, names, sub + k) for k, v in obj.items()}}
        return {'__items__': [[_encode(k, arrays, names, sub + 'key'),
                               _encode(v, arrays, names, f'{sub}{k}')] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {'__list__': [_encode(v, arrays, names, f'{sub}{i}') for i, v in enumerate(obj)],
                'tuple': isinstance(obj, tuple)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, 'state_dict'):  # a Module or an optimizer: its numbers are its state_dict
        raise TypeError(f"save: got a {type(obj).__name__}, which holds code as well as numbers; "
                        "save its state_dict(): nn.save(obj.state_dict(), path), and bring it "
                        "back with obj.load_state_dict(nn.load(path))")
    raise TypeError(f"save: cannot store an object of type {type(obj).__name__}")


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if '__tensor__' in obj:
            return tt.tensor(arrays[obj['__tensor__']])
        if '__array__' in obj:
            return arrays[obj['__array__']]
        if '__dict__' in obj:
            return {k: _decode(v, arrays) for k, v in obj['__dict__'].items()}
        if '__items__' in obj:
            out = {}
            for k, v in obj['__items__']:
                k = _key(_decode(k, arrays))  # keys whose hashes cannot be made to collide
                if k in out:
                    raise ValueError(f"the key {k!r:.40} comes twice")
                out[k] = _decode(v, arrays)
            return out
        if '__list__' in obj:
            items = [_decode(v, arrays) for v in obj['__list__']]
            return tuple(items) if obj['tuple'] else items
    return obj


def save(obj, path):
    """Write obj (nested dicts and lists of tensors, arrays, numbers and strings: a
    state_dict, a training checkpoint) to path: a .safetensors file when path ends so,
    else NumPy's .npz. Atomically: a temporary file in the same folder, flushed to disk,
    then renamed over path. A crash mid-save leaves the old file intact."""
    arrays, names = [], []
    meta = json.dumps(_encode(obj, arrays, names))
    if str(path).endswith('.safetensors'):
        tensors = dict(zip(_unique(names), arrays))
        atomic_write(path, lambda f: _write_safetensors(
            f, tensors, {_META: meta, 'names': json.dumps(list(tensors)), 'format': 'pt'}))
        return
    entries = {f'a{i}': a for i, a in enumerate(arrays)}
    entries[_META] = np.frombuffer(meta.encode('utf-8'), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **entries))


def _unique(names):
    """Tensor names for a .safetensors file: the dotted paths, made unique."""
    seen, out = set(), []
    for i, name in enumerate(names):
        name = name or 'tensor'
        if name in seen:
            name = f'{name}#{i}'
        seen.add(name)
        out.append(name)
    return out


def _one_way_out(reader):
    """reader's every failure is one CheckpointError line naming the file (a missing file
    aside: FileNotFoundError, as open's): whatever NumPy or Python raise inside it."""
    def read(path, *args):
        name = getattr(path, 'name', path)  # a path, or a file read_npz is given
        try:
            return reader(path, *args)
        except (CheckpointError, FileNotFoundError):
            raise
        except _BadFile as e:
            raise CheckpointError(f"{name} {e}") from None
        except MemoryError:
            raise CheckpointError(f"{name} declares arrays larger than the memory; {_HOSTILE}") \
                from None
        except Exception as e:  # noqa: BLE001 (the one way out)
            raise CheckpointError(_one_line(f"{name} cannot be read ({type(e).__name__}: "
                                            f"{str(e)[:200]}); {_HOSTILE}")) from None
    read.__name__, read.__doc__, read.__wrapped__ = reader.__name__, reader.__doc__, reader
    return read


@_one_way_out
def load(path):
    """Read what save() wrote. Never unpickles, so an untrusted file cannot run code."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.endswith('.safetensors'):
        tensors, metadata = load_safetensors(path)
        if _META not in metadata or 'names' not in metadata:
            raise CheckpointError(f"{path} is a safetensors file but not a tinytorch checkpoint "
                                  f"(no {_META} entry in its metadata); read its tensors with "
                                  "nn.load_safetensors")
        try:
            names = json.loads(metadata['names'])
            return _decode(json.loads(metadata[_META]), {i: tensors[n] for i, n in enumerate(names)})
        except (KeyError, ValueError, TypeError, IndexError, RecursionError, _BadFile) as e:
            raise _bad_description(path, e) from None
    try:
        f = open_regular(path)
    except NotARegularFile as e:
        raise CheckpointError(f"{e}: it holds no checkpoint") from None
    with f:
        if f.read(4) != b'PK\x03\x04':  # every .npz is a zip archive, which starts so
            raise CheckpointError(f"{path} is not a tinytorch checkpoint (neither a .npz archive "
                                  "nor a .safetensors file)")
        try:
            arrays = read_npz(f)
        except _BadFile as e:
            raise CheckpointError(f"{path} {e}") from None
        except MemoryError:
            raise CheckpointError(f"{path} declares arrays larger than the memory; {_HOSTILE}") \
                from None
    if _META not in arrays:
        raise CheckpointError(f"{path} is not a tinytorch checkpoint (no {_META} entry)")
    meta = arrays.pop(_META)
    numbered = {}
    for k, a in arrays.items():
        if not re.fullmatch(r'a(0|[1-9][0-9]{0,8})', k):  # a1 and a01 would be one array
            raise CheckpointError(_one_line(f"{path} has a member {k}.npy that nn.save never "
                                               f"writes (its arrays are a0, a1, ...); {_HOSTILE}"))
        numbered[int(k[1:])] = a
    try:
        return _decode(json.loads(meta.tobytes().decode('utf-8')), numbered)
    except (KeyError, ValueError, TypeError, IndexError, RecursionError, _BadFile) as e:
        raise _bad_description(path, e) from None


def _bad_description(path, e):
    what = {RecursionError: "it is nested deeper than Python can follow",
            KeyError: f"it refers to array {e}, which the file lacks"}.get(type(e), f"{e}")
    return CheckpointError(_one_line(f"{path}: its tinytorch description does not match its "
                                        f"arrays ({type(e).__name__}: {what}); the file is damaged "
                                        "or was made to attack: do not use it"))


# ---------------------------------------------------------------------------
# .npz: a zip of .npy members, each a header (a Python dict literal) and raw bytes
# ---------------------------------------------------------------------------
_NPY_CODES = {**{code: np.dtype(t) for code, (t, _, _) in _CODES.items()},
              'u2': np.dtype(np.uint16), 'u4': np.dtype(np.uint32), 'u8': np.dtype(np.uint64)}
# The header np.save writes, and nothing else: {'descr': '<f4', 'fortran_order': False,
# 'shape': (2, 3), } padded with spaces to a line end.
_NPY_HEADER = re.compile(r"\{'descr': '([<>|])([a-z][0-9]{1,2})', 'fortran_order': (True|False), "
                         r"'shape': \(((?:[0-9]{1,19}, )*[0-9]{1,19},?)?\), \} *\n")


@_one_way_out
def read_npz(f):
    """name -> array for every member of an .npz (each must be an .npy), read strictly."""
    archive = _Zip(f)
    arrays = {}
    for name, m in archive.members.items():
        if not name.endswith('.npy'):
            _fail(f"has a member {name} that is not an array (.npy); {_HOSTILE}")
        arrays[name[:-4]] = _npy(name, m, archive)
    return arrays


def _npy(name, m, archive):
    """One .npy member: its header parsed by _NPY_HEADER, its size checked before it is read."""
    head = archive.head(m, 12)
    if head[:6] != b'\x93NUMPY' or head[6] not in (1, 2, 3) or head[7] != 0:
        _fail(f"has a member {name} that is not an .npy array (no NUMPY magic); {_HOSTILE}")
    start, size = (10, int.from_bytes(head[8:10], 'little')) if head[6] == 1 else \
        (12, int.from_bytes(head[8:12], 'little'))
    if size > 1 << 16:
        _fail(f"has a member {name} whose array header claims {size:,} bytes; {_HOSTILE}")
    text = archive.head(m, start + size)[start:].decode('latin1')
    if "'descr': '|O'" in text or "'descr': 'O'" in text:
        _fail(f"holds pickled Python objects in {name}, which could run code: it is not a "
                 "tinytorch checkpoint, and tinytorch never loads them")
    found = _NPY_HEADER.fullmatch(text)
    if found is None or found[2] not in _NPY_CODES:
        _fail(f"has a member {name} whose array header {text.strip()[:80]!r} is not one np.save "
                 f"writes for a plain number type; {_HOSTILE}")
    order, code, fortran, dims = found.groups()
    dtype = _NPY_CODES[code]
    if (order == '|') != (dtype.itemsize == 1):
        _fail(f"has a member {name} with the byte order {order!r} for {dtype}; {_HOSTILE}")
    shape = tuple(int(n) for n in dims.split(',') if n.strip()) if dims else ()
    if len(shape) <= 64:
        _indexable(shape, dtype.itemsize, f"has its array {name} of")
    need = math.prod(shape) * dtype.itemsize
    if len(shape) > 64 or start + size + need != m.size:
        _fail(f"has its array {name}, which declares {shape} of {dtype} ({need:,} bytes) in a member of "
                 f"{m.size - start - size:,}; {_HOSTILE}")
    raw = archive.read(m)  # its declared size, now known to be the array's
    a = np.frombuffer(raw, dtype.newbyteorder(order) if order != '|' else dtype, offset=start + size)
    return _owned(a.reshape(shape, order='F' if fortran == 'True' else 'C'))


# ---------------------------------------------------------------------------
# safetensors (Hugging Face's format): an 8-byte little-endian length N, N bytes of JSON
# (for each tensor its dtype, shape and [begin, end) byte offsets in the data that
# follows; "__metadata__": a dict of strings), then the tensors' raw little-endian bytes.
# ---------------------------------------------------------------------------
_ST_DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'I64': np.int64,
              'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U64': np.uint64,
              'U32': np.uint32, 'U16': np.uint16, 'U8': np.uint8, 'BOOL': np.bool_,
              'BF16': np.uint16}  # bfloat16: read as its 16 bits, widened to float32
_ST_CODES = {np.dtype(t): code for code, t in _ST_DTYPES.items() if code != 'BF16'}
_ST_HEADER_LIMIT = 100 << 20  # the reference reader's limit on the JSON header


def save_safetensors(tensors, path, metadata=None):
    """Write name -> array (or tensor) as a .safetensors file, atomically."""
    arrays = {k: (v.array if isinstance(v, Tensor) else np.asarray(v)) for k, v in tensors.items()}
    atomic_write(path, lambda f: _write_safetensors(f, arrays, metadata))


def _write_safetensors(f, tensors, metadata):
    header, offset = {}, 0
    if metadata:
        header['__metadata__'] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        if a.dtype not in _ST_CODES:
            raise TypeError(f"save: safetensors cannot store {name!r} of dtype {a.dtype}")
        header[name] = {'dtype': _ST_CODES[a.dtype], 'shape': list(a.shape),
                        'data_offsets': [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(',', ':')).encode('utf-8')
    text += b' ' * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer does
    f.write(len(text).to_bytes(8, 'little') + text)
    for a in tensors.values():
        f.write(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder('<')).tobytes())


def _json_int(text):
    if len(text) > 20:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _json_float(text):
    raise ValueError(f"a number with a fraction or an exponent ({text[:20]})")


def _json_object(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k[:40]!r} twice")
        out[k] = v
    return out


def _count_list(v):
    """A shape or a pair of offsets: a list of ints 0 <= n < 2**62 (bool is no int here)."""
    return type(v) is list and len(v) <= 64 and all(type(n) is int and 0 <= n < 1 << 62 for n in v)


@_one_way_out
def load_safetensors(path):
    """Read a .safetensors file: (name -> NumPy array, metadata dict). bfloat16 tensors
    come back as float32 (NumPy has no bfloat16). Every field of the header is checked:
    a bad one is one line naming the file and the field."""
    def corrupt(why):  # one line, whatever the file's names hold (_one_line)
        return CheckpointError(_one_line(f"{path} is truncated or corrupt and cannot be "
                                            f"loaded ({why}); {_HOSTILE}"))
    try:
        f = open_regular(path)
    except NotARegularFile as e:
        raise CheckpointError(f"{e}: it holds no checkpoint") from None
    with f:
        raw = f.read()
    if len(raw) < 8:
        raise corrupt(f"{len(raw)} bytes, fewer than the 8 of the header length")
    n = int.from_bytes(raw[:8], 'little')
    if n > len(raw) - 8 or n > _ST_HEADER_LIMIT:
        raise corrupt(f"the header claims {n:,} bytes, the file has {len(raw) - 8:,} after it")
    try:
        header = json.loads(raw[8:8 + n].decode('utf-8'), object_pairs_hook=_json_object,
                            parse_int=_json_int, parse_float=_json_float,
                            parse_constant=_json_float)
    except RecursionError:
        raise corrupt("its header is nested deeper than Python can follow") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise corrupt(f"its header is not JSON that safetensors writes: {str(e)[:120]}") from None
    if type(header) is not dict:
        raise corrupt("its header is not a JSON object")
    data = memoryview(raw)[8 + n:]
    metadata = header.pop('__metadata__', {})
    if type(metadata) is not dict or not all(type(v) is str for v in metadata.values()):
        raise corrupt("its __metadata__ is not a dict of strings")
    spans = []
    for name, info in header.items():
        if type(info) is not dict or set(info) != {'dtype', 'shape', 'data_offsets'}:
            raise corrupt(f"{name[:60]!r} is not {{dtype, shape, data_offsets}}")
        code, shape, offsets = info['dtype'], info['shape'], info['data_offsets']
        if type(code) is not str or code not in _ST_DTYPES:
            raise corrupt(f"{name[:60]!r} has dtype {str(code)[:20]}, which tinytorch cannot read")
        if not _count_list(shape):
            raise corrupt(f"{name[:60]!r} has shape {str(shape)[:40]}: not a list of counts")
        if not (_count_list(offsets) and len(offsets) == 2):
            raise corrupt(f"{name[:60]!r} has data_offsets {str(offsets)[:40]}: not two counts")
        begin, end = offsets
        need = math.prod(shape) * np.dtype(_ST_DTYPES[code]).itemsize
        if math.prod(n for n in shape if n) * np.dtype(_ST_DTYPES[code]).itemsize > _INDEX_LIMIT:
            raise corrupt(f"{name[:60]!r} has shape {shape}: more elements than NumPy can index")
        if not begin <= end <= len(data) or end - begin != need:
            raise corrupt(f"{name[:60]!r}: offsets {begin}..{end} do not hold {tuple(shape)} of "
                          f"{code} within the {len(data):,} bytes of data")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise corrupt(f"{name[:60]!r} starts at byte {begin:,} of the data, where "
                          f"{'the tensors before it end' if at else 'the data starts'} at {at:,} "
                          "(overlapping tensors or a gap)")
        at = end
    if at != len(data):
        raise corrupt(f"its tensors end at byte {at:,} of {len(data):,} bytes of data")
    tensors = {}
    for begin, end, name in spans:
        code, shape = header[name]['dtype'], tuple(header[name]['shape'])
        a = np.frombuffer(data[begin:end], dtype=np.dtype(_ST_DTYPES[code]).newbyteorder('<'))
        a = a.reshape(shape)
        if code == 'BF16':  # bfloat16 is the top half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = _owned(a)
    return tensors, metadata


# ---------------------------------------------------------------------------
# nanoGPT's files (export.py --from-nanogpt): ckpt.pt is a PyTorch file, meta.pkl a plain
# pickle of dicts, numbers and strings; both are read by tt.load's grammar (no PyTorch)
# ---------------------------------------------------------------------------
def read_nanogpt(path, meta_path):
    """(the checkpoint, the vocabulary's dict) of a nanoGPT run; a bad file: one line."""
    out = []
    for p in (path, meta_path):
        try:
            out.append(torch_load(p))
        except pickle.UnpicklingError as e:
            raise CheckpointError(str(e)) from None
    return tuple(out)
