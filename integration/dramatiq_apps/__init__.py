"""Dramatiq applications run by real ``dramatiq`` worker processes in the integration tests."""
