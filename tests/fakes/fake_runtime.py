#!/usr/bin/env python3
"""A FAKE container runtime, installed as `docker` / `podman` first on PATH by the tests.

The container path is proven on a real Docker engine (tests/test_e2e_container.py; tests/run.sh
starts one). This stand-in covers only what a real engine cannot show on these machines: rootless
podman refusing --cpuset-* (no cpuset delegation), podman present but unable to start containers,
a daemon that is down, and `sudo docker`; plus the exact argv of each call, cheaply, in the fast
suite. It records every argv to $FAKE_RT_DIR/calls.jsonl (a leading --host=ADDRESS apart, as `engine`)
-- plus which secret NAMES were present in its environment, never their values -- and simulates: info, run (incl. podman's --rootfs probe),
image inspect, pull, inspect -f, logs, stop, rm, ps.
Behaviour is set by files in $FAKE_RT_DIR:
  daemon_down      `info` fails like a stopped daemon
  user_denied      `info` of plain docker fails: this user may not use the socket (sudo docker may)
  images           one locally present image per line
  pull_fails       `pull` fails
  pull_creates     `pull` makes a container of the name this file holds (id a...a): another start during ours
  inspect_fails    `inspect` fails like a daemon that did not answer in time
  run_hang         `run` (of the server) never returns: a slow `docker run` to interrupt
  rm_fails         `rm` fails like a daemon that stopped answering
  cpuset_rejected  `run` with --cpuset-* fails like rootless podman without cpuset delegation
  exited           `inspect` reports the container not running
  logs_flood       `logs` prints without end (one line that never ends)
  logs_lines       `logs` prints that many zentorch kernel lines (a long --kernel-log run)
  logs_hang        `logs` closes its output, then never exits
  logs_text        `logs` prints exactly this file's text, and exits with the number in logs_exit (default 0)
  context          "NAME ADDRESS": the current docker context (`context show` / `context inspect`), else default
  removed-NAME     written by `rm NAME`, removed by `run --name NAME`: `stop NAME` then says "No such container"
  created-NAME     the id of the container `run --name NAME` made (`inspect`, `rm`, `stop` and `logs` take
                   it by name or by id; inspect knows no other container); `run
                   --name NAME` fails on it as the engine does (name in use) until `rm NAME`
  next_id          the id the next `run --name` gives its container (default f...f, 64 of them); one a
                   line: each run takes the first, the last is kept
  stopped-NAME     written by podman's run refused on --cpuset-* (it created the container, e...e, and left
                   it exited): `inspect` says it does not run
  run_quiet        `run --name` prints a notice instead of the id it gave (`inspect` still knows it)
"""

import json
import os
import sys
from pathlib import Path

d = Path(os.environ["FAKE_RT_DIR"])
d.mkdir(parents=True, exist_ok=True)
name = Path(sys.argv[0]).name
args = sys.argv[1:]
if name == "sudo":  # tests/fakes/sudo_bin only: `sudo -n docker ...` runs this docker as root (root's context)
    if args[:2] != ["-n", "docker"]:
        sys.exit(print("sudo: a password is required", file=sys.stderr) or 1)
    name, args = "sudo docker", args[2:]
engine = None  # docker's global --host=ADDRESS (the plan's engine), taken off as the real CLI does
if args and args[0].startswith("--host="):
    engine, args = args[0].removeprefix("--host="), args[1:]
with open(d / "calls.jsonl", "a") as f:
    f.write(
        json.dumps(
            {
                "runtime": name,
                "argv": args,
                "engine": engine,
                "docker_host_env": os.environ.get("DOCKER_HOST"),
                "docker_context_env": os.environ.get("DOCKER_CONTEXT"),
                "container_host_env": os.environ.get("CONTAINER_HOST"),
                "container_connection_env": os.environ.get("CONTAINER_CONNECTION"),
                "secret_names_in_env": sorted(k for k in ("HF_TOKEN", "VLLM_API_KEY") if os.environ.get(k)),
            }
        )
        + "\n"
    )
flag = lambda n: (d / n).exists()  # noqa: E731
images = (d / "images").read_text().split() if flag("images") else []
cmd = args[0] if args else ""


def by_name(ref: str) -> str:
    """The container a reference names, as the engine takes one: its name, or its id (12 or more leading hex
    digits). The fake keeps containers by name (created-NAME holds the id), one not removed first."""
    if flag(f"created-{ref}") or len(ref) < 12:
        return ref
    made = sorted(d.glob("created-*"), key=lambda f: flag("removed-" + f.name.removeprefix("created-")))
    return next((f.name.removeprefix("created-") for f in made if f.read_text().strip().startswith(ref)), ref)


if cmd in ("inspect", "rm", "stop", "logs") and len(args) > 1:
    args[-1] = by_name(args[-1])

if cmd == "info":
    if flag("user_denied") and name == "docker":  # not in the docker group; root (sudo docker) is let in
        sys.exit(
            print(
                "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock",
                file=sys.stderr,
            )
            or 1
        )
    if flag("daemon_down"):
        sys.exit(print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", file=sys.stderr) or 1)
    print("28.2.2")
elif cmd == "image" and args[1:2] == ["inspect"]:
    sys.exit(0 if args[2] in images else 1)
elif cmd == "pull":
    if flag("pull_creates"):  # another plan's start, during ours: its container takes the name this file holds
        taken = (d / "pull_creates").read_text().strip()
        (d / f"removed-{taken}").unlink(missing_ok=True)
        (d / f"created-{taken}").write_text("a" * 64)
    if flag("pull_fails"):
        sys.exit(print(f"Error response from daemon: pull access denied for {args[1]}", file=sys.stderr) or 1)
    (d / "images").write_text("\n".join(images + [args[1]]) + "\n")
    print(f"Pulled {args[1]}")
elif cmd == "run":
    if "--rootfs" in args:  # podman's can-it-run probe
        sys.exit(
            0 if flag("podman_can_run") else (print("Error: setrlimit: operation not permitted", file=sys.stderr) or 1)
        )
    if flag("cpuset_rejected") and any(a.startswith("--cpuset") for a in args):
        if name == "podman" and "--name" in args:  # podman has created the container before its start fails:
            made = args[args.index("--name") + 1]  # it stays, exited, under the name
            (d / f"removed-{made}").unlink(missing_ok=True)
            (d / f"created-{made}").write_text("e" * 64)
            (d / f"stopped-{made}").touch()
        sys.exit(
            print(
                "Error: OCI runtime error: the requested cgroup controller `cpuset` is not available", file=sys.stderr
            )
            or 126
        )
    if "--rm" in args and "--entrypoint" in args:  # a probe inside the image
        sys.exit(print("python3: simulated", file=sys.stderr) or 1)
    if flag("run_hang"):
        import time

        time.sleep(120)
    if "--name" in args:  # a container of that name exists again, with the id printed (`next_id`, or f...f)
        cname = args[args.index("--name") + 1]
        if flag(f"created-{cname}") and not flag(f"removed-{cname}"):  # as the engine refuses a name in use
            sys.exit(
                print(
                    f'docker: Error response from daemon: Conflict. The container name "/{cname}" is already '
                    f'in use by container "{(d / f"created-{cname}").read_text().strip()}". You have to remove '
                    "(or rename) that container to be able to reuse that name.",
                    file=sys.stderr,
                )
                or 125
            )
        (d / f"removed-{cname}").unlink(missing_ok=True)
        (d / f"stopped-{cname}").unlink(missing_ok=True)
        ids = (d / "next_id").read_text().split() if flag("next_id") else ["f" * 64]
        if len(ids) > 1:  # several lines: one id per run, the last one kept for every run after
            (d / "next_id").write_text("\n".join(ids[1:]) + "\n")
        (d / f"created-{cname}").write_text(ids[0])
        print("WARNING: a runtime's notice" if flag("run_quiet") else (d / f"created-{cname}").read_text())
    else:
        print("f" * 64)
elif cmd == "inspect" and flag("inspect_fails"):  # a daemon too slow to answer this once
    sys.exit(print("Error response from daemon: context deadline exceeded", file=sys.stderr) or 1)
elif cmd == "inspect":  # `inspect -f "{{.Id}} {{.State.Running}} {{.State.Restarting}}" NAME`: of a container run made
    if not flag(f"created-{args[-1]}") or flag(f"removed-{args[-1]}"):
        sys.exit(print(f"Error: No such object: {args[-1]}", file=sys.stderr) or 1)
    running = "false" if flag("exited") or flag(f"stopped-{args[-1]}") else "true"
    restarts = (d / "restarts").read_text().strip() if flag("restarts") else "0"  # its restart policy at work
    print((d / f"created-{args[-1]}").read_text(), running, "true" if restarts != "0" else "false", restarts)
elif cmd == "logs":
    if flag("logs_lines"):  # a long kernel log: that many zentorch lines
        chunk = "[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear, kernel=brgemm\n" * 10_000
        for _ in range(int((d / "logs_lines").read_text()) // 10_000):
            sys.stdout.write(chunk)
        sys.exit(0)
    if flag("logs_text"):
        sys.stdout.write((d / "logs_text").read_text())
        sys.exit(int((d / "logs_exit").read_text()) if flag("logs_exit") else 0)
    if flag("logs_hang"):  # a runtime that ends its output but never exits
        print("INFO fake log line 1", flush=True)
        os.close(1)
        os.close(2)
        import time

        time.sleep(120)
    if flag("logs_flood"):  # a runtime whose last lines never end
        block = "x" * (1 << 20)
        while True:
            sys.stdout.write(block)
    print("INFO fake log line 1\nERROR fake engine failure")
elif cmd == "context":  # `context show` / `context inspect`: the file `context` holds "NAME ADDRESS"
    ctx_name, ctx_host = ((d / "context").read_text().split() + ["", ""])[:2] if flag("context") else ("default", "")
    ctx_host = ctx_host or "unix:///var/run/docker.sock"
    print(ctx_name if args[1:2] == ["show"] else ctx_host)
elif cmd == "rm" and flag("rm_fails"):
    sys.exit(print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", file=sys.stderr) or 1)
elif cmd == "stop" and flag(f"removed-{args[-1]}"):  # as the engine answers for a container it removed
    sys.exit(print(f"Error response from daemon: No such container: {args[-1]}", file=sys.stderr) or 1)
elif cmd in ("rm", "ps", "stop"):
    if cmd == "rm" and args[-1] and not args[-1].startswith("-"):
        (d / f"removed-{args[-1]}").touch()
    print(args[-1] if cmd in ("rm", "stop") else "")
else:
    sys.exit(print(f"fake runtime: unsupported {args}", file=sys.stderr) or 2)
