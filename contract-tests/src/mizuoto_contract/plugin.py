"""pytest plugin (filled in later)."""
