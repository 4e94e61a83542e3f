"""The TLS side of pycnid's etcd credentials: the files checked at open, a refused handshake named.

gRPC reports every failed handshake as UNAVAILABLE, and the one an operator meets most, etcd
refusing pycnid's client certificate, only as ``Unwrap failed (TSI_DATA_CORRUPTED)``: the same
words as no client certificate at all, and close to a network fault. When a call failed that
way, ``diagnose_handshake`` repeats the handshake with the standard library's ``ssl``, which
reads etcd's alert (``bad certificate``, ``certificate required``) or its own verdict on etcd's
certificate, and names the file to fix. Only a diagnosed refusal becomes code 7; a member that
is down stays code 11.
"""

from __future__ import annotations

import socket
import ssl
from typing import Protocol

from cni.spec.errors import InvalidConfig

#: Words of a gRPC error that may hide a refused handshake (worth a diagnosis).
HANDSHAKE_HINTS = ("TSI_", "handshake", "SSL", "certificate", "verification", "Socket closed")


class TlsFiles(Protocol):
    """The TLS keys of the store's config (``EtcdOptions``)."""

    @property
    def ca(self) -> str | None: ...

    @property
    def cert(self) -> str | None: ...

    @property
    def key(self) -> str | None: ...

    @property
    def server_name(self) -> str | None: ...


ALERT_WAIT = 1.0  # seconds to wait for a refusing etcd's alert (on loopback it takes < 1 ms)


def check_files(files: TlsFiles) -> None:
    """Each file parses and the key matches the certificate (code 7 naming the key)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if files.ca:
        try:
            context.load_verify_locations(files.ca)
        except (ssl.SSLError, ValueError) as exc:
            raise bad_file("ca", f"{files.ca} holds no PEM CA certificate ({exc})") from None
    if files.cert and files.key:
        try:
            context.load_cert_chain(files.cert, files.key)
        except ssl.SSLError as exc:
            raise bad_file(
                "key", f"{files.key} does not hold the private key of {files.cert} ({exc})"
            ) from None


def bad_file(what: str, details: str) -> InvalidConfig:
    return InvalidConfig(f"invalid daemon config key 'store.{what}'", details)


def may_be_handshake(details: str) -> bool:
    return any(hint in details for hint in HANDSHAKE_HINTS)


def diagnose_handshake(files: TlsFiles, host: str, port: int, timeout: float) -> str | None:
    """Why etcd at ``host:port`` and pycnid's files do not agree on TLS, or None (they do, or
    the member does not answer: not a credential problem)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if files.ca:
        context.load_verify_locations(files.ca)
    else:
        context.load_default_certs()
    if files.cert and files.key:
        context.load_cert_chain(files.cert, files.key)
    name = files.server_name or host.strip("[]")
    try:
        with socket.create_connection((host.strip("[]"), port), timeout) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:
                # TLS 1.3: etcd judges the client certificate after the handshake ends here; its
                # alert is what the first read gets. Nothing is sent first: etcd would close on
                # unread data with a reset, which drops the alert. A good pair reads nothing.
                tls.settimeout(min(timeout, ALERT_WAIT))
                tls.recv(1)
    except TimeoutError:
        return None  # etcd took the certificate and waits for a request
    except ssl.SSLCertVerificationError as exc:
        return describe_distrust(files, name, exc)
    except ssl.SSLError as exc:
        return describe_refusal(files, exc)
    except OSError:
        return None
    return None


def describe_distrust(files: TlsFiles, name: str, exc: ssl.SSLCertVerificationError) -> str:
    if "hostname" in (exc.verify_message or "").lower():
        return (
            f"etcd's server certificate does not name {name!r}"
            f" (store.tlsServerName, else the endpoint's host): {exc.verify_message}"
        )
    ca = files.ca or "the system CAs"
    return f"etcd's server certificate is not trusted by {ca} (store.ca): {exc.verify_message}"


def describe_refusal(files: TlsFiles, exc: ssl.SSLError) -> str:
    alert = describe_alert(exc)
    if not alert.startswith("alert"):
        return f"the TLS handshake with etcd failed: {alert}"
    if not files.cert:
        return f"etcd requires a client certificate: set store.cert and store.key ({alert})"
    return f"etcd refused the client certificate {files.cert} (store.cert): {alert}"


def describe_alert(exc: ssl.SSLError) -> str:
    """``TLSV13_ALERT_CERTIFICATE_REQUIRED`` -> ``alert certificate required``."""
    reason = exc.reason or str(exc)
    words = reason.lower().replace("_", " ").split()
    if "alert" in words:
        return " ".join(words[words.index("alert") :])
    return reason
