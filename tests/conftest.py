"""Session hooks shared by the test files."""


def pytest_collection_modifyitems(session, config, items):
    """Start each collected test module's background work (``start_in_background``), once,
    as soon as the session knows which tests it runs: tests/test_fused_vectorized.py's probe
    compiles the kernels in an interpreter of its own, beside the suite's first tests."""
    started = set()
    for item in items:
        module = getattr(item, "module", None)
        start = getattr(module, "start_in_background", None)
        if start is not None and module.__name__ not in started:
            started.add(module.__name__)
            start()
