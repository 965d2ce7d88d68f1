"""Where the alert tests' alerts arrive: a real SMTP server (aiosmtpd on
loopback) and one loopback HTTP server standing in for Slack's incoming
webhook and for ``ADPIPE_ALERT_WEBHOOK``, with the Connections and settings
that point adpipe at them (``AIRFLOW_CONN_*`` variables, as a deployment's
secrets backend would give them)."""

from __future__ import annotations

import email
import email.policy
import html
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLACK_PATH = "/services/T000/B000/XXXX"
WEBHOOK_PATH = "/adpipe"
RECIPIENTS = "oncall@example.org, data@example.org"
SENDER = "adpipe@example.org"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Inbox:
    """What the SMTP server received, as parsed messages (the envelope's
    recipients in ``X-Envelope-To``)."""

    port: int = 0
    messages: list[EmailMessage] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: ANN001, N802 - aiosmtpd's handler API
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        self.messages.append(message)
        return "250 OK"


def html_text(message: EmailMessage) -> str:
    """An e-mail's HTML body, entities decoded."""
    return html.unescape(message.get_body(("html",)).get_content())


@contextmanager
def smtp_server() -> Iterator[Inbox]:
    from aiosmtpd.controller import Controller

    inbox = Inbox(port=free_port())
    controller = Controller(inbox, hostname="127.0.0.1", port=inbox.port)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()


class Hooks(BaseHTTPRequestHandler):
    """Slack's incoming webhook and the JSON webhook in one server: every
    POST is kept as (path, body); ``fail[path]`` answers that many POSTs to
    ``path`` with a 500 first."""

    received: list[tuple[str, dict]] = []
    fail: dict[str, int] = {}

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.path, body))
        if type(self).fail.get(self.path, 0) > 0:
            type(self).fail[self.path] -= 1
            self.send_response(500)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass

    @classmethod
    def slack(cls) -> list[dict]:
        return [body for path, body in cls.received if path == SLACK_PATH]

    @classmethod
    def posted(cls) -> list[dict]:
        return [body for path, body in cls.received if path == WEBHOOK_PATH]


@contextmanager
def hooks_server() -> Iterator[str]:
    """The server's base URL; :class:`Hooks` keeps what it received."""
    Hooks.received, Hooks.fail = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def smtp_connection(port: int, timeout_s: int = 5) -> str:
    """The ``adpipe_smtp`` Connection (JSON) of a loopback server without TLS."""
    return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port, "extra": {
        "from_email": SENDER, "disable_ssl": True, "disable_tls": True, "timeout": timeout_s, "retry_limit": 1}})


def alert_env(inbox: Inbox, hooks_url: str) -> dict[str, str]:
    """Every alert channel on, pointed at these servers."""
    return {
        "AIRFLOW_CONN_ADPIPE_SMTP": smtp_connection(inbox.port),
        "AIRFLOW_CONN_ADPIPE_SLACK": json.dumps({"conn_type": "slackwebhook", "password": hooks_url + SLACK_PATH}),
        "ADPIPE_ALERT_WEBHOOK": hooks_url + WEBHOOK_PATH,
        "ADPIPE_ALERT_EMAIL_TO": RECIPIENTS,
        "ADPIPE_ALERT_SLACK": "on",
        "ADPIPE_ALERT_RETRIES": "2",
    }
