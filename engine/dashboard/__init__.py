"""``mq dashboard``: a local, read-mostly web console in the spirit of the RocketMQ dashboard.

:mod:`engine.dashboard.app` builds the Starlette application (pages rendered by Jinja2 with
autoescaping), :mod:`engine.dashboard.sampler` keeps the short history behind message rates and lag
charts, :mod:`engine.dashboard.server` runs it with uvicorn on 127.0.0.1.
"""
