"""A server's state folder: its own files, state.json, secret files and locks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from . import errors, hubcache, jsonio
from .command import SECRET_VALUE, secret_unsendable
from .errors import ScriptError
from .hubcache import in_system_tree

NO_RETRY_FIX = "report this phase and the log lines to the user and stop: do not retry, do not debug"


def open_nofollow(name: str | Path, flags: int, mode: int, dir_fd: int | None, path: str | Path, phase: str) -> tuple:
    """os.open never through a link (nor blocking on a FIFO), untruncated: -> (fd, made here)."""
    import errno

    base = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_NONBLOCK
    made = False
    try:
        if flags & os.O_CREAT:  # made new here if it can be (O_EXCL never follows a link: a link is EEXIST)
            try:
                fd, made = os.open(name, base | os.O_EXCL, mode, dir_fd=dir_fd), True
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                fd = os.open(name, base & ~os.O_CREAT, mode, dir_fd=dir_fd)
        else:
            fd = os.open(name, base, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScriptError(
                f"{path} is a symbolic link: {phase} reads and writes only its own files, never through a link",
                "remove the link, or use a fresh folder",
                phase=phase,
            )
        raise ScriptError(f"cannot open {path}: {exc.strerror or exc}", "remove it, or use a fresh folder", phase=phase)
    return fd, made


def refuse_a_file_not_ours(
    fd: int, path: str | Path, flags: int, mode: int, phase: str, one_name: bool | None, made: bool
) -> None:
    """A regular file, with one name when written, and this user's with `mode`; the fd is closed on refusal."""
    import stat

    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ScriptError(
            f"{path} is not a regular file (a pipe, device or folder of that name)",
            "remove it, or use a fresh folder",
            phase=phase,
        )
    if one_name is None:
        one_name = bool(flags & (os.O_WRONLY | os.O_RDWR))
    if one_name and st.st_nlink > 1:  # a hard link planted there: its other name is a file elsewhere
        os.close(fd)
        raise ScriptError(
            f"{path} has other names (a hard link): {phase} reads and writes only its own files",
            "remove it, or use a fresh folder",
            phase=phase,
        )
    if flags & (os.O_WRONLY | os.O_RDWR) and not made:
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise ScriptError(
                f"{path} belongs to another user (uid {st.st_uid}): {phase} writes only files of its own",
                "remove it, or use a fresh folder of your own",
                phase=phase,
            )
        try:
            os.fchmod(fd, mode)
        except OSError as exc:  # a file system without modes (vfat, some CIFS): the file stays as it was
            os.close(fd)
            raise ScriptError(
                f"cannot make {path} mode {mode:o}: {exc.strerror or exc}",
                "use a state dir on a file system with Unix permissions (not vfat or CIFS)",
                phase=phase,
            ) from None


def open_own_file(
    path: str | Path,
    flags: int,
    mode: int = 0o600,
    phase: str = "start",
    one_name: bool | None = None,
    dir_fd: int | None = None,
) -> int:
    """Open a file of the state dir as a regular file of its own: not through a symbolic link (a link
    planted there must not make start write, truncate or show a file elsewhere), and not a FIFO, device or
    folder of that name (a FIFO would block start forever, after the server was launched). With one_name
    (the default for a write) a file with other names (a hard link) is refused too: writing would change a
    file elsewhere, and reading the server log would pass another file's lines off as the server's. A
    state.json read is not refused for it: the process it names is checked anyway, and a refusal there
    would make stop say "not running" and leave the server up. A file found and written must be this
    user's, and gets `mode`: one another user made (0666, readable by them) would keep its owner and mode,
    and the secret or log written into it with them. A file made here is ours whoever the file system says
    owns it (root-squash NFS). With O_EXCL in `flags`, only a file made here."""
    # with dir_fd (a folder held open), the name in that folder: never a path looked up again
    fd, made = open_nofollow(path if dir_fd is None else os.path.basename(path), flags, mode, dir_fd, path, phase)
    refuse_a_file_not_ours(fd, path, flags, mode, phase, one_name, made)
    if flags & os.O_TRUNC:  # only once the file is known to be ours alone
        os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def write_own_file(path: str | Path, text: str, dir_fd: int | None = None, new: bool = False) -> None:
    """Write (or overwrite) a file of the state dir, 0600, through open_own_file: never a link's target.
    `new`: only a file made now (a name taken meanwhile is an error)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_EXCL if new else 0)
    try:
        with os.fdopen(open_own_file(path, flags, dir_fd=dir_fd), "w") as f:
            f.write(text)
    except OSError as exc:  # a full disk: opened, and the write (or its flush at close) refused
        raise errors.os_error(exc, f"cannot write {path}")


def read_state(plan: dict) -> dict | None:
    try:
        with os.fdopen(open_own_file(plan["state_file"], os.O_RDONLY), "rb") as f:
            state = jsonio.strict_json_loads(f.read(1 << 20).decode("utf-8"), unique_keys=True)
    except (jsonio.DuplicateKey, jsonio.NotANumber) as exc:  # edited by hand: which pid or port it names is
        # anyone's guess (start writes neither a key twice nor a NaN)
        said = "is ambiguous" if isinstance(exc, jsonio.DuplicateKey) else "holds a number JSON does not have"
        raise ScriptError(
            f"{plan['state_file']} {said} ({exc}): it was edited, and what it names cannot be trusted",
            "look at the server it meant (ps, docker ps) and stop it by hand; then remove the file and start again",
        ) from None
    except (OSError, ValueError, RecursionError, ScriptError):  # none, a link, a FIFO, junk: no state of ours
        return None
    return state if written_by_start(state) else None


def written_by_start(state: object) -> bool:
    """A state one start wrote: a host server's group and start time, or a container's name and id. `{}` or a
    document of other fields names no server: verify had written its pass into it, handoff handed that
    off, and stop acted on the plan's container by name as if this state dir had started it. A container's
    state names its id: one with a name alone was taken "by the name" and stopped another plan's server."""
    if not isinstance(state, dict):
        return False
    if not {"path", "port", "plan_id"} <= state.keys():  # a state of another version of this bundle: not ours
        return False
    return (state["path"] == "host" and {"pgid", "create_time"} <= state.keys()) or (
        state["path"] == "container"
        and "container_name" in state
        and isinstance(state.get("container_id"), str)
        and bool(CONTAINER_ID.fullmatch(state["container_id"]))
    )


def write_state(plan: dict, state: dict) -> None:
    """Atomically: a reader sees the old state or the new one, never half of it. Each write has a temp file
    of its own (created, never reused): with one shared name, two writers at once (two verifies) truncated
    the file the other had just renamed into place, and a reader saw half a state."""
    import tempfile

    target = Path(plan["state_file"])
    tmp = None
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


CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def plan_identity(plan: dict) -> str:
    """What tells one plan's server from another's: the command, its environment, where it runs. Two plans
    on one port and folder (another --served-model-name, --max-model-len, sizing) differ here; the same
    plan rendered again does not. start records it in the state."""
    import hashlib

    basis = {key: plan.get(key) for key in ("path", "argv", "env", "container_name", "engine")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:32]


CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


def secret_values(plan: dict) -> dict:
    """The secrets the plan names, read now from our environment. One that is unset is a refusal:
    an API-key server started without its key would enforce nothing, and what the human approved
    (a key) is what must run."""
    values, missing = {}, []
    for name, source in (plan.get("secrets") or {}).items():
        value = os.environ.get(source, "")
        if not value:
            missing.append(source)
        elif not SECRET_VALUE.fullmatch(value):  # a newline or space: no HTTP header can carry it
            raise ScriptError(
                secret_unsendable(source),
                f"export {source} again with the token alone (printable ASCII, no spaces), then start",
                phase="start",
            )
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
    if directory.is_symlink() or (os.path.lexists(directory) and not directory.is_dir()):
        raise ScriptError(
            f"{directory} is not a folder start made (a link, file or pipe): secrets are written "
            "only into the state dir itself",
            "remove it, or plan with a fresh --state-dir",
            phase="start",
        )
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # held open from here: a link swapped in for the folder after this check cannot take the writes
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ScriptError(
            f"cannot make {directory}: {exc.strerror or exc}", "plan with a fresh --state-dir", phase="start"
        )
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():  # its owner could read the keys, or swap the files under us
            raise ScriptError(
                f"{directory} belongs to another user (uid {owner}): secrets are written only into a "
                "folder of your own",
                "remove it, or plan with a fresh --state-dir",
                phase="start",
            )
        os.fchmod(fd, 0o700)
        for name, value in values.items():
            # made new: a file found there may be open in another process already, which would read the key
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
            write_own_file(directory / name, value, dir_fd=fd, new=True)
    except OSError as exc:
        raise errors.os_error(exc, f"cannot write the secret files in {directory}") from None
    finally:
        os.close(fd)


STATE_DIR_FIX = "plan again with a new or empty --state-dir, e.g. ~/.cache/serving-llms-on-epyc/run/NAME"
SECRET_NAMES = ("HF_TOKEN", "VLLM_API_KEY")
# what start and up keep in a state dir (up: one JSON per step, named by its phase; bench: bench-* folders)
OWN_FILES = {
    "server.log",
    "state.json",
    ".state.json.tmp",
    ".lock",
    ".up.lock",
    "secrets",
    "plan.json",
    "shown-plan.json",
    *(
        f"{phase}.json"
        for phase in ("detect", "validate", "setup_host_stack", "check_model", "estimate_memory", "cpu_tune")
    ),
}
STATE_TEMP = re.compile(r"\.state\.[A-Za-z0-9_]{1,16}\.tmp")


def state_dir_problem(state_dir: Path) -> str | None:
    """Why start may not write into this folder, or None. start truncates server.log and writes state.json
    there, stop removes them: so it is an absolute folder other than '/', new, or holding only this
    bundle's files, and its secrets/ (when there) is a real folder of the secret files start writes."""
    try:
        if not state_dir.is_absolute():
            return "is not an absolute path"
        if state_dir == Path("/"):
            return "already holds other files (it is /)"
        if not str(state_dir).isprintable():  # an XDG_CACHE_HOME with a newline: the summary would lie
            return "holds characters that are not printable"
        for where in {str(state_dir), os.path.realpath(state_dir)}:  # as written, and through any link
            if in_system_tree(where):
                return f"is inside a system tree (/proc, /sys, /dev, /etc, /run...): {where}"
        try:
            os.lstat(state_dir)
        except FileNotFoundError:  # new: start makes it
            return None
        if not state_dir.is_dir():
            return "exists and is not a folder"
        owner = state_dir.stat().st_uid
        if owner != os.geteuid():  # its owner can rename what start checked there, and read what it writes
            return f"belongs to another user (uid {owner})"
        foreign = sorted(
            p.name
            for p in state_dir.iterdir()  # bench's folders are folders, never links
            if p.name not in OWN_FILES
            and not STATE_TEMP.fullmatch(p.name)
            and not (p.name.startswith("bench-") and p.is_dir() and not p.is_symlink())
        )
        if foreign:
            return f"already holds other files ({', '.join(foreign[:5])})"
        secrets = state_dir / "secrets"
        if os.path.lexists(secrets):
            if secrets.is_symlink() or not secrets.is_dir():
                return "holds a secrets entry that is not a folder (a link, file or pipe)"
            owner = secrets.stat().st_uid
            if owner != os.geteuid():
                return f"holds a secrets folder of another user (uid {owner})"
            odd = sorted(
                p.name for p in secrets.iterdir() if p.name not in SECRET_NAMES or p.is_symlink() or not p.is_file()
            )
            if odd:
                return f"holds secrets/{odd[0]}, not a secret file start writes"
    except OSError as exc:  # a name too long, a loop of links, no permission
        return f"cannot be read ({exc.strerror or exc})"
    return None


def remove_secret_files(plan: dict) -> str | None:
    """Remove what start wrote, by name, and the folder if that leaves it empty: never a whole tree a
    plan file happens to point at, never a folder or a link's target. It never fails (stop must go on);
    a key file it could not remove is said (a secret left on disk), a foreign entry left is not."""
    directory = Path(plan["state_dir"]) / "secrets"
    try:
        if directory.is_symlink() or not directory.is_dir():  # not a folder start made: not ours to touch
            return None
        for name in SECRET_NAMES:
            entry = directory / name
            if entry.is_symlink() or entry.is_file():
                entry.unlink(missing_ok=True)
    except OSError as exc:  # a read-only state dir: the key files stay, and the user must know
        return f"could not remove the key files in {directory} ({exc.strerror or exc}): delete them by hand"
    with contextlib.suppress(OSError):  # a folder under a secret's name, a foreign file: left where it is
        directory.rmdir()
    return None


def known_secrets(plan: dict) -> list[str]:
    """The values a server's answer must never echo into our output."""
    return [os.environ.get(src, "") for src in (plan.get("secrets") or {}).values()]


def require_api_key(plan: dict, verb: str) -> None:
    """A server started with an API key refuses every request without it: a shell that lacks the variable
    is named before anything is sent (verify would judge a healthy server failed, and clear its pass)."""
    key_env = plan.get("api_key_env")
    if key_env and not os.environ.get(key_env):
        raise ScriptError(
            f"the plan's server wants its API key, and {key_env} is not set in this shell",
            f"export {key_env}=<key> (the one the server was started with), then {verb} again",
            phase=verb,
        )
    if key_env and not SECRET_VALUE.fullmatch(os.environ[key_env]):  # no header carries it: every request
        # would fail before it is sent, and verify would wait out its timeout calling a healthy server dead
        raise ScriptError(
            secret_unsendable(key_env),
            f"export {key_env} again with the key alone (the one the server was started with), then {verb} again",
            phase=verb,
        )


def auth_headers(plan: dict) -> dict:
    key = os.environ.get(plan["api_key_env"]) if plan.get("api_key_env") else None
    return {"Authorization": f"Bearer {key}"} if key else {}


LOCK_WAIT_S = 2.0


def lock_held(path: Path) -> bool:
    """Another process holds that lock file (flock). Read-only and never created here (a check makes no
    files); no lock file, no such process ever ran here."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def flock_within(fd: int, seconds: float) -> bool:
    """Take the exclusive lock on that open file, asking again for up to `seconds`: another verb's brief
    hold (verify writing its verdict) is waited out, a start's or stop's whole run is not."""
    import fcntl

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def start_in_progress(plan: dict) -> bool:
    """A start holds the state dir's .lock from its checks until its state is written (and, on the container
    path, through a pull and `run`): a stop then would find no state and say "not running" while the
    server comes up, or remove a container that start is about to record."""
    return lock_held(Path(plan["state_dir"]) / ".lock")


UP_HOLDS: set[str] = set()


def up_in_progress(plan: dict) -> bool:
    """Another process's `up` holds the folder (.up.lock) through its steps, start and verify: a start of
    another plan there would launch a server that up's plan.json, written next, no longer names."""
    return plan["state_dir"] not in UP_HOLDS and lock_held(Path(plan["state_dir"]) / ".up.lock")


@contextlib.contextmanager
def holding_the_start_lock(plan: dict, busy: ScriptError | None = None, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """stop holds .lock as start does, for its whole run: a start that came in while the server went down
    would write its state, and stop would then remove it (its server named by nothing). stop makes the lock
    file where none is yet (a first start could begin while it runs); on a read-only folder it makes none,
    and no start can write there either. No state dir at all: nothing to hold. `busy()` is the error when
    another holds it past `wait_s` (stop's own words by default)."""
    lock = Path(plan["state_dir"]) / ".lock"
    fd = None
    for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            break
        except OSError:
            continue
    try:
        if fd is not None:
            if not flock_within(fd, wait_s):
                if busy is not None:
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


def state_root() -> Path:
    """Where default state dirs go (a plan without --state-dir, up's run folder)."""
    return hubcache.cache_root() / "serving-llms-on-epyc" / "run"
