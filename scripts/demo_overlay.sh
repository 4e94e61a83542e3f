# make demo, part 2 (sourced by scripts/demo.sh, which owns the cleanup): two nodes, one Pod on
# each, a cross-node ping over VXLAN.
#
#   underlay ns: br0 ── veth ── control-plane (eth0 172.31.251.2)    etcd
#                    ── veth ── node1         (eth0 172.31.251.11)   pycnid, VXLAN pycni.1
#                    ── veth ── node2         (eth0 172.31.251.12)   pycnid, VXLAN pycni.1
#
# Each pycnid registers its node in etcd (underlay address, VTEP MAC and address) and programs
# the other node: a route per block via the peer's VTEP address, a permanent neighbour entry and
# an FDB entry, all marked as pycni's (route protocol 77).

UNDERLAY_NET=172.31.251  # a /24 inside the demo's namespaces only
CP_ADDR=$UNDERLAY_NET.2
ETCD_URL=http://$CP_ADDR:2379
POOL=pods-v4             # the pool conf/20-pycni-cluster.conflist asks for
POOL_CIDR=10.244.0.0/16
CLUSTER_NETWORK=pycni-cluster
VXLAN_DEV=pycni.1        # the overlay's default device (VNI 1)

underlay_port() {  # underlay_port HOST_NS OCTET PORT: HOST_NS's eth0 on the underlay bridge
    local ul=$TAG-ul
    ip -n "$ul" link add "$3" type veth peer name eth0 netns "$1"
    ip -n "$ul" link set "$3" master br0 up
    ip -n "$1" link set eth0 up
    ip -n "$1" addr add "$UNDERLAY_NET.$2/24" dev eth0
}

etcd_healthy() {  # etcd's /health, asked from inside the control-plane namespace
    ip netns exec "$TAG-cp" "$PYTHON" -c 'import json, sys, urllib.request
try:
    sys.exit(json.load(urllib.request.urlopen(sys.argv[1], timeout=1))["health"] != "true")
except (OSError, ValueError, KeyError):
    sys.exit(1)' "$ETCD_URL/health"
}

start_etcd() {
    local peer=http://$CP_ADDR:2380
    start_daemon etcd "$WORK/etcd.log" "$TAG-cp" etcd --name demo --data-dir "$WORK/etcd" \
        --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "demo=$peer" --logger zap --log-level warn
    for _ in $(seq 100); do
        etcd_healthy && return
        kill -0 "$LAST_PID" 2>/dev/null || fail "etcd exited early"
        sleep 0.2
    done
    fail "etcd not healthy at $ETCD_URL"
}

start_node_pycnid() {  # start_node_pycnid NODE: its pycnid started (no wait)
    local dir=$WORK/$1
    start_daemon "pycnid on $1" "$dir/pycnid.log" "$TAG-$1" \
        "$PYTHON" -m ipam.daemon.main --config "$dir/pycnid.json"
    NODE_PID[$1]=$LAST_PID
}

pycni_on() {  # pycni_on NODE ARGS...: the `pycni` CLI in NODE's namespace, on its pycnid's config
    local node=$1
    shift
    ip netns exec "$TAG-$node" "$PYTHON" -m ipam.cli "$@" --config "$WORK/$node/pycnid.json"
}

wait_overlay_route() {  # wait_overlay_route NODE IP: until NODE routes IP through the VXLAN device
    for _ in $(seq 100); do
        ip -n "$TAG-$1" route get "$2" 2>/dev/null | grep -q " dev $VXLAN_DEV " && return
        sleep 0.1
    done
    fail "$1 has no route to $2 over $VXLAN_DEV after 10 s"
}

vxlan_summary() {  # vxlan_summary NETNS: the VXLAN device's settings, on one line
    local details mtu
    details=$(ip -d -n "$1" link show "$VXLAN_DEV")
    mtu=$(ip -n "$1" link show "$VXLAN_DEV")
    grep -oE 'mtu [0-9]+' <<<"$mtu" | tr '\n' ','
    grep -oE ' vxlan id [0-9]+ local [^ ]+ dev [^ ]+' <<<"$details" | tr '\n' ','
    grep -oE ' dstport [0-9]+' <<<"$details" | tr -d '\n'
    grep -oE ' nolearning' <<<"$details"
}

show_overlay_state() {  # show_overlay_state NODE: the VXLAN device and the peer entries on NODE
    local ns=$TAG-$1
    info "$VXLAN_DEV: $(vxlan_summary "$ns")"
    info "routes (ip route show proto 77):"
    ip -n "$ns" route show proto 77 | indent | indent
    info "neighbours (ip neigh show dev $VXLAN_DEV):"
    ip -n "$ns" neigh show dev "$VXLAN_DEV" | indent | indent
    info "forwarding database (bridge fdb show dev $VXLAN_DEV):"
    bridge -n "$ns" fdb show dev "$VXLAN_DEV" | indent | indent
}

demo_two_nodes() {
    local -A NODE_PID=()
    local node pod address ip1 ip2 left
    step "Part 2, two nodes: underlay bridge, control plane with etcd, node1 and node2"
    make_ns "$TAG-ul" "$TAG-cp" "$TAG-node1" "$TAG-node2" "$TAG-node1-pod" "$TAG-node2-pod"
    ip -n "$TAG-ul" link add br0 type bridge
    ip -n "$TAG-ul" link set br0 up
    underlay_port "$TAG-cp" 2 p0
    underlay_port "$TAG-node1" 11 p1
    underlay_port "$TAG-node2" 12 p2
    for node in node1 node2; do ip netns exec "$TAG-$node" sysctl -qw net.ipv4.ip_forward=1; done
    info "underlay $UNDERLAY_NET.0/24: control plane .2, node1 .11, node2 .12"

    step "Starting etcd in the control-plane namespace ($ETCD_URL)"
    start_etcd
    info "etcd pid $LAST_PID healthy"

    step "Writing each node's pycnid config (store: etcd, overlay: vxlan) and network config"
    for node in node1 node2; do
        "$PYTHON" "$REPO/scripts/demo_config.py" "$REPO/conf" "$WORK/$node" "$node" "$ETCD_URL"
        info "$node: $WORK/$node/pycnid.json, $WORK/$node/net.d/20-pycni-cluster.conflist"
    done

    step "Adding the pool: pycni ipam pool add $POOL --cidr $POOL_CIDR --block-size 26"
    pycni_on node1 ipam pool add "$POOL" --cidr "$POOL_CIDR" --block-size 26 | indent

    step "Starting pycnid on each node"
    for node in node1 node2; do start_node_pycnid "$node"; done
    for node in node1 node2; do
        wait_socket "${NODE_PID[$node]}" "$WORK/$node/pycnid.sock"
        info "$node: pycnid pid ${NODE_PID[$node]} serving $WORK/$node/pycnid.sock"
    done

    step "One Pod per node: pycni net add $CLUSTER_NETWORK <netns> (conf/20-pycni-cluster.conflist)"
    for node in node1 node2; do
        pod=$TAG-$node-pod
        POD_HOME[$pod]="$TAG-$node $WORK/$node $CLUSTER_NETWORK"
        attach "$pod"
        address=$(ip -n "$pod" -br -4 addr show dev eth0 | awk '{print $3}')
        info "pod on $node: $address, $(ip -n "$pod" link show eth0 | grep -o 'mtu [0-9]*')"
    done
    ip1=$(pod_ip "$WORK/$TAG-node1-pod.json")
    ip2=$(pod_ip "$WORK/$TAG-node2-pod.json")
    wait_overlay_route node1 "$ip2"
    wait_overlay_route node2 "$ip1"

    step "The node registry: pycni node ls"
    pycni_on node1 node ls | indent

    step "What pycnid programmed on node1 for node2"
    show_overlay_state node1

    step "Pinging across nodes (VXLAN over the underlay)"
    ping_from "$TAG-node1-pod" "$ip2" "pod on node1 -> pod on node2 $ip2"
    ping_from "$TAG-node2-pod" "$ip1" "pod on node2 -> pod on node1 $ip1"

    step "Detaching: pycni net del"
    for node in node1 node2; do
        detach "$TAG-$node-pod" && info "pod on $node: DEL ok"
    done
    left=$(veths_left "$TAG-node1")
    left=$((left + $(veths_left "$TAG-node2")))
    info "veth pairs left on the nodes: $left"
    ((left == 0))
}
