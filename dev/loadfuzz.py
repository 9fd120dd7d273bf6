"""dev/loadfuzz.py: the loader fuzzer. Valid files of every kind tinytorch reads, mutated,
each loaded in a child process.

`python dev/loadfuzz.py --seed 7 --count 20000` runs it at length; the suite
runs a few hundred mutants (test_loader_fuzzer_*). A mutant must load to a value of the
grammar (the original or, where the format has no checksum, other numbers) or be refused
in one line naming the file, within 20 s and 64 MiB + 8x its size of Python memory;
never a crash, a hang or a traceback.

It builds its pickles and zips with the builders of hostile files in test_tinytorch.py
(opcode by opcode, member by member) and loads them with its child loader, as the
loader's tests do; its own test (test_loader_fuzzer_finds_nothing_in_300_mutants) is
there too.
"""
import io
import json
import os
import pickle
import shutil
import struct
import sys
import time as _time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run as `python dev/loadfuzz.py`: the project beside dev/
import tinytorch as tt  # noqa: E402
import nn  # noqa: E402


def _tests():
    """test_tinytorch.py, for its builders of hostile files and its child loader."""
    import test_tinytorch
    return test_tinytorch


_FUZZ_OPCODES = [bytes([c]) for c in b'.(NJKM\x8aGX\x8c\x8dCB\x8e)t\x85\x86\x87]ae}sudqr\x94hjc\x93R\x81bQP\x82i0128']


def _fuzz_sources():
    """kind -> (reader, bytes) of small valid files: tt.save's zip, a PyTorch zip of views,
    an earlier tinytorch save (a plain pickle, protocols 4 and 2), nn.save's .npz and
    .safetensors, and a Hugging Face .safetensors; and the shapes of issue 55: memo graphs
    (values shared through the memo, protocols 2 and 4), tt.save's zip deflated, a zip with
    a comment, tensors and arrays with a zero dim, a whole model (torch.save(model); the
    child lists its classes), a BPE's merges.txt."""
    T = _tests()
    folder = os.path.join(os.environ.get('TMPDIR', '/tmp'), f'tt-fuzz-src-{os.getpid()}')
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    model = nn.Linear(3, 2)
    state = model.state_dict()
    obj = {'model': state, 'step': 3, 'lr': 0.1, 'names': ['a', 'b'], 'nothing': None,
           'opt': {'state': {0: {'step': tt.tensor(2.0), 'exp_avg': tt.ones(3)}},
                   'param_groups': [{'params': [0], 'betas': (0.9, 0.99)}]},
           'shape': tt.Size([2, 3]), 'dev': tt.device('cpu'), 'dt': tt.float16,
           'p': nn.Parameter(tt.ones(2)), 'tied': [state['weight'], state['weight']],
           'ints': tt.arange(5), 'mask': tt.tensor([True, False]), 'b': b'\x00\xff'}
    out = {}
    buf = io.BytesIO()
    tt.save(obj, buf)
    out['tt_zip'] = ('tt', buf.getvalue())
    s = T._storage_ref('0', 4)
    out['torch_zip'] = ('tt', open(T._torch_zip(os.path.join(folder, 'views.pt'), T._pickled(T._op_dict(
        a=T._tensor_op(s, 0, (4,), (1,)), b=T._tensor_op(s, 1, (2,), (1,)),
        t=T._tensor_op(s, 0, (2, 2), (1, 2)))), {'0': T._F4}), 'rb').read())
    old = {'w': tt.tensor(rng.standard_normal((2, 3)).astype(np.float32)), 'p': nn.Parameter(tt.zeros(2)),
           'a': np.arange(4.0), 'f': np.float64(1.5), 'i': np.int64(7), 's': tt.Size([1]),
           'd': tt.device('cpu'), 'fortran': np.asfortranarray(np.arange(6).reshape(2, 3)),
           'half': tt.ones(2, dtype=tt.float16), 'flag': np.array([True, False])}
    out['old_pickle_4'] = ('tt', pickle.dumps(old, protocol=4))
    out['old_pickle_2'] = ('tt', pickle.dumps(old, protocol=2))
    npz, st, nst = (os.path.join(folder, n) for n in ('ck.npz', 'x.safetensors', 'ck.safetensors'))
    nn.save({'model': {k: v.array for k, v in state.items()}, 'step': 4, 'vocab': 'abc',
             'opt': {'state': {0: {'m': np.ones(2)}}, 'groups': [{'lr': 0.1}]}}, npz)
    nn.save_safetensors({'w': rng.standard_normal((2, 3)).astype(np.float32),
                         'i': np.arange(3), 'b': np.array([True, False])}, st, {'format': 'pt'})
    nn.save({'w': tt.ones(2, 2), 'step': 1}, nst)
    out['npz'] = ('nn', open(npz, 'rb').read())
    out['safetensors'] = ('st', open(st, 'rb').read())
    out['nn_safetensors'] = ('nn', open(nst, 'rb').read())
    a = [1, 'x']
    b = (a, a)
    graph = {'a': a, 'b': b, 'c': [b, b], 'd': ((b, b), (b, b)), 'e': {'k': b}}
    out['memo_graph_2'] = ('tt', pickle.dumps(graph, protocol=2))
    out['memo_graph_4'] = ('tt', pickle.dumps(graph, protocol=4))
    out['deflated_zip'] = ('tt', _rezip(_zip_members(out['tt_zip'][1]), deflate=True))
    out['zip_comment'] = ('tt', _with_comment(out['tt_zip'][1], b'saved by tinytorch'))
    buf = io.BytesIO()
    tt.save({'e': tt.zeros(0, 3), 'z': tt.zeros(2, 0, 4), 's': tt.tensor(1.5)}, buf)
    out['zero_dims_zip'] = ('tt', buf.getvalue())
    zst, znpz = os.path.join(folder, 'z.safetensors'), os.path.join(folder, 'z.npz')
    nn.save_safetensors({'e': np.zeros((0, 3), np.float32), 'w': np.ones(2, np.float32)}, zst)
    nn.save({'e': np.zeros((0, 3)), 'z': tt.zeros(2, 0)}, znpz)
    out['zero_dims_safetensors'] = ('st', open(zst, 'rb').read())
    out['zero_dims_npz'] = ('nn', open(znpz, 'rb').read())
    buf = io.BytesIO()
    tt.manual_seed(0)
    tt.save(nn.Sequential(nn.Linear(3, 2), nn.ReLU()), buf)
    out['whole_model'] = ('tt', buf.getvalue())
    import tokens
    merges = os.path.join(folder, 'merges.txt')
    tokens.BPE.train('the cat sat on the mat; the cat ran', 270).save(merges)
    out['bpe_merges'] = ('bpe', open(merges, 'rb').read())
    shutil.rmtree(folder)
    return out


def _with_comment(raw, comment):
    """A zip's bytes with its end record's comment set to comment."""
    end = raw.rindex(b'PK\x05\x06')
    return raw[:end + 20] + struct.pack('<H', len(comment)) + comment


def _zip_members(raw):
    """[(name, bytes)] of a zip (valid: only for the sources' own)."""
    import zipfile
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _rezip(members, deflate=False):
    """A zip of the members, stored (or deflated), with right CRCs: what is mutated inside
    passes the zip."""
    import zlib
    out, central = b'', b''
    for name, data in members:
        method, packed = 0, data
        if deflate:
            z = zlib.compressobj(6, zlib.DEFLATED, -15)
            method, packed = 8, z.compress(data) + z.flush()
        fields = (20, 0, method, 0, 0, zlib.crc32(data), len(packed), len(data), len(name))
        head = b'PK\x03\x04' + struct.pack('<HHHHHIIIHH', *fields, 0) + name.encode()
        central += (b'PK\x01\x02' + struct.pack('<HHHHHHIIIHHHHHII', 20, *fields, 0, 0, 0, 0, 0,
                                                 len(out)) + name.encode())
        out += head + packed
    n = len(members)
    return out + central + b'PK\x05\x06' + struct.pack('<HHHHIIH', 0, 0, n, n, len(central), len(out), 0)


def _mutate_bytes(rng, raw):
    """One byte-level mutation: flips, a cut, an inserted or duplicated opcode or span, a
    deleted span, a big number written over 4 or 8 bytes."""
    raw, n = bytearray(raw), len(raw)
    if not n:  # an empty member (a tensor with a zero dim): something in it
        return b''.join(_FUZZ_OPCODES[int(i)] for i in rng.integers(len(_FUZZ_OPCODES), size=3))
    how = rng.integers(7)
    at = int(rng.integers(max(n, 1)))
    if how == 0:
        for _ in range(int(rng.integers(1, 5))):
            raw[int(rng.integers(n))] ^= int(rng.integers(1, 256))
    elif how == 1:
        del raw[at:]
    elif how == 2:
        raw[at:at] = b''.join(_FUZZ_OPCODES[int(i)] for i in rng.integers(len(_FUZZ_OPCODES), size=int(rng.integers(1, 4))))
    elif how == 3:
        span = raw[at:at + int(rng.integers(1, 32))]
        raw[int(rng.integers(n)):0] = span
        where = int(rng.integers(n))
        raw[where:where] = span
    elif how == 4:
        del raw[at:at + int(rng.integers(1, 16))]
    elif how == 5:
        big = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x0C000000, 2 ** 63 - 1, 2 ** 64 - 1, 0][int(rng.integers(7))]
        width = 8 if big >= 1 << 32 or rng.integers(2) else 4
        raw[at:at + width] = big.to_bytes(8, 'little')[:width]
    else:
        raw[at:at + 1] = _FUZZ_OPCODES[int(rng.integers(len(_FUZZ_OPCODES)))]
    return bytes(raw)


_FUZZ_JSON = [-1, 2 ** 64, 1.5, 'x', [], {}, None, True, [[[[[[[[1]]]]]]]], [2 ** 62, 3], [0, 10 ** 9],
              'F32', 'BF16', ['F32'], {'a': 1}, 'O', [1, -1], list(range(70)),
              [0, 2 ** 61, 2 ** 61], [0, 2 ** 62 - 1], [0, 3], [2, 0, 5]]


def _mutate_tail(rng, raw):
    """A zip's end made to read two ways: bytes after it, a comment holding zip records (a
    slice of the archive, or a whole second one), a second end record."""
    end = raw.rindex(b'PK\x05\x06')
    how = int(rng.integers(4))
    if how == 0:
        return raw + bytes(rng.integers(256, size=int(rng.integers(1, 40)), dtype=np.uint8))
    if how == 1:
        at = int(rng.integers(len(raw)))
        return _with_comment(raw, raw[at:at + int(rng.integers(4, 200))])
    if how == 2:
        return _with_comment(raw, raw)
    return raw + raw[end:end + 22]


def _shared(rng, pkl):
    """A pickle whose value v becomes (v, v) of (v, v) of ... k deep, shared through the
    memo: valid, and 2**k times v once walked."""
    if pkl[-1:] != b'.':
        return pkl
    return pkl[:-1] + b'q\xffh\xff\x86' * int(rng.integers(1, 200)) + b'.'


def _mutate_growth(rng, raw):
    """Growth the file's bytes do not pay for: shared structure that expands (a plain
    pickle, or a zip's data.pkl), a member deflated from many times its size, a flood of
    values made from memoized arguments."""
    if raw[:2] != b'PK':
        return _shared(rng, raw)
    members = _zip_members(raw)
    pick = int(rng.integers(len(members)))
    name, data = members[pick]
    how = int(rng.integers(3))
    if how == 0 and name.endswith('data.pkl'):
        members[pick] = (name, _shared(rng, data))
    elif how == 1:
        members[pick] = (name, data + bytes(int(rng.integers(1 << 16, 1 << 23))))
        return _rezip(members, deflate=True)
    elif name.endswith('data.pkl') and data[-1:] == b'.':  # the value, then n copies of it
        n = int(rng.integers(1, 100_000))
        members[pick] = (name, data[:-1] + b'q\xff]q\xfe(' + b'h\xff' * n + b'e\x86.')
    return _rezip(members)


def _mutate_bpe(rng, raw):
    """merges.txt: lines that double a token each time, numbers past the tokens, or bytes."""
    lines = raw.decode('utf-8').splitlines(keepends=True)
    how = int(rng.integers(4))
    if how == 0:
        k = 256 + sum(1 for line in lines if line.split('#', 1)[0].strip())
        start = int(rng.integers(256, k))
        chain = [f"{start} {start}\n"] + [f"{k + i} {k + i}\n" for i in range(int(rng.integers(10, 60)))]
        return ''.join(lines + chain).encode()
    if how == 1 and len(lines) > 1:
        at = int(rng.integers(1, len(lines)))
        lines[at] = ['-1 2\n', '1 2 3\n', f"{2 ** 64} 1\n", '\u00b2 1\n', '1e3 1\n',
                     f"{'9' * 5000} 1\n"][int(rng.integers(6))]
        return ''.join(lines).encode()
    return _mutate_bytes(rng, raw)


def _mutate_file(rng, kind, raw):
    """A mutant of a source file: byte-level over the whole file, or, inside a zip, over a
    member (its bytes re-zipped with right CRCs), members swapped, dropped or doubled, its
    end made to read two ways; a safetensors header field replaced; an .npy header
    rewritten; merges.txt's lines."""
    how = rng.integers(4)
    if kind == 'bpe':
        return _mutate_bpe(rng, raw)
    if raw[:2] == b'PK' and how and rng.integers(6) == 0:
        return _mutate_tail(rng, raw)
    if rng.integers(8) == 0:
        return _mutate_growth(rng, raw)
    if raw[:2] == b'PK' and how:
        members = _zip_members(raw)
        pick = int(rng.integers(len(members)))
        name, data = members[pick]
        if how == 1:
            if name.endswith('.npy') and rng.integers(2):
                text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
                    ['<f8', '<f4', '|b1', '|O', '>i8', '<U2', '<f4x'][int(rng.integers(7))],
                    ['False', 'True'][int(rng.integers(2))],
                    ['()', '(2,)', '(3, 2)', '(0,)', '(4294967296,)', '(-1,)', '(2, 3, 4)',
                     '(0, 2305843009213693952, 2305843009213693952)', '(0, 4611686018427387904)',
                     '(3, 0)'][int(rng.integers(10))])
                text = (text + ' ' * (64 - (10 + len(text) + 1) % 64) + '\n').encode()
                body = data[10 + int.from_bytes(data[8:10], 'little'):]
                members[pick] = (name, b'\x93NUMPY\x01\x00' + len(text).to_bytes(2, 'little') + text + body)
            else:
                members[pick] = (name, _mutate_bytes(rng, data))
        elif how == 2 and len(members) > 1:
            other = int(rng.integers(len(members)))
            members[pick], members[other] = (members[pick][0], members[other][1]), (members[other][0], data)
        else:
            change = int(rng.integers(3))
            if change == 0:
                members.insert(int(rng.integers(len(members) + 1)), members[pick])
            elif change == 1:
                del members[pick]
            else:
                members[pick] = (members[int(rng.integers(len(members)))][0], data)
        return _rezip(members, deflate=bool(rng.integers(2)) and raw[:2] == b'PK' and
                      b'\x08\x00' == raw[8:10])  # a deflated source stays deflated
    if kind == 'st' or (raw[8:9] == b'{' and how):
        n = int.from_bytes(raw[:8], 'little')
        try:
            header = json.loads(raw[8:8 + n])
        except ValueError:
            return _mutate_bytes(rng, raw)
        names = list(header)
        entry = header[names[int(rng.integers(len(names)))]]
        value = _FUZZ_JSON[int(rng.integers(len(_FUZZ_JSON)))]
        if isinstance(entry, dict) and entry and rng.integers(3):
            keys = list(entry)
            entry[keys[int(rng.integers(len(keys)))]] = value
        else:
            header[names[int(rng.integers(len(names)))]] = value
        text = json.dumps(header).encode()
        return len(text).to_bytes(8, 'little') + text + raw[8 + n:]
    return _mutate_bytes(rng, raw)


def loadfuzz(seed, count, folder, batch=2000):
    """count mutants from seed, loaded `batch` at a time in one child each; returns
    (findings, counts): findings name the mutant and what went wrong."""
    T = _tests()
    rng = np.random.default_rng(seed)
    sources = _fuzz_sources()
    names = sorted(sources)
    findings, counts = [], {'ok': 0, 'same': 0, 'refused': 0}
    readers = {'tt': 'tt', 'nn': 'nn', 'st': 'st', 'bpe': 'bpe'}
    originals = {}
    for name in names:
        path = os.path.join(folder, f'{name}.orig' + ('.safetensors' if 'safetensors' in name else ''))
        T._write(path, sources[name][1])
        originals[name] = path
    base = T._load_in_child([(readers[sources[n][0]], originals[n]) for n in names])
    for n in names:
        assert base[originals[n]][0] == 'ok', (n, base[originals[n]])
    for start in range(0, count, batch):
        jobs, made = [], {}
        for i in range(start, min(start + batch, count)):
            name = names[int(rng.integers(len(names)))]
            kind, raw = sources[name]
            mutant = _mutate_file(rng, kind, raw)
            path = os.path.join(folder, f'{i}-{name}' + ('.safetensors' if 'safetensors' in name else ''))
            T._write(path, mutant)
            jobs.append((readers[kind], path))
            made[path] = (name, len(mutant))
        got = T._load_in_child(jobs, timeout=60 + batch)
        for path, (name, size) in made.items():
            status, what, seconds, peak = got[path]
            problem = None
            if status == 'ok':
                counts['ok'] += 1
                counts['same'] += what == base[originals[name]][1]
            elif status == 'refused':
                counts['refused'] += 1
                prefix = f"load: {path} " if readers[sources[name][0]] == 'tt' else f"{path}"
                if '\n' in what or not what.startswith(prefix):
                    problem = f"refused without one line naming the file: {what!r}"
            else:
                problem = f"{status}: {what}"
            if seconds > 20 or peak > (64 << 20) + 8 * size:  # (a loaded machine: 20 s, not 1)
                problem = f"took {seconds:.1f} s and {peak:,} bytes"
            if problem:
                kept = path + '.finding'
                shutil.copy(path, kept)
                findings.append(f"{kept} (a mutant of {name}): {problem}")
            else:
                os.remove(path)
    return findings, counts


def _loadfuzz_main(argv):
    import argparse
    import tempfile
    p = argparse.ArgumentParser(prog='python dev/loadfuzz.py')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--count', type=int, default=2000)
    p.add_argument('--keep', help="folder for the findings (default: a temporary one)")
    args = p.parse_args(argv)
    folder = args.keep or tempfile.mkdtemp(prefix='tt-loadfuzz-')
    os.makedirs(folder, exist_ok=True)
    began = _time.time()
    findings, counts = loadfuzz(args.seed, args.count, folder)
    print(f"loadfuzz seed {args.seed}: {args.count} mutants in {_time.time() - began:.0f} s: "
          f"{counts['refused']} refused in one line, {counts['ok']} loaded ({counts['same']} equal "
          f"to the original), {len(findings)} findings")
    for f in findings:
        print(f)
    sys.exit(1 if findings else 0)


if __name__ == '__main__':
    _loadfuzz_main(sys.argv[1:])
