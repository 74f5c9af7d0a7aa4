"""Helpers shared by tests and the scripts that prepare their data."""
