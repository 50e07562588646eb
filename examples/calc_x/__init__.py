"""calc_x example (see README.md)."""
