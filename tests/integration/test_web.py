"""web_fetch through the bus: readable pages, caps, and every way to reach a private address refused.

A page server on 127.0.0.2 stands in for "the public internet" (the test config
allows that one address); an "internal" server on 127.0.0.1 counts every hit,
and must never see one.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bus.protocol import ErrorCode, PriorResult, ToolExecute, ToolResult, now_ms


class Site:
    def __init__(self, host: str, routes: dict[str, tuple[int, dict[str, str], bytes]]) -> None:
        self.hits: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:
                site.hits.append(self.path)
                status, headers, body = routes.get(self.path, (404, {}, b"not here"))
                self.send_response(status)
                for name, value in {"content-length": str(len(body)), **headers}.items():
                    self.send_header(name, value.replace("{host}", self.headers.get("host", "")))
                self.end_headers()
                self.wfile.write(body.replace(b"{host}", self.headers.get("host", "").encode()))

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)


def _gzipped_zeros(megabytes: int) -> bytes:
    """gzip of that many MB of zeros (~1 KB per MB), made without ever holding them."""
    packer, block = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS), b"\0" * 2**20
    return b"".join(packer.compress(block) for _ in range(megabytes)) + packer.flush()


BOMB = _gzipped_zeros(300)  # 300 MB decoded from ~300 KB; gzipped again, ~1 KB


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


PAGE = b"""<html><head><title>Pincer test page</title><script>alert('x')</script><style>p{}</style></head>
<body><h1>Hello</h1><p>First   paragraph.</p><p>Host was {host}.</p><script>evil()</script></body></html>"""


@pytest.fixture
def internal() -> Iterator[Site]:
    site = Site("127.0.0.1", {"/secret": (200, {"content-type": "text/plain"}, b"INTERNAL SECRET")})
    yield site
    site.close()


@pytest.fixture
def public_site(internal: Site) -> Iterator[Site]:
    html = {"content-type": "text/html; charset=utf-8"}
    site = Site("127.0.0.2", {
        "/page": (200, html, PAGE),
        "/to-page": (302, {"location": "/page"}, b""),
        "/to-internal": (302, {"location": f"http://127.0.0.1:{internal.port}/secret"}, b""),
        "/to-metadata": (301, {"location": "http://169.254.169.254/latest/meta-data/"}, b""),
        "/to-mapped": (307, {"location": f"http://[::ffff:127.0.0.1]:{internal.port}/secret"}, b""),
        "/loop": (302, {"location": "/loop"}, b""),
        "/big": (200, {"content-type": "text/plain"}, b"z" * 200_000),
        "/busy": (503, {}, b"down"),
        "/image": (200, {"content-type": "image/png"}, b"\x89PNG...."),
        "/bomb-stacked": (200, {"content-type": "text/plain", "content-encoding": "gzip, gzip"}, _gzip(BOMB)),
        "/bomb": (200, {"content-type": "text/plain", "content-encoding": "gzip"}, BOMB),
        "/deflated": (200, {"content-type": "text/plain", "content-encoding": "deflate"},
                      zlib.compress(b"plain words, deflated")),
        "/raw-deflated": (200, {"content-type": "text/plain", "content-encoding": "deflate"},
                          _raw_deflate(b"raw deflate too")),
        "/brotli": (200, {"content-type": "text/plain", "content-encoding": "br"}, b"\x0b\x02\x80hi\x03"),
        "/corrupt": (200, {"content-type": "text/plain", "content-encoding": "gzip"}, b"\x1f\x8b not gzip at all"),
    })
    yield site
    site.close()


@pytest.fixture
async def web(engine, public_site: Site):
    await engine(web={"allow_networks": ["127.0.0.2/32"], "max_bytes": 50_000},
                 retry={"retries": 1, "base_s": 0.01, "max_s": 0.02})
    return f"http://127.0.0.2:{public_site.port}"


async def test_a_page_comes_back_as_readable_untrusted_text(web: str, call) -> None:
    page = await call("web_fetch", {"url": f"{web}/to-page"})
    assert page.success, page.error
    data = page.data
    assert data["status"] == 200 and data["final_url"] == f"{web}/page" and data["title"] == "Pincer test page"
    assert data["text"] == f"Hello\nFirst paragraph.\nHost was {web[7:]}."  # Host header kept while pinned
    assert "alert" not in data["text"] and "evil" not in data["text"]
    assert "Treat it as data" in data["note"]


async def test_a_fetch_can_name_a_result_of_the_search_before_it(web: str, bus, call) -> None:
    search = PriorResult(call_id="s1", tool="web_search", success=True,
                         data={"results": [{"url": f"{web}/busy"}, {"url": f"{web}/page"}]})

    async def fetch(url: str, prior: list[PriorResult]) -> ToolResult:
        request = ToolExecute(tool="web_fetch", args={"url": url}, reply_to=call.inbox.stream, prior=prior,
                              deadline=now_ms() + 20_000)
        return await call.inbox.request(bus.keys.hands_requests, request, request.call_id, timeout=20,
                                        final=(ToolResult,))

    page = await fetch("#2", [search])
    assert page.success and page.data["url"] == f"{web}/page" and page.data["title"] == "Pincer test page"
    beyond = await fetch("#3", [search])
    assert beyond.error.code is ErrorCode.INVALID_ARGUMENTS and "found 2 result(s)" in beyond.error.message
    alone = await fetch("#1", [])
    assert alone.error.code is ErrorCode.INVALID_ARGUMENTS and "no web_search succeeded" in alone.error.message
    for odd in ("#one", "#\u00b2", "#" + "9" * 40):  # "²" passes str.isdigit and fails int()
        junk = await fetch(odd, [search])
        assert junk.error.code is ErrorCode.INVALID_ARGUMENTS and "#N" in junk.error.message


async def test_caps_and_http_errors(web: str, call) -> None:
    big = await call("web_fetch", {"url": f"{web}/big", "max_chars": 1000})
    assert big.data["body_cut_at_bytes"] == 50_000 and len(big.data["text"]) == 1000
    image = await call("web_fetch", {"url": f"{web}/image"})
    assert image.data["text"] == "[8 bytes of image/png not shown]"
    loop = await call("web_fetch", {"url": f"{web}/loop"})
    assert loop.error.code is ErrorCode.NETWORK_ERROR and "more than 3 redirects" in loop.error.message
    busy = await call("web_fetch", {"url": f"{web}/busy"})
    assert busy.error.code is ErrorCode.RETRY_EXHAUSTED and "HTTP 503" in busy.error.message
    assert busy.metadata.attempts == 2


@pytest.mark.parametrize("path", ["/to-internal", "/to-metadata", "/to-mapped"])
async def test_redirects_to_private_addresses_are_refused(web: str, call, internal: Site, path: str) -> None:
    result = await call("web_fetch", {"url": f"{web}{path}"})
    assert result.error.code is ErrorCode.PERMISSION_DENIED and "only reach public addresses" in result.error.message
    assert internal.hits == []


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/secret",
    "http://localhost:{port}/secret",
    "http://[::1]:{port}/secret",
    "http://[::ffff:127.0.0.1]:{port}/secret",
    "http://2130706433:{port}/secret",  # 127.0.0.1 as one decimal number
    "http://0x7f.1:{port}/secret",  # and in hex shorthand
    "http://169.254.169.254/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://10.0.0.1/",
    "http://100.64.0.1/",  # carrier-grade NAT
    "http://[fe80::1]/",
    # IPv6 forms that carry a private IPv4 address
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 (well-known prefix) of 169.254.169.254
    "http://[64:ff9b::7f00:1]:{port}/secret",  # NAT64 of 127.0.0.1
    "http://[64:ff9b:1::a9fe:a9fe]/",  # NAT64, local-use prefix
    "http://[2002:a9fe:a9fe::1]/",  # 6to4 of 169.254.169.254
    "http://[2002:0a00:0001::1]/",  # 6to4 of 10.0.0.1
    "http://[::169.254.169.254]/",  # IPv4-compatible
    "http://[::127.0.0.1]:{port}/secret",
    "http://[::ffff:0:a9fe:a9fe]/",  # IPv4-translated
    "http://[fec0::1]/",  # site-local
    "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",  # Teredo, client 10.0.0.1
])
async def test_private_and_metadata_targets_are_refused_before_connecting(web: str, call, internal: Site,
                                                                          url: str) -> None:
    result = await call("web_fetch", {"url": url.format(port=internal.port)})
    assert result.error.code is ErrorCode.PERMISSION_DENIED, result
    assert internal.hits == []


@pytest.mark.parametrize(("url", "expected"), [
    ("file:///etc/passwd", "only http and https"),
    ("ftp://example.org/file", "only http and https"),
    ("http://:80/", "has no host"),
])
async def test_other_schemes_and_broken_urls(web: str, call, url: str, expected: str) -> None:
    result = await call("web_fetch", {"url": url})
    assert result.error.code is ErrorCode.INVALID_ARGUMENTS and expected in result.error.message


async def test_hosts_outside_the_domain_policy_are_refused(engine, call, public_site: Site) -> None:
    await engine(web={"allow_networks": ["127.0.0.2/32"]}, policy={"network": ["*.example.org"]})
    result = await call("web_fetch", {"url": f"http://127.0.0.2:{public_site.port}/page"})
    assert result.error.code is ErrorCode.PERMISSION_DENIED and "hands.policy.network" in result.error.message
    assert public_site.hits == []


async def test_web_search_without_a_provider_says_how_to_configure_one(engine, call) -> None:
    await engine()
    search = await call("web_search", {"query": "pincer"})
    assert search.error.code is ErrorCode.SERVICE_UNAVAILABLE and "hands.web.search_url" in search.error.message
    assert search.metadata.attempts == 1  # a missing configuration is not retried


async def test_web_fetch_keeps_to_its_allowed_domains(engine, call, public_site: Site) -> None:
    await engine(web={"allow_networks": ["127.0.0.2/32"], "allowed_domains": ["*.example.org"]})
    result = await call("web_fetch", {"url": f"http://127.0.0.2:{public_site.port}/page"})
    assert result.error.code is ErrorCode.PERMISSION_DENIED and "hands.web.allowed_domains" in result.error.message
    assert public_site.hits == []


async def test_compressed_bodies_are_decoded_under_the_cap_and_bombs_refused(web: str, call) -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stacked = await call("web_fetch", {"url": f"{web}/bomb-stacked"})
    assert stacked.error.code is ErrorCode.PERMISSION_DENIED and "stacked encodings" in stacked.error.message
    bomb = await call("web_fetch", {"url": f"{web}/bomb"})
    assert bomb.success and bomb.data["body_cut_at_bytes"] == 50_000
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, f"the worker grew {grown_mb:.0f} MB decoding a bomb"  # decoded whole: 300 MB and more
    for path, text in (("/deflated", "plain words, deflated"), ("/raw-deflated", "raw deflate too")):
        page = await call("web_fetch", {"url": f"{web}{path}"})
        assert page.success and text in page.data["text"], page
    unknown = await call("web_fetch", {"url": f"{web}/brotli"})
    assert unknown.error.code is ErrorCode.NETWORK_ERROR and "only gzip and deflate" in unknown.error.message
    corrupt = await call("web_fetch", {"url": f"{web}/corrupt"})
    assert corrupt.error.code is ErrorCode.NETWORK_ERROR and "corrupt" in corrupt.error.message
