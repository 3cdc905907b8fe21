"""The local launcher: each role of a distributed run a process on this machine, forked by a fork server."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import platform
import sys
import time
from typing import Any, Callable, Iterator

from rlbench.machine_state import thread_environment
from rlbench.runtime.distributed import roles
from rlbench.runtime.distributed.roles import RoleSpec
from rlbench.runtime.launchers import (
    GRACE_S,
    POLL_S,
    ROLE_FUNCTIONS,
    START_TIMEOUT_S,
    RoleFailedError,
    RoleHandle,
    called,
    one_line,
    run_role,
)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set while a process is started (the fork server: it keeps them)."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


LAUNCHER_GONE_EXIT = 3  # a role whose launcher went away before it could say its outcome
ROLE_SERVER_MODULE = "rlbench.runtime.launchers.role_server"  # what the fork server imports for every role


def role_context() -> Any:
    """Roles are forked by multiprocessing's fork server, which has imported ROLE_SERVER_MODULE.
    Never a plain fork of the launcher: its DPDK, CUDA and torch state, threads and locks must not
    be copied; the server holds none of them. Its thread pools load at one thread, so it has no
    pool threads to fork; each role then sizes its own (`_take_environment`)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([ROLE_SERVER_MODULE])
    with _environment(thread_environment(1)):  # the server starts with it; it imports in the background
        multiprocessing.forkserver.ensure_running()
    return context


def _take_environment(environment: dict[str, str], cpus: float) -> None:
    """In a role's process: the launcher's environment as it is now (the server's is from when it
    started), and every thread pool the server loaded resized to the role's CPUs. Pools that load
    later read their size from the environment, as in a spawned process."""
    os.environ.clear()
    os.environ.update(environment)
    threads = max(1, int(cpus))
    import threadpoolctl

    threadpoolctl.threadpool_limits(limits=threads)  # numpy's BLAS and the OpenMP runtimes loaded
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def _role_entry(function: Callable[..., Any] | str, spec: RoleSpec, environment: dict[str, str], said: Any) -> None:
    """A role's process: it says its address (a node) and then its outcome on its own pipe to the
    launcher. A launcher that is gone (killed, or stopped at once) hears nothing: the role just ends."""
    try:
        _take_environment(environment, spec.cpus)
        report = run_role(function, spec, lambda address: said.send(("address", address)))
    except BrokenPipeError:  # the launcher is gone
        raise SystemExit(LAUNCHER_GONE_EXIT) from None
    except BaseException as exc:
        _say(said, ("error", one_line(f"{type(exc).__name__}: {exc}")))
        raise SystemExit(1) from None
    _say(said, ("ok", report))


def _say(said: Any, message: tuple[str, Any]) -> None:
    try:
        said.send(message)
    except BrokenPipeError:
        raise SystemExit(LAUNCHER_GONE_EXIT) from None


class LocalLauncher:
    """Each role a process on this machine, forked by the fork server (`role_context`). Each role says
    its address and its outcome on a pipe of its own: no multiprocessing.Queue, whose named semaphores
    (/dev/shm/sem.mp-*) a run killed with SIGKILL left behind."""

    def __init__(self, functions: dict[str, Callable[..., Any] | str] | None = None) -> None:
        self.functions = {**ROLE_FUNCTIONS, **(functions or {})}  # role -> function (or "module:function")
        self.context = role_context()
        self.pipes: dict[Any, str] = {}  # the launcher's end of each running role's pipe -> role name
        self.announced: dict[str, str] = {}
        self.handles: list[RoleHandle] = []
        self.outcomes: dict[str, tuple[str, Any]] = {}

    def start(self, spec: RoleSpec) -> RoleHandle:
        ours, theirs = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_role_entry, name=f"rlbench-{spec.role}-{spec.index}", daemon=True,
                                       args=(self.functions[spec.role], spec,
                                             {**os.environ, **thread_environment(spec.cpus)}, theirs))
        process.start()
        theirs.close()  # the role holds the only writing end: its exit ends the pipe
        self.pipes[ours] = spec.name
        handle = RoleHandle(spec.role, spec.index, process)
        self.handles.append(handle)
        return handle

    def wait_address(self, node: RoleHandle) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if node.name in self.announced:
                return self.announced.pop(node.name)
            self._drain(timeout=POLL_S)
            if node.name not in self.announced and not node.alive():
                raise RoleFailedError(f"{called(node)} exited before it listened: {self.failure_of(node)}")
        raise RoleFailedError(f"{called(node)} did not start listening within 2 minutes")

    def _drain(self, timeout: float) -> None:
        """Read what roles said (addresses, outcomes), waiting up to `timeout` for the first. Roles
        block on a large report until it is read, so the launcher reads while it waits for them
        (joining without reading deadlocks, and terminating a role mid-write would leave half a
        message in the pipe)."""
        for pipe in multiprocessing.connection.wait(list(self.pipes), timeout=timeout):
            name = self.pipes[pipe]
            try:
                kind, payload = pipe.recv()
            except (EOFError, OSError):  # the role is gone: nothing more comes on its pipe
                del self.pipes[pipe]
                pipe.close()
                continue
            if kind == "address":
                self.announced[name] = payload
            else:
                self.outcomes[name] = (kind, payload)

    def collect(self) -> dict[str, tuple[str, Any]]:
        self._drain(timeout=0.05)
        while multiprocessing.connection.wait(list(self.pipes), timeout=0):
            self._drain(timeout=0)
        return dict(self.outcomes)

    def wait(self, handles: list[RoleHandle], timeout: float) -> None:
        """Until these roles have exited or the timeout passes, reading outcomes meanwhile."""
        deadline = time.monotonic() + timeout
        while any(h.alive() for h in handles) and time.monotonic() < deadline:
            self._drain(timeout=0.05)

    def failure_of(self, handle: RoleHandle) -> str:
        """One line: the role's error, or how its process ended."""
        status, payload = self.collect().get(handle.name, ("", None))
        if status == "error":
            return one_line(payload)
        return f"exit code {handle.exitcode}" + (" after it reported" if status == "ok" else "")

    def describe(self) -> dict[str, Any]:
        return {"name": "local", "roles": {h.name: {"host": platform.node()} for h in self.handles}}

    def close(self) -> None:
        """Release the roles' pipes (after `collect`)."""
        for pipe in self.pipes:
            pipe.close()
        self.pipes.clear()

    def stop_all(self, grace: float = GRACE_S) -> None:
        """Roles still running after `grace` are killed (they ignore the polite signals: stopping
        them in order is the launcher's job, done before this)."""
        self.wait(self.handles, grace)
        for handle in self.handles:
            if handle.alive():
                handle.process.kill()
                handle.process.join(timeout=5)
