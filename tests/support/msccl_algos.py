"""Hand-built MSCCL algorithms and the helpers that build them (an RCCL-style ring, an
all-pairs with scratch), shared by the MSCCL tests."""

from __future__ import annotations

import dataclasses

from topoplan.interop.msccl import Algo, Gpu, Step, ThreadBlock, loads_msccl, to_xml


def step(s: int, type: str, srcbuf: str = "i", srcoff: int = -1, dstbuf: str = "o",
         dstoff: int = -1, cnt: int = 1, depid: int = -1, deps: int = -1,
         hasdep: bool = False) -> Step:
    return Step(s, type, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep)


def numbered(raw: list[Step]) -> tuple[Step, ...]:
    return tuple(dataclasses.replace(x, s=k) for k, x in enumerate(raw))


def algo(gpus: list[Gpu], *, nchunks: int, proto: str = "Simple", nchannels: int = 1,
         inplace: bool = True, outofplace: bool = True, name: str = "test") -> Algo:
    return Algo(name, proto, nchannels, nchunks, len(gpus), "allreduce", inplace,
                outofplace, 0, 0, tuple(gpus))


def ring(n: int = 4, first_cnt: int = 1) -> Algo:
    """The RCCL ring in one tb per gpu: s, rrs..., rrcs, rcs..., r; i as the local
    source, o as the destination; chunk k is ``first_cnt`` units at ``k*first_cnt``."""
    c = first_cnt
    gpus = []
    for g in range(n):
        raw = [step(0, "s", "i", g * c, "o", g * c, cnt=c)]
        for k in range(1, n):  # receive chunk g-k from g-1, add the local copy
            ch = (g - k) % n
            raw.append(step(0, "rrs" if k < n - 1 else "rrcs", "i", ch * c, "o", ch * c,
                            cnt=c))
        for m in range(1, n):  # receive the reduced chunk g-(m-1), pass it on
            ch = (g - (m - 1)) % n
            raw.append(step(0, "rcs" if m < n - 1 else "r", "i", ch * c, "o", ch * c,
                            cnt=c))
        tb = ThreadBlock(0, (g + 1) % n, (g - 1) % n, 0, numbered(raw))
        gpus.append(Gpu(g, n * c, n * c, 0, (tb,)))
    return algo(gpus, nchunks=n * c)


def allpairs(n: int = 4) -> Algo:
    """All-pairs: tb p of gpu g sends i[p] to gpu p, receives gpu p's i[g] into scratch,
    then (after the reduce tb) sends the sum o[g] to p and receives o[p]. The reduce tb
    (id n-1) copies i[g] to o[g] and adds every scratch unit with re, waiting for the
    receives with nops and a dependency on its first re."""
    gpus = []
    for g in range(n):
        peers = [p for p in range(n) if p != g]
        red = len(peers)  # id of the reduce tb
        tbs = []
        for t, p in enumerate(peers):
            raw = [step(0, "s", "i", p, "o", p),
                   step(0, "r", "i", -1, "s", t, hasdep=True),
                   step(0, "s", "o", g, "o", g, depid=red, deps=n - 1 + len(peers) - 1),
                   step(0, "r", "i", -1, "o", p)]
            tbs.append(ThreadBlock(t, p, p, 0, numbered(raw)))
        raw = [step(0, "cpy", "i", g, "o", g)]
        for t in range(len(peers) - 1):
            raw.append(step(0, "nop", "i", -1, "o", -1, cnt=0, depid=t, deps=1))
        last = len(peers) - 1
        for t in range(len(peers)):
            raw.append(step(0, "re", "s", t, "o", g, depid=last if t == 0 else -1,
                            deps=1 if t == 0 else -1, hasdep=t == len(peers) - 1))
        tbs.append(ThreadBlock(red, -1, -1, 0, numbered(raw)))
        gpus.append(Gpu(g, n, n, len(peers), tuple(tbs)))
    return algo(gpus, nchunks=n)


def replace_step(a: Algo, g: int, t: int, k: int, **changes: object) -> Algo:
    gpu = a.gpus[g]
    tb = gpu.tbs[t]
    steps = list(tb.steps)
    steps[k] = dataclasses.replace(steps[k], **changes)  # type: ignore[arg-type]
    tbs = list(gpu.tbs)
    tbs[t] = dataclasses.replace(tb, steps=tuple(steps))
    gpus = list(a.gpus)
    gpus[g] = dataclasses.replace(gpu, tbs=tuple(tbs))
    return dataclasses.replace(a, gpus=tuple(gpus))


def set_steps(a: Algo, g: int, t: int, steps: list[Step]) -> Algo:
    gpu = a.gpus[g]
    tbs = list(gpu.tbs)
    tbs[t] = dataclasses.replace(tbs[t], steps=numbered(steps))
    gpus = list(a.gpus)
    gpus[g] = dataclasses.replace(gpu, tbs=tuple(tbs))
    return dataclasses.replace(a, gpus=tuple(gpus))


def roundtrip(a: Algo) -> Algo:
    """Through the XML text, so every fixture is also a file the parser accepts."""
    return loads_msccl(to_xml(a), file="algo.xml")
