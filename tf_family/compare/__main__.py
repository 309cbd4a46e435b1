"""``python -m tf_family.compare``: the same as ``tf-family compare``."""

from .cli import main

raise SystemExit(main())
