# Shared by hack/test.sh, hack/test-matrix.sh and hack/demo.sh (sourced, not run).

step() { printf '\n==> %s\n' "$*" >&2; }

# Starts hack/tools.sh in the background. On a fresh machine the Go builds of the tools and the
# Rust build then share the two cores, each filling the other's downloads and single-threaded
# link steps; on a warm one it returns in seconds. Its progress goes to stderr as it comes.
start_tools() {
  tools_out=$(mktemp)
  hack/tools.sh >"$tools_out" &
  tools_pid=$!
}

# Waits for start_tools' build and prints its bin folder; fails when the build failed.
wait_for_tools() {
  local status=0
  wait "$tools_pid" || status=$?
  if ((status)); then
    printf 'hack/tools.sh failed (exit %s); its messages are above\n' "$status" >&2
    return "$status"
  fi
  cat "$tools_out"
  rm -f "$tools_out"
}

# Every test binary, unit and end-to-end, two at a time on a fresh control plane (hack/run-tests.sh)
# of the Kubernetes hack/tools.sh picks (SVC_KUBERNETES_VERSION, else the pinned one).
# The soak replays one seed here; `make soak` draws a new one each run. A node whose fake kubelet
# stops is NotReady after 8 s here, not Kubernetes's 50 s: every node loss in the tests waits for it
# (the demo and `make bench` keep the defaults).
run_every_test_binary() {
  SOAK_SECONDS=${SOAK_SECONDS:-45} SOAK_SEED=${SOAK_SEED:-777} \
    SVC_NODE_MONITOR_GRACE_PERIOD=${SVC_NODE_MONITOR_GRACE_PERIOD:-8s} SVC_NODE_MONITOR_PERIOD=${SVC_NODE_MONITOR_PERIOD:-1s} \
    hack/with-cluster.sh hack/run-tests.sh --include-ignored
}
