"""The machine's state while something was measured: was it quiet, or contended?

Busy-polling transports lose their edge when the cores are contended (on a 2-core machine another
job made dpdk 25 us against udp's 29). So every run and every benchmark records, beside its
figures: the load average before and after, the CPU time stolen by the hypervisor, the CPU time
other processes used meanwhile, and whether each of its busy processes had a core to itself — and
says so in one warning line when the figures were taken on a contended machine. Nothing is retried
until the number looks good; the state is reported as found.

    with watch(busy_processes=4) as state:   # the run's or benchmark's own busy processes
        ...
    state.report()   # a dict for the result; state.warning: "" or one line

The load average is recorded but not judged: it trails the last minute, our own previous run
included. Contention is judged on what happened during the measurement (other processes' CPU,
steal) and on the measurement's own processes outnumbering the cores.

From /proc (Linux); elsewhere the fields are None and the reason is said.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

CONTENDED_OTHER_CORES = 0.2  # others used a fifth of a core on average: polling loops already feel it
CONTENDED_STEAL = 0.05  # 5 % of the CPU time went to other guests


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, steal) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def own_cpu_s() -> float:
    """CPU seconds of this process, its children that have been waited for, and the fork server's."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system + fork_server_cpu_s()


def fork_server_cpu_s() -> float:
    """CPU seconds of this process's multiprocessing fork server, its imports included, and of every
    process it has reaped: the local launcher's roles, which are its children, not ours, so
    os.times() does not count them. 0 where there is no server (or /proc cannot say)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = [int(value) for value in stat.read().rsplit(")", 1)[1].split()[11:15]]
    except (OSError, ValueError):
        return 0.0
    return sum(fields) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime: proc(5) fields 14-17


@dataclass
class MachineState:
    busy_processes: int
    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else (os.cpu_count() or 1))
    load_before: list[float] | None = None
    load_after: list[float] | None = None
    wall_s: float = 0.0
    steal_fraction: float | None = None
    other_processes_cpu_s: float | None = None
    own_cpu_s: float | None = None
    extra_own_cpu_s: float = 0.0  # CPU of our processes the OS does not count as our children (e.g. Ray's)
    warning: str = ""

    def report(self) -> dict[str, Any]:
        others = self.other_processes_cpu_s
        return {
            "cores": self.cores,
            "busy_processes": self.busy_processes,
            "each_had_a_core": self.busy_processes <= self.cores,
            "load_before": self.load_before,
            "load_after": self.load_after,
            "steal_fraction": self.steal_fraction,
            "other_processes_cpu_s": others,
            "other_processes_cores": others / self.wall_s if others is not None and self.wall_s > 0 else None,
            "own_cpu_s": self.own_cpu_s,
            "contended": bool(self.warning),
            "warning": self.warning,
        }

    def _judge(self) -> str:
        reasons = []
        if self.busy_processes > self.cores:
            reasons.append(f"{self.busy_processes} busy processes share {self.cores} core(s)")
        if self.wall_s > 0 and self.other_processes_cpu_s is not None:
            other_cores = self.other_processes_cpu_s / self.wall_s
            if other_cores > CONTENDED_OTHER_CORES:
                reasons.append(f"other processes used {other_cores:.2f} core(s) meanwhile")
        if self.steal_fraction is not None and self.steal_fraction > CONTENDED_STEAL:
            reasons.append(f"{self.steal_fraction:.0%} of the CPU time was stolen by the hypervisor")
        if not reasons:
            return ""
        return "measured on a contended machine: " + "; ".join(reasons) + " (figures may be lower than a quiet machine's)"


@contextlib.contextmanager
def watch(busy_processes: int = 1) -> Iterator[MachineState]:
    """Record the machine's state around a measurement; `busy_processes`: how many of ours spin or work."""
    state = MachineState(busy_processes)
    state.load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    jiffies_before = _cpu_jiffies()
    own_before = own_cpu_s()
    t0 = time.perf_counter()
    try:
        yield state
    finally:
        state.wall_s = time.perf_counter() - t0
        state.own_cpu_s = own_cpu_s() - own_before + state.extra_own_cpu_s
        jiffies_after = _cpu_jiffies()
        state.load_after = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        if jiffies_before is not None and jiffies_after is not None:
            tick = os.sysconf("SC_CLK_TCK")
            busy = (jiffies_after[0] - jiffies_before[0]) / tick
            steal = (jiffies_after[1] - jiffies_before[1]) / tick
            capacity = state.wall_s * state.cores
            state.steal_fraction = steal / capacity if capacity > 0 else None
            # jiffies are coarse (10 ms): never report less than nothing
            state.other_processes_cpu_s = max(0.0, busy - state.own_cpu_s)
        state.warning = state._judge()


def summary_line(report: dict[str, Any]) -> str:
    """One line for a benchmark's output: the state it was measured in."""
    if report.get("warning"):
        return "WARNING: " + report["warning"]
    load = report.get("load_before")
    others = report.get("other_processes_cores")
    return (f"machine: quiet ({report['cores']} core(s), {report['busy_processes']} busy process(es) of ours"
            + (f", load {load[0]:.2f} before" if load else "")
            + (f", others used {others:.2f} core(s)" if others is not None else "") + ")")


# The thread pools of numpy's BLAS, OpenMP and torch size themselves to the machine's cores when
# they load. With more role processes than cores, every role's spinning pool steals the others'
# cores (issue #24 measured 1 -> 2 actors at 0.23x). Each role runs its pools at the CPUs it was
# given, set in its environment before anything loads them (Ray does the same for its workers);
# a role forked from the local launcher's fork server, where they loaded at one thread, resizes them.
THREAD_POOL_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")


def thread_environment(cpus: float) -> dict[str, str]:
    """The environment a role process of `cpus` CPUs starts with: every thread pool that size."""
    return {name: str(max(1, int(cpus))) for name in THREAD_POOL_VARIABLES}


def threads_in_use() -> dict[str, Any]:
    """For a role's report: the pools' sizes as this process has them."""
    used: dict[str, Any] = {name: os.environ.get(name) for name in THREAD_POOL_VARIABLES[:2]}
    torch = sys.modules.get("torch")
    if torch is not None:
        used["torch_threads"] = torch.get_num_threads()
    import threadpoolctl  # here, not at import: `import rlbench` stays cheap

    # the loaded pools themselves (a process forked from one that loaded them sized them at run time)
    used["pools"] = {f"{pool['internal_api']}:{pool['prefix']}": pool["num_threads"]
                     for pool in threadpoolctl.threadpool_info()}
    return used
