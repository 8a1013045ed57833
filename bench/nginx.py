"""nginx `grpc_pass` as the C-proxy yardstick (bench/router.py). Debian 12's `nginx-light` is a transitional
package for `nginx`, whose binary has the HTTP/2 and gRPC proxy modules: when no `nginx` is on PATH, the bench
fetches Debian's package with `apt-get download` and unpacks only the binary into .mmhost-cache/nginx (no
service started, nothing installed system-wide). Never used by tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHED = ROOT / ".mmhost-cache" / "nginx" / "usr" / "sbin" / "nginx"

CONF = """worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fcgi;
    uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
    client_max_body_size 0;
    upstream hostd {{ server {upstream}; keepalive 64; }}
    server {{
        listen {listen} http2;
        location / {{ grpc_pass grpc://hostd; grpc_read_timeout 120s; grpc_send_timeout 120s; }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx")
    if found:
        return found
    if CACHED.exists():
        return str(CACHED)
    with tempfile.TemporaryDirectory() as d:
        Path(d).chmod(0o777)  # apt's download user writes there
        print("bench: fetching Debian's nginx package (apt-get download nginx) for the nginx grpc_pass yardstick")
        subprocess.run(["apt-get", "download", "nginx"], cwd=d, check=True, capture_output=True)
        deb = next(Path(d).glob("nginx_*.deb"))
        CACHED.parents[2].mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHED.parents[2])], check=True)
    return str(CACHED)


def start_nginx(listen: str, upstream: str, work: Path) -> subprocess.Popen:
    work.mkdir(parents=True, exist_ok=True)
    conf = work / "nginx.conf"
    conf.write_text(CONF.format(work=work, listen=listen, upstream=upstream))
    log = open(work / "nginx.log", "wb")
    return subprocess.Popen([nginx_binary(), "-c", str(conf), "-p", str(work)], stdout=log, stderr=subprocess.STDOUT)
