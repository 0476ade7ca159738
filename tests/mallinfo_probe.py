"""Source a probe process runs to see whether glibc serves a large block with its own mmap (its defaults: threshold at
most 32 MiB) or from the heap (``ragen.allocator.tune_process`` raises the threshold to 1 GiB). After it runs,
``libc.mallinfo2().hblks - before`` is 1 for a mmap-served 100 MiB ``block``, 0 when the heap keeps it."""

MMAP_BLOCK_PROBE = """
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
before = libc.mallinfo2().hblks
block = bytearray(100 * 2**20)
"""
