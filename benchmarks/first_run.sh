#!/usr/bin/env bash
# A machine's first run of the demo against its later runs, for one or more checkouts side by side:
# per checkout, `bin/nbrgc-train` with an empty kernel cache (cold: compiles) and again with that
# cache (warm), wall clock and user+sys CPU of the whole command (compile helpers included), the
# compile CPU (cold - warm), and the run's last losses and validation bpb (the bits must not depend
# on whether the kernels were compiled or loaded), and the warm-up's own "kernels ready in" line.
# Run it with nothing else on the cores.
#
#   bash benchmarks/first_run.sh                       # this checkout
#   git worktree add /tmp/base 8c4c5b2
#   bash benchmarks/first_run.sh /tmp/base .           # an older version beside this one
set -euo pipefail
trees=("${@:-.}")
lscpu | grep "Model name" || true
python3 -c "import threadpoolctl, numpy; print('OpenBLAS kernels:', sorted({i.get('architecture') for i in threadpoolctl.threadpool_info() if i.get('internal_api') == 'openblas'}))"
for tree in "${trees[@]}"; do
  tree=$(cd "$tree" && pwd)
  d=$(mktemp -d)
  for pass in cold warm; do
    ( cd "$d" && NBRGC_CACHE="$d/cache" PYTHONPATH="$tree" /usr/bin/time -o "$d/$pass.time" \
        -f "%e %U %S" "$tree/bin/nbrgc-train" --out "$d/run-$pass" > "$d/$pass.out" 2> "$d/$pass.err" )
  done
  python3 - "$tree" "$d" <<'PY'
import json, sys
tree, d = sys.argv[1:3]
t = {p: [float(v) for v in open(f"{d}/{p}.time").read().split()[-3:]] for p in ("cold", "warm")}
cpu = {p: t[p][1] + t[p][2] for p in t}
print(f"{tree}: cold {t['cold'][0]:.1f} s wall, {cpu['cold']:.1f} s CPU; warm {t['warm'][0]:.1f} s wall, "
      f"{cpu['warm']:.1f} s CPU; compile CPU (cold - warm) {cpu['cold'] - cpu['warm']:.1f} s")
for p in ("cold", "warm"):
    recs = [json.loads(line) for line in open(f"{d}/run-{p}/log.jsonl") if line.startswith("{")]
    losses = [r["loss"] for r in recs if "loss" in r][-3:]
    val = [r["val_bpb"] for r in recs if "val_bpb" in r][-1:]
    ready = [ln.strip() for ln in open(f"{d}/{p}.err").read().replace("\r", "\n").splitlines()
             if "kernels ready in" in ln][-1:]  # the warm-up's own time: compiling, or loading
    print(f"  {p}: last losses {losses}, val bpb {val}; {ready[0] if ready else 'no kernels line'}")
PY
  rm -rf "$d"
done
