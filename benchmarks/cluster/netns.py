"""A cluster of N Ray nodes on one Linux machine, each in its own network namespace
behind a link shaped to a given rate, so every byte between nodes crosses a real,
rate-limited network path (docs/guide/benchmarks.md, "A shaped cluster on one machine").

Layout: one namespace per node (``eth0`` with ``10.77.0.<i+1>/24``, ``lo``), all joined
by a bridge that lives in a namespace of its own (the "switch"), so the machine's own
network namespace gets no address, route or interface. Node ``i``'s link is its veth
pair; its uplink is shaped on the node side (``eth0`` egress), its downlink on the switch
side, both with htb at ``link_mb_per_s`` (MB = 2^20 bytes, as the paper's dispatch
figures and ``mindrl.planner.sample_flow``). netem is not used: this kernel does not have
it, so links add no latency beyond the veth's own.

Each link's htb has four classes sharing its rate, so its byte counters say what crossed
it: Ray's object transfers (the object manager port: payloads over 100 KiB), the dock's
actors (their worker ports, registered once the dock has started), collectives (gloo's
connections: both ports ephemeral) and the rest of Ray (control, task calls).

Everything is torn down on exit, also after Ctrl-C or an error: the processes inside
the namespaces (found with ``ip netns pids``), the namespaces (their veths and the bridge
go with them) and the temporary folder (Ray's session, logs, the address file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(sys.executable)
SUBNET = "10.77.0"
HEAD_PORT = 6379
#: Ray's fixed ports on every node (each namespace has its own port space). All below
#: the kernel's ephemeral range, so a connection with two ephemeral ports is a
#: collective's (gloo, the TCP store), never Ray's.
OBJECT_MANAGER_PORT = 8076
RAY_PORTS = {
    "--object-manager-port": OBJECT_MANAGER_PORT,
    "--node-manager-port": 8077,
    "--dashboard-agent-listen-port": 8078,
    "--dashboard-agent-grpc-port": 8079,
    "--metrics-export-port": 8080,
    "--runtime-env-agent-port": 8081,
    "--min-worker-port": 10002,
    "--max-worker-port": 10999,
}
EPHEMERAL_PORT_BIT = 0x8000  # Linux's ephemeral ports are 32768-60999
#: htb classes of every link: name -> minor class id (1:<id>); "ray" takes the rest.
TRAFFIC_CLASSES = {"objects": 10, "dock": 20, "collective": 30, "ray": 40}
DEFAULT_CLASS = "ray"
MTU = 9000  # fewer packets per byte: the two cores move the bytes, not the headers
#: The systems the cluster benchmark compares, by the dock kind each is built as (here,
#: not in flow.py, so the parent process reads it without importing Ray and the dock).
DOCK_KINDS = {"td": "distributed", "central": "central"}
NODE_READY_TIMEOUT_S = 120.0
KILL_WAIT_S = 10.0
#: Ray re-requests an object whose transfer outlives 10 s; on a slow link shared by
#: several pulls a 5 MiB chunk takes longer, and the node sends it again (measured at
#: 1 MB/s, 8 nodes: 20-40 % more object bytes than the flow moves). Give transfers time.
OBJECT_TRANSFER_TIMEOUT_MS = 600_000


class ClusterUnavailable(RuntimeError):
    """This machine cannot build a shaped cluster; the message is one line saying why."""


def unavailable_reason() -> str | None:
    """Why a shaped cluster cannot be built here, in one line, or None when it can: needs
    root, ``ip netns`` and tc's htb (checked by building and removing a probe namespace
    with a shaped veth)."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "a shaped cluster needs Linux network namespaces; this is not Linux"
    if os.geteuid() != 0:
        return "a shaped cluster needs root (ip netns, veth pairs, tc): run as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"a shaped cluster needs `{tool}` (iproute2): install iproute2"
    name = f"mrlprobe{os.getpid()}{secrets.token_hex(2)}"
    try:
        _run(["ip", "netns", "add", name])
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed ({_first_line(exc)}): network namespaces are unavailable"
    try:
        _run(["ip", "-n", name, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"])
        _run(["tc", "-n", name, "qdisc", "add", "dev", "pa", "root", "handle", "1:", "htb"])
    except subprocess.CalledProcessError as exc:
        return f"tc cannot shape a veth here ({_first_line(exc)}): needs veth and htb"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _first_line(exc: subprocess.CalledProcessError) -> str:
    text = (exc.stderr or exc.stdout or "").strip()
    return text.splitlines()[0] if text else f"exit {exc.returncode}"


def _run(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


@dataclass
class LinkBytes:
    """Bytes that crossed each node's link, per direction and per traffic class."""

    up: list[int]  # node i -> switch
    down: list[int]  # switch -> node i
    up_classes: list[dict[str, int]] = field(default_factory=list)
    down_classes: list[dict[str, int]] = field(default_factory=list)

    def __sub__(self, before: LinkBytes) -> LinkBytes:
        def minus(a: list[dict[str, int]], b: list[dict[str, int]]) -> list[dict[str, int]]:
            if not a or not b:
                return []
            return [{k: x[k] - y.get(k, 0) for k in x} for x, y in zip(a, b, strict=True)]

        return LinkBytes(
            [a - b for a, b in zip(self.up, before.up, strict=True)],
            [a - b for a, b in zip(self.down, before.down, strict=True)],
            minus(self.up_classes, before.up_classes),
            minus(self.down_classes, before.down_classes),
        )

    def busiest(self) -> tuple[int, str, int]:
        """(bytes, "up" / "down", node) of the most loaded link direction."""
        directions = [(b, "up", i) for i, b in enumerate(self.up)]
        directions += [(b, "down", i) for i, b in enumerate(self.down)]
        return max(directions)

    def as_dict(self) -> dict:
        return {
            "up": self.up,
            "down": self.down,
            "up_classes": self.up_classes,
            "down_classes": self.down_classes,
        }


@dataclass
class ShapedCluster:
    """N namespaced Ray nodes behind shaped links (module docstring). Use as a context
    manager: ``with ShapedCluster(4, 25.0) as cluster: cluster.run_on(0, [...])``.

    Args:
        nodes: how many nodes; node 0 is Ray's head (and where drivers run).
        link_mb_per_s: each link's rate per direction; None leaves links unshaped.
        cpus: Ray CPU slots per node, one entry per node or one for all.
        object_store_mb: each node's object store.
        resources: extra Ray resources per node (``cluster_node_<i>: 1`` is always set,
            so work can be pinned to a node).
        start_ray: start the Ray nodes (False: the network alone).
    """

    nodes: int
    link_mb_per_s: float | None = None
    cpus: int | Sequence[int] = 1
    object_store_mb: int = 96
    resources: Sequence[dict[str, float]] | None = None
    start_ray: bool = True
    token: str = field(default_factory=lambda: f"{os.getpid()}{secrets.token_hex(2)}")
    tmp: Path | None = None
    _made: list[str] = field(default_factory=list)

    # ---- names ------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"mrc{self.token}sw"

    def namespace(self, node: int) -> str:
        return f"mrc{self.token}n{node}"

    @staticmethod
    def address(node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def head_address(self) -> str:
        return f"{self.address(0)}:{HEAD_PORT}"

    @staticmethod
    def switch_port(node: int) -> str:
        return f"port{node}"

    # ---- life cycle -------------------------------------------------------------------
    def __enter__(self) -> ShapedCluster:
        reason = unavailable_reason()
        if reason:
            raise ClusterUnavailable(reason)
        previous = signal.getsignal(signal.SIGTERM)
        # A SIGTERM becomes an exception, so the teardown below runs for it as for Ctrl-C.
        signal.signal(signal.SIGTERM, _raise_system_exit)
        self._previous_sigterm = previous
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=f"mindrl-cluster-{self.token}-"))
            self._build_network()
            self.shape(self.link_mb_per_s)
            if self.start_ray:
                self._start_ray()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.teardown()

    def teardown(self) -> None:
        """Kill every process in the namespaces, delete them, remove the temporary folder.
        Safe to call twice; never raises."""
        for name in reversed(self._made):
            _kill_namespace_processes(name)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if hasattr(self, "_previous_sigterm"):
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            del self._previous_sigterm

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after teardown): namespaces, processes
        started with its environment, its temporary folder."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left = [line.split()[0] for line in listed.splitlines() if f"mrc{self.token}" in line]
        marker = f"mindrl-cluster-{self.token}-".encode()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if marker in environ.read_bytes():
                    left.append(f"process {environ.parent.name}")
        if self.tmp is not None and self.tmp.exists():
            left.append(str(self.tmp))
        return left

    # ---- network ----------------------------------------------------------------------
    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._made.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        # IPv4 only: no IPv6 neighbour discovery or multicast on the links' counters.
        _run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"])  # fmt: skip

    def _build_network(self) -> None:
        self._add_namespace(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "mtu", str(MTU), "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for node in range(self.nodes):
            ns, port = self.namespace(node), self.switch_port(node)
            self._add_namespace(ns)
            # Both ends are created inside their namespaces: nothing appears in the
            # machine's own namespace, even for a moment.
            _run(["ip", "-n", self.switch, "link", "add", port, "mtu", str(MTU), "type",
                  "veth", "peer", "name", "eth0", "netns", ns])  # fmt: skip
            _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "mtu", str(MTU), "up"])

    def _link_ends(self, node: int) -> list[tuple[str, str]]:
        """(namespace, device) of node ``node``'s uplink and downlink qdiscs."""
        return [(self.namespace(node), "eth0"), (self.switch, self.switch_port(node))]

    def shape(self, link_mb_per_s: float | None) -> None:
        """(Re)shape every link to ``link_mb_per_s`` per direction; None: unshaped (the
        classes stay, at a rate no link here reaches, so the counters still split)."""
        self.link_mb_per_s = link_mb_per_s
        rate_bits = int((link_mb_per_s or 100_000) * 2**20 * 8)
        for node in range(self.nodes):
            for ns, dev in self._link_ends(node):
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)  # fmt: skip
                self._add_htb(ns, dev, rate_bits)
        self._filters_ready = False
        self._classify_base()

    def _add_htb(self, ns: str, dev: str, rate_bits: int) -> None:
        default = TRAFFIC_CLASSES[DEFAULT_CLASS]
        tc = ["tc", "-n", ns]
        _run([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
              "default", str(default)])  # fmt: skip
        # burst >= a GSO segment (64 KiB), so htb never splits one; quantum set so htb
        # does not warn at low rates.
        shape = ["burst", "256k", "cburst", "256k", "quantum", "200000"]
        _run([*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
              "rate", f"{rate_bits}bit", "ceil", f"{rate_bits}bit", "burst", "256k",
              "cburst", "256k"])  # fmt: skip
        share = max(rate_bits // len(TRAFFIC_CLASSES), 8000)
        for minor in TRAFFIC_CLASSES.values():
            _run([*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{minor}",
                  "htb", "rate", f"{share}bit", "ceil", f"{rate_bits}bit", *shape])  # fmt: skip

    def _filter(self, ns: str, dev: str, prio: int, matches: list[str], cls: str) -> None:
        _run(["tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
              "prio", str(prio), "u32", "match", "ip", "protocol", "6", "0xff", *matches,
              "flowid", f"1:{TRAFFIC_CLASSES[cls]}"])  # fmt: skip

    def _classify_base(self) -> None:
        port = str(OBJECT_MANAGER_PORT)
        bit = hex(EPHEMERAL_PORT_BIT)
        for node in range(self.nodes):
            for ns, dev in self._link_ends(node):
                self._filter(ns, dev, 3, ["match", "ip", "sport", port, "0xffff"], "objects")
                self._filter(ns, dev, 3, ["match", "ip", "dport", port, "0xffff"], "objects")
                both = ["match", "ip", "sport", bit, bit, "match", "ip", "dport", bit, bit]
                self._filter(ns, dev, 4, both, "collective")

    def classify_dock(self, endpoints: Sequence[tuple[str, int]]) -> None:
        """Count traffic to and from these ``(ip, port)`` worker endpoints (the dock's
        warehouses and controllers) as class "dock" on every link."""
        for ip, port in endpoints:
            to = ["match", "ip", "dst", f"{ip}/32", "match", "ip", "dport", str(port), "0xffff"]
            back = ["match", "ip", "src", f"{ip}/32", "match", "ip", "sport", str(port), "0xffff"]
            for node in range(self.nodes):
                for ns, dev in self._link_ends(node):
                    self._filter(ns, dev, 2, to, "dock")
                    self._filter(ns, dev, 2, back, "dock")

    def link_bytes(self) -> LinkBytes:
        """Bytes each link has carried so far, per direction and traffic class (from the
        switch ports' counters and the htb classes)."""
        out = _run(["ip", "-n", self.switch, "-s", "-j", "link", "show"]).stdout
        stats = {d["ifname"]: d["stats64"] for d in json.loads(out)}
        up, down, up_cls, down_cls = [], [], [], []
        for node in range(self.nodes):
            port = stats[self.switch_port(node)]
            up.append(port["rx"]["bytes"])  # what the switch received from node i
            down.append(port["tx"]["bytes"])
            (ns_up, dev_up), (ns_down, dev_down) = self._link_ends(node)
            up_cls.append(_class_bytes(ns_up, dev_up))
            down_cls.append(_class_bytes(ns_down, dev_down))
        return LinkBytes(up, down, up_cls, down_cls)

    # ---- Ray --------------------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        """The environment of every process of this cluster."""
        # Nothing of a Ray session this process may belong to (pytest's shared one).
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            RAY_TMPDIR=str(self.tmp),  # the session and Ray's address file stay in tmp
            RAY_AUTH_MODE="disabled",  # its network is the namespaces' own bridge
            RAY_USAGE_STATS_ENABLED="0",
            RAY_ADDRESS=self.head_address,
            RAY_worker_niceness="0",
            GLOO_SOCKET_IFNAME="eth0",  # collectives between nodes go over the link
            RAY_object_manager_pull_timeout_ms=str(OBJECT_TRANSFER_TIMEOUT_MS),
            RAY_object_manager_push_timeout_ms=str(OBJECT_TRANSFER_TIMEOUT_MS),
            PYTHONPATH=str(ROOT),
        )
        return env

    def _ray_start(self, node: int) -> subprocess.Popen:
        cpus = self.cpus if isinstance(self.cpus, int) else self.cpus[node]
        resources = {f"cluster_node_{node}": 1.0}
        if self.resources:
            resources |= self.resources[node]
        argv = [str(PYTHON.parent / "ray"), "start", "--node-ip-address", self.address(node),
                "--num-cpus", str(cpus), "--object-store-memory",
                str(self.object_store_mb * 2**20), "--resources", json.dumps(resources),
                "--disable-usage-stats", "--include-log-monitor=false"]  # fmt: skip
        for flag, port in RAY_PORTS.items():
            argv += [flag, str(port)]
        if node == 0:
            # No dashboard or autoscaler monitor: fewer processes to start
            # and less chatter on node 0's link.
            argv += ["--head", "--port", str(HEAD_PORT), "--include-dashboard=false",
                     "--no-monitor",
                     "--temp-dir", str(self.tmp / "ray")]  # fmt: skip
        else:
            argv += ["--address", self.head_address]
        log = open(self.tmp / f"ray_start_{node}.log", "w")  # noqa: SIM115 (closed by the process)
        return self.popen(node, argv, stdout=log, stderr=subprocess.STDOUT)

    def _start_ray(self) -> None:
        # One node at a time: several raylets registering at once on two busy cores
        # outlive Ray's own start-up deadline.
        for node in range(self.nodes):
            self._wait_started(self._ray_start(node), node)

    def _wait_started(self, proc: subprocess.Popen, node: int) -> None:
        try:
            code = proc.wait(timeout=NODE_READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            log = (self.tmp / f"ray_start_{node}.log").read_text()
            tail = " | ".join(log.strip().splitlines()[-2:])
            raise ClusterUnavailable(f"Ray node {node} did not start: {tail}")

    def popen(self, node: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside node ``node``'s namespace with the cluster's environment."""
        kwargs.setdefault("env", self.environment())
        kwargs.setdefault("cwd", ROOT)
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(node), *argv], **kwargs)

    def run_on(self, node: int, argv: Sequence[str], timeout_s: float | None = None,
               **kwargs) -> subprocess.CompletedProcess:  # fmt: skip
        """Run ``argv`` inside node ``node``'s namespace and wait; output captured."""
        proc = self.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


#: A driver inside a node prints its report on one line after this marker: Ray's own
#: warnings reach the same stdout.
REPORT_MARKER = "mindrl-cluster-report: "


def report_line(stdout: str) -> dict | None:
    """The report a driver printed with :data:`REPORT_MARKER`, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(REPORT_MARKER):
            return json.loads(line[len(REPORT_MARKER) :])
    return None


#: The dock's actor classes, whose worker ports :meth:`ShapedCluster.classify_dock` takes.
DOCK_ACTORS = ("TDWarehouse", "TDControllers", "CentralBuffer")


def dock_endpoints() -> list[tuple[str, int]]:
    """From a driver of the cluster: ``(ip, port)`` of every live dock actor, from Ray's
    actor table (its worker's gRPC server: every call to the actor arrives there)."""
    import ray

    return [
        (a["Address"]["IPAddress"], int(a["Address"]["Port"]))
        for a in ray._private.state.actors().values()
        if a["ActorClassName"] in DOCK_ACTORS and a["State"] == "ALIVE"
    ]


def _class_bytes(ns: str, dev: str) -> dict[str, int]:
    # tc here prints htb classes as text even with -j: "class htb 1:20 ..." then " Sent N bytes".
    out = _run(["tc", "-n", ns, "-s", "class", "show", "dev", dev]).stdout
    by_id = dict(re.findall(r"^class htb (\S+) .*\n Sent (\d+) bytes", out, re.MULTILINE))
    return {name: int(by_id.get(f"1:{minor}", 0)) for name, minor in TRAFFIC_CLASSES.items()}


def _kill_namespace_processes(name: str) -> None:
    """KILL every process inside namespace ``name`` and wait until they are gone. Nothing
    in a disposable cluster needs a graceful stop: its files go with the folder."""

    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    deadline = time.monotonic() + KILL_WAIT_S
    while (alive := pids()) and time.monotonic() < deadline:
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _raise_system_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def refused_in_one_line() -> Iterator[None]:
    """Turn :class:`ClusterUnavailable` into one line on stderr and exit status 2."""
    try:
        yield
    except ClusterUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
