"""`python -m optimum_shared_graph validate ARTIFACT ...`: the same command as `optimum-cli shared-graph validate`."""

from .validate_cli import main

raise SystemExit(main())
