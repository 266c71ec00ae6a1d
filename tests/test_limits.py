"""Memory limits (issue #11.1): one parser, reached through every public entry point.

Refused everywhere with a suggestion: a negative or zero size, a size that
overflows, and a bare number in (1, 1e6) (``80`` is far more likely 80 GB than
80 bytes). Accepted with the right bytes: ``"80 GiB"``, ``"80e9 B"``, a
fraction ``0.9`` of the accelerator's memory, and bare bytes ``8e10``.
"""

from __future__ import annotations

import numpy as np
import pytest

import solver
import sweep
from sweep import cli
from sweep.limits import MemoryLimitError

#: 2 x 2 x 2 = 8 layouts of Llama3_70B on 1024 H100s (80 GiB each).
SPEC = {"name": "limits", "workload": "Llama3_70B", "fleet": "Training_1K",
        "outputs": ["mfu", "step_latency_total", "memory_footprint", "feasible"],
        "axes": {"tp_size": [4, 8], "pp_size": [4, 8], "zero_stage": [1, 3]},
        "fixed": {"batch_size": 1024}}
CAPACITY = solver.catalog.fleet("Training_1K").node.accelerator.memory_capacity

REFUSED = [("-5 GB", "finite size > 0"), ("0 GB", "finite size > 0"),
           ("1e400 GB", "finite size > 0"), (80, "did you mean '80 GB'"),
           ("80", "did you mean '80 GB'"), (0, "a limit is finite and > 0"),
           (-0.5, "a limit is finite and > 0"), ("1 B", "at least 1 MB"),
           ("1e-300 GB", "at least 1 MB"), (80000, "did you mean '80000 MB'")]
ACCEPTED = [("80 GiB", 80 * 2**30), ("80e9 B", 80e9), (0.9, 0.9 * CAPACITY), (8e10, 8e10),
            ("72 GB", 72e9)]


def _spec(limit):
    return {**SPEC, "constraints": {"memory_limit": limit}}


@pytest.fixture(scope="module")
def cube():
    return sweep.run(SPEC)


@pytest.mark.parametrize("limit, message", REFUSED)
def test_search_refuses(limit, message):
    with pytest.raises(MemoryLimitError, match=message):
        sweep.search(SPEC, mode="exact", memory_limit=limit)


@pytest.mark.parametrize("limit, message", REFUSED)
def test_a_spec_refuses(limit, message):
    with pytest.raises(ValueError, match=message) as caught:
        sweep.load_spec(_spec(limit))
    assert "memory_limit" in str(caught.value)


@pytest.mark.parametrize("limit, message", REFUSED)
def test_top_k_refuses(cube, limit, message):
    with pytest.raises(MemoryLimitError, match=message):
        sweep.top_k(cube, constraints={"memory_limit": limit})


@pytest.mark.parametrize("limit", ["80", "-5 GB", "0 GB", "1e400 GB", "5e5"])
def test_the_command_line_refuses(tmp_path, capsys, limit):
    path = sweep.save(sweep.run(SPEC), tmp_path / "limits.nc")
    for argv in (["top", str(path), "--memory-limit", limit],
                 ["search", "unused.toml", "--memory-limit", limit]):
        assert cli.main(argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert "--memory-limit" in err and "expected" in err and "but got" in err
        if limit in ("80", "5e5"):  # GB up to 4096 (no accelerator holds 4 TB), MB past it
            assert f"did you mean '{float(limit):g} {'GB' if limit == '80' else 'MB'}'" in err


@pytest.mark.parametrize("limit, size", ACCEPTED)
def test_accepted_everywhere_with_the_right_bytes(cube, limit, size):
    spec = sweep.load_spec(_spec(limit))
    assert spec.memory_limit_for(spec.fleets["Training_1K"]) == pytest.approx(size, rel=1e-12)
    result = sweep.search(SPEC, mode="exact", memory_limit=limit)
    assert list(result.memory_limits.values()) == [pytest.approx(size, rel=1e-12)]
    got = sweep.top_k(cube, k=8, constraints={"memory_limit": limit}, collapse_ties=False)
    fits = cube["admissible"] & (cube["memory_footprint"] <= size)
    assert got.sizes["rank"] == int(fits.sum())
    assert (got["memory_footprint"] <= size).all()


def test_the_command_line_accepts_the_right_bytes(tmp_path, capsys):
    path = sweep.save(sweep.run(SPEC), tmp_path / "limits.nc")
    cube = sweep.open_cube(path)
    assert int((cube["admissible"] & (cube["memory_footprint"] <= 80 * 2**30)).sum()) > 0
    for text, size in (("80 GiB", 80 * 2**30), ("0.2", 0.2 * CAPACITY), ("3e10", 3e10)):
        code = cli.main(["top", str(path), "--memory-limit", text, "-k", "8", "--keep-ties"])
        out = capsys.readouterr().out
        count = int((cube["admissible"] & (cube["memory_footprint"] <= size)).sum())
        if count:
            assert code == 0 and f"of {count} admissible layouts" in out
        else:
            assert code == cli.EXIT_EMPTY
    assert np.isfinite(float(cube["memory_footprint"].max()))
    cube.close()


def test_a_limit_above_the_memory_is_the_memory_with_a_warning():
    """A layout must fit the device: with a limit of 1 TB on 80 GiB H100s, layouts needing
    hundreds of GB had been admissible (feasible False, ranked among the best)."""
    hungry = {**SPEC, "axes": {"tp_size": [1, 2, 8], "pp_size": [1, 8], "zero_stage": [0, 1]}}
    capped = sweep.run(hungry)
    assert bool((capped["memory_footprint"] > CAPACITY).any())  # some layouts do not fit
    with pytest.warns(sweep.limits.MemoryLimitWarning, match=r"above the accelerator's memory"):
        spec = sweep.load_spec({**hungry, "constraints": {"memory_limit": "1 TB"}})
        assert spec.memory_limit_for(spec.fleets["Training_1K"]) == CAPACITY
        loose = sweep.run({**hungry, "constraints": {"memory_limit": "1 TB"}})
    assert not bool((loose["admissible"] & ~loose["feasible"]).any())
    assert bool((loose["admissible"] == capped["admissible"]).all())  # the capacity's, no more
    with pytest.warns(sweep.limits.MemoryLimitWarning):
        result = sweep.search(hungry, mode="exact", memory_limit="1 TB")
    assert list(result.memory_limits.values()) == [CAPACITY]
    assert result.best_params is not None
    # asked of a cube, a limit above the accelerator's memory is that memory, with the
    # warning (it had been taken as asked, so where='valid' ranked layouts that do not fit)
    with pytest.warns(sweep.limits.MemoryLimitWarning, match=r"above the accelerator's memory"):
        top = sweep.top_k(capped, k=12, constraints={"memory_limit": "1 TB"})
    assert top.equals(sweep.top_k(capped, k=12))
    with pytest.warns(sweep.limits.MemoryLimitWarning):
        valid = sweep.top_k(capped, k=12, where="valid", collapse_ties=False,
                            constraints={"memory_limit": "1 TB"})
    assert bool(valid["feasible"].all())
    assert bool((valid["memory_footprint"] <= CAPACITY).all())


def test_units_take_the_si_kilo_and_suggest_the_case():
    from solver.units import parse_quantity

    assert parse_quantity("500 kB", "bytes") == parse_quantity("500 KB", "bytes") == 5e5
    assert sweep.limits.parse_memory_limit("72000 kB").size == 72e6
    with pytest.raises(MemoryLimitError, match=r"unknown unit 'gb'; did you mean 'GB'\?"):
        sweep.search(SPEC, mode="exact", memory_limit="72 gb")
    with pytest.raises(ValueError, match=r"unknown unit 'gbps'; did you mean 'Gbps'\?"):
        parse_quantity("400 gbps", "bandwidth")
