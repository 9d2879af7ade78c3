"""PEARL brain: pure, typed Python with no Django import.

The live control plane (Django services, Celery tasks) and the discrete-event simulator
(`sim`) both call into this package, and it never knows which one is calling.
"""
