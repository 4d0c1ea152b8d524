"""``python -m engine.cli``: the ``mq`` program."""

import sys

from engine.cli.commands import main

sys.exit(main())
