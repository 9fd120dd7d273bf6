"""bench.py: how fast is a tinytorch training step, and how does it compare with PyTorch?

    python bench.py              # small, default and large GPT configurations, a CNN, an LSTM, a GRU
    python bench.py --quick      # fewer steps, under a minute
    python bench.py --threads 1  # threads for BLAS, tinytorch and PyTorch (default: all cores)
    python bench.py --busy 2     # also with 2 busy processes competing for the cores

For each configuration it times the char-level GPT training step (forward, backward,
AdamW step): the median over the timed steps after warm-up, tokens per second and
the peak resident memory while stepping. When PyTorch is installed it builds the
same model in PyTorch (nanoGPT's layout, the same weights copied in, the same batch,
the same number of threads), checks that the first-step losses agree to 1e-4, times
it the same way and prints the ratio tinytorch / PyTorch. The cnn configuration is
train_digits.py's CNN (two 3x3 convolutions, a max pool, two linear layers) on a batch
of 32 8x8 images, with Adam; its throughput column counts images, not tokens. lstm and gru
are a character model with 2 recurrent layers of 128 units (an embedding of 64 before, a
linear head after; windows of 64 characters, batch 12, AdamW), PyTorch's nn.LSTM / nn.GRU
the reference; lstm4 is train_charlm.py --model lstm's shape (4 layers of 128).

--busy N measures a busy machine too (a laptop with a browser and a build running): each
configuration is also timed while N other processes keep a core busy each, and the table
shows the quiet and the busy step times side by side. The busy processes run only during
those measurements, and stop when they end, however they end.
"""
import argparse
import contextlib
import math
import json
import os
import subprocess
import sys
import time

CONFIGS = {
    'small': dict(n_layer=2, n_head=4, n_embd=64, block_size=32, batch=32),
    'default': dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12),
    'large': dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=16),
    'cnn': dict(batch=32, block_size=1),  # train_digits.py's CNN, 32 images of 8x8 a step
    # a character model with recurrent layers: embedding -> LSTM or GRU -> linear head
    'lstm': dict(kind='lstm', layers=2, hidden=128, embd=64, block_size=64, batch=12),
    'gru': dict(kind='gru', layers=2, hidden=128, embd=64, block_size=64, batch=12),
    'lstm4': dict(kind='lstm', layers=4, hidden=128, embd=128, block_size=64, batch=12),  # train_charlm.py --model lstm
}
VOCAB = 65


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--quick', action='store_true', help="fewer steps: finishes in under a minute")
    p.add_argument('--threads', type=int, default=os.cpu_count(),
                   help="threads for BLAS, tinytorch's own kernels and PyTorch (default: all cores)")
    p.add_argument('--configs', default='small,default,large,cnn,lstm,gru',
                   help="comma-separated subset of " + ','.join(CONFIGS))
    p.add_argument('--no-torch', action='store_true', help="skip the PyTorch comparison")
    p.add_argument('--busy', type=int, default=0, metavar='N',
                   help="also time each configuration while N busy processes compete for the "
                        "cores, and show quiet and busy side by side (default 0: quiet only)")
    p.add_argument('--rounds', type=int,
                   help="runs of each framework per configuration, alternating, each in a fresh "
                        "process; the median run is reported (default 5, --quick 3; large: 1)")
    p.add_argument('--worker', choices=['tinytorch', 'torch'], help=argparse.SUPPRESS)
    p.add_argument('--steps', type=int, default=20, help=argparse.SUPPRESS)
    p.add_argument('--warmup', type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument('--budget', type=float, default=60, help=argparse.SUPPRESS)
    args = p.parse_args()
    # one line, exit 2, for a value argparse accepts but bench cannot use
    unknown = [name for name in args.configs.split(',') if name not in CONFIGS]
    if unknown:
        refuse(f"--configs: unknown configuration {unknown[0]!r}; choose among "
               f"{', '.join(CONFIGS)} (comma-separated)")
    for flag in ('threads', 'rounds', 'steps'):
        value = getattr(args, flag)
        if value is not None and value < 1:
            refuse(f"--{flag} {value}: it must be at least 1")
    if args.busy < 0:
        refuse(f"--busy {args.busy}: it must be 0 or more")
    return args


def refuse(message):
    print(f"bench.py: error: {message}", file=sys.stderr)
    sys.exit(2)


ARGS = parse_args() if __name__ == '__main__' else None
if ARGS is not None:  # BLAS reads its thread count when NumPy is first imported
    for var in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ[var] = str(ARGS.threads)
    os.environ.setdefault('OPENBLAS_THREAD_TIMEOUT', '16')  # read as NumPy loads OpenBLAS (tt.tune)

import tinytorch as tt  # noqa: E402
import numpy as np  # noqa: E402

import nn  # noqa: E402
import optim  # noqa: E402
from train_digits import make_model  # noqa: E402
from transformer import GPT, GPTConfig  # noqa: E402

# the settings tt.tune() made in this process (PyTorch runs as a user gets it: untuned)
TUNED = tt.tune() if ARGS is not None and ARGS.worker != 'torch' else []


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------
def rss_mb(field):
    """VmHWM (peak resident size) or VmRSS of this process, in MB (Linux)."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    return float('nan')


def time_steps(step, warmup, steps, budget=math.inf, spent=0.0):
    """The median step time in ms, and how many steps it is the median of: warmup steps, then
    steps timed ones. A step that collapses on a busy machine can take minutes, so the
    warm-up stops once a quarter of budget seconds is spent (spent: already, on the first
    step), and the timing once budget seconds are; at least one step is timed."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        if spent + time.perf_counter() - t0 > budget / 4:
            break
        step()
    times = []
    while len(times) < steps and (not times or sum(times) < budget):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1000, len(times)


def blas_info():
    try:
        from threadpoolctl import threadpool_info
        pools = [f"{p['internal_api']} {p.get('version') or ''} ({p['num_threads']} threads)"
                 for p in threadpool_info() if p['user_api'] == 'blas']
        if pools:
            return ', '.join(pools)
    except ImportError:
        pass
    try:
        blas = np.show_config(mode='dicts')['Build Dependencies']['blas']
        name = f"{blas.get('name')} {blas.get('version', '')}"
    except Exception:
        name = 'unknown BLAS'
    return f"{name} ({os.environ.get('OPENBLAS_NUM_THREADS', '?')} threads requested)"


def training_step(loss_of, opt):
    """One training step, the same in both frameworks: forward to the loss, gradients
    cleared (set to None, PyTorch's default too), backward, the optimizer's step."""
    def step():
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


# ---------------------------------------------------------------------------
# tinytorch
# ---------------------------------------------------------------------------
def make_batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    shape = (cfg['batch'], cfg['block_size'])
    return rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape)


def tinytorch_model(cfg):
    tt.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=cfg['block_size'], n_layer=cfg['n_layer'],
                         n_head=cfg['n_head'], n_embd=cfg['n_embd']))


def cnn_batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((cfg['batch'], 1, 8, 8), dtype=np.float32),
            rng.integers(0, 10, cfg['batch']))


def tinytorch_cnn_setup(cfg):
    tt.manual_seed(0)
    model = make_model('cnn', 8, 8)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    x, y = (tt.tensor(a) for a in cnn_batch(cfg))

    return model, training_step(lambda: nn.cross_entropy(model(x), y), opt)


def torch_cnn_setup(cfg, ours, threads):
    import torch
    import torch.nn as tnn
    torch.set_num_threads(threads)
    model = tnn.Sequential(tnn.Conv2d(1, 16, 3, padding=1), tnn.ReLU(),
                           tnn.Conv2d(16, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
                           tnn.Flatten(), tnn.Linear(512, 64), tnn.ReLU(), tnn.Linear(64, 10))
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = (torch.from_numpy(a) for a in cnn_batch(cfg))

    return training_step(lambda: tnn.functional.cross_entropy(model(x), y), opt), model


def recurrent_model(cfg, nn_):
    """The lstm/gru configurations' model, built with either framework's nn (the same API)."""
    layer = nn_.LSTM if cfg['kind'] == 'lstm' else nn_.GRU
    return nn_.ModuleDict({'emb': nn_.Embedding(VOCAB, cfg['embd']),
                           'rnn': layer(cfg['embd'], cfg['hidden'], num_layers=cfg['layers'],
                                        batch_first=True),
                           'head': nn_.Linear(cfg['hidden'], VOCAB)})


def recurrent_loss(model, x, y, cross_entropy):
    out, _ = model['rnn'](model['emb'](x))
    return cross_entropy(model['head'](out).reshape(-1, VOCAB), y.reshape(-1))


def tinytorch_recurrent_setup(cfg):
    tt.manual_seed(0)
    model = recurrent_model(cfg, nn)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (tt.tensor(a) for a in make_batch(cfg))
    return model, training_step(lambda: recurrent_loss(model, x, y, nn.cross_entropy), opt)


def torch_recurrent_setup(cfg, ours, threads):
    import torch
    torch.set_num_threads(threads)
    model = recurrent_model(cfg, torch.nn)
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (torch.from_numpy(a) for a in make_batch(cfg))
    return training_step(lambda: recurrent_loss(model, x, y, torch.nn.functional.cross_entropy),
                         opt), model


def tinytorch_setup(cfg):
    if cfg is CONFIGS['cnn']:
        return tinytorch_cnn_setup(cfg)
    if 'kind' in cfg:
        return tinytorch_recurrent_setup(cfg)
    model = tinytorch_model(cfg)
    opt = optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x, y = (tt.tensor(a) for a in make_batch(cfg))

    return model, training_step(lambda: model(x, y)[1], opt)


# ---------------------------------------------------------------------------
# The same model in PyTorch (nanoGPT's layout and parameter names)
# ---------------------------------------------------------------------------
def torch_setup(cfg, ours, threads):
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F
    torch.set_num_threads(threads)

    class Attn(tnn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.c_attn = tnn.Linear(C, 3 * C)
            self.c_proj = tnn.Linear(C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(tnn.Module):
        def __init__(self, C):
            super().__init__()
            self.c_fc, self.gelu, self.c_proj = tnn.Linear(C, 4 * C), tnn.GELU(), tnn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(tnn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.ln_1, self.attn = tnn.LayerNorm(C), Attn(C, H)
            self.ln_2, self.mlp = tnn.LayerNorm(C), MLP(C)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            C = cfg['n_embd']
            self.wte, self.wpe = tnn.Embedding(VOCAB, C), tnn.Embedding(cfg['block_size'], C)
            self.h = tnn.ModuleList([Block(C, cfg['n_head']) for _ in range(cfg['n_layer'])])
            self.ln_f = tnn.LayerNorm(C)
            self.lm_head = tnn.Linear(C, VOCAB, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1])
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    model = TorchGPT()
    model.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x, y = (torch.from_numpy(a) for a in make_batch(cfg))

    return training_step(lambda: model(x, y), opt), model


# ---------------------------------------------------------------------------
# Autograd overhead: a chain of small ops, through tinytorch and as bare NumPy calls
# ---------------------------------------------------------------------------
def autograd_overhead(n_ops=300, repeats=30):
    x0 = np.random.default_rng(0).standard_normal(16).astype(np.float32)

    def with_tinytorch():
        x = tt.tensor(x0, requires_grad=True)
        y = x
        for _ in range(n_ops // 3):
            y = (y * 0.9 + 0.1).tanh()
        y.sum().backward()

    def with_numpy():  # the same forward calls, and the same backward arithmetic, by hand
        outs, y = [], x0
        for _ in range(n_ops // 3):
            y = np.tanh(y * 0.9 + 0.1)
            outs.append(y)
        g = np.ones_like(y)
        for out in reversed(outs):
            g = g * (1 - out * out) * 0.9

    # the two run in turn, so that a spell of a busy machine slows both; each keeps its best
    times = {with_tinytorch: [], with_numpy: []}
    for fn in times:
        fn()  # warm up
    for _ in range(repeats):
        for fn in times:
            times[fn].append(_timed(fn))
    return min(times[with_tinytorch]) / n_ops * 1e6, min(times[with_numpy]) / n_ops * 1e6


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def worker(args):
    """Run one framework on one configuration in this (fresh) process and print JSON,
    with the peak resident size of the whole process (libraries included)."""
    cfg = CONFIGS[args.configs]
    if args.worker == 'tinytorch':
        step = tinytorch_setup(cfg)[1]
    elif args.configs == 'cnn':
        step = torch_cnn_setup(cfg, tinytorch_cnn_setup(cfg)[0], args.threads)[0]
    elif 'kind' in cfg:
        step = torch_recurrent_setup(cfg, tinytorch_recurrent_setup(cfg)[0], args.threads)[0]
    else:
        step = torch_setup(cfg, tinytorch_model(cfg), args.threads)[0]
    t0 = time.perf_counter()
    first = step()
    ms, timed = time_steps(step, max(0, args.warmup - 1), args.steps, args.budget,
                           time.perf_counter() - t0)
    print(json.dumps({'ms': ms, 'mb': rss_mb('VmHWM'), 'first_loss': first, 'steps': timed}))


# A busy process: a core's worth of work, as a browser tab or a build can be. It checks
# every million loops (a few tens of ms) that bench.py is still its parent, so it ends by
# itself if bench.py is killed before it could stop it.
SPINNER = ("import os, sys\n"
           "parent = int(sys.argv[1])\n"
           "while os.getppid() == parent:\n"
           "    for _ in range(10 ** 6):\n"
           "        pass\n")


@contextlib.contextmanager
def busy_processes(n):
    """n busy processes (SPINNER) for the duration of the with block, stopped when it ends,
    however it ends (an error, Ctrl-C)."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, '-c', SPINNER, str(os.getpid())]))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def run_worker(framework, name, args, steps, warmup, busy=0):
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', framework, '--configs', name,
           '--threads', str(args.threads), '--steps', str(steps), '--warmup', str(warmup),
           '--budget', str(args.budget)]
    with busy_processes(busy):
        out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench.py: the {framework} run of '{name}' failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_run(runs):
    """The run with the median step time (the peak memory is the highest of all runs)."""
    run = dict(sorted(runs, key=lambda r: r['ms'])[len(runs) // 2])
    run['mb'] = max(r['mb'] for r in runs)
    return run


def main():
    args = ARGS
    if args.worker:
        return worker(args)
    warmup, steps = (3, 8) if args.quick else (3, 20)
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 5)
    torch_version = None
    if not args.no_torch:
        try:
            import torch
            torch_version = torch.__version__
        except ImportError:
            print("PyTorch is not installed: printing tinytorch's own figures only.")
    print(f"training step (forward, backward, AdamW step; cnn: Adam): median of {steps} steps after "
          f"{warmup} warm-up{' (large: 3 after 2)' if args.quick else ''}, in each of "
          f"{rounds} runs per framework{'' if args.rounds else ' (large: 1)'}, alternating, "
          "each in a fresh process; the median run is shown; peak MB = the highest peak resident "
          "size of a run's process, libraries included")
    coretype = os.environ.get('OPENBLAS_CORETYPE')
    print(f"NumPy {np.__version__}, BLAS: {blas_info()}"
          + (f", OPENBLAS_CORETYPE={coretype} (from the environment)" if coretype else ""))
    print(f"tinytorch: {tt.get_num_threads()} threads of its own, malloc tuning "
          f"{'on' if 'malloc' in TUNED else 'off'}, OpenBLAS idle spin "
          f"2^{os.environ.get('OPENBLAS_THREAD_TIMEOUT', '28 (its default)')} cycles, sharing the "
          f"cores with other programs {'on' if 'share_cores' in TUNED and tt.fast else 'off'}")
    if torch_version:
        print(f"PyTorch {torch_version}, {args.threads} threads (torch.set_num_threads), "
              "its default allocator settings")
    if args.busy:
        print(f"busy: {args.busy} other processes keep a core busy each during the busy runs "
              f"(this machine has {os.cpu_count()} cores); x = busy / quiet step time")
        header = f"{'config':<8} {'tinytorch ms':>12} {'busy ms':>9} {'x':>5}"
        if torch_version:
            header += (f" {'PyTorch ms':>10} {'busy ms':>9} {'x':>5} {'ratio':>6} {'busy ratio':>10}"
                       f" {'loss diff':>9}")
    else:
        header = f"{'config':<8} {'tinytorch ms':>12} {'tok/s':>9} {'peak MB':>8}"
        if torch_version:
            header += (f" {'PyTorch ms':>10} {'tok/s':>9} {'peak MB':>8} {'ratio':>6}"
                       f" {'loss diff':>9}")
    print(header)
    for name in args.configs.split(','):
        cfg = CONFIGS[name]
        tokens = cfg['batch'] * cfg['block_size']
        n, w = (3, 2) if name == 'large' and args.quick else (steps, warmup)  # ~1.7 s a step
        # A shared machine has slow spells: alternating the two frameworks' runs lets a
        # spell hit both, and the median run leaves a single unlucky one out.
        runs = 1 if name == 'large' and args.rounds is None else rounds  # ~40 s a large run
        kinds = [(fw, busy) for busy in ([0, args.busy] if args.busy else [0])
                 for fw in (['tinytorch', 'torch'] if torch_version else ['tinytorch'])]
        results = {kind: [] for kind in kinds}
        for _ in range(runs):
            for fw, busy in kinds:
                results[fw, busy].append(run_worker(fw, name, args, n, w, busy))
        res = {kind: median_run(r) for kind, r in results.items()}
        ours = res['tinytorch', 0]
        if args.busy:
            ours_busy = res['tinytorch', args.busy]
            line = (f"{name:<8} {ours['ms']:>12.1f} {ours_busy['ms']:>9.1f} "
                    f"{ours_busy['ms'] / ours['ms']:>5.1f}")
        else:
            line = f"{name:<8} {ours['ms']:>12.1f} {tokens / ours['ms'] * 1000:>9,.0f} {ours['mb']:>8.0f}"
        if torch_version:
            theirs = res['torch', 0]
            diff = abs(theirs['first_loss'] - ours['first_loss'])
            if args.busy:
                theirs_busy = res['torch', args.busy]
                line += (f" {theirs['ms']:>10.1f} {theirs_busy['ms']:>9.1f} "
                         f"{theirs_busy['ms'] / theirs['ms']:>5.1f} {ours['ms'] / theirs['ms']:>6.2f}"
                         f" {ours_busy['ms'] / theirs_busy['ms']:>10.2f} {diff:>9.1e}")
            else:
                line += (f" {theirs['ms']:>10.1f} {tokens / theirs['ms'] * 1000:>9,.0f} "
                         f"{theirs['mb']:>8.0f} {ours['ms'] / theirs['ms']:>6.2f} {diff:>9.1e}")
            if diff > 1e-4:
                line += "  (first-step losses differ by more than 1e-4!)"
        short = sorted({f"{fw}{' busy' if busy else ''}: {r['steps']}" for (fw, busy), r in res.items()
                        if r['steps'] < n})
        if short:  # a step so slow that the time budget cut the timing short
            line += f"  (steps timed: {', '.join(short)})"
        print(line, flush=True)
    per_op_tt, per_op_np = autograd_overhead()
    print(f"autograd overhead: a chain of small elementwise ops (16 floats) costs "
          f"{per_op_tt:.1f} us/op through tinytorch (forward + backward) vs {per_op_np:.1f} us/op "
          f"as bare NumPy calls ({per_op_tt / per_op_np:.1f}x)")


if __name__ == '__main__':
    main()
