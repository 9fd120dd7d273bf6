"""lookinside.py: tools that look at tinytorch's graph and at a run.

    import lookinside
    lookinside.draw_graph(loss, 'graph.svg', names=model)  # the graph, as Graphviz draws it
    lookinside.grad_path(loss, model.fc.weight, names=model)  # one gradient's way back
    with lookinside.profile() as prof: ...                 # time, FLOPs, memory per op
    with lookinside.detect_anomaly(): ...                  # where a NaN was born
    writer = lookinside.SummaryWriter('runs/exp1')         # scalars of a run, to a CSV file
    print(lookinside.summary(model))                       # each module's parameter count

  1. seeing the graph: draw_graph and grad_path
  2. looking inside a run: profile and detect_anomaly; memory (what a step keeps for
     backward, per module) and memory_growth (how it grows with block size or batch)
  3. logging a run: SummaryWriter (tinytorch.utils.tensorboard's, for PyTorch programs);
     StopRequest (Ctrl-C ends a training loop after its step)
  4. a model's size: summary (the parameter counts that print(model) leaves out, as PyTorch)

tinytorch.py keeps only the hook these need (its section 6b); this file reads the graph
that tinytorch builds and the docstrings of its backward rules, and changes nothing.
"""
import csv
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
import weakref
from collections import deque

import numpy as np

import tinytorch as tt


# ---------------------------------------------------------------------------
# 1. Seeing the graph: draw_graph and grad_path
# ---------------------------------------------------------------------------
def _param_names(names):
    """id -> name, from a Module (anything with named_parameters()) or a dict name -> tensor."""
    if names is None:
        return {}
    items = names.named_parameters() if hasattr(names, 'named_parameters') else names.items()
    return {id(t): n for n, t in items}


def _op_label(node):
    """The op's name as the graph shows it: add_ (in place) for an in-place op."""
    return f'{node._op} (in place)' if node._op.endswith('_') else node._op


def _check_intact(root):
    if root._backward is tt._freed_graph:
        raise RuntimeError("the graph behind this tensor was freed by backward(); call "
                           "backward(retain_graph=True) first, or look before backward()")


def _shape(shape):
    """(12, 64) or (128,): a shape written as Python writes a tuple."""
    return str(tuple(int(n) for n in shape))


def draw_graph(tensor, path=None, names=None, max_nodes=150):
    """The computation graph behind `tensor` as Graphviz DOT text.

    Each box is an op (name, output shape, dtype); leaves are ellipses, parameters
    filled and named when `names` (a Module, or a dict name -> tensor) is given.
    Arrows point the way data flows; gradients flow back against them. At most
    max_nodes nodes are drawn, nearest the output first, with a note of how many
    were left out. With path ending in .svg, .png or .pdf the graph is rendered with
    Graphviz's `dot` when it is installed; .dot, .gv or .txt get the DOT text; any other
    extension is refused with the list.
    """
    _check_intact(tensor)
    label = _param_names(names)
    seen, order, queue = {id(tensor)}, [], deque([tensor])
    while queue:  # breadth first from the output: every node, inputs and constants included
        node = queue.popleft()
        order.append(node)
        for p in tt._inputs(node):
            if id(p) not in seen:
                seen.add(id(p))
                queue.append(p)
    hidden = len(order) - max_nodes
    order = order[:max_nodes]  # the nodes nearest the output
    ids = {id(node): f'n{i}' for i, node in enumerate(order)}
    lines = ['digraph tinytorch {', '  rankdir=BT;',
             '  node [shape=box, fontname="Helvetica", fontsize=10];']
    for node in order:
        text = f'{_shape(node.shape)} {node.dtype}'
        if node._parents:
            attrs = f'label="{_op_label(node)}\\n{text}"'
        elif id(node) in label:
            attrs = (f'label="{label[id(node)]}\\n{text}", shape=ellipse, style=filled, '
                     'fillcolor="#cfe2ff"')
        else:
            kind = 'leaf (requires grad)' if node.requires_grad else 'input'
            attrs = f'label="{kind}\\n{text}", shape=ellipse'
        lines.append(f'  {ids[id(node)]} [{attrs}];')
    for node in order:
        for p in tt._inputs(node):
            if id(p) in ids:
                lines.append(f'  {ids[id(p)]} -> {ids[id(node)]};')
    if hidden > 0:
        lines.append(f'  note [shape=note, label="{hidden} more nodes not drawn '
                     f'(max_nodes={max_nodes})"];')
    lines.append('}')
    dot = '\n'.join(lines) + '\n'
    if path is not None:
        _write_graph(dot, path)
    return dot


_RENDERED = ('svg', 'png', 'pdf')  # drawn by Graphviz's dot
_DOT_TEXT = ('dot', 'gv', 'txt')  # the DOT text itself


def _write_graph(dot, path):
    fmt = os.path.splitext(path)[1].lstrip('.').lower()
    if fmt not in _RENDERED + _DOT_TEXT:
        raise ValueError(f"draw_graph: can't write {os.path.basename(path)!r}: give a path ending "
                         f"in {', '.join('.' + f for f in _RENDERED)} (drawn with Graphviz) or "
                         f"{', '.join('.' + f for f in _DOT_TEXT)} (the DOT text)")
    if fmt in _DOT_TEXT:
        with open(path, 'w') as f:
            f.write(dot)
        return
    if shutil.which('dot') is None:
        dot_path = os.path.splitext(path)[0] + '.dot'
        with open(dot_path, 'w') as f:
            f.write(dot)
        print(f"draw_graph: Graphviz's `dot` is not installed, so {path} was not drawn; the DOT "
              f"text is in {dot_path}. Install Graphviz (apt-get install graphviz, brew install "
              f"graphviz) and run: dot -T{fmt} {dot_path} -o {path}")
        return
    subprocess.run(['dot', f'-T{fmt}', '-o', path], input=dot.encode(), check=True)


# What an op's backward rule does to the gradient, in words, for grad_path: the rule's
# own docstring, one line per input (a rule for any number of inputs, as cat's, has one
# line for all). So the words are the rule's math comment and cannot drift from it.
_BROADCASTING = ('add', 'sub', 'mul', 'div', 'where', 'maximum', 'minimum', 'pow')


def rule_lines(rule):
    """The lines of a backward rule's docstring (its math, one line per input)."""
    doc = getattr(rule, '__doc__', None) or ''
    return [line.strip() for line in doc.strip().split('\n') if line.strip()]


def _norm(g):
    """|g|; a Function with several outputs passes one array per output (an object array)."""
    if g.dtype != object:
        return np.linalg.norm(g)
    return np.sqrt(sum(float(np.sum(np.square(a))) for a in g.flat if not isinstance(a, int)))


def _rule_in_words(node, i, g_out, g_in):
    """What node's backward rule does to the gradient on its way to input i."""
    inputs = tt._inputs(node)
    lines = rule_lines(node._backward)
    if not lines:
        words = f"backward of {node._op}"
    else:
        words = lines[i] if len(lines) > 1 else lines[0]
    op = node._op[:-1] if node._op.endswith('_') else node._op  # add_ has add's rule
    other = inputs[1 - i] if len(inputs) == 2 else None
    if op == 'mul' and other is not None and other.array.size == 1:
        words += f", here {float(other.array.reshape(-1)[0]):.4g}"
    if tuple(g_out.shape) != tuple(inputs[i].shape) and op in _BROADCASTING:
        words += f"; summed over the broadcast dims {_shape(g_out.shape)} -> {_shape(inputs[i].shape)}"
    return words


def grad_path(loss, param, names=None, max_paths=6, file=None):
    """Print how the gradient travels from `loss` back to `param`, op by op.

    For each step: the op, the shapes in and out, its backward rule in words and
    the norm of the gradient there. When `param` is reached along several paths,
    each path's own contribution is shown, and their sum, which is param's gradient
    (the multivariable chain rule adds them). With more than max_paths paths, the
    ops they pass through are listed once each instead, from the loss down.
    The graph must be intact: call it before loss.backward(), or after
    loss.backward(retain_graph=True). Returns the text it printed.
    """
    _check_intact(loss)
    label = _param_names(names)
    pname = label.get(id(param), 'the parameter')
    order = tt._topological_order(loss)
    if not any(n is param for n in order):
        raise ValueError(f"grad_path: {pname} does not affect this loss (no path reaches it)")
    # which nodes lie on a path to param, and how many paths leave each of them
    paths = {id(param): 1}
    for node in order:
        n = sum(paths.get(id(p), 0) for p in tt._inputs(node))
        if n and node is not param:
            paths[id(node)] = n
    seed = np.ones_like(loss.array)
    out = [f"gradient of the loss {_shape(loss.shape)} with respect to {pname} {_shape(param.shape)}",
           "each step: op, gradient shape at its output -> at its input [that input], "
           "|grad| there, and the backward rule"]

    def step_line(node, i, g, pg):
        x = tt._inputs(node)[i]
        src = label.get(id(x), 'x' if not x._parents else _op_label(x))
        return (f"  {_op_label(node):<14} {_shape(g.shape)} -> {_shape(x.shape)} [{src}]  |grad| "
                f"{_norm(g):.4g} -> {_norm(pg):.4g}:  "
                f"{_rule_in_words(node, i, g, pg)}")

    if paths[id(loss)] <= max_paths:
        # walk each path on its own, sending the gradient along that path's edges only
        total = np.zeros(param.shape)
        todo = [(loss, seed, [])]
        found = []
        while todo:
            node, g, lines = todo.pop()
            if node is param:
                found.append((lines, g))
                continue
            grads = node._backward(g)
            for i, p in reversed(list(enumerate(tt._inputs(node)))):
                if id(p) in paths and grads[i] is not None:
                    todo.append((p, grads[i], lines + [step_line(node, i, g, grads[i])]))
        for k, (lines, g) in enumerate(found, 1):
            out.append(f"path {k} of {len(found)}:")
            out.extend(lines)
            out.append(f"  = contribution {_norm(g):.4g}")
            total = total + g
        if len(found) > 1:
            out.append(f"the {len(found)} contributions are added (chain rule): "
                       f"|grad of {pname}| = {_norm(total):.4g}")
        else:
            out.append(f"|grad of {pname}| = {_norm(total):.4g}")
    else:
        # too many paths to list: walk the graph as backward does (its own walk, keeping
        # the graph) and list each step that lies on some path
        out.append(f"{paths[id(loss)]} paths reach it (more than max_paths={max_paths}); the "
                   "ops they pass through, from the loss down (where a tensor feeds several ops, "
                   "the gradients coming back from them are added):")
        total = None
        for node, g, rule_out in tt._walk(loss, seed, retain_graph=True):
            if node is param:
                total = g
            if rule_out is None or id(node) not in paths:
                continue
            for i, (p, pg) in enumerate(zip(tt._inputs(node), rule_out)):
                if pg is not None and id(p) in paths:
                    out.append(step_line(node, i, g, pg))
        out.append(f"all contributions added: |grad of {pname}| = {_norm(total):.4g}")
    text = '\n'.join(out)
    print(text, file=file or sys.stdout)
    return text


# ---------------------------------------------------------------------------
# 2. Looking inside a run: profile and detect_anomaly
# ---------------------------------------------------------------------------
# Both watch every op and every backward rule through tinytorch's hooks (its section 6b):
# inside `with`, tt._hooks holds them, and from_op and backward tell them what happens.
class _Hook:
    """Turned on by `with`, off at the end of the block, even after an error."""

    def __enter__(self):
        tt._hooks.append(self)
        return self

    def __exit__(self, *exc):
        tt._hooks.remove(self)

    def op(self, out, op, parents):
        pass

    def rule_start(self, node):
        pass

    def rule_end(self, node, grads):
        pass

    def renamed(self, node, op):  # an in-place op's twin (add) became add_
        pass

    def region(self, name, ms):  # a tt.record_function block ended
        pass



# FLOPs of an op from its output and inputs, forward pass; backward does one such
# product per input that gets a gradient (dA = g B^T and dB = A^T g for a matmul).
# Ops of nn.py and transformer.py are counted by their names (linear, conv2d, attention).
def _matmul_flops(out, parents):
    a = parents[0]
    return 2 * out.array.size * (a.shape[-1] if a.ndim else 1)  # multiply and add per k


FLOPS = {
    'matmul': _matmul_flops,
    'linear': lambda out, parents: 2 * out.array.size * parents[1].shape[1],  # x @ W^T
    'conv2d': lambda out, parents: 2 * out.array.size * parents[1].array[0].size,  # per pixel
    'causal_attention': lambda out, parents: 4 * out.array.size * out.shape[1],  # QK^T, PV
}
# backward FLOPs / forward FLOPs where it is not the count above
BACKWARD_FLOPS_FACTOR = {'causal_attention': 2}


def _kept_bytes(node, seen):
    """Bytes an op keeps alive for backward: its output, if it is in the graph, and the
    arrays its rule captured (masks, probabilities, copies). A memory block is counted
    once, for the first op that holds it (`seen`: the blocks counted so far, by id)."""
    blocks = {}
    # a view's memory is its input's, counted there (or, for a leaf's, held by no op). The
    # hook runs before the view is marked (_view), so the memory itself says it.
    owner = node.array if node.array.base is None else node.array.base
    of_an_input = any(owner is p.array or owner is p.array.base for p in node._parents)
    arrays = [node.array] if node.requires_grad and not of_an_input else []
    for cell in getattr(node._backward, '__closure__', None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, np.ndarray):
            arrays.append(v)
    for a in arrays:
        base = a if a.base is None else a.base
        counted = seen.get(id(base))
        if isinstance(base, np.ndarray) and (counted is None or counted() is not base):
            blocks[id(base)] = base
    # weak references: a freed block's id may be reused by a new one
    seen.update((i, weakref.ref(b)) for i, b in blocks.items())
    return sum(b.nbytes for b in blocks.values())


class profile(_Hook):
    """Where the time, the FLOPs and the memory of a block go, per op:

        with lookinside.profile() as prof:
            loss = model(x, y)[1]; loss.backward(); optimizer.step()
        print(prof)

    An op's forward time runs from the end of the previous event (op, rule, or a
    record_function block such as the optimizer's step) to the end of this op, so it
    includes the Python that prepared it; each backward rule is timed on its own. The
    row "(outside ops)" is the rest of the block, so the rows add up to prof.total_ms,
    the wall time of the block. "kept" is what each op holds for backward (its output
    and the arrays its rule captured); prof.peak_kept_bytes is the most held at once.
    """

    def __init__(self):
        self.rows = {}  # op -> {'calls', 'forward_ms', 'backward_ms', 'flops', 'out_bytes', 'kept_bytes'}
        self.total_ms = 0.0
        self.kept, self.peak_kept_bytes, self.peak_by_op = 0, 0, {}
        self._held = {}  # id(rule) -> (op, bytes) still held for backward
        self._seen = {}  # id -> weak reference of each memory block counted so far
        self._last_op = None
        self._rule_starts = []

    def _row(self, op):
        if op not in self.rows:
            self.rows[op] = dict(calls=0, forward_ms=0.0, backward_ms=0.0, flops=0,
                                 out_bytes=0, kept_bytes=0)
        return self.rows[op]

    def __enter__(self):
        self._start = self._last = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.total_ms = (time.perf_counter() - self._start) * 1000

    def op(self, out, op, parents):
        now = time.perf_counter()
        row = self._row(op)
        this = dict(calls=1, forward_ms=(now - self._last) * 1000, out_bytes=out.array.nbytes,
                    flops=FLOPS[op](out, parents) if op in FLOPS else 0, kept_bytes=0)
        if out.requires_grad:
            this['kept_bytes'] = kept = _kept_bytes(out, self._seen)
            self._held[id(out._backward)] = (op, kept)  # the rule moves with the history
            self.kept += kept
            if self.kept > self.peak_kept_bytes:
                self.peak_kept_bytes = self.kept
                self.peak_by_op = self._by_op()
        for key, value in this.items():
            row[key] += value
        self._last_op = (op, this)  # an in-place op renames it (renamed, above)
        self._last = time.perf_counter()  # the bookkeeping above is not the next op's time

    def renamed(self, node, op):
        """The op just counted as node._op is the in-place op (add as add_): move it."""
        last, old = self._last_op, node._op
        if last is None or last[0] != old:
            return
        src, row = self.rows[old], self._row(op)
        for key, value in last[1].items():
            src[key] -= value
            row[key] += value
        if not src['calls']:
            del self.rows[old]
        key = id(node._backward)
        if key in self._held:
            self._held[key] = (op, self._held[key][1])
        self._last_op = None

    def _by_op(self):
        by_op = {}
        for op, kept in self._held.values():
            by_op[op] = by_op.get(op, 0) + kept
        return by_op

    def rule_start(self, node):
        self._rule_starts.append(time.perf_counter())  # a stack: a checkpoint's rule runs rules

    def rule_end(self, node, grads):
        now = time.perf_counter()
        row = self._row(node._op)
        row['backward_ms'] += (now - self._rule_starts.pop()) * 1000
        if node._op in FLOPS:
            n = BACKWARD_FLOPS_FACTOR.get(node._op) or sum(
                1 for p, pg in zip(node._parents, grads) if pg is not None and p.ndim >= 2)
            row['flops'] += n * FLOPS[node._op](node, node._parents)  # bias gradients: sums
        op_kept = self._held.pop(id(node._backward), None)
        if op_kept is not None:  # backward is done with it: freed
            self.kept -= op_kept[1]
        self._last = now

    def region(self, name, ms):
        row = self._row(name)
        row['calls'] += 1
        row['forward_ms'] += ms
        self._last = time.perf_counter()

    @property
    def outside_ms(self):
        return self.total_ms - sum(r['forward_ms'] + r['backward_ms']
                                            for r in self.rows.values())

    @property
    def flops(self):
        return sum(r['flops'] for r in self.rows.values())

    def table(self, row_limit=None):
        """One row per op name (the row_limit slowest, or all), slowest first; the totals."""
        ms = lambda r: r['forward_ms'] + r['backward_ms']  # noqa: E731
        lines = [f"{'op':<20} {'calls':>6} {'fwd ms':>8} {'bwd ms':>8} {'total ms':>9} "
                 f"{'share':>6} {'GFLOP':>7} {'out MB':>7} {'kept MB':>8}"]
        total = self.total_ms or 1.0
        for op, r in sorted(self.rows.items(), key=lambda kv: -ms(kv[1]))[:row_limit]:
            lines.append(f"{op:<20} {r['calls']:>6} {r['forward_ms']:>8.2f} "
                         f"{r['backward_ms']:>8.2f} {ms(r):>9.2f} {ms(r) / total:>6.1%} "
                         f"{r['flops'] / 1e9:>7.3f} {r['out_bytes'] / 1e6:>7.2f} "
                         f"{r['kept_bytes'] / 1e6:>8.2f}")
        lines.append(f"{'(outside ops)':<20} {'':>6} {'':>8} {'':>8} {self.outside_ms:>9.2f} "
                     f"{self.outside_ms / total:>6.1%}")
        lines.append(f"{'total':<20} {'':>6} {'':>8} {'':>8} {self.total_ms:>9.2f} {1:>6.0%} "
                     f"{self.flops / 1e9:>7.3f}")
        rate = self.flops / (self.total_ms / 1000) / 1e9 if self.total_ms else 0.0
        top = sorted(self.peak_by_op.items(), key=lambda kv: -kv[1])[:4]
        held = ', '.join(f"{op} {b / 1e6:.1f} MB" for op, b in top)
        lines.append(f"{self.flops / 1e9:.3f} GFLOP in {self.total_ms:.1f} ms: {rate:.1f} GFLOP/s; "
                     f"peak held for backward {self.peak_kept_bytes / 1e6:.1f} MB"
                     + (f" ({held})" if held else ""))
        return '\n'.join(lines)

    __str__ = table


class torch_profile(profile):
    """torch.profiler.profile as a PyTorch program calls it (tinytorch.profiler.profile):

        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function('model_inference'):
                model(x)
        print(prof.key_averages().table(sort_by='cpu_time_total', row_limit=10))

    It is lookinside.profile: one row per tinytorch op and record_function block, timed
    over the whole block. schedule, record_shapes, profile_memory, with_stack, with_flops
    and the rest are accepted (memory and FLOPs are always counted; there is no schedule:
    step() does nothing); on_trace_ready is called once, at the end of the block. A CUDA
    activity is dropped with a warning, as PyTorch does without a GPU; a trace file is
    refused in one line."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, **options):
        super().__init__()
        if any(getattr(a, 'name', a) != 'CPU' for a in activities or ()):
            warnings.warn("torch.profiler.profile: tinytorch profiles the CPU only (there is "
                          "no GPU here); the other activities are dropped", stacklevel=2)
        self.on_trace_ready = on_trace_ready

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def start(self):
        self.__enter__()

    def stop(self):
        self.__exit__(None, None, None)

    def step(self):
        """PyTorch's schedule moves on here; tinytorch's profile covers the whole block."""

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        """The rows by op name (they are averaged already): .table(...) prints them."""
        return _KeyAverages(self)

    def export_chrome_trace(self, path):
        raise RuntimeError("torch.profiler: tinytorch's profiler writes no trace file; print "
                           "prof.key_averages().table() instead")


class _KeyAverages:
    def __init__(self, prof):
        self.prof = prof

    def table(self, sort_by=None, row_limit=100, **options):
        """The profile's table (sorted by total time whatever sort_by says), row_limit ops."""
        return self.prof.table(row_limit=None if row_limit < 0 else row_limit)

    __str__ = table


class memory(_Hook):
    """What one training step keeps for backward, per module, and the step's peak:

        with lookinside.memory(model) as mem:
            loss = model(x, y)[1]
            loss.backward()
        print(mem)

    Every op made in the step is charged to the innermost module whose forward was running
    (the ops of GPT.forward itself to the model, '(model)'; ops outside the model to
    '(outside)'); what it keeps is profile's "kept" (its output if the graph holds it, and
    the arrays its rule captured, each memory block counted once). "kept" is what the
    forward pass leaves for backward; "recomputed" what backward makes again (activation
    checkpointing). peak_bytes is the most held for backward at once: it grows as the
    forward pass runs and falls as each rule runs and frees what its op kept. The
    parameters and their gradients come on top (param_bytes each)."""

    def __init__(self, model):
        self.model = model
        self.kept, self.recomputed = {}, {}  # module name -> bytes (its own ops only)
        self.held = self.peak_bytes = 0
        self.param_bytes = sum(p.array.nbytes for p in model.parameters())
        self._held = {}  # id(rule) -> bytes still held
        self._seen = {}  # id -> weak reference of each memory block counted so far
        self._names = ['(outside)']  # the modules whose forward runs now, innermost last
        self._backward = False  # True from the first rule on

    def __enter__(self):
        self._own = []  # (module, its own forward attribute or None): put back at the end
        for name, m in self.model.named_modules():
            self._own.append((m, m.__dict__.get('forward')))
            object.__setattr__(m, 'forward', self._charged(name or '(model)', m.forward))
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        for m, own in self._own:
            if own is None:
                del m.__dict__['forward']  # the class's forward again
            else:
                object.__setattr__(m, 'forward', own)

    def _charged(self, name, forward):
        def charged(*args, **kwargs):
            self._names.append(name)
            try:
                return forward(*args, **kwargs)
            finally:
                self._names.pop()
        return charged

    def op(self, out, op, parents):
        if not out.requires_grad:
            return
        kept = _kept_bytes(out, self._seen)
        table = self.recomputed if self._backward else self.kept
        table[self._names[-1]] = table.get(self._names[-1], 0) + kept
        self._held[id(out._backward)] = (kept, self._names[-1])
        self.held += kept
        self.peak_bytes = max(self.peak_bytes, self.held)

    def rule_start(self, node):
        self._backward = True
        # what a rule computes (a checkpoint's recomputation) is charged to the op's module
        self._names.append(self._held.get(id(node._backward), (0, self._names[-1]))[1])

    def rule_end(self, node, grads):
        self._names.pop()
        self.held -= self._held.pop(id(node._backward), (0, None))[0]  # freed by backward

    @property
    def kept_bytes(self):
        return sum(self.kept.values())

    def totals(self, depth=None):
        """module name -> (kept, recomputed) of its own ops and those of the modules under
        it, for the modules at most `depth` dots deep (None: all)."""
        out = {}
        for name, _ in self.model.named_modules():
            name = name or '(model)'
            if depth is not None and name.count('.') >= depth:
                continue
            inside = lambda n: n == name or name == '(model)' or n.startswith(name + '.')  # noqa: E731
            out[name] = (sum(b for n, b in self.kept.items() if inside(n) and n != '(outside)'),
                         sum(b for n, b in self.recomputed.items() if inside(n) and n != '(outside)'))
        return out

    def table(self, depth=2):
        types = {name or '(model)': type(m).__name__ for name, m in self.model.named_modules()}
        rows = [(n, types[n], k, r) for n, (k, r) in self.totals(depth).items() if k or r]
        if self.kept.get('(outside)') or self.recomputed.get('(outside)'):
            rows.append(('(outside)', '', self.kept.get('(outside)', 0),
                         self.recomputed.get('(outside)', 0)))
        width = max([len(r[0]) for r in rows] + [6])
        lines = [f"{'module':<{width}}  {'type':<20} {'kept MB':>9} {'recomputed MB':>14}"]
        lines += [f"{n:<{width}}  {t:<20} {k / 1e6:>9.3f} {r / 1e6:>14.3f}" for n, t, k, r in rows]
        lines.append(f"kept for backward {self.kept_bytes / 1e6:.3f} MB; peak held "
                     f"{self.peak_bytes / 1e6:.3f} MB; parameters {self.param_bytes / 1e6:.3f} MB "
                     f"(and as much for their gradients)")
        return '\n'.join(lines)

    __str__ = table


def memory_growth(step_for, values, name='block size', path=None):
    """How a step's memory grows with one setting: step_for(v) returns (model, step) for the
    setting v, step() runs one forward and backward; each runs under `memory`. Returns a
    table (kept for backward, peak held, and the peak relative to the first value's); with
    `path` (a .png) and matplotlib installed, also a plot of both against the setting."""
    rows = []
    for v in values:
        model, step = step_for(v)
        with memory(model) as mem:
            step()
        rows.append((v, mem.kept_bytes, mem.peak_bytes))
    lines = [f"{name:>12} {'kept MB':>10} {'peak MB':>10} {'peak x':>7}"]
    lines += [f"{v!s:>12} {k / 1e6:>10.2f} {p / 1e6:>10.2f} {p / rows[0][2]:>7.2f}"
              for v, k, p in rows]
    if path is not None:
        try:
            import matplotlib
            matplotlib.use('Agg')
            import matplotlib.pyplot as plt
        except ImportError:
            lines.append("(no plot: matplotlib is not installed)")
        else:
            fig, ax = plt.subplots(figsize=(5, 3.5))
            ax.plot([r[0] for r in rows], [r[2] / 1e6 for r in rows], 'o-', label='peak held')
            ax.plot([r[0] for r in rows], [r[1] / 1e6 for r in rows], 's--', label='kept after forward')
            ax.set_xlabel(name), ax.set_ylabel('MB'), ax.legend()
            fig.tight_layout()
            fig.savefig(path)
            plt.close(fig)
    return '\n'.join(lines)


class AnomalyError(RuntimeError):
    pass


_LIBRARY = ('tinytorch.py', 'nn.py', 'optim.py', 'transformer.py', 'data.py', 'lookinside.py')


def _user_line():
    """Where an op was called: the innermost line outside this file, tinytorch.py and nn.py (a
    model's forward), and, if that is in the library (transformer.py), the user's line
    that called it."""
    stack = list(reversed(traceback.extract_stack()))
    name = lambda f: os.path.basename(f.filename)  # noqa: E731
    text = lambda f: f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"  # noqa: E731
    model = next((f for f in stack if name(f) not in ('tinytorch.py', 'nn.py', 'lookinside.py')),
                 None)
    if model is None:
        return "(unknown)"
    if name(model) not in _LIBRARY:
        return text(model)
    user = next((f for f in stack if name(f) not in _LIBRARY), None)
    return text(model) + ("" if user is None else f", called from {text(user)}")


class detect_anomaly(_Hook):
    """Find where a NaN was born. Forward: the first op whose output holds a NaN raises,
    naming the op, its inputs' shapes and the line of your code that called it
    (infinities alone are allowed: masks use -inf). Backward: the first rule that returns
    a NaN or infinite gradient raises, naming the op, the input, and the line that made
    the op in the forward pass. Off by default; slow when on (it checks every array)."""

    def __init__(self):
        self._made_at = weakref.WeakKeyDictionary()  # an op's rule -> where the op was made

    def op(self, out, op, parents):
        where = _user_line()
        if out.requires_grad:
            self._made_at[out._backward] = where  # the rule moves with an in-place rewrite
        if out.array.dtype.kind == 'f' and np.isnan(out.array).any():
            shapes = ', '.join(str(tuple(p.shape)) for p in parents)
            raise AnomalyError(f"detect_anomaly: '{op}' returned NaN in its output "
                               f"{tuple(out.shape)} (inputs {shapes}), at {where}")

    def rule_end(self, node, grads):
        for i, (p, pg) in enumerate(zip(node._parents, grads)):
            if pg is not None and np.issubdtype(np.asarray(pg).dtype, np.floating) and \
                    not np.isfinite(pg).all():
                kind = 'NaN' if np.isnan(pg).any() else 'an infinite value'
                raise AnomalyError(
                    f"detect_anomaly: the backward rule of '{node._op}' returned {kind} in the "
                    f"gradient of its input {i} (shape {tuple(p.shape)}); the op was made at "
                    f"{self._made_at.get(node._backward, '(before detect_anomaly was on)')}")


# ---------------------------------------------------------------------------
# 3. Logging a run: SummaryWriter
# ---------------------------------------------------------------------------
class SummaryWriter:
    """torch.utils.tensorboard's SummaryWriter for PyTorch programs run on tinytorch (the
    import rule maps tinytorch.utils.tensorboard here). It writes each scalar as a row
    (wall_time, tag, step, value) of log_dir/scalars.csv, a file any spreadsheet or
    pandas reads; TensorBoard's own event files need the tensorboard package. The other
    add_* methods (images, histograms, graphs) are accepted and write nothing."""

    def __init__(self, log_dir=None, comment='', purge_step=None, max_queue=10, flush_secs=120,
                 filename_suffix=''):
        if log_dir is None:
            stamp = time.strftime('%b%d_%H-%M-%S')
            log_dir = os.path.join('runs', f"{stamp}_{platform.node()}{comment}")
        self.log_dir = str(log_dir)
        os.makedirs(self.log_dir, exist_ok=True)
        self.path = os.path.join(self.log_dir, f'scalars{filename_suffix}.csv')
        is_new = not os.path.exists(self.path)
        self._file = open(self.path, 'a', newline='')
        self._rows = csv.writer(self._file)
        if is_new:
            self._rows.writerow(['wall_time', 'tag', 'step', 'value'])
        warnings.warn(f"SummaryWriter: tinytorch writes the scalars to {self.path} (CSV), not "
                      "TensorBoard event files", stacklevel=2)

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None, new_style=False,
                   double_precision=False):
        value = scalar_value.item() if isinstance(scalar_value, tt.Tensor) else float(scalar_value)
        self._rows.writerow([walltime or time.time(), tag, global_step, value])

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None):
        for tag, value in tag_scalar_dict.items():
            self.add_scalar(f'{main_tag}/{tag}', value, global_step, walltime)

    def _nothing(self, *args, **kwargs):
        pass

    add_histogram = add_image = add_images = add_figure = add_text = add_graph = \
        add_embedding = add_hparams = _nothing

    def flush(self):
        self._file.flush()

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class StopRequest:
    """Ctrl-C in a training loop: the first asks the loop to stop after the current step
    (it checks .requested, then saves and reports); a second stops at once. restore()
    gives SIGINT back its previous handler (train_charlm.py and train_digits.py use it)."""

    def __init__(self):
        self.requested = False
        self.previous = signal.signal(signal.SIGINT, self.handler)

    def handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGINT, self.previous)


# ---------------------------------------------------------------------------
# 4. A model's size: summary
# ---------------------------------------------------------------------------
def summary(model):
    """A table of every module in `model` (its name in the state_dict, its class, the
    parameters under it, a shared one counted once) and the total. print(model) prints
    the tree as PyTorch prints it, without counts; PyTorch has no such table built in
    (the torchinfo package's summary is the usual one).

        module   type        params
        (model)  Sequential       9
        0        Linear           9
        1        Tanh             0
        9 parameters (9 trainable), 36 bytes
    """
    rows = [(name or '(model)', type(m).__name__, f"{m.num_parameters():,}")
            for name, m in model.named_modules()]
    widths = [max(len(r[i]) for r in rows + [('module', 'type', 'params')]) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}"
             for a, b, c in [('module', 'type', 'params')] + rows]
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    size = sum(p.array.nbytes for p in params)
    lines.append(f"{total:,} parameters ({trainable:,} trainable), {size:,} bytes")
    return '\n'.join(lines)
