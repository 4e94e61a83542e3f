"""`pycni ipam` on etcd with user authentication: the user from pycnid's config or from
``--etcd-username/--etcd-password-file``; a reader lists but may not add (exit 1 naming the
key), a wrong password is exit 1 naming the user; the password is never printed."""

from __future__ import annotations

import json
import os

import pytest

from tests.ipamcli.test_pycni_command import pycni, write_config

pytestmark = pytest.mark.etcd


def test_pycni_ipam_with_the_users_of_an_authenticated_etcd(etcd_auth, tmp_path):
    users = etcd_auth.users
    config = write_config(tmp_path, etcd_auth.store_config(users.writer))
    pycni("pool", "add", "a", "--cidr", "10.5.0.0/16", "--config", config)
    reader = [
        "--etcd-username",
        users.reader,
        "--etcd-password-file",
        users.password_file(users.reader),
    ]
    listed = pycni("pool", "ls", "-o", "json", "--config", config, *reader)
    assert [p["name"] for p in json.loads(listed.stdout)["pools"]] == ["a"]
    refused = pycni(
        "pool", "add", "b", "--cidr", "10.6.0.0/16", "--config", config, *reader, code=1
    )
    assert "permission denied to user 'pycni-reader' for the txn writing /pycni/v1/" in (
        refused.stderr
    )
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    os.chmod(wrong, 0o600)
    bad = ["--etcd-username", users.writer, "--etcd-password-file", str(wrong)]
    failed = pycni("pool", "ls", "--config", config, *bad, code=1)
    assert "authentication failed for user 'pycni-node'" in failed.stderr
    for run in (listed, refused, failed):
        for user in (users.writer, users.reader):
            assert users.password(user) not in run.stdout + run.stderr
