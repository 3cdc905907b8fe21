"""Studies and reports: `rlbench sweep` (a grid x seeds, resumable), `rlbench report` (one HTML page
with interval estimates and figures), `rlbench compare` (two result sets), `rlbench dashboard`
(asv's dashboard, offline). Importing this package imports nothing heavy; see rlbench.report.cli.
"""
