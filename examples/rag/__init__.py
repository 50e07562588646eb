"""rag example (see README.md)."""
