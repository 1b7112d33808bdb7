#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the tests and the demo: etcd, kube-apiserver and
# kube-controller-manager built by hack/tools.sh. No kubelet, no scheduler: the tests run a fake
# kubelet per simulated node (tests/common/kubelet.rs) that renews the node's Lease, and Kubernetes's
# own node-lifecycle controller marks a node NotReady once that stops.
#
#   hack/cluster.sh up [DIR]     start; writes DIR/kubeconfig (DIR defaults to $SVC_CLUSTER_DIR or
#                                ${TMPDIR:-/tmp}/shared-volume-controller-cluster)
#   hack/cluster.sh down [DIR]   stop every process and remove DIR
#   hack/cluster.sh env [DIR]    print `export KUBECONFIG=...`
#   SVC_SERVICE_CIDR=10.96.0.0/16,fd00:10:96::/108 hack/cluster.sh up DIR
#                                a dual-stack service range (default: IPv4 10.96.0.0/16 only)
#   SVC_EVENT_TTL=15s hack/cluster.sh up DIR
#                                events expire sooner than Kubernetes's default (1h)
#   SVC_NODE_MONITOR_GRACE_PERIOD=8s SVC_NODE_MONITOR_PERIOD=1s hack/cluster.sh up DIR
#                                a silent node is marked NotReady sooner than Kubernetes's defaults
#                                (50s and 5s): `make test` does, the demo and `make bench` do not
#   SVC_API_PRIORITY=true SVC_API_SEATS=40,20 hack/cluster.sh up DIR
#                                API Priority and Fairness on (off by default: the tests act as the
#                                admin, which it exempts), with the API server's seats (at most
#                                40 requests in flight, 20 of them writes; Kubernetes: 400,200)
#   hack/cluster.sh restart NAME [DIR]
#                                stop one of etcd, kube-apiserver, kube-controller-manager and start
#                                it again as it was (etcd keeps its data): for the fault tests
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:-}
[[ $cmd == restart ]] && { component=${2:-}; shift; }
dir=${2:-${SVC_CLUSTER_DIR:-${TMPDIR:-/tmp}/shared-volume-controller-cluster}}
log() { printf '[cluster] %s\n' "$*" >&2; }

# Controllers the tests rely on: garbage collection (owner references), EndpointSlice mirroring,
# namespace deletion, the default ServiceAccount every namespace needs for Pod admission, and the
# PVC/PV protection finalizers (without them a deleted claim never goes away), and node loss as
# Kubernetes decides it: node-lifecycle (NotReady, the unreachable taints) and taint-eviction (pods
# deleted once their toleration of those taints runs out).
# SVC_EXTRA_CONTROLLERS adds more: the benchmark's stateful pods need the StatefulSet, Deployment
# and ReplicaSet controllers, which would give the other tests' charts pods nobody schedules.
controllers=garbage-collector-controller,endpointslice-mirroring-controller,namespace-controller,serviceaccount-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller,disruption-controller,node-lifecycle-controller,taint-eviction-controller${SVC_EXTRA_CONTROLLERS:+,$SVC_EXTRA_CONTROLLERS}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

down() {
  [[ -d "$dir" ]] || return 0
  for pidfile in "$dir"/*.pid; do
    [[ -f "$pidfile" ]] || continue
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
  done
  for pidfile in "$dir"/*.pid; do
    [[ -f "$pidfile" ]] || continue
    local pid
    pid=$(cat "$pidfile")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
  log "stopped and removed $dir"
}

all_running() {
  local name
  for name in etcd kube-apiserver kube-controller-manager; do
    [[ -f "$dir/$name.pid" ]] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || return 1
  done
}

make_pki() {
  local pki=$dir/pki
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=svc-test-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 \
      -extfile apiserver.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
    # An extension makes it an X.509 v3 certificate, the only version rustls accepts.
    printf 'extendedKeyUsage=clientAuth\n' >admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 2 \
      -extfile admin.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

write_kubeconfig() {
  local port=$1 pki=$dir/pki
  cat >"$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 <"$pki/admin.crt")
    client-key-data: $(base64 -w0 <"$pki/admin.key")
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KC
}

start() { # name, command...
  local name=$1
  shift
  printf '%q ' "$@" >"$dir/$name.cmd"
  setsid "$@" >>"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

restart() {
  [[ -f "$dir/$component.cmd" ]] || { log "no $component in $dir"; exit 2; }
  local pid
  pid=$(cat "$dir/$component.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  log "restarting $component"
  local command
  command=$(cat "$dir/$component.cmd")
  eval "start $component $command"
}

wait_for() { # what, seconds, command...
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "FAILED: $what not ready after ${seconds}s; last lines of its log:"
      tail -n 20 "$dir/$what.log" >&2 || true
      return 1
    fi
    sleep 0.3
  done
}

up() {
  local bin
  bin=$("$here/tools.sh")
  if all_running && "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    log "already up: export KUBECONFIG=$dir/kubeconfig"
    return 0
  fi
  down
  mkdir -p "$dir"
  make_pki
  local pki=$dir/pki etcd_port peer_port api_port
  etcd_port=$(free_port)
  peer_port=$(free_port)
  api_port=$(free_port)

  log "starting etcd on 127.0.0.1:$etcd_port"
  start etcd "$bin/etcd" --data-dir "$dir/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "default=http://127.0.0.1:$peer_port" --listen-metrics-urls "" --log-level warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

  # An audit log of every write to the objects the controller and the agents manage, with the
  # client's User-Agent (the controller names its replica there): the fault tests read it
  # ($dir/audit.log, beside the kubeconfig) to tell which replica wrote what, and when.
  cat >"$dir/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - group: ""
        resources: [services, endpoints, persistentvolumes, persistentvolumeclaims, nodes, pods]
      - group: discovery.k8s.io
        resources: [endpointslices]
      - group: storage.k8s.io
        resources: [volumeattachments]
  - level: None
POLICY

  local seats=()
  if [[ -n "${SVC_API_SEATS:-}" ]]; then
    seats=(--max-requests-inflight "${SVC_API_SEATS%,*}" --max-mutating-requests-inflight "${SVC_API_SEATS#*,}")
  fi
  log "starting kube-apiserver on 127.0.0.1:$api_port"
  # No endpoint reconciler: it would keep trying to write a loopback address into the `kubernetes`
  # Endpoints (refused with 422), which is noise in tests that count the apiserver's writes.
  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode RBAC \
    --service-cluster-ip-range "${SVC_SERVICE_CIDR:-10.96.0.0/16}" --allow-privileged \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --enable-priority-and-fairness="${SVC_API_PRIORITY:-false}" "${seats[@]}" \
    --profiling=false --event-ttl "${SVC_EVENT_TTL:-1h}" \
    --endpoint-reconciler-type none \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log" \
    --audit-log-format json --audit-log-maxbackup 1 --audit-log-maxsize 200
  write_kubeconfig "$api_port"
  wait_for kube-apiserver 90 "$bin/kubectl" --kubeconfig "$dir/kubeconfig" get --raw /readyz

  local node_monitor=()
  [[ -n ${SVC_NODE_MONITOR_GRACE_PERIOD:-} ]] &&
    node_monitor+=(--node-monitor-grace-period "$SVC_NODE_MONITOR_GRACE_PERIOD")
  [[ -n ${SVC_NODE_MONITOR_PERIOD:-} ]] && node_monitor+=(--node-monitor-period "$SVC_NODE_MONITOR_PERIOD")
  log "starting kube-controller-manager ($controllers${node_monitor[*]:+ ${node_monitor[*]}})"
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/kubeconfig" --controllers "$controllers" --leader-elect=false \
    --secure-port 0 --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --concurrent-gc-syncs 10 "${node_monitor[@]}"
  wait_for kube-controller-manager 60 "$bin/kubectl" --kubeconfig "$dir/kubeconfig" \
    get serviceaccount default -n default
  log "up: export KUBECONFIG=$dir/kubeconfig"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  restart) restart ;;
  env) echo "export KUBECONFIG=$dir/kubeconfig" ;;
  *)
    echo "usage: $0 up|down|env [DIR], or $0 restart etcd|kube-apiserver|kube-controller-manager [DIR]" >&2
    exit 2
    ;;
esac
