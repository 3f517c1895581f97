"""``python -m troupe`` runs the ``troupe`` command: for a venv whose ``bin/`` is not on the
PATH (cron, a service's ``ExecStart``, ``sudo`` with a reset PATH).

``python -m`` puts the current folder first on ``sys.path``, where the console script has its
own ``bin/``: taken off, so that a scratch ``zmq.py`` or ``torch.py`` there is not imported by
the command in place of the installed package, as it is not by ``troupe``."""

import os
import sys

try:
    here = os.getcwd()
except FileNotFoundError:  # a folder deleted under the shell: the command says so in one line
    here = ""
if sys.path and sys.path[0] in ("", here):
    del sys.path[0]

from troupe.cli.entry import main

main()
