"""Every answer of the gateway carries its security headers, refusals too, and no API
answer (job states, schemas, sealed results, problem details) is kept by a cache.

The refusals that come before the app (no or unknown token, a credential in the query
string, a body too large or outside /v1/) echo the request's path in their problem
details: they are data, never a page to sniff, render or frame."""

from __future__ import annotations

import http.client

import httpx
import pytest
from service_fakes import Stack

NOT_HTML = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}
ECHO = "/v1/<script>alert(1)</script>"


def _check(r: httpx.Response, expect: int, cached: str = "no-store") -> None:
    assert r.status_code == expect, (r.request.url, r.status_code, r.text)
    for name, value in NOT_HTML.items():
        assert r.headers.get(name) == value, (r.request.url, name, dict(r.headers))
    csp = r.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp, (r.request.url, dict(r.headers))
    assert r.headers.get_list("cache-control") == [cached], (r.request.url, dict(r.headers))


def test_refusals_before_the_app_carry_the_security_headers(stack: Stack) -> None:
    url = stack.gateway.url
    auth = {"Authorization": f"Bearer {stack.token['analyst-1']}"}
    _check(httpx.get(url + ECHO), 401)  # no token: the path comes back in "instance"
    _check(httpx.get(url + ECHO, headers={"Authorization": "Bearer nope"}), 401)
    _check(httpx.get(url + "/v1/jobs?access_token=x", headers=auth), 400)
    # a body said to be larger than any accepted: refused before a byte of it is read
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/v1/datasets")
    conn.putheader("Authorization", auth["Authorization"])
    conn.putheader("Content-Length", str(1 << 40))
    conn.endheaders()
    got = conn.getresponse()
    assert got.status == 413
    _check(httpx.Response(413, headers=got.getheaders(), request=httpx.Request("POST", url)),
           413)
    conn.close()
    r = httpx.post(url + "/console/x", content=b"{}")  # a body outside /v1/
    assert r.status_code == 404 and r.headers.get("x-content-type-options") == "nosniff"
    assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", "")


@pytest.mark.parametrize("path", ["/v1/principal", "/v1/jobs", "/v1/datasets",
                                  "/v1/deployment", "/v1/jobs/nojob", "/metrics"])
def test_api_answers_are_never_cached(stack: Stack, path: str) -> None:
    who = "admin" if path == "/metrics" else "analyst-1"
    r = httpx.get(stack.gateway.url + path,
                  headers={"Authorization": f"Bearer {stack.token[who]}"})
    _check(r, 404 if path.endswith("nojob") else 200)


def test_the_console_is_revalidated_under_its_own_policy(stack: Stack) -> None:
    r = httpx.get(stack.gateway.url + "/console/")
    _check(r, 200, cached="no-cache")  # revalidated, so a new console is seen at once
    assert "script-src 'self'" in r.headers["content-security-policy"]
