"""`python -m agents.trainer`: see agents.trainer.server."""

from agents.trainer.server import main

main()
