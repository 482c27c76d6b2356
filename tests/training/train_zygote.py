"""train.py runs forked from a process that has imported it once (a zygote, `zygote_server.py`), for
the tests that start train.py dozens of times: each start skips the ~5 s of imports (torch, timm,
the repository) that a fresh interpreter pays on two CPU cores, and otherwise runs as `python
train.py ...` does, in a process of its own: its pid, folder, environment, argv, stdout and stderr,
exit code (-N when killed by signal N), a session of its own on request, non-daemon threads and
atexit handlers at exit.

What a fork cannot give: settings read when an interpreter starts (PYTHON* variables, -X options)
and modules imported before the run's environment is set; a test of those starts train.py in a fresh
interpreter (`train_runs.run_train(..., fresh=True)`). One zygote per test process, started at its
first use.
"""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SERVER = Path(__file__).with_name("zygote_server.py")


class Zygote:
    def __init__(self, repo: Path):
        self.repo = repo
        self.outputs = Path(tempfile.mkdtemp(prefix="train-zygote-"))
        self.lock = threading.Lock()
        self.count = 0
        self.server = subprocess.Popen(
            [sys.executable, str(SERVER), str(repo)],
            cwd=repo,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def request(self, **request) -> dict:
        with self.lock:
            if self.server.poll() is not None:
                raise RuntimeError(f"the train.py zygote exited ({self.server.returncode})")
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            return json.loads(self.server.stdout.readline())

    def start(
        self, argv: list, cwd: Path, env: dict, new_session: bool, capture_stdout: bool
    ) -> "ForkedRun":
        with self.lock:
            self.count += 1
            stem = self.outputs / f"run{self.count}"
        stdout = f"{stem}.out" if capture_stdout else os.devnull
        reply = self.request(
            op="start",
            argv=[str(a) for a in argv],
            cwd=str(cwd),
            env=dict(env),
            stdout=stdout,
            stderr=f"{stem}.err",
            new_session=new_session,
        )
        return ForkedRun(
            self, reply["pid"], argv, Path(stdout) if capture_stdout else None, Path(f"{stem}.err")
        )

    def close(self) -> None:
        if self.server.poll() is None:
            self.server.stdin.close()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
        shutil.rmtree(self.outputs, ignore_errors=True)


class _DeferredText:
    """`Popen.stderr` as the tests read it: `read()` waits for the run to end, then gives all it
    wrote."""

    def __init__(self, run: "ForkedRun", path: Path):
        self.run, self.path = run, path

    def read(self) -> str:
        self.run.wait()
        return self.path.read_text(errors="replace")


class ForkedRun:
    """The part of `subprocess.Popen` the tests use, for a run forked by the zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list, stdout: Path | None, stderr: Path):
        self.zygote, self.pid, self.args = zygote, pid, args
        self.stdout_path, self.stderr_path = stdout, stderr
        self.stderr = _DeferredText(self, stderr)
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.request(op="poll", pid=self.pid)["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped yet, so the pid is still this run's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) once the run has ended."""
        self.wait()
        out = self.stdout_path.read_text(errors="replace") if self.stdout_path else ""
        return out, self.stderr_path.read_text(errors="replace")


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote(repo: Path) -> Zygote:
    """This test process's zygote, started at its first use (again if it died)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.server.poll() is not None:
            _zygote = Zygote(repo)
            atexit.register(_zygote.close)
        return _zygote
