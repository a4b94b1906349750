"""The ceiling kernels of chapter 10 (see minipaged/lab/kernels/ceilings.py, which launches and times them):
a flat read of fp16 values in 2-, 4- or 8-byte words, and a paged read of K and V through the block
table with no attention math. Like the attention kernels, they are built by factories whose arguments
become compile-time constants.

Importing this module imports numba: pick the simulator or the real numba.cuda first (importing
``minipaged.attention.kernels`` does).

Not handled: 16-byte loads (numba has no vector types).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int16, int64

FLAT_WORDS = {2: "float16", 4: "int32", 8: "int64"}  # bytes per word -> the dtype the fp16 data is read as


@functools.cache
def _half_bits(sim: bool):
    """Device function: the fp16 value whose 16 bits are the low bits of an integer, as fp32. On a GPU,
    libdevice's half2float; the simulator has no libdevice, so there numpy reinterprets the bits."""
    if sim:
        @cuda.jit(device=True)
        def half_bits(bits):
            return np.float32(np.uint16(int(bits) & 0xFFFF).view(np.float16))
    else:
        from numba.cuda import libdevice

        @cuda.jit(device=True, inline=True)
        def half_bits(bits):
            return libdevice.half2float(int16(bits & 0xFFFF))
    return half_bits


@functools.cache
def make_flat_read(word_bytes: int, sim: bool):
    """flat_read(words, partial): each thread sums the fp16 values of its words (grid-stride) into
    partial[thread]. words: float16 (2 bytes), int32 (two halves) or int64 (four halves)."""
    half_bits = _half_bits(sim)
    if word_bytes == 2:
        @cuda.jit(device=True, inline=True)
        def unpack(w):  # a float16 element: ld.global.u16, then a conversion
            return float32(w)
    elif word_bytes == 4:
        @cuda.jit(device=True, inline=True)
        def unpack(w):  # two halves in one 32-bit word
            return half_bits(w) + half_bits(w >> 16)
    else:
        @cuda.jit(device=True, inline=True)
        def unpack(w):  # four halves in one 64-bit word
            return (half_bits(w) + half_bits(w >> 16)) + (half_bits(w >> 32) + half_bits(w >> 48))

    @cuda.jit
    def flat_read(words, partial):
        tid = cuda.grid(1)
        stride = cuda.gridsize(1)
        acc = float32(0.0)
        for i in range(tid, words.shape[0], stride):
            acc += unpack(words[i])
        partial[tid] = acc

    return flat_read


@functools.cache
def make_paged_read(block_size: int, row_words: int, threads: int):
    """paged_read(k_words, v_words, block_tables, context_lens, part_tokens, out): block (s, h, p) reads
    the K and V rows of tokens [p * part_tokens, (p + 1) * part_tokens) of sequence s, KV head h,
    through the block table, and XORs them into out[s, h, p, thread]. Sizes are closure constants, so
    token // block_size and idx // row_words compile to shifts."""
    @cuda.jit
    def paged_read(k_words, v_words, block_tables, context_lens, part_tokens, out):
        # k_words, v_words [num_blocks, block_size, num_kv_heads, row_words] int64; out [seqs, kv_heads, P, T]
        s, h, p = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        start = p * part_tokens
        end = min(start + part_tokens, context_lens[s])
        acc = int64(0)
        for idx in range(tid, (end - start) * row_words, threads):
            tok = start + idx // row_words
            blk = block_tables[s, tok // block_size]
            slot = tok % block_size
            w = idx % row_words
            acc ^= k_words[blk, slot, h, w] ^ v_words[blk, slot, h, w]
        out[s, h, p, tid] = acc

    return paged_read
