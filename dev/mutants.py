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
    'test_tinytorch_with_files_saves_and_loads_and_a_parameter_without_nn_is_a_tensor_that_requires_grad',
    'test_budgets_keys_shapes_and_zip_readings_each_class_refused_in_one_line_in_a_child',
    'test_a_fifo_or_link_beside_a_save_or_in_place_of_a_file_is_refused_in_one_line_and_never_blocks',
    'test_a_whole_model_saved_with_save_loads_under_safe_globals_and_trains_on',
    'test_every_reader_has_one_way_out_whatever_numpy_or_python_raise_inside',
    'test_bpe_refuses_a_vocabulary_below_the_bytes_and_a_bad_merges_file',
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
           "pad = padding if isinstance(padding, str) else (0, one(padding)[1])",
           "pad = padding if isinstance(padding, str) else (one(padding)[1], 0)",
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
    Mutant('loader-bounds-check-off-by-one-a-tensor-one-ele', 'files.py',
           '        if last >= n or offset > n:',
           '        if last > n or offset > n:',
           LOADER_TESTS, 'bounds check off by one: a tensor one element past its storage loads'),
    Mutant('loader-weights-only-none-read-as-unsafe-false', 'files.py',
           '    trusted = weights_only is not None and not weights_only',
           '    trusted = not weights_only',
           LOADER_TESTS, 'weights_only=None read as unsafe (False)'),
    Mutant('loader-a-ctrl-c-during-a-save-leaves-its-tempor', 'files.py',
           '        if tmp is not None and os.path.exists(tmp):\n            os.remove(tmp)',
           '        if tmp is not None and os.path.exists(tmp) and False:\n            os.remove(tmp)',
           LOADER_TESTS, 'a Ctrl-C during a save leaves its temporary'),
    Mutant('loader-duplicate-zip-member-names-accepted-the', 'files.py',
           '            if m.name in self.members:',
           '            if m.name in self.members and False:',
           LOADER_TESTS, 'duplicate zip member names accepted (the last wins)'),
    Mutant('loader-overlapping-zip-members-accepted', 'files.py',
           '            if m.header < last:',
           '            if m.header < last - 4096:',
           LOADER_TESTS, 'overlapping zip members accepted'),
    Mutant('loader-a-zip-member-s-crc-not-checked', 'files.py',
           '        if crc != m.crc:',
           '        if crc != m.crc and m.method:',
           LOADER_TESTS, "a zip member's CRC not checked"),
    Mutant('loader-inflation-not-bounded-by-the-declared-si', 'files.py',
           'chunk = inflate.decompress(pending, m.size - got + 1)',
           'chunk = inflate.decompress(pending)',
           LOADER_TESTS, 'inflation not bounded by the declared size'),
    Mutant('loader-a-storage-member-larger-than-its-tensors', 'files.py',
           '        if m.size != numel * dtype.itemsize:',
           '        if m.size < numel * dtype.itemsize:',
           LOADER_TESTS, 'a storage member larger than its tensors declare accepted'),
    Mutant('loader-int-dict-keys-of-any-size-hash-collision', 'files.py',
           '(t is int and -_INT_KEY < k < _INT_KEY)',
           '(t is int)',
           LOADER_TESTS, 'int dict keys of any size (hash collisions: quadratic)'),
    Mutant('loader-a-dict-key-given-twice-the-last-wins', 'files.py',
           '            if _key(k) in d:',
           '            if _key(k) in d and False:',
           LOADER_TESTS, 'a dict key given twice: the last wins'),
    Mutant('loader-nesting-depth-limit-1000x-too-high', 'files.py',
           '            if h > _MAX_DEPTH:',
           '            if h > 1000 * _MAX_DEPTH:',
           LOADER_TESTS, 'nesting depth limit 1000x too high'),
    Mutant('loader-bytes-of-arrays-not-counted-against-the', 'files.py',
           '    if made[0] > made[1]:',
           '    if made[0] > 1000 * made[1]:',
           LOADER_TESTS, "bytes of arrays not counted against the pickle's size"),
    Mutant('loader-bool-bytes-not-normalised-to-0-1', 'files.py',
           "    if a.dtype == np.bool_:\n        return np.array(a.view(np.uint8) != 0, order='C')",
           "    if a.dtype == np.bool_ and False:\n        return np.array(a.view(np.uint8) != 0, order='C')",
           LOADER_TESTS, 'bool bytes not normalised to 0/1'),
    Mutant('loader-a-big-endian-array-read-as-native', 'files.py',
           "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big']) else",
           "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big'], '>') else",
           LOADER_TESTS, 'a big-endian array read as native'),
    Mutant('loader-save-writes-fortran-strides-for-c-order', 'files.py',
           'self.tuple(tuple(math.prod(a.shape[i + 1:]) for i in range(a.ndim)))',
           'self.tuple(tuple(math.prod(a.shape[:i]) for i in range(a.ndim)))',
           LOADER_TESTS, 'save writes Fortran strides for C-order bytes'),
    Mutant('loader-a-parameter-saved-with-requires-grad-fal', 'files.py',
           '            self.write(bool(t.requires_grad))\n',
           '            self.write(False)\n',
           LOADER_TESTS, 'a Parameter saved with requires_grad False'),
    Mutant('loader-an-integer-tensor-may-require-grad', 'files.py',
           "    if requires_grad and array.dtype.kind not in 'fc':",
           "    if requires_grad and array.dtype.kind not in 'fciu':",
           LOADER_TESTS, 'an integer tensor may require grad'),
    Mutant('loader-backward-hooks-in-a-file-accepted', 'files.py',
           '    if not (type(h) in (dict, _OrderedDict) and not h):',
           '    if not (type(h) in (dict, _OrderedDict)):',
           LOADER_TESTS, 'backward hooks in a file accepted'),
    Mutant('loader-a-save-s-temporary-made-with-mode-0600-t', 'files.py',
           "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o666)",
           "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o600)",
           LOADER_TESTS, "a save's temporary made with mode 0600 (the umask ignored)"),
    Mutant('loader-a-save-removes-every-temporary-named-aft', 'files.py',
           "    ours = re.compile(re.escape(start) + r'[0-9a-f]{8}\\.tmp')",
           "    ours = re.compile(re.escape(f'.{base[:40]}.') + r'.*\\.tmp')",
           LOADER_TESTS, "a save removes every temporary named after its file (a user's too)"),
    Mutant('loader-a-save-removes-temporaries-that-a-runnin', 'files.py',
           '        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        os.remove(tmp)',
           '        os.remove(tmp)',
           LOADER_TESTS, 'a save removes temporaries that a running save holds'),
    Mutant('loader-a-dotted-global-resolved-by-its-first-pa', 'files.py',
           '        make = _MAKERS.get((module, name))\n        if make is None:',
           "        make = _MAKERS.get((module, name.split('.')[0]))\n        if make is None:",
           LOADER_TESTS, 'a dotted global resolved by its first part'),
    Mutant('loader-truncation-read-as-a-short-opcode', 'files.py',
           '        if n > len(self.data) - self.at:',
           '        if n > len(self.data) - self.at + 8:',
           LOADER_TESTS, 'truncation read as a short opcode'),
    Mutant('loader-bytes-after-the-pickle-s-end-accepted', 'files.py',
           '                if self.at != len(self.data):',
           '                if self.at > len(self.data):',
           LOADER_TESTS, "bytes after the pickle's end accepted"),
    Mutant('loader-an-unbuilt-numpy-box-used-as-a-value', 'files.py',
           '            if v.value is None:\n                _fail(f"uses a NumPy {v.kind} before its BUILD',
           '            if v.value is None and False:\n                _fail(f"uses a NumPy {v.kind} before its BUILD',
           LOADER_TESTS, 'an unbuilt NumPy box used as a value'),
    Mutant('loader-a-numpy-array-built-twice', 'files.py',
           '        if type(obj) is _Box and obj.value is None:',
           '        if type(obj) is _Box:',
           LOADER_TESTS, 'a NumPy array built twice'),
    Mutant('loader-safetensors-overlapping-tensors-accepted', 'files.py',
           '        if begin != at:',
           '        if begin > at:',
           LOADER_TESTS, 'safetensors: overlapping tensors accepted'),
    Mutant('loader-safetensors-a-bool-accepted-as-a-count', 'files.py',
           'len(v) <= 64 and all(type(n) is int and 0 <= n < 1 << 62 for n in v)',
           'len(v) <= 64 and all(isinstance(n, int) and 0 <= n < 1 << 62 for n in v)',
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
    # -- issue 55's classes (files.py, tokens.py): each planted by the author of its defence
    Mutant('loader-the-work-budget-1000x-too-high', 'files.py',
           '        if self.spent > self.budget:',
           '        if self.spent > self.budget * 1000:',
           LOADER_TESTS, "the work a pickle makes not bounded by the file's bytes"),
    Mutant('loader-inflation-not-bounded-by-a-ratio', 'files.py',
           '                if m.size > _INFLATION * m.packed + (1 << 16) or inflated > _MAX_INFLATED:',
           '                if inflated > _MAX_INFLATED:',
           LOADER_TESTS, "a deflated member may inflate to any multiple of its bytes"),
    Mutant('loader-expanded-size-not-checked', 'files.py',
           '            if n > limit:',
           '            if n > limit * 10 ** 80:',
           LOADER_TESTS, "shared structure's expanded size not checked (billion laughs)"),
    Mutant('loader-tuple-dict-keys-accepted', 'files.py',
           '    if t in (str, bytes, bool) or k is None',
           '    if t in (str, bytes, bool, tuple) or k is None',
           LOADER_TESTS, "tuple dict keys accepted (their hash a file can solve for)"),
    Mutant('loader-a-zip-comment-holding-records-accepted', 'files.py',
           '        if len(ends) > 1 or any(sig in tail[end + 22:] for sig in _ZIP_RECORDS):',
           '        if False:',
           LOADER_TESTS, "a zip with two readings (a second archive in its comment) accepted"),
    Mutant('loader-a-zero-dim-hides-dims-numpy-cannot-index', 'files.py',
           '    if math.prod(n for n in shape if n) * itemsize > _INDEX_LIMIT:',
           '    if math.prod(shape) * itemsize > _INDEX_LIMIT:',
           LOADER_TESTS, "a shape [0, 2**61, 2**61] passes (NumPy's raw ValueError)"),
    Mutant('loader-a-fifo-leftover-temporary-opened', 'files.py',
           '    if not stat.S_ISREG(mode):',
           '    if stat.S_ISDIR(mode):',
           LOADER_TESTS, "a leftover temporary that is a FIFO or a link is opened"),
    Mutant('loader-listed-classes-ignored', 'files.py',
           '            listed = _listed(module, name)',
           '            listed = None',
           LOADER_TESTS, "safe_globals' classes not looked up (whole models refused)"),
    Mutant('tokens-bpe-merges-expand-unbounded', 'tokens.py',
           '        if lengths[-1] > MAX_TOKEN_BYTES or total > MAX_TOKENS_BYTES:',
           '        if False:',
           LOADER_TESTS, "BPE merges that double a token each time accepted"),

    # -- issue 57: value tests that stand on their own (golden files, limits, memory order,
    #    PyTorch's rules by hand, messages, the look-inside tools); each row planted by the
    #    tests helper and caught by the test named in it, without PyTorch
    Mutant('golden-storage-names-short-and-int-swapped', 'files.py',
           "'i2': (np.int16, 'ShortStorage', 'int16'),\n          'i4': (np.int32, 'IntStorage', 'int32')",
           "'i2': (np.int16, 'IntStorage', 'int16'),\n          'i4': (np.int32, 'ShortStorage', 'int32')",
           'golden', "PyTorch's storage names ShortStorage and IntStorage swapped"),
    Mutant('golden-binint2-read-signed', 'files.py',
           "self.push(self.number('<H'))", "self.push(self.number('<h'))",
           'golden', "a plain pickle's 2-byte ints (BININT2) read with a sign: 32768 becomes -32768"),
    Mutant('golden-writer-int32-range-includes-2-31', 'files.py',
           "if -(1 << 31) <= obj < 1 << 31 else", "if -(1 << 31) <= obj <= 1 << 31 else",
           'golden', "the writer's 4-byte int range off by one at 2**31"),
    Mutant('golden-writer-int32-range-excludes-minus-2-31', 'files.py',
           "if -(1 << 31) <= obj < 1 << 31 else", "if -(1 << 31) < obj < 1 << 31 else",
           'golden', "the writer writes -2**31 as LONG1, not as pickle's BININT"),
    Mutant('golden-zip-end-record-without-its-comment', 'files.py',
           "at + 22 + struct.unpack('<H', tail[at + 20:at + 22])[0] == len(tail)]",
           "at + 22 == len(tail)]",
           'golden', "the zip's end record looked for without its comment"),
    Mutant('golden-npy-fortran-order-ignored', 'files.py',
           "return _owned(a.reshape(shape, order='F' if fortran == 'True' else 'C'))",
           "return _owned(a.reshape(shape))",
           'golden', "an .npy member's Fortran order misread (read as C order)"),
    Mutant('golden-numpy-pickle-fortran-order-ignored', 'files.py',
           "return _owned(np.frombuffer(raw, dtype).reshape(shape, order='F' if fortran else 'C'))",
           "return _owned(np.frombuffer(raw, dtype).reshape(shape))",
           'golden', "a pickled NumPy array's Fortran order misread"),
    Mutant('golden-64-dims-refused', 'files.py',
           "if not (type(v) in (tuple, Size) and len(v) <= _MAX_DIMS",
           "if not (type(v) in (tuple, Size) and len(v) < _MAX_DIMS",
           'golden or limit_and_refuse', "a 64-dim tensor (NumPy's limit, which save writes) refused on load"),
    Mutant('limit-nesting-200-deep-refused', 'files.py',
           "            if h > _MAX_DEPTH:", "            if h >= _MAX_DEPTH:",
           'limit_and_refuse', "containers nested exactly 200 deep refused"),
    Mutant('limit-long4-of-64-bytes-refused', 'files.py',
           "if not 0 <= n <= 64:", "if not 0 <= n < 64:",
           'limit_and_refuse', "an int of 64 bytes (LONG4) refused"),
    Mutant('limit-int-key-2-60-accepted', 'files.py',
           "(t is int and -_INT_KEY < k < _INT_KEY)", "(t is int and -_INT_KEY < k <= _INT_KEY)",
           'limit_and_refuse', "a dict key of 2**60 accepted"),
    Mutant('limit-global-line-of-255-refused', 'files.py',
           "end = self.data.find(b'\\n', self.at, self.at + 256)",
           "end = self.data.find(b'\\n', self.at, self.at + 255)",
           'limit_and_refuse', "a GLOBAL's line of 255 characters read as one without its end"),
    Mutant('limit-storage-key-of-64-refused', 'files.py',
           "re.fullmatch(r'[A-Za-z0-9_.]{1,64}', key)", "re.fullmatch(r'[A-Za-z0-9_.]{1,63}', key)",
           'limit_and_refuse', "a storage key of 64 characters refused"),
    Mutant('limit-npy-header-of-64-kib-refused', 'files.py',
           "    if size > 1 << 16:", "    if size >= 1 << 16:",
           'limit_and_refuse', "an .npy header of exactly 64 KiB refused"),
    Mutant('limit-npy-of-64-dims-refused', 'files.py',
           "    if len(shape) > 64 or start", "    if len(shape) >= 64 or start",
           'limit_and_refuse', "an .npy array of 64 dims refused"),
    Mutant('limit-safetensors-shape-of-64-refused', 'files.py',
           "return type(v) is list and len(v) <= 64 and", "return type(v) is list and len(v) < 64 and",
           'limit_and_refuse', "a safetensors shape of 64 dims refused"),
    Mutant('limit-budget-of-work-exactly-spent-refused', 'files.py',
           "        if self.spent > self.budget:", "        if self.spent >= self.budget:",
           'budget_of_work', "a pickle spending exactly its budget of work refused"),
    Mutant('limit-budget-memo-entry-costs-more', 'files.py',
           "            self.spend(32)", "            self.spend(33)",
           'budget_of_work', "a memo entry costs 33 units, not the 32 files.py states"),
    Mutant('limit-data-pkl-of-256-mib-refused', 'files.py',
           "    if m.size > _MAX_PICKLE:", "    if m.size >= _MAX_PICKLE:",
           'data_pkl_of_256_mib', "a data.pkl of exactly 256 MiB refused"),
    Mutant('limit-charlm-at-least-1-excludes-1', 'train_charlm.py',
           'AT_LEAST_1 = (lambda v: v >= 1, "it must be at least 1")',
           'AT_LEAST_1 = (lambda v: v > 1, "it must be at least 1")',
           'bound_and_refused', "train_charlm.py refuses --steps 1, --batch-size 1 and the like"),
    Mutant('limit-charlm-at-least-0-excludes-0', 'train_charlm.py',
           'AT_LEAST_0 = (lambda v: v >= 0, "it must be 0 or more")',
           'AT_LEAST_0 = (lambda v: v > 0, "it must be 0 or more")',
           'bound_and_refused', "train_charlm.py refuses --seed 0, --warmup 0 and the like"),
    Mutant('limit-charlm-dropout-1-accepted', 'train_charlm.py',
           "'dropout': (float, (lambda v: 0 <= v < 1,", "'dropout': (float, (lambda v: 0 <= v <= 1,",
           'bound_and_refused', "--dropout 1 accepted"),
    Mutant('limit-charlm-vocab-size-256-refused', 'train_charlm.py',
           "if args.vocab_size is not None and args.vocab_size < 256:",
           "if args.vocab_size is not None and args.vocab_size <= 256:",
           'bound_and_refused', "--vocab-size 256 (the bytes alone) refused"),
    Mutant('limit-digits-epochs-1-refused', 'train_digits.py',
           "        if getattr(args, name) < 1:", "        if getattr(args, name) < 2:",
           'bound_and_refused', "train_digits.py refuses --epochs 1 and --batch-size 1"),
    Mutant('layout-tie-rule-inverted', 'tinytorch.py',
           "            if shape[d0] > shape[d1]:\n                return 1\n        return 0",
           "            if shape[d0] < shape[d1]:\n                return 1\n        return 0",
           'laid_out_in_memory_as_torchs', "the rule that orders dims of equal stride inverted"),
    Mutant('layout-contiguity-counts-size-1-strides', 'tinytorch.py',
           "def is_contiguous(x):\n    return bool(x.array.flags.c_contiguous)",
           "def is_contiguous(x):\n    return x.array.strides == np.empty(x.array.shape, x.array.dtype).strides",
           'contiguity_with_size_1_dims_as_worked', "is_contiguous counts the stride of a size-1 dim"),
    Mutant('amp-scale-grows-to-inf', 'amp.py',
           "                if math.isfinite(grown):\n                    self._scale = grown",
           "                if True:\n                    self._scale = grown",
           'full_schedule_as_worked', "GradScaler's scale grows past float32's largest, to inf"),
    Mutant('amp-tracker-kept-when-growth-refused', 'amp.py',
           "                if math.isfinite(grown):\n                    self._scale = grown\n                self._growth_tracker = 0",
           "                if math.isfinite(grown):\n                    self._scale = grown\n                    self._growth_tracker = 0",
           'full_schedule_as_worked', "GradScaler's tracker not zeroed where growth stops"),
    Mutant('amp-backoff-factor-ignored', 'amp.py',
           "                self._scale = np.float32(self._scale * np.float32(self._backoff_factor))",
           "                self._scale = np.float32(self._scale * np.float32(0.5))",
           'full_schedule_as_worked', "GradScaler halves on an overflow whatever its backoff_factor"),
    Mutant('prune-count-rounds-half-up', 'compress.py',
           "    return round(amount * size)", "    return int(amount * size + 0.5)",
           'round_half_to_even', "pruning rounds amount * n half up (PyTorch's round goes to even)"),
    Mutant('prune-count-truncated', 'compress.py',
           "    return round(amount * size)", "    return int(amount * size)",
           'round_half_to_even', "pruning truncates amount * n"),
    Mutant('prune-again-counts-the-pruned', 'compress.py',
           "        left = old_mask == 1  # pruning again", "        left = old_mask > -1  # pruning again",
           'round_half_to_even', "pruning again counts the entries already pruned"),
    Mutant('dist-categorical-batch-draws-not-transposed', 'distributions.py',
           "        return draws.T.reshape(shape)", "        return draws.reshape(shape)",
           'batched_categorical_samples', "a batch of Categoricals sampled: draws of one row spread over others"),
    Mutant('dist-kl-zero-classes-in-the-wrong-order', 'distributions.py',
           "        t = tt.where(q.probs.expand(t.shape) == 0, math.inf, t)\n        t = tt.where(p.probs.expand(t.shape) == 0, 0.0, t)",
           "        t = tt.where(p.probs.expand(t.shape) == 0, 0.0, t)\n        t = tt.where(q.probs.expand(t.shape) == 0, math.inf, t)",
           'zero_probability_classes', "KL of a class neither distribution gives: inf instead of 0"),
    Mutant('dist-kl-no-inf-for-q-zero', 'distributions.py',
           "        t = tt.where(q.probs.expand(t.shape) == 0, math.inf, t)\n", "",
           'zero_probability_classes', "KL finite where q never gives a class p gives"),
    Mutant('packed-unsorted-indices-not-inverted', 'nn.py',
           "            unsorted_indices = tt.argsort(sorted_indices)  # the inverse permutation",
           "            unsorted_indices = sorted_indices  # the inverse permutation",
           'not_its_own_inverse', "a packed batch's unsorted_indices is its sort, not the inverse"),
    Mutant('packed-h0-permuted-the-wrong-way', 'nn.py',
           "            start = [s.index_select(1, input.sorted_indices) for s in start]",
           "            start = [s.index_select(1, input.unsorted_indices) for s in start]",
           'not_its_own_inverse', "each sequence starts from another's initial state"),
    Mutant('packed-h-n-permuted-the-wrong-way', 'nn.py',
           "            final = [s.index_select(1, input.unsorted_indices) for s in final]",
           "            final = [s.index_select(1, input.sorted_indices) for s in final]",
           'not_its_own_inverse', "the final states put back in the wrong order"),
    Mutant('packed-total-length-at-the-longest-refused', 'nn.py',
           "    if total_length is not None and total_length < len(sizes):",
           "    if total_length is not None and total_length <= len(sizes):",
           'total_length_at_the_longest', "pad_packed_sequence refuses total_length equal to the longest"),
    Mutant('packed-total-length-ignored', 'nn.py',
           "    steps = len(batch_sizes) if total_length is None else total_length",
           "    steps = len(batch_sizes)",
           'total_length_at_the_longest', "pad_packed_sequence ignores a longer total_length"),
    Mutant('interpolate-recompute-ignored', 'nn.py',
           "        scales = [i / o if recompute_scale_factor else 1 / s for i, o, s in zip(spatial, out, sf)]",
           "        scales = [1 / s for i, o, s in zip(spatial, out, sf)]",
           'non_integer_scales_both', "interpolate ignores recompute_scale_factor=True"),
    Mutant('interpolate-always-recomputes', 'nn.py',
           "        scales = [i / o if recompute_scale_factor else 1 / s for i, o, s in zip(spatial, out, sf)]",
           "        scales = [i / o for i, o, s in zip(spatial, out, sf)]",
           'non_integer_scales_both', "interpolate recomputes the scale though not asked to"),
    Mutant('interpolate-size-rounded', 'nn.py',
           "        out = tuple(int(math.floor(i * s)) for i, s in zip(spatial, sf))",
           "        out = tuple(int(round(i * s)) for i, s in zip(spatial, sf))",
           'non_integer_scales_both', "interpolate's output size rounded, not floored"),
    Mutant('lbfgs-n-iter-reset-each-step', 'optim.py',
           "        state.setdefault('n_iter', 0)", "        state['n_iter'] = 0",
           'lbfgs_carries or lbfgs_history', "LBFGS starts afresh at each step() call"),
    Mutant('lbfgs-history-one-pair-too-many', 'optim.py',
           "                    if len(old_dirs) == group['history_size']:",
           "                    if len(old_dirs) > group['history_size']:",
           'lbfgs_history', "LBFGS keeps history_size + 1 pairs"),
    Mutant('lbfgs-history-drops-the-newest', 'optim.py',
           "                    old_dirs.pop(0), old_stps.pop(0), ro.pop(0)",
           "                    old_dirs.pop(), old_stps.pop(), ro.pop()",
           'lbfgs_history', "LBFGS drops its newest pair, not its oldest"),
    Mutant('message-data-type-error-made-value-error', 'data.py',
           '            raise TypeError(f"RandomSampler: replacement should be a boolean value, but got "',
           '            raise ValueError(f"RandomSampler: replacement should be a boolean value, but got "',
           'each_data_refusal', "a refusal's exception class changed"),
    Mutant('message-dataloader-timeout-reworded', 'data.py',
           '            raise ValueError("DataLoader: timeout option should be non-negative")',
           '            raise ValueError("DataLoader: timeout should be non-negative")',
           'each_data_refusal', "a refusal's words changed"),
    Mutant('message-bpe-merges-refusal-a-runtime-error', 'tokens.py',
           '                    raise ValueError(f"{path}, line {n}: not a merge of two earlier tokens "',
           '                    raise RuntimeError(f"{path}, line {n}: not a merge of two earlier tokens "',
           'merges_file', "a bad BPE merges file refused with another exception class"),
    Mutant('message-bpe-merge-of-the-next-token-accepted', 'tokens.py',
           "                        max(int(p) for p in parts) >= 256 + len(merges):",
           "                        max(int(p) for p in parts) > 256 + len(merges):",
           'merges_file', "a merge naming the token it makes accepted"),
    Mutant('message-charlm-empty-text-a-traceback', 'train_charlm.py',
           '        raise UserError(f"{path} is empty: there is nothing to learn from")',
           '        raise ValueError(f"{path} is empty: there is nothing to learn from")',
           'refusal_of_the_text', "an empty text gives a traceback, not exit 2"),
    Mutant('message-load-empty-file-a-value-error', 'files.py',
           '            _fail("is empty (0 bytes): it holds no checkpoint; save or download it again")',
           '            raise ValueError("is empty (0 bytes): it holds no checkpoint; save or download it again")',
           'front_door', "tt.load of an empty file raises a ValueError without the file's name"),
    Mutant('message-nn-load-missing-file-a-checkpoint-error', 'files.py',
           '        raise FileNotFoundError(f"checkpoint not found: {path}")',
           '        raise CheckpointError(f"checkpoint not found: {path}")',
           'front_door', "nn.load of a missing file raises CheckpointError"),
    Mutant('checkpoint-parameters-not-guarded', 'tinytorch.py',
           "    return from_op(out.array, 'checkpoint', inputs + params, backward, saved=inputs + params)",
           "    return from_op(out.array, 'checkpoint', inputs + params, backward, saved=inputs)",
           'guards_the_parameters', "a parameter a checkpointed function reads, changed in place, not refused"),
    Mutant('lookinside-memory-table-one-level-too-deep', 'lookinside.py',
           "            if depth is not None and name.count('.') >= depth:",
           "            if depth is not None and name.count('.') > depth:",
           'memory_table_shows', "the memory table shows one level more than its depth"),
    Mutant('lookinside-memory-table-default-depth-3', 'lookinside.py',
           "    def table(self, depth=2):", "    def table(self, depth=3):",
           'memory_table_shows', "the memory table's default depth 3"),
    Mutant('learn-adam-lr-diagnosis-unreachable', 'learn.py',
           "    ('lr', \"the step ignores the learning rate",
           "    ('lr2', \"the step ignores the learning rate",
           'named_diagnosis_of_an_optional', "learn.py's 'step without lr' diagnosis falls back to the generic message"),
    Mutant('learn-adamw-grew-diagnosis-unreachable', 'learn.py',
           "        'grew': \"the weights grew", "        'grow': \"the weights grew",
           'named_diagnosis_of_an_optional', "learn.py's 'the weights grew' diagnosis falls back to the generic message"),
    Mutant('learn-lstm-f-i-order-diagnosis-unreachable', 'learn.py',
           "                (dict(order='figo'), ", "                (dict(order='ifog'), ",
           'named_diagnosis_of_an_optional', "learn.py's 'f, i, g, o' diagnosis falls back to the 'i, f, o, g' model"),
    Mutant('golden-safetensors-bfloat16-shifted-by-15', 'files.py',
           "            a = (a.astype(np.uint32) << 16).view(np.float32)",
           "            a = (a.astype(np.uint32) << 15).view(np.float32)",
           'golden_safetensors', "safetensors' bfloat16 widened with the wrong shift"),
    Mutant('golden-safetensors-i8-read-as-uint8', 'files.py',
           "'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U64': np.uint64,",
           "'I32': np.int32, 'I16': np.int16, 'I8': np.uint8, 'U64': np.uint64,",
           'golden_safetensors', "safetensors' I8 read as unsigned"),
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
