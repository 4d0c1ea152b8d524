"""Broker work that runs beside the clients: store maintenance and the jobs' store-level logic."""
