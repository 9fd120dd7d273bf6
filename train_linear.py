"""The first experiments, done with the real pieces.

1. Fit y = 2x + 1 with nn.Linear, mse_loss and SGD: the smallest complete training loop.
2. Train a two-layer MLP on a generated two-class spiral with Adam.

Run: python train_linear.py (it takes no options; about a second). Both start from a fixed
seed, so the output is the same on every run; the losses print in scientific notation
(3.71e+01 ... 2.88e-08), so a loss too small for six decimals still shows falling.
"""
import argparse

import tinytorch as tt
import numpy as np

import nn
import optim


def fit_line(steps=201, lr=0.05, log_every=50, seed=0):
    tt.manual_seed(seed)  # the starting w and b: the same on every run
    x = tt.tensor([[1.0], [2.0], [3.0], [4.0]])
    y = 2 * x + 1
    model = nn.Linear(1, 1)
    optimizer = optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        loss = nn.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            print(f"step={step:3d} loss={loss.item():.2e} "
                  f"w={model.weight.item():.4f} b={model.bias.item():.4f}")
    return model.weight.item(), model.bias.item(), loss.item()


def spiral(n_per_class=100, noise=0.2, seed=0):
    """Two interleaved spirals: a classic set that no straight line separates."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n_per_class)) * 3 * np.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    x = np.concatenate([arm, -arm]) + rng.normal(0, noise / (3 * np.pi) * 2, (2 * n_per_class, 2))
    y = np.concatenate([np.zeros(n_per_class), np.ones(n_per_class)]).astype(np.int64)
    return tt.tensor(x.astype(np.float32)), tt.tensor(y)


def fit_spiral(steps=500, hidden=64, lr=0.01, seed=0, log_every=100):
    tt.manual_seed(seed)
    x, y = spiral(seed=seed)
    model = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                          nn.Linear(hidden, 2))
    optimizer = optim.Adam(model.parameters(), lr=lr)
    for step in range(steps + 1):
        logits = model(x)
        loss = nn.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        accuracy = float((logits.argmax(dim=1) == y).array.mean())
        if step % log_every == 0:
            print(f"step={step:3d} loss={loss.item():.2e} accuracy={accuracy:.3f}")
    return accuracy


if __name__ == '__main__':
    argparse.ArgumentParser(description="Fit y = 2x + 1 with a Linear layer and SGD, then "
                            "classify a two-class spiral with a 2-layer MLP and Adam; prints "
                            "the losses as they fall. It takes no options.").parse_args()
    print("Fitting y = 2x + 1 with SGD")
    w, b, _ = fit_line(steps=501)  # after that the loss is float32's rounding, not learning
    print(f"learned w={w:.4f} (want 2), b={b:.4f} (want 1)\n")
    print("Classifying a two-class spiral with a 2-layer MLP and Adam")
    acc = fit_spiral()
    print(f"training accuracy: {acc:.1%}")
