"""Backends behind the protocols: executors, LLM providers and schedulers."""
