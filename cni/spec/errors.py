"""CNI errors, each carrying its spec code from where it is raised.

They become the spec's JSON exactly once: in the daemon's reply (``pycnid.server``) or in
the executable (``cni.exe``).
"""

from __future__ import annotations


class CNIError(Exception):
    """An error the CNI spec can express: a code, a short message and details."""

    code = 999

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str | None = None) -> dict:
        out: dict = {}
        if cni_version:
            out["cniVersion"] = cni_version
        out["code"] = self.code
        out["msg"] = self.msg
        if self.details:
            out["details"] = self.details
        return out

    def to_json(self, cni_version: str | None = None) -> str:
        import json  # lazily: the executable's fast path never renders an error

        return json.dumps(self.to_dict(cni_version), indent=4)

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg


class IncompatibleVersion(CNIError):
    code = 1


class UnsupportedField(CNIError):
    code = 2


class UnknownContainer(CNIError):
    code = 3


class InvalidEnvironment(CNIError):
    code = 4


class IOFailure(CNIError):
    code = 5


class DecodingFailure(CNIError):
    code = 6


class InvalidConfig(CNIError):
    code = 7


class TryAgainLater(CNIError):
    code = 11


class NotAvailable(CNIError):
    """STATUS: the plugin cannot service ADD now."""

    code = 50


class NotAvailableDegraded(CNIError):
    """STATUS: not available, and existing containers may have degraded connectivity."""

    code = 51


class InternalError(CNIError):
    code = 999


# Plugin-specific codes (100+).
class CheckFailed(CNIError):
    """CHECK found live state that differs from prevResult."""

    code = 100


class AddressExhausted(CNIError):
    """No address left to hand out."""

    code = 101


class AddressConflict(CNIError):
    """A requested address is held by another attachment."""

    code = 102


class AttachmentExists(CNIError):
    """ADD found the attachment's interfaces already there (ADD repeated without DEL, or
    CNI_IFNAME already taken in the pod)."""

    code = 103


class NodeChangeFailed(CNIError):
    """The kernel refused a network change (netlink, sysctl, nftables); the message names the
    step and the kernel's reason."""

    code = 104


class CleanupIncomplete(CNIError):
    """DEL or GC removed what it could; the message lists what is left and why."""

    code = 105


class DelegateFailed(CNIError):
    """The delegated IPAM plugin failed without a CNI error, or printed an unreadable result."""

    code = 106


BY_CODE: dict[int, type[CNIError]] = {
    cls.code: cls
    for cls in (
        IncompatibleVersion,
        UnsupportedField,
        UnknownContainer,
        InvalidEnvironment,
        IOFailure,
        DecodingFailure,
        InvalidConfig,
        TryAgainLater,
        NotAvailable,
        NotAvailableDegraded,
        CheckFailed,
        AddressExhausted,
        AddressConflict,
        AttachmentExists,
        NodeChangeFailed,
        CleanupIncomplete,
        DelegateFailed,
    )
}


def error_from_dict(data: dict) -> CNIError:
    """Rebuild an error from its spec JSON (as another plugin or the daemon printed it)."""
    code = int(data.get("code", 999))
    cls = BY_CODE.get(code, CNIError)
    err = cls(str(data.get("msg", "")), str(data.get("details", "")))
    err.code = code
    return err
