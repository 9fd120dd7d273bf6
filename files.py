"""files.py: the one room for files. nn.save / nn.load (.npz or .safetensors), Hugging
Face's .safetensors, and the reading that export.py does of Hugging Face and nanoGPT files.

One threat model for every file a program reads (and tt.load's, in tinytorch.py's
"Saving and loading" section): a file from someone else is hostile. Reading one never
runs code from it, never reads memory outside it, never allocates more than what its
arrays declare (and those are checked against the bytes that hold them), takes time
linear in its size, and a bad file is one line naming it and what is wrong (a
CheckpointError here; pickle.UnpicklingError from tt.load), never a traceback. Zip
archives (.npz) are read by tinytorch's strict reader (tt._Zip: directory and local
headers cross-checked, no overlapping or duplicate members, inflation bounded by the
declared size, CRCs checked); an .npy member's header is parsed by the small grammar
below, not by NumPy; a .safetensors header is JSON whose every field is checked. Every
write is atomic (tt._atomic_write): a temporary beside the file, renamed over it.

Formats: tt.save (PyTorch's zip: torch.load reads it) for a state_dict to share with
PyTorch; nn.save (.npz + JSON, never pickle) for tinytorch's own training checkpoints;
.safetensors for Hugging Face.
"""
import json
import math
import os
import pickle
import re

import numpy as np

import tinytorch as tt
from tinytorch import Tensor


class CheckpointError(Exception):
    """What is wrong with a file nn.load or load_safetensors reads: one line naming it."""


_META = '__tinytorch_meta__'
_HOSTILE = "the file is damaged or was made to attack: do not use it"


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
                k = tt._key(_decode(k, arrays))  # keys whose hashes cannot be made to collide
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
        tt._atomic_write(path, lambda f: _write_safetensors(
            f, tensors, {_META: meta, 'names': json.dumps(list(tensors)), 'format': 'pt'}))
        return
    entries = {f'a{i}': a for i, a in enumerate(arrays)}
    entries[_META] = np.frombuffer(meta.encode('utf-8'), dtype=np.uint8)
    tt._atomic_write(path, lambda f: np.savez(f, **entries))


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
        except (KeyError, ValueError, TypeError, IndexError, RecursionError, tt._BadFile) as e:
            raise _bad_description(path, e) from None
    with open(path, 'rb') as f:
        if f.read(4) != b'PK\x03\x04':  # every .npz is a zip archive, which starts so
            raise CheckpointError(f"{path} is not a tinytorch checkpoint (neither a .npz archive "
                                  "nor a .safetensors file)")
        try:
            arrays = read_npz(f)
        except tt._BadFile as e:
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
            raise CheckpointError(tt._one_line(f"{path} has a member {k}.npy that nn.save never "
                                               f"writes (its arrays are a0, a1, ...); {_HOSTILE}"))
        numbered[int(k[1:])] = a
    try:
        return _decode(json.loads(meta.tobytes().decode('utf-8')), numbered)
    except (KeyError, ValueError, TypeError, IndexError, RecursionError, tt._BadFile) as e:
        raise _bad_description(path, e) from None


def _bad_description(path, e):
    what = {RecursionError: "it is nested deeper than Python can follow",
            KeyError: f"it refers to array {e}, which the file lacks"}.get(type(e), f"{e}")
    return CheckpointError(tt._one_line(f"{path}: its tinytorch description does not match its "
                                        f"arrays ({type(e).__name__}: {what}); the file is damaged "
                                        "or was made to attack: do not use it"))


# ---------------------------------------------------------------------------
# .npz: a zip of .npy members, each a header (a Python dict literal) and raw bytes
# ---------------------------------------------------------------------------
_NPY_CODES = {**{code: np.dtype(t) for code, (t, _, _) in tt._CODES.items()},
              'u2': np.dtype(np.uint16), 'u4': np.dtype(np.uint32), 'u8': np.dtype(np.uint64)}
# The header np.save writes, and nothing else: {'descr': '<f4', 'fortran_order': False,
# 'shape': (2, 3), } padded with spaces to a line end.
_NPY_HEADER = re.compile(r"\{'descr': '([<>|])([a-z][0-9]{1,2})', 'fortran_order': (True|False), "
                         r"'shape': \(((?:[0-9]{1,19}, )*[0-9]{1,19},?)?\), \} *\n")


def read_npz(f):
    """name -> array for every member of an .npz (each must be an .npy), read strictly."""
    archive = tt._Zip(f)
    arrays = {}
    for name, m in archive.members.items():
        if not name.endswith('.npy'):
            tt._fail(f"has a member {name} that is not an array (.npy); {_HOSTILE}")
        arrays[name[:-4]] = _npy(name, m, archive)
    return arrays


def _npy(name, m, archive):
    """One .npy member: its header parsed by _NPY_HEADER, its size checked before it is read."""
    head = archive.head(m, 12)
    if head[:6] != b'\x93NUMPY' or head[6] not in (1, 2, 3) or head[7] != 0:
        tt._fail(f"has a member {name} that is not an .npy array (no NUMPY magic); {_HOSTILE}")
    start, size = (10, int.from_bytes(head[8:10], 'little')) if head[6] == 1 else \
        (12, int.from_bytes(head[8:12], 'little'))
    if size > 1 << 16:
        tt._fail(f"has a member {name} whose array header claims {size:,} bytes; {_HOSTILE}")
    text = archive.head(m, start + size)[start:].decode('latin1')
    if "'descr': '|O'" in text or "'descr': 'O'" in text:
        tt._fail(f"holds pickled Python objects in {name}, which could run code: it is not a "
                 "tinytorch checkpoint, and tinytorch never loads them")
    found = _NPY_HEADER.fullmatch(text)
    if found is None or found[2] not in _NPY_CODES:
        tt._fail(f"has a member {name} whose array header {text.strip()[:80]!r} is not one np.save "
                 f"writes for a plain number type; {_HOSTILE}")
    order, code, fortran, dims = found.groups()
    dtype = _NPY_CODES[code]
    if (order == '|') != (dtype.itemsize == 1):
        tt._fail(f"has a member {name} with the byte order {order!r} for {dtype}; {_HOSTILE}")
    shape = tuple(int(n) for n in dims.split(',') if n.strip()) if dims else ()
    need = math.prod(shape) * dtype.itemsize
    if len(shape) > 64 or start + size + need != m.size:
        tt._fail(f"has its array {name}, which declares {shape} of {dtype} ({need:,} bytes) in a member of "
                 f"{m.size - start - size:,}; {_HOSTILE}")
    raw = archive.read(m)  # its declared size, now known to be the array's
    a = np.frombuffer(raw, dtype.newbyteorder(order) if order != '|' else dtype, offset=start + size)
    return tt._owned(a.reshape(shape, order='F' if fortran == 'True' else 'C'))


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
    tt._atomic_write(path, lambda f: _write_safetensors(f, arrays, metadata))


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


def load_safetensors(path):
    """Read a .safetensors file: (name -> NumPy array, metadata dict). bfloat16 tensors
    come back as float32 (NumPy has no bfloat16). Every field of the header is checked:
    a bad one is one line naming the file and the field."""
    def corrupt(why):  # one line, whatever the file's names hold (tt._one_line)
        return CheckpointError(tt._one_line(f"{path} is truncated or corrupt and cannot be "
                                            f"loaded ({why}); {_HOSTILE}"))
    with open(path, 'rb') as f:
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
        tensors[name] = tt._owned(a)
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
            out.append(tt.load(p))
        except pickle.UnpicklingError as e:
            raise CheckpointError(str(e)) from None
    return tuple(out)
