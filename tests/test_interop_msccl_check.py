"""The MSCCL XML model: parser errors, to_xml round trip, limits, and the symbolic checker
on hand-built algorithms (an RCCL-style ring, an all-pairs with scratch, dependencies and
nops) and broken variants of them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoplan.errors import ScheduleError, XmlFormatError
from topoplan.interop.msccl import (
    Algo, Gpu, Limits, ThreadBlock, limit_violations, load_msccl, loads_msccl, to_xml,
    verify_msccl,
)

DATA = Path(__file__).parent / "data" / "msccl"

from tests.support.msccl_algos import (  # noqa: E402
    algo, allpairs, numbered, replace_step, ring, roundtrip, set_steps, step,
)


def xml_lines(a: Algo) -> list[str]:
    return to_xml(a).splitlines()


def parse_lines(lines: list[str]) -> Algo:
    return loads_msccl("\n".join(lines) + "\n", file="algo.xml")


# --------------------------------------------------------------------------- parser


def test_ring_file_fixture_parses_and_checks() -> None:
    a = load_msccl(DATA / "ring4.xml")
    assert a.ngpus == 4 and a.name == "ring4" and a.proto == "Simple"
    assert a.gpus[2].tbs[0].steps[1].type == "rrs"
    assert a.gpus[2].tbs[0].steps[1].line == 28
    report = verify_msccl(a)
    assert report.modes == ("inplace", "outofplace")


def test_unknown_attributes_and_comments_are_ignored() -> None:
    lines = xml_lines(ring())
    lines[0] = lines[0].replace("<algo ", '<algo maxcount="1" nthreadblocks="1" ')
    lines.insert(1, "<!-- a comment -->")
    assert parse_lines(lines) == ring()


def test_roundtrip_ring_and_allpairs() -> None:
    for a in (ring(), allpairs(), ring(3, first_cnt=3)):
        text = to_xml(a)
        assert loads_msccl(text) == a
        assert "<?xml" not in text and "\t" not in text
        assert text.splitlines()[1].startswith('  <gpu id="0"')
        assert 'minBytes="0" maxBytes="0"' in text.splitlines()[0]


@st.composite
def algos(draw: st.DrawFn) -> Algo:
    n = draw(st.integers(2, 4))
    nchan = draw(st.integers(1, 3))
    gpus = []
    for g in range(n):
        ntb = draw(st.integers(0, 3))
        chunks = draw(st.integers(1, 4))
        tbs = []
        for t in range(ntb):
            chan = t % nchan if nchan > 1 else 0
            peer = draw(st.sampled_from([p for p in range(n) if p != g]))
            if ntb > nchan:  # keep one connection per (peer, channel)
                peer = -1
            nsteps = draw(st.integers(0, 4))
            raw = []
            for k in range(nsteps):
                typ = draw(st.sampled_from(["cpy", "re"] + (["s", "r", "rrcs"] if peer >= 0
                                                           else [])))
                cnt = draw(st.integers(1, chunks))
                srcbuf, dstbuf = draw(st.sampled_from("ios")), draw(st.sampled_from("ios"))
                prev = raw[-1] if raw else None
                if (typ == "re" and prev is not None and prev.type == "re"
                        and prev.dstbuf == dstbuf and not prev.hasdep):
                    cnt = prev.cnt  # a chain the executor fuses runs with one cnt
                raw.append(step(k, typ, srcbuf, 0, dstbuf, 0, cnt=cnt,
                                hasdep=draw(st.booleans())))
            tbs.append(ThreadBlock(t, peer, peer, chan, tuple(raw)))
        gpus.append(Gpu(g, chunks, chunks, chunks, tuple(tbs)))
    name = draw(st.text("abcXYZ019_- .", min_size=1, max_size=10))
    return Algo(name, draw(st.sampled_from(["Simple", "LL", "LL128"])), nchan, 4, n,
                "allreduce", draw(st.booleans()), draw(st.booleans()),
                draw(st.integers(0, 1 << 40)), draw(st.integers(0, 1 << 40)), tuple(gpus))


@settings(max_examples=60, deadline=None)
@given(algos())
def test_roundtrip_property(a: Algo) -> None:
    assert loads_msccl(to_xml(a)) == a


def bad(lines: list[str], pattern: str) -> None:
    with pytest.raises(XmlFormatError) as err:
        parse_lines(lines)
    assert re.search(pattern, str(err.value)), str(err.value)


def test_missing_attribute_names_file_line_element() -> None:
    lines = xml_lines(ring())
    lines[4] = lines[4].replace(' cnt="1"', "")  # gpu 0 tb 0 step 1
    bad(lines, r"^algo\.xml:5: algo/gpu\[0\]/tb\[0\]/step\[1\]: cnt: missing attribute")
    lines = xml_lines(ring())
    lines[0] = lines[0].replace(' maxBytes="0"', "")
    bad(lines, r"^algo\.xml:1: algo: maxBytes: missing attribute")


def test_executor_attributes_msccl_tools_leaves_out_are_named_with_the_fix() -> None:
    # msccl-tools' ir_to_xml writes no outofplace, minBytes or maxBytes
    lines = xml_lines(ring())
    head = lines[0]
    lines[0] = head.replace(' outofplace="1" minBytes="0" maxBytes="0"', "")
    bad(lines, r'^algo\.xml:1: algo: outofplace: missing attribute \(it has: .*\); '
               r'msccl-executor-nccl needs outofplace, minBytes, maxBytes \(msccl_parser\.cc\) '
               r'and msccl-tools does not write them: add outofplace="0" minBytes="0" '
               r'maxBytes="0" to <algo> \(in place only, every size\)$')
    lines[0] = lines[0].replace('inplace="1"', 'inplace="1" outofplace="0" minBytes="0" '
                                               'maxBytes="0"')
    assert parse_lines(lines) == dataclasses.replace(ring(), outofplace=False)
    lines[0] = head.replace(' minBytes="0"', "").replace('inplace="1" outofplace="1"',
                                                          'inplace="0" outofplace="1"')
    bad(lines, r'algo: minBytes: missing attribute .*needs minBytes \(msccl_parser\.cc\) .*'
               r'add minBytes="0" to <algo> \(out of place only, every size\)$')


def test_bad_step_type() -> None:
    lines = xml_lines(ring())
    lines[5] = lines[5].replace('type="rrs"', 'type="rrx"')
    bad(lines, r"algo\.xml:6: algo/gpu\[0\]/tb\[0\]/step\[2\]: type: unknown step type 'rrx'")


def test_offset_out_of_bounds() -> None:
    lines = xml_lines(ring())
    lines[3] = lines[3].replace('srcoff="0"', 'srcoff="4"')
    bad(lines, r"algo\.xml:4: .*step\[0\]: srcoff: units 4\.\.4 are outside buffer i of "
               r"gpu 0 \(i_chunks=4\)")
    # a send's dst is the peer's business: not checked here
    lines = xml_lines(ring())
    lines[3] = lines[3].replace('dstoff="0"', 'dstoff="99"')
    parse_lines(lines)


@pytest.mark.parametrize("edit, pattern", [
    (('s="1"', 's="2"'), r"s: must be the step's position in its tb \(1\)"),
    (('srcbuf="i"', 'srcbuf="x"'), r"srcbuf: must be one of i, o, s"),
    (('hasdep="0"', 'hasdep="2"'), r"hasdep: must be <= 1"),
    (('depid="-1" deps="-1"', 'depid="3" deps="0"'), r"depid: gpu 0 has no tb 3"),
    (('depid="-1"', 'depid="3"'), r"deps: must be a step of tb 3 \(>= 0\) when depid is set"),
    (('cnt="1"', 'cnt="0"'), r"cnt: must be >= 1 for a rrs step"),
])
def test_step_errors(edit: tuple[str, str], pattern: str) -> None:
    lines = xml_lines(ring())
    lines[4] = lines[4].replace(*edit)
    bad(lines, r"algo\.xml:5: algo/gpu\[0\]/tb\[0\]/step\[1\]: " + pattern)


@pytest.mark.parametrize("edit, pattern", [
    (('send="1"', 'send="0"'), r"send: a tb cannot send to its own gpu 0"),
    (('send="1"', 'send="-1"'), r"step\[0\]: type: a s step sends, but tb 0 has no send peer"),
    (('recv="3"', 'recv="-1"'), r"step\[1\]: type: a rrs step receives, but tb 0 has no "
                                r"recv peer"),
    (('chan="0"', 'chan="1"'), r"chan: must be in \[0, nchannels=1\), got 1"),
    (('id="0" send', 'id="1" send'), r"tb ids must be 0\.\.0 without gaps; tb 0 is missing"),
    (('send="1"', 'send="4"'), r"send: must be <= 3"),
])
def test_tb_errors(edit: tuple[str, str], pattern: str) -> None:
    lines = xml_lines(ring())
    lines[2] = lines[2].replace(*edit)
    bad(lines, r"algo\.xml:\d+: algo/gpu\[0\]" + r".*" + pattern)


def test_gpu_and_algo_errors() -> None:
    lines = xml_lines(ring())
    lines[0] = lines[0].replace('ngpus="4"', 'ngpus="5"')
    bad(lines, r"algo\.xml:1: algo: ngpus: ngpus=5 but there is no <gpu> with id 4")
    lines = xml_lines(ring())
    lines[0] = lines[0].replace('proto="Simple"', 'proto="LL64"')
    bad(lines, r"proto: must be one of Simple, LL, LL128")
    lines = xml_lines(ring())
    lines[0] = lines[0].replace('coll="allreduce"', 'coll="allsum"')
    bad(lines, r"coll: must be one of allreduce")
    empty = Gpu(0, 1, 1, 0, ())
    text = to_xml(algo([empty, empty], nchunks=1))
    with pytest.raises(XmlFormatError, match=r"algo\.xml:4: algo/gpu\[1\]: id: duplicate "
                                              r"gpu id 0 \(first at line 2\)"):
        loads_msccl(text, file="algo.xml")
    with pytest.raises(XmlFormatError, match=r"unexpected element <stp>"):
        loads_msccl(to_xml(ring()).replace("<step s=\"3\"", "<stp s=\"3\""), file="algo.xml")
    with pytest.raises(XmlFormatError, match=r"the root element must be <algo>"):
        loads_msccl("<algorithm/>")
    with pytest.raises(XmlFormatError, match=r"not well-formed"):
        loads_msccl("<algo")


def test_two_tbs_on_one_connection_refused() -> None:
    a = allpairs()
    gpu = a.gpus[0]
    tbs = list(gpu.tbs)
    tbs[1] = dataclasses.replace(tbs[1], send=tbs[0].send)
    a = dataclasses.replace(a, gpus=(dataclasses.replace(gpu, tbs=tuple(tbs)),) + a.gpus[1:])
    with pytest.raises(XmlFormatError, match=r"tb\[1\]: send: tb 0 already has send peer 1 "
                                              r"on channel 0"):
        roundtrip(a)


def test_dependency_on_missing_step_and_self() -> None:
    a = replace_step(allpairs(), 0, 0, 2, deps=9)
    with pytest.raises(XmlFormatError, match=r"deps: tb 3 of gpu 0 has 6 steps \(0\.\.5\), "
                                              r"got 9"):
        roundtrip(a)
    a = replace_step(allpairs(), 0, 0, 2, depid=0)
    with pytest.raises(XmlFormatError, match=r"depid: a tb cannot depend on itself"):
        roundtrip(a)


def test_nop_before_a_step_without_dependency_refused() -> None:
    a = allpairs()
    # the first re of the reduce tb carries the last dependency; drop it
    a = replace_step(a, 0, 3, 3, depid=-1, deps=-1)
    with pytest.raises(XmlFormatError, match=r"tb\[3\]/step\[3\]: depid: nop step 1 carries "
                                              r"a dependency, so the next real step must"):
        roundtrip(a)


def test_nop_without_dependency_refused() -> None:
    a = replace_step(allpairs(), 0, 3, 1, depid=-1, deps=-1)
    with pytest.raises(XmlFormatError, match=r"tb\[3\]/step\[1\]: depid: a nop without a "
                                              r"dependency is dropped by the executor"):
        roundtrip(a)
    # at the end of a tb it changes nothing
    raw = list(ring().gpus[0].tbs[0].steps) + [step(0, "nop", cnt=0)]
    verify_msccl(roundtrip(set_steps(ring(), 0, 0, raw)))


def test_fused_re_with_different_cnt_refused() -> None:
    a = allpairs()
    gpu = a.gpus[0]
    a = replace_step(a, 0, 3, 4, cnt=2)
    a = dataclasses.replace(a, gpus=(dataclasses.replace(gpu, s_chunks=4),) + a.gpus[1:])
    a = replace_step(a, 0, 3, 4, cnt=2)
    with pytest.raises(XmlFormatError, match=r"fuses with the re at step 3"):
        roundtrip(a)


@pytest.mark.parametrize("edit, line, pattern", [
    (lambda t: '<?xml version="1.0"?>\n' + t, 1, r"an XML declaration"),
    (lambda t: t.replace("  <gpu", "\t<gpu", 2), 2, r"a tab"),
    (lambda t: t.replace(' o_chunks="4"', '\n    o_chunks="4"', 1), 2,
     r"a tag spread over several lines, or text outside the elements"),
    (lambda t: t.replace('cnt="1" depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n  </gpu>\n  <gpu '
                         'id="1"', "cnt='1' depid='-1' deps='-1' hasdep='0'/>\n    </tb>\n  "
                         '</gpu>\n  <gpu id="1"'), 10, r"an attribute written as .* with single quotes"),
    (lambda t: t.replace("</tb>", "</tb>stray", 1), 11, r"a tag spread over several lines, or text outside the elements"),
])
def test_xml_the_executor_cannot_lex(edit: object, line: int, pattern: str) -> None:
    text = edit(to_xml(ring()))  # type: ignore[operator]
    with pytest.raises(XmlFormatError, match=rf"^algo\.xml:{line}: {pattern}.*the executor's "
                                              r"parser cannot read it"):
        loads_msccl(text, file="algo.xml")


def test_to_xml_refuses_unreadable_name() -> None:
    with pytest.raises(XmlFormatError, match="name"):
        to_xml(dataclasses.replace(ring(), name='a"b'))


# --------------------------------------------------------------------------- limits


def test_limit_violations() -> None:
    assert limit_violations(ring()) == []
    long = ring(4)
    raw = list(long.gpus[3].tbs[0].steps) + [step(0, "cpy", "i", 0, "s", 0)] * 64
    long = set_steps(long, 3, 0, raw)
    found = limit_violations(long)
    assert found == ["gpu 3 tb 0 has 71 steps; the executor allows 64 (MSCCL_MAX_NUM_STEPS, "
                     "a build option)"]
    assert limit_violations(long, Limits(max_steps=128)) == []
    big = replace_step(ring(), 1, 0, 0, cnt=72)
    assert limit_violations(big) == ["gpu 1 tb 0 step 0 has cnt=72; the executor allows at "
                                     "most 71 (MSCCL_MAX_COUNT=72)"]
    wide = dataclasses.replace(ring(), nchannels=40)
    assert limit_violations(wide) == ["nchannels=40; the executor allows 32 (MAXCHANNELS)"]
    tight = limit_violations(ring(), Limits(max_tbs_per_channel=0))
    assert "gpu 0 channel 0 has 1 tbs with a send peer; the executor allows 0 " \
           "(MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL)" in tight


# --------------------------------------------------------------------------- checker


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_passes_both_modes(n: int) -> None:
    a = roundtrip(ring(n))
    report = verify_msccl(a)
    assert report.modes == ("inplace", "outofplace")
    assert report.steps == n * (2 * n - 1)
    assert report.messages == n * (2 * n - 2)
    assert report.capacity == 2 and 1 <= report.max_fifo_depth <= 2


@pytest.mark.parametrize("n", [2, 3, 5])
def test_allpairs_with_scratch_nops_and_dependencies_passes(n: int) -> None:
    a = roundtrip(allpairs(n))
    assert any(s.type == "nop" for s in a.gpus[0].tbs[-1].steps) or n == 2
    report = verify_msccl(a)
    assert report.modes == ("inplace", "outofplace")


def check_error(a: Algo, pattern: str, **kw: object) -> str:
    with pytest.raises(ScheduleError) as err:
        verify_msccl(a, **kw)  # type: ignore[arg-type]
    assert re.search(pattern, str(err.value)), str(err.value)
    return str(err.value)


def test_dependency_on_step_without_hasdep_deadlocks_naming_it() -> None:
    a = replace_step(allpairs(), 2, 3, 5, hasdep=False)  # the last re no longer signals
    text = check_error(a, r"deadlock")
    assert "gpu 2 tb 0 (send 0, recv 0, chan 0) step 2 s: waits for tb 3 step 5 (re); " \
           "that step has hasdep=0, so it never signals, and no later step of tb 3 has " \
           "hasdep=1" in text


def test_dependency_on_a_nop_deadlocks_naming_it() -> None:
    a = replace_step(allpairs(), 1, 0, 2, deps=1)  # wait for the reduce tb's nop
    a = replace_step(a, 1, 3, 5, hasdep=False)
    check_error(a, r"waits for tb 3 step 1 \(nop\); that step is a nop, and nops never signal")


def test_missing_dependency_is_a_race() -> None:
    # tb 1 of gpu 0 sends o[0] without waiting for the reduce tb that writes it
    a = roundtrip(replace_step(allpairs(), 0, 1, 2, depid=-1, deps=-1))
    check_error(a, r"^algo\.xml \(in-place\): gpu 0: race on i\[0\] \(o is i in-place\) "
                   r"between tb \d step \d \((re|s|cpy)\) and tb \d step \d \((re|s|cpy)\): "
                   r"neither waits for the other")
    a = dataclasses.replace(a, inplace=False)
    check_error(a, r"\(out-of-place\): gpu 0: race on o\[0\] between")


def test_removed_nop_dependency_is_a_race_or_an_empty_read() -> None:
    a = allpairs()
    raw = list(a.gpus[0].tbs[3].steps)
    del raw[1]  # the nop waiting for tb 0's receive into s[0]
    a = set_steps(a, 0, 3, raw)
    for t in range(3):  # the sends now wait for the reduce tb's last step, one earlier
        a = replace_step(a, 0, t, 2, deps=4)
    check_error(roundtrip(a), r"gpu 0: (race on s\[0\] between tb 0 step 1 \(r\) and tb 3 "
                              r"step \d \(re\)|tb 3 step \d \(re\) reads s\[0\], which holds "
                              r"nothing)")


def test_double_counted_rank() -> None:
    # gpu 0 adds its input again to the fully reduced chunk 2 (rrc instead of r)
    a = roundtrip(replace_step(ring(), 0, 0, 6, type="rrc", srcoff=2))
    check_error(a, r"^algo\.xml \(in-place\): gpu 0 tb 0 step 6 \(rrc\) adds i\[2\] "
                   r"\(chunk 2 of \{0\}\) to the data received from gpu 3 tb 0 step 5 \(rcs\) "
                   r"\(chunk 2 of \{0,1,2,3\}\): \{0\} would be counted twice$")
    # with re, into scratch, on two units
    b = allpairs()
    # gpu 1's reduce tb copies i[1] into o[1], then adds i[1] instead of s[0]
    b = replace_step(b, 1, 3, 3, srcbuf="i", srcoff=1)
    check_error(roundtrip(b), r"gpu 1 tb 3 step 3 \(re\) adds i\[1\] \(chunk 1 of \{1\}\) to "
                              r"o\[1\] \(chunk 1 of \{1\}\): \{1\} would be counted twice")


def test_sum_of_different_chunks() -> None:
    # gpu 1 adds its chunk 1 to the chunk 0 it receives: rank sets alone would not notice
    a = roundtrip(replace_step(ring(), 1, 0, 1, srcoff=1))
    check_error(a, r"gpu 1 tb 0 step 1 \(rrs\) adds i\[1\] \(chunk 1 of \{1\}\) to the data "
                   r"received from gpu 0 tb 0 step 0 \(s\) \(chunk 0 of \{0\}\): a sum of two "
                   r"different chunks")


def test_missing_contribution() -> None:
    # gpu 2 forwards (rcs) instead of adding its input (rrs) at step 1: chunk 1 lacks rank 2
    a = replace_step(ring(), 2, 0, 1, type="rcs", dstbuf="s", dstoff=0)
    a = dataclasses.replace(a, gpus=a.gpus[:2] + (dataclasses.replace(a.gpus[2], s_chunks=1),)
                            + a.gpus[3:])
    check_error(roundtrip(a), r"^algo\.xml \(in-place\): gpu 0 i\[1\] holds \{0,1,3\}; "
                              r"expected all of 0\.\.3 once \(missing \{2\}\)")
    check_error(dataclasses.replace(a, inplace=False),
                r"\(out-of-place\): gpu 0 o\[1\] holds \{0,1,3\}; expected all of 0\.\.3 once "
                r"\(missing \{2\}\)")


def test_output_never_written() -> None:
    a = replace_step(ring(), 3, 0, 6, dstbuf="s", dstoff=0)
    a = dataclasses.replace(a, outofplace=True, inplace=False, gpus=a.gpus[:3] + (
        dataclasses.replace(a.gpus[3], s_chunks=1),))
    check_error(a, r"gpu 3 o\[1\] is never written; expected all of 0\.\.3 once")


def test_cnt_mismatch_between_send_and_recv() -> None:
    a = ring(3, first_cnt=2)
    a = replace_step(a, 0, 0, 0, cnt=1)
    check_error(a, r"gpu 1 tb 0 step 1 \(rrs\) receives cnt=2, but the message it takes, "
                   r"from gpu 0 tb 0 step 0 \(s\), has cnt=1")


def test_two_gpus_that_both_receive_first_deadlock() -> None:
    gpus = []
    for g in range(2):
        p = 1 - g
        raw = [step(0, "r", "i", -1, "s", 0), step(0, "s", "i", 0, "o", 0),
               step(0, "cpy", "i", 0, "o", 0), step(0, "re", "s", 0, "o", 0)]
        gpus.append(Gpu(g, 1, 1, 1, (ThreadBlock(0, p, p, 0, numbered(raw)),)))
    a = algo(gpus, nchunks=1)
    text = check_error(roundtrip(a), r"deadlock: 2 tbs cannot move")
    assert "gpu 0 tb 0 (send 1, recv 1, chan 0) step 0 r: waits for a message from gpu 1 " \
           "on channel 0; gpu 1 tb 0 is at step 0 (r, receiving)" in text
    # sending first works
    fixed = [set_steps(a, g, 0, [a.gpus[g].tbs[0].steps[k] for k in (1, 0, 2, 3)])
             for g in range(1)][0]
    fixed = set_steps(fixed, 1, 0, [a.gpus[1].tbs[0].steps[k] for k in (1, 0, 2, 3)])
    assert verify_msccl(fixed).messages == 2


def test_capacity_deadlock_under_simple_passes_with_more_room() -> None:
    # every gpu first sends 3 units, then receives: fits only in a buffer of 3 or more
    a = ring(4, first_cnt=3)
    text = check_error(a, r"deadlock: 4 tbs cannot move")
    assert "gpu 0 tb 0 (send 1, recv 3, chan 0) step 0 s: waits for buffer space toward " \
           "gpu 1 on channel 0 (0 of 2 units queued, the message is 3)" in text
    assert verify_msccl(a, capacity=4).max_fifo_depth == 3
    assert verify_msccl(dataclasses.replace(a, proto="LL")).capacity == 8


def test_rendezvous_when_receiver_waits() -> None:
    # a 3-unit send to a gpu that receives first goes through even with capacity 2
    gpus = []
    for g, raw in ((0, [step(0, "s", "i", 0, "o", 0, cnt=3), step(0, "r", "i", -1, "o", 0,
                                                                  cnt=3)]),
                   (1, [step(0, "rrcs", "i", 0, "o", 0, cnt=3)])):
        gpus.append(Gpu(g, 3, 3, 0, (ThreadBlock(0, 1 - g, 1 - g, 0, numbered(raw)),)))
    report = verify_msccl(algo(gpus, nchunks=3))
    assert report.max_fifo_depth == 0 and report.messages == 2


def test_unreceived_message_and_unmatched_connection() -> None:
    a = set_steps(ring(), 1, 0, list(ring().gpus[1].tbs[0].steps) +
                  [step(0, "s", "i", 0, "o", 0)])
    a = replace_step(a, 2, 0, 0, srcoff=2)
    check_error(a, r"messages from gpu 1 tb 0 to gpu 2 tb 0 are never received")
    b = dataclasses.replace(ring(), gpus=ring().gpus[:1] + (
        dataclasses.replace(ring().gpus[1], tbs=(dataclasses.replace(
            ring().gpus[1].tbs[0], recv=3),)),) + ring().gpus[2:])
    check_error(b, r"gpu 0 tb 0 sends to gpu 1 on channel 0, but no tb of gpu 1 has recv=0")


def test_out_of_place_must_not_write_input() -> None:
    a = replace_step(ring(), 0, 0, 6, dstbuf="i")
    check_error(a, r"\(out-of-place\): gpu 0 tb 0 step 6 \(r\) writes i\[2\], the input "
                   r"buffer")
    verify_msccl(dataclasses.replace(a, outofplace=False))


def test_other_collectives_refused() -> None:
    check_error(dataclasses.replace(ring(), coll="broadcast"),
                r"checks allreduce, allgather, reducescatter algorithms; coll='broadcast' "
                r"is not supported")


def test_an_allreduce_labelled_allgather_or_reducescatter_is_caught() -> None:
    # The ring's buffers are whole-buffer sized: an allgather's input is one shard.
    check_error(dataclasses.replace(ring(), coll="allgather"),
                r"gpu 0 i_chunks=4 exceeds the 1 chunks of the allgather's send buffer "
                r"\(nchunksperloop / ngpus\)")
    check_error(dataclasses.replace(ring(), coll="reducescatter"),
                r"gpu 0 o_chunks=4 exceeds the 1 chunks of the reducescatter's receive buffer")
    check_error(dataclasses.replace(ring(), coll="reducescatter", nchunksperloop=6),
                r"coll='reducescatter': nchunksperloop=6 is not a multiple of ngpus=4")


def test_large_algorithm_runs() -> None:
    """200 gpus of 50 tbs of 40 steps (400k steps): the event-driven worklist runs it in
    seconds; a checker that rescanned every tb each round would take hours. (Timing is
    measured in scripts, not asserted here.)"""
    n, per = 200, 50
    gpus = []
    for g in range(n):
        tbs = []
        for t in range(per):
            raw = []
            for k in range(20):
                raw.append(step(0, "s", "i", t, "o", t))
                raw.append(step(0, "r", "i", -1, "s", t))
            tbs.append(ThreadBlock(t, (g + 1) % n, (g - 1) % n, t, numbered(raw)))
        gpus.append(Gpu(g, per, per, per, tuple(tbs)))
    a = dataclasses.replace(algo(gpus, nchunks=per, nchannels=per), inplace=False)
    # an exchange, not an allreduce: it runs to the end and fails the output check
    check_error(a, r"gpu 0 o\[0\] is never written")


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_moved_offset_in_the_ring_is_caught(data: st.DataObject) -> None:
    """Moving the buffer offset a ring step reads or writes breaks the allreduce, and the
    checker says so (chunk labels catch what rank sets alone would miss)."""
    n = data.draw(st.integers(2, 5), label="n")
    a = ring(n)
    g = data.draw(st.integers(0, n - 1), label="gpu")
    k = data.draw(st.integers(0, 2 * n - 2), label="step")
    old = a.gpus[g].tbs[0].steps[k]
    field = "srcoff" if old.type in ("s", "rrs") else "dstoff"
    if old.type == "rrcs":
        field = data.draw(st.sampled_from(["srcoff", "dstoff"]), label="field")
    new = data.draw(st.integers(0, n - 1).filter(lambda x: x != getattr(old, field)))
    with pytest.raises(ScheduleError):
        verify_msccl(replace_step(a, g, 0, k, **{field: new}))
