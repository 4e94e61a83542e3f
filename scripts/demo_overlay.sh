# make demo, part 2 (sourced by scripts/demo.sh, which owns the cleanup): two nodes, one Pod on
# each, a cross-node ping over VXLAN, then a Service over both Pods.
#
#   underlay ns: br0 ── veth ── control-plane (eth0 172.31.251.2)    etcd
#                    ── veth ── node1         (eth0 172.31.251.11)   pycnid, VXLAN pycni.1
#                    ── veth ── node2         (eth0 172.31.251.12)   pycnid, VXLAN pycni.1
#
# Each pycnid registers its node in etcd (underlay address, VTEP MAC and address) and programs
# the other node: a route per block via the peer's VTEP address, a permanent neighbour entry and
# an FDB entry, all marked as pycni's (route protocol 77).
#
# Then a Service, as an operator runs one: the Pods were added through pycni-bridge + pycni-svc
# (labels app=web in CNI_ARGS), so they are its endpoints; `pycni svc` makes demo/web, each
# Pod serves its own address on 8080, the pod on node1 connects to the VIP and both answer
# (one of them is the client itself: hairpin), and `pycni svc trace` explains the path.

UNDERLAY_NET=172.31.251  # a /24 inside the demo's namespaces only
CP_ADDR=$UNDERLAY_NET.2
ETCD_URL=http://$CP_ADDR:2379
POOL=pods-v4             # the pool conf/20-pycni-cluster.conflist asks for
POOL_CIDR=10.244.0.0/16
CLUSTER_NETWORK=pycni-cluster
VXLAN_DEV=pycni.1        # the overlay's default device (VNI 1)
SVC=demo/web             # namespace/name of the demo's Service
SVC_CIDR=10.96.0.0/24
SVC_CONNECTS=16          # VIP connects from node1's pod (all to one backend: 1 run in 2^15)
# Each Pod's server: answers every connection with the address it reached (the Pod's own)
WEB_SERVER='import socketserver as s
class H(s.BaseRequestHandler):
    def handle(self): self.request.sendall(self.request.getsockname()[0].encode())
s.TCPServer.allow_reuse_address = True
s.TCPServer(("0.0.0.0", 8080), H).serve_forever()'
# The client: waits (15 s at most) until this node's proxy has the Service, then N connects
# and prints "ADDRESS COUNT" per backend that answered
WEB_CLIENT='import collections, socket, sys, time
def ask():
    with socket.create_connection((sys.argv[1], 80), timeout=2) as conn:
        return conn.recv(64).decode()
deadline = time.monotonic() + 15
while True:
    try:
        ask()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
for address, count in sorted(collections.Counter(ask() for _ in range(int(sys.argv[2]))).items()):
    print(address, count)'

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
        "$PYTHON" -m pycnid.main --config "$dir/pycnid.json"
    NODE_PID[$1]=$LAST_PID
}

pycni_on() {  # pycni_on NODE ARGS...: the `pycni` CLI in NODE's namespace, on its pycnid's config
    local node=$1
    shift
    ip netns exec "$TAG-$node" "$PYTHON" -m cli "$@" --config "$WORK/$node/pycnid.json"
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

pod_args() {  # pod_args NODE: the CNI_ARGS a runtime passes for NODE's Pod (demo/web-NODE)
    printf 'IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-%s;PYCNI_LABELS=app:web' "$1"
}

wait_listening() {  # wait_listening NETNS PORT: until a TCP socket listens on PORT (5 s)
    for _ in $(seq 50); do
        ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q . && return
        sleep 0.1
    done
    fail "nothing listens on $2 in $1 after 5 s"
}

start_web_servers() {  # WEB_PID[NODE]: each Pod's server, listening
    local node
    for node in node1 node2; do
        start_daemon "web server on $node" "$WORK/$node/web.log" "$TAG-$node-pod" \
            "$PYTHON" -c "$WEB_SERVER" "$TAG-web"  # the tag names it in ps
        WEB_PID[$node]=$LAST_PID
    done
    for node in node1 node2; do wait_listening "$TAG-$node-pod" 8080; done
    info "a TCP server on :8080 in each Pod, answering with the Pod's address"
}

create_service() {  # the Service made, its first ClusterIP printed
    pycni_on node1 svc create "$SVC" --port http:80/TCP:8080 --selector app=web --output json |
        "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["service"]["clusterIPs"][0])'
}

count_answers() {  # count_answers VIP IP1 IP2: connects from node1's pod, answers per Pod
    local answers address count who
    answers=$(ip netns exec "$TAG-node1-pod" "$PYTHON" -c "$WEB_CLIENT" "$1" "$SVC_CONNECTS")
    info "$SVC_CONNECTS connects from the pod on node1 to $1:80:"
    while read -r address count; do
        case $address in
            "$2") who="the pod on node1" ;;
            "$3") who="the pod on node2" ;;
            *) who="?" ;;
        esac
        info "$(printf '    answered by %s %-14s %2d' "$who" "$address" "$count")"
    done <<<"$answers"
}

demo_service() {  # demo_service IP1 IP2: a Service over both Pods, used, traced and removed
    local -A WEB_PID=()
    local vip node
    step "A Service over both Pods: pycni svc (the proxy in each pycnid programs it)"
    pycni_on node1 svc config set --cidr "$SVC_CIDR" | indent
    vip=$(create_service)
    info "pycni svc create $SVC --port http:80/TCP:8080 --selector app=web: clusterIP $vip"
    info "pycni svc show $SVC:"
    pycni_on node1 svc show "$SVC" | indent | indent
    info "pycni svc endpoints $SVC (published by pycni-svc when each Pod was added):"
    pycni_on node1 svc endpoints "$SVC" | indent | indent

    step "Connecting to the Service's VIP $vip:80 (DNAT to a Pod's :8080)"
    start_web_servers
    count_answers "$vip" "$1" "$2"

    step "pycni svc trace --from $1 --to $vip:80/tcp (read from node1's live ruleset)"
    pycni_on node1 svc trace --from "$1" --to "$vip:80/tcp" | sed '/^ *$/d' | indent

    step "Removing the Service: servers stopped, pycni svc rm $SVC"
    for node in node1 node2; do stop_daemon "${WEB_PID[$node]}" "web server on $node"; done
    pycni_on node1 svc rm "$SVC" | indent
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

    step "One Pod per node: pycni net add $CLUSTER_NETWORK <netns> (pycni-bridge, pycni-svc)"
    info "CNI_ARGS of the pod on node1: $(pod_args node1)"
    for node in node1 node2; do
        pod=$TAG-$node-pod
        POD_HOME[$pod]="$TAG-$node $WORK/$node $CLUSTER_NETWORK $(pod_args "$node")"
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

    demo_service "$ip1" "$ip2"

    step "Detaching: pycni net del"
    for node in node1 node2; do
        detach "$TAG-$node-pod" && info "pod on $node: DEL ok"
    done
    left=$(veths_left "$TAG-node1")
    left=$((left + $(veths_left "$TAG-node2")))
    info "veth pairs left on the nodes: $left"
    ((left == 0))
}
