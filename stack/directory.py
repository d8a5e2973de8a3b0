"""A private OpenLDAP directory for the tests and for trying sign-in through one: Debian's
slapd on a free port of 127.0.0.1, with its own database in a folder of the caller's, the
schemas people and groups are written in (inetOrgPerson, posixAccount, posixGroup), and its
root account for changes. Never the machine's own slapd (there may be none, or a site's).

    with private_directory(tmp / "ldap", "dc=trainyard,dc=test") as directory:
        directory.add(person("ada", 20001, 20001, "ada-pw", directory.suffix))

Changes go through ldapadd/ldapmodify as the root account, as an administrator makes them.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stack.redis_server import free_port

SCHEMAS = ("core", "cosine", "inetorgperson", "nis")
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")
ROOT_PASSWORD = "directory-root"  # noqa: S105 (a throwaway server's, on 127.0.0.1 only)
START_SECONDS = 20.0


def missing_tools() -> list[str]:
    """What this host lacks to run a private directory (`make directory` installs it)."""
    return [tool for tool in ("slapd", "slapadd", "ldapmodify") if shutil.which(tool) is None]


@dataclass(frozen=True)
class Directory:
    url: str
    suffix: str
    root_dn: str
    process: subprocess.Popen[bytes]

    def modify(self, ldif: str) -> None:
        """Apply `ldif` (changetype records) as the directory's administrator."""
        self._tool("ldapmodify", ldif)

    def add(self, ldif: str) -> None:
        self._tool("ldapmodify", ldif, "-a")

    def _tool(self, tool: str, ldif: str, *options: str) -> None:
        done = subprocess.run(
            [tool, "-x", "-H", self.url, "-D", self.root_dn, "-w", ROOT_PASSWORD, *options],
            input=ldif.encode(), capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.decode(errors='replace').strip()}")


def config(folder: Path, suffix: str) -> str:
    """slapd.conf for one database under `suffix`, its files in `folder`."""
    includes = "".join(f"include {SCHEMA_DIR / name}.schema\n" for name in SCHEMAS)
    return (
        f"{includes}pidfile {folder / 'slapd.pid'}\n"
        f"modulepath {MODULE_DIR}\nmoduleload back_mdb\n"
        f'database mdb\nmaxsize 104857600\nsuffix "{suffix}"\n'
        f'rootdn "cn=admin,{suffix}"\nrootpw {ROOT_PASSWORD}\n'
        f"directory {folder / 'db'}\n"
        # People read their own entry and bind with their password; nobody reads another's
        # password; the rest is readable by those who are signed in (the console's account).
        "access to attrs=userPassword by self write by anonymous auth by * none\n"
        "access to * by users read by * none\n"
    )


def base_entries(suffix: str) -> str:
    top = suffix.split(",")[0].split("=")[1]
    return (
        f"dn: {suffix}\nobjectClass: dcObject\nobjectClass: organization\no: {top}\ndc: {top}\n\n"
        f"dn: ou=people,{suffix}\nobjectClass: organizationalUnit\nou: people\n\n"
        f"dn: ou=groups,{suffix}\nobjectClass: organizationalUnit\nou: groups\n\n"
    )


def person(name: str, uid: int, gid: int, password: str, suffix: str) -> str:
    """A person's entry, as a site's directory holds one (posixAccount: their Unix identity)."""
    return (
        f"dn: uid={name},ou=people,{suffix}\nobjectClass: inetOrgPerson\n"
        f"objectClass: posixAccount\nobjectClass: shadowAccount\nuid: {name}\ncn: {name.title()}\n"
        f"givenName: {name.title()}\nsn: Tester\nmail: {name}@example.org\n"
        f"uidNumber: {uid}\ngidNumber: {gid}\n"
        f"homeDirectory: /home/{name}\nuserPassword: {password}\n\n"
    )


def group(name: str, gid: int, members: list[str], suffix: str) -> str:
    member_lines = "".join(f"memberUid: {m}\n" for m in members)
    return (
        f"dn: cn={name},ou=groups,{suffix}\nobjectClass: posixGroup\ncn: {name}\n"
        f"gidNumber: {gid}\n{member_lines}\n"
    )


@contextlib.contextmanager
def private_directory(folder: Path, suffix: str = "dc=trainyard,dc=test") -> Iterator[Directory]:
    """A slapd of our own, started with the base entries (ou=people, ou=groups), stopped on
    the way out by the PID it was started with."""
    (folder / "db").mkdir(parents=True, exist_ok=True)
    conf = folder / "slapd.conf"
    conf.write_text(config(folder, suffix))
    loaded = subprocess.run(
        ["slapadd", "-f", str(conf)], input=base_entries(suffix).encode(),
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if loaded.returncode != 0:
        raise RuntimeError(f"slapadd failed: {loaded.stderr.decode(errors='replace').strip()}")
    port = free_port()
    url = f"ldap://127.0.0.1:{port}"
    # -d 0: in the foreground, so that it is this process's child and stops with it.
    process = subprocess.Popen(
        ["slapd", "-f", str(conf), "-h", f"{url}/", "-d", "0"],
        stdout=subprocess.DEVNULL, stderr=(folder / "slapd.log").open("wb"),
    )  # fmt: skip
    directory = Directory(url, suffix, f"cn=admin,{suffix}", process)
    try:
        _wait_until_it_answers(directory)
        yield directory
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(10)


def _wait_until_it_answers(directory: Directory) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if directory.process.poll() is not None:
            raise RuntimeError(f"slapd exited with code {directory.process.returncode}")
        probe = subprocess.run(
            ["ldapwhoami", "-x", "-H", directory.url, "-D", directory.root_dn,
             "-w", ROOT_PASSWORD],
            capture_output=True, timeout=10, check=False,
        )  # fmt: skip
        if probe.returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"slapd at {directory.url} did not answer within {START_SECONDS:.0f} s")
