"""Ray clusters and the hosts of a run: everything rlbench does with a cluster besides launching roles.

- ray.py: connecting to a cluster (or starting Ray for one run), its alive nodes, and naming them
  (`--place ROLE=NODE`, `--nodes`).
- netns.py: a Ray cluster of real hosts on one machine (network namespaces), for tests and benchmarks.
- cli.py: `rlbench ray nodes | probe` and `rlbench bench launchers`.
- profile.py: `rlbench profile --ray-address`, each host measured on itself.

The Ray launcher itself is rlbench.runtime.launchers.ray; the `ray` transport (messages as Ray actor
calls) is a transport like any other, rlbench.builtin.transports.ray_actors. Ray is imported only
inside functions: `import rlbench` and `rlbench list` never load it.
"""
