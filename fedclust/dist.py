"""The distributed edge: Lightning Fabric setup from the environment
(one process, torchrun, Slurm) and the row gather used once per round."""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import re
import socket
import sys
import time
import uuid
from typing import Any

import torch

from fedclust.errors import CollectiveError, StartupError
from fedclust.identity import RunIdentity


def world_from_env() -> tuple[int, int]:
    """(devices per node, nodes) as the launcher set them: torchrun's
    LOCAL_WORLD_SIZE/WORLD_SIZE, Slurm's task counts, else (1, 1)."""
    env = os.environ
    if "LOCAL_WORLD_SIZE" in env and "WORLD_SIZE" in env:
        local = int(env["LOCAL_WORLD_SIZE"])
        return local, max(1, int(env["WORLD_SIZE"]) // local)
    if int(env.get("SLURM_NTASKS", "1")) > 1 and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        m = re.match(r"(\d+)", per_node)
        nodes = int(env.get("SLURM_NNODES", "1"))
        local = int(m.group(1)) if m else int(env["SLURM_NTASKS"]) // nodes
        return local, nodes
    return 1, 1


def launch_rank() -> int:
    """This process's global rank as the launcher set it, before any process group: torchrun's RANK, Slurm's
    SLURM_PROCID for a job of several tasks, else 0."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"])
    local, nodes = world_from_env()
    if local * nodes > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"])
    return 0


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def import_fabric() -> tuple[Any, Any]:
    """(Fabric, DDPStrategy), imported when a run starts, not when a config is
    checked.  Two of Lightning's imports are skipped for this import only,
    when nothing has imported them yet (later imports of either work):
    its version probe imports torchmetrics (3-4 s with the torchvision it
    pulls in) only to set a flag for a callback fedclust never uses; its
    wrappers import torch._dynamo (2.1 s a process: the tracer, sympy) only
    for ``OptimizedModule``, to unwrap compiled modules handed to
    ``Fabric.setup``, which fedclust never calls.  Each rank of a
    multi-process run pays this import."""
    import types

    hidden: dict[str, Any] = {}
    if "torchmetrics" not in sys.modules:
        hidden["torchmetrics"] = None
    if "torch._dynamo" not in sys.modules:
        stand_in = types.ModuleType("torch._dynamo", "fedclust's stand-in while Lightning Fabric is imported")

        class OptimizedModule(torch.nn.Module):       # what no module of a fedclust run is
            pass

        setattr(stand_in, "OptimizedModule", OptimizedModule)
        hidden["torch._dynamo"] = stand_in
    sys.modules.update(hidden)   # None: the import fails at once
    try:
        from lightning_fabric import Fabric
        from lightning_fabric.strategies import DDPStrategy
    finally:
        for name, module in hidden.items():
            if sys.modules.get(name, 0) is module:
                del sys.modules[name]
    return Fabric, DDPStrategy


class OneProcess:
    """What the round loop asks of Fabric when the run is one process: rank 0
    of 1 on its device.  One process has no process group to set up, so it
    does not pay for importing Fabric."""

    world_size, global_rank = 1, 0

    def __init__(self, device: str):
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device(device)

    def launch(self) -> None:
        pass

    def barrier(self) -> None:
        pass


def make_fabric(device: str, timeout_seconds: float = 1800.0, startup_seconds: float = 180.0,
                identity: RunIdentity | None = None):
    """A launched Fabric for the detected environment (gloo on CPU, NCCL on
    GPU) when the launcher started several processes; a collective waits at
    most ``timeout_seconds`` for the other ranks.  The processes first wait
    at most ``startup_seconds`` for each other (:func:`startup_store`): a
    rank that died or hangs in start-up, or one of another run (``identity``:
    this rank's run directory and config digest), is named then, not after a
    collective's timeout.  One process gets :class:`OneProcess`."""
    devices, nodes = world_from_env()
    accelerator = resolve_device(device)
    if devices * nodes == 1:
        return OneProcess(accelerator)
    Fabric, DDPStrategy = import_fabric()
    timeout = datetime.timedelta(seconds=float(timeout_seconds))
    strategy = DDPStrategy(timeout=timeout)
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=nodes, strategy=strategy)
    # The process group is formed here, on a store every rank has announced itself on; Fabric's launch then
    # finds it formed and uses it.  Rank and address as Fabric's DDP strategy computes them.
    rank, world = fabric.node_rank * devices + fabric.local_rank, devices * nodes
    env = fabric.strategy.cluster_environment
    store = startup_store(env.main_address, env.main_port, rank, world, startup_seconds, timeout_seconds,
                          identity=identity, local=nodes == 1)
    kwargs: dict[str, Any] = {"device_id": torch.device("cuda", fabric.local_rank)} if accelerator == "cuda" else {}
    backend = "nccl" if accelerator == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)
    print(f"fedclust: process group formed: rank {rank} of {world} ({backend}, node {fabric.node_rank})",
          file=sys.stderr, flush=True)
    fabric.launch()
    return fabric


# The rendezvous store's keys: rank 0 publishes its RunIdentity at RUN_PREFIX/<attempt>/identity, the one key a
# rank reads before it knows it belongs to the run; everything else (each rank's start-up claim, the process
# group's own keys) lives under RUN_PREFIX/<attempt>/<rank 0's identity key>/.  <attempt>: torchrun's run id and
# restart count, "direct/0" for processes started otherwise (Slurm, by hand), then the count of runs this process
# started on that address before (0 for the first).
RUN_PREFIX = "fedclust/run"
_STARTED: dict[tuple[str, int, int], int] = {}   # (host, port, rank) -> runs this process finished there
_RUNNING: list[tuple[str, int, int]] = []         # the address of the run under way, when one is


def startup_store(host: str, port: int, rank: int, world: int, startup_seconds: float, timeout_seconds: float,
                  identity: RunIdentity | None = None, local: bool = False):
    """The run's rendezvous store (rank 0 serves it, or torchrun's agent does),
    seen through a prefix of the run's own, once every rank of the run has
    announced itself on it.  Rank 0 publishes ``identity`` (its run directory
    and config digest); every other rank compares its own with it first, and
    one of another run (another config) raises
    :class:`fedclust.errors.StartupError` naming both run directories,
    having written nothing.  A rank that cannot reach the store within
    ``startup_seconds``, that waits longer for another rank, or whose rank
    another process already took, raises it too.  ``local`` (every rank on
    this machine): rank 0 listens on ``host``'s address alone, not on every
    interface.  The store then waits up to ``timeout_seconds`` (NCCL
    exchanges its ids through it at the first collective, after every
    rank's data is read)."""
    from torch.distributed import PrefixStore

    identity = identity or RunIdentity("", "")
    fix = (f"read that rank's own output for its error; a slow start (many nodes, a slow file system) needs a "
           f"larger startup_timeout (now {startup_seconds:g} s)")
    agent = (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get("MASTER_ADDR") == host
             and os.environ.get("MASTER_PORT") == str(port))   # torchrun's agent serves the store there
    store = _open_store(host, port, rank, world, startup_seconds, fix, serve=rank == 0 and not agent, local=local)
    started = (host, int(port), rank)
    # a process may run several runs one after another on one address (a script calling fedclust.runner.run in a
    # loop under torchrun): the run after k finished ones there is keyed apart, every rank counting alike
    env = os.environ
    attempt = (f"{env.get('TORCHELASTIC_RUN_ID') or 'direct'}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
               f"/{_STARTED.get(started, 0)}")
    deadline = time.monotonic() + float(startup_seconds)
    try:
        run = _agree(store, f"{RUN_PREFIX}/{attempt}/identity", rank, identity, f"{host}:{port}", deadline,
                     f"rank {rank}: rank 0 did not start within startup_timeout = {startup_seconds:g} s: it died "
                     f"or hangs in start-up, or was never launched; {fix}")
        scoped = PrefixStore(f"{RUN_PREFIX}/{attempt}/{run.key}", store)
        _announce(scoped, rank, world, deadline, startup_seconds, f"{host}:{port}", fix)
    except (RuntimeError, torch.distributed.DistError) as exc:   # the store went away: rank 0 stopped
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StartupError(f"rank {rank}: rank 0 stopped during start-up (the run's rendezvous closed: {first}); "
                           f"{fix}") from None
    store.set_timeout(datetime.timedelta(seconds=float(timeout_seconds)))
    _RUNNING.append(started)   # counted as started there when the run finishes (finish)
    return scoped


def _open_store(host: str, port: int, rank: int, world: int, startup_seconds: float, fix: str, serve: bool,
                local: bool):
    """A TCPStore at ``host:port``: served here when ``serve`` (on ``host``'s address alone when ``local``,
    :func:`listen_socket`), else reached within ``startup_seconds``."""
    from torch.distributed import TCPStore

    wait = datetime.timedelta(seconds=float(startup_seconds))
    try:
        fd = listen_socket(host, port) if serve and local else None
        return TCPStore(host, port, world_size=world, is_master=serve, timeout=wait, wait_for_workers=False,
                        multi_tenant=True, master_listen_fd=fd)
    except (OSError, RuntimeError, torch.distributed.DistError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if serve:
            raise StartupError(f"rank 0: cannot serve the run's rendezvous at {host}:{port} ({first}); another "
                               "program holds the port, or a run's processes were started twice; free it or set "
                               "MASTER_PORT to a free port") from None
        raise StartupError(f"rank {rank}: rank 0 did not open the run's rendezvous at {host}:{port} within "
                           f"startup_timeout = {startup_seconds:g} s: it died or hangs in start-up, or was never "
                           f"started ({first}); {fix}") from None


def listen_socket(host: str, port: int) -> int | None:
    """A socket listening on ``host``'s first address that binds (not every interface, as TCPStore's own), as
    a file descriptor TCPStore takes over (``master_listen_fd``); None where ``host`` resolves to no address of
    this machine (TCPStore then listens on every interface).  A port in use raises OSError."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as TCPStore's: past TIME_WAIT, not a listener
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise
            continue
        return sock.detach()   # TCPStore closes it
    return None


def _agree(store, key: str, rank: int, identity: RunIdentity, where: str, deadline: float,
           late: str) -> RunIdentity:
    """The run's identity, rank 0's: rank 0 publishes ``identity`` at ``key``; another rank waits for it until
    ``deadline`` (else StartupError ``late``) and compares its config digest with it, writing nothing.  Another
    run's raises StartupError naming both run directories."""
    if rank == 0:
        published = store.compare_set(key, "", identity.dumps())   # a run's second rank 0 finds the first's
    else:
        while not store.check([key]):
            if time.monotonic() > deadline:
                raise StartupError(late)
            time.sleep(0.05)
        published = store.get(key)
    run = RunIdentity.loads(published)
    if run.digest != identity.digest:
        ours, theirs = identity.out or "(none)", run.out or "(none)"
        raise StartupError(f"rank {rank}: the rendezvous at {where} is another run's (out={theirs}, config "
                           f"{run.digest[:12] or 'unknown'}), not this run's (out={ours}, config "
                           f"{identity.digest[:12] or 'unknown'}): two runs share the address; start this run's "
                           "processes with another MASTER_PORT (a free port; torchrun: --master-port)")
    return run


def _announce(store, rank: int, world: int, deadline: float, startup_seconds: float, where: str, fix: str) -> None:
    """Claim this rank's place on the run's ``store`` and wait until ``deadline`` for every rank's claim; a
    place another process holds, or ranks still missing at the deadline, raise StartupError."""
    claim = f"{uuid.uuid4().hex} pid {os.getpid()} on {socket.gethostname()}"
    held = store.compare_set(f"started/{rank}", "", claim)
    held = held.decode() if isinstance(held, bytes) else str(held)
    if held != claim:
        raise StartupError(f"rank {rank}: this run's rank {rank} was already started ({held.split(' ', 1)[-1]}) at "
                           f"{where}: the run's processes were started twice, or two runs of one config share the "
                           "address; stop the copy, or start it with another MASTER_PORT (a free port)")
    keys = [f"started/{r}" for r in range(world)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            shown = ", ".join(str(r) for r in missing[:16]) + (" ..." if len(missing) > 16 else "")
            what = ("they died or hang in start-up, or were never launched" if len(missing) > 1
                    else "it died or hangs in start-up, or was never launched")
            raise StartupError(f"rank {rank}: rank{'s' if len(missing) > 1 else ''} {shown} did not start "
                               f"within startup_timeout = {startup_seconds:g} s ({world - len(missing)} of "
                               f"{world} processes did): {what}; {fix}")
        time.sleep(0.05)


class Collectives:
    """The run's collectives on one rank, each run through :meth:`run`: with
    several ranks, a collective that fails or times out (a rank died or
    hangs) becomes a :class:`fedclust.errors.CollectiveError` naming this
    rank and the round.  ``round``: the round under way, named by
    :meth:`all_reduce`'s errors (the runner sets it)."""

    def __init__(self, rank: int, world: int, timeout_seconds: float):
        self.rank, self.world, self.timeout = rank, world, float(timeout_seconds)
        self.round = 0

    def run(self, t: int, fn, *args):
        """``fn(*args)``, a collective of round ``t``."""
        try:
            return fn(*args)
        except (RuntimeError, torch.distributed.DistError) as exc:
            if self.world == 1:
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise CollectiveError(f"rank {self.rank}: a collective in round {t} failed or timed out "
                                  f"(collective_timeout = {self.timeout:g} s): another rank stopped or hangs "
                                  f"({type(exc).__name__}: {first})") from exc

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` summed into it, in place; one process: ``x`` as it is."""
        if self.world > 1:
            self.run(self.round, torch.distributed.all_reduce, x)
        return x


def finish(fabric) -> None:
    """With several processes: wait until rank 0 has written everything, then
    close the process group, so that no rank exits while the others still use
    it (gloo aborts a process whose background threads are still running)."""
    if fabric.world_size > 1:
        fabric.barrier()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        while _RUNNING:   # the next run this process starts on that address is keyed apart from this one
            done = _RUNNING.pop()
            _STARTED[done] = _STARTED.get(done, 0) + 1


def shard_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """Contiguous near-equal split of n clients: rank r holds [start, stop)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class GatherMeter:
    """Seconds, calls and bytes of :func:`gather_rows`' collectives while
    :func:`measure_gathers` is open.  ``bytes`` is the size of the gathered
    buffer each rank receives: every rank's (padded) shard, its own included."""

    def __init__(self):
        self.calls, self.seconds, self.bytes = 0, 0.0, 0

    def gather(self, fabric, rows: torch.Tensor) -> torch.Tensor:
        if rows.is_cuda:
            torch.cuda.synchronize(rows.device)       # not the work queued before it
        started = time.perf_counter()
        gathered = all_gather(rows, fabric.world_size)
        if gathered.is_cuda:
            torch.cuda.synchronize(gathered.device)   # the collective's time, not its launch
        self.calls += 1
        self.seconds += time.perf_counter() - started
        self.bytes += gathered.numel() * gathered.element_size()
        return gathered


_meter: GatherMeter | None = None   # the open measurement, if any


@contextlib.contextmanager
def measure_gathers():
    """``with measure_gathers() as meter:`` counts every gather inside the
    block (``fedclust bench-scale``); outside one, a gather costs one test."""
    global _meter
    outer, _meter = _meter, GatherMeter()
    try:
        yield _meter
    finally:
        _meter = outer


# torch >= 2.14 names the one-buffer all-gather all_gather_single (all_gather_into_tensor, its older name, warns
# on every call); older torch has only all_gather_into_tensor.
_gather_into = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor


def all_gather(rows: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's equally shaped ``rows`` as ``[world, *rows.shape]``,
    received straight into one buffer (:data:`_gather_into`, gloo and NCCL;
    Fabric's ``all_gather`` goes through torch's deprecated autograd
    all_gather and stacks a received list)."""
    out = rows.new_empty((world * rows.shape[0],) + tuple(rows.shape[1:]))   # concatenated: gloo and NCCL take it
    _gather_into(out, rows.contiguous())
    return out.view((world,) + tuple(rows.shape))


def gather_rows(fabric, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Concatenate every rank's rows (contiguous shards) into [n, ...].

    Shards may differ by one row; they are padded to equal size for the
    collective and trimmed after."""
    world = fabric.world_size
    if world == 1:
        return rows
    longest = shard_bounds(n, world, 0)[1]
    pad = longest - rows.shape[0]
    if pad:
        rows = torch.cat([rows, rows.new_zeros((pad,) + tuple(rows.shape[1:]))])
    # [world, longest, ...]
    gathered = _meter.gather(fabric, rows) if _meter is not None else all_gather(rows, world)
    if n == world * longest:   # equal shards: the gathered buffer already is [n, ...] in order, no copy
        return gathered.reshape((n,) + tuple(rows.shape[1:]))
    parts = [gathered[r, : shard_bounds(n, world, r)[1] - shard_bounds(n, world, r)[0]] for r in range(world)]
    return torch.cat(parts)


def gather_parts(fabric, parts: list[torch.Tensor], n: int) -> list[torch.Tensor]:
    """Every rank's rows of each ``[C, k_i]`` part, as ``[n, k_i]`` tensors,
    in one collective (the parts travel side by side in one buffer).  With
    one process the parts are returned as they are, without a copy."""
    if fabric.world_size == 1:
        return list(parts)
    widths = [p.shape[1] for p in parts]
    gathered = gather_rows(fabric, torch.cat(parts, dim=1), n)
    # Contiguous copies: with column views of the buffer (row stride its width) later products copy them
    # again, which raises the peak (bench-scale, 1,000 clients: 4.4 GB against 3.7 GB a rank).
    return [g.contiguous() for g in torch.split(gathered, widths, dim=1)]




class ColumnBlocks:
    """The round's exchange in column blocks (``exchange_mb``): every rank's
    ``[C, P]`` parts (named: "after", "before") gathered ``columns`` columns
    at a time, one all-gather per block, so that a rank never holds more
    than one ``[n, columns]`` block of each part.  Each pass over
    :meth:`blocks` gathers anew; ``passes`` counts the columns gathered, in
    units of P (what a pass costs the exchange)."""

    def __init__(self, fabric, parts: dict[str, torch.Tensor], n: int, columns: int, collective=None):
        widths = {p.shape[1] for p in parts.values()}
        if len(widths) != 1:
            raise ValueError(f"the parts must share one width, got {sorted(widths)}")
        self.fabric, self.parts, self.n = fabric, parts, n
        self.width = widths.pop()
        self.columns = max(1, int(columns))
        self.collective = collective or (lambda fn, *args: fn(*args))
        self.passes = 0.0

    def blocks(self, names: tuple[str, ...] = ("after",)):
        """Yield ``(start, stop, {name: [n, stop - start]})`` for column
        blocks in increasing order; each block is one collective on every rank."""
        for start in range(0, self.width, self.columns):   # column blocks, not clients
            stop = min(start + self.columns, self.width)
            cols = [self.parts[k][:, start:stop] for k in names]
            got = self.collective(gather_parts, self.fabric, cols, self.n)
            self.passes += len(names) * (stop - start) / max(self.width, 1)
            yield start, stop, {k: g.contiguous() for k, g in zip(names, got)}


def exchange_column_bytes(n: int, world: int, parts: int) -> int:
    """Bytes one gathered column costs a rank: the received buffer
    (``world`` padded shards of ``ceil(n / world)`` rows, ``parts`` parts,
    float32) and at most as much again in the copies that split it into
    ``[n, c]`` parts."""
    return 2 * world * -(-n // world) * parts * 4


def exchange_columns(budget_mb: float, n: int, world: int, parts: int) -> int:
    """Columns per block for an exchange of at most ``budget_mb`` MiB on a rank (0: not even one fits)."""
    return int(budget_mb * 2**20 // exchange_column_bytes(n, world, parts))


def available_memory(device: str) -> tuple[int, str]:
    """(bytes free, where) on the device a run would use: the CUDA device's
    free memory, else /proc/meminfo's MemAvailable."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()   # this rank's GPU
        free, _ = torch.cuda.mem_get_info(index)
        return int(free), f"GPU {index} ({torch.cuda.get_device_name(index)})"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "host memory (MemAvailable)"
    raise OSError("/proc/meminfo has no MemAvailable line")
