"""`python -m agents.node`: see agents.node.cli."""

from agents.node.cli import main

main()
