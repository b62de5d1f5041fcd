"""The admin token: `tandem serve` makes a fresh one at every start and writes it where only its user can
read it (a 0600 file in a 0700 directory); /admin/* answers only requests that carry it as a Bearer token,
and `tandem scale` / `tandem status` read it from the same place. Nothing else opens the admin surface,
the API key included: a client of the API cannot resize the pools.

    ~/.cache/tandem/admin/<port>.token     ($TANDEM_CACHE_DIR/admin/... when set)
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

# port -> token of the files this process wrote and has not forgotten: what `forget_written` removes when
# the process must end without its cleanup (cluster.lifeline's last resort).
_written: dict[int, str] = {}


def token_path(port: int) -> Path:
    root = Path(os.environ.get("TANDEM_CACHE_DIR") or Path.home() / ".cache" / "tandem")
    return root / "admin" / f"{port}.token"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(port: int, token: str) -> Path:
    """Write the token of the router on `port`, 0600 (replacing any earlier one); returns where."""
    path = token_path(port)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)  # a new file: its mode is ours, whoever made the old one
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    _written[port] = token
    return path


def read_token(url: str) -> str | None:
    """The token of the router at `url` on this machine, or None when none is written for its port."""
    port = urlsplit(url).port or 80
    try:
        return token_path(port).read_text().strip() or None
    except OSError:
        return None


def forget_token(port: int, token: str) -> None:
    """Remove the file if it still holds `token` (another server may have started on the port since)."""
    if _written.get(port) == token:
        del _written[port]
    path = token_path(port)
    try:
        if path.read_text().strip() == token:
            path.unlink()
    except OSError:
        pass


def forget_written() -> None:
    """Remove every token file this process wrote and still holds (a process ending without its cleanup)."""
    for port, token in list(_written.items()):
        forget_token(port, token)
