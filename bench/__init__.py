"""The lakemq benchmark suite: ``python bench/run.py`` (or ``bash bench/run.sh``) writes BENCHMARKS.md."""
