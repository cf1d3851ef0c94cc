"""A single-node Slurm cluster on localhost for the test suite: munged, slurmctld and slurmd (and, for
job accounting, slurmdbd on a private MariaDB) started as daemons from a generated config in a temp dir.

Needs the Debian packages slurm-wlm and munge (slurmdbd and mariadb-server for accounting) and root, as
slurmd starts every job as its submitting user. `missing()` names what is absent, so a test can skip.
Every daemon listens on 127.0.0.1 only, on free ports; `stop()` ends the daemons it started, by pid.
For its lifetime /etc/slurm/slurm.conf links to the generated config (see DEFAULT_CONF).
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "sacct", "srun")
ACCOUNTING = ("slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db")
SBIN = ("/usr/sbin", "/sbin", "/usr/bin")
# Where Slurm's clients find the cluster's config when $SLURM_CONF is not set: the slurm executor plugin's
# job step (snakemake-executor-plugin-slurm-jobstep) clears every SLURM_* variable before its `srun`.
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing(accounting: bool = True) -> str | None:
    """Why a local Slurm cannot start here (None when it can)."""
    # the daemons may sit in an sbin folder off $PATH; the commands the test and Snakemake's executor call by
    # name must be on $PATH (.ci/bare-path hides them: a machine without Slurm)
    clients = (*CLIENTS, *(("sacctmgr",) if accounting else ()))
    daemons = (*DAEMONS, *((n for n in ACCOUNTING if n not in clients) if accounting else ()))
    absent = [n for n in daemons if not _which(n)] + [n for n in clients if not shutil.which(n)]
    if absent:
        return (
            f"no local Slurm: {', '.join(absent)} not installed "
            "(apt-get install slurm-wlm munge slurmdbd mariadb-server, as .ci/run does)"
        )
    if os.geteuid() != 0:
        return "no local Slurm: slurmd must run as root to start jobs"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return 'no slurm executor plugin: pip install -e ".[cluster]" (as .ci/run does)'
    if DEFAULT_CONF.exists():  # (a dangling link, left by a killed test run, is replaced)
        return f"no local Slurm: {DEFAULT_CONF} exists (a configured Slurm here); the test cluster will not replace it"
    return None


def requested(job_log: str) -> dict[str, str]:
    """What a job should have asked Slurm for, as sacct prints it, from the resources and threads
    Snakemake wrote in the job's Slurm log: --mem <mem_mb>, -t <runtime minutes>, --cpus-per-task <threads>."""
    res = re.search(r"resources: .*", job_log).group(0)
    mem_mb, runtime = (int(re.search(rf"\b{k}=(\d+)", res).group(1)) for k in ("mem_mb", "runtime"))
    threads = re.search(r"threads: (\d+)", job_log)
    return {
        "ReqMem": f"{mem_mb}M",
        "Timelimit": f"{runtime // 60:02d}:{runtime % 60:02d}:00",
        "ReqCPUS": threads.group(1) if threads else "1",
    }


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A LocalSlurm with job accounting for a test module; skipped where it cannot start, failed under CI
    (.ci/run installs it, so there the tests must run)."""
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("MemTotal not in /proc/meminfo")


@dataclass
class LocalSlurm:
    root: Path
    cpus: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))  # not more than the machine has
    partition: str = "cpu"
    account: str | None = "qrerase_ci"  # None: no slurmdbd, no accounting
    gpus: int = 2  # GRES gpu on the node: stand-in device files (character devices like /dev/null), no GPU
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _linked: bool = False  # DEFAULT_CONF is this cluster's link

    @property
    def env(self) -> dict[str, str]:
        """Environment for the Slurm clients (and everything they start): this cluster's slurm.conf."""
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}{self.logs()}")
        return proc

    def accounting(self) -> dict[str, dict[str, str]]:
        """Job id -> its sacct (slurmdbd) record: Account, State, ExitCode, ReqMem, Timelimit, ReqCPUS."""
        fields = ["JobID", "Account", "State", "ExitCode", "ReqMem", "Timelimit", "ReqCPUS"]
        out = self.run("sacct", "-X", "-n", "-P", "-a", "-S", "now-1days", "-o", ",".join(fields)).stdout
        return {r[0]: dict(zip(fields[1:], r[1:])) for r in (line.split("|") for line in out.splitlines() if line)}

    def logs(self) -> str:
        return "".join(
            f"\n--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted([*self.root.glob("*.log"), *self.root.glob("*.out")])
        )

    def _daemon(self, name: str, *args: str) -> None:
        """Start ``name`` in the foreground (its own session; output to <root>/<name>.out)."""
        with open(self.root / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                [_which(name), *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start ({proc.returncode}){self.logs()}")

    def _wait(self, what: str, ok, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            time.sleep(0.3)
        raise RuntimeError(f"local Slurm: {what} not ready after {timeout} s{self.logs()}")

    def _port_open(self, port: int) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    def start(self) -> LocalSlurm:
        """Start the daemons (stopping those already started if one fails) and wait for an idle node."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LocalSlurm:
        r = self.root
        r.mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o700)
        for sub in ("state", "spool", "munge", "db"):
            (r / sub).mkdir(exist_ok=True)
            os.chmod(r / sub, 0o711 if sub == "munge" else 0o700)  # munged: its socket's folder searchable
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        sock = r / "munge" / "munge.socket"
        self._daemon(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={r / 'munged.pid'}",
            f"--log-file={r / 'munged.log'}",
            f"--seed-file={r / 'munge' / 'seed'}",
        )
        self._wait("munged", sock.exists)
        host = socket.gethostname().split(".")[0]
        user = getpass.getuser()
        auth = ["AuthType=auth/munge", f"AuthInfo=socket={sock}", f"SlurmUser={user}"]
        conf = [
            "ClusterName=qrerase",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            *auth,
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups (containers, CI)
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/linux",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",  # CPUs and memory are the consumable resources
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "MinJobAge=600",
            "JobCompType=jobcomp/none",
            # RealMemory below what slurmd measures (a larger value drains the node)
            "GresTypes=gpu",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={int(_mem_mb() * 0.9)} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        ]
        if self.account is None:
            conf.append("AccountingStorageType=accounting_storage/none")
        else:
            dbd_port = self._start_accounting(host, auth)
            conf += [
                "AccountingStorageTRES=gres/gpu",  # sacct's AllocTRES counts the GPUs a job was granted
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={dbd_port}",
                f"AccountingStoragePass={sock}",  # munge socket for slurmdbd
                "AccountingStorageEnforce=associations",
            ]
        (r / "slurm.conf").write_text("\n".join(conf) + "\n")
        (r / "gres.conf").write_text(f"Name=gpu File={self._stand_in_gpus()}\n")  # read next to slurm.conf
        DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
        if DEFAULT_CONF.is_symlink() and not DEFAULT_CONF.exists():
            DEFAULT_CONF.unlink()  # a killed test run's link into its deleted temp dir
        DEFAULT_CONF.symlink_to(r / "slurm.conf")  # fails if a config appeared since missing()
        self._linked = True
        if self.account is not None:
            self.run("sacctmgr", "-i", "add", "cluster", "qrerase")
        self._daemon("slurmctld", "-D", "-f", str(r / "slurm.conf"))
        self._daemon("slurmd", "-D", "-f", str(r / "slurm.conf"))
        if self.account is not None:
            self.run("sacctmgr", "-i", "add", "account", self.account, "Cluster=qrerase", "Description=tests")
            self.run("sacctmgr", "-i", "add", "user", user, f"Account={self.account}", "Cluster=qrerase")
        self._wait("node idle", lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout)
        return self

    def _stand_in_gpus(self) -> str:
        """``self.gpus`` device files for gres.conf: character devices 1:3 (what /dev/null is), so slurmd
        sees GPU devices to schedule and bind (CUDA_VISIBLE_DEVICES) without any GPU. Returns the
        gres.conf ``File=`` range."""
        dev = self.root / "dev"
        dev.mkdir(exist_ok=True)
        for i in range(self.gpus):
            node = dev / f"nvidia{i}"
            if not node.exists():
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return f"{dev}/nvidia[0-{self.gpus - 1}]"

    def _start_accounting(self, host: str, auth: list[str]) -> int:
        """A private MariaDB (loopback only, no grant tables: nothing but slurmdbd can reach it) and slurmdbd."""
        r = self.root
        self.run(
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={r / 'db'}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            timeout=120,
        )
        db_port, dbd_port = _free_port(), _free_port()
        self._daemon(
            "mariadbd",
            "--no-defaults",
            f"--datadir={r / 'db'}",
            "--user=root",
            "--skip-grant-tables",
            "--bind-address=127.0.0.1",
            f"--port={db_port}",
            f"--socket={r / 'mariadb.sock'}",
            f"--pid-file={r / 'mariadb.pid'}",
            f"--log-error={r / 'mariadb.log'}",
            "--innodb-buffer-pool-size=64M",
            "--skip-log-bin",
        )
        self._wait("mariadb", lambda: self._port_open(db_port))
        dbd_conf = r / "slurmdbd.conf"
        dbd_conf.write_text(
            "\n".join(
                [
                    *auth,
                    f"DbdHost={host}",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={dbd_port}",
                    f"PidFile={r / 'slurmdbd.pid'}",
                    f"LogFile={r / 'slurmdbd.log'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={db_port}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )
        os.chmod(dbd_conf, 0o600)  # slurmdbd refuses a config others can read
        self._daemon("slurmdbd", "-D")  # reads slurmdbd.conf next to $SLURM_CONF
        self._wait("slurmdbd", lambda: self._port_open(dbd_port))
        return dbd_port

    def stop(self) -> None:
        """SIGTERM to each daemon this object started, in reverse order; SIGKILL after 20 s."""
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if (
            self._linked
            and DEFAULT_CONF.is_symlink()
            and DEFAULT_CONF.resolve() == (self.root / "slurm.conf").resolve()
        ):
            DEFAULT_CONF.unlink()
        self._linked = False
