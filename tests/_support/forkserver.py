"""A fork server ("zygote") for the suite's child processes: ``sqlqueue ARGS`` and
``python -m MODULE ARGS`` started by forking an interpreter that has already imported them.

Why: a child's CPU was mostly its imports. Each ``sqlqueue`` run and each worker process spent
about 0.75 s of CPU starting Python and importing sqlqueue, SQLAlchemy and the drivers before
doing a few milliseconds of work, hundreds of times per suite on a 2-core machine. Each pytest
process (each xdist worker) starts one server, lazily, as a fresh interpreter
(``python -m tests._support.forkserver``; never a fork of pytest, which has threads and open
connections). It imports what the children need, opens no database connection, starts no
thread and runs no event loop, then forks one child per request: the child takes the client's
stdin, stdout and stderr, its working directory, environment and arguments, and runs the
target as the interpreter would (``sqlqueue`` by its console-script entry point, ``-m`` by
``runpy``), exiting as the interpreter does: ``SystemExit`` codes, a traceback and exit 1,
non-daemon threads joined, ``atexit`` handlers run, stdio flushed.

:func:`spawn` gives a :class:`Process` (the part of ``subprocess.Popen`` the tests use) and
:func:`run` a ``CompletedProcess[str]``. With ``fresh=True``, with ``SQLQUEUE_TEST_EXEC=1``, and
while coverage measures subprocesses (``COVERAGE_PROCESS_START`` or ``COVERAGE_PROCESS_CONFIG``:
a fork of the zygote would not be measured) they exec a real interpreter instead. A server that
died or cannot be reached is an error (:class:`ForkServerError`), never a silent fallback.

What differs from exec, and how it is handled:

- Modules are already imported, so code that runs at import time ran once, in the server, with
  its environment (the pytest process's, without ``SQLQUEUE_*``). sqlqueue reads no environment
  variable at import time (``SQLQUEUE_DATABASE_URL``, ``SQLQUEUE_SCHEMA``,
  ``SQLQUEUE_ENCRYPTION_KEYS`` and ``SQLQUEUE_WEB_SECRET`` are read where used); SQLAlchemy
  (``DISABLE_SQLALCHEMY_CEXT_RUNTIME``), psycopg (``PSYCOPG_IMPL``) and OpenTelemetry
  (``OTEL_PYTHON_CONTEXT``) read theirs at import, and the suite sets none of them. The test
  apps that read the environment at import (``tests.apps.ledger_app``, ``ops_app``,
  ``fault_app``) are not imported by the server; the children import them. ``os.environ`` is
  replaced in place, so code holding it (a default argument) sees the child's.
- Interpreter start-up settings cannot change after start: a request whose ``PYTHON*``,
  ``LANG`` or ``LC_*`` variables differ from the server's is refused (``PYTHONUNBUFFERED``
  excepted: the child's stdio is rebuilt with it). So is a module shadowed through
  ``PYTHONPATH``, as an already imported driver cannot be: such tests pass ``fresh=True``, as
  does a fault worker whose clock must be skewed before sqlqueue is imported.
- Randomness drawn at import time is shared by every child: the string hash seed, and any
  module-level secret, which is why ``sqlqueue.web`` (its per-process CSRF key) is not
  pre-imported. ``random`` is reseeded in each child by CPython's own fork hook.
- The children are the server's, not pytest's: signals go through the server, which knows
  whether the process was already reaped (so a reused pid is never signalled). ``ps`` shows
  them with the server's command line, and they run the code as it was when the server
  started (as pytest itself does), not as edited since.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.metadata
import io
import json
import locale
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol

__all__ = [
    "EXEC_VARIABLE",
    "ForkServerError",
    "ForkedProcess",
    "Process",
    "exec_reason",
    "run",
    "spawn",
]

#: ``SQLQUEUE_TEST_EXEC=1``: every child is exec'd, as before the fork server.
EXEC_VARIABLE = "SQLQUEUE_TEST_EXEC"

#: What the server imports before it forks: what the CLI and the worker processes import,
#: never a module with import-time side effects (an environment read, a connection, a thread,
#: a per-process secret). ``-m`` targets themselves are not imported either (runpy runs them).
PRELOAD = (
    "sqlqueue",
    "sqlqueue.cli",
    # What the commands and a worker run: `import sqlqueue` and the CLI's parser load none of it.
    "sqlqueue.cli._run",
    "sqlqueue._worker.loop",
    "sqlqueue.dialects.postgresql",
    "sqlqueue.dialects.mysql",
    "sqlqueue.dialects.sqlite",
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql.psycopg",
    "sqlalchemy.dialects.mysql.pymysql",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sqlalchemy.pool",
    "psycopg",
    "pymysql",
    "alembic.command",
    "alembic.config",
    "alembic.runtime.migration",
    "tests.apps.ledger",
    "tests.apps.fault_hooks",
)

_REPO_ROOT = Path(__file__).resolve().parents[2]
#: The largest request: argv, environment and working directory as JSON.
_MAX_MESSAGE = 1 << 20
#: Set when coverage measures subprocesses: a child must then be exec'd to be measured.
_COVERAGE_VARIABLES = ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")
#: Set by the child's stdio rebuild rather than at interpreter start, so it may differ.
_REBUILT_SETTINGS = {"PYTHONUNBUFFERED"}


class ForkServerError(RuntimeError):
    """The fork server died, could not be started, or refused a request."""


class Process(Protocol):
    """The part of ``subprocess.Popen`` the tests use, which :class:`ForkedProcess` has too."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


Stream = int | IO[Any] | None


def exec_reason() -> str | None:
    """Why children must be exec'd rather than forked now, or ``None`` if they may be forked."""
    if os.environ.get(EXEC_VARIABLE) == "1":
        return f"{EXEC_VARIABLE}=1"
    for name in _COVERAGE_VARIABLES:
        if os.environ.get(name):
            return f"coverage measures subprocesses ({name})"
    return None


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: Stream = None,
    stdout: Stream = None,
    stderr: Stream = None,
    fresh: bool = False,
) -> Process:
    """Start ``argv`` (``[sys.executable, "-m", MODULE, ...]`` or an installed console script)
    like ``subprocess.Popen``: forked from the fork server, or exec'd if ``fresh`` or
    :func:`exec_reason` says so. Streams are ``None`` (ours), a file, a descriptor,
    ``subprocess.DEVNULL`` or, for ``stderr``, ``subprocess.STDOUT``."""
    if fresh or exec_reason() is not None:
        return subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
    return _client().spawn(argv, env, cwd, (stdin, stdout, stderr))


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)``,
    forked from the fork server unless ``fresh`` or :func:`exec_reason`: a child still running
    at ``timeout`` is killed and ``subprocess.TimeoutExpired`` raised."""
    if fresh or exec_reason() is not None:
        return subprocess.run(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return _client().run(argv, env, cwd, timeout)


def _text(file: IO[bytes]) -> str:
    """A captured stream as ``subprocess.run(text=True)`` gives it (universal newlines)."""
    file.seek(0)
    data = file.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


# -- the client side (in the pytest process) ---------------------------------------------------


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket) -> dict[str, Any] | None:
    """The next message the server sent on ``sock`` (a few bytes), or ``None`` at its end."""
    data = sock.recv(4096)
    if not data:
        return None
    message: dict[str, Any] = json.loads(data)
    return message


class ForkedProcess:
    """A child of the fork server, handled like ``subprocess.Popen``: its pid at once, its exit
    status (negative: killed by that signal) when the server reaps it. Thread-safe as Popen is:
    a ``poll`` while another thread waits returns ``None`` rather than block."""

    def __init__(self, args: list[str], sock: socket.socket, pid: int, describe: Callable[[], str]):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()  # held while reading the server's messages
        self._send_lock = threading.Lock()
        self._describe = describe

    def __repr__(self) -> str:
        return f"<ForkedProcess pid {self.pid} returncode {self.returncode} args {self.args!r}>"

    def poll(self) -> int | None:
        """The exit status if the child has exited, else ``None``."""
        if self._lock.acquire(blocking=False):
            try:
                while self.returncode is None and self._read(0) is not None:
                    pass
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit and return its status; ``subprocess.TimeoutExpired``
        after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.returncode is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                self._read(remaining)
            return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child unless it has exited. The server sends it (it knows whether
        the pid was reaped) and says so; that answer is awaited unless another thread is in
        :meth:`wait`, which reads it instead (as ``Popen``, a signal never waits on a wait)."""
        self.poll()
        sock = self._sock
        if self.returncode is not None or sock is None:
            return
        # On OSError the server has closed the connection: the exit status is coming.
        with self._send_lock, contextlib.suppress(OSError):
            _send(sock, {"signal": int(sig)})
        if self._lock.acquire(blocking=False):
            try:
                while self.returncode is None:
                    if (self._read(None) or {}).get("ack"):
                        break
            finally:
                self._lock.release()

    def terminate(self) -> None:
        """``send_signal(SIGTERM)``."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """``send_signal(SIGKILL)``."""
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        """Read one message (waiting at most ``timeout`` seconds, ``None`` for ever) and take
        in an exit status; ``None`` if none came. Called with the lock held."""
        sock = self._sock
        if sock is None:
            return None
        sock.settimeout(timeout)
        try:
            message = _receive(sock)
        except (TimeoutError, BlockingIOError):
            return None
        except ConnectionResetError:
            message = None
        if message is None:
            self._close()
            raise ForkServerError(
                f"the fork server dropped pid {self.pid} before it exited\n{self._describe()}"
            )
        if "exit" in message:
            self.returncode = int(message["exit"])
            self._close()
        return message

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __del__(self) -> None:
        self._close()


class _Client:
    """This process's fork server: started on first use, ended when this process exits (the
    server reads its stdin, a pipe from here, and leaves at end of file)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.directory = Path(tempfile.mkdtemp(prefix="sqlqueue-forkserver-"))
        self.path = str(self.directory / "socket")
        self.log_path = self.directory / "server.log"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.path)
            listener.listen(64)
            environment = {k: v for k, v in os.environ.items() if not _unshared(k)}
            with self.log_path.open("wb") as log:
                self.server = subprocess.Popen(
                    [sys.executable, "-m", "tests._support.forkserver", str(listener.fileno())],
                    cwd=_REPO_ROOT,
                    env=environment,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=[listener.fileno()],
                )
        finally:
            listener.close()  # the server's now; connections queue until it accepts them
        atexit.register(self.close)

    def describe(self) -> str:
        """The server's state and log, for errors."""
        status = self.server.poll()
        state = "running" if status is None else f"exited with status {status}"
        try:
            log = self.log_path.read_text(errors="replace")[-4000:]
        except OSError as error:
            log = f"(no log: {error})"
        return f"fork server pid {self.server.pid} {state}; its log:\n{log}"

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | Path | None,
        streams: tuple[Stream, Stream, Stream],
    ) -> ForkedProcess:
        """Ask the server for a child; return its handle once the server has forked it."""
        if self.server.poll() is not None:
            raise ForkServerError(f"the fork server is gone\n{self.describe()}")
        args = [str(arg) for arg in argv]
        request = {
            "argv": args,
            "env": dict(os.environ if env is None else env),
            "cwd": str(Path.cwd() if cwd is None else cwd),
        }
        opened: list[int] = []
        try:
            fds = _descriptors(streams, opened)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(self.path)
                _send(sock, request, fds)
                reply = _receive(sock)
            except OSError as error:
                sock.close()
                raise ForkServerError(
                    f"the fork server is unreachable: {error}\n{self.describe()}"
                ) from error
        finally:
            for fd in opened:
                os.close(fd)
        if reply is None or "pid" not in reply:
            sock.close()
            if reply is not None and "error" in reply:
                raise ForkServerError(
                    f"the fork server refused {request['argv']}: {reply['error']}"
                )
            raise ForkServerError(f"the fork server died\n{self.describe()}")
        return ForkedProcess(args, sock, int(reply["pid"]), self.describe)

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | Path | None,
        timeout: float | None,
    ) -> subprocess.CompletedProcess[str]:
        """:func:`run` on this server: the output captured in temporary files."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            process = self.spawn(argv, env, cwd, (None, out, err))
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise subprocess.TimeoutExpired(
                    list(argv), timeout or 0, output=_text(out), stderr=_text(err)
                ) from None
            return subprocess.CompletedProcess(list(argv), code, _text(out), _text(err))

    def close(self) -> None:
        """End the server (it leaves at end of file on its stdin) and remove its directory."""
        if self.server.stdin is not None:
            self.server.stdin.close()
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _unshared(name: str) -> bool:
    """Whether the server starts without the variable ``name``: sqlqueue's settings (each child
    gets its own) and coverage's start-up (a server under coverage would measure nothing)."""
    return name.startswith("SQLQUEUE_") or name in _COVERAGE_VARIABLES


def _descriptors(streams: tuple[Stream, Stream, Stream], opened: list[int]) -> list[int]:
    """The three descriptors the child's 0, 1 and 2 become (``opened``: ours to close)."""
    fds: list[int] = []
    for number, stream in enumerate(streams):
        if stream is None:
            fds.append(number)
        elif stream == subprocess.DEVNULL:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
        elif stream == subprocess.STDOUT and number == 2:
            fds.append(fds[1])
        elif isinstance(stream, int) and stream >= 0:
            fds.append(stream)
        elif isinstance(stream, int):
            raise ValueError(f"the fork server cannot give a child stream {stream} (a pipe?)")
        else:
            fds.append(stream.fileno())
    return fds


_CLIENT: _Client | None = None
_CLIENT_LOCK = threading.Lock()


def _client() -> _Client:
    """This process's fork server, started on first use."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None or _CLIENT.owner != os.getpid():
            _CLIENT = _Client()
        return _CLIENT


# -- the server side (python -m tests._support.forkserver LISTENER_FD) --------------------------


@dataclass(frozen=True)
class _Target:
    """What a child runs: a module (``-m``) or a console script's entry point."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    module: str | None = None
    entry_point: importlib.metadata.EntryPoint | None = None


class _Server:
    """The single-threaded server loop: accept requests, fork, reap, report."""

    def __init__(self, listener_fd: int) -> None:
        self.start_environment = dict(os.environ)
        self.start_signals = _dispositions()
        self.start_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.scripts = {
            entry.name: entry for entry in importlib.metadata.entry_points(group="console_scripts")
        }
        self.listener = socket.socket(fileno=listener_fd)
        self.listener.setblocking(False)
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(self.wakeup_write, False)
        self.selector = selectors.DefaultSelector()
        #: Connections by the pid of their child (``None`` before it is forked).
        self.children: dict[int, socket.socket | None] = {}
        self.connections: dict[socket.socket, int | None] = {}

    def serve(self) -> None:
        """Serve until this process's stdin (the client's pipe) reaches end of file."""
        signal.set_wakeup_fd(self.wakeup_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is pytest's to handle
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, "reap")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "lifeline")
        while True:
            for key, _ in self.selector.select():
                if key.data == "lifeline":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.data == "accept":
                    self._accept()
                elif key.data == "reap":
                    self._reap()
                else:
                    self._handle(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        self.connections[conn] = None
        self.selector.register(conn, selectors.EVENT_READ, "client")

    def _drop(self, conn: socket.socket) -> None:
        pid = self.connections.pop(conn, None)
        if pid is not None and pid in self.children:
            self.children[pid] = None  # nobody to tell when it exits
        self.selector.unregister(conn)
        conn.close()

    def _reply(self, conn: socket.socket, message: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the client went away; its end of file comes next
            _send(conn, message)

    def _handle(self, conn: socket.socket) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        except OSError:
            data, fds, flags = b"", [], 0
        pid = self.connections.get(conn)
        if not data:
            self._close_all(fds)
            self._drop(conn)
            return
        if pid is None:
            self._start(conn, data, fds, flags)
            return
        self._close_all(fds)
        sig = int(json.loads(data)["signal"])
        if pid in self.children:  # not reaped: the pid is still this child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        self._reply(conn, {"ack": True})

    def _start(self, conn: socket.socket, data: bytes, fds: list[int], flags: int) -> None:
        try:
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or len(fds) != 3:
                raise ValueError("a request is argv, env and cwd as JSON with three descriptors")
            target = self._target(json.loads(data))
            sys.stdout.flush()
            sys.stderr.flush()
            pid = self._fork()
        except (ValueError, OSError) as error:
            self._close_all(fds)
            self._reply(conn, {"error": str(error)})
            self._drop(conn)
            return
        if pid == 0:
            self._child(target, fds)
        self._close_all(fds)
        self.children[pid] = conn
        self.connections[conn] = pid
        self._reply(conn, {"pid": pid})

    def _fork(self) -> int:
        """``os.fork()``, signals blocked in the child until its handlers are a fresh
        interpreter's: a SIGINT sent at once is held, not lost to the server's ``SIG_IGN``."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self.start_signals)
        pid = -1
        try:
            pid = os.fork()
        finally:
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, self.start_mask)
        return pid

    def _target(self, request: Mapping[str, Any]) -> _Target:
        """The request checked: what to run, and an environment this interpreter can honour."""
        argv = [str(arg) for arg in request["argv"]]
        env = {str(k): str(v) for k, v in request["env"].items()}
        for name in sorted(set(env) | set(self.start_environment)):
            if _startup_setting(name) and env.get(name) != self.start_environment.get(name):
                raise ValueError(
                    f"${name} is {env.get(name)!r} where the fork server started with "
                    f"{self.start_environment.get(name)!r}: an interpreter setting that only "
                    "a fresh interpreter takes (fresh=True)"
                )
        cwd = str(request["cwd"])
        if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
            return _Target(argv, env, cwd, module=argv[2])
        name = os.path.basename(argv[0]) if argv else ""
        here = os.path.dirname(sys.executable)
        if argv and os.path.dirname(argv[0]) == here and name in self.scripts:
            return _Target(argv, env, cwd, entry_point=self.scripts[name])
        raise ValueError(
            f"it runs `{sys.executable} -m MODULE` and console scripts in {here}, not {argv}"
        )

    def _child(self, target: _Target, fds: list[int]) -> NoReturn:
        """Become the requested process: its streams, directory, environment and arguments;
        run it; exit as the interpreter would. Never returns into the server loop."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for signum, handler in self.start_signals.items():
                if signal.getsignal(signum) is not handler:
                    signal.signal(signum, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, self.start_mask)
            self.selector.close()
            self.listener.close()
            for conn in self.connections:
                conn.close()
            os.close(self.wakeup_read)
            os.close(self.wakeup_write)
            for number, fd in enumerate(fds):
                os.dup2(fd, number)
            self._close_all(fds)
            os.chdir(target.cwd)
            os.environ.clear()
            os.environ.update(target.env)
            _rebuild_stdio(unbuffered=bool(target.env.get("PYTHONUNBUFFERED")))
            importlib.invalidate_caches()
            code = _run_as_interpreter(target)
        except BaseException:
            traceback.print_exc()
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
        finally:
            os._exit(code)

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wakeup_read, 4096):
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self._reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
                self._drop(conn)

    @staticmethod
    def _close_all(fds: Sequence[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _startup_setting(name: str) -> bool:
    """Whether the environment variable ``name`` only takes effect when an interpreter starts."""
    if name in _REBUILT_SETTINGS:
        return False
    return name.startswith(("PYTHON", "LC_")) or name == "LANG"


def _dispositions() -> dict[int, Callable[[int, types.FrameType | None], Any] | int]:
    """The signal handlers this (fresh) interpreter started with, to restore in a child."""
    found: dict[int, Callable[[int, types.FrameType | None], Any] | int] = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if handler is not None:
            found[signum] = handler
    return found


def _rebuild_stdio(*, unbuffered: bool) -> None:
    """New ``sys.stdin/stdout/stderr`` on descriptors 0-2, made as CPython makes them at start:
    line-buffered on a terminal (stderr always), unbuffered with ``PYTHONUNBUFFERED``."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old: io.TextIOWrapper = getattr(sys, f"__{name}__") or getattr(sys, name)
        writing = fd != 0
        binary: Any = open(  # noqa: SIM115 - the interpreter's stream, never closed
            fd, "wb" if writing else "rb", buffering=0 if unbuffered and writing else -1,
            closefd=False,
        )  # fmt: skip
        raw = getattr(binary, "raw", binary)
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(
            binary,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
            write_through=unbuffered,
        )
        stream.mode = "w" if writing else "r"  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run_as_interpreter(target: _Target) -> int:
    """Run ``target`` and finish as ``python`` does; return the exit status. ``sys.path[0]``
    is the server's start directory (it ran with ``-m``), which becomes the child's own."""
    if target.module is not None:
        sys.argv = ["-m", *target.argv[3:]]
        sys.path[0] = os.getcwd()
    else:
        script = target.argv[0]
        sys.argv = [script, *target.argv[1:]]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        main = types.ModuleType("__main__")
        main.__file__ = script
        sys.modules["__main__"] = main
    interrupted = False
    try:
        if target.module is not None:
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        else:
            assert target.entry_point is not None
            sys.exit(target.entry_point.load()())
        code = 0
    except SystemExit as exit_:
        code = _exit_status(exit_)
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        interrupted = isinstance(error, KeyboardInterrupt)
        code = 1
    code = _finish(code)
    if interrupted:  # as CPython does: die of the SIGINT, so the parent sees -2
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_status(exit_: SystemExit) -> int:
    """The status ``SystemExit`` ends an interpreter with (a message: printed, status 1)."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    with contextlib.suppress(Exception):
        print(exit_.code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """What CPython does after ``__main__``: join non-daemon threads, run ``atexit`` handlers
    (``logging.shutdown`` is one), flush stdio (a failed flush of stdout: status 120)."""
    shutdown: Callable[[], None] = getattr(threading, "_shutdown")  # noqa: B009 - private
    try:
        shutdown()
    except SystemExit as exit_:
        code = _exit_status(exit_)
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as error:
            if stream is sys.stdout:
                with contextlib.suppress(Exception):
                    print(f"Exception ignored on flushing sys.stdout:\n{error!r}", file=sys.stderr)
                code = code or 120
    return code


def _open_descriptors() -> dict[int, str]:
    """This process's open file descriptors and what they are (Linux; empty elsewhere)."""
    found: dict[int, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # listdir's own, closed since
                found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def _serve(argv: Sequence[str]) -> None:
    """The server process: import what children need, check nothing was started, serve."""
    server = _Server(int(argv[1]))
    before = _open_descriptors()
    for module in PRELOAD:
        importlib.import_module(module)
    if threading.active_count() != 1:
        raise ForkServerError(f"an import started a thread: {threading.enumerate()}")
    left_open = {fd: what for fd, what in _open_descriptors().items() if fd not in before}
    if left_open:  # a connection, a log file: every child would share it
        raise ForkServerError(f"an import left descriptors open: {left_open}")
    gc.collect()
    gc.freeze()  # the imported objects stay untouched in the children (copy-on-write)
    server.serve()


if __name__ == "__main__":
    _serve(sys.argv)
