"""Thin clients (no JVM): producer, consumers, admin."""
