"""Train a small CNN to read handwritten digits, then report its test accuracy, a
confusion matrix and the time.

    python train_digits.py                  # the CNN on the 1,797 8x8 digits in data/
    python train_digits.py --model mlp      # a plain 2-layer network, for comparison
    python train_digits.py --plot           # also draw the test digits it got wrong
    python train_digits.py --mnist DIR      # MNIST, from its four idx files in DIR
    python train_digits.py --help

Ctrl-C stops after the current step and saves the model trained so far.

The digits are the UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin,
C. Kaynak, 1998; CC BY 4.0), as scikit-learn ships it: 64 pixel values (0-16) and a label
per row. The split is fixed: the rows permuted by np.random.default_rng(0), the last 360
are the test set.
"""
import argparse
import gzip
import math
import os
import sys
import tempfile
import time

if __name__ == '__main__':  # OpenBLAS reads it once, as NumPy loads it (see tt.tune)
    os.environ.setdefault('OPENBLAS_THREAD_TIMEOUT', '16')
import tinytorch as tt  # noqa: E402
import numpy as np

import data
import lookinside
from files import atomic_write, open_regular
import nn
import optim

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, 'data', 'digits.csv.gz')
TEST_SIZE = 360
MAX_TEXT = 64 * 2 ** 20  # bytes a digits file may inflate to (the 1,797 digits: 270 KB)
MAX_IDX = 2 ** 30  # values an idx file may declare (MNIST's largest: 47 million)
MNIST_FILES = {'train_images': 'train-images-idx3-ubyte', 'train_labels': 'train-labels-idx1-ubyte',
               'test_images': 't10k-images-idx3-ubyte', 'test_labels': 't10k-labels-idx1-ubyte'}


class UserError(Exception):
    """Bad input: printed as one clear line, exit status 2, no traceback."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a CNN (or an MLP) on handwritten digits.")
    p.add_argument('--model', choices=['cnn', 'mlp'], default='cnn',
                   help="cnn: two 3x3 convolutions, a 2x2 max pool, two linear layers; "
                        "mlp: one hidden layer of 128 (default cnn)")
    p.add_argument('--epochs', type=int, default=30, help="passes over the training set (default 30)")
    p.add_argument('--batch-size', type=int, default=32, help="images per step (default 32)")
    p.add_argument('--lr', type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    p.add_argument('--seed', type=int, default=0, help="random seed: initial weights and "
                   "batch order (default 0)")
    p.add_argument('--data', default=DIGITS, help="the digits file: gzipped CSV, 64 pixels "
                   "(0-16) then the label per row (default data/digits.csv.gz)")
    p.add_argument('--mnist', metavar='DIR', help="train on MNIST instead: DIR holds its four "
                   "idx files (train-images-idx3-ubyte, ..., gzipped or not)")
    p.add_argument('--out-dir', default='out_digits', help="where the trained model is saved, "
                   "as MODEL.npz (default out_digits)")
    p.add_argument('--force', action='store_true', help="replace a model already saved there "
                   "(without it, a saved model is never overwritten)")
    p.add_argument('--plot', action='store_true', help="save OUT_DIR/MODEL_errors.png, the test "
                   "digits it got wrong with their predicted labels (needs matplotlib)")
    args = p.parse_args(argv)
    for name in ('epochs', 'batch_size'):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    return args


# -- data ----------------------------------------------------------------------
def load_digits(path):
    """(images (N, 1, 8, 8) float32 in [0, 1], labels (N,) int64) from the CSV file, read
    as a file from others: at most MAX_TEXT bytes inflated (a gzip bomb stops there), each
    row 64 pixel values from 0 to 16 (no NaN, no inf) and a label 0-9, more rows than the
    test set takes."""
    if not os.path.exists(path):
        raise UserError(f"digits file not found: {path}")
    try:
        with open_regular(path) as packed, gzip.open(packed, 'rb') as f:  # a FIFO: refused
            raw = f.read(MAX_TEXT + 1)
        if len(raw) > MAX_TEXT:
            raise UserError(f"{path} inflates to more than {MAX_TEXT >> 20} MiB of text, far "
                            "more than a digits file (the 1,797 digits take 270 KB): it is "
                            "damaged or was made to attack; nothing was trained")
        rows = [line.split(',') for line in raw.decode('ascii').splitlines() if line.strip()]
        for n, row in enumerate(rows, 1):
            if len(row) != 65:
                raise UserError(f"{path}: each row must hold 64 pixel values and a label, got "
                                f"{len(row)} value{'s' * (len(row) != 1)} in row {n}")
        table = np.array(rows, dtype=np.float64).reshape(-1, 65)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a gzipped CSV of numbers ({e.__class__.__name__}: "
                        f"{str(e)[:80]})") from None
    pixels, labels = table[:, :64], table[:, 64]
    bad = np.flatnonzero(~((pixels >= 0) & (pixels <= 16)).all(axis=1))  # NaN fails both
    if bad.size:
        n = bad[0]
        value = pixels[n][~((pixels[n] >= 0) & (pixels[n] <= 16))][0]
        raise UserError(f"{path}: pixel values must be numbers from 0 to 16, row {n + 1} has "
                        f"{value}")
    if not np.all((labels >= 0) & (labels <= 9) & (labels == np.round(labels))):
        raise UserError(f"{path}: labels (the last column) must be whole numbers 0-9")
    if len(labels) <= TEST_SIZE:
        raise UserError(f"{path} holds {len(labels)} digits; the last {TEST_SIZE} of them (in "
                        f"a fixed shuffled order) are the test set, so it needs more than "
                        f"{TEST_SIZE}")
    images = (pixels / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return images, labels.astype(np.int64)


def split_digits(images, labels):
    """The fixed split: rows permuted by default_rng(0); the last 360 are the test set."""
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:-TEST_SIZE], order[-TEST_SIZE:]
    return (images[train], labels[train]), (images[test], labels[test])


def read_idx(path, kind):
    """One MNIST idx file (gzipped or not): images (N, rows, cols) or labels (N,), uint8."""
    for candidate in (path, path + '.gz'):
        if os.path.exists(candidate):
            break
    else:
        raise UserError(f"MNIST file not found: {path} (or {os.path.basename(path)}.gz)")
    opener = gzip.open if candidate.endswith('.gz') else open
    dims = 3 if kind == 'images' else 1
    magic = 0x0800 + dims  # unsigned bytes, then the number of dims
    header = 4 + 4 * dims
    try:
        with opener(candidate, 'rb') as f:
            head = f.read(header)
            if len(head) < header or int.from_bytes(head[:4], 'big') != magic:
                raise UserError(f"{candidate} is not an idx file of {kind} (expected magic "
                                f"number {magic:#010x})")
            shape = tuple(int.from_bytes(head[4 + 4 * i:8 + 4 * i], 'big') for i in range(dims))
            size = math.prod(shape)  # Python's integers: a product of dims cannot wrap
            if size > MAX_IDX:
                raise UserError(f"{candidate}: its header declares {' x '.join(map(str, shape))}"
                                f" = {size:,} values, more than the {MAX_IDX:,} an idx file may "
                                "hold here; it is damaged or was made to attack")
            raw = f.read(size + 1)  # what the header declares, and one byte to see more
    except (OSError, EOFError) as e:
        raise UserError(f"{candidate} cannot be read ({e})") from None
    if len(raw) != size:
        raise UserError(f"{candidate} is truncated: its header promises {shape} values"
                        if len(raw) < size else f"{candidate} holds more bytes than the {shape} "
                        "values its header declares: it is not one idx file")
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def load_mnist(folder):
    if not os.path.isdir(folder):
        raise UserError(f"--mnist: {folder} is not a folder")
    parts = {k: read_idx(os.path.join(folder, name), k.split('_')[1])
             for k, name in MNIST_FILES.items()}
    sets = []
    for which in ('train', 'test'):
        images, labels = parts[which + '_images'], parts[which + '_labels']
        if len(images) != len(labels):
            raise UserError(f"MNIST {which}: {len(images)} images but {len(labels)} labels")
        if labels.size and labels.max() > 9:
            raise UserError(f"MNIST {which}: labels must be 0-9, got {labels.max()}")
        if not len(labels) or min(images.shape[1:]) < 2:
            raise UserError(f"MNIST {which}: {len(images)} images of "
                            f"{images.shape[1]}x{images.shape[2]}; it needs at least one "
                            "image, of at least 2x2 pixels")
        sets.append(((images / 255.0).astype(np.float32)[:, None], labels.astype(np.int64)))
    if sets[0][0].shape[2:] != sets[1][0].shape[2:]:
        raise UserError(f"MNIST: the training images are {'x'.join(map(str, sets[0][0].shape[2:]))}"
                        f", the test images {'x'.join(map(str, sets[1][0].shape[2:]))}; both "
                        "sets must have one size")
    return sets


# -- models ----------------------------------------------------------------------
def make_model(kind, height, width):
    if kind == 'mlp':
        return nn.Sequential(nn.Flatten(), nn.Linear(height * width, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),  # 32 channels of (h/2) x (w/2)
        nn.Linear(32 * (height // 2) * (width // 2), 64), nn.ReLU(),
        nn.Linear(64, 10))


def predict(model, images, batch_size=500):
    model.eval()
    with tt.no_grad():
        out = [model(tt.tensor(images[i:i + batch_size])).array.argmax(1)
               for i in range(0, len(images), batch_size)]
    model.train()
    return np.concatenate(out)


def confusion_matrix(labels, predicted):
    m = np.zeros((10, 10), dtype=np.int64)
    np.add.at(m, (labels, predicted), 1)
    return m


def format_confusion(m):
    lines = ["confusion matrix (rows: true digit, columns: predicted)",
             "       " + "".join(f"{j:>5}" for j in range(10))]
    for i in range(10):
        lines.append(f"  {i:>3}  " + "".join(f"{m[i, j]:>5}" if m[i, j] else "    ."
                                             for j in range(10)))
    return "\n".join(lines)


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib (pip install matplotlib); nothing was "
                        "trained") from None


def plot_errors(images, labels, predicted, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    wrong = np.flatnonzero(predicted != labels)[:40]
    cols = 10
    rows = max(1, -(-len(wrong) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols, rows * 1.2), squeeze=False)
    for ax in axes.flat:
        ax.axis('off')
    for ax, k in zip(axes.flat, wrong):
        ax.imshow(images[k, 0], cmap='gray_r')
        ax.set_title(f"{predicted[k]} (is {labels[k]})", fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format='png'))  # a link there: replaced
    print(f"{len(wrong)} misclassified test digits drawn in {path}")


# -- training ----------------------------------------------------------------------
def prepare_out_dir(out_dir):
    """The output folder, made and tried before any training: a bad --out-dir is one
    line now, not a crash at the end that loses the trained model."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix='.write-test', dir=out_dir)  # a fresh name: no link
        os.close(fd)                                                    # planted there followed
        os.remove(probe)
    except OSError as e:
        raise UserError(f"cannot write to the output folder {out_dir}: "
                        f"{e.strerror or e}") from None


def main(argv=None):
    try:
        return run(parse_args(argv))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstopped.", file=sys.stderr)
        return 130


def run(args):
    if args.plot:
        need_matplotlib()
    ckpt = os.path.join(args.out_dir, f'{args.model}.npz')
    if os.path.exists(ckpt) and not args.force:
        raise UserError(f"{ckpt} already holds a trained model; give another --out-dir to keep "
                        f"it, or --force to replace it")
    if args.mnist:
        (x_train, y_train), (x_test, y_test) = load_mnist(args.mnist)
        source = f"MNIST from {args.mnist}"
    else:
        (x_train, y_train), (x_test, y_test) = split_digits(*load_digits(args.data))
        source = os.path.relpath(args.data)
    height, width = x_train.shape[2:]
    prepare_out_dir(args.out_dir)
    tt.manual_seed(args.seed)
    model = make_model(args.model, height, width)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    loader = data.DataLoader(data.TensorDataset(tt.tensor(x_train), tt.tensor(y_train)),
                             batch_size=args.batch_size, shuffle=True)
    print(f"{source}: {len(y_train)} training and {len(y_test)} test images of {height}x{width}; "
          f"{args.model}, {model.num_parameters():,} parameters, {args.epochs} epochs of "
          f"{len(loader)} steps")
    start, steps, epochs_done = time.perf_counter(), 0, 0
    stop = lookinside.StopRequest()  # first Ctrl-C: finish the step, report, save
    try:
        for epoch in range(1, args.epochs + 1):
            total, seen = 0.0, 0
            for images, labels in loader:
                loss = nn.cross_entropy(model(images), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.item() * len(labels)
                seen += len(labels)
                steps += 1
                if stop.requested:
                    break
            if stop.requested:
                break
            epochs_done = epoch
            accuracy = np.mean(predict(model, x_test) == y_test)
            print(f"epoch {epoch:>3}/{args.epochs}  train loss {total / seen:.4f}  test accuracy "
                  f"{100 * accuracy:5.1f}%  {time.perf_counter() - start:6.1f} s", flush=True)
    finally:
        stop.restore()
    seconds = time.perf_counter() - start
    predicted = predict(model, x_test)
    accuracy = np.mean(predicted == y_test)
    print(format_confusion(confusion_matrix(y_test, predicted)))
    print(f"test accuracy {100 * accuracy:.2f}% ({np.sum(predicted == y_test)} of {len(y_test)}); "
          f"training took {seconds:.1f} s, {1000 * seconds / max(steps, 1):.2f} ms per step "
          f"(evaluations included)")
    # an interrupted run is saved too: 'epochs' counts the epochs it finished
    nn.save({'model': args.model, 'image_size': [int(height), int(width)],
             'state_dict': model.state_dict(), 'test_accuracy': float(accuracy),
             'epochs': epochs_done}, ckpt)
    if stop.requested:
        print(f"interrupted in epoch {epochs_done + 1} of {args.epochs}; the model trained so far "
              f"is saved to {ckpt}")
        return 130
    print(f"model saved to {ckpt}")
    if args.plot:
        plot_errors(x_test, y_test, predicted, os.path.join(args.out_dir, f'{args.model}_errors.png'))
    return 0


if __name__ == '__main__':
    tt.tune()  # this process is a training run: tune it
    sys.exit(main())
