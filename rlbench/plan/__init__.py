"""`rlbench profile` and `rlbench plan`: measure what each primitive costs on this machine, predict
what every mapping of a job onto the components would achieve, choose one, and check the prediction.

- `rlbench.plan.profile`: the profile document (measured costs per host, per job) and its cache.
- `rlbench.plan.model`: the performance model, written down in its docstring.
- `rlbench.plan.planner`: which mappings exist and can run, ranked; the plan file.
- `rlbench.plan.validation`: runs mappings for real and prints predicted beside measured.
- `rlbench.plan.cli`: the two commands.

Nothing is imported here: `import rlbench` and `rlbench --help` never load this package's code.
"""
