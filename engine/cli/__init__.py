"""``mq``: the command line of a lakemq store (the console script ``mq = engine.cli:main``).

The commands and their parser are :mod:`engine.cli.commands`; how results are shown is
:mod:`engine.cli.render`.
"""

from engine.cli.commands import JAVA_MESSAGE, build_parser, main, require_java
from engine.errors import CliError

__all__ = ["JAVA_MESSAGE", "CliError", "build_parser", "main", "require_java"]
