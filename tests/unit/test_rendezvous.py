"""Two runs on one rendezvous address never merge (issue 43): every rank
compares its config digest with rank 0's before the process group forms; a
rank of another run exits within startup_timeout naming both run
directories, having written nothing, and the run it reached ends as it
would alone; the run's own keys live under its identity; a rank started
twice is refused; on one node the store listens on MASTER_ADDR alone."""

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from fedclust import dist
from fedclust.config import load_config
from fedclust.errors import StartupError
from fedclust.identity import RunIdentity, config_digest, run_identity

A = RunIdentity("/runs/a", "a" * 64)
B = RunIdentity("/runs/b", "b" * 64)
TORCHRUN_VARS = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture(autouse=True)
def outside_torchrun(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> list[str]:
    """The addresses a socket listens on at ``port`` on this machine (/proc/net/tcp and tcp6)."""
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            host, at = fields[1].rsplit(":", 1)
            if int(at, 16) == port and fields[3] == "0A":   # 0A: LISTEN
                raw = bytes.fromhex(host)   # 32-bit words in the host's byte order
                found.append(socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))
    return found


def start(pool, port, rank, world, identity, seconds=10.0, local=True):
    return pool.submit(dist.startup_store, "127.0.0.1", port, rank, world, seconds, 30.0, identity=identity,
                       local=local)


# ----------------------------------------------------------------------------
# Identity


def test_the_digest_is_equal_for_one_config_and_differs_with_any_key():
    base = ["algorithm.name=random", "data.name=synthetic", "clients=8", "rounds=2", "progress=false"]
    one = config_digest(load_config(None, base))
    assert len(one) == 64 and int(one, 16) >= 0                          # SHA-256, hex
    assert config_digest(load_config(None, base)) == one                 # equal configs, loaded apart
    for key in ("seed=4", "train.lr=0.5", "rounds=3", "out=runs/x"):
        assert config_digest(load_config(None, base + [key])) != one, key
    assert config_digest(load_config(None, base + ["out=runs/x"])) != config_digest(load_config(None, base + [
        "out=runs/y"]))
    # a default out (a time stamp, per rank): the digest agrees, the identity names each rank's own directory
    cfg = load_config(None, base)
    first, second = run_identity(cfg, "runs/random-1"), run_identity(cfg, "runs/random-2")
    assert first.digest == second.digest == one
    assert first.out == os.path.abspath("runs/random-1") and first.key != second.key
    assert RunIdentity.loads(first.dumps()) == first
    assert RunIdentity.loads(b"not one of ours") == RunIdentity("", "")


def test_the_digest_does_not_depend_on_the_plugins_a_process_loaded(monkeypatch):
    """A section some plug-in registered in one process only (at its defaults) leaves the digest as it is; a
    section set away from its defaults changes it."""
    import dataclasses

    from fedclust import schema

    base = ["algorithm.name=random", "data.name=synthetic", "clients=8", "rounds=2"]
    before = config_digest(load_config(None, base))

    @dataclasses.dataclass
    class Extra:
        x: int = 1

        def validate(self, cfg):
            pass

    monkeypatch.setitem(schema.SECTIONS, "extra_plugin_section", Extra)
    cfg = load_config(None, base)
    assert "extra_plugin_section" in cfg.sections and config_digest(cfg) == before
    cfg.sections["extra_plugin_section"].x = 2
    assert config_digest(cfg) != before


# ----------------------------------------------------------------------------
# startup_store, ranks as threads of this process


def test_a_rank_of_another_run_is_refused_and_the_run_completes_with_its_own():
    port = free_port()
    with ThreadPoolExecutor(3) as pool:
        began = time.monotonic()
        stray = start(pool, port, 1, 2, B)      # first: it waits for the store to open (staggered starts)
        time.sleep(0.5)
        zero = start(pool, port, 0, 2, A)
        with pytest.raises(StartupError) as refused:
            stray.result(timeout=30)
        assert time.monotonic() - began < 10                              # within its startup_timeout
        assert str(refused.value) == (
            f"rank 1: the rendezvous at 127.0.0.1:{port} is another run's (out=/runs/a, config aaaaaaaaaaaa), not "
            "this run's (out=/runs/b, config bbbbbbbbbbbb): two runs share the address; start this run's processes "
            "with another MASTER_PORT (a free port; torchrun: --master-port)")
        assert not zero.done()                                            # rank 0 waits for its own rank 1
        one = start(pool, port, 1, 2, A)                                  # its place was not taken by the stray
        stores = zero.result(timeout=30), one.result(timeout=30)
    stores[0].set("k", "from 0")
    assert stores[1].get("k") == b"from 0"                                # one run, one key space
    raw = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    assert raw.get("fedclust/run/direct/0/0/identity") == A.dumps().encode()
    assert raw.check([f"fedclust/run/direct/0/0/{A.key}/started/0", f"fedclust/run/direct/0/0/{A.key}/started/1",
                      f"fedclust/run/direct/0/0/{A.key}/k"])                # the run's keys, under its identity


def test_a_rank_started_twice_is_refused():
    port = free_port()
    with ThreadPoolExecutor(3) as pool:
        first = [start(pool, port, r, 2, A, local=False) for r in (0, 1)]
        [f.result(timeout=30) for f in first]
        with pytest.raises(StartupError) as twice:
            start(pool, port, 1, 2, A, local=False).result(timeout=30)
    assert str(twice.value).startswith(f"rank 1: this run's rank 1 was already started (pid {os.getpid()} on ")
    assert "started twice" in str(twice.value) and "another MASTER_PORT" in str(twice.value)


def test_under_torchrun_the_agent_store_holds_the_attempts_keys_and_configs_are_compared(monkeypatch):
    port = free_port()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    agent = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)   # torchrun's agent serves it
    with ThreadPoolExecutor(3) as pool:
        zero = start(pool, port, 0, 2, A)
        with pytest.raises(StartupError, match="is another run's .out=/runs/a.*not this run's .out=/runs/b"):
            start(pool, port, 1, 2, B).result(timeout=30)
        one = start(pool, port, 1, 2, A)
        zero.result(timeout=30), one.result(timeout=30)
    assert agent.get("fedclust/run/job7/1/0/identity") == A.dumps().encode()
    assert agent.check([f"fedclust/run/job7/1/0/{A.key}/started/0", f"fedclust/run/job7/1/0/{A.key}/started/1"])


def test_on_one_node_the_store_listens_on_the_master_address_alone():
    port = free_port()
    store = dist.startup_store("127.0.0.1", port, 0, 1, 5.0, 5.0, identity=A, local=True)
    assert listening(port) == ["127.0.0.1"]
    other = free_port()
    several = dist.startup_store("127.0.0.1", other, 0, 1, 5.0, 5.0, identity=A, local=False)
    assert listening(other) in (["0.0.0.0"], ["::"])                     # torch's own: every interface
    del store, several
    assert dist.listen_socket("192.0.2.1", free_port()) is None           # not this machine's: torch's own then
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with pytest.raises(StartupError, match=f"rank 0: cannot serve the run's rendezvous at 127.0.0.1:{taken}"):
            dist.startup_store("127.0.0.1", taken, 0, 2, 5.0, 5.0, identity=A, local=True)


# ----------------------------------------------------------------------------
# End to end


def kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


