"""learn.py: build tinytorch yourself, one exercise at a time, checked as you go.

    python learn.py                     the checklist, your progress and what to do next
    python learn.py start [DIR]         make your workspace (default mytorch/; never overwrites):
                                        tinytorch's own files with the exercises cut out
    python learn.py start DIR --from-scratch
                                        or an empty engine of your own to write (engine.py,
                                        nn.py: a contract per exercise, no code)
    python learn.py check [STEP|EXERCISE] [--dir DIR]
                                        check your code: one line per exercise (exit 0: all pass)
    python learn.py hint EXERCISE       more help on each call: what to think about, the math,
                                        finally the shipped answer (from scratch: where
                                        tinytorch does the same)
    python learn.py diff EXERCISE       your code beside the shipped one (once its check passes)
    python learn.py map                 your from-scratch engine's names -> tinytorch's
    python learn.py help                this text

Without --dir the workspace is the folder you are in if it is one, else mytorch/ there, else
mytorch/ beside learn.py. Each check stops after a few seconds (a loop that never ends is
named as such) and Ctrl-C stops learn.py with one line. Needs only NumPy.

The exercises are the seed article's checklist, in the order of tinytorch.py's Part I, then
nn.py, optim.py and transformer.py; past it, four optional steps (an LSTM cell, Adam and
AdamW, convolution as a matmul over patches, a KV cache) from the same files, Part II of
tinytorch.py included. In the cut-out track they are cut out of the shipped files (LOCATE
below names each one's function and statements, so the shipped files are the answer key and
carry no markers), and your workspace gets the same files with those lines replaced by a stub
that says what to write, between `# exercise N.k: title` and `# end exercise`. The checks
run your workspace's code (never this folder's): finite differences in float64 with
broadcast operands and a tensor used twice, and at the end of a step a small real run on
your engine. When a check fails, it names the symptom and its likely cause.

The from-scratch track (start --from-scratch) is the same checklist in eight steps, written
from nothing: a workspace of engine.py and nn.py holding only each piece's contract
(signature, what it returns, why), checked by behaviour on your files alone, ending with your
engine training a spiral classifier and a character model on text.txt; past it, optional
step 9 (Adam and AdamW). Its answer key is not in this file (the tests hold it); `map` shows
how your names map onto tinytorch's.
"""
import _thread
import ast
import contextlib
import ctypes
import difflib
import json
import math
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
import time
import traceback
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FILES = ('tinytorch.py', 'files.py', 'nn.py', 'optim.py', 'transformer.py')  # in import order
VERSION = 1  # of the workspace layout: a workspace stamped otherwise is refused
STAMP = '.learn.json'
DEFAULT_DIR = 'mytorch'
ME = 'learn.py'  # this file as the suggested commands call it (main: from the folder you are in)
FOUND = None  # the workspace main found without --dir (then the suggested commands need none)

STEPS = {
    1: "Tensor data, shapes and basic ops: add, sub, mul, div and their broadcasting",
    2: "The dynamic graph and the reverse-topological backward",
    3: "New ops, each checked by finite differences: matmul, sum/mean, exp, log, pow",
    4: "Parameter collection, Linear and SGD",
    5: "Train a linear regression (y = 2x + 1)",
    6: "Stable softmax, normalisation and cross-entropy (and a spiral classifier)",
    7: "Single-head attention, then multi-head",
    8: "A Transformer block, validated on a small text",
    9: "Optional, past the checklist: an LSTM cell, and backpropagation through time",
    10: "Optional, past the checklist: Adam and AdamW (moments, bias correction, decoupled "
        "weight decay)",
    11: "Optional, past the checklist: convolution as a matmul over patches (im2col and its "
        "fold back), max pooling, and a CNN that reads digits",
    12: "Optional, past the checklist: a KV cache for generation",
}
OPTIONAL = 9  # steps from here on go past the seed's checklist: `check` alone skips them
              # until you start one

# What each stub says (inputs, output, what the backward returns; never how), then two
# hints: what to think about, and the math. The third hint is the shipped answer itself.
EXERCISES = {
    '1.1': dict(
        what="grad: an array of the broadcast result's shape; shape: the operand's shape (a "
             "tuple).\nReturn an array of exactly `shape`: d loss / d operand.",
        think="Broadcasting used the operand once per copy. How many copies of a (3,) "
              "operand are in a (4, 3) result, and what does the chain rule do with a value "
              "used several times? Which dims were added in front, which were stretched from 1?",
        math="A value used n times gets the sum of the n gradients. So: sum grad over the "
             "leading dims broadcasting added (grad.ndim - len(shape) of them), and with "
             "keepdims over each dim where shape has 1 but grad does not; then reshape."),
    '1.2': dict(
        what="g: d loss / d out, an array of out's shape; sa, sb: the shapes of a and b.\n"
             "Return (gradient for a, gradient for b): each of its operand's shape, or None for "
             "an operand that does not require grad (a.requires_grad, b.requires_grad).",
        think="If out = a + b, how much does out move when a moves a little? Then what shape "
              "must the gradient of b have when b was broadcast?",
        math="d(a+b)/da = 1 and d(a+b)/db = 1, so both get g, each summed back to its own "
             "shape with unbroadcast(g, shape)."),
    '1.3': dict(
        what="g: d loss / d out (out's shape); sa, sb: the shapes of a and b.\nReturn "
             "(gradient for a, gradient for b), each of its operand's shape, or None for one "
             "that does not require grad.",
        think="out = a - b: which way does out move when b grows?",
        math="d(a-b)/da = 1, d(a-b)/db = -1: a gets unbroadcast(g, sa), b gets "
             "unbroadcast(-g, sb)."),
    '1.4': dict(
        what="g: d loss / d out (out's shape); a.array, b.array: the operands' values; sa, sb: "
             "their shapes.\nReturn (gradient for a, gradient for b), each of its operand's "
             "shape, or None for one that does not require grad.",
        think="out = a * b: if a moves by a little, out moves by that little times what?",
        math="d(a*b)/da = b and d(a*b)/db = a: a gets unbroadcast(g * b, sa), b gets "
             "unbroadcast(g * a, sb)."),
    '1.5': dict(
        what="g: d loss / d out (out's shape); a.array, b.array: the operands' values; sa, sb: "
             "their shapes.\nReturn (gradient for a, gradient for b), each of its operand's "
             "shape, or None for one that does not require grad.",
        think="a / b is a * (1/b). What is the derivative of 1/b?",
        math="d(a/b)/da = 1/b and d(a/b)/db = -a/b^2: a gets unbroadcast(g / b, sa), b gets "
             "unbroadcast(-g * a / (b * b), sb)."),
    '2.1': dict(
        what="root: the output tensor. Return a list of every tensor that root depends on and "
             "that requires grad (root too),\neach exactly once, every tensor after all of its "
             "inputs (_inputs(node) lists a node's inputs). It must work for a chain\nof "
             "100,000 ops.",
        think="A tensor used by two ops is reached twice: how do you make sure it is listed "
              "once? When do you know that all of a node's inputs are already in the list? "
              "Python's recursion stops at about 1000 calls deep.",
        math="Depth-first search, appending a node after all its inputs (post-order), with a "
             "set of visited ids; an explicit stack of (node, expanded) pairs instead of "
             "recursion: pop a node; if expanded, append it; else push (node, True) and then "
             "its unvisited inputs."),
    '2.2': dict(
        what="node: the tensor whose rule just ran; rule_out: what the rule returned, one "
             "gradient (an array or None) per input\nin _inputs(node); grads: a dict id(tensor) "
             "-> the gradient that reached that tensor so far.\nPass each input's gradient on "
             "(skip None, and inputs that do not require grad). Optional: call "
             "_wrong_gradient(node, p, pg)\nwhen pg's shape or dtype is not p's (it names the "
             "op whose rule is wrong).",
        think="In y = x * x the rule returns two gradients, both for x. What must grads[id(x)] "
              "hold after the loop?",
        math="The multivariable chain rule: d root/d x is the sum over every path from x to "
             "root. So add pg to grads[id(p)] if a gradient is there already, else store pg."),
    '2.3': dict(
        what="t: a leaf tensor; g: an array, d root / d t from this backward call. Make t.grad "
             "hold the sum of every backward call's gradient so far: t._grad = "
             "_constant(array) sets it, t._grad.array is its array. g may be shared (x + y "
             "hands x and y one array) or read-only: never store g itself, store a copy.",
        think="Call backward twice without zeroing: what does PyTorch's .grad hold? And if "
              "you store g itself, who else may still write into that array?",
        math="If t._grad is None: t._grad = _constant(a copy of g in t's dtype); else add g "
             "into t._grad.array in place."),
    '3.1': dict(
        what="A, B: the operands as matrices (..., n, k) and (..., k, m); G: g as (..., n, m).\n"
             "Return (ga, gb): ga of a's shape, gb of b's shape (reshape at the end), None for an "
             "input that does not require grad.\nA batch dim that broadcasting added or "
             "stretched must be summed back (unbroadcast).",
        think="Write out one entry out[i, j] = sum_k A[i, k] B[k, j]. Which entries of out "
              "does A[i, k] touch? Then check the shapes: (n, m) and (k, m) must give (n, k).",
        math="dA = G @ B^T and dB = A^T @ G (np.swapaxes(X, -1, -2) transposes the last two "
             "dims), each unbroadcast to the operand's matrix shape, then reshaped to "
             "a.shape / b.shape."),
    '3.2': dict(
        what="g: the gradient of the reduction's result; shape: the input's shape; axes: the "
             "reduced axes (a tuple);\nkeepdim: whether the result kept them as size 1. Return "
             "an array of `shape` (a read-only broadcast view is fine).",
        think="Every input element of a summed slice moved the sum by 1. What is each "
              "one's gradient, and how do you line g up with the input when the summed "
              "axis was dropped?",
        math="d sum/dx_i = 1: put the reduced axes back as size 1 (np.expand_dims(g, axes) "
             "when keepdim is False), then np.broadcast_to(g, shape). mean passes g / n."),
    '3.3': dict(
        what="g: d loss / d out; out: e^x, the forward's result (x.array is x).\nReturn a "
             "1-tuple: (d loss / d x,).",
        think="Which function is its own derivative? And is there a value already computed "
              "that you can reuse?",
        math="d e^x/dx = e^x, which is out: return (g * out,)."),
    '3.4': dict(
        what="g: d loss / d out; x.array: the input.\nReturn a 1-tuple: (d loss / d x,).",
        think="How fast does log x grow at x = 1, at x = 10?",
        math="d log(x)/dx = 1/x: return (g / x,)."),
    '3.5': dict(
        what="g: d loss / d out; a.array: the base; p: the exponent, a Python number.\nReturn "
             "a 1-tuple: (d loss / d a,).",
        think="The power rule from calculus, and one special case: p = 0.",
        math="d(x^p)/dx = p x^(p-1), times g (0 when p = 0)."),
    '4.1': dict(
        what="kind: 'parameters' or 'buffers'; prefix: the name to put in front; recurse: "
             "include the sub-modules.\nself.named_modules(prefix=prefix, remove_duplicate="
             "remove_duplicate) yields (dotted name, module) for this module and every module\n"
             "below it; module._own(kind) gives a module's own (name, value) pairs. Yield "
             "('dotted.name', value) for every member;\nwith remove_duplicate, a tensor shared "
             "by two modules (weight tying) is yielded once.",
        think="A model is a tree: a Block holds Linears that hold weights. Which of the "
              "tree's modules must you visit, and what if two of them hold the same tensor?",
        math="For each (module_prefix, module) in the tree (just [(prefix, self)] without "
             "recurse), for each (name, value) in module._own(kind): skip an id already seen, "
             "remember it, yield module_prefix + '.' + name (no dot for an empty prefix)."),
    '4.2': dict(
        what="x2: x as rows (rows, in); weight.array: (out, in); g: d loss / d y, (..., out): "
             "reshape it to (rows, outs) as g2.\nReturn (gx, gw) when bias is None, else (gx, gw, "
             "gb): gx of x's shape xs, gw of the weight's shape, gb of the bias's shape bs;\nNone "
             "for an x or weight that does not require grad.",
        think="y = x W^T + b. Check the shapes: which product of g2 (rows, out) with W "
              "(out, in) or x2 (rows, in) gives (rows, in), and which gives (out, in)? And b "
              "was added to every row.",
        math="dx = g @ W, dW = g^T @ x, db = g summed over the rows (it was broadcast), "
             "then unbroadcast to bs."),
    '4.3': dict(
        what="p: the parameter (change p.array in place); g: its gradient, an array; "
             "group['lr']: the learning rate.\nOne step of gradient descent.",
        think="The gradient points uphill. Which way do you step, and how far?",
        math="p <- p - lr * g."),
    '4.4': dict(
        what="self._params(): the parameters. set_to_none=True: set each p.grad to None; "
             "False: keep each existing .grad\ntensor and write zeros into its array.",
        think="Gradients accumulate (exercise 2.3). What happens to the second training "
              "step if nothing clears them?",
        math="set_to_none: p.grad = None for each p; otherwise p.grad.array[...] = 0 where "
             "p.grad is not None."),
    '5.1': dict(
        what="d = input.array - target.array; g: d loss / d out, of d's shape (the loss per "
             "element is d^2).\nReturn (gradient for input, gradient for target), None for "
             "one that does not require grad.",
        think="Differentiate (x - y)^2 by x, then by y.",
        math="d (x-y)^2/dx = 2 (x - y), d (x-y)^2/dy = -2 (x - y), each times g."),
    '6.1': dict(
        what="logits.array: (N, C) numbers, as large as 1000, in any float dtype. Define "
             "three arrays: e (N, C), the exp of the logits shifted by something that keeps "
             "exp from overflowing (softmax's numerators); sumexp (N, 1), e's row sums; logp "
             "(N, C), log_softmax of the logits, finite wherever the logits are.",
        think="exp(1000) is inf in float64. softmax(z) = softmax(z - c) for any c per row: "
              "which c makes every exponent <= 0, and one of them exactly 0?",
        math="shifted = z - max_j z_j (per row, keepdims=True); e = exp(shifted); sumexp = "
             "e.sum(axis=1, keepdims=True); lse = log(sumexp)[:, 0]; logp = shifted - "
             "lse[:, None]."),
    '6.2': dict(
        what="rows: (R, n), one row per normalised group, a view of the caller's x: leave it "
             "unchanged; eps: a small number.\nSet mean (R, 1), each row's mean; rstd (R, 1), "
             "the reciprocal of each row's standard deviation (the biased one, over n), eps "
             "keeping a constant row finite; xhat (R, n), a new array: the rows at mean 0 and "
             "variance 1. Why: every layer then sees inputs of one scale, and the backward "
             "after your lines reuses rstd and xhat.",
        think="What is the variance of a row of equal numbers, and what happens when you "
              "divide by its square root? Does LayerNorm divide by n or by n - 1?",
        math="mean = rows.mean(1, keepdims), var = ((rows - mean)^2).mean(1, keepdims) (the "
             "biased variance, / n), rstd = 1/sqrt(var + eps), xhat = (rows - mean) * rstd."),
    '7.1': dict(
        what="q: (..., Tq, d), k: (..., Tk, d) tensors; scale: None (then 1/sqrt(d)) or a "
             "number; mask: None, or a bool array/tensor\n(True = may attend) or a float one "
             "to add to the scores; is_causal: query i sees keys 0..i only (_causal_mask(Tq, "
             "Tk)\nis that bool mask). Set scores (..., Tq, Tk), the masked scaled scores (the "
             "lines after your code read it), and\nunless zero_empty_rows, return the weights: "
             "each row sums to 1 over its allowed keys and is exactly 0 elsewhere.",
        think="Dot products of random d-dimensional vectors grow like sqrt(d): what does "
              "that do to a softmax? A masked key must get weight 0 and the rest must still "
              "sum to 1: before or after the softmax?",
        math="scores = q @ k^T / sqrt(d) (k.transpose(-2, -1)); disallowed positions set to "
             "-inf with scores.masked_fill(~allowed, -np.inf) (a float mask is added); then "
             "scores.softmax(-1)."),
    '7.2': dict(
        what="First block: q, k, v are (B, T, C); H heads of D = C // H channels; make each "
             "(B, H, T, D), head h = channels h*D..(h+1)*D-1.\nSecond block: y is (B, H, T, D); "
             "return it as (B, T, C), the heads side by side again.",
        think="reshape only regroups numbers in memory order: which shape keeps each "
              "position's channels together? Then which dims must swap so that each head "
              "is a batch of (T, D) matrices?",
        math="x.reshape(B, T, H, D).transpose(1, 2) splits; y.transpose(1, 2).reshape(B, T, C) "
             "undoes it."),
    '8.1': dict(
        what="x: (B, T, C). A pre-LayerNorm block from self.ln_1, self.attn (call it "
             "self.attn(h, cache, layer)), self.ln_2 and self.mlp.\nReturn (B, T, C).",
        think="Where does the normalisation go in a pre-LN block, and what keeps a path "
              "from the output straight back to x?",
        math="x = x + attn(ln_1(x)); return x + mlp(ln_2(x))."),
    '9.1': dict(
        what="x: (N, input); h, c: (N, hidden), the previous hidden state and cell; w_ih (4 "
             "hidden, input), w_hh (4 hidden, hidden), b_ih, b_hh (4 hidden,) or None: PyTorch's "
             "weights, their four blocks in PyTorch's order i (input gate), f (forget gate), g "
             "(the candidate), o (output gate). Set c, the new cell, and h, the new hidden "
             "state, with tinytorch ops (linear, .chunk(4, -1), .sigmoid(), .tanh()): then the "
             "gradient flows back through time by itself.",
        think="A cell carries a memory c. Which gate decides how much of the old memory to "
              "keep, which how much of the new candidate to write, and which how much of the "
              "memory to show as h? Which of the four is content rather than a gate, and what "
              "range should content have?",
        math="z = linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh); i, f, g, o = z.chunk(4, -1); "
             "i, f, o = sigmoid of each; g = tanh(g); c = f * c + i * g; h = o * tanh(c)."),
    '10.1': dict(
        what="p: the parameter's array, g: its gradient; m, v: the moving averages of g and of "
             "g^2, arrays the optimizer keeps between steps: change them in place (m[...] = "
             "...), or the next step sees the old ones; t: the step number, counted from 1; "
             "lr, b1, b2, eps: the settings.\nFirst block: update m and v. Second "
             "block: one Adam step of p (the model holds that array), with PyTorch's Adam's "
             "bias correction and eps. Why: m and v start at 0, so early on they are too small; "
             "dividing by the root of v makes the step about lr whatever the gradient's scale.",
        think="m and v start at 0: after the first step m = (1 - b1) g, a tenth of g, and v a "
              "thousandth of g^2. What number undoes that at step t? And what is the size of "
              "a step when g is the same every time?",
        math="m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (both in place: m[...] = ...); "
             "m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t); p -= lr * m_hat / "
             "(sqrt(v_hat) + eps)."),
    '10.2': dict(
        what="wd: the weight decay; group['decoupled_weight_decay']: True in AdamW; lr: the "
             "learning rate; p.array: the parameter; g: its gradient (an array). Apply the "
             "decay: in Adam (decoupled False) as PyTorch's Adam does, as L2 regularisation "
             "through the gradient; in AdamW decoupled from the gradient: p itself shrinks "
             "by the fraction lr * wd, in place, before the Adam step (Adam with "
             "decoupled_weight_decay=True too). With wd = 0 nothing changes. g may be p.grad's "
             "own array: never change it in place.",
        think="Adam divides every step by sqrt(v). A decay term added to g is divided too: "
              "how much does a large weight with a small gradient then shrink? Which version "
              "shrinks every weight by the same fraction each step, whatever its gradient?",
        math="Adam: g = g + wd * p.array (L2: the gradient of wd/2 |p|^2). AdamW: p.array *= "
             "1 - lr * wd, and g stays as it is."),
    '11.1': dict(
        what="x: the padded image, an array (N, C, H + 2 ph, W + 2 pw); w: the window: "
             "w.kernel = (kh, kw), w.dilation = (dh, dw), w.stride = (sh, sw), and w.out = "
             "(oh, ow), the number of patch positions. Define cols, an array (N, C, kh, kw, "
             "oh, ow): cols[n, c, i, j, y, x] is kernel element (i, j) of the patch at output "
             "position (y, x), the padded image at row y*sh + i*dh, column x*sw + j*dw.",
        think="A loop over all oh * ow patch positions works, but there are few kernel "
              "elements and many positions: which pixels does kernel element (i, j) visit, "
              "over all the positions? Is that a slice of the image?",
        math="For each (i, j): cols[:, :, i, j] = x[..., i*dh : i*dh + sh*(oh-1) + 1 : sh, "
             "j*dw : j*dw + sw*(ow-1) + 1 : sw] (that is _window_slice(w, i, j)): kh * kw "
             "strided copies of the image."),
    '11.2': dict(
        what="g: d loss / d cols, (N, C*kh*kw, oh*ow); xs: the padded image's shape; w, n, c, "
             "kh, kw, oh, ow, ph, pw, h, wd: as in the forward (h, wd: the unpadded height and "
             "width). Return (gx,): gx (N, C, h, wd), d loss / d the input image.",
        think="The forward copied each pixel into every patch that covers it. How many "
              "patches cover a pixel when the stride is 1 and the kernel 3x3, and what does "
              "the chain rule do with a value used several times? And the padding: is it "
              "part of the input?",
        math="gx = zeros(xs); for each (i, j): gx[..., _window_slice(w, i, j)] += g[:, :, i, "
             "j] (g reshaped to (n, c, kh, kw, oh, ow)); overlapping patches add up; return "
             "(gx[:, :, ph:ph+h, pw:pw+wd],): the padding's part dropped."),
    '11.3': dict(
        what="input: (N, C, H, W); weight: (O, C, kh, kw); bias: (O,) or None; kernel, "
             "dilation, padding, stride: as given; n, o: N and O; oh, ow: the output's height "
             "and width. With tinytorch ops (tt.unfold, reshape, @, +), return the "
             "convolution (N, O, oh, ow). tt.unfold takes input, kernel_size, dilation, "
             "padding, stride, in that order.",
        think="tt.unfold gives every patch as a column (N, C*kh*kw, oh*ow). One output "
              "value is the dot product of a kernel with a patch: which matrix of kernels, "
              "times the columns, gives every output channel at every position at once? And "
              "where does the bias, one number per output channel, line up?",
        math="cols = tt.unfold(input, kernel, dilation, padding, stride); out = "
             "weight.reshape(o, -1) @ cols ((O, C*kh*kw) @ (N, C*kh*kw, L) -> (N, O, L)); out "
             "= out + bias.reshape(o, 1); return out.reshape(n, o, oh, ow)."),
    '11.4': dict(
        what="g: d loss / d the max along dim d (the result's shape: dim d dropped unless "
             "keepdim); idx: the index of the first largest element along d (an array with "
             "dim d kept, of size 1); xs: x's shape. Return (gx,): gx of shape xs and g's "
             "dtype, d loss / d x. The same rule serves min (then idx is the smallest's): "
             "use idx, do not search x again.",
        think="Nudge an element that is not the largest: does the max move? Nudge the "
              "largest one? And when two are equal, which one did max pick?",
        math="d max/dx_i = 1 at the index returned, 0 elsewhere: gx = zeros(xs); "
             "np.put_along_axis(gx, idx, g (np.expand_dims(g, d) unless keepdim), axis=d)."),
    '12.1': dict(
        what="q, k, v: this call's queries, keys and values (B, H, T, D) for its T new "
             "positions; cache.layers[layer]: None on the first call, else the (keys, values) "
             "of every earlier position, (B, H, past, D) each. Set past (the number of "
             "earlier positions), make k and v hold the earlier positions' keys and values "
             "followed by the new ones, and keep them in cache.layers[layer] for the next "
             "call. Take past from this layer's entry: cache.length counts layer 0's, which "
             "layer 0 has already extended when the next layer runs.",
        think="A new token's query must see every earlier key and value, which earlier calls "
              "computed already. Which dim of (B, H, T, D) is the positions? And the mask "
              "after your lines: where does query i of this call sit among all positions?",
        math="if cache.layers[layer] is not None: past_k, past_v = cache.layers[layer]; past = "
             "past_k.shape[2]; k = tt.cat([past_k, k], dim=2), the same for v; then, in every "
             "case, cache.layers[layer] = (k, v)."),
    '12.2': dict(
        what="idx: the tokens so far (B, n); window: its last block_size tokens; use_cache: "
             "whether to keep a KVCache; cache: None at first; bs: the block size. Set logits "
             "(B, T, vocab), the model's logits for the window (the lines after read the last "
             "position's). Without the cache: the model on the window. With it: the first "
             "call encodes the window into a new KVCache(self.config.n_layer); afterwards "
             "only the newest token goes through the model; when idx.shape[1] > bs (the "
             "window slides), rebuild the cache from the window each step. self(tokens, "
             "cache=cache) returns (logits, loss).",
        think="The cache holds keys and values computed at fixed positions. Once the window "
              "slides by one token, every token sits one position earlier than when it was "
              "cached: what does that do to its position embedding, and so to its key?",
        math="if not use_cache: logits, _ = self(window); elif cache is None or idx.shape[1] "
             "> bs: cache = KVCache(self.config.n_layer); logits, _ = self(window, "
             "cache=cache); else: logits, _ = self(idx[:, -1:], cache=cache)."),
}
# Where the shipped answer carries guards for edge cases a first answer need not have, hint
# 3 shows hint 2 as plain code first (checked by the tests like every answer), then those.
EXERCISES['2.3'].update(plain="""\
if t._grad is None:
    t._grad = _constant(g.astype(t.dtype, copy=True))  # a copy: g may be shared
else:
    t._grad.array += g""", guards="a path that keeps g itself when nothing else can hold it "
                                  "(section 20's speed-up)")
EXERCISES['3.5'].update(plain="""\
return (np.zeros_like(g) if p == 0 else g * p * a.array ** (p - 1),)""",
                        guards="a bool exponent (p is False), and _power_of: sqrt for 0.5 and "
                               "-0.5, as PyTorch, so that edge values (-inf, -0.0) agree")
EXERCISES['6.2'].update(plain="""\
mean = rows.mean(axis=1, keepdims=True)
var = ((rows - mean) ** 2).mean(axis=1, keepdims=True)
rstd = 1 / np.sqrt(var + eps)
xhat = (rows - mean) * rstd""", guards="a shift by each row's first value, so that a large "
                                       "mean costs no digits; an overflowing variance as nan, as "
                                       "PyTorch's; xhat built in place, one array, not four")
for _k, _v in EXERCISES.items():
    _v['step'] = int(_k.split('.')[0])
ORDER = sorted(EXERCISES, key=lambda k: tuple(map(int, k.split('.'))))
CORE = [ex for ex in ORDER if EXERCISES[ex]['step'] < OPTIONAL]  # the seed's checklist
RUNS = {2: "gradients of a broadcast expression with a tensor used three times and one "
           "changed in place after an op read it, through your ops and your backward, vs "
           "finite differences",
        3: "gradients of a small model through your whole engine vs finite differences",
        5: "fit y = 2x + 1 with your Linear, mse_loss, backward and SGD",
        6: "a spiral classifier, and cross-entropy on logits of 1000",
        7: "multi-head attention vs the shipped implementation (values and gradients)",
        8: "a tiny Transformer learns a small text (loss below 0.3 within 300 steps)",
        9: "an LSTM on your cell learns 'hello world! ' (loss below 0.1 within 150 steps)",
        10: "a spiral classifier trained by your AdamW (at least 95% within 300 steps)",
        11: "a CNN on your convolution and max pooling reads handwritten digits (at least 93% "
            "of 297 unseen digits after 300 steps)",
        12: "a small GPT generates 40 tokens past its block size with your cache and without: "
            "the same tokens"}


class Usage(Exception):
    """A bad argument or workspace: one line, exit 2."""


class Fail(Exception):
    """A check failed; the message says what and why."""


# ---------------------------------------------------------------------------
# The exercises in the source. The shipped files are the answer key and carry no
# markers: each exercise is found by its function (with ast) and, where it is only part
# of the function, by its first and last statement. A statement is found by its code
# (comments and line breaks do not count), or, when no statement has that code, by the
# one clearly most like it: so renaming a local, reflowing a comment or adding a
# statement near an exercise changes nothing, and an anchor that is gone is one line
# naming the exercise and the file (the tests fail too), never a silent drift.
# ---------------------------------------------------------------------------
LOCATE = {  # exercise: (file, title, [(function, first statement, last statement), ...])
    # first None: the function's body after its docstring; last None: to the body's end
    '1.1': ('tinytorch.py', "unbroadcast", [('unbroadcast', None, None)]),
    '1.2': ('tinytorch.py', "add's backward", [('add.backward', None, None)]),
    '1.3': ('tinytorch.py', "sub's backward", [('sub.backward', None, None)]),
    '1.4': ('tinytorch.py', "mul's backward", [('mul.backward', None, None)]),
    '1.5': ('tinytorch.py', "div's backward", [('div.backward', None, None)]),
    '2.1': ('tinytorch.py', "the topological order (inputs before outputs)",
            [('_topological_order', None, None)]),
    '2.2': ('tinytorch.py', "backward: pass each gradient on to the inputs",
            [('_walk', 'for p, pg in zip(_inputs(node), rule_out):',
              'for p, pg in zip(_inputs(node), rule_out):')]),
    '2.3': ('tinytorch.py', "accumulate into .grad", [('_accumulate', None, None)]),
    '3.1': ('tinytorch.py', "matmul's backward", [('matmul.backward', 'ga = gb = None', None)]),
    '3.2': ('tinytorch.py', "sum's and mean's backward", [('_expand_back', None, None)]),
    '3.3': ('tinytorch.py', "exp's backward", [('exp.backward', None, None)]),
    '3.4': ('tinytorch.py', "log's backward", [('log.backward', None, None)]),
    '3.5': ('tinytorch.py', "pow's backward (a number as the exponent)",
            [('_pow_number.backward', None, None)]),
    '4.1': ('nn.py', "collect the parameters of a module tree",
            [('Module._named_members', None, None)]),
    '4.2': ('nn.py', "linear's backward",
            [('linear.backward', 'g2 = g.reshape(rows, outs)', None)]),
    '4.3': ('optim.py', "SGD's update", [('SGD._update', "p.array -= group['lr'] * g", None)]),
    '4.4': ('optim.py', "zero_grad", [('Optimizer.zero_grad', None, None)]),
    '5.1': ('nn.py', "mse_loss's backward", [('mse_loss.backward', None, None)]),
    '6.1': ('nn.py', "a stable log-softmax (inside cross_entropy)",
            [('cross_entropy', 'shifted = logits.array - logits.array.max(axis=1, keepdims=True)',
              'logp = shifted - lse[:, None]')]),
    '6.2': ('nn.py', "layer norm's normalisation",
            [('layer_norm', 'first = np.where(np.isfinite(rows[:, :1]), rows[:, :1], 0)',
              'xhat *= rstd')]),
    '7.1': ('nn.py', "attention weights",
            [('attention_weights',
              'scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale',
              'if not zero_empty_rows:')]),
    '7.2': ('transformer.py', "multi-head",
            [('CausalSelfAttention.attend', 'q = q.reshape(B, T, H, C // H).transpose(1, 2)',
              'v = v.reshape(B, T, H, C // H).transpose(1, 2)'),
             ('CausalSelfAttention.attend', 'return y.transpose(1, 2).reshape(B, T, C)', None)]),
    '8.1': ('transformer.py', "the Transformer block", [('Block.forward', None, None)]),
    '9.1': ('nn.py', "an LSTM cell",
            [('lstm_cell',
              'i, f, g, o = (linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)).chunk(4, -1)',
              'h = o * c.tanh()')]),
    # past the checklist, from Part II of tinytorch.py too
    '10.1': ('optim.py', "Adam's step (moments and bias correction)",
             [('adam_step', 'm[...] = b1 * m + (1 - b1) * g', 'v[...] = b2 * v + (1 - b2) * g * g'),
              ('adam_step', 'm_hat = m / (1 - b1 ** t)', None)]),
    '10.2': ('optim.py', "weight decay: Adam's L2 and AdamW's decoupled",
             [('Adam._update', "if wd and group['decoupled_weight_decay']:",
               "if wd and group['decoupled_weight_decay']:")]),
    '11.1': ('tinytorch.py', "im2col: every patch becomes a column (unfold)",
             [('unfold', 'cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)',
               'for i in range(kh):')]),
    '11.2': ('tinytorch.py', "the columns folded back: unfold's backward (col2im)",
             [('unfold.backward', None, None)]),
    '11.3': ('nn.py', "a convolution as one matmul over the patches",
             [('conv2d', 'cols = tt.unfold(input, kernel, dilation, padding, stride)', None)]),
    '11.4': ('tinytorch.py', "max's backward (max pooling's gradient)",
             [('_extreme_dim.backward', None, None)]),
    '12.1': ('transformer.py', "the KV cache: the keys and values of earlier positions",
             [('CausalSelfAttention.attend', 'if cache.layers[layer] is not None:',
               'cache.layers[layer] = (k, v)')]),
    '12.2': ('transformer.py', "generate with the cache: only the newest token runs",
             [('GPT.generate', 'if not use_cache:', 'if not use_cache:')]),
}
for _k, (_f, _title, _) in LOCATE.items():
    EXERCISES[_k].update(file=_f, title=_title)
_MARK = re.compile(r'^(\s*)# exercise (\d+\.\d+): (.*)$')
_END = re.compile(r'^\s*# end exercise\s*$')
_blocks = {}


class Mismatch(Exception):
    """The shipped files no longer hold an exercise's lines: one line, exit 2."""


def _find(tree, path, before):
    """The def at a dotted path (class or function names), the first one in the file."""
    nodes = tree.body
    node = None
    for name in path.split('.'):
        node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == name and n.lineno < before), None)
        if node is None:
            return None
        nodes = list(ast.walk(node))[1:] if isinstance(node, ast.FunctionDef) else node.body
    return node


def _statements(fn):
    """Every list of sibling statements inside a function, outermost first."""
    out = [fn.body]
    for n in ast.walk(fn):
        for field in ('body', 'orelse', 'finalbody'):
            stmts = getattr(n, field, None)
            if n is not fn and isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                out.append(stmts)
    return out


def _code(st):
    """A statement's first line as ast writes it: no comments, one line however it wraps."""
    return ast.unparse(st).split('\n')[0]


def _skeleton(st):
    """A statement's form without its names: what renaming a local leaves unchanged (the
    header only of a for, if, while or with)."""
    parts = [type(st).__name__]
    for field, value in ast.iter_fields(st):
        if field in ('body', 'orelse', 'finalbody', 'handlers', 'type_comment'):
            continue
        for v in (value if isinstance(value, list) else [value]):
            parts.append(ast.dump(v) if isinstance(v, ast.AST) else repr(v))
    return re.sub(r"(id|arg)='[^']*'", r"\1=_", ' '.join(parts))


def _anchor(candidates, anchor):
    """The index in candidates (statements) of the one an anchor names: the first whose
    code starts with it; else, when the anchor is a whole statement, the one of the same
    form with other names (a renamed local), the one most like it if several, or None."""
    for k, st in enumerate(candidates):
        if _code(st).startswith(anchor):
            return k
    try:
        want = _skeleton(ast.parse(anchor + ('\n    pass' if anchor.endswith(':') else '')).body[0])
    except SyntaxError:  # a prefix, not a statement: only the exact match counts
        return None
    same = [(difflib.SequenceMatcher(None, anchor, _code(st)).ratio(), k)
            for k, st in enumerate(candidates) if _skeleton(st) == want]
    same.sort(reverse=True)
    if len(same) == 1 or len(same) > 1 and same[1][0] <= same[0][0] - 0.1:
        return same[0][1]
    return None


def blocks(ex):
    """[(first line, end line) as 0-based slice bounds, indent] of an exercise's shipped lines."""
    if ex in _blocks:
        return _blocks[ex]
    f, _, specs = LOCATE[ex]
    try:
        text = (HERE / f).read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError) as e:
        raise Mismatch(f"exercise {ex}: cannot read {HERE / f} ({type(e).__name__}: {e})") from None
    lines = text.split('\n')
    end = next((i + 1 for i, ln in enumerate(lines) if ln.startswith('# END OF PART I')),
               len(lines) + 1)  # tinytorch.py: the checklist's exercises are in Part I
    if EXERCISES[ex]['step'] >= OPTIONAL:  # the optional steps' may be anywhere in the file
        end = len(lines) + 1
    out = []
    for path, first, last in specs:
        fn = _find(tree, path, end)
        if fn is None:
            part = ' in Part I' if end <= len(lines) else ''
            raise Mismatch(f"exercise {ex}: {f} has no {path}{part}: this learn.py does not "
                           "match the files beside it")
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        if first is not None:
            sibling_lists = [stmts for stmts in _statements(fn)]
            flat = [(stmts, k) for stmts in sibling_lists for k in range(len(stmts))]
            k = _anchor([stmts[i] for stmts, i in flat], first)
            if k is None:
                raise Mismatch(f"exercise {ex}: {path} in {f} has no statement like {first!r}: "
                               "this learn.py does not match the files beside it")
            stmts, i = flat[k]
            body = stmts[i:]
            if last is not None:
                stop = _anchor(body, last)
                if stop is None:
                    raise Mismatch(f"exercise {ex}: {path} in {f} has no statement like "
                                   f"{last!r} after {first!r}: this learn.py does not match "
                                   "the files beside it")
                body = body[:stop + 1]
        a, b = body[0].lineno - 1, body[-1].end_lineno
        indent = lines[a][:len(lines[a]) - len(lines[a].lstrip())]
        out.append((a, b, indent))
    _blocks[ex] = out
    return out


def regions(text):
    """The exercises in a workspace file (between the markers learn.py wrote there):
    [(exercise, title, indent, first body line, end marker line)] in file order."""
    out, lines, i = [], text.split('\n'), 0
    while i < len(lines):
        m = _MARK.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not _END.match(lines[j]):
                j += 1
            out.append((m.group(2), m.group(3).strip(), m.group(1), i + 1, j))
            i = j
        i += 1
    return out


def shipped_code(ex):
    """The shipped answer of an exercise: its lines, per block."""
    lines = (HERE / EXERCISES[ex]['file']).read_text().split('\n')
    return ['\n'.join(lines[a:b]) for a, b, _ in blocks(ex)]


def _index_exercises():
    """Find every exercise in the shipped files, or say what is missing."""
    for ex in ORDER:
        blocks(ex)


def _wrap(text, width):
    """text as lines of at most width, never breaking a parenthesised phrase of up to 60
    characters (so `(_causal_mask(Tq, Tk) is that bool mask)` stays whole)."""
    chars, opened = list(' '.join(text.split())), []
    for i, c in enumerate(chars):
        if c == '(':
            opened.append(i)
        elif c == ')' and opened:
            a = opened.pop()
            if i - a <= 60:
                chars[a:i] = [('\0' if x == ' ' else x) for x in chars[a:i]]
    return [ln.replace('\0', ' ') for ln in textwrap.wrap(''.join(chars), width,
                                                           break_long_words=False,
                                                           break_on_hyphens=False)]


def reads_after(ex, k=0):
    """The names block k of an exercise sets that its function reads after it (for a stub
    to name: they are what the learner's lines must define)."""
    f, _, specs = LOCATE[ex]
    path, first, _ = specs[k]
    if first is None:
        return []
    text = (HERE / f).read_text()
    a, b, _ = blocks(ex)[k]
    fn = _find(ast.parse(text), path, len(text))
    stored, read = [], set()
    own = set()  # the reads inside a nested function of a name it binds itself (its own loop)
    for inner in ast.walk(fn):
        if inner is not fn and isinstance(inner, (ast.FunctionDef, ast.Lambda)):
            names = list(ast.walk(inner))
            binds = ({n.id for n in names
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                     | {a.arg for a in ast.walk(inner.args) if isinstance(a, ast.arg)})
            own |= {id(n) for n in names if isinstance(n, ast.Name) and n.id in binds}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and id(n) not in own:
            if isinstance(n.ctx, ast.Store) and a < n.lineno <= b and n.id not in stored:
                stored.append(n.id)
            elif isinstance(n.ctx, ast.Load) and n.lineno > b:
                read.add(n.id)
    return [name for name in stored if name in read]


def stub(ex, indent, block):
    """The lines that replace an exercise's code in the workspace."""
    e = EXERCISES[ex]
    say = [f"{indent}# TODO exercise {ex} ({e['title']}){' continued' if block else ''}:"]
    what = e['what'] if not block else ''
    names = reads_after(ex, block)
    if names:
        what += f" (The lines after this block read {', '.join(names)}.)"
    say += [f"{indent}#   {part}" for part in _wrap(what, 92 - len(indent))]
    say.append(f'{indent}raise NotImplementedError("exercise {ex}: not implemented yet; write it '
               f'here, then run: python learn.py check {ex}")')
    return say


# Code beside an exercise that would answer it (issue 54: "the tensor-power rule sits above
# 3.5, RMSprop's in-place update below Adam, _window_slice is exactly 11.1/11.2's slicing, and
# AdamW's docstring gives its decay"): in the workspace only, replaced by text that does not
# spell the answer out. The shipped text must be in the file once (start refuses otherwise, and
# the tests fail). What the engine calls keeps working, written otherwise (_window_slice from
# the positions 11.1's text states, adam_step_ as adam_step); what nothing the checks run calls
# (pow's rule for a tensor exponent, RMSprop's step) raises, saying that tinytorch's own file
# has it.
HIDE = [  # (file, exercises, shipped text, workspace text)
    ('tinytorch.py', '3.5',  # pow of two tensors: the power rule for the base
     '        """d(a^b)/da = b a^(b-1)  (0 where b = 0, even for a nan g)\n',
     '        """d(a^b)/da: the power rule (hidden here while exercise 3.5 is open)\n'),
    ('tinytorch.py', '3.5',
     '                ga = np.where(b.array == 0, 0, g * (b.array * a.array ** (b.array - 1)))\n',
     '                raise NotImplementedError(\n'
     '                    "pow: the gradient of a base to a tensor power is "\n'
     '                    "hidden in this workspace "\n'
     '                    "while exercise 3.5 is open: tinytorch\'s own tinytorch.py has it")\n'),
    ('tinytorch.py', '3.5',  # float tensor ** integer tensor
     '        """d(a^b)/da = b a^(b-1)  (b - 1 in b\'s integer dtype; 0 where b = 0, '
     'even for a nan g)"""\n',
     '        """d(a^b)/da: the power rule (hidden here while exercise 3.5 is open)"""\n'),
    ('tinytorch.py', '3.5',
     '            below = (b.array - 1).astype(a.dtype)\n'
     '            return (unbroadcast(np.where(e.array == 0, 0, g * (e.array * a.array '
     '** below)), a.shape),)\n',
     '            raise NotImplementedError(\n'
     '                "pow: the gradient of a base to an integer tensor power is "\n'
     '                "hidden in this workspace "\n'
     '                "while exercise 3.5 is open: tinytorch\'s own tinytorch.py has it")\n'),
    ('tinytorch.py', '3.5',  # _power_of's docstring
     '    rule uses it too: d(x^0.5)/dx = 0.5 x^(-0.5) is nan at -inf, as PyTorch\'s."""\n',
     '    rule uses it too."""\n'),
    ('tinytorch.py', '11.1 and 11.2',  # pooling calls it: the same positions, as index arrays
     '    """The positions that kernel element (i, j) visits, in the padded input: a '
     'strided slice."""\n'
     '    (dh, dw), (sh, sw), (oh, ow) = w.dilation, w.stride, w.out\n'
     '    return (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),\n'
     '            slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))\n',
     '    """The positions that kernel element (i, j) visits in the padded input, as 11.1\'s\n'
     '    text gives them, each evenly spaced list as a slice (a view: pooling writes through\n'
     '    it). Hidden while exercises 11.1 and 11.2 are open: tinytorch\'s own has it."""\n'
     '    at = [np.arange(n) * s + k * d for n, s, k, d in zip(w.out, w.stride, (i, j), '
     'w.dilation)]\n'
     '    return tuple(slice(int(p[0]), int(p[-1]) + 1, s) for p, s in zip(at, w.stride))\n'),
    ('optim.py', '10.1 and 10.2',  # Adam's docstring: the contract, not the formulas
     '    """m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;\n'
     '    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).\n'
     "    weight_decay here is L2 (added to g), as in PyTorch's Adam, unless\n"
     '    decoupled_weight_decay=True (that is AdamW). amsgrad=True divides by the largest\n'
     '    v seen so far instead of the current v."""\n',
     '    """PyTorch\'s Adam: each step moves a parameter by about lr, scaled by running '
     'averages\n'
     "    of its gradient and of the gradient's square (adam_step, exercise 10.1). weight_decay\n"
     "    is Adam's L2 unless decoupled_weight_decay=True (that is AdamW; exercise 10.2).\n"
     '    amsgrad=True divides by the largest v seen so far instead of the current v."""\n'),
    ('optim.py', '10.2',  # AdamW's docstring: the contract, not the decay
     '    """Adam with decoupled weight decay: p *= (1 - lr * wd) before the Adam step."""\n',
     '    """Adam with decoupled weight decay: the weights themselves shrink each step, not\n'
     '    through the gradient (how: exercise 10.2)."""\n'),
    ('optim.py', '10.1',  # RMSprop: 10.1's pattern (nothing in learn.py calls it)
     '    """Divide g by a running root mean square of the gradients:\n'
     '    v = alpha v + (1 - alpha) g^2;  p -= lr * g / (sqrt(v) + eps).\n'
     '    centered=True subtracts the squared running mean of g from v (a variance);\n'
     '    momentum > 0 keeps buf = momentum * buf + g / (sqrt(v) + eps) and steps by lr * buf.\n'
     '    weight_decay is L2 (g += wd * p)."""\n',
     '    """Divide g by a running root mean square of the gradients (hidden in this workspace\n'
     '    while exercise 10.1, Adam\'s step, is open: tinytorch\'s own optim.py has it)."""\n'),
    ('optim.py', '10.1',
     "        v = state['square_avg']\n"
     '        v[...] = alpha * v + (1 - alpha) * g * g\n'
     "        if group['centered']:\n"
     "            mean = state['grad_avg']\n"
     '            mean[...] = alpha * mean + (1 - alpha) * g\n'
     '            avg = np.sqrt(v - mean * mean) + eps\n'
     '        else:\n'
     '            avg = np.sqrt(v) + eps\n'
     '        if momentum > 0:\n'
     "            buf = state['momentum_buffer']\n"
     '            buf[...] = momentum * buf + g / avg\n'
     '            p.array -= lr * buf\n'
     '        else:\n'
     '            p.array -= lr * g / avg\n',
     '        raise NotImplementedError(\n'
     '            "RMSprop\'s step is hidden in this workspace "\n'
     '            "while exercise 10.1 is open: tinytorch\'s own optim.py has it")\n'),
    ('optim.py', '10.1',  # the Speed section's Adam: the plain one (learn.py runs that anyway)
     '    """adam_step\'s arithmetic with one scratch array and no other temporaries (a third\n'
     '    of the memory traffic; a test checks that both give the same numbers)."""\n'
     '    bias1, bias2 = 1 - b1 ** t, 1 - b2 ** t\n'
     '    m *= b1\n'
     '    tmp = np.multiply(g, 1 - b1)\n'
     '    m += tmp  # m = b1 m + (1 - b1) g\n'
     '    v *= b2\n'
     '    np.multiply(g, g, out=tmp)\n'
     '    tmp *= 1 - b2\n'
     '    v += tmp  # v = b2 v + (1 - b2) g^2\n'
     '    np.sqrt(v, out=tmp)\n'
     '    tmp /= math.sqrt(bias2)\n'
     '    tmp += eps  # sqrt(v / (1 - b2^t)) + eps\n'
     '    np.divide(m, tmp, out=tmp)\n'
     '    tmp *= lr / bias1\n'
     '    p -= tmp  # p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)\n',
     '    """adam_step (tinytorch\'s own, with one scratch array, is hidden in this '
     'workspace while\n'
     '    exercise 10.1 is open)."""\n'
     '    return adam_step(p, g, m, v, t, lr, b1, b2, eps)\n'),
]


def hide(f, text):
    """text (file f as the learner gets it) with HIDE's neighbours replaced."""
    for file, ex, shipped, mine in HIDE:
        if file == f:
            if text.count(shipped) != 1:
                raise Mismatch(f"exercise {ex}: {f} no longer holds, once, the lines learn.py "
                               f"hides from its workspace ({shipped.strip()[:40]!r}...): this "
                               "learn.py does not match the files beside it")
            text = text.replace(shipped, mine)
    return text


def workspace_text(f):
    """File f as the learner gets it: every exercise's lines replaced by its stub, between
    a '# exercise N.k: title' and an '# end exercise' line, and HIDE's neighbours replaced."""
    lines = (HERE / f).read_text().split('\n')
    spans = sorted(((a, b, indent, ex, k) for ex in ORDER if EXERCISES[ex]['file'] == f
                    for k, (a, b, indent) in enumerate(blocks(ex))), reverse=True)
    for a, b, indent, ex, k in spans:
        lines[a:b] = ([f"{indent}# exercise {ex}: {EXERCISES[ex]['title']}"] + stub(ex, indent, k)
                      + [f"{indent}# end exercise"])
    head = (f"# Your copy of {f} (made by learn.py, version {VERSION}): fill in each block "
            "between '# exercise N.k' and '# end exercise',\n# then run: python learn.py check "
            "N.k  (it imports nothing from the tinytorch folder: move this folder anywhere)\n")
    return head + hide(f, '\n'.join(lines))  # (after the cuts: blocks are the shipped lines)


# ---------------------------------------------------------------------------
# The workspace
# ---------------------------------------------------------------------------
def read_stamp(ws):
    if not ws.is_dir():
        raise Usage(f"no workspace at {ws}/: make one with: python {ME} start {ws}")
    try:
        stamp = json.loads((ws / STAMP).read_text())
    except (OSError, ValueError):
        stamp = {}
    if stamp.get('version') != VERSION:
        raise Usage(f"{ws}/ was not made by this learn.py (workspace version "
                    f"{stamp.get('version', 'none')}, this is {VERSION}): start a new one with "
                    f"python {ME} start NEWDIR and copy your answers over")
    files = SC_FILES if stamp.get('track') == 'scratch' else FILES
    missing = [f for f in files if not (ws / f).is_file()]
    if missing:
        raise Usage(f"{ws}/ lacks {', '.join(missing)}: start a new workspace with python "
                    "learn.py start NEWDIR and copy your answers over")
    return stamp


def write_stamp(ws, stamp):
    (ws / STAMP).write_text(json.dumps(stamp, indent=1) + '\n')


def start(ws, scratch=False):
    """Make a workspace: the cut-out track's copies of the shipped files with the exercises
    cut out, or (scratch) the from-scratch track's contracts, engine.py and nn.py, and a
    small text."""
    if ws.exists():
        raise Usage(f"{ws} already exists; learn.py never overwrites: pick another name "
                    f"(python {ME} start OTHERDIR) or check it with --dir {ws}")
    if scratch:
        with track('scratch'):
            texts = {f: sc_workspace_text(f) for f in FILES}
            texts[SC_TEXT] = SC_TEXT_BODY
            ws.mkdir(parents=True)
            for f, text in texts.items():
                (ws / f).write_text(text, encoding='utf-8')
            write_stamp(ws, {'version': VERSION, 'track': 'scratch', 'hints': {}})
            print(f"Made {ws}/ with an empty engine of your own to write: {', '.join(FILES)} "
                  f"(the contract of each piece, no code) and {SC_TEXT} (the text your "
                  f"model learns at step 8): {len(CORE)} exercises in {OPTIONAL - 1} steps, and "
                  f"past the checklist, optional {', '.join(e for e in ORDER if e not in CORE)}.")
            print(next_step(ws, {}))
        return
    texts = {f: workspace_text(f) for f in FILES}  # all found before anything is made
    ws.mkdir(parents=True)
    for f in FILES:
        (ws / f).write_text(texts[f])
    write_stamp(ws, {'version': VERSION, 'hints': {}})
    extra = [ex for ex in ORDER if ex not in CORE]
    print(f"Made {ws}/ with your copies of {', '.join(FILES)}: {len(CORE)} exercises to fill in"
          + (f" (and, past the checklist, optional {', '.join(extra)})." if extra else "."))
    print(next_step(ws, {}))


def locate(ws, ex):
    """(file, line number) of an exercise's first block in the workspace."""
    f = EXERCISES[ex]['file']
    for e, _, _, a, _ in regions((ws / f).read_text()):
        if e == ex:
            return f, a
    return f, None


def is_stub(ws, ex):
    """Is the exercise's stub still in the workspace (not started)?"""
    return f'"exercise {ex}: not implemented yet' in (ws / EXERCISES[ex]['file']).read_text()


def next_step(ws, states, runs_ok=None):
    """What to do next: the first exercise that fails (states[ex] False), or has no result
    yet and is not started. runs_ok: whether the steps' runs passed (None: not run)."""
    todo = [ex for ex in ORDER if states.get(ex) is False
            or states.get(ex) is not True and is_stub(ws, ex) and ex in CORE]
    if not todo and all(states.get(ex) for ex in CORE):
        if runs_ok is None:
            return (f"All {len(CORE)} exercises pass their checks. Now the steps' runs on your "
                    f"engine: python {ME} check{_dir_arg(ws)}")
        if TRACK == 'scratch':
            more = [ex for ex in ORDER if ex not in CORE and is_stub(ws, ex)]
            return (f"All {len(CORE)} exercises pass, and every step's run: your own engine "
                    f"trains a classifier and a character model. How it maps onto tinytorch's: "
                    f"python {ME} map" + (
                        f"; past the checklist, optional: exercise {more[0]} "
                        f"({EXERCISES[more[0]]['title']}): python {ME} check {more[0]}"
                        f"{_dir_arg(ws)}" if more else ""))
        more = [ex for ex in ORDER if ex not in CORE and is_stub(ws, ex)]
        extra = [ex for ex in ORDER if ex not in CORE]
        done = sum(1 for ex in extra if states.get(ex))
        return (f"All {len(CORE)} exercises pass, and every step's run" + (
            f"; past the checklist, {done} of {len(extra)} optional exercises pass too." if done
            else ".") + (
            f" Past the checklist, optional: exercise {more[0]} ({EXERCISES[more[0]]['title']}): "
            f"python {ME} check {more[0]}{_dir_arg(ws)}" if more else ""))
    if not todo:
        return (f"No exercise is left unwritten. Check them all, with the steps' runs: "
                f"python {ME} check{_dir_arg(ws)}")
    ex = todo[0]
    f, line = locate(ws, ex)
    where = f"{ws}/{f}" + (f", line {line}" if line else "")
    do = ("read the TODO comment there and replace the raise with your code" if is_stub(ws, ex)
          else "fix it (its check says what is wrong)")
    return (f"Next: exercise {ex} ({EXERCISES[ex]['title']}) in {where}: {do}.\n"
            f"Then: python {ME} check {ex}{_dir_arg(ws)}   (stuck? python {ME} hint {ex}"
            f"{_dir_arg(ws)})")


def _dir_arg(ws):
    return '' if str(ws) == DEFAULT_DIR or FOUND is not None and ws == FOUND else f' --dir {ws}'


# ---------------------------------------------------------------------------
# Loading the learner's code, never the project's
# ---------------------------------------------------------------------------
_compiled = {}


def load(ws):
    """The workspace's modules, run fresh from its files in their own namespace: the
    project's tinytorch (sys.modules, sys.path) is put back untouched afterwards. Returns
    {name: module, or the one-line reason it does not import}."""
    saved_modules, saved_path, saved_meta = dict(sys.modules), list(sys.path), list(sys.meta_path)
    mods = {}
    try:
        for k in list(sys.modules):
            if k.split('.')[0] in ('tinytorch', 'files', 'nn', 'optim', 'transformer', 'engine'):
                del sys.modules[k]
        for f in FILES:
            name = f[:-3]
            path = ws / f
            src = path.read_text()
            try:
                code = _compiled.get((str(path), src))
                if code is None:
                    code = _compiled[(str(path), src)] = compile(src, str(path), 'exec')
                m = types.ModuleType(name)
                m.__file__ = str(path)
                sys.modules[name] = m
                with time_limit(LIMIT):
                    exec(code, m.__dict__)
                mods[name] = m
            except KeyboardInterrupt:
                raise
            except Hang as e:
                sys.modules.pop(name, None)
                where = _hang_place(e, ws)[1]
                mods[name] = f"your {ws / f} {_endless(LIMIT)} (importing it){where}"
            except BaseException as e:  # noqa: BLE001 (the learner's file: report, go on)
                sys.modules.pop(name, None)
                mods[name] = f"your {ws / f} does not import: {_where(e, ws)}"
    finally:
        sys.modules.clear()
        sys.modules.update(saved_modules)
        sys.path[:], sys.meta_path[:] = saved_path, saved_meta
    tt = mods.get('tinytorch')
    if tt is not None and not isinstance(tt, str):
        tt.fast = False  # the one switch: the plain code runs, your lines, nothing bypasses them
    return mods


def _where(e, ws):
    """An exception as one line, with the last place in the workspace it passed."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError in {ws / Path(e.filename or '?').name} line {e.lineno}: {e.msg}"
    place = ''
    frames = _frames(e, ws)
    mine = [(f, n, code, exercise_at(ws, f, n)) for f, n, code in frames]
    at = next((fr for fr in mine if fr[3]), mine[0] if mine else None)  # the learner's line first
    if at:
        f, n, code, inside = at
        place = f" ({ws / f} line {n}{', exercise ' + inside if inside else ''}: {code})"
        if at is not mine[0]:
            place += f" (raised in {mine[0][0]} line {mine[0][1]}: {mine[0][2]})"
    msg = str(e).split('\n')[0]
    return f"{type(e).__name__}: {msg}{place}"


def reference():
    """The shipped modules: the answer key the attention and Transformer checks compare with."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import tinytorch
    import nn
    import transformer
    return tinytorch, nn, transformer


# ---------------------------------------------------------------------------
# Tools of the checks
# ---------------------------------------------------------------------------
def rng(seed=0):
    return np.random.default_rng(seed)


def leaf(tt, arr, grad=True):
    return tt.tensor(np.array(arr, dtype=np.float64), requires_grad=grad)


def numeric(f, arrays, i, g, eps=1e-6):
    """d sum(f(*arrays) * g) / d arrays[i] by central differences, in float64."""
    x = arrays[i]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        keep = x[idx]
        x[idx] = keep + eps
        up = np.sum(f(*arrays) * g)
        x[idx] = keep - eps
        down = np.sum(f(*arrays) * g)
        x[idx] = keep
        out[idx] = (up - down) / (2 * eps)
    return out


def close(a, b, tol=1e-5):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol)


def close_relative(a, b, tol=1e-6):
    """close() relative to b's largest value: for arrays of tiny numbers (Adam's moments of
    gradients of 1e-4), which close()'s absolute tolerance would call equal to anything."""
    return np.allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


def worst(got, want, who="finite differences say"):
    d = np.abs(np.asarray(got, dtype=np.float64) - want)
    i = np.unravel_index(np.argmax(d), d.shape) if d.ndim else ()
    return (f"at index {tuple(int(k) for k in i)} you gave {float(np.asarray(got)[i]):.6g}, "
            f"{who} {float(want[i]):.6g}")


def rule_grads(out, g, n):
    """Run a result's backward rule directly (no graph walk needed)."""
    if out._backward is None:
        raise Fail("the result has no backward rule: did the forward still call from_op?")
    g = np.array(g)
    g.setflags(write=False)  # the caller's: a rule that writes into it fails at its own line
    try:
        got = out._backward(g)
    except ValueError as e:
        if not _wrote_into(e):
            raise
        raise Fail(f"the rule wrote into g, the gradient it was handed ({_where(e, _SC_WS[0])}): "
                   "g belongs to the caller (backward hands one g to several rules), so make a "
                   "new array: -g, g * b, not g *= ...") from None
    if not isinstance(got, tuple) or len(got) != n:
        raise Fail(f"the rule must return a tuple of {n} gradient(s), one per input; it returned "
                   f"{type(got).__name__}{'' if not isinstance(got, tuple) else f' of {len(got)}'}")
    return got


def check_input_grad(name, got, want, shape, mistakes=(), math_=''):
    """One input's gradient vs finite differences, with the typical mistakes named."""
    if got is None:
        raise Fail(f"the gradient for {name} is None, but {name} requires grad")
    if not isinstance(got, np.ndarray) and not isinstance(got, np.generic):
        raise Fail(f"the gradient for {name} must be a NumPy array, got {type(got).__name__} "
                   "(use the .array of tensors inside a rule)")
    got = np.asarray(got)
    if got.shape != tuple(shape):
        for pred, msg in mistakes:
            if pred(got):
                raise Fail(msg)
        if got.size == math.prod(shape):
            raise Fail(f"the gradient for {name} has shape {got.shape}, but {name} has shape "
                       f"{tuple(shape)}: the right number of elements in another shape: reshape "
                       f"it to {tuple(shape)} (nothing to sum)")
        raise Fail(f"the gradient for {name} has shape {got.shape}, but {name} has shape "
                   f"{tuple(shape)}: did you sum the gradient back to the shape of {name}? "
                   "(unbroadcast)")
    if close(got, want):
        return
    for pred, msg in mistakes:
        if pred(got):
            raise Fail(msg)
    if close(-got, want):
        raise Fail(f"sign error: the gradient for {name} is the negative of the right one "
                   f"({math_})")
    if close(got, 2 * want):
        raise Fail(f"the gradient for {name} is twice the right one ({math_})")
    if close(2 * got, want):
        raise Fail(f"the gradient for {name} is half the right one ({math_})")
    how = _how_wrong(got, want)
    if how:
        raise Fail(f"the gradient for {name} is {how} ({math_})")
    raise Fail(f"the gradient for {name} is wrong: {worst(got, want)} ({math_})")


def _how_wrong(got, want):
    """How a gradient differs from finite differences, where a cheap test names it: zero
    everywhere, a constant factor (as 1/k or k when k is whole), or the transpose; else ''."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if not np.any(want) or not np.all(np.isfinite(got)):
        return ''
    if not np.any(got):
        return ("zero everywhere, though finite differences are not: g's part is lost "
                "(multiplied by 0, or a zeros array returned)")
    c = float(np.sum(got * want) / np.sum(want * want))  # the best single factor
    if c != 0 and close(got, c * want):
        k = 1 / c
        factor = (f"1/{round(k)} of the right one" if abs(k) > 1.5 and abs(k - round(k)) < 1e-3
                  else f"{round(c)} times the right one" if abs(c - round(c)) < 1e-3
                  else f"{c:.4g} times the right one")
        return (f"{factor} at every element: a constant factor too many or too few, the "
                "rest is right")
    if got.ndim >= 2 and got.shape[-1] == got.shape[-2] and close(np.swapaxes(got, -1, -2), want):
        return ("the transpose of the right one (the right numbers, rows and columns swapped): "
                "check which factor is transposed, and the order of the product")
    return ''


def check_binary(m, op, npf, math_, shapes=((4, 3), (3,)), mistakes=None, positive=False):
    """A two-input op's rule against finite differences, for broadcast operands (both
    ways round) and for one tensor used as both operands."""
    tt = m['tinytorch']
    r = rng(1)
    cases = [shapes, shapes[::-1], ((2, 1, 3), (4, 1)), ((3,), (3,))]
    for k, (sa, sb) in enumerate(cases):
        a = r.uniform(0.5, 2.0, sa) if positive else r.standard_normal(sa)
        b = r.uniform(0.5, 2.0, sb) if positive else r.standard_normal(sb)
        same = k == 3
        A = leaf(tt, a)
        B = A if same else leaf(tt, b)
        out = getattr(tt, op)(A, B)
        g = r.standard_normal(out.shape)
        ga, gb = rule_grads(out, g, 2)
        bb = a if same else b
        for i, (name, got, shape) in enumerate((('a', ga, sa), ('b', gb, sb))):
            want = numeric(npf, [a.copy(), bb.copy()], i, g)
            extra = (mistakes or (lambda *_: ()))(name, a, bb, g)
            check_input_grad(name if not same else f"{name} (x {op} x: one tensor as both "
                             "operands)", got, want, shape, extra, math_)
    A = tt.tensor(np.ones(shapes[0], np.float32) * 1.5, requires_grad=True)
    B = tt.tensor(np.ones(shapes[1], np.float32) * 0.5, requires_grad=True)
    out = getattr(tt, op)(A, B)
    for name, got in zip('ab', rule_grads(out, np.ones(out.shape, np.float32), 2)):
        if np.asarray(got).dtype != np.float32:
            raise Fail(f"for float32 operands {op}'s gradient for {name} is "
                       f"{np.asarray(got).dtype}: a rule returns its input's dtype (an array you "
                       "make: in g's dtype)")


def _like_broadcast(name, own_shape, full_shape):
    return (lambda got: got.shape == tuple(full_shape) != tuple(own_shape),
            f"the gradient for {name} has the broadcast shape {tuple(full_shape)}, not {name}'s "
            f"own shape: did you sum the gradient back to the shape of {name}? (unbroadcast)")


# ---------------------------------------------------------------------------
# The checks, one per exercise. Each first calls the exercise's own code, so a stub
# still in place reports itself; then it looks for the typical mistakes.
# ---------------------------------------------------------------------------
def check_1_1(m):
    ub = m['tinytorch'].unbroadcast
    g = np.arange(12.0).reshape(4, 3)
    keep = ub(g, (4, 3))
    if not close(keep, g):
        raise Fail("unbroadcast changed a gradient that already has the operand's shape")
    try:
        lead = ub(g.copy(), (3,))
    except ValueError:
        lead = None
    ones = []
    for shape in ((1, 3), (4, 1)):
        try:
            ones.append(ub(g.copy(), shape))
        except ValueError:
            ones.append(None)
    ok_ones = all(o is not None and close(o, g.sum(axis=ax, keepdims=True))
                  for o, ax in zip(ones, (0, 1)))
    if lead is None or not close(lead, g.sum(0)):
        raise Fail("for an operand of shape (3,) broadcast to (4, 3) the gradient must be "
                   "summed over the leading dim broadcasting added (4 uses -> the sum of 4 rows)"
                   + ("" if ok_ones else "; and dims of size 1 must be summed too"))
    if not ok_ones:
        raise Fail("an operand of shape (4, 1) stretched to (4, 3): sum the gradient over each "
                   "dim where the operand has size 1 (keepdims=True), not only the leading dims")
    deep = ub(np.ones((2, 4, 3)), (4, 1))
    if not close(deep, np.full((4, 1), 6.0)):
        raise Fail("(2, 4, 3) back to (4, 1) must sum the leading dim and the stretched one: "
                   "each entry is the sum of 6 ones")
    try:
        two = ub(np.ones((2, 5, 4, 3)), (4, 3))
    except ValueError:
        two = None
    if two is None or not close(two, np.full((4, 3), 10.0)):
        raise Fail("(2, 5, 4, 3) back to (4, 3): broadcasting added two dims in front; sum over "
                   "each of them, not only the first (each entry is the sum of 2 * 5 = 10 ones)")


def _mul_mistakes(name, a, b, g):
    other, own = (b, a) if name == 'a' else (a, b)

    def swapped(got):
        return close(got, m_unb(g * own, got.shape)) and not close(own, other)
    return [(swapped, f"mul's rule is swapped: the gradient for {name} is g times the OTHER "
             f"operand (d(a*b)/da = b, d(a*b)/db = a), you used {name} itself")]


def m_unb(x, shape):
    """Sum x down to shape (the checks' own unbroadcast, for spotting mistakes)."""
    try:
        return _m_unb(x, shape)
    except ValueError:
        return np.full(shape, np.nan)


def _m_unb(x, shape):
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    ax = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=ax, keepdims=True) if ax else x


def _div_mistakes(name, a, b, g):
    if name != 'b':
        return [(lambda got: close(got, m_unb(g * b, got.shape)),
                 "div's gradient for a multiplies by b; d(a/b)/da = 1/b: divide g by b")]
    return [(lambda got: close(got, m_unb(-g * a / b, b.shape)),
             "d(a/b)/db = -a/b^2: divide by b twice (you divided once)")]


def _add_mistakes(name, a, b, g):
    own = a.shape if name == 'a' else b.shape
    return [_like_broadcast(name, own, np.broadcast_shapes(a.shape, b.shape))]


def check_1_2(m):
    check_binary(m, 'add', np.add, "d(a+b)/da = 1, d(a+b)/db = 1", mistakes=_add_mistakes)


def check_1_3(m):
    check_binary(m, 'sub', np.subtract, "d(a-b)/da = 1, d(a-b)/db = -1", mistakes=_add_mistakes)


def check_1_4(m):
    check_binary(m, 'mul', np.multiply, "d(a*b)/da = b, d(a*b)/db = a",
                 mistakes=lambda *x: _add_mistakes(*x) + _mul_mistakes(*x))


def check_1_5(m):
    check_binary(m, 'div', np.divide, "d(a/b)/da = 1/b, d(a/b)/db = -a/b^2", positive=True,
                 mistakes=lambda *x: _add_mistakes(*x) + _div_mistakes(*x))


# -- step 2: the graph walk, on ops the check makes itself (no step-1 code needed) --------
def _ops(tt):
    def mul(a, b):
        return tt.from_op(a.array * b.array, 'mul', (a, b),
                          lambda g: (g * b.array if a.requires_grad else None,
                                     g * a.array if b.requires_grad else None))

    def exp(a):
        out = np.exp(a.array)
        return tt.from_op(out, 'exp', (a,), lambda g: (g * out,))

    def add(a, b):
        return tt.from_op(a.array + b.array, 'add', (a, b),
                          lambda g: (g if a.requires_grad else None,
                                     g if b.requires_grad else None))
    return mul, exp, add


def check_2_1(m):
    tt = m['tinytorch']
    mul, exp, add = _ops(tt)
    x = leaf(tt, [0.5, -1.0])
    y = exp(x)
    z = mul(x, y)  # x used twice: by exp and by mul
    root = add(z, y)
    order = tt._topological_order(root)
    if not isinstance(order, list):
        raise Fail(f"_topological_order must return a list, got {type(order).__name__}")
    ids = [id(n) for n in order]
    if len(set(ids)) != len(ids):
        raise Fail("a node is visited twice: x feeds both exp and mul, and your order lists it "
                   f"{ids.count(id(x))} times; keep a set of visited nodes and list each once")
    missing = [n._op or 'leaf' for n in (x, y, z, root) if id(n) not in ids]
    if missing:
        raise Fail(f"your order misses {', '.join(missing)}: follow every input of every node "
                   "(_inputs(node)) down to the leaves, root included")
    pos = {i: k for k, i in enumerate(ids)}
    for node in (y, z, root):
        for p in node._parents:
            if pos[id(p)] > pos[id(node)]:
                raise Fail(f"wrong order: '{node._op}' comes before its input "
                           f"'{p._op or 'leaf'}'; every node must come after all of its inputs "
                           "(append a node only when all its inputs are done: post-order)")
    twice = tt._topological_order(mul(x, x))  # both inputs one tensor: pushed twice
    if [id(n) for n in twice].count(id(x)) > 1:
        raise Fail(f"x * x: your order lists x {[id(n) for n in twice].count(id(x))} times: both "
                   "of mul's inputs are x, so x is pushed twice before it is expanded; when you "
                   "take a node that is already visited, skip it")
    c = leaf(tt, [2.0, 3.0], grad=False)
    if any(n is c for n in tt._topological_order(mul(x, c))):
        raise Fail("x * c with a c that does not require grad: your order lists c; leave out "
                   "inputs whose requires_grad is False (no gradient goes to them, and a graph "
                   "full of constants would be walked for nothing)")
    chain = x
    for _ in range(3000):
        chain = tt.from_op(chain.array, 'id', (chain,), lambda g: (g,))
    try:
        deep = tt._topological_order(chain)
    except RecursionError:
        raise Fail("a chain of 3000 ops hits Python's recursion limit: walk the graph with an "
                   "explicit stack (a list you push and pop), not recursion") from None
    if len(deep) != 3001:
        raise Fail(f"a chain of 3000 ops and its leaf must give 3001 nodes, got {len(deep)}")


def _known_order(root):
    order, seen = [], set()
    todo = [(root, False)]
    while todo:
        n, done = todo.pop()
        if done:
            order.append(n)
        elif id(n) not in seen:
            seen.add(id(n))
            todo.append((n, True))
            todo.extend((p, False) for p in n._parents if p.requires_grad)
    return order


def _walk_grads(tt, root, g0):
    """Leaf gradients from the learner's _walk, with a known-good order (exercise 2.1's
    part is not needed for this check)."""
    real = tt._topological_order
    tt._topological_order = _known_order
    try:
        return {id(n): g for n, g, r in tt._walk(root, g0) if r is None}
    finally:
        tt._topological_order = real


def check_2_2(m):
    tt = m['tinytorch']
    mul, exp, add = _ops(tt)
    x = leaf(tt, [0.5, -1.0, 2.0])
    grads = _walk_grads(tt, mul(x, x), np.ones(3))
    got = grads.get(id(x))
    if got is None:
        raise Fail("no gradient reached x in x * x: pass each input's gradient on into grads")
    want = 2 * x.array
    if close(got, x.array):
        raise Fail("x * x gave half the gradient (x instead of 2x): both of mul's inputs are x, "
                   "and the second gradient overwrote the first; a tensor reached twice gets "
                   "the sum (grads[key] + pg)")
    if not close(got, want):
        raise Fail(f"x * x: d/dx must be 2x = {want.tolist()}, got {np.asarray(got).tolist()}")
    c = leaf(tt, [1.0, 2.0, 3.0], grad=False)
    w = leaf(tt, [0.1, 0.2, 0.3])
    y = exp(w)
    root = add(mul(y, c), y)  # a diamond: y reached from two sides; c needs no grad
    grads = _walk_grads(tt, root, np.ones(3))
    if not close(grads.get(id(w)), np.exp(w.array) * (c.array + 1)):
        raise Fail("through a diamond (y used by mul and by add) the gradient of w is wrong: "
                   "the two paths into y must add up before y's rule runs")


def check_2_3(m):
    tt = m['tinytorch']
    t = leaf(tt, [1.0, 2.0])
    g1 = np.array([1.0, 1.0])
    try:
        tt._accumulate(t, g1)
    except TypeError as e:
        if 'grad' in str(e):
            raise Fail(".grad must be a Tensor: wrap the array with _constant(array) "
                       f"(t._grad = ...); got: {e}") from None
        raise
    if not isinstance(t.grad, tt.Tensor):
        raise Fail(f".grad must be a Tensor (t._grad = _constant(array)), got "
                   f"{type(t.grad).__name__}")
    if np.shares_memory(t.grad.array, g1):
        raise Fail("your .grad is the caller's array itself (it shares g's memory): x + y hands "
                   "x and y one gradient array, so their .grads would be one array, and scaling "
                   "one in place (clip_grad_norm_) changes both, or fails on a read-only g; "
                   "store a copy (g.astype(t.dtype, copy=True))")
    t32 = tt.tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    tt._accumulate(t32, np.array([0.5, 0.25]))  # a float64 gradient for a float32 tensor
    if t32.grad.array.dtype != np.float32:
        raise Fail(f".grad must have its tensor's dtype: a float32 tensor got a "
                   f"{t32.grad.array.dtype} .grad; store g.astype(t.dtype, copy=True)")
    g2 = np.array([10.0, 20.0])
    tt._accumulate(t, g2)
    if close(t.grad.array, g2):
        raise Fail("the second backward overwrote .grad: gradients must accumulate across "
                   "backward calls (add into t._grad.array), until zero_grad clears them")
    if not close(t.grad.array, g1 + g2):
        raise Fail(f"after gradients {g1.tolist()} and {g2.tolist()} .grad must be "
                   f"{(g1 + g2).tolist()}, got {t.grad.array.tolist()}")


# -- step 3: new ops --------------------------------------------------------------------
def check_3_1(m):
    tt = m['tinytorch']
    r = rng(3)
    cases = [((3, 3), (3, 3)), ((2, 3), (3, 4)), ((2, 3, 4), (2, 4, 2)), ((2, 3, 4), (4, 2)),
             ((4,), (4, 2)), ((3, 4), (4,))]
    for sa, sb in cases:
        a, b = r.standard_normal(sa), r.standard_normal(sb)
        A, B = leaf(tt, a), leaf(tt, b)
        out = tt.matmul(A, B)
        g = r.standard_normal(out.shape)
        try:
            ga, gb = rule_grads(out, g, 2)
        except ValueError as e:
            if len(sa) > 2 and len(sb) > 2:
                raise Fail(f"a batch {sa} @ {sb}, nothing broadcast: your rule raised ({e}): "
                           "transpose only the last two dims (np.swapaxes(X, -1, -2)); .T "
                           "reverses every dim of a batched array") from None
            if len(sa) > 2:
                raise Fail(f"a {sb} matrix used by every item of a {sa} batch: its gradient must "
                           f"be summed over the batch dims (unbroadcast); your rule raised: "
                           f"{e}") from None
            raise Fail(f"matmul's rule fails for shapes {sa} @ {sb} ({e}): check which "
                       "operand to transpose; dA = g @ B^T, dB = A^T @ g") from None
        wa = numeric(np.matmul, [a.copy(), b.copy()], 0, g)
        wb = numeric(np.matmul, [a.copy(), b.copy()], 1, g)
        mist_a = [(lambda got: sa == sb and close(got, g @ b), "transposed matmul rule: dA = g @ "
                   "B^T (you used g @ B); check the shapes: (n, m) @ (m, k) gives (n, k)"),
                  (lambda got: sa == sb and close(got, b.T @ g), "dA's factors are swapped: "
                   "dA = g @ B^T, with g on the left (matrix products do not commute)")]
        mist_b = [(lambda got: sa == sb and close(got, g @ a) or sa == sb and close(got, a @ g),
                   "transposed matmul rule: dB = A^T @ g (A transposed, on the left)"),
                  (lambda got: len(sa) > 2 and got.shape == sa[:-2] + sb,
                   f"a {sb} matrix used by every item of a {sa} batch: sum its gradient over "
                   "the batch dims (unbroadcast)")]
        if len(sa) > 2 and len(sb) > 2:  # the 2-D cases passed: what is left is the batch
            batch = (lambda got: True, f"a batch {sa} @ {sb}, nothing broadcast: the gradient is "
                     "wrong though the 2-D cases are right: transpose only the last two dims "
                     "(np.swapaxes(X, -1, -2)); .T reverses every dim of a batched array")
            mist_a, mist_b = [batch], [batch]
        check_input_grad(f'a {sa}', ga, wa, sa, mist_a, "dA = g @ B^T")
        check_input_grad(f'b {sb}', gb, wb, sb, mist_b, "dB = A^T @ g")


def check_3_2(m):
    tt = m['tinytorch']
    r = rng(4)
    x = r.standard_normal((3, 4))
    for dim, keep in ((1, False), (0, False), (1, True), (None, False), ((0, 2), False),
                      ((1, 2), True), (-1, False), ((-3, 1), False)):
        x = r.standard_normal((3, 4)) if isinstance(dim, int) and dim >= 0 or dim is None \
            else r.standard_normal((2, 3, 4))
        for op, npf in (('sum', np.sum), ('mean', np.mean)):
            X = leaf(tt, x)
            out = getattr(tt, op)(X, dim, keep)
            g = r.standard_normal(out.shape)
            try:
                got, = rule_grads(out, g, 1)
            except ValueError as e:
                raise Fail(f"{op}(dim={dim}, keepdim={keep}): g {g.shape} cannot be spread "
                           f"over {x.shape}: put the reduced dims back as size 1 first "
                           f"(np.expand_dims) when keepdim is False ({e})") from None
            want = numeric(lambda v: npf(v, axis=dim, keepdims=keep), [x.copy()], 0, g)
            spread = [(lambda got: np.size(got) < x.size,
                       f"{op}(dim={dim}, keepdim={keep}): the gradient has shape "
                       f"{np.shape(got)}, but x has {x.shape}: spread g back over the reduced "
                       "dims (np.broadcast_to(g, shape)), each element of a slice gets g")]
            check_input_grad(f'x in {op}(dim={dim}, keepdim={keep})', got, want, x.shape, spread,
                             "every element of a reduced slice gets g (mean: g / n)")


def _unary(m, op, npf, xs, math_, mistakes=lambda x, g: ()):
    tt = m['tinytorch']
    g = rng(5).standard_normal(xs.shape)
    out = getattr(tt, op)(leaf(tt, xs))
    got, = rule_grads(out, g, 1)
    want = numeric(npf, [xs.copy()], 0, g)
    check_input_grad('x', got, want, xs.shape, mistakes(xs, g), math_)


def check_3_3(m):
    _unary(m, 'exp', np.exp, rng(6).standard_normal((2, 3)), "d e^x/dx = e^x",
           lambda x, g: [(lambda got: close(got, g), "exp's rule passed g through unchanged: "
                          "d e^x/dx = e^x, so multiply g by the output (out)"),
                         (lambda got: close(got, g * x), "exp's rule multiplied g by x: "
                          "the derivative of e^x is e^x itself (out), not x")])


def check_3_4(m):
    _unary(m, 'log', np.log, rng(7).uniform(0.5, 3.0, (2, 3)), "d log(x)/dx = 1/x",
           lambda x, g: [(lambda got: close(got, g * x), "log's rule multiplied g by x: "
                          "d log(x)/dx = 1/x, so divide g by x"),
                         (lambda got: close(got, g * np.log(x)), "log's rule used log(x): "
                          "its derivative is 1/x")])


def check_3_5(m):
    tt = m['tinytorch']
    r = rng(8)
    at0 = np.array([0.0, 2.0, -1.5])
    got, = rule_grads(tt.pow(leaf(tt, at0), 0), np.ones(3), 1)
    if np.isnan(np.asarray(got, dtype=np.float64)).any():
        raise Fail("x ** 0 at x = 0: your gradient is nan, but x^0 is the constant 1, whose "
                   "gradient is 0 everywhere; p x^(p-1) at p = 0, x = 0 is 0 * inf = nan, so give "
                   "zeros when p == 0")
    x = r.uniform(0.5, 2.0, (2, 3))
    for p in (3, 2.5, -1, 0):
        g = r.standard_normal(x.shape)
        out = tt.pow(leaf(tt, x), p)
        got, = rule_grads(out, g, 1)
        want = numeric(lambda v: v ** p, [x.copy()], 0, g)
        check_input_grad(f'x in x ** {p}', got, want, x.shape,
                         [(lambda got: close(got, g * p * x ** p), "pow's exponent is off by one: "
                           "d(x^p)/dx = p x^(p-1)"),
                          (lambda got: close(got, g * x ** (p - 1)), "pow's rule forgot the "
                           "factor p: d(x^p)/dx = p x^(p-1)")], "d(x^p)/dx = p x^(p-1)")


# -- step 4: parameters, Linear, SGD -------------------------------------------------------
def check_4_1(m):
    tt, nn = m['tinytorch'], m['nn']

    class Inner(nn.Module):
        def __init__(self):
            self.lin = nn.Linear(2, 3)
            self.scale = nn.Parameter(tt.ones(3))

    class Outer(nn.Module):
        def __init__(self):
            self.first = nn.Linear(3, 2)
            self.inner = Inner()
            self.tied = Inner()
            self.tied.lin.weight = self.inner.lin.weight  # weight tying

    model = Outer()
    got = list(model.named_parameters())
    names = [n for n, _ in got]
    want = ['first.weight', 'first.bias', 'inner.scale', 'inner.lin.weight', 'inner.lin.bias',
            'tied.scale', 'tied.lin.bias']
    if not all(isinstance(p, tt.Tensor) for _, p in got):
        raise Fail("named_parameters must yield (name, tensor) pairs")
    if len(names) < len(want) and set(names) <= {'first.weight', 'first.bias'}:
        raise Fail(f"parameters() missed the parameters of nested modules: found {len(names)} "
                   f"of {len(want)} ({', '.join(names) or 'none'}); walk the whole tree "
                   "(self.named_modules), not only this module's own attributes")
    ids = [id(p) for _, p in got]
    if len(set(ids)) != len(ids):
        raise Fail("a parameter shared by two modules (weight tying) was listed twice: an "
                   "optimizer would then update it twice per step; remember the ids you yielded")
    if sorted(names) != sorted(want):
        raise Fail(f"the names are {names}, expected {want}: module name, a dot, then the "
                   "parameter name ('inner.lin.weight')")
    if len(list(model.parameters())) != len(want):
        raise Fail("parameters() must give the same tensors as named_parameters()")
    own = [n for n, _ in model.inner.named_parameters(recurse=False)]
    if any(n.startswith('.') for n in own):
        raise Fail(f"a name at the root starts with a dot ({own}): the module's own "
                   "parameters are named alone ('scale'); a dot only joins a module's name "
                   "and a parameter's")
    if own != ['scale']:
        raise Fail(f"named_parameters(recurse=False) gave {own}: without recurse only the "
                   "module's own parameters count (['scale']), not its sub-modules'")


def check_4_2(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(9)
    for xs, (o, i), bias in (((5, 3), (3, 3), True), ((5, 3), (4, 3), True),
                             ((2, 3, 3), (2, 3), True), ((4, 3), (2, 3), False)):
        x, w, b = r.standard_normal(xs), r.standard_normal((o, i)), r.standard_normal(o)
        X, W = leaf(tt, x), leaf(tt, w)
        B = leaf(tt, b) if bias else None
        out = nn.linear(X, W, B)
        g = r.standard_normal(out.shape)
        try:
            grads = rule_grads(out, g, 3 if bias else 2)
        except ValueError as e:
            raise Fail(f"linear's rule fails for x {xs} and a weight {(o, i)} ({e}): check the "
                       "shapes: dx = g @ W is (rows, out) @ (out, in), dW = g^T @ x is (out, "
                       "rows) @ (rows, in)") from None
        f = (lambda x_, w_, b_: x_ @ w_.T + b_) if bias else (lambda x_, w_: x_ @ w_.T)
        arrays = [x, w, b] if bias else [x, w]
        rows_g, rows_x = g.reshape(-1, o), x.reshape(-1, i)
        mist = {
            'x': [(lambda got: i == o and close(got, (rows_g @ w.T).reshape(xs)),
                   "transposed matmul rule for x: W is (out, in), so dx = g @ W (you gave "
                   "g @ W^T)")],
            'weight': [(lambda got: got.shape == (i, o) and i != o
                        or i == o and close(got, rows_x.T @ rows_g),
                        "transposed matmul rule for the weight: W is (out, in), so dW = g^T @ x "
                        "(you gave x^T @ g, shape (in, out))")],
            'bias': [(lambda got: got.shape == rows_g.shape or got.shape == g.shape,
                      "the bias was added to every row, so its gradient is g summed over the "
                      "rows: did you sum the gradient back to the shape of the bias?")]}
        for k, name in enumerate(('x', 'weight', 'bias')[:len(arrays)]):
            want = numeric(f, [a.copy() for a in arrays], k, g)
            check_input_grad(name, grads[k], want, arrays[k].shape,
                             [mm for mm in mist[name] if mm[1]], "y = x W^T + b: dx = g @ W, "
                             "dW = g^T @ x, db = g summed over the rows")


def check_4_3(m):
    tt, optim = m['tinytorch'], m['optim']
    p = leaf(tt, [1.0, -2.0])
    p.grad = tt.tensor(np.array([0.5, 0.25]))
    opt = optim.SGD([p], lr=0.1)
    opt.step()
    want = np.array([1.0 - 0.05, -2.0 - 0.025])
    if close(p.array, [1.05, -1.975]):
        raise Fail("SGD went uphill: the gradient points to where the loss grows, so step "
                   "against it: p -= lr * g")
    if close(p.array, [0.5, -2.25]):
        raise Fail("the step ignores the learning rate: p -= lr * g (group['lr'])")
    if close(p.array, [1.0, -2.0]):
        raise Fail("step() did not change the parameter: change p.array in place")
    if not close(p.array, want):
        raise Fail(f"p = [1, -2], grad = [0.5, 0.25], lr = 0.1 must give {want.tolist()}, got "
                   f"{p.array.tolist()}")
    p = leaf(tt, [1.0])
    p.grad = tt.tensor(np.array([0.5]))
    optim.SGD([p], lr=0.1, weight_decay=0.1).step()  # g = 0.5 + 0.1 * 1 = 0.6: p = 1 - 0.06
    if close(p.array, [0.95]):
        raise Fail("with weight_decay=0.1 the step ignored the decay: step with g (the lines "
                   "before yours add the decay into it: 0.5 + 0.1 * 1), not p.grad; p must "
                   "become 0.94")
    if not close(p.array, [0.94]):
        raise Fail(f"p = [1], grad = [0.5], lr = 0.1, weight_decay = 0.1 must give [0.94] (g = "
                   f"0.6), got {p.array.tolist()}")
    a, b = leaf(tt, [1.0]), leaf(tt, [1.0])
    a.grad, b.grad = tt.tensor(np.array([1.0])), tt.tensor(np.array([1.0]))
    optim.SGD([{'params': [a]}, {'params': [b], 'lr': 0.5}], lr=0.1).step()
    if not close([a.array[0], b.array[0]], [0.9, 0.5]):
        raise Fail(f"groups with their own learning rate (0.1 by default, 0.5 for the second), "
                   f"gradient 1 each, from 1: expected [0.9, 0.5], got "
                   f"{[float(a.array[0]), float(b.array[0])]}: each group steps with its own "
                   "group['lr'], not the optimizer's default")


def check_4_4(m):
    tt, optim = m['tinytorch'], m['optim']
    p = leaf(tt, [1.0, 2.0])
    q = leaf(tt, [3.0])
    opt = optim.SGD([p, q], lr=0.1)
    p.grad = tt.tensor(np.array([1.0, 1.0]))
    opt.zero_grad()
    if isinstance(p.grad, tt.Tensor) and close(p.grad.array, [0.0, 0.0]):
        raise Fail("zero_grad() wrote zeros into .grad, but its default is set_to_none=True (as "
                   "PyTorch's): set p.grad = None; zeros in the existing .grad are for "
                   "set_to_none=False")
    if p.grad is not None:
        raise Fail("zero_grad() left the old gradients: the next backward adds onto them, so "
                   "every step would use the sum of all past gradients; set p.grad = None")
    if q.grad is not None:
        raise Fail("zero_grad() must leave a parameter without gradient alone (grad None)")
    p.grad = tt.tensor(np.array([1.0, 1.0]))
    g = p.grad
    opt.zero_grad(set_to_none=False)
    if p.grad is not g:
        raise Fail("zero_grad(set_to_none=False) must keep the existing .grad tensor and write "
                   "zeros into its array (p.grad.array[...] = 0), not replace it or set None")
    if not close(g.array, [0.0, 0.0]):
        raise Fail("zero_grad(set_to_none=False) must write zeros into .grad's array")
    if q.grad is not None:
        raise Fail("zero_grad(set_to_none=False) must leave a parameter whose grad is None alone")
    opt = optim.SGD([{'params': [p]}, {'params': [q], 'lr': 0.5}], lr=0.1)
    p.grad, q.grad = tt.tensor(np.array([1.0, 1.0])), tt.tensor(np.array([1.0]))
    opt.zero_grad()
    if (p.grad is None) != (q.grad is None):
        raise Fail("zero_grad() cleared one group only: clear the parameters of every group "
                   "(self.param_groups, each its 'params')")


def check_5_1(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(10)
    x, y = r.standard_normal((3, 2)), r.standard_normal((3, 2))
    out = nn.mse_loss(leaf(tt, x), leaf(tt, y), reduction='none')
    g = r.standard_normal(out.shape)
    gi, gt = rule_grads(out, g, 2)
    d = x - y
    check_input_grad('input', gi, numeric(lambda a, b: (a - b) ** 2, [x.copy(), y.copy()], 0, g),
                     x.shape, [(lambda got: close(got, g * d), "the factor 2 is missing: "
                                "d (x - y)^2/dx = 2 (x - y)")], "d (x-y)^2/dx = 2 (x - y)")
    check_input_grad('target', gt, numeric(lambda a, b: (a - b) ** 2, [x.copy(), y.copy()], 1, g),
                     y.shape, [(lambda got: close(got, -g * d), "the factor 2 is missing: "
                                "d (x - y)^2/dy = -2 (x - y)")], "d (x-y)^2/dy = -2 (x - y)")


# -- step 6: softmax, normalisation, cross-entropy ---------------------------------------------
def _ce_reference(z, t):
    s = z - z.max(axis=1, keepdims=True)
    return np.mean(np.log(np.exp(s).sum(1)) - s[np.arange(len(t)), t])


def check_6_1(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(11)
    z, t = r.standard_normal((4, 3)), np.array([0, 2, 1, 2])
    cases = [('logits of size 1', z), ('logits of 1000', z * 10 + 1000),
             ('rows of very different sizes', np.array([[1000.0, 999, 998], [0, -1, -2],
                                                         [-1000, -1001, -999], [5, 5, 5]]))]
    for what, logits in cases:
        L = leaf(tt, logits)
        L.array.setflags(write=False)  # the caller's: the loss must leave it as it was
        with np.errstate(all='ignore'):
            try:
                loss = nn.cross_entropy(L, t)
            except ValueError as e:
                if _wrote_into(e):
                    raise Fail(f"cross_entropy wrote into its input logits "
                               f"({_where(e, _SC_WS[0])}): "
                               "they are the caller's; make a new array (logits - max), never "
                               "-= on theirs") from None
                raise Fail(f"(4, 3) logits: {e}; subtract each row's own max with "
                           "keepdims=True so that it lines up with the rows") from None
        v = float(loss.array)
        want = _ce_reference(logits, t)
        if not np.isfinite(v):
            if what == 'logits of 1000':
                raise Fail("the softmax overflowed on logits of 1000 (exp(1000) is inf, the "
                           "loss nan): subtract each row's max before exp; softmax(z - c) = "
                           "softmax(z)")
            raise Fail(f"{what}: the loss is {v}: subtract each row's OWN max (axis=1, "
                       "keepdims=True), not one max for the whole batch (a row far below it "
                       "underflows to exp = 0, log 0 = -inf)")
        if not abs(v - want) < 1e-6 * max(1, abs(want)):
            raise Fail(f"{what}: cross-entropy {v:.6g}, expected {want:.6g}: check logp = "
                       "shifted - lse (log-softmax) and lse = log of the row sums of e")
        with np.errstate(all='ignore'):
            try:
                grad, = rule_grads(loss, np.ones(()), 1)
            except ValueError as e:
                raise Fail(f"{what}: the backward (which reads e and sumexp) fails ({e}): "
                           "sumexp must be e's row sums as (N, 1) (keepdims=True), so that "
                           "e / sumexp lines up with the rows") from None
        s = np.exp(logits - logits.max(1, keepdims=True))
        want_g = (s / s.sum(1, keepdims=True) - np.eye(3)[t]) / len(t)
        if not close(grad, want_g):
            raise Fail(f"{what}: the backward (which reads e and sumexp) is wrong: e must be "
                       "exp(shifted) (N, C) and sumexp its row sums (N, 1)")
    _far_below(tt, nn)


def _far_below(tt, nn):
    """Logits [0, -200] in float32 with target 1: the loss is 200 (the target's logit is 200
    below the other), but exp(-200) is 0 in float32, so log(softmax) is log 0 = -inf."""
    far = tt.tensor(np.array([[0.0, -200.0]], dtype=np.float32), requires_grad=True)
    with np.errstate(all='ignore'):
        v = float(nn.cross_entropy(far, np.array([1])).array)
    if not abs(v - 200.0) < 1e-3:
        raise Fail(f"logits [0, -200] (float32), target 1: the loss is {v:.6g}, but it is 200 "
                   "(-log_softmax = 200 - 0 + log(1 + e^-200)): log(softmax) underflows "
                   "(e^-200 is 0 in float32, log 0 = -inf); compute logp = shifted - "
                   "log(sumexp), never the log of e / sumexp" if not np.isfinite(v) else
                   f"logits [0, -200] (float32), target 1: the loss is {v:.6g}, expected 200")


def check_6_2(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(12)
    x = r.standard_normal((3, 5)) * 3 + 1
    x[1] = 2.0  # a constant row: variance 0
    X = leaf(tt, x)
    X.array.setflags(write=False)  # the caller's: layer_norm must leave it as it was
    with np.errstate(all='ignore'):
        try:
            out = nn.layer_norm(X, (5,))
        except ValueError as e:
            if not _wrote_into(e):
                raise
            raise Fail(f"layer_norm wrote into its input x ({_where(e, _SC_WS[0])}): x is the "
                       "caller's (a residual stream adds it again later); make new arrays "
                       "(rows - mean), never rows -= ... on x's own") from None
    y = out.array
    mu = x.mean(1, keepdims=True)
    want = (x - mu) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    if not np.all(np.isfinite(y)):
        raise Fail("a constant row came out as nan or inf: its variance is 0, so add eps inside "
                   "the square root: 1 / sqrt(var + eps)")
    if close(y[[0, 2]], ((x - mu) / np.sqrt(x.var(1, ddof=1, keepdims=True) + 1e-5))[[0, 2]]):
        raise Fail("LayerNorm divides the squared deviations by n (the biased variance), not "
                   "n - 1")
    if close(y[[0, 2]], ((x - mu) / (np.sqrt(x.var(1, keepdims=True)) + 1e-5))[[0, 2]], 1e-9) \
            and not close(y, want, 1e-9):
        raise Fail("eps goes inside the square root: 1 / sqrt(var + eps)")
    if close(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)):
        raise Fail("the mean and variance were taken down the columns (axis 0): LayerNorm "
                   "normalises each row over its own n values (axis=1, keepdims=True)")
    if close(y, (x - mu) * np.sqrt(x.var(1, keepdims=True) + 1e-5)):
        raise Fail("the rows were multiplied by their standard deviation: rstd = 1 / sqrt(var "
                   "+ eps) is its reciprocal, so xhat = (rows - mean) * rstd divides by it")
    if not close(y, want, 1e-7):
        raise Fail(f"layer_norm's output is wrong: row 0 gives {np.round(y[0], 4).tolist()}, "
                   f"expected {np.round(want[0], 4).tolist()} ((x - mean) / sqrt(var + eps))")
    g = r.standard_normal(x.shape)
    X = leaf(tt, x)
    with np.errstate(all='ignore'):
        got, = rule_grads(nn.layer_norm(X, (5,)), g, 1)

    def f(v):
        return (v - v.mean(1, keepdims=True)) / np.sqrt(v.var(1, keepdims=True) + 1e-5)
    if not close(got, numeric(f, [x.copy()], 0, g), 1e-4):
        raise Fail("the backward (which reads xhat and rstd) is wrong: xhat must be the "
                   "normalised rows and rstd = 1 / sqrt(var + eps), shape (R, 1)")


# -- step 7: attention -----------------------------------------------------------------------
def _softmax(s, axis=-1):
    with np.errstate(invalid='ignore'):
        e = np.exp(s - s.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)


def check_7_1(m):
    tt, tr = m['tinytorch'], m['transformer']
    r = rng(13)
    q, k = r.standard_normal((2, 4, 8)) * 2, r.standard_normal((2, 5, 8)) * 2
    try:
        w = tr.attention_weights(leaf(tt, q), leaf(tt, k)).array
    except ValueError as e:
        raise Fail(f"(2, 4, 8) queries with (2, 5, 8) keys: {e}; the scores are q @ k^T "
                   "(k.transpose(-2, -1)), shape (..., Tq, Tk)") from None
    raw = q @ k.transpose(0, 2, 1)
    want = _softmax(raw / math.sqrt(8))
    if w.shape != want.shape:
        raise Fail(f"the weights have shape {w.shape}, expected {want.shape} = (..., Tq, Tk)")
    if close(w, _softmax(raw)):
        raise Fail("the scores are not scaled by 1/sqrt(d): without it, large dot products make "
                   "the softmax nearly one-hot and its gradient vanishes")
    if close(w, _softmax(raw / 8)):
        raise Fail("the scores are divided by d; divide by sqrt(d) (math.sqrt(q.shape[-1]))")
    if close(w, _softmax(raw / math.sqrt(8), axis=-2)):
        raise Fail("the softmax runs over the queries (dim -2): each query's weights over the "
                   "keys (the last dim) must sum to 1")
    if not close(w, want):
        raise Fail("the weights differ from softmax(q @ k^T / sqrt(d)) over the last dim")
    w = tr.attention_weights(leaf(tt, q), leaf(tt, k), scale=0.5).array
    if close(w, want):
        raise Fail("attention_weights ignored its scale= argument: with scale=0.5 the scores "
                   "are q @ k^T * 0.5; 1/sqrt(d) is only the default, for scale=None")
    if not close(w, _softmax(raw * 0.5)):
        raise Fail("with scale=0.5 the weights must be softmax(q @ k^T * 0.5) over the last dim")
    q2, k2 = q[:, :4], k[:, :4]
    w = tr.attention_weights(leaf(tt, q2), leaf(tt, k2), is_causal=True).array
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    s = np.where(allowed, q2 @ k2.transpose(0, 2, 1) / math.sqrt(8), -np.inf)
    want = _softmax(s)
    if np.any(w[..., ~allowed] != 0):
        raise Fail("is_causal=True: a query gave weight to a later key; set the scores of "
                   "disallowed positions to -inf before the softmax")
    if not close(w.sum(-1), np.ones((2, 4))):
        raise Fail("the mask is applied after the softmax: the kept weights no longer sum to 1; "
                   "mask the scores (-inf) first, then take the softmax")
    if not close(w, want):
        raise Fail("is_causal=True: the weights differ from the softmax of the masked scores")
    mask = r.random((4, 4)) < 0.6
    mask[:, 0] = True
    w = tr.attention_weights(leaf(tt, q2), leaf(tt, k2), mask=mask).array
    s = np.where(mask, q2 @ k2.transpose(0, 2, 1) / math.sqrt(8), -np.inf)
    if not close(w, _softmax(s)):
        raise Fail("a boolean mask (True = may attend) is not applied as -inf where it is False")
    fmask = r.standard_normal((4, 4))
    w = tr.attention_weights(leaf(tt, q2), leaf(tt, k2), mask=fmask).array
    s = q2 @ k2.transpose(0, 2, 1) / math.sqrt(8)
    if close(w, _softmax(s)):
        raise Fail("a float mask was ignored: a float mask is added to the scores (only a bool "
                   "mask says which keys a query may look at)")
    if not close(w, _softmax(s + fmask)):
        raise Fail("a float mask must be added to the scores as it is: softmax(scores + mask)")
    empty = np.ones((4, 4), dtype=bool)
    empty[2] = False  # query 2 may look at no key
    w = tr.attention_weights(leaf(tt, q2), leaf(tt, k2), mask=empty, zero_empty_rows=True).array
    if not (np.all(w[:, 2] == 0) and close(w[:, [0, 1, 3]], _softmax(s)[:, [0, 1, 3]])):
        raise Fail("a query that may look at no key (zero_empty_rows=True) must get weights 0: "
                   + ("yours are uniform, as when the masked scores are -1e9 and not -inf (the "
                      "lines after yours find such rows by their -inf)"
                      if close(w[:, 2], np.full((2, 4), 0.25)) else
                      f"got {np.round(w[0, 2], 4).tolist()}"))


def _heads_np(qkv, H, split_ok=True, merge_ok=True):
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // H
    parts = [qkv[..., i * C:(i + 1) * C] for i in range(3)]
    if split_ok:
        q, k, v = (p.reshape(B, T, H, D).transpose(0, 2, 1, 3) for p in parts)
    else:
        q, k, v = (p.reshape(B, H, T, D) for p in parts)
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(D), -np.inf)
    y = _softmax(s) @ v
    return y.transpose(0, 2, 1, 3).reshape(B, T, C) if merge_ok else y.reshape(B, T, C)


def _attn_module(m, n_embd=8, n_head=2):
    tr = m['transformer']
    cfg = tr.GPTConfig(block_size=8, vocab_size=5, n_layer=1, n_head=n_head, n_embd=n_embd,
                       dropout=0.0, bias=True)
    return tr.CausalSelfAttention(cfg)


def check_7_2(m):
    tt = m['tinytorch']
    qkv = rng(14).standard_normal((2, 5, 24))
    attn = _attn_module(m)
    try:
        y = attn.attend(leaf(tt, qkv)).array
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 (the learner's split: told apart below)
        y = None
    want = _heads_np(qkv, 2)
    if y is None:
        pass
    elif y.shape != want.shape:
        raise Fail(f"attend must return (B, T, C) = {want.shape}, got {y.shape}")
    if close(y, want):
        return
    if close(y, _heads_np(qkv, 2, split_ok=False)):
        raise Fail("the heads are mixed up: (B, T, C).reshape(B, H, T, D) takes the numbers in "
                   "memory order, so a 'head' gets pieces of several positions; reshape to "
                   "(B, T, H, D), then transpose(1, 2)")
    if close(y, _heads_np(qkv, 2, merge_ok=False)):
        raise Fail("putting the heads back: (B, H, T, D).reshape(B, T, C) mixes positions; "
                   "transpose(1, 2) to (B, T, H, D) first, then reshape")
    tr = m['transformer']
    real, seen = tr.attention_weights, []
    B, T, C3 = qkv.shape
    C, H = C3 // 3, 2

    def spy(q, k, *args, **kwargs):  # q and k as the split made them
        seen.append((np.asarray(q.array), np.asarray(k.array)))
        return real(q, k, *args, **kwargs)

    def itself(q, k, *args, **kwargs):  # each position attends to itself alone: y is v split
        return tt.tensor(np.broadcast_to(np.eye(T), (B, H, T, T)).copy())
    back = None
    try:
        tr.attention_weights = spy
        with contextlib.suppress(Exception):
            attn.attend(leaf(tt, qkv))
        tr.attention_weights = itself
        with contextlib.suppress(Exception):
            back = attn.attend(leaf(tt, qkv)).array
    finally:
        tr.attention_weights = real
    for name, i in (('q', 0), ('k', 1)):
        want_s = qkv[..., i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        got_s = seen[0][i] if seen else None
        if got_s is None or got_s.shape != want_s.shape or not close(got_s, want_s):
            raise Fail(f"the split: {name} reached the attention as "
                       f"{None if got_s is None else got_s.shape}, not as (B, H, T, D) = "
                       f"{want_s.shape} with head h holding channels h*D..(h+1)*D-1 of every "
                       "position" if got_s is None or got_s.shape != want_s.shape else
                       f"the split: {name} has the shape (B, H, T, D) but its numbers are in "
                       "the wrong places: reshape to (B, T, H, D) first, then transpose(1, 2)")
    if back is None or back.shape != (B, T, C) or not close(back, qkv[..., 2 * C:]):
        raise Fail("the merge (or v's split, done as q's and k's, which are right): with each "
                   "position attending to itself alone, attend must give v back as it came "
                   "(B, T, C); yours differs: (B, H, T, D) -> transpose(1, 2) -> reshape(B, T, C)")
    raise Fail("the split and the merge are right, but the heads' attention differs: each head "
               "attends causally, w = attention_weights(q, k, mask=the causal mask), then w @ v")


def check_8_1(m):
    tt, tr = m['tinytorch'], m['transformer']
    rt, _, rtr = reference()
    cfg = dict(block_size=8, vocab_size=5, n_layer=1, n_head=2, n_embd=8, dropout=0.0, bias=True)
    tt.manual_seed(0)
    mine = tr.Block(tr.GPTConfig(**cfg))
    rt.manual_seed(0)
    ref = rtr.Block(rtr.GPTConfig(**cfg))
    for name in ('ln_1', 'ln_2'):  # LayerNorms start as 1 and 0: make them matter
        for part in ('weight', 'bias'):
            a = rng(15).standard_normal(getattr(getattr(ref, name), part).shape)
            getattr(getattr(ref, name), part).array[...] = a
            getattr(getattr(mine, name), part).array[...] = a
    x = rng(16).standard_normal((2, 5, 8)).astype(np.float32)  # the model's dtype
    y = mine(tt.tensor(x)).array
    with rt.no_grad():
        X = rt.tensor(x)
        h = ref.attn(ref.ln_1(X))
        want = (X + h + ref.mlp(ref.ln_2(X + h))).array
        no_residual = [h + ref.mlp(ref.ln_2(h)), ref.mlp(ref.ln_2(h)),  # the first one missing
                       ref.mlp(ref.ln_2(X + h)), X + h]  # the second one missing
        post = ref.ln_1(X + ref.attn(X))
        post = ref.ln_2(post + ref.mlp(post)).array
        raw_in = [X + h + ref.mlp(X + h)]  # the MLP's input not normalised
        h1 = ref.attn(X)
        raw_in.append(X + h1 + ref.mlp(ref.ln_2(X + h1)))  # the attention's
    if any(np.allclose(y, v.array, atol=1e-5) for v in no_residual):
        raise Fail("the residual is missing: each sub-layer adds to its input (x = x + "
                   "attn(ln_1(x)), then x + mlp(ln_2(x))); without it the gradient has no "
                   "direct path back")
    if any(np.allclose(y, v.array, atol=1e-5) for v in raw_in):
        raise Fail("a sub-layer gets x itself: a pre-LN block normalises each sub-layer's input "
                   "(attn(ln_1(x)), mlp(ln_2(x))) and adds the result to the unnormalised x")
    if np.allclose(y, post, atol=1e-5):
        raise Fail("that is a post-LN block (normalise after the residual sum); this model is "
                   "pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))")
    if not np.allclose(y, want, atol=1e-5):
        raise Fail("the block's output differs from x + attn(ln_1(x)) followed by "
                   "x + mlp(ln_2(x))")


# -- step 9 (optional): an LSTM cell ---------------------------------------------------------
def _sig(z):
    return 1 / (1 + np.exp(-z))


def _lstm_np(x, h, c, w, order='ifgo', g_act=np.tanh, forget=True, h_tanh=True, new_c=True):
    """One LSTM step in NumPy, or one of the typical mistakes (the keywords)."""
    z = x @ w[0].T + w[2] + h @ w[1].T + w[3]
    d = dict(zip(order, np.split(z, 4, -1)))
    i, f, g, o = _sig(d['i']), _sig(d['f']), g_act(d['g']), _sig(d['o'])
    c2 = f * c + i * g if forget else c + i * g
    return o * (np.tanh(c2 if new_c else c) if h_tanh else c2), c2


def _lstm_gate_by_gate(tt, nn):
    """The first of the learner's gates that is wrong, each measured on its own: with x, h
    and the weights 0, each gate is its bias chunk's activation (i = sigmoid(0.3), f =
    sigmoid(-0.5), g = tanh(0.8), o = sigmoid(1.2)); the new cell is f c_old + i g, so two
    old cells (0 and 1) give f (the slope) and i g (the rest), and h / tanh(c) gives o."""
    b = np.array([0.3, -0.5, 0.8, 1.2])
    i, f, g, o = _sig(b[0]), _sig(b[1]), np.tanh(b[2]), _sig(b[3])
    out = []
    for c0 in (0.0, 1.0):
        hh, cc = nn.lstm_cell(leaf(tt, [[0.0]]), (leaf(tt, [[0.0]]), leaf(tt, [[c0]])),
                              leaf(tt, np.zeros((4, 1))), leaf(tt, np.zeros((4, 1))),
                              leaf(tt, b), leaf(tt, np.zeros(4)))
        out.append((float(np.asarray(hh.array).ravel()[0]), float(np.asarray(cc.array).ravel()[0])))
    (h0, c_0), (h1, c_1) = out
    slope, rest = c_1 - c_0, c_0
    acts = {'sigmoid': _sig, 'tanh': np.tanh}
    if not abs(slope - f) < 1e-6:
        if abs(slope - 1) < 1e-6:
            return ("the forget gate: the old cell passes unchanged (c = c + i * g): multiply it "
                    "by f, c = f * c + i * g")
        for (na, fa), ci in ((a, c) for a in acts.items() for c in range(4)):
            if abs(slope - fa(b[ci])) < 1e-9:
                return (f"the forget gate is {na} of chunk {ci + 1}: f = sigmoid(second chunk), "
                        "the chunks in PyTorch's order i, f, g, o")
        return (f"the forget gate: the new cell changes by {slope:.4f} per unit of the old one, "
                f"but f = sigmoid(second chunk) = {f:.4f}: the chunks are i, f, g, o, and f "
                "multiplies the old cell")
    if not abs(rest - i * g) < 1e-6:
        for (na, fa), (nb, fb) in ((x, y) for x in acts.items() for y in acts.items()):
            for ci in range(4):
                for cg in range(4):
                    if ci != cg and abs(rest - fa(b[ci]) * fb(b[cg])) < 1e-9 and (ci, cg) != (0, 2):
                        return (f"the input and the candidate: i * g uses {na} of chunk {ci + 1} "
                                f"and {nb} of chunk {cg + 1}; i = sigmoid(first chunk), g = "
                                "tanh(third chunk)")
                    if ci != cg and (ci, cg) == (0, 2) and abs(rest - fa(b[0]) * fb(b[2])) < 1e-9:
                        return (f"the input gate is {na} and the candidate {nb}: i = sigmoid(...), "
                                "g = tanh(...) (the candidate is new content between -1 and 1)")
        return (f"the new cell without its old part (old cell 0) is {rest:.4f}, but i * g = "
                f"sigmoid(first chunk) * tanh(third chunk) = {i * g:.4f}")
    for hv, cv in ((h0, c_0), (h1, c_1)):
        if abs(hv - o * np.tanh(cv)) > 1e-6:
            if abs(hv - o * cv) < 1e-6:
                return "h = o * tanh(c): you left out the tanh of the cell"
            got_o = hv / np.tanh(cv) if cv else float('nan')
            for (na, fa), ci in ((a, c) for a in acts.items() for c in range(4)):
                if abs(got_o - fa(b[ci])) < 1e-9:
                    return (f"the output gate is {na} of chunk {ci + 1}: o = sigmoid(fourth "
                            "chunk), h = o * tanh(c)")
            return (f"the output gate: h / tanh(c) is {got_o:.4f}, but o = sigmoid(fourth chunk) "
                    f"= {o:.4f}; h = o * tanh(c), with the new c")
    return ("each gate is right when x and h are 0: the weights are wrong: the four chunks are "
            "of linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)")


def check_9_1(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(17)
    x, h, c = r.standard_normal((2, 3)), r.standard_normal((2, 4)), r.standard_normal((2, 4))
    w = [r.standard_normal((16, 3)) * 0.7, r.standard_normal((16, 4)) * 0.7,
         r.standard_normal(16) * 0.5, r.standard_normal(16) * 0.5]
    got = nn.lstm_cell(leaf(tt, x), (leaf(tt, h), leaf(tt, c)), *[leaf(tt, a) for a in w])
    if not (isinstance(got, tuple) and len(got) == 2):
        raise Fail("lstm_cell must return (h, c): the lines after your code return them")
    gh, gc = (np.asarray(t.array) for t in got)
    want_h, want_c = _lstm_np(x, h, c, w)
    if close(gh, want_h) and close(gc, want_c):
        pass
    else:
        for kw, msg in (
                (dict(order='ifog'), "the chunks are in PyTorch's order i, f, g, o: the third is "
                                     "the candidate g, the fourth the output gate o"),
                (dict(order='figo'), "the chunks are in PyTorch's order i, f, g, o: the input gate "
                                     "comes first, then the forget gate"),
                (dict(g_act=_sig), "the candidate g is tanh(...), not a sigmoid: it is the new "
                                   "content (between -1 and 1); only the gates i, f, o are "
                                   "sigmoids"),
                (dict(forget=False), "c = f * c + i * g: the old cell must be multiplied by the "
                                     "forget gate f, or the memory only ever grows"),
                (dict(h_tanh=False), "h = o * tanh(c): you left out the tanh of the cell"),
                (dict(new_c=False), "h shows the new cell: h = o * tanh(c) with the c you just "
                                    "computed, not the old one")):
            mh, mc = _lstm_np(x, h, c, w, **kw)
            if close(gh, mh) and close(gc, mc):
                raise Fail(msg)
        raise Fail(_lstm_gate_by_gate(tt, nn))
    # backpropagation through time: three steps of the cell, the loss on the last h
    xs = r.standard_normal((3, 2, 3))
    G = r.standard_normal((2, 4))

    def f_np(xs_, whh):
        hh, cc = h, c
        for t in range(3):
            hh, cc = _lstm_np(xs_[t], hh, cc, [w[0], whh, w[2], w[3]])
        return hh
    X, Whh = leaf(tt, xs), leaf(tt, w[1])
    hh, cc = leaf(tt, h, grad=False), leaf(tt, c, grad=False)
    wts = [leaf(tt, w[0], grad=False), Whh, leaf(tt, w[2], grad=False), leaf(tt, w[3], grad=False)]
    for t in range(3):
        hh, cc = nn.lstm_cell(X[t], (hh, cc), *wts)
    hh.backward(tt.tensor(G))
    _check_leaf_grads((('the inputs', X), ('w_hh', Whh)), f_np, (xs, w[1]), G, tol=1e-4,
                      says=lambda name, why: f"backpropagation through time: d h_3 / d {name} "
                                             f"through 3 steps of your cell differs from finite "
                                             f"differences: {why}")


# -- step 10 (optional): Adam and AdamW ------------------------------------------------------
def _adam_np(gs, p0, lr=0.1, b1=0.9, b2=0.999, eps=1e-8, mistake=''):
    """Adam's steps from p0, one per gradient in gs, in NumPy; or, with mistake, one of the
    typical mistakes: 'correction' (none), 'm only' / 'v only' (one of the two corrected),
    'power' (1 - b1, not 1 - b1^t), 't+1', 'root' (sqrt(v) / (1 - b2^t)), 'paper' (the Adam
    paper's efficient form: eps added before the correction), 'eps' (inside the square
    root), 'sqrt' (none), 'lr' (none), 'betas' (swapped)."""
    p, m, v = np.array(p0, dtype=np.float64), 0.0, 0.0
    for t, g in enumerate(gs, 1):
        g = np.asarray(g, dtype=np.float64)
        a1, a2 = (b2, b1) if mistake == 'betas' else (b1, b2)
        m, v = a1 * m + (1 - a1) * g, a2 * v + (1 - a2) * g * g
        k = t + 1 if mistake == 't+1' else t
        c1, c2 = ((1, 1) if mistake == 'correction' else (1 - b1, 1 - b2) if mistake == 'power'
                  else (1 - b1 ** k, 1 - b2 ** k))
        m_hat = m if mistake == 'v only' else m / c1
        v_hat = v if mistake == 'm only' else v / c2
        den = {'eps': lambda: np.sqrt(v_hat + eps), 'sqrt': lambda: v_hat + eps,
               'root': lambda: np.sqrt(v) / c2 + eps,
               'paper': lambda: (np.sqrt(v) + eps) / math.sqrt(c2)}.get(
                   mistake, lambda: np.sqrt(v_hat) + eps)()
        p = p - (1 if mistake == 'lr' else lr) * m_hat / den
    return p


_ADAM_MISTAKES = (
    ('correction', "the bias correction is missing: m and v start at 0, so early on they are "
                   "far too small (m = 0.1 g after one step); divide m by 1 - b1^t and v by "
                   "1 - b2^t"),
    ('m only', "v needs its correction too: v_hat = v / (1 - b2^t); v starts at 0 like m, and "
               "after one step it is a thousandth of g^2"),
    ('v only', "m needs its correction too: m_hat = m / (1 - b1^t); m starts at 0 like v, and "
               "after one step it is a tenth of g"),
    ('root', "the correction of v goes under the square root: sqrt(v / (1 - b2^t)); you divided "
             "sqrt(v) by 1 - b2^t"),
    ('paper', "eps goes after the square root of the corrected v, sqrt(v_hat) + eps, as in "
              "PyTorch's Adam; the Adam paper's efficient form adds it to sqrt(v) before the "
              "correction, which matters for small gradients"),
    ('power', "the correction is 1 - b1^t and 1 - b2^t, with t the step number: it fades as t "
              "grows (1 - b1 alone is right for the first step only)"),
    ('t+1', "t counts from 1 (the first step has t = 1, so 1 - b1^t = 1 - b1 then): you "
            "corrected with t + 1"),
    ('sqrt', "the step divides by the square root of v_hat: lr * m_hat / (sqrt(v_hat) + eps) is "
             "about lr * g / |g|, a step of about lr whatever the gradient's scale"),
    ('eps', "eps goes outside the square root, sqrt(v_hat) + eps, as in PyTorch's Adam: inside, "
            "it swamps gradients of about 1e-4 (sqrt(1e-8 + 1e-8) instead of 1e-4)"),
    ('lr', "the step ignores the learning rate: p -= lr * m_hat / (sqrt(v_hat) + eps)"),
)


def check_10_1(m):
    optim = m['optim']
    r = rng(26)
    cases = [([np.array([1.0, -2.0, 0.5])] * 2, "a constant gradient [1, -2, 0.5]"),
             ([r.standard_normal(4) * 1e-4 for _ in range(3)], "3 gradients of about 1e-4"),
             ([r.standard_normal(4) for _ in range(5)], "5 random gradients")]
    for gs, what in cases:
        p0 = r.standard_normal(gs[0].shape)
        p, mm, vv = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
        for t, g in enumerate(gs, 1):
            optim.adam_step(p, g, mm, vv, t, 0.1, 0.9, 0.999, 1e-8)
            if t > 1:
                continue
            if not mm.any() and not vv.any():
                raise Fail("m and v are still 0 after a step: `m = ...` gives the name m a new "
                           "array and leaves the optimizer's (the state kept for the next step) "
                           "at 0; write into it: m[...] = b1 * m + (1 - b1) * g, and v likewise")
            if close_relative(mm, 0.001 * g) or close_relative(vv, 0.1 * g * g):
                raise Fail("the betas are swapped: m averages g with b1 = 0.9 (it follows g "
                           "quickly), v averages g^2 with b2 = 0.999 (slowly)")
            if close_relative(vv, 0.001 * g):
                raise Fail("v is the moving average of the squared gradient: v = b2 v + "
                           "(1 - b2) g * g (you averaged g itself)")
            if close_relative(mm, g):
                raise Fail("after one step m must be (1 - b1) g = 0.1 g, yours is g: either the "
                           "new gradient was not weighted by 1 - b1, or the correction divided m "
                           "itself (m_hat = m then m_hat /= ... changes the state: m_hat = m / "
                           "(1 - b1^t) makes a new array)")
            if not (close_relative(mm, 0.1 * g) and close_relative(vv, 0.001 * g * g)):
                raise Fail(f"after one step from m = v = 0 with g = {np.round(g, 4).tolist()}, m "
                           f"must be (1 - b1) g = 0.1 g and v (1 - b2) g^2 = 0.001 g^2; got m = "
                           f"{np.round(mm, 6).tolist()}, v = {np.round(vv, 8).tolist()}")
            if close(p, p0):
                raise Fail("p did not change: `p = p - ...` makes a new array; change the "
                           "parameter's own array in place (p -= ...)")
        want = _adam_np(gs, p0)
        if close(p, want, 1e-7):
            continue
        if not np.all(np.isfinite(p)):
            raise Fail(f"p became {'nan' if np.isnan(p).any() else 'inf'}: look at the "
                       "corrections, m / (1 - b1^t) with its brackets and t counted from 1 (at "
                       "t = 0, 1 - b1^t is 0), and at what goes under the square root")
        for mistake, msg in _ADAM_MISTAKES:
            if close(p, _adam_np(gs, p0, mistake=mistake), 1e-7):
                raise Fail(msg)
        if close(p - p0, p0 - want):
            raise Fail("Adam stepped uphill: p -= lr * m_hat / (sqrt(v_hat) + eps)")
        raise Fail(f"after {len(gs)} steps with {what} (lr 0.1, betas (0.9, 0.999), eps 1e-8), "
                   f"p must be {np.round(want, 6).tolist()}, you gave {np.round(p, 6).tolist()}")


def _decay_np(p0, gs, lr, wd, how):
    """Adam's steps with weight decay applied `how`: 'decoupled' (AdamW), 'l2' (Adam), or a
    typical mistake: 'none', 'both', 'nolr' (1 - wd), 'subtract' (p - lr wd), 'grew'
    (1 + lr wd), 'replace' (g = wd p)."""
    p, m, v = np.array(p0, dtype=np.float64), 0.0, 0.0
    for t, g in enumerate(gs, 1):
        factor = {'decoupled': 1 - lr * wd, 'both': 1 - lr * wd, 'nolr': 1 - wd,
                  'grew': 1 + lr * wd}.get(how, 1)
        p = p * factor - (lr * wd if how == 'subtract' else 0)
        g = g + wd * p if how in ('l2', 'both') else wd * p if how == 'replace' else g
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        p = p - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return p


_DECAY_MISTAKES = {
    'AdamW': ('decoupled', {
        'l2': "AdamW decayed through the gradient (g + wd * p is Adam's L2): Adam's division by "
              "sqrt(v) then makes the decay a step of about lr whatever the weight; AdamW "
              "shrinks p itself: p.array *= 1 - lr * wd",
        'none': "AdamW ignored weight_decay: with decoupled_weight_decay, shrink p itself, "
                "p.array *= 1 - lr * wd",
        'both': "AdamW decayed twice, directly and through g: its decay is only the decoupled "
                "one (p.array *= 1 - lr * wd; g stays as it is)",
        'nolr': "AdamW's decay is scaled by the learning rate: p.array *= 1 - lr * wd (you used "
                "1 - wd)",
        'subtract': "decoupled decay multiplies, p.array *= 1 - lr * wd, taking the same fraction "
                    "off every weight: you subtracted lr * wd",
        'grew': "the weights grew: decay shrinks them, p.array *= 1 - lr * wd"}),
    'Adam': ('l2', {
        'decoupled': "Adam's weight_decay is L2, as in PyTorch's Adam: add wd * p to the gradient "
                     "(g = g + wd * p.array); only AdamW (decoupled_weight_decay=True) shrinks p "
                     "directly",
        'none': "Adam ignored weight_decay: as PyTorch's Adam, add wd * p to the gradient "
                "(g = g + wd * p.array)",
        'both': "Adam decayed twice, through g and directly: Adam's decay is only the L2 term "
                "g = g + wd * p.array",
        'replace': "the decay term is added to the gradient, g = g + wd * p.array: you replaced "
                   "g with it"})}


def check_10_2(m):
    tt, optim = m['tinytorch'], m['optim']
    p0, lr, wd = np.array([2.0, -4.0, 0.5]), 0.1, 0.5
    gs = [np.array([0.0, 0.0, 1.0]), np.array([1.0, 0.5, -2.0])]

    def train(cls, decay, **kw):
        p = leaf(tt, p0)
        opt = cls([p], lr=lr, weight_decay=decay, **kw)
        for g in gs:
            p.grad = tt.tensor(g)
            opt.step()
            if not close(p.grad.array, g):
                raise Fail("the step changed p.grad: g is p.grad's own array, so g += wd * "
                           "p.array writes the decay into the gradient the user sees; make a "
                           "new array: g = g + wd * p.array")
        return p.array
    for name, (right, mistakes) in _DECAY_MISTAKES.items():
        got = train(getattr(optim, name), wd)
        if close(got, _decay_np(p0, gs, lr, wd, right)):
            continue
        for how, msg in mistakes.items():
            if close(got, _decay_np(p0, gs, lr, wd, how)):
                raise Fail(msg)
        rule = 'p *= 1 - lr * wd before the step' if right == 'decoupled' else 'g = g + wd * p'
        raise Fail(f"{name}(lr=0.1, weight_decay=0.5), 2 steps from {p0.tolist()}: p must be "
                   f"{np.round(_decay_np(p0, gs, lr, wd, right), 6).tolist()}, you gave "
                   f"{np.round(got, 6).tolist()} ({rule})")
    got = train(optim.Adam, wd, decoupled_weight_decay=True)
    if not close(got, _decay_np(p0, gs, lr, wd, 'decoupled')):
        raise Fail("Adam(decoupled_weight_decay=True) must decay as AdamW does (AdamW is that "
                   "Adam): test group['decoupled_weight_decay'], not the optimizer's class")
    for name in _DECAY_MISTAKES:
        got = train(getattr(optim, name), 0.0)
        if not close(got, _decay_np(p0, gs, lr, 0.0, 'none')):
            raise Fail(f"{name} with weight_decay=0 must be plain Adam: p "
                       f"{np.round(_decay_np(p0, gs, lr, 0.0, 'none'), 6).tolist()}, you gave "
                       f"{np.round(got, 6).tolist()}")


# -- step 11 (optional): convolution as a matmul over patches, max pooling -------------------
def _positions(h, w, k, d, p, s):
    """(oh, ow): how many places a kernel k (dilation d) takes on an h x w image padded by
    p, at stride s."""
    return tuple((size + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1
                 for i, size in enumerate((h, w)))


def _unfold_np(x, k, d=(1, 1), p=(0, 0), s=(1, 1), dilate=True, stride=True):
    """unfold by its definition, one kernel element at a time: element (i, j) of the patch
    at output position (y, x) is the padded input at (y*sh + i*dh, x*sw + j*dw), so for all
    positions at once it is a strided slice. (N, C*kh*kw, oh*ow); with dilate or stride
    False, a typical mistake (that one ignored)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    oh, ow = _positions(h, w, k, d, p, s)
    dd, ss = (d if dilate else (1, 1)), (s if stride else (1, 1))
    out = np.zeros((n, c, k[0], k[1], oh, ow))
    for i in range(k[0]):
        for j in range(k[1]):
            rows = i * dd[0] + ss[0] * np.arange(oh)
            cols = j * dd[1] + ss[1] * np.arange(ow)
            out[:, :, i, j] = xp[:, :, rows[:, None], cols[None, :]]
    return out.reshape(n, c * k[0] * k[1], oh * ow)


def _fold_np(g, shape, k, d=(1, 1), p=(0, 0), s=(1, 1), add=True, crop=True, dilate=True,
             stride=True):
    """unfold's adjoint by its definition: each column entry back onto its pixel, added; or
    a typical mistake: add False (assigned), crop False (the padding kept), dilate or stride
    False (that one ignored)."""
    n, c, h, w = shape
    oh, ow = _positions(h, w, k, d, p, s)
    dd, ss = (d if dilate else (1, 1)), (s if stride else (1, 1))
    g = g.reshape(n, c, k[0], k[1], oh, ow)
    gx = np.zeros((n, c, h + 2 * p[0], w + 2 * p[1]))
    for i in range(k[0]):
        for j in range(k[1]):
            for y in range(oh):
                for x_ in range(ow):
                    at = (slice(None), slice(None), y * ss[0] + i * dd[0], x_ * ss[1] + j * dd[1])
                    gx[at] = gx[at] + g[:, :, i, j, y, x_] if add else g[:, :, i, j, y, x_]
    return gx[:, :, p[0]:p[0] + h, p[1]:p[1] + w] if crop else gx


# (input shape, kernel, dilation, padding, stride): a square kernel at stride 1, then each
# of stride, dilation and padding on its own, then all of them
_WINDOWS = (((2, 2, 5, 5), (3, 3), (1, 1), (0, 0), (1, 1)),
            ((1, 2, 6, 7), (2, 3), (1, 1), (0, 0), (2, 3)),
            ((1, 1, 7, 6), (3, 2), (2, 1), (0, 0), (1, 1)),
            ((2, 1, 4, 5), (3, 3), (1, 1), (1, 2), (1, 1)),
            ((1, 2, 8, 7), (2, 3), (2, 1), (1, 1), (2, 2)))


def _window_says(k, d, p, s):
    return f"kernel {k}, dilation {d}, padding {p}, stride {s}"


def check_11_1(m):
    tt = m['tinytorch']
    r = rng(28)
    for shape, k, d, p, s in _WINDOWS:
        x = r.standard_normal(shape)
        try:
            got = np.asarray(tt.unfold(leaf(tt, x), k, d, p, s).array)
        except (ValueError, IndexError, TypeError) as e:
            raise Fail(f"for a {_window_says(k, d, p, s)} your code raised {type(e).__name__}: "
                       f"{str(e).splitlines()[0]}: kernel element (i, j) visits oh x ow pixels, "
                       "rows i*dh, i*dh + sh, ... and columns j*dw, j*dw + sw, ...") from None
        want = _unfold_np(x, k, d, p, s)
        if close(got, want):
            continue
        if d != (1, 1) and close(got, _unfold_np(x, k, d, p, s, dilate=False)):
            raise Fail(f"with dilation {d} the kernel's elements are spread out: element (i, j) "
                       f"sits i*dh rows and j*dw columns into its patch (you used i and j)")
        if s != (1, 1) and close(got, _unfold_np(x, k, d, p, s, stride=False)):
            raise Fail(f"with stride {s} the patches start every sh-th row and sw-th column: the "
                       "patch at output position (y, x) starts at row y*sh, column x*sw (you "
                       "moved by 1)")
        if k[0] == k[1] and close(got, want.reshape(shape[:2] + k + (-1,)).swapaxes(2, 3)
                                  .reshape(want.shape)):
            raise Fail("the kernel's rows and columns are swapped: cols[:, :, i, j] is kernel "
                       "element (i, j), row i and column j of each patch")
        if got.shape == want.shape and close(np.sort(got, axis=None), np.sort(want, axis=None)):
            raise Fail(f"for a {_window_says(k, d, p, s)} cols holds the right pixels in the "
                       "wrong places: it is (N, C, kh, kw, oh, ow), cols[n, c, i, j, y, x] the "
                       "pixel of kernel element (i, j) in the patch at (y, x); the lines after "
                       "reshape it to (N, C*kh*kw, oh*ow), row c*kh*kw + i*kw + j")
        raise Fail(f"the columns of unfold for a {_window_says(k, d, p, s)} differ from the "
                   f"patches: {worst(got, want, 'the patch holds')}")


def check_11_2(m):
    tt = m['tinytorch']
    r = rng(29)
    for shape, k, d, p, s in _WINDOWS:
        x = r.standard_normal(shape)
        out = tt.unfold(leaf(tt, x), k, d, p, s)
        g = r.standard_normal(out.shape)
        gx, = rule_grads(out, g, 1)
        gx = np.asarray(gx)
        want = _fold_np(g, shape, k, d, p, s)
        if p != (0, 0) and gx.shape == _fold_np(g, shape, k, d, p, s, crop=False).shape:
            raise Fail(f"the gradient has the padded image's shape {gx.shape}: the padding is not "
                       f"part of the input, so drop its part (gx[:, :, ph:ph + h, pw:pw + wd])")
        if gx.shape != shape:
            raise Fail(f"the gradient has shape {gx.shape}, the image {shape}: after folding "
                       f"into the padded image, cut out the image itself, exactly h rows from "
                       f"ph and wd columns from pw: gx[:, :, ph:ph + h, pw:pw + wd]")
        say = _window_says(k, d, p, s)
        check_input_grad(
            'the image', gx, want, shape,
            [(lambda got: close(got, _fold_np(g, shape, k, d, p, s, add=False)),
              f"patches overlap (a {k[0]}x{k[1]} kernel at stride {s}): a pixel in several "
              "patches gets the sum of their gradients; add into gx (+=), do not assign"),
             (lambda got: s != (1, 1) and close(got, _fold_np(g, shape, k, d, p, s, stride=False)),
              f"with stride {s} the patch at output position (y, x) starts at row y*sh, column "
              "x*sw: its entries go back there (you moved by 1)"),
             (lambda got: d != (1, 1) and close(got, _fold_np(g, shape, k, d, p, s, dilate=False)),
              f"with dilation {d} kernel element (i, j) sits i*dh rows and j*dw columns into "
              "its patch: its entries go back there (you used i and j)")],
            f"for a {say}: d unfold/dx: each column entry goes back onto the pixel it came from, "
            "and overlapping patches add up")
    x32 = r.standard_normal((1, 1, 4, 4)).astype(np.float32)
    out = tt.unfold(tt.tensor(x32, requires_grad=True), 2)
    gx, = rule_grads(out, np.ones(out.shape, dtype=np.float32), 1)
    if np.asarray(gx).dtype != np.float32:
        raise Fail(f"for a float32 image the gradient is {np.asarray(gx).dtype}: a rule returns "
                   "its input's dtype; make gx in g's dtype (np.zeros(xs, dtype=g.dtype))")


def _conv_np(x, w, b, s, p, d):
    """A convolution by its definition: out[n, o, y, x] = sum over c, i, j of w[o, c, i, j]
    times the padded input at (y*sh + i*dh, x*sw + j*dw), plus b[o]."""
    n, o = x.shape[0], w.shape[0]
    cols = _unfold_np(x, w.shape[2:], d, p, s)
    out = np.einsum('ok,nkl->nol', w.reshape(o, -1), cols)
    if b is not None:
        out = out + b[:, None]
    return out.reshape((n, o) + _positions(*x.shape[2:], w.shape[2:], d, p, s))


def check_11_3(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(30)
    for xs, ws, bias, s, p, d in (((2, 3, 5, 5), (4, 3, 3, 3), True, (1, 1), (1, 1), (1, 1)),
                                  ((1, 2, 6, 5), (3, 2, 2, 3), False, (2, 1), (0, 0), (1, 1)),
                                  ((2, 1, 6, 6), (2, 1, 3, 2), True, (1, 2), (1, 0), (2, 1))):
        x, w = r.standard_normal(xs), r.standard_normal(ws)
        b = r.standard_normal(ws[0]) if bias else None
        X, W = leaf(tt, x), leaf(tt, w)
        B = leaf(tt, b) if bias else None
        say = (f"x {xs}, weight {ws}{', a bias' if bias else ', no bias'}, stride {s}, "
               f"padding {p}, dilation {d}")
        try:
            out = nn.conv2d(X, W, B, s, p, d)
        except NotImplementedError:  # a stub (a RuntimeError too): attempt names it
            raise
        except (ValueError, IndexError, TypeError, RuntimeError) as e:
            why = ("test `bias is not None`: a tensor of several numbers is neither true nor "
                   "false" if 'truth value' in str(e) else
                   "tt.unfold takes (input, kernel_size, dilation, padding, stride), in that "
                   "order; weight.reshape(o, -1) is (O, C*kh*kw), the columns (N, C*kh*kw, L), "
                   "their product (N, O, L); the bias (O,) reshaped to (O, 1) adds to every "
                   "position")
            raise Fail(f"for {say} your conv2d raised {type(e).__name__}: "
                       f"{str(e).splitlines()[0]}: {why}") from None
        want = _conv_np(x, w, b, s, p, d)
        if tuple(out.shape) != want.shape:
            raise Fail(f"for {say} the result has shape {tuple(out.shape)}, expected "
                       f"{want.shape} (N, O, oh, ow): the product (N, O, L) reshaped, the "
                       "positions last")
        if not close(out.array, want):
            if bias and close(out.array, _conv_np(x, w, None, s, p, d)):
                raise Fail("the bias was not added: out = out + bias.reshape(o, 1), one number "
                           "per output channel at every position")
            if close(out.array, _conv_np(x, w[:, :, ::-1, ::-1], b, s, p, d)):
                raise Fail("the kernel was flipped: deep learning's convolution is a "
                           "cross-correlation (PyTorch's conv2d does not flip), each output the "
                           "dot product of the kernel with the patch as it is")
            if s != d and close(out.array, _conv_np(x, w, b, d, p, s)):
                raise Fail(f"stride and dilation swapped ({say}): tt.unfold takes (input, "
                           "kernel_size, dilation, padding, stride), in that order")
            raise Fail(f"for {say} the convolution differs from its definition (the sum over "
                       f"c, i, j of w[o, c, i, j] times the patch's pixel): "
                       f"{worst(out.array, want, 'the definition gives')}")
        g = r.standard_normal(want.shape)
        out.backward(tt.tensor(g))
        arrays = [x, w] + ([b] if bias else [])
        leaves = [('x', X), ('the weight', W)] + ([('the bias', B)] if bias else [])
        _check_leaf_grads(leaves, lambda *a: _conv_np(a[0], a[1], a[2] if bias else None, s, p, d),
                          arrays, g, tol=1e-4, says=lambda name, why: (
                              f"for {say}, d out/d {name} through your unfold, matmul and "
                              f"reshape differs from finite differences: {why}"))


def check_11_4(m):
    tt, nn = m['tinytorch'], m['nn']
    r = rng(31)
    x = r.permutation(24).reshape(2, 3, 4).astype(np.float64)  # no ties
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            out = leaf(tt, x).max(dim=dim, keepdim=keepdim).values
            g = r.standard_normal(out.shape)
            try:
                gx, = rule_grads(out, g, 1)
            except (ValueError, IndexError) as e:
                why = ("with keepdim=True g already has dim d (of size 1): use it as it is" if
                       keepdim else "without keepdim, g lost dim d: put it back "
                       "(np.expand_dims(g, d)) to line up with idx") + (
                           "; and take idx as the forward made it (dim d kept, of size 1)")
                raise Fail(f"max(dim={dim}, keepdim={keepdim}): your rule raised "
                           f"{type(e).__name__}: {str(e).splitlines()[0]}: {why}") from None
            want = np.zeros(x.shape)
            np.put_along_axis(want, np.expand_dims(x.argmax(dim), dim),
                              g if keepdim else np.expand_dims(g, dim), axis=dim)
            check_input_grad(
                f'x in max(dim={dim}, keepdim={keepdim})', gx, want, x.shape,
                [(lambda got: close(got, np.broadcast_to(g if keepdim else np.expand_dims(g, dim),
                                                         x.shape)),
                  "max's gradient is not sum's: only the largest element moved the result, so "
                  "only it gets g; the others get 0")], "d max/dx_i = 1 at the largest, else 0")
    # the same rule serves min (its idx is the smallest's) and must use idx, not find the
    # largest again: in float64, 1 + 1e-9 is larger than 1 (in float32 they are equal)
    for op, xs, at in (('min', [[2.0, -1.0, 3.0]], 1), ('max', [[1.0, 1.0 + 1e-9]], 1)):
        gx, = rule_grads(getattr(leaf(tt, xs), op)(dim=1).values, np.array([1.0]), 1)
        if not close(gx, np.eye(len(xs[0]))[at][None]):
            raise Fail(f"{op}({xs[0]}, dim=1) must send its gradient to index {at} (the index "
                       f"{op} returned, idx), got {np.asarray(gx).tolist()}: use idx, which the "
                       "forward found on x itself; do not search for the largest again")
    gx, = rule_grads(tt.tensor(np.float32([[1.0, 2.0]]), requires_grad=True).max(dim=1).values,
                     np.float32([1.0]), 1)
    if np.asarray(gx).dtype != np.float32:
        raise Fail(f"for a float32 x the gradient is {np.asarray(gx).dtype}: a rule returns its "
                   "input's dtype; make gx in g's dtype (np.zeros_like(g, shape=xs))")
    tie = leaf(tt, [[1.0, 3.0, 3.0, 2.0]])
    gx, = rule_grads(tie.max(dim=1).values, np.array([5.0]), 1)
    if close(gx, [[0, 5, 5, 0]]) or close(gx, [[0, 2.5, 2.5, 0]]):
        raise Fail(f"a tie: max([1, 3, 3, 2]) with g = 5 gave {np.asarray(gx).tolist()}: the "
                   "gradient goes to one element, the first of the largest (the index max "
                   "returns, idx), as in PyTorch")
    if not close(gx, [[0, 5, 0, 0]]):
        raise Fail(f"max([1, 3, 3, 2]) with g = 5 must give the gradient [0, 5, 0, 0], got "
                   f"{np.asarray(gx).tolist()}")
    # max pooling: the maximum of each window's column, so its gradient goes to each
    # window's largest pixel (a pixel in two windows gets both)
    for kernel, stride, padding in ((2, 2, 0), (3, 2, 1), (2, 1, 0)):
        img = r.standard_normal((2, 2, 5, 5)) - (padding * 3)  # padded windows: all negative
        X = leaf(tt, img)
        out = nn.max_pool2d(X, kernel, stride, padding)
        g = r.standard_normal(out.shape)
        out.backward(tt.tensor(g))
        k2, p2, s2 = (kernel, kernel), (padding, padding), (stride, stride)
        cols = _unfold_np(img, k2, (1, 1), p2, s2).reshape(4, 1, kernel * kernel, -1)
        cols = np.where(_unfold_np(np.ones((1, 1, 5, 5)), k2, (1, 1), p2, s2) == 1, cols, -np.inf)
        want_out = cols.max(axis=2).reshape(out.shape)
        pick = np.zeros(cols.shape)
        np.put_along_axis(pick, cols.argmax(axis=2)[:, :, None], g.reshape(4, 1, 1, -1), axis=2)
        want = _fold_np(pick.reshape(4, 1, -1), (4, 1, 5, 5), k2, (1, 1), p2, s2).reshape(img.shape)
        if not close(out.array, want_out):
            raise Fail(f"max_pool2d(kernel {kernel}, stride {stride}, padding {padding}) gives "
                       f"other values than each window's largest: "
                       f"{worst(out.array, want_out, 'the largest is')}")
        if X.grad is None or not close(X.grad.array, want):
            raise Fail(f"max_pool2d(kernel {kernel}, stride {stride}, padding {padding}): the "
                       f"image's gradient must be g at each window's largest pixel (added up "
                       f"where windows overlap), 0 elsewhere: "
                       + (worst(X.grad.array, want, 'it should be') if X.grad is not None
                          else 'no .grad'))


# -- step 12 (optional): a KV cache for generation -------------------------------------------
def _cached_attention_np(x, attn, calls, how=''):
    """CausalSelfAttention on x in NumPy, called once per (first, end) span of calls with a
    cache; how: '' as it should be, or 'reversed' (the new keys before the cached ones, a
    typical mistake)."""
    W, b = attn.c_attn.weight.array.astype(np.float64), attn.c_attn.bias.array
    Wp, bp = attn.c_proj.weight.array.astype(np.float64), attn.c_proj.bias.array
    B, _, C = x.shape
    H = attn.n_head
    D = C // H
    q, k, v = np.split(x @ W.T + b, 3, axis=-1)

    def heads(a):
        return a.reshape(B, -1, H, D).transpose(0, 2, 1, 3)
    K = V = None
    outs = []
    for first, end in calls:
        qq, kk, vv = heads(q[:, first:end]), heads(k[:, first:end]), heads(v[:, first:end])
        past = 0 if K is None else K.shape[2]
        if K is not None:
            kk, vv = ((np.concatenate([kk, K], 2), np.concatenate([vv, V], 2)) if how == 'reversed'
                      else (np.concatenate([K, kk], 2), np.concatenate([V, vv], 2)))
        K, V = kk, vv
        allowed = np.tril(np.ones((end - first, past + end - first), dtype=bool), k=past)
        w = _softmax(np.where(allowed, qq @ kk.transpose(0, 1, 3, 2) / math.sqrt(D), -np.inf))
        outs.append((w @ vv).transpose(0, 2, 1, 3).reshape(B, end - first, C) @ Wp.T + bp)
    return np.concatenate(outs, 1)


def check_12_1(m):
    tt, tr = m['tinytorch'], m['transformer']
    cfg = tr.GPTConfig(block_size=8, vocab_size=5, n_layer=2, n_head=2, n_embd=8, dropout=0.0,
                       bias=True)
    tt.manual_seed(3)
    layers = [tr.CausalSelfAttention(cfg) for _ in range(2)]  # two layers, one cache
    x = rng(32).standard_normal((2, 6, 8)).astype(np.float32)
    calls = ((0, 3), (3, 4), (4, 6))  # a prompt of 3, then one token, then two at once
    cache, outs = tr.KVCache(2), [[], []]
    for first, end in calls:
        for layer, attn in enumerate(layers):
            held = 0 if cache.layers[layer] is None else cache.layers[layer][0].shape[2]
            try:
                outs[layer].append(np.asarray(attn(tt.tensor(x[:, first:end]), cache,
                                                   layer).array))
            except NotImplementedError:  # a stub (a RuntimeError too): attempt names it
                raise
            except (ValueError, IndexError, RuntimeError, TypeError) as e:
                kept = cache.layers[layer]
                why = ("keys and values are (B, H, T, D), the positions are dim 2"
                       if kept is None or kept[0].shape[2] != end else
                       "the values must grow with the keys: v = tt.cat([past_v, v], dim=2)"
                       if kept[1].shape[2] != end else
                       "set past from this layer's cached keys (past_k.shape[2]): cache.length "
                       "counts layer 0's, which layer 0 has already extended when layer 1 runs"
                       if layer else
                       "set past to the number of cached positions (past_k.shape[2]): the mask "
                       "after your lines is (T, past + T), a column for every key")
                raise Fail(f"layer {layer}, with the cache holding {held} positions, a call on "
                           f"{end - first} new ones raised {type(e).__name__}: "
                           f"{str(e).splitlines()[0]}: {why}") from None
            kept = cache.layers[layer]
            if kept is None:
                raise Fail("after a call with the cache, cache.layers[layer] is still None: keep "
                           "this call's keys and values there, cache.layers[layer] = (k, v)")
            if kept[0].shape[2] != end:
                raise Fail(f"after {end} positions the cache holds {kept[0].shape[2]}: keep the "
                           "keys and values of every position so far (the cached ones followed "
                           "by the new ones, after the concatenation) in cache.layers[layer]" + (
                               ", not only this call's" if kept[0].shape[2] == end - first
                               else ""))
    for layer, attn in enumerate(layers):
        got = np.concatenate(outs[layer], 1)
        want = _cached_attention_np(x, attn, calls)
        if close(got, want, 1e-4):
            continue
        if close(got, _cached_attention_np(x, attn, calls, 'reversed'), 1e-4):
            raise Fail("the cached keys go first: tt.cat([past_k, k], dim=2) keeps the positions "
                       "in order, which the causal mask assumes (the same for the values)")
        raise Fail(f"layer {layer}, with the cache (calls on positions 0-2, then 3, then 4-5): "
                   f"the outputs differ from attention over all the positions so far: "
                   f"{worst(got, want, 'attention over them gives')}")


def _generate_np(tt, model, prompt, n, temperature):
    """Generation by its definition: the model (no cache) on the last block_size tokens,
    then the next token as generate's lines after the exercise pick it, n times."""
    idx = np.array(prompt)
    for _ in range(n):
        logits, _ = model(idx[:, -model.config.block_size:])
        logits = logits.array[:, -1, :]
        if temperature == 0:
            nxt = np.argmax(logits, axis=-1)[:, None]
        else:
            nxt = tt.multinomial(tt.softmax(tt.tensor(logits / temperature), -1), 1).array
        idx = np.concatenate([idx, nxt.astype(idx.dtype)], axis=1)
    return idx


def _stuck_counter(code):
    """A name that an `if` test of the learner's block reads and the block sets, but never
    advances (no `n += ...`, no `n = ... n ...`): a counter that stays where it was set, as
    (name, the test's line, what it is set to). None when there is none (or no block)."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return None
    tests = [(n.test, ast.unparse(n.test)) for n in ast.walk(tree) if isinstance(n, ast.If)]
    plain, advanced = {}, set()
    for n in ast.walk(tree):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            advanced.add(n.target.id)
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    if any(isinstance(v, ast.Name) and v.id == t.id for v in ast.walk(n.value)):
                        advanced.add(t.id)
                    else:
                        plain.setdefault(t.id, ast.unparse(n.value))
    order = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)  # a count compared
    for test, line in tests:
        for c in ast.walk(test):
            if isinstance(c, ast.Compare) and all(isinstance(op, order) for op in c.ops):
                for v in [c.left] + c.comparators:
                    if isinstance(v, ast.Name) and v.id in plain and v.id not in advanced:
                        return v.id, line, plain[v.id]
    return None


def check_12_2(m):
    tt, tr = m['tinytorch'], m['transformer']
    cfg = tr.GPTConfig(block_size=8, vocab_size=7, n_layer=3, n_head=2, n_embd=16, dropout=0.0,
                       bias=True)  # n_layer is not n_head: a cache sized by the wrong one fails
    cache = tr.KVCache(2)  # exercise 8.1's block (its own check uses no cache) hands it on?
    tr.Block(cfg)(tt.tensor(rng(30).standard_normal((1, 3, 16)).astype(np.float32)), cache, 1)
    if cache.layers[1] is None or cache.layers[0] is not None:
        raise Fail("needs exercise 8.1 first: its Block.forward(x, cache, layer) must hand cache "
                   "and layer on to the attention (self.attn(self.ln_1(x), cache, layer)); "
                   f"generation found {'no' if cache.layers[1] is None else 'the wrong'} layer's "
                   "keys in the cache")
    tt.manual_seed(4)
    model = tr.GPT(cfg)
    for p in model.parameters():
        p.array *= 20  # weights of about 0.4: logits far apart, so each token is clear
    prompt, n = np.array([[1, 2, 3], [4, 5, 6]]), 9  # 3 + 9 tokens: past the block of 8
    calls, forward = [], model.forward

    def counting(idx, targets=None, cache=None):  # what each step runs the model on
        calls.append((tuple(idx.shape), cache is not None))
        return forward(idx, targets, cache)

    def generate(use_cache, temperature):
        calls.clear()
        tt.manual_seed(7)
        model.forward = counting
        try:
            return np.asarray(model.generate(tt.tensor(prompt), n, temperature=temperature,
                                             use_cache=use_cache).array)
        finally:
            del model.forward
    stuck = next(filter(None, map(_stuck_counter, _learner_code(tr, '12.2'))), None)
    if stuck:  # the one mistake the calls cannot tell from `elif cache is None:`
        name, test, first = stuck
        stuck_says = (f"your counter {name} never advances: it is set ({name} = {first}) but "
                      f"no step adds to it, so `{test}` never sees the window slide and the "
                      f"cache is never rebuilt; advance {name} each step the text grows "
                      f"({name} += 1), or test the length itself (idx.shape[1] > bs)")
    for temperature in (0, 4.0):  # greedy, then sampled from the same seed
        tt.manual_seed(7)
        want = _generate_np(tt, model, prompt, n, temperature)
        try:
            got = generate(False, temperature)
        except (ValueError, IndexError) as e:
            raise Fail(f"without the cache, generation past the block size raised "
                       f"{type(e).__name__}: {str(e).splitlines()[0]}: run the model on the "
                       "window (the last block_size tokens), logits, _ = self(window)") from None
        if any(c for _, c in calls):
            raise Fail("with use_cache=False generate must not use a cache: logits, _ = "
                       "self(window)")
        if not np.array_equal(got, want):
            raise Fail("without the cache, generate must give the tokens of the model run on the "
                       "window each step (logits, _ = self(window))" + (
                           f"; at temperature {temperature} the tokens differ: the lines after "
                           "your block divide by the temperature, your block only sets logits"
                           if temperature else ""))
        try:
            got = generate(True, temperature)
        except (ValueError, IndexError) as e:
            says = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            if any(len(shape) != 2 for shape, _ in calls):
                raise Fail(f"with the cache, generation raised {says}: the model takes (B, T) "
                           "token ids; idx[:, -1:] keeps the time dim (idx[:, -1] drops it)"
                           ) from None
            if isinstance(e, IndexError):
                raise Fail(f"with the cache, generation raised {says}: the cache has one entry "
                           "per layer, KVCache(self.config.n_layer)") from None
            if stuck and not any(shape[1] > 1 for shape, _ in calls[1:3]):
                raise Fail(f"with the cache, generation past the block size raised {says}: "
                           + stuck_says)
            raise Fail(f"with the cache, generation past the block size raised {says}" + (
                ": the cache already holds the earlier tokens' keys and values, so after the "
                "first call only the newest token goes through the model (idx[:, -1:])"
                if any(shape[1] > 1 for shape, _ in calls[1:3]) else
                ": once the text is longer than the block size the window slides, every token "
                "sits one position earlier than when it was cached, so rebuild the cache from "
                "the window each step (when idx.shape[1] > bs)")) from None
        ran = [(shape[1], cached) for shape, cached in calls]
        expect = [(min(3 + s, 8) if s == 0 or 3 + s > 8 else 1, True) for s in range(n)]
        if ran[0] == (1, True):
            raise Fail("the first call must encode the whole window (the prompt) into the new "
                       "cache: you ran only the newest token, so the others' keys were never "
                       "made")
        if not all(c for _, c in ran):
            raise Fail("with use_cache=True a step ran the model without the cache: pass "
                       "cache=cache (a KVCache(self.config.n_layer) made on the first call)")
        if ran != expect and [t for t, _ in ran[1:6]] == [3 + s for s in range(1, 6)]:
            raise Fail("with use_cache=True every step ran the whole window through the model: "
                       "the cache already holds the earlier tokens, so after the first call "
                       "feed only the newest one, idx[:, -1:]")
        if stuck and not any(t > 1 for t, _ in ran[6:]):  # never rebuilt once it slides
            raise Fail(stuck_says)
        if not np.array_equal(got, want):
            raise Fail(f"with the cache, generate gave other tokens than without it: "
                       f"{got[0].tolist()} instead of {want[0].tolist()}")
        if ran != expect:
            raise Fail(f"with the cache the model should run on {[t for t, _ in expect]} tokens "
                       f"per step (the window once, then the newest token, and the window again "
                       f"each step once it slides), it ran on {[t for t, _ in ran]}")


CHECKS = {ex: globals()['check_' + ex.replace('.', '_')] for ex in EXERCISES}
# The other exercises whose code each check runs (found by tracing the checks on the
# shipped answers; a test traces them again): a failure is blamed on the first of these
# whose own check fails.
DEPS = {ex: () for ex in EXERCISES}
DEPS.update({'1.2': ('1.1',), '1.3': ('1.1',), '1.4': ('1.1',), '1.5': ('1.1',),
             '3.1': ('1.1',), '4.2': ('1.1',), '7.2': ('7.1',), '8.1': ('6.2', '7.1', '7.2'),
             '9.1': ('1.1', '1.2', '1.4', '2.1', '2.2', '2.3', '4.2'), '10.2': ('10.1',),
             '11.2': ('11.1',), '11.3': ('1.1', '1.2', '2.1', '2.2', '2.3', '3.1', '11.1', '11.2'),
             '11.4': ('2.1', '2.2', '2.3', '11.1', '11.2'), '12.1': ('7.1', '7.2'),
             '12.2': ('4.1', '6.2', '7.1', '7.2', '8.1', '12.1')})


# ---------------------------------------------------------------------------
# The runs at the end of a step, on the learner's whole engine
# ---------------------------------------------------------------------------
def _check_leaf_grads(leaves, f_np, arrays, g, says, scale=1, tol=1e-5):
    """Each (name, leaf)'s .grad against scale * the finite differences of f_np at arrays
    (upstream gradient g); the first that differs fails with says(name, why)."""
    for k, (name, t) in enumerate(leaves):
        want = scale * numeric(f_np, [a.copy() for a in arrays], k, g)
        if t.grad is None or not close(t.grad.array, want, tol):
            why = worst(t.grad.array, want) if t.grad is not None else 'no .grad'
            raise Fail(says(name, why))


def run_2(m):
    tt = m['tinytorch']
    r = rng(19)
    a, b = r.uniform(0.5, 2, (3, 1)), r.uniform(0.5, 2, (4,))

    def f_np(a_, b_):
        h = a_ * b_
        return ((h + b_) * a_ - a_ / b_ + a_ * a_) + (h + a_)

    g = r.standard_normal((3, 4))
    A, B = leaf(tt, a), leaf(tt, b)
    for _ in range(2):  # twice: the second backward adds to .grad
        h = A * B
        y = (h + B) * A - A / B + A * A  # add reads h as it is now (and saves nothing) ...
        h += A  # ... and then h changes in place: y's gradient must reach the h that y read
        out = y + h
        out.backward(tt.tensor(g))
    _check_leaf_grads((('a', A), ('b', B)), f_np, (a, b), g, scale=2, says=lambda name, why: (
        f"h = a * b; y = (h + b) a - a / b + a a; h += a; out = y + h, backward twice: "
        f"{name}.grad differs from twice the finite differences: {why}" + _parents_walk(tt)))
    return ("h = a * b; y = (h + b) a - a / b + a a; h += a; out = y + h with a (3, 1) and b "
            "(4,), backward twice: .grad agrees with finite differences")


def _parents_walk(tt):
    """'; likely cause: ...' when the learner's order or walk reads node._parents where
    _inputs(node) is meant (the run's in-place h += a shows it), else ''."""
    for ex in ('2.1', '2.2'):
        if any('_parents' in code for code in _learner_code(tt, ex)):
            return (f"; likely cause: exercise {ex} walks node._parents: h changed in place after "
                    "the add read it, so h's history is new since; walk _inputs(node), the inputs "
                    "as each op read them")
    return ""


def _learner_code(tt, ex):
    """The learner's lines of an exercise (from the file the module was loaded from)."""
    try:
        text = Path(tt.__file__).read_text()
    except (OSError, AttributeError, TypeError):
        return []
    lines = text.split('\n')
    return ['\n'.join(lines[a:b]) for e, _, _, a, b in regions(text) if e == ex]


def run_3(m):
    tt = m['tinytorch']
    r = rng(20)
    x, w, b = r.standard_normal((4, 3)), r.standard_normal((3, 2)), r.uniform(0.5, 1, (2,))

    def f_np(x_, w_, b_):
        h = x_ @ w_ + b_
        return np.mean(np.exp(h / 4) * h - np.log(b_ * b_) / (h * h + 1)
                       + (h ** 3).sum(0, keepdims=True))

    X, W, B = leaf(tt, x), leaf(tt, w), leaf(tt, b)
    h = X @ W + B
    loss = ((h / 4).exp() * h - (B * B).log() / (h * h + 1)
            + (h ** 3).sum(0, keepdim=True)).mean()
    if not close(loss.array, f_np(x, w, b)):
        raise Fail(f"the loss is {float(loss.array):.6g}, expected {f_np(x, w, b):.6g}")
    loss.backward()
    _check_leaf_grads((('x', X), ('W', W), ('b', B)), f_np, (x, w, b), np.ones(()), tol=1e-4,
                      says=lambda name, why: f"d loss/d {name} through your whole engine "
                                             f"differs from finite differences: {why}")
    return ("loss = mean(exp(h/4) h - log(b^2) / (h^2 + 1) + sum(h^3)) with h = x @ W + b: "
            "all gradients agree")


def run_5(m):
    tt, nn, optim = m['tinytorch'], m['nn'], m['optim']
    r = rng(21)
    x = r.uniform(-1, 1, (64, 1))
    y = 2 * x + 1
    tt.manual_seed(0)
    model = nn.Linear(1, 1)
    model.weight.array[...] = 0.0
    model.bias.array[...] = 0.0
    opt = optim.SGD(model.parameters(), lr=0.1)
    X, Y = tt.tensor(x.astype(np.float32)), tt.tensor(y.astype(np.float32))
    for step in range(300):
        opt.zero_grad()
        loss = nn.mse_loss(model(X), Y)
        loss.backward()
        opt.step()
    w, b = float(model.weight.array[0, 0]), float(model.bias.array[0])
    if not (abs(w - 2) < 0.02 and abs(b - 1) < 0.02):
        raise Fail(f"after 300 SGD steps (lr 0.1) on y = 2x + 1 the model has w = {w:.4f}, "
                   f"b = {b:.4f} (loss {float(loss.array):.4g}); expected w = 2, b = 1")
    return f"300 steps: w = {w:.4f}, b = {b:.4f}, loss {float(loss.array):.2e}"


def spiral(n=60, classes=3, seed=22):
    r = rng(seed)
    xs, ys = [], []
    for c in range(classes):
        t = np.linspace(0.0, 1, n)
        angle = c * 2 * np.pi / classes + 4 * t + r.normal(0, 0.2, n)
        xs.append(np.stack([t * np.sin(angle), t * np.cos(angle)], 1))
        ys.append(np.full(n, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def train_spiral(m, optimizer, steps):
    """A 2-64-3 MLP trained on the spiral by optimizer(parameters): (accuracy, final loss)."""
    tt, nn = m['tinytorch'], m['nn']
    x, y = spiral()
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = optimizer(model.parameters())
    X = tt.tensor(x)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
    return float((model(X).array.argmax(1) == y).mean()), loss


def run_6(m):
    tt, nn, optim = m['tinytorch'], m['nn'], m['optim']
    acc, loss = train_spiral(m, lambda params: optim.SGD(params, lr=1.0, momentum=0.9), 400)
    if acc < 0.95:
        raise Fail(f"the spiral classifier reached only {acc:.0%} training accuracy (loss "
                   f"{float(loss.array):.3f}) after 400 steps; expected at least 95%")
    big = leaf(tt, np.array([[1000.0, 0.0, -1000.0], [1000.0, 1000.0, 0.0]]))
    with np.errstate(all='ignore'):
        ce = nn.cross_entropy(big, np.array([0, 2]))
        ce.backward()
    if not (np.isfinite(ce.array) and np.all(np.isfinite(big.grad.array))):
        raise Fail("cross-entropy on logits of 1000 is not finite: the softmax overflowed")
    return (f"spiral (3 classes): {acc:.0%} after 400 steps; logits of 1000: loss "
            f"{float(ce.array):.4g}, finite gradient")


def run_7(m):
    tt, tr = m['tinytorch'], m['transformer']
    rt, _, rtr = reference()
    r = rng(23)
    q, k, v = (r.standard_normal((2, 2, 5, 4)) for _ in range(3))
    g = r.standard_normal((2, 2, 5, 4))
    mine = [leaf(tt, a) for a in (q, k, v)]
    ref = [rt.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = tr.scaled_dot_product_attention(*mine, is_causal=True)
    want = rtr.scaled_dot_product_attention(*ref, is_causal=True)
    if not close(out.array, want.array):
        raise Fail("causal attention's output differs from the shipped implementation")
    out.backward(tt.tensor(g))
    want.backward(rt.tensor(g))
    for name, a, b in zip('qkv', mine, ref):
        if a.grad is None or not close(a.grad.array, b.grad.array):
            raise Fail(f"d out/d {name} through your engine differs from the shipped "
                       "implementation's")
    cfg = dict(block_size=8, vocab_size=5, n_layer=1, n_head=2, n_embd=8, dropout=0.0, bias=True)
    tt.manual_seed(1)
    a1 = tr.CausalSelfAttention(tr.GPTConfig(**cfg))
    rt.manual_seed(1)
    a2 = rtr.CausalSelfAttention(rtr.GPTConfig(**cfg))
    x = r.standard_normal((2, 6, 8)).astype(np.float32)  # the model's dtype
    X1, X2 = tt.tensor(x, requires_grad=True), rt.tensor(x, requires_grad=True)
    y1, y2 = a1(X1), a2(X2)
    if not close(y1.array, y2.array, 1e-4):
        raise Fail("multi-head causal self-attention differs from the shipped one")
    y1.sum().backward()
    y2.sum().backward()
    if not close(X1.grad.array, X2.grad.array, 1e-4):
        raise Fail("multi-head attention's input gradient differs from the shipped one")
    return "single- and multi-head causal attention: outputs and gradients match the shipped ones"


TEXT = "the cat sat on the mat. the dog sat on the log. "


def run_8(m, steps=300, target=0.3):
    """A 1-layer GPT learns a small text, everything on your code: the engine, the block,
    and your SGD with momentum (Adam is an optional step of its own, 10)."""
    tt, tr, optim = m['tinytorch'], m['transformer'], m['optim']
    chars = sorted(set(TEXT))
    ids = np.array([chars.index(c) for c in TEXT * 4])
    cfg = tr.GPTConfig(block_size=16, vocab_size=len(chars), n_layer=1, n_head=2, n_embd=32,
                       dropout=0.0, bias=True)
    tt.manual_seed(0)
    model = tr.GPT(cfg)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    r = rng(24)
    t0 = time.perf_counter()
    for step in range(steps):
        starts = r.integers(0, len(ids) - 17, 16)
        xb = np.stack([ids[s:s + 16] for s in starts])
        yb = np.stack([ids[s + 1:s + 17] for s in starts])
        opt.zero_grad()
        _, loss = model(tt.tensor(xb), tt.tensor(yb))
        loss.backward()
        if step == 0:  # a mistake that only slows learning shows here, in the gradients
            _same_gradients_as_shipped(model, cfg, xb, yb)
        opt.step()
        if float(loss.array) < target:
            break
    secs = time.perf_counter() - t0
    final = float(loss.array)
    if not final < target:
        raise Fail(f"after {steps} SGD steps the loss is {final:.3f} (it starts near "
                   f"{math.log(len(chars)):.2f}); expected below {target}")
    return (f"a 1-layer GPT learned {len(TEXT)} characters of text: loss {final:.3f} after "
            f"{step + 1} steps ({secs:.0f} s)")


def _same_gradients_as_shipped(model, cfg, xb, yb):
    """Your GPT's gradients on one batch against the shipped engine's, from the same weights."""
    rt, _, rtr = reference()
    ref = rtr.GPT(rtr.GPTConfig(**vars(cfg)))
    mine = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        p.array[...] = mine[name].array
    _, loss = ref(rt.tensor(xb), rt.tensor(yb))
    loss.backward()
    for name, p in ref.named_parameters():
        got = mine[name].grad
        if got is None or not close(got.array, p.grad.array, 1e-4):
            raise Fail(f"the first batch's gradient for {name} differs from the shipped engine's "
                       f"(from the same weights): " + (
                           worst(got.array, p.grad.array, 'the shipped one gives')
                           if got is not None else 'no .grad'))


HELLO = "hello world! "


def run_9(m, steps=150, target=0.1):
    """An LSTM (your cell, in nn.LSTM's loop over time) learns to continue 'hello world! ':
    after 'l' comes 'l', 'o' or 'd', so it must remember what came before."""
    tt, nn, optim = m['tinytorch'], m['nn'], m['optim']
    chars = sorted(set(HELLO))
    v = len(chars)
    ids = np.array([chars.index(ch) for ch in HELLO * 8])
    eye = np.eye(v, dtype=np.float32)
    tt.manual_seed(0)
    lstm, head = nn.LSTM(v, 24, batch_first=True), nn.Linear(24, v)
    opt = optim.SGD(list(lstm.parameters()) + list(head.parameters()), lr=0.5, momentum=0.9)
    r = rng(25)
    for step in range(steps):
        starts = r.integers(0, len(ids) - 13, 8)
        xb = np.stack([ids[k:k + 12] for k in starts])
        yb = np.stack([ids[k + 1:k + 13] for k in starts])
        out, _ = lstm(tt.tensor(eye[xb]))
        loss = nn.cross_entropy(head(out).reshape(-1, v), yb.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if float(loss.array) < target:
            break
    final = float(loss.array)
    if not final < target:
        raise Fail(f"after {steps} SGD steps the loss is {final:.3f} (it starts near "
                   f"{math.log(v):.2f}); expected below {target}")
    return (f"an LSTM on your cell continues {HELLO.strip()!r}: loss {final:.3f} after "
            f"{step + 1} steps")


def run_10(m, steps=300):
    """The spiral of step 6, learned by your AdamW instead of SGD with momentum."""
    optim = m['optim']
    acc, loss = train_spiral(m, lambda params: optim.AdamW(params, lr=0.02, weight_decay=0.01),
                             steps)
    if acc < 0.95:
        raise Fail(f"the spiral classifier reached only {acc:.0%} training accuracy (loss "
                   f"{float(loss.array):.3f}) after {steps} AdamW steps (lr 0.02, weight decay "
                   f"0.01); expected at least 95%")
    return (f"spiral (3 classes) with your AdamW: {acc:.0%} after {steps} steps (loss "
            f"{float(loss.array):.3f})")


def digits():
    """The handwritten digits this project ships (data/digits.csv.gz beside learn.py): 1797
    images of 8x8 pixels valued 0-16, each row 64 pixels and the label."""
    import gzip
    path = HERE / 'data' / 'digits.csv.gz'
    try:
        with gzip.open(path, 'rt') as f:
            rows = np.loadtxt(f, delimiter=',')
    except (OSError, ValueError, EOFError) as e:
        raise Fail(f"cannot read {path} ({type(e).__name__}): the step 11 run needs the digits "
                   "that tinytorch ships in data/") from None
    if rows.ndim != 2 or rows.shape[1] != 65:
        raise Fail(f"{path} is not 65 numbers a row (64 pixels and the label)")
    x = (rows[:, :64] / 16).astype(np.float32).reshape(-1, 1, 8, 8)
    return x, rows[:, 64].astype(np.int64)


def run_11(m, steps=300):
    """A small CNN (your conv2d and max pooling) learns 1500 of the digits and reads the
    other 297, which it never saw."""
    tt, nn, optim = m['tinytorch'], m['nn'], m['optim']
    x, y = digits()
    order = rng(34).permutation(len(y))
    x, y = x[order], y[order]  # the file is sorted by writer: mix them
    tt.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    r = rng(33)
    for step in range(steps):
        batch = r.integers(0, 1500, 64)
        opt.zero_grad()
        loss = nn.cross_entropy(model(tt.tensor(x[batch])), y[batch])
        loss.backward()
        opt.step()
    acc = float((model(tt.tensor(x[1500:])).array.argmax(1) == y[1500:]).mean())
    if acc < 0.93:
        raise Fail(f"the CNN read only {acc:.0%} of the 297 unseen digits after {steps} steps "
                   f"(training loss {float(loss.array):.3f}); expected at least 93%")
    return (f"a CNN on your convolution and max pooling read {acc:.1%} of 297 unseen digits "
            f"after {steps} steps")


def run_12(m, n=40):
    """A small GPT (random weights, made large so that its choices are clear) samples 40
    tokens past its block size with your cache and without, from the same seed."""
    tt, tr = m['tinytorch'], m['transformer']
    cfg = tr.GPTConfig(block_size=32, vocab_size=11, n_layer=2, n_head=2, n_embd=32,
                       dropout=0.0, bias=True)
    tt.manual_seed(5)
    model = tr.GPT(cfg)
    for p in model.parameters():
        p.array *= 10
    prompt = tt.tensor(np.array([[1, 2, 3, 4]]))
    out, secs = {}, {}
    for use_cache in (False, True):
        tt.manual_seed(6)
        t0 = time.perf_counter()
        out[use_cache] = np.asarray(model.generate(prompt, n, use_cache=use_cache).array)[0]
        secs[use_cache] = (time.perf_counter() - t0) / n
    if not np.array_equal(out[True], out[False]):
        k = int(np.argmax(out[True] != out[False]))
        raise Fail(f"sampled from the same seed, generation with the cache gave other tokens "
                   f"than without it, from token {k} on: {out[True][k:k + 8].tolist()} instead "
                   f"of {out[False][k:k + 8].tolist()}")
    return (f"{n} tokens sampled past the block size of {cfg.block_size}: the same with your cache "
            f"and without ({1000 * secs[True]:.1f} ms a token against {1000 * secs[False]:.1f})")


RUN_FNS = {2: run_2, 3: run_3, 5: run_5, 6: run_6, 7: run_7, 8: run_8, 9: run_9, 10: run_10,
           11: run_11, 12: run_12}


# -- after a failed run: probes of the code it uses, each with a closed form ------------------
# A run fails although every exercise up to it passes its check: the mistake is in code
# the exercises do not cover (the optimizers' state, a module's forward) or in something
# their checks do not try. Each probe tries one such piece on a case worked out by hand.
def _probe_sgd(m):
    tt, optim = m['tinytorch'], m['optim']
    p, q = leaf(tt, [1.0, -2.0]), leaf(tt, [5.0])
    opt = optim.SGD([p, q], lr=0.1)
    for g in ([0.5, 0.25], [1.0, -1.0]):
        p.grad, q.grad = tt.tensor(np.array(g)), None
        opt.step()
    # [1, -2] - 0.1 [0.5, 0.25] - 0.1 [1, -1] = [0.85, -1.925]; q has no gradient: untouched
    if not (close(p.array, [0.85, -1.925]) and close(q.array, [5.0])):
        raise Fail(f"SGD's step (optim.py, Optimizer.step and SGD._update): two steps of lr 0.1 "
                   f"with gradients [0.5, 0.25] then [1, -1] from [1, -2] must give [0.85, "
                   f"-1.925], and leave a parameter without .grad alone; got "
                   f"{p.array.tolist()} and {q.array.tolist()}")


def _probe_momentum(m):
    tt, optim = m['tinytorch'], m['optim']
    p = leaf(tt, [0.0])
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    for _ in range(3):
        p.grad = tt.tensor(np.array([1.0]))
        opt.step()
    # buf = 1, 0.9 * 1 + 1 = 1.9, 0.9 * 1.9 + 1 = 2.71: p = -0.1 (1 + 1.9 + 2.71) = -0.561
    got = float(p.array[0])
    if close(got, -0.3):
        raise Fail("momentum (optim.py, SGD._update): the buffer must persist between steps: "
                   "after 3 steps of gradient 1 (lr 0.1, momentum 0.9) p moved 0.3, as without "
                   "momentum; keep it in state['momentum_buffer'] (buf = 0.9 buf + g)")
    if not close(got, -0.561):
        raise Fail(f"momentum (optim.py, SGD._update): 3 steps of gradient 1 from 0 (lr 0.1, "
                   f"momentum 0.9) must give -0.561 (buf = 1, 1.9, 2.71), got {got:.6g}")


def _probe_adam(m):
    tt, optim = m['tinytorch'], m['optim']
    p = leaf(tt, [0.0, 0.0])
    opt = optim.Adam([p], lr=0.1)
    g = np.array([1.0, -2.0])
    for _ in range(2):
        p.grad = tt.tensor(g)
        opt.step()
    # corrected, m/(1-b1^t) = g and v/(1-b2^t) = g^2 at every step of a constant g, so each
    # step moves p by lr g/|g|: [-0.2, 0.2]. Uncorrected, the first step alone moves it by
    # lr * 0.1 / sqrt(0.001) = 3.16 lr.
    if close(p.array, [-0.2, 0.2]):
        return
    if close(p.array, _adam_np([g, g], [0.0, 0.0], mistake='correction')):
        raise Fail("Adam (optim.py, adam_step): the bias correction is missing: m and v start "
                   "at 0, so divide m by 1 - b1^t and v by 1 - b2^t; without it the first "
                   "steps are 3 to 4 times lr instead of lr")
    raise Fail(f"Adam (optim.py, Adam._update and adam_step): 2 steps of gradient [1, -2] from 0 "
               f"(lr 0.1) must give [-0.2, 0.2] (each step lr g/|g|), got {p.array.tolist()}")


def _probe_relu(m):
    tt, nn = m['tinytorch'], m['nn']
    x = leaf(tt, [-1.0, 0.5, 2.0])
    y = nn.ReLU()(x)
    y.backward(tt.tensor(np.array([1.0, 2.0, 3.0])))
    if not (close(y.array, [0.0, 0.5, 2.0]) and close(x.grad.array, [0.0, 2.0, 3.0])):
        raise Fail(f"ReLU (nn.py): relu([-1, 0.5, 2]) must be [0, 0.5, 2] and pass g = [1, 2, 3] "
                   f"back as [0, 2, 3]; got {y.array.tolist()} and {x.grad.array.tolist()}")


def _probe_linear_module(m):
    tt, nn = m['tinytorch'], m['nn']
    lin = nn.Linear(2, 1)
    lin.weight.array[...] = [[2.0, -1.0]]
    lin.bias.array[...] = [0.5]
    x = tt.tensor(np.array([[1.0, 3.0], [2.0, 0.0]], dtype=np.float32))
    y = lin(x)
    y.sum().backward()
    # y = [2 - 3 + 0.5, 4 + 0.5] = [-0.5, 4.5]; dW = column sums of x = [3, 3], db = 2
    if not (close(y.array, [[-0.5], [4.5]]) and close(lin.weight.grad.array, [[3.0, 3.0]])
            and close(lin.bias.grad.array, [2.0])):
        raise Fail("nn.Linear (nn.py, its forward): with W = [[2, -1]], b = [0.5] and x = [[1, 3], "
                   "[2, 0]], y must be [[-0.5], [4.5]], dW = [[3, 3]] and db = [2]")


def _probe_mse(m):
    tt, nn = m['tinytorch'], m['nn']
    x = leaf(tt, [1.0, 2.0, 4.0])
    loss = nn.mse_loss(x, tt.tensor(np.array([1.0, 0.0, 1.0])))
    loss.backward()
    # (0 + 4 + 9) / 3 = 13/3; d/dx = 2 (x - y) / 3 = [0, 4/3, 2]
    if not (close(loss.array, 13 / 3) and close(x.grad.array, [0.0, 4 / 3, 2.0])):
        raise Fail("mse_loss (nn.py): the mean of (x - y)^2 over [1, 2, 4] and [1, 0, 1] is "
                   f"13/3 with gradient [0, 4/3, 2]; got {float(loss.array):.6g}")


def _probe_cross_entropy(m):
    tt, nn = m['tinytorch'], m['nn']
    z = leaf(tt, [[0.0, math.log(3.0)], [0.0, 0.0]])
    loss = nn.cross_entropy(z, np.array([1, 0]))
    loss.backward()
    # row 1: softmax [1/4, 3/4], -log 3/4; row 2: [1/2, 1/2], -log 1/2; the mean of the two;
    # d/dz = (softmax - onehot) / 2 = [[1/8, -1/8], [-1/4, 1/4]]
    want = (-math.log(0.75) - math.log(0.5)) / 2
    if not (close(loss.array, want) and close(z.grad.array, [[0.125, -0.125], [-0.25, 0.25]])):
        raise Fail(f"cross_entropy (nn.py): logits [[0, log 3], [0, 0]] with targets [1, 0] give "
                   f"{want:.6g} (the mean of -log 3/4 and -log 1/2), with gradient (softmax - "
                   f"onehot) / 2; got {float(loss.array):.6g}")


def _probe_embedding(m):
    tt, nn = m['tinytorch'], m['nn']
    w = leaf(tt, np.zeros((3, 2)))
    out = nn.embedding(tt.tensor(np.array([1, 1, 2])), w)
    out.backward(tt.tensor(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])))
    # token 1 is picked twice: its row gets both gradients, [1 + 3, 2 + 4]; row 0 none
    if w.grad is None or not close(w.grad.array, [[0.0, 0.0], [4.0, 6.0], [5.0, 6.0]]):
        got = w.grad.array.tolist() if w.grad is not None else None
        raise Fail(f"an embedding's gradient (tinytorch.py, getitem's backward): rows [1, 1, 2] "
                   f"with g = [[1, 2], [3, 4], [5, 6]] must give [[0, 0], [4, 6], [5, 6]] (a "
                   f"token picked twice gets both gradients: np.add.at, not gx[idx] = g); got "
                   f"{got}")


def _probe_sdpa(m):
    tt, tr = m['tinytorch'], m['transformer']
    q = leaf(tt, [[1.0, 0.0], [0.0, 1.0]])
    k = leaf(tt, [[1.0, 0.0], [0.0, 1.0]])
    v = leaf(tt, [[1.0, 2.0], [3.0, 4.0]])
    y = tr.scaled_dot_product_attention(q, k, v, is_causal=True)
    # query 0 sees key 0 only: v[0]; query 1: softmax([0, 1/sqrt 2]) weights on v[0], v[1]
    w = 1 / (1 + math.exp(-1 / math.sqrt(2)))
    want = [[1.0, 2.0], [1 + 2 * w, 2 + 2 * w]]
    if not close(y.array, want):
        raise Fail(f"scaled_dot_product_attention (transformer.py): causal attention of q = k = "
                   f"I (2x2) on v = [[1, 2], [3, 4]] must give {np.round(want, 4).tolist()} "
                   f"(weights @ v), got {np.round(y.array, 4).tolist()}")


PROBES = {5: [_probe_sgd, _probe_mse, _probe_linear_module],
          6: [_probe_sgd, _probe_momentum, _probe_relu, _probe_linear_module,
              _probe_cross_entropy],
          7: [_probe_sdpa],
          8: [_probe_sgd, _probe_momentum, _probe_embedding, _probe_sdpa, _probe_linear_module,
              _probe_cross_entropy],
          9: [_probe_sgd, _probe_momentum, _probe_linear_module, _probe_cross_entropy],
          10: [_probe_adam, _probe_relu, _probe_linear_module, _probe_cross_entropy],
          11: [_probe_sgd, _probe_momentum, _probe_relu, _probe_linear_module,
               _probe_cross_entropy],
          12: [_probe_sdpa]}


# ---------------------------------------------------------------------------
# The from-scratch track: `start DIR --from-scratch` gives an empty engine of the learner's
# own (engine.py, nn.py and a small text), the seed's eight steps as contracts, never code.
# The checks below call only the learner's files; the answer key is not here (the tests
# hold one that passes every check and run).
# ---------------------------------------------------------------------------
SC_FILES = ('engine.py', 'nn.py')  # in import order
SC_TEXT = 'text.txt'  # the small text step 8's character model learns (made by start)
SC_TEXT_BODY = ("the cat sat on the mat. the dog sat on the log. the cat saw the dog. "
                "the dog saw the cat sat on the mat.\n")
SC_STEPS = {
    1: "A Tensor, how an op enters the graph, unbroadcast, add and mul with their rules",
    2: "The graph in topological order and backward along it",
    3: "New ops, each checked by finite differences: matmul, sum, exp, log, relu, power, "
       "reshape, transpose",
    4: "Parameter collection, Linear and SGD",
    5: "Train a linear regression (y = 2x + 1)",
    6: "Stable softmax, log-softmax, cross-entropy and LayerNorm (and a spiral classifier)",
    7: "Single-head attention, then multi-head",
    8: "A Transformer block, and a character model on your engine learns a text file",
    9: "Optional, past the checklist: Adam and AdamW (moments, bias correction, decoupled "
       "weight decay)",
}
# title, file, the two hints (what to think about, the math), and where tinytorch does the
# same (`map` shows these; hint 3 names it): file, function(s), by name.
SC_EXERCISES = {
    '1.1': dict(title="the Tensor", file='engine.py', tt=('tinytorch.py', 'Tensor, tensor'),
                think="What must the graph know about a tensor besides its values? Which "
                      "inputs are already arrays of the right kind, and which are not?",
                math="Keep a float32/float64 ndarray itself; np.asarray(data, dtype=np.float32) "
                     "for anything else. Set the five attributes the contract names."),
    '1.2': dict(title="unbroadcast", file='engine.py', tt=('tinytorch.py', 'unbroadcast'),
                think="How many copies of a (3,) operand are in a (2, 4, 3) result, and what "
                      "does the chain rule do with a value used several times? Which dims were "
                      "added in front, which were stretched from 1?",
                math="Sum grad over every leading dim broadcasting added (grad.ndim - len(shape) "
                     "of them) and, keeping them, over every dim where shape has 1 and grad "
                     "does not; then reshape to shape. Make new arrays; never write into grad."),
    '1.3': dict(title="how an op enters the graph", file='engine.py',
                tt=('tinytorch.py', 'from_op'),
                think="Which of the result's attributes does backward read later? When does a "
                      "result need them at all?",
                math="requires_grad = any parent's; only then store .parents and .rule."),
    '1.4': dict(title="add, and its rule", file='engine.py', tt=('tinytorch.py', 'add'),
                think="If out = a + b, how much does out move when a moves a little? And what "
                      "shape must b's gradient have when b was broadcast?",
                math="d(a+b)/da = 1, d(a+b)/db = 1: each input gets g, unbroadcast to its shape."),
    '1.5': dict(title="mul, and its rule", file='engine.py', tt=('tinytorch.py', 'mul'),
                think="out = a * b: if a moves by a little, out moves by that little times what?",
                math="d(a*b)/da = b, d(a*b)/db = a: a gets g * b's data, b gets g * a's data, "
                     "each unbroadcast to its own shape (new arrays: never g *= ...)."),
    '2.1': dict(title="the order of the graph (inputs before outputs)", file='engine.py',
                tt=('tinytorch.py', '_topological_order'),
                think="A tensor used by two ops is reached twice: how is it listed once? When "
                      "do you know that all of a tensor's parents are already listed? Python's "
                      "recursion stops at about 1000 calls deep.",
                math="Depth-first, appending a tensor after all its parents (post-order), with a "
                     "set of visited ids, and a stack of (tensor, expanded) pairs instead of "
                     "recursion."),
    '2.2': dict(title="backward", file='engine.py',
                tt=('tinytorch.py', 'backward, _walk, _accumulate'),
                think="In y = x * x the rule returns two gradients, both for x: what must x "
                      "get? And what does PyTorch's .grad hold after two backward calls?",
                math="A dict id(tensor) -> gradient so far, seeded with root's; for each tensor "
                     "in reversed(topo_order(root)): a leaf adds its gradient into .grad (a copy "
                     "in its dtype the first time), any other passes rule(g)'s gradients to its "
                     "parents, adding to what is there."),
    '3.1': dict(title="matmul, and its rule", file='engine.py', tt=('tinytorch.py', 'matmul'),
                think="Write out one entry out[i, j] = sum_k a[i, k] b[k, j]. Which entries of "
                      "out does a[i, k] touch? Then check the shapes: (n, m) and (k, m) must "
                      "give (n, k). And a batch dim that b did not have?",
                math="da = g @ b^T, db = a^T @ g (np.swapaxes(x, -1, -2) transposes the last "
                     "two dims), each unbroadcast to its operand's shape."),
    '3.2': dict(title="sum over axes, and its rule", file='engine.py',
                tt=('tinytorch.py', 'sum, _expand_back'),
                think="Every element of a summed slice moved the sum by 1. How do you line g up "
                      "with x when the summed axes were dropped, all of them?",
                math="Put every summed axis back as size 1 (np.expand_dims(g, axes), the axes "
                     "made non-negative) unless keepdims, then np.broadcast_to(g, x.shape)."),
    '3.3': dict(title="exp, and its rule", file='engine.py', tt=('tinytorch.py', 'exp'),
                think="Which function is its own derivative? Is a value already computed?",
                math="d e^x/dx = e^x, the forward's own result: g * that."),
    '3.4': dict(title="log, and its rule", file='engine.py', tt=('tinytorch.py', 'log'),
                think="How fast does log x grow at x = 1, at x = 10?",
                math="d log(x)/dx = 1/x: g / x."),
    '3.5': dict(title="relu, and its rule", file='engine.py', tt=('tinytorch.py', 'relu'),
                think="Where does max(x, 0) move when x moves, and where does it not?",
                math="The gradient is g where x > 0 and 0 elsewhere (at 0 too)."),
    '3.6': dict(title="power with a number as the exponent, and its rule", file='engine.py',
                tt=('tinytorch.py', 'pow, _pow_number'),
                think="The power rule from calculus, and one special case: p = 0.",
                math="d(x^p)/dx = p x^(p-1), times g; zeros when p == 0 (0 * inf is nan at "
                     "x = 0). Keep x's dtype."),
    '3.7': dict(title="reshape, and its rule", file='engine.py', tt=('tinytorch.py', 'reshape'),
                think="A reshape moves no number: where does each element of g belong?",
                math="g reshaped back to x's shape."),
    '3.8': dict(title="transpose (swap two axes), and its rule", file='engine.py',
                tt=('tinytorch.py', 'transpose'),
                think="Swapping two axes moves each element; what undoes it?",
                math="np.swapaxes(g, axis1, axis2): a swap is its own inverse."),
    '4.1': dict(title="collect the parameters of a module tree", file='nn.py',
                tt=('nn.py', 'Module.named_parameters, Module._named_members'),
                think="A model is a tree: a Block holds Linears that hold weights. Which "
                      "attributes lead further down, and what if two modules hold one tensor?",
                math="Walk vars(module) from the root (a stack or a queue of (name, module)); a "
                     "Parameter is yielded unless its id was seen; a Module or a list of "
                     "Modules is walked when recurse; names joined with '.', no dot before the "
                     "first."),
    '4.2': dict(title="a linear layer", file='nn.py', tt=('nn.py', 'Linear, linear'),
                think="Which shapes must multiply: x (..., n_in) with weight (n_out, n_in)?",
                math="y = x @ weight.transpose(0, 1) + bias; weight and bias drawn with "
                     "np.random.uniform(-1/sqrt(n_in), 1/sqrt(n_in), shape), made float32."),
    '4.3': dict(title="SGD's step", file='nn.py', tt=('optim.py', 'Optimizer, SGD'),
                think="The gradient points uphill. Where does each group keep its rate?",
                math="param_groups: [{'params': [...], 'lr': ...}]; step: for each group, each "
                     "p with a .grad: p.data -= group['lr'] * p.grad."),
    '4.4': dict(title="zero_grad", file='nn.py', tt=('optim.py', 'Optimizer.zero_grad'),
                think="Which parameters does an optimizer hold? All of its groups'.",
                math="p.grad = None for every p of every group."),
    '5.1': dict(title="the mean squared error", file='nn.py', tt=('nn.py', 'mse_loss'),
                think="Which of your ops make a square and a mean? Do you need a rule at all?",
                math="((pred - target) ** 2).mean(): built from ops that have rules, it needs "
                     "none of its own."),
    '6.1': dict(title="a stable softmax", file='nn.py', tt=('tinytorch.py', 'softmax'),
                think="e^1000 overflows. Which constant can you subtract from a row without "
                      "changing its softmax, and must it be the same for every row?",
                math="Subtract each row's own max along axis (keepdims), as a constant (its "
                     "gradient does not matter: the result does not depend on it); then "
                     "e / e.sum(axis, keepdims=True)."),
    '6.2': dict(title="a stable log-softmax", file='nn.py', tt=('tinytorch.py', 'log_softmax'),
                think="log(e_i / sum e) = ? Write it without dividing, so that no probability "
                      "that underflowed to 0 is ever taken the log of.",
                math="shifted = x - max (a constant per row); shifted - log(sum(exp(shifted)))."),
    '6.3': dict(title="cross-entropy", file='nn.py', tt=('nn.py', 'cross_entropy'),
                think="How do you pick each row's target entry with the ops you have (there is "
                      "no indexing op)?",
                math="A constant one-hot array (N, C) times log_softmax(logits), summed, "
                     "negated, divided by N."),
    '6.4': dict(title="layer normalisation", file='nn.py',
                tt=('nn.py', 'LayerNorm, layer_norm'),
                think="Over which axis are the mean and the variance taken, and which variance "
                      "(n or n - 1)? What happens to a row of equal values?",
                math="Centre each row (minus its mean over the last axis, keepdims), divide by "
                     "the square root of the biased variance plus eps, times weight, plus bias."),
    '7.1': dict(title="scaled dot-product attention", file='nn.py',
                tt=('nn.py', 'attention_weights, scaled_dot_product_attention'),
                think="Which axis does the softmax run over: the queries' or the keys'? Where "
                      "must a bool mask act so that the kept weights still sum to 1? What does "
                      "a softmax of nothing but -inf give?",
                math="scores = q @ k^T / sqrt(d); a bool mask becomes 0 / -inf added to the "
                     "scores, a float mask is added as it is; softmax over the last axis; @ v. "
                     "Rows with no allowed key: leave them unmasked, then multiply their "
                     "weights by 0."),
    '7.2': dict(title="split into heads", file='nn.py',
                tt=('transformer.py', 'CausalSelfAttention.attend'),
                think="In memory, a (B, T, C) tensor holds position after position. Which "
                      "reshape keeps each position's features together?",
                math="reshape to (B, T, H, D), then swap the axes T and H."),
    '7.3': dict(title="merge the heads", file='nn.py',
                tt=('transformer.py', 'CausalSelfAttention.attend'),
                think="What undoes split_heads, step by step, in reverse?",
                math="swap H and T back to (B, T, H, D), then reshape to (B, T, H*D)."),
    '7.4': dict(title="multi-head causal self-attention", file='nn.py',
                tt=('transformer.py', 'CausalSelfAttention'),
                think="Which mask lets position t see 0..t only, and which shape must it have?",
                math="A bool (T, T) mask np.tril(np.ones((T, T), bool)); q, k, v split, "
                     "attention, merge, then out."),
    '9.1': dict(title="Adam and AdamW", file='nn.py', tt=('optim.py', 'Adam, adam_step, AdamW'),
                think="m and v start at 0: after the first step m = (1 - b1) g, a tenth of g, "
                      "and v a thousandth of g^2. What number undoes that at step t? Where does "
                      "each parameter keep its m, v and t between steps?",
                math="per parameter: t += 1; Adam: g = g + wd p; AdamW: p *= 1 - lr wd; m = b1 m "
                     "+ (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr (m / (1 - b1^t)) / "
                     "(sqrt(v / (1 - b2^t)) + eps)."),
    '8.1': dict(title="the Transformer block", file='nn.py', tt=('transformer.py', 'Block'),
                think="Each sub-layer adds to its input. Which x does each sub-layer read, "
                      "and which x does it add to?",
                math="x = x + attn(ln1(x)); then x + proj(relu(fc(ln2(x))))."),
}
for _k, _v in SC_EXERCISES.items():
    _v['step'] = int(_k.split('.')[0])
SC_ORDER = sorted(SC_EXERCISES, key=lambda k: tuple(map(int, k.split('.'))))
SC_OPTIONAL = 9  # from here on past the seed's checklist: `check` alone skips it until started
SC_RUNS = {2: "a graph with a tensor used twice, an in-place += and two backward calls, vs "
              "finite differences",
           3: "gradients of a small model through your whole engine vs finite differences",
           5: "fit y = 2x + 1 with your Linear, mse_loss, backward and SGD",
           6: "a spiral classifier, and cross-entropy on logits of 1000",
           7: "multi-head causal attention: your engine's gradient vs finite differences",
           8: "a character model (your Block) learns text.txt, on your engine alone",
           9: "a spiral classifier trained by your AdamW (at least 95% within 200 steps)"}
SC_OPTIONAL_LATER = ("Adam and AdamW are optional step 9 (python learn.py check 9.1); "
                     "convolution as im2col and a KV cache are not yet in the from-scratch "
                     "track (the cut-out track has them: python learn.py start OTHERDIR, steps "
                     "11-12)")


def sc_workspace_text(f):
    """A from-scratch file as the learner gets it: the contracts, each exercise's code a
    raise that names it."""
    text = SC_TEMPLATES[f]
    out = []
    for line in text.split('\n'):
        got = re.fullmatch(r'(\s*)@@(\d+\.\d+)', line)
        if got:
            ind, ex = got.groups()
            line = (f'{ind}raise NotImplementedError("exercise {ex}: not implemented yet; '
                    f'write it here, then run: python learn.py check {ex}")')
        out.append(line)
    return (f"# Your {f} (made by learn.py, version {VERSION}, the from-scratch track)\n"
            + '\n'.join(out))

SC_TEMPLATES = {'engine.py':
                r'''"""engine.py: your own autograd engine, from an empty file (learn.py's
from-scratch track).

Each block between '# exercise N.k' and '# end exercise' is yours to write: it states a
contract (what it takes, what it returns, and why), never the code. Replace its `raise`
with your code, then run: python learn.py check N.k
The few lines outside the blocks are plumbing, so that you may write a + b for add(a, b),
x.sum() for reduce_sum(x) and loss.backward() for backward(loss): keep them.
Only NumPy; nothing from tinytorch.
"""
import numpy as np


class Tensor:
    # exercise 1.1: the Tensor
    def __init__(self, data, requires_grad=False):
        """A NumPy array with a place in the computation graph.
        data: an array, a list or a number. self.data must be a NumPy array: a float32 or
        float64 array is kept as it is (not copied), a NumPy float32 or float64 number (what
        np.sum of a whole array gives) becomes an array of its dtype, anything else float32.
        self.requires_grad: as given. self.grad: None. self.parents: () and self.rule: None.
        Why: the values are NumPy's; the graph needs to know, per tensor, whether a gradient
        must reach it (requires_grad), where it adds up (grad), and how the tensor was made
        (parents and rule, which exercise 1.3 sets for an op's result; a tensor you make
        yourself is a leaf)."""
        @@1.1
    # end exercise

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)

    def __repr__(self):
        return f"Tensor({self.data}, requires_grad={self.requires_grad})"

    # Plumbing: each operator calls an op you write below.
    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(other, self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(other, self)

    def __neg__(self):
        return mul(self, -1.0)

    def __sub__(self, other):
        return add(self, mul(other, -1.0))

    def __rsub__(self, other):
        return add(other, mul(self, -1.0))

    def __truediv__(self, other):
        return mul(self, power(as_tensor(other), -1))

    def __rtruediv__(self, other):
        return mul(other, power(self, -1))

    def __pow__(self, p):
        return power(self, p)

    def __matmul__(self, other):
        return matmul(self, other)

    def sum(self, axis=None, keepdims=False):
        return reduce_sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        total = reduce_sum(self, axis, keepdims)
        return total * (total.data.size / self.data.size)

    def exp(self):
        return exp(self)

    def log(self):
        return log(self)

    def relu(self):
        return relu(self)

    def reshape(self, *shape):
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple)
                       else shape)

    def transpose(self, axis1, axis2):
        return transpose(self, axis1, axis2)

    def backward(self, grad=None):
        backward(self, grad)


def as_tensor(x):
    """x itself if it is a Tensor, else a constant Tensor of it: an array keeps its dtype, a
    number (Python's or NumPy's) becomes float32, so that it never turns float32 into float64."""
    if isinstance(x, Tensor):
        return x
    return Tensor(x if isinstance(x, np.ndarray) else np.asarray(x, dtype=np.float32))


# exercise 1.2: unbroadcast
def unbroadcast(grad, shape):
    """grad: d loss / d result, an array of the broadcast result's shape; shape: the shape of
    one operand (a tuple). Returns d loss / d operand: an array of exactly `shape`, in grad's
    dtype; grad itself is left unchanged (it may be read-only).
    Why: broadcasting used each element of a smaller operand several times, and a value used
    several times gets the gradients of all its uses."""
    @@1.2
# end exercise


# exercise 1.3: how an op enters the graph
def op(data, parents, rule):
    """data: the op's result (an array); parents: the tuple of the op's input Tensors; rule: a
    function of g (d loss / d result, an array of data's shape) that returns a tuple with one
    gradient per parent, each an array of that parent's shape.
    Returns the result as a Tensor that requires grad if any parent does; only then does it
    keep parents and rule (as .parents and .rule), else it is a leaf like any other.
    Why: this is the whole graph: each result remembers what it was made from and how to send
    a gradient back to it; and a result of constants remembers nothing, so a graph that needs
    no gradient costs nothing."""
    @@1.3
# end exercise


# exercise 1.4: add, and its rule
def add(a, b):
    """a, b: Tensors or numbers (as_tensor makes a number a Tensor), of shapes that broadcast.
    Returns a + b as op makes it, with the rule that gives (d loss/d a, d loss/d b), each of
    its operand's own shape, in the result's dtype.
    Why: the simplest op with two inputs; its rule shows how a gradient splits between the
    inputs, and why a broadcast input needs unbroadcast."""
    @@1.4
# end exercise


# exercise 1.5: mul, and its rule
def mul(a, b):
    """a, b: Tensors or numbers, of shapes that broadcast. Returns a * b (elementwise) as op
    makes it, with the rule that gives (d loss/d a, d loss/d b), each of its operand's shape.
    Why: the first rule that needs the forward's values: what each input was multiplied by."""
    @@1.5
# end exercise


# exercise 2.1: the order of the graph (inputs before outputs)
def topo_order(root):
    """root: a Tensor. Returns a list of every tensor that root depends on through .parents
    and that requires grad (root too), each exactly once, every tensor after all of its
    parents. It must work for a chain of 100,000 ops.
    Why: backward may apply a tensor's rule only once every gradient that reaches the tensor
    has arrived, that is after every tensor made from it; this list, reversed, is that order."""
    @@2.1
# end exercise


# exercise 2.2: backward
def backward(root, grad=None):
    """root: a Tensor; grad: d loss / d root, an array of root's shape (None: ones, for a root
    of one element). Walks the graph from root back to the leaves: each tensor's rule gets the
    sum of all the gradients that reached that tensor, and every leaf (a tensor without a rule)
    that requires grad gets its gradient added into its .grad: an array of its own shape and
    dtype, which nobody else holds. Returns nothing. The arrays handed to you (grad, what a
    rule returns) may be read-only and must stay unchanged.
    Why: the chain rule, applied once per tensor, in reverse order of how the graph was made;
    a tensor used twice gets both gradients, and .grad adds up over backward calls as in
    PyTorch (until the optimizer's zero_grad clears it)."""
    @@2.2
# end exercise


# exercise 3.1: matmul, and its rule
def matmul(a, b):
    """a: (..., n, k), b: (..., k, m) Tensors, each at least 2-D; their leading (batch) dims
    broadcast. Returns a @ b, (..., n, m), as op makes it, with the rule that gives
    (d loss/d a, d loss/d b), each of its operand's shape.
    Why: every linear layer and every attention score is a matrix product: this one rule
    carries most of a network's gradient."""
    @@3.1
# end exercise


# exercise 3.2: sum over axes, and its rule
def reduce_sum(x, axis=None, keepdims=False):
    """x: a Tensor; axis: None (all axes), an int or a tuple of ints (negative ones count from
    the end); keepdims: keep each summed axis with size 1. Returns the sum, as NumPy's sum
    gives it, as op makes it, with the rule that gives (d loss/d x,), of x's shape.
    Why: losses and means are sums; and a sum's gradient must reach every element it added."""
    @@3.2
# end exercise


# exercise 3.3: exp, and its rule
def exp(x):
    """Returns e^x elementwise as op makes it, with the rule that gives (d loss/d x,).
    Why: softmax is built on it."""
    @@3.3
# end exercise


# exercise 3.4: log, and its rule
def log(x):
    """Returns the natural log of x (x > 0) elementwise, with the rule that gives (d loss/d x,).
    Why: cross-entropy is a log of probabilities."""
    @@3.4
# end exercise


# exercise 3.5: relu, and its rule
def relu(x):
    """Returns max(x, 0) elementwise, with the rule that gives (d loss/d x,); at x = 0 the
    gradient is 0 (as PyTorch's).
    Why: the nonlinearity between two linear layers; without one, two layers are one."""
    @@3.5
# end exercise


# exercise 3.6: power with a number as the exponent, and its rule
def power(x, p):
    """x: a Tensor; p: a Python number (int or float). Returns x ** p elementwise in x's dtype,
    with the rule that gives (d loss/d x,); x ** 0 is 1 everywhere, whose gradient is 0.
    Why: division (a * b ** -1), squares for a mean squared error, and 1 / sqrt for a norm."""
    @@3.6
# end exercise


# exercise 3.7: reshape, and its rule
def reshape(x, shape):
    """x: a Tensor; shape: a tuple (one entry may be -1). Returns x's values in that shape (in
    NumPy's row-major order), with the rule that gives (d loss/d x,), of x's shape.
    Why: attention splits the features into heads and puts them back together."""
    @@3.7
# end exercise


# exercise 3.8: transpose (swap two axes), and its rule
def transpose(x, axis1, axis2):
    """x: a Tensor; axis1, axis2: two of its axes (negative ones count from the end). Returns
    x with those two axes swapped, with the rule that gives (d loss/d x,), of x's shape.
    Why: k transposed for the scores q k^T, and the heads moved next to the batch."""
    @@3.8
# end exercise
''',
'nn.py': r'''"""nn.py: modules, an optimizer, losses and attention, on your engine (learn.py's
from-scratch track). As in engine.py: replace each block's `raise` with your code, then
run: python learn.py check N.k. Only NumPy and your engine.
"""
import numpy as np

from engine import Tensor, as_tensor


class Parameter(Tensor):
    """A Tensor that a Module owns and an optimizer changes: it always requires grad."""

    def __init__(self, data):
        super().__init__(data, requires_grad=True)


class Module:
    """A part of a model: its Parameters and sub-Modules are its attributes."""

    def __call__(self, *args):
        return self.forward(*args)

    def parameters(self, recurse=True):
        return [p for _, p in self.named_parameters(recurse=recurse)]

    # exercise 4.1: collect the parameters of a module tree
    def named_parameters(self, prefix='', recurse=True):
        """Yields (name, parameter) for every Parameter among this module's attributes and,
        with recurse, its sub-modules' (an attribute that is a Module, or a list of Modules:
        a list's item is named by its index), depth first: a module's own parameters and
        sub-modules in the order its attributes were set. A name is the attribute names
        joined by dots ('block.attn.query.weight', 'layers.0.weight'), after prefix and a dot
        when prefix is given ('weight' at the root). A parameter held by two modules (weight
        tying) is yielded once, under the first name found.
        Why: an optimizer needs every parameter exactly once, whatever the model's shape."""
        @@4.1
    # end exercise


# exercise 4.2: a linear layer
class Linear(Module):
    """Linear(n_in, n_out, bias=True): y = x W^T + b for x of shape (..., n_in), y of shape
    (..., n_out). Parameters: weight (n_out, n_in) and, with bias, bias (n_out,), float32,
    drawn with np.random uniformly from -1/sqrt(n_in) to 1/sqrt(n_in) (bias=False: no bias
    attribute at all, or None).
    Why: the layer every network is made of; the uniform range keeps the outputs' size about
    the inputs' whatever n_in is."""

    def __init__(self, n_in, n_out, bias=True):
        @@4.2

    def forward(self, x):
        @@4.2
# end exercise


class SGD:
    # exercise 4.3: SGD's step
    def __init__(self, params, lr):
        """params: a list of Parameters, or a list of groups: dicts with 'params' (a list of
        Parameters) and optionally 'lr' (the group's own learning rate; lr is the default).
        Keep them as self.param_groups: a list of dicts, each with its 'params' and 'lr'.
        Why: groups let one model train its parts at different rates."""
        @@4.3

    def step(self):
        """Moves every parameter that has a .grad a step of its group's learning rate against
        its gradient, changing the parameter's own array (the model holds that Parameter);
        .grad is left unchanged. Why: the gradient points where the loss grows fastest."""
        @@4.3
    # end exercise

    # exercise 4.4: zero_grad
    def zero_grad(self):
        """Clears the gradient of every parameter, in every group (sets .grad to None).
        Why: backward adds into .grad, so each step must start from nothing."""
        @@4.4
    # end exercise


# exercise 9.1: Adam and AdamW (optional, past the checklist: python learn.py check 9.1)
class Adam(SGD):
    """Adam(params, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    PyTorch's Adam, or with decoupled=True its AdamW. params as SGD's; each group keeps its
    own 'lr', 'betas', 'eps', 'weight_decay' and 'decoupled' (the arguments are the defaults).
    step(): each parameter with a .grad moves as torch.optim.Adam (AdamW) moves it: by the
    moving average of its gradients over the square root of the moving average of their
    squares, both kept between steps for each parameter and corrected for having started at
    0; weight_decay is Adam's L2 term added to the gradient, or AdamW's decoupled shrinking
    of the weights themselves. .grad is left unchanged; zero_grad is SGD's.
    Why: a step size of its own for every weight, from that weight's gradient history: a
    Transformer trains far faster than with SGD."""

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled=False):
        @@9.1

    def step(self):
        @@9.1
# end exercise


# exercise 5.1: the mean squared error
def mse_loss(pred, target):
    """pred: a Tensor; target: a Tensor or array of pred's shape. Returns the mean over every
    element of (pred - target)^2, a Tensor of one element; pred and target are left unchanged.
    Why: the loss of regression: large errors cost more than small ones."""
    @@5.1
# end exercise


# exercise 6.1: a stable softmax
def softmax(x, axis=-1):
    """x: a Tensor of scores. Returns probabilities of x's shape: e^x divided by its sum along
    axis, so that they are positive and sum to 1 along axis; finite for any finite x (scores
    of 1000 included), with the gradient of that formula.
    Why: e^1000 is inf in floating point; softmax(x - c) = softmax(x) for any c constant
    along the axis."""
    @@6.1
# end exercise


# exercise 6.2: a stable log-softmax
def log_softmax(x, axis=-1):
    """x: a Tensor of scores. Returns log(softmax(x)) along axis, x's shape, finite for any
    finite x, even where softmax itself is 0 in floating point (scores 0 and -200 in float32).
    Why: cross-entropy needs the log of a probability, and the log of a number that
    underflowed to 0 is -inf."""
    @@6.2
# end exercise


# exercise 6.3: cross-entropy
def cross_entropy(logits, targets):
    """logits: a Tensor (N, C) of scores; targets: an int array (N,) of classes in 0..C-1.
    Returns the mean over the N rows of -log_softmax(logits)[row, target], a Tensor of one
    element; logits and targets are left unchanged.
    Why: the loss of classification: the surprise at the right class, small when the model
    gives it a high probability."""
    @@6.3
# end exercise


# exercise 6.4: layer normalisation
class LayerNorm(Module):
    """LayerNorm(n, eps=1e-5): for x of shape (..., n), each row of n values is shifted to
    mean 0 and scaled to variance 1 (the biased variance, over n) with eps added to the
    variance, then multiplied by weight (n,) and added bias (n,), Parameters starting at ones
    and zeros, float32. x is left unchanged.
    Why: it keeps every layer's inputs at one scale, so a deep stack trains; eps keeps a
    constant row finite."""

    def __init__(self, n, eps=1e-5):
        @@6.4

    def forward(self, x):
        @@6.4
# end exercise


# exercise 7.1: scaled dot-product attention
def attention(q, k, v, mask=None):
    """q: (..., Tq, d), k: (..., Tk, d), v: (..., Tk, dv) Tensors. mask: None, or an array that
    broadcasts to (..., Tq, Tk): a bool mask (True: this query may look at this key) or a float
    mask added to the scores. Returns (..., Tq, dv): for each query, the average of the values
    weighted by the softmax over the keys of the scores q . k / sqrt(d). A query that a bool
    mask lets look at no key at all gets zeros (never nan). q, k, v and mask are left
    unchanged.
    Why: each position gathers what it needs from the others; the 1/sqrt(d) keeps the scores'
    size, and so the softmax's gradient, independent of d."""
    @@7.1
# end exercise


# exercise 7.2: split into heads
def split_heads(x, n_head):
    """x: (B, T, C) with C a multiple of n_head. Returns (B, n_head, T, C // n_head): head h
    gets features h*D to (h+1)*D - 1 of every position, D = C // n_head.
    Why: each head attends with its own slice of the features, all heads at once as a batch."""
    @@7.2
# end exercise


# exercise 7.3: merge the heads
def merge_heads(x):
    """x: (B, H, T, D). Returns (B, T, H*D): the heads' features side by side at each
    position, head 0's first: the exact inverse of split_heads.
    Why: the next layer sees one feature vector per position again."""
    @@7.3
# end exercise


# exercise 7.4: multi-head causal self-attention
class MultiHeadAttention(Module):
    """MultiHeadAttention(n_embd, n_head): four Linear(n_embd, n_embd) layers named query, key,
    value and out. forward(x), x (B, T, n_embd): q, k and v are x through query, key and value,
    split into n_head heads; each head attends causally (position t looks at positions 0..t
    only); the heads merged go through out. Returns (B, T, n_embd).
    Why: several heads look for different things at once; causal, because a model that
    predicts the next character must not see it."""

    def __init__(self, n_embd, n_head):
        @@7.4

    def forward(self, x):
        @@7.4
# end exercise


# exercise 8.1: the Transformer block
class Block(Module):
    """Block(n_embd, n_head): sub-modules ln1 = LayerNorm(n_embd), attn =
    MultiHeadAttention(n_embd, n_head), ln2 = LayerNorm(n_embd), fc = Linear(n_embd,
    4 * n_embd), proj = Linear(4 * n_embd, n_embd). forward(x), x (B, T, n_embd): a pre-LN
    block: attention reads the normalised x and adds its result to x; then the MLP (fc, relu,
    proj) reads the normalised result and adds to it. Returns (B, T, n_embd).
    Why: the residual sums give the gradient a direct path through every block; normalising
    each sub-layer's input (pre-LN) keeps a deep stack stable."""

    def __init__(self, n_embd, n_head):
        @@8.1

    def forward(self, x):
        @@8.1
# end exercise
'''}

# --- the from-scratch checks: each calls the learner's code, then names the mistake ---
def _ro(a, dtype=np.float64):
    """A read-only copy: code that writes into what it was handed fails at its own line."""
    a = np.array(a, dtype=dtype)
    a.setflags(write=False)
    return a


def _wrote_into(e):
    return isinstance(e, ValueError) and 'read-only' in str(e)


def _sc_call(who, fn, *args):
    """fn(*args), an in-place write into a handed array named as such, at the learner's line."""
    try:
        return fn(*args)
    except ValueError as e:
        if not _wrote_into(e):
            raise
        raise Fail(f"{who} wrote into an array it was handed ({_where(e, _SC_WS[0])}): inputs, g "
                   "and what a rule returns stay unchanged; make a new array instead (y = x - m, "
                   "not x -= m)") from None


_SC_WS = [Path('.')]  # the workspace being checked (for the learner's line in a message)


def _sc_rule(out, n, name):
    """out.rule(g) with a read-only g of out's shape: (g, the tuple it returned)."""
    if not getattr(out, 'requires_grad', False) or getattr(out, 'rule', None) is None:
        raise Fail(f"{name}'s result has no rule (.rule is None or requires_grad False) though "
                   "an input requires grad: make the result with op(data, parents, rule)")
    g = _ro(rng(3).standard_normal(out.shape), out.dtype)
    got = _sc_call(f"{name}'s rule", out.rule, g)
    if not isinstance(got, (tuple, list)) or len(got) != n:
        raise Fail(f"{name}'s rule must return a tuple of {n} gradient(s), one per parent; it "
                   f"returned {type(got).__name__}"
                   + (f" of {len(got)}" if isinstance(got, (tuple, list)) else ''))
    return g, got


def _sc_grad(name, op_name, got, want, shape, dtype, math_='', extra=()):
    """One parent's gradient from a rule against finite differences."""
    if got is None:
        raise Fail(f"{op_name}'s rule gave None for {name}, which requires grad")
    got = np.asarray(got)
    for pred, msg in extra:
        if pred(got):
            raise Fail(msg)
    if got.shape != tuple(shape):
        raise Fail(f"{op_name}'s gradient for {name} has shape {got.shape}, but {name} has "
                   f"shape {tuple(shape)}" + (
                       ": sum it back to the operand's shape (unbroadcast)"
                       if got.size > int(np.prod(shape)) else
                       ": the same numbers in another shape: undo what the forward did to the "
                       "axes (a gradient has its input's shape)" if got.size == int(np.prod(shape))
                       else ""))
    if got.dtype != dtype:
        raise Fail(f"{op_name}'s gradient for {name} is {got.dtype}, but {name} is "
                   f"{np.dtype(dtype)}: a "
                   f"rule keeps its input's dtype (an array you make: give it g's dtype)")
    if close(got, want, 1e-4 if dtype == np.float32 else 1e-5):
        return
    if close(-got, want):
        raise Fail(f"sign error in {op_name}'s gradient for {name}: it is the negative of the "
                   f"right one ({math_})")
    if close(got, 2 * want) or close(2 * got, want):
        how = 'twice' if close(got, 2 * want) else 'half'
        raise Fail(f"{op_name}'s gradient for {name} is {how} the right one ({math_})")
    raise Fail(f"{op_name}'s gradient for {name} is wrong: {worst(got, want)} ({math_})")


def _sc_forward(name, out, want, E, dtype):
    if not isinstance(out, E.Tensor):
        raise Fail(f"{name} must return a Tensor (made by op), got {type(out).__name__}")
    if np.shape(out.data) != np.shape(want):
        raise Fail(f"{name}'s result has shape {np.shape(out.data)}, expected {np.shape(want)}")
    if out.data.dtype != dtype:
        raise Fail(f"{name} turned {np.dtype(dtype)} into {out.data.dtype}: float32 in, float32 "
                   "out (an "
                   "array you make: give it the input's dtype; a number is a float32 Tensor)")
    if not close(out.data, want, 1e-4 if dtype == np.float32 else 1e-7):
        raise Fail(f"{name}'s result is wrong: {worst(out.data, want, 'NumPy gives')}")


def _sc_op_check(m, name, fn, np_fn, shapes, math_, positive=False, same=True, extra=None,
                 args=()):
    """An op with Tensor inputs: its forward against NumPy and its rule against finite
    differences for each case of input shapes (the first in float32 too), inputs read-only;
    `same`: one tensor as every input too."""
    E = m['engine']
    r = rng(2)
    cases = [(s, False, np.float64) for s in shapes] + [(shapes[0], False, np.float32)] + (
        [(shapes[-1], True, np.float64)] if same else [])
    for case, one, dtype in cases:
        arrays = [r.uniform(0.5, 2.0, s) if positive else r.standard_normal(s) for s in case]
        if one:
            arrays = [arrays[0]] * len(arrays)
        ts = [E.Tensor(_ro(a, dtype), requires_grad=True) for a in arrays]
        if one:
            ts = [ts[0]] * len(ts)
        out = _sc_call(name, fn, *ts, *args)
        _sc_forward(name, out, np_fn(*[a.astype(dtype) for a in arrays], *args), E, dtype)
        g, got = _sc_call(name, _sc_rule, out, len(ts), name)
        g64 = np.asarray(g, np.float64)
        if one:
            want = numeric(lambda x_: np_fn(*([x_] * len(ts)), *args),
                           [arrays[0].astype(np.float64)], 0, g64)
            tot = sum(np.asarray(p, np.float64) for p in got)
            _sc_grad(f"x ({name} of one tensor x as every input: the sum of its gradients)",
                     name, tot, want, ts[0].shape, np.float64, math_)
            continue
        for i, (t, pg) in enumerate(zip(ts, got)):
            who = 'ab'[i] if len(ts) > 1 else 'x'
            want = numeric(lambda *xs: np_fn(*xs, *args),
                           [a.astype(np.float64) for a in arrays], i, g64)
            more = extra(who, arrays, g64, case) if extra else ()
            _sc_grad(who, name, pg, want, t.shape, dtype, math_, more)


def sc_check_1_1(m):
    E = m['engine']
    t = E.Tensor([1, 2, 3])
    if not isinstance(t.data, np.ndarray):
        raise Fail(f"Tensor([1, 2, 3]).data is a {type(t.data).__name__}: keep a NumPy array")
    if t.data.dtype != np.float32:
        raise Fail(f"Tensor([1, 2, 3]).data is {t.data.dtype}: a list (or ints) becomes float32, "
                   "the default of deep learning (half the memory of float64, and as PyTorch)")
    for dtype in (np.float32, np.float64):
        a = _ro([[1.0, 2.0]], dtype)
        t = E.Tensor(a, requires_grad=True)
        if t.data.dtype != dtype:
            raise Fail(f"a {np.dtype(dtype)} array became {t.data.dtype}: keep a float array's "
                       "dtype (float64 is what finite differences need)")
        if t.data is not a:
            raise Fail("a float array was copied: keep the array itself (every op's result "
                       "would otherwise be copied once more)")
    if E.Tensor(3).data.dtype != np.float32 or E.Tensor(2.5).data.shape != ():
        raise Fail("a number becomes a float32 array of shape ()")
    for dtype in (np.float32, np.float64):
        s = E.Tensor(dtype(2.0))
        if not isinstance(s.data, np.ndarray) or s.data.dtype != dtype:
            raise Fail(f"a NumPy {np.dtype(dtype)} number (what np.sum of a whole array gives) "
                       f"became {type(s.data).__name__} of {np.asarray(s.data).dtype}: make it an "
                       "array of its own dtype (np.asarray keeps it; np.float64 is also a "
                       "Python float, so test for np.generic before float)")
    for name, want in (('requires_grad', True), ('grad', None), ('rule', None)):
        if getattr(t, name, '(none)') != want:
            raise Fail(f"Tensor(a, requires_grad=True).{name} must be {want!r}, got "
                       f"{getattr(t, name, '(no such attribute)')!r}")
    if tuple(getattr(t, 'parents', None) or ()) != () or not hasattr(t, 'parents'):
        raise Fail("a new tensor is a leaf: .parents must be ()")
    if E.Tensor([1.0]).requires_grad is not False:
        raise Fail("requires_grad defaults to False")


def _sc_unbroadcast_says(big, shape):
    """What unbroadcast must do for a case, as the message for getting it wrong."""
    lead = len(big) - len(shape)
    stretched = [lead + i for i, n in enumerate(shape) if n == 1 and big[lead + i] != 1]
    if lead > 1 and not stretched:
        return (f"{lead} dims were added in front of an operand of shape {shape} to make "
                f"{big}: sum over each of them, not only the first")
    if lead and not stretched:
        return (f"for an operand of shape {shape} broadcast to {big} the gradient must be summed "
                f"over the leading dim broadcasting added ({big[0]} uses -> the sum of {big[0]} "
                "rows)")
    if stretched and not lead:
        return (f"an operand of shape {shape} stretched to {big}: sum the gradient over every "
                "dim where the operand has size 1 (keeping it), not only the leading dims")
    return (f"an operand of shape {shape} broadcast to {big}: sum over the {lead} leading dim(s) "
            "broadcasting added and over every dim where the operand has size 1")


# in the order that names the first thing missing: nothing to do, one leading dim, dims
# stretched from 1, several leading dims, then both at once
_SC_UNBROADCAST = (((4, 3), (4, 3)), ((4, 3), (3,)), ((4, 3), (1, 3)), ((4, 3), (4, 1)),
                   ((2, 5, 4, 3), (4, 3)), ((2, 4, 3), (4, 1)), ((2, 5, 4, 3), (5, 1, 3)),
                   ((2, 5, 4, 3), (1, 5, 1, 1)), ((2, 5, 4, 3), ()))


def sc_check_1_2(m):
    ub = m['engine'].unbroadcast
    r = rng(4)
    for big, shape in _SC_UNBROADCAST:
        for dtype in (np.float64, np.float32):
            g = _ro(r.standard_normal(big), dtype)
            keep = g.copy()
            lead = len(big) - len(shape)
            axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                              if n == 1 and big[lead + i] != 1)
            want = g.astype(np.float64).sum(axis=axes, keepdims=True).reshape(shape)
            try:
                got = np.asarray(_sc_call('unbroadcast', ub, g, shape))
            except ValueError as e:
                raise Fail(f"{_sc_unbroadcast_says(big, shape)}; your unbroadcast raised "
                           f"{_where(e, _SC_WS[0])}") from None
            if got.shape == big and big != tuple(shape):
                raise Fail(f"a gradient of shape {big} for an operand of shape {shape} came "
                           f"back unchanged: {_sc_unbroadcast_says(big, shape)}")
            if got.shape != tuple(shape) or not close(got, want, 1e-4):
                raise Fail(_sc_unbroadcast_says(big, shape) + (
                    f" (yours gave shape {got.shape})" if got.shape != tuple(shape) else ""))
            if got.dtype != dtype:
                raise Fail(f"unbroadcast turned a {np.dtype(dtype)} gradient into {got.dtype}: "
                           "keep grad's dtype")
            if not np.array_equal(g, keep):
                raise Fail("unbroadcast changed the gradient it was handed")


def sc_check_1_3(m):
    E = m['engine']
    x = E.Tensor(_ro([1.0, 2.0]), requires_grad=True)
    c = E.Tensor(_ro([3.0, 4.0]))

    def rule(g):
        return g, g
    data = np.array([4.0, 6.0])
    out = E.op(data, (x, c), rule)
    if not isinstance(out, E.Tensor):
        raise Fail(f"op must return a Tensor, got {type(out).__name__}")
    if not close(out.data, data):
        raise Fail("op's result must hold data")
    if out.requires_grad is not True:
        raise Fail("a result of an input that requires grad must require grad too (or no "
                   "gradient would flow back through it)")
    if tuple(out.parents or ()) != (x, c) or any(p is not q for p, q in zip(out.parents, (x, c))):
        raise Fail("the result's .parents must be the tuple of the op's inputs, in order "
                   "(the rule's gradients go to them one by one)")
    if out.rule is not rule:
        raise Fail("the result's .rule must be the rule given (backward calls it)")
    const = E.op(np.array([1.0]), (c, c), rule)
    if const.requires_grad or tuple(const.parents or ()) or const.rule is not None:
        raise Fail("a result of inputs that need no gradient is a leaf: requires_grad False, "
                   ".parents () and .rule None (a graph of constants costs nothing)")
    if E.op(np.ones(2, np.float32), (x,), rule).data.dtype != np.float32:
        raise Fail("op changed a float32 result's dtype")


def _sc_mul_extra(who, arrays, g, case):
    a, b = arrays
    other, own = (b, a) if who == 'a' else (a, b)
    shape = case[0] if who == 'a' else case[1]
    try:
        with np.errstate(all='ignore'):
            same = m_unb(g * own, shape)
    except ValueError:
        return ()
    return ((lambda got: got.shape == same.shape and close(got, same),
             f"mul's rule is swapped: the gradient for {who} is g times the OTHER operand "
             f"(d(a*b)/da = b, d(a*b)/db = a), you used {who} itself"),)


def sc_check_1_4(m):
    _sc_op_check(m, 'add', m['engine'].add, np.add,
                 [((4, 3), (3,)), ((3,), (4, 3)), ((2, 1, 3), (4, 1)), ((3,), (3,))],
                 "d(a+b)/da = 1, d(a+b)/db = 1")
    E = m['engine']
    x = E.Tensor(np.ones(2, np.float32), requires_grad=True)
    for y in (E.add(x, 2.0), E.add(2.0, x)):
        if y.data.dtype != np.float32 or not close(y.data, [3, 3]):
            raise Fail("add with a number (x + 2.0) must work and keep float32: as_tensor "
                       "makes the number a Tensor")


def sc_check_1_5(m):
    _sc_op_check(m, 'mul', m['engine'].mul, np.multiply,
                 [((4, 3), (3,)), ((3,), (4, 3)), ((2, 1, 3), (4, 1)), ((3,), (3,))],
                 "d(a*b)/da = b, d(a*b)/db = a", extra=_sc_mul_extra)


def _sc_chain(E, x, n):
    def rule(g):
        return (g,)
    y = x
    for _ in range(n):
        y = E.op(y.data, (y,), rule)
    return y


def sc_check_2_1(m):
    E = m['engine']

    def rule(g):
        return g, g
    x = E.Tensor(_ro([1.0]), requires_grad=True)
    c = E.Tensor(_ro([2.0]))
    a = E.op(np.array([2.0]), (x, c), rule)
    a.name = 'a'
    b = E.op(np.array([3.0]), (x, a), rule)
    root = E.op(np.array([5.0]), (a, b), rule)
    names = {id(x): 'x', id(c): 'c', id(a): 'a', id(b): 'b', id(root): 'root'}
    order = list(E.topo_order(root))
    ids = [id(t) for t in order]
    if id(c) in ids:
        raise Fail("a constant (requires_grad False) is in your order: leave out tensors that "
                   "need no gradient (no gradient goes to them)")
    for t, nm in ((x, 'x'), (a, 'a'), (b, 'b'), (root, 'root')):
        k = ids.count(id(t))
        if k == 0:
            raise Fail(f"{nm} is missing from the order of root = f(a, b), b = f(x, a), "
                       f"a = f(x, c): list root and everything it depends on")
        if k > 1:
            raise Fail(f"{nm} is listed {k} times: x feeds both a and b, and a feeds both b and "
                       "root; keep a set of the tensors already visited and list each once")
    pos = {i: k for k, i in enumerate(ids)}
    for t in (a, b, root):
        for p in t.parents:
            if id(p) in pos and pos[id(p)] > pos[id(t)]:
                raise Fail(f"wrong order: {names[id(t)]} comes before its parent "
                           f"{names[id(p)]}; a tensor must come after all of its parents "
                           "(append it only when all of them are listed: post-order)")
    sq = E.op(np.array([1.0]), (x, x), rule)
    if [id(t) for t in E.topo_order(sq)].count(id(x)) != 1:
        raise Fail("f(x, x): your order lists x twice (both parents are x): when you come to a "
                   "tensor already visited, skip it")
    deep = _sc_chain(E, x, 3000)
    try:
        n = len(E.topo_order(deep))
    except RecursionError:
        raise Fail("a chain of 3000 ops hits Python's recursion limit: walk the graph with an "
                   "explicit stack (a list you push and pop), not recursion") from None
    if n != 3001:
        raise Fail(f"a chain of 3000 ops on x gave an order of {n} tensors, expected 3001")


def sc_check_2_2(m):
    E = m['engine']
    for dtype in (np.float64, np.float32):
        x = E.Tensor(_ro([1.0, -2.0], dtype), requires_grad=True)
        c = E.Tensor(_ro([5.0, 5.0], dtype))
        handed = []

        def three(g):
            out = _ro(3 * np.asarray(g, np.float64))  # float64 on purpose, read-only
            handed.append(out)
            return (out,)

        def both(g):
            return g, g
        y = E.op(np.array([3.0, -6.0], dtype), (x,), three)
        if dtype == np.float64:  # reached once: .grad gets the rule's own array unless copied
            _sc_call('backward', E.backward, y, _ro([1.0, 1.0]))
            if x.grad is not None and any(np.shares_memory(x.grad, h) for h in handed):
                raise Fail(".grad is the very array a rule returned: that array is the rule's "
                           "(it may be read-only, or handed to other tensors too); store a copy")
            x.grad = None
        root = E.op(np.array([4.0, -8.0], dtype), (y, x), both)
        extra = E.op(np.array([9.0, -3.0], dtype), (root, c), both)
        _sc_call('backward', E.backward, extra, _ro([1.0, 1.0]))
        if x.grad is None:
            raise Fail("after backward x.grad is None: a leaf that requires grad gets its "
                       "gradient in .grad")
        gx = np.asarray(x.grad)
        if close(gx, [3.0, 3.0]) or close(gx, [1.0, 1.0]):
            raise Fail(f"x is reached twice (through y = 3x and directly): x.grad is "
                       f"{gx.tolist()}, expected [4, 4]; a tensor reached twice gets the sum of "
                       "its gradients, not the last one")
        if not close(gx, [4.0, 4.0]):
            raise Fail(f"root = f(3x, x) with g = 1: x.grad is {gx.tolist()}, expected [4, 4]")
        if gx.dtype != dtype:
            raise Fail(f"x is {np.dtype(dtype)} but its .grad is {gx.dtype}: .grad has its "
                       "tensor's dtype (a rule may hand back another)")
        if any(np.shares_memory(gx, h) for h in handed):
            raise Fail(".grad is the very array a rule returned: that array is the rule's (and "
                       "may be read-only or shared by other tensors); store a copy")
        if c.grad is not None:
            raise Fail("a constant (requires_grad False) got a .grad: pass gradients only to "
                       "parents that require grad")
        _sc_call('backward, called a second time,', E.backward, extra, _ro([1.0, 1.0]))
        if close(np.asarray(x.grad), [4.0, 4.0]):
            raise Fail("the second backward left .grad at the first one's gradient: .grad adds "
                       "up over backward calls (until zero_grad clears it)")
        if not close(np.asarray(x.grad), [8.0, 8.0]):
            raise Fail(f"after two backward calls x.grad is {np.asarray(x.grad).tolist()}, "
                       "expected [8, 8]: each call adds its gradient into .grad")
    s = E.op(np.array(2.0), (x,), lambda g: (np.full(2, float(g)),))
    x.grad = None
    E.backward(s)
    if x.grad is None or not close(np.asarray(x.grad), [1.0, 1.0]):
        raise Fail("backward(root) without grad, for a root of one element, starts from 1")
    deep = _sc_chain(E, E.Tensor(np.ones(1), requires_grad=True), 3000)
    try:
        E.backward(deep, np.ones(1))
    except RecursionError:
        raise Fail("backward of a chain of 3000 ops hits Python's recursion limit: walk the "
                   "order topo_order gives, in a loop") from None

def _sc_matmul_extra(who, arrays, g, case):
    a, b = arrays
    if who != 'a':
        return ()
    try:
        wrong = g @ b
    except ValueError:
        return ()
    return ((lambda got: got.shape == wrong.shape and close(got, wrong),
             "transposed matmul rule: da = g @ b^T (you used g @ b); check the shapes: "
             "(n, m) @ (m, k) gives (n, k)"),)


def sc_check_3_1(m):
    _sc_op_check(m, 'matmul', m['engine'].matmul, np.matmul,
                 [((3, 3), (3, 3)), ((2, 3), (3, 4)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 2)),
                  ((2, 1, 3, 4), (5, 4, 2)), ((3, 3), (3, 3))],
                 "da = g @ b^T, db = a^T @ g, each summed back to its operand's shape",
                 extra=_sc_matmul_extra)


_SC_AXES = ((None, False), (1, False), (-1, True), ((0, 2), False), ((1, 2), True),
            ((-1, -3), False), (0, False))


def sc_check_3_2(m):
    E = m['engine']
    r = rng(5)
    for dtype in (np.float64, np.float32):
        for axis, keep in _SC_AXES:
            x = r.standard_normal((2, 3, 4))
            t = E.Tensor(_ro(x, dtype), requires_grad=True)
            say = f"reduce_sum(x of shape (2, 3, 4), axis={axis}, keepdims={keep})"
            out = _sc_call(say, E.reduce_sum, t, axis, keep)
            _sc_forward(say, out, np.sum(x.astype(dtype), axis=axis, keepdims=keep), E, dtype)
            try:
                g, (got,) = _sc_rule(out, 1, say)
            except ValueError as e:
                raise Fail(f"{say}: the rule cannot spread g {out.shape} over x: put every summed "
                           f"axis back as size 1 first when keepdims is False ({e})") from None
            got = np.asarray(got)
            if got.shape != x.shape:
                raise Fail(f"{say}: the gradient has shape {got.shape}, x has (2, 3, 4): spread g "
                           "back over every summed axis (each element of a summed slice gets g)")
            want = np.broadcast_to(np.asarray(g, np.float64).reshape(
                np.sum(x, axis=axis, keepdims=True).shape), x.shape)
            _sc_grad('x', say, got, want, x.shape, dtype, "d sum/dx_i = 1")


def _sc_unary(m, name, np_fn, math_, positive=False, shape=(3, 4), extra=None, args=()):
    _sc_op_check(m, name, getattr(m['engine'], name), np_fn, [(shape,), ((2, 3, 2),)], math_,
                 positive=positive, same=False, extra=extra, args=args)


def _sc_passed_through(op, fix):
    return lambda who, arrays, g, case: ((lambda got: close(got, g),
                                          f"{op}'s rule passed g through unchanged: {fix}"),)


def sc_check_3_3(m):
    _sc_unary(m, 'exp', np.exp, "d e^x/dx = e^x",
              extra=lambda who, arrays, g, case: (
                  (lambda got: close(got, g), "exp's rule passed g through unchanged: d e^x/dx "
                                              "= e^x, so multiply g by the result"),
                  (lambda got: close(got, g * arrays[0]), "exp's rule multiplied g by x: the "
                                                          "derivative of e^x is e^x itself")))


def sc_check_3_4(m):
    _sc_unary(m, 'log', np.log, "d log(x)/dx = 1/x", positive=True,
              extra=lambda who, arrays, g, case: (
                  (lambda got: close(got, g * arrays[0]),
                   "log's rule multiplied g by x: d log(x)/dx = 1/x, so divide g by x"),))


def sc_check_3_5(m):
    _sc_unary(m, 'relu', lambda x: np.maximum(x, 0), "the gradient is g where x > 0, else 0")
    E = m['engine']
    x = E.Tensor(_ro([-1.0, 0.0, 2.0]), requires_grad=True)
    g, (got,) = _sc_rule(E.relu(x), 1, 'relu')
    if not close(got, [0.0, 0.0, g[2]]):
        raise Fail(f"relu at [-1, 0, 2]: the gradient must be g where x > 0 and 0 elsewhere, at "
                   f"x = 0 too (as PyTorch's); got {np.asarray(got).tolist()}")


def sc_check_3_6(m):
    E = m['engine']
    for p in (2, 3, -1, 0.5, -0.5, 1):
        _sc_op_check(m, f'power(x, {p})', E.power, np.power, [((3, 4),)], "d(x^p)/dx = p x^(p-1)",
                     positive=True, same=False, args=(p,),
                     extra=lambda who, arrays, g, case, p=p: (
                         (lambda got: close(got, g * p * arrays[0] ** p),
                          "power's exponent is off by one: d(x^p)/dx = p x^(p-1)"),))
    x = E.Tensor(_ro([0.0, 2.0]), requires_grad=True)
    y = _sc_call('power(x, 0)', E.power, x, 0)
    _sc_forward('power(x, 0)', y, np.ones(2), E, np.float64)
    _, (got,) = _sc_rule(y, 1, 'power(x, 0)')
    if not np.all(np.asarray(got) == 0):
        raise Fail(f"x ** 0 at x = [0, 2]: your gradient is {np.asarray(got).tolist()}, but x^0 "
                   "is the constant 1, whose gradient is 0 everywhere (p x^(p-1) at p = 0, x = 0 "
                   "is 0 * inf = nan): give zeros when p == 0")
    half = E.power(E.Tensor(np.full(2, 4.0, np.float32), requires_grad=True), 0.5)
    if half.data.dtype != np.float32:
        raise Fail("power(x, 0.5) of a float32 x must stay float32")


def sc_check_3_7(m):
    E = m['engine']
    for src, shape in (((2, 3, 4), (4, -1)), ((6, 4), (2, 3, 4)), ((2, 3, 4), (2, 12))):
        _sc_op_check(m, f'reshape(x, {shape})', E.reshape, np.reshape, [(src,)],
                     "the gradient is g in x's shape", same=False, args=(shape,))


def sc_check_3_8(m):
    E = m['engine']
    for a1, a2 in ((0, 2), (-1, -2), (1, 2)):
        _sc_op_check(m, f'transpose(x, {a1}, {a2})', E.transpose, np.swapaxes, [((2, 3, 4),)],
                     "the gradient is g with the two axes swapped back", same=False,
                     args=(a1, a2))


def _sc_tree(m):
    """A module tree: own parameters, nested modules, a list of modules, a tied parameter,
    a tensor and a number that are not parameters."""
    E, nn = m['engine'], m['nn']

    class Leaf(nn.Module):
        def __init__(self):
            self.weight = nn.Parameter(np.ones((2, 2), np.float32))
            self.bias = nn.Parameter(np.zeros(2, np.float32))

    class Inner(nn.Module):
        def __init__(self):
            self.scale = nn.Parameter(np.ones(1, np.float32))
            self.lin = Leaf()

    class Root(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(3, np.float32))
            self.inner = Inner()
            self.layers = [Leaf(), Leaf()]
            self.tied = Leaf()
            self.tied.weight = self.inner.lin.weight
            self.buffer = E.Tensor(np.zeros(2))
            self.size = 3
    return Root()


def sc_check_4_1(m):
    root = _sc_tree(m)
    got = list(root.named_parameters())
    names = [n for n, _ in got]
    want = ['w', 'inner.scale', 'inner.lin.weight', 'inner.lin.bias', 'layers.0.weight',
            'layers.0.bias', 'layers.1.weight', 'layers.1.bias', 'tied.bias']
    if any(n.startswith('.') for n in names):
        raise Fail(f"a name starts with a dot ({[n for n in names if n.startswith('.')][0]!r}): "
                   "at the root the name is the attribute's alone ('w'); a dot only joins two "
                   "names")
    if len({id(p) for _, p in got}) < len(got):
        raise Fail("a parameter shared by two modules (weight tying) was listed twice: an "
                   "optimizer would then update it twice per step; remember the ids you yielded")
    if sorted(names) != sorted(want):
        missing = sorted(set(want) - set(names))
        if missing and all(n.startswith('layers') for n in missing):
            raise Fail(f"parameters() missed {missing}: an attribute that is a list of Modules "
                       "holds modules too (each named by its index: 'layers.0.weight')")
        if set(names) <= {'w', 'scale', 'weight', 'bias'} and len(names) > 1:
            raise Fail(f"the names are {names}, expected {want}: each is the path of attribute "
                       "names from the root, joined by dots ('inner.lin.weight')")
        raise Fail(f"the names are {names}, expected {want} (in any order)")
    for n, p in got:
        obj = root
        for part in n.split('.'):
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        if obj is not p:
            raise Fail(f"{n!r} is not the parameter at that path")
    own = [n for n, _ in root.named_parameters(recurse=False)]
    if own != ['w']:
        raise Fail(f"named_parameters(recurse=False) gave {own}: without recurse only the "
                   "module's own parameters count (['w'])")
    pre = sorted(n for n, _ in root.inner.named_parameters(prefix='model.inner'))
    if pre != ['model.inner.lin.bias', 'model.inner.lin.weight', 'model.inner.scale']:
        raise Fail(f"named_parameters(prefix='model.inner') gave {pre}: put the prefix and a "
                   "dot before every name")
    if len(root.parameters()) != len(want):
        raise Fail("parameters() must list what named_parameters yields")


def _sc_backward_sum(E, y, g):
    """backward of sum(y * g), g a constant: the gradient reaching y is g."""
    E.backward(E.reduce_sum(E.mul(y, E.Tensor(g))))


def sc_check_4_2(m):
    E, nn = m['engine'], m['nn']
    np.random.seed(0)
    lin = nn.Linear(50, 3)
    names = sorted(n for n, _ in lin.named_parameters())
    if names != ['bias', 'weight']:
        raise Fail(f"Linear's parameters are {names}: expected a weight and a bias")
    if lin.weight.shape != (3, 50) or lin.bias.shape != (3,):
        raise Fail(f"Linear(50, 3): weight {lin.weight.shape}, bias {lin.bias.shape}; expected "
                   "(3, 50) (n_out, n_in, as PyTorch's) and (3,)")
    if lin.weight.dtype != np.float32 or lin.bias.dtype != np.float32:
        raise Fail(f"Linear's parameters are {lin.weight.dtype}: make them float32 (NumPy draws "
                   "float64)")
    w = np.asarray(lin.weight.data)
    if np.abs(w).max() > 1 / np.sqrt(50) + 1e-6 or w.std() < 0.5 / np.sqrt(3 * 50):
        raise Fail(f"Linear(50, 3)'s weights lie in [{w.min():.3f}, {w.max():.3f}]: draw them "
                   f"uniformly from -1/sqrt(n_in) to 1/sqrt(n_in) (+-{1 / np.sqrt(50):.3f})")
    if np.array_equal(w[0], w[1]):
        raise Fail("Linear's weight rows are equal: draw each weight at random, or every output "
                   "stays the same as the others")
    if [n for n, _ in nn.Linear(4, 2, bias=False).named_parameters()] != ['weight']:
        raise Fail("Linear(4, 2, bias=False) must have no bias parameter")
    r = rng(6)
    W, b = r.standard_normal((3, 4)).astype(np.float32), r.standard_normal(3).astype(np.float32)
    lin = nn.Linear(4, 3)
    lin.weight.data[...] = W
    lin.bias.data[...] = b
    for shape in ((5, 4), (2, 5, 4)):
        x = r.standard_normal(shape).astype(np.float32)
        X = E.Tensor(_ro(x, np.float32), requires_grad=True)
        y = _sc_call('Linear', lin, X)
        _sc_forward(f'Linear(4, 3) on x of shape {shape}', y, x @ W.T + b, E, np.float32)
        g = r.standard_normal(y.shape).astype(np.float32)
        lin.weight.grad = lin.bias.grad = None
        _sc_backward_sum(E, y, g)
        g2, x2 = g.reshape(-1, 3), x.reshape(-1, 4)
        for name, t, want in (('x', X, g @ W), ('weight', lin.weight, g2.T @ x2),
                              ('bias', lin.bias, g2.sum(0))):
            if t.grad is None or not close(t.grad, want, 1e-4):
                raise Fail(f"Linear on x of shape {shape}: d loss/d {name} is wrong (through your "
                           "engine): y = x W^T + b, from x @ weight.transpose(0, 1) + bias")
    nb = nn.Linear(4, 3, bias=False)
    nb.weight.data[...] = W
    x = r.standard_normal((2, 4)).astype(np.float32)
    _sc_forward('Linear(4, 3, bias=False)', nb(E.Tensor(x)), x @ W.T, E, np.float32)


def _sc_params(E, nn, *values):
    return [nn.Parameter(np.array(v, np.float32)) for v in values]


def sc_check_4_3(m):
    E, nn = m['engine'], m['nn']
    p, q = _sc_params(E, nn, [1.0, -2.0], [5.0])
    opt = nn.SGD([p, q], lr=0.1)
    for g in ([0.5, 0.25], [1.0, -1.0]):
        p.grad, q.grad = _ro(g, np.float32), None
        _sc_call('SGD.step', opt.step)
    if close(p.data, [1.15, -2.075]):
        raise Fail("SGD went uphill: the gradient points to where the loss grows, so step "
                   "against it: p -= lr * g")
    if close(p.data, [-0.5, -1.25]):
        raise Fail("the step ignores the learning rate: p -= lr * g")
    if not close(p.data, [0.85, -1.925], 1e-6):
        raise Fail(f"two steps of lr 0.1 with gradients [0.5, 0.25] then [1, -1] from [1, -2] must "
                   f"give [0.85, -1.925]; got {np.asarray(p.data).tolist()}")
    if not close(q.data, [5.0]):
        raise Fail("a parameter without .grad (None) must be left alone")
    if np.asarray(p.data).dtype != np.float32:
        raise Fail("SGD's step turned a float32 parameter into float64: change its values, keep "
                   "its dtype")
    a, b, c = _sc_params(E, nn, [1.0], [1.0], [1.0])
    opt = nn.SGD([{'params': [a]}, {'params': [b, c], 'lr': 0.5}], lr=0.1)
    if not (isinstance(opt.param_groups, list) and len(opt.param_groups) == 2
            and all(isinstance(gr, dict) and 'lr' in gr for gr in opt.param_groups)):
        raise Fail("SGD([{'params': [a]}, {'params': [b, c], 'lr': 0.5}], lr=0.1) must keep two "
                   "groups in param_groups, each a dict with its 'params' and its 'lr'")
    for t in (a, b, c):
        t.grad = _ro([1.0], np.float32)
    opt.step()
    got = [float(np.asarray(t.data)[0]) for t in (a, b, c)]
    if not close(got, [0.9, 0.5, 0.5]):
        raise Fail(f"groups with their own learning rate: lr 0.1 for a (the default), 0.5 for b "
                   f"and c, gradient 1 each, from 1: expected [0.9, 0.5, 0.5], got {got}; each "
                   "group's step uses its own group['lr']")


def sc_check_4_4(m):
    E, nn = m['engine'], m['nn']
    a, b = _sc_params(E, nn, [1.0], [2.0])
    opt = nn.SGD([{'params': [a]}, {'params': [b], 'lr': 0.5}], lr=0.1)
    a.grad, b.grad = np.ones(1, np.float32), np.ones(1, np.float32)
    opt.zero_grad()
    left = [n for n, t in (('a', a), ('b', b)) if t.grad is not None]
    if left == ['a', 'b']:
        raise Fail("zero_grad() left the old gradients: the next backward adds onto them, so "
                   "every step would use the sum of all past gradients; set p.grad = None")
    if left:
        raise Fail(f"zero_grad() cleared one group only ({left[0]} kept its .grad): clear the "
                   "parameters of every group")


def sc_check_5_1(m):
    E, nn = m['engine'], m['nn']
    r = rng(7)
    x, y = r.standard_normal((4, 3)), r.standard_normal((4, 3))
    X = E.Tensor(_ro(x), requires_grad=True)
    Y = E.Tensor(_ro(y), requires_grad=True)
    loss = _sc_call('mse_loss', nn.mse_loss, X, Y)
    _sc_forward('mse_loss', loss, np.mean((x - y) ** 2), E, np.float64)
    _sc_call('backward of mse_loss', E.backward, loss)
    for name, t, want in (('pred', X, 2 * (x - y) / x.size), ('target', Y, -2 * (x - y) / x.size)):
        got = np.asarray(t.grad) if t.grad is not None else None
        if got is None or not close(got, want):
            if got is not None and close(got, want / 2):
                raise Fail(f"d loss/d {name} is half the right one: d (x - y)^2/dx = 2 (x - y)")
            raise Fail(f"d loss/d {name} is wrong: the mean over all {x.size} elements of "
                       "(pred - target)^2")
    f32 = nn.mse_loss(E.Tensor(x.astype(np.float32)), y.astype(np.float32))
    if f32.data.dtype != np.float32:
        raise Fail("mse_loss of float32 inputs must be float32")

def _np_softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _np_log_softmax(z, axis=-1):
    s = z - z.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def _sc_fn_check(m, name, fn, np_fn, arrays, tol=1e-5, args=()):
    """A function built from the learner's ops: its value against NumPy, and its gradients
    through the learner's backward against finite differences, inputs read-only."""
    E = m['engine']
    ts = [E.Tensor(_ro(a), requires_grad=True) for a in arrays]
    out = _sc_call(name, fn, *ts, *args)
    _sc_forward(name, out, np_fn(*arrays, *args), E, np.float64)
    g = rng(8).standard_normal(out.shape)
    _sc_call(f"backward through {name}", _sc_backward_sum, E, out, g)
    for i, t in enumerate(ts):
        want = numeric(lambda *xs: np_fn(*xs, *args), [a.copy() for a in arrays], i, g)
        if t.grad is None or not close(t.grad, want, tol):
            raise Fail(f"{name}'s gradient (through your engine) is wrong: "
                       + (worst(t.grad, want) if t.grad is not None else 'no .grad'))
    return out


def sc_check_6_1(m):
    E, nn = m['engine'], m['nn']
    r = rng(9)
    z = r.standard_normal((4, 3))
    _sc_fn_check(m, 'softmax', nn.softmax, _np_softmax, [z])
    _sc_fn_check(m, 'softmax(x, axis=0) of a (3, 2, 4) x', nn.softmax, _np_softmax,
                 [r.standard_normal((3, 2, 4))], args=(0,))
    one = np.asarray(nn.softmax(E.Tensor(_ro([[1000.0, 0.0, -1000.0]], np.float32))).data)
    if not np.all(np.isfinite(one)):
        raise Fail("softmax overflowed on scores of 1000 (e^1000 is inf, inf/inf nan): subtract "
                   "each row's max before exp; softmax(z - c) = softmax(z)")
    far = np.array([[0.0, -1.0, -2.0], [-1000.0, -1001.0, -1002.0]])
    p = np.asarray(nn.softmax(E.Tensor(_ro(far, np.float32))).data)
    if not close(p, _np_softmax(far), 1e-5):
        raise Fail("rows of very different sizes: softmax is wrong for the row of -1000s (e^-1000 "
                   "is 0, 0/0 nan): subtract each row's OWN max (keepdims), not one max for "
                   "the whole batch")
    big = np.array([[1000.0, 0.0, -1000.0], [0.0, -1.0, -2.0], [-1000.0, -1001.0, -1002.0]])
    p = np.asarray(nn.softmax(E.Tensor(_ro(big, np.float32))).data)
    if not np.all(np.isfinite(p)):
        raise Fail("softmax overflowed on scores of 1000 (e^1000 is inf, inf/inf nan): subtract "
                   "each row's max before exp; softmax(z - c) = softmax(z)")
    if not close(p, _np_softmax(big), 1e-5):
        raise Fail("rows of very different sizes: softmax is wrong for the row of -1000s (e^-1000 "
                   "is 0, 0/0 nan): subtract each row's OWN max (keepdims), not one max for "
                   "the whole batch")
    if p.dtype != np.float32:
        raise Fail("softmax of float32 scores must be float32")


def sc_check_6_2(m):
    E, nn = m['engine'], m['nn']
    r = rng(10)
    _sc_fn_check(m, 'log_softmax', nn.log_softmax, _np_log_softmax, [r.standard_normal((4, 3))])
    _sc_fn_check(m, 'log_softmax(x, axis=1) of a (2, 3, 4) x', nn.log_softmax, _np_log_softmax,
                 [r.standard_normal((2, 3, 4))], args=(1,))
    z = np.array([[0.0, -200.0], [1000.0, 0.0]])
    got = np.asarray(nn.log_softmax(E.Tensor(_ro(z, np.float32))).data, np.float64)
    if not np.all(np.isfinite(got)):
        raise Fail("scores [0, -200] in float32: log_softmax gave -inf (or nan), but it is "
                   "-200: log(softmax) underflows (e^-200 is 0 in float32, log 0 = -inf); "
                   "compute shifted - log(sum(exp(shifted))), never the log of a probability")
    if not close(got, _np_log_softmax(z), 1e-4):
        raise Fail("log_softmax of [[0, -200], [1000, 0]] is wrong: "
                   + worst(got, _np_log_softmax(z), 'NumPy gives'))


def sc_check_6_3(m):
    E, nn = m['engine'], m['nn']
    r = rng(11)
    z, t = r.standard_normal((5, 4)), np.array([0, 3, 1, 1, 2])
    tr = t.copy()
    tr.setflags(write=False)

    def ce(zz, tt_=t):
        return -np.mean(_np_log_softmax(zz)[np.arange(len(tt_)), tt_])
    _sc_fn_check(m, 'cross_entropy', lambda Z: nn.cross_entropy(Z, tr), ce, [z])
    big = np.array([[1000.0, 0.0, -1000.0], [0.0, -200.0, 0.0]])
    got = nn.cross_entropy(E.Tensor(_ro(big, np.float32)), np.array([2, 1]))
    if not np.isfinite(float(got.data)):
        raise Fail("cross_entropy of logits [1000, 0, -1000] (target 2) is not finite: build it "
                   "on your stable log_softmax")
    if got.data.dtype != np.float32:
        raise Fail("cross_entropy of float32 logits must be float32")


def _np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def sc_check_6_4(m):
    E, nn = m['engine'], m['nn']
    ln = nn.LayerNorm(4)
    if sorted(n for n, _ in ln.named_parameters()) != ['bias', 'weight']:
        raise Fail("LayerNorm's parameters must be weight and bias")
    if not (close(ln.weight.data, np.ones(4)) and close(ln.bias.data, np.zeros(4))
            and ln.weight.dtype == np.float32):
        raise Fail("LayerNorm(4)'s weight starts at ones, its bias at zeros, float32")
    r = rng(12)
    w, b = r.standard_normal(4), r.standard_normal(4)
    x = r.standard_normal((2, 3, 4))
    ln.weight, ln.bias = nn.Parameter(w.copy()), nn.Parameter(b.copy())
    X = E.Tensor(_ro(x), requires_grad=True)
    y = _sc_call('LayerNorm', ln, X)
    if isinstance(y, E.Tensor) and y.shape == x.shape and not close(y.data,
                                                                     _np_layer_norm(x, w, b)):
        got = np.asarray(y.data)
        if close(got, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5) * w + b):
            raise Fail("the mean and variance were taken over the wrong axis: LayerNorm "
                       "normalises each row over its own n values (the last axis)")
        mu = x.mean(-1, keepdims=True)
        if close(got, (x - mu) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + 1e-5) * w + b):
            raise Fail("LayerNorm divides the squared deviations by n (the biased variance), "
                       "not n - 1")
        if close(got, (x - mu) / np.sqrt(x.var(-1, keepdims=True)) * w + b):
            raise Fail("eps is missing: add it to the variance before the square root (a "
                       "constant row has variance 0, and 0/0 is nan)")
        if close(got, (x - mu) * np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b):
            raise Fail("the rows were multiplied by their standard deviation: divide by it "
                       "(times the reciprocal of sqrt(var + eps))")
    _sc_forward('LayerNorm', y, _np_layer_norm(x, w, b), E, np.float64)
    g = rng(8).standard_normal(x.shape)
    _sc_backward_sum(E, y, g)
    for name, t, k in (('x', X, 0), ('weight', ln.weight, 1), ('bias', ln.bias, 2)):
        want = numeric(_np_layer_norm, [x.copy(), w.copy(), b.copy()], k, g)
        if t.grad is None or not close(t.grad, want, 1e-4):
            raise Fail(f"LayerNorm's gradient for {name} (through your engine) is wrong: "
                       + (worst(t.grad, want) if t.grad is not None else 'no .grad'))
    flat = nn.LayerNorm(3)(E.Tensor(np.full((2, 3), 7.0, np.float32)))
    if not np.all(np.isfinite(flat.data)):
        raise Fail("a constant row came out as nan or inf: its variance is 0, so add eps to the "
                   "variance before the square root")
    if flat.data.dtype != np.float32:
        raise Fail("LayerNorm of a float32 x must be float32")


def _np_attention(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    none = None
    if mask is not None and mask.dtype == bool:
        none = ~mask.any(-1, keepdims=True)
        s = np.where(mask | none, s, -np.inf)
    elif mask is not None:
        s = s + mask
    w = _np_softmax(s)
    if none is not None:
        w = np.where(none, 0.0, w)
    return w @ v


def sc_check_7_1(m):
    E, nn = m['engine'], m['nn']
    r = rng(13)
    q, k, v = (r.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2)))
    att = nn.attention
    out = _sc_call('attention', att, *(E.Tensor(_ro(a)) for a in (q, k, v)))
    if isinstance(out, E.Tensor) and out.shape == (2, 3, 2):
        got = np.asarray(out.data)
        s = q @ np.swapaxes(k, -1, -2)
        if close(got, _np_softmax(s) @ v):
            raise Fail("the scores are not scaled by 1/sqrt(d): without it, large dot products "
                       "make the softmax nearly one-hot and its gradient vanishes")
        if close(got, _np_softmax(s / np.sqrt(4), -2) @ v):
            raise Fail("the softmax runs over the queries (axis -2): each query's weights over "
                       "the keys (the last axis) must sum to 1")
    _sc_fn_check(m, 'attention', att, _np_attention, [q, k, v])
    causal = np.tril(np.ones((3, 5), bool))
    causal.setflags(write=False)
    got = np.asarray(att(*(E.Tensor(a) for a in (q, k, v)), causal).data)
    after = _np_softmax(q @ np.swapaxes(k, -1, -2) / 2) * causal @ v
    if close(got, after):
        raise Fail("the mask is applied after the softmax: the kept weights no longer sum to 1; "
                   "mask the scores (-inf) first, then take the softmax")
    if close(got, _np_attention(q, k, v, ~causal)):
        raise Fail("a bool mask read the other way: True means this query MAY look at this key")
    _sc_fn_check(m, 'attention with a bool mask', lambda *t: att(*t, causal),
                 lambda *a: _np_attention(*a, causal), [q, k, v])
    fmask = _ro(r.standard_normal((3, 5)))
    got = np.asarray(att(*(E.Tensor(a) for a in (q, k, v)), fmask).data)
    if close(got, _np_attention(q, k, v)):
        raise Fail("a float mask was ignored: a float mask is added to the scores (a bool mask "
                   "says which keys a query may look at)")
    _sc_fn_check(m, 'attention with a float mask', lambda *t: att(*t, fmask),
                 lambda *a: _np_attention(*a, fmask), [q, k, v])
    empty = np.ones((3, 5), bool)
    empty[1] = False
    empty.setflags(write=False)
    ts = [E.Tensor(_ro(a), requires_grad=True) for a in (q, k, v)]
    out = _sc_call('attention with a query that may look at no key', att, *ts, empty)
    got = np.asarray(out.data)
    if not np.all(np.isfinite(got)):
        raise Fail("a query that may look at no key gave nan (a softmax of nothing but -inf is "
                   "0/0): give that query zeros, e.g. leave its row unmasked and multiply its "
                   "weights by 0")
    if not close(got, _np_attention(q, k, v, empty)):
        if np.abs(got[:, 1]).max() > 1e-6:
            raise Fail("a query that may look at no key must get zeros (it attends to nothing); "
                       "yours gets a mix of the values (did you mask with -1e9 instead of -inf? "
                       "then such a row's weights are uniform, not 0)")
        raise Fail("attention with a row of the mask all False is wrong for the other rows")
    _sc_backward_sum(E, out, np.ones(out.shape))
    if not all(t.grad is not None and np.all(np.isfinite(t.grad)) for t in ts):
        raise Fail("a query that may look at no key gave a nan gradient: keep its row finite "
                   "before the softmax too")


def _np_split(x, H):
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)


def _np_merge(x):
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def sc_check_7_2(m):
    E, nn = m['engine'], m['nn']
    x = rng(14).standard_normal((2, 3, 6))
    y = _sc_call('split_heads', nn.split_heads, E.Tensor(_ro(x)), 2)
    if isinstance(y, E.Tensor) and y.shape == (2, 2, 3, 3):
        if close(y.data, x.reshape(2, 2, 3, 3)):
            raise Fail("the heads are mixed up: (B, T, C).reshape(B, H, T, D) takes the numbers "
                       "in memory order, so a 'head' gets pieces of several positions; reshape "
                       "to (B, T, H, D), then swap T and H")
    _sc_fn_check(m, 'split_heads (2, 3, 6) into 2 heads', nn.split_heads, _np_split, [x],
                 args=(2,))


def sc_check_7_3(m):
    E, nn = m['engine'], m['nn']
    x = rng(15).standard_normal((2, 2, 3, 3))
    y = _sc_call('merge_heads', nn.merge_heads, E.Tensor(_ro(x)))
    if isinstance(y, E.Tensor) and y.shape == (2, 3, 6) and close(y.data, x.reshape(2, 3, 6)):
        raise Fail("putting the heads back: (B, H, T, D).reshape(B, T, C) mixes positions; swap "
                   "H and T back to (B, T, H, D) first, then reshape")
    _sc_fn_check(m, 'merge_heads', nn.merge_heads, _np_merge, [x])


def _np_linear(x, lin):
    return x @ np.asarray(lin.weight.data, np.float64).T + np.asarray(lin.bias.data, np.float64)


def _np_mha(x, a, H):
    T = x.shape[1]
    q, k, v = (_np_split(_np_linear(x, lin), H) for lin in (a.query, a.key, a.value))
    return _np_linear(_np_merge(_np_attention(q, k, v, np.tril(np.ones((T, T), bool)))), a.out)


def sc_check_7_4(m):
    E, nn = m['engine'], m['nn']
    np.random.seed(1)
    a = nn.MultiHeadAttention(8, 2)
    names = sorted({n.split('.')[0] for n, _ in a.named_parameters()})
    if names != ['key', 'out', 'query', 'value']:
        raise Fail(f"MultiHeadAttention's sub-modules are {names}: expected four Linears named "
                   "query, key, value and out")
    x = rng(16).standard_normal((2, 5, 8)).astype(np.float32)
    y = _sc_call('MultiHeadAttention', a, E.Tensor(_ro(x, np.float32)))
    want = _np_mha(x.astype(np.float64), a, 2)
    if isinstance(y, E.Tensor) and y.shape == want.shape and not close(y.data, want, 1e-4):
        x2 = x.copy()
        x2[:, -1] += 1
        y2 = a(E.Tensor(x2))
        if not close(np.asarray(y2.data)[:, :-1], np.asarray(y.data)[:, :-1], 1e-5):
            raise Fail("a change of the last position changed the earlier outputs: the attention "
                       "is not causal (position t may look at positions 0..t only: a (T, T) "
                       "lower-triangular bool mask)")
        if close(y.data, _np_linear(_np_merge(_np_attention(
                *(_np_split(_np_linear(x.astype(np.float64), lin), 2)
                  for lin in (a.query, a.key, a.value)))), a.out), 1e-4):
            raise Fail("the attention is not causal: pass a (T, T) lower-triangular bool mask")
    _sc_forward('MultiHeadAttention(8, 2)', y, want, E, np.float32)


def _np_block(x, blk, H):
    def ln(z, l):
        return _np_layer_norm(z, np.asarray(l.weight.data, np.float64),
                              np.asarray(l.bias.data, np.float64))
    x = x + _np_mha(ln(x, blk.ln1), blk.attn, H)
    return x + _np_linear(np.maximum(_np_linear(ln(x, blk.ln2), blk.fc), 0), blk.proj)


def sc_check_8_1(m):
    E, nn = m['engine'], m['nn']
    np.random.seed(2)
    blk = nn.Block(8, 2)
    subs = sorted({n.split('.')[0] for n, _ in blk.named_parameters()})
    if subs != ['attn', 'fc', 'ln1', 'ln2', 'proj']:
        raise Fail(f"Block's sub-modules are {subs}: expected ln1, attn, ln2, fc and proj")
    for lnm in (blk.ln1, blk.ln2):  # not the identity, so a missing norm shows
        lnm.weight.data[...] = rng(3).uniform(0.5, 1.5, 8)
        lnm.bias.data[...] = rng(4).uniform(-0.5, 0.5, 8)
    x = rng(17).standard_normal((2, 5, 8)).astype(np.float32) * 3 + 1
    y = _sc_call('Block', blk, E.Tensor(_ro(x, np.float32)))
    x64 = x.astype(np.float64)
    want = _np_block(x64, blk, 2)
    if isinstance(y, E.Tensor) and y.shape == want.shape and not close(y.data, want, 1e-4):
        got = np.asarray(y.data, np.float64)

        def ln(z, l):
            return _np_layer_norm(z, np.asarray(l.weight.data, np.float64),
                                  np.asarray(l.bias.data, np.float64))

        def mlp(z):
            return _np_linear(np.maximum(_np_linear(z, blk.fc), 0), blk.proj)
        h = _np_mha(ln(x64, blk.ln1), blk.attn, 2)
        for msg, alt in (
                ("the attention's residual is missing: each sub-layer adds to its input (x + "
                 "attn(ln1(x))); without it the gradient has no direct path back",
                 h + mlp(ln(h, blk.ln2))),
                ("the MLP's residual is missing: x + mlp(ln2(x))", mlp(ln(x64 + h, blk.ln2))),
                ("that is a post-LN block (normalise after the residual sum); this block is "
                 "pre-LN: x + attn(ln1(x)), then x + mlp(ln2(x))",
                 ln(ln(x64 + _np_mha(x64, blk.attn, 2), blk.ln1)
                    + mlp(ln(x64 + _np_mha(x64, blk.attn, 2), blk.ln1)), blk.ln2)),
                ("the MLP's input is not normalised: mlp(ln2(x)), added to the unnormalised x",
                 x64 + h + mlp(x64 + h)),
                ("the attention's input is not normalised: attn(ln1(x)), added to the "
                 "unnormalised x", x64 + _np_mha(x64, blk.attn, 2)
                 + mlp(ln(x64 + _np_mha(x64, blk.attn, 2), blk.ln2))),
                ("the MLP has no relu between fc and proj (two linear layers in a row are one)",
                 x64 + h + _np_linear(_np_linear(ln(x64 + h, blk.ln2), blk.fc), blk.proj))):
            if close(got, alt, 1e-4):
                raise Fail(msg)
    _sc_forward('Block(8, 2)', y, want, E, np.float32)

# --- the from-scratch runs: the learner's whole engine at the end of a step ---
def _sc_leaf_grads(leaves, f_np, arrays, g, says, scale=1, tol=1e-5):
    """Each (name, leaf)'s .grad (an array) against scale * the finite differences."""
    for k, (name, t) in enumerate(leaves):
        want = scale * numeric(f_np, [a.copy() for a in arrays], k, g)
        if t.grad is None or not close(t.grad, want, tol):
            raise Fail(says(name, worst(t.grad, want) if t.grad is not None else 'no .grad'))


def sc_run_2(m):
    E = m['engine']
    r = rng(19)
    a, b = r.uniform(0.5, 2, (3, 1)), r.uniform(0.5, 2, (4,))
    g = r.standard_normal((3, 4))

    def f_np(a_, b_):
        h = a_ * b_
        h = h + a_
        return h * h + h * b_

    A, B = E.Tensor(_ro(a), requires_grad=True), E.Tensor(_ro(b), requires_grad=True)
    for _ in range(2):  # the same graph's backward twice: the second adds to .grad
        h = A * B
        h += A  # in place: h becomes a new tensor; the graph keeps the old one
        out = h * h + h * B
    for _ in range(2):
        _sc_call('backward', E.backward, out, _ro(g))
    _sc_leaf_grads((('a', A), ('b', B)), f_np, (a, b), g, scale=2, says=lambda name, why: (
        f"h = a * b; h += a; out = h * h + h * b, backward twice: {name}.grad differs from twice "
        f"the finite differences: {why}"))
    return ("h = a * b; h += a; out = h * h + h * b with a (3, 1), b (4,), backward twice: .grad "
            "agrees with finite differences")


def sc_run_3(m):
    E = m['engine']
    r = rng(20)
    x, w, b = r.standard_normal((2, 4, 3)), r.standard_normal((3, 2)), r.uniform(0.5, 1, (2,))

    def f_np(x_, w_, b_):
        h = x_ @ w_ + b_
        z = np.swapaxes(h, 0, 2).reshape(2, 8)
        return np.mean(np.exp(h / 4) * np.maximum(h, 0) - np.log(b_ * b_) / (h ** 2 + 1)
                       + (h ** 3).sum((0, 2), keepdims=True)) + (z ** 2).sum(-1).mean()

    X, W, B = (E.Tensor(_ro(a), requires_grad=True) for a in (x, w, b))
    h = X @ W + B
    z = h.transpose(0, 2).reshape(2, 8)
    loss = ((h / 4).exp() * h.relu() - (B * B).log() / (h ** 2 + 1)
            + (h ** 3).sum((0, 2), keepdims=True)).mean() + (z ** 2).sum(-1).mean()
    if not close(loss.data, f_np(x, w, b)):
        raise Fail(f"the loss is {float(loss.data):.6g}, expected {f_np(x, w, b):.6g}")
    loss.backward()
    _sc_leaf_grads((('x', X), ('W', W), ('b', B)), f_np, (x, w, b), np.ones(()), tol=1e-4,
                   says=lambda name, why: f"d loss/d {name} through your whole engine "
                                          f"differs from finite differences: {why}")
    return ("a loss of matmul, exp, log, relu, power, sums, reshape and transpose: all "
            "gradients agree")


def sc_run_5(m):
    E, nn = m['engine'], m['nn']
    r = rng(21)
    x = r.uniform(-1, 1, (64, 1)).astype(np.float32)
    y = 2 * x + 1
    model = nn.Linear(1, 1)
    model.weight.data[...] = 0.0
    model.bias.data[...] = 0.0
    opt = nn.SGD(model.parameters(), lr=0.1)
    for step in range(300):
        opt.zero_grad()
        loss = nn.mse_loss(model(E.Tensor(x)), E.Tensor(y))
        loss.backward()
        opt.step()
    w, b = float(np.asarray(model.weight.data).ravel()[0]), float(np.asarray(model.bias.data)[0])
    if not (abs(w - 2) < 0.02 and abs(b - 1) < 0.02):
        raise Fail(f"after 300 SGD steps (lr 0.1) on y = 2x + 1 the model has w = {w:.4f}, "
                   f"b = {b:.4f} (loss {float(loss.data):.4g}); expected w = 2, b = 1")
    return f"300 steps: w = {w:.4f}, b = {b:.4f}, loss {float(loss.data):.2e}"


def _sc_spiral(m, make_opt, steps):
    """The spiral classifier of steps 6 and 9 on the learner's engine (an MLP of their
    Linear layers), trained by the optimizer make_opt(nn, model) makes:
    (training accuracy, the last loss)."""
    E, nn = m['engine'], m['nn']
    x, y = spiral()

    class MLP(nn.Module):
        def __init__(self):
            self.hidden, self.out = nn.Linear(2, 64), nn.Linear(64, 3)

        def forward(self, z):
            return self.out(self.hidden(z).relu())
    np.random.seed(0)
    model = MLP()
    opt = make_opt(nn, model)
    X = E.Tensor(x)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
    return float((np.asarray(model(X).data).argmax(1) == y).mean()), loss


def sc_run_6(m):
    E, nn = m['engine'], m['nn']
    acc, loss = _sc_spiral(m, lambda nn, model: nn.SGD(  # two groups: each keeps its own lr
        [{'params': model.hidden.parameters(), 'lr': 2.0}, {'params': model.out.parameters()}],
        lr=2.0), 300)
    if acc < 0.95:
        raise Fail(f"the spiral classifier reached only {acc:.0%} training accuracy (loss "
                   f"{float(loss.data):.3f}) after 300 steps; expected at least 95%")
    big = E.Tensor(np.array([[1000.0, 0.0, -1000.0], [1000.0, 1000.0, 0.0]]), requires_grad=True)
    ce = nn.cross_entropy(big, np.array([0, 2]))
    ce.backward()
    if not (np.isfinite(float(ce.data)) and np.all(np.isfinite(big.grad))):
        raise Fail("cross-entropy on logits of 1000 is not finite: the softmax overflowed")
    return (f"spiral (3 classes): {acc:.0%} after 300 steps; logits of 1000: loss "
            f"{float(ce.data):.4g}, finite gradient")


def sc_run_7(m):
    E, nn = m['engine'], m['nn']
    np.random.seed(3)
    a = nn.MultiHeadAttention(4, 2)
    for lin in (a.query, a.key, a.value, a.out):
        lin.weight.data, lin.bias.data = (np.asarray(lin.weight.data, np.float64),
                                          np.asarray(lin.bias.data, np.float64))
    x = rng(25).standard_normal((1, 3, 4))
    g = rng(26).standard_normal((1, 3, 4))
    X = E.Tensor(x.copy(), requires_grad=True)
    y = a(X)
    _sc_backward_sum(E, y, g)
    want = numeric(lambda x_: _np_mha(x_, a, 2), [x.copy()], 0, g)
    if X.grad is None or not close(X.grad, want, 1e-5):
        raise Fail("d out/d x through your multi-head attention differs from finite differences: "
                   + (worst(X.grad, want) if X.grad is not None else 'no .grad'))
    return "multi-head causal attention: d out/d x agrees with finite differences"


class _CharModel:
    """The character model of step 8's run, made of the learner's pieces: token and position
    embeddings (a one-hot matmul: no indexing op needed), one Block, a LayerNorm, a Linear."""

    def __new__(cls, nn, E, vocab, T, C=32, H=2):
        class CharModel(nn.Module):
            def __init__(self):
                self.tok = nn.Parameter((np.random.randn(vocab, C) * 0.1).astype(np.float32))
                self.pos = nn.Parameter((np.random.randn(T, C) * 0.1).astype(np.float32))
                self.blocks = [nn.Block(C, H)]
                self.ln = nn.LayerNorm(C)
                self.head = nn.Linear(C, vocab)

            def forward(self, idx):
                onehot = np.eye(vocab, dtype=np.float32)[idx]
                x = E.Tensor(onehot) @ self.tok + self.pos
                for blk in self.blocks:
                    x = blk(x)
                return self.head(self.ln(x))
        return CharModel()


def sc_run_8(m, steps=400, target=0.3, T=16):
    E, nn = m['engine'], m['nn']
    path = _SC_WS[0] / SC_TEXT
    try:
        text = path.read_text(encoding='utf-8')
    except (OSError, UnicodeDecodeError) as e:
        raise Fail(f"cannot read {path} ({type(e).__name__}): it is the text step 8 learns; "
                   "put any text of 100 characters or more there") from None
    if len(text) < 2 * T + 2:
        raise Fail(f"{path} holds {len(text)} characters: step 8 needs at least {2 * T + 2}")
    text = text[:2000]  # the run stays short whatever the file
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text])
    np.random.seed(0)
    model = _CharModel(nn, E, len(chars), T)
    opt = nn.SGD(model.parameters(), lr=0.3)
    r = rng(24)
    t0 = time.perf_counter()
    for step in range(steps):
        starts = r.integers(0, len(ids) - T - 1, 16)
        xb = np.stack([ids[s:s + T] for s in starts])
        yb = np.stack([ids[s + 1:s + T + 1] for s in starts])
        opt.zero_grad()
        logits = model(xb)
        loss = nn.cross_entropy(logits.reshape(-1, len(chars)), yb.reshape(-1))
        loss.backward()
        opt.step()
        if float(loss.data) < target:
            break
    final = float(loss.data)
    if not final < target:
        raise Fail(f"after {steps} SGD steps on {path.name} the loss is {final:.3f} (it starts "
                   f"near {math.log(len(chars)):.2f}); expected below {target}")
    window = list(ids[:T])
    for _ in range(40):  # the model writes: the most likely next character, each time
        logits = model(np.array([window[-T:]]))
        window.append(int(np.asarray(logits.data)[0, -1].argmax()))
    said = ''.join(chars[i] for i in window[T:]).replace('\n', ' ')
    return (f"your character model learned {path.name} ({len(text)} characters): loss "
            f"{final:.3f} after {step + 1} steps ({time.perf_counter() - t0:.1f} s); it goes "
            f"on from {text[:T]!r} with {said!r}")


def _sc_adam_run(nn, E, gs, p0, lr=0.1, **kw):
    """Your Adam's steps on one parameter from p0 (float64), one per gradient (read-only)."""
    p = nn.Parameter(np.array(p0, dtype=np.float64))
    opt = nn.Adam([p], lr=lr, **kw)
    for g in gs:
        p.grad = _ro(g)
        _sc_call('Adam.step', opt.step)
    return np.asarray(p.data, dtype=np.float64)


def _sc_said(msg):
    """A cut-out track's Adam message in the from-scratch track's names."""
    return (msg.replace('p.array', 'p.data')
            .replace('decoupled_weight_decay=True', 'decoupled=True')
            .replace("group['decoupled_weight_decay']", "group['decoupled']"))


def sc_check_9_1(m):
    E, nn = m['engine'], m['nn']
    r = rng(26)
    cases = [([np.array([1.0, -2.0, 0.5])] * 2, "a constant gradient [1, -2, 0.5]"),
             ([r.standard_normal(4) * 1e-4 for _ in range(3)], "3 gradients of about 1e-4"),
             ([r.standard_normal(4) for _ in range(5)], "5 random gradients")]
    for gs, what in cases:
        p0 = r.standard_normal(gs[0].shape)
        got = _sc_adam_run(nn, E, gs, p0)
        want = _adam_np(gs, p0)
        if close(got, want, 1e-7):
            continue
        if not np.all(np.isfinite(got)):
            raise Fail(f"p became {'nan' if np.isnan(got).any() else 'inf'}: look at the "
                       "corrections, m / (1 - b1^t) with its brackets and t counted from 1, and "
                       "at what goes under the square root")
        if len(gs) > 1 and close(got, _adam_np(gs[:1], p0) + sum(
                _adam_np([g], np.zeros_like(p0)) for g in gs[1:]), 1e-7):
            raise Fail("every step was Adam's first: m, v and t must persist between steps, "
                       "one set per parameter (kept in the optimizer, e.g. a dict by id(p))")
        for mistake, msg in _ADAM_MISTAKES:
            if close(got, _adam_np(gs, p0, mistake=mistake), 1e-7):
                raise Fail(_sc_said(msg))
        if close(got, _adam_np(gs, p0, mistake='betas'), 1e-7):
            raise Fail("the betas are swapped: m averages g with b1 = 0.9, v averages g^2 with "
                       "b2 = 0.999")
        raise Fail(f"after {len(gs)} steps with {what} (lr 0.1, betas (0.9, 0.999), eps 1e-8), p "
                   f"must be {np.round(want, 6).tolist()}, you gave {np.round(got, 6).tolist()}")
    a, b = nn.Parameter(np.array([1.0, -1.0])), nn.Parameter(np.array([2.0]))
    opt = nn.Adam([{'params': [a]}, {'params': [b], 'lr': 0.01}], lr=0.1)
    for g in ([0.5, 0.25], [1.0, -1.0]):
        a.grad, b.grad = _ro(g), _ro(g[:1])
        opt.step()
    if not close(b.data, _adam_np([[0.5], [1.0]], [2.0], lr=0.01), 1e-7):
        raise Fail("a group with its own lr (0.01) stepped with another: each group's step uses "
                   "its own group['lr']")
    p = nn.Parameter(np.ones(3, np.float32))
    p.grad = _ro([0.1, -0.2, 0.3], np.float32)
    nn.Adam([p], lr=0.1).step()
    if np.asarray(p.data).dtype != np.float32:
        raise Fail("Adam's step turned a float32 parameter into float64: keep its dtype")
    gs, p0 = [np.array([0.2, -0.3]), np.array([0.1, 0.4])], np.array([1.5, -2.0])
    for cls, kw in (('AdamW', dict(decoupled=True)), ('Adam', {})):
        how, mistakes = _DECAY_MISTAKES[cls]
        got = _sc_adam_run(nn, E, gs, p0, lr=0.1, weight_decay=0.1, **kw)
        if close(got, _decay_np(p0, gs, 0.1, 0.1, how), 1e-7):
            continue
        for mistake, msg in mistakes.items():
            if close(got, _decay_np(p0, gs, 0.1, 0.1, mistake), 1e-7):
                raise Fail(_sc_said(msg).replace('AdamW', 'Adam(decoupled=True)'))
        raise Fail(f"{cls} with weight_decay=0.1 (lr 0.1) after 2 steps: p must be "
                   f"{np.round(_decay_np(p0, gs, 0.1, 0.1, how), 6).tolist()}, you gave "
                   f"{np.round(got, 6).tolist()}")


def sc_run_9(m):
    acc, loss = _sc_spiral(m, lambda nn, model: nn.Adam(
        model.parameters(), lr=0.02, weight_decay=0.01, decoupled=True), 200)
    if acc < 0.95:
        raise Fail(f"the spiral classifier trained by your AdamW reached only {acc:.0%} (loss "
                   f"{float(loss.data):.3f}) after 200 steps; expected at least 95%")
    return f"spiral (3 classes) by your AdamW: {acc:.0%} after 200 steps"


SC_CHECKS = {ex: globals()['sc_check_' + ex.replace('.', '_')] for ex in SC_EXERCISES}
SC_RUN_FNS = {2: sc_run_2, 3: sc_run_3, 5: sc_run_5, 6: sc_run_6, 7: sc_run_7, 8: sc_run_8,
              9: sc_run_9}
# The other exercises each check runs: a failure is blamed on the first of these that fails
# its own check (so no exercise is blamed for another's mistake).
_E = ('1.1', '1.2', '1.3', '1.4', '1.5', '2.1', '2.2')  # the engine: Tensor to backward
SC_DEPS = {ex: () for ex in SC_EXERCISES}
SC_DEPS.update({
    '1.3': ('1.1',), '1.4': ('1.1', '1.2', '1.3'), '1.5': ('1.1', '1.2', '1.3'),
    '2.1': ('1.1', '1.3'), '2.2': ('1.1', '1.3', '2.1'), '3.1': ('1.1', '1.2', '1.3'),
    **{ex: ('1.1', '1.3') for ex in ('3.2', '3.3', '3.4', '3.5', '3.6', '3.7', '3.8')},
    '4.1': ('1.1',), '4.2': _E + ('3.1', '3.2', '3.8', '4.1'), '4.3': ('1.1',),
    '4.4': ('1.1', '4.3'), '5.1': _E + ('3.2', '3.6'), '6.1': _E + ('3.2', '3.3', '3.6'),
    '6.2': _E + ('3.2', '3.3', '3.4'), '6.3': _E + ('3.2', '3.3', '3.4', '3.6', '6.2'),
    '6.4': _E + ('3.2', '3.6', '4.1'), '7.1': _E + ('3.1', '3.2', '3.3', '3.6', '3.8', '6.1'),
    '7.2': ('1.1', '1.2', '1.3', '1.5', '2.1', '2.2', '3.2', '3.7', '3.8'),
    '7.3': ('1.1', '1.2', '1.3', '1.5', '2.1', '2.2', '3.2', '3.7', '3.8'),
    '7.4': ('1.1', '1.3', '1.4', '1.5', '3.1', '3.2', '3.3', '3.6', '3.7', '3.8', '4.1', '4.2',
            '6.1', '7.1', '7.2', '7.3'),
    '8.1': ('1.1', '1.3', '1.4', '1.5', '3.1', '3.2', '3.3', '3.5', '3.6', '3.7', '3.8', '4.1',
            '4.2', '6.1', '6.4', '7.1', '7.2', '7.3', '7.4'),
    '9.1': ('1.1', '4.3')})


def sc_map():
    """How the learner's engine maps onto tinytorch's: their names -> tinytorch's, by name."""
    rows = [("yours (exercise)", "tinytorch's (file: function)")]
    for ex in SC_ORDER:
        e = SC_EXERCISES[ex]
        rows.append((f"{e['file']}: {SC_NAMES[ex]} ({ex})", f"{e['tt'][0]}: {e['tt'][1]}"))
    w = max(len(a) for a, _ in rows)
    return '\n'.join(f"{a:<{w}}  ->  {b}" for a, b in rows)


SC_NAMES = {'1.1': 'Tensor', '1.2': 'unbroadcast', '1.3': 'op', '1.4': 'add', '1.5': 'mul',
            '2.1': 'topo_order', '2.2': 'backward', '3.1': 'matmul', '3.2': 'reduce_sum',
            '3.3': 'exp', '3.4': 'log', '3.5': 'relu', '3.6': 'power', '3.7': 'reshape',
            '3.8': 'transpose', '4.1': 'Module.named_parameters', '4.2': 'Linear',
            '4.3': 'SGD (__init__, step)', '4.4': 'SGD.zero_grad', '5.1': 'mse_loss',
            '6.1': 'softmax', '6.2': 'log_softmax', '6.3': 'cross_entropy', '6.4': 'LayerNorm',
            '7.1': 'attention', '7.2': 'split_heads', '7.3': 'merge_heads',
            '7.4': 'MultiHeadAttention', '8.1': 'Block', '9.1': 'Adam'}


# ---------------------------------------------------------------------------
# Running checks: each under a time limit, each result kept for the rest of the command
# ---------------------------------------------------------------------------
LIMIT = 5  # seconds for one exercise's check (each takes well under 0.2 s on the shipped code)
RUN_LIMIT = 60  # seconds for a step's run (the longest, step 8's, takes about 1 s)
_doing = ['']  # what runs now, for the one line a Ctrl-C prints


class Hang(BaseException):
    """The time limit ran out inside the learner's code. A BaseException, so that an
    `except Exception` in their code does not swallow it (the alarm repeats for a bare
    `except:`)."""


@contextlib.contextmanager
def time_limit(seconds):
    """Raise Hang in the code of the with-block after `seconds` (a POSIX alarm, or on
    Windows a timer that interrupts the main thread). Off the main thread: no limit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if hasattr(signal, 'setitimer'):
        def ring(signum, frame):
            raise Hang()
        old = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)  # then every 0.5 s until stopped
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return
    rang = []

    def interrupt():
        rang.append(True)
        _thread.interrupt_main()
    timer = threading.Timer(seconds, interrupt)
    timer.start()
    try:
        yield
    except KeyboardInterrupt as e:
        if rang:  # the timer's: a Hang, with the place it interrupted
            raise Hang().with_traceback(e.__traceback__) from None
        raise
    finally:
        timer.cancel()


_blas = []  # [(openblas_set_num_threads, openblas_get_num_threads)] of this process's OpenBLAS


@contextlib.contextmanager
def one_blas_thread():
    """OpenBLAS at one thread while the checks run, then as it was. The checks multiply
    small matrices, where OpenBLAS's threads only wait for each other, and on a busy machine
    they wait for the cores too: the step 8 run took 9 s of CPU with two threads, 1.5 s with
    one. Found as NumPy's wheels name them (scipy_openblas_..._64_) in the libraries this
    process mapped; with another BLAS, or off Linux, nothing changes."""
    if not _blas:
        _blas.append(None)
        try:
            with open('/proc/self/maps') as f:
                paths = sorted({ln.split()[-1] for ln in f
                                if 'openblas' in ln.lower() and '/' in ln})
        except OSError:
            paths = []
        for path in paths:
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in ('openblas_{}_num_threads', 'scipy_openblas_{}_num_threads64_',
                         'openblas_{}_num_threads64_', 'scipy_openblas_{}_num_threads'):
                put, get = (getattr(lib, name.format(w), None) for w in ('set', 'get'))
                if put is not None and get is not None:
                    _blas.append((put, get))
                    break
    before = [(put, get()) for put, get in _blas[1:]]
    for put, _ in before:
        put(1)
    try:
        yield
    finally:
        for put, n in before:
            put(n)


def upto(step):
    """The exercises a step's run uses: the checklist's up to that step, and an optional
    step's own (each optional step builds on the checklist, not on the other ones)."""
    return [e for e in ORDER if EXERCISES[e]['step'] <= step
            and (e in CORE or EXERCISES[e]['step'] == step)]


def needs(ex):
    """The modules an exercise's check uses."""
    step = EXERCISES[ex]['step']
    if TRACK == 'scratch':
        return ('engine',) + (('nn',) if step >= 4 else ())
    return (('tinytorch',) + (('nn', 'optim') if step >= 4 else ())
            + (('transformer',) if step >= 7 else ()))


def exercise_at(ws, f, line):
    """The exercise whose lines in the workspace's file f hold line `line` (1-based)."""
    try:
        text = (ws / f).read_text()
    except OSError:
        return None
    return next((e for e, _, _, a, b in regions(text) if a < line <= b), None)


def _frames(e, ws):
    """[(file name, line number, line text)] of the traceback's frames in the workspace,
    innermost first."""
    out = []
    for fr in traceback.extract_tb(e.__traceback__):
        if Path(fr.filename).parent in (ws, ws.resolve()):
            out.append((Path(fr.filename).name, fr.lineno, (fr.line or '').strip()))
    return out[::-1]


def _hang_place(e, ws):
    """(exercise or None, ' (file line N: code)') of where the time ran out: the innermost
    frame in the workspace that is inside an exercise, else the innermost one there."""
    frames = _frames(e, ws)
    at = next(((f, n, code, exercise_at(ws, f, n)) for f, n, code in frames
               if exercise_at(ws, f, n)), frames[0] + (None,) if frames else None)
    return (at[3], f" ({ws / at[0]} line {at[1]}: {at[2]})") if at else (None, '')


def _endless(seconds):
    return f"did not finish in {seconds:g} s: look for a loop that never ends"


def attempt(fn, mods, mod_names, ex, ws, limit=None):
    """(passed, message, hung) of one check or run, within limit seconds (LIMIT): hung is
    None, or the exercise whose code did not finish in time (the one being checked when no
    other is to blame)."""
    limit = limit or LIMIT
    for name in mod_names:
        if isinstance(mods[name], str):
            return False, mods[name], None
    try:
        with np.errstate(all='ignore'), time_limit(limit):
            msg = fn(mods)
        return True, msg or '', None
    except Hang as e:
        blame, where = _hang_place(e, ws)
        if blame and blame != ex:
            whose = f"needs exercise {blame} first: its" if ex else f"exercise {blame}'s"
            return False, f"{whose} code {_endless(limit)}{where}", blame
        return False, f"your code {_endless(limit)}{where}", ex or '?'
    except Fail as e:
        return False, str(e), None
    except NotImplementedError as e:
        text = str(e)
        got = re.match(r'exercise (\d+\.\d+): not implemented yet', text)
        if got and ex is not None and got.group(1) != ex:
            return False, f"needs exercise {got.group(1)} first (it is not implemented yet)", None
        if got:
            f, line = locate(ws, got.group(1))
            return False, f"not implemented yet: write it in {ws / f}, line {line}", None
        return False, _where(e, ws), None
    except RecursionError:
        return False, ("RecursionError: your code recursed too deep (a loop in the graph "
                       "walk?)"), None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 (the learner's code: explain, do not crash)
        return False, f"your code raised {_where(e, ws)}", None


def select(arg, ws=None):
    if arg is None:  # the checklist, and each optional exercise once started
        mine = [ex for ex in ORDER if ex in CORE or ws is not None and not is_stub(ws, ex)]
        return mine, sorted({s for s in RUN_FNS if s < OPTIONAL}
                            | {EXERCISES[ex]['step'] for ex in mine if ex not in CORE})
    if re.fullmatch(r'\d+', arg) and int(arg) in STEPS:
        s = int(arg)
        return [ex for ex in ORDER if EXERCISES[ex]['step'] == s], [s] if s in RUN_FNS else []
    if arg in EXERCISES:
        return [arg], []
    raise Usage(f"unknown exercise or step {arg!r}: the steps are 1-{len(STEPS)}, the exercises "
                f"{ORDER[0]} .. {ORDER[-1]} (python {ME} lists them)")


class Session:
    """One command's checks on a workspace: its modules loaded once, each exercise's result
    kept, and after a check that did not finish, no more checks (the interrupted code may
    have left the modules half-changed, and every later check would wait out its limit)."""

    def __init__(self, ws):
        self.ws = ws
        _SC_WS[0] = ws
        _doing[0] = f"loading {ws}/"
        self.mods = load(ws)
        self.done = {}  # exercise -> (passed, message)
        self.hung = None  # the exercise whose code did not finish in time

    def own(self, ex):
        """(passed, message) of the exercise's own check."""
        if ex not in self.done:
            _doing[0] = f"checking exercise {ex}"
            passed, msg, hung = attempt(CHECKS[ex], self.mods, needs(ex), ex, self.ws)
            self.hung = self.hung or hung
            first = re.match(r'needs exercise (\d+\.\d+) first \(it is not implemented', msg)
            if first and is_stub(self.ws, ex):  # neither started: this one is not started yet
                f, line = locate(self.ws, ex)
                msg = (f"not implemented yet: write it in {self.ws / f}, line {line} (after "
                       f"exercise {first.group(1)}, which it needs)")
            self.done[ex] = passed, msg
        return self.done[ex]

    def verdict(self, ex):
        """(passed, message), a failure blamed on the first exercise this one's check runs
        (DEPS) whose own check fails: its mistake shows up here too, so it is the one to fix."""
        passed, msg = self.own(ex)
        if passed or self.hung or msg.startswith(('needs exercise', 'not implemented yet')):
            return passed, msg
        for d in DEPS[ex]:
            ok, why = self.own(d)
            if self.hung:
                return False, why
            if not ok and why.startswith('not implemented yet'):
                return False, f"needs exercise {d} first (it is not implemented yet)"
            if not ok:
                return False, (f"needs exercise {d} first ({EXERCISES[d]['title']}, which this "
                               f"check runs, fails its own check: {why})")
        return passed, msg

    def run(self, step, out):
        """A step's run, once every exercise up to it passes; a failure names the likely
        culprit (PROBES). True when it passed."""
        mine = upto(step)
        blocked = [e for e in mine if not self.hung and not self.verdict(e)[0]]
        if blocked:
            out(f"· step {step} run ({RUNS[step]}): waits for {', '.join(blocked[:4])}"
                f"{' ...' if len(blocked) > 4 else ''}")
            return False
        _doing[0] = f"the step {step} run"
        passed, msg, hung = attempt(RUN_FNS[step], self.mods, needs(mine[-1]), None, self.ws,
                                    RUN_LIMIT)
        self.hung = self.hung or hung
        if not passed and not hung:
            msg += self.likely_cause(step)
        out(f"✓ step {step} run: {msg}" if passed
            else f"✗ step {step} run ({RUNS[step]}): {msg}")
        return passed

    def likely_cause(self, step):
        """After a failed run whose exercises all pass: the first probe of the code the run
        uses (outside the exercises, or beyond what their checks try) that fails."""
        mine = upto(step)
        for probe in PROBES.get(step, ()):
            ok, why, hung = attempt(probe, self.mods, needs(mine[-1]), None, self.ws)
            self.hung = self.hung or hung
            if not ok:
                return f"; likely cause: {why}"
        return ""


def _mark(passed, msg):
    return '✓' if passed else '·' if msg.startswith('not implemented yet') else '✗'


def track_of(ws):
    """'scratch' for a from-scratch workspace, else 'cut' (read_stamp checks the rest)."""
    try:
        return json.loads((ws / STAMP).read_text()).get('track', 'cut')
    except (OSError, ValueError, AttributeError):
        return 'cut'


_TRACKED = ('TRACK', 'FILES', 'STEPS', 'OPTIONAL', 'EXERCISES', 'ORDER', 'CORE', 'RUNS',
            'CHECKS', 'DEPS', 'RUN_FNS', 'PROBES')
TRACK = 'cut'
_CUT = {n: globals()[n] for n in _TRACKED}
_SCRATCH = dict(TRACK='scratch', FILES=SC_FILES, STEPS=SC_STEPS, OPTIONAL=SC_OPTIONAL,
                EXERCISES=SC_EXERCISES, ORDER=SC_ORDER,
                CORE=[ex for ex in SC_ORDER if SC_EXERCISES[ex]['step'] < SC_OPTIONAL],
                RUNS=SC_RUNS,
                CHECKS=SC_CHECKS, DEPS=SC_DEPS, RUN_FNS=SC_RUN_FNS, PROBES={})


@contextlib.contextmanager
def track(name):
    """The exercises, checks and runs of a track ('cut' or 'scratch') as this module's
    globals while the with-block runs (every function reads them there)."""
    saved = {n: globals()[n] for n in _TRACKED}
    globals().update(_SCRATCH if name == 'scratch' else _CUT)
    try:
        yield
    finally:
        globals().update(saved)


def check(ws, arg, out=print):
    with track(track_of(ws)), one_blas_thread():
        return _check(ws, arg, out)


def status(ws):
    with track(track_of(ws)), one_blas_thread():
        return _status(ws)


def hint(ws, ex):
    with track(track_of(ws)):
        return _hint(ws, ex)


def diff(ws, ex):
    with track(track_of(ws)), one_blas_thread():
        return _diff(ws, ex)


def _check(ws, arg, out=print):
    read_stamp(ws)
    exercises, runs = select(arg, ws)
    s = Session(ws)
    results, skipped = {}, []
    ok = runs_ok = True
    for ex in exercises:
        if s.hung:
            skipped.append(ex)
            continue
        passed, msg = s.verdict(ex)
        results[ex] = passed
        ok &= passed
        title = EXERCISES[ex]['title']
        out(f"✓ {ex} {title}" if passed else f"{_mark(passed, msg)} {ex} {title}: {msg}")
        step = EXERCISES[ex]['step']
        if step in runs and ex == [e for e in ORDER if EXERCISES[e]['step'] == step][-1] \
                and not s.hung:
            runs_ok &= s.run(step, out)
    for step in runs:  # runs of steps none of whose exercises were chosen
        if not any(EXERCISES[e]['step'] == step for e in exercises) and not s.hung:
            runs_ok &= s.run(step, out)
    ok &= runs_ok
    if s.hung:
        listed = ', '.join(skipped) if len(skipped) < 5 else f"{skipped[0]} .. {skipped[-1]}"
        out(f"· not checked{': ' + listed if skipped else ''}"
            f"{' and the runs' if runs else ''}: exercise {s.hung}'s code must finish first"
            if skipped or runs else f"(stuck? python {ME} hint {s.hung}{_dir_arg(ws)})")
        return False, results
    if not runs_ok and all(results.values()):
        out(f"{'All ' + str(len(CORE)) if set(CORE) <= set(results) else 'These'} exercises "
            "pass their checks, but a step's run fails (its line above says what it found): fix "
            f"that, then: python {ME} check{' ' + arg if arg else ''}{_dir_arg(ws)}")
    elif ok or len(exercises) > 1:
        out(next_step(ws, results, runs_ok if runs else None))
    else:
        blamed = re.match(r'needs exercise (\d+\.\d+) first', s.verdict(exercises[0])[1])
        out(f"(stuck? python {ME} hint {blamed.group(1) if blamed else exercises[0]}"
            f"{_dir_arg(ws)})")
    return ok, results


def _status(ws):
    print("Build your own engine from an empty file: the seed article's checklist in eight "
          "steps, checked by learn.py.\n" if TRACK == 'scratch' else "Build tinytorch yourself: "
          "the seed article's checklist, as exercises that tinytorch checks.\n")
    have = ws.is_dir()
    states = {}
    if have:
        read_stamp(ws)
        s = Session(ws)
        for ex in ORDER:
            if s.hung:
                break
            states[ex] = None if is_stub(ws, ex) else s.verdict(ex)[0]
    for step, what in STEPS.items():
        print(f"Step {step}. {what}" if step < OPTIONAL
              else f"Step {step} ({what[0].lower()}{what[1:]})")
        for ex in ORDER:
            if EXERCISES[ex]['step'] != step:
                continue
            mark = {True: '✓', False: '✗', None: '·'}[states.get(ex)] if have else ' '
            print(f"   {mark} {ex} {EXERCISES[ex]['title']}  ({EXERCISES[ex]['file']})")
        if step in RUNS:
            print(f"     then a run: {RUNS[step]}")
    print()
    if not have:
        print(f"No workspace yet. Start with:  python {ME} start   (makes {DEFAULT_DIR}/: "
              f"your copies of {', '.join(_CUT['FILES'])} with the exercises cut out)")
        print(f"   or:  python {ME} start DIR --from-scratch   (an empty engine of your own to "
              "write: engine.py and nn.py, a contract per exercise, no code)")
        print(f"Then:  python {ME} check 1.1    python {ME} hint 1.1    "
              f"python {ME} diff 1.1")
    else:
        done = sum(1 for ex, v in states.items() if v and ex in CORE)
        print(f"{ws}/: {done} of {len(CORE)} exercises pass (✓ passes, ✗ written but failing, "
              "· not started).")
        if s.hung:
            print(f"Exercise {s.hung}'s code did not finish in {LIMIT} s (the later ones were "
                  f"not checked): python {ME} check {s.hung}{_dir_arg(ws)}")
        else:
            print(next_step(ws, states))


def _hint(ws, ex):
    if ex not in EXERCISES:
        raise Usage(f"unknown exercise {ex!r}: the exercises are {ORDER[0]} .. {ORDER[-1]} "
                    f"(python {ME} lists them)")
    stamp = read_stamp(ws)
    level = min(stamp.setdefault('hints', {}).get(ex, 0) + 1, 3)
    stamp['hints'][ex] = level
    write_stamp(ws, stamp)
    e = EXERCISES[ex]
    print(f"Hint {level} of 3 for exercise {ex} ({e['title']}, {e['file']}):")
    if level == 1:
        print(e['think'])
    elif level == 2:
        print(e['math'])
    elif TRACK == 'scratch':  # the answer key is not shipped: where tinytorch does the same
        print(f"tinytorch does the same in {e['tt'][0]}: {e['tt'][1]} (found by name; PyTorch's "
              f"finer rules and guards around it). Read it there; once your check passes, "
              f"python {ME} diff {ex}{_dir_arg(ws)} shows it beside yours.")
    elif 'plain' in e:
        print("Hint 2 as code, a complete answer:")
        print(textwrap.indent(e['plain'], blocks(ex)[0][2]))
        print(f"tinytorch's own file says the same, with guards you may skip ({e['guards']}):")
        for block in shipped_code(ex):
            print(block)
    else:
        print("The shipped answer (this is what tinytorch's own file says):")
        for block in shipped_code(ex):
            print(block)
    if level < 3:
        print(f"(python {ME} hint {ex} again for more)")


def _diff(ws, ex):
    if ex not in EXERCISES:
        raise Usage(f"unknown exercise {ex!r}: the exercises are {ORDER[0]} .. {ORDER[-1]}")
    read_stamp(ws)
    passed, msg = Session(ws).verdict(ex)
    if not passed:
        print(f"✗ {ex} {EXERCISES[ex]['title']}: {msg}")
        print(f"diff shows the shipped answer once your check passes (python {ME} check {ex}).")
        return False
    f = EXERCISES[ex]['file']
    lines = (ws / f).read_text().split('\n')
    yours = ['\n'.join(_without_todo(lines[a:b]))
             for e, _, _, a, b in regions('\n'.join(lines)) if e == ex]
    if TRACK == 'scratch':  # yours, then tinytorch's own code for the same, found by name
        tf, names = EXERCISES[ex]['tt']
        print(f"✓ {ex} passes. Yours ({ws}/{f}):")
        print('\n'.join(_dedent(yours[0].split('\n'))))
        print(f"tinytorch's ({tf}: {names}; PyTorch's finer rules and speed guards included):")
        for name in names.split(', '):
            print(_source_of(tf, name))
        return True
    width = max(40, (shutil.get_terminal_size((120, 24)).columns - 3) // 2)
    print(f"✓ {ex} passes. Yours ({ws}/{f}) | shipped ({f} of tinytorch):")
    for mine, theirs in zip(yours, shipped_code(ex)):
        left, right = _dedent(mine.split('\n')), _dedent(theirs.split('\n'))
        for a, b in _pairs(left, right):
            mark = ' ' if a == b else '|'
            wa, wb = textwrap.wrap(a, width) or [''], textwrap.wrap(b, width) or ['']
            for k in range(max(len(wa), len(wb))):
                pa, pb = (wa[k] if k < len(wa) else ''), (wb[k] if k < len(wb) else '')
                print(f"{pa:<{width}} {mark} {pb}".rstrip())
        print('-' * (2 * width + 3))
    return True


def _source_of(f, name):
    """The source of a shipped function or class, by its dotted name (never a line number)."""
    text = (HERE / f).read_text()
    node = _find(ast.parse(text), name, len(text.split('\n')) + 1)
    if node is None:
        raise Mismatch(f"{f} has no {name}: this learn.py does not match the files beside it")
    return '\n'.join(text.split('\n')[node.lineno - 1:node.end_lineno])


def _without_todo(lines):
    """The learner's lines without the stub's TODO comment (if they kept it)."""
    out, skip = [], False
    for ln in lines:
        if ln.strip().startswith('# TODO exercise'):
            skip = True
        elif not (skip and ln.strip().startswith('#')):
            skip = False
            out.append(ln)
    return out


def _dedent(lines):
    lines = [ln for ln in lines if ln.strip()]
    pad = min((len(ln) - len(ln.lstrip()) for ln in lines), default=0)
    return [ln[pad:] for ln in lines]


def _pairs(a, b):
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b).get_opcodes():
        left, right = a[i1:i2], b[j1:j2]
        for k in range(max(len(left), len(right))):
            out.append((left[k] if k < len(left) else '', right[k] if k < len(right) else ''))
    return out


def usage():
    return (f"usage: python {ME} [start [DIR] [--from-scratch] | check [STEP|EXERCISE] | hint "
            f"EXERCISE | diff EXERCISE | map | help] [--dir DIR]  (python {ME} help says more)")


def _find_workspace():
    """The workspace when no --dir is given: this folder if it is one, else mytorch/ here,
    else mytorch/ beside learn.py (so check works from any folder); None if none is."""
    if Path(STAMP).is_file() and not Path(DEFAULT_DIR).is_dir():
        return Path('.')
    for ws in (Path(DEFAULT_DIR), HERE / DEFAULT_DIR):
        if ws.is_dir():
            return Path(_short(ws))
    return None


def _short(path):
    """A path as short as it can be written from the folder you are in."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return rel if len(rel) <= len(str(path)) else str(path)


def main(argv):
    try:
        sys.stdout.reconfigure(errors='replace')
    except (AttributeError, ValueError):
        pass
    global ME, FOUND
    ME = _short(HERE / 'learn.py')
    args = list(argv)
    if '-h' in args or '--help' in args or args[:1] == ['help']:
        print(__doc__.split('\n\nThe exercises are')[0])
        if ME != 'learn.py':
            print(f"(From this folder, learn.py is: python {ME})")
        return 0
    ws = None
    if '--dir' in args:
        i = args.index('--dir')
        if i + 1 >= len(args):
            raise Usage("--dir needs a folder: --dir mytorch")
        ws = args[i + 1]
        del args[i:i + 2]
    scratch = '--from-scratch' in args
    if scratch:
        args.remove('--from-scratch')
        if args[:1] != ['start']:
            raise Usage(f"--from-scratch goes with start: python {ME} start DIR --from-scratch")
    bad = [a for a in args if a.startswith('-')]
    if bad:
        raise Usage(f"unknown option {bad[0]!r}; {usage()}")
    cmd, rest = (args[0], args[1:]) if args else ('status', [])
    if cmd not in ('status', 'start', 'check', 'hint', 'diff', 'map'):
        raise Usage(f"unknown command {cmd!r}; {usage()}")
    if len(rest) > 1 or cmd in ('hint', 'diff') and len(rest) != 1:
        what = 'one exercise, as in 2.1' if cmd in ('hint', 'diff') else 'too many arguments'
        raise Usage(f"{cmd}: {what}; {usage()}")
    if cmd == 'start':
        if ws is not None and rest:
            raise Usage(f"start takes the folder once: python {ME} start DIR")
        if not scratch:
            _index_exercises()  # before making anything: every exercise must be found
        start(Path(rest[0] if rest else ws or DEFAULT_DIR), scratch)
        return 0
    if cmd == 'map':
        if rest:
            raise Usage(f"map takes no argument; {usage()}")
        print("Your engine (the from-scratch track) and where tinytorch does the same, by "
              "name:\n" + sc_map() + f"\nPast the checklist: {SC_OPTIONAL_LATER}.")
        return 0
    if ws is None:  # inside a workspace: that one; else mytorch/ here or beside learn.py
        FOUND = _find_workspace()
        ws = FOUND or DEFAULT_DIR
    ws = Path(ws)
    if cmd == 'status':
        status(ws)
        return 0
    if cmd == 'check':
        return 0 if check(ws, rest[0] if rest else None)[0] else 1
    if cmd == 'hint':
        hint(ws, rest[0])
        return 0
    return 0 if diff(ws, rest[0]) else 1


def cli(argv):
    """main, with its errors as one line: exit 2 for a bad argument, 130 for Ctrl-C."""
    try:
        sys.exit(main(argv))
    except (Usage, Mismatch) as e:
        print(f"learn.py: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # python learn.py hint 1.1 | head
        sys.exit(0)
    except KeyboardInterrupt:
        print(f"learn.py: stopped (Ctrl-C){' while ' + _doing[0] if _doing[0] else ''}",
              file=sys.stderr)
        sys.exit(130)


if __name__ == '__main__':
    cli(sys.argv[1:])
