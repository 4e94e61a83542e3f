"""The conntrack reader of the Service policy cluster tests (tests/overlay/svc_policy_helpers.py),
over generated `conntrack -L` output: every entry comes back with its original and reply
addresses in order, whatever other fields surround them; lines that are no entry are skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.overlay.svc_policy_helpers import Flow, parse_flows

ADDRESSES = st.sampled_from(
    ["10.131.0.5", "172.31.250.100", "10.96.0.1", "fd00:96::1", "fd31::864b", "172.31.250.12"]
)
flows = st.builds(Flow, ADDRESSES, ADDRESSES, ADDRESSES, ADDRESSES)
extras = st.lists(
    st.sampled_from(["[ASSURED]", "[UNREPLIED]", "mark=0", "use=1", "zone=3", "TIME_WAIT", "117"]),
    max_size=3,
)


def render_line(flow: Flow, head: list[str], middle: list[str], tail: list[str]) -> str:
    """One entry as conntrack prints it: proto, timeout, state, both directions, flags."""
    original = [f"src={flow.src}", f"dst={flow.dst}", "sport=40000", "dport=80"]
    reply = [f"src={flow.reply_src}", f"dst={flow.reply_dst}", "sport=8080", "dport=40000"]
    return " ".join(["tcp", "6", *head, *original, *middle, *reply, *tail])


@given(st.lists(st.tuples(flows, extras, extras, extras)), st.booleans())
def test_parse_flows_gives_back_every_entry_in_order(entries, summary):
    lines = [render_line(*entry) for entry in entries]
    if summary:  # what the tool prints last (stderr, but a merged stream must not count)
        lines.append(
            f"conntrack v1.4.7 (conntrack-tools): {len(entries)} flow entries have been shown."
        )
    assert parse_flows("\n".join(lines)) == [flow for flow, *_ in entries]


@given(ADDRESSES, ADDRESSES)
def test_a_line_with_one_direction_is_no_entry(src, dst):
    assert parse_flows(f"tcp 6 10 SYN_SENT src={src} dst={dst} sport=1 dport=2") == []
