"""The node agent, one per machine (`python -m agents.node`, or `run_agent(config)` from a program).

- `session`: registration, fencing of desired states by epoch and generation, the agent link, heartbeats;
- `reconciler`: the worker and driver processes converged to the desired state, crash supervision;
- `standalone`: the agent without a control plane;
- `cli`: the command line and `run_agent`.
"""

from agents.node.cli import main, run_agent
from agents.node.config import AgentConfig
from agents.node.reconciler import DriverProcess, Managed, Reconciler, partials
from agents.node.session import NodeAgent

__all__ = ["AgentConfig", "DriverProcess", "Managed", "NodeAgent", "Reconciler", "main", "partials", "run_agent"]
