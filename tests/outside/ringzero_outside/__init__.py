"""Backends a framework author writes against ringzero's protocols, outside ringzero: an
executor that runs code in a plain subprocess and calls the tools it was handed itself, and a
store registered under the ``outside://`` URL scheme."""
