import sys

from adpipe.cli import main

sys.exit(main())
