"""The server side of `train_zygote.py`: imports train.py's modules once, then forks one child per
request that runs train.py as `python train.py ARGS` would. Protocol: one JSON object per line on
stdin, one reply per line on stdout.

    {"op": "start", "argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path, "new_session": bool}
        -> {"pid": pid}
    {"op": "poll", "pid": pid} -> {"code": None while it runs, else its exit code (-N: killed by signal N)}
"""

import atexit
import json
import os
import runpy
import sys
import threading
import traceback

REPO = sys.argv[1]
sys.argv = [os.path.join(REPO, "train.py")]
sys.path.insert(0, REPO)  # `python train.py` puts the script's folder first on sys.path

# train first: it sets its environment defaults before torch loads, as a fresh start does; then the
# rest of what train.main imports (torch, timm, the repository)
import train  # noqa: E402,F401,I001
import data  # noqa: E402,F401
from training import preflight, trainer  # noqa: E402,F401


def _exit_code(exit_request: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit: None 0, an int itself, anything else
    printed and 1."""
    code = exit_request.code
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _run_child(request: dict) -> None:
    """In the forked child: train.py with the request's session, streams, folder, environment and
    arguments; then what the interpreter does at exit (non-daemon threads joined, atexit handlers,
    streams flushed). Never returns."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdout.reconfigure(write_through=True)  # PYTHONUNBUFFERED, as the tests start train.py
        sys.stderr.reconfigure(write_through=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        # an uncaught exception: traceback and exit 1, as the interpreter does
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # the interpreter joins non-daemon threads before atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    finished = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "start":
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            reply = {"pid": pid}
        elif request["op"] == "poll":
            pid = request["pid"]
            if pid not in finished:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    finished[pid] = os.waitstatus_to_exitcode(status)
            reply = {"code": finished.get(pid)}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
