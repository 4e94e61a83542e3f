"""netpol/view.PodCache under generated histories of endpoint records (several interfaces per
Pod, relabels, moves between Pods, deletes, repeated refreshes): after every step its Pods
equal what ``netpol/record.calc_pods`` computes afresh from the same records in key order
(and so do its Pods by namespace),
whether it looks at every key or is told the keys touched since (as ``Records`` tells it),
and the policies-by-namespace index gives ``policies_of`` the same answer as a full scan; the
policies ``Records`` sorts once per change are, after every step, its policies sorted by ref."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from netpol import members
from netpol.evaluate import PolicyInputs, policies_of, selects
from netpol.members import group_by_namespace
from netpol.policy import parse_policy
from netpol.record import NamespaceRecord, calc_pods
from netpol.view import PodCache, Records
from services.record import EndpointRecord
from store.base import KV
from store.codec import encode
from store.keys import ENDPOINTS, NAMESPACES, NETPOLS, namespace_key, netpol_key
from tests.fuzz.budget import cases

KEYS = st.tuples(st.sampled_from("xy"), st.sampled_from("abc"), st.sampled_from(["eth0", "net1"]))
RECORDS = st.builds(
    lambda key, ip, app, port: EndpointRecord(
        key[0], key[1], key[2], (f"10.0.0.{ip}",), {"app": app}, "n1", {"http": port}
    ),
    KEYS,
    st.integers(1, 9),
    st.sampled_from(["web", "db"]),
    st.integers(80, 82),
)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), RECORDS),
        st.tuples(st.just("delete"), KEYS),
        st.tuples(st.just("refresh"), st.none()),
    ),
    max_size=25,
)


@cases(200)
@given(steps=STEPS, told=st.booleans(), resort=st.sampled_from([0, members.RESORT]))
def test_the_cache_equals_a_fresh_computation_after_every_step(steps, told, resort):
    """``resort``: how many changed Pods are moved in place (0: every change sorts again)."""
    kept, members.RESORT = members.RESORT, resort
    try:
        check_cache(steps, told)
    finally:
        members.RESORT = kept


def check_cache(steps, told):
    cache, endpoints, touched = PodCache(), {}, set()
    for op, arg in steps:
        if op == "put":
            endpoints[arg.key] = arg
            touched.add(arg.key)
        elif op == "delete":
            key = EndpointRecord(*arg, ()).key
            endpoints.pop(key, None)
            touched.add(key)
        fresh = calc_pods([endpoints[k] for k in sorted(endpoints)])
        assert cache.refresh(endpoints, touched if told else None) == fresh
        assert cache.groups == group_by_namespace(fresh)  # a changed namespace: another tuple
        touched = set()


@cases(100)
@given(
    namespaces=st.lists(st.sampled_from("xyz"), max_size=6),
    pod_ns=st.sampled_from("xyz"),
    app=st.sampled_from(["web", "db"]),
)
def test_policies_by_namespace_give_what_a_full_scan_gives(namespaces, pod_ns, app):
    policies = tuple(
        parse_policy(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"namespace": ns, "name": f"p{i}"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}} if i % 2 else {}},
            }
        )
        for i, ns in enumerate(namespaces)
    )
    inputs = PolicyInputs(policies=policies)
    pod = calc_pods([EndpointRecord(pod_ns, "a", "eth0", ("10.0.0.1",), {"app": app}, "n1")])[0]
    scan = sorted(
        (p for p in policies if p.isolates("Ingress") and selects(p, pod)), key=lambda p: p.ref
    )
    assert policies_of(inputs, pod, "Ingress") == scan


@cases(100)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("put"), RECORDS),
            st.tuples(st.just("delete"), KEYS),
            st.tuples(st.just("snapshot"), st.lists(RECORDS, max_size=4)),
            st.tuples(st.just("inputs"), st.none()),
        ),
        max_size=20,
    )
)
def test_records_tell_the_cache_every_endpoint_they_touched(steps):
    """Records' puts, deletes and snapshots (``replace_all``) between calls of ``inputs()``:
    its Pods are those of the records it holds, as computed afresh."""
    records = Records()
    for op, arg in [*steps, ("inputs", None)]:
        if op == "put":
            records.apply(KV(arg.key, arg.to_bytes(), 1))
        elif op == "delete":
            records.apply(KV(EndpointRecord(*arg, ()).key, b"", 1), deleted=True)
        elif op == "snapshot":
            records.replace_all([KV(r.key, r.to_bytes(), 1) for r in arg], ENDPOINTS)
        else:
            held = records.endpoints
            assert records.inputs().pods == calc_pods([held[k] for k in sorted(held)])


POLICY_NAMES = st.tuples(st.sampled_from("xy"), st.sampled_from("pqr"))


def policy_kv(namespace: str, name: str, app: str) -> KV:
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"podSelector": {"matchLabels": {"app": app}}},
    }
    return KV(netpol_key(namespace, name), encode(parse_policy(manifest).to_dict()), 1)


@cases(100)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("put"), POLICY_NAMES, st.sampled_from(["web", "db"])),
            st.tuples(st.just("delete"), POLICY_NAMES, st.none()),
            st.tuples(st.just("snapshot"), st.lists(POLICY_NAMES, max_size=3), st.none()),
        ),
        max_size=15,
    )
)
def test_the_sorted_policies_follow_every_put_delete_and_snapshot(steps):
    records = Records()
    for op, arg, app in steps:
        if op == "put":
            records.apply(policy_kv(*arg, app))
        elif op == "delete":
            records.apply(KV(netpol_key(*arg), b"", 1), deleted=True)
        else:
            records.replace_all([policy_kv(ns, n, "web") for ns, n in arg], NETPOLS)
        held = tuple(sorted(records.policies.values(), key=lambda p: p.ref))
        assert records.inputs().policies == held
        assert records.policy_inputs().policies == held
        assert records.inputs().policies_in == PolicyInputs(policies=held).policies_in


NAMESPACE_LABELS = st.dictionaries(st.sampled_from(["team", "env"]), st.sampled_from("ab"))


@cases(100)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.sampled_from("xy"), NAMESPACE_LABELS),
            st.tuples(st.just("delete"), st.sampled_from("xy"), st.none()),
            st.tuples(
                st.just("snapshot"),
                st.dictionaries(st.sampled_from("xy"), NAMESPACE_LABELS, max_size=2),
                st.none(),
            ),
            st.tuples(st.just("inputs"), st.none(), st.none()),
        ),
        max_size=15,
    )
)
def test_the_namespace_labels_follow_every_put_delete_and_snapshot(steps):
    """One mapping is shared by the passes until a namespace record changed; it is always
    the labels of the namespace records held."""
    records = Records()

    def kv(name: str, labels: dict) -> KV:
        return KV(namespace_key(name), NamespaceRecord(name, labels).to_bytes(), 1)

    for op, arg, labels in steps:
        if op == "put":
            records.apply(kv(arg, labels))
        elif op == "delete":
            records.apply(KV(namespace_key(arg), b"", 1), deleted=True)
        elif op == "snapshot":
            records.replace_all([kv(n, found) for n, found in arg.items()], NAMESPACES)
        held = {n.name: dict(n.labels) for n in records.namespaces.values()}
        assert records.inputs().namespaces == held
