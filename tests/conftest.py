"""Shared fixtures: a real photo as model input, and a table of measured peer-parity differences.

Every test process runs torch on one thread: the test machines are small and shared, and one thread
keeps timings and reductions steady. Set here once, for the whole session, not per module."""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
# the flag rules decide the fast paths in tests (and in the processes they start): a test that wants this
# machine measured says so (tests/test_measured_decisions.py)
os.environ["VITKIT_MEASURE"] = "0"

_PARITY: list[tuple[str, float, float]] = []


@pytest.fixture(autouse=True)
def vitkit_logging_as_configured():
    """Each test starts with vitkit's logger as vitkit leaves it: enabled, propagating to the root (where caplog
    listens), no level of its own (so the root's, Python's default WARNING), no global `logging.disable`. A library
    that reconfigures logging in an earlier test of the same process (raises the root's level, or a `dictConfig`
    that disables every logger it does not name) must not hide vitkit's warnings from a later test: which tests
    share a process depends on how a parallel run splits them."""
    import logging

    logger = logging.getLogger("vitkit")
    logger.disabled, logger.propagate = False, True
    logger.setLevel(logging.NOTSET)
    root = logging.getLogger()
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    yield


@pytest.fixture
def photo_batch():
    """make(size, mean, std) -> [3, 3, size, size]: skimage's astronaut photo resized, plus two random images."""
    from skimage import data

    def make(size: int, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)) -> torch.Tensor:
        img = torch.from_numpy(data.astronaut()).permute(2, 0, 1)[None].float() / 255  # [1, 3, 512, 512]
        img = torch.nn.functional.interpolate(img, size=(size, size), mode="bilinear", antialias=True)
        rand = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
        x = torch.cat([img, rand])
        return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)

    return make


@pytest.fixture
def record_parity():
    """record(config, logits_diff, features_diff): collected for the end-of-run table."""
    def record(name: str, logits: float, feats: float) -> None:
        _PARITY.append((name, logits, feats))

    return record


def pytest_terminal_summary(terminalreporter):
    if _PARITY:
        terminalreporter.write_sep("-", "peer parity: max |diff| (fp32)")
        for name, lo, fe in _PARITY:
            terminalreporter.write_line(f"{name:58s} logits {lo:.2e}  features {fe:.2e}")


# A fresh interpreter, with torch already imported: a "zygote" process imports torch and torchvision once
# (about 5 s of every `python -c "import vitkit ..."` here), then forks one child per job. Each child sets
# its own environment, working directory and blocked packages before anything else is imported, so whatever
# reads the environment or tries an import at import time (huggingface_hub, vitkit, onnx, timm, ...) does so
# freshly, as in `python -c CODE` / `python -m MODULE`. Not for tests about torch's own import-time behaviour.
_ZYGOTE_CODE = r'''
import json, os, runpy, sys, traceback
import torch, torchvision  # noqa: F401  (the shared start-up cost; nothing else is imported here)

PRELOADED = set(sys.modules)
for line in sys.stdin:
    job = json.loads(line)
    loaded = [n for n in job["blocked"] if any(m == n or m.startswith(n + ".") for m in PRELOADED)]
    if loaded:  # the block could not hide them: refuse rather than run a different test
        print(json.dumps({"refused": f"already imported by the zygote: {loaded}"}), flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            for name in job["blocked"]:
                sys.modules[name] = None  # `import name` raises ImportError, as in a fresh interpreter
            try:
                if job["module"]:
                    sys.argv = ["-m", *job["args"]]
                    runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = ["-c", *job["args"]]
                    exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                rc = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
'''


class FreshPython:
    """run(code=..., or module=..., args, env, cwd, blocked, timeout) -> subprocess.CompletedProcess."""

    def __init__(self, workdir):
        import subprocess
        import sys

        self._workdir = workdir
        self._jobs = 0
        self._pending = b""
        self._proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE_CODE], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, bufsize=0)

    def _reply(self, deadline: float) -> dict:
        import json
        import os
        import select
        import time

        # own line buffer over the raw pipe: a buffered readline could hold the next reply where select
        # no longer sees it
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                raise TimeoutError
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, code: str | None = None, *, module: str | None = None, args=(), env=None, cwd=None,
            blocked=(), timeout: float = 300):
        import json
        import os
        import signal
        import subprocess
        import time

        assert (code is None) != (module is None)
        self._jobs += 1
        out, err = self._workdir / f"{self._jobs}.out", self._workdir / f"{self._jobs}.err"
        job = dict(code=code, module=module, args=list(args), env=dict(os.environ if env is None else env),
                   cwd=str(cwd or os.getcwd()), blocked=list(blocked), stdout=str(out), stderr=str(err))
        self._proc.stdin.write((json.dumps(job) + "\n").encode())
        deadline = time.monotonic() + timeout
        first = self._reply(deadline)
        assert "refused" not in first, first["refused"]
        try:
            rc = self._reply(deadline)["returncode"]
        except TimeoutError:
            os.kill(first["pid"], signal.SIGKILL)
            self._reply(time.monotonic() + 30)
            raise subprocess.TimeoutExpired(code or module, timeout) from None
        argv = ["python", *(["-m", module] if module else ["-c", code]), *args]
        return subprocess.CompletedProcess(argv, rc, out.read_text(), err.read_text())

    def close(self):
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory):
    """A fresh interpreter per call, for tests that need one (import-time environment, a missing extra),
    without paying torch's import each time: see _ZYGOTE_CODE."""
    runner = FreshPython(tmp_path_factory.mktemp("fresh-python"))
    yield runner
    runner.close()
