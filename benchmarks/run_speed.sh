#!/usr/bin/env bash
# Reproduce the speed, memory and profile files in benchmarks/. Run on a quiet machine: nothing else
# on the cores. Not timed end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks
# 1. small and paper, every mode side by side. rgc-async twice: auto (4 stages on 2 single-thread
#    workers, 2 stages each) and 4 workers (one per stage: 4 threads on 2 cores, oversubscribed)
bin/nbrgc-bench --config small --modes bp,rgc-sync,rgc-async,torch --stage-workers auto,4 --threads 2 \
    --repeats 5 --warmup-steps 3 --steps 20 --gemm-peak --out $out/small-speed.json | tee $out/small-speed.md
bin/nbrgc-bench --config paper --modes bp,rgc-sync,rgc-async,torch --stage-workers auto,4 --threads 2 \
    --repeats 3 --warmup-steps 2 --steps 6 --gemm-peak --out $out/paper-speed.json | tee $out/paper-speed.md
# 2. rgc-async with exactly the budget's threads (2 stages x 1 thread)
bin/nbrgc-bench --config small --modes bp,rgc-async --n-stages 2 --stage-threads 1,1 --threads 2 \
    --repeats 5 --warmup-steps 3 --steps 20 --out $out/small-k2.json | tee $out/small-k2.md
bin/nbrgc-bench --config paper --modes bp,rgc-async --n-stages 2 --stage-threads 1,1 --threads 2 \
    --repeats 2 --warmup-steps 2 --steps 6 --out $out/paper-k2.json | tee $out/paper-k2.md
# 3. the thread-scaling curve this machine allows (1 and 2 threads; BP's scaling bounds rgc-async)
bin/nbrgc-bench --config small --modes bp,rgc-async --n-stages 2 --threads 1,2 --repeats 3 \
    --warmup-steps 3 --steps 15 --out $out/small-threads.json | tee $out/small-threads.md
# 4. per-kernel breakdown of one BP step
python3 -m nbrgc.profile --config small --threads 2 --repeats 5 | tee $out/profile-small.md
python3 -m nbrgc.profile --config paper --threads 2 --repeats 2 | tee $out/profile-paper.md
# 5. the OpenBLAS settings some machines need (older builds crash without them): GEMM peak and BP
OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=1048576 bin/nbrgc-bench --config paper --modes bp,torch \
    --threads 2 --repeats 2 --warmup-steps 2 --steps 4 --gemm-peak --out $out/paper-openblas-haswell.json \
    | tee $out/paper-openblas-haswell.md
# 6. BP against the PyTorch peer alone on small and paper, more rounds (the ratios the performance
#    targets name)
bin/nbrgc-bench --config small --modes bp,torch --threads 2 --repeats 9 --warmup-steps 3 --steps 20 \
    --out $out/small-bp-torch.json | tee $out/small-bp-torch.md
bin/nbrgc-bench --config paper --modes bp,torch --threads 2 --repeats 5 --warmup-steps 2 --steps 6 \
    --out $out/paper-bp-torch.json | tee $out/paper-bp-torch.md
# 7. attention probabilities kept (default) or recomputed in the backward, side by side
bin/nbrgc-bench --config paper --modes bp,rgc-async --attention store,recompute --threads 2 --repeats 2 \
    --warmup-steps 2 --steps 5 --out $out/paper-attention.json | tee $out/paper-attention.md
bin/nbrgc-bench --config small --modes bp,rgc-async --attention store,recompute --threads 2 --repeats 4 \
    --warmup-steps 3 --steps 15 --out $out/small-attention.json | tee $out/small-attention.md
python3 -m nbrgc.profile --config paper --threads 2 --repeats 2 --attention recompute \
    | tee $out/profile-paper-recompute.md
# 8. the ceiling for single-thread stage workers: 2 BP processes at 1 thread each, at once, against
#    one BP process at 2 threads
python3 benchmarks/concurrency_ceiling.py --config small --threads 2 --repeats 5 \
    --out $out/small-ceiling.json > $out/small-ceiling.md
python3 benchmarks/concurrency_ceiling.py --config paper --threads 2 --repeats 3 --warmup-steps 2 \
    --steps 6 --out $out/paper-ceiling.json > $out/paper-ceiling.md
# 9. the schemes between RGC and BP on their worker threads: pipelined backprop (pipe-async), RGC
#    whose losses reach one stage back (rgc-h1) and RGC with a readout block (rgc-readout), beside
#    bp and rgc-async
bin/nbrgc-bench --config small --modes bp,rgc-async,pipe-async,rgc-h1:async,rgc-readout:async \
    --threads 2 --repeats 5 --warmup-steps 3 --steps 20 --out $out/small-pipe-speed.json \
    | tee $out/small-pipe-speed.md
bin/nbrgc-bench --config paper --modes bp,rgc-async,pipe-async,rgc-h1:async,rgc-readout:async \
    --threads 2 --repeats 3 --warmup-steps 2 --steps 6 --out $out/paper-pipe-speed.json \
    | tee $out/paper-pipe-speed.md
