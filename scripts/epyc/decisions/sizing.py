"""cpu_tune's decisions: which socket (or NUMA nodes, a rank each), which cores, the KV grant, how to pin."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from epyc import bundle, subproc
from epyc.decisions.kv_budget import DoesNotFit, Grant, Need, grant, rank_need
from epyc.errors import ScriptError
from epyc.facts import hostfacts

# ---------------------------------------------------------------- pure decisions


def warn(check: str, message: str, fix: str | None = None) -> dict:
    """One entry of cpu_tune's warnings."""
    return {"check": check, "message": message, "fix": fix}


def roomiest(sockets: list[int], free_bytes: dict[int, int] | None, margin: float = 0.10) -> tuple[int, bool]:
    """Among equally idle sockets, the one with clearly more free memory (by `margin`), else the lowest id:
    the KV cache and the weights must fit in the chosen socket's memory, not the host's."""
    first = sockets[0]
    if not free_bytes or any(s not in free_bytes for s in sockets):
        return first, False
    best = max(sockets, key=lambda s: (free_bytes[s], -s))
    return (best, True) if free_bytes[best] > free_bytes[first] * (1 + margin) else (first, False)


def choose_socket(
    candidates: list[int],
    all_sockets: list[int],
    busy: dict[int, float] | None,
    threshold: float,
    forced: int | None,
    free_bytes: dict[int, int] | None = None,
) -> tuple[int, str, str | None]:
    """The socket to serve on -> (socket, reason, warning): --socket if usable, else a free one (below the busy
    threshold: a neighbour's load halves decode speed), else the least busy, said; without a sample the lowest."""
    if forced is not None:
        for pool, why, fix in (
            (all_sockets, "does not exist on this host", "use one of the sockets"),
            (candidates, "has no CPU this process may use (affinity/cgroup cpuset)", "use one of"),
        ):
            if forced not in pool:
                raise ScriptError(f"--socket {forced} {why}", f"{fix}: {', '.join(map(str, pool))}", valid_sockets=pool)
        return forced, "forced by --socket", None
    if not candidates:
        raise ScriptError(
            "no socket has a CPU this process may use", "check the process affinity and cgroup cpuset (taskset -p $$)"
        )
    if busy is None:
        return candidates[0], "load unknown (no live sample); lowest usable socket", None
    if len(candidates) == 1:  # no choice, but a load on it slows every token: said, not hidden
        only = candidates[0]
        warning = f"the only usable socket ({only}) is {busy[only]:.0f}% busy: serving will compete with that load"
        return only, "single usable socket", warning if busy[only] >= threshold else None
    free = [s for s in candidates if busy[s] < threshold]
    if free:
        pick, by_memory = roomiest(free, free_bytes)
        how = "the most free memory" if by_memory else "lowest id"
        if len(free) == len(candidates):
            return pick, f"all sockets free (< {threshold:g}% busy); {how}", None
        return pick, f"socket {pick} free (< {threshold:g}% busy), others busy; {how}", None
    least = min(candidates, key=lambda s: (busy[s], s))
    warning = (
        f"every socket is at least {threshold:g}% busy (socket {least}: {busy[least]:.0f}%); "
        "serving will compete with that load"
    )
    return least, "all sockets busy; least busy", warning


def share_cores(cores: list[int], i: int, n: int) -> list[int]:
    """Engine i's slice of n near-equal contiguous slices of the bound cores."""
    if not 0 <= i < n <= len(cores):
        raise ScriptError(
            f"{n} engines cannot share {len(cores)} cores", f"use at most {len(cores)} engines on this socket"
        )
    return cores[i * len(cores) // n : (i + 1) * len(cores) // n]


def split_reserved(cores: list[int], reserve: int) -> tuple[list[int], list[int]]:
    """Hold back the last `reserve` physical cores (for vLLM's frontend / the OS) -> (bind, reserved); default 0,
    since binding every core served faster than vLLM's own one-core reserve (reference.md)."""
    if reserve < 0:
        raise ScriptError(f"--reserve-cores {reserve} is negative", "use --reserve-cores 0 or more")
    if reserve >= len(cores):
        raise ScriptError(
            f"--reserve-cores {reserve} leaves no core to bind (the socket has {len(cores)} usable)",
            f"use --reserve-cores below {len(cores)}",
        )
    return (cores[: len(cores) - reserve], cores[len(cores) - reserve :]) if reserve else (cores, [])


def socket_ram_bytes(nodes: list[int], node_mem: dict[int, int], usable_total: int) -> int:
    """RAM local to the socket: the smaller of its nodes' sysfs totals and the usable total (MemTotal / cgroup
    limit), even when sysfs looks wrong: vLLM's CPU worker refuses a KV cache larger than sysfs says is free."""
    if not node_mem:  # no per-node meminfo at all (no NUMA sysfs): the host's total is the socket's
        return usable_total
    missing = [n for n in nodes if n not in node_mem]
    if missing:  # never the whole host's RAM for one socket: that over-grants a KV cache by the sockets' count
        raise ScriptError(
            f"no sysfs meminfo for NUMA node(s) {missing} of the chosen socket",
            "check /sys/devices/system/node/node*/meminfo on the host (a sysroot must capture it)",
        )
    return min(sum(node_mem[n] for n in nodes), usable_total)


def cap_to_quota(bind: list[int], quota: float | None) -> tuple[list[int], dict | None]:
    """Bind at most floor(quota) cores (at least one): more OMP threads than a cgroup CPU quota only time-slice."""
    if quota is None or len(bind) <= max(1, math.floor(quota)):
        return bind, None
    keep = max(1, math.floor(quota))
    return bind[:keep], warn(
        "cpu_quota",
        f"the cgroup CPU quota allows {quota:g} CPUs: binding {keep} of the socket's {len(bind)} physical cores",
    )


def pin_commands(bind: list[int], cpuset: list[int], nodes: list[int], tools: dict[str, bool]) -> dict:
    """How to pin: cgroup cpuset flags for a container; for the host numactl (CPU and memory), else taskset (CPU
    only: memory follows first touch), else nothing, and the note says so."""
    bind_s, mems = hostfacts.format_cpulist(bind), ",".join(map(str, nodes))
    container = [f"--cpuset-cpus={hostfacts.format_cpulist(cpuset)}", f"--cpuset-mems={mems}"]
    note = None
    if tools.get("numactl"):
        prefix, tool = ["numactl", f"--cpunodebind={mems}", f"--membind={mems}"], "numactl"
    elif tools.get("taskset"):
        prefix, tool = ["taskset", "-c", bind_s], "taskset"
        note = "numactl not found: CPU pinned with taskset, memory not bound (install numactl)"
    else:
        prefix, tool = [], None
        note = "neither numactl nor taskset found: the host launch is unpinned (install numactl)"
    return {
        "container_cpuset": " ".join(container),
        "container_cpuset_argv": container,
        "host_pin_prefix": shlex.join(prefix),
        "host_pin_argv": prefix,
        "host_pin_tool": tool,
        "pin_note": note,
    }


def env_lines(plan: dict) -> str:
    """Shell text safe to eval: every value quoted."""
    out = [f"# cpu_tune: socket {plan['chosen_socket']} ({plan['socket_choice_reason']})"]
    if plan["tensor_parallel_size"] > 1:  # the bind holds one list per rank: vLLM needs as many ranks
        note = f"cpu_tune: one list per rank: serve with --tensor-parallel-size {plan['tensor_parallel_size']}"
        out.append(f"echo {shlex.quote(note)} >&2")
    out += [f"export {key}={shlex.quote(str(value))}" for key, value in plan["env"].items()]
    out += [f"echo {shlex.quote('cpu_tune warning: ' + w['message'])} >&2" for w in plan.get("warnings") or []]
    return "\n".join(out)


# ---------------------------------------------------------------- gathering (I/O)


def busy_by_socket(per_cpu: list[float], online: list[int], topo: hostfacts.Topology, allowed: list[int]) -> dict:
    """Per-socket busy %, averaged over the CPUs we could bind there. psutil lists the online CPUs in
    id order, so entry i is the i-th online CPU id -- not CPU i when some CPUs are offline."""
    by_id = dict(zip(sorted(online), per_cpu))
    cpus = {s: [c for c in topo.socket_cpus(s) if c in allowed and c in by_id] for s in topo.sockets}
    return {s: round(sum(by_id[c] for c in ours) / len(ours), 1) if ours else 100.0 for s, ours in cpus.items()}


def sample_busy(topo: hostfacts.Topology, allowed: list[int], seconds: float) -> dict[int, float]:
    import psutil

    return busy_by_socket(psutil.cpu_percent(interval=seconds, percpu=True), topo.cpus, topo, allowed)


# ---------------------------------------------------------------- the plan


def socket_rows(facts: hostfacts.HostFacts, usable_bytes: int, busy: dict[int, float] | None) -> list[dict]:
    """Each socket as the plan reports it: its CPUs, those this process may use, cores, nodes, RAM, load."""
    topo, allowed, rows = facts.topology, set(facts.allowed_cpus), []
    for s in topo.sockets:
        usable = [c for c in topo.socket_cpus(s) if c in allowed]
        nodes = topo.socket_nodes(s)
        rows.append(
            {
                "socket": s,
                "cpus": hostfacts.format_cpulist(topo.socket_cpus(s)),
                "allowed_cpus": hostfacts.format_cpulist(usable),
                "physical_cores": len(topo.physical_cores(usable)),
                "numa_nodes": nodes,
                "ram_gb": bundle.gb(socket_ram_bytes(nodes, topo.node_mem_bytes, usable_bytes)),
                "busy_pct": busy.get(s) if busy else None,
            }
        )
    return rows


def memory_nodes(topo: hostfacts.Topology, socket: int, bind: list[int], part: tuple[int, int] | None) -> list[int]:
    """The nodes an engine's memory is bound to: its socket's, or, for one engine per node of the socket
    (NPS2/NPS4 split as many ways as it has nodes), the one node that holds all its cores."""
    nodes = topo.socket_nodes(socket)
    if not nodes:  # nothing to bind memory to: '--membind=' with no node, or 0 GiB of socket RAM
        raise ScriptError(
            f"socket {socket} has no NUMA node listing its CPUs (every node's cpulist leaves them out)",
            "re-capture sys/devices/system/node from the host (detect.py --capture)",
        )
    if part and part[1] == len(nodes) > 1:
        return [n for n in nodes if set(bind) <= set(topo.node_cpus.get(n, []))] or nodes
    return nodes


@dataclass(frozen=True)
class SizingRequest:
    """What cpu_tune is asked to size: its flags (or a fleet engine's socket and share) and what the model needs."""

    busy_threshold: float
    reserve_cores: int
    os_reserve_gb: float
    need: Need = Need()
    socket: int | None = None
    part: tuple[int, int] | None = None  # engine i of n sharing the socket (a fleet on a socket of its own)
    tensor_parallel: int | None = None
    rank_table: list | None = None  # estimate_memory's per-rank rows: how vLLM splits the model


@dataclass
class Sized:
    """What one_socket or across_nodes decided, for tune_doc to report."""

    reason: str
    ranks: list[dict]
    reserved: list[int]
    kv: Grant
    ram_gb: float
    nodes: list[int]
    pins: dict
    warnings: list[dict]
    notes: list[str]
    need: Need
    sockets: list[dict]


def tune(facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, req: SizingRequest) -> dict:
    """cpu_tune.py's document: one engine on one socket, or split over the NUMA nodes by tensor parallelism when
    --tensor-parallel asks, or when it does not fit one socket and the estimate says how vLLM splits it."""
    ranks = req.tensor_parallel
    if ranks not in (None, 1):
        return across_nodes(facts, epyc, busy, req, ranks, f"--tensor-parallel {ranks}")
    try:
        return one_socket(facts, epyc, busy, req)
    except DoesNotFit as why:
        if ranks == 1 or req.socket is not None or not req.rank_table or len(usable_nodes(facts)) < 2:
            raise
        return across_nodes(facts, epyc, busy, req, None, f"the model does not fit one engine's memory ({why.error})")


def one_socket(facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, req: SizingRequest) -> dict:
    """One engine: the socket, its cores to bind, the KV grant from its own RAM, the pin; `req.part` (i, n):
    engine i of n sharing the socket, with its slice of the cores and its share of the memory."""
    topo, allowed, part = facts.topology, set(facts.allowed_cpus), req.part
    truth = facts.memory(epyc["memory"]["sysfs_disagreement_tolerance"])
    sockets = socket_rows(facts, truth["usable_bytes"], busy)
    by_id = {d["socket"]: d for d in sockets}
    candidates = [d["socket"] for d in sockets if d["allowed_cpus"]]
    free_mem = (
        {s: sum(topo.node_free_bytes.get(n, 0) for n in topo.socket_nodes(s)) for s in topo.sockets}
        if busy is not None and topo.node_free_bytes
        else None
    )  # live only: a capture's free memory is stale
    chosen, reason, warning = choose_socket(candidates, topo.sockets, busy, req.busy_threshold, req.socket, free_mem)
    usable = [c for c in topo.socket_cpus(chosen) if c in allowed]
    bind, reserved = split_reserved(topo.physical_cores(usable), req.reserve_cores)
    bind, quota_warning = cap_to_quota(bind, facts.cpu_quota)
    ways = part[1] if part else 1
    bind = share_cores(bind, *part) if part else bind
    nodes = memory_nodes(topo, chosen, bind, part)
    ram_gb, first = by_id[chosen]["ram_gb"] / ways, topo.node_of_cpu.get(bind[0], nodes[0])
    if len(nodes) > 1:  # vLLM keeps a worker's memory on its first core's node: at most that node's
        ram_gb = min(ram_gb, bundle.gb(socket_ram_bytes([first], topo.node_mem_bytes, truth["usable_bytes"])))
    kv = grant(epyc, ram_gb, req.os_reserve_gb / ways, req.need, "socket" if len(nodes) == 1 else f"node {first}")
    pins = pin_commands(bind, bind if part else usable, nodes, tool_presence())  # a part's container: its cores
    notes = [*truth["notes"], *hostfacts.merged_note(topo)]
    if len(usable) < len(topo.socket_cpus(chosen)):
        notes.append(
            f"this process may use {hostfacts.format_cpulist(usable)} of socket {chosen}'s "
            f"{by_id[chosen]['cpus']} (affinity/cgroup cpuset); only those are bound"
        )
    ranks = [{"rank": 0, "socket": chosen, "numa_node": first, "cpus": hostfacts.format_cpulist(bind)}]
    warnings = [warn("socket", warning, "pass --socket N to choose another")] if warning else []
    warnings += [quota_warning] if quota_warning else []
    warnings += [warn("kv", kv.warning, "use a smaller model or a bigger socket")] if kv.warning else []
    if len(nodes) > 1:
        nps = (
            f"socket {chosen} spans NUMA nodes {nodes} (NPS2/NPS4): vLLM 0.32 keeps an engine's memory on the node "
            f"of its first core, so the KV cache is sized to node {nodes[0]}'s RAM"
        )
        fix = (
            "cpu_tune.py --tensor-parallel N (N: the host's NUMA nodes) puts one rank on each node: all their "
            "memory and bandwidth"
        )
        warnings.append(warn("nps", nps, fix))
    sized = Sized(reason, ranks, reserved, kv, ram_gb, nodes, pins, warnings, notes, req.need, sockets)
    return tune_doc(facts, req, busy, sized)


def usable_nodes(facts: hostfacts.HostFacts) -> list[int]:
    """The NUMA nodes holding a CPU this process may use, in id order."""
    allowed = set(facts.allowed_cpus)
    return [n for n in sorted(facts.topology.node_cpus) if allowed & set(facts.topology.node_cpus[n])]


def tool_presence() -> dict[str, bool]:
    return {"numactl": bool(subproc.find_program("numactl")), "taskset": bool(subproc.find_program("taskset"))}


def rank_cores(facts: hostfacts.HostFacts, nodes: list[int], ranks: int, reserve: int) -> tuple[list, list, list]:
    """Each rank's contiguous slice of its node's cores less `reserve`, all cut to the smallest (within the quota):
    a step runs at the slowest rank's pace -> (the ranks' cores, the cores held back, a warning if some are cut)."""
    topo, allowed, per_node, out, held = facts.topology, set(facts.allowed_cpus), ranks // len(nodes), [], []
    for node in nodes:
        bind, kept = split_reserved(topo.physical_cores([c for c in topo.node_cpus[node] if c in allowed]), reserve)
        out, held = out + [share_cores(bind, i, per_node) for i in range(per_node)], held + kept
    even = min(map(len, out))
    if facts.cpu_quota is not None:
        even = max(1, min(even, math.floor(facts.cpu_quota / ranks)))
    trimmed = sum(map(len, out)) - even * ranks
    why = f"{even} cores per rank: {trimmed} left unbound so that every rank has as many (the cgroup CPU quota, or "
    warning = warn("cpu_quota", why + "nodes with fewer usable cores)")
    return [c[:even] for c in out], held, [warning] if trimmed else []


def across_nodes(
    facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, req: SizingRequest,
    forced: int | None, reason: str,
) -> dict:  # fmt: skip
    """One engine, tensor parallel: one rank (or more, sharing its cores) per usable NUMA node, each sized from its
    node's memory (vLLM binds it to its first core's node) with the share the estimate's table gives it."""
    topo, allowed, nodes = facts.topology, set(facts.allowed_cpus), usable_nodes(facts)
    ranks = forced or len(nodes)
    if req.socket is not None:
        raise ScriptError("--socket and --tensor-parallel both given", "drop --socket: the ranks use every node")
    if ranks < 2 or not nodes or ranks % len(nodes):
        raise ScriptError(
            f"{reason}, and {ranks} ranks do not spread evenly over the {len(nodes)} NUMA node(s) this process "
            "may use (vLLM binds each rank's memory to one node)",
            f"--tensor-parallel {max(2, len(nodes))} (one rank per node, or a multiple), or a smaller model",
        )
    need, sizes = rank_need(req.rank_table, ranks), sorted(row["ranks"] for row in req.rank_table or [])
    if need is None:
        raise ScriptError(
            f"{reason}, but vLLM cannot split this model {ranks} ways"
            + (f" (its heads allow {sizes})" if sizes else " (no estimate_memory.py per-rank table)"),
            "run estimate_memory.py in the same --run first" if not sizes else "use a smaller model",
        )
    truth = facts.memory(epyc["memory"]["sysfs_disagreement_tolerance"])
    per_node, limit = ranks // len(nodes), truth["usable_bytes"] // len(nodes)  # a cgroup limit is shared by all
    ram_gb = min(bundle.gb(socket_ram_bytes([n], topo.node_mem_bytes, limit)) for n in nodes) / per_node
    kv = grant(epyc, ram_gb, req.os_reserve_gb / per_node, need, "rank's node")
    cores, reserved, trimmed = rank_cores(facts, nodes, ranks, req.reserve_cores)
    bind = sorted(c for rank in cores for c in rank)
    usable = sorted(c for n in nodes for c in topo.node_cpus[n] if c in allowed)
    loaded = {topo.package[c] for c in bind if busy and busy.get(topo.package[c], 0) >= req.busy_threshold}
    warnings = [
        warn("socket", f"socket {s} is {busy[s]:.0f}% busy: its rank will compete with that load")
        for s in sorted(loaded)
    ]
    warnings += [warn("kv", kv.warning, "use a smaller model or a bigger host")] if kv.warning else []
    ranks_doc = [
        {"rank": i, "socket": topo.package[c[0]], "numa_node": topo.node_of_cpu[c[0]], "cpus": hostfacts.format_cpulist(c)}
        for i, c in enumerate(cores)
    ]  # fmt: skip
    reason = f"{reason}; over NUMA node(s) {','.join(map(str, nodes))}"
    pins, notes = pin_commands(bind, usable, nodes, tool_presence()), [*truth["notes"], *hostfacts.merged_note(topo)]
    sockets = socket_rows(facts, truth["usable_bytes"], busy)
    sized = Sized(reason, ranks_doc, reserved, kv, ram_gb, nodes, pins, warnings + trimmed, notes, need, sockets)
    return tune_doc(facts, req, busy, sized)


def tune_doc(facts: hostfacts.HostFacts, req: SizingRequest, busy: dict[int, float] | None, d: Sized) -> dict:
    """cpu_tune.py's document from the decisions made."""
    bind_s = "|".join(r["cpus"] for r in d.ranks)
    return {
        "target": facts.target,
        "chosen_socket": d.ranks[0]["socket"],
        "socket_choice_reason": d.reason,
        "tensor_parallel_size": len(d.ranks),
        "ranks": d.ranks,
        "sockets": d.sockets,
        "socket_busy_pct": {str(k): v for k, v in busy.items()} if busy else None,
        "busy_threshold": req.busy_threshold,
        "vllm_cpu_omp_threads_bind": bind_s,
        "omp_threads": sum(len(hostfacts.parse_cpulist(r["cpus"])) for r in d.ranks),
        "cpu_quota": facts.cpu_quota,
        "reserved_cpus": hostfacts.format_cpulist(d.reserved),
        "kv_granted_gb": d.kv.kv_gb,
        "kv_basis": d.kv.basis,
        "weight_gb": d.need.weight_gb,
        "kv_needed_gb": d.need.kv_needed_gb,
        "os_reserve_gb": req.os_reserve_gb,
        "socket_ram_gb": round(d.ram_gb, 2),
        "numa_nodes": d.nodes,
        **{k: v for k, v in d.pins.items() if k != "pin_note"},
        "warnings": d.warnings,
        "notes": d.notes + ([d.pins["pin_note"]] if d.pins["pin_note"] else []),
        "env": {"VLLM_CPU_OMP_THREADS_BIND": bind_s, "VLLM_CPU_KVCACHE_SPACE": d.kv.kv_gb},
    }
