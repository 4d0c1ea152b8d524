"""``mq``: the command line of a lakemq store (the console script ``mq = engine.cli:main``).

The program and its parser are :mod:`engine.cli.app`; each command group has its module
(``cmd_topic``, ``cmd_group``, ``cmd_message``, ``cmd_dlq``, ``cmd_sql``, ``cmd_jobs``,
``cmd_dashboard``); what they share is :mod:`engine.cli.common`; how results are shown,
:mod:`engine.cli.render`.
"""

from engine.cli.app import build_parser, main
from engine.cli.common import JAVA_MESSAGE, require_java
from engine.errors import CliError

__all__ = ["JAVA_MESSAGE", "CliError", "build_parser", "main", "require_java"]
