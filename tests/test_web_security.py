"""The web page against another site, over real HTTP (uvicorn on a free port, on every backend):
forged CSRF tokens (a planted cookie with its own form value, a token signed with another key,
an expired or tampered one), POSTs from another origin or from nowhere, requests for a host the
page is not served as (DNS rebinding), and the headers that keep the page out of frames.

Each check is tried on its own — a good token from another origin, a bad token from the page's
own origin — so that no layer passes only because the other refused first. Every refusal is
followed by a control: the same request, made right, goes through.
"""

from __future__ import annotations

import ast
import hmac
import inspect
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import sqlqueue
from sqlqueue.web import _csrf, create_app
from tests._support import drain, enqueue, sqlqueue_command
from tests._support.source import parse
from tests._support.web import make_queue, serving, token_of, web_command
from tests.conftest import Backend
from tests.test_web import dead_snapshot

SECRET = "the-web-page-key-for-these-tests-only-0123456789"
OTHER_SECRET = "another-server-s-key-that-this-page-never-saw-987654321"


@pytest.fixture
def scene(backend: Backend) -> tuple[sqlqueue.Queue, list[int]]:
    """Three dead jobs (``crm.sync``, a 503) to act on."""
    queue = make_queue(backend)
    dead = enqueue(queue, "crm.sync", 3)
    drain(queue)
    return queue, dead


@pytest.fixture
def page(scene: Any) -> Iterator[str]:
    """The page of ``scene``'s queue, keyed with :data:`SECRET`, served on 127.0.0.1."""
    queue, _ = scene
    with serving(create_app(queue, secret_key=SECRET)) as base:
        yield base


def browser(base: str, **headers: str) -> httpx.Client:
    """A client with its own cookie jar that sends ``headers`` with every request."""
    return httpx.Client(base_url=base, headers=headers, follow_redirects=False, timeout=30)


def loaded(base: str, path: str) -> tuple[httpx.Client, str]:
    """A browser that loaded ``path`` (it holds the page's cookie), and the page's token."""
    client = browser(base, Origin=base)
    return client, token_of(client.get(path).text)


def forged(nonce: str, key: str, *, issued: float | None = None, scope: str = "") -> str:
    """A token for ``nonce`` as a server keyed with ``key`` would sign it."""
    when = int(time.time() if issued is None else issued)
    return f"{when}.{_csrf.signature(key.encode(), nonce, when, scope)}"


def requeued(queue: sqlqueue.Queue, job_id: int) -> bool:
    job = queue.get_job(job_id)
    assert job is not None
    return job.requeued_as is not None


# -- the token ----------------------------------------------------------------------------------


def test_a_cookie_and_form_value_planted_by_another_origin_change_nothing(
    backend: Backend, scene: Any, page: str
) -> None:
    queue, dead = scene
    nonce = "N" * 43  # a cookie a page on another port of 127.0.0.1 set: cookies ignore ports
    attacks = {
        # The old double submit: the cookie's value, echoed in the form.
        "double submit": nonce,
        "another key": forged(nonce, OTHER_SECRET),
        "no signature": f"{int(time.time())}.",
        "the nonce signed as the token": f"{int(time.time())}.{nonce}",
    }
    before = dead_snapshot(backend.engine)
    answers = {}
    for name, token in attacks.items():
        with browser(page, Origin=page) as client:  # even with the page's own Origin
            client.cookies.set(_csrf.COOKIE, nonce)
            answers[name] = client.post(
                f"/jobs/{dead[0]}/requeue", data={"csrf_token": token, "reason": "forged"}
            )

    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(
        attacks, 403
    )
    assert all("security token is missing or wrong" in a.text for a in answers.values())
    assert dead_snapshot(backend.engine) == before
    with browser(page, Origin=page) as client:  # control: signed with the page's key, it passes
        client.cookies.set(_csrf.COOKIE, nonce)
        good = client.post(
            f"/jobs/{dead[0]}/requeue",
            data={"csrf_token": forged(nonce, SECRET), "reason": "signed"},
        )
    assert good.status_code == 303
    assert requeued(queue, dead[0])


def test_a_page_keyed_otherwise_does_not_take_this_pages_tokens(scene: Any, page: str) -> None:
    queue, dead = scene
    client, token = loaded(page, f"/jobs/{dead[0]}")
    nonce = client.cookies[_csrf.COOKIE]
    with serving(create_app(queue, secret_key=OTHER_SECRET)) as other:
        elsewhere = browser(other, Origin=other)
        elsewhere.cookies.set(_csrf.COOKIE, nonce)
        refused = elsewhere.post(
            f"/jobs/{dead[0]}/requeue", data={"csrf_token": token, "reason": "other key"}
        )

    assert refused.status_code == 403
    assert not requeued(queue, dead[0])
    taken = client.post(f"/jobs/{dead[0]}/requeue", data={"csrf_token": token, "reason": "ok"})
    assert taken.status_code == 303


def test_an_expired_tampered_or_misplaced_token_is_refused(scene: Any, page: str) -> None:
    queue, dead = scene
    client, token = loaded(page, f"/jobs/{dead[0]}")
    nonce = client.cookies[_csrf.COOKIE]
    now = time.time()
    issued, signature = token.split(".")
    arabic_indic = issued.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    refused = {
        "13 h old": forged(nonce, SECRET, issued=now - 13 * 3600),
        "from the future": forged(nonce, SECRET, issued=now + 3600),
        "signature changed": f"{issued}.{flipped}",
        "time changed": f"{int(issued) + 1}.{signature}",
        "for another mount": forged(nonce, SECRET, scope="/admin/queue"),
        "for another cookie": forged("M" * 43, SECRET),
        "empty": "",
        "non-ASCII digits": f"{arabic_indic}.{signature}",
    }

    answers = {
        name: client.post(f"/jobs/{dead[0]}/requeue", data={"csrf_token": sent, "reason": "x"})
        for name, sent in refused.items()
    }

    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(
        refused, 403
    )
    assert "has expired (after 12 h): reload the page" in answers["13 h old"].text
    assert "missing or wrong" in answers["signature changed"].text
    assert not requeued(queue, dead[0])
    eleven_hours = forged(nonce, SECRET, issued=now - 11 * 3600)  # within its lifetime
    answer = client.post(
        f"/jobs/{dead[0]}/requeue", data={"csrf_token": eleven_hours, "reason": "x"}
    )
    assert answer.status_code == 303


def test_the_token_is_compared_in_constant_time(
    scene: Any, page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, dead = scene
    client, token = loaded(page, f"/jobs/{dead[0]}")
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    client.post(f"/jobs/{dead[0]}/discard", data={"csrf_token": wrong, "reason": "x"})
    client.post(f"/jobs/{dead[0]}/discard", data={"csrf_token": token, "reason": "x"})

    signature = token.split(".")[1].encode()
    assert compared[-2] == (signature, wrong.split(".")[1].encode())
    assert compared[-1] == (signature, signature)
    # And no ==/!= anywhere in the function that checks a token: a spy sees only the calls made.
    source = textwrap.dedent(inspect.getsource(_csrf.token_problem))
    equalities = [
        ast.unparse(node)
        for node in ast.walk(parse(source))
        if isinstance(node, ast.Compare)
        and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
    ]
    assert equalities == []
    assert "hmac.compare_digest(" in source


# -- the origin ---------------------------------------------------------------------------------


def test_a_good_token_from_another_origin_or_from_nowhere_is_refused(
    backend: Backend, scene: Any, page: str
) -> None:
    queue, dead = scene
    client, token = loaded(page, f"/jobs/{dead[0]}")
    port = int(page.rsplit(":", 1)[1])
    queue.pause("hooks", by="ops", reason="so that resume would change something")
    posts = [
        (f"/jobs/{dead[0]}/requeue", {"reason": "r"}),
        (f"/jobs/{dead[0]}/discard", {"reason": "r"}),
        ("/jobs/requeue", {"reason": "r", "error": "503"}),
        ("/jobs/discard", {"reason": "r", "error": "503"}),
        ("/queues/pause", {"reason": "r", "queue": "mail"}),
        ("/queues/resume", {"queue": "hooks"}),
    ]
    origins: dict[str, dict[str, str]] = {
        "another port": {"Origin": f"http://127.0.0.1:{port + 1}"},
        "another scheme": {"Origin": f"https://127.0.0.1:{port}"},
        "another name": {"Origin": f"http://localhost:{port}"},
        "a sibling": {"Origin": "http://evil.127.0.0.1.nip.io"},
        "opaque": {"Origin": "null"},
        "no origin, another referer": {"Origin": "", "Referer": f"http://127.0.0.1:{port + 1}/"},
        "neither": {"Origin": ""},
    }
    before = dead_snapshot(backend.engine)

    answers = {}
    for name, headers in origins.items():
        sent = {key: value for key, value in headers.items() if value}
        with browser(page, **sent) as other:
            other.cookies.set(_csrf.COOKIE, client.cookies[_csrf.COOKIE])
            for path, form in posts:
                answers[name, path] = other.post(path, data={**form, "csrf_token": token})

    assert {key: answer.status_code for key, answer in answers.items()} == dict.fromkeys(
        answers, 403
    )
    assert dead_snapshot(backend.engine) == before
    port_refusal = answers["another port", posts[0][0]].text.replace("&#39;", "'")
    assert f"another site (origin 'http://127.0.0.1:{port + 1}')" in port_refusal
    assert f"not from this page (http://127.0.0.1:{port})" in port_refusal
    assert "neither an Origin nor a Referer" in answers["neither", posts[0][0]].text
    with browser(page, Referer=f"{page}/jobs/{dead[0]}") as referred:  # control: no Origin,
        referred.cookies.set(_csrf.COOKIE, client.cookies[_csrf.COOKIE])  # the page's Referer
        answer = referred.post(posts[0][0], data={**posts[0][1], "csrf_token": token})
    assert answer.status_code == 303


# -- the host -----------------------------------------------------------------------------------


def raw_get(base: str, request: bytes) -> bytes:
    """``request`` sent as it is (httpx always sends a Host), and the whole answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_for_a_host_the_page_is_not_served_as_is_a_400_that_shows_nothing(
    backend: Backend, scene: Any, page: str
) -> None:
    queue, dead = scene
    port = page.rsplit(":", 1)[1]
    client, token = loaded(page, f"/jobs/{dead[0]}")
    paths = ["/", "/jobs?status=dead", f"/jobs/{dead[0]}", "/chart", "/static/sqlqueue.js"]
    refused_hosts = [f"rebound.example:{port}", "rebound.example", f"127.0.0.1.nip.io:{port}",
                     f"localhost.example:{port}", "", "local host", f"[::2]:{port}"]  # fmt: skip
    allowed_hosts = [f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", "127.0.0.1"]

    refused = {(host, path): client.get(path, headers={"Host": host}) for host in refused_hosts
               for path in paths}  # fmt: skip
    posted = client.post(
        f"/jobs/{dead[0]}/requeue",
        data={"csrf_token": token, "reason": "rebound"},
        headers={"Host": f"rebound.example:{port}", "Origin": f"http://rebound.example:{port}"},
    )
    without_host = raw_get(page, b"GET / HTTP/1.0\r\n\r\n")

    assert {key: answer.status_code for key, answer in refused.items()} == dict.fromkeys(
        refused, 400
    )
    for answer in refused.values():
        assert "crm.sync" not in answer.text
        assert "set-cookie" not in answer.headers
        assert answer.headers["x-frame-options"] == "DENY"
    assert "not served as the host 'rebound.example:" in refused[refused_hosts[0], "/"].text
    assert "--allowed-host" in refused[refused_hosts[0], "/"].text
    assert posted.status_code == 400
    assert not requeued(queue, dead[0])
    assert without_host.startswith(b"HTTP/1.1 400")
    assert b"no Host header" in without_host
    for host in allowed_hosts:  # control: the loopback names, on any port by default
        assert client.get("/", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_names_exactly_the_hosts_that_are_answered(scene: Any) -> None:
    queue, _ = scene
    app = create_app(queue, allowed_hosts=["ops.example:8443", "jobs.internal"])
    with serving(app) as base, browser(base) as client:
        expected = {
            "ops.example:8443": 200,
            "OPS.EXAMPLE.:8443": 200,
            "ops.example:8080": 400,
            "jobs.internal:1234": 200,  # no port given: any port
            "jobs.internal": 200,
            "x.jobs.internal": 400,
            base.removeprefix("http://"): 400,  # the address it listens on, not named
            "localhost": 400,
        }
        answers = {host: client.get("/", headers={"Host": host}).status_code for host in expected}

    assert answers == expected


def test_every_response_forbids_framing_and_sniffing(scene: Any, page: str) -> None:
    _, dead = scene
    client, token = loaded(page, f"/jobs/{dead[0]}")

    answers = {
        "page": client.get("/"),
        "fragment": client.get("/chart"),
        "asset": client.get("/static/style.css"),
        "redirect": client.post(
            f"/jobs/{dead[0]}/discard", data={"csrf_token": token, "reason": "x"}
        ),
        "refused": client.post(f"/jobs/{dead[1]}/discard", data={"reason": "x"}),
        "bad filter": client.get("/jobs?status=sleeping"),
        "missing": client.get("/jobs/987654"),
        "no route": client.get("/nowhere"),
    }

    assert {name: answer.status_code for name, answer in answers.items()} == {
        "page": 200, "fragment": 200, "asset": 200, "redirect": 303, "refused": 403,
        "bad filter": 400, "missing": 404, "no route": 404,
    }  # fmt: skip
    for name, answer in answers.items():
        assert answer.headers["x-frame-options"] == "DENY", name
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], name
        assert answer.headers["x-content-type-options"] == "nosniff", name
    assert "<h1>403</h1>" in answers["refused"].text  # the refusal is a page that says why
    assert "security token is missing or wrong" in answers["refused"].text


# -- mounted in a host's app, and the configuration ----------------------------------------------


def test_mounted_in_a_host_app_the_page_keeps_its_checks_and_the_host_its_routes(
    scene: Any,
) -> None:
    queue, dead = scene

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the host app")

    mounted = create_app(queue, secret_key=SECRET, allowed_hosts=["127.0.0.1"])
    host = Starlette(routes=[Route("/", home), Mount("/admin/queue", app=mounted)])
    with serving(host) as base:
        client, token = loaded(base, f"/admin/queue/jobs/{dead[0]}")
        nonce = client.cookies[_csrf.COOKIE]
        rebound = client.get("/admin/queue/", headers={"Host": "rebound.example"})
        hosts_own = client.get("/", headers={"Host": "rebound.example"})
        unmounted_token = client.post(  # a token for the page at / does not pass under a prefix
            f"/admin/queue/jobs/{dead[0]}/requeue",
            data={"csrf_token": forged(nonce, SECRET), "reason": "x"},
        )
        with browser(base, Origin="http://127.0.0.1:1") as other:
            other.cookies.set(_csrf.COOKIE, nonce, path="/admin/queue/")
            cross = other.post(
                f"/admin/queue/jobs/{dead[0]}/requeue", data={"csrf_token": token, "reason": "x"}
            )
        good = client.post(
            f"/admin/queue/jobs/{dead[0]}/requeue", data={"csrf_token": token, "reason": "x"}
        )

    assert rebound.status_code == 400
    assert hosts_own.text == "the host app"  # the host app decides about its own routes
    assert (unmounted_token.status_code, cross.status_code) == (403, 403)
    assert good.status_code == 303
    assert good.headers["location"] == f"/admin/queue/jobs/{dead[0]}"


def test_create_app_refuses_a_short_key_and_hosts_that_are_not_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match="secret_key must be at least 32 bytes"):
        create_app(queue, secret_key="hunter2-too-short")
    with pytest.raises(sqlqueue.ConfigurationError, match="secret_key: expected str or bytes"):
        create_app(queue, secret_key=12345678901234567890123456789012345)  # type: ignore[arg-type]
    monkeypatch.setenv("SQLQUEUE_WEB_SECRET", "short-and-secret")
    with pytest.raises(sqlqueue.ConfigurationError, match=r"\$SQLQUEUE_WEB_SECRET must be") as e:
        create_app(queue)
    assert "short-and-secret" not in str(e.value)
    monkeypatch.setenv("SQLQUEUE_WEB_SECRET", SECRET)
    assert create_app(queue).state.sqlqueue.secret_key == SECRET.encode()
    assert create_app(queue, secret_key=OTHER_SECRET).state.sqlqueue.secret_key == (
        OTHER_SECRET.encode()
    )
    monkeypatch.setenv("SQLQUEUE_WEB_SECRET", "")  # empty is unset: one random key per process
    made = create_app(queue).state.sqlqueue.secret_key
    assert made == create_app(queue).state.sqlqueue.secret_key
    assert len(made) >= 32
    assert made not in (SECRET.encode(), OTHER_SECRET.encode())
    for hosts, message in [
        ("localhost", "expected a list of hosts"),
        (["http://localhost:8080"], "'http://localhost:8080' is not a host"),
        (["localhost/admin"], "is not a host"),
        (["local host"], "is not a host"),
        (["localhost:99999"], "is not a host"),
        ([""], "is not a host"),
        ([], "allowed_hosts is empty"),
    ]:
        with pytest.raises(sqlqueue.ConfigurationError, match=message):
            create_app(queue, allowed_hosts=hosts)


def test_the_web_command_answers_its_allowed_hosts_only(
    backend: Backend, scene: Any, tmp_path: Path
) -> None:
    # Port 0: uvicorn binds a port the kernel chose and says which in its start-up line, so the
    # hosts with a port are checked against one it cannot be (1) and names without one.
    hosts = ["--allowed-host", "ops.example", "--allowed-host", "pinned.example:1",
             "--allowed-host", "127.0.0.1"]  # fmt: skip
    with web_command("--database-url", backend.url, *hosts, log=tmp_path / "web.log") as port:
        base = f"http://127.0.0.1:{port}"
        # --allowed-host replaces the default (the address and localhost): localhost is refused.
        expected = {
            f"ops.example:{port}": 200,
            f"127.0.0.1:{port}": 200,
            f"localhost:{port}": 400,
            f"pinned.example:{port}": 400,
        }
        answers = {
            host: httpx.get(base + "/", headers={"Host": host}, timeout=30).status_code
            for host in expected
        }
    bad = subprocess.run(
        [
            *sqlqueue_command(),
            "web",
            "--database-url",
            backend.url,
            "--port",
            "0",
            "--allowed-host",
            "http://ops.example/",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert answers == expected
    assert bad.returncode == 2
    assert "allowed_hosts: 'http://ops.example/' is not a host" in bad.stderr
    assert "Traceback" not in bad.stderr
