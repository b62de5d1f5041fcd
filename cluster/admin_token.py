"""The admin token: `tandem serve` makes a fresh one at every start and writes it where only its user can
read it (a 0600 file in a 0700 directory); /admin/* answers only requests that carry it as a Bearer token,
and `tandem scale` / `tandem status` read it from the same place. Nothing else opens the admin surface,
the API key included: a client of the API cannot resize the pools.

    ~/.cache/tandem/admin/<host>-<port>.token     ($TANDEM_CACHE_DIR/admin/... when set)

Keyed by the address the router binds and its port: two servers on one port of two loopback addresses keep
their own tokens. A URL is sent the token of its own host and port, and a loopback URL also that of a
router bound to every address (0.0.0.0, ::); a token never goes to another host than the one it was
written for.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

# (host, port) -> token of the files this process wrote and has not forgotten: what `forget_written` removes
# when the process must end without its cleanup (cluster.lifeline's last resort).
_written: dict[tuple[str, int], str] = {}
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_EVERY_ADDRESS = ("0.0.0.0", "::")


def token_path(host: str, port: int) -> Path:
    root = Path(os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem")
    return root / "admin" / f"{host.strip('[]').replace(':', '_')}-{port}.token"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(host: str, port: int, token: str) -> Path:
    """Write the token of the router bound to `host`:`port`, 0600 (replacing any earlier one); returns where."""
    path = token_path(host, port)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)  # a new file: its mode is ours, whoever made the old one
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    _written[(host, port)] = token
    return path


def read_token(url: str) -> str | None:
    """The token of the router at `url` on this machine, or None when none is written for its address."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loopback = host in _LOOPBACK or host.startswith("127.")
    for candidate in (host, *_LOOPBACK, *_EVERY_ADDRESS) if loopback else (host,):
        try:
            token = token_path(candidate, port).read_text().strip()
        except OSError:
            continue
        if token:
            return token
    return None


def forget_token(host: str, port: int, token: str) -> None:
    """Remove the file if it still holds `token` (another server may have started on the address since)."""
    if _written.get((host, port)) == token:
        del _written[(host, port)]
    path = token_path(host, port)
    try:
        if path.read_text().strip() == token:
            path.unlink()
    except OSError:
        pass


def forget_written() -> None:
    """Remove every token file this process wrote and still holds (a process ending without its cleanup)."""
    for (host, port), token in list(_written.items()):
        forget_token(host, port, token)
