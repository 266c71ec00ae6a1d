"""Session hooks shared by the test files."""

import pathlib
import re

import pytest

_MEGATRON = re.compile(r"megatron|_MC\b", re.IGNORECASE)


def _reaches_megatron(item, cache):
    """Whether a test may call the megatron physics' fused kernel: its module's source, or
    its own id (a notebook's name, a parameter), names the megatron physics or a megatron
    catalog entry (``*_MC``). A test that does without saying so only runs sooner than it
    would (and, where the kernel is not in numba's cache yet, compiles it itself)."""
    path = pathlib.Path(item.path)
    if path not in cache:
        cache[path] = bool(_MEGATRON.search(path.read_text(encoding="utf-8")))
    return cache[path] or bool(_MEGATRON.search(item.nodeid))


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(session, config, items):
    """Start each collected test module's background work (``start_in_background``), once,
    as soon as the session knows which tests it runs, and run the tests that do not reach
    the megatron kernel first.

    tests/test_fused_vectorized.py's probe compiles the fused kernels into numba's cache in
    an interpreter of its own, on the second core (the megatron kernel takes some three
    minutes of one core to compile). The tests that never call that kernel (about half the
    suite's time) run meanwhile; the first call of those that do waits for the probe
    (``wait_until_warm``) and reads the kernel from the cache, instead of compiling it a
    second time beside the probe.
    """
    if config.option.collectonly:
        return
    cache = {}
    late = [_reaches_megatron(item, cache) for item in items]
    items[:] = ([item for item, x in zip(items, late) if not x]
                + [item for item, x in zip(items, late) if x])
    started = set()
    for item in items:
        module = getattr(item, "module", None)
        start = getattr(module, "start_in_background", None)
        if start is not None and module.__name__ not in started:
            started.add(module.__name__)
            start()
            wait = getattr(module, "wait_until_warm", None)
            if wait is not None:
                _wait_before_compiling(wait)


def _wait_before_compiling(wait):
    """Make the megatron kernel's first compile of this session wait for ``wait()``."""
    try:
        from solver.fused import megatron_kernel as mk
    except ImportError:  # no numba: nothing compiles
        return
    if not mk._CACHE:  # the kernel does not read numba's cache: the probe's compile is its own
        return
    compile_ = mk._compile

    def waiting(*args, **kwargs):
        wait()
        mk._compile = compile_
        return compile_(*args, **kwargs)

    mk._compile = waiting
