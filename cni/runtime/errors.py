"""Runtime-side errors: which plugin of the list failed, and joined errors (GC).

Both keep the CNI code of the underlying error, so a caller can still act on it (11 → retry,
50/51 → node not ready) while the message says where it happened.
"""

from __future__ import annotations

from cni.spec.errors import CNIError


class PluginFailed(CNIError):
    """Plugin `plugin_type` (position `index` of `total` in the list) failed `verb`."""

    def __init__(
        self, cause: CNIError, plugin_type: str, verb: str, index: int = 0, total: int = 1
    ) -> None:
        super().__init__(cause.msg, cause.details)
        self.code = cause.code
        self.cause = cause
        self.plugin_type = plugin_type
        self.verb = verb
        self.index = index
        self.total = total

    @property
    def where(self) -> str:
        position = f" (plugin {self.index + 1} of {self.total})" if self.total > 1 else ""
        return f'plugin "{self.plugin_type}"{position} failed ({self.verb})'

    def __str__(self) -> str:
        return f"{self.where}: {CNIError.__str__(self)}"


class JoinedErrors(CNIError):
    """Several errors from one operation that keeps going past errors (GC)."""

    def __init__(self, errors: list[CNIError]) -> None:
        super().__init__(str(errors[0]), "; ".join(str(e) for e in errors[1:]))
        self.code = errors[0].code
        self.errors = errors

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def join_errors(errors: list[CNIError]) -> CNIError | None:
    if not errors:
        return None
    return errors[0] if len(errors) == 1 else JoinedErrors(errors)
