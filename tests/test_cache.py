"""The build cache under faults and concurrency: damaged entries are rebuilt (with a warning), an
interrupted build never leaves an entry that loads wrongly, the size cap is honoured without
evicting entries in use, and concurrent processes building one model (or several) agree."""
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import codegen
from codegen.backend import cache, toolchain
from codegen.write import emit
from micrograd_c import MLP, Value

COMPILER = "tcc"  # the fastest to build: these tests build a lot


def tiny_model(hidden=4, seed=0):
    random.seed(seed)
    model = MLP(3, [hidden, 1])
    xs = [Value(0.5) for _ in range(3)]
    return model(xs), xs, model.parameters()


def compile_tiny(directory, hidden=4, **options):
    loss, xs, params = tiny_model(hidden)
    return codegen.compile(loss, xs, params, compiler=COMPILER, cache=directory, **options)


def build_tiny(directory, hidden=4):
    """The tiny model's entry, built (not loaded: a test may then damage it safely)."""
    loss, xs, params = tiny_model(hidden)
    return toolchain.build_extension(codegen.generate(loss, xs, params), "nn", COMPILER, cache=directory)


def expected_forward(hidden=4):
    """The interpreter's value (fused dots add in another order: equal to 1e-12)."""
    return pytest.approx(tiny_model(hidden)[0].data, rel=1e-12)


def stems(directory):
    return sorted(e.stem for e in cache.entries(directory))


def library_source(i):
    return f"double value_{i}(void) {{ return {i}.0; }}\n" + "/* padding */\n" * 200


# ---- healing -------------------------------------------------------------------------------------

def test_a_truncated_entry_is_rebuilt_not_a_crash(tmp_path):
    """The issue's case, in fresh processes: the second compile met a truncated .so and died of SIGBUS."""
    script = textwrap.dedent(f"""
        import random, codegen
        from micrograd_c import MLP, Value
        random.seed(0)
        model = MLP(3, [4, 1]); xs = [Value(0.5) for _ in range(3)]
        net = codegen.compile(model(xs), xs, model.parameters(), compiler={COMPILER!r})
        print(net.build.cached, net.forward())
    """)
    env = dict(os.environ, MICROGRAD_C_CACHE=str(tmp_path))
    run = lambda: subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    first = run()
    assert first.returncode == 0, first.stderr
    (so_path,) = tmp_path.glob("*.so")
    os.truncate(so_path, so_path.stat().st_size // 3)
    second = run()
    assert second.returncode == 0, second.stderr
    assert "CacheWarning" in second.stderr and "damaged" in second.stderr
    assert second.stdout.split()[0] == "False" and second.stdout.split()[1] == first.stdout.split()[1]
    third = run()
    assert third.returncode == 0 and third.stdout.split()[0] == "True" and third.stderr == ""


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "bad record", "record of another file"])
def test_a_damaged_entry_is_rebuilt_with_a_warning(tmp_path, damage):
    so_path = build_tiny(tmp_path).path
    data = bytearray(so_path.read_bytes())
    record = cache.record_path(so_path)
    if damage == "truncate":
        so_path.write_bytes(data[:1000])
    elif damage == "flip":  # same size, one byte changed
        data[len(data) // 2] ^= 0xFF
        so_path.write_bytes(data)
    elif damage == "empty":
        so_path.write_bytes(b"")
    elif damage == "bad record":
        record.write_text("{not json")
    else:
        record.write_text(record.read_text().replace(so_path.name, "other.so"))
    with pytest.warns(cache.CacheWarning, match="damaged"):
        net = compile_tiny(tmp_path)
    assert not net.build.cached and net.forward() == expected_forward()
    assert cache.open_entry(so_path)[0] == cache.VALID


def test_an_entry_that_does_not_load_is_rebuilt_once(tmp_path):
    """Whole and as recorded, yet dlopen refuses it (e.g. built for another machine)."""
    so_path = build_tiny(tmp_path).path
    so_path.write_bytes(b"\x7fELF" + bytes(200))
    cache.commit(so_path, name="nn")  # a record matching the bad bytes
    assert cache.open_entry(so_path)[0] == cache.VALID
    with pytest.warns(cache.CacheWarning, match="does not load"):
        net = compile_tiny(tmp_path)
    assert not net.build.cached and net.forward() == expected_forward()


def test_the_loader_refuses_a_damaged_entry_instead_of_crashing(tmp_path):
    so_path = build_tiny(tmp_path).path
    os.truncate(so_path, 4096)
    with pytest.raises(ImportError, match="damaged"):
        codegen.backend.loader.load_extension(so_path, "nn")


# ---- the module runtime: one cached object that every optimising build links -------------------

GCC_OPT = 0  # compile_gcc's -O: the module runtime's fastest build


def compile_gcc(directory, hidden):
    """With gcc, whose builds link the module runtime's object."""
    loss, xs, params = tiny_model(hidden)
    return codegen.compile(loss, xs, params, compiler="gcc", opt=GCC_OPT, cache=directory)


def runtime_objects(directory):
    return sorted(directory.glob(f"{toolchain.SHARED_OBJECT_NAME}_*.o"))


@pytest.fixture(scope="module")
def gcc_first_build(tmp_path_factory):
    """A new cache's first gcc module, which built the runtime object it links: (the cache, the
    module) (built once: each runtime build is seconds of gcc)."""
    directory = tmp_path_factory.mktemp("gcc-cache")
    return directory, compile_gcc(directory, 4)


@pytest.mark.requires("gcc")
def test_models_share_one_runtime_object(tmp_path, gcc_first_build):
    """The runtime (templates/runtime.c and its products' unit, templates/products.c: two objects)
    is compiled by the first build and linked by the next."""
    first_cache, first = gcc_first_build
    runtimes = runtime_objects(first_cache)
    assert len(runtimes) == 2 and not first.build.cached
    assert all(str(runtime) in first.build.command for runtime in runtimes)
    tmp_path = shutil.copytree(first_cache, tmp_path / "cache")
    runtimes = runtime_objects(tmp_path)
    built = [runtime.stat().st_mtime_ns for runtime in runtimes]
    second = compile_gcc(tmp_path, 5)
    assert runtime_objects(tmp_path) == runtimes and [runtime.stat().st_mtime_ns for runtime in runtimes] == built
    assert all(str(runtime) in second.build.command for runtime in runtimes) and not second.build.cached
    assert sorted(cache.read_record(second.build.path)["objects"]) == [runtime.name for runtime in runtimes]
    assert first.forward() == expected_forward(4) and second.forward() == expected_forward(5)


@pytest.mark.requires("gcc")
def test_the_runtime_object_builds_ahead_of_the_model(tmp_path):
    """compile() starts the runtime's builds before it lowers the graph (start_shared_object, a
    thread for each of its units): the model's build then links those objects, not others; with
    them cached, nothing starts."""
    gcc, sources = toolchain.find_compiler("gcc"), emit.runtime_sources()
    threads = [toolchain.start_shared_object(source, gcc, GCC_OPT, False, tmp_path) for source in sources]
    assert None not in threads
    for thread in threads:
        thread.join()
    runtimes = runtime_objects(tmp_path)
    assert len(runtimes) == 2 and all(cache.open_entry(runtime)[0] == cache.VALID for runtime in runtimes)
    built = [runtime.stat().st_mtime_ns for runtime in runtimes]
    assert [toolchain.start_shared_object(source, gcc, GCC_OPT, False, tmp_path) for source in sources] == [None, None]
    net = compile_gcc(tmp_path, 4)
    assert runtime_objects(tmp_path) == runtimes and [runtime.stat().st_mtime_ns for runtime in runtimes] == built
    assert all(str(runtime) in net.build.command for runtime in runtimes) and net.forward() == expected_forward(4)


@pytest.mark.requires("gcc")
@pytest.mark.parametrize("damage", ["truncate", "flip", "missing"])
def test_a_damaged_or_missing_runtime_object_is_rebuilt(tmp_path, gcc_first_build, damage):
    tmp_path = shutil.copytree(gcc_first_build[0], tmp_path / "cache")
    runtime = runtime_objects(tmp_path)[0]  # (either of the runtime's two)
    data = bytearray(runtime.read_bytes())
    if damage == "truncate":
        runtime.write_bytes(data[:1000])
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        runtime.write_bytes(data)
    else:
        runtime.unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = compile_gcc(tmp_path, 5)
    messages = [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]
    if damage == "missing":
        assert messages == []
    else:
        assert len(messages) == 1 and runtime.name in messages[0] and "damaged" in messages[0], messages
    assert not net.build.cached and net.forward() == expected_forward(5)
    assert cache.open_entry(runtime)[0] == cache.VALID


@pytest.mark.parametrize("leftover", ["c files only", "temporary .so", "so without record", "record without so",
                                      "stale lock file"])
def test_an_interrupted_build_leaves_nothing_that_loads_wrongly(tmp_path, leftover):
    """The states a build killed at any point can leave: each is a miss, rebuilt without fuss."""
    good = build_tiny(tmp_path)
    so_path, record = good.path, cache.record_path(good.path)
    stem = cache.stem_of(so_path)
    if leftover == "c files only":
        record.unlink()
        so_path.unlink()
    elif leftover == "temporary .so":
        record.unlink()
        so_path.rename(tmp_path / f".{so_path.name}.abc123.tmp")
        os.truncate(tmp_path / f".{so_path.name}.abc123.tmp", 500)
    elif leftover == "so without record":  # killed between the rename and the record; maybe truncated too
        record.unlink()
        os.truncate(so_path, 500)
    elif leftover == "record without so":
        so_path.unlink()
    else:
        (tmp_path / f".{stem}.lock").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # incomplete entries are rebuilt silently
        net = compile_tiny(tmp_path)
    assert net.build.cached == (leftover == "stale lock file")
    assert net.forward() == expected_forward()
    assert cache.open_entry(so_path)[0] == cache.VALID


@pytest.mark.requires("gcc")  # slow enough to be killed midway
def test_a_build_killed_midway_leaves_no_entry(tmp_path):
    """Kill a process while it builds, at a few points; the next build is whole."""
    script = textwrap.dedent(f"""
        import sys, codegen
        from codegen.backend import toolchain
        source = "double big(double x) {{\\n" + "x = x * 1.000001 + 0.5;\\n" * 10000 + "return x; }}\\n"
        print("start", flush=True)
        toolchain.build_library(source, "big", "gcc", opt=0)  # gcc: slow enough to be killed midway
    """)
    env = dict(os.environ, MICROGRAD_C_CACHE=str(tmp_path))
    for delay in (0.0, 0.2, 0.4):
        child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        child.stdout.readline()
        time.sleep(delay)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for entry in cache.entries(tmp_path):
            assert entry.record is None or cache.open_entry(entry.shared_object)[0] == cache.VALID
    source = "double big(double x) {\n" + "x = x * 1.000001 + 0.5;\n" * 10000 + "return x; }\n"
    result = toolchain.build_library(source, "big", "gcc", opt=0, cache=tmp_path)
    assert cache.open_entry(result.path)[0] == cache.VALID
    assert not list(tmp_path.glob(".*.lock"))


# ---- the size cap ----------------------------------------------------------------------------------

def test_the_cap_is_honoured_least_recently_used_first(tmp_path, monkeypatch):
    first = toolchain.build_library(library_source(0), "lib", COMPILER, cache=tmp_path)
    entry_size = cache.total_size(tmp_path)
    monkeypatch.setenv("MICROGRAD_C_CACHE_MAX_MB", str(3.5 * entry_size / 1e6))  # room for 3 entries
    built = [first] + [toolchain.build_library(library_source(i), "lib", COMPILER, cache=tmp_path) for i in (1, 2)]
    time.sleep(0.01)
    assert toolchain.build_library(library_source(0), "lib", COMPILER, cache=tmp_path).cached  # used again
    for i in range(3, 9):  # filling it past the cap
        built.append(toolchain.build_library(library_source(i), "lib", COMPILER, cache=tmp_path))
        assert cache.total_size(tmp_path) <= cache.max_bytes()
    kept = stems(tmp_path)
    assert len(kept) == 3
    assert cache.stem_of(built[-1].path) in kept and cache.stem_of(built[-2].path) in kept
    assert cache.stem_of(first.path) not in kept  # used again, but 6 builds ago


def test_an_entry_in_use_by_a_process_is_never_evicted(tmp_path, monkeypatch):
    """A process that loaded a module holds its entry; eviction skips it while that process lives."""
    used = compile_tiny(tmp_path, hidden=5).build.path  # loaded here: this process holds it
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    child = context.Process(target=_load_and_wait, args=(str(tmp_path), 6, ready, done))
    child.start()
    try:
        while not ready.wait(0.2):
            assert child.is_alive(), "the child process failed"
        other = [e.stem for e in cache.entries(tmp_path) if e.shared_object != used]
        monkeypatch.setenv("MICROGRAD_C_CACHE_MAX_MB", "0")  # evict all that may be
        toolchain.build_library(library_source(1), "lib", COMPILER, cache=tmp_path)
        assert set(other) | {cache.stem_of(used)} <= set(stems(tmp_path))
    finally:
        done.set()
        child.join(60)
    after = toolchain.build_library(library_source(2), "lib", COMPILER, cache=tmp_path)
    assert set(stems(tmp_path)) == {cache.stem_of(used), cache.stem_of(after.path)}  # the child's went


def _load_and_wait(directory, hidden, ready, done):
    net = compile_tiny(directory, hidden=hidden)
    assert net.forward() == expected_forward(hidden)
    ready.set()
    done.wait(120)


def test_a_malformed_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROGRAD_C_CACHE_MAX_MB", "lots")
    with pytest.raises(ValueError, match="MICROGRAD_C_CACHE_MAX_MB must be a number"):
        toolchain.build_library(library_source(0), "lib", COMPILER, cache=tmp_path)
    monkeypatch.setenv("MICROGRAD_C_CACHE_MAX_MB", "0.5")
    assert cache.max_bytes() == 500_000


# ---- processes building at once ---------------------------------------------------------------------

def _compile_in_process(directory, hidden, start):
    start.wait(120)
    net = compile_tiny(directory, hidden=hidden)
    return str(net.build.path), net.build.cached, net.forward()


def _in_processes(directory, hiddens):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(len(hiddens))
        with context.Pool(len(hiddens)) as pool:
            return pool.starmap(_compile_in_process, [(str(directory), h, start) for h in hiddens])


def test_four_processes_compiling_one_model(tmp_path):
    results = _in_processes(tmp_path, [4] * 4)
    assert len({path for path, _, _ in results}) == 1
    assert sorted(cached for _, cached, _ in results) == [False, True, True, True]  # compiled once
    assert all(value == expected_forward(4) for _, _, value in results)
    (entry,) = cache.entries(tmp_path)
    assert cache.open_entry(entry.shared_object)[0] == cache.VALID
    assert not list(tmp_path.glob(".*"))  # no lock files, no temporaries


def test_four_processes_compiling_different_models(tmp_path):
    hiddens = [2, 3, 4, 5]
    results = _in_processes(tmp_path, hiddens)
    assert len({path for path, _, _ in results}) == 4 and not any(cached for _, cached, _ in results)
    assert all(value == expected_forward(h) for (_, _, value), h in zip(results, hiddens))
    assert all(cache.open_entry(e.shared_object)[0] == cache.VALID for e in cache.entries(tmp_path))


# ---- the command line ---------------------------------------------------------------------------------

def test_list_and_clear(tmp_path, capsys):
    compile_tiny(tmp_path, hidden=2)  # loaded here: in use
    build_tiny(tmp_path, hidden=3)
    (tmp_path / "unrelated.txt").write_text("not the cache's")
    assert cache.main(["--dir", str(tmp_path), "list"]) == 0
    listing = capsys.readouterr().out
    assert "last used" in listing and "2 entries" in listing and listing.count(" tcc ") == 2
    assert "-O2" in listing and " nn " in listing
    assert cache.main(["--dir", str(tmp_path), "clear", "--older-than", "1"]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert cache.main(["--dir", str(tmp_path), "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 entries" in out and "1 in use" in out
    assert len(stems(tmp_path)) == 1 and (tmp_path / "unrelated.txt").exists()


def test_the_command_line_runs_as_a_module(tmp_path):
    build_tiny(tmp_path)
    run = subprocess.run([sys.executable, "-m", "codegen.backend.cache", "--dir", str(tmp_path), "list"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr == "" and "1 entries" in run.stdout
