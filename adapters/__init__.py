"""Capture adapters, one module per framework; each imports its framework lazily."""
