"""Where the gateway's turns are sampled: a `Backend` turns a prompt (token ids) into one complete turn.
The two backends, side by side:

* `WorkerBackend` (`workers.py`): engine workers' data plane directly (a standalone gateway, the tests, the
  benchmark).
* `DriverBackend` (`driver.py`): inside a job, the rollout driver samples the turn (`agents.envs.agent`).
"""

from agents.gateway.backends.base import Backend, BackendUnavailable, Generation, Sampling
from agents.gateway.backends.driver import DriverBackend, Pending
from agents.gateway.backends.workers import WorkerBackend

__all__ = ["Backend", "BackendUnavailable", "DriverBackend", "Generation", "Pending", "Sampling", "WorkerBackend"]
