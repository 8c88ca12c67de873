"""The Rust extension: the ``user`` command line and the proxy and owner programs."""

from typing import List, Tuple

OUTPUT_FILES: List[str]

class StudyError(Exception):
    """A study refused or failed; the message is the command line's, cause chain
    included."""

def run_user(args: List[str], launcher: List[str]) -> str:
    """Runs ``user ARGS`` (``local`` or ``study``) in this process; the proxy and
    owner programs it starts are ``launcher + [role]``. Returns study.json's text.
    Raises ``ValueError`` for arguments the command line refuses, ``StudyError``
    for a study that fails, ``KeyboardInterrupt`` on Ctrl-C (after stopping every
    process it started)."""

def role_main(role: str, args: List[str]) -> int:
    """Runs the ``proxy`` or ``owner`` program with ``args``; returns its exit code."""

def contribute(args: List[str], rows: bytes) -> Tuple[str, List[str]]:
    """Runs ``owner ARGS`` on ``rows``, the table's CSV bytes held in memory
    (``--data`` only names it); returns the owner's report as JSON and the
    warnings the program would print (rows clipped, a budget cap above the one
    held)."""

def dev_certs(out: str, proxy_hosts: List[str], users: List[str], owners: List[str]) -> None:
    """Writes a development CA and every party's certificate into ``out``."""
