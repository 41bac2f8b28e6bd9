"""Helpers for tests and local development (real services, not mocks)."""
