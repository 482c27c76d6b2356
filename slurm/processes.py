"""The processes a local job started, read from /proc (Linux), so that a stop leaves none of them
behind.

A local job's controller forwards the stop to its tasks and kills them after its own grace; if the
controller itself has to be killed first (a loaded machine where train.py takes long to save its
last checkpoint), its tasks and their train.py are re-parented and would keep running. `family(pid)`
names them while they are still its descendants; `kill_left(family)` ends whichever are still alive
(each checked by its start time, so a reused pid is never hit). Elsewhere than Linux both do
nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int):
    """(parent pid, start time in clock ticks) of a live process, or None (gone, a zombie, or no
    /proc)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[
        text.rindex(")") + 2 :
    ].split()  # after "pid (name) ": state, ppid, ..., starttime (field 22)
    return None if fields[0] == "Z" else (int(fields[1]), fields[19])


def family(pid: int) -> dict[int, str]:
    """{pid: start time} of every live descendant of `pid`."""
    parents = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == parent and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def kill_left(members: dict[int, str]) -> list[int]:
    """SIGKILL the members of a `family` that still run (same pid, same start time); the pids
    killed."""
    killed = []
    for pid, start in members.items():
        st = _stat(pid)
        if st is not None and st[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    return killed
