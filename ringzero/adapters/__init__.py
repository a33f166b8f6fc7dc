"""Adapters into agent frameworks; each imports its framework lazily (an extra)."""
