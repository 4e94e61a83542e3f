#!/usr/bin/env bash
# make demo: two pods on one node, wired by pycni-bridge + pycni-ipam through the example conflist.
#
# Everything happens in namespaces this script creates: a "node" namespace runs pycnid (embedded
# SQLite store, temp state dir and socket) and holds the bridge; two "pod" namespaces get attached
# with `pycni net add` (the cnitool-compatible CLI), ping each other and their gateway, and are
# detached again. The machine's own network namespace is never touched. On exit (success, failure
# or Ctrl-C) pycnid is stopped, the namespaces are deleted and the temp dir is removed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
NETWORK=pycni                      # the "name" in conf/10-pycni.conflist
TAG=pycnidemo$$
NODE=$TAG-node POD1=$TAG-pod1 POD2=$TAG-pod2
WORK= PYCNID_PID=

if [[ -t 1 ]]; then B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'; else B= G= R= N=; fi
step() { printf '\n%s==> %s%s\n' "$B" "$*" "$N"; }
info() { printf '    %s\n' "$*"; }
in_node() { ip netns exec "$NODE" "$@"; }

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # a signal may arrive while a command's output is redirected (pycni_net add > pod.json):
    # the trap inherits that redirection, so speak on the script's own stdout/stderr again
    exec 1>&3 2>&4
    step "Cleaning up"
    if [[ -n $PYCNID_PID ]] && kill -0 "$PYCNID_PID" 2>/dev/null; then
        kill -TERM "$PYCNID_PID" 2>/dev/null || true
        wait "$PYCNID_PID" 2>/dev/null || true
        info "pycnid stopped"
    fi
    if ((status != 0)) && [[ -n $WORK && -s $WORK/pycnid.log ]]; then
        printf '%s    last lines of the pycnid log:%s\n' "$R" "$N"
        tail -n 15 "$WORK/pycnid.log" | sed 's/^/      /'
    fi
    local ns
    for ns in "$POD1" "$POD2" "$NODE"; do
        if ip netns delete "$ns" 2>/dev/null; then info "namespace $ns deleted"; fi
    done
    [[ -n $WORK ]] && rm -rf "$WORK" && info "temp dir $WORK removed"
    if ((status == 0)); then
        printf '\n%spycni demo: OK%s\n' "$G" "$N"
    else
        printf '\n%spycni demo: FAILED (exit %d)%s\n' "$R" "$status" "$N"
    fi
    exit "$status"
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

step "Creating a node namespace ($NODE) and two pod namespaces"
for ns in "$NODE" "$POD1" "$POD2"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
in_node sysctl -qw net.ipv4.ip_forward=1
info "node: $NODE   pod1: $POD1   pod2: $POD2"

step "Writing plugin executables, daemon config and network config to $WORK"
"$PYTHON" -m cni.launcher "$WORK/bin" | sed 's/^/    /'
"$PYTHON" "$REPO/scripts/demo_config.py" "$REPO/conf" "$WORK"
info "NETCONFPATH=$WORK/net.d (conf/10-pycni.conflist, daemonSocket=$WORK/pycnid.sock)"

step "Starting pycnid in the node namespace (embedded SQLite store)"
# not through in_node: $! must be the daemon itself (ip netns exec execs it, same pid)
ip netns exec "$NODE" "$PYTHON" -m ipam.daemon.main --config "$WORK/pycnid.json" \
    </dev/null >>"$WORK/pycnid.log" 2>&1 &
PYCNID_PID=$!
for _ in $(seq 150); do
    [[ -S $WORK/pycnid.sock ]] && break
    kill -0 "$PYCNID_PID" 2>/dev/null || { echo "pycnid exited early" >&2; exit 1; }
    sleep 0.1
done
[[ -S $WORK/pycnid.sock ]] || { echo "pycnid did not open $WORK/pycnid.sock" >&2; exit 1; }
info "pycnid pid $PYCNID_PID serving $WORK/pycnid.sock"

pycni_net() {  # pycni net VERB NETNS_NAME — cnitool-style, run inside the node namespace
    in_node env NETCONFPATH="$WORK/net.d" CNI_PATH="$WORK/bin:/usr/lib/cni" \
        CNI_CACHE_DIR="$WORK/cache" "$PYTHON" -m ipam.cli net "$1" "$NETWORK" "/var/run/netns/$2"
}
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

step "Attaching the pods: pycni net add $NETWORK <netns>"
for pod in "$POD1" "$POD2"; do
    pycni_net add "$pod" >"$WORK/$pod.json"
    info "${pod#"$TAG-"}: $(ip -n "$pod" -br -4 addr show dev eth0 | awk '{print $1, $3}')"
done
IP1=$(pod_ip "$WORK/$POD1.json") IP2=$(pod_ip "$WORK/$POD2.json")
GW=$(gateway_ip "$WORK/$POD1.json")
info "gateway (bridge address on the node): $GW"
info "default route in pod1: $(ip -n "$POD1" route show default | sed 's/ *$//')"

step "Pinging"
ping_from() {  # ping_from POD TARGET LABEL
    local summary
    summary=$(ip netns exec "$1" ping -c 3 -i 0.2 -W 2 "$2" | grep -E 'packets transmitted')
    info "$(printf '%-28s %s' "$3" "${summary%%, time*}")"
}
ping_from "$POD1" "$IP2" "pod1 -> pod2    $IP2"
ping_from "$POD2" "$IP1" "pod2 -> pod1    $IP1"
ping_from "$POD1" "$GW" "pod1 -> gateway $GW"
ping_from "$POD2" "$GW" "pod2 -> gateway $GW"

step "What the node namespace holds now"
ip -n "$NODE" -br link show | awk '{printf "    %-24s %s\n", $1, $2}'
info "bridge address: $(ip -n "$NODE" -br -4 addr show type bridge | awk '{print $1, $3}')"
info "nftables tables: $(in_node nft list tables | tr '\n' ' ' | sed 's/ *$//')"

step "Checking and detaching: pycni net check / pycni net del"
for pod in "$POD1" "$POD2"; do
    pycni_net check "$pod" && info "${pod#"$TAG-"}: CHECK ok"
    pycni_net del "$pod" && info "${pod#"$TAG-"}: DEL ok"
done
left=$(ip -n "$NODE" -o link show type veth | wc -l)
info "veth pairs left on the node: $left"
((left == 0))
