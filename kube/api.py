"""HTTP to the API server through the official ``kubernetes`` client: it loads the kubeconfig or
the in-cluster service account (token, CA, client certificates, token refresh) and sends the
requests; the list/watch protocol itself (pages, watch lines, bookmarks, Status errors) is
spoken here and in ``reflector.py``, on raw JSON, so no object is ever built as a client model
(10^4 Services as models would cost seconds and tens of MiB).

Every failure is one of two errors: ``ApiStatus`` (the server answered with a Status: 403,
410, 500...) and ``Unreachable`` (no answer: refused, reset, timed out, TLS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cni.spec.errors import InvalidConfig
from kube.config import KubeConfig

if TYPE_CHECKING:
    import urllib3
    from kubernetes import client as kclient

GONE, FORBIDDEN = 410, 403


class ApiStatus(Exception):
    """The server's answer was a Status failure (or an ERROR watch event carrying one)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}" if message else f"{code} {reason}")
        self.code, self.reason, self.message = code, reason, message


class Unreachable(Exception):
    """No answer from the API server."""


def open_api(config: KubeConfig) -> Api:
    """The client for ``config`` (its kubeconfig, or in-cluster); a config that cannot be
    loaded is code 7 naming it. The library is imported here, not with this module: it
    costs ~0.4 s and ~30 MiB, which a pycnid without the ``kubernetes`` section never pays."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig
    from kubernetes.config.config_exception import ConfigException

    configuration = kclient.Configuration()
    try:
        if config.kubeconfig is None:
            kconfig.load_incluster_config(client_configuration=configuration)
        else:
            kconfig.load_kube_config(
                config_file=config.kubeconfig, client_configuration=configuration
            )
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = config.kubeconfig or "the in-cluster service account"
        raise InvalidConfig(f"cannot load Kubernetes credentials from {where}", str(exc)) from None
    configuration.retries = False  # the reflector backs off itself
    return Api(kclient.ApiClient(configuration), config.request_timeout)


class Api:
    def __init__(self, api_client: kclient.ApiClient, timeout: float) -> None:
        import urllib3
        from kubernetes.client import ApiException

        self.api_client, self.timeout = api_client, timeout
        self.errors: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)
        self.api_exception = ApiException

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    def get(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        """One JSON document (a list page)."""
        return decode_document(self.read(path, params), path)

    def read(self, path: str, params: Mapping[str, str]) -> bytes:
        """One answer's body, undecoded (``decode_document``)."""
        response = self._send(path, params, (self.timeout, self.timeout))
        try:
            data: bytes = response.data
            return data
        except self.errors as exc:
            raise Unreachable(f"reading {path}: {exc}") from None
        finally:
            response.release_conn()

    def stream(self, path: str, params: Mapping[str, str], read_timeout: float) -> Stream:
        """A watch: its lines, one event each, until the server ends it or ``close()``."""
        return Stream(self._send(path, params, (self.timeout, read_timeout)), path, self.errors)

    def _send(
        self, path: str, params: Mapping[str, str], timeout: tuple[float, float]
    ) -> urllib3.HTTPResponse:
        method, url, headers, _body, _post = self.api_client.param_serialize(
            "GET",
            path,
            query_params=list(params.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(method, url, headers, _request_timeout=timeout)
        except self.api_exception as exc:  # TLS failures come as status 0
            raise Unreachable(f"{path}: {exc.reason}") from None
        except self.errors as exc:
            raise Unreachable(f"{path}: {exc}") from None
        raw: urllib3.HTTPResponse = response.response
        if not 200 <= raw.status < 300:
            try:
                body = raw.data
            except self.errors:
                body = b""
            finally:
                raw.release_conn()
            raise parse_status(raw.status, body)
        return raw


class Stream:
    """One watch response, read line by line; ``close()`` from another thread ends a read
    that is waiting (the socket is shut down)."""

    def __init__(
        self,
        response: urllib3.HTTPResponse,
        path: str,
        errors: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        self.response, self.path, self.errors = response, path, errors
        self.read_errors: tuple[type[BaseException], ...] = (*errors, ValueError)

    def events(self) -> Iterator[dict[str, Any]]:
        """Each event as a dict ({"type": ..., "object": {...}}); the stream's end returns."""
        pending = b""
        try:
            for chunk in self.response.stream(amt=None, decode_content=False):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield decode_event(line, self.path)
        except self.read_errors as exc:
            raise Unreachable(f"watch {self.path}: {exc}") from None
        if pending.strip():
            yield decode_event(pending, self.path)

    def close(self) -> None:
        try:
            self.response.shutdown()
        except (OSError, ValueError, RuntimeError):  # not reading, or released: nothing to end
            pass
        try:
            self.response.release_conn()
        except self.errors:
            pass


def decode_document(data: bytes, path: str) -> dict[str, Any]:
    """A JSON object, or a Status error (500 BadResponse) saying what it is not."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ApiStatus(500, "BadResponse", f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiStatus(500, "BadResponse", f"{path}: not a JSON object")
    return doc


def decode_event(line: bytes, path: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ApiStatus(500, "BadResponse", f"watch {path}: a line is not JSON: {exc}") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ApiStatus(500, "BadResponse", f"watch {path}: an event without an object")
    return event


def parse_status(code: int, body: bytes) -> ApiStatus:
    """A non-2xx answer as the Status it carries (or its HTTP code alone)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return status_error(doc, code)
    return ApiStatus(code, "HTTP", body[:200].decode("utf-8", "replace").strip())


def status_error(doc: Mapping[str, Any], code: int = 0) -> ApiStatus:
    number = doc.get("code")
    return ApiStatus(
        number if isinstance(number, int) else code,
        str(doc.get("reason") or ""),
        str(doc.get("message") or ""),
    )


__all__ = ["Api", "ApiStatus", "Stream", "Unreachable", "decode_document", "open_api"]
