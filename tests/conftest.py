"""Shared fixtures: synthetic checkpoints (made once per test run) and a cached upstream loader;
the tiers every test falls in.

The checkpoints come from our own `make_checkpoint` (milliseconds each), never from the Hub;
`upstream_agent(path)` is the test-time reference, laya 0.4.15 loaded on CPU.

Tiers (markers registered in pyproject.toml), set here from what each test's code reaches, so a
new test cannot escape them:
- `integration`: the test, a fixture it uses, or a helper of the tests' own that either calls,
  starts a process or opens a socket (subprocess, socket, asyncio streams, a gRPC server or
  channel, uvicorn, tests/stack.py), or uses a module of the package that does (core/wire/ipc.py);
- `kernels`: the test's module imports the Triton kernels (run through Triton's CPU interpreter);
- `slow`: the test itself (not a fixture it shares) starts a whole `laya-grpc serve` (tests/stack.py,
  or `laya-grpc serve|bench` as a process) or builds an environment.
`pytest -m "not integration and not kernels"` is the fast tier.
"""
from __future__ import annotations

import inspect
import os
import sys
import types
import warnings

# CI has no GPU: the CUDA path's Triton kernels run through Triton's interpreter. Set before any
# test module imports triton, since triton's own jit helpers read it at import (collection order
# must not decide whether tests/test_cuda_attention.py can run).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from laya_grpc.cli.make_checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="session")
def tiny_ckpt(ckpt_root) -> str:
    """English-style (ModernBERT-like) tiny checkpoint."""
    return make_checkpoint(str(ckpt_root / "tiny"), "tiny")


@pytest.fixture(scope="session")
def tiny_ml_ckpt(ckpt_root) -> str:
    """Multilingual-style (mmBERT/Gemma-like) tiny checkpoint."""
    return make_checkpoint(str(ckpt_root / "tiny-ml"), "tiny-ml")


@pytest.fixture(scope="session")
def tiny_par_ckpt(ckpt_root) -> str:
    """`tiny` with `"option_layout": "parallel"`."""
    return make_checkpoint(str(ckpt_root / "tiny-par"), "tiny-par")


@pytest.fixture(scope="session")
def upstream_agent():
    """`load(path) -> laya.Agent` on CPU, one Agent per path for the session.

    The path must contain a "/" (laya.load resolves bare words as aliases); the
    fixture checkpoints above are absolute paths.
    """
    agents = {}

    def load(path: str):
        if path not in agents:
            import laya
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                agents[path] = laya.load(path, device="cpu")
        return agents[path]

    return load


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", default=False,
                     help="large counts in the hostile-input, load and kill tests (minutes, not for CI)")


@pytest.fixture(scope="session")
def soak(request) -> bool:
    return bool(request.config.getoption("--soak"))


# Names whose use in a test's code means it starts a process or opens a socket (globals and
# attribute names alike: `subprocess.run`, `asyncio.open_connection`, `grpc.aio.server().add_insecure_port`).
_INTEGRATION_NAMES = frozenset({
    "subprocess", "socket", "multiprocessing", "Popen", "create_subprocess_exec", "create_subprocess_shell",
    "open_connection", "open_unix_connection", "start_server", "start_unix_server", "create_connection",
    "socketpair", "add_insecure_port", "insecure_channel", "uvicorn", "Stack", "urlopen",
})
# Names that start a whole `laya-grpc serve` or build an environment, and the CLI commands that do.
_SLOW_NAMES = frozenset({"Stack", "venv", "EnvBuilder", "argv:serve", "argv:bench"})
_SLOW_COMMANDS = frozenset({"serve", "bench"})
# Modules whose import means the test runs the Triton kernels through the interpreter.
_KERNEL_MODULES = ("triton", "triton_interpreter", "laya_grpc.inference.cuda_kernels",
                   "laya_grpc.inference.cuda_attention", "laya_grpc.inference.split_gemm")
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _ours(obj) -> bool:
    """A function or class written in tests/ (helpers are followed; product code is not)."""
    try:
        return os.path.abspath(inspect.getfile(obj)).startswith(_TESTS_DIR + os.sep)
    except TypeError:
        return False


def _names(obj, seen: set) -> set:
    """Every global and attribute name the code of `obj` (a function or class written in tests/)
    uses, following the tests' own helpers, classes and nested functions it calls."""
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    if isinstance(obj, type):
        out = {obj.__name__}
        for v in vars(obj).values():
            v = getattr(v, "__func__", v)
            if isinstance(v, (types.FunctionType, property)) and _ours(getattr(v, "fget", v)):
                out |= _names(getattr(v, "fget", v), seen)
        return out
    obj = inspect.unwrap(obj)
    code, glb = getattr(obj, "__code__", None), getattr(obj, "__globals__", {})
    if code is None:
        return set()
    out, codes = set(), [code]
    while codes:
        c = codes.pop()
        out.update(c.co_names)
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        out.update("argv:" + k for k in c.co_consts if k in _SLOW_COMMANDS)
    for name in list(out):
        v = glb.get(name)
        if isinstance(v, types.ModuleType):
            if v.__name__ in ("subprocess", "socket", "multiprocessing", "stack", "hostile_clients"):
                out.add("module:" + v.__name__)
            out |= _product_module_io(v)
        elif isinstance(v, (types.FunctionType, type)) and _ours(v):
            out |= _names(v, seen)
        elif callable(v):
            out |= _product_module_io(sys.modules.get(getattr(v, "__module__", None) or ""))
    return out


def _product_module_io(module) -> set:
    """{"module:socket"} or {"module:subprocess"} for a module of the package that opens sockets or
    starts processes itself (core/wire/ipc.py's unix sockets, the bench's stacks): what a test reaches
    through it is integration even though the test's own code names neither."""
    if not isinstance(module, types.ModuleType) or not module.__name__.startswith("laya_grpc."):
        return set()
    return {"module:" + m for m in ("socket", "subprocess") if getattr(module, m, None) is sys.modules.get(m)}


def _kernel_module(module) -> bool:
    for v in vars(module).values():
        name = getattr(v, "__name__", "") if isinstance(v, types.ModuleType) else getattr(v, "__module__", "") or ""
        if name.startswith(_KERNEL_MODULES):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    kernel_modules: dict = {}
    for item in items:
        fn = getattr(item, "function", None)
        if fn is None:
            continue
        seen: set = set()
        names = own = _names(fn, seen)     # `own`: what the test pays for alone (shared fixtures aside)
        for fixture in item.fixturenames:
            for fdef in item._fixtureinfo.name2fixturedefs.get(fixture, ()):
                if _ours(fdef.func):
                    got = _names(fdef.func, set())
                    names = names | got
                    if fdef.scope == "function":
                        own = own | got
        if names & _INTEGRATION_NAMES or {"module:stack", "module:hostile_clients", "module:socket",
                                          "module:subprocess"} & names:
            item.add_marker(pytest.mark.integration)
        if own & _SLOW_NAMES:
            item.add_marker(pytest.mark.slow)
        mod = item.module
        if mod not in kernel_modules:
            kernel_modules[mod] = _kernel_module(mod)
        if kernel_modules[mod]:
            item.add_marker(pytest.mark.kernels)
    _heaviest_files_first(items)


def _heaviest_files_first(items) -> None:
    """pytest-xdist (`-n auto --dist loadfile`, the README's test command) hands whole files to its
    workers in collection order (pytest_configure turns off its own reordering by test count), so a
    long file that comes last keeps one worker busy after the others have finished. Files that start
    whole stacks (`slow`), processes or Triton-interpreter kernels go first; within a file the order
    stays as written."""
    weight: dict = {}
    first: dict = {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first.setdefault(path, i)
        # a stack a test starts itself weighs ten tests that share one; a kernel test through the
        # interpreter about as much as a test that talks to processes
        w = weight.setdefault(path, [0, 0, 0])
        w[0] += bool(item.get_closest_marker("slow"))
        w[1] += bool(item.get_closest_marker("integration"))
        w[2] += bool(item.get_closest_marker("kernels"))
    key = {p: -(10 * s + min(n, 5) + min(k, 5)) for p, (s, n, k) in weight.items()}
    items.sort(key=lambda item: (key[item.nodeid.split("::", 1)[0]], first[item.nodeid.split("::", 1)[0]]))


def pytest_sessionfinish(session, exitstatus):
    """Remove what the processes tests started left in the system's temporary directory (tests/stack.py:
    about a hundred run directories and logs a suite run) when this session (an xdist worker's own, under
    -n) had no failure."""
    import shutil

    import stack
    if session.testsfailed:
        return
    for path in stack.CREATED:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)


def pytest_configure(config):
    # xdist's loadfile scheduling sorts files by their number of tests unless told not to, which
    # would send the 2-test drain file last; the order above is the one wanted
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the CPUs this process may use (its affinity, not the host's
    count), since much of a test's time is spent waiting on the processes it started; at most 4:
    every worker starts its own stacks and checkpoints."""
    return min(len(os.sched_getaffinity(0)) + 1, 4)
