"""spider example (see README.md)."""
