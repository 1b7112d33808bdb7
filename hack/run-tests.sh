#!/usr/bin/env bash
# Runs every test binary of `cargo test --all-targets`, SVC_TEST_LANES (2) at a time, with the
# arguments given ("--include-ignored"). The end-to-end binaries spend most of their time waiting
# on the control plane and the simulated nodes, so two of them share the two cores well; the
# slowest start first. Each binary's output is printed whole once it ends, and a summary with
# the times at the end (binaries that need the API server to themselves run alone, last). A
# binary that failed beside another is run once more, alone, when the
# others are done: it fails the run only if it fails again, and the summary names it either way
# (a test that needs the machine to itself is a finding, not noise). Exit status 1 when any
# binary failed alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

lanes=${SVC_TEST_LANES:-2}
# Slowest first (seconds on 2 cores, warm): the rest are under a minute each.
slowest=(datapath failover faults soak monitoring chart agent demo)
# Binaries that need the API server to themselves, run alone after the others: `resync` reads the
# API server's own counters, which every test's writes move; `share` runs Kubernetes' PV binder,
# which acts on every test's claims (beside the benchmark's hundreds it bound share's own claim
# too late, and meddled with the benchmark's hand-bound ones: both failed, twice).
alone=(resync share)

logs=$(mktemp -d "${TMPDIR:-/tmp}/svc-tests.XXXXXX")
mapfile -t targets < <(
  cargo test --locked --all-targets --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["profile"]["test"]:
        print(message["target"]["name"] + "\t" + message["executable"])
'
)
if ((${#targets[@]} == 0)); then
  echo "no test binaries found (cargo test --no-run failed?)" >&2
  exit 1
fi

ordered=()
for name in "${slowest[@]}"; do
  for target in "${targets[@]}"; do [[ ${target%%$'\t'*} == "$name" ]] && ordered+=("$target"); done
done
for target in "${targets[@]}"; do
  [[ " ${slowest[*]} ${alone[*]} " == *" ${target%%$'\t'*} "* ]] || ordered+=("$target")
done
last=()
for name in "${alone[@]}"; do
  for target in "${targets[@]}"; do [[ ${target%%$'\t'*} == "$name" ]] && last+=("$target"); done
done

run_one() {
  local name=$1 executable=$2 started status=0
  shift 2
  started=$SECONDS
  "$executable" "$@" >"$logs/$name.log" 2>&1 || status=$?
  printf '%s %s %s\n' "$name" "$status" "$((SECONDS - started))" >"$logs/$name.done"
  {
    flock 9
    printf '\n==> test binary %s (exit %s, %ss)\n' "$name" "$status" "$((SECONDS - started))"
    cat "$logs/$name.log"
  } 9>"$logs/print.lock"
}

running=0
for target in "${ordered[@]}"; do
  if ((running >= lanes)); then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "${target%%$'\t'*}" "${target#*$'\t'}" "$@" &
  running=$((running + 1))
done
wait || true
for target in "${last[@]}"; do
  run_one "${target%%$'\t'*}" "${target#*$'\t'}" "$@"
done
ordered+=("${last[@]}")

failed=0
summary=()
for target in "${ordered[@]}"; do
  name=${target%%$'\t'*}
  status=missing seconds=-
  [[ -f $logs/$name.done ]] && read -r _ status seconds <"$logs/$name.done"
  if [[ $status != 0 ]]; then
    rm -f "$logs/$name.done"
    run_one "$name" "${target#*$'\t'}" "$@"
    read -r _ rerun _ <"$logs/$name.done"
    if [[ $rerun == 0 && " ${alone[*]} " == *" $name "* ]]; then
      status="$status, then 0 (FLAKY, also when alone)"
    elif [[ $rerun == 0 ]]; then
      status="$status, then 0 alone (FLAKY beside another binary)"
    else
      status="$status, then $rerun alone"
      failed=1
    fi
  fi
  summary+=("$(printf '%-26s %-6s %s' "$name" "$seconds" "$status")")
done
printf '\n==> test binaries (name, seconds, exit status)\n'
printf '%s\n' "${summary[@]}"
rm -rf "$logs"
exit "$failed"
