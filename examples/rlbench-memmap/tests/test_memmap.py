from rlbench.testing import check_replay_memory

from rlbench_memmap import MemmapReplay


def test_passes_the_replay_conformance_kit(tmp_path):
    check_replay_memory(lambda capacity: MemmapReplay(capacity, seed=0, directory=str(tmp_path)))
