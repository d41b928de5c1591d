"""``python -m nbrgc.measure.bench --worker SPEC_JSON``: one bench worker in this process."""
import sys

from .worker import worker_main

sys.exit(worker_main(sys.argv[1:]))
