"""Journal storage that survives killed searches, and storage errors that name the fix.

A real child process takes the journal's lock and is SIGKILLed; a real study's
journal gets a torn last line. The resume must remove the stale lock at once
(with a message) and keep every complete trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage

from sweep import cli
from sweep.search import search
from sweep.search.storage import (JournalWarning, OwnedFileLock, StorageError, open_storage,
                                  repair_journal, with_driver)

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

ROOT = str(Path(__file__).resolve().parents[1])

#: 4 x 4 x 8 x 4 = 512 layouts of Llama3_70B on 1024 H100s.
SPEC = {"name": "tiny_search", "workload": "Llama3_70B", "fleet": "Training_1K",
        "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 8],
                 "microbatch_count": [1, 2, 4, 8, 16, 32, 64, 128], "zero_stage": [0, 1, 2, 3]},
        "fixed": {"batch_size": 1024}, "constraints": {"memory_limit": "72 GB"}}

TOML = """\
name = "tiny_search"
workload = "Llama3_70B"
fleet = "Training_1K"

[axes]
tp_size = [1, 2, 4, 8]
pp_size = [1, 2, 4, 8]
microbatch_count = [1, 2, 4, 8, 16, 32, 64, 128]
zero_stage = [0, 1, 2, 3]

[fixed]
batch_size = 1024

[constraints]
memory_limit = "72 GB"
"""

#: A search that takes the journal's lock to write and is killed holding it: fsync never returns.
HOLDER = """
import os, sys, time
sys.path.insert(0, {root!r})
from sweep import cli

def hang(fd):
    print("locked", flush=True)
    time.sleep(600)

os.fsync = hang
cli.main(["search", sys.argv[1], "--trials", "40", "--storage", sys.argv[2],
          "--study-name", "s", "--no-progress", "--seed", "1"])
"""


def _trials(path, name="s"):
    storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE]


def _kill_holding_the_lock(spec_file, journal) -> int:
    """Start a search that stops inside the journal's lock; SIGKILL it there; its pid."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=ROOT), str(spec_file),
                              str(journal)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
    finally:
        child.kill()
        child.wait(timeout=30)
    return child.pid


def test_resume_removes_a_lock_left_by_a_killed_search_at_once(tmp_path, capsys):
    spec_file, journal = tmp_path / "tiny.toml", tmp_path / "s.log"
    spec_file.write_text(TOML)
    assert cli.main(["search", str(spec_file), "--trials", "8", "--storage", str(journal),
                     "--study-name", "s", "--no-progress", "--seed", "0"]) == 0
    pid = _kill_holding_the_lock(spec_file, journal)
    assert Path(f"{journal}.lock").exists()  # what the kill left: a lock nobody will release
    assert json.loads(Path(f"{journal}.lock").read_text())["pid"] == pid
    capsys.readouterr()

    started = time.perf_counter()
    code = cli.main(["search", str(spec_file), "--trials", "16", "--storage", str(journal),
                     "--study-name", "s", "--no-progress", "--seed", "0"])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 0
    assert elapsed < 5.0, f"the resume waited {elapsed:.1f} s behind a dead owner's lock"
    assert f"warning: {journal}.lock: removed a stale lock left by pid {pid}" in err
    assert not Path(f"{journal}.lock").exists()
    assert len(_trials(journal)) == 16


def test_a_live_owners_lock_is_waited_for_and_an_unnamed_old_one_removed(tmp_path):
    journal = tmp_path / "s.log"
    journal.touch()
    lock_file = Path(f"{journal}.lock")
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from sweep.search.storage import _start_time

        lock_file.write_text(json.dumps({"host": os.uname().nodename, "pid": owner.pid,
                                         "start": _start_time(owner.pid)}))
        lock = OwnedFileLock(str(journal))
        taken = threading.Event()
        with pytest.warns(JournalWarning, match=f"left by pid {owner.pid}"):
            waiter = threading.Thread(target=lambda: (lock.acquire(), taken.set()))
            waiter.start()
            time.sleep(1.0)
            assert not taken.is_set(), "took the lock of a process that still runs"
            owner.kill()
            owner.wait(timeout=30)
            assert taken.wait(timeout=5.0)
            waiter.join()
        lock.release()
    finally:
        owner.kill()
        owner.wait(timeout=30)

    lock_file.write_text("")  # created, owner never written (or an optuna symlink lock)
    old = time.time() - 10
    os.utime(lock_file, (old, old))
    with pytest.warns(JournalWarning, match="unnamed owner"):
        assert OwnedFileLock(str(journal)).acquire()


def test_a_torn_last_line_is_cut_and_every_complete_trial_kept(tmp_path):
    journal = tmp_path / "s.log"
    search(SPEC, n_trials=12, seed=0, storage=journal, study_name="s", refine=0.0)
    before = {t.number: (t.params, t.values) for t in _trials(journal)}
    assert len(before) == 12
    whole = journal.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    torn = last[: len(last) // 2]  # a kill in the middle of writing one more record
    with open(journal, "ab") as f:
        f.write(torn)

    with pytest.warns(JournalWarning, match="cut a torn last line"):
        result = search(SPEC, n_trials=20, seed=0, storage=journal, study_name="s",
                        refine=0.0)
    after = {t.number: (t.params, t.values) for t in _trials(journal)}
    assert len(after) == 20 and result.n_new == 8
    assert {n: after[n] for n in before} == before
    backups = list(tmp_path.glob("s.log.torn-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == torn
    assert journal.read_bytes().startswith(whole)
    search(SPEC, n_trials=24, seed=0, storage=journal, study_name="s", refine=0.0)
    assert len(_trials(journal)) == 24  # the repaired journal reads and grows


def test_repair_leaves_a_whole_journal_alone(tmp_path):
    journal = tmp_path / "s.log"
    journal.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    assert repair_journal(journal) == 0
    assert journal.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    # A torn record, and after it one written by a resume that did not repair (not JSON).
    journal.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": 3, "d{"e": 5}\n')
    with pytest.warns(JournalWarning, match="cut a torn last line"):
        assert repair_journal(journal) == len(b'{"c": 3, "d{"e": 5}\n')
    assert journal.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


@pytest.mark.parametrize("storage, named", [
    ("/nonexistent/s.log", "/nonexistent does not exist"),
    ("journal:///nonexistent/s.log", "'/nonexistent/s.log'.*/nonexistent does not exist"),
    ("sqlite:////nonexistent/x.db", "/nonexistent does not exist"),
    ("nosuchdialect://host/db", "expected an RDB URL SQLAlchemy knows"),
])
def test_storage_that_cannot_open_names_itself(storage, named):
    with pytest.raises(StorageError, match=named) as err:
        open_storage(storage)
    if not storage.startswith("journal:"):
        assert repr(storage) in str(err.value)


def test_postgresql_without_a_driver_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # import psycopg2 -> ImportError
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StorageError, match=r"needs the database driver 'psycopg2?'.*"
                                           r"layout-sweep\[postgres\]"):
        open_storage("postgresql://nobody:secret@127.0.0.1:9/x")


def test_postgresql_url_uses_psycopg3_when_psycopg2_is_absent(monkeypatch):
    import psycopg  # noqa: F401 - the [postgres] and [test] extras install psycopg 3
    from sqlalchemy.engine import make_url

    monkeypatch.setitem(sys.modules, "psycopg2", None)
    url = with_driver("postgresql://u@h/db")
    assert make_url(url).get_dialect().driver == "psycopg"  # SQLAlchemy 2.0 would want psycopg2
    assert url in ("postgresql://u@h/db", "postgresql+psycopg://u@h/db")
    assert with_driver("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    # Nothing listens on port 9: the driver is found and the error is the server's, password hidden.
    with pytest.raises(StorageError, match="cannot open the database.*refused") as err:
        open_storage("postgresql://nobody:secret@127.0.0.1:9/x")
    assert "secret" not in str(err.value) and "'postgresql://nobody:***@127.0.0.1:9/x'" in \
        str(err.value)
