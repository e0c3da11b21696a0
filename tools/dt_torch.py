#!/usr/bin/python3
"""dt_torch.py: dtrain model files <-> PyTorch state_dicts.

    dt_torch.py to-torch MODEL OUT.pt           a dtrain model file (--save-model) or a
                                                checkpoint's state.dtck -> a state_dict
    dt_torch.py from-torch IN.pt OUT [--like MODEL]
                                                a state_dict (or a checkpoint dict holding
                                                one under "model" / "state_dict") -> a
                                                dtrain model file (format version 2)
    dt_torch.py show MODEL                      the tensor table

dtrain names its tensors as the PyTorch modules do: dtrain-gpt's are gpt_bytes.py's
state_dict keys (wte.weight, wpe.weight, h.0.ln_1.weight, h.0.attn.c_attn.weight,
h.0.mlp.c_fc.bias, ..., ln_f.bias; the head is tied to wte, so neither has its own key),
with the same shapes (Linear weights are (out, in)) and the same row-major layout. So
the conversion is by name; only the file format changes.

from-torch writes the tensors in the state_dict's order, or with --like in the order of
that dtrain model file (whose table is then the reference: every name must be in the
state_dict with the same shape, and keys it lacks are refused unless --ignore-extra);
the layer indices and flags (DT_PARAM_NO_DECAY, ...) come from --like, else -1 and 0
(dtrain does not read them when loading a model file). Buffers: keys listed by
--buffers NAME,... (or in --like's buffer table) go to the buffer table.

The file format is docs/checkpoint-format.md (version 2; version 1 is read): a 64-byte
header, then sections PTAB (table), PARM (floats), BTAB, BUFS, each with a CRC32C.
Needs only the standard library and, for the .pt side, torch >= 1.13 (Debian's
python3-torch). A .pt file is a pickle, and unpickling can run code of the file's
choosing, so from-torch loads weights only (torch.load(weights_only=True)): tensors and
plain containers; a file that holds anything else (a class, a whole nn.Module) is
refused, saying what it held.
"""
import argparse
import struct
import sys

MAGIC = b"\x89DTCKPT\n"
HEADER = 64
SECHDR = 24
KIND_STATE, KIND_MODEL = 1, 4
VERSION = 2

# ------------------------------------------------------------------------------ CRC32C
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data, crc=0):
    """CRC32C (Castagnoli), continued from `crc` as dt_crc32c does."""
    try:  # a C implementation when one is installed
        import crc32c as _fast  # type: ignore
        return _fast.crc32c(bytes(data), crc)
    except ImportError:
        pass
    c = crc ^ 0xFFFFFFFF
    t = _TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# ------------------------------------------------------------------------------ reading
class Reader:
    def __init__(self, buf, what):
        self.b, self.at, self.what = buf, 0, what

    def take(self, n):
        if self.at + n > len(self.b):
            raise ValueError(f"{self.what}: truncated entry")
        v = self.b[self.at:self.at + n]
        self.at += n
        return v

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def i32(self):
        return struct.unpack("<i", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def string(self):
        return self.take(self.u32()).decode("utf-8")


def read_file(path):
    """{'kind', 'version', 'params': [(name, shape, layer, flags)], 'floats': bytes,
    'buffers': [...], 'buf_floats': bytes}, every CRC checked."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER or data[:8] != MAGIC:
        raise ValueError(f"{path}: expected a dtrain model or checkpoint file (magic "
                         f"\\x89DTCKPT), found {data[:8]!r}")
    version, hsize, kind, nsec = struct.unpack_from("<IIII", data, 8)
    size = struct.unpack_from("<Q", data, 40)[0]
    if version not in (1, 2) or hsize != HEADER:
        raise ValueError(f"{path}: expected format version 1..2 with a 64-byte header, "
                         f"found version {version}, header {hsize}")
    if crc32c(data[:60]) != struct.unpack_from("<I", data, 60)[0]:
        raise ValueError(f"{path}: corrupt header (CRC32C)")
    if size != len(data):
        raise ValueError(f"{path}: expected {size} bytes (its header), found {len(data)}")
    if kind not in (KIND_STATE, KIND_MODEL):
        raise ValueError(f"{path}: expected a model file (kind 4) or a checkpoint's "
                         f"state.dtck (kind 1), found kind {kind}")
    secs, at = {}, HEADER
    for _ in range(nsec):
        tag = data[at:at + 4].decode("ascii", "replace")
        length = struct.unpack_from("<Q", data, at + 8)[0]
        stored = struct.unpack_from("<I", data, at + 16)[0]
        payload = data[at + SECHDR:at + SECHDR + length]
        if len(payload) != length or crc32c(payload, crc32c(data[at:at + 16])) != stored:
            raise ValueError(f"{path}: corrupt or truncated section {tag}")
        secs[tag] = payload
        at += SECHDR + length

    def table(tag):
        if tag not in secs:
            return []
        r, out = Reader(secs[tag], f"{path}: {tag}"), []
        for _ in range(r.u32()):
            name = r.string()
            shape = [r.i64() for _ in range(r.u32())]
            r.u64(), r.u64()  # offset, count: contiguous in order
            layer = r.i32()
            flags = r.u32() if version >= 2 else 0
            out.append((name, shape, layer, flags))
        return out

    def floats(tag):
        if tag not in secs:
            return b""
        n = struct.unpack_from("<Q", secs[tag], 0)[0]
        return secs[tag][8:8 + 4 * n]

    return {"kind": kind, "version": version, "params": table("PTAB"),
            "floats": floats("PARM"), "buffers": table("BTAB"), "buf_floats": floats("BUFS")}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def tensors(entries, raw):
    """(name, shape, the tensor's float32 bytes) per entry of a table."""
    at = 0
    for name, shape, _, _ in entries:
        n = 4 * numel(shape)
        yield name, shape, raw[at:at + n]
        at += n


# ------------------------------------------------------------------------------ writing
def _ptab(entries):
    out, off = [struct.pack("<I", len(entries))], 0
    for name, shape, layer, flags in entries:
        nb = name.encode("utf-8")
        if not 1 <= len(nb) <= 255 or not 1 <= len(shape) <= 4:
            raise ValueError(f"{name}: expected a name of 1..255 bytes and 1..4 dimensions, "
                             f"found {len(nb)} bytes and shape {shape}")
        out.append(struct.pack("<I", len(nb)) + nb + struct.pack("<I", len(shape)))
        out.append(b"".join(struct.pack("<q", d) for d in shape))
        n = numel(shape)
        out.append(struct.pack("<QQiI", off, n, layer, flags))
        off += n
    return b"".join(out)


def write_model(path, params, raw, buffers=(), buf_raw=b""):
    """A model file (kind 4, version 2): params / buffers are (name, shape, layer, flags)
    tables, raw / buf_raw their float32 little-endian bytes in table order."""
    secs = [(b"PTAB", _ptab(params)), (b"PARM", struct.pack("<Q", len(raw) // 4) + raw),
            (b"BTAB", _ptab(list(buffers))),
            (b"BUFS", struct.pack("<Q", len(buf_raw) // 4) + buf_raw)]
    heads, size = [], HEADER
    for tag, payload in secs:
        sh = tag + b"\0" * 4 + struct.pack("<Q", len(payload))
        crc = crc32c(payload, crc32c(sh))
        heads.append(sh + struct.pack("<II", crc, 0))
        size += SECHDR + len(payload)
    hdr = bytearray(HEADER)
    hdr[:8] = MAGIC
    struct.pack_into("<IIIIqII Q", hdr, 8, VERSION, HEADER, KIND_MODEL, len(secs), 0, 1, 0,
                     size)
    struct.pack_into("<I", hdr, 48, crc32c(b"".join(heads)))
    struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[:60])))
    with open(path, "wb") as f:
        f.write(hdr)
        for h, (_, payload) in zip(heads, secs):
            f.write(h)
            f.write(payload)


# ------------------------------------------------------------------------------ torch side
def to_torch(src, dst):
    import torch
    m = read_file(src)
    sd = {}
    for entries, raw in ((m["params"], m["floats"]), (m["buffers"], m["buf_floats"])):
        for name, shape, b in tensors(entries, raw):
            t = torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(shape)
            sd[name] = t.clone()
    torch.save(sd, dst)
    return len(sd)


def _torch_load_weights(path):
    """torch.load of tensors and plain containers only: unpickling anything else can run
    code from the file (a class's __reduce__ is a call), so it is refused, never tried."""
    import inspect
    import pickle
    import torch
    if "weights_only" not in inspect.signature(torch.load).parameters:
        # No restricted loader before torch 1.13: nothing here could read the file
        # without trusting it.
        raise ValueError(f"{path}: refused: torch {torch.__version__} cannot load weights "
                         f"only (torch.load has weights_only from 1.13 on), and loading "
                         f"a .pt file otherwise can run code from it; use torch >= 1.13")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's text suggests weights_only=False; keep only what it found.
        found = str(e).split("WeightsUnpickler error:")[-1].strip()
        raise ValueError(
            f"{path}: refused: expected only tensors and plain containers (a state_dict), "
            f"found more ({found}); dt_torch.py loads weights only, because loading "
            f"anything else can run code from the file. Save the state_dict alone: "
            f"torch.save(model.state_dict(), path) (torch {torch.__version__}'s "
            f"weights-only loader may also refuse plain values such as an optimizer's "
            f"float learning rate)") from None
    except RuntimeError as e:
        raise ValueError(f"{path}: expected a PyTorch file (torch.save), found one torch "
                         f"cannot read: {e}") from None


def load_state_dict(path):
    """The state_dict of a .pt file: the file's dict, or the dict it holds under "model"
    or "state_dict" (a training checkpoint); every value a tensor."""
    import torch
    obj = _torch_load_weights(path)
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state_dict (a dict of tensors), found "
                         f"{type(obj).__name__}")
    for name, t in obj.items():
        if not isinstance(name, str) or not torch.is_tensor(t):
            raise ValueError(f"{path}: expected a state_dict (a dict of tensors by name), "
                             f"found {name!r} holding {type(t).__name__}")
    return obj


def from_torch(src, dst, like=None, buffers=(), ignore_extra=False):
    import torch
    sd = load_state_dict(src)

    def raw_of(name, shape):
        t = sd[name]
        if list(t.shape) != list(shape):
            raise ValueError(f"{name}: expected shape {list(shape)} (the --like model's), "
                             f"found {list(t.shape)}")
        return t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()

    if like:
        ref = read_file(like)
        ptab, btab = ref["params"], ref["buffers"]
        missing = [e[0] for e in ptab + btab if e[0] not in sd]
        if missing:
            raise ValueError(f"{src}: expected every tensor of {like}, missing "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        extra = sorted(set(sd) - {e[0] for e in ptab + btab})
        if extra and not ignore_extra:
            raise ValueError(f"{src}: keys not in {like}: {', '.join(extra[:5])} "
                             f"(--ignore-extra leaves them out)")
    else:
        ptab, btab = [], []
        for name, t in sd.items():
            if not t.is_floating_point():
                continue  # counters such as BatchNorm's num_batches_tracked
            (btab if name in buffers else ptab).append((name, list(t.shape), -1, 0))
    raw = b"".join(raw_of(n, s) for n, s, _, _ in ptab)
    braw = b"".join(raw_of(n, s) for n, s, _, _ in btab)
    write_model(dst, ptab, raw, btab, braw)
    return len(ptab) + len(btab)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("to-torch")
    a.add_argument("model")
    a.add_argument("out")
    b = sub.add_parser("from-torch")
    b.add_argument("pt")
    b.add_argument("out")
    b.add_argument("--like", help="a dtrain model file giving the order, layers and flags")
    b.add_argument("--buffers", default="", help="comma-separated keys that are buffers")
    b.add_argument("--ignore-extra", action="store_true")
    c = sub.add_parser("show")
    c.add_argument("model")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "to-torch":
            n = to_torch(args.model, args.out)
            print(f"wrote {n} tensors to {args.out}")
        elif args.cmd == "from-torch":
            bufs = [x for x in args.buffers.split(",") if x]
            n = from_torch(args.pt, args.out, args.like, bufs, args.ignore_extra)
            print(f"wrote {n} tensors to {args.out}")
        else:
            m = read_file(args.model)
            for name, shape, layer, flags in m["params"]:
                print(f"{name} {shape} layer {layer} flags {flags}")
            for name, shape, layer, flags in m["buffers"]:
                print(f"{name} {shape} (buffer)")
    except (OSError, ValueError) as e:
        print(f"dt_torch.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
