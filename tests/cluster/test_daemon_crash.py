"""pycnid killed with SIGKILL in the middle of ADDs, restarted, then a CNI GC naming the ADDs
that succeeded: no address leaks, and the other node's leases are untouched. Then killed again
in the middle of the DELs of every attachment, restarted, the cut DELs repeated: nothing
left but the outage buffers. `make test` runs
100 ADDs on the victim (two /26 blocks; killed after a third of them), `make long` 200."""

from __future__ import annotations

import pytest

from tests.fixtures.scale import sized

from .checks import (
    assert_cli_checks_clean,
    assert_handles_match,
    assert_no_duplicates,
    assert_only_buffers_left,
    assert_store_consistent,
    cli_check,
    store_view,
)
from .load import NETWORK, gc_conf, interleave, ipam, netconf, run_all, run_with_incident

pytestmark = [
    pytest.mark.netns,
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.drill,
]

ADDS = sized(100, 200)


def test_sigkill_mid_adds_restart_gc_leaks_nothing(make_cluster, cni_bin):
    cluster = make_cluster(nodes=2, etcd_members=1)
    steady, victim = cluster.nodes
    conf = netconf()
    kept = run_all(cni_bin, interleave([steady], "ADD", 40), conf)
    assert all(c.ok for c in kept), [c.run.stdout for c in kept if not c.ok][:3]

    calls, before_kill = run_with_incident(
        cni_bin,
        interleave([victim], "ADD", ADDS),
        conf,
        after=ADDS // 3,
        incident=victim.daemon.kill,
    )
    assert before_kill < ADDS, "the daemon was killed only after every ADD had finished"
    failed = [c for c in calls if not c.ok]
    assert failed, "no ADD was in flight or pending when pycnid was killed"
    assert {c.code for c in failed} == {11}, {c.code: c.run.stdout for c in failed}
    succeeded = [c for c in calls if c.ok]

    victim.daemon.start()
    gc = ipam(cni_bin, victim, "GC", gc_conf(conf, [(c.cid, "eth0") for c in succeeded]))
    assert gc.ok, gc.run.stdout + victim.daemon.log()[-2000:]

    view = store_view(cluster)
    assert_store_consistent(view)
    assert_handles_match(view, kept + succeeded)  # nothing the runtime does not know of
    assert_no_duplicates(kept + succeeded)
    checks = [cli_check(cluster, "after the crash and GC")]

    again = run_all(cni_bin, [(victim, "ADD", c.cid) for c in failed], conf)
    assert all(c.ok for c in again), [c.run.stdout for c in again if not c.ok][:3]
    assert_no_duplicates(kept + succeeded + again)
    # the DELs, the victim's pycnid killed a third of the way through them: a cut DEL is
    # code 11, and the runtime's repeated DEL releases what it held
    victims = [(victim, "DEL", c.cid) for c in succeeded + again]
    dels, before_kill = run_with_incident(
        cni_bin,
        [(steady, "DEL", c.cid) for c in kept] + victims,
        conf,
        after=len(kept) + len(victims) // 3,
        incident=victim.daemon.kill,
    )
    assert before_kill < len(dels), "the daemon was killed only after every DEL had finished"
    cut = [c for c in dels if not c.ok]
    assert {c.node for c in cut} <= {victim.name}, [c.run.stdout for c in cut][:3]
    assert {c.code for c in cut} <= {11}, {c.code: c.run.stdout for c in cut}
    victim.daemon.start()
    repeated = run_all(cni_bin, [(victim, "DEL", c.cid) for c in cut], conf)
    assert all(c.ok for c in repeated), [
        (c.run.code, c.run.stdout, c.run.stderr[-800:]) for c in repeated if not c.ok
    ][:3]
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view, NETWORK)
    checks.append(cli_check(cluster, "after DEL of every attachment"))
    assert_cli_checks_clean(checks)
    tried = len(calls) + len(kept)
    print(
        f"\npycnid SIGKILL drill: {tried} ADDs tried ({len(failed)} cut by the kill, code 11, "
        f"retried), {tried} survived (one address each, then released), 0 lost; "
        f"{len(dels)} DELs tried ({len(cut)} cut by a second kill, code 11, repeated), "
        f"{len(dels)} survived, 0 lost"
    )
