"""``python -m resilient_flows.cli``: the ``resilient-flows`` command without its installed script."""

import sys

from resilient_flows.cli import main

sys.exit(main())
