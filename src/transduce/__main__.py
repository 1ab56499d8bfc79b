import sys

from transduce.cli.main import main

sys.exit(main())
