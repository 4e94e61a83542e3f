"""What must hold whatever the input, so a runtime can always act on it: one reply, a known
code, a clean log.

``judge_output`` checks what an executable printed (or what pycnid replied): exactly one JSON
object, a result for a successful ADD, nothing for another successful verb, a spec error with
a known code and a non-empty ``msg`` otherwise. ``LogWatch`` reads what pycnid logged since
the last look and refuses a stack (a ``Traceback`` or an ``exc`` field).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SPEC_CODES = {1, 2, 3, 4, 5, 6, 7, 11, 50, 51}
INTERNAL = 999


def known_code(code: object) -> bool:
    """A spec code or a plugin-specific one (100+); 999 is an internal error, never bad input."""
    return (
        isinstance(code, int)
        and not isinstance(code, bool)
        and (code in SPEC_CODES or 100 <= code < INTERNAL)
    )


@dataclass(frozen=True)
class Verdict:
    ok: bool  # the request succeeded
    value: dict | None  # the JSON printed (result or error), None when nothing was printed


def parse_one_object(stdout: str) -> dict:
    text = stdout.strip()
    assert text, "nothing on stdout"
    decoder = json.JSONDecoder()
    value, end = decoder.raw_decode(text)
    assert end == len(text), f"more than one JSON value on stdout: {stdout!r}"
    assert isinstance(value, dict), f"stdout is not a JSON object: {stdout!r}"
    return value


def judge_output(command: str, exit_code: int, stdout: str, stderr: str = "") -> Verdict:
    assert "Traceback" not in stderr, f"traceback on stderr:\n{stderr}"
    assert "Traceback" not in stdout, f"traceback on stdout:\n{stdout}"
    if exit_code == 0:
        if command == "ADD":
            result = parse_one_object(stdout)
            assert isinstance(result.get("cniVersion"), str), f"ADD result: {stdout!r}"
            assert "code" not in result, f"exit 0 with an error: {stdout!r}"
            return Verdict(True, result)
        if command == "VERSION":
            info = parse_one_object(stdout)
            assert info.get("supportedVersions"), f"VERSION answer: {stdout!r}"
            return Verdict(True, info)
        assert stdout.strip() == "", f"{command} succeeded but printed {stdout!r}"
        return Verdict(True, None)
    error = parse_one_object(stdout)
    assert known_code(error.get("code")), f"unknown or internal error code: {stdout!r}"
    assert isinstance(error.get("msg"), str) and error["msg"].strip(), f"empty msg: {stdout!r}"
    assert exit_code != 0
    return Verdict(False, error)


class LogWatch:
    """pycnid's JSON-lines log, read incrementally."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.skip()

    def skip(self) -> None:
        with open(self.path, "rb") as fh:
            fh.seek(0, 2)
            self.offset = fh.tell()

    def new_lines(self) -> list[str]:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        return data.decode("utf-8", "replace").splitlines()

    def assert_no_stack(self, context: str) -> None:
        lines = self.new_lines()
        for line in lines:
            assert "Traceback" not in line, f"pycnid logged a stack for {context}:\n{line}"
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise AssertionError(
                    f"pycnid wrote a non-JSON log line for {context}: {line!r}"
                ) from exc
            assert "exc" not in entry, f"pycnid logged an exception for {context}:\n{line}"
