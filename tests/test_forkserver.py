"""The suite's fork server (``tests/_support/forkserver.py``): a forked child must look to the
tests like the exec'd process it replaces, and a broken server must fail loudly.

Each check runs a probe module both ways, forked from a private server (so killing it here
cannot break the other tests of this pytest process) and exec'd, and compares what it saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import forkserver, sqlqueue_command, wait_until

pytestmark = pytest.mark.timeout(120)

PROBE = '''\
"""What a child process sees of its start: python -m probe MODE."""
import atexit, json, os, signal, sys, threading, time

def report():
    names = ("SIGINT", "SIGPIPE", "SIGCHLD", "SIGTERM", "SIGXFSZ", "SIGHUP")
    return {
        "argv0": os.path.basename(sys.argv[0]),
        "args": sys.argv[1:],
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE")},
        "stdin": sys.stdin.read(),
        "stdout": [sys.stdout.name, sys.stdout.line_buffering, sys.stdout.write_through,
                   sys.stdout.encoding, sys.stdout.errors],
        "stderr": [sys.stderr.name, sys.stderr.line_buffering, sys.stderr.errors],
        "signals": {n: str(signal.getsignal(getattr(signal, n))) for n in names},
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3],
        "more_fds": len(os.listdir("/proc/self/fd")) > 4,
        "threads": threading.active_count(),
        "main": sys.modules["__main__"].__name__,
    }

mode = sys.argv[1]
if mode == "report":
    print(json.dumps(report()))
elif mode == "exit":
    print("out")
    print("err", file=sys.stderr)
    sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
elif mode == "raise":
    raise ValueError("from the probe")
elif mode == "interrupt":
    raise KeyboardInterrupt
elif mode == "finish":
    def late():
        time.sleep(0.3)
        print("thread done", flush=True)
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran"))
    sys.stdout.write("buffered, no newline")
elif mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(60)
'''


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A fork server of this module's own."""
    client = forkserver._Client()
    yield client
    client.close()


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def probe(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe", *args]


def both(server: Any, argv: list[str], cwd: Path, **env: str) -> tuple[Any, Any]:
    """``argv`` forked and exec'd: (forked, exec'd) CompletedProcess."""
    environment = {**os.environ, **env}
    forked = server.run(argv, environment, cwd, 60)
    fresh = forkserver.run(argv, env=environment, cwd=cwd, timeout=60, fresh=True)
    return forked, fresh


def test_a_forked_child_starts_as_an_execd_one(server: Any, probe_dir: Path) -> None:
    stdin = probe_dir / "stdin.txt"
    stdin.write_text("typed in\n")
    seen = []
    for fresh in (False, True):
        out = probe_dir / f"out-{fresh}.txt"
        with stdin.open("rb") as given, out.open("wb") as taken:
            argv = probe("report", "x y")
            environment = {**os.environ, "PROBE_VALUE": "1", "PYTHONUNBUFFERED": "1"}
            if fresh:
                process: forkserver.Process = subprocess.Popen(
                    argv, env=environment, cwd=probe_dir, stdin=given, stdout=taken
                )
            else:
                process = server.spawn(argv, environment, probe_dir, (given, taken, None))
            assert process.wait(60) == 0
        seen.append(json.loads(out.read_text()))
    forked, execd = seen
    assert forked == execd
    assert forked["stdin"] == "typed in\n"
    assert forked["stdout"][2] is True  # PYTHONUNBUFFERED: write-through
    assert forked["signals"]["SIGINT"] == str(signal.default_int_handler)


def test_the_console_script_runs_as_installed(server: Any, tmp_path: Path) -> None:
    forked, execd = both(server, [*sqlqueue_command(), "stats", "--help"], tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        execd.returncode,
        execd.stdout,
        execd.stderr,
    )
    assert forked.stdout.startswith("usage: sqlqueue stats")


@pytest.mark.parametrize(
    "args",
    [("exit", "0"), ("exit", "3"), ("exit", "a message"), ("raise",), ("finish",)],
    ids=["exit 0", "exit 3", "exit message", "traceback", "threads and atexit"],
)
def test_an_exit_is_the_interpreters(server: Any, probe_dir: Path, args: tuple[str, ...]) -> None:
    forked, execd = both(server, probe(*args), probe_dir)
    assert (forked.returncode, forked.stdout) == (execd.returncode, execd.stdout)
    assert forked.stderr.splitlines()[-1:] == execd.stderr.splitlines()[-1:]
    assert ("Traceback" in forked.stderr) == ("Traceback" in execd.stderr)


def test_an_uncaught_keyboard_interrupt_dies_of_sigint(server: Any, probe_dir: Path) -> None:
    forked, execd = both(server, probe("interrupt"), probe_dir)
    assert forked.returncode == execd.returncode == -signal.SIGINT
    assert "KeyboardInterrupt" in forked.stderr


def test_signals_waits_and_timeouts_as_popen(server: Any, probe_dir: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        process = server.spawn(probe("sleep"), None, probe_dir, (None, subprocess.DEVNULL, None))
        assert process.pid > 0
        assert process.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
        process.send_signal(sig)
        assert process.wait(timeout=30) == -sig
        assert process.returncode == -sig
        process.kill()  # after the exit: nothing to signal, as Popen

    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        server.run(probe("sleep"), None, probe_dir, 0.5)
    assert time.monotonic() - began < 30
    assert timed_out.value.output == "sleeping\n"


def test_a_signal_never_waits_for_a_wait_in_another_thread(server: Any, probe_dir: Path) -> None:
    process = server.spawn(probe("sleep"), None, probe_dir, (None, subprocess.DEVNULL, None))
    waited: list[int] = []
    waiter = threading.Thread(target=lambda: waited.append(process.wait(60)))
    waiter.start()
    wait_until(process._lock.locked, what="the other thread to wait")
    process.terminate()
    waiter.join(30)
    assert waited == [-signal.SIGTERM]


def test_a_signal_sent_at_once_is_not_lost(server: Any, probe_dir: Path) -> None:
    """The server ignores SIGINT; its child blocks signals until its handlers are reset."""
    for _ in range(5):
        process = server.spawn(probe("sleep"), None, probe_dir, (None, subprocess.DEVNULL, None))
        process.send_signal(signal.SIGINT)
        # Killed by it, or a KeyboardInterrupt (exit 1) if it came during the start-up code.
        assert process.wait(30) in (-signal.SIGINT, 1)


def test_exec_is_used_when_asked(monkeypatch: pytest.MonkeyPatch, probe_dir: Path) -> None:
    monkeypatch.setenv(forkserver.EXEC_VARIABLE, "1")
    process = forkserver.spawn(probe("exit", "0"), cwd=probe_dir, stdout=subprocess.DEVNULL)
    assert isinstance(process, subprocess.Popen)
    assert process.wait(60) == 0
    monkeypatch.delenv(forkserver.EXEC_VARIABLE)
    monkeypatch.setenv("COVERAGE_PROCESS_START", "pyproject.toml")
    assert forkserver.exec_reason() == "coverage measures subprocesses (COVERAGE_PROCESS_START)"


def test_what_a_fork_cannot_honour_is_refused(server: Any, probe_dir: Path) -> None:
    with pytest.raises(forkserver.ForkServerError, match=r"\$PYTHONPATH .*\(fresh=True\)"):
        server.run(probe("exit", "0"), {**os.environ, "PYTHONPATH": "elsewhere"}, probe_dir, 60)
    with pytest.raises(forkserver.ForkServerError, match="console scripts"):
        server.run(["/bin/true"], None, probe_dir, 60)


def test_a_dead_server_fails_loudly(probe_dir: Path) -> None:
    client = forkserver._Client()
    try:
        running = client.spawn(probe("sleep"), None, probe_dir, (None, subprocess.DEVNULL, None))
        client.server.kill()
        client.server.wait(30)
        with pytest.raises(forkserver.ForkServerError, match="dropped pid"):
            running.wait(30)
        with pytest.raises(forkserver.ForkServerError, match="is gone"):
            client.run(probe("exit", "0"), None, probe_dir, 60)
    finally:
        os.kill(running.pid, signal.SIGKILL)
        client.close()
