"""Memory settings for a one-shot analysis process (`diag analyze`): set before numpy is imported.

Not for the library's callers: a long-lived process would keep freed memory forever.
"""

from __future__ import annotations

import os
import sys


def tune_for_one_shot_analysis(in_chunks: bool = False) -> None:
    """numpy asks the kernel for transparent huge pages for every large array; the analysis allocates and
    frees hundreds of them, and zeroing/compacting huge pages then costs more system time than it saves in
    TLB misses (measured: -40% sys time on 2M packets). Must run before numpy is imported. Then glibc keeps
    freed memory for reuse (``keep_freed_memory``); in_chunks: the captures are read in chunks."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    keep_freed_memory(in_chunks)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Above any one array of the analysis in one chunk (columns of millions of packets are tens of MB).
_MMAP_THRESHOLD = 1 << 30
# In chunks the temporaries are a chunk's (a few MB at most); the larger arrays live long (the kept TCP state,
# the TCP state kernel's segment ends, which double as they grow): as mappings of their own they grow by
# mremap, without a copy, and go back to the system when freed, where on the heap each doubling left the
# old copy behind (measured: peak 234 -> 226 MB on the 2.1 M-packet bench capture).
_CHUNKED_MMAP_THRESHOLD = 4 << 20


def keep_freed_memory(in_chunks: bool = False) -> None:
    """Have glibc serve the analysis's many large temporaries from its heap and keep freed memory there.

    By default every array over glibc's dynamic threshold (128 kB growing to 32 MB) is a fresh mmap, so each
    temporary of the analysis pays its page faults and zeroing again and is unmapped when freed; reusing
    heap pages cut system time by about a quarter (0.7 -> 0.5 s on 2.36 M packets). Peak RSS is unchanged:
    the peak is live data anyway. Set only by the one-shot command, never by the library itself: a long-lived
    caller would keep freed memory forever.
    Best effort: other C libraries have no mallopt and keep their default.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")  # not ctypes.util.find_library: it runs ldconfig (~0.1 s)
        libc.mallopt(_M_MMAP_THRESHOLD, _CHUNKED_MMAP_THRESHOLD if in_chunks else _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
        # One arena: the analysis's helper threads (decoder, hosts, TCP state) then draw on the same
        # kept heap instead of each growing its own (measured: 234k -> fewer page faults, less sys time).
        libc.mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        return
