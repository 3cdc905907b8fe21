from rlbench.testing import check_replay_memory

from rlbench_memmap import MemmapReplay


def test_passes_the_replay_conformance_kit(tmp_path):
    check_replay_memory(lambda capacity: MemmapReplay(capacity, seed=0, directory=str(tmp_path)))


def test_image_observations_are_stored_whole_and_frames_once_is_refused(tmp_path):
    import numpy as np
    import pytest

    from rlbench.errors import RlbenchError

    memory = MemmapReplay(16, seed=0, directory=str(tmp_path))
    assert not memory.capabilities.frames
    stacks = np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    memory.add({"obs": stacks, "action": np.arange(8), "next_obs": stacks[::-1].copy()})
    sample = memory.sample(8)
    assert sample.transitions["obs"].dtype == np.uint8 and np.array_equal(sample.transitions["obs"],
                                                                           stacks[sample.indices])
    with pytest.raises(RlbenchError, match="not frames once.*use --replay prioritized or uniform"):
        MemmapReplay(16, directory=str(tmp_path), frames=4)


def test_an_unknown_option_is_refused_naming_it_and_the_accepted_ones(tmp_path):
    import pytest

    from rlbench.errors import RlbenchError

    with pytest.raises(RlbenchError, match=r"takes no option 'directroy'; it takes alpha, seed, directory, frames"):
        MemmapReplay(16, seed=0, directroy=str(tmp_path))
    assert len(MemmapReplay(16, alpha=0.6, seed=0, directory=str(tmp_path))) == 0  # the accepted ones still work
