#!/usr/bin/env bash
# make demo: pycni on one node, then a pod network across two nodes.
#
# Part 1, one node: a "node" namespace runs pycnid (embedded SQLite store, temp state dir and
# socket) and holds the bridge; two "pod" namespaces get attached with `pycni net add` (the
# cnitool-compatible CLI) through the example conflist, ping each other and their gateway, and
# are detached again.
# Part 2, two nodes (scripts/demo_overlay.sh): an "underlay" namespace with a bridge joins a
# control-plane namespace running etcd and two node namespaces, each running its own pycnid on
# that etcd with the VXLAN overlay; one pool, one Pod per node, and a ping from node to node;
# then a Service over both Pods (pycni-svc, the proxy in pycnid, `pycni svc`) and its trace.
#
# Everything happens in namespaces this script creates (all named pycnidemo<pid>-*); the
# machine's own network namespace is never touched. On exit (success, failure or Ctrl-C) Pods
# still attached are DELeted, the daemons are stopped, the namespaces are deleted and the temp
# dir is removed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TAG=pycnidemo$$
WORK=
NAMESPACES=()           # every namespace made, deleted last-made first
DAEMONS=()              # "pid log label" of every daemon started, stopped last-started first
declare -A POD_HOME=()  # pod ns -> "node-ns node-dir network [CNI_ARGS]" it attaches to
declare -A ATTACHED=()  # pods ADDed and not DELeted yet: DELeted on the way out

# At most one $(...) per command once the traps are set: bash 5.2 (Debian 12) mis-parses the
# trap, or loses the signal, when Ctrl-C lands in a command with several command substitutions.
if [[ -t 1 ]]; then B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'; else B= G= R= N=; fi
step() { printf '\n%s==> %s%s\n' "$B" "$*" "$N"; }
info() { printf '    %s\n' "$*"; }
indent() { sed 's/^/    /'; }
fail() { echo "$*" >&2; exit 1; }

make_ns() {  # make_ns NAME...: namespaces with their loopback up, deleted on the way out
    local ns
    for ns in "$@"; do
        ip netns add "$ns"
        NAMESPACES+=("$ns")
        ip -n "$ns" link set lo up
    done
}

start_daemon() {  # start_daemon LABEL LOG NETNS CMD...: in the background, stopped on the way out
    local label=$1 log=$2 ns=$3
    shift 3
    # not through a wrapper: $! must be the daemon itself (ip netns exec execs it, same pid)
    ip netns exec "$ns" "$@" </dev/null >>"$log" 2>&1 &
    DAEMONS+=("$! $log $label")
    LAST_PID=$!
}

wait_socket() {  # wait_socket PID SOCKET: until the pycnid at PID serves SOCKET (15 s)
    for _ in $(seq 150); do
        [[ -S $2 ]] && return
        kill -0 "$1" 2>/dev/null || fail "pycnid (pid $1) exited early"
        sleep 0.1
    done
    fail "pycnid (pid $1) did not open $2"
}

stop_daemon() {  # stop_daemon PID LABEL: SIGTERM, SIGKILL after 10 s
    kill -0 "$1" 2>/dev/null || return 0
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    info "$2 stopped"
}

cni_net() {  # cni_net VERB POD: `pycni net VERB` (cnitool-style) in the pod's node namespace
    local node dir network args
    read -r node dir network args <<<"${POD_HOME[$2]}"
    ip netns exec "$node" env NETCONFPATH="$dir/net.d" CNI_PATH="$WORK/bin:/usr/lib/cni" \
        CNI_CACHE_DIR="$dir/cache" CNI_ARGS="$args" \
        "$PYTHON" -m cli net "$1" "$network" "/var/run/netns/$2"
}
attach() {  # attach POD: ADD, the result in $WORK/POD.json
    ATTACHED[$1]=1  # before the ADD: a failed or interrupted ADD is DELeted too
    cni_net add "$1" >"$WORK/$1.json"
}
detach() { cni_net del "$1" && unset "ATTACHED[$1]"; }

pod_ip() {  # the pod's first IPv4 address (no prefix) from its ADD result
    "$PYTHON" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(next(ip["address"].split("/")[0] for ip in r["ips"] if "." in ip["address"]))' "$1"
}
gateway_ip() {
    "$PYTHON" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(next(ip["gateway"] for ip in r["ips"] if "." in ip["address"] and ip.get("gateway")))' "$1"
}
ping_from() {  # ping_from POD TARGET LABEL
    local summary
    summary=$(ip netns exec "$1" ping -c 3 -i 0.2 -W 2 "$2" | grep -E 'packets transmitted')
    info "$(printf '%-34s %s' "$3" "${summary%%, time*}")"
}
veths_left() {  # Pod veths left on a node namespace (its underlay eth0 is one too, not counted)
    ip -n "$1" -o link show type veth | awk '$2 !~ /^eth0@/' | wc -l
}

detach_leftovers() {
    local pod
    for pod in "${!ATTACHED[@]}"; do
        if cni_net del "$pod" >/dev/null 2>&1; then info "${pod#"$TAG-"}: DEL ok"; fi
    done
}

stop_daemons() {
    local i pid label log
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        read -r pid log label <<<"${DAEMONS[i]}"
        stop_daemon "$pid" "$label"
    done
}

show_logs() {  # after a failure: the last lines of every daemon's log
    local entry pid label log
    for entry in "${DAEMONS[@]}"; do
        read -r pid log label <<<"$entry"
        [[ -s $log ]] || continue
        printf '%s    last lines of the %s log:%s\n' "$R" "$label" "$N"
        tail -n 15 "$log" | sed 's/^/      /'
    done
}

delete_namespaces() {
    local i ns pid
    for ((i = ${#NAMESPACES[@]} - 1; i >= 0; i--)); do
        ns=${NAMESPACES[i]}
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        if ip netns delete "$ns" 2>/dev/null; then info "namespace $ns deleted"; fi
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # a signal may arrive while a command's output is redirected (attach > pod.json): the
    # trap inherits that redirection, so speak on the script's own stdout/stderr again
    exec 1>&3 2>&4
    step "Cleaning up"
    detach_leftovers
    stop_daemons
    ((status == 0)) || show_logs
    delete_namespaces
    [[ -n $WORK ]] && rm -rf "$WORK" && info "temp dir $WORK removed"
    if ((status == 0)); then
        printf '\n%spycni demo: OK%s\n' "$G" "$N"
    else
        printf '\n%spycni demo: FAILED (exit %d)%s\n' "$R" "$status" "$N"
    fi
    exit "$status"
}

demo_single_node() {
    local node=$TAG-node pod1=$TAG-pod1 pod2=$TAG-pod2 network=pycni  # conf/10-pycni.conflist
    local pod ip1 ip2 gw left
    step "Part 1, one node: a node namespace ($node) and two pod namespaces"
    make_ns "$node" "$pod1" "$pod2"
    ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1
    info "node: $node   pod1: $pod1   pod2: $pod2"
    "$PYTHON" "$REPO/scripts/demo_config.py" "$REPO/conf" "$WORK"
    info "NETCONFPATH=$WORK/net.d (conf/10-pycni.conflist, daemonSocket=$WORK/pycnid.sock)"

    step "Starting pycnid in the node namespace (embedded SQLite store)"
    start_daemon pycnid "$WORK/pycnid.log" "$node" \
        "$PYTHON" -m pycnid.main --config "$WORK/pycnid.json"
    wait_socket "$LAST_PID" "$WORK/pycnid.sock"
    info "pycnid pid $LAST_PID serving $WORK/pycnid.sock"

    step "Attaching the pods: pycni net add $network <netns>"
    for pod in "$pod1" "$pod2"; do
        POD_HOME[$pod]="$node $WORK $network"
        attach "$pod"
        info "${pod#"$TAG-"}: $(ip -n "$pod" -br -4 addr show dev eth0 | awk '{print $1, $3}')"
    done
    ip1=$(pod_ip "$WORK/$pod1.json")
    ip2=$(pod_ip "$WORK/$pod2.json")
    gw=$(gateway_ip "$WORK/$pod1.json")
    info "gateway (bridge address on the node): $gw"
    info "default route in pod1: $(ip -n "$pod1" route show default | sed 's/ *$//')"

    step "Pinging"
    ping_from "$pod1" "$ip2" "pod1 -> pod2    $ip2"
    ping_from "$pod2" "$ip1" "pod2 -> pod1    $ip1"
    ping_from "$pod1" "$gw" "pod1 -> gateway $gw"
    ping_from "$pod2" "$gw" "pod2 -> gateway $gw"

    step "What the node namespace holds now"
    ip -n "$node" -br link show | awk '{printf "    %-24s %s\n", $1, $2}'
    info "bridge address: $(ip -n "$node" -br -4 addr show type bridge | awk '{print $1, $3}')"
    info "nftables tables: $(ip netns exec "$node" nft list tables | tr '\n' ' ' | sed 's/ *$//')"

    step "Checking and detaching: pycni net check / pycni net del"
    for pod in "$pod1" "$pod2"; do
        cni_net check "$pod" && info "${pod#"$TAG-"}: CHECK ok"
        detach "$pod" && info "${pod#"$TAG-"}: DEL ok"
    done
    left=$(veths_left "$node")
    info "veth pairs left on the node: $left"
    ((left == 0))
}

if [[ $(id -u) != 0 ]]; then
    echo "make demo needs root: it creates network namespaces (never touching the host's own)" >&2
    exit 1
fi
exec 3>&1 4>&2
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "Checking prerequisites (installs only what is missing)"
bash "$REPO/scripts/install-deps.sh" --demo
export PYTHONPATH=$REPO
WORK=$(mktemp -d /tmp/pycni-demo.XXXXXX)

step "Writing the plugin executables to $WORK/bin"
"$PYTHON" -m cni.launcher "$WORK/bin" | indent

demo_single_node
# shellcheck source=scripts/demo_overlay.sh
source "$REPO/scripts/demo_overlay.sh"
demo_two_nodes
