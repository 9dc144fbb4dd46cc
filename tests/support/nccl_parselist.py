"""NCCL's ``parseList`` (``src/graph/tuning.cc:55-136``, master 5067397c) transcribed char
by char, ``strtok_r`` included: what :func:`topoplan.analysis.native.nccl_env.parse_list`
is checked against."""

from __future__ import annotations


def strtok(buf: list[str], start: int, delims: str) -> tuple[int | None, int]:
    """``strtok_r`` on ``buf`` (chars; ``"\\0"`` ends a string) from ``start``: the
    token's start (``None``: no token left) and where the next call starts."""
    i = start
    while i < len(buf) and buf[i] != "\0" and buf[i] in delims:
        i += 1
    if i >= len(buf) or buf[i] == "\0":
        return None, i
    j = i
    while j < len(buf) and buf[j] != "\0" and buf[j] not in delims:
        j += 1
    if j < len(buf) and buf[j] != "\0":
        buf[j] = "\0"
        return i, j + 1
    return i, j


def cstr(buf: list[str], i: int) -> str:
    """The C string at ``buf[i]``."""
    j = i
    while j < len(buf) and buf[j] != "\0":
        j += 1
    return "".join(buf[i:j])


def nccl_parse_list(text: str, prefixes: list[str], elems: tuple[str, ...],
                    defaults: list[list[int]]) -> list[list[int]] | str:
    """The list NCCL ends with (``list[p][e]``, from ``defaults``), ``"error"``
    (``ncclInvalidUsage``) or ``"crash"`` (where NCCL reads a NULL list: ``"::"``)."""
    lst = [list(d) for d in defaults]
    full = list(text)
    tok, save = strtok(full, 0, ";")
    while tok is not None:
        sub = list(cstr(full, tok))
        prefix, rest = strtok(sub, 0, ":")
        elemlist = None if prefix is None else strtok(sub, rest, ":")[0]
        prefix_s = None if prefix is None else cstr(sub, prefix)
        elem_s = None if elemlist is None else cstr(sub, elemlist)
        if elem_s is None:
            if tok != 0:                  # fullToken != fullStr
                return "error"
            elem_s, prefix_s = prefix_s, None
            if elem_s is None:
                return "crash"
        unset, setv = (1, 0) if elem_s.startswith("^") else (0, 1)
        if elem_s.startswith("^"):
            elem_s = elem_s[1:]
        found = False
        for p, name in enumerate(prefixes):
            if prefix_s is not None and prefix_s.lower() != name.lower():
                continue
            found = True
            for e in range(len(elems)):
                lst[p][e] = unset
            ebuf = list(elem_s)
            et, es = strtok(ebuf, 0, ",")
            while et is not None:
                el = cstr(ebuf, et)
                for e, en in enumerate(elems):
                    if el.lower() == en.lower():
                        lst[p][e] = setv
                        break
                else:
                    return "error"
                et, es = strtok(ebuf, es, ",")
        if not found:
            return "error"
        tok, save = strtok(full, save, ";")
    return lst
