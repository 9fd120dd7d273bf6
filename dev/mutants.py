"""dev/mutants.py: plant one bug at a time in a copy of the project and see whether the tests
catch it (a mutation run). Nothing imports this file; it is a tool for whoever writes tests.

    python dev/mutants.py               # every row: plant, run its tests (-k), caught or survived
    python dev/mutants.py --full        # each row against the whole suite instead (slow)
    python dev/mutants.py bce tune      # only the rows whose name contains one of these words
    python dev/mutants.py --list        # the rows, and whether each snippet still matches
    python dev/mutants.py -j 2          # two rows at a time (each in its own copy)

Each row of MUTANTS is one plausible bug: a file, an exact snippet of today's code, what
it becomes, the tests that should catch it (a pytest -k expression; `and not pytorch` is
added: the run is a learner's, without PyTorch, which is hidden from the tests even where
it is installed), and a description. A row whose snippet no longer occurs exactly once in
its file is reported as STALE (the code moved or changed: update the row), never skipped in
silence. A row's test run ends at the first failure (-x); a run that passes is a survivor:
add a test that pins the value the bug changes, or say why the bug is harmless.

To add a row: copy the snippet from the code (a line of a function body's logic, with enough
of it to be unique), write the bug as someone might really write it, and name the tests.
The exit status is 0 when every row is caught, 1 otherwise.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project, above dev/
Mutant = namedtuple('Mutant', 'name file old new tests why')

# The loader's tests (the training scripts' checkpoint tests take minutes: left out).
LOADER_TESTS = ' or '.join([
    'test_save_and_load_refuse_pickled_code_unless_asked',
    'test_save_load_nested_and_atomic',
    'test_a_crash_in_the_middle_of_a_save_leaves_the_old_checkpoint_alone',
    'test_truncated_or_foreign_checkpoint_gives_clear_error',
    'test_checkpoint_never_unpickles',
    'test_a_file_that_is_not_a_checkpoint_says_so_without_numpys_pickle_advice',
    'test_checkpoints_follow_the_umask_like_every_other_file',
    'test_safetensors_round_trip_of_every_dtype',
    'test_safetensors_reads_bfloat16_and_refuses_broken_files',
    'test_load_refuses_every_global_outside_the_exact_allow_list',
    'test_load_checks_every_tensor_against_its_storage',
    'test_load_refuses_sizes_before_reading_them',
    'test_load_says_in_one_line_what_is_wrong_with_a_plain_bad_file',
    'test_nn_load_says_in_one_line_what_is_wrong_with_a_bad_file',
    'test_a_save_killed_midway_leaves_the_old_file_or_the_new_one',
    'test_hostile_files_of_every_class_are_refused_in_one_line_in_a_child',
    'test_a_memo_index_of_200_million_costs_nothing',
    'test_a_tensor_one_element_past_its_storage_is_refused',
    'test_weights_only_none_is_the_safe_default',
    'test_nn_load_refuses_names_two_keys_map_to_and_members_that_are_not_arrays',
    'test_safetensors_headers_each_malformed_field_in_one_line',
    'test_saves_change_no_umask_keep_others_temporaries_and_take_long_names',
    'test_ctrl_c_during_a_save_leaves_no_temporary',
    'test_saves_killed_one_after_another_leave_at_most_one_temporary',
    'test_two_processes_saving_one_path_both_finish_with_one_whole_file',
    'test_tt_save_writes_the_zip_format_torch_reads_and_round_trips_every_value',
    'test_load_checks_crcs_depth_and_the_bytes_arrays_take',
    'test_load_normalises_bools_reads_big_endian_and_refuses_odd_tensors',
    'test_tinytorch_alone_saves_and_loads_and_a_parameter_without_nn_is_a_tensor_that_requires_grad',
    'test_loader_fuzzer_finds_nothing_in_300_mutants',
    'test_load_refuses_a_numpy_global_that_is_not_a_dtype',
    'test_load_a_torch_save_zip_whose_tensors_share_one_storage_at_offsets',
])

MUTANTS = [
    # -- issue 49's own five: the bugs that passed the suite in the last wave ---------------
    Mutant('bmm-batch-1', 'tinytorch.py',
           "if dims == 3 and input.shape[0] != other.shape[0]:",
           "if dims == 3 and input.shape[0] != other.shape[0] and 1 not in (input.shape[0], other.shape[0]):",
           'bmm', "bmm lets a batch of 1 broadcast against a batch of 4"),
    Mutant('bce-weight-ignored', 'nn.py',
           "return binary_cross_entropy(input, target, self.weight, reduction=self.reduction)",
           "return binary_cross_entropy(input, target, None, reduction=self.reduction)",
           'bce or binary_cross_entropy or census_layers', "nn.BCELoss(weight=w) ignores its weight"),
    Mutant('conv-transpose-output-padding-top-left', 'nn.py',
           "x = pad(x, (qw, qw + opw, qh, qh + oph))",
           "x = pad(x, (qw + opw, qw, qh + oph, qh))",
           'conv_transpose or census_layers', "conv_transpose2d's output_padding on the top/left"),
    Mutant('assert-close-float32-swapped', 'tinytorch.py',
           "float32: (1.3e-6, 1e-5)", "float32: (1e-5, 1.3e-6)",
           'assert_close or testing', "testing.assert_close's float32 rtol and atol swapped"),
    Mutant('tune-share-not-enabled', 'tinytorch.py',
           "    _sharing = tuning if 'share_cores' in done else None",
           "    _sharing = None",
           'tune', "tt.tune() says 'share_cores' but leaves core sharing off"),

    # -- tinytorch.py Part I: the engine ----------------------------------------------------
    Mutant('unbroadcast-axis-without-lead', 'tinytorch.py',
           "lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)",
           "i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)",
           'unbroadcast or broadcasting or part_one', "unbroadcast sums the wrong axis of a (k, 1) operand under added dims"),
    Mutant('sub-rule-sign', 'tinytorch.py',
           "unbroadcast(-g, sb) if b.requires_grad else None)",
           "unbroadcast(g, sb) if b.requires_grad else None)",
           'binary_ops or part_one or micrograd', "sub's rule gives b the gradient +g"),
    Mutant('div-rule-b-squared', 'tinytorch.py',
           "unbroadcast(-g * a.array / (b.array * b.array), sb)",
           "unbroadcast(-g * a.array / b.array, sb)",
           'binary_ops or part_one or micrograd', "div's rule for b forgets a factor 1/b"),
    Mutant('mean-rule-without-1-over-n', 'tinytorch.py',
           "return (_expand_back(g / n, xs, axes, keepdim),)",
           "return (_expand_back(g, xs, axes, keepdim),)",
           'reductions or part_one', "mean's rule passes g instead of g / n"),
    Mutant('dim-range-off-by-one', 'tinytorch.py',
           "if not -n <= d < n:", "if not -n <= d <= n:",
           'dim or error_messages or shape_ops', "_dim accepts dim == ndim (wraps it to 0)"),
    Mutant('dims-repeated-accepted', 'tinytorch.py',
           "if len(set(axes)) != len(axes):", "if len(set(axes)) > len(axes):",
           'dim or reductions', "a reduction over dim (1, 1) is not refused"),
    Mutant('implicit-gradient-of-empty', 'tinytorch.py',
           "if tensor.array.size != 1:\n            raise RuntimeError(f\"backward: grad can be created",
           "if tensor.array.size > 1:\n            raise RuntimeError(f\"backward: grad can be created",
           'implicit_gradient or backward', "backward() of an empty tensor starts from ones instead of refusing"),
    Mutant('accumulate-overwrites', 'tinytorch.py',
           "        t._grad.array += g\n", "        t._grad.array[...] = g\n",
           'accumulate or twice or part_one', "a second backward overwrites .grad instead of adding"),
    Mutant('matmul-1d-left-row-copied-predicate', 'tinytorch.py',
           "G = G[..., None, :] if x.ndim == 1 else G",
           "G = G[..., None, :] if y.ndim == 1 else G",
           'matmul or part_one', "matmul's rule tests b.ndim for a's lost dim (copied from the line above)"),
    Mutant('matmul-dtypes-by-kind', 'tinytorch.py',
           "if t.array.dtype != t0.array.dtype:\n            raise RuntimeError(f\"{op}: {name0} is",
           "if t.array.dtype.kind != t0.array.dtype.kind:\n            raise RuntimeError(f\"{op}: {name0} is",
           'mixed_dtypes or refuse_mixed or matmul', "matmul lets float32 meet float64"),
    Mutant('numpy-scalar-loses-dtype', 'tinytorch.py',
           "if isinstance(data, (np.ndarray, np.generic)):  # NumPy data keeps its dtype",
           "if isinstance(data, np.ndarray):  # NumPy data keeps its dtype",
           'creation or dtype', "tensor(np.float64(1.5)) becomes float32 (PyTorch keeps float64)"),
    Mutant('tensor-aliases-callers-array', 'tinytorch.py',
           "            arr = np.copy(arr)  # like torch.tensor", "            arr = arr  # like torch.tensor",
           'creation or copies or tensor_attributes or part_one', "tt.tensor(a) shares a's memory"),
    Mutant('pow-minus-half-not-rsqrt', 'tinytorch.py',
           "np.sqrt(x) if p == 0.5 else 1 / np.sqrt(x) if p == -0.5 else x ** p",
           "np.sqrt(x) if p == 0.5 else x ** p",
           'pow or power', "x ** -0.5 by NumPy's pow: (-0.0) ** -0.5 is inf, not -inf"),
    Mutant('grad-mode-exit-enables', 'tinytorch.py',
           "        _grad_enabled = self._prev\n        return False",
           "        _grad_enabled = True\n        return False",
           'no_grad or grad_enabled', "leaving a nested no_grad turns grad mode on"),
    Mutant('walk-frees-with-retain-graph', 'tinytorch.py',
           "            if not retain_graph:  # drop what the rule holds",
           "            if retain_graph:  # drop what the rule holds",
           'retain_graph or backward', "backward frees the graph exactly when asked to keep it"),

    # -- section 7: type promotion ----------------------------------------------------------
    Mutant('promote-types-lower-category', 'tinytorch.py',
           "return type1 if c1 > c2 else type2", "return type1 if c1 < c2 else type2",
           'promot or dtype', "promote_types picks the lower category"),
    Mutant('numpy-bool-scalar-refused', 'tinytorch.py',
           "if isinstance(x, (float, np.floating, np.bool_)):\n        return default_dtype",
           "if isinstance(x, (float, np.floating)):\n        return default_dtype",
           'promot or numpy_scalar or numpy_bool or dtype', "a NumPy bool scalar operand is refused"),
    Mutant('result-type-0d-as-dims', 'tinytorch.py',
           "tier, dt = (0 if x.ndim else 1), x.dtype", "tier, dt = 0, x.dtype",
           'promot or dtype', "a 0-d tensor ranks with the tensors that have dims"),
    Mutant('result-type-lower-tier-same-category', 'tinytorch.py',
           "_CATEGORY[dt.kind] > _CATEGORY[result.kind]):", "_CATEGORY[dt.kind] >= _CATEGORY[result.kind]):",
           'promot or dtype', "a 0-d int64 widens an int32 tensor (same category, lower tier)"),
    Mutant('int-div-int-stays-int', 'tinytorch.py',
           "if dtype == b.array.dtype and (not floating or dtype.kind == 'f'):",
           "if dtype == b.array.dtype:",
           'promot or dtype or float32 or div', "int / int skips the float promotion (float64 out of NumPy)"),
    Mutant('add-alpha-scales-before-cast', 'tinytorch.py',
           "return _as(a, dtype), _as(b, dtype) * alpha  # cast, then scale",
           "return _as(a, dtype), _as(b * alpha, dtype)  # cast, then scale",
           'alpha', "add(a, b, alpha) scales b before the cast (int32 overflow)"),
    Mutant('int-negative-power-parity', 'tinytorch.py',
           "np.where(b % 2 == 0, 1, -1)", "np.where(b % 2 == 0, -1, 1)",
           'pow or power or integer', "(-1) ** -n gets the wrong sign by n's parity"),
    Mutant('pow-int-exponent-minus-1-after-cast', 'tinytorch.py',
           "below = (b.array - 1).astype(a.dtype)", "below = b.array.astype(a.dtype) - 1",
           'pow', "pow's rule takes b - 1 in the base's float dtype"),

    # -- section 8: the version counter -----------------------------------------------------
    Mutant('saved-version-check-never-fires', 'tinytorch.py',
           "        if counter[0] != version:", "        if counter[0] < version:",
           'version or guarded or in_place', "backward never sees an in-place change of a saved tensor"),
    Mutant('only-first-saved-guarded', 'tinytorch.py',
           "    for t in saved:\n        records.append((t._vc, t._vc[0], t.array.shape))",
           "    for t in saved[:1]:\n        records.append((t._vc, t._vc[0], t.array.shape))",
           'version or guarded or in_place', "only the first saved tensor of a rule is guarded"),

    # -- section 13: in-place history -------------------------------------------------------
    Mutant('as-read-by-one-step', 'tinytorch.py',
           "    while p._seq >= node._seq:\n        p = p._older",
           "    if p._seq >= node._seq:\n        p = p._older",
           'in_place or old_value or view', "an input changed in place twice is read at the wrong version"),
    Mutant('view-of-leaf-check-copied', 'tinytorch.py',
           "if info is not None and info[0].requires_grad and info[0].is_leaf:",
           "if info is not None and x.requires_grad and x.is_leaf:",
           'leaf', "a view of a leaf that requires grad may be changed in place"),
    Mutant('in-place-without-bump', 'tinytorch.py',
           "    _bump(x)\n    if result.requires_grad:\n        for hook in _hooks:",
           "    if result.requires_grad:\n        for hook in _hooks:",
           'version or guarded or in_place', "an in-place op does not bump the version counter"),
    Mutant('copy-slices-region-keeps-base-grad', 'tinytorch.py',
           "        gv = region.copy()\n        region[...] = 0",
           "        gv = region.copy()",
           'view or in_place_through', "a write through a view still sends the old base gradient in its region"),
    Mutant('setitem-written-keeps-gradient', 'tinytorch.py',
           "        at(gx)[i] = 0  # written over", "        pass  # written over",
           'setitem', "x[idx] = v still sends gradient to the overwritten values"),
    Mutant('setitem-every-repeated-write-counts', 'tinytorch.py',
           "    return owner[idx] == slots", "    return owner[idx] >= slots",
           'setitem', "x[[0, 0]] = v gives both writes the gradient, not only the last"),
    Mutant('fill-keeps-old-gradient', 'tinytorch.py',
           "        return np.zeros_like(g), g.sum().astype(g.dtype).reshape(())",
           "        return g, g.sum().astype(g.dtype).reshape(())",
           'fill or in_place', "fill_'s rule sends gradient to the forgotten values"),
    Mutant('pow-in-place-keeps-no-copy', 'tinytorch.py',
           "old, e = _keep_old(x, exponent, x.requires_grad or _requires_grad(exponent))",
           "old, e = _keep_old(x, exponent, _requires_grad(exponent))",
           'in_place', "x.pow_(2) on a graph tensor keeps no copy of x (backward refuses)"),

    # -- section 18 / 18b and compat.py: what PyTorch programs reach for ----------------------------------
    Mutant('to-copy-ignored', 'tinytorch.py',
           "return clone(out) if copy and out is self else out", "return out",
           'devices or torch_style', "x.to(x.dtype, copy=True) returns x itself"),
    Mutant('inference-mode-builds-graph', 'tinytorch.py',
           "        self.enabled = not mode", "        self.enabled = mode",
           'inference or gpu_program or grad_enabled', "torch.inference_mode() builds the graph"),
    Mutant('companion-from-anywhere', 'tinytorch.py',
           "if spec is not None and _same_file(spec.origin, path):",
           "if spec is not None:",
           'import_rule or companion', "a learner's own data.py becomes tinytorch.utils.data"),
    Mutant('grad-scaler-step-skipped', 'amp.py',
           "result = None if state['found_inf'] else optimizer.step(*args, **kwargs)",
           "result = None",
           'gpu_program or scaler or torch_style or amp', "GradScaler.step() does not step"),
    Mutant('autocast-swallows-errors', 'amp.py',
           "        tt._autocast_dtype = self._prev\n        return False",
           "        tt._autocast_dtype = self._prev\n        return True",
           'gpu_program or autocast or torch_style', "an error inside `with autocast():` vanishes"),
    Mutant('set-grad-enabled-decorator-leaks', 'tinytorch.py',
           "        _grad_enabled = self._prev  # decorating changes nothing now",
           "        pass  # decorating changes nothing now",
           'set_grad_enabled', "@set_grad_enabled(False) switches grad off at decoration time"),
    Mutant('equal-nan-equals-nan', 'tinytorch.py',
           "bool(np.array_equal(input.array, other.array))",
           "bool(np.array_equal(input.array, other.array, equal_nan=True))",
           'equal_ravel or census_tensor', "torch.equal says nan equals nan"),
    Mutant('random-float-range-halved', 'tinytorch.py',
           "from_, to = 0, (2 ** (np.finfo(x.dtype).nmant + 1) + 1 if x.dtype.kind == 'f'",
           "from_, to = 0, (2 ** np.finfo(x.dtype).nmant + 1 if x.dtype.kind == 'f'",
           'random or census or review_fixes', "x.random_() draws from [0, 2^23] for float32 (PyTorch: 2^24)"),
    Mutant('bincount-float32-weights-to-float64', 'tinytorch.py',
           "(w.dtype if w.dtype == float32 else float64)", "float64",
           'bincount or census', "bincount with float32 weights returns float64"),
    Mutant('resize-of-a-strided-tensor', 'tinytorch.py',
           "if math.prod(shape) != x.numel() or not x.array.flags.c_contiguous:",
           "if math.prod(shape) != x.numel():",
           'resize or census', "resize_ of a transposed tensor reshapes a copy silently"),
    Mutant('addcdiv-divides-the-other-way', 'tinytorch.py',
           "return x.add_(tensor1 / tensor2 * value)", "return x.add_(tensor2 / tensor1 * value)",
           'census or addc', "addcdiv_ adds value * tensor2 / tensor1"),
    Mutant('assert-close-one-tolerance-accepted', 'tinytorch.py',
           "if (rtol is None) != (atol is None):", "if rtol is None and atol is not None:",
           'assert_close or testing', "assert_close(rtol=...) without atol is not refused"),
    Mutant('type-by-module-name', 'tinytorch.py',
           "name = dtype.rsplit('.', 1)[-1]", "name = dtype.rsplit('.', 1)[0]",
           'census or legacy', "x.type('torch.LongTensor') looks up 'torch'"),

    # -- tuning.py and section 20: tuning and threads ----------------------------------------------------------------
    Mutant('mallopt-thresholds-swapped', 'tuning.py',
           "M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3", "M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -3, -1",
           'tune', "tune_malloc sets each threshold to the other's value"),
    Mutant('cores-to-use-none', 'tuning.py',
           "return max(1, cores - others)", "return max(0, cores - others)",
           'cores or share', "a busy machine leaves tinytorch no core"),
    Mutant('share-drops-after-one-look', 'tuning.py',
           "if max(want, seen) < _cores_free:", "if want < _cores_free:",
           'share_cores or parallel_for', "one look at a busy machine lowers the threads"),
    Mutant('num-threads-zero-from-env', 'tinytorch.py',
           "if os.environ.get(var, '').isdigit() and int(os.environ[var]) > 0:",
           "if os.environ.get(var, '').isdigit() and int(os.environ[var]) >= 0:",
           'thread or tune', "OMP_NUM_THREADS=0 gives zero threads"),
    Mutant('set-num-threads-zero', 'tinytorch.py',
           "if int(n) < 1:\n        raise ValueError(f\"set_num_threads",
           "if int(n) < 0:\n        raise ValueError(f\"set_num_threads",
           'threads or parallel', "set_num_threads(0) is accepted"),
    Mutant('parallel-for-last-range-lost', 'tinytorch.py',
           "bounds = [n * i // k for i in range(k + 1)]", "bounds = [n * i // k for i in range(k)]",
           'parallel_for or threaded', "parallel_for never runs its last range"),

    # -- nn.py: the census layers and losses --------------------------------------------
    Mutant('adaptive-pool-floor-end', 'nn.py',
           "bins = [(i * size // o, -(-(i + 1) * size // o)) for i in range(o)]",
           "bins = [(i * size // o, (i + 1) * size // o) for i in range(o)]",
           'adaptive or census_layers', "adaptive_avg_pool2d's bins end at floor, not ceil"),
    Mutant('instance-norm-eps', 'nn.py',
           "                  use_input_stats=True, momentum=0.1, eps=1e-5):",
           "                  use_input_stats=True, momentum=0.1, eps=1e-3):",
           'instance or census_layers', "instance_norm's eps default 1e-3"),
    Mutant('dropout2d-one-mask-per-sample', 'nn.py',
           "mask = dropout_mask(input.shape[:2] + (1,) * (input.ndim - 2), p, input.dtype)",
           "mask = dropout_mask(input.shape[:1] + (1,) * (input.ndim - 1), p, input.dtype)",
           'dropout2d or census_layers', "dropout2d drops whole samples instead of channels"),
    Mutant('lazy-linear-reads-batch-dim', 'nn.py',
           "            self.in_features = x.shape[-1]", "            self.in_features = x.shape[0]",
           'lazy or census_layers', "LazyLinear takes in_features from the batch size"),
    Mutant('pad-sequence-left-ignored', 'nn.py',
           "if padding_side == 'right' else (longest - s.shape[0], 0)",
           "if padding_side == 'right' else (0, longest - s.shape[0])",
           'pad_sequence or census_layers', "pad_sequence(padding_side='left') pads on the right"),
    Mutant('bce-rule-sign', 'nn.py',
           "gp = g * (p - y) / np.maximum(p * (1 - p), 1e-12)",
           "gp = g * (y - p) / np.maximum(p * (1 - p), 1e-12)",
           'bce or binary_cross_entropy or census_layers', "binary_cross_entropy's gradient has the wrong sign"),
    Mutant('conv1d-pads-height', 'nn.py',
           "pad = (0, padding[0] if isinstance(padding, (tuple, list)) else padding)",
           "pad = (padding[0] if isinstance(padding, (tuple, list)) else padding, 0)",
           'conv1d or census_layers', "conv1d pads the height of its 1-row image, not the length"),

    # -- optim.py -------------------------------------------------------------------------
    Mutant('rmsprop-centered-plus', 'optim.py',
           "avg = np.sqrt(v - mean * mean) + eps", "avg = np.sqrt(v + mean * mean) + eps",
           'rmsprop', "centered RMSprop adds the squared mean instead of subtracting it"),
    Mutant('adagrad-lr-decay-off-by-one', 'optim.py',
           "lr_t = group['lr'] / (1 + (state['step'] - 1) * group['lr_decay'])",
           "lr_t = group['lr'] / (1 + state['step'] * group['lr_decay'])",
           'adagrad', "Adagrad's lr decay starts one step early"),
    Mutant('adadelta-rho-zero-refused', 'optim.py',
           "if not 0.0 <= rho <= 1.0:", "if not 0.0 < rho <= 1.0:",
           'adadelta or nonsense', "Adadelta refuses rho=0 (PyTorch allows [0, 1])"),
    Mutant('betas-one-accepted', 'optim.py',
           "if not 0.0 <= betas[i] < 1.0:", "if not 0.0 <= betas[i] <= 1.0:",
           'nonsense or adam', "Adam accepts beta = 1.0 (PyTorch refuses it)"),
    Mutant('param-in-two-groups', 'optim.py',
           "                any(id(p) in seen for p in group['params']):",
           "                False:",
           'param_group or nonsense or optimizer_errors', "add_param_group accepts a parameter already in a group"),
    Mutant('maximize-ignored', 'optim.py',
           "                            g = -g  # maximize", "                            g = g  # maximize",
           'maximize', "maximize=True descends"),
    Mutant('multistep-at-milestone', 'optim.py',
           "bisect.bisect_right(self.milestones, t)", "bisect.bisect_left(self.milestones, t)",
           'schedul and not charlm', "MultiStepLR changes the lr one step after each milestone"),
    Mutant('linear-lr-past-total-iters', 'optim.py',
           "progress = min(self.total_iters, t) / self.total_iters",
           "progress = t / self.total_iters",
           'schedul and not charlm', "LinearLR keeps changing after total_iters"),
    Mutant('onecycle-phase-end', 'optim.py',
           "up = float(pct_start * total_steps) - 1", "up = float(pct_start * total_steps)",
           '(one_cycle or schedul) and not charlm', "OneCycleLR's peak one step late"),
    Mutant('optimizer-state-keeps-saved-dtype', 'optim.py',
           "self.state[p] = {k: (v.astype(p.dtype) if isinstance(v, np.ndarray) else v)",
           "self.state[p] = {k: (v if isinstance(v, np.ndarray) else v)",
           'optimizer_errors or exact_resume or optimizer_skips or state_dict', "load_state_dict keeps float64 moments for a float32 model"),
    Mutant('sgd-dampening-inverted', 'optim.py',
           "buf += (1 - group['dampening']) * g", "buf += group['dampening'] * g",
           'sgd', "SGD's dampening multiplies by dampening instead of 1 - dampening"),

    # -- data.py ----------------------------------------------------------------------------
    Mutant('random-split-remainder-from-last', 'data.py',
           "counts[k % len(counts)] += 1", "counts[-1 - k % len(counts)] += 1",
           'random_split', "random_split hands the remainder out from the last length"),
    Mutant('random-sampler-drops-the-rest', 'data.py',
           "            yield from rng.permutation(n)[:self.num_samples % n].tolist()\n",
           "",
           'sampler', "RandomSampler(num_samples > len) drops the last partial permutation"),
    Mutant('batch-sampler-len-swapped', 'data.py',
           "return n // batch_size if drop_last else math.ceil(n / batch_size)",
           "return math.ceil(n / batch_size) if drop_last else n // batch_size",
           'sampler or data_loader', "len(BatchSampler) counts the short batch only when dropped"),
    Mutant('sampler-with-shuffle-accepted', 'data.py',
           "if sampler is not None and shuffle:", "if sampler is not None and shuffle is None:",
           'data_loader or sampler', "DataLoader(sampler=..., shuffle=True) is not refused"),
    Mutant('collate-floats-to-float32', 'data.py',
           "return tt.tensor(batch, dtype=tt.float64)", "return tt.tensor(batch, dtype=tt.float32)",
           'collate', "default_collate makes Python floats float32 (PyTorch: float64)"),
    Mutant('convert-keeps-tuples', 'data.py',
           "    if isinstance(data, tuple):\n        return [default_convert(d) for d in data]",
           "    if isinstance(data, tuple):\n        return tuple(default_convert(d) for d in data)",
           'collate or convert or data_loader', "default_convert keeps a tuple (PyTorch makes it a list)"),
    Mutant('tensor-dataset-sizes-unchecked', 'data.py',
           "if len(set(sizes)) != 1:", "if len(set(sizes)) > 2:",
           'dataset or data_edge or data_loader', "TensorDataset of 3 and 4 rows is accepted"),

    # -- lookinside.py ----------------------------------------------------------------------
    Mutant('grad-path-first-rule-line', 'lookinside.py',
           "words = lines[i] if len(lines) > 1 else lines[0]", "words = lines[0]",
           'grad_path', "grad_path states input 0's rule for every input"),
    Mutant('kept-bytes-counts-views', 'lookinside.py',
           "arrays = [node.array] if node.requires_grad and not of_an_input else []",
           "arrays = [node.array] if node.requires_grad else []",
           'profile and not charlm', "profile counts a view's memory again (it is its input's)"),
    Mutant('kept-bytes-view-of-a-view', 'lookinside.py',
           "owner is p.array or owner is p.array.base for p in node._parents",
           "owner is p.array for p in node._parents",
           'profile and not charlm', "profile counts a view of a view (x.reshape(..).t()) as new memory"),
    Mutant('profile-keeps-empty-row', 'lookinside.py',
           "        if not src['calls']:\n            del self.rows[old]",
           "        if not src['calls']:\n            pass",
           'profile and not charlm', "profile keeps an empty 'add' row after add_ took its call"),
    Mutant('anomaly-lets-inf-gradients-pass', 'lookinside.py',
           "not np.isfinite(pg).all():", "np.isnan(pg).any():",
           'anomaly', "detect_anomaly misses an infinite gradient"),
    Mutant('summary-counts-frozen-as-trainable', 'lookinside.py',
           "trainable = sum(p.numel() for p in params if p.requires_grad)",
           "trainable = sum(p.numel() for p in params)",
           'summary or print_model', "summary counts frozen parameters as trainable"),
    Mutant('summary-writer-header-on-every-open', 'lookinside.py',
           "        if is_new:\n            self._rows.writerow", "        if True:\n            self._rows.writerow",
           'summary_writer', "a SummaryWriter reopening a log writes its header again"),
    Mutant('matmul-flops-without-add', 'lookinside.py',
           "return 2 * out.array.size * (a.shape[-1] if a.ndim else 1)",
           "return out.array.size * (a.shape[-1] if a.ndim else 1)",
           'flops', "profile counts a matmul's multiplies but not its adds"),
    Mutant('draw-graph-cap-off-by-one', 'lookinside.py',
           "    order = order[:max_nodes]  # the nodes nearest the output",
           "    order = order[:max_nodes - 1]  # the nodes nearest the output",
           'draw_graph', "draw_graph draws one node fewer than max_nodes"),

    # -- the loader (tinytorch.py section 19, files.py): planted by its author, each caught
    #    by a test of the 'Loading files from others' section
    Mutant('loader-bounds-check-off-by-one-a-tensor-one-ele', 'tinytorch.py',
           '        if last >= n or offset > n:',
           '        if last > n or offset > n:',
           LOADER_TESTS, 'bounds check off by one: a tensor one element past its storage loads'),
    Mutant('loader-weights-only-none-read-as-unsafe-false', 'tinytorch.py',
           '    trusted = weights_only is not None and not weights_only',
           '    trusted = not weights_only',
           LOADER_TESTS, 'weights_only=None read as unsafe (False)'),
    Mutant('loader-a-ctrl-c-during-a-save-leaves-its-tempor', 'tinytorch.py',
           '        if tmp is not None and os.path.exists(tmp):\n            os.remove(tmp)',
           '        if tmp is not None and os.path.exists(tmp) and False:\n            os.remove(tmp)',
           LOADER_TESTS, 'a Ctrl-C during a save leaves its temporary'),
    Mutant('loader-duplicate-zip-member-names-accepted-the', 'tinytorch.py',
           '            if m.name in self.members:',
           '            if m.name in self.members and False:',
           LOADER_TESTS, 'duplicate zip member names accepted (the last wins)'),
    Mutant('loader-overlapping-zip-members-accepted', 'tinytorch.py',
           '            if m.header < last:',
           '            if m.header < last - 4096:',
           LOADER_TESTS, 'overlapping zip members accepted'),
    Mutant('loader-a-zip-member-s-crc-not-checked', 'tinytorch.py',
           '        if crc != m.crc:',
           '        if crc != m.crc and m.method:',
           LOADER_TESTS, "a zip member's CRC not checked"),
    Mutant('loader-inflation-not-bounded-by-the-declared-si', 'tinytorch.py',
           'chunk = inflate.decompress(pending, m.size - got + 1)',
           'chunk = inflate.decompress(pending)',
           LOADER_TESTS, 'inflation not bounded by the declared size'),
    Mutant('loader-a-storage-member-larger-than-its-tensors', 'tinytorch.py',
           '        if m.size != numel * dtype.itemsize:',
           '        if m.size < numel * dtype.itemsize:',
           LOADER_TESTS, 'a storage member larger than its tensors declare accepted'),
    Mutant('loader-int-dict-keys-of-any-size-hash-collision', 'tinytorch.py',
           '(t is int and -_INT_KEY < k < _INT_KEY)',
           '(t is int)',
           LOADER_TESTS, 'int dict keys of any size (hash collisions: quadratic)'),
    Mutant('loader-a-dict-key-given-twice-the-last-wins', 'tinytorch.py',
           '            if _key(k) in d:',
           '            if _key(k) in d and False:',
           LOADER_TESTS, 'a dict key given twice: the last wins'),
    Mutant('loader-nesting-depth-limit-1000x-too-high', 'tinytorch.py',
           '            if h > _MAX_DEPTH:',
           '            if h > 1000 * _MAX_DEPTH:',
           LOADER_TESTS, 'nesting depth limit 1000x too high'),
    Mutant('loader-bytes-of-arrays-not-counted-against-the', 'tinytorch.py',
           '    if made[0] > made[1]:',
           '    if made[0] > 1000 * made[1]:',
           LOADER_TESTS, "bytes of arrays not counted against the pickle's size"),
    Mutant('loader-bool-bytes-not-normalised-to-0-1', 'tinytorch.py',
           "    if a.dtype == np.bool_:\n        return np.array(a.view(np.uint8) != 0, order='C')",
           "    if a.dtype == np.bool_ and False:\n        return np.array(a.view(np.uint8) != 0, order='C')",
           LOADER_TESTS, 'bool bytes not normalised to 0/1'),
    Mutant('loader-a-big-endian-array-read-as-native', 'tinytorch.py',
           "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big']) else",
           "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big'], '>') else",
           LOADER_TESTS, 'a big-endian array read as native'),
    Mutant('loader-save-writes-fortran-strides-for-c-order', 'tinytorch.py',
           'math.prod(a.shape[i + 1:]) for i in range(a.ndim)',
           'math.prod(a.shape[:i]) for i in range(a.ndim)',
           LOADER_TESTS, 'save writes Fortran strides for C-order bytes'),
    Mutant('loader-a-parameter-saved-with-requires-grad-fal', 'tinytorch.py',
           '            self.write(bool(t.requires_grad))\n',
           '            self.write(False)\n',
           LOADER_TESTS, 'a Parameter saved with requires_grad False'),
    Mutant('loader-an-integer-tensor-may-require-grad', 'tinytorch.py',
           "    if requires_grad and array.dtype.kind not in 'fc':",
           "    if requires_grad and array.dtype.kind not in 'fciu':",
           LOADER_TESTS, 'an integer tensor may require grad'),
    Mutant('loader-backward-hooks-in-a-file-accepted', 'tinytorch.py',
           '    if not (type(h) in (dict, _OrderedDict) and not h):',
           '    if not (type(h) in (dict, _OrderedDict)):',
           LOADER_TESTS, 'backward hooks in a file accepted'),
    Mutant('loader-a-save-s-temporary-made-with-mode-0600-t', 'tinytorch.py',
           "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o666)",
           "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o600)",
           LOADER_TESTS, "a save's temporary made with mode 0600 (the umask ignored)"),
    Mutant('loader-a-save-removes-every-temporary-named-aft', 'tinytorch.py',
           "    ours = re.compile(re.escape(start) + r'[0-9a-f]{8}\\.tmp')",
           "    ours = re.compile(re.escape(f'.{base[:40]}.') + r'.*\\.tmp')",
           LOADER_TESTS, "a save removes every temporary named after its file (a user's too)"),
    Mutant('loader-a-save-removes-temporaries-that-a-runnin', 'tinytorch.py',
           '        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        os.remove(tmp)',
           '        os.remove(tmp)',
           LOADER_TESTS, 'a save removes temporaries that a running save holds'),
    Mutant('loader-a-dotted-global-resolved-by-its-first-pa', 'tinytorch.py',
           '        make = _MAKERS.get((module, name))\n        if make is None:',
           "        make = _MAKERS.get((module, name.split('.')[0]))\n        if make is None:",
           LOADER_TESTS, 'a dotted global resolved by its first part'),
    Mutant('loader-truncation-read-as-a-short-opcode', 'tinytorch.py',
           '        if n > len(self.data) - self.at:',
           '        if n > len(self.data) - self.at + 8:',
           LOADER_TESTS, 'truncation read as a short opcode'),
    Mutant('loader-bytes-after-the-pickle-s-end-accepted', 'tinytorch.py',
           '                if self.at != len(self.data):',
           '                if self.at > len(self.data):',
           LOADER_TESTS, "bytes after the pickle's end accepted"),
    Mutant('loader-an-unbuilt-numpy-box-used-as-a-value', 'tinytorch.py',
           '            if v.value is None:\n                _fail(f"uses a NumPy {v.kind} before its BUILD',
           '            if v.value is None and False:\n                _fail(f"uses a NumPy {v.kind} before its BUILD',
           LOADER_TESTS, 'an unbuilt NumPy box used as a value'),
    Mutant('loader-a-numpy-array-built-twice', 'tinytorch.py',
           '        if type(obj) is _Box and obj.value is None:',
           '        if type(obj) is _Box:',
           LOADER_TESTS, 'a NumPy array built twice'),
    Mutant('loader-safetensors-overlapping-tensors-accepted', 'files.py',
           '        if begin != at:',
           '        if begin > at:',
           LOADER_TESTS, 'safetensors: overlapping tensors accepted'),
    Mutant('loader-safetensors-a-bool-accepted-as-a-count', 'files.py',
           'all(type(n) is int and 0 <= n < 1 << 62 for n in v)',
           'all(isinstance(n, int) and 0 <= n < 1 << 62 for n in v)',
           LOADER_TESTS, 'safetensors: a bool accepted as a count'),
    Mutant('loader-safetensors-metadata-values-not-checked', 'files.py',
           '    if type(metadata) is not dict or not all(type(v) is str for v in metadata.values()):',
           '    if type(metadata) is not dict:',
           LOADER_TESTS, 'safetensors: __metadata__ values not checked'),
    Mutant('loader-npz-a1-and-a01-both-read-as-array-1', 'files.py',
           "        if not re.fullmatch(r'a(0|[1-9][0-9]{0,8})', k):",
           "        if not re.fullmatch(r'a[0-9]{1,9}', k):",
           LOADER_TESTS, 'npz: a1 and a01 both read as array 1'),
    Mutant('loader-npz-an-npy-header-s-size-not-checked-aga', 'files.py',
           '    if len(shape) > 64 or start + size + need != m.size:',
           '    if len(shape) > 64 or start + size + need > m.size + 8:',
           LOADER_TESTS, "npz: an .npy header's size not checked against its member"),
    # -- Blind planter, issue 57 (2026-12-03): rows written from the code and docs alone
    #    (before reading test_tinytorch.py), each confirmed by hand to change behaviour, in
    #    what the wave since 3f7c65b changed: nn.py's new parameters and reprs, printing and
    #    grad_fn names, device predicates, the import finder, compat.py's module paths,
    #    optim.py / amp.py signatures and learn.py's from-scratch checks ------------------
    #    Measured before any test was written for them (2026-12-03, without PyTorch): the suite
    #    caught 33 of these 57; the 24 survivors each got a value test, and all 57 are caught.
    Mutant('blind-embedding-padding-idx-minus-n-refused', 'nn.py',
           '    if not -n <= padding_idx < n:',
           '    if not -n < padding_idx < n:',
           'embedding', "padding_idx=-num_embeddings (the first row, PyTorch's) refused"),
    Mutant('blind-embedding-padding-idx-kept-negative', 'nn.py',
           '    return padding_idx % n\n',
           '    return padding_idx\n',
           'embedding or modules_print', 'padding_idx=-1 kept as -1 (PyTorch stores and prints the row number)'),
    Mutant('blind-embedding-padding-row-0-not-zeroed', 'nn.py',
           "            if self.padding_idx is not None:  # PyTorch's: the padding row starts at 0",
           "            if self.padding_idx:  # PyTorch's: the padding row starts at 0",
           'embedding', 'padding_idx=0: row 0 not zeroed at construction (0 is falsy)'),
    Mutant('blind-embedding-padding-row-gets-gradient', 'nn.py',
           '    if padding_idx is None and not scale_grad_by_freq:',
           '    if not scale_grad_by_freq:',
           'embedding', 'the padding row gets a gradient (the fast path taken whenever no freq scaling)'),
    Mutant('blind-embedding-max-norm-ignores-norm-type', 'nn.py',
           '        norm = np.linalg.norm(w, ord=norm_type, axis=1) if norm_type != 2 else \\',
           '        norm = np.linalg.norm(w, axis=1) if norm_type != 2 else \\',
           'embedding', 'max_norm measured with the 2-norm whatever norm_type says'),
    Mutant('blind-embedding-module-drops-scale-grad-by-freq', 'nn.py',
           '        return embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,\n                         self.scale_grad_by_freq, self.sparse)',
           '        return embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,\n                         False, self.sparse)',
           'embedding', 'Embedding(scale_grad_by_freq=True) forgets it in forward'),
    Mutant('blind-conv-out-channels-not-checked-against-groups', 'nn.py',
           '        if groups < 1 or in_channels % groups or out_channels % groups:',
           '        if groups < 1 or in_channels % groups:',
           'conv', 'Conv2d(4, 6, groups=4) accepted at construction (fails later, deep inside)'),
    Mutant('blind-conv-transpose-groups-weight-shape', 'nn.py',
           '        shape = ((in_channels, out_channels // groups) if self.transposed',
           '        shape = ((in_channels // groups, out_channels) if self.transposed',
           'conv', "ConvTranspose2d with groups: weight shaped as a Conv2d's"),
    Mutant('blind-conv-padding-mode-pads-in-wrong-dim-order', 'nn.py',
           '        return pad(x, [a for pair in reversed(pads) for a in pair], mode=self.padding_mode), 0',
           '        return pad(x, [a for pair in pads for a in pair], mode=self.padding_mode), 0',
           'conv or pad', "padding_mode='reflect' with padding (1, 2): F.pad amounts given first dim first"),
    Mutant('blind-maxpool-ceil-mode-window-in-right-padding-kept', 'nn.py',
           '        if (out - 1) * s >= size + p:  # the last window would start in the right padding',
           '        if (out - 1) * s > size + p:  # the last window would start in the right padding',
           'pool', 'ceil_mode keeps a window that starts in the right padding'),
    Mutant('blind-maxpool-indices-last-on-ties', 'nn.py',
           '                bigger = part > best\n',
           '                bigger = part >= best\n',
           'pool', 'return_indices names the last maximum on ties, not the first'),
    Mutant('blind-maxpool-indices-ignore-padding-offset', 'nn.py',
           '                (np.arange(ow)[None] * sw + j * dw - pw)',
           '                (np.arange(ow)[None] * sw + j * dw)',
           'pool', 'return_indices with padding: the column counted in the padded plane'),
    Mutant('blind-maxpool1d-module-swaps-ceil-and-indices', 'nn.py',
           '        return max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation,\n                          self.ceil_mode, self.return_indices)',
           '        return max_pool1d(x, self.kernel_size, self.stride, self.padding, self.dilation,\n                          self.return_indices, self.ceil_mode)',
           'pool', "MaxPool1d passes ceil_mode and return_indices in each other's place"),
    Mutant('blind-avgpool-divisor-override-ignored-on-the-plain-path', 'nn.py',
           '    if not ceil_mode and count_include_pad and divisor_override is None:',
           '    if not ceil_mode and count_include_pad:',
           'pool', 'divisor_override ignored unless ceil_mode or count_include_pad=False'),
    Mutant('blind-avgpool-count-exclude-pad-covers-the-wrong-corner', 'nn.py',
           '        covered[..., ph:ph + h, pw:pw + w] = 1',
           '        covered[..., :h, :w] = 1',
           'pool', 'count_include_pad=False counts the top-left h x w of the padded plane'),
    Mutant('blind-avgpool-ceil-window-counts-past-the-padding', 'nn.py',
           '        covered[..., :h + 2 * ph, :w + 2 * pw] = 1',
           '        covered[...] = 1',
           'pool', 'ceil_mode: the last partial window divides by the full kernel area'),
    Mutant('blind-bce-pos-weight-off-by-one', 'nn.py',
           '    return (1 - target) * input + (1 + (pos_weight - 1) * target) * neg_log_sigmoid',
           '    return (1 - target) * input + (1 + pos_weight * target) * neg_log_sigmoid',
           'bce or binary_cross or pos_weight', 'pos_weight: the positive term weighed 1 + pos_weight'),
    Mutant('blind-bce-pos-weight-softplus-overflows', 'nn.py',
           '    neg_log_sigmoid = (-input).clamp(min=0) + (-input.abs()).exp().log1p()',
           '    neg_log_sigmoid = (-input).clamp(min=0) + (-input).exp().log1p()',
           'bce or binary_cross or pos_weight', 'pos_weight: -log sigma(x) as max(-x,0) + log1p(exp(-x)) (wrong for x < 0)'),
    Mutant('blind-legacy-reduce-true-sums', 'nn.py',
           "    return 'sum' if size_average is False else 'mean'",
           "    return 'mean' if size_average else 'sum'",
           'loss or reduction or legacy', "size_average=None, reduce=True read as 'sum' (PyTorch: 'mean')"),
    Mutant('blind-legacy-reduce-none-read-as-false', 'nn.py',
           "    if reduce is False:\n        return 'none'",
           "    if not reduce:\n        return 'none'",
           'loss or reduction or legacy', "size_average=False, reduce=None read as 'none' (PyTorch: 'sum')"),
    Mutant('blind-inplace-silu-reads-its-overwritten-input', 'nn.py',
           '    old = input.clone() if input.requires_grad and tt.is_grad_enabled() else input',
           '    old = input',
           'inplace or in_place or silu or activation', 'inplace=True: the rule reads the input it overwrote'),
    Mutant('blind-relu6-ignores-inplace', 'nn.py',
           '    return hardtanh(input, 0.0, 6.0, inplace)',
           '    return hardtanh(input, 0.0, 6.0)',
           'relu6 or hardtanh or inplace or in_place or activation', 'relu6(inplace=True) leaves its input unchanged'),
    Mutant('blind-repr-maxpool-drops-ceil-mode', 'nn.py',
           '                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")',
           '                f"dilation={self.dilation}")',
           'print or repr', "MaxPool2d's repr without ceil_mode (PyTorch prints it)"),
    Mutant('blind-repr-leaky-relu-always-shows-inplace', 'nn.py',
           '        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")',
           '        return f"negative_slope={self.negative_slope}, inplace={self.inplace}"',
           'print or repr', 'LeakyReLU prints inplace=False (PyTorch shows it only when set)'),
    Mutant('blind-repr-dropout-hides-inplace', 'nn.py',
           '        return f"p={self.p}, inplace={self.inplace}"',
           '        return f"p={self.p}"',
           'print or repr', "Dropout's repr without inplace (PyTorch: p=0.5, inplace=False)"),
    Mutant('blind-repr-conv-always-shows-groups', 'nn.py',
           '        if self.groups != 1:\n            s += f", groups={self.groups}"',
           '        if self.groups:\n            s += f", groups={self.groups}"',
           'print or repr', 'Conv2d prints groups=1'),
    Mutant('blind-repr-tensor-nonleaf-also-says-requires-grad', 'tinytorch.py',
           "        elif self.requires_grad:\n            extra.append('requires_grad=True')",
           "        if self.requires_grad:\n            extra.append('requires_grad=True')",
           'print or repr or grad_fn', 'a result prints grad_fn= and requires_grad=True both'),
    Mutant('blind-grad-fn-clamp-variant-0', 'tinytorch.py',
           "                  'clamp': 'ClampBackward1', 'layer_norm': 'NativeLayerNormBackward0',",
           "                  'clamp': 'ClampBackward0', 'layer_norm': 'NativeLayerNormBackward0',",
           'grad_fn or print', 'clamp(min, max) named ClampBackward0 (PyTorch: ClampBackward1, its scalar variant)'),
    Mutant('blind-grad-fn-sum-variants-swapped', 'tinytorch.py',
           "        return op.capitalize() + ('Backward0' if full else 'Backward1')",
           "        return op.capitalize() + ('Backward1' if full else 'Backward0')",
           'grad_fn or print', 'sum() is SumBackward1, sum(dim) SumBackward0 (swapped)'),
    Mutant('blind-grad-fn-max-variants-swapped', 'tinytorch.py',
           "        return op.capitalize() + ('Backward1' if full else 'Backward0')",
           "        return op.capitalize() + ('Backward0' if full else 'Backward1')",
           'grad_fn or print', 'max() is MaxBackward0 (PyTorch: MaxBackward1)'),
    Mutant('blind-grad-fn-mv-dims-reversed', 'tinytorch.py',
           "        return {(1, 1): 'DotBackward0', (2, 1): 'MvBackward0',",
           "        return {(1, 1): 'DotBackward0', (1, 2): 'MvBackward0',",
           'grad_fn or print', 'matrix @ vector named MatmulBackward0, vector @ matrix MvBackward0'),
    Mutant('blind-summary-format-from-every-element', 'tinytorch.py',
           "    shown = _shown(a, o['edgeitems']) if a.size > threshold else a",
           '    shown = a',
           'summar or print', "a summarised tensor's format chosen from the hidden elements too"),
    Mutant('blind-summary-per-line-forgets-the-separator', 'tinytorch.py',
           '        per_line = builtins.max(1, (width - indent) // (w + 2))',
           '        per_line = builtins.max(1, (width - indent) // w)',
           'summar or print', "a summarised row fits elements per line without their ', '"),
    Mutant('blind-size-repr-as-tuple', 'tinytorch.py',
           "        return f'torch.Size({list(self)})'",
           "        return f'torch.Size({tuple(self)})'",
           'print or size or shape', 'torch.Size((2, 3)) instead of torch.Size([2, 3])'),
    Mutant('blind-device-is-cpu-false', 'tinytorch.py',
           '_methods(to=_to, device=property(lambda self: _CPU), is_cpu=property(lambda self: True),',
           '_methods(to=_to, device=property(lambda self: _CPU), is_cpu=_never,',
           'device', 'x.is_cpu is False'),
    Mutant('blind-device-cpu-copies', 'tinytorch.py',
           "         cpu=lambda self: self, cuda=lambda self, *args, **kwargs: _cpu_only('cuda', 'cuda()'),",
           "         cpu=lambda self: self.clone(), cuda=lambda self, *args, **kwargs: _cpu_only('cuda', 'cuda()'),",
           'device', 'x.cpu() a copy (PyTorch: x itself on the CPU)'),
    Mutant('blind-index-of-a-float-tensor', 'tinytorch.py',
           '         __index__=lambda self: operator.index(self.item()),  # a 0-d int tensor slices a list',
           '         __index__=lambda self: int(self.item()),  # a 0-d int tensor slices a list',
           'index', 'a 0-d float tensor accepted as a list index'),
    Mutant('blind-device-repr-index', 'tinytorch.py',
           "        more = '' if self.index is None else f', index={self.index}'",
           "        more = '' if self.index is None else f', {self.index}'",
           'device', "device('cuda:1') repr without index="),
    Mutant('blind-finder-added-again-on-reload', 'tinytorch.py',
           "if not builtins.any(getattr(f, '__qualname__', '') == '_Submodules' and f.__module__ == __name__\n                    for f in sys.meta_path):",
           'if _Submodules not in sys.meta_path:',
           'finder or import', 'reloading tinytorch adds a second finder'),
    Mutant('blind-finder-answers-for-lookalike-names', 'tinytorch.py',
           "        if not fullname.startswith(__name__ + '.'):\n            return None  # not a name of ours: Python asks the next finder",
           '        if not fullname.startswith(__name__):\n            return None  # not a name of ours: Python asks the next finder',
           'finder or import', 'importing tinytorch_extras (not ours) loads compat.py'),
    Mutant('blind-compat-cudnn-allow-tf32-false', 'compat.py',
           '        allow_tf32=True, benchmark=False, benchmark_limit=10, deterministic=False, enabled=True,',
           '        allow_tf32=False, benchmark=False, benchmark_limit=10, deterministic=False, enabled=True,',
           'backend_flags or gpu', 'torch.backends.cudnn.allow_tf32 False (PyTorch: True)'),
    Mutant('blind-compat-cudnn-disabled', 'compat.py',
           'deterministic=False, enabled=True,\n',
           'deterministic=False, enabled=False,\n',
           'backend_flags or gpu', 'torch.backends.cudnn.enabled False (PyTorch: True)'),
    Mutant('blind-compat-sdp-disabled', 'compat.py',
           "        is_built=lambda: False, **{f'{n}_sdp_enabled': (lambda: True) for n in (",
           "        is_built=lambda: False, **{f'{n}_sdp_enabled': (lambda: False) for n in (",
           'backend_flags or gpu', 'torch.backends.cuda.flash_sdp_enabled() False (PyTorch: True)'),
    Mutant('blind-compat-matmul-tf32-true', 'compat.py',
           '        matmul=types.SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,',
           '        matmul=types.SimpleNamespace(allow_tf32=True, allow_fp16_reduced_precision_reduction=True,',
           'backend_flags or gpu', 'torch.backends.cuda.matmul.allow_tf32 True (PyTorch: False)'),
    Mutant('blind-compat-optim-lbfgs-path-missing', 'compat.py',
           "        'adadelta adagrad adam adamax adamw asgd lbfgs nadam optimizer radam rmsprop rprop sgd '",
           "        'adadelta adagrad adam adamax adamw asgd nadam optimizer radam rmsprop rprop sgd '",
           'gpu or module_path or submodule or import', 'import torch.optim.lbfgs fails'),
    Mutant('blind-compat-lacking-child-message-without-tinytorch-has-no', 'compat.py',
           '            return "tinytorch has no " + why if not why.startswith(\'tinytorch\') else why',
           '            return why',
           'submodule', "a lacking child's message loses 'tinytorch has no'"),
    Mutant('blind-optim-vector-to-parameters-copies', 'optim.py',
           "        p.data = vec[start:start + n].reshape(p.shape).detach()  # a view of vec, as PyTorch's",
           "        p.data = vec[start:start + n].reshape(p.shape).detach().clone()  # a view of vec, as PyTorch's",
           'vector or clip or optim', "vector_to_parameters copies (PyTorch: the parameters share vec's memory)"),
    Mutant('blind-optim-parameters-to-vector-outside-the-graph', 'optim.py',
           '    return tt.cat([p.reshape(-1) for p in parameters])',
           '    return tt.cat([p.detach().reshape(-1) for p in parameters])',
           'vector or clip or optim', 'parameters_to_vector outside the graph (no gradient reaches the parameters)'),
    Mutant('blind-amp-autocast-device-type-defaults-to-cpu', 'amp.py',
           '    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):',
           "    def __init__(self, device_type='cpu', dtype=None, enabled=True, cache_enabled=None):",
           'autocast or gpu', 'torch.autocast() without device_type accepted (PyTorch: TypeError)'),
    Mutant('blind-learn-sc-twice-and-half-swapped', 'learn.py',
           "        how = 'twice' if close(got, 2 * want) else 'half'",
           "        how = 'half' if close(got, 2 * want) else 'twice'",
           'learn_scratch', 'a gradient twice the right one diagnosed as half'),
    Mutant('blind-learn-sc-one-leading-dim-called-several', 'learn.py',
           '    if lead > 1 and not stretched:',
           '    if lead >= 1 and not stretched:',
           'learn_scratch', "one leading dim diagnosed as 'several dims were added'"),
    Mutant('blind-learn-sc-float32-copy-accepted', 'learn.py',
           '    for dtype in (np.float32, np.float64):\n        a = _ro([[1.0, 2.0]], dtype)',
           '    for dtype in (np.float64,):\n        a = _ro([[1.0, 2.0]], dtype)',
           'learn_scratch', 'check 1.1 no longer tries a float32 array (a Tensor that casts it to float64 passes)'),
    Mutant('blind-learn-sc-constant-result-keeps-parents', 'learn.py',
           '    if const.requires_grad or tuple(const.parents or ()) or const.rule is not None:',
           '    if const.requires_grad:',
           'learn_scratch', 'check 1.3 accepts a constant result that keeps parents and rule'),
    Mutant('blind-learn-sc-float32-gradient-for-float64-accepted', 'learn.py',
           '    if got.dtype != dtype:\n        raise Fail(f"{op_name}\'s gradient for {name} is {got.dtype}, but {name} is "',
           '    if got.dtype.kind != np.dtype(dtype).kind:\n        raise Fail(f"{op_name}\'s gradient for {name} is {got.dtype}, but {name} is "',
           'learn_scratch', 'a float32 gradient for a float64 operand accepted'),
    Mutant('blind-learn-sc-same-size-gradient-told-to-unbroadcast', 'learn.py',
           '                       if got.size > int(np.prod(shape)) else',
           '                       if got.size >= int(np.prod(shape)) else',
           'learn_scratch', 'a gradient of the right size in the wrong shape told to unbroadcast'),
    Mutant('blind-learn-sc-read-only-write-not-recognised', 'learn.py',
           "    return isinstance(e, ValueError) and 'read-only' in str(e)",
           "    return isinstance(e, ValueError) and 'read only' in str(e)",
           'learn_scratch', "a write into a handed array no longer named as such (NumPy says 'read-only')"),
    Mutant('blind-learn-sc-as-tensor-makes-float64', 'learn.py',
           '    return Tensor(x if isinstance(x, np.ndarray) else np.asarray(x, dtype=np.float32))',
           '    return Tensor(x if isinstance(x, np.ndarray) else np.asarray(x))',
           'learn_scratch', "the workspace's as_tensor makes a number float64 (x + 2.0 turns float32 into float64)"),
]

_NO_TORCH = "raise ImportError('PyTorch is hidden by mutants.py: the run is without it')\n"
_SKIP = shutil.ignore_patterns('.git', '__pycache__', '.pytest_cache', '.venv', '.benchmarks',
                               'out', 'out_*', 'runs', '*.npz')


def match_count(m, root=ROOT):
    path = os.path.join(root, m.file)
    if not os.path.exists(path):
        return 0
    with open(path, encoding='utf-8') as f:
        return f.read().count(m.old)


def _tree(work):
    """A copy of the project in work/tree, and work/no_torch holding a torch that fails to
    import (put first on PYTHONPATH: pytest.importorskip('torch') then skips)."""
    tree = os.path.join(work, 'tree')
    shutil.copytree(ROOT, tree, ignore=_SKIP)
    os.makedirs(os.path.join(work, 'no_torch', 'torch'))
    with open(os.path.join(work, 'no_torch', 'torch', '__init__.py'), 'w') as f:
        f.write(_NO_TORCH)
    return tree


def _pytest(tree, work, selection, timeout):
    env = {k: v for k, v in os.environ.items() if k != 'TINYTORCH_REQUIRE_TORCH'}
    env['PYTHONPATH'] = os.pathsep.join(p for p in (os.path.join(work, 'no_torch'),
                                                    env.get('PYTHONPATH')) if p)
    env['PYTHONDONTWRITEBYTECODE'] = '1'  # a planted file never meets a stale .pyc
    cmd = [sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider',
           'test_tinytorch.py']
    if selection:
        cmd += ['-k', selection]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return 'timeout', ''
    tail = (r.stdout + r.stderr).strip().splitlines()
    return r.returncode, tail[-1] if tail else ''


def run_row(m, tree, work, full, timeout):
    """Plant m in tree, run its tests, put the file back. Returns (verdict, detail, seconds)."""
    n = match_count(m, tree)
    if n != 1:
        return 'STALE', (f"the snippet occurs {n} times in {m.file}" if n else
                         f"the snippet is no longer in {m.file}"), 0.0
    path = os.path.join(tree, m.file)
    with open(path, encoding='utf-8') as f:
        original = f.read()
    start = time.perf_counter()
    try:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(original.replace(m.old, m.new))
        rc, last = _pytest(tree, work, None if full else f"({m.tests}) and not pytorch", timeout)
    finally:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(original)
    seconds = time.perf_counter() - start
    if rc == 'timeout':
        return 'caught', f"timed out after {timeout} s", seconds
    if rc == 0:
        return 'SURVIVED', last, seconds
    if rc == 1:
        return 'caught', last, seconds
    if rc == 5:
        return 'NO TESTS', f"-k {m.tests!r} selects no test", seconds
    return 'ERROR', f"pytest exit {rc}: {last}", seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('words', nargs='*', help="only the rows whose name contains one of these")
    ap.add_argument('--full', action='store_true', help="run the whole suite for each row")
    ap.add_argument('--list', action='store_true', help="list the rows and whether each matches")
    ap.add_argument('-j', type=int, default=1, help="rows run at a time (default 1)")
    ap.add_argument('--timeout', type=int, default=900, help="seconds a row may take")
    ap.add_argument('--no-baseline', action='store_true',
                    help="skip the first run of every row's tests on the unchanged copy")
    args = ap.parse_args(argv)
    rows = [m for m in MUTANTS if not args.words or any(w in m.name for w in args.words)]
    names = [m.name for m in MUTANTS]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        sys.exit(f"mutants.py: row names must be unique, repeated: {', '.join(dup)}")
    if not rows:
        sys.exit(f"mutants.py: no row's name contains {' or '.join(args.words)}")
    if args.list:
        for k, m in enumerate(rows, 1):
            n = match_count(m)
            state = 'ok' if n == 1 else 'STALE'
            print(f"{k:3} {state:<5} {m.file:<14} {m.name:<42} {m.why}")
        return 0
    with tempfile.TemporaryDirectory(prefix='mutants-') as tmp:
        works = []
        for k in range(max(1, args.j)):
            work = os.path.join(tmp, f'w{k}')
            os.makedirs(work)
            works.append((work, _tree(work)))
        if not args.no_baseline:  # every selection must pass on the unchanged code
            selection = None if args.full else ' or '.join(f"({m.tests})" for m in rows)
            rc, last = _pytest(works[0][1], works[0][0],
                               selection and f"({selection}) and not pytorch", args.timeout * 4)
            if rc != 0:
                print(f"mutants.py: the tests fail on the unchanged code ({last}); fix that first")
                return 1
            print(f"baseline: the selected tests pass on the unchanged code ({last})")
        free, lock = list(works), threading.Lock()
        results = [None] * len(rows)

        def one(k):
            with lock:
                work, tree = free.pop()
            try:
                results[k] = run_row(rows[k], tree, work, args.full, args.timeout)
            finally:
                with lock:
                    free.append((work, tree))
            verdict, detail, seconds = results[k]
            with lock:
                print(f"{k + 1:3} {verdict:<8} {rows[k].file:<14} {rows[k].name:<42} "
                      f"{seconds:5.1f} s  {rows[k].why}" + (f"\n      {detail}" if verdict != 'caught'
                                                             else ''), flush=True)
        with ThreadPoolExecutor(len(works)) as pool:
            list(pool.map(one, range(len(rows))))
    counts = {}
    for verdict, _, _ in results:
        counts[verdict] = counts.get(verdict, 0) + 1
    print(f"\ncaught {counts.get('caught', 0)} of {len(rows)}" + ''.join(
        f"; {v.lower()} {n}" for v, n in sorted(counts.items()) if v != 'caught'))
    for m, (verdict, detail, _) in zip(rows, results):
        if verdict != 'caught':
            print(f"  {verdict}: {m.name} ({m.file}): {m.why}")
    return 0 if counts.get('caught', 0) == len(rows) else 1


if __name__ == '__main__':
    sys.exit(main())
