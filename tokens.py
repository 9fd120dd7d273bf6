"""tokens.py: byte-level BPE, the tokenizer of GPT-2, trained on your own text.

    bpe = tokens.BPE.train(text, vocab_size=512)   # 256 bytes + 256 merges
    ids = bpe.encode(text)                         # fewer tokens than characters
    assert bpe.decode(ids) == text
    bpe.save('merges.txt')                         # one merge a line, readable

A token is a byte (ids 0-255) or a merge of two tokens (ids 256 and up, in the order they
were learned). Training starts from the text's UTF-8 bytes and repeats: count every pair
of neighbouring tokens, give the most frequent pair (the first seen, on a tie) the next id
and replace it everywhere. Encoding repeats the merges in the same order. Needs only
NumPy.
"""
import numpy as np


def _merge(ids, pair, new):
    """ids with every occurrence of pair (left to right, not overlapping) replaced by new."""
    a, b = pair
    at = np.flatnonzero((ids[:-1] == a) & (ids[1:] == b))
    if a == b and at.size:  # 'aaa' holds the pair twice, overlapping: keep every other one
        keep, last = [], -2
        for p in at.tolist():
            if p != last + 1:
                keep.append(p)
                last = p
        at = np.array(keep)
    if not at.size:
        return ids
    out = ids.copy()
    out[at] = new
    return np.delete(out, at + 1)


MAX_TOKEN_BYTES, MAX_TOKENS_BYTES = 1 << 20, 1 << 24  # a token's bytes; all tokens' together


def expanded_bytes(merges):
    """The bytes all the tokens of these merges take, counted before any is made: merges
    from a file may double a token each time ([0, 0], [256, 256], [257, 257], ...: 2**60
    bytes after 60 merges). A token of more than 1 MiB, or tokens of more than 16 MiB in
    all (real vocabularies take kilobytes), is one ValueError line."""
    lengths, total = [1] * 256, 256
    for k, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + k and 0 <= b < 256 + k):
            raise ValueError(f"merge {k} ({a}, {b}) is not of two earlier tokens")
        lengths.append(lengths[a] + lengths[b])
        total += lengths[-1]
        if lengths[-1] > MAX_TOKEN_BYTES or total > MAX_TOKENS_BYTES:
            raise ValueError(f"merge {k} makes a token of {lengths[-1]:,} bytes and the tokens "
                             f"{total:,} bytes in all (a BPE's tokens take at most "
                             f"{MAX_TOKEN_BYTES >> 20} MiB each, {MAX_TOKENS_BYTES >> 20} MiB in "
                             "all): not a vocabulary learned from text")
    return total


class BPE:
    """A byte-level BPE tokenizer: `merges` is the list of (left, right) token-id pairs;
    merge k makes token 256 + k."""

    def __init__(self, merges):
        self.merges = [tuple(int(t) for t in m) for m in merges]
        expanded_bytes(self.merges)  # before any token is made
        self.pieces = [bytes([i]) for i in range(256)]  # token id -> its bytes
        for a, b in self.merges:
            self.pieces.append(self.pieces[a] + self.pieces[b])

    @property
    def vocab_size(self):
        return 256 + len(self.merges)

    @classmethod
    def train(cls, text, vocab_size):
        """Learn vocab_size - 256 merges from text (fewer if no pair repeats any more)."""
        if vocab_size < 256:
            raise ValueError(f"vocab_size {vocab_size} is too small: byte-level BPE has 256 "
                             "byte tokens before its first merge (use 256 or more)")
        ids = np.frombuffer(text.encode('utf-8'), dtype=np.uint8).astype(np.int64)
        merges = []
        while 256 + len(merges) < vocab_size and ids.size > 1:
            pairs = ids[:-1] * vocab_size + ids[1:]  # each neighbouring pair as one number
            counts = np.bincount(pairs)
            if counts.max() < 2:
                break
            best = np.isin(pairs, np.flatnonzero(counts == counts.max()))
            code = int(pairs[np.argmax(best)])  # the most frequent; on a tie, the first seen
            pair = (code // vocab_size, code % vocab_size)
            ids = _merge(ids, pair, 256 + len(merges))
            merges.append(pair)
        return cls(merges)

    def encode(self, text):
        ids = np.frombuffer(text.encode('utf-8'), dtype=np.uint8).astype(np.int64)
        for k, pair in enumerate(self.merges):
            ids = _merge(ids, pair, 256 + k)
        return ids

    def decode(self, ids):
        """The text of token ids; a cut through a character's bytes (a sample may end
        there) becomes U+FFFD, as GPT-2's decoder does."""
        return b''.join(self.pieces[int(i)] for i in ids).decode('utf-8', errors='replace')

    def save(self, path):
        """One merge a line: 'left right' ids, then the merged bytes as Python writes them
        (to a path, or into a binary file: files.atomic_write's)."""
        text = "# tinytorch byte-level BPE: one merge a line, token 256 first\n" + ''.join(
            f"{a} {b}  # {256 + k} = {self.pieces[256 + k]!r}\n" for k, (a, b) in enumerate(self.merges))
        if hasattr(path, 'write'):
            path.write(text.encode('utf-8'))
            return
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)

    @classmethod
    def load(cls, path):
        """The merges BPE.save wrote. A file that is not one is one ValueError line naming
        it (never a raw decoding error, nor tokens past the budget of expanded_bytes)."""
        merges = []
        try:
            with open(path, encoding='utf-8') as f:
                for n, line in enumerate(f, 1):
                    line = line.split('#', 1)[0].strip()
                    if not line:
                        continue
                    parts = line.split()
                    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) < 10
                                                  for p in parts) or \
                            max(int(p) for p in parts) >= 256 + len(merges):
                        raise ValueError(f"{path}, line {n}: not a merge of two earlier tokens "
                                         f"({line[:40]!r})")
                    merges.append((int(parts[0]), int(parts[1])))
            return cls(merges)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {e.start:,} of a line)") from None
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
