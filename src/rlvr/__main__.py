import sys

from rlvr.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
