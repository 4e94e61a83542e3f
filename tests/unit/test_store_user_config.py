"""etcd user authentication in the config, under generated input: ``store.username`` and
``store.passwordFile`` parse into the typed StoreConfig together or are code 7 naming the key,
never a traceback; the password file is read as an operator expects (one trailing newline
dropped) or refused naming ``store.passwordFile``, and refused whenever group or others may
access it. No etcd here: the real-etcd tests are tests/etcd/test_auth.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.open_store import StoreOptions, calc_store_config
from cni.spec.errors import InvalidConfig
from pycnid.config import parse_daemon_config
from store.etcd_auth import Credentials, read_password
from store.etcd_conn import parse_options

VALUES = (
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.lists(st.text(), max_size=2)
)
USER_KEY = st.text(max_size=8) | VALUES
ENDPOINTS = ["https://127.0.0.1:2379"]


def store_section(store_type: str, user: dict) -> dict:
    return {"store": {"type": store_type, "endpoints": ENDPOINTS, **user}}


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.sampled_from(["etcd", "sqlite"]),
    st.fixed_dictionaries({}, optional={"username": USER_KEY, "passwordFile": USER_KEY}),
)
def test_username_and_password_file_parse_together_or_name_the_key(store_type, user):
    try:
        config = parse_daemon_config(store_section(store_type, user))
    except InvalidConfig as err:
        assert err.code == 7
        assert "'store.username'" in err.msg or "'store.passwordFile'" in err.msg, err.msg
        return
    store = config.store
    given_both = all(isinstance(user.get(k), str) and user[k] for k in user)
    if store.username is None:  # missing or null, both
        assert store.password_file is None
        assert all(user.get(k) is None for k in ("username", "passwordFile"))
    else:
        assert store_type == "etcd" and given_both and len(user) == 2
        assert (store.username, store.password_file) == (user["username"], user["passwordFile"])
        assert "username" not in store.options and "passwordFile" not in store.options


@pytest.mark.parametrize(
    "user, key",
    [
        ({"username": "pycni"}, "store.passwordFile"),
        ({"passwordFile": "/etc/pycni/etcd/password"}, "store.username"),
        ({"username": "", "passwordFile": "/p"}, "store.username"),
        ({"username": "pycni", "passwordFile": 5}, "store.passwordFile"),
        ({"username": ["pycni"], "passwordFile": "/p"}, "store.username"),
    ],
)
def test_a_bad_user_is_code_7_naming_the_key(user, key):
    with pytest.raises(InvalidConfig, match=f"'{key}'"):
        parse_daemon_config(store_section("etcd", user))


def test_a_user_on_sqlite_is_refused():
    data = {"store": {"type": "sqlite", "username": "u", "passwordFile": "/p"}}
    with pytest.raises(InvalidConfig, match="'store.username'.*only an etcd store"):
        parse_daemon_config(data)


def write(path, raw: bytes, mode: int) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
    os.chmod(path, mode)
    return str(path)


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.binary(max_size=40) | st.text(max_size=20).map(str.encode), st.integers(0o400, 0o777))
def test_a_password_file_is_its_text_or_code_7_naming_the_key(tmp_path, raw, mode):
    path = write(tmp_path / "password", raw, mode)
    try:
        password = read_password(path)
    except InvalidConfig as err:
        assert err.code == 7 and "'store.passwordFile'" in err.msg and path in err.details
        return
    assert not mode & 0o077, "a file group or others may read is refused"
    text = raw.decode("utf-8")
    assert password and text in (password, password + "\n", password + "\r\n")


@pytest.mark.parametrize(
    "raw, password",
    [(b"pw\r", "pw\r"), (b"pw\r\n", "pw"), (b"pw\n\n", "pw\n"), (b" pw ", " pw ")],
)
def test_only_one_trailing_newline_is_dropped(tmp_path, raw, password):
    assert read_password(write(tmp_path / "password", raw, 0o600)) == password


@pytest.mark.parametrize(
    "raw, mode, words",
    [
        (b"secret\n", 0o644, "mode 0644"),
        (b"secret", 0o640, "defaultMode: 0400"),
        (b"\n", 0o600, "is empty"),
        (b"\xff\xfe", 0o600, "not UTF-8"),
    ],
)
def test_a_bad_password_file_says_why(tmp_path, raw, mode, words):
    path = write(tmp_path / "password", raw, mode)
    with pytest.raises(InvalidConfig, match="'store.passwordFile'") as caught:
        read_password(path)
    assert words in caught.value.details
    assert "secret" not in str(caught.value)


def test_missing_password_file_is_refused_when_the_store_opens(tmp_path):
    with pytest.raises(InvalidConfig, match="'store.passwordFile'") as caught:
        Credentials("pycni", str(tmp_path / "nope"), "etcd")
    assert "cannot read" in caught.value.details


def test_the_password_is_read_with_one_newline_dropped_and_never_shown(tmp_path):
    path = write(tmp_path / "password", b"  s3cret pw \n", 0o400)
    assert read_password(path) == "  s3cret pw "
    credentials = Credentials("pycni", path, "etcd")
    assert "s3cret" not in repr(credentials) and path in repr(credentials)
    config = parse_daemon_config(
        store_section("etcd", {"username": "pycni", "passwordFile": path})
    )
    assert "s3cret" not in repr(config)


def test_the_etcd_options_want_both_halves_of_a_user():
    with pytest.raises(InvalidConfig, match="'store.passwordFile'"):
        parse_options(ENDPOINTS, None, None, None, None, username="pycni")
    opts = parse_options(ENDPOINTS, None, None, None, None, "pycni", "/p")
    assert (opts.username, opts.password_file) == ("pycni", "/p")


def test_pycni_takes_the_user_from_the_config_or_the_command_line():
    config = parse_daemon_config(
        store_section("etcd", {"username": "node", "passwordFile": "/etc/pw"})
    )
    assert calc_store_config(StoreOptions(), config).username == "node"
    flags = StoreOptions(etcd_username="admin", etcd_password_file="/root/pw")
    chosen = calc_store_config(flags, config)
    assert (chosen.username, chosen.password_file) == ("admin", "/root/pw")
    other = calc_store_config(StoreOptions(etcd_endpoints="https://10.0.0.9:2379"), config)
    assert other.endpoints == ("https://10.0.0.9:2379",) and other.username == "node"
    with pytest.raises(InvalidConfig, match="--etcd-password-file"):
        calc_store_config(
            StoreOptions(etcd_endpoints="https://e:2379", etcd_username="x"),
            parse_daemon_config({}),
        )
