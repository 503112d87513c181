#!/usr/bin/env bash
# tests/plan_rows.sh MPRUN WORKER DIR: mp_worker --plan --memory-per-rank
# lists only configurations within the budget, ordered by communication per
# step, and each row it lists takes, when run on 2 ranks with the row's
# --set flags, exactly the bytes per rank the row says (the measured
# categories of the first step's metrics, "other" aside: a few hundred bytes
# of step scalars the plan leaves out). Rows checked: the chosen one, the
# first that recomputes every unit, the first that recomputes every 2nd,
# and the first of another strategy with several micro-batches.
set -u
mprun=$1 worker=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
small=(--set model.gpt.layers=3 --set model.gpt.context=32 --set data.micro_batch_size=4
       --set val_interval=0 --set sample_interval=0)
budget=$((15 << 20))
"$worker" "${small[@]}" --plan --memory-per-rank $budget --world-size 2 --plan-rows 0 > "$dir/plan.txt" 2>&1 ||
  { cat "$dir/plan.txt"; fail "--plan --memory-per-rank"; }
python3 - "$dir/plan.txt" "$budget" > "$dir/rows.txt" <<'PY' || { cat "$dir/plan.txt"; fail "the table"; }
import re, sys
budget = int(sys.argv[2])
rows, chosen = [], None
for line in open(sys.argv[1]):
    m = re.match(r"^\s*(\d+)(\*?)\s+(\S+)\s+(\S+)\s+(none|every unit|every 2nd)\s+(\d+)x(\d+)\s+(\d+)\s+\S+ \S+\s+"
                 r"(\S+) (\S+)\s+(.*)$", line)
    if not m:
        continue
    unit = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(10)]
    rows.append(dict(n=int(m.group(1)), strategy=m.group(3), recompute=m.group(5), micro=int(m.group(6)),
                     bytes=int(m.group(8)), comm=float(m.group(9)) * unit,
                     sets="" if m.group(11).startswith("(") else m.group(11)))
    if m.group(2):
        chosen = rows[-1]
assert rows and chosen, "no rows or no choice"
assert all(r["bytes"] <= budget for r in rows), "a row over the budget"
assert all(a["comm"] <= b["comm"] * 1.01 for a, b in zip(rows, rows[1:])), "rows not ordered by communication"
picked = [chosen, next(r for r in rows if r["recompute"] == "every unit"),
          next(r for r in rows if r["recompute"] == "every 2nd"),
          next(r for r in rows if r["micro"] > 1 and r["strategy"] != chosen["strategy"])]
for r in picked:
    print(r["n"], r["bytes"], r["sets"])
PY
grep -q "^choice: row [0-9]*, the config's recipe (bf16_master)" "$dir/plan.txt" || { cat "$dir/plan.txt"; fail "no choice"; }
checked=0
while read -r n bytes sets; do
  # shellcheck disable=SC2086
  "$mprun" -np 2 "$worker" "${small[@]}" $sets --steps 1 --out "$dir/row$n" < /dev/null > "$dir/row$n.log" 2>&1 ||
    { cat "$dir/row$n.log"; fail "row $n ($sets)"; }
  measured=$(python3 -c 'import json, sys
m = json.loads(open(sys.argv[1]).readline())["memory_bytes"]
print(sum(v for k, v in m.items() if k != "other"))' "$dir/row$n/metrics.jsonl")
  [[ $measured == "$bytes" ]] || fail "row $n ($sets): planned $bytes bytes per rank, measured $measured"
  echo "row $n: $bytes bytes per rank planned and measured ($sets)"
  checked=$((checked + 1))
done < "$dir/rows.txt"
[[ $checked == 4 ]] || fail "$checked rows checked, not 4"
# A budget nothing fits, and a host size that does not divide the world.
"$worker" "${small[@]}" --plan --memory-per-rank 1KiB --world-size 2 > "$dir/none.txt" 2>&1 || fail "a tiny budget"
grep -q "^0 of [0-9]* configurations fit; the smallest needs" "$dir/none.txt" &&
  grep -q "^choice: none" "$dir/none.txt" || { cat "$dir/none.txt"; fail "a budget nothing fits"; }
"$worker" --plan --memory-per-rank 1GiB --world-size 4 --ranks-per-host 3 > "$dir/bad.txt" 2>&1
[[ $? == 2 ]] && grep -q "ranks-per-host 3 does not divide the world size 4" "$dir/bad.txt" ||
  { cat "$dir/bad.txt"; fail "--ranks-per-host 3 of 4"; }
echo "--plan --memory-per-rank: the rows run in the bytes they say"
