"""The broker's Spark structured-streaming jobs, declared once in :mod:`engine.spark.jobs.registry`.

One module per job (``dispatch``, ``index``, ``schedule``, ``retry``, ``pull_log``,
``transaction_check``, ``maintenance``: its ``run_<job>`` and ``summary``), the registry that lists
them, the program every job shares (:mod:`~engine.spark.jobs.runner`), the wiring of their queries
(:mod:`~engine.spark.jobs.streams`) and the broker app that runs them all in one Spark application
(:mod:`~engine.spark.jobs.broker_app`). ``jobs/<job>.py`` are their spark-submit entry points.
Nothing here imports ``deltalake``: tables are read and written through ``engine.store``.
"""

from engine.spark.jobs.registry import JOB_ORDER, JOBS, Job, job_named, main

__all__ = ["JOBS", "JOB_ORDER", "Job", "job_named", "main"]
