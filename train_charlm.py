"""Train a character-level GPT (or an LSTM or GRU) on a text file, then write new text in
its style.

    python train_charlm.py                 # learns from this project's own source and README
    python train_charlm.py my.txt          # learns from your text; the run goes to out_my/
    python train_charlm.py my.txt --model lstm   # an LSTM instead of the GPT (or --model gru)
    python train_charlm.py my.txt --resume # continues from out_my/ckpt.npz exactly where it stopped
    python train_charlm.py my.txt --sample # writes text in its style (or --sample --out-dir out_my)
    python train_charlm.py --sample --prompt "def " --length 300
    python train_charlm.py --help

Ctrl-C stops after the current step and saves a checkpoint (--resume continues it).
"""
import argparse
import csv
import glob
import io
import math
import os
import reprlib
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

if __name__ == '__main__':  # OpenBLAS reads it once, as NumPy loads it (see tt.tune)
    os.environ.setdefault('OPENBLAS_THREAD_TIMEOUT', '16')
import tinytorch as tt  # noqa: E402
import numpy as np

import lookinside
from files import NotARegularFile, atomic_write, open_regular
import nn
import optim
import tokens
from transformer import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = ['README.md', 'docs/*.md', 'tinytorch.py', 'nn.py', 'optim.py', 'transformer.py',
                  'train_linear.py', 'train_charlm.py']
MODELS = ('gpt', 'lstm', 'gru')
MODEL_FLAGS = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.1)
# the run's training settings: saved in its checkpoints, so --resume continues with them
RUN_FLAGS = dict(steps=5000, batch_size=12, lr=1e-3, min_lr=1e-4, warmup=100, weight_decay=0.1,
                 grad_clip=1.0, seed=1337, eval_interval=250, eval_iters=20)
CKPT_NAME, BEST_NAME, METRICS_NAME = 'ckpt.npz', 'best.npz', 'metrics.csv'


class UserError(Exception):
    """Bad input: printed as one clear line, exit status 2, no traceback."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a character-level GPT (or LSTM, or GRU) on "
                                "a text file.")
    p.add_argument('file', nargs='?', help="UTF-8 text file to learn from (default: this "
                   "project's own README and source)")
    g = p.add_argument_group('model (taken from the checkpoint when resuming or sampling)')
    g.add_argument('--model', choices=MODELS,
                   help="gpt (default): a Transformer. lstm or gru: an embedding of --n-embd, "
                        "--n-layer recurrent layers (nn.LSTM / nn.GRU) of --n-embd hidden units "
                        "each, dropout, a linear head; it trains on windows of --block-size "
                        "characters and samples with no length limit; --n-head is GPT-only")
    g.add_argument('--n-layer', type=int, help=f"Transformer blocks, or recurrent layers "
                   f"(default {MODEL_FLAGS['n_layer']})")
    g.add_argument('--n-head', type=int, help=f"attention heads, GPT only (default "
                   f"{MODEL_FLAGS['n_head']})")
    g.add_argument('--n-embd', type=int, help=f"embedding width, and the recurrent layers' "
                   f"hidden units (default {MODEL_FLAGS['n_embd']})")
    g.add_argument('--block-size', type=int,
                   help=f"context length in characters; for lstm and gru, the training window "
                        f"(default {MODEL_FLAGS['block_size']})")
    g.add_argument('--tokenizer', choices=('char', 'bpe'),
                   help="char (default): one token per character. bpe: byte-level BPE learned "
                        "from the text (tokens.py), its merges saved as OUT_DIR/merges.txt")
    g.add_argument('--vocab-size', type=int,
                   help="with --tokenizer bpe: the vocabulary, 256 bytes + the merges "
                        "(default 512)")
    g.add_argument('--dropout', type=float,
                   help=f"dropout rate (default {MODEL_FLAGS['dropout']})")
    t = p.add_argument_group("training (when resuming: the run's own, unless given)")
    t.add_argument('--steps', type=int,
                   help="total optimizer steps (default 5000; the progress line shows the "
                        "time left)")
    t.add_argument('--batch-size', type=int, help="windows per step (default 12)")
    t.add_argument('--lr', type=float, help="peak learning rate (default 1e-3)")
    t.add_argument('--min-lr', type=float, help="final learning rate (default 1e-4)")
    t.add_argument('--warmup', type=int, help="linear warmup steps (default 100)")
    t.add_argument('--weight-decay', type=float, help="AdamW weight decay (default 0.1)")
    t.add_argument('--grad-clip', type=float, help="max gradient norm (default 1.0)")
    t.add_argument('--seed', type=int, help="random seed (default 1337)")
    t.add_argument('--eval-interval', type=int,
                   help="validate and save a checkpoint every N steps (default 250)")
    t.add_argument('--eval-iters', type=int,
                   help="validation batches, fixed for the whole run (default 20)")
    t.add_argument('--out-dir', help="checkpoint and metrics folder (default out; with a FILE "
                   "such as my.txt, out_my)")
    t.add_argument('--resume', action='store_true', help="continue from OUT_DIR/ckpt.npz")
    t.add_argument('--force', action='store_true',
                   help="start a new run in an OUT_DIR that holds another run, replacing it "
                        "at the new run's first checkpoint (without it, such a run is refused "
                        "and left intact)")
    t.add_argument('--stop-after', type=int, default=None,
                   help="stop after this many steps in this run (as if interrupted), saving a "
                        "checkpoint; --resume continues it")
    t.add_argument('--checkpoint-blocks', action='store_true',
                   help="activation checkpointing (torch.utils.checkpoint): each Transformer "
                        "block keeps only its output for backward and runs its forward again "
                        "there: less memory, more time, the same numbers (GPT only)")
    t.add_argument('--amp', action='store_true',
                   help="mixed precision, as PyTorch's on a CPU: the forward pass under "
                        "torch.autocast('cpu', dtype=torch.float16) (matmuls in float16, the "
                        "loss in float32), the loss scaled by torch.amp.GradScaler (a step whose "
                        "gradients overflow is skipped); GPT only")
    t.add_argument('--profile', action='store_true',
                   help="print where the time, FLOPs and memory of one training step of the "
                        "configured model go (lookinside.profile), then exit; nothing is written")
    t.add_argument('--plot', action='store_true',
                   help="save OUT_DIR/loss.png from the metrics (needs matplotlib); on an OUT_DIR "
                        "that holds a run, without --resume, it only draws that run")
    s = p.add_argument_group('sampling')
    s.add_argument('--sample', action='store_true',
                   help="only generate text, from the run's best checkpoint (OUT_DIR/best.npz), "
                        "no training")
    s.add_argument('--latest', action='store_true',
                   help="with --sample: use the latest checkpoint (OUT_DIR/ckpt.npz) instead")
    s.add_argument('--prompt', default=None, help="text to start from (default a newline)")
    s.add_argument('--length', type=int, default=500, help="characters to generate (default 500)")
    s.add_argument('--temperature', type=float, default=0.8,
                   help="sampling temperature; 0 = always the likeliest (default 0.8)")
    s.add_argument('--top-k', type=int, default=None, help="sample among the k likeliest only")
    args = p.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = default_out_dir(args.file)
    check_flags(args)
    return args


def default_out_dir(file):
    """out for this project's own text; out_NAME for a FILE NAME.txt, so that each text's run
    has its own folder (a run on my.txt does not stop at the run the first command made)."""
    if not file:
        return 'out'
    name = os.path.splitext(os.path.basename(os.path.normpath(file)))[0]
    return 'out_' + (name or 'text')


# Each setting's rule, written once: the command line's flags and the settings a file brings
# back (a checkpoint's config and training settings, export.py's config.json) are checked by
# it, in the same words.
AT_LEAST_1 = (lambda v: v >= 1, "it must be at least 1")
AT_LEAST_0 = (lambda v: v >= 0, "it must be 0 or more")
MORE_THAN_0 = (lambda v: v > 0, "it must be more than 0")
SETTING_RULES = {  # name: (int or float, (test, what the test asks))
    'steps': (int, AT_LEAST_1), 'batch_size': (int, AT_LEAST_1),
    'eval_interval': (int, AT_LEAST_1), 'eval_iters': (int, AT_LEAST_1),
    'n_layer': (int, AT_LEAST_1), 'n_head': (int, AT_LEAST_1), 'n_embd': (int, AT_LEAST_1),
    'block_size': (int, AT_LEAST_1), 'stop_after': (int, AT_LEAST_1), 'top_k': (int, AT_LEAST_1),
    'vocab_size': (int, AT_LEAST_1),  # no flag: from a checkpoint or export.py's config.json
    'length': (int, AT_LEAST_0), 'warmup': (int, AT_LEAST_0), 'seed': (int, AT_LEAST_0),
    'min_lr': (float, AT_LEAST_0), 'weight_decay': (float, AT_LEAST_0),
    'temperature': (float, (lambda v: v >= 0,
                            "it must be 0 or more (0 = always the likeliest character)")),
    'lr': (float, MORE_THAN_0), 'grad_clip': (float, MORE_THAN_0),
    'dropout': (float, (lambda v: 0 <= v < 1, "it must be in [0, 1)")),
}


def setting_problem(name, value):
    """None when value is a valid --NAME, else what is wrong, in the words that follow the
    value in an error line: 'is out of range: it must be at least 1'. A bool is no number
    (True would pass as 1)."""
    kind, (test, rule) = SETTING_RULES[name]
    numbers = (int, np.integer) if kind is int else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, numbers):
        return f"is not {'a whole number' if kind is int else 'a number'}"
    return None if test(value) else f"is out of range: {rule}"


def heads_problem(n_embd, n_head):
    """None when n_embd splits into n_head heads, else what is wrong (after the values)."""
    if n_embd % n_head == 0:
        return None
    return (f"is not a multiple of --n-head {n_head}: each head gets n_embd / n_head channels "
            f"(try --n-embd {n_embd - n_embd % n_head or n_head})")


def flag(name):
    return '--' + name.replace('_', '-')


def check_flags(args):
    """Every flag's value in its range, before any work: one UserError line that names the
    flag, the value and what is allowed."""
    for name, value in vars(args).items():
        problem = setting_problem(name, value) if name in SETTING_RULES and value is not None \
            else None
        if problem:
            raise UserError(f"{flag(name)} {value} {problem}")
    if args.n_head is not None and args.model in ('lstm', 'gru'):
        raise UserError(f"--n-head is for --model gpt only: --model {args.model} is a recurrent "
                        "network, with no attention heads")
    if args.vocab_size is not None and args.vocab_size < 256:
        raise UserError(f"--vocab-size {args.vocab_size} is out of range: byte-level BPE has 256 "
                        "byte tokens before its first merge; use 256 or more")
    if args.vocab_size is not None and args.tokenizer != 'bpe':
        raise UserError("--vocab-size is the BPE vocabulary: give it with --tokenizer bpe")
    if args.checkpoint_blocks and args.model in ('lstm', 'gru'):
        raise UserError(f"--checkpoint-blocks is for --model gpt only: --model {args.model} has "
                        "no Transformer blocks")
    if args.amp and args.model in ('lstm', 'gru'):
        raise UserError(f"--amp is for --model gpt only: --model {args.model}'s recurrent "
                        "layers have no float16 path")
    if not (args.resume or args.sample or args.model in ('lstm', 'gru')):
        # a new GPT: its widths must split into heads
        n_embd = args.n_embd or MODEL_FLAGS['n_embd']
        n_head = args.n_head or MODEL_FLAGS['n_head']
        problem = heads_problem(n_embd, n_head)
        if problem:
            raise UserError(f"--n-embd {n_embd} {problem}")


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------
def read_text(path):
    """Read a UTF-8 file; every way this can fail becomes one clear UserError."""
    if not os.path.exists(path):
        raise UserError(f"file not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not a text file")
    try:
        with open(path, 'rb') as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}); convert it, e.g. with iconv -t UTF-8") from None
    if not text:
        raise UserError(f"{path} is empty: there is nothing to learn from")
    return text


def default_corpus():
    """This project's own text: the README and its pages in docs/ (English), then the source."""
    parts = []
    for pattern in DEFAULT_CORPUS:
        for path in sorted(glob.glob(os.path.join(HERE, pattern))):
            name = os.path.relpath(path, HERE).replace(os.sep, '/')
            parts.append(f"# ===== {name} =====\n" + read_text(path))
    return '\n'.join(parts)


MANY_PASSES = 20  # more reads of the training text than this: it is learned by heart


def small_text_note(n_train, steps, batch_size, block_size):
    """None, or a note for a run that reads its training text many times over: a text small
    for the steps is learned by heart (the validation loss turns up, the sample repeats the
    text). It suggests the --steps that read it about 10 times."""
    passes = steps * batch_size * block_size / max(n_train, 1)
    if passes <= MANY_PASSES:
        return None
    fit = 10 * n_train / (batch_size * block_size)
    fit = max(10, int(float(f"{fit:.2g}")))  # two significant digits: --steps 230
    return (f"note: the text is small for this run: {steps} steps of {batch_size} x "
            f"{block_size} characters read its {n_train:,} training characters about "
            f"{passes:.0f} times, so the model will learn it by heart (the validation loss "
            f"turns up, the sample repeats the text; best.npz keeps the best model). --steps "
            f"{fit} reads it about 10 times; a longer text (1 MB or more) is better still")


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def _codepoints(text):
    return np.frombuffer(text.encode('utf-32-le'), dtype=np.uint32)


class Vocab:
    """Characters <-> integer ids, the ids in sorted order of the characters."""

    def __init__(self, chars):
        self.chars = ''.join(sorted(set(chars)))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.codes = _codepoints(self.chars)  # sorted, so searchsorted finds each id
        self.size = len(self.chars)

    def encode(self, text):
        missing = sorted(set(text) - set(self.index))
        if missing:
            raise UserError(f"these characters are not in the model's vocabulary: "
                            f"{''.join(missing)!r}")
        return np.searchsorted(self.codes, _codepoints(text)).astype(np.int64)

    def decode(self, ids):
        return ''.join(self.chars[i] for i in ids)


class BPEVocab:
    """--tokenizer bpe: tokens.BPE behind Vocab's interface. `chars` is what the checkpoint
    keeps of it (the merges); every text can be encoded (bytes)."""

    def __init__(self, bpe):
        self.bpe, self.size = bpe, bpe.vocab_size
        self.chars = {'bpe_merges': [list(m) for m in bpe.merges]}
        self.index = {'\n': 10}  # sample_text's default prompt, a newline, is byte 10

    def encode(self, text):
        return self.bpe.encode(text)

    def decode(self, ids):
        return self.bpe.decode(ids)


def make_vocab(args, text, saved=None):
    """The run's tokens: the checkpoint's BPE (saved: its 'vocab'), a BPE learned from the
    text (--tokenizer bpe), or the text's characters."""
    if isinstance(saved, dict):
        return BPEVocab(tokens.BPE(saved['bpe_merges']))
    if saved is None and getattr(args, 'tokenizer', None) == 'bpe':
        return BPEVocab(tokens.BPE.train(text, args.vocab_size or 512))
    return Vocab(text if saved is None else saved)


def split_data(data, block_size):
    """90/10 train/validation split; each part must hold at least one window."""
    need = block_size + 1
    if len(data) < need:
        raise UserError(f"the text has {plural(len(data), 'character')}, fewer than one block "
                        f"plus one ({need}); use a longer file or a smaller --block-size")
    n = int(0.9 * len(data))
    if n < need or len(data) - n < need:
        print(f"note: the text is too short for a 90/10 split with block size {block_size}; "
              "validating on the training text", file=sys.stderr)
        return data, data
    return data[:n], data[n:]


def get_batch(data, block_size, batch_size, rng):
    """batch_size random windows; y is x shifted by one character (the next-char targets)."""
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    offsets = np.arange(block_size)
    x = data[starts[:, None] + offsets]
    y = data[starts[:, None] + offsets + 1]
    return tt.tensor(x), tt.tensor(y)


# ---------------------------------------------------------------------------
# The recurrent models (--model lstm, gru); the GPT is transformer.py's
# ---------------------------------------------------------------------------
@dataclass
class RNNConfig:
    kind: str = 'lstm'    # or 'gru'
    vocab_size: int = 65
    block_size: int = 64  # the training window: backpropagation through this many steps
    n_layer: int = 4
    n_embd: int = 128     # the embedding width and every layer's hidden units
    dropout: float = 0.0

    def to_dict(self):
        return asdict(self)


class CharRNN(nn.Module):
    """Embedding -> LSTM or GRU (n_layer layers of n_embd units) -> dropout -> linear head.
    Called as the GPT is: model(idx, targets) -> (logits, loss)."""

    def __init__(self, config):
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        layers = nn.LSTM if config.kind == 'lstm' else nn.GRU
        self.rnn = layers(config.n_embd, config.n_embd, num_layers=config.n_layer,
                          batch_first=True, dropout=config.dropout if config.n_layer > 1 else 0.0)
        self.drop = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)

    def run(self, idx, state=None):
        """idx (B, T) -> logits (B, T, vocab) and the recurrent state after the last step."""
        out, state = self.rnn(self.drop(self.wte(idx)), state)
        return self.lm_head(self.drop(out)), state

    def forward(self, idx, targets=None):
        idx = idx if isinstance(idx, tt.Tensor) else tt.tensor(idx)
        logits, _ = self.run(idx)  # every window starts from a zero state
        loss = None
        if targets is not None:
            B, T = idx.shape
            targets = targets if isinstance(targets, tt.Tensor) else tt.tensor(targets)
            loss = nn.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    @tt.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Extend idx (B, T) by max_new_tokens characters: the prompt is read once, then
        each new character is one step of the network, which carries its state (the whole
        past, with no window)."""
        idx = idx if isinstance(idx, tt.Tensor) else tt.tensor(idx)
        was_training = self.training
        self.eval()
        ids = idx.array
        logits, state = self.run(idx)
        for _ in range(max_new_tokens):
            nxt = pick_next(logits.array[:, -1, :], temperature, top_k).astype(ids.dtype)
            ids = np.concatenate([ids, nxt], axis=1)
            logits, state = self.run(tt.tensor(nxt), state)
        self.train(was_training)
        return tt.tensor(ids)


def pick_next(logits, temperature, top_k):
    """The next token for each row of logits (B, vocab), as GPT.generate picks it:
    temperature 0 is the likeliest; else sampled, among the top_k likeliest if given."""
    if temperature == 0:
        return np.argmax(logits, axis=-1)[:, None]
    logits = logits / temperature
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[:, [-min(top_k, logits.shape[-1])]]
        logits = np.where(logits < kth, -np.inf, logits)
    return tt.multinomial(tt.softmax(tt.tensor(logits), -1), num_samples=1).array


def make_model(config):
    return GPT(config) if isinstance(config, GPTConfig) else CharRNN(config)


def checkpoint_blocks(model):
    """--checkpoint-blocks: each block of the GPT runs under torch.utils.checkpoint (tinytorch's
    checkpoint: the block's forward keeps nothing, backward runs it again); generation (with
    a cache, or under no_grad) runs the blocks as they are."""
    if not isinstance(model, GPT):
        raise UserError("--checkpoint-blocks is for a GPT: this run's model is a recurrent "
                        "network, with no Transformer blocks")
    for block in model.h:
        def forward(x, cache=None, layer=0, plain=block.forward):
            if cache is not None or not tt.is_grad_enabled():
                return plain(x, cache, layer)
            return tt.utils.checkpoint.checkpoint(plain, x, use_reentrant=False)
        object.__setattr__(block, 'forward', forward)  # this model's blocks only
    return model


def describe(config):
    """The model in a few words, for the first lines of a run and --profile."""
    if isinstance(config, GPTConfig):
        return (f"{plural(config.n_layer, 'layer')}, {config.n_head} heads, {config.n_embd} wide, block "
                f"{config.block_size}")
    return (f"{config.kind.upper()}, {plural(config.n_layer, 'layer')} of {config.n_embd} units, block "
            f"{config.block_size}")


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
def checkpoint_path(out_dir, name=CKPT_NAME):
    return os.path.join(out_dir, name)


def prepare_out_dir(out_dir):
    """The folder exists and takes a new file (a probe of a fresh name, made with O_EXCL: a
    link planted in the folder is never followed); a leftover temporary that is not a
    regular file (a FIFO would block a save forever) is refused before any work."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix='.write-test', dir=out_dir)
        os.close(fd)
        os.remove(probe)
        for name in os.listdir(out_dir):
            path = os.path.join(out_dir, name)
            if name.startswith('.') and name.endswith('.tmp') and not stat.S_ISREG(os.lstat(path).st_mode):
                what = 'a link' if os.path.islink(path) else 'a FIFO' if stat.S_ISFIFO(
                    os.lstat(path).st_mode) else 'a folder, device or socket'
                raise UserError(f"{path} is a leftover temporary that is not a regular file "
                                f"({what}); remove it to save")
    except OSError as e:
        raise UserError(f"cannot write to the output folder {out_dir}: "
                        f"{e.strerror or e}") from None


def load_checkpoint(out_dir, name=CKPT_NAME):
    path = checkpoint_path(out_dir, name)
    if os.path.islink(path):
        raise UserError(f"{path} is a link, which a run folder's files never are; move it aside")
    if not os.path.exists(path):
        raise UserError(f"no checkpoint at {path}; train first (or give --out-dir)")
    return read_checkpoint(path)


def read_checkpoint(path, keys=('model', 'config', 'vocab', 'step')):
    """The checkpoint at path (it exists), with the keys asked for; anything else is one
    UserError line. export.py reads checkpoints with it too."""
    try:
        ck = nn.load(path)
    except nn.CheckpointError as e:
        raise UserError(str(e)) from None
    if not isinstance(ck, dict):
        raise UserError(f"{path} is not a train_charlm.py checkpoint (it holds a "
                        f"{type(ck).__name__}, not a dict of the run's parts)")
    missing = [k for k in keys if k not in ck]
    if missing:
        raise UserError(f"{path} is not a train_charlm.py checkpoint (no {', '.join(missing)})")
    check_checkpoint(ck, path)
    return ck


NOT_OURS = "the file is damaged or was not written by train_charlm.py"
WHOLE = (int, np.integer)  # a whole number, as a file's loader may give it back
NUMBER = (int, float, np.integer, np.floating)


SHORT = reprlib.Repr()
SHORT.maxlevel = 1  # [{...}]: a list of dicts shown one level deep


def show(value):
    """A value from a file, shown short (a file may hold a string of a million characters)."""
    if isinstance(value, (np.ndarray, tt.Tensor)):
        return f"an array {tuple(value.shape)} of {value.dtype}"
    return SHORT.repr(value)


def check_checkpoint(ck, path, tail=NOT_OURS):
    """Every part of a checkpoint that the run reads, checked before any work: the model's
    config and the training settings as their flags are checked (setting_problem), the
    config against the shapes of the weights it comes with (a config that says n_embd 8192
    beside weights 16 wide would build a model of gigabytes first), the vocabulary, the
    step, the best validation, the metrics rows and the random state. Anything else is
    one UserError line that names the file, the part and what is wrong, then tail."""
    def bad(what):
        raise UserError(f"{path}: {what}; {tail}")

    kinds = {'model': (dict, "a dict of weights"), 'config': (dict, "a dict of model settings"),
             'settings': (dict, "a dict of training settings"), 'vocab': ((str, dict), "a string "
             "of characters or a BPE's merges"), 'best': (dict, "a dict"), 'optimizer': (dict, "a dict"),
             'rng': (dict, "a dict"), 'metrics_rows': (list, "a list of rows"),
             'source': (str, "a string")}
    for key, (kind, words) in kinds.items():
        if key in ck and not isinstance(ck[key], kind):
            bad(f"its {key!r} is {show(ck[key])}, not {words}")
    for key, lowest in (('step', 0), ('schedule_steps', 1)):
        value = ck.get(key, lowest)
        if isinstance(value, bool) or not isinstance(value, WHOLE) or value < lowest:
            bad(f"its {key} is {show(value)}, not a whole number {lowest} or more")
    for name, value in ck.get('settings', {}).items():
        problem = setting_problem(name, value) if name in RUN_FLAGS else None
        if problem:
            bad(f"its setting {flag(name)} {show(value)} {problem}")
    weights = ck.get('model', {})
    for name, a in weights.items():
        if not isinstance(name, str) or not isinstance(a, (np.ndarray, tt.Tensor)):
            bad(f"its weights hold {show(name)}: {show(a)}, not a name and an array")
        a = a.array if isinstance(a, tt.Tensor) else a
        if a.dtype.kind != 'f':
            bad(f"its weights {name} are {a.dtype}, not floats")
        if not np.isfinite(a).all():
            bad(f"its weights {name} hold NaN or inf")
    if 'config' in ck:
        check_config(ck['config'], weights, path, tail)
    vocab = ck.get('vocab')
    if isinstance(vocab, dict):  # --tokenizer bpe: merge i makes token 256 + i of two before it
        merges = vocab.get('bpe_merges')
        if set(vocab) != {'bpe_merges'} or not isinstance(merges, list) or not all(
                isinstance(m, (list, tuple)) and len(m) == 2 and all(
                    isinstance(t, WHOLE) and not isinstance(t, bool) and 0 <= t < 256 + i
                    for t in m) for i, m in enumerate(merges)):
            bad(f"its vocab {show(vocab)} is not a BPE's merges (pairs of earlier tokens)")
        try:
            tokens.expanded_bytes(merges)
        except ValueError as e:
            bad(f"its BPE's {e}")
        size = ck.get('config', {}).get('vocab_size', 256 + len(merges))
        if size != 256 + len(merges):
            bad(f"its BPE has {256 + len(merges):,} tokens, its config says vocab_size "
                f"{show(size)}")
    elif vocab is not None:
        if not vocab or vocab != ''.join(sorted(set(vocab))):
            bad(f"its vocab {show(vocab)} is not its characters in sorted order, each once")
        size = ck.get('config', {}).get('vocab_size', len(vocab))
        if size != len(vocab):
            bad(f"its vocab has {plural(len(vocab), 'character')}, its config says vocab_size "
                f"{show(size)}")
    best = ck.get('best', {})
    if not isinstance(best.get('step', 0), WHOLE) or isinstance(best.get('step'), bool) or \
            not 0 <= best.get('step', 0) <= ck.get('step', 0):
        bad(f"its best step {show(best['step'])} is not a whole number from 0 to its step")
    if not isinstance(best.get('val_loss', 0.0), NUMBER) or isinstance(best.get('val_loss'), bool) \
            or not best.get('val_loss', 0.0) >= 0:
        bad(f"its best val_loss {show(best['val_loss'])} is not a loss (a number, 0 or more)")
    for row in ck.get('metrics_rows', []):
        if not (isinstance(row, (list, tuple)) and len(row) in (5, len(METRICS_COLUMNS))
                and isinstance(row[0], WHOLE) and not isinstance(row[0], bool)
                and 1 <= row[0] <= ck.get('step', 0)
                and all(isinstance(v, NUMBER) or isinstance(v, str) and len(v) <= 40
                        and v.isprintable() for v in row[1:])):
            bad(f"its metrics row {show(row)} is not a row of metrics.csv (a step from 1 to its "
                f"step, then {len(METRICS_COLUMNS) - 1} numbers or empty fields)")
    if 'rng' in ck:
        try:  # NumPy's own check of a generator's state, on a generator of its own
            np.random.PCG64().state = ck['rng']
        except (TypeError, ValueError, KeyError, OverflowError):
            bad(f"its rng {show(ck['rng'])} is not a NumPy PCG64 random state")


def check_config(config, weights, path, tail=NOT_OURS):
    """A checkpoint's model config: its kind, its settings as --n-layer, --n-head, --n-embd,
    --block-size and --dropout are checked, and agreeing with the weights beside it: the
    token embedding (vocab_size, n_embd), a GPT's position embedding (block_size, n_embd),
    one layer of weights per n_layer."""
    def bad(what):
        raise UserError(f"{path}: {what}; {tail}")
    kind = config.get('kind', 'gpt')
    if kind not in MODELS:
        bad(f"its config says kind {show(kind)}, not one of {', '.join(MODELS)}")
    fields = (GPTConfig if kind == 'gpt' else RNNConfig).__dataclass_fields__
    unknown = [k for k in config if k not in fields]
    if unknown:
        bad(f"its config has {show(unknown[0])}, which a {kind.upper()}'s config has not")
    for name in MODEL_FLAGS:
        problem = setting_problem(name, config[name]) if name in config else None
        if problem:
            bad(f"its config's {flag(name)} {show(config[name])} {problem}")
    for name in ('bias', 'tie_weights'):
        if not isinstance(config.get(name, True), bool):
            bad(f"its config's {name} is {show(config[name])}, not true or false")
    if 'vocab_size' in config and setting_problem('vocab_size', config['vocab_size']):
        bad(f"its config's vocab_size {show(config['vocab_size'])} "
            f"{setting_problem('vocab_size', config['vocab_size'])}")
    c = (GPTConfig if kind == 'gpt' else RNNConfig)(**config)
    if kind == 'gpt' and heads_problem(c.n_embd, c.n_head):
        bad(f"its config's --n-embd {c.n_embd} {heads_problem(c.n_embd, c.n_head)}")
    # the shapes the config implies, against the weights in the file
    want = {'wte.weight': ((c.vocab_size, c.n_embd), f"vocab_size {c.vocab_size} and n_embd "
                                                      f"{c.n_embd}")}
    if kind == 'gpt':
        want['wpe.weight'] = ((c.block_size, c.n_embd), f"block_size {c.block_size} and n_embd "
                                                        f"{c.n_embd}")
        layers = {k.split('.')[1] for k in weights if k.startswith('h.')}
    else:
        layers = {k.rsplit('_l', 1)[1] for k in weights if k.startswith('rnn.weight_ih_l')}
    for name, (shape, says) in want.items():
        if name in weights and tuple(np.shape(weights[name])) != shape:
            bad(f"its config says {says}, but its weights {name} have shape "
                f"{tuple(np.shape(weights[name]))}")
    if layers and layers != {str(i) for i in range(c.n_layer)}:
        bad(f"its config says n_layer {c.n_layer}, its weights hold {plural(len(layers), 'layer')}")


def build_config(args, vocab_size, saved=None):
    """The model's config: from the flags, or from the checkpoint when there is one (its
    'kind' says lstm or gru; a GPT's has none). A model flag given explicitly must agree
    with the checkpoint."""
    if saved is None:
        values = {k: (getattr(args, k) if getattr(args, k) is not None else v)
                  for k, v in MODEL_FLAGS.items()}
        if args.model in (None, 'gpt'):
            return GPTConfig(vocab_size=vocab_size, **values)
        del values['n_head']
        return RNNConfig(kind=args.model, vocab_size=vocab_size, **values)
    kind = saved.get('kind', 'gpt')
    config = GPTConfig(**saved) if kind == 'gpt' else RNNConfig(**saved)
    clashes = [f"--model {args.model} (checkpoint has {kind})"] \
        if args.model is not None and args.model != kind else []
    clashes += [f"--{k.replace('_', '-')} {getattr(args, k)} (checkpoint has "
                f"{saved.get(k, 'none')})" for k in MODEL_FLAGS
                if getattr(args, k) is not None and getattr(args, k) != saved.get(k)]
    if clashes:
        raise UserError("the checkpoint does not match the requested model: " + ", ".join(clashes))
    return config


def settle_settings(args, saved=None):
    """The run's training settings (RUN_FLAGS) into args: a flag given on the command
    line, else the run's own (from its checkpoint, when resuming), else the default. A
    flag given on resume that differs from the run's replaces it, with one line that
    says so."""
    saved = saved or {}
    replaced = []
    for name, default in RUN_FLAGS.items():
        given, before = getattr(args, name), saved.get(name)
        if given is None:
            setattr(args, name, default if before is None else before)
        elif before is not None and given != before:
            replaced.append((f"--{name.replace('_', '-')} {given:g}", f"{before:g}"))
    if replaced:
        flags, values = zip(*replaced)
        print(f"note: on resume, {and_list(flags)} replace{'s' if len(flags) == 1 else ''} the "
              f"run's {and_list(values)}; its other settings continue as they were")


def and_list(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def restore_model(ck, config):
    model = make_model(config)
    try:
        model.load_state_dict(ck['model'])
    except KeyError as e:  # nn.StateDictError: its problems one per line, here one line
        raise UserError("the checkpoint does not match the model: "
                        + "; ".join(str(e.args[0]).split('\n\t'))) from None
    return model


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
@tt.no_grad()
def evaluate(model, batches):
    model.eval()
    losses = [model(x, y)[1].item() for x, y in batches]
    model.train()
    return float(np.mean(losses))


def sample_text(model, vocab, prompt, length, temperature, top_k):
    if prompt is None:
        prompt = '\n' if '\n' in vocab.index else vocab.chars[0]
    if not prompt:
        raise UserError("--prompt must not be empty")
    ids = vocab.encode(prompt)[None, :]
    out = model.generate(ids, length, temperature=temperature, top_k=top_k)
    return vocab.decode(out.array[0].tolist())


def fmt_time(seconds):
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """The status line. On a terminal it refreshes in place at every step and stays, as
    a line of its own, at each validation. Into a file or a pipe it is a line at the
    first step, then every 30 seconds and at each validation. When the reader of a pipe
    has gone (`train_charlm.py | head -3`), `closed` turns True and output stops."""

    def __init__(self):
        self.tty = sys.stdout.isatty()
        self.width = 0
        self.last_line = None  # when the last line went into a file or pipe
        self.closed = False

    def show(self, text, final=False):
        if self.tty:
            pad = ' ' * max(0, self.width - len(text))
            self.width = 0 if final else len(text)
            self.write('\r' + text + pad + ('\n' if final else ''))
        elif final or self.last_line is None or time.time() - self.last_line >= 30:
            self.last_line = time.time()
            self.write(text + '\n')

    def clear(self):
        if self.tty and self.width:
            self.write('\r' + ' ' * self.width + '\r')
            self.width = 0

    def write(self, text):
        if self.closed:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            self.closed = True
            silence_stdout()


def silence_stdout():
    """Point standard output at /dev/null: what is still to be printed goes nowhere,
    instead of failing again on the closed pipe when Python exits."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def need_matplotlib(metrics_file):
    """--plot is checked before any training: a missing matplotlib is one line, exit 2."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib (pip install matplotlib); nothing was trained "
                        f"or drawn (the metrics are in {metrics_file})") from None


def plot_metrics(metrics_file, png_path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    header, rows, _ = read_metrics(metrics_file)
    rows = [dict(zip(header, r + [''] * (len(header) - len(r)))) for r in rows]
    steps = [int(r['step']) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [float(r['train_loss']) for r in rows], label='train')
    val = [(int(r['step']), float(r['val_loss'])) for r in rows if r['val_loss']]
    if val:
        ax.plot(*zip(*val), 'o-', label='validation')
    ax.set_xlabel('step')
    ax.set_ylabel('loss (nats per character)')
    ax.legend()
    fig.tight_layout()
    atomic_write(png_path, lambda f: fig.savefig(f, format='png'))  # a link there: replaced
    print(f"loss curve saved to {png_path}"
          + ("" if val else " (no validation loss yet: the run stopped before its first evaluation)"))


def plot_only(args):
    """--plot on a folder that holds a run: draw its curves, train nothing."""
    metrics_file = os.path.join(args.out_dir, METRICS_NAME)
    need_matplotlib(metrics_file)
    if not os.path.exists(metrics_file):
        raise UserError(f"{args.out_dir} holds a checkpoint but no {METRICS_NAME} to plot")
    ck = load_checkpoint(args.out_dir)
    print(f"drawing the run in {args.out_dir} ({plural(int(ck['step']), 'step')}); nothing is "
          "trained")
    plot_metrics(metrics_file, os.path.join(args.out_dir, 'loss.png'))
    return 0


def refuse_to_overwrite(out_dir):
    """A new run never replaces a finished one by accident: say what the folder holds and
    what to do instead."""
    path = checkpoint_path(out_dir)
    if not os.path.exists(path):
        return
    try:
        ck = nn.load(path)
        held = plural(int(ck['step']), 'step')
        if ck.get('best', {}).get('step'):  # the best validation, which each checkpoint keeps
            held += f", best validation loss {ck['best']['val_loss']:.4f}"
    except (nn.CheckpointError, KeyError, TypeError, ValueError, AttributeError):
        held = "a checkpoint"
    raise UserError(f"{out_dir} already holds a run ({held}); add --resume to continue it, "
                    f"give another --out-dir to keep it, or --force to replace it")


def read_corpus(args):
    """The text to learn from, and a name for it: FILE, or this project's own files."""
    if args.file:
        return read_text(args.file), args.file
    return default_corpus(), "this project's own source and README"


def make_optimizer(model, args):
    """AdamW with weight decay on the matrices (embeddings included, as in nanoGPT), not
    on biases and LayerNorm gains."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return optim.AdamW([{'params': decay, 'weight_decay': args.weight_decay},
                        {'params': no_decay, 'weight_decay': 0.0}],
                       lr=args.lr, betas=(0.9, 0.99))


METRICS_COLUMNS = ['step', 'train_loss', 'val_loss', 'lr', 'tokens_per_sec', 'grad_norm',
                   'update_ratio']


LEFT_AS_IT_IS = "it is left as it is: move it aside to continue the run without it"


def read_metrics(path):
    """metrics.csv read strictly, before anything is written: (header, rows, torn). UTF-8;
    the header metrics.csv's own (or the five columns of an older version); each row a
    step (a whole number) then numbers or empty fields. A last line without its newline (a
    kill while it was written) is left out of the rows, and torn says so. Anything else is
    one UserError line, and the file is not touched."""
    try:
        with open_regular(path, follow=False) as f:
            raw = f.read()
    except NotARegularFile as e:
        raise UserError(str(e)) from None
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}); {LEFT_AS_IT_IS}") from None
    lines = text.splitlines(keepends=True)
    torn = bool(lines) and not lines[-1].endswith('\n')
    if torn:
        lines.pop()  # the kill came while this line was written
    reader = csv.reader(lines)
    try:
        rows = list(reader)
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num} is not CSV ({e}); "
                        f"{LEFT_AS_IT_IS}") from None
    header, rows = (rows[0], rows[1:]) if rows else (None, [])
    if header is not None and header not in (METRICS_COLUMNS, METRICS_COLUMNS[:5]):
        raise UserError(f"{path}: its first line {show(','.join(header))} is not metrics.csv's "
                        f"header ({','.join(METRICS_COLUMNS)}); {LEFT_AS_IT_IS}")
    for n, row in enumerate(rows, 2):
        if not (len(row) == len(header) and row[0].isascii() and row[0].isdigit()
                and len(row[0]) < 19 and is_number(row[1])
                and all(v == '' or is_number(v) for v in row[2:])):
            raise UserError(f"{path}: row {n} {show(','.join(row))} is not a row of metrics (a "
                            f"step, then numbers); {LEFT_AS_IT_IS}")
    return header, rows, torn


def is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return len(text) < 40


def write_metrics(path, header, rows):
    """metrics.csv rewritten whole or not at all (a kill midway leaves the old one)."""
    text = io.StringIO(newline='')
    csv.writer(text).writerows([header, *rows])
    atomic_write(path, lambda f: f.write(text.getvalue().encode('utf-8')))


def agree_metrics(path, ck):
    """After a kill, make metrics.csv tell the story of the checkpoint --resume continues:
    rows past its step and a half-written last line go, and the rows it holds that the
    kill kept from reaching metrics.csv are written (with the header, when the kill came
    before the first rows: no metrics.csv, or a torn header). A metrics.csv from before the
    health columns existed gets them, empty in its old rows."""
    header, rows, torn = read_metrics(path) if os.path.exists(path) else (None, [], False)
    step = int(ck['step'])
    keep = [r for r in rows if int(r[0]) <= step]
    last = int(keep[-1][0]) if keep else 0
    keep += [[str(v) for v in r] for r in ck.get('metrics_rows', []) if int(r[0]) > last]
    keep = [r + [''] * (len(METRICS_COLUMNS) - len(r)) for r in keep]
    if header != METRICS_COLUMNS or keep != rows or torn:
        write_metrics(path, METRICS_COLUMNS, keep)


class RunFiles:
    """What a run writes into OUT_DIR: metrics.csv, ckpt.npz, best.npz. The metrics rows
    wait in memory and are written with each checkpoint, so the two always tell the same
    story: the checkpoint first (each file written whole or not at all), holding the rows
    since the last one, then the rows in metrics.csv; after a kill between the two, --resume
    writes the rows the checkpoint holds (agree_metrics). A new run writes nothing before
    its first checkpoint; then it replaces the files of any run that was there (--force),
    so a new run stopped before that leaves the old one whole."""

    def __init__(self, out_dir, new_run):
        self.out_dir, self.new_run = out_dir, new_run
        self.metrics_file = os.path.join(out_dir, METRICS_NAME)
        self.rows = []  # metrics rows not yet written

    def save(self, checkpoint, best=False):
        if self.new_run:  # the first checkpoint of a new run: the old run's files go
            for name in (BEST_NAME, 'loss.png', METRICS_NAME):
                if os.path.exists(os.path.join(self.out_dir, name)):
                    os.remove(os.path.join(self.out_dir, name))
            self.new_run = False
        checkpoint['metrics_rows'] = self.rows
        if best:
            nn.save(checkpoint, checkpoint_path(self.out_dir, BEST_NAME))
        nn.save(checkpoint, checkpoint_path(self.out_dir))
        if not os.path.lexists(self.metrics_file):  # a new run's, or imported weights' first rows
            write_metrics(self.metrics_file, METRICS_COLUMNS, [])
        with append_only(self.metrics_file) as f:
            csv.writer(f).writerows(self.rows)
            f.flush()
            os.fsync(f.fileno())
        self.rows = []


def append_only(path):
    """path opened to append text, only if it is a regular file of the run folder (no link
    followed, no FIFO waited on); else one UserError line."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, 'O_NOFOLLOW', 0)
                     | getattr(os, 'O_NONBLOCK', 0))
    except OSError as e:
        raise UserError(f"cannot append to {path}: {e.strerror or e} (a link there is never "
                        "followed)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file; {LEFT_AS_IT_IS}")
    return os.fdopen(fd, 'a', newline='')


def update_ratio(before, params):
    """The median over the parameters of |change| / |weight| for one optimizer step: a
    health signal (around 1e-3 is healthy; much larger, the steps are too big)."""
    ratios = [np.linalg.norm(p.array - b) / (np.linalg.norm(b) + 1e-12)
              for b, p in zip(before, params)]
    return float(np.median(ratios))


def diagnose_nan(model, x, y, rng_state):
    """Run the step that went bad again under lookinside.detect_anomaly: which op made the NaN."""
    tt.set_rng_state(rng_state)  # the same dropout masks as the step that failed
    try:
        with np.errstate(all='ignore'), lookinside.detect_anomaly():
            _, loss = model(x, y)
            model.zero_grad()
            loss.backward()
    except lookinside.AnomalyError as e:
        return str(e)
    return "detect_anomaly found no NaN when the step ran again"


def step_memory(config, batch_size):
    """About how many bytes one training step needs (float32): per layer and window, the
    attention scores and probabilities kept for backward (n_head x block_size each, the
    term that grows with the square of the context) and the activations (about 24
    vectors of n_embd); the logits; the weights, gradients and AdamW's two moments. An
    LSTM or GRU keeps about 32 vectors of n_embd per layer and step as a loop of cells, and
    about 12 as nn's one-op layer (tt.fast, nn.py's Speed section); no scores."""
    B, T, C = batch_size, config.block_size, config.n_embd
    if isinstance(config, RNNConfig):
        kept = 12 if tt.fast else 32
        activations = 4 * B * T * (config.n_layer * kept * C + 4 * config.vocab_size)
        return activations + 16 * (config.n_layer * 8 * C * C + 2 * config.vocab_size * C)
    H = config.n_head
    activations = 4 * B * T * (config.n_layer * (4 * H * T + 24 * C) + 4 * config.vocab_size)
    weights = 16 * (config.n_layer * 12 * C * C + (config.vocab_size + T) * C)
    return activations + weights


def available_memory():
    """Bytes of memory available now (Linux's MemAvailable), or None when unknown."""
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (ValueError, OSError, AttributeError):
        return None


def fmt_bytes(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
        if n < 1024 or unit == 'TiB':
            break
        n /= 1024
    return f"{n:.1f} {unit}"


def check_memory(config, batch_size, eval_iters=0, sampling=False):
    """Refuse, before any work, a model whose training step cannot fit in memory, or
    --eval-iters validation batches that cannot (they are made once and kept: two int64
    arrays of batch_size x block_size each). sampling: a checkpoint's model to sample
    from, sized as one training step of batch 1 (more than sampling takes)."""
    have = available_memory()
    if have is None:
        return
    batches = 16 * eval_iters * batch_size * config.block_size
    if batches > have:
        raise UserError(f"the {eval_iters:,} validation batches of --eval-iters are kept in "
                        f"memory: about {fmt_bytes(batches)}, more than the {fmt_bytes(have)} "
                        "this machine has available; use a smaller --eval-iters")
    need = step_memory(config, batch_size) + batches
    if need > have and sampling:
        raise UserError(f"this checkpoint's model ({describe(config)}) needs about "
                        f"{fmt_bytes(need)} of memory, more than the {fmt_bytes(have)} this "
                        "machine has available")
    if need > have:
        grows = ("the attention scores grow with the square of" if isinstance(config, GPTConfig)
                 else "the activations grow with")
        raise UserError(f"one training step of this model needs about {fmt_bytes(need)} of "
                        f"memory ({grows} --block-size {config.block_size}), more than the {fmt_bytes(have)} this machine "
                        "has available; use a smaller --block-size or --batch-size")


def profile_step(args):
    """--profile: one step of the configured model, measured op by op; nothing written."""
    settle_settings(args)
    text, source = read_corpus(args)
    vocab = make_vocab(args, text)
    config = build_config(args, vocab.size)
    check_memory(config, args.batch_size)
    train_data, _ = split_data(vocab.encode(text), config.block_size)
    tt.manual_seed(args.seed)
    model = make_model(config)
    if args.checkpoint_blocks:
        checkpoint_blocks(model)
    optimizer = make_optimizer(model, args)

    def step():
        x, y = get_batch(train_data, config.block_size, args.batch_size, tt._numpy_rng())
        with tt.autocast('cpu', dtype=tt.float16, enabled=args.amp):
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
    step()  # a warm-up step: the first one also pays for setting things up
    with lookinside.profile() as prof:
        step()
    print(f"one training step: {describe(config)}, batch {args.batch_size}, "
          f"{model.num_parameters():,} parameters (text: {source})")
    print(prof)
    return 0


def check_vocabulary(ck, vocab):
    """A resumed run must read the same characters as the run it continues."""
    if ck['vocab'] != vocab.chars:
        extra = sorted(set(vocab.chars) - set(ck['vocab']))
        raise UserError(f"the checkpoint's vocabulary ({len(ck['vocab'])} characters) does not "
                        f"match this text's ({len(vocab.chars)} characters"
                        + (f"; new: {''.join(extra)!r}" if extra else '')
                        + "); resume with the file it was trained on"
                        + (f": {ck['source']}" if ck.get('source') else ''))


def resume_from(ck, optimizer, scheduler, args, schedule_steps):
    """Bring the optimizer, the schedule and the random state back from a checkpoint;
    return the step it was saved at. The moments and step counts come from the
    checkpoint; the lr, its schedule and the weight decay from the run's settings
    (settle_settings: the checkpoint's, unless a flag replaced one)."""
    if 'optimizer' in ck:
        optimizer.load_state_dict(checked_optimizer_state(ck['optimizer'], optimizer,
                                                          checkpoint_path(args.out_dir)))
        optimizer.param_groups[0]['weight_decay'] = args.weight_decay
    else:  # weights brought in by export.py from Hugging Face: no moments to continue
        print("note: the checkpoint holds no optimizer state (imported weights); AdamW's "
              "moments start from zero")
    step = int(ck['step'])
    scheduler.load_state_dict({'last_epoch': step, 'base_lrs': [args.lr, args.lr]})
    if args.steps > schedule_steps:
        print(f"note: this run's learning-rate schedule ends at step {schedule_steps}; steps "
              f"{max(step, schedule_steps) + 1} to {args.steps} run at --min-lr "
              f"{args.min_lr:g}")
    if 'rng' in ck:
        tt.set_rng_state(ck['rng'])
    return step


def checked_optimizer_state(saved, optimizer, path):
    """A checkpoint's AdamW state, checked against this run's optimizer before it is
    loaded: the same parameter groups, the groups' betas, eps and weight decay by AdamW's
    own checks, and for each parameter a whole step count and two finite moments of its
    shape. Returns only what AdamW reads (a key the file adds, such as amsgrad, would
    change the update); anything else is one UserError line."""
    def bad(what):
        raise UserError(f"{path}: its optimizer state {what}; {NOT_OURS}")
    params = optimizer._params()
    groups = saved.get('param_groups')
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups) or \
            [len(g.get('params', ())) for g in groups] != [len(g['params'])
                                                        for g in optimizer.param_groups]:
        bad(f"has parameter groups {show(groups)}, where this model's optimizer has "
            f"{len(optimizer.param_groups)} groups of {', '.join(str(len(g['params'])) for g in optimizer.param_groups)} parameters")
    clean_groups = []
    for group in groups:
        values = {k: group[k] for k in ('lr', 'betas', 'eps', 'weight_decay') if k in group}
        try:
            betas = tuple(values.get('betas', (0.9, 0.99)))
            if len(betas) != 2 or not all(isinstance(b, NUMBER) for b in betas):
                raise ValueError(f"betas {show(values['betas'])} are not two numbers")
            optim._betas(betas)
            for k in ('lr', 'eps', 'weight_decay'):
                if k in values and (isinstance(values[k], bool) or not isinstance(values[k], NUMBER)
                                    or not math.isfinite(values[k])):
                    raise ValueError(f"{k} {show(values[k])} is not a finite number")
            optim._at_least_0(**{k: values[k] for k in ('lr', 'eps', 'weight_decay')
                                 if k in values})
        except (TypeError, ValueError) as e:
            bad(f"is not AdamW's ({e})")
        if 'betas' in values:
            values['betas'] = betas
        clean_groups.append(values)
    state = saved.get('state', {})
    if not isinstance(state, dict):
        bad(f"has state {show(state)}, not a dict")
    clean_state = {}
    for key, s in state.items():
        i = int(key) if isinstance(key, WHOLE) and not isinstance(key, bool) or \
            isinstance(key, str) and key.isdecimal() and len(key) < 10 else None
        if i is None or not 0 <= i < len(params) or i in clean_state:
            bad(f"refers to parameter {show(key)}, where the model has parameters 0 to "
                f"{len(params) - 1}")
        if not isinstance(s, dict):
            bad(f"of parameter {i} is {show(s)}, not a dict")
        step = s.get('step')
        if isinstance(step, bool) or not isinstance(step, WHOLE) or step < 0:
            bad(f"of parameter {i} has step {show(step)}, not a whole number 0 or more")
        clean_state[i] = {'step': int(step)}
        for k in ('exp_avg', 'exp_avg_sq'):
            m = s.get(k)
            m = m.array if isinstance(m, tt.Tensor) else m
            if not isinstance(m, np.ndarray) or m.shape != tuple(params[i].shape) or \
                    m.dtype.kind != 'f' or not np.isfinite(m).all():
                bad(f"of parameter {i} has {k} {show(m)}, not finite floats of the "
                    f"parameter's shape {tuple(params[i].shape)}")
            clean_state[i][k] = m
    start = 0  # the groups' params as this optimizer numbers them (the file's are not read)
    for group, mine in zip(clean_groups, optimizer.param_groups):
        group['params'] = list(range(start, start + len(mine['params'])))
        start += len(mine['params'])
    return {'state': clean_state, 'param_groups': clean_groups}


def report_nan(model, x, y, rng_state, step, loss_value, grad_norm, out_dir):
    """A loss or gradient that is not finite: say which and where, keep the last good
    checkpoint, and name the op that made it; exit status 3."""
    kept = (f"the last good checkpoint is kept at {checkpoint_path(out_dir)}"
            if os.path.exists(checkpoint_path(out_dir)) else "no checkpoint was saved yet")
    what = (f"the loss became {loss_value}" if not math.isfinite(loss_value)
            else f"the gradient norm became {grad_norm}")
    print(f"\nerror: {what} at step {step + 1}; stopping (try a lower --lr). "
          f"{kept}\n{diagnose_nan(model, x, y, rng_state)}", file=sys.stderr)
    return 3


class TrainingLog:
    """What the loop reports at each step: a metrics row (kept by RunFiles until the next
    checkpoint) and the progress line."""

    def __init__(self, files, total_steps, step, stop_at, tokens_per_step):
        self.files, self.progress = files, Progress()
        self.total_steps, self.stop_at, self.tokens_per_step = total_steps, stop_at, tokens_per_step
        self.start_time, self.start_step = time.time(), step

    def elapsed(self):
        return time.time() - self.start_time

    def step(self, step, loss_value, lr, grad_norm, val_loss, ratio, elapsed):
        """ratio (the update-to-weight ratio) is None except at evaluations."""
        evaluated = ratio is not None
        tok_s = (step - self.start_step) * self.tokens_per_step / max(elapsed, 1e-9)
        self.files.rows.append([step, f"{loss_value:.6f}", f"{val_loss:.6f}" if evaluated else '',
                                f"{lr:.6g}", f"{tok_s:.1f}", f"{grad_norm:.4g}",
                                f"{ratio:.3e}" if evaluated else ''])
        eta = (self.stop_at - step) * elapsed / max(step - self.start_step, 1)
        val = f"{val_loss:.4f}" if math.isfinite(val_loss) else "-"  # - : none yet
        self.progress.show(f"step {step}/{self.total_steps} | loss {loss_value:.4f} | val {val} | "
                           f"{tok_s:,.0f} tok/s | {fmt_time(elapsed)} elapsed | ETA "
                           f"{fmt_time(eta)}", final=evaluated)


class BusyWatch:
    """Says, once a run, when the machine is busy: when the tokens per second of the last
    WINDOW seconds fall below half of what this machine gives when it is quiet. Quiet is
    known two ways, and the higher counts: the best window of this run so far (a busy spell
    that comes later), and the tokens per second of CPU time this process got in the window
    (what it would do with the cores to itself: a process that waits for a core gets less
    CPU time than wall time; this one catches a machine busy from the start). Give it the
    step, the wall-clock time and the process's CPU time; it returns the line to print, or
    None."""
    WINDOW = 30.0  # seconds

    def __init__(self, tokens_per_step, step, now, cpu):
        self.tokens_per_step = tokens_per_step
        self.start = (step, now, cpu)  # where the current window started
        self.best = 0.0  # the best tokens/s of a whole window so far
        self.said = False

    def update(self, step, now, cpu):
        step0, now0, cpu0 = self.start
        if now - now0 < self.WINDOW:
            return None
        self.start = (step, now, cpu)
        tokens = (step - step0) * self.tokens_per_step
        rate, cpu_rate = tokens / (now - now0), tokens / max(cpu - cpu0, 1e-9)
        quiet = max(self.best, cpu_rate)
        self.best = max(self.best, rate)
        if self.said or rate >= quiet / 2:
            return None
        self.said = True
        return (f"the machine is busy: {rate:,.0f} tok/s in the last {now - now0:.0f} s, where it "
                f"gives about {quiet:,.0f} when quiet; other programs are taking the cores. "
                "Closing them (a browser, a build, another training run) brings the speed back; "
                "tinytorch already uses fewer threads while they run.")


def report_end(status, step, args, last_val, best, elapsed):
    """The last lines of a run: how it ended, where its checkpoints are."""
    ckpt = checkpoint_path(args.out_dir)
    if status == 'output closed':  # stdout is gone: say it on stderr
        print(f"the output was closed (the program reading it exited): stopped at step {step} of "
              f"{args.steps}; checkpoint saved to {ckpt} (continue with --resume)", file=sys.stderr)
        return
    if status == 'interrupted':
        print(f"\ninterrupted at step {step}; checkpoint saved to {ckpt} (continue with "
              f"--resume; sample it with: python train_charlm.py --sample --latest --out-dir "
              f"{args.out_dir})")
    elif status == 'stopped':
        print(f"\nstopped at step {step} of {args.steps}; checkpoint saved to {ckpt} (continue "
              "with --resume)")
    else:
        val = (f"validation loss {last_val:.4f}" if math.isfinite(last_val)
               else "no validation in this run")
        print(f"\nfinished {plural(step, 'step')} in {fmt_time(elapsed)}; {val}; checkpoint saved "
              f"to {ckpt}")
    if best['step']:
        print(f"best validation loss {best['val_loss']:.4f} at step {best['step']}, kept in "
              f"{checkpoint_path(args.out_dir, BEST_NAME)} (--sample uses it)")


def train(args):
    # -- check everything before any work: flags, text, checkpoint, memory, folder ------
    if args.plot:
        need_matplotlib(os.path.join(args.out_dir, METRICS_NAME))
    if not args.resume and not args.force:
        refuse_to_overwrite(args.out_dir)
    text, source = read_corpus(args)
    ck = load_checkpoint(args.out_dir) if args.resume else None
    metrics_file = os.path.join(args.out_dir, METRICS_NAME)
    if ck is not None and os.path.exists(metrics_file):
        read_metrics(metrics_file)  # a bad one is refused now, before any work
    settle_settings(args, ck.get('settings') if ck else None)
    vocab = make_vocab(args, text, ck['vocab'] if ck and isinstance(ck['vocab'], dict) else None)
    if ck is not None:
        check_vocabulary(ck, vocab)
    config = build_config(args, vocab.size, ck['config'] if ck else None)
    check_memory(config, args.batch_size, args.eval_iters)
    train_data, val_data = split_data(vocab.encode(text), config.block_size)
    prepare_out_dir(args.out_dir)

    # -- the model, the optimizer and the schedule (from the checkpoint when resuming) -
    tt.manual_seed(args.seed)
    model = restore_model(ck, config) if ck else make_model(config)
    if args.checkpoint_blocks:
        checkpoint_blocks(model)
    optimizer = make_optimizer(model, args)
    # the schedule belongs to the run: a resumed run keeps the length it started with, so
    # more --steps than that continue at --min-lr instead of stretching the cosine again
    schedule_steps = int(ck.get('schedule_steps', args.steps)) if ck is not None else args.steps
    scheduler = optim.WarmupCosineLR(optimizer, args.warmup, schedule_steps, min_lr=args.min_lr)
    step = resume_from(ck, optimizer, scheduler, args, schedule_steps) if ck is not None else 0
    scaler = tt.amp.GradScaler('cpu', enabled=args.amp)  # --amp: the loss scale (disabled: a no-op)
    if ck is not None and args.amp and ck.get('scaler'):
        scaler.load_state_dict(ck['scaler'])
    best = {'step': 0, 'val_loss': math.inf}  # the best validation so far, kept across resumes
    if ck is not None:
        best.update(ck.get('best', {}))
    # fixed validation batches, from their own generator: evaluating never changes the
    # training batches, so a resumed run sees exactly the batches a straight run sees
    val_rng = np.random.default_rng(args.seed + 1)
    val_batches = [get_batch(val_data, config.block_size, args.batch_size, val_rng)
                   for _ in range(args.eval_iters)]

    files = RunFiles(args.out_dir, new_run=ck is None)
    if ck is not None:
        agree_metrics(files.metrics_file, ck)

    def checkpoint(at_step):
        return {'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                'vocab': vocab.chars, 'config': config.to_dict(), 'step': at_step,
                'rng': tt.get_rng_state(), 'schedule_steps': schedule_steps, 'best': dict(best),
                'source': source, 'settings': {k: getattr(args, k) for k in RUN_FLAGS},
                'scaler': scaler.state_dict()}

    print(f"training on {source}: {len(text):,} characters, vocabulary {vocab.size}, "
          f"{model.num_parameters():,} parameters")
    print(f"model: {describe(config)}; batch {args.batch_size}, {args.steps} steps"
          + (f", resuming at step {step}" if step else ''))
    note = None if ck else small_text_note(len(train_data), args.steps, args.batch_size,
                                           config.block_size)
    if note:
        print(note)

    # -- the training loop ------------------------------------------------------------
    stop_at = args.steps if args.stop_after is None else min(args.steps, step + args.stop_after)
    log = TrainingLog(files, args.steps, step, stop_at, args.batch_size * config.block_size)
    stop = lookinside.StopRequest()  # first Ctrl-C: finish the step, save, exit
    busy = BusyWatch(args.batch_size * config.block_size, step, time.time(), time.process_time())
    last_val = float('nan')
    # NumPy's overflow warnings are off: every loss and gradient norm is checked below,
    # and a bad one is reported once, with the op that made it
    try:
        with np.errstate(over='ignore', invalid='ignore', divide='ignore'):
            while step < stop_at and not (stop.requested or log.progress.closed):
                # a batch of random windows, and the random state to run this step again if
                # it goes bad
                x, y = get_batch(train_data, config.block_size, args.batch_size,
                                 tt._numpy_rng())
                rng_state = tt.get_rng_state()
                # forward (--amp: under autocast), backward (of the scaled loss), clip
                with tt.autocast('cpu', dtype=tt.float16, enabled=args.amp):
                    _, loss = model(x, y)
                loss_value, grad_norm = loss.item(), math.nan
                if math.isfinite(loss_value):
                    optimizer.zero_grad()
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    grad_norm = optim.clip_grad_norm_(model.parameters(), args.grad_clip).item()
                if not math.isfinite(grad_norm) and not (args.amp and math.isfinite(loss_value)):
                    log.progress.clear()
                    return report_nan(model, x, y, rng_state, step, loss_value, grad_norm,
                                      args.out_dir)
                # step (the lr is read first: it is the one this step uses)
                lr = scheduler.get_last_lr()[0]
                evaluated = step + 1 == args.steps or (step + 1) % args.eval_interval == 0
                before = [p.array.copy() for p in model.parameters()] if evaluated else None
                scaler.step(optimizer)  # (--amp: skipped if a gradient overflowed)
                scaler.update()
                scheduler.step()
                step += 1
                # evaluate, log, and at each evaluation save the checkpoints
                elapsed, ratio = log.elapsed(), None
                if evaluated:
                    last_val = evaluate(model, val_batches)
                    ratio = update_ratio(before, model.parameters())
                log.step(step, loss_value, lr, grad_norm, last_val, ratio, elapsed)
                note = busy.update(step, time.time(), time.process_time())
                if note:
                    log.progress.clear()
                    log.progress.write(note + '\n')
                if evaluated:
                    new_best = last_val < best['val_loss']
                    if new_best:  # kept in best.npz beside the latest
                        best.update(step=step, val_loss=last_val)
                    files.save(checkpoint(step), best=new_best)
    finally:
        stop.restore()
    log.progress.clear()

    # -- the end: a last checkpoint, what happened, a sample unless stopped early ------
    files.save(checkpoint(step))
    if isinstance(vocab, BPEVocab):  # the merges beside the checkpoint, readable
        atomic_write(os.path.join(args.out_dir, 'merges.txt'), vocab.bpe.save)  # links: replaced
    status = ('interrupted' if stop.requested else 'done' if step >= args.steps
              else 'output closed' if log.progress.closed else 'stopped')
    report_end(status, step, args, last_val, best, log.elapsed())
    if isinstance(vocab, BPEVocab) and math.isfinite(last_val):  # comparable with --tokenizer char
        chars_per_token = len(vocab.decode(val_data)) / len(val_data)
        print(f"validation loss {last_val:.4f} per token is {last_val / chars_per_token:.4f} per "
              f"character ({chars_per_token:.2f} characters a token in the validation text)")
    if args.plot:
        plot_metrics(files.metrics_file, os.path.join(args.out_dir, 'loss.png'))
    if args.length and status in ('done', 'stopped') and not log.progress.closed:
        print("\n--- sample ---")
        print(sample_text(model, vocab, args.prompt, args.length, args.temperature, args.top_k))
    return 130 if status == 'interrupted' else 0


def sample_only(args):
    settle_settings(args)  # --seed, or its default
    name = BEST_NAME if not args.latest and os.path.exists(
        checkpoint_path(args.out_dir, BEST_NAME)) else CKPT_NAME
    ck = load_checkpoint(args.out_dir, name)
    best = ck.get('best', {})
    val = f", validation loss {best['val_loss']:.4f}" if name == BEST_NAME and 'val_loss' in best \
        else ""
    print(f"sampling from {checkpoint_path(args.out_dir, name)} (step {int(ck['step'])}{val})",
          file=sys.stderr)
    vocab = make_vocab(args, None, ck['vocab'])
    config = build_config(args, vocab.size, ck['config'])
    check_memory(config, 1, sampling=True)
    model = restore_model(ck, config)
    tt.manual_seed(args.seed)
    print(sample_text(model, vocab, args.prompt, args.length, args.temperature, args.top_k))
    return 0


def main(argv=None):
    try:
        args = parse_args(argv)
        if args.sample:
            return sample_only(args)
        if args.profile:
            return profile_step(args)
        if args.plot and not (args.resume or args.force) and \
                os.path.exists(checkpoint_path(args.out_dir)):
            return plot_only(args)
        return train(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstopped.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of a pipe left after training (the sample, say)
        silence_stdout()
        return 0


if __name__ == '__main__':
    tt.tune()  # this process is a training run: tune it
    sys.exit(main())
