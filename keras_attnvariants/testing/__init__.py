"""Test helpers, imported only by tests."""
