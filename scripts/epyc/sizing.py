"""Sizing: does the model fit, which socket, which cores, how much KV cache, how to pin."""

from __future__ import annotations

import argparse
import math
import shlex

from . import bundle, hostfacts, subproc
from .bundle import GIB
from .errors import ScriptError


class DoesNotFit(ScriptError):
    """The memory a rank has cannot hold its weights, KV need and reserve: tensor parallelism may."""


# ---------------------------------------------------------------- pure decisions


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
    """Pick the socket to serve on -> (socket, reason, warning).

    A forced socket wins if it exists and this process may run there. Otherwise prefer a free
    socket (busy% below threshold), lowest id first, because a neighbour's load halves our
    decode speed; when every socket is busy take the least busy one and say so. Without a
    load sample (sysroot, remote) the lowest usable socket is taken and the reason says why."""
    if forced is not None:
        if forced not in all_sockets:
            raise ScriptError(
                f"--socket {forced} does not exist on this host",
                f"use one of the sockets: {', '.join(map(str, all_sockets))}",
                valid_sockets=all_sockets,
            )
        if forced not in candidates:
            raise ScriptError(
                f"--socket {forced} has no CPU this process may use (affinity/cgroup cpuset)",
                f"use one of: {', '.join(map(str, candidates))}",
                valid_sockets=candidates,
            )
        return forced, "forced by --socket", None
    if not candidates:
        raise ScriptError(
            "no socket has a CPU this process may use", "check the process affinity and cgroup cpuset (taskset -p $$)"
        )
    if busy is None:
        return candidates[0], "load unknown (no live sample); lowest usable socket", None
    if len(candidates) == 1:  # no choice, but a load on it slows every token: said, not hidden
        only = candidates[0]
        loaded = busy[only] >= threshold
        return (
            only,
            "single usable socket",
            (
                f"the only usable socket ({only}) is {busy[only]:.0f}% busy: serving will compete with that load"
                if loaded
                else None
            ),
        )
    free = [s for s in candidates if busy[s] < threshold]
    if free:
        pick, by_memory = roomiest(free, free_bytes)
        how = "the most free memory" if by_memory else "lowest id"
        if len(free) == len(candidates):
            return pick, f"all sockets free (< {threshold:g}% busy); {how}", None
        return pick, f"socket {pick} free (< {threshold:g}% busy), others busy; {how}", None
    least = min(candidates, key=lambda s: (busy[s], s))
    return (
        least,
        "all sockets busy; least busy",
        (
            f"every socket is at least {threshold:g}% busy (socket {least}: {busy[least]:.0f}%); "
            "serving will compete with that load"
        ),
    )


def share_cores(cores: list[int], i: int, n: int) -> list[int]:
    """Engine i's slice of n near-equal contiguous slices of the bound cores."""
    if not 0 <= i < n <= len(cores):
        raise ScriptError(
            f"{n} engines cannot share {len(cores)} cores", f"use at most {len(cores)} engines on this socket"
        )
    return cores[i * len(cores) // n : (i + 1) * len(cores) // n]


def split_reserved(cores: list[int], reserve: int) -> tuple[list[int], list[int]]:
    """Hold back the last `reserve` physical cores (for vLLM's frontend / the OS) -> (bind, reserved).

    Default 0: on this 2-vCPU runner binding every core gave 18.0 vs 13.5 output tok/s (c=1) and
    63.9 vs 37.2 (c=4) against vLLM's own one-core reserve; on a 96-core socket a reserve costs ~1%."""
    if reserve < 0:
        raise ScriptError(f"--reserve-cores {reserve} is negative", "use --reserve-cores 0 or more")
    if reserve >= len(cores):
        raise ScriptError(
            f"--reserve-cores {reserve} leaves no core to bind (the socket has {len(cores)} usable)",
            f"use --reserve-cores below {len(cores)}",
        )
    return (cores[: len(cores) - reserve], cores[len(cores) - reserve :]) if reserve else (cores, [])


def socket_ram_bytes(nodes: list[int], node_mem: dict[int, int], usable_total: int) -> int:
    """RAM local to the socket: the smaller of its nodes' sysfs totals and the usable total
    (MemTotal / cgroup limit). Smaller wins even when sysfs looks wrong: vLLM's CPU worker reads
    the node's sysfs meminfo and refuses a KV cache larger than what that file says is free."""
    if not node_mem:  # no per-node meminfo at all (no NUMA sysfs): the host's total is the socket's
        return usable_total
    missing = [n for n in nodes if n not in node_mem]
    if missing:  # never the whole host's RAM for one socket: that over-grants a KV cache by the sockets' count
        raise ScriptError(
            f"no sysfs meminfo for NUMA node(s) {missing} of the chosen socket",
            "check /sys/devices/system/node/node*/meminfo on the host (a sysroot must capture it)",
        )
    return min(sum(node_mem[n] for n in nodes), usable_total)


def size_kv_cache(
    socket_ram_gb: float,
    os_reserve_gb: float,
    weight_gb: float | None,
    kv_needed_gb: float | None,
    headroom: float,
    default_fraction: float,
    batch_gb: float | None = None,
    prefix_share: float = 0.0,
    where: str = "socket",
) -> dict:
    """The KV cache to grant, in whole GiB: `default_fraction` of what the socket has left after weights and
    the OS, bounded by what the largest running batch can use (`batch_gb`) plus `prefix_share` of it for the
    prefix cache (vLLM reserves the grant at start: more would only take memory from the host), and at least
    the model's need x headroom. A socket that cannot hold weights + need + reserve is a refusal."""
    left = socket_ram_gb - os_reserve_gb - (weight_gb or 0.0)
    if kv_needed_gb is not None and (left < kv_needed_gb or math.floor(left) < math.ceil(kv_needed_gb)):
        raise DoesNotFit(
            f"{where} RAM {socket_ram_gb:g} GiB cannot hold weights {weight_gb or 0:g} GiB + "
            f"KV {kv_needed_gb:g} GiB + OS reserve {os_reserve_gb:g} GiB",
            "lower --max-model-len or the concurrency in estimate_memory.py, or use a smaller "
            "model (or another socket with --socket)",
        )
    need = max(1, math.ceil(kv_needed_gb * headroom)) if kv_needed_gb is not None else 0
    share = math.floor(left * default_fraction)
    usable = math.ceil(batch_gb * (1 + prefix_share)) if batch_gb is not None else None
    wanted = max(need, share if usable is None else min(share, usable))
    kv = min(wanted, math.floor(left))
    if kv < wanted:
        basis = f"all the {where} RAM left after OS reserve and weights ({left:.1f} GiB)"
    elif need and kv == need:
        basis = f"model need {kv_needed_gb:g} GiB x {headroom:g} headroom (more than the share below)"
    elif usable is not None and usable < share:
        basis = (
            f"what the largest running batch can use ({batch_gb:g} GiB) + {prefix_share:.0%} for the prefix "
            "cache; estimate_memory.py --num-prompts N sizes it for N full-length requests"
        )
    elif kv_needed_gb is None:
        basis = f"{default_fraction:g} of {where} RAM left after OS reserve and weights (no model need given)"
    else:
        basis = (
            f"{default_fraction:g} of the {where} RAM left after OS reserve and weights ({left:.1f} GiB); "
            f"at least the need, at most what the {where} has left"
        )
    warning = None
    if kv < 1:
        kv = 1
        warning = (
            f"only {left:.1f} GiB left on the socket after weights and OS reserve; KV cache set to the 1 GiB minimum"
        )
    return {"kv_gb": int(kv), "basis": basis, "warning": warning}


def cap_to_quota(bind: list[int], quota: float | None) -> tuple[list[int], dict | None]:
    """A cgroup CPU quota is a hard budget: more OMP threads than it allows only time-slice against each
    other. Bind at most floor(quota) cores (at least one)."""
    if quota is None or len(bind) <= max(1, math.floor(quota)):
        return bind, None
    keep = max(1, math.floor(quota))
    return bind[:keep], {
        "check": "cpu_quota",
        "message": f"the cgroup CPU quota allows {quota:g} CPUs: binding "
        f"{keep} of the socket's {len(bind)} physical cores",
        "fix": None,
    }


def pin_commands(bind: list[int], cpuset: list[int], nodes: list[int], tools: dict[str, bool]) -> dict:
    """How to pin the chosen socket: cgroup cpuset flags for containers, a launch prefix for the host.

    numactl binds CPU and memory; taskset binds CPU only (memory then follows first touch);
    with neither, the launch is unpinned and the note says so."""
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
    for key, value in plan["env"].items():
        out.append(f"export {key}={shlex.quote(str(value))}")
    for w in plan.get("warnings") or []:
        out.append(f"echo {shlex.quote('cpu_tune warning: ' + w['message'])} >&2")
    return "\n".join(out)


# ---------------------------------------------------------------- gathering (I/O)


def busy_by_socket(per_cpu: list[float], online: list[int], topo: hostfacts.Topology, allowed: list[int]) -> dict:
    """Per-socket busy %, averaged over the CPUs we could bind there. psutil lists the online CPUs in
    id order, so entry i is the i-th online CPU id -- not CPU i when some CPUs are offline."""
    by_id = dict(zip(sorted(online), per_cpu))
    busy = {}
    for s in topo.sockets:
        cpus = [c for c in topo.socket_cpus(s) if c in allowed and c in by_id]
        busy[s] = round(sum(by_id[c] for c in cpus) / len(cpus), 1) if cpus else 100.0
    return busy


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


def tune_warnings(warning: str | None, quota_warning: dict | None, kv: dict, chosen: int, nodes: list[int]) -> list:
    warnings = [{"check": "socket", "message": warning, "fix": "pass --socket N to choose another"}] if warning else []
    if quota_warning:
        warnings.append(quota_warning)
    if kv["warning"]:
        warnings.append({"check": "kv", "message": kv["warning"], "fix": "use a smaller model or a bigger socket"})
    if len(nodes) > 1:
        warnings.append(
            {
                "check": "nps",
                "message": f"socket {chosen} spans NUMA nodes {nodes} (NPS2/NPS4): vLLM 0.32 keeps an engine's "
                f"memory on the node of its first core, so the KV cache is sized to node {nodes[0]}'s RAM",
                "fix": "cpu_tune.py --tensor-parallel N (N: the host's NUMA nodes) puts one rank on each node: all "
                "their memory and bandwidth",
            }
        )
    return warnings


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


def plan(facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, args: argparse.Namespace) -> dict:
    """cpu_tune.py's document: one engine on one socket, or one engine split over the NUMA nodes by tensor
    parallelism -- when --tensor-parallel asks for it, or when the model does not fit one socket and the
    estimate says how vLLM splits it (`args.rank_table`)."""
    ranks = getattr(args, "tensor_parallel", None)
    if ranks not in (None, 1):
        return across_nodes(facts, epyc, busy, args, ranks, f"--tensor-parallel {ranks}")
    try:
        return one_socket(facts, epyc, busy, args)
    except DoesNotFit as why:
        if (
            ranks == 1
            or args.socket is not None
            or not getattr(args, "rank_table", None)
            or len(usable_nodes(facts)) < 2
        ):
            raise
        return across_nodes(facts, epyc, busy, args, None, f"the model does not fit one engine's memory ({why.error})")


def one_socket(facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, args: argparse.Namespace) -> dict:
    """One engine: the socket, its cores to bind, the KV grant from its own RAM, the pin.
    `args` holds the flags it reads: socket, busy_threshold, reserve_cores, weight_gb, kv_needed_gb,
    os_reserve_gb, and part: (i, n) for engine i of n sharing the socket (a fleet on a socket of its own)."""
    topo, allowed = facts.topology, set(facts.allowed_cpus)
    truth = facts.memory(epyc["memory"]["sysfs_disagreement_tolerance"])
    sockets = socket_rows(facts, truth["usable_bytes"], busy)
    by_id = {d["socket"]: d for d in sockets}
    candidates = [d["socket"] for d in sockets if d["allowed_cpus"]]
    free_mem = (
        {s: sum(topo.node_free_bytes.get(n, 0) for n in topo.socket_nodes(s)) for s in topo.sockets}
        if busy is not None and topo.node_free_bytes
        else None
    )  # live only: a capture's free memory is stale
    chosen, reason, warning = choose_socket(candidates, topo.sockets, busy, args.busy_threshold, args.socket, free_mem)
    usable = [c for c in topo.socket_cpus(chosen) if c in allowed]
    bind, reserved = split_reserved(topo.physical_cores(usable), args.reserve_cores)
    bind, quota_warning = cap_to_quota(bind, facts.cpu_quota)
    part = getattr(args, "part", None)
    if part:  # engine i of n on this socket: its slice of the cores, its share of the memory
        bind = share_cores(bind, *part)
    nodes = memory_nodes(topo, chosen, bind, part)
    ram_gb, first = by_id[chosen]["ram_gb"] / (part[1] if part else 1), topo.node_of_cpu.get(bind[0], nodes[0])
    if len(nodes) > 1:  # vLLM keeps a worker's memory on its first core's node: at most that node's
        ram_gb = min(ram_gb, bundle.gb(socket_ram_bytes([first], topo.node_mem_bytes, truth["usable_bytes"])))
    where = "socket" if len(nodes) == 1 else f"node {first}"
    kv = grant(epyc, args, ram_gb, args.os_reserve_gb / (part[1] if part else 1), vars(args), where)
    pins = pin_commands(bind, bind if part else usable, nodes, tool_presence())  # a part's container: its cores
    notes = list(truth["notes"]) + hostfacts.merged_note(topo)
    if len(usable) < len(topo.socket_cpus(chosen)):
        notes.append(
            f"this process may use {hostfacts.format_cpulist(usable)} of socket {chosen}'s "
            f"{by_id[chosen]['cpus']} (affinity/cgroup cpuset); only those are bound"
        )
    bind_s = hostfacts.format_cpulist(bind)
    ranks = [{"rank": 0, "socket": chosen, "numa_node": first, "cpus": bind_s}]
    return tune_doc(
        facts, args, sockets, busy, (chosen, reason), ranks, reserved, kv, ram_gb, nodes, pins,
        tune_warnings(warning, quota_warning, kv, chosen, nodes), notes,
    )  # fmt: skip


def usable_nodes(facts: hostfacts.HostFacts) -> list[int]:
    """The NUMA nodes holding a CPU this process may use, in id order."""
    allowed = set(facts.allowed_cpus)
    return [n for n in sorted(facts.topology.node_cpus) if allowed & set(facts.topology.node_cpus[n])]


def tool_presence() -> dict[str, bool]:
    return {"numactl": bool(subproc.find_program("numactl")), "taskset": bool(subproc.find_program("taskset"))}


def grant(epyc: dict, args: argparse.Namespace, ram_gb: float, reserve_gb: float, need: dict, where: str) -> dict:
    """The KV grant for one rank from its memory and what it holds (`need`: weight_gb, kv_needed_gb,
    kv_per_sequence_gb)."""
    mem = epyc["memory"]
    per_seq = need.get("kv_per_sequence_gb")
    return size_kv_cache(
        ram_gb,
        reserve_gb,
        need.get("weight_gb"),
        need.get("kv_needed_gb"),
        mem["kv_headroom_factor"],
        mem["kv_default_fraction"],
        per_seq * epyc["serve"]["max_num_seqs_cap"] if per_seq else None,
        mem["kv_prefix_cache_share"],
        where,
    )


def rank_cores(
    topo: hostfacts.Topology, allowed: set, nodes: list[int], ranks: int, reserve: int
) -> tuple[list[list[int]], list[int]]:
    """Each rank's physical cores: ranks / nodes ranks on every NUMA node, each a contiguous slice of its cores
    less `reserve` per node -> (the ranks' cores, the cores held back)."""
    per_node, out, held = ranks // len(nodes), [], []
    for node in nodes:
        bind, kept = split_reserved(topo.physical_cores([c for c in topo.node_cpus[node] if c in allowed]), reserve)
        out, held = out + [share_cores(bind, i, per_node) for i in range(per_node)], held + kept
    return out, held


def across_nodes(
    facts: hostfacts.HostFacts, epyc: dict, busy: dict[int, float] | None, args: argparse.Namespace,
    forced: int | None, reason: str,
) -> dict:  # fmt: skip
    """One engine, tensor parallel: a rank per NUMA node this process may use (or several, sharing its cores, when
    --tensor-parallel asks for more), each sized from its own node's memory -- vLLM binds a rank's memory to
    the node of its first core -- with the share of weights and KV the estimate's table gives it."""
    topo, allowed, nodes = facts.topology, set(facts.allowed_cpus), usable_nodes(facts)
    ranks = forced or len(nodes)
    table = {row["ranks"]: row for row in getattr(args, "rank_table", None) or []}
    if args.socket is not None:
        raise ScriptError("--socket and --tensor-parallel both given", "drop --socket: the ranks use every node")
    if ranks < 2 or not nodes or ranks % len(nodes):
        raise ScriptError(
            f"{reason}, and {ranks} ranks do not spread evenly over the {len(nodes)} NUMA node(s) this process "
            "may use (vLLM binds each rank's memory to one node)",
            f"--tensor-parallel {max(2, len(nodes))} (one rank per node, or a multiple), or a smaller model",
        )
    if ranks not in table:
        raise ScriptError(
            f"{reason}, but vLLM cannot split this model {ranks} ways"
            + (f" (its heads allow {sorted(table)})" if table else " (no estimate_memory.py per-rank table)"),
            "run estimate_memory.py in the same --run first" if not table else "use a smaller model",
        )
    truth = facts.memory(epyc["memory"]["sysfs_disagreement_tolerance"])
    per_node, limit = ranks // len(nodes), truth["usable_bytes"] // len(nodes)  # a cgroup limit is shared by all
    ram_gb = min(bundle.gb(socket_ram_bytes([n], topo.node_mem_bytes, limit)) for n in nodes) / per_node
    row = {**table[ranks], "kv_per_sequence_gb": table[ranks]["kv_bytes_per_sequence"] / GIB}
    kv = grant(epyc, args, ram_gb, args.os_reserve_gb / per_node, row, "rank's node")
    cores, reserved = rank_cores(topo, allowed, nodes, ranks, args.reserve_cores)
    # a step runs at the slowest rank's pace: every rank gets as many cores as the smallest, within the quota
    even = min(map(len, cores))
    if facts.cpu_quota is not None:
        even = max(1, min(even, math.floor(facts.cpu_quota / ranks)))
    trimmed, cores = sum(map(len, cores)) - even * ranks, [c[:even] for c in cores]
    bind = sorted(c for rank in cores for c in rank)
    usable = sorted(c for n in nodes for c in topo.node_cpus[n] if c in allowed)
    sockets = socket_rows(facts, truth["usable_bytes"], busy)
    busy_sockets = sorted(
        {topo.package[c] for c in bind if busy and busy.get(topo.package[c], 0) >= args.busy_threshold}
    )
    warnings = [
        {"check": "socket", "message": f"socket {s} is {busy[s]:.0f}% busy: its rank will compete with that load", "fix": None}
        for s in busy_sockets
    ]  # fmt: skip
    if kv["warning"]:
        warnings.append({"check": "kv", "message": kv["warning"], "fix": "use a smaller model or a bigger host"})
    if trimmed:
        warnings.append(
            {"check": "cpu_quota", "message": f"{even} cores per rank: {trimmed} left unbound so that every rank "
             "has as many (the cgroup CPU quota, or nodes with fewer usable cores)", "fix": None}
        )  # fmt: skip
    ranks_doc = [
        {"rank": i, "socket": topo.package[c[0]], "numa_node": topo.node_of_cpu[c[0]], "cpus": hostfacts.format_cpulist(c)}
        for i, c in enumerate(cores)
    ]  # fmt: skip
    reason = f"{reason}; over NUMA node(s) {','.join(map(str, nodes))}"
    return tune_doc(
        facts, args, sockets, busy, (ranks_doc[0]["socket"], reason), ranks_doc, reserved, kv, ram_gb, nodes,
        pin_commands(bind, usable, nodes, tool_presence()), warnings, list(truth["notes"]) + hostfacts.merged_note(topo),
        weight_gb=row["weight_gb"], kv_needed_gb=row["kv_needed_gb"],
    )  # fmt: skip


def tune_doc(
    facts, args, sockets, busy, choice, ranks, reserved, kv, ram_gb, nodes, pins, warnings, notes, **need
) -> dict:  # fmt: skip
    """cpu_tune.py's document from the decisions made."""
    if pins["pin_note"]:
        notes.append(pins["pin_note"])
    bind_s = "|".join(r["cpus"] for r in ranks)
    return {
        "target": facts.target,
        "chosen_socket": choice[0],
        "socket_choice_reason": choice[1],
        "tensor_parallel_size": len(ranks),
        "ranks": ranks,
        "sockets": sockets,
        "socket_busy_pct": {str(k): v for k, v in busy.items()} if busy else None,
        "busy_threshold": args.busy_threshold,
        "vllm_cpu_omp_threads_bind": bind_s,
        "omp_threads": sum(len(hostfacts.parse_cpulist(r["cpus"])) for r in ranks),
        "cpu_quota": facts.cpu_quota,
        "reserved_cpus": hostfacts.format_cpulist(reserved),
        "kv_granted_gb": kv["kv_gb"],
        "kv_basis": kv["basis"],
        "weight_gb": need.get("weight_gb", args.weight_gb),
        "kv_needed_gb": need.get("kv_needed_gb", args.kv_needed_gb),
        "os_reserve_gb": args.os_reserve_gb,
        "socket_ram_gb": round(ram_gb, 2),
        "numa_nodes": nodes,
        "container_cpuset": pins["container_cpuset"],
        "container_cpuset_argv": pins["container_cpuset_argv"],
        "host_pin_prefix": pins["host_pin_prefix"],
        "host_pin_argv": pins["host_pin_argv"],
        "host_pin_tool": pins["host_pin_tool"],
        "warnings": warnings,
        "notes": notes,
        "env": {"VLLM_CPU_OMP_THREADS_BIND": bind_s, "VLLM_CPU_KVCACHE_SPACE": kv["kv_gb"]},
    }
