"""``python -m nbrgc.study SPEC.json``: one study run in this process (see nbrgc.study.runner)."""
import sys

from .runner import main

sys.exit(main())
