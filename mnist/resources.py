"""The process's resource use, for the app's summary (and the benchmark's tables)."""
import resource

from codegen.backend.toolchain import MAXRSS_BYTES


def process_peak_rss() -> int:
    """This process's peak resident memory so far, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * MAXRSS_BYTES
