"""dev/make_golden.py: writes data/golden/, the files tinytorch did not write that the suite
loads (test_tinytorch.py, "golden files": each value they must give is written there by
hand, never read back from tinytorch).

    /work/torchenv/bin/python dev/make_golden.py     # needs PyTorch (2.15 wrote the committed ones)

What it writes, each a few KB at most:
  torch_dtypes.pt      torch.save of a dict: a tensor of every storage type tinytorch reads
                       (float16/32/64, int8/16/32/64, uint8, bool, complex64/128), a transposed
                       view (its storage in the other order), a 0-d tensor, a Parameter, an int
                       and a string with bytes above 127
  torch_state_dict.pt  torch.save of nn.Sequential(Linear(2, 2), BatchNorm1d(2)).state_dict()
  torch_bfloat16.pt    a bfloat16 tensor (NumPy has none: tt.load refuses it in one line)
  torch_64dims.pt      a tensor of 64 dims (NumPy's limit) and torch_65dims.pt, one past it
  torch_comment.pt     torch.save's zip with a comment after its end record
  pickle_p2.pkl .. pickle_p5.pkl   pickle.dumps at protocols 2 to 5: ints on each side of
                       2**7, 2**8, 2**15, 2**16, 2**31, 2**63 and their negatives, bytes and text
                       above 127, floats; NumPy arrays (a Fortran-ordered one, a big-endian one)
                       at protocols 2 to 4 (protocol 5 pickles an array by _frombuffer)
  numpy_checkpoint.npz np.savez in nn.save's layout (a0, a1, ..., __tinytorch_meta__): a
                       Fortran-ordered array, big-endian ints, bytes 128..255, 64 dims, a 0-d
                       array, names with bytes above 127; a zip comment
  tensors.safetensors  Hugging Face's format written here by its specification (an 8-byte
                       length, the JSON header, the bytes): bfloat16 (PyTorch's bits), float16,
                       int8, uint8, bool, int64, a name and metadata with bytes above 127
"""
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'golden')

INTS = [0, 1, 127, 128, 255, 256, 32767, 32768, 65535, 65536, 2**31 - 1, 2**31, 2**63 - 1, 2**63,
        2**64, -1, -128, -129, -256, -32768, -32769, -65536, -2**31, -2**31 - 1, -2**63, -2**63 - 1]


def path(name):
    return os.path.join(OUT, name)


def add_comment(name, comment):
    """Append a zip comment: the end record's last field (its length) and the bytes after it."""
    raw = bytearray(open(path(name), 'rb').read())
    end = raw.rindex(b'PK\x05\x06')
    assert end + 22 == len(raw)  # no comment yet
    raw[end + 20:end + 22] = struct.pack('<H', len(comment))
    open(path(name), 'wb').write(bytes(raw) + comment)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.save({
        'f16': torch.tensor([1.5, -2.0, 65504.0, 2.0**-24, -0.0], dtype=torch.float16),
        'f32': torch.tensor([0.15625, -3.5, 3.4028234663852886e38, 2.0**-149], dtype=torch.float32),
        'f64': torch.tensor([0.1, -1e308, 5e-324], dtype=torch.float64),
        'i8': torch.tensor([-128, 127, -1, 0], dtype=torch.int8),
        'u8': torch.tensor([0, 127, 128, 255], dtype=torch.uint8),
        'i16': torch.tensor([-32768, 32767, 256, -256], dtype=torch.int16),
        'i32': torch.tensor([-2**31, 2**31 - 1, 65536], dtype=torch.int32),
        'i64': torch.tensor([-2**63, 2**63 - 1, 2**32], dtype=torch.int64),
        'b': torch.tensor([True, False, True]),
        'c64': torch.tensor([1 + 2j, -0.5j], dtype=torch.complex64),
        'c128': torch.tensor([3 - 4j], dtype=torch.complex128),
        't': torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # size (3, 2), stride (1, 3)
        'scalar': torch.tensor(7),
        'p': torch.nn.Parameter(torch.tensor([0.5, -0.25])),
        'n': 3,
        'name': 'poids_\u00e9 \u91cd\u307f',
    }, path('torch_dtypes.pt'))

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))
        model[0].bias.copy_(torch.tensor([0.125, -1.0]))
        model[1].running_mean.copy_(torch.tensor([0.5, -0.5]))
        model[1].running_var.copy_(torch.tensor([4.0, 0.25]))
        model[1].num_batches_tracked.fill_(3)
    torch.save(model.state_dict(), path('torch_state_dict.pt'))

    torch.save({'w': torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, path('torch_bfloat16.pt'))
    torch.save(torch.full([1] * 64, 2.5), path('torch_64dims.pt'))
    torch.save(torch.full([1] * 65, 2.5), path('torch_65dims.pt'))
    torch.save({'w': torch.tensor([1.0, 2.0])}, path('torch_comment.pt'))
    add_comment('torch_comment.pt', 'a comment: caf\u00e9 \u2713'.encode() + bytes([0x80, 0xff]))

    for protocol in (2, 3, 4, 5):
        obj = {'ints': INTS, 'floats': [0.1, -2.5, 1e300, float('inf')],
               'text': 'h\u00e9llo \u2713 \u91cd\u307f', 'bytes': bytes([0, 127, 128, 200, 255]),
               'tuple': (1, 'a', None), 'bools': [True, False], 'nested': {'k': [[], {}]}}
        if protocol < 5:
            obj['fortran'] = np.asfortranarray(np.array([[1.5, -2.0, 3.0], [4.0, 5.0, -6.0]],
                                                        dtype=np.float32))
            obj['big_endian'] = np.array([1, -2, 300], dtype='>i2')
            obj['scalar'] = np.float64(0.25)
        with open(path(f'pickle_p{protocol}.pkl'), 'wb') as f:
            pickle.dump(obj, f, protocol=protocol)

    meta = {'__dict__': {
        'fortran': {'__tensor__': 0}, 'big_endian': {'__array__': 1},
        'octets_\u00e9': {'__tensor__': 2}, 'dims64': {'__tensor__': 3},
        'flags': {'__array__': 4}, 'step': {'__array__': 5}, '\u91cd\u307f': {'__array__': 6},
        'lr': 0.5, 'note': 'caf\u00e9'}}
    np.savez(path('numpy_checkpoint.npz'),
             a0=np.asfortranarray(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])),
             a1=np.array([-2**31, 2**31 - 1, 1], dtype='>i4'),
             a2=np.array([0, 127, 128, 255], dtype=np.uint8),
             a3=np.full((1,) * 64, 0.5, dtype=np.float32),
             a4=np.array([True, False]),
             a5=np.array(-7, dtype=np.int64),
             a6=np.array([65535, 0], dtype='<u2'),
             __tinytorch_meta__=np.frombuffer(json.dumps(meta, ensure_ascii=False).encode(),
                                              dtype=np.uint8))
    add_comment('numpy_checkpoint.npz', 'np.savez, then a comment: \u00e9\u00e8'.encode())
    st = {'poids_\u00e9': torch.tensor([1.5, -2.0, 3.14159], dtype=torch.bfloat16),
          'h': torch.tensor([65504.0, -0.0], dtype=torch.float16),
          'i8': torch.tensor([-128, 127], dtype=torch.int8), 'u8': torch.tensor([0, 255], dtype=torch.uint8),
          'b': torch.tensor([True, False]), 'i64': torch.tensor([[-2**63], [2**63 - 1]])}
    codes = {torch.bfloat16: 'BF16', torch.float16: 'F16', torch.int8: 'I8', torch.uint8: 'U8',
             torch.bool: 'BOOL', torch.int64: 'I64'}
    header, data = {'__metadata__': {'format': 'pt', 'note': 'caf\u00e9'}}, b''
    for name, t in st.items():
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()  # little-endian
        header[name] = {'dtype': codes[t.dtype], 'shape': list(t.shape),
                        'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, ensure_ascii=False).encode()
    text += b' ' * (-len(text) % 8)
    with open(path('tensors.safetensors'), 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + data)
    for name in sorted(os.listdir(OUT)):
        print(f'{os.path.getsize(path(name)):6,} {name}')
    assert zipfile.ZipFile(path('numpy_checkpoint.npz')).comment  # readable by zipfile


if __name__ == '__main__':
    main()
