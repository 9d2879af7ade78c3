"""Helpers shared by the tests, imported by name (`from tests.support.cluster import make_job`). Fixtures stay
in the conftest files; what a test calls lives here, so no test imports from a conftest."""
