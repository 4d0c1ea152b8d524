"""``python -m engine.cli``: the ``mq`` program."""

import sys

from engine.cli.app import main

sys.exit(main())
