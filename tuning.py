"""tuning.py: what tt.tune() changes in the process, for training.

Importing tinytorch changes no setting of the process (it adds one import finder, for
`import tinytorch.nn`-style imports, and nothing else): a library must not. A training script
asks for these two settings with tt.tune() (train_*.py and bench.py do, first thing):

  1. tune_malloc: glibc's allocator keeps freed memory for reuse instead of handing it back
     to the OS after every step (about 25% faster steps; the peak memory stays the same);
  2. share_cores: tinytorch's threads and OpenBLAS's follow the cores that other programs
     leave free, looked at four times a second (threads that wait for each other on a busy
     machine are far slower than one thread).

A third setting can't be made here: OpenBLAS reads OPENBLAS_THREAD_TIMEOUT (how long its
idle threads spin) only when NumPy loads it, so the scripts set it in the environment
before they import NumPy. This file imports only the standard library and tinytorch.py;
nothing in tinytorch.py needs it until tune() is called.
"""
import ctypes
import itertools
import os
import sys
import time

import tinytorch as tt


def tune():
    """Make the settings above (TINYTORCH_TUNE_MALLOC=0 and TINYTORCH_TUNE_THREADS=0 leave
    one out). Returns the names of the settings made: ['malloc', 'share_cores'] on Linux
    with glibc. tt.tune() calls this."""
    done = []
    if tune_malloc():
        done.append('malloc')
    if os.environ.get('TINYTORCH_TUNE_THREADS', '1') != '0':
        done.append('share_cores')
    return done


def tune_malloc():
    """Keep freed memory in the process instead of handing it back to the OS.

    A training step allocates and frees the same large arrays every time. glibc's
    malloc serves blocks over a (dynamic) threshold with mmap and returns them to
    the OS on free, and trims the top of the heap as soon as 128 KiB are free, so
    each step pays for fresh zeroed pages again (page faults cost as much as the
    arithmetic here). Raising both thresholds keeps those pages for reuse: about
    25% faster steps, while the peak memory stays the same. tune() calls it (on Linux);
    TINYTORCH_TUNE_MALLOC=0 leaves the allocator alone even then.
    Returns True if the settings were applied.
    """
    if os.environ.get('TINYTORCH_TUNE_MALLOC', '1') == '0' or not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL('libc.so.6')
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)  # glibc's maximum
                    and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 30))
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to do
        return False


# Sharing the cores with other programs
# Threads pay only while each has a core. When other programs keep the cores busy (a
# browser, a build, another training run), threads that wait for each other (the two
# halves of a split matmul in OpenBLAS, the ranges of a parallel_for) are descheduled in
# turn, and each wait lasts one of the scheduler's time slices (milliseconds) instead of
# microseconds. On the 2-core dev VM with two busy processes a GPT step took 10-30x its
# quiet time with 2 threads, and 2-3x with 1 (docs/performance.md). So, four times a
# second, share_cores looks at the machine: /proc/stat's procs_running counts the threads
# that run or wait for a core, machine-wide; less this process's own, that leaves the
# others. The cores they leave (at least one) are what tinytorch's parallel_for and
# OpenBLAS may use: fewer as soon as two looks in a row see the others (one look alone
# can catch a process that woke for a moment), more again only after 2 seconds of room
# (a spell that comes and goes would otherwise flip it back and forth). Looking costs
# about 0.1 ms. OpenBLAS's count is set through its own openblas_set_num_threads, found in
# the library NumPy loaded. Only Linux has /proc; elsewhere nothing changes.
# tune() turns it on (TINYTORCH_TUNE_THREADS=0 keeps it off); the plain path and
# tt.set_num_threads(n) turn it off.
SHARE_LOOK_EVERY = 0.25  # seconds between two looks at the machine
SHARE_RISE_AFTER = 2.0  # seconds the cores must stay free before the threads go up again
_machine_cores = os.cpu_count() or 1
_cores_free = _machine_cores  # what the threads may use now
_next_look, _room_since = 0.0, None
_last_want = _machine_cores  # what the previous look left free: one look alone (a process
# that woke for a moment, as one look in 200 sees on a quiet machine) lowers nothing
_openblas_found = None  # [(set_num_threads, its count at start)], looked up on first use


def cores_to_use(others, cores):
    """The cores that others (threads of other programs that run or wait) leave free: at
    least one."""
    return max(1, cores - others)


def others_running():
    """Threads of other processes that run or wait for a core right now: /proc/stat's
    procs_running (the whole machine), less this process's threads in state R. None
    where there is no /proc (not Linux)."""
    try:
        with open('/proc/stat') as f:
            running = next(int(line.split()[1]) for line in f if line.startswith('procs_running'))
        mine = 0
        for tid in os.listdir('/proc/self/task'):
            try:
                with open(f'/proc/self/task/{tid}/stat') as f:
                    stat = f.read()
            except OSError:  # the thread has just ended
                continue
            mine += stat[stat.rindex(')') + 2] == 'R'  # the state follows the name: "(...) R"
        return max(0, running - mine)
    except (OSError, StopIteration, ValueError):
        return None


def share_cores(now=None, others=None):
    """If it is time (SHARE_LOOK_EVERY), look at the machine and set the threads parallel_for
    and OpenBLAS use: fewer at once when other programs take cores, more again after
    SHARE_RISE_AFTER seconds of room. Called on the caller's thread where threaded work
    starts (parallel_for, a bias's gradient), never from a worker: OpenBLAS's count must
    not change during a product. now and others let a test inject them."""
    global _next_look, _room_since, _last_want
    now = time.monotonic() if now is None else now
    if now < _next_look:
        return
    _next_look = now + SHARE_LOOK_EVERY
    if not tt.fast:  # the plain path: all the cores, at once
        if _cores_free != _machine_cores:
            _use_cores(_machine_cores)
        return
    others = others_running() if others is None else others
    if others is None:
        return
    want, seen = cores_to_use(others, _machine_cores), _last_want
    _last_want = want
    if max(want, seen) < _cores_free:  # others came, two looks in a row: fewer now
        _room_since = None
        _use_cores(max(want, seen))
    elif want == _cores_free:
        _room_since = None
    elif _room_since is None:  # room: wait to see that it lasts
        _room_since = now
    elif now - _room_since >= SHARE_RISE_AFTER:
        _room_since = None
        _use_cores(want)


def cores_free():
    """The cores tinytorch's threads may use now (tt's parallel_for asks)."""
    return _cores_free


def _use_cores(n):
    global _cores_free
    _cores_free = n
    for set_threads, most in _openblas():
        set_threads(min(n, most))


def _openblas():
    """[(openblas_set_num_threads, its thread count at start)] for each OpenBLAS this process
    loaded, found as threadpoolctl finds them: the shared libraries mapped in
    /proc/self/maps. NumPy's wheels name the functions scipy_openblas_..._64_. Empty when
    there is none (another BLAS, or not Linux): then only tinytorch's own threads adapt."""
    global _openblas_found
    if _openblas_found is None:
        _openblas_found = []
        try:
            with open('/proc/self/maps') as f:
                paths = sorted({line.split()[-1] for line in f
                                if 'openblas' in line.lower() and '/' in line})
        except OSError:
            paths = []
        for path in paths:
            try:
                lib = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
            except OSError:
                continue
            for prefix, suffix in itertools.product(('', 'scipy_'), ('', '64_')):
                setter = getattr(lib, f'{prefix}openblas_set_num_threads{suffix}', None)
                getter = getattr(lib, f'{prefix}openblas_get_num_threads{suffix}', None)
                if setter is not None and getter is not None:
                    _openblas_found.append((setter, getter()))
                    break
    return _openblas_found
