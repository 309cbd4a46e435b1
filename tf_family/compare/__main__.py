"""``python -m tf_family.compare``: the same as ``tf-family compare``."""

from .grid import main

raise SystemExit(main())
