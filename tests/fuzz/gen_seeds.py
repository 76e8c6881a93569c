#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (corpus/<target>/): small inputs in the formats
image.h (fuzz_mount, fuzz_fsck) and fuzz_nvme.cc describe, one per structure or command, so
that libFuzzer starts from inputs that already reach each part of the code. The files are
checked in; run this again only when the input formats change."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# --- fuzz_mount / fuzz_fsck: header, then patches (image.h) --------------------------------
META, INODE, SUPER, HEADERS, JOURNAL, GROUP, ANY, DATA = range(8)
OVERWRITE, XOR, ADD, MAGIC = range(4)
RAW = 0x20


def patch(region, mode, index, offset, data, raw=False):
    op = region | (mode << 3) | (RAW if raw else 0)
    return struct.pack("<BHHB", op, index, offset, len(data) - 1) + bytes(data)


def image_seeds():
    seeds = {}
    for base in range(4):
        seeds[f"base{base}"] = bytes([base, 0])
        seeds[f"base{base}-ro"] = bytes([base | 0x08, 0])
        seeds[f"base{base}-inode1-links"] = bytes([base, 0]) + patch(INODE, ADD, 0, 12, [1])
        seeds[f"base{base}-sb-free"] = bytes([base, 0]) + patch(SUPER, XOR, 0, 56, [1])
        seeds[f"base{base}-gd-free"] = bytes([base, 0]) + patch(GROUP, ADD, 0, 24, [0xff] * 4)
        seeds[f"base{base}-fault"] = bytes([base, 0x10])
        for i in range(4):
            # Header blocks: the count field (u16 at byte 4), then an entry's bytes.
            seeds[f"base{base}-header{i}-count"] = bytes([base, 0]) + patch(HEADERS, ADD, i, 4, [1, 0])
            seeds[f"base{base}-header{i}-entry"] = bytes([base, 0]) + patch(HEADERS, XOR, i, 48, [0x40])
            seeds[f"base{base}-meta{i}-magic"] = bytes([base, 0]) + patch(META, MAGIC, 7 * i, 16 + 8 * i, [i * 5, 3])
        seeds[f"base{base}-data"] = bytes([base, 0]) + patch(DATA, XOR, 0, 0, [0x58])
        seeds[f"base{base}-raw-inode"] = bytes([base, 0]) + patch(INODE, XOR, 2, 20, [0x10], raw=True)
        seeds[f"base{base}-no-fixup"] = bytes([base | 0x04, 0]) + patch(INODE, XOR, 0, 0, [1])
    # Xattr chain and value blocks (they sit among the header blocks of base 0; every index
    # is patched, so that each chain and value block gets both): byte 16 is a chain block's
    # `next` and a value block's `position`; byte 33 the first entry's name_index (bit 7:
    # out of line).
    for i in range(48):
        seeds[f"base0-header{i}-next"] = bytes([0, 0]) + patch(HEADERS, ADD, i, 16, [1])
        seeds[f"base0-header{i}-outofline"] = bytes([0, 0]) + patch(HEADERS, XOR, i, 33, [0x80])
    # Inode times (byte 32 atime ... 56 crtime) set to a sentinel, with and without a record.
    for i in range(8):
        for field in range(4):
            seeds[f"base0-inode{i}-time{field}-sentinel"] = bytes([0, 0]) + patch(
                INODE, OVERWRITE, i, 32 + 8 * field, list(struct.pack("<q", -(2**63) if field % 2 else 2**63 - 1)))
    # The journal: its header's tail, a descriptor's count and target, a commit's sequence.
    # Shared blocks (base 3): the descriptor's refcount_table (u32 at byte 36) moved or set to
    # an edge value; a count in each header block (the table's are among them: byte 32 on is
    # a table block's counts).
    seeds["shared-table-field-next"] = bytes([3, 0]) + patch(GROUP, ADD, 0, 36, [1, 0, 0, 0])
    seeds["shared-table-field-back"] = bytes([3, 0]) + patch(GROUP, ADD, 0, 36, [0xff] * 4)
    seeds["shared-table-field-edge"] = bytes([3, 0]) + patch(GROUP, MAGIC, 0, 36, [2, 2])
    for i in range(64):
        seeds[f"shared-header{i}-count"] = bytes([3, 0]) + patch(HEADERS, ADD, i, 32 + 2 * (i % 16), [1, 0])
    seeds["crashed-journal-tail"] = bytes([1, 0]) + patch(JOURNAL, ADD, 0, 8, [1])
    for j in range(1, 8):
        seeds[f"crashed-journal{j}"] = bytes([1, 0]) + patch(JOURNAL, XOR, j, 4 + j, [0x01])
    seeds["crashed-orphan"] = bytes([1, 0]) + patch(SUPER, MAGIC, 0, 80, [1, 3])
    seeds["crashed-readdir-paged"] = bytes([1 | 0x10, 0])
    seeds["clean-readdir-3"] = bytes([0 | 0x20, 0])
    seeds["clean-look-only"] = bytes([0 | 0x80, 0])
    return seeds


# --- fuzz_nvme: config byte, then operations (fuzz_nvme.cc) --------------------------------
(W32, W64, ENABLE, DISABLE, POKE, ADMIN, IO, CREATE, DELETE, RING, SLEEP, READ, CUT) = range(13)


def sqe(opcode, nsid=0, prp1=0, prp2=0, cdw10=0, cdw11=0, cdw12=0, cdw13=0):
    return struct.pack("<BBHIIIQQQIIIIII", opcode, 0, 0, nsid, 0, 0, 0, prp1, prp2,
                       cdw10, cdw11, cdw12, cdw13, 0, 0)


DATA_PAGE = 10 * 4096
IN_DMA = 1 | 2 | 32  # PRP1 and PRP2 in the region, PSDT 0


def admin(c, fix=IN_DMA):
    return bytes([ADMIN]) + c + bytes([fix])


def io(q, c, fix=IN_DMA):
    return bytes([IO, q - 1]) + c + bytes([fix])


def nvme_seeds():
    up = bytes([ENABLE, 30])
    pair = bytes([CREATE, 0, 30, 0x12, 2])
    seeds = {
        "enable": bytes([0]) + up,
        "identify": bytes([0]) + up + admin(sqe(0x06, prp1=DATA_PAGE, cdw10=1)),
        "identify-ns": bytes([0]) + up + admin(sqe(0x06, nsid=2, prp1=DATA_PAGE, cdw10=0)),
        "log-error": bytes([0]) + up + admin(sqe(0x02, prp1=DATA_PAGE, prp2=DATA_PAGE + 4096, cdw10=1 | (2047 << 16))),
        "log-smart": bytes([0]) + up + admin(sqe(0x02, prp1=DATA_PAGE, cdw10=2 | (127 << 16))),
        "features": bytes([0]) + up + admin(sqe(0x09, cdw10=1, cdw11=0x03020103)) + admin(sqe(0x0a, cdw10=6)),
        "pair": bytes([0]) + up + pair,
        "write-read": bytes([0]) + up + pair
        + io(1, sqe(0x01, nsid=1, prp1=DATA_PAGE, prp2=DATA_PAGE + 4096, cdw10=8, cdw12=15))
        + io(1, sqe(0x02, nsid=1, prp1=DATA_PAGE + 4096, cdw10=8, cdw12=7)),
        "prp-list": bytes([0]) + up + pair
        + bytes([POKE, 0x00, 0xc0, 23]) + struct.pack("<QQQ", 0x10_0000_0000 + 13 * 4096, 0x10_0000_0000 + 14 * 4096, 0x10_0000_0000 + 15 * 4096)
        + io(1, sqe(0x02, nsid=2, prp1=DATA_PAGE, prp2=12 * 4096, cdw10=3, cdw12=3), fix=1 | 2 | 32),
        "write-zeroes-dsm-flush": bytes([0]) + up + pair
        + io(1, sqe(0x08, nsid=2, cdw10=4, cdw12=3))
        + io(1, sqe(0x09, nsid=2, prp1=DATA_PAGE, cdw10=0, cdw11=4))
        + io(1, sqe(0x00, nsid=0xffffffff), fix=0),
        "wrr-two-workers": bytes([1]) + bytes([ENABLE, 0x80 | 30]) + admin(sqe(0x09, cdw10=1, cdw11=0x03020107))
        + pair + bytes([CREATE, 1, 30, 0x22, 1])
        + io(1, sqe(0x02, nsid=1, prp1=DATA_PAGE, cdw12=7)) + io(2, sqe(0x02, nsid=1, prp1=DATA_PAGE, cdw12=7)),
        "latency-shuffle": bytes([2 | 4]) + up + pair + io(1, sqe(0x01, nsid=2, prp1=DATA_PAGE, cdw10=1))
        + bytes([SLEEP, 5]),
        "delete-pair": bytes([0]) + up + pair + bytes([DELETE, 0]) + io(1, sqe(0x02, nsid=1, prp1=DATA_PAGE)),
        "bad-doorbells": bytes([32]) + up + pair + bytes([RING, 1, 0]) + struct.pack("<I", 4000)
        + bytes([RING, 1, 1]) + struct.pack("<I", 4000) + bytes([READ, 0x1c, 0]),
        "registers": bytes([0]) + bytes([W32, 0x24, 0]) + struct.pack("<I", 0x003f003f)
        + bytes([W64, 0, 1]) + struct.pack("<Q", 0) + bytes([W64, 1, 1]) + struct.pack("<Q", 4096)
        + bytes([W32, 0x14, 0]) + struct.pack("<I", 0x00460001) + bytes([SLEEP, 3, READ, 0x1c, 0]),
        "shutdown": bytes([0]) + up + pair + io(1, sqe(0x01, nsid=1, prp1=DATA_PAGE)) + bytes([DISABLE, 1]),
        "power-cut": bytes([0]) + up + pair + io(1, sqe(0x01, nsid=1, prp1=DATA_PAGE)) + bytes([CUT, 128]),
    }
    return seeds


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"{target}: {len(seeds)} seeds in {d}", file=sys.stderr)


if __name__ == "__main__":
    img = image_seeds()
    write("fuzz_mount", img)
    write("fuzz_fsck", img)
    write("fuzz_nvme", nvme_seeds())
