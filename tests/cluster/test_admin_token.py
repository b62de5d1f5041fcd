"""The admin token file of a router is keyed by the address it binds and its port, and goes to that address
only: a loopback URL also finds a router bound to every address; another host never gets a local token."""

from __future__ import annotations

from cluster.admin_token import read_token, write_token


def test_each_address_has_its_own_token_and_none_goes_to_another_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    write_token("127.0.0.1", 8000, "first")
    write_token("127.0.0.2", 8000, "second")  # same port, another loopback address: not overwritten
    assert read_token("http://127.0.0.1:8000") == "first" and read_token("http://127.0.0.2:8000") == "second"
    assert read_token("http://localhost:8000") == "first"
    assert read_token("http://10.1.2.3:8000") is None  # another machine's router: no local token sent there
    write_token("0.0.0.0", 9000, "every address")
    assert read_token("http://127.0.0.1:9000") == "every address"
    assert read_token("http://10.1.2.3:9000") is None
    write_token("10.1.2.3", 9000, "bound there")  # a router of this machine bound to its own address
    assert read_token("http://10.1.2.3:9000") == "bound there"
    write_token("::1", 9100, "v6")
    assert read_token("http://[::1]:9100") == "v6"
