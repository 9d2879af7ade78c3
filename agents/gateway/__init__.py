"""Bring your own agent: an OpenAI-compatible gateway in front of PEARL's rollout (see `app`)."""
