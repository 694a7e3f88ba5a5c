"""Mizuoto contract suite."""
