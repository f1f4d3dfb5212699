"""The plan, as pure functions: from the five documents and a few host facts to the exact command, the
summary the human confirms, the verdict on a server's answer, and the hand-off. No I/O here: the
facts a plan depends on (environment variables present, a model folder on disk) come in as `facts`.
"""
from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import common
import quantization
from common import ScriptError
from hf_model import is_revision
from kv_cache import ssm_state_dtype
from vllm_registry import normalize_version


def state_root() -> Path:
    """Where default state dirs go (a plan without --state-dir, up's run folder)."""
    return common.cache_root() / "serving-llms-on-epyc" / "run"


STOP_GRACE_S = 30  # SIGTERM first: vLLM shuts its engine down cleanly; SIGKILL only after this


def served_model_name(model: str, model_dir: str | None) -> str:
    """The id clients send: the Hub id as is, a local folder by its name."""
    return Path(model_dir or model).name if (model_dir or model.startswith((".", "/", "~"))) else model


def needs_device_flag(vllm_version: str | None, removed_in: str = "0.20") -> bool:
    """`--device cpu` was removed from `vllm serve` in 0.20 (data/epyc.json serve.device_cpu_flag_removed_in);
    passing it is an argparse error there."""
    def major_minor(v: str) -> tuple[int, int]:
        parts = v.split("+")[0].split(".")
        return int(parts[0]), int(parts[1])
    try:
        return major_minor(vllm_version or "") < major_minor(removed_in)
    except (ValueError, IndexError):
        return False


def quantized_path(report: dict | None, backend: str, dtype: str, epyc: dict, avx512: bool | None = None) -> dict | None:
    """The checkpoint's quantization and the kernel this plan's backend and dtype run it with on this CPU."""
    if not report:
        return None
    desc = {k: report.get(k) for k in ("method", "format", "bits", "symmetric", "group_size")}
    return {**desc, **quantization.cpu_kernel(desc, backend, dtype, epyc["quantization"]["kernels"], avx512,
                                              epyc["quantization"].get("stock_needs_avx512"))}


def serve_options(served: str, host: str, port: int, dtype: str, max_len: int, device_flag: bool,
                  max_num_seqs: int | None = None, batched_tokens: int | None = None) -> list[str]:
    """vLLM's serve flags. The KV sizing's assumptions are pinned, not left to vLLM's defaults: how many
    sequences run at once, and how many tokens a step takes (a sliding-window layer keeps that many
    beyond its window, so the KV estimate depends on it)."""
    opts = ["--served-model-name", served, "--host", host, "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(max_len)]
    if max_num_seqs:
        opts += ["--max-num-seqs", str(max_num_seqs)]
    if batched_tokens:
        opts += ["--max-num-batched-tokens", str(batched_tokens)]
    return opts + (["--device", "cpu"] if device_flag else [])


def runtime_stop_pair(rt: list[str], name: str) -> str:
    """The runtime's own graceful stop and removal of the container (plans before 6d345f9 handed over only
    this as their stop_command)."""
    return " && ".join(shlex.join(c) for c in ([*rt, "stop", "-t", str(STOP_GRACE_S), name], [*rt, "rm", name]))


def kv_capacity(granted_gb: int, bytes_per_token: int | None, bytes_per_sequence: int | None,
                cap: int, batched_tokens: int | None = None) -> dict:
    """What the granted KV cache holds: tokens, and full-length requests at once. --max-num-seqs
    follows it (at most `cap`, and never above the tokens one step takes: vLLM refuses that), so vLLM
    never schedules more sequences than the cache can keep."""
    granted = granted_gb * common.GIB
    tokens = granted // bytes_per_token if bytes_per_token else None
    requests = granted // bytes_per_sequence if bytes_per_sequence else None
    seqs = max(1, min(cap, batched_tokens or cap, requests)) if requests is not None else None
    return {"kv_tokens": tokens, "kv_full_length_requests": requests, "max_num_seqs": seqs}


SECRETS_TARGET = "/run/secrets/serving-llms-on-epyc"
# Inside the container: export each mounted secret file (named after its variable) and exec vLLM.
# A constant script, never built from input; the serve arguments arrive as "$@".
SECRET_LOADER = ('for f in ' + SECRETS_TARGET + '/*; do [ -f "$f" ] && export "${f##*/}=$(cat "$f")"; done; '
                 'exec vllm serve "$@"')


def container_run_argv(rt: list[str], name: str, run_flags: list[str], cpuset: list[str], hf_mount: list[str],
                       model_mount: list[str], env: dict, secrets_dir: str | None, image: str,
                       serve_args: list[str], shm_size: str = "16g") -> list[str]:
    """`RT run -d` with values for the sizing env, and secrets as read-only files, never values in the
    argv or the container's config: `--env NAME` would put NAME=value into `docker inspect`. With
    secrets, a constant loader exports them inside the container and execs `vllm serve`.

    The entrypoint is set explicitly (`vllm`, or `sh` for the loader), so the command is the same
    whatever the image declares (the stock image's entrypoint is `vllm serve`, the zentorch one has none)."""
    if any(f.startswith("--shm-size") for f in run_flags) and "--ipc=host" in run_flags:
        raise ScriptError("run flags combine --ipc=host with --shm-size", "use --ipc=host alone (data/epyc.json)")
    argv = [*rt, "run", "-d", "--name", name, *run_flags, *cpuset, *hf_mount, *model_mount]
    if "--ipc=host" not in run_flags:  # an isolated IPC namespace needs a big /dev/shm instead
        argv.append(f"--shm-size={shm_size}")
    if secrets_dir:
        argv += bind_mount(secrets_dir, SECRETS_TARGET, read_only=True)  # a ':' in a --state-dir: refused
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    if secrets_dir:
        return argv + ["--entrypoint", "sh", image, "-c", SECRET_LOADER, "vllm", *serve_args]
    return argv + ["--entrypoint", "vllm", image, "serve", *serve_args]


def serve_args(argv: list[str], container: bool) -> list[str]:
    """What `vllm serve` is given (the model first), read from a command this module built, by its shape:
    `--entrypoint vllm IMAGE serve ARGS`, `--entrypoint sh IMAGE -c LOADER vllm ARGS` (the secrets' loader),
    or on the host `[PIN...] /venv/bin/vllm serve ARGS`. Never by looking for the word "serve", which the
    loader form lacks and an image may be named; the path says which shape (a serve option is no marker)."""
    if container:
        at = argv.index("--entrypoint")
        return argv[at + 6:] if argv[at + 1] == "sh" else argv[at + 4:]
    at = next(k for k, a in enumerate(argv) if a.endswith("/vllm") and argv[k + 1:k + 2] == ["serve"])
    return argv[at + 2:]


def throughput_env(flags: dict) -> dict:
    """The opt-in throughput flags, all or none: FREEZING alone crashes engine init."""
    env = dict(flags["env"])
    missing = [k for k in flags["required_together"] if k not in env]
    if missing:
        raise ScriptError(f"throughput flags incomplete: {missing}", "data/epyc.json must pair the flags")
    return env


def bind_mount(source: str, target: str, read_only: bool = False) -> list[str]:
    """`-v SOURCE:TARGET[:ro]` as two argv elements. A ':' or ',' in a path would change what the runtime
    parses (another mount option), so such a path is refused rather than passed; so is one with a newline
    or another unprintable character (the summary's shell-quoted command would show another folder)."""
    for path in (source, target):
        if ":" in path or "," in path or not path.startswith("/") or not path.isprintable():
            raise ScriptError(f"cannot mount {path!r}: a container mount needs an absolute path of printable "
                              "characters, without ':' or ','",
                              "move or link the folder to a plain path (for the HF cache: export HF_HOME=/a/path)")
    if system_folder(source):
        raise ScriptError(f"cannot mount {source!r} into the container: it is a system folder (the HF cache is "
                          "mounted read-write into a root container)", "point HF_HOME at a cache folder of its own, "
                          "e.g. export HF_HOME=~/.cache/huggingface, and run validate.py again")
    return ["-v", f"{source}:{target}" + (":ro" if read_only else "")]


API_KEY_MIN = 8
SECRET_VALUE = re.compile(r"[\x21-\x7e]{1,4096}")  # what a Bearer header (and vLLM's --api-key) can carry


def secret_unsendable(name: str) -> str:
    """The refusal of a secret whose value no HTTP header carries (plan and start say it alike)."""
    return (f"{name} holds characters a token cannot have (spaces, newlines or other non-printing ones, or "
            "more than 4096 of them; its value is not shown)")
HF_MOUNT_FIX = ("move what is not a model out of that folder, or point HF_HUB_CACHE at a folder of its own "
                "(e.g. export HF_HUB_CACHE=~/.cache/huggingface/hub); then run validate.py and plan again")
SYSTEM_TREES = ("/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/var/lib/docker")
SYSTEM_FOLDERS = ("/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/var", "/home", "/root", "/opt", "/tmp", "/srv",
                  "/mnt", "/media", "/snap", "/var/lib", "/var/tmp", "/var/log", "/var/spool", "/var/cache")
# never mounted read-write into a root container, at any depth: programs and libraries, container engines'
# and schedulers' state, logs and cron, keys
MOUNT_REFUSED_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/libx32", "/lib64", "/var/lib/containerd",
                       "/var/lib/containers", "/var/lib/kubelet", "/var/lib/etcd", "/var/lib/rancher", "/var/lib/dpkg",
                       "/var/lib/systemd", "/var/log", "/var/spool", "/var/mail", "/var/backups")
KEY_FOLDERS = (".ssh", ".gnupg", ".docker", ".kube")


def system_folder(path: str) -> bool:
    """A folder a document must never name as a mount: a system tree (the docker socket lives in /run),
    programs, libraries and engines' state at any depth, a key folder, or a whole top-level folder (and
    /var's). A cache below one (/root/.cache/huggingface, /var/lib/hf-cache) is fine. This is the first
    fence only: what the HF cache holds is checked too (hf_mount_problem), as no list names every folder."""
    norm = "/" + os.path.normpath(path).lstrip("/")  # POSIX keeps a leading '//', which the runtime reads as '/'
    return (norm in SYSTEM_FOLDERS or in_system_tree(norm) or ".." in path.split("/")
            or _at_or_below(norm, MOUNT_REFUSED_TREES) or not set(KEY_FOLDERS).isdisjoint(norm.split("/")))


def in_system_tree(path: str) -> bool:
    """At or below /etc, /proc, /sys, /dev, /run, /var/run, /boot or /var/lib/docker (path normalised)."""
    return _at_or_below(path, SYSTEM_TREES)


def _at_or_below(path: str, trees: tuple[str, ...]) -> bool:
    return any(path == t or path.startswith(t + "/") for t in trees)


# What huggingface_hub (and diffusers, and a data disk's file system) put at a hub cache's top: a folder
# mounted read-write into a root container as the hub cache holds nothing else. A home, ~/.aws, /nix/store
# or a disk's root each hold something else.
# (`blobs`: huggingface_hub 2.x's store shared by every Xet-backed download, <hub>/blobs/XX/HASH)
HUB_CACHE_ENTRIES = frozenset({".locks", "CACHEDIR.TAG", "lost+found", "blobs"})
_HUB_CACHE_ENTRY = re.compile(r"(models|datasets|spaces)--[^/]+|version[\w.-]*\.txt")


def foreign_cache_entries(entries: list[str]) -> list[str]:
    """The entries of a would-be hub cache that no Hugging Face library puts there."""
    return [e for e in entries if e not in HUB_CACHE_ENTRIES and not _HUB_CACHE_ENTRY.fullmatch(e)]


def hf_mount_problem(path: str, found: dict | None) -> str | None:
    """Why the hub cache validate.py recorded cannot be mounted read-write into a root container now, or
    None. `found` is the folder as it is now (validate.cache_listing). It must be at that very path (a
    link made since then would be followed by the runtime: validate records the real path), and hold
    only models, datasets and spaces, or nothing yet: a list of system folders can refuse / or /etc,
    but never names every folder that holds what a container must not write."""
    if not found:
        return "was not looked at on this machine"
    if found.get("error"):
        return f"cannot be read ({found['error']})"
    if found["real"] != path:
        return f"is {found['real']} now (a link, or a path not in its plain form), not the folder validate.py checked"
    foreign = foreign_cache_entries(found.get("entries") or [])
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        return (f"holds {', '.join(repr(e[:80]) for e in foreign[:5])}{more}, which a hub cache does not hold "
                "(only models--*, datasets--*, spaces--* folders)")
    return None


_PRELOAD_PATH = re.compile(r"/[A-Za-z0-9._+/-]+")
LIB_DIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/opt/conda/lib")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,199}$")
_CPULIST = re.compile(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")


def is_served_name(text: object) -> bool:
    """A served model name is one argv element vLLM reads as a value, and the id clients send: it never
    starts with '-' (vLLM would read an option), holds no space or control character, and is no URL (the
    mask of credentials in URLs would rewrite `http://user@host` in the plan: not the name asked for)."""
    return (isinstance(text, str) and bool(_SERVED_NAME.fullmatch(text))  # fullmatch: "$" lets a final \n through
            and "://" not in text)


def pin_prefix_problem(argv: list, cpuset: list, numa_nodes: list | None = None,
                       bind: list[int] | None = None) -> str | None:
    """cpu_tune's pin prefix and cpuset flags run as part of the command: only the shapes cpu_tune makes
    (numactl --cpunodebind=N --membind=N, taskset -c LIST, nothing) -- never a program a document names;
    given the document's numa_nodes, memory bound to exactly those nodes (the ones it sized), on the host
    and in the container alike; given its thread bind, CPUs that hold it (taskset: exactly it)."""
    mems = ",".join(map(str, numa_nodes)) if numa_nodes is not None else None

    def listed(arg: str, flag: str) -> str | None:
        return arg[len(flag):] if arg.startswith(flag) and _CPULIST.fullmatch(arg[len(flag):]) else None

    def nodes(arg: str, flag: str) -> bool:
        value = listed(arg, flag)
        return value is not None and (mems is None or value == mems)

    def cpus(value: str | None, exact: bool) -> bool:
        if value is None or bind is None:
            return value is not None
        have = set(common.parse_cpulist(value))
        return have == set(bind) if exact else set(bind) <= have
    ok_pin = (argv == [] or (len(argv) == 3 and argv[0] == "numactl" and nodes(argv[1], "--cpunodebind=")
                             and nodes(argv[2], "--membind="))
              or (len(argv) == 3 and argv[:2] == ["taskset", "-c"] and cpus(argv[2] if _CPULIST.fullmatch(argv[2])
                                                                            else None, exact=True)))
    if not ok_pin:
        return f"cpu_tune's host_pin_argv {argv!r} is not a numactl or taskset prefix cpu_tune makes for its bind"
    if not (cpuset == [] or (len(cpuset) == 2 and cpus(listed(cpuset[0], "--cpuset-cpus="), exact=False)
                             and nodes(cpuset[1], "--cpuset-mems="))):
        return (f"cpu_tune's container_cpuset_argv {cpuset!r} is not the --cpuset-cpus/--cpuset-mems pair of the "
                "CPUs it binds and the NUMA nodes it sized")
    return None


def bound_cpus(tune: dict) -> list[int] | None:
    """The CPUs cpu_tune binds vLLM's OpenMP threads to (VLLM_CPU_OMP_THREADS_BIND), or None when it binds
    none by list (`nobind`, `auto`)."""
    value = tune.get("vllm_cpu_omp_threads_bind")
    if not isinstance(value, str) or not _CPULIST.fullmatch(value):
        return None
    try:
        return common.parse_cpulist(value)
    except ValueError:
        return None


def preload_value(value: str | None, allowed: list[str]) -> str | None:
    """validate.py's LD_PRELOAD, accepted only as absolute paths to the libraries data/epyc.json names
    (tcmalloc, libiomp5): a plan never preloads anything else into the server."""
    if not value:
        return None
    if not isinstance(value, str):
        raise ScriptError(f"LD_PRELOAD {str(value)[:80]} is not text", "re-run validate.py and pass its unmodified "
                          "output to plan")
    # the loader splits LD_PRELOAD on spaces as well as colons, and expands $LIB: one safe alphabet, and each
    # name exactly a pinned library (optionally with its version suffix, libtcmalloc_minimal.so.4.5.9)
    names = re.compile("|".join(re.escape(name.split(".so")[0] + ".so") + r"(?:\.[0-9]+)*" for name in allowed))
    for part in value.split(":"):
        folder = str(Path(part).parent)
        # the library's name AND a system library folder: a file of that name in /tmp is someone else's code
        if not (_PRELOAD_PATH.fullmatch(part) and names.fullmatch(Path(part).name) and ".." not in Path(part).parts
                and "//" not in part and (folder in LIB_DIRS or folder.startswith(tuple(d + "/" for d in LIB_DIRS)))):
            raise ScriptError(f"LD_PRELOAD entry {part!r} is not one of {', '.join(allowed)}",
                              "re-run validate.py and pass its unmodified output to plan")
    return value


SIZINGS = {
    # name: bind (the socket's cores / nobind / vLLM's default), kv (grant VLLM_CPU_KVCACHE_SPACE), pin (CPU +
    # memory), preload (LD_PRELOAD), seqs (--max-num-seqs from the KV capacity), throughput (the opt-in flags)
    "skill": dict(bind="cores", kv=True, pin=True, preload=True, seqs=True, throughput=False),
    "skill+throughput": dict(bind="cores", kv=True, pin=True, preload=True, seqs=True, throughput=True),
    "vllm-default": dict(bind=None, kv=False, pin=False, preload=False, seqs=False, throughput=False),
    "all-cores": dict(bind="cores", kv=False, pin=False, preload=False, seqs=False, throughput=False),
    "unpinned": dict(bind="nobind", kv=True, pin=False, preload=False, seqs=False, throughput=False),
}


def sizing_rules(name: str) -> dict:
    """What a sizing sets. `skill` is this bundle's plan; the others are what a user might type instead
    (vLLM's own defaults; every physical core bound and nothing else; no binding at all): bench.py
    --compare serves the same model under each, so the skill's rules are measured, not asserted."""
    if name not in SIZINGS:
        raise ScriptError(f"unknown sizing {name!r}", f"use one of: {', '.join(SIZINGS)}")
    return SIZINGS[name]


def plan_differences(plan: dict, fresh: dict) -> list[str]:
    """The fields where the plan on disk and a fresh rendering of its own inputs disagree. Every field
    counts: the command, env and paths decide what runs, and the rest (the stop command, the summary,
    the base URL) is what the human and the handoff are told -- an edit anywhere is refused."""
    return sorted(k for k in plan.keys() | fresh.keys() if k != "ok" and plan.get(k) != fresh.get(k))  # ok: the
    # contract's verdict, added when the plan is printed


LAUNCHABLE_KINDS = ("text", "multimodal", "undetermined")  # check_model's endpoints_for: the others never are


def mismatches(inp: dict) -> list[str]:
    """Why the five documents do not describe one serve: each script echoes the inputs its decision
    used, so a set assembled from different runs (another model, other weights, a KV grant below the
    need, another host) is caught here instead of serving something nobody sized."""
    det, val, chk, est, tune = (inp["detect"], inp["validate"], inp["check_model"], inp["estimate_memory"],
                                inp["cpu_tune"])
    out = []
    if chk.get("model") and est.get("model") and chk["model"] != est["model"]:
        out.append(f"check_model.py ran for {chk['model']}, estimate_memory.py for {est['model']}")
    # (an older bundle's estimate has none; no revision is main, as the Hub client reads it)
    if "revision" in est and (est["revision"] or "main") != (chk.get("revision") or "main"):
        out.append(f"check_model.py checked revision {chk.get('revision') or 'main'}, estimate_memory.py sized "
                   f"{est['revision'] or 'main'}")
    if tune.get("weight_gb") is not None and tune["weight_gb"] != est.get("weight_gb"):
        out.append(f"cpu_tune.py sized for {tune['weight_gb']} GiB of weights, estimate_memory.py says "
                   f"{est.get('weight_gb')}")
    need = (est.get("fit") or {}).get("kv_needed_gb")
    if tune.get("kv_needed_gb") is not None and need is not None and tune["kv_needed_gb"] != need:
        out.append(f"cpu_tune.py sized for a {tune['kv_needed_gb']} GiB KV need, estimate_memory.py says {need}")
    if need is not None and tune.get("kv_granted_gb") is not None and tune["kv_granted_gb"] < need:
        out.append(f"cpu_tune.py grants {tune['kv_granted_gb']} GiB of KV cache, below the {need} GiB needed")
    checked = normalize_version(chk.get("vllm_version"))  # '0.32.0+cpu' -> '0.32.0'
    serving = normalize_version((val.get("stack") or {}).get("vllm"))
    if checked and serving and checked != serving:  # the architecture was judged by another vLLM's registry
        out.append(f"check_model.py judged the model with vLLM {checked}'s registry, validate.py found vLLM {serving}")
    ram = tune.get("socket_ram_gb")
    if ram is not None and tune.get("kv_granted_gb") is not None and tune["kv_granted_gb"] > ram:
        out.append(f"cpu_tune.py grants {tune['kv_granted_gb']} GiB of KV cache on a socket of {ram} GiB")
    sized = (est.get("kv_layers") or {}).get("ssm_state_dtype")
    if sized and det.get("avx512_bf16") is not None:
        # the SSM state's dtype, and so the KV page, depends on the CPU (kv_cache.ssm_state_dtype)
        served = ssm_state_dtype(bool(det["avx512_bf16"]), est.get("kv_dtype") or "bfloat16")
        if sized != served:
            out.append(f"estimate_memory.py sized the recurrent state in {sized}, vLLM keeps it in {served} on the "
                       f"CPU detect.py read (AVX-512 BF16: {'yes' if det['avx512_bf16'] else 'no'}; pass "
                       f"--avx512-bf16 {'yes' if det['avx512_bf16'] else 'no'})")
    vendor = det.get("vendor")
    if val.get("backend") == "zentorch" and vendor != "AuthenticAMD":
        # vLLM picks ZenCpuPlatform only on an AMD CPU: elsewhere zentorch is installed and never runs. A CPU
        # whose vendor detect.py could not read is no AMD one either (it would not call it an EPYC)
        out.append(f"validate.py chose the zentorch backend, which vLLM activates only on AMD CPUs; detect.py read "
                   + (f"a {common.clip(vendor, 40)} CPU" if isinstance(vendor, str) else "no CPU vendor"))
    if chk.get("launchable") and chk.get("kind") not in LAUNCHABLE_KINDS:
        out.append(f"check_model.py calls a {chk.get('kind')!r} model launchable")
    listed = [s.get("socket") for s in tune.get("sockets") or [] if isinstance(s, dict)]
    if listed and "chosen_socket" in tune and tune["chosen_socket"] not in listed:  # the summary would name it
        out.append(f"cpu_tune.py chose socket {tune['chosen_socket']}, which its own sockets ({listed[:8]}) do not list")
    if det.get("target") and tune.get("target") and det["target"] != tune["target"]:
        out.append(f"detect.py read {det['target']}, cpu_tune.py sized {tune['target']}")
    read, checked_on = det.get("target", "localhost"), val.get("target", "localhost")
    # one machine only when one target: validate.py run here for a plan of a spec, capture or sysroot tree
    # of another host would start that host's sizing here with nothing deferred (a tree standing in for
    # this machine is validated with --detect of that tree)
    if read != checked_on:
        out.append(f"detect.py read {read}, validate.py checked {checked_on}")
    return out


def build_plan(inp: dict, opt: dict, epyc: dict, facts: dict) -> dict:
    """Everything start needs, and the summary the human confirms, from the five JSON inputs, the
    options, and the host facts that matter (`facts`: hf_token_set, hf_offline, api_key_set,
    api_key_length (None: not known here), unsendable_secrets (the secret variables whose values no
    header carries), model_dir -- the real path of a local model folder, or None; hf_cache -- the cache folder as it is
    now, validate.cache_listing, or None where no container mounts it)."""
    det, val, chk, est, tune = (inp["detect"], inp["validate"], inp["check_model"], inp["estimate_memory"],
                                 inp["cpu_tune"])
    if not val.get("ready"):
        errs = "; ".join(e["message"] for e in val.get("errors", [])) or "not ready"
        raise ScriptError(f"validate.py is not ready: {errs}", (val.get("errors") or [{}])[0].get("fix")
                          or "fix what validate.py reported, then re-run it")
    if chk.get("launchable") is False:
        raise ScriptError(f"check_model.py: {chk.get('message')}", "choose a model vLLM serves as chat/completions")
    wrong = mismatches(inp)
    if wrong:
        raise ScriptError("the five documents do not describe one serve: " + "; ".join(wrong),
                          "re-run the steps from the first one that differs, for one model on one host, "
                          "and plan from those files")
    fit = est.get("fit")
    if fit and not fit["fits"]:
        raise ScriptError(f"does not fit: required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM",
                          fit.get("action") or "lower --max-model-len or use a smaller model")
    model = opt.get("model") or chk.get("model")
    if chk.get("model") and model != chk["model"]:
        raise ScriptError(f"check_model.py ran for {chk['model']}, the plan is for {model}",
                          "run check_model.py and estimate_memory.py for the model you serve")
    path = val["path"]
    backend = val.get("backend") or "zentorch"
    if not isinstance(model, str) or not model or model.startswith("-") or any(ord(c) < 32 for c in model):
        raise ScriptError(f"model {model!r} would be read as an option or is not one argument",
                          "pass a Hub id (owner/name) or a folder path that does not start with '-' (e.g. ./-name)")
    problem = pin_prefix_problem(tune.get("host_pin_argv", []), tune.get("container_cpuset_argv", []),
                                 tune.get("numa_nodes"), bound_cpus(tune))
    if problem:
        raise ScriptError(problem, "pass the unmodified output of cpu_tune.py")
    if path == "host" and not (isinstance(val.get("python"), str) and val["python"].startswith("/")):
        raise ScriptError(f"validate.py's python {val.get('python')!r} is not an absolute path",
                          "pass the unmodified output of validate.py (it names the interpreter by absolute path)")
    dtype = opt.get("dtype") or epyc["precision"]["default"]
    if backend != "stock" and dtype not in epyc["precision"]["host_stack_supported"]:
        raise ScriptError(f"{dtype} is not a compute dtype of the zentorch CPU platform: "
                          + epyc["precision"]["host_stack_note"],
                          f"use {' or '.join(epyc['precision']['host_stack_supported'])}")
    if est.get("dtype") is not None and est["dtype"] != dtype:  # weights and KV bytes are per dtype: float32
        # sized as bfloat16 is twice the memory the summary would call a fit
        raise ScriptError(f"estimate_memory.py sized the model at {common.clip(str(est['dtype']), 40)}, the plan "
                          f"serves {dtype}", f"run estimate_memory.py with --dtype {dtype} (then cpu_tune.py with its "
                          "figures), or plan with the dtype it sized; then plan again")
    max_len = int(opt.get("max_model_len") or (fit or {}).get("max_model_len")
                  or epyc["serve"]["default_max_model_len"])
    sized = (fit or {}).get("max_model_len")
    if opt.get("max_model_len") and sized and max_len > sized:  # the fit and the KV grant are for `sized` tokens
        raise ScriptError(f"--max-model-len {max_len} is past the {sized} tokens estimate_memory.py sized (and "
                          "cpu_tune.py granted KV cache for)" + (f"; the model's own limit is "
                          f"{est['model_max_seq_len']}" if est.get("model_max_seq_len") else ""),
                          f"re-run estimate_memory.py --max-model-len {max_len}, then cpu_tune.py with its "
                          "kv_needed_gb, and plan with those (launch.py up does all three)")
    port = int(opt.get("port") or val["port"])
    expose = bool(opt.get("expose"))
    key_env = opt.get("api_key_env")
    if expose and not key_env:
        raise ScriptError("--expose serves on all interfaces: an API key is required",
                          "export a key in an env var and pass --api-key-env NAME")
    if key_env and not facts.get("api_key_set"):
        raise ScriptError(f"--api-key-env {key_env}: that variable is not set", f"export {key_env}=<key> first")
    if key_env and facts.get("api_key_length") is not None and facts["api_key_length"] < API_KEY_MIN:
        # a short key is guessed, and masking it would blank words wherever it appears ("local", "error")
        raise ScriptError(f"--api-key-env {key_env}: the key is {facts['api_key_length']} characters; a key needs "
                          f"{API_KEY_MIN} at least", f"export {key_env} as a longer random key, e.g. "
                          f"export {key_env}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')")
    if facts.get("unsendable_secrets"):
        name = facts["unsendable_secrets"][0]
        raise ScriptError(secret_unsendable(name), f"export {name} again with the token alone (printable ASCII, "
                          "no spaces), then plan")
    host = "0.0.0.0" if expose else epyc["serve"]["bind_host"]
    served = opt.get("served_model_name") or served_model_name(model, facts.get("model_dir"))
    if not is_served_name(served):
        raise ScriptError(f"served model name {served!r} is not a plain name (letters, digits and ._:@+/-, not "
                          "starting with '-', at most 200)", "pass --served-model-name NAME")
    version = (val.get("stack") or {}).get("vllm")
    device = needs_device_flag(version, epyc["serve"]["device_cpu_flag_removed_in"])
    rules = sizing_rules(opt.get("sizing") or "skill")
    env = {}
    if rules["bind"]:
        env["VLLM_CPU_OMP_THREADS_BIND"] = tune["vllm_cpu_omp_threads_bind"] if rules["bind"] == "cores" else "nobind"
    if rules["kv"]:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(tune["kv_granted_gb"])
    if (opt.get("throughput_flags") or rules["throughput"]) and backend == "stock":
        raise ScriptError("the throughput flags are for the zentorch path only: on stock vLLM CPU (vLLM 0.32, "
                          "CpuPlatform) the engine segfaults in onednn_mm while warming up (measured on an Intel "
                          "runner, 2026-12-01)", "plan without --throughput-flags on the stock path")
    if opt.get("throughput_flags") or rules["throughput"]:
        env.update(throughput_env(epyc["throughput_flags"]))
        extra_warnings = [{"check": "throughput_flags", "message": epyc["throughput_flags"]["gotcha"], "fix": None}]
    else:
        extra_warnings = []
    if opt.get("kernel_log"):  # every zentorch matmul logs its plugin_op and kernel: kernel_proof.py reads them
        env.update({"ZENDNNL_API_LOG_LEVEL": "4", "ONEDNN_VERBOSE": "1"})
    if facts.get("hf_offline"):
        env["HF_HUB_OFFLINE"] = "1"  # an offline host serves from its HF cache, and so does the server
    # secrets the server gets, and the variable each value is read from at start (never written here)
    secrets = {**({"HF_TOKEN": "HF_TOKEN"} if facts.get("hf_token_set") else {}),
               **({"VLLM_API_KEY": key_env} if key_env else {})}
    env_by_name = list(secrets)
    name = f"{epyc['container']['name']}-{port}"  # one container per endpoint: plans never remove each other's
    state_dir = Path(opt.get("state_dir") or state_root() / (name if path != "host" else f"host-{port}"))
    warnings = [{"check": w["check"], "message": w["message"], "fix": w.get("fix")}
                for w in [*tune.get("warnings", []), *val.get("warnings", []), *extra_warnings]]
    batched = int(est.get("max_num_batched_tokens") or epyc["serve"]["max_num_batched_tokens"])
    capacity = kv_capacity(tune["kv_granted_gb"], est.get("kv_bytes_per_token"), est.get("kv_bytes_per_sequence")
                           if not opt.get("max_model_len") or opt.get("max_model_len") == (fit or {}).get(
                               "max_model_len") else None, epyc["serve"]["max_num_seqs_cap"], batched)
    opts = serve_options(served, host, port, dtype, max_len, device, capacity["max_num_seqs"] if rules["seqs"] else None,
                         batched if rules["seqs"] else None)
    # the revision checked and sized is the one served (vLLM takes the tokenizer's from it); a folder has none
    for reader, said in (("check_model.py", chk), ("estimate_memory.py", est)):
        # the model as typed is found again here, from this folder: a relative path, or a folder named like a
        # Hub id, can mean another model than the one checked and sized (an older document has no model_dir)
        if "model_dir" in said and said["model_dir"] != facts.get("model_dir"):
            read = said["model_dir"] or f"the Hub id {said.get('model')}"
            here = facts.get("model_dir") or "a Hub id (no such folder here)"
            raise ScriptError(f"{reader} read {read}, but {model} is {here} from where plan runs",
                              "run check_model.py, estimate_memory.py and plan from the same folder, or pass the "
                              "model folder as an absolute path")
    revision = None if facts.get("model_dir") else chk.get("revision")
    if revision is not None and not is_revision(revision):  # a document's value becomes a vLLM argument
        raise ScriptError(f"check_model.json's revision {str(revision)[:200]!r} is not a branch, tag or commit",
                          "run check_model.py (and estimate_memory.py) again with a plain --revision")
    if revision:
        opts += ["--revision", revision]
    pre: list[list[str]] = []
    if path == "host":
        vllm_bin = str(Path(val["python"]).parent / "vllm")
        env["PYTHONUNBUFFERED"] = "1"  # the log tail a failed verify shows is the server's last words
        preload = preload_value((val.get("ld_preload") or {}).get("value"), epyc["host_stack"]["ld_preload_libs"])
        if preload and rules["preload"]:
            env["LD_PRELOAD"] = preload
        # a local folder by its real absolute path: the command means the same from any directory
        argv = [*(tune.get("host_pin_argv", []) if rules["pin"] else []), vllm_bin, "serve",
                facts.get("model_dir") or model, *opts]
        runtime = "host"
        stop_cmd = "python3 scripts/launch.py stop --plan <plan.json>  (or: kill the recorded pid's group)"
    else:
        rt = common.runtime_argv(val["runtime"], val.get("engine"))  # the daemon validate probed
        image = val["image"]
        model_arg, mount = model, []
        if facts.get("model_dir"):  # a local folder goes into the container read-only
            model_arg = f"/models/{Path(facts['model_dir']).name}"
            mount = bind_mount(facts["model_dir"], model_arg, read_only=True)
        # the hub cache only, where the container's huggingface_hub looks for models (see validate.py); a
        # validate.json of an older bundle names a whole HF_HOME (mount_subdir null): rendered as it was, so
        # stop still acts on the server it started, but never started again
        subdir = val["hf_cache"].get("mount_subdir")
        hf_target = epyc["container"]["hf_cache_mount_target"] + (f"/{subdir}" if subdir else "")
        hf_mount = bind_mount(val["hf_cache"]["path"], hf_target)  # the system-folder fence first: its wording
        if subdir is None and not (facts.get("hf_cache") or {}).get("from_plan"):
            raise ScriptError("validate.json is from an older version of this bundle (it mounts a whole HF_HOME; "
                              "now only its hub cache is mounted)", "run validate.py again, then plan again")
        if not val.get("deferred"):  # another host's cache is checked there, by its own chain
            problem = hf_mount_problem(val["hf_cache"]["path"], facts.get("hf_cache"))
            if problem:
                raise ScriptError(f"cannot mount the Hugging Face hub cache {val['hf_cache']['path'][:300]!r} "
                                  f"read-write into the container: it {problem}", HF_MOUNT_FIX)
        argv = container_run_argv(rt, name, epyc["container"]["run_flags"],
                                  tune["container_cpuset_argv"] if rules["pin"] else [],
                                  hf_mount, mount, env,
                                  str(state_dir / "secrets") if secrets else None, image, [model_arg, *opts],
                                  epyc["container"]["shm_size_if_ipc_isolated"])
        pre = [[*rt, "rm", "-f", name], [*rt, "pull", image]]
        runtime = val["runtime"]
        # launch.py stop first: it also removes the key files start wrote (the runtime's pair leaves them)
        by_hand = runtime_stop_pair(rt, name) + " && " + shlex.join(["rm", "-rf", str(state_dir / "secrets")])
        stop_cmd = f"python3 scripts/launch.py stop --plan <plan.json>  (by hand: {by_hand})"
    quant = quantized_path(chk.get("quantization"), backend, dtype, epyc, det.get("avx512"))
    if quant and quant["served_on_cpu"] is False:
        raise ScriptError(f"{model} is a {quant['method']} {quant['bits'] or '?'}-bit checkpoint this CPU's "
                          f"{backend} path cannot run: {quant['note']}", "serve the unquantized (bfloat16) "
                          "checkpoint here, or this one on a CPU with AVX-512")
    plan = {
        "target": det.get("target", "localhost"), "deferred": val.get("deferred", []),
        "path": path, "backend": backend, "platform": (val.get("stack") or {}).get("platform"),
        "runtime": runtime, "engine": val.get("engine") if path != "host" else None,
        "image": val.get("image"), "model": model, "served_model_name": served,
        "kind": chk.get("kind"), "primary_endpoint": chk.get("primary_endpoint") or "unknown",
        "supported_endpoints": chk.get("supported_endpoints") or [],
        "chat_template_status": (chk.get("chat_template") or {}).get("status"),
        "host": host, "port": port, "base_url": f"http://127.0.0.1:{port}/v1", "expose": expose,
        "api_key_env": key_env, "dtype": dtype, "max_model_len": max_len, "vllm_version": version,
        "quantization": quant, "model_dir": facts.get("model_dir"), "revision": revision,
        "env": env, "env_by_name": env_by_name, "secrets": secrets, "pre_argv": pre, "argv": argv,
        "command": shlex.join(argv), "container_name": name if path != "host" else None,
        "state_dir": str(state_dir), "log_file": str(state_dir / "server.log"),
        "state_file": str(state_dir / "state.json"), "stop_command": stop_cmd,
        "requires_confirmation": bool(val.get("requires_confirmation")),
        "confirmation_reasons": [c["message"] for c in val.get("confirmations", [])],
        "warnings": warnings,
        "sizing": {"sizing_rule": opt.get("sizing") or "skill",
                   "socket": tune["chosen_socket"], "socket_choice_reason": tune["socket_choice_reason"],
                   "vllm_cpu_omp_threads_bind": tune["vllm_cpu_omp_threads_bind"], "omp_threads": tune.get("omp_threads"),
                   "kv_granted_gb": tune["kv_granted_gb"], **capacity, "numa_nodes": tune["numa_nodes"],
                   "max_num_batched_tokens": batched if rules["seqs"] else None,
                   "max_model_len": max_len},
    }
    plan["inputs"] = inp  # start re-renders from these and refuses a plan whose command was edited
    # the state dir as resolved here: a default one derives from $XDG_CACHE_HOME / $HOME, and stop run from
    # another shell (the human's terminal) must still find the server this plan's start recorded
    plan["options"] = {k: v for k, v in {**opt, "state_dir": str(state_dir)}.items() if v is not None}
    plan["summary"] = summary_rows(plan, det, fit)
    plan["summary_markdown"] = markdown_table(["Field", "Value"], plan["summary"])
    # what the human is shown must be a plan start would accept (a port 0 or an image that reads as an
    # option, taken from a hand-made document, is refused here rather than after they said yes)
    common.check_schema(plan, "plan", "the plan these documents render is not one start would run",
                        "pass the unmodified outputs of detect, validate, check_model, estimate_memory and cpu_tune")
    return plan


MARKER_ENV = "SERVING_LLMS_ON_EPYC_RUN"  # the run token start gives every server process (see serve_life)
# what a host server takes from the shell that starts it, besides the plan's own env and secrets
# (which the summary shows): where it finds programs, its home and caches, locale and proxies
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "HF_HOME", "HF_HUB_CACHE",
                 "HUGGINGFACE_HUB_CACHE",
                 "XDG_CACHE_HOME", "HF_ENDPOINT", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "SSL_CERT_FILE",
                 "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                 "http_proxy", "https_proxy", "no_proxy")


def server_env(shell: dict, plan_env: dict, secrets: dict, token: str) -> dict:
    """The host server's whole environment: the plan's env and secrets (what the human approved), the
    few INHERITED_ENV names and LC_* from this shell, and the run marker -- not whatever else the shell
    holds (an LD_LIBRARY_PATH or VLLM_* there would change what runs without being in the summary)."""
    base = {k: v for k, v in shell.items() if k in INHERITED_ENV or k.startswith("LC_")}
    return {**base, **plan_env, **secrets, MARKER_ENV: token}


def summary_rows(plan: dict, det: dict, fit: dict | None) -> list[list[str]]:
    platform = (plan.get("platform") or "platform not probed").rsplit(".", 1)[-1]
    backend = (f"stock vLLM CPU ({platform}), no zentorch: unaccelerated" if plan["backend"] == "stock"
               else "zentorch-accelerated (ZenCpuPlatform)")
    where = ("host venv (" + next(a for a in plan["argv"] if a.endswith("/vllm")) + ")" if plan["path"] == "host"
             else f"container ({plan['runtime']}, {plan['image']}"
             + (f", on the engine at {plan['engine']})" if plan.get("engine") else ")"))
    s = plan["sizing"]
    rows = [
        ["Model / kind", f"{plan['model']}" + (f" at revision {plan['revision']}" if plan.get("revision") else "")
                         + f" -- {plan['kind']}, endpoint "
                         + ("unknown until verify settles it (chat first, then completions)"
                            if plan["primary_endpoint"] == "unknown" else plan["primary_endpoint"])],
        ["Backend", backend],
        ["Path", where],
        ["Precision", plan["dtype"] + (f" activations; weights {q['method']} {q['bits'] or '?'}-bit, run by "
                                       f"{q['kernel'] or 'a kernel vLLM picks at load (unknown to this skill)'}"
                                       if (q := plan.get("quantization")) else "")],
        ["Fit", f"required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM" if fit else "not estimated"],
        ["CPU sizing", f"socket {s['socket']} ({s['socket_choice_reason']}), bind {s['vllm_cpu_omp_threads_bind']}, "
                       f"KV {s['kv_granted_gb']} GiB (socket-local), memory on nodes "
                       f"{','.join(map(str, s['numa_nodes']))}"],
        ["KV cache", (f"holds {s['kv_tokens']:,} tokens = {s['kv_full_length_requests']} requests of "
                      f"{s['max_model_len']} tokens at once; --max-num-seqs {s['max_num_seqs']}"
                      + (f", --max-num-batched-tokens {s['max_num_batched_tokens']}"
                         if s.get("max_num_batched_tokens") else ""))
         if s.get("kv_tokens") is not None and s.get("kv_full_length_requests") is not None
         else (f"holds {s['kv_full_length_requests']} requests at once (a recurrent state per sequence, no "
               f"per-token KV); --max-num-seqs {s['max_num_seqs']}")
         if s.get("kv_full_length_requests") is not None
         else "capacity not computed (max_model_len differs from the estimate's)"],
        *([["Sizing rule", f"{s['sizing_rule']} (a comparison baseline, not the skill's sizing)"]]
           if s["sizing_rule"] != "skill" else []),
        ["Hardware", (f"EPYC {det.get('epyc_generation')} ({det.get('zen_arch')})" if det.get("is_amd_epyc")
                      else f"{det.get('cpu_model')} (not an AMD EPYC)")
                     + f", {det.get('physical_cores')} cores, AVX-512 {'yes' if det.get('avx512') else 'no'}"],
        ["Port", f"{plan['port']} on {plan['host']}" + (" (exposed, API key required)" if plan["expose"] else "")],
    ]
    pin = [a for a in plan["argv"][:plan["argv"].index(next(a for a in plan["argv"] if a.endswith("/vllm")))]] \
        if plan["path"] == "host" else []
    rows.append(["Pinning", shlex.join(pin) if pin else ("--cpuset-* flags in the command" if plan["path"] != "host"
                                                         else "none (numactl/taskset not found)")])
    rows.append(["Environment", ", ".join(f"{k}={v}" for k, v in plan["env"].items())
                 + "".join(f", {k} (from ${src}, value not shown)" for k, src in plan["secrets"].items())
                 + ("; from this shell only " + ", ".join(n for n in INHERITED_ENV if n.isupper() and "PROXY" not in n)
                    + ", LC_* and the proxy variables" if plan["path"] == "host" else "")])
    rows.append(["Command (exactly what start runs)", plan["command"]])
    if plan["deferred"]:
        rows.append(["Planned for", f"{plan['target']} -- not this machine: {', '.join(plan['deferred'])} are "
                                    "assumed; re-check on the host before start (run the chain there)"])
    for w in plan["warnings"]:
        rows.append(["Warning", w["message"]])
    for c in plan["confirmation_reasons"]:
        rows.append(["Needs your OK", c])
    return rows


def table_cell(value) -> str:
    """One cell on one line, as the human will read it: `|` escaped, and every character that is not
    printable shown as its escape -- a newline from a document would end the row, an ESC or a bidi
    override could redraw the very line of the command the human is approving."""
    text = str(value).replace("|", "\\|")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(table_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- pure: judging the server

def smoke_request(endpoint: str, served: str) -> tuple[str, dict]:
    """The one deterministic request verify sends on the primary endpoint."""
    if endpoint == "chat_completions":
        return "/v1/chat/completions", {"model": served, "messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 16, "temperature": 0}
    return "/v1/completions", {"model": served, "prompt": "Hello, world", "max_tokens": 16, "temperature": 0}


# a key's name then ':' or '=' (a header, JSON, a query string): "token count 5" is prose, not a credential
_BEARER = re.compile(r"(?i)(bearer\s+|(?:api[_-]?key|token)[\"']?\s*[:=][\"'\s]*)[^\s\"',}]+")


def mask_token_patterns(text: str) -> str:
    """Anything after `Bearer`/`api_key`/`token` masked (a server that reflects headers must not get the key
    printed). Cheap on text without those words: the pattern alone cost 5 s a million lines."""
    low = text.lower()
    if "bearer" in low or "api" in low or "token" in low:  # what _BEARER needs to match at all
        text = _BEARER.sub(lambda m: m.group(1) + "***", text)
    return text


def mask_server_text(text: str, forms: list[str]) -> str:
    """A server's text with the secrets' forms (common.secret_forms: every value, longest first, in every
    form) masked, URL credentials too, and then the token patterns. In that order: a secret holding a
    shorter one, or the word `token=`, would otherwise lose only that part, and show the rest. The forms
    come prepared: kernel_proof masks every line of a log with the same ones."""
    return mask_token_patterns(common.mask_forms(text, forms))


def redact(text: str, secrets: list[str], limit: int = 200) -> str:
    """A server's text as we may show it: masked, then shortened -- in that order, as a cut made first can
    leave part of a secret that no mask then sees. Masked are the plan's secrets and every secret this
    shell holds (the host server inherits HF_ENDPOINT, so its log can quote a mirror's password)."""
    text = mask_server_text(text, common.secret_forms([*secrets, *common.secret_values()]))
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def judge_smoke(status: int, body: str, endpoint: str, secrets: list[str] = ()) -> tuple[bool, str]:
    """A 200 is not enough: the body must be a completion with a non-error, non-empty first choice.
    Any server text in the verdict is redacted."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # ValueError: not JSON, or an integer past Python's 4300 digits
        return False, f"HTTP {status}, body is not JSON: {redact(body, secrets)!r}"
    if status != 200:
        return False, f"HTTP {status}: {redact(json.dumps(doc), secrets)}"
    if not isinstance(doc, dict) or "error" in doc or doc.get("object") == "error":
        return False, f"HTTP 200 carrying an error: {redact(json.dumps(doc), secrets)}"
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False, "no choices in the response"
    first = choices[0]
    if not isinstance(first, dict):
        return False, "choices[0] is not an object"
    message = first.get("message") if endpoint == "chat_completions" else None
    text = (message.get("content") if isinstance(message, dict) else None) if endpoint == "chat_completions" \
        else first.get("text")
    if not isinstance(text, str):
        return False, f"choices[0] has no {'message.content' if endpoint == 'chat_completions' else 'text'}"
    usage = doc.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:  # true is not a count
        return False, "the server generated no tokens (usage.completion_tokens missing or 0)"
    return True, redact(text, secrets)


def handoff_doc(plan: dict, served: str | None = None, settled: str | None = None) -> dict:
    """What the user gets: base URL, endpoint, examples. An endpoint the plan left "unknown" is the one
    verify settled on the running server (`settled`); before that there is nothing true to hand off."""
    served = served or plan["served_model_name"]
    endpoint = plan["primary_endpoint"] if plan["primary_endpoint"] != "unknown" else settled
    if endpoint not in ("chat_completions", "completions"):
        raise ScriptError("the plan's endpoint is unknown (the chat template could not be read) and verify has not "
                          "settled it yet", "run: python3 scripts/launch.py verify --plan <plan.json>, then handoff")
    path = "/v1/chat/completions" if endpoint == "chat_completions" else "/v1/completions"
    why = ("settled by verify: " if settled and plan["primary_endpoint"] == "unknown" else "") + (
        "a chat template is present" if endpoint == "chat_completions" else "no usable chat template: raw prompts")
    base = plan["base_url"]
    key_env = plan.get("api_key_env")
    if key_env is not None and not common.is_env_name(key_env):  # pasted into a shell example: a name only
        raise ScriptError(f"the plan's api_key_env {key_env!r} is not an environment variable name",
                          "plan again with --api-key-env NAME")
    key = f"os.environ[{plan['api_key_env']!r}]" if plan.get("api_key_env") else '"EMPTY"'
    if endpoint == "chat_completions":
        body = {"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 128,
                "temperature": 0.7}
        py_call = ("r = client.chat.completions.create(model=model, messages=[{\"role\": \"user\", \"content\": "
                   "\"Hello\"}], max_tokens=128, temperature=0.7)\nprint(r.choices[0].message.content)")
    else:
        body = {"model": served, "prompt": "Hello, world", "max_tokens": 128, "temperature": 0.7}
        py_call = ("r = client.completions.create(model=model, prompt=\"Hello, world\", max_tokens=128)\n"
                   "print(r.choices[0].text)")
    # quoted word by word; the key is expanded by the user's shell from the variable's NAME
    auth = f' -H "Authorization: Bearer ${{{key_env}}}"' if key_env else ""
    curl = (shlex.join(["curl", "-s", base + path[3:], "-H", "Content-Type: application/json"]) + auth
            + " \\\n  -d " + shlex.quote(json.dumps(body)))
    python = ("import os\nfrom openai import OpenAI\n\n"
              f"client = OpenAI(base_url=\"{base}\", api_key={key})\n"
              f"model = {json.dumps(served)}  # the served model name\n" + py_call)
    s = plan["sizing"]
    runs_on = f"{plan['runtime']} / {plan['port']}" + (f" (engine {plan['engine']})" if plan.get("engine") else "")
    # an exposed server listens on every address: the base URL is this machine's; others use its address
    reach = (f"; it listens on every address ({plan['host']}:{plan['port']}): from another machine use this "
             f"host's address, with the key in ${key_env}") if plan.get("expose") else ""
    rows = [["Base URL", f"{base} (the trailing /v1 matters{reach})"], ["Served model", served],
            ["Endpoint", path], ["Why", why], ["Runtime / port", runs_on],
            ["Sizing", f"{s['omp_threads']} OMP threads ({s['vllm_cpu_omp_threads_bind']}), KV {s['kv_granted_gb']} GiB, "
                       f"--max-model-len {s['max_model_len']}, socket {s['socket']}, NUMA "
                       f"{','.join(map(str, s['numa_nodes']))}"],
            ["Stop", plan["stop_command"]]]
    return {"base_url": base, "served_model_name": served, "endpoint_path": path, "why": why, "runtime": plan["runtime"],
            # the daemon the container runs on (docker --host=...): the one `docker logs` or `exec` must name
            "engine": plan.get("engine"), "port": plan["port"], "sizing": s, "stop_command": plan["stop_command"], "curl_example": curl,
            "python_example": python, "table_markdown": markdown_table(["Field", "Value"], rows),
            "guidance": ["max_tokens caps the output; prompt tokens + max_tokens must stay <= --max-model-len "
                         f"({s['max_model_len']})",
                         "temperature 0 is greedy; tune temperature or top_p, not both",
                         "stream: true streams tokens (server-sent events)",
                         "the model's generation_config.json may set sampling defaults; pass explicit values"]}

