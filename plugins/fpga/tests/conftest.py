import os

# One PoCL thread: the kernels are single work-items, and other test processes share the cores.
os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", "1")
