"""Hangs and crashes in learner code become one failed test, never a stalled or dead session.

Two protections, registered by the root ``conftest.py`` as the ``course-guard`` plugin:

* **A per-test timeout.** Each phase of a test (setup, call, teardown) gets ``COURSE_TEST_TIMEOUT``
  seconds (default :data:`DEFAULT_TIMEOUT_S`; ``0`` turns it off); ``@pytest.mark.timeout(s)``
  gives one test its own budget (``0`` or ``None``: no limit). When time runs out, SIGALRM raises
  :class:`TestTimeout` inside the test, so the failure carries a traceback pointing at the loop
  and a message naming the likely cause. ``TestTimeout`` derives from ``BaseException`` so a
  learner's ``except Exception:`` inside the loop cannot swallow it. If the exception cannot land
  (code stuck in C, or a bare ``except:``), a watchdog thread gives up ``grace`` seconds later:
  it prints the message and every thread's stack, then ends the process (under ``-n`` xdist
  reports the crashed worker as that test's failure and carries on). Importing a test module (and
  so the learner's file) gets the default limit too. Off under ``--pdb``/``--trace``, and when the
  ``pytest-timeout`` plugin is loaded (it then owns the marker).
* **Triton interpreter isolation.** Under ``TRITON_INTERPRET=1`` a kernel that loads out of bounds
  reads raw memory and can segfault the whole interpreter. So each ``triton``-marked test's call
  phase runs in a forked child (fixtures are set up in the parent, after torch and triton are
  imported, so a fork costs milliseconds). The child reports its outcome, with the usual
  traceback and assertion message, through a pipe; a child that dies from a signal becomes one
  failed test that names the likely cause and shows the child's Python stack at the crash. The
  child runs torch single-threaded (its OpenMP pool does not survive a fork). On a
  real GPU it stays off: a forked child cannot use a CUDA context its parent created, so
  forking there is unsafe. ``COURSE_ISOLATE_TRITON=0`` turns it off (to debug a kernel in-process).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import pytest

DEFAULT_TIMEOUT_S = 60.0
TIMEOUT_ENV = "COURSE_TEST_TIMEOUT"
ISOLATE_ENV = "COURSE_ISOLATE_TRITON"
# Words check-labs looks for to say "timed out" instead of just "failed".
TIMEOUT_TAG = "timed out: likely an infinite loop"
CRASH_TAG = "crashed"


class TestTimeout(BaseException):
    """A test outlived its time budget (``BaseException``: ``except Exception`` cannot hide it)."""

    __test__ = False  # not a test class, whatever pytest's name pattern says


class IsolatedCrash(Exception):
    """The forked child running a test died without reporting (a signal, or ``os._exit``)."""


class _ChildFailure(Exception):
    """Carries the failure report a forked child rendered, for the parent to show as-is."""

    def __init__(self, longrepr):
        super().__init__("test failed in its isolated child process")
        self.longrepr = longrepr


def timeout_message(seconds: float, where: str = "call", killed: bool = False) -> str:
    """``where``: a test phase (setup / call / teardown) or "collection"."""
    how = (
        "the process did not respond and was stopped; the stack below shows where it was"
        if killed
        else "the traceback shows where it was when time ran out"
    )
    return (
        f"{TIMEOUT_TAG} — {_PHASES.get(where, where)} ran for more than {seconds:g}s ({how}). "
        f"Most likely a loop that never terminates — check your loop's exit condition: a while "
        f"condition that never becomes false, an index or counter that never advances, a queue or "
        f"free list that is refilled as fast as it drains, a `continue` that skips the update. "
        f"(A legitimately slow test can ask for more with @pytest.mark.timeout(seconds); "
        f"{TIMEOUT_ENV}=seconds sets the default, 0 turns the limit off.)"
    )


_PHASES = {
    "setup": "this test's setup (its fixtures)",
    "call": "this test",
    "teardown": "this test's teardown",
    "collection": "importing this test module (and the file it tests)",
}


# --------------------------------------------------------------------------------------- settings


def default_timeout() -> float | None:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(
            f"{TIMEOUT_ENV}={raw!r}: give a number of seconds (0 turns the limit off)"
        ) from None
    return value if value > 0 else None


def timeout_for(item: pytest.Item) -> float | None:
    """The budget of each phase of ``item`` in seconds, or None for no limit."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("seconds")
        return float(value) if value else None
    return default_timeout()


def grace_for(seconds: float) -> float:
    """How long after the soft timeout the hard stop waits for the exception to land."""
    return min(30.0, max(5.0, seconds / 4))


def isolation_mode(has_cuda: bool) -> bool:
    """Whether ``triton`` tests run in a forked child: on under the interpreter, off on a GPU."""
    if os.environ.get(ISOLATE_ENV, "").strip() in ("0", "false", "no", "off"):
        return False
    # Never on a real GPU: CUDA cannot be used in a child forked after the parent initialised it
    # (the child fails or hangs), and compiled kernels do not go through the interpreter anyway.
    if has_cuda or not hasattr(os, "fork"):
        return False
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ------------------------------------------------------------------------------ timers and watchdog


class _Watchdog:
    """One daemon thread that ends the process if a test ignores its soft timeout for too long."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._message = ""
        self._thread: threading.Thread | None = None
        self.stderr_fd = 2

    def arm(self, deadline: float | None, message: str) -> tuple[float | None, str]:
        """Set (or with None, clear) the deadline; returns the previous one, to restore when nested."""
        with self._cond:
            if self._thread is None and deadline is not None:
                self._thread = threading.Thread(target=self._loop, name="course-guard-watchdog", daemon=True)
                self._thread.start()
            previous = (self._deadline, self._message)
            self._deadline, self._message = deadline, message
            self._cond.notify()
            return previous

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._fire()

    def _fire(self) -> None:
        fd = self.stderr_fd
        with contextlib.suppress(OSError, ValueError):
            with tempfile.TemporaryFile() as dump:
                faulthandler.dump_traceback(file=dump, all_threads=True)
                dump.seek(0)
                stack = trim_stack(dump.read().decode("utf-8", "replace"), drop_current=True)
            os.write(fd, f"\n\ncourse guard: {self._message}\n\n{stack}\n".encode())
        os._exit(124)

    def after_fork_in_child(self) -> None:
        # The thread does not exist in a forked child; its lock may have been held at fork time.
        self._cond = threading.Condition()
        self._deadline, self._thread = None, None


_watchdog = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watchdog.after_fork_in_child)


def _raise_timeout(message: str) -> Callable:
    def handler(signum, frame):
        __tracebackhide__ = True
        raise TestTimeout(message)

    return handler


def _async_raise(thread_id: int, message: str) -> None:
    """Raise ``TestTimeout(message)`` in another thread (used when the test is not on the main
    thread, where SIGALRM cannot reach it). Works for Python code; C code is the watchdog's job."""
    exc = type("TestTimeout", (TestTimeout,), {"__init__": lambda self: TestTimeout.__init__(self, message)})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


@contextlib.contextmanager
def time_limit(
    seconds: float | None, where: str = "call", hard_stop: bool = True, name: str = ""
) -> Iterator[None]:
    """Raise :class:`TestTimeout` in the body after ``seconds``; end the process ``grace`` later.

    Nests: an inner limit (a test of this module, say) restores the outer one's remaining time."""
    if not seconds:
        yield
        return
    message = timeout_message(seconds, where)
    # SIGALRM reaches only the main thread (and does not exist on Windows): elsewhere a timer thread
    # raises the exception asynchronously in the test's thread.
    on_main = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    timer = None
    start = time.monotonic()
    if on_main:
        previous = signal.signal(signal.SIGALRM, _raise_timeout(message))
        outer_left, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    else:
        timer = threading.Timer(seconds, _async_raise, (threading.get_ident(), message))
        timer.daemon = True
        timer.start()
    if hard_stop:
        last_words = timeout_message(seconds, where, killed=True) + " The test session stops here."
        outer_watch = _watchdog.arm(
            start + seconds + grace_for(seconds), f"{name}: {last_words}" if name else last_words
        )
    try:
        yield
    finally:
        if on_main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer_left:
                signal.setitimer(signal.ITIMER_REAL, max(0.001, outer_left - (time.monotonic() - start)))
        else:
            timer.cancel()
        if hard_stop:
            _watchdog.arm(*outer_watch)


# --------------------------------------------------------------------------------- forked isolation


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        what = {
            "SIGSEGV": "a segmentation fault",
            "SIGBUS": "a bus error",
            "SIGABRT": "an abort",
            "SIGFPE": "an arithmetic fault",
            "SIGILL": "an illegal instruction",
            "SIGKILL": "SIGKILL (out of memory?)",
        }.get(name, name)
        return f"was killed by {name} ({what})"
    return f"exited with status {os.waitstatus_to_exitcode(status)} before reporting"


def crash_message(status: int, stack: str, hint: str = "") -> str:
    """What a crashed test reports; ``hint`` (``@pytest.mark.crash_hint("...")``) names this test's usual cause."""
    stack = stack.strip()
    return (
        (f"{CRASH_TAG}: {hint}\n\n" if hint else "")
        + f"{CRASH_TAG}: this test's process {_describe_status(status)} while it ran under the Triton "
        f"interpreter (TRITON_INTERPRET=1). Most likely a tl.load or tl.store touched memory outside "
        f"its tensor: check every pointer's offsets (row/column strides, the block index times the "
        f"block size) and the mask that guards the tail, and give masked loads an `other=`. Only this "
        f"test failed; the rest of the session goes on."
        + (f"\n\nThe child's Python stack when it died (most recent call first):\n{stack}" if stack else "")
    )


def _child_prepare(crash_file) -> None:
    """First things in the forked child."""
    with contextlib.suppress(Exception):  # die with the parent (Linux): no orphan keeps running
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    torch = sys.modules.get("torch")
    if torch is not None:
        # torch's OpenMP pool does not survive fork: a child that uses more than one intra-op
        # thread after the parent did hangs forever (measured with torch 2.13 on Linux).
        torch.set_num_threads(1)
    faulthandler.enable(file=crash_file, all_threads=True)


def _child_outcome(item: pytest.Item, runtest: Callable[[], None], seconds: float | None) -> dict:
    try:
        with time_limit(seconds, "call", hard_stop=False):  # the parent is the hard stop
            runtest()
    except pytest.skip.Exception as exc:
        return {"outcome": "skipped", "msg": exc.msg}
    except pytest.xfail.Exception as exc:
        return {"outcome": "xfailed", "msg": exc.msg}
    except BaseException:  # noqa: BLE001 - every failure is rendered here, where the traceback lives
        from _pytest.reports import TestReport

        excinfo = pytest.ExceptionInfo.from_current()
        longrepr = type(item).repr_failure(item, excinfo)
        report = TestReport(item.nodeid, item.location, {}, "failed", longrepr, "call")
        data = item.config.hook.pytest_report_to_serializable(config=item.config, report=report)
        return {"outcome": "failed", "report": data}
    return {"outcome": "passed"}


def run_isolated(item: pytest.Item, runtest: Callable[[], None], seconds: float | None) -> None:
    """Run ``runtest`` in a forked child and re-raise its outcome here."""
    with tempfile.TemporaryFile() as crash_file:  # the child's faulthandler writes its stack here
        _run_isolated(item, runtest, seconds, crash_file)


def _run_isolated(item: pytest.Item, runtest: Callable[[], None], seconds: float | None, crash_file) -> None:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # Python >= 3.12 warns about fork() in a threaded process (torch's pools, our watchdog);
        # the child only runs this test and calls nothing that needs those threads' locks.
        warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(read_fd)
            _child_prepare(crash_file)
            try:
                payload = json.dumps(_child_outcome(item, runtest, seconds)).encode()
            except BaseException as exc:  # noqa: BLE001 - an unserialisable failure still reports
                payload = json.dumps({"outcome": "error", "msg": f"{type(exc).__name__}: {exc}"}).encode()
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view) :]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds + grace_for(seconds) if seconds else None
    timed_out = False
    try:
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], wait)
            if not ready:
                timed_out = True
                break
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        if timed_out:
            # SIGABRT first: the child's faulthandler prints its stack, then it dies.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
            for _ in range(40):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            pid = 0
            raise TestTimeout(timeout_message(seconds, "call", killed=True) + _stack_from(crash_file))
        _, status = os.waitpid(pid, 0)
        pid = 0
    finally:
        os.close(read_fd)
        if pid:  # interrupted (Ctrl-C): take the child down with us
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    try:
        result = json.loads(b"".join(chunks)) if chunks else None
    except ValueError:
        result = None
    if result is None:
        marker = item.get_closest_marker("crash_hint")
        hint = str(marker.args[0]) if marker and marker.args else ""
        raise IsolatedCrash(crash_message(status, _stack_from(crash_file, header=False), hint))
    outcome = result["outcome"]
    if outcome == "passed":
        return
    if outcome == "skipped":
        raise pytest.skip.Exception(result["msg"], _use_item_location=True)  # not this file's line
    if outcome == "xfailed":
        raise pytest.xfail.Exception(result["msg"])
    if outcome == "error":
        raise IsolatedCrash(f"the isolated child could not report its failure: {result['msg']}")
    report = item.config.hook.pytest_report_from_serializable(config=item.config, data=result["report"])
    raise _ChildFailure(report.longrepr)


_PLUMBING = (
    "/_pytest/",
    "/pluggy/",
    "/xdist/",
    "/execnet/",
    "/pytest/__main__.py",
    "course/guard.py",
    "course/zygote.py",
    "<frozen runpy>",
)


def trim_stack(text: str, drop_current: bool = False) -> str:
    """A faulthandler dump without pytest's and this module's frames, so the learner's stand out.

    ``drop_current`` leaves out the dumping thread's own block (the watchdog's)."""
    blocks = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if drop_current and lines and lines[0].startswith("Current thread"):
            continue
        if lines and lines[0].startswith("Extension modules:"):
            continue
        out: list[str] = []
        for line in lines:
            if line.startswith("  File ") and any(p in line for p in _PLUMBING):
                if out and out[-1] != "  ...":
                    out.append("  ...")
                continue
            out.append(line)
        while out and out[-1] == "  ...":
            out.pop()
        blocks.append("\n".join(out))
    return "\n\n".join(b for b in blocks if b.strip())


def _stack_from(crash_file, header: bool = True) -> str:
    try:
        crash_file.seek(0)
        text = crash_file.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""
    text = trim_stack(text)
    if not text:
        return ""
    return f"\n\nThe child's stack when it was stopped:\n{text}" if header else text


# ------------------------------------------------------------------------------------ the plugin


class GuardPlugin:
    """pytest hooks: a time limit around every test phase, fork isolation for interpreter kernels."""

    def __init__(self, config: pytest.Config, has_cuda: bool) -> None:
        self.default = default_timeout()  # validates the env var up front
        debugging = bool(config.getoption("usepdb", False) or config.getoption("trace", False))
        self.other_plugin = config.pluginmanager.hasplugin("timeout")  # pytest-timeout owns the marker
        self.timeouts_on = not debugging and not self.other_plugin
        self.isolate = isolation_mode(has_cuda)
        if not self.other_plugin:
            config.addinivalue_line(
                "markers",
                f"timeout(seconds): this test's own time budget per phase (default {TIMEOUT_ENV} or "
                f"{DEFAULT_TIMEOUT_S:g}s; 0 or None: no limit)",
            )
        with contextlib.suppress(OSError):
            _watchdog.stderr_fd = os.dup(2)  # the terminal: fd 2 is captured while tests run

    def report_header(self) -> str:
        limit = f"{self.default:g}s per test phase" if self.default else "off"
        if not self.timeouts_on:
            limit = "off (pytest-timeout loaded)" if self.other_plugin else "off (debugging)"
        iso = "on (a forked child per test)" if self.isolate else "off"
        return f"guard: timeout {limit} ({TIMEOUT_ENV}); triton isolation {iso} ({ISOLATE_ENV})"

    def _limit(self, item: pytest.Item) -> float | None:
        return timeout_for(item) if self.timeouts_on else None

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        # Importing a test module imports the learner's file: a loop at its top level hangs here.
        seconds = self.default if self.timeouts_on and isinstance(collector, pytest.Module) else None
        with time_limit(seconds, "collection", name=collector.nodeid):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        with time_limit(self._limit(item), "setup", name=item.nodeid):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        seconds = self._limit(item)
        if self.isolate and item.get_closest_marker("triton") and isinstance(item, pytest.Function):
            runtest = item.runtest
            item.runtest = lambda: run_isolated(item, runtest, seconds)
            item.repr_failure = lambda excinfo, style=None: _repr_failure(item, excinfo, style)
            try:
                return (yield)
            finally:
                del item.runtest
        with time_limit(seconds, "call", name=item.nodeid):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        with time_limit(self._limit(item), "teardown", name=item.nodeid):
            return (yield)


def _repr_failure(item: pytest.Item, excinfo: pytest.ExceptionInfo, style=None):
    if isinstance(excinfo.value, _ChildFailure):
        return excinfo.value.longrepr  # rendered in the child, where the traceback was
    if isinstance(excinfo.value, (IsolatedCrash, TestTimeout)):
        return str(excinfo.value)  # no parent-side traceback: it would only show the fork plumbing
    return type(item).repr_failure(item, excinfo, style)
