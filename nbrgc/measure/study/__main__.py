"""``python -m nbrgc.measure.study SPEC.json``: one study run in this process (see nbrgc.measure.study.runner)."""
import sys

from .runner import main

sys.exit(main())
