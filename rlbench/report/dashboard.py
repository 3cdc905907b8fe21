"""asv's dashboard as a user gets it, offline too: `asv publish`, then the scripts and styles asv
takes from CDNs pointed at local copies of the same libraries (Debian's libjs-* packages), then a
local web server (asv's page loads its data with requests a file:// page may not make)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rlbench.errors import RlbenchError

JS = Path("/usr/share/javascript")
# asv's CDN file -> the local copy of the same library. Debian's flot 4 bundles the time, selection
# and categories plugins into jquery.flot.js (their own files are empty): those tags are dropped.
LOCAL_COPIES = {
    "jquery-3.3.1.min.js": JS / "jquery/jquery.min.js",
    "jquery.flot.min.js": JS / "jquery-flot/jquery.flot.min.js",
    "jquery.flot.time.min.js": JS / "jquery-flot/jquery.flot.time.min.js",
    "jquery.flot.selection.min.js": JS / "jquery-flot/jquery.flot.selection.min.js",
    "jquery.flot.categories.min.js": JS / "jquery-flot/jquery.flot.categories.min.js",
    "stupidtable.min.js": JS / "jquery-stupidtable/stupidtable.min.js",
    "md5.min.js": JS / "blueimp-md5/md5.min.js",
    "bootstrap.min.js": JS / "bootstrap/js/bootstrap.min.js",
    "bootstrap.min.css": JS / "bootstrap/css/bootstrap.min.css",
}
# no local copy anywhere: without it asv draws grouped bars overlapping instead of side by side
OPTIONAL = ("jquery.flot.orderBars.js",)
DEBIAN_PACKAGES = "libjs-jquery libjs-jquery-flot libjs-jquery-stupidtable libjs-bootstrap node-blueimp-md5"
VENDOR = "vendor"
# Debian's flot is 4.x, asv's pages are written for 0.8: flot 4 has the axis-label plugin built in (asv's
# own copy would draw each label twice) and draws its legend as SVG whose background and text take
# their colours from CSS that flot 0.8 never needed.
FLOT4_SHIM = ("<style>/* rlbench: flot 4 legend */ .legend svg rect.background { fill: #fff; fill-opacity: .85; "
              "stroke: #ccc; } .legend svg text { fill: #333; font-size: 12px; }</style>")
_AXISLABELS = re.compile(r'<script[^>]*src="jquery\.flot\.axislabels\.js"[^>]*>\s*</script>')
_TAG = re.compile(r'<script\s+[^>]*src="(https?://[^"]+)"[^>]*>\s*</script>|<link\s+[^>]*href="(https?://[^"]+)"[^>]*>')


def read_asv_config(path: str | Path) -> dict:
    """asv.conf.json (JSON with // comment lines)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RlbenchError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    except json.JSONDecodeError as exc:
        raise RlbenchError(f"{path} is not asv's JSON configuration: {exc}") from None


def html_dir(config_path: str | Path) -> Path:
    config_path = Path(config_path)
    return (config_path.parent / read_asv_config(config_path).get("html_dir", "html")).resolve()


def _flot4() -> bool:
    """Debian's flot 4 ships its plugins inside jquery.flot.js, leaving their own files empty."""
    time_plugin = LOCAL_COPIES["jquery.flot.time.min.js"]
    return time_plugin.exists() and time_plugin.stat().st_size == 0


def make_offline(html: str | Path) -> dict[str, list[str]]:
    """Point every CDN script and style of the published pages at local copies, copied beside them.
    Returns what was made local, dropped (bundled into another file or optional) and still remote."""
    html = Path(html)
    pages = sorted(html.glob("*.html"))
    if not pages:
        raise RlbenchError(f"{html} holds no published dashboard (run asv publish first)")
    done: dict[str, list[str]] = {"local": [], "dropped": [], "remote": []}
    (html / VENDOR).mkdir(exist_ok=True)

    def replace(match: re.Match) -> str:
        url = match.group(1) or match.group(2)
        name = url.rsplit("/", 1)[-1]
        local = LOCAL_COPIES.get(name)
        if local is not None and local.exists():
            if local.stat().st_size == 0:
                done["dropped"].append(name)
                return ""
            shutil.copyfile(local, html / VENDOR / name)
            done["local"].append(name)
            if match.group(1):
                return f'<script src="{VENDOR}/{name}" onerror="js_load_failure()"></script>'
            return f'<link rel="stylesheet" href="{VENDOR}/{name}">'
        if name in OPTIONAL:
            done["dropped"].append(name)
            return ""
        done["remote"].append(name)
        return match.group(0)

    for page in pages:
        text = _TAG.sub(replace, page.read_text())
        if f'src="{VENDOR}/jquery.flot.min.js"' in text and _flot4():
            text = _AXISLABELS.sub("", text)
            if FLOT4_SHIM not in text:
                text = text.replace("</head>", FLOT4_SHIM + "</head>", 1)
        page.write_text(text)
    fonts = JS / "bootstrap/fonts"  # bootstrap.min.css asks for ../fonts/ from vendor/
    if fonts.is_dir():
        shutil.copytree(fonts, html / "fonts", dirs_exist_ok=True)
    return {k: sorted(set(v)) for k, v in done.items()}


def publish(config_path: str | Path) -> Path:
    """`asv publish` for this configuration, then the page made offline; returns the html folder."""
    config_path = Path(config_path)
    if not config_path.exists():
        raise RlbenchError(f"no asv configuration at {config_path} (run from the repository root, or --config)")
    published = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(config_path)],
                               capture_output=True, text=True, cwd=config_path.parent)
    if published.returncode != 0:
        tail = (published.stderr or published.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RlbenchError(f"asv publish failed: {tail[0]}")
    return html_dir(config_path)


def serve(html: Path, host: str, port: int, announce) -> None:
    """Serve `html` until Ctrl-C."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    handler.log_message = lambda *args: None
    try:
        server = http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise RlbenchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    announce(f"dashboard at http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
