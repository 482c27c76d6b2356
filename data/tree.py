"""Listing an image tree that may hold anything, and naming its entries safely in logs.

Rules for the entries under `root/<split>/<class>/` (docs/run-directory.md states them for users
too):

* Only regular files are images. FIFOs, sockets, device nodes and dangling or looping symlinks are
  never opened: a FIFO with no writer would block the reading process (or data worker) forever, out
  of reach of the trainer's SIGTERM handling. They are skipped, counted, and named in one warning
  line. A file that turns into something else after the listing is refused when read
  (`open_regular`: non-blocking open, then `fstat`), as an unreadable image (`data.on_corrupt`).
* Symlinks are followed: a link to an image is an image, a link to a directory is walked. Every
  directory is listed at most once (keyed by device and inode), where it is met first (classes in
  sorted order, then paths), so a symlink loop, or a second link to a directory already listed, is
  skipped with a warning naming the path: it can neither recurse forever nor count images twice. The
  split folder and the class folders are reached only as themselves: a link inside class a to the
  split folder, or to class b, is skipped (b's images never get a's label).
* Sub-folders of a class folder are walked (as torchvision's ImageFolder does), whatever their
  names: a directory named like an image (`x.jpg/`) is a folder, never opened as an image.
* Names are bytes on Linux: ones that are not UTF-8 are kept (surrogateescape) and read as they are.
  Wherever a name is logged or put into an error message it goes through `printable`: undecodable
  bytes, control characters (newline, carriage return, ESC, ...) and other unprintable code points
  are escaped, so they cannot forge or break lines of `log.txt` or recolour a terminal.
"""

import errno
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SHOWN = 5  # entries named per warning line


def printable(text) -> str:
    """`text` with every unprintable character escaped as Python's repr would (`\\n`, `\\x1b`,
    `\\u202e`) and every undecodable byte of a file name (a surrogateescape code point) as `\\xNN`.
    Idempotent: the result is printable. Backslashes are left as they are (names with them are rare
    on Linux; escaping them would double on each pass)."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as os.fsdecode keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


def entry_kind(path: str) -> str:
    """What `path` is, following symlinks: "file" (regular), "dir", or a description of anything
    else."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if os.path.islink(path):
            return "symlink loop" if e.errno == errno.ELOOP else "dangling symlink"
        return f"unreadable ({e.strerror})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return describe_mode(mode)


def describe_mode(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


class NotRegularFile(OSError):
    """An image path that is not (or no longer) a regular file."""


def open_regular(path: str):
    """`open(path, "rb")` for a regular file only, never blocking: O_NONBLOCK makes opening a FIFO
    return at once (without it, open waits for a writer forever), and `fstat` then refuses it;
    O_NOCTTY keeps a terminal device from becoming the controlling one. Anything not a regular file
    raises `NotRegularFile` naming what it is."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket (or a device with nothing behind it)
            raise NotRegularFile(f"not a regular file ({entry_kind(path)})") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(
                f"not a regular file ({'directory' if stat.S_ISDIR(mode) else describe_mode(mode)})"
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass
class TreeReport:
    """What a listing left out, relative to the split folder: (path, why) pairs."""

    not_regular: list[tuple[str, str]] = field(
        default_factory=list
    )  # FIFOs, sockets, devices, bad links
    repeated_dirs: list[str] = field(
        default_factory=list
    )  # reached again through a symlink (a loop or a 2nd link)
    unreadable_dirs: list[tuple[str, str]] = field(
        default_factory=list
    )  # cannot be listed (permissions, ...)
    not_images: list[str] = field(default_factory=list)  # regular files without an image extension
    hidden: list[str] = field(
        default_factory=list
    )  # names starting with "." where they are left out

    def warnings(self, split_dir: str) -> list[str]:
        """One line per kind of entry left out, counted, naming the first few (printable)."""
        lines = []

        def names(items):
            shown = ", ".join(printable(i) for i in items[:SHOWN])
            return shown + (f", ... ({len(items)} in all)" if len(items) > SHOWN else "")

        where = printable(split_dir)
        if self.not_regular:
            lines.append(
                f"{len(self.not_regular)} entries under {where} are not regular files and are "
                f"never opened: " + names([f"{p} ({why})" for p, why in self.not_regular])
            )
        if self.repeated_dirs:
            lines.append(
                f"{len(self.repeated_dirs)} directories under {where} are reached a second time "
                f"through a "
                "symlink (a loop, or another link to a directory already listed) and are listed "
                "once only: " + names(self.repeated_dirs)
            )
        if self.unreadable_dirs:
            lines.append(
                f"{len(self.unreadable_dirs)} directories under {where} cannot be listed and are "
                f"not used: " + names([f"{p} ({why})" for p, why in self.unreadable_dirs])
            )
        if self.hidden:
            lines.append(
                f"{len(self.hidden)} hidden files and folders under {where} are left out: "
                + names(self.hidden)
            )
        if self.not_images:
            lines.append(
                f"{len(self.not_images)} files under {where} are not images PIL can read (by "
                f"extension) "
                "and are not used: " + names(self.not_images)
            )
        return lines


def list_classes(split_dir: str, report: TreeReport) -> list[str]:
    """The sorted non-hidden folders of `split_dir` (links to folders included). Entries there that
    are neither folders nor regular files (a dangling link meant as a class, a FIFO) go into
    `report.not_regular`; regular files there are ignored, as they always were. Raises OSError if
    `split_dir` cannot be listed."""
    classes = []
    for entry in os.scandir(split_dir):
        if entry.name.startswith("."):
            continue
        kind = _kind(entry)
        if kind == "dir":
            classes.append(entry.name)
        elif kind != "file":
            report.not_regular.append((entry.name, kind))
    return sorted(classes)


def scan_image_tree(
    split_dir: str,
    classes: Sequence[str],
    extensions: tuple[str, ...],
    report: TreeReport | None = None,
    skip_hidden: bool = False,
) -> tuple[list[tuple[str, int]], TreeReport]:
    """(path, class index) of every regular file with an image extension under `split_dir/<class>/`
    (any depth), in torchvision's `make_dataset` order (per class: directories sorted by path, files
    by name), so indices match the ones that function gave for a tree it could read; plus what was
    left out (`report`, or a new `TreeReport`). `classes=[""]` lists `split_dir` itself as one
    class; `skip_hidden` leaves out (and reports) names starting with "." (torchvision walks them,
    so the class trees keep them)."""
    report = TreeReport() if report is None else report
    listed = set()  # (st_dev, st_ino) of every directory listed: each is listed once
    # the split folder and the class folders are reached only as themselves: a link inside class a
    # to the split folder or to class b would otherwise give b's images a's label
    reserved = ({_key(split_dir)} | {_key(os.path.join(split_dir, c)) for c in classes}) - {None}
    samples: list[tuple[str, int]] = []
    for index, cls in enumerate(classes):
        folders = []  # (directory path, names of the regular files in it)
        class_dir = os.path.join(split_dir, cls)
        stack = [class_dir]
        while stack:
            directory = stack.pop()
            rel = os.path.relpath(directory, split_dir)
            try:
                st = os.stat(directory)
                key = st.st_dev, st.st_ino
                repeated = key in listed or (key in reserved and directory != class_dir)
                entries = None if repeated else list(os.scandir(directory))
            except OSError as e:
                report.unreadable_dirs.append((rel, e.strerror or str(e)))
                continue
            if entries is None:
                report.repeated_dirs.append(rel)
                continue
            listed.add(key)
            files = []
            for entry in entries:
                if skip_hidden and entry.name.startswith("."):
                    report.hidden.append(os.path.relpath(entry.path, split_dir))
                    continue
                kind = _kind(entry)
                if kind == "file":
                    files.append(entry.name)
                elif kind == "dir":
                    stack.append(entry.path)
                else:
                    report.not_regular.append((os.path.relpath(entry.path, split_dir), kind))
            folders.append((directory, files))
        for directory, files in sorted(folders):
            for name in sorted(files):
                path = os.path.join(directory, name)
                if name.lower().endswith(extensions):
                    samples.append((path, index))
                else:
                    report.not_images.append(os.path.relpath(path, split_dir))
    return samples, report


class DataNotes:
    """Warnings about a dataset, logged when found and kept: `train.py` builds the dataset before it
    opens the run's `log.txt` (a wrong data.root is reported before the run directory exists), so a
    warning logged then reaches only stderr. `log_again` repeats those into the handlers configured
    since (the trainer's loader calls it)."""

    def __init__(self):
        self.lines: list[str] = []
        self._unlogged: list[
            str
        ] = []  # logged while no handler was configured (Python's last resort: stderr)

    def warn(self, message: str, log: logging.Logger = logger) -> None:
        log.warning("%s", message)
        self.lines.append(message)
        if not log.hasHandlers():
            self._unlogged.append(message)

    def extend(self, other: "DataNotes") -> None:
        self.lines += other.lines
        self._unlogged += other._unlogged

    def log_again(self, log: logging.Logger = logger) -> int:
        """Log the warnings no handler received, now that some exist; returns how many."""
        if not self._unlogged or not log.hasHandlers():
            return 0
        lines, self._unlogged = self._unlogged, []
        for line in lines:
            log.warning("%s (found while building the dataset, before this log was opened)", line)
        return len(lines)


def _key(path: str):
    """A directory's identity (following symlinks); None when it cannot be read (listing it then
    fails, and says)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _kind(entry: os.DirEntry) -> str:
    """`entry_kind` without a system call for plain files and folders (the directory listing's
    d_type says)."""
    try:
        if not entry.is_symlink():
            if entry.is_file(follow_symlinks=False):
                return "file"
            if entry.is_dir(follow_symlinks=False):
                return "dir"
    except OSError:
        pass
    return entry_kind(entry.path)
