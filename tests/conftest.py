"""Shared fixtures: one real vLLM engine for the whole test session (engines are slow to start)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("KVLAB_QUICK", "1")
_CLOCK = {"start": time.monotonic(), "module_start": time.monotonic()}
_CPU_SEEN: dict[int, float] = {}


def pytest_report_header(config):
    """The machine this run is on (CPU, cores, memory, the dtype chosen): what a slow CI run is read against."""
    from kvlab.runtime import envinfo

    report = envinfo.env_report()
    keys = ("cpu", "cpu flags (vector/matrix)", "cores usable", "memory total / available", "vllm", "model dtype")
    return [f"{k}: {report[k]}" for k in keys]


def _busy_processes(seconds: float) -> str:
    """Processes alive now that used over a fifth of a core since the last module ended (a leaked engine or server
    spinning shows here), with the CPU seconds they used."""
    import psutil

    busy = []
    for proc in psutil.process_iter(["pid", "name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is None or proc.info["pid"] == os.getpid():
            continue
        used = times.user + times.system
        since = used - _CPU_SEEN.get(proc.info["pid"], 0.0)
        _CPU_SEEN[proc.info["pid"]] = used
        if since > 0.2 * seconds:
            busy.append(f"{proc.info['name']}[{proc.info['pid']}] {since:.0f} s")
    return ", ".join(busy) or "none"


def _available_gib() -> float:
    """Memory available now (GiB): a run short of memory (an engine's worker killed) shows here before it hangs."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def pytest_sessionstart(session):
    _busy_processes(float("inf"))  # CPU used before the run is not counted
    if not os.environ.get("KVLAB_STARTUP_LOG"):  # every engine and server start of the run (kernels inherit it)
        import tempfile

        fd, path = tempfile.mkstemp(prefix="kvlab-startups-", suffix=".jsonl")
        os.close(fd)
        os.environ["KVLAB_STARTUP_LOG"] = path


def _startups() -> tuple[int, float]:
    """Engine and service start-ups recorded so far in this run (``config.note_startup``): how many, seconds in all."""
    from kvlab.course.build import startup_seconds

    path = os.environ.get("KVLAB_STARTUP_LOG", "")
    seen = startup_seconds(Path(path)) if path and Path(path).exists() else []
    return len(seen), sum(seen)


def python_stacks(pids: list[int]) -> str:
    """Every thread's Python stack in each process (py-spy, which reads a process without stopping it for long): where
    a hung notebook kernel, vLLM engine core or worker waits, which pytest-timeout's own dump (pytest only) can't show."""
    import shutil
    import subprocess
    import sys

    import psutil

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    parts = []
    for pid in pids:
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())[:160]
            done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            parts.append(f"--- pid {pid}: {cmd}\n{done.stdout or done.stderr}")
        except (OSError, subprocess.SubprocessError, psutil.Error) as err:
            parts.append(f"--- pid {pid}: no stack ({err})")
    return "\n".join(parts)


def _dump_if_hung(config, nodeid: str, after: float) -> None:
    """Print the stacks of this run's Python processes on the terminal, live (past pytest's capture, so they are in
    the log even if the whole run is killed)."""
    import psutil

    me = psutil.Process()
    pids = [me.pid]
    for proc in me.children(recursive=True):  # by executable: vLLM renames its processes (VLLM::EngineCore)
        try:
            if "python" in Path(proc.exe()).name:
                pids.append(proc.pid)
        except psutil.Error:
            pass
    text = (f"\n=== {nodeid} still running after {after:.0f} s (memory available {_available_gib():.1f} GiB): the "
            f"Python stacks of this run's processes ===\n"
            f"{python_stacks(pids)}\n=== end of stacks ===")
    terminal, capture = (config.pluginmanager.get_plugin(name) for name in ("terminalreporter", "capturemanager"))
    if terminal is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # the test's thread is stuck: nothing else writes meanwhile
            terminal.write_line(text, flush=True)


#: Before any lesson run on another model has finished, how long one is assumed to take (s): the slowest seen on a
#: 2-core AVX2-only machine in float32 was about 5 minutes.
FIRST_MODEL_RUN_S = 300.0
_MODEL_RUNS: list[float] = []


def deadline_reason(now: float, deadline: float, runs_s: list[float]) -> str | None:
    """Why a ``models`` lesson run should not start with CI's deadline (unix time) at ``deadline``: when the time left
    is under 1.25 × the slowest such run so far (``FIRST_MODEL_RUN_S`` before any). None: start it."""
    slowest = max(runs_s, default=FIRST_MODEL_RUN_S)
    left = deadline - now
    if left >= 1.25 * slowest:
        return None
    return (f"CI deadline (KVLAB_CI_DEADLINE): {max(left, 0) / 60:.1f} min left, a lesson run here takes up to "
            f"{slowest / 60:.1f} min; not started, so the run ends inside CI's limit with every result it has")


#: Seconds each slow test file and lesson took in quick mode on the slowest CI machine seen: a 2-core AVX2-only EPYC
#: in float32 (2026-12-05, CI of 99b542c; lessons 07-10, which that run did not reach, from another AVX2 run × 1.8).
#: The deadline guard scales them by this run's own speed. Files not listed take under a minute there.
SLOW_MACHINE_S = {
    "tests/test_capacity.py": 96, "tests/test_engine.py": 86, "tests/test_forecast.py": 529, "tests/test_gateway.py": 100,
    "tests/test_grid.py": 115, "tests/test_kvevents.py": 67, "tests/test_labs.py": 256, "tests/test_paged.py": 77,
    "tests/test_serving.py": 218, "tests/test_speculative.py": 96, "tests/test_stepmodel.py": 582,
    "notebooks/00_setup_and_first_tokens.ipynb": 75, "notebooks/01_kv_cache_by_hand.ipynb": 99,
    "notebooks/02_prefill_vs_decode.ipynb": 320, "notebooks/03_prefix_caching.ipynb": 751,
    "notebooks/04_chunked_prefill.ipynb": 319, "notebooks/05_batching.ipynb": 535,
    "notebooks/06_serving_and_dashboards.ipynb": 464, "notebooks/07_capacity_under_slos.ipynb": 710,
    "notebooks/08_inside_the_paged_kv_cache.ipynb": 290, "notebooks/09_speculative_decoding.ipynb": 310,
    "notebooks/10_predict_then_measure.ipynb": 940,
}
_FILE_PLAN: dict[str, str | None] = {}  # file → why its engine tests and lesson cells are skipped (None: they run)
_PACE = {"took": 0.0, "slow_machine": 0.0}  # listed files finished in this run: their seconds, and SLOW_MACHINE_S's


def pace() -> float:
    """This run's speed against the slow machine's table: seconds taken ÷ seconds listed, over the listed files done
    (1.0 before any, so the first estimates are the slow machine's own)."""
    return _PACE["took"] / _PACE["slow_machine"] if _PACE["slow_machine"] else 1.0


def file_deadline_reason(now: float, deadline: float, listed_s: float, speed: float) -> str | None:
    """Why a slow file's engine tests (or a lesson's cells) should not start with CI's deadline at ``deadline``: its
    listed time × this run's speed, plus a tenth, would end past it. None: run it."""
    expected = listed_s * speed
    left = deadline - now
    if left >= 1.1 * expected:
        return None
    return (f"CI deadline (KVLAB_CI_DEADLINE): {max(left, 0) / 60:.1f} min left, this file would take about "
            f"{expected / 60:.1f} min here; not started, so the run ends inside CI's limit with every result it has")


def pytest_runtest_logreport(report):
    """Each lesson run on another model that ran (a skipped one has no call phase): how long it took."""
    if report.when == "call" and "models" in report.keywords:
        _MODEL_RUNS.append(report.duration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test still running at 80 % of pytest-timeout's limit prints every process's Python stack (the kernel's and
    vLLM's, not only pytest's); after a test file's last test: its time, the run's time so far, load, busy processes."""
    try:
        after = 0.8 * float(item.config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout not installed: no limit, no watchdog
        after = 0.0
    watchdog = threading.Timer(after, _dump_if_hung, (item.config, item.nodeid, after)) if after > 0 else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    yield
    if watchdog is not None:
        watchdog.cancel()
    module = item.nodeid.split("::")[0]
    if nextitem is None or nextitem.nodeid.split("::")[0] != module:
        now = time.monotonic()
        took, _CLOCK["module_start"] = now - _CLOCK["module_start"], now
        if module in SLOW_MACHINE_S and not _FILE_PLAN.get(module):  # run in full: it tells this machine's speed
            _PACE["took"] += took
            _PACE["slow_machine"] += SLOW_MACHINE_S[module]
        terminal = item.config.pluginmanager.get_plugin("terminalreporter")
        count, seconds = _startups()
        starts = f"{count - _CLOCK.get('starts', 0):.0f} start-ups, {seconds - _CLOCK.get('start_s', 0.0):.0f} s"
        _CLOCK["starts"], _CLOCK["start_s"] = count, seconds
        if terminal is not None:
            terminal.write_line(f"  [{module}: {took:.0f} s ({starts}); {(now - _CLOCK['start']) / 60:.1f} min so far; load "
                                f"{os.getloadavg()[0]:.1f}; memory available {_available_gib():.1f} GiB; "
                                f"busy others: {_busy_processes(took)}]")


class _FiguresWithinTheirData:
    """A notebook cell run by nbval fails when a figure it drew puts a label or an axis range orders of magnitude beyond
    its data (``figures.overreach``, the check ``make course`` applies to each built lesson). A plugin, not a conftest
    hook: a conftest's call hooks reach only the tests below it, and the notebooks are not under tests/."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        outcome = yield
        outputs = getattr(item, "test_outputs", None) or []  # nbval's outputs of the cell it just ran
        if outcome.excinfo is not None or not outputs:
            return
        from kvlab.runtime import figures

        problems = figures.output_problems(outputs)
        if problems:
            outcome.force_exception(AssertionError("a figure reaches far beyond its data: " + "; ".join(problems)))


class _CIDeadline:
    """The deadline guard as a plugin: a conftest's setup hooks reach only the tests below it, and the notebooks are
    not under tests/."""

    def pytest_runtest_setup(self, item):
        """With ``KVLAB_CI_DEADLINE`` set (``.ci/run`` sets it), a lesson run on another model (``models``), or a slow
        file's engine tests or lesson (``SLOW_MACHINE_S``), that would likely end past it is skipped, with the reason: a
        slow machine's CI ends green and says what it left out, instead of being killed at its limit with nothing
        reported."""
        deadline = os.environ.get("KVLAB_CI_DEADLINE")
        if not deadline:
            return
        if item.get_closest_marker("models") is not None:
            reason = deadline_reason(time.time(), float(deadline), _MODEL_RUNS)
            if reason:
                pytest.skip(reason)
            return
        module = item.nodeid.split("::")[0]
        heavy = module.endswith(".ipynb") or any(item.get_closest_marker(m) for m in ("engine", "notebook"))
        if heavy and module in SLOW_MACHINE_S:
            if module not in _FILE_PLAN:  # decided once per file: a lesson runs all its cells or none
                _FILE_PLAN[module] = file_deadline_reason(time.time(), float(deadline), SLOW_MACHINE_S[module], pace())
            if _FILE_PLAN[module]:
                pytest.skip(_FILE_PLAN[module])


def pytest_configure(config):
    config.pluginmanager.register(_FiguresWithinTheirData(), "kvlab-figures-within-their-data")
    config.pluginmanager.register(_CIDeadline(), "kvlab-ci-deadline")


@pytest.fixture(autouse=True)
def _markers_say_what_a_test_starts(request, monkeypatch):
    """A test that starts a vLLM engine or server must be marked ``engine``, one that executes a notebook ``notebook``:
    ``make unit`` runs neither and stays under a minute. An unmarked test that tries either fails here at once."""
    marks = {m.name for m in request.node.iter_markers()}
    if "engine" in marks or "notebook" in marks:
        return
    if "engine" in request.fixturenames:
        pytest.fail("this test uses the session's engine: mark it @pytest.mark.engine")
    from kvlab.runtime import engine, kernels, services, serving

    def refuse(what: str, mark: str):
        def refused(*args, **kwargs):
            pytest.fail(f"this test {what}: mark it @pytest.mark.{mark}")
        return refused

    monkeypatch.setattr(engine, "import_vllm", refuse("starts a vLLM engine", "engine"))
    start, launch = serving.Server.start, refuse("starts a vLLM server", "engine")

    def guarded_start(self):  # a busy port is refused before anything launches: that much a unit test may check
        return start(self) if services.port_in_use(self.host, self.port) else launch()

    monkeypatch.setattr(serving.Server, "start", guarded_start)
    monkeypatch.setattr(kernels, "execute", refuse("executes a notebook", "notebook"))


@pytest.fixture(scope="session")
def engine():
    """The default model in a real vLLM engine with KV Lab's settings (eager, 1 GiB KV on CPU)."""
    import kvlab

    llm = kvlab.make_engine(enforce_eager=True)
    yield llm
    kvlab.close_engine(llm)


@pytest.fixture(scope="session")
def second_model():
    """The second architecture (Qwen2 layout, random weights, made locally): the model most lab tests run, so one
    CI run per lab covers both the lab and the course beyond its own model (tests/test_second_model.py)."""
    from kvlab.runtime import randomweights

    return randomweights.prepare_second_model()


@pytest.fixture(scope="session")
def model_dir():
    """The prepared, verified default model folder."""
    import kvlab

    return kvlab.prepare_default_model()


def pytest_sessionfinish(session, exitstatus):
    """No vLLM server may outlive the tests or notebooks that started it: fail the run if one did. Prints the run's
    engine and service start-ups (how many, how long in all): the part of CI's time no workload sizing can shrink."""
    count, seconds = _startups()
    print(f"\nengine and service start-ups in this run: {count}, {seconds / 60:.1f} min in all "
          f"(the course build's own lessons are in its report)")
    from kvlab.runtime.serving import running_servers

    left = [p.pid for p in running_servers()]
    if left:
        print(f"\nvLLM server processes left running after the tests: {left}")
        session.exitstatus = 1
    import psutil

    ours = ("kvlab.runtime.gateway", "kvlab-redis-")  # the gateway's module; the Redis the course starts works in kvlab-redis-*
    others = [p.pid for p in psutil.process_iter(["cmdline"]) if any(m in " ".join(p.info["cmdline"] or []) for m in ours)]
    if others:
        print(f"\ngateway or Redis processes left running after the tests: {others}")
        session.exitstatus = 1
