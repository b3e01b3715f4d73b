"""``python -m ppfs_cli ...``: the ``ppfs`` command."""

import sys

from ppfs_cli.main import main

if __name__ == "__main__":
    sys.exit(main())
