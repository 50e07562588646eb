"""game example (see README.md)."""
