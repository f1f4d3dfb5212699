"""The plan's commands: vllm serve's argv, the container run, the environment and the pin."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from epyc import bundle
from epyc.errors import ScriptError
from epyc.facts import hostfacts, hubcache, quantization
from epyc.subproc import MARKER_ENV, STOP_GRACE_S


def served_model_name(model: str, model_dir: str | None) -> str:
    """The id clients send: the Hub id as is, a local folder by its name."""
    return Path(model_dir or model).name if (model_dir or model.startswith((".", "/", "~"))) else model


def quantized_path(
    report: dict | None, backend: str, dtype: str, epyc: dict, avx512: bool | None = None
) -> dict | None:
    """The checkpoint's quantization and the kernel this plan's backend and dtype run it with on this CPU."""
    if not report:
        return None
    desc = {k: report.get(k) for k in ("method", "format", "bits", "symmetric", "group_size")}
    kernels, needs = epyc["quantization"]["kernels"], epyc["quantization"].get("stock_needs_avx512")
    return {**desc, **quantization.cpu_kernel(desc, backend, dtype, kernels, avx512, needs)}


def stop_command(plan_file: str | Path) -> str:
    """The one stop command every document prints: this bundle's launch.py, by absolute paths, on a plan file."""
    return shlex.join(["python3", str(bundle.SCRIPTS / "launch.py"), "stop", "--plan", os.path.abspath(plan_file)])


def runtime_stop_pair(rt: list[str], name: str, state_dir: str | Path | None = None) -> str:
    """The by-hand form of launch.py stop: the runtime's own graceful stop and removal of the container, and
    (with the state dir) of the key files start wrote there."""
    steps = [[*rt, "stop", "-t", str(STOP_GRACE_S), name], [*rt, "rm", name]]
    if state_dir is not None:
        steps.append(["rm", "-rf", str(Path(state_dir) / "secrets")])
    return " && ".join(shlex.join(c) for c in steps)


SECRETS_TARGET = "/run/secrets/serving-llms-on-epyc"
TLS_TARGET = {k: f"{SECRETS_TARGET}-tls/{k}.pem" for k in ("cert", "key")}  # the pair, mounted read-only
# Inside the container: export each mounted secret file (named after its variable) and exec vLLM.
# A constant script, never built from input; the serve arguments arrive as "$@".
SECRET_LOADER = (
    "for f in " + SECRETS_TARGET + '/*; do [ -f "$f" ] && export "${f##*/}=$(cat "$f")"; done; exec vllm serve "$@"'
)


def container_run_argv(
    rt: list[str],
    name: str,
    run_flags: list[str],
    cpuset: list[str],
    hf_mount: list[str],
    model_mount: list[str],
    env: dict,
    secrets_dir: str | None,
    image: str,
    serve_args: list[str],
    shm_size: str = "16g",
) -> list[str]:
    """`RT run -d` with the sizing env as values and secrets as read-only files (never in the argv or
    `docker inspect`); the entrypoint is set explicitly, so the command is the same whatever the image declares."""
    argv = [*rt, "run", "-d", "--name", name, *run_flags, *cpuset, *hf_mount, *model_mount]
    if "--ipc=host" not in run_flags:  # an isolated IPC namespace needs a big /dev/shm instead
        argv.append(f"--shm-size={shm_size}")
    if secrets_dir:
        argv += hubcache.bind_mount(secrets_dir, SECRETS_TARGET, read_only=True)  # a ':' in a --state-dir: refused
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    if secrets_dir:
        return argv + ["--entrypoint", "sh", image, "-c", SECRET_LOADER, "vllm", *serve_args]
    return argv + ["--entrypoint", "vllm", image, "serve", *serve_args]


def serve_args(argv: list[str], container: bool) -> list[str]:
    """What `vllm serve` is given (the model first), read by the shape of a command this module built: the
    container's `vllm IMAGE serve ARGS` or loader form, or the host's `[PIN...] /venv/bin/vllm serve ARGS`."""
    if container:
        at = argv.index("--entrypoint")
        return argv[at + 6 :] if argv[at + 1] == "sh" else argv[at + 4 :]
    at = next(k for k, a in enumerate(argv) if a.endswith("/vllm") and argv[k + 1 : k + 2] == ["serve"])
    return argv[at + 2 :]


def throughput_env(flags: dict) -> dict:
    """The opt-in throughput flags, all or none: FREEZING alone crashes engine init."""
    env = dict(flags["env"])
    missing = [k for k in flags["required_together"] if k not in env]
    if missing:
        raise ScriptError(f"throughput flags incomplete: {missing}", "data/epyc.json must pair the flags")
    return env


_CPULIST = re.compile(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")


def pin_prefix_problem(
    argv: list, cpuset: list, numa_nodes: list | None = None, bind: list[int] | None = None
) -> str | None:
    """cpu_tune's pin prefix and cpuset flags run as part of the command: only the shapes cpu_tune makes
    (numactl --cpunodebind=N --membind=N, taskset -c LIST, nothing) -- never a program a document names;
    given the document's numa_nodes, memory bound to exactly those nodes (the ones it sized), on the host
    and in the container alike; given its thread bind, CPUs that hold it (taskset: exactly it)."""
    mems = ",".join(map(str, numa_nodes)) if numa_nodes is not None else None

    def listed(arg: str, flag: str) -> str | None:
        return arg[len(flag) :] if arg.startswith(flag) and _CPULIST.fullmatch(arg[len(flag) :]) else None

    def nodes(arg: str, flag: str) -> bool:
        value = listed(arg, flag)
        return value is not None and (mems is None or value == mems)

    def cpus(value: str | None, exact: bool) -> bool:
        if value is None or bind is None:
            return value is not None
        have = set(hostfacts.parse_cpulist(value))
        return have == set(bind) if exact else set(bind) <= have

    pin = len(argv) == 3 and (
        (argv[0] == "numactl" and nodes(argv[1], "--cpunodebind=") and nodes(argv[2], "--membind="))
        or (argv[:2] == ["taskset", "-c"] and cpus(listed(argv[2], ""), exact=True))
    )
    if not (argv == [] or pin):
        return f"cpu_tune's host_pin_argv {argv!r} is not a numactl or taskset prefix cpu_tune makes for its bind"
    if not (
        cpuset == []
        or (
            len(cpuset) == 2
            and cpus(listed(cpuset[0], "--cpuset-cpus="), exact=False)
            and nodes(cpuset[1], "--cpuset-mems=")
        )
    ):
        return (
            f"cpu_tune's container_cpuset_argv {cpuset!r} is not the --cpuset-cpus/--cpuset-mems pair of the "
            "CPUs it binds and the NUMA nodes it sized"
        )
    return None


def bound_cpus(value: object) -> list[int] | None:
    """The CPUs a VLLM_CPU_OMP_THREADS_BIND value binds vLLM's OpenMP threads to (every rank's), or None when it
    binds none by list (`nobind`, `auto`)."""
    lists = value.split("|") if isinstance(value, str) else []  # a list per tensor-parallel rank
    if not lists or not all(_CPULIST.fullmatch(x) for x in lists):
        return None
    try:
        return sorted({c for x in lists for c in hostfacts.parse_cpulist(x)})
    except ValueError:
        return None


# what a host server takes from the shell that starts it, besides the plan's own env and secrets
# (which the summary shows): where it finds programs, its home and caches, locale and proxies
INHERITED_ENV = tuple(
    "PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR HF_HOME HF_HUB_CACHE HUGGINGFACE_HUB_CACHE XDG_CACHE_HOME "
    "HF_ENDPOINT HF_HUB_ETAG_TIMEOUT HF_HUB_DOWNLOAD_TIMEOUT SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE "
    "CURL_CA_BUNDLE HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy".split()
)


def inherited_env(shell: dict) -> dict:
    """The few INHERITED_ENV names and LC_* of this shell that a host server takes from it."""
    return {k: v for k, v in shell.items() if k in INHERITED_ENV or k.startswith("LC_")}


def server_env(shell: dict, plan_env: dict, secrets: dict, token: str) -> dict:
    """The host server's whole environment: the plan's env and secrets (what the human approved), what it
    inherits from this shell, and the run marker -- not whatever else the shell holds (an LD_LIBRARY_PATH
    or VLLM_* there would change what runs without being in the summary)."""
    return {**inherited_env(shell), **plan_env, **secrets, MARKER_ENV: token}


def as_flags(values: dict) -> list[str]:
    """{option: value} as the flags a script takes: True alone, None and False left out."""
    pairs = [(f"--{k.replace('_', '-')}", v) for k, v in values.items() if v is not None and v is not False]
    return [x for flag, v in pairs for x in ([flag] if v is True else [flag, str(v)])]


def router_binary(epyc: dict, home: str | None = None) -> Path:
    return hubcache.cache_root(home) / "serving-llms-on-epyc" / epyc["router"]["venv"] / "bin" / "vllm-router"


def tls_terminator(port: int, upstream: int, folder: Path, tls: dict, epyc: dict) -> dict:
    """nginx's host process spec: TLS with the pair (by path) on all interfaces, to the router on 127.0.0.1:`upstream`."""
    d, argv = folder / "tls", [epyc["tls"]["nginx"], "-c", str(folder / "tls" / "nginx.conf")]
    paths = {"dir": str(d), "cert": tls["cert"], "key": tls["key"]}
    if bad := [v for v in paths.values() if re.search(r'[$"\\\n]', v)]:  # nginx reads '$' as a variable
        raise ScriptError(f"{bad[0]}: nginx's config cannot quote it ($, \", \\ or a newline)", "use a plain path")
    config = epyc["tls"]["nginx_conf"].format(port=port, upstream=upstream, **paths)
    spec = {"path": "host", "argv": argv, "command": shlex.join(argv), "port": port, "state_dir": str(d), "tls": tls}
    return {**spec, "config": config, "state_file": str(d / "state.json"), "log_file": str(d / "nginx.log")}


def router_plan(
    urls: list[str], port: int, folder: Path, epyc: dict, expose: bool = False, tls=None, home=None
) -> dict:
    """The router's command: every engine's URL, the pinned policy, 127.0.0.1 on the fleet's port (all interfaces
    with --expose; with `tls`, nginx there, the router behind it on the block's last port). It holds no key: it passes
    the client's Authorization header on, each engine checks it (vllm-router 0.1.17), so no argv holds the key."""
    bind = "0.0.0.0" if expose and not tls else "127.0.0.1"
    metrics = port + len(urls) + 1  # the port after the engines': the fleet's block, one per fleet
    listen = metrics + 1 if tls else port
    argv = [str(router_binary(epyc, home)), "--host", bind, "--port", str(listen), "--worker-urls", *urls]
    # workers checked every 2 s, not 30, and a dead engine's circuit tried after 10 s, not 60: an engine healthy
    # just after a look gets requests within seconds (measured: the defaults left a repaired one idle a minute)
    argv += ["--policy", epyc["router"]["policy"], "--worker-startup-check-interval", "2", "--log-level", "info"]
    argv += ["--cb-timeout-duration-secs", "10"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    return {  # a host process spec, started, proven and stopped by the code that runs an engine (process.py)
        "path": "host",
        "argv": argv,
        "command": shlex.join(argv),
        "port": port,
        "base_url": f"https://{tls['name']}:{port}/v1" if tls else f"http://127.0.0.1:{port}/v1",
        "state_dir": str(folder / "router"),
        "state_file": str(folder / "router" / "state.json"),
        "log_file": str(folder / "router" / "router.log"),
        "expose": expose,
        **({"terminator": tls_terminator(port, listen, folder, tls, epyc)} if tls else {}),
    }
