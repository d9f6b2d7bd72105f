"""``python -m aiocheckpoint``: the command line (see :mod:`aiocheckpoint.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
