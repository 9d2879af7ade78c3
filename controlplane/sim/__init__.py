"""Discrete-event cluster simulator that drives `controlplane.core` policies in virtual time.

No Django import anywhere in this package. Entry points: `python -m controlplane.sim` (cli.py),
`run_policy` / `Simulation` (cluster.py), scenario files (scenario.py, scenarios/*.yaml).
"""
