"""Validation of the CNI_* environment with nothing but builtins.

The executable runs this on every call before it talks to pycnid, so it must not import
anything (not even `re`: importing it costs ~2 ms, a tenth of our whole budget).
Each function returns an error as (code, msg, details) or None.
"""

COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
ATTACHMENT_VERBS = ("ADD", "DEL", "CHECK")
ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.\\-]*$"
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_ID_REST = _ALNUM | frozenset("_.-")


def valid_id(text):
    """CNI_CONTAINERID and network names: ^[A-Za-z0-9][A-Za-z0-9_.\\-]*$"""
    return bool(text) and text[0] in _ALNUM and all(c in _ID_REST for c in text)


IFNAMSIZ = 16  # the kernel's buffer for an interface name, its NUL included


def check_ifname(name):
    if not name:
        return 4, "required env variable CNI_IFNAME is missing", ""
    size = len(name.encode("utf-8", "surrogateescape"))
    if size >= IFNAMSIZ:
        return 4, "invalid CNI_IFNAME", f"{name!r} is {size} bytes in UTF-8, at most 15 allowed"
    if name in (".", "..") or "/" in name or ":" in name or any(c.isspace() for c in name):
        return 4, "invalid CNI_IFNAME", f"{name!r}: no '/', ':', whitespace, '.' or '..'"
    return None


def check_cni_args(text):
    for pair in text.split(";"):
        pair = pair.strip()
        if pair and (not pair.partition("=")[1] or pair.startswith("=")):
            return 4, "invalid CNI_ARGS", f"pair {pair!r} is not KEY=VALUE"
    return None


def check_utf8(environ):
    """os.environ keeps bytes that are not UTF-8 as surrogate escapes, which cannot be sent."""
    for key, value in environ.items():
        if key.startswith("CNI_"):
            for text in (key, value):
                if not is_utf8(text):
                    raw = text.encode("utf-8", "surrogateescape")[:64]
                    name = key if is_utf8(key) else "CNI_* variable name"
                    return 4, f"invalid {name}", f"{raw!r} is not valid UTF-8"
    return None


def is_utf8(text):
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_env(environ):
    """The first problem with the CNI_* variables for this verb, or None."""
    command = environ.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        return (
            4,
            "unknown CNI_COMMAND",
            f"CNI_COMMAND={command!r}, expected one of {', '.join(COMMANDS)}",
        )
    problem = check_utf8(environ)
    if problem:
        return problem
    if command not in ATTACHMENT_VERBS:
        return None
    cid = environ.get("CNI_CONTAINERID", "")
    if not cid:
        return 4, "required env variable CNI_CONTAINERID is missing", ""
    if not valid_id(cid):
        return 4, "invalid CNI_CONTAINERID", f"{cid!r} must match {ID_PATTERN}"
    if command != "DEL" and not environ.get("CNI_NETNS"):
        return 4, "required env variable CNI_NETNS is missing", ""
    return check_ifname(environ.get("CNI_IFNAME", "")) or check_cni_args(
        environ.get("CNI_ARGS", "")
    )
