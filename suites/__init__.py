"""asv benchmark suites for rlbench (asv.conf.json at the repository root points here)."""
