"""Runs a WebAssembly program built for wasm32-wasi (codegen.export(target="wasm32-wasi")) with the
wasmtime package: its arguments, stdin, stdout and stderr are this process's, and it sees the
file system as a native program would (for the files named on its command line). Compiled modules
are cached by wasmtime (~/.cache/wasmtime): Cranelift takes seconds over a big frozen model.

    python -m codegen.backend.wasi mnist.wasm < pixels.f64
"""
import sys


def main(argv):
    import wasmtime
    config = wasmtime.Config()
    try:  # wasmtime's cache of compiled modules (~/.cache/wasmtime): a module's next run starts at once
        config.cache = True
    except wasmtime.WasmtimeError:
        pass  # (no writable cache directory: compile each time)
    engine = wasmtime.Engine(config)
    store, linker = wasmtime.Store(engine), wasmtime.Linker(engine)
    linker.define_wasi()
    wasi = wasmtime.WasiConfig()
    wasi.argv = argv
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir("/", "/")
    store.set_wasi(wasi)
    instance = linker.instantiate(store, wasmtime.Module.from_file(engine, argv[0]))
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as exit:
        return exit.code
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
