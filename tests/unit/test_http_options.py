"""module.yaml: the HTTP ingress's allowedHosts, auth and tls, and an HTTP endpoint's headers."""

from __future__ import annotations

from pathlib import Path

import pytest

from statefun._exceptions import ModuleError
from statefun.module import HttpEndpointSpec, HttpIngressSpec, load_module_text

INGRESS = """\
kind: io.pystatefun.http.v1/ingress
spec:
  id: example/http
"""
ENDPOINT = """\
kind: io.statefun.endpoints.v2/http
spec:
  functions: example/*
  urlPathTemplate: https://functions.example.com/statefun
"""


def ingress(extra: str, base: Path | None = None) -> HttpIngressSpec:
    (spec,) = load_module_text(INGRESS + extra, base_dir=base).ingresses
    assert isinstance(spec, HttpIngressSpec)
    return spec


def endpoint(extra: str) -> HttpEndpointSpec:
    (spec,) = load_module_text(ENDPOINT + extra).endpoints
    assert isinstance(spec, HttpEndpointSpec)
    return spec


def error(text: str, base: Path | None = None) -> str:
    with pytest.raises(ModuleError) as info:
        load_module_text(text, base_dir=base)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults() -> None:
    spec = ingress("")
    assert (spec.allowed_hosts, spec.token, spec.tls) == (None, None, None)
    assert endpoint("").transport.headers == ()


def test_allowed_hosts() -> None:
    assert ingress("  allowedHosts: [a.example, 'b.example:8080']\n").allowed_hosts == (
        "a.example",
        "b.example:8080",
    )
    assert "spec.allowedHosts: expected a list" in error(INGRESS + "  allowedHosts: []\n")
    assert "spec.allowedHosts" in error(INGRESS + "  allowedHosts: nope\n")


def test_token_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INGRESS_TOKEN", " t0ken \n")
    spec = ingress("  auth:\n    tokenEnv: INGRESS_TOKEN\n")
    assert spec.token == "t0ken"
    assert "t0ken" not in repr(spec)
    (tmp_path / "token").write_text("f1le-token\n")
    assert ingress("  auth:\n    tokenFile: token\n", tmp_path).token == "f1le-token"


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ("  auth:\n    tokenEnv: UNSET_TOKEN_VARIABLE\n", "UNSET_TOKEN_VARIABLE is not set"),
        ("  auth:\n    tokenFile: missing\n", "cannot read token file"),
        ("  auth: {}\n", "give the token's environment variable or its file"),
        ("  auth:\n    tokenEnv: A\n    tokenFile: b\n", "(one)"),
        ("  auth:\n    tokenEnv: 'not a name'\n", "spec.auth.tokenEnv"),
        ("  auth:\n    token: inline\n", "spec.auth.token: unknown field"),
    ],
)
def test_bad_auth_is_one_line(auth: str, message: str, tmp_path: Path) -> None:
    got = error(INGRESS + auth, tmp_path)
    assert message in got and "document 1 (io.pystatefun.http.v1/ingress)" in got


def test_tls_files_are_checked(tmp_path: Path) -> None:
    message = error(INGRESS + "  tls:\n    certFile: c.pem\n    keyFile: k.pem\n", tmp_path)
    assert "spec.tls" in message and "c.pem" in message
    assert "spec.tls.keyFile: missing" in error(INGRESS + "  tls:\n    certFile: c.pem\n")


def test_endpoint_headers_with_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FN_TOKEN", "abc123")
    spec = endpoint('  headers:\n    Authorization: "Bearer ${FN_TOKEN}"\n    X-Tenant: 7\n')
    assert spec.transport.headers == (("Authorization", "Bearer abc123"), ("X-Tenant", "7"))
    assert "abc123" not in repr(spec)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ('    Authorization: "Bearer ${NOT_SET_ANYWHERE}"\n', "NOT_SET_ANYWHERE"),
        ('    Authorization: "${bad name}"\n', "not an environment variable's name"),
        ("    Host: other\n", "the client sets this header itself"),
        ('    "Bad Name": x\n', "not a header name"),
        ("    X-List: [1]\n", "expected a string"),
    ],
)
def test_bad_endpoint_headers_are_one_line(headers: str, message: str) -> None:
    got = error(ENDPOINT + "  headers:\n" + headers)
    assert message in got and "spec.headers" in got


def test_a_header_value_with_a_line_break_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLIT", "a\r\nX-Injected: 1")
    assert "line break" in error(ENDPOINT + '  headers:\n    X-A: "${SPLIT}"\n')
