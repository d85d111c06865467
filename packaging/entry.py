"""The bundle's entry point: the same `fitscope` command as the source install."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
