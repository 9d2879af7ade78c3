"""PEARL control plane: the Django app (models, services, API, consumers, tasks) and its pure core."""
