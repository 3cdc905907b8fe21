"""What the local launcher's fork server imports once, before it forks any role.

A spawned role re-imported numpy, torch and gymnasium on its own: 2.5-3 s of every distributed
run's start-up on a 2-core VM whose page cache does not keep torch. The fork server imports them
once per launcher process, and each role is forked from it. The server only imports: it runs no
torch op, so it has no OpenMP or BLAS threads (their pools load at one thread, see
`rlbench.runtime.launchers.local`), no CUDA context, no DPDK or OpenCL state to copy into a role.

It also ignores the polite signals: a scheduler's SIGTERM or SIGHUP to the process group (or
Ctrl-C's SIGINT, which multiprocessing already ignores here) must reach the launcher, which stops
the roles in order. The server, if it died first, would take every role with it (their
PR_SET_PDEATHSIG).
"""

import importlib
import signal

from rlbench.runtime.launchers import ROLE_SIGNALS

ROLE_IMPORTS = ("numpy", "torch", "gymnasium", "threadpoolctl", "rlbench.runtime.distributed.roles",
                "rlbench.runtime.distributed.replay_node",
                # a learner's first torch optimizer imports it (Optimizer.__init__ is wrapped to
                # disable dynamo): 1.4 s of this VM's learner start-up
                "torch._dynamo")

for _name in ROLE_IMPORTS:
    importlib.import_module(_name)
for _signum in ROLE_SIGNALS:
    signal.signal(_signum, signal.SIG_IGN)
