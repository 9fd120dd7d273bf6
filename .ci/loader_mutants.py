"""The loader's mutation trial (issues 44 and 49): plant one bug at a time in a copy of the
project, run the loader's tests there without PyTorch, and say which test caught it.

    python .ci/loader_mutants.py            # every planted bug
    python .ci/loader_mutants.py 3 7        # only these (--jobs=2: two at a time)

Not part of the shipped code: a check that the tests can fail where the loader is wrong.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = [  # the loader's tests (the training scripts' checkpoint tests take minutes: left out)
    'test_save_and_load_refuse_pickled_code_unless_asked', 'test_save_load_nested_and_atomic',
    'test_a_crash_in_the_middle_of_a_save_leaves_the_old_checkpoint_alone',
    'test_truncated_or_foreign_checkpoint_gives_clear_error', 'test_checkpoint_never_unpickles',
    'test_a_file_that_is_not_a_checkpoint_says_so_without_numpys_pickle_advice',
    'test_checkpoints_follow_the_umask_like_every_other_file',
    'test_safetensors_round_trip_of_every_dtype', 'test_safetensors_reads_bfloat16_and_refuses_broken_files',
    'test_load_refuses_every_global_outside_the_exact_allow_list',
    'test_load_checks_every_tensor_against_its_storage', 'test_load_refuses_sizes_before_reading_them',
    'test_load_says_in_one_line_what_is_wrong_with_a_plain_bad_file',
    'test_nn_load_says_in_one_line_what_is_wrong_with_a_bad_file',
    'test_a_save_killed_midway_leaves_the_old_file_or_the_new_one',
    'test_hostile_files_of_every_class_are_refused_in_one_line_in_a_child',
    'test_a_memo_index_of_200_million_costs_nothing', 'test_a_tensor_one_element_past_its_storage_is_refused',
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
    'test_loader_fuzzer_finds_nothing_in_300_mutants', 'test_load_refuses_a_numpy_global_that_is_not_a_dtype',
    'test_load_a_torch_save_zip_whose_tensors_share_one_storage_at_offsets']

# (what the bug is, file, the right text, the wrong text)
BUGS = [
    ("bounds check off by one: a tensor one element past its storage loads", 'tinytorch.py',
     "        if last >= n or offset > n:", "        if last > n or offset > n:"),
    ("weights_only=None read as unsafe (False)", 'tinytorch.py',
     "    trusted = weights_only is not None and not weights_only",
     "    trusted = not weights_only"),
    ("a Ctrl-C during a save leaves its temporary", 'tinytorch.py',
     "        if tmp is not None and os.path.exists(tmp):\n            os.remove(tmp)",
     "        if tmp is not None and os.path.exists(tmp) and False:\n            os.remove(tmp)"),
    ("duplicate zip member names accepted (the last wins)", 'tinytorch.py',
     "            if m.name in self.members:", "            if m.name in self.members and False:"),
    ("overlapping zip members accepted", 'tinytorch.py',
     "            if m.header < last:", "            if m.header < last - 4096:"),
    ("a zip member's CRC not checked", 'tinytorch.py',
     "        if crc != m.crc:", "        if crc != m.crc and m.method:"),
    ("inflation not bounded by the declared size", 'tinytorch.py',
     "chunk = inflate.decompress(pending, m.size - got + 1)",
     "chunk = inflate.decompress(pending)"),
    ("a storage member larger than its tensors declare accepted", 'tinytorch.py',
     "        if m.size != numel * dtype.itemsize:", "        if m.size < numel * dtype.itemsize:"),
    ("int dict keys of any size (hash collisions: quadratic)", 'tinytorch.py',
     "(t is int and -_INT_KEY < k < _INT_KEY)", "(t is int)"),
    ("a dict key given twice: the last wins", 'tinytorch.py',
     "            if _key(k) in d:", "            if _key(k) in d and False:"),
    ("nesting depth limit 1000x too high", 'tinytorch.py',
     "            if h > _MAX_DEPTH:", "            if h > 1000 * _MAX_DEPTH:"),
    ("bytes of arrays not counted against the pickle's size", 'tinytorch.py',
     "    if made[0] > made[1]:", "    if made[0] > 1000 * made[1]:"),
    ("bool bytes not normalised to 0/1", 'tinytorch.py',
     "    if a.dtype == np.bool_:\n        return np.array(a.view(np.uint8) != 0, order='C')",
     "    if a.dtype == np.bool_ and False:\n        return np.array(a.view(np.uint8) != 0, order='C')"),
    ("a big-endian array read as native", 'tinytorch.py',
     "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big']) else",
     "    return dtype if state[1] in ('|', '<>'[sys.byteorder == 'big'], '>') else"),
    ("save writes Fortran strides for C-order bytes", 'tinytorch.py',
     "math.prod(a.shape[i + 1:]) for i in range(a.ndim)", "math.prod(a.shape[:i]) for i in range(a.ndim)"),
    ("a Parameter saved with requires_grad False", 'tinytorch.py',
     "            self.write(bool(t.requires_grad))\n", "            self.write(False)\n"),
    ("an integer tensor may require grad", 'tinytorch.py',
     "    if requires_grad and array.dtype.kind not in 'fc':",
     "    if requires_grad and array.dtype.kind not in 'fciu':"),
    ("backward hooks in a file accepted", 'tinytorch.py',
     "    if not (type(h) in (dict, _OrderedDict) and not h):",
     "    if not (type(h) in (dict, _OrderedDict)):"),
    ("a save's temporary made with mode 0600 (the umask ignored)", 'tinytorch.py',
     "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o666)",
     "os.O_EXCL | getattr(os, 'O_BINARY', 0),\n                             0o600)"),
    ("a save removes every temporary named after its file (a user's too)", 'tinytorch.py',
     "    ours = re.compile(re.escape(start) + r'[0-9a-f]{8}\\.tmp')",
     "    ours = re.compile(re.escape(f'.{base[:40]}.') + r'.*\\.tmp')"),
    ("a save removes temporaries that a running save holds", 'tinytorch.py',
     "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        os.remove(tmp)",
     "        os.remove(tmp)"),
    ("a dotted global resolved by its first part", 'tinytorch.py',
     "        make = _MAKERS.get((module, name))\n        if make is None:", "        make = _MAKERS.get((module, name.split('.')[0]))\n        if make is None:"),
    ("truncation read as a short opcode", 'tinytorch.py',
     "        if n > len(self.data) - self.at:", "        if n > len(self.data) - self.at + 8:"),
    ("bytes after the pickle's end accepted", 'tinytorch.py',
     "                if self.at != len(self.data):", "                if self.at > len(self.data):"),
    ("an unbuilt NumPy box used as a value", 'tinytorch.py',
     "            if v.value is None:\n                _fail(f\"uses a NumPy {v.kind} before its BUILD",
     "            if v.value is None and False:\n                _fail(f\"uses a NumPy {v.kind} before its BUILD"),
    ("a NumPy array built twice", 'tinytorch.py',
     "        if type(obj) is _Box and obj.value is None:", "        if type(obj) is _Box:"),
    ("safetensors: overlapping tensors accepted", 'files.py',
     "        if begin != at:", "        if begin > at:"),
    ("safetensors: a bool accepted as a count", 'files.py',
     "all(type(n) is int and 0 <= n < 1 << 62 for n in v)",
     "all(isinstance(n, int) and 0 <= n < 1 << 62 for n in v)"),
    ("safetensors: __metadata__ values not checked", 'files.py',
     "    if type(metadata) is not dict or not all(type(v) is str for v in metadata.values()):",
     "    if type(metadata) is not dict:"),
    ("npz: a1 and a01 both read as array 1", 'files.py',
     "        if not re.fullmatch(r'a(0|[1-9][0-9]{0,8})', k):",
     "        if not re.fullmatch(r'a[0-9]{1,9}', k):"),
    ("npz: an .npy header's size not checked against its member", 'files.py',
     "    if len(shape) > 64 or start + size + need != m.size:",
     "    if len(shape) > 64 or start + size + need > m.size + 8:"),
]


def run(number):
    what, name, right, wrong = BUGS[number]
    with tempfile.TemporaryDirectory(prefix='tt-mutant-') as folder:
        for f in os.listdir(HERE):  # the working tree (the tests read README.md, data/, ...)
            src = os.path.join(HERE, f)
            if f != '.git' and not f.startswith('.venv'):
                (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(folder, f))
        path = os.path.join(folder, name)
        text = open(path).read()
        assert text.count(right) == 1, (number, what, text.count(right))
        open(path, 'w').write(text.replace(right, wrong))
        began = time.time()
        r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider',
                            '--basetemp', os.path.join(folder, 'tmp')]
                           + [f'test_tinytorch.py::{t}' for t in TESTS], cwd=folder, capture_output=True, text=True, timeout=1800,
                           env={**os.environ, 'TINYTORCH_NO_TORCH': '1'})
        caught = re.findall(r'^FAILED (\S+)', r.stdout, re.M)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"pytest could not run the tests: {r.stdout[-2000:]}")
        return what, (caught[0].split('::')[-1] if caught else None), time.time() - began


if __name__ == '__main__':
    from concurrent.futures import ThreadPoolExecutor
    jobs = 2 if '--jobs=2' in sys.argv else 1
    wanted = [int(a) for a in sys.argv[1:] if a.isdigit()] or range(len(BUGS))
    survivors = 0
    with ThreadPoolExecutor(jobs) as pool:
        for i, (what, test, seconds) in zip(wanted, pool.map(run, wanted)):
            survivors += test is None
            print(f"{i:2d} {what}: {'SURVIVED' if test is None else 'caught by ' + test} "
                  f"({seconds:.0f} s)", flush=True)
    print(f"{len(wanted) - survivors} of {len(wanted)} caught")
