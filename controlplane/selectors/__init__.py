"""Read models: plain dicts/dataclasses built with few queries, shared by the API, sockets and metrics."""
