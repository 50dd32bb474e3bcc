import sys

from pipelines.run.cli import main

sys.exit(main())
