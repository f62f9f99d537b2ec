import sys

from moco_ref.cli.main import main

sys.exit(main())
