"""Where checkpoint code may read and write (the rules are in docs/safety.md).

* :func:`check_output` — refuse an output that exists (unless ``overwrite``), is a link,
  or contains, equals or sits inside the input.
* :func:`resolve_inside` — a path taken from a checkpoint's metadata, resolved inside
  the checkpoint (no absolute paths, no ``..``, no symlink leaving it).
* :func:`open_regular` — open a regular file for reading (never a FIFO, device or socket).
* :func:`side_files` / :func:`copy_regular` — the allow-listed non-tensor files to copy.
* :class:`atomic_output` — build an output under a unique temporary name beside it and
  put it in place atomically; abandoned temporaries are cleaned by a lock rule.
"""
from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
from typing import Iterable

try:
    import fcntl
except ImportError:  # not POSIX: temporaries of killed runs are not cleaned automatically
    fcntl = None

__all__ = ["UnsafePathError", "check_output", "resolve_inside", "allowed_roots", "open_regular", "read_regular",
           "copy_regular", "side_files", "SIDE_FILE_ALLOW", "atomic_output", "output_mode", "signals_as_exit",
           "clean_abandoned"]


class UnsafePathError(ValueError):
    """A path that microscale refuses to read or write (see docs/safety.md)."""


#: Non-tensor files copied from a checkpoint directory into its converted copy
#: (fnmatch on the file name, top level or inside a sentence-transformers numbered
#: module folder such as ``1_Pooling/``); every other file is reported as skipped.
SIDE_FILE_ALLOW = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.*", "merges.txt", "*.model", "chat_template.*", "preprocessor_config.json",
    "README", "README.md", "LICENSE*", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
_MODULE_DIR = re.compile(r"[0-9]+_[A-Za-z0-9_.-]+")
_MAX_JSON = 256 * 1024 * 1024  # side JSON files (index, configs) larger than this are refused


def _inside(path: str, root: str) -> bool:
    """``path`` equals ``root`` or lies below it (both already real and absolute)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def allowed_roots(root: str | os.PathLike) -> list[str]:
    """Real directories a checkpoint rooted at ``root`` may read from: ``root`` itself and,
    for a Hugging Face cache snapshot (``.../snapshots/<rev>``), that repository's
    ``blobs`` folder, which the snapshot's symlinks point into."""
    real = os.path.realpath(root)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots":
        blobs = os.path.join(os.path.dirname(parent), "blobs")
        if os.path.isdir(blobs):
            roots.append(os.path.realpath(blobs))
    return roots


def resolve_inside(root: str | os.PathLike, rel: object, what: str) -> str:
    """The real path of ``rel`` (a path read from a checkpoint's metadata) under ``root``.

    Raises :class:`UnsafePathError` for a non-string or empty name, an absolute path, a
    ``..`` component, or a path whose symlinks lead outside :func:`allowed_roots`.
    """
    root = os.fspath(root)
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UnsafePathError(f"{what}: file name {rel!r} is not a non-empty string")
    norm = rel.replace("\\", "/")
    if os.path.isabs(rel) or norm.startswith("/") or re.match(r"[A-Za-z]:", norm):
        raise UnsafePathError(f"{what}: file name {rel!r} is an absolute path; names must be relative to {root}")
    if ".." in norm.split("/"):
        raise UnsafePathError(f"{what}: file name {rel!r} climbs out of {root} with '..'")
    real = os.path.realpath(os.path.join(root, rel))
    if not any(_inside(real, r) for r in allowed_roots(root)):
        raise UnsafePathError(f"{what}: file name {rel!r} is a symbolic link to {real}, outside {root}")
    return real


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, follow: bool = True):
    """Open ``path`` for binary reading if it is a regular file (checked with ``stat``
    before the open and ``fstat`` after it); ``follow=False`` refuses a symlink (O_NOFOLLOW).
    A FIFO, device, socket or directory raises :class:`UnsafePathError` without blocking."""
    path = os.fspath(path)
    st = os.stat(path, follow_symlinks=follow)  # FileNotFoundError passes through
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path}: is {_kind(st.st_mode)}, not a regular file; refusing to read it")
    flags = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
             | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in after the stat cannot block the open
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path}: is a symbolic link; refusing to follow it") from e
        raise
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafePathError(f"{path}: changed while being opened ({_kind(st2.st_mode)}); refusing to read it")
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike, limit: int = _MAX_JSON) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnsafePathError(f"{os.fspath(path)}: {size} bytes, more than the {limit} bytes allowed for "
                                  "this kind of file")
        return f.read(limit + 1)[:limit]


def copy_regular(src: str, dst: str) -> int:
    """Copy the regular file ``src`` (no symlink followed) to the new file ``dst``; bytes copied."""
    with open_regular(src, follow=False) as fi:
        size = os.fstat(fi.fileno()).st_size
        with open(dst, "xb") as fo:
            n = 0
            while n < size and (chunk := fi.read(min(1 << 22, size - n))):  # never past the stat size
                fo.write(chunk)
                n += len(chunk)
    return n


def _allowed_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in SIDE_FILE_ALLOW)


def side_files(src: str, exclude: Iterable[str] = ()) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(copy, skipped)`` for a checkpoint directory: ``copy`` holds ``(relative name,
    real path)`` of allow-listed regular files inside :func:`allowed_roots`; ``skipped``
    holds ``(relative name, reason)`` for everything else (directories not descended
    into get a trailing ``/``). ``exclude``: relative names handled elsewhere (shards, index)."""
    excl = {os.path.normpath(e) for e in exclude}
    roots = allowed_roots(src)
    copy: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []

    def visit(rel_dir: str, depth: int) -> None:
        here = os.path.join(src, rel_dir) if rel_dir else src
        for e in sorted(os.scandir(here), key=lambda e: e.name):
            rel = os.path.join(rel_dir, e.name) if rel_dir else e.name
            if os.path.normpath(rel) in excl:
                continue
            if e.is_dir(follow_symlinks=False):
                if depth == 0 and _MODULE_DIR.fullmatch(e.name):
                    visit(rel, 1)
                else:
                    skipped.append((rel + "/", "directory (not a sentence-transformers module folder)"))
                continue
            if not _allowed_name(e.name):
                skipped.append((rel, "not on the side-file allow-list"))
                continue
            real = os.path.realpath(e.path)
            if not any(_inside(real, r) for r in roots):
                skipped.append((rel, f"symbolic link to {real}, outside the checkpoint"))
                continue
            try:
                st = os.stat(real)
            except OSError as ex:
                skipped.append((rel, f"cannot stat: {ex.strerror}"))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append((rel, f"{_kind(st.st_mode)}, not a regular file"))
                continue
            copy.append((rel, real))

    visit("", 0)
    return copy, skipped


# ---------------------------------------------------------------------------------
# output checks
# ---------------------------------------------------------------------------------
def check_output(src: str | os.PathLike | None, dst: str | os.PathLike, overwrite: bool, what: str,
                 kind: str = "dir") -> None:
    """Refuse ``dst`` unless it is safe to write.

    ``kind`` is ``"dir"`` (a checkpoint directory; an existing empty directory is fine)
    or ``"file"`` (e.g. a ``.gguf`` file). Refused: an existing ``dst`` without
    ``overwrite`` (:class:`FileExistsError`); a ``dst`` that is a symbolic link, equals or
    contains ``src`` (also ``src``'s parent or the folder holding a single-file ``src``),
    or lies inside a directory ``src`` (:class:`UnsafePathError`); a directory where a
    file is to be written (:class:`IsADirectoryError`).
    """
    dst = os.fspath(dst)
    dabs = os.path.abspath(dst)
    if os.path.islink(dabs):
        raise UnsafePathError(f"{what}: DST {dst} is a symbolic link; give the real path to write there")
    dreal = os.path.realpath(dabs)
    if src is not None:
        src = os.fspath(src)
        sreal = os.path.realpath(src)
        if _inside(sreal, dreal):
            rel = "equals" if sreal == dreal else "contains"
            raise UnsafePathError(f"{what}: DST {dst} {rel} SRC {src}; DST must differ from SRC and lie "
                                  "outside it (the input is never modified)")
        if os.path.isdir(sreal) and _inside(dreal, sreal):
            raise UnsafePathError(f"{what}: DST {dst} lies inside SRC {src}; DST must differ from SRC and "
                                  "lie outside it (the input is never modified)")
    if not os.path.lexists(dabs):
        return
    if kind == "file":
        if os.path.isdir(dabs):
            raise IsADirectoryError(f"{what}: DST {dst} is a directory; this output is a single file")
        if not overwrite:
            raise FileExistsError(f"{what}: DST {dst} exists; pass --overwrite (overwrite=True) to replace it")
        return
    if os.path.isdir(dabs) and not os.listdir(dabs):
        return
    if not overwrite:
        raise FileExistsError(f"{what}: DST {dst} exists and is not an empty directory; pass --overwrite "
                              "(overwrite=True) to replace it")


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    m = os.umask(0o022)  # no /proc: read it by setting and restoring
    os.umask(m)
    return m


def output_mode(directory: bool = False) -> int:
    """The mode a new output gets: 0o666 (0o777 for a directory) less the umask, as
    ``open``/``mkdir`` would give, instead of ``mkstemp``'s owner-only 0o600."""
    return (0o777 if directory else 0o666) & ~_umask()


# ---------------------------------------------------------------------------------
# atomic replacement
# ---------------------------------------------------------------------------------
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
_OURS: set[str] = set()  # lock files held by this process: never cleaned by it
_OURS_LOCK = threading.Lock()


def _renameat2(a: str, b: str, flags: int) -> bool:
    """``renameat2(a, b, flags)``: True when done, False where the call or the flag is
    not supported (not Linux, glibc < 2.28, or a file system without it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(e, os.strerror(e), a, None, b)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _prefix(dst: str) -> str:
    return "." + os.path.basename(dst) + ".partial-"


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


def _try_lock(path: str):
    """An fd holding an exclusive flock on ``path`` (still linked there), or None."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def clean_abandoned(dst: str | os.PathLike) -> list[str]:
    """Remove the temporaries of earlier runs writing ``dst`` whose writer is gone.

    Each writer holds an exclusive ``flock`` on ``.<name>.partial-<host>-<pid>-<random>.lock``
    for as long as it runs; the kernel drops it when the process dies, however it dies.
    A lock that can be taken therefore proves its writer is gone (also for a writer in
    another container or on another host sharing the folder); only then its temporary
    (``...<random>``) is removed. A ``...<random>.old`` (an earlier DST moved aside where
    an atomic exchange was unavailable) is put back if DST is missing, else removed.
    Returns the names removed.
    """
    dst = os.path.abspath(os.fspath(dst))
    parent, pre = os.path.dirname(dst), _prefix(dst)
    removed = []
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for n in names:
        if not (n.startswith(pre) and n.endswith(".lock")):
            continue
        lock = os.path.join(parent, n)
        with _OURS_LOCK:
            if lock in _OURS:
                continue
        fd = _try_lock(lock)
        if fd is None:
            continue
        try:
            stem = lock[: -len(".lock")]
            old = stem + ".old"
            if os.path.lexists(old):
                if os.path.lexists(dst):
                    _remove(old)
                else:
                    os.rename(old, dst)
            if os.path.lexists(stem):
                _remove(stem)
                removed.append(os.path.basename(stem))
            os.unlink(lock)
        finally:
            os.close(fd)
    return removed


class signals_as_exit:
    """While active (main thread only), SIGTERM and SIGHUP raise SystemExit so that
    ``finally`` blocks and context managers clean up; the old handlers come back after."""

    def __enter__(self) -> "signals_as_exit":
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            def _exit(signum, frame):
                raise SystemExit(128 + signum)

            for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
                if s is not None:
                    self.old[s] = signal.signal(s, _exit)
        return self

    def __exit__(self, *exc) -> bool:
        for s, h in self.old.items():
            signal.signal(s, h)
        return False


class atomic_output:
    """``with atomic_output(dst, kind) as tmp:`` — build the output at ``tmp`` (a new
    directory for ``kind="dir"``, a path to create for ``kind="file"``) beside ``dst``;
    on success it takes ``dst``'s place atomically, on any error (KeyboardInterrupt,
    SIGTERM and SIGHUP included) it is removed and ``dst`` is left as it was.

    Directories: where ``dst`` exists, ``renameat2(RENAME_EXCHANGE)`` swaps old and new in
    one step and the old one is removed afterwards. Without that call (not Linux, or a
    file system lacking it) the old ``dst`` is renamed aside to ``<tmp>.old`` first: a
    crash between the two renames leaves ``dst`` missing for that moment, and the next
    run for the same ``dst`` puts ``<tmp>.old`` back (see :func:`clean_abandoned`).
    Files are replaced with one ``rename``. The caller checks ``dst`` first
    (:func:`check_output`); without ``overwrite`` a ``dst`` that appears meanwhile (other
    than an empty directory) is not replaced: :class:`FileExistsError`.
    """

    def __init__(self, dst: str | os.PathLike, kind: str = "dir", overwrite: bool = False):
        self.dst = os.path.abspath(os.fspath(dst))
        self.kind = kind
        self.overwrite = overwrite

    def __enter__(self) -> str:
        parent = os.path.dirname(self.dst)
        os.makedirs(parent, exist_ok=True)
        clean_abandoned(self.dst)
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"
        for _ in range(100):
            stem = os.path.join(parent, f"{_prefix(self.dst)}{host}-{os.getpid()}-{secrets.token_hex(6)}")
            try:
                fd = os.open(stem + ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            except FileExistsError:
                continue
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                st, now = os.fstat(fd), os.stat(stem + ".lock", follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                    break  # ours, and no cleaner removed it between the create and the lock
            except OSError as e:
                if e.errno in _NO_LOCKS:  # a file system without flock: nobody can prove us gone, so
                    break                 # nobody removes our temporary (a killed run's stays for the user)
            os.close(fd)
        else:
            raise OSError(f"cannot create a temporary beside {self.dst}")
        self.stem, self.lock_fd = stem, fd
        with _OURS_LOCK:
            _OURS.add(stem + ".lock")
        self.tmp = stem
        if self.kind == "dir":
            os.mkdir(stem, 0o700)
        self._sig = signals_as_exit().__enter__()
        return stem

    def _commit(self) -> None:
        tmp, dst = self.tmp, self.dst
        os.chmod(tmp, output_mode(directory=self.kind == "dir"))
        if (not self.overwrite and os.path.lexists(dst)
                and not (self.kind == "dir" and os.path.isdir(dst) and not os.path.islink(dst) and not os.listdir(dst))):
            raise FileExistsError(f"{dst} appeared while the output was being built; it was not replaced "
                                  "(pass --overwrite / overwrite=True to replace it)")
        if self.kind == "file":
            if os.path.lexists(dst):
                os.replace(tmp, dst)
            elif not _renameat2(tmp, dst, _RENAME_NOREPLACE):
                os.rename(tmp, dst)
            return
        if not os.path.lexists(dst):
            try:
                if _renameat2(tmp, dst, _RENAME_NOREPLACE):
                    return
            except FileExistsError as e:
                raise FileExistsError(f"{dst} appeared while the output was being built; it was not "
                                      "replaced") from e
            os.rename(tmp, dst)
            return
        if _renameat2(tmp, dst, _RENAME_EXCHANGE):
            _remove(tmp)  # now holds the old dst
            return
        old = self.stem + ".old"
        os.rename(dst, old)
        try:
            os.rename(tmp, dst)
        except BaseException:
            os.rename(old, dst)  # put the old one back
            raise
        _remove(old)

    def __exit__(self, et, ev, tb) -> bool:
        try:
            if et is None:
                self._commit()
        finally:
            try:
                if os.path.lexists(self.tmp):
                    _remove(self.tmp)
                if os.path.lexists(self.stem + ".old") and os.path.lexists(self.dst):
                    _remove(self.stem + ".old")
                os.unlink(self.stem + ".lock")
            finally:
                with _OURS_LOCK:
                    _OURS.discard(self.stem + ".lock")
                os.close(self.lock_fd)
                self._sig.__exit__(None, None, None)
        return False
