"""A server's state folder: its own files, state.json, secret files and locks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from epyc import bundle, errors, jsonio, masking
from epyc.errors import ScriptError
from epyc.jsonio import open_own_file, write_own_file

NO_RETRY_FIX = "report this phase and the log lines to the user and stop: do not retry, do not debug"
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
STATE_DIR_FIX = "plan again with a new or empty --state-dir, e.g. ~/.cache/serving-llms-on-epyc/run/NAME"
SECRET_NAMES = ("HF_TOKEN", "VLLM_API_KEY")
# what start, up (a JSON per step), bench (bench-* folders) and handoff (a unit; secrets.env is the user's) keep
OWN_FILES = {
    *"server.log state.json .lock .up.lock secrets plan.json shown-plan.json server.service server.env".split(),
    "secrets.env",
    *(f"{step}.json" for step in (*bundle.INPUT_SCRIPTS, "setup_host_stack")),
}
STATE_TEMP = re.compile(r"\.state\.[A-Za-z0-9_]{1,16}\.tmp")
LOCK_WAIT_S = 2.0
UP_HOLDS: set[str] = set()  # the state dirs this process's own up holds: its own start there is not another's


def read_state(plan: dict) -> dict | None:
    """The state start wrote, or None: none, a link, junk or another version's document is no state of ours."""
    try:
        with os.fdopen(open_own_file(plan["state_file"], os.O_RDONLY), "rb") as f:
            state = jsonio.strict_json_loads(f.read(1 << 20).decode("utf-8"), unique_keys=True)
    except (OSError, ValueError, RecursionError, ScriptError):
        return None
    # this version's fields, and a host server's group and start time or a container's name and id
    if not isinstance(state, dict) or not {"path", "port", "plan_id"} <= state.keys():
        return None
    host = state["path"] == "host" and {"pgid", "create_time"} <= state.keys()
    cid = state.get("container_id")
    container = state["path"] == "container" and "container_name" in state and isinstance(cid, str)
    return state if host or (container and CONTAINER_ID.fullmatch(cid)) else None


def write_state(plan: dict, state: dict) -> None:
    """Atomically, through a temp file of this write's own (two verifies at once never leave half a state)."""
    import tempfile

    target, tmp = Path(plan["state_file"]), None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=target.parent)  # O_EXCL, 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, target)  # replaces a link named state.json itself, never its target
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk, a read-only folder: named, never an internal error
            raise errors.os_error(exc, f"cannot write {target}") from None
        raise


def plan_identity(plan: dict) -> str:
    """What tells one plan's server from another's on one port and folder: the command, its env, where it runs."""
    import hashlib

    basis = {key: plan.get(key) for key in ("path", "argv", "env", "container_name", "engine")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:32]


def secret_values(plan: dict) -> dict:
    """The secrets the plan names, read now from our environment; one unset (or no header carries) is refused."""
    values, missing = {}, []
    for name, source in (plan.get("secrets") or {}).items():
        value = os.environ.get(source, "")
        if not value:
            missing.append(source)
        elif not masking.SECRET_VALUE.fullmatch(value):  # a newline or space: no HTTP header can carry it
            fix = f"export {source} again with the token alone (printable ASCII, no spaces), then start"
            raise ScriptError(masking.secret_unsendable(source), fix, phase="start")
        values[name] = value
    if missing:
        raise ScriptError(
            f"the plan passes {', '.join(missing)} to the server, but it is not set in this shell",
            f"export {missing[0]}=... in the shell that runs start (its value is never shown)",
            phase="start",
        )
    return values


def write_secret_files(directory: Path, values: dict) -> None:
    """One 0600 file per secret in a 0700 folder of the state dir, mounted read-only; stop removes it."""
    if directory.is_symlink():
        raise ScriptError(f"{directory} is a link", "remove it, then start again", phase="start")
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        for name, value in values.items():
            (directory / name).unlink(missing_ok=True)  # made new: a reader of the old file never sees the key
            write_own_file(directory / name, value)
    except OSError as exc:
        raise errors.os_error(exc, f"cannot write the secret files in {directory}") from None


def own_folder_problem(folder: Path) -> str | None:
    """Why a folder the bundle keeps files in is not this user's alone, or None (one not there yet too)."""
    import stat

    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a name too long, a loop of links, no permission
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "exists and is not a folder"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    return "may be written by other users (chmod go-w it)" if st.st_mode & 0o022 else None


def make_own_folder(folder: Path, fix: str, phase: str) -> Path:
    """The folder made 0700 when missing, then refused unless it is this user's alone (checked after the mkdir)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if problem := own_folder_problem(folder):
        raise ScriptError(
            f"{folder} {problem}: the bundle keeps its files only in a folder of your own", fix, phase=phase
        )
    return folder


def refuse_state_dir(state_dir: Path, named: str, fix: str, **extra) -> None:
    """Refuse a state_dir start may not write into (state_dir_problem), naming it as `named`."""
    if problem := state_dir_problem(state_dir):
        raise ScriptError(
            f"{named} {problem}: start writes its log and state there and stop removes them", fix, **extra
        )


def state_dir_problem(state_dir: Path) -> str | None:
    """Why start may not write (nor stop remove) there, or None: absolute, and new or ours holding only our files."""
    if not state_dir.is_absolute():
        return "is not an absolute path"
    if problem := own_folder_problem(state_dir):
        return problem
    try:
        foreign = sorted(
            p.name
            for p in state_dir.iterdir()
            if p.name not in OWN_FILES and not STATE_TEMP.fullmatch(p.name) and not p.name.startswith("bench-")
        )
    except FileNotFoundError:  # new: start makes it
        return None
    except OSError as exc:  # a name too long, a loop of links, no permission
        return f"cannot be read ({exc.strerror or exc})"
    return f"already holds other files ({', '.join(foreign[:5])})" if foreign else None


def remove_secret_files(plan: dict) -> str | None:
    """Remove the key files start wrote, by name, and their folder; never raises: one left on disk is said."""
    directory = Path(plan["state_dir"]) / "secrets"
    if directory.is_symlink():  # not the folder start made: nothing in it is ours
        return None
    try:
        for name in SECRET_NAMES:
            (directory / name).unlink(missing_ok=True)
    except OSError as exc:  # a read-only state dir: the key files stay, and the user must know
        return f"could not remove the key files in {directory} ({exc.strerror or exc}): delete them by hand"
    with contextlib.suppress(OSError):
        directory.rmdir()
    return None


def known_secrets(plan: dict) -> list[str]:
    """The values a server's answer must never echo into our output."""
    return [os.environ.get(src, "") for src in (plan.get("secrets") or {}).values()]


def require_api_key(plan: dict, verb: str) -> None:
    """A shell without the server's API key (or one no header carries) is refused before anything is sent."""
    key_env = plan.get("api_key_env")
    if key_env and not os.environ.get(key_env):
        raise ScriptError(
            f"the plan's server wants its API key, and {key_env} is not set in this shell",
            f"export {key_env}=<key> (the one the server was started with), then {verb} again",
            phase=verb,
        )
    if key_env and not masking.SECRET_VALUE.fullmatch(os.environ[key_env]):
        fix = f"export {key_env} again with the key alone (the one the server was started with), then {verb} again"
        raise ScriptError(masking.secret_unsendable(key_env), fix, phase=verb)


def auth_headers(plan: dict) -> dict:
    key = os.environ.get(plan["api_key_env"]) if plan.get("api_key_env") else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def lock_held(path: Path) -> bool:
    """Another process holds that lock file (flock); never created here: no file, no holder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not flock_within(fd, 0, shared=True)
    finally:
        os.close(fd)


def flock_within(fd: int, seconds: float, shared: bool = False) -> bool:
    """The exclusive (or shared) lock on that file, asked for up to `seconds` (a verify's brief hold is waited out)."""
    import fcntl

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def start_in_progress(plan: dict) -> bool:
    """A start holds the state dir's .lock from its checks until its state is written."""
    return lock_held(Path(plan["state_dir"]) / ".lock")


def up_in_progress(plan: dict) -> bool:
    """Another process's `up` holds the folder (.up.lock): its plan.json would not name a server started there."""
    return plan["state_dir"] not in UP_HOLDS and lock_held(Path(plan["state_dir"]) / ".up.lock")


@contextlib.contextmanager
def holding_the_start_lock(plan: dict, busy: Callable | None = None, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold .lock as start does, for the whole block; `busy()` is the error when another holds it past `wait_s`."""
    lock, fd = Path(plan["state_dir"]) / ".lock", None
    for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
        with contextlib.suppress(OSError):
            fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            break
    try:
        if fd is not None and not flock_within(fd, wait_s):
            if busy:
                raise busy() from None
            raise ScriptError(
                f"a start (or another stop) for {plan['state_dir']} is in progress: its server is not recorded yet",
                "wait for start to finish (or interrupt it: it takes down what it launched), then run stop again",
                phase="stop",
            ) from None
        yield
    finally:
        if fd is not None:
            os.close(fd)


def self_signed(folder: str, names: list[str], days: int = 30) -> dict:
    """A self-signed certificate (its own CA) and its key (0600) in `folder`, made with `cryptography` on request,
    for tests and a first try over TLS: `names` first, then this host's name, localhost and 127.0.0.1."""
    import datetime
    import ipaddress
    import socket

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    out = make_own_folder(Path(os.path.abspath(folder)), "pass --out with a folder of your own", "tls-selfsigned")
    names = list(dict.fromkeys([*names, socket.gethostname(), "localhost", "127.0.0.1"]))
    if bad := [n for n in names if not n.isascii()]:  # a certificate holds a name in its IDNA form
        raise ScriptError(f"--name {bad[0]!r} is not ASCII", "pass its IDNA form (xn--...)", phase="tls-selfsigned")

    def alt(name: str) -> x509.GeneralName:  # an address as one, the rest as host names
        with contextlib.suppress(ValueError):
            return x509.IPAddress(ipaddress.ip_address(name))
        return x509.DNSName(name)

    key, now = ec.generate_private_key(ec.SECP256R1()), datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, names[0])])
    cert = x509.CertificateBuilder(subject, subject, key.public_key(), x509.random_serial_number())
    cert = cert.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days))
    cert = cert.add_extension(x509.SubjectAlternativeName(map(alt, names)), critical=False)
    cert = cert.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256())
    pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    write_own_file(out / "key.pem", pem.decode())
    write_own_file(out / "cert.pem", cert.public_bytes(ser.Encoding.PEM).decode())
    doc = {"cert": str(out / "cert.pem"), "key": str(out / "key.pem"), "ca": str(out / "cert.pem"), "names": names}
    use = f"launch.py plan ... --expose --api-key-env NAME --tls-cert {doc['cert']} --tls-key {doc['key']}"
    return {**doc, "not_after": cert.not_valid_after_utc.isoformat(), "made_with": "cryptography", "use": use}
