"""The launchers of topoplan.runtime.transports.launch: threads and spawned processes, results in
rank order, the lowest rank's error, and ranks that die without a word."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.support import launch_ranks
from topoplan.errors import TopoplanError, TransportError
from topoplan.runtime.transports import Local
from topoplan.runtime.transports.launch import free_port, run_processes, run_threads


def test_threads_return_results_in_rank_order_and_say_who_left():
    left: list[tuple[int, str, bool]] = []
    lock = threading.Lock()

    def leave(rank: int, why: str, *, failed: bool) -> None:
        with lock:
            left.append((rank, why, failed))

    names = run_threads(3, lambda t: (t, threading.current_thread().name), lambda r: r * 10,
                        leave=leave, name="t")
    assert names == [(0, "t-0"), (10, "t-1"), (20, "t-2")]
    assert sorted(left) == [(0, "finished", False), (1, "finished", False),
                            (2, "finished", False)]


def test_threads_raise_the_lowest_ranks_error_or_return_it():
    def fn(rank: int) -> int:
        if rank in (1, 2):
            raise KeyError(rank)
        return rank

    with pytest.raises(KeyError, match="1"):
        run_threads(3, fn, lambda r: r)
    out = run_threads(3, fn, lambda r: r, return_exceptions=True)
    assert out[0] == 0 and [type(e) for e in out[1:]] == [KeyError, KeyError]


def test_local_launch_runs_on_the_thread_launcher():
    assert Local.launch(3, lambda t: (t.rank, t.size)) == [(0, 3), (1, 3), (2, 3)]
    out = Local.launch(2, lambda t: 1 / t.rank, return_exceptions=True)
    assert isinstance(out[0], ZeroDivisionError) and out[1] == 1.0


def test_processes_connect_run_and_close_each_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOPLAN_TEST_CLOSED", str(tmp_path))
    out = run_processes(2, launch_ranks.report, ("x",), launch_ranks.connect,
                        close=launch_ranks.close, timeout=60)
    assert out == [(0, 2, "x"), (1, 2, "x")]
    assert len(list(tmp_path.iterdir())) == 2


def test_processes_report_errors_and_ranks_that_died_without_a_word():
    out = run_processes(3, launch_ranks.fail_on, (1, 2), launch_ranks.connect, timeout=60,
                        return_exceptions=True)
    assert out[0] == 0
    assert isinstance(out[1], ValueError) and "rank 1 refuses" in str(out[1])
    assert isinstance(out[2], TransportError)
    assert "rank 2 exited with code 7 before reporting a result" in str(out[2])
    with pytest.raises(ValueError, match="rank 1 refuses"):
        run_processes(3, launch_ranks.fail_on, (1, 2), launch_ranks.connect, timeout=60)


def test_forked_ranks_get_the_callers_environment_of_the_moment(tmp_path, monkeypatch):
    """Under ``forkserver`` the ranks fork from a server started earlier (by another
    test, maybe): each still sees the variables the caller set just before, as spawned
    ranks do (launch_ranks.close reads TOPOPLAN_TEST_CLOSED), and reports what it ran."""
    monkeypatch.delenv("TOPOPLAN_TEST_CLOSED", raising=False)
    assert run_processes(1, launch_ranks.report, ("x",), launch_ranks.connect, timeout=60,
                         start_method="forkserver") == [(0, 1, "x")]  # the server is up
    monkeypatch.setenv("TOPOPLAN_TEST_CLOSED", str(tmp_path))
    out = run_processes(2, launch_ranks.report, ("y",), launch_ranks.connect,
                        close=launch_ranks.close, timeout=60, start_method="forkserver")
    assert out == [(0, 2, "y"), (1, 2, "y")]
    assert len(list(tmp_path.iterdir())) == 2
    with pytest.raises(TopoplanError, match="start_method 'fork': expected 'spawn' or "
                                            "'forkserver'"):
        run_processes(1, launch_ranks.report, ("z",), launch_ranks.connect, start_method="fork")


def test_free_port_can_be_bound_on_loopback():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
