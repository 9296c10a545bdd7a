#!/usr/bin/env python3
"""Writes the seed corpus of the runtime fuzzer (runtime/fuzz/corpus/): a few
inputs that each walk one family of calls the way a real user would, so the
fuzzer starts from meaningful sequences. The encoding is RuntimeFuzzer.cpp's:
one opcode byte (op % 26, the extra ops at 25 + 26*k), then its argument bytes.
Rerun after changing the encoding: python3 runtime/fuzz/make_corpus.py"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")

u16 = lambda v: list(struct.pack("<H", v))
u32 = lambda v: list(struct.pack("<I", v))

# Operands of copies/memsets: device slot i, pinned slot i, pageable i, freed, NULL.
dev = lambda i, off=0: [0 + 8 * i] + u16(off)
pinned = lambda i, off=0: [3 + 8 * i] + u16(off)
pageable = lambda i, off=0: [4 + 8 * i] + u16(off)
freed = [6, 0, 0]
null = [7, 0, 0]
# Counts: 0, 1, the room left, one past it, far past it, SIZE_MAX, or v % (room+1).
C0, C1, ROOM, PAST, FAR, HUGE = ([c, 0, 0] for c in range(6))
cnt = lambda v: [7] + u16(v)
H2D, D2H, D2D, DEFAULT, BADKIND = 0, 1, 2, 3, 5
# Streams: slot 0-7, default of device 0 / 1, the handle 0, garbage, destroyed.
S = lambda i: i
DEF0, DEF1, S_ZERO, S_GARBAGE, S_DEAD = 8, 9, 10, 11, 12
E = lambda i: i
E_ZERO, E_DEAD = 8, 9


def malloc(device, size_class, v=0): return [0, device, size_class] + u32(v)
def free(slot): return [2, 8 * slot, 0, 0]
def host_alloc(size_class): return [3, size_class]
def host_free(slot): return [4, 8 * slot]
def attrs(sel, off=0): return [5, sel] + u16(off)
def memcpy(dst, src, kind, count): return [6] + dst + src + [kind] + count
def memcpy_async(dst, src, kind, stream, count): return [7] + dst + src + [kind, stream] + count
def memset(op, value, count): return [9] + op + u32(value) + count
def memset_async(op, value, stream, count): return [10] + op + u32(value) + [stream] + count
def stream_create(device, prio_class=0): return [11, device, prio_class]
def stream_destroy(s): return [12, s]
def stream_query(s): return [13, s]
def stream_sync(s): return [14, s]
def wait_event(s, e): return [15, s, e]
def event_create(flags_class=0): return [16, flags_class]
def event_record(e, s): return [17, e, s]
def event_query(e): return [18, e]
def event_sync(e): return [19, e]
def elapsed(a, b): return [20, a, b, 0]
def event_destroy(e): return [21, e]
def gate(s): return [22, 0, s, 0, 0]
def fill(s, slot, v=0x0100): return [22, 1, s] + u16((v & ~0xf) | slot)
def fail(s): return [22, 3, s, 0, 0]
def check(s, seed=7): return [22, 5, s] + u16(seed)
def null_fn(s): return [22, 6, s, 1, 0]
def null_args(s): return [22, 7, s, 1, 0]
def work(shape, kind_class, s, corr=0): return [24, shape, kind_class, s] + u32(corr)
def activity(a): return [25, a]
def device_op(a, device): return [51, a, device]
def open_gate(i=0): return [77, i]
def host_write(sel, value): return [103, sel, value]
def verify(sel): return [129, sel]
V_DEV = lambda i: 0 + 4 * i
V_PINNED = lambda i: 1 + 4 * i
V_PAGEABLE = lambda i: 2 + 4 * i

SEEDS = {
    "copies": malloc(0, 5) + malloc(1, 6) + host_write(1, 0xAB) + host_write(3, 0x11)
    + memcpy(dev(0), pageable(0), H2D, ROOM) + verify(V_DEV(0))
    + memcpy(pageable(1), dev(0, 16), D2H, cnt(100)) + verify(V_PAGEABLE(1))
    + memcpy(dev(1), dev(0), D2D, ROOM) + memcpy(dev(1, 8), pageable(1), DEFAULT, cnt(300))
    + verify(V_DEV(1)) + memcpy(dev(0), dev(0, 100), D2D, PAST) + memcpy(dev(0), pageable(0), D2H, C1)
    + memcpy(null, dev(0), D2H, C1) + memcpy(dev(0), pageable(0), BADKIND, C1)
    + memcpy(freed, pageable(0), H2D, C1) + memcpy(null, null, H2D, C0),
    "async": stream_create(0) + stream_create(1, 1) + malloc(0, 6) + malloc(1, 5) + host_alloc(3)
    + host_write(0, 0x5C) + memcpy_async(dev(0), pinned(0), H2D, S(0), ROOM)
    + memset_async(dev(0, 64), 0x1FF, S(0), cnt(200)) + memcpy_async(dev(1), dev(0), D2D, S(1), ROOM)
    + memcpy_async(pinned(0), dev(1), D2H, DEF1, cnt(4000)) + stream_query(S(0))
    + verify(V_PINNED(0)) + verify(V_DEV(1)) + memset(dev(1), 7, FAR)
    + memcpy_async(dev(0), pageable(0), H2D, S_DEAD, C1) + memcpy_async(null, null, DEFAULT, S(0), C0)
    + memset_async(pinned(0), 1, S(0), C1) + stream_sync(S(1)),
    "events": stream_create(0) + stream_create(1, 3) + event_create(0) + event_create(1)
    + gate(S(0)) + event_record(E(0), S(0)) + wait_event(S(1), E(0)) + stream_query(S(1))
    + event_query(E(0)) + elapsed(E(0), E(0)) + open_gate() + event_sync(E(0))
    + event_record(E(1), S(1)) + elapsed(E(0), E(1)) + event_record(E(0), S(1)) + elapsed(E(1), E(0))
    + stream_destroy(S(0)) + stream_query(S_DEAD) + event_destroy(E(0)) + event_query(E_DEAD)
    + wait_event(S(1), E_DEAD) + event_query(E(3)) + stream_destroy(DEF0) + event_create(2),
    "failures": stream_create(0) + event_create(0) + fail(S(0)) + event_record(E(0), S(0))
    + event_query(E(0)) + stream_sync(S(0)) + fail(DEF0) + device_op(0, 0) + fail(S(0))
    + malloc(0, 4) + memcpy(pageable(0), dev(0), D2H, ROOM) + stream_create(1) + fail(S(1))
    + stream_destroy(S(1)) + fail(DEF1) + event_record(E(0), DEF1) + event_sync(E(0)) + stream_query(DEF1),
    "kernels": stream_create(0) + malloc(0, 5) + fill(S(0), 0) + check(S(0)) + check(DEF1, 99)
    + null_fn(S(0)) + null_args(S(0)) + fill(S_GARBAGE, 0) + gate(S(0)) + stream_query(S(0))
    + open_gate() + verify(V_DEV(0)) + gate(DEF0) + gate(DEF1) + device_op(0, 1),
    "activity": stream_create(0) + activity(0) + work(0x00, 0, S(0), 5) + work(0x50, 1, S(0), 6)
    + work(0x20, 0x66, DEF0) + work(0x01, 0x10, S(0)) + work(0x03, 0, S(0)) + work(0x00, 7, S(0))
    + device_op(5, 3) + work(0x80, 2, S(0)) + malloc(0, 5) + memset_async(dev(0), 3, S(0), ROOM)
    + memcpy(pageable(0), dev(0), D2H, ROOM) + activity(3) + activity(2) + activity(4) + activity(1)
    + work(0x00, 4, S(0)) + activity(4) + device_op(0x45, 0),
    "bad_memory": malloc(0, 10) + malloc(0, 9) + malloc(5, 3) + malloc(6, 3) + malloc(0, 8)
    + free(0) + malloc(0, 0xC3) + malloc(0, 0) + free(0) + attrs(6) + attrs(4, 17) + attrs(7)
    + host_alloc(0) + host_alloc(10) + host_alloc(11) + host_alloc(2) + host_free(0) + [4, 2]
    + [4, 5 + 8] + [2, 4, 0, 0] + [2, 5, 0, 0] + malloc(0, 4) + [2, 2, 3, 0] + attrs(0, 100)
    + attrs(8) + free(0) + [2, 3, 0, 0] + attrs(3),
    "devices": device_op(1, 1) + device_op(1, 5) + device_op(1, 6) + device_op(2, 0) + device_op(2, 7)
    + device_op(3, 0) + device_op(0x83, 1) + device_op(4, 5) + device_op(0, 6)
    + stream_create(5) + stream_create(0, 7) + stream_create(1, 8) + event_create(3) + event_create(4),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, ops in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes(b & 0xFF for b in ops))
    rng = random.Random(9)
    for i in range(3):  # unstructured inputs decode into valid calls too
        with open(os.path.join(OUT, f"random{i}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(300)))


if __name__ == "__main__":
    main()
