"""Fault-injection suite (``pytest -m fault``): scenarios, their harness and the FAULTS.md report."""
