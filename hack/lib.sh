# Shared by hack/test.sh and hack/demo.sh (sourced, not run).

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
