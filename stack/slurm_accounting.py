"""Slurm's accounting for the test cluster (stack/slurm.py): a MariaDB of its own and slurmdbd.

A site's Slurm records every job in slurmdbd, so that `sacct` answers for ended jobs, fair
share has usage to weigh and limits have associations to hold. The cluster runs the same
where Debian's `slurmdbd` and `mariadb-server` are installed (`make test` installs them as
root), and says why not elsewhere:

- mariadbd on a data folder of the cluster's, listening on 127.0.0.1 at a free port only, with
  one user for slurmdbd whose password is in the 0600 slurmdbd.conf (an init file, 0600 too,
  makes it at start; nothing else may log in over the network);
- slurmdbd beside slurm.conf, in the foreground, its PID recorded as the cluster's others are.

Without them the cluster runs as before: AccountingStorageType=accounting_storage/none.
"""

import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stack.redis_server import free_port

PACKAGES = ("slurmdbd", "mariadb-server")
BINARIES = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")
DATABASE = "slurm_acct_db"
DB_USER = "slurm"


def missing_reason(what: str, binaries: tuple[str, ...], packages: tuple[str, ...]) -> str | None:
    """Why `what` cannot run here for want of its programs (None: they are all there)."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        return f"{what} ({', '.join(missing)} missing): apt-get install {' '.join(packages)}"
    return None


def unavailable_reason() -> str | None:
    return missing_reason("no Slurm accounting here", BINARIES, PACKAGES)


@dataclass
class Accounting:
    root: Path  # the cluster's folder
    dbd_port: int
    db_port: int
    db_password: str

    @classmethod
    def plan(cls, root: Path) -> "Accounting":
        return cls(root, free_port(), free_port(), secrets.token_urlsafe(18))

    def conf_lines(self, munge_socket: Path) -> list[str]:
        """slurm.conf's accounting lines. AccountingStoragePass is, with munge, the socket the
        connections to slurmdbd authenticate through (AuthInfo's is not used for them)."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={munge_socket}",
        ]

    def start(
        self,
        spawn: Callable[[str, list[str], dict[str, str] | None], None],
        env: dict[str, str],
        munge_socket: Path,
        wait: Callable[[Callable[[], bool], str], None],
    ) -> None:
        """MariaDB, then slurmdbd; before slurmctld, which registers with slurmdbd."""
        data = self.root / "mysql"
        subprocess.run(
            [
                "mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                "--skip-test-db", "--auth-root-authentication-method=socket",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        init = self.root / "mysql-init.sql"
        init.touch(mode=0o600)
        init.chmod(0o600)
        init.write_text(
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self.db_password}';"
            f"\nGRANT ALL ON {DATABASE}.* TO '{DB_USER}'@'127.0.0.1';\n"
        )
        socket = self.root / "mysql.sock"
        spawn(
            "mariadbd",
            [
                "mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
                f"--socket={socket}", f"--port={self.db_port}", "--bind-address=127.0.0.1",
                "--skip-name-resolve", f"--init-file={init}",
                f"--pid-file={self.root / 'mysql.pid'}",
                f"--log-error={self.root / 'log' / 'mysql.log'}",
            ],
            None,
        )  # fmt: skip
        wait(lambda: socket.exists(), "mariadbd to open its socket")
        conf = self.root / "slurmdbd.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={munge_socket}",
                    "DbdHost=localhost",
                    f"DbdPort={self.dbd_port}",
                    "SlurmUser=root",
                    f"LogFile={self.root / 'log' / 'slurmdbd.log'}",
                    f"PidFile={self.root / 'slurmdbd.pid'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.db_port}",
                    f"StorageUser={DB_USER}",
                    f"StoragePass={self.db_password}",
                    f"StorageLoc={DATABASE}",
                ]
            )
            + "\n"
        )
        # slurmdbd reads slurmdbd.conf from SLURM_CONF's folder.
        spawn("slurmdbd", ["slurmdbd", "-D"], env)

        def answers() -> bool:
            listed = subprocess.run(
                ["sacctmgr", "--noheader", "list", "cluster"],
                env=env, capture_output=True, text=True, check=False, timeout=30,
            )  # fmt: skip
            return listed.returncode == 0

        wait(answers, "slurmdbd to answer")

    def register(self, env: dict[str, str], cluster: str) -> None:
        """The cluster in slurmdbd, before its slurmctld starts."""
        self.manage(env, "add", "cluster", cluster)

    @staticmethod
    def manage(env: dict[str, str], *words: str) -> None:
        """sacctmgr, answering yes (-i): add accounts and users, as a site's admin does."""
        subprocess.run(
            ["sacctmgr", "-i", *words], env=env, capture_output=True, text=True, check=True,
            timeout=60,
        )  # fmt: skip
