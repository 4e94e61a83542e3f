"""The runtime over a list, driving scripted plugin executables (no root needed)."""

from __future__ import annotations

import io
import json
import os

import pytest

from cni.runtime import cache
from cni.runtime.chain import Runtime
from cni.runtime.conflist import conflist_from_bytes
from cni.runtime.errors import JoinedErrors, PluginFailed
from cni.runtime.inject import RuntimeConf
from cni.spec.errors import CNIError
from tests.fixtures.runtime import read_calls, write_recording_plugin

RT = RuntimeConf(
    container_id="ctr1",
    netns="/var/run/netns/pod1",
    ifname="eth0",
    args=(("K8S_POD_NAME", "web"), ("IgnoreUnknown", "1")),
    capability_args={
        "portMappings": [{"hostPort": 8080, "containerPort": 80}],
        "bandwidth": {"ingressRate": 1000},
    },
)


@pytest.fixture
def env(tmp_path):
    class Env:
        bin = str(tmp_path / "bin")
        log = str(tmp_path / "calls.log")
        cache_dir = str(tmp_path / "cache")
        stderr = io.StringIO()

        def plugin(self, name: str, **behaviour) -> None:
            write_recording_plugin(self.bin, name, self.log, behaviour)

        def runtime(self, **kw) -> Runtime:
            return Runtime(
                path=(self.bin,),
                cache_dir=self.cache_dir,
                stderr=self.stderr,
                environ={
                    "PATH": os.environ["PATH"],
                    "MARKER": "inherited",
                    "CNI_COMMAND": "overridden",
                },
                **kw,
            )

        def calls(self) -> list[dict]:
            return read_calls(self.log)

    return Env()


def conflist(version: str = "1.0.0", *plugins: dict, **extra) -> object:
    data = {
        "cniVersion": version,
        "name": "net",
        **extra,
        "plugins": list(plugins) or [{"type": "a"}, {"type": "b"}],
    }
    return conflist_from_bytes(json.dumps(data).encode())


def test_add_chains_results_and_injects_name_version_and_env(env):
    env.plugin("a")
    env.plugin("b")
    result = env.runtime().add_network_list(conflist(), RT)
    assert [i["name"] for i in result["interfaces"]] == ["a", "b"]
    first, second = env.calls()
    assert first["stdin"]["name"] == "net" and first["stdin"]["cniVersion"] == "1.0.0"
    assert "prevResult" not in first["stdin"]
    assert second["stdin"]["prevResult"]["interfaces"] == [{"name": "a"}]
    assert first["env"] == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "ctr1",
        "CNI_NETNS": "/var/run/netns/pod1",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAME=web;IgnoreUnknown=1",
        "CNI_PATH": env.bin,
        "MARKER": "inherited",
    }


def test_runtime_config_holds_only_declared_and_supplied_capabilities(env):
    env.plugin("a")
    env.plugin("b")
    env.plugin("c")
    conf = conflist(
        "1.0.0",
        {"type": "a", "capabilities": {"portMappings": True, "ips": True, "bandwidth": False}},
        {"type": "b", "runtimeConfig": {"stale": 1}},
        {"type": "c", "capabilities": {"bandwidth": True}, "runtimeConfig": {"stale": 1}},
    )
    env.runtime().add_network_list(conf, RT)
    a, b, c = (call["stdin"] for call in env.calls())
    assert a["runtimeConfig"] == {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}
    assert b["runtimeConfig"] == {"stale": 1}  # nothing to inject: the file's key is left
    assert c["runtimeConfig"] == {"bandwidth": {"ingressRate": 1000}}  # replaced, as libcni
    assert a["capabilities"]["portMappings"] is True  # other keys pass through


def test_add_caches_the_final_result_with_the_runtime_arguments(env):
    env.plugin("a")
    env.plugin("b")
    conf = conflist()
    result = env.runtime().add_network_list(conf, RT)
    got = cache.read_cached_entry(env.cache_dir, "net", "ctr1", "eth0")
    assert got.result == result and got.config == conf.raw and got.netns == RT.netns
    assert got.cni_args == RT.args and got.capability_args == dict(RT.capability_args)


def test_add_stops_at_the_first_failing_plugin_and_caches_nothing(env):
    env.plugin("a", ADD={"exit": 1, "stdout": {"code": 7, "msg": "bad bridge", "details": "x"}})
    env.plugin("b")
    with pytest.raises(PluginFailed) as err:
        env.runtime().add_network_list(conflist(), RT)
    assert (err.value.code, err.value.msg, err.value.details) == (7, "bad bridge", "x")
    assert err.value.plugin_type == "a" and "plugin 1 of 2" in str(err.value)
    assert [c["plugin"] for c in env.calls()] == ["a"]
    assert not os.path.exists(os.path.join(env.cache_dir, "results", "net-ctr1-eth0"))


def test_result_without_cni_version_takes_the_config_version(env):
    env.plugin("a", ADD={"stdout": {"ips": [{"address": "10.0.0.2/24"}]}})
    result = env.runtime().add_network_list(conflist("0.4.0", {"type": "a"}), RT)
    assert result["cniVersion"] == "0.4.0"


def test_unreadable_result_is_a_plugin_failure(env):
    env.plugin("a", ADD={"stdout": "not json"})
    with pytest.raises(PluginFailed) as err:
        env.runtime().add_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert err.value.code == 6


@pytest.mark.parametrize(
    "stdout,stderr,expect",
    [
        ("", "boom on stderr", "boom on stderr"),
        ("", "", "exit status 3"),
        ("not json", "", "error parsing its diagnostic message"),
    ],
)
def test_failures_without_error_json_still_explain_themselves(env, stdout, stderr, expect):
    env.plugin("a", ADD={"exit": 3, "stdout": stdout, "stderr": stderr})
    with pytest.raises(PluginFailed) as err:
        env.runtime().add_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert expect in str(err.value)


def test_plugin_stderr_is_passed_on(env):
    env.plugin("a", ADD={"stderr": "a log line\n"})
    env.runtime().add_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert "a log line" in env.stderr.getvalue()


@pytest.mark.parametrize(
    "rt,code",
    [
        (RuntimeConf("", "/n", "eth0"), 3),
        (RuntimeConf("bad id", "/n", "eth0"), 4),
        (RuntimeConf("c", "/n", "a-very-long-ifname0"), 4),
        (RuntimeConf("c", "/n", "e/0"), 4),
    ],
)
def test_add_validates_the_attachment_first(env, rt, code):
    env.plugin("a")
    with pytest.raises(CNIError) as err:
        env.runtime().add_network_list(conflist("1.0.0", {"type": "a"}), rt)
    assert err.value.code == code and env.calls() == []


def test_missing_plugin_names_type_and_path(env):
    with pytest.raises(PluginFailed) as err:
        env.runtime().add_network_list(conflist("1.0.0", {"type": "nothere"}), RT)
    assert err.value.code == 4 and "nothere" in err.value.msg and env.bin in err.value.msg


def test_plugin_type_with_a_path_is_refused(env):
    with pytest.raises(PluginFailed) as err:
        env.runtime().add_network_list(conflist("1.0.0", {"type": "../a"}), RT)
    assert "invalid plugin name" in err.value.msg


def test_del_runs_in_reverse_with_the_cached_result_in_the_config_version(env):
    env.plugin("a")
    env.plugin("b")
    runtime = env.runtime()
    runtime.add_network_list(conflist("1.0.0"), RT)
    runtime.del_network_list(conflist("0.4.0"), RT)  # config version changed since ADD
    dels = [c for c in env.calls() if c["env"]["CNI_COMMAND"] == "DEL"]
    assert [c["plugin"] for c in dels] == ["b", "a"]
    for call in dels:
        prev = call["stdin"]["prevResult"]
        assert prev["cniVersion"] == "0.4.0" and prev["ips"][0]["version"] == "4"
    assert cache.read_cached_entry(env.cache_dir, "net", "ctr1", "eth0") is None


def test_del_without_cache_sends_no_prev_result_and_succeeds(env):
    env.plugin("a")
    env.runtime().del_network_list(conflist("1.0.0", {"type": "a"}), RT)
    env.runtime().del_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert all("prevResult" not in c["stdin"] for c in env.calls())


def test_del_with_a_corrupt_cache_omits_prev_result_and_removes_the_file(env):
    env.plugin("a")
    path = os.path.join(env.cache_dir, "results", "net-ctr1-eth0")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write("{truncated")
    env.runtime().del_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert "prevResult" not in env.calls()[0]["stdin"]
    assert not os.path.exists(path)


def test_del_below_040_sends_no_prev_result(env):
    env.plugin("a")
    runtime = env.runtime()
    runtime.add_network_list(conflist("0.3.1", {"type": "a"}), RT)
    runtime.del_network_list(conflist("0.3.1", {"type": "a"}), RT)
    assert "prevResult" not in env.calls()[-1]["stdin"]


def test_failing_del_stops_and_keeps_the_cache(env):
    env.plugin("a")
    env.plugin("b", DEL={"exit": 1, "stdout": {"code": 11, "msg": "busy"}})
    runtime = env.runtime()
    runtime.add_network_list(conflist(), RT)
    with pytest.raises(PluginFailed) as err:
        runtime.del_network_list(conflist(), RT)
    assert err.value.code == 11 and err.value.verb == "DEL"
    assert [c["plugin"] for c in env.calls() if c["env"]["CNI_COMMAND"] == "DEL"] == ["b"]
    assert cache.read_cached_entry(env.cache_dir, "net", "ctr1", "eth0") is not None


def test_check_passes_the_cached_result_in_order(env):
    env.plugin("a")
    env.plugin("b")
    runtime = env.runtime()
    added = runtime.add_network_list(conflist(), RT)
    runtime.check_network_list(conflist(), RT)
    checks = [c for c in env.calls() if c["env"]["CNI_COMMAND"] == "CHECK"]
    assert [c["plugin"] for c in checks] == ["a", "b"]
    assert all(c["stdin"]["prevResult"] == added for c in checks)


def test_check_is_refused_below_040(env):
    env.plugin("a")
    with pytest.raises(CNIError) as err:
        env.runtime().check_network_list(conflist("0.3.1", {"type": "a"}), RT)
    assert err.value.code == 1 and "does not support the CHECK command" in err.value.msg
    assert env.calls() == []


def test_disable_check_skips_every_plugin(env):
    env.plugin("a", CHECK={"exit": 1, "stdout": {"code": 100, "msg": "would fail"}})
    env.runtime().check_network_list(conflist("1.0.0", {"type": "a"}, disableCheck="true"), RT)
    assert env.calls() == []


def test_check_failure_carries_the_plugin_code(env):
    env.plugin("a", CHECK={"exit": 1, "stdout": {"code": 100, "msg": "address missing"}})
    with pytest.raises(PluginFailed) as err:
        env.runtime().check_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert err.value.code == 100 and "address missing" in str(err.value)


def test_gc_deletes_stale_cached_attachments_then_sends_gc_with_both_keys(env):
    env.plugin("a")
    runtime = env.runtime()
    conf = conflist("1.1.0", {"type": "a"})
    for cid in ("keep", "stale"):
        runtime.add_network_list(
            conf, RuntimeConf(cid, f"/var/run/netns/{cid}", "eth0", (("K", cid),), {"x": 1})
        )
    runtime.add_network_list(
        conflist("1.1.0", {"type": "a"}, name="other"), RuntimeConf("stale", "/n", "eth0")
    )
    start = len(env.calls())
    runtime.gc_network_list(conf, [("keep", "eth0")])
    calls = env.calls()[start:]
    dels = [c for c in calls if c["env"]["CNI_COMMAND"] == "DEL"]
    assert len(dels) == 1 and dels[0]["env"]["CNI_CONTAINERID"] == "stale"
    assert dels[0]["env"]["CNI_NETNS"] == "/var/run/netns/stale"
    assert dels[0]["env"]["CNI_ARGS"] == "K=stale"
    assert dels[0]["stdin"]["prevResult"]["interfaces"] == [{"name": "a"}]
    gc = [c for c in calls if c["env"]["CNI_COMMAND"] == "GC"]
    assert len(gc) == 1
    expected = [{"containerID": "keep", "ifname": "eth0"}]
    assert gc[0]["stdin"]["cni.dev/valid-attachments"] == expected
    assert gc[0]["stdin"]["cni.dev/attachments"] == expected
    assert gc[0]["env"]["CNI_CONTAINERID"] == "" and gc[0]["env"]["CNI_PATH"] == env.bin
    remaining = {
        e.container_id for e in cache.cached_attachments(env.cache_dir) if e.network_name == "net"
    }
    assert remaining == {"keep"}


def test_gc_without_a_valid_list_deletes_everything_and_sends_no_key(env):
    env.plugin("a")
    runtime = env.runtime()
    conf = conflist("1.1.0", {"type": "a"})
    runtime.add_network_list(conf, RT)
    runtime.gc_network_list(conf, None)
    gc = [c for c in env.calls() if c["env"]["CNI_COMMAND"] == "GC"][0]
    assert not any(k.startswith("cni.dev/") for k in gc["stdin"])
    assert cache.cached_attachments(env.cache_dir) == []


def test_gc_continues_past_errors_and_joins_them(env):
    env.plugin("a", GC={"exit": 1, "stdout": {"code": 11, "msg": "store down"}})
    env.plugin(
        "b",
        DEL={"exit": 1, "stdout": {"code": 999, "msg": "del broke"}},
        GC={"exit": 1, "stdout": {"code": 999, "msg": "gc broke"}},
    )
    runtime = env.runtime()
    conf = conflist("1.1.0")
    runtime.add_network_list(conf, RT)
    with pytest.raises(JoinedErrors) as err:
        runtime.gc_network_list(conf, [])
    text = str(err.value)
    assert "stale attachment ctr1 eth0" in text and "store down" in text and "gc broke" in text
    assert [c["plugin"] for c in env.calls() if c["env"]["CNI_COMMAND"] == "GC"] == ["a", "b"]


def test_gc_below_110_only_deletes_cached_attachments(env):
    env.plugin("a")
    runtime = env.runtime()
    runtime.add_network_list(conflist("1.0.0", {"type": "a"}), RT)
    runtime.gc_network_list(conflist("1.0.0", {"type": "a"}), [])
    verbs = [c["env"]["CNI_COMMAND"] for c in env.calls()]
    assert verbs == ["ADD", "DEL"]


def test_disable_gc_does_nothing(env):
    env.plugin("a")
    runtime = env.runtime()
    runtime.add_network_list(conflist("1.1.0", {"type": "a"}), RT)
    runtime.gc_network_list(conflist("1.1.0", {"type": "a"}, disableGC=True), [])
    assert [c["env"]["CNI_COMMAND"] for c in env.calls()] == ["ADD"]


def test_status_stops_at_the_first_failing_plugin(env):
    env.plugin("a", STATUS={"exit": 1, "stdout": {"code": 50, "msg": "store unreachable"}})
    env.plugin("b")
    with pytest.raises(PluginFailed) as err:
        env.runtime().status_network_list(conflist("1.1.0"))
    assert err.value.code == 50 and err.value.plugin_type == "a"
    assert [c["plugin"] for c in env.calls()] == ["a"]
    assert env.calls()[0]["stdin"] == {"type": "a", "name": "net", "cniVersion": "1.1.0"}


def test_status_below_110_is_a_no_op(env):
    env.plugin("a", STATUS={"exit": 1})
    env.runtime().status_network_list(conflist("1.0.0", {"type": "a"}))
    assert env.calls() == []


def test_cache_write_failure_is_an_io_error(env, tmp_path):
    env.plugin("a")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache dir should be")
    runtime = env.runtime()
    runtime.cache_dir = str(blocker)
    with pytest.raises(CNIError) as err:
        runtime.add_network_list(conflist("1.0.0", {"type": "a"}), RT)
    assert err.value.code == 5 and "cached result" in err.value.msg
